"""Write slime prompt rows for the service's rollout function from the service's own task files.

    python examples/slime/make_rows.py --out runs/slime-rows      # -> train.jsonl, eval.jsonl

Each line is what slime's data source reads with `--input-key prompt --label-key label --metadata-key
metadata`: `prompt` (the problem text: slime filters and logs it; the service's kind renders the real prompt),
`label` (the answer, for slime's logs) and `metadata.rollouts_task`, the service task the bridge sends
(docs/TRAINERS.md, "slime"). The math tasks of examples/math.jsonl: 16 to train on, 4 to evaluate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS = HERE.parent / "math.jsonl"
EVAL_ROWS = 4


def rows() -> list[dict]:
    out = []
    for line in TASKS.read_text().splitlines():
        task = json.loads(line)["task"]
        out.append({"prompt": task["problem"], "label": str(task["answer"]), "metadata": {"rollouts_task": task}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/slime-rows"))
    out = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    made = rows()
    for name, part in (("train", made[:-EVAL_ROWS]), ("eval", made[-EVAL_ROWS:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in part))
        print(f"{out / name}.jsonl: {len(part)} rows")


if __name__ == "__main__":
    main()
