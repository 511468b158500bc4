"""Write verl parquet rows for the service's agent loop from the service's own task files.

    python examples/verl/make_rows.py --out runs/verl-rows      # -> train.parquet, val.parquet

Each row is verl's RLHFDataset layout (`prompt`, `data_source`, `reward_model`, `extra_info`) plus what
the bridge reads: `agent_name: rollouts` and `extra_info.rollouts_task` (the service task, from
examples/math.jsonl and examples/code.jsonl). `extra_info.rollouts_key` makes the jobs' idempotency
keys stable across a trainer restart (docs/TRAINERS.md). Needs pandas and pyarrow (verl has both).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
TASK_FILES = (HERE.parent / "math.jsonl", HERE.parent / "code.jsonl")


def rows() -> list[dict]:
    out = []
    for path in TASK_FILES:
        for line in path.read_text().splitlines():
            task = json.loads(line)["task"]
            index = len(out)
            text = task.get("problem") or task.get("prompt") or ""
            out.append(
                {
                    # verl tokenizes `prompt` for its length filter; the service's kind renders the real prompt
                    "prompt": [{"role": "user", "content": text}],
                    "data_source": f"rollouts/{task['kind']}",
                    "agent_name": "rollouts",
                    "reward_model": {"style": "rule", "ground_truth": str(task.get("answer", ""))},
                    "extra_info": {
                        "index": index,
                        "rollouts_task": json.dumps(task),
                        "rollouts_key": str(task.get("id", index)),
                    },
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/verl-rows"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows())
    table.to_parquet(args.out / "train.parquet")
    table.iloc[::5].to_parquet(args.out / "val.parquet")
    print(f"{len(table)} rows in {args.out}")


if __name__ == "__main__":
    main()
