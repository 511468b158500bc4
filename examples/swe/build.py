"""Build the example SWE instances: tiny repositories with a real bug, tests, and SWE-bench-style rows.

For each project below this writes `examples/swe/repos/<name>/` (the buggy
repository at its base commit, as plain files; the swe kind snapshots them
into a one-commit git repository whose hash is `base_commit`) and one line of
`examples/swe.jsonl`. It also checks each instance for real before writing
it: with the test patch applied, FAIL_TO_PASS fails and PASS_TO_PASS passes on
the base, and everything passes with the reference fix (`patch`).

Run from the repository root: `python examples/swe/build.py`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from workers.init.swe_repo import git, snapshot_commit  # noqa: E402

HERE = Path(__file__).resolve().parent
REPOS = HERE / "repos"
OUT = ROOT / "examples" / "swe.jsonl"
LIMITS = {"max_turns": 8, "rollout_timeout_s": 600, "eval_timeout_s": 300}


@dataclass
class Project:
    name: str
    package: str
    problem: str
    buggy: str  # <package>/core.py at the base commit
    fixed: str  # the same file with the reference fix
    tests: str  # tests/test_core.py at the base commit (PASS_TO_PASS)
    new_tests: str  # appended by the test patch (FAIL_TO_PASS)


PROJECTS = [
    Project(
        name="slugkit",
        package="slugkit",
        problem=(
            "slugify() leaves repeated and edge dashes in the slug. `slugify('  Hello,   World!  ')` "
            "returns '-hello-world-' (and 'a--b' for 'a - b'); it should return 'hello-world' and 'a-b': "
            "runs of separators become one dash and the slug never starts or ends with a dash."
        ),
        buggy='''"""URL slugs."""
import re


def slugify(text: str) -> str:
    """Lowercase `text` and join its words with single dashes."""
    text = text.lower()
    return re.sub(r"[^a-z0-9]", "-", text).replace("--", "-")
''',
        fixed='''"""URL slugs."""
import re


def slugify(text: str) -> str:
    """Lowercase `text` and join its words with single dashes."""
    text = text.lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")
''',
        tests="""from slugkit.core import slugify


def test_simple_word():
    assert slugify("hello") == "hello"


def test_lowercases():
    assert slugify("ABC") == "abc"
""",
        new_tests="""

def test_collapses_separators():
    assert slugify("a - b") == "a-b"


def test_strips_edges():
    assert slugify("  Hello,   World!  ") == "hello-world"
""",
    ),
    Project(
        name="spans",
        package="spans",
        problem=(
            "merge() does not merge intervals that touch. `merge([(1, 2), (2, 3)])` returns "
            "[(1, 2), (2, 3)] but should return [(1, 3)]: intervals are closed, so sharing an "
            "endpoint means they overlap."
        ),
        buggy='''"""Closed integer intervals."""


def merge(intervals):
    """Merge overlapping closed intervals; returns a sorted list of (start, end)."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
''',
        fixed='''"""Closed integer intervals."""


def merge(intervals):
    """Merge overlapping closed intervals; returns a sorted list of (start, end)."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
''',
        tests="""from spans.core import merge


def test_disjoint_stay_apart():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_overlapping_merge():
    assert merge([(1, 4), (2, 3), (3, 8)]) == [(1, 8)]
""",
        new_tests="""

def test_touching_merge():
    assert merge([(1, 2), (2, 3)]) == [(1, 3)]
""",
    ),
    Project(
        name="numerals",
        package="numerals",
        problem=(
            "from_roman() gets subtractive numerals wrong: `from_roman('IV')` returns 6 and "
            "`from_roman('XC')` returns 110. A smaller numeral before a larger one is subtracted "
            "(IV = 4, XC = 90, MCMXCIV = 1994)."
        ),
        buggy='''"""Roman numerals."""

VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def from_roman(numeral: str) -> int:
    """The integer value of a Roman numeral."""
    return sum(VALUES[char] for char in numeral.upper())
''',
        fixed='''"""Roman numerals."""

VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def from_roman(numeral: str) -> int:
    """The integer value of a Roman numeral."""
    digits = [VALUES[char] for char in numeral.upper()]
    total = 0
    for i, value in enumerate(digits):
        if i + 1 < len(digits) and value < digits[i + 1]:
            total -= value
        else:
            total += value
    return total
''',
        tests="""from numerals.core import from_roman


def test_additive():
    assert from_roman("XVII") == 17


def test_lowercase():
    assert from_roman("mmx") == 2010
""",
        new_tests="""

def test_subtractive():
    assert from_roman("IV") == 4
    assert from_roman("XC") == 90


def test_year():
    assert from_roman("MCMXCIV") == 1994
""",
    ),
    Project(
        name="csvlite",
        package="csvlite",
        problem=(
            "split_row() breaks quoted fields that contain commas: `split_row('a,\"b,c\",d')` returns "
            "['a', '\"b', 'c\"', 'd'] instead of ['a', 'b,c', 'd']. A field in double quotes may contain "
            "commas; the quotes are not part of the value."
        ),
        buggy='''"""A tiny CSV row splitter."""


def split_row(line: str) -> list:
    """Split one CSV line into its fields."""
    return [field.strip() for field in line.split(",")]
''',
        fixed='''"""A tiny CSV row splitter."""


def split_row(line: str) -> list:
    """Split one CSV line into its fields."""
    fields, current, quoted = [], [], False
    for char in line:
        if char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            fields.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    fields.append("".join(current).strip())
    return fields
''',
        tests="""from csvlite.core import split_row


def test_plain_fields():
    assert split_row("a,b,c") == ["a", "b", "c"]


def test_strips_spaces():
    assert split_row(" a , b ") == ["a", "b"]
""",
        new_tests="""

def test_quoted_comma():
    assert split_row('a,"b,c",d') == ["a", "b,c", "d"]
""",
    ),
    Project(
        name="statsmini",
        package="statsmini",
        problem=(
            "median() is wrong for unsorted input and for an even number of values: "
            "`median([3, 1, 2])` returns 1 (should be 2) and `median([1, 2, 3, 4])` returns 3 "
            "(should be 2.5, the mean of the two middle values)."
        ),
        buggy='''"""Small statistics helpers."""


def mean(values):
    return sum(values) / len(values)


def median(values):
    """The middle value of `values`."""
    return values[len(values) // 2]
''',
        fixed='''"""Small statistics helpers."""


def mean(values):
    return sum(values) / len(values)


def median(values):
    """The middle value of `values`."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
''',
        tests="""from statsmini.core import mean, median


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_sorted_odd():
    assert median([1, 2, 3]) == 2
""",
        new_tests="""

def test_median_unsorted():
    assert median([3, 1, 2]) == 2


def test_median_even():
    assert median([1, 2, 3, 4]) == 2.5
""",
    ),
]


def write_repo(project: Project, dest: Path, core: str) -> None:
    (dest / project.package).mkdir(parents=True)
    (dest / "tests").mkdir()
    (dest / project.package / "__init__.py").write_text(f'"""{project.name}: a tiny example project."""\n')
    (dest / project.package / "core.py").write_text(core)
    (dest / "tests" / "test_core.py").write_text(project.tests)
    (dest / "README.md").write_text(f"# {project.name}\n\nRun the tests with `python -m pytest`.\n")


def test_ids(source: str) -> list[str]:
    return [
        f"tests/test_core.py::{line[4:].split('(')[0]}" for line in source.splitlines() if line.startswith("def test")
    ]


def patch_between(base: Path, change) -> str:  # type: ignore[no-untyped-def]
    """The git diff that `change(tree)` makes to a copy of `base`."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "t"
        shutil.copytree(base, tree)
        snapshot_commit(tree)
        change(tree)
        return git(tree, "diff").decode()


def pytest_outcomes(tree: Path) -> dict[str, bool]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", "tests"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    outcomes = {}
    for line in done.stdout.splitlines():
        for status in ("PASSED", "FAILED"):
            if line.startswith(status + " "):
                outcomes[line.split()[1]] = status == "PASSED"
    return outcomes


def verify(project: Project, base: Path, test_patch: str, patch: str) -> None:
    """FAIL_TO_PASS fails and PASS_TO_PASS passes on the base; all pass with the reference fix."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "t"
        shutil.copytree(base, tree)
        snapshot_commit(tree)
        git(tree, "apply", "-", stdin=test_patch.encode())
        before = pytest_outcomes(tree)
        git(tree, "apply", "-", stdin=patch.encode())
        after = pytest_outcomes(tree)
    for test in test_ids(project.new_tests):
        assert before.get(test) is False and after.get(test) is True, (project.name, test, before, after)
    for test in test_ids(project.tests):
        assert before.get(test) is True and after.get(test) is True, (project.name, test, before, after)


def build(project: Project) -> dict:
    dest = REPOS / project.name
    if dest.exists():
        shutil.rmtree(dest)
    write_repo(project, dest, project.buggy)
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / "s"
        shutil.copytree(dest, snapshot)
        base_commit = snapshot_commit(snapshot)
    test_file = "tests/test_core.py"
    core_file = f"{project.package}/core.py"
    test_patch = patch_between(dest, lambda t: (t / test_file).write_text(project.tests + project.new_tests))
    patch = patch_between(dest, lambda t: (t / core_file).write_text(project.fixed))
    verify(project, dest, test_patch, patch)
    task = {
        "kind": "swe",
        "instance_id": f"rollouts-examples__{project.name}-1",
        "repo": f"rollouts-examples/{project.name}",
        "repo_path": f"examples/swe/repos/{project.name}",
        "base_commit": base_commit,
        "problem_statement": project.problem,
        "test_patch": test_patch,
        "patch": patch,
        "FAIL_TO_PASS": test_ids(project.new_tests),
        "PASS_TO_PASS": test_ids(project.tests),
        "image": None,
        "test_timeout_s": 120,
    }
    return {"task": task, "limits": LIMITS}


def main() -> None:
    rows = [build(project) for project in PROJECTS]
    with OUT.open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} instances to {OUT.relative_to(ROOT)}, repositories under {REPOS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
