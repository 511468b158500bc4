"""The old hand-written math grader, math-verify as published, and the new grader, on generated answer cases.

Prints the agreement table (bench/answer_cases.py: every case's expected verdict and each grader's),
every case where the graders disagree, and grades per second of the old and the new grader measured
in this one process, one after the other, on the same cases: the comparison alone, after the
verdict pass has warmed both up (each then runs in a child process per check, which costs the same
for both), and the new grader end to end through `equivalent` (a forkserver child per check, as the
math and stem kinds call it) on the first `--child` cases.

The old grader is read from git at OLD_COMMIT (its modules were deleted when math-verify replaced
them), so the comparison stays reproducible:

    .venv/bin/python -m bench.graders [--repeats 3] [--child 100] [--cases N]
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench.answer_cases import Case, cases

OLD_COMMIT = "862f7eed38496532bdd813215e381c2511ce534b"  # main before this branch: the hand-written grader
ROOT = Path(__file__).resolve().parents[1]
Grader = Callable[[str, str], bool]


def old_grader() -> Grader:
    """`compare` of the hand-written grader (workers/eval/math_equiv.py and latex.py at OLD_COMMIT)."""
    package = types.ModuleType("old_graders")
    package.__path__ = []
    sys.modules["old_graders"] = package
    for name in ("latex", "math_equiv"):
        source = subprocess.run(
            ["git", "show", f"{OLD_COMMIT}:workers/eval/{name}.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.replace("from workers.eval.latex import", "from old_graders.latex import")
        module = types.ModuleType(f"old_graders.{name}")
        sys.modules[module.__name__] = module
        exec(compile(source, f"{OLD_COMMIT[:7]}:workers/eval/{name}.py", "exec"), module.__dict__)  # noqa: S102
    compare = sys.modules["old_graders.math_equiv"].compare
    return lambda answer, reference: bool(compare(answer, reference).equivalent)


def math_verify_grader() -> Grader:
    """math-verify as its README uses it: both sides parsed (here from a \\boxed{}), then verify(gold, answer)."""
    from math_verify import parse, verify

    def grade(answer: str, reference: str) -> bool:
        return bool(verify(parse(f"\\boxed{{{reference}}}"), parse(f"\\boxed{{{answer}}}")))

    return grade


def new_grader() -> Grader:
    """The grader the math and stem kinds use now (in-process: its comparison without the child process)."""
    from workers.eval.math_equiv import compare

    return lambda answer, reference: bool(compare(answer, reference).equivalent)


_OLD_END_TO_END = """
import sys, time
from bench.answer_cases import cases
from workers.eval.math_equiv import equivalent
table = cases()[: int(sys.argv[1])]
equivalent("1", "1")
start = time.perf_counter()
for case in table:
    equivalent(case.answer, case.reference)
print(len(table) / (time.perf_counter() - start))
"""


def old_end_to_end(count: int) -> float:
    """Grades/s of the old grader's own `equivalent` (its forkserver child per check), run from a tree of
    OLD_COMMIT's workers/ and shared/ in a temporary directory (a process of its own: the module names clash)."""
    with tempfile.TemporaryDirectory() as tree:
        archive = subprocess.run(
            ["git", "archive", OLD_COMMIT, "workers", "shared"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        (Path(tree) / "bench").mkdir()
        (Path(tree) / "bench" / "__init__.py").write_text("")
        (Path(tree) / "bench" / "answer_cases.py").write_text((ROOT / "bench" / "answer_cases.py").read_text())
        done = subprocess.run(
            [sys.executable, "-c", _OLD_END_TO_END, str(count)], cwd=tree, check=True, capture_output=True, text=True
        )
    return float(done.stdout.strip().splitlines()[-1])


def end_to_end() -> Grader:
    """The new grader as the kinds call it: `equivalent`, in a forkserver child with the time limit."""
    from workers.eval.math_equiv import equivalent

    equivalent("1", "1")  # start the forkserver outside the measurement
    return lambda answer, reference: bool(equivalent(answer, reference).equivalent)


def verdicts(grader: Grader, table: list[Case]) -> list[bool]:
    return [grader(case.answer, case.reference) for case in table]


def grades_per_second(grader: Grader, table: list[Case], repeats: int) -> float:
    """The best of `repeats` passes over the table."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        verdicts(grader, table)
        best = min(best, time.perf_counter() - start)
    return len(table) / best


def mark(verdict: bool, expected: bool) -> str:
    return ("=" if verdict else "≠") + ("" if verdict == expected else " ✗")


def summary(table: list[Case], columns: dict[str, list[bool]]) -> str:
    """Per family: cases, and how many each grader got right."""
    names = list(columns)
    lines = ["| family | cases | " + " | ".join(f"{n} right" for n in names) + " |", "|---" * (2 + len(names)) + "|"]
    right: dict[str, Counter[str]] = {n: Counter() for n in names}
    total: Counter[str] = Counter()
    for i, case in enumerate(table):
        total[case.family] += 1
        for n in names:
            right[n][case.family] += columns[n][i] == case.expected
    for family in total:
        lines.append(f"| {family} | {total[family]} | " + " | ".join(str(right[n][family]) for n in names) + " |")
    all_right = " | ".join(f"**{sum(right[n].values())}**" for n in names)
    lines.append(f"| **all** | **{len(table)}** | {all_right} |")
    return "\n".join(lines)


def disagreements(table: list[Case], columns: dict[str, list[bool]]) -> str:
    """Every case where two graders differ, or one differs from the expected verdict (✗: wrong)."""
    names = list(columns)
    lines = ["| family | reference | answer | expected | " + " | ".join(names) + " |", "|---" * (4 + len(names)) + "|"]
    for i, case in enumerate(table):
        row = [columns[n][i] for n in names]
        if len(set(row)) > 1 or any(v != case.expected for v in row):
            cells = " | ".join(mark(v, case.expected) for v in row)
            expected = "=" if case.expected else "≠"
            lines.append(f"| {case.family} | `{case.reference}` | `{case.answer}` | {expected} | {cells} |")
    return "\n".join(lines)


def spread(table: list[Case], count: int) -> list[Case]:
    """`count` cases taken at an even stride, so a short run still meets most families."""
    stride = max(1, len(table) // max(count, 1))
    return table[::stride][:count]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", type=int, default=100, help="cases graded end to end, a child process each")
    parser.add_argument("--cases", type=int, help="only every case up to this many, spread over the families")
    args = parser.parse_args(argv)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    table = cases() if args.cases is None else spread(cases(), args.cases)
    graders = {"old": old_grader(), "math-verify": math_verify_grader(), "new": new_grader()}
    columns = {name: verdicts(grader, table) for name, grader in graders.items()}
    print(
        f"{len(table)} cases ({sum(c.expected for c in table)} equivalent, {sum(not c.expected for c in table)} not)\n"
    )
    print(summary(table, columns), end="\n\n")
    print(disagreements(table, columns), end="\n\n")
    rates = {name: grades_per_second(graders[name], table, args.repeats) for name in ("old", "new")}
    rates["old, through equivalent() (a child process per check)"] = old_end_to_end(args.child)
    rates["new, through equivalent() (a child process per check)"] = grades_per_second(
        end_to_end(), table[: args.child], 1
    )
    print("| grader | grades/s |\n|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.1f} |")


if __name__ == "__main__":
    main()
