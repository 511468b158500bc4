"""Small git repositories shaped like SWE-bench's, built in a test, with rows as SWE-bench publishes them.

Three runners, as the official harness picks them: a Django-style repository
(`django/django`: a tiny `tests/runtests.py` that takes test labels and prints
what Django's runner prints at --verbosity 2, docstring descriptions included),
a sympy-style one (`sympy/sympy`: `bin/test -C --verbose FILES`, printing
`test_name ok|F|E`), and a pytest one. Each row's gold `patch` fixes a bug
that its FAIL_TO_PASS tests (added by `test_patch`) catch; FAIL_TO_PASS and
PASS_TO_PASS are JSON strings, and `version`/`environment_setup_commit` are
there, as in the published JSONL.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@localhost",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}

DJANGO_RUNTESTS = '''\
#!/usr/bin/env python
"""Runs test labels (module, module.Class, module.Class.method under tests/) like Django's runtests.py."""
import argparse, os, sys, unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]


class Result(unittest.TextTestResult):
    def getDescription(self, test):  # Django's runner: "name (module.Class)", then the docstring's first line
        text = "%s (%s.%s)" % (test._testMethodName, type(test).__module__, type(test).__qualname__)
        doc = test.shortDescription()
        return text + "\\n" + doc if doc else text


parser = argparse.ArgumentParser()
parser.add_argument("labels", nargs="*")
parser.add_argument("--verbosity", type=int, default=1)
parser.add_argument("--settings")
parser.add_argument("--parallel", type=int, default=0)
args = parser.parse_args()
print("Testing against Django installed in %r" % os.path.dirname(HERE))
suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromName(label) for label in args.labels)
outcome = unittest.TextTestRunner(verbosity=args.verbosity, resultclass=Result).run(suite)
sys.exit(0 if outcome.wasSuccessful() else 1)
'''

SYMPY_BIN_TEST = '''\
#!/usr/bin/env python
"""Runs the test_* functions of the given files and prints them like sympy's bin/test --verbose."""
import importlib.util, os, sys, traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
files = [a for a in sys.argv[1:] if not a.startswith("-")]
failures, ok = [], True
for path in files:
    spec = importlib.util.spec_from_file_location(path[:-3].replace("/", "."), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [n for n in vars(module) if n.startswith("test_") and callable(getattr(module, n))]
    print("%s[%d] " % (path, len(tests)))
    for name in tests:
        try:
            getattr(module, name)()
            print("%s ok" % name)
        except AssertionError:
            print("%s F" % name)
            failures.append((path, name, traceback.format_exc()))
            ok = False
        except Exception:
            print("%s E" % name)
            failures.append((path, name, traceback.format_exc()))
            ok = False
for path, name, text in failures:
    print("%s %s:%s %s" % ("_" * 10, path, name, "_" * 10))
    print(text)
sys.exit(0 if ok else 1)
'''


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_GIT_ENV}, capture_output=True, check=True)
    return done.stdout.decode()


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if relative in ("tests/runtests.py", "bin/test"):
            path.chmod(0o755)


def _repo_row(
    root: Path,
    repo: str,
    instance_id: str,
    base: dict[str, str],
    fixed: dict[str, str],
    tests_after: dict[str, str],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
) -> dict[str, Any]:
    """Commit `base`, and diff the fix and the new tests against it: a SWE-bench row over that repo."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    _write(root, base)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    commit = git(root, "rev-parse", "HEAD").strip()
    _write(root, fixed)
    patch = git(root, "diff")
    git(root, "checkout", "-q", "--", ".")
    _write(root, tests_after)
    git(root, "add", "-N", ".")
    test_patch = git(root, "diff")
    git(root, "reset", "-q", "--hard")
    git(root, "clean", "-qfd")
    return {
        "repo": repo,
        "instance_id": instance_id,
        "base_commit": commit,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": f"{instance_id}: the function is wrong.",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "4.0" if repo == "django/django" else "1.0",
        "FAIL_TO_PASS": json.dumps(fail_to_pass),
        "PASS_TO_PASS": json.dumps(pass_to_pass),
        "environment_setup_commit": commit,
    }


def django_row(root: Path) -> dict[str, Any]:
    test_old = (
        "import unittest\nfrom calc import add\n\n\nclass AddTests(unittest.TestCase):\n"
        "    def test_zero(self):\n        self.assertEqual(add(5, 0), 5)\n\n"
        '    def test_documented(self):\n        """Adding nothing changes nothing."""\n'
        "        self.assertEqual(add(0, 0), 0)\n"
    )
    test_new = test_old + "\n    def test_adds(self):\n        self.assertEqual(add(2, 3), 5)\n"
    return _repo_row(
        root,
        "django/django",
        "django__django-1",
        base={
            "calc/__init__.py": "def add(a, b):\n    return a - b\n",
            "tests/runtests.py": DJANGO_RUNTESTS,
            "tests/calc_tests/__init__.py": "",
            "tests/calc_tests/test_add.py": test_old,
        },
        fixed={"calc/__init__.py": "def add(a, b):\n    return a + b\n"},
        tests_after={"tests/calc_tests/test_add.py": test_new},
        fail_to_pass=["test_adds (calc_tests.test_add.AddTests)"],
        pass_to_pass=["test_zero (calc_tests.test_add.AddTests)", "Adding nothing changes nothing."],
    )


def sympy_row(root: Path) -> dict[str, Any]:
    tests_old = "from symp.core import double\n\n\ndef test_identity():\n    assert double(0) * 0 == 0\n"
    tests_new = tests_old + "\n\ndef test_double():\n    assert double(3) == 6\n"
    return _repo_row(
        root,
        "sympy/sympy",
        "sympy__sympy-1",
        base={
            "symp/__init__.py": "",
            "symp/core.py": "def double(x):\n    return x + x + 1\n",
            "symp/tests/__init__.py": "",
            "symp/tests/test_core.py": tests_old,
            "bin/test": SYMPY_BIN_TEST,
        },
        fixed={"symp/core.py": "def double(x):\n    return x + x\n"},
        tests_after={"symp/tests/test_core.py": tests_new},
        fail_to_pass=["test_double"],
        pass_to_pass=["test_identity"],
    )


def pytest_row(root: Path) -> dict[str, Any]:
    tests_old = "from pyfix.text import shout\n\n\ndef test_empty():\n    assert shout('') == '!'\n"
    tests_new = tests_old + "\n\nclass TestShout:\n    def test_word(self):\n        assert shout('hi') == 'HI!'\n"
    return _repo_row(
        root,
        "acme/pyfix",
        "acme__pyfix-1",
        base={
            "pyfix/__init__.py": "",
            "pyfix/text.py": "def shout(text):\n    return text + '!'\n",
            "tests/test_text.py": tests_old,
        },
        fixed={"pyfix/text.py": "def shout(text):\n    return text.upper() + '!'\n"},
        tests_after={"tests/test_text.py": tests_new},
        fail_to_pass=["tests/test_text.py::TestShout::test_word"],
        pass_to_pass=["tests/test_text.py::test_empty"],
    )


def build_mirror(mirror: Path) -> list[dict[str, Any]]:
    """The three repositories under `mirror` (owner__name, SWE-bench's naming); their rows, as published."""
    return [
        django_row(mirror / "django__django"),
        sympy_row(mirror / "sympy__sympy"),
        pytest_row(mirror / "acme__pyfix"),
    ]
