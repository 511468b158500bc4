"""Per-test outcomes from the logs of Django's and sympy's own test runners, read as SWE-bench reads them.

Neither runner writes a structured report, so SWE-bench's harness parses their
verbose output; these parsers follow its rules, so a test id of a published
instance (what that runner prints for the test) is found under the same name:

- Django (`runtests.py --verbosity 2`): `<description> ... ok|FAIL|ERROR|skipped ...`,
  where the description is `name (module.Class)` or the first line of the test's
  docstring; `FAIL: x` / `ERROR: x` headers; an `ok` on its own line after output
  that the test printed between the dots and its status.
- sympy (`bin/test -C --verbose`): `test_name ok|F|E` lines, and failure
  headers `____ path.py:test_name ____`.

Outcomes are "passed", "failed", "error" or "skipped".
"""

from __future__ import annotations

import re

_DJANGO_PASS = (" ... ok", " ... OK", " ...  OK")
# Output that Django's runner is known to interleave between a test's dots and its "ok".
_DJANGO_SPLIT_OK = (
    re.compile(r"^(.*?)\s\.\.\.\sTesting against Django installed in (?s:.*?) silenced\)\.\nok$", re.MULTILINE),
    re.compile(r"^(.*?)\s\.\.\.\sInternal Server Error: /(.*)/\nok$", re.MULTILINE),
    re.compile(r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$", re.MULTILINE),
)


def parse_django_log(log: str) -> dict[str, str]:
    """test description -> outcome, from `runtests.py --verbosity 2` output (stdout and stderr merged)."""
    outcomes: dict[str, str] = {}
    last_started: str | None = None
    for raw in log.split("\n"):
        line = raw.strip()
        if " ... " in line:
            last_started = line.split(" ... ", 1)[0]
        passed = next((s for s in _DJANGO_PASS if line.endswith(s)), None)
        if passed is not None:
            outcomes[line[: -len(passed)]] = "passed"
        if " ... skipped" in line:
            outcomes[line.split(" ... skipped", 1)[0]] = "skipped"
        if line.endswith(" ... FAIL"):
            outcomes[line[: -len(" ... FAIL")]] = "failed"
        if line.endswith(" ... ERROR"):
            outcomes[line[: -len(" ... ERROR")]] = "error"
        for header, outcome in (("FAIL:", "failed"), ("ERROR:", "error")):
            if line.startswith(header) and len(line.split()) > 1:
                outcomes[line.split()[1]] = outcome
        if line.startswith("ok") and last_started is not None:
            outcomes[last_started] = "passed"  # the test printed between its dots and its status
    for pattern in _DJANGO_SPLIT_OK:
        for match in pattern.finditer(log):
            outcomes[match.group(1)] = "passed"
    return outcomes


_SYMPY_FAILURE_HEADER = re.compile(r"_+ (\S+\.py):(\S+) _+")


def parse_sympy_log(log: str) -> dict[str, str]:
    """test name -> outcome, from `bin/test -C --verbose` output."""
    outcomes: dict[str, str] = {}
    for path, name in _SYMPY_FAILURE_HEADER.findall(log):
        outcomes[f"{path}:{name}"] = "failed"
    for raw in log.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        name = line.split()[0]
        if line.endswith(" E"):
            outcomes[name] = "error"
        elif line.endswith(" F"):
            outcomes[name] = "failed"
        elif line.endswith(" ok"):
            outcomes[name] = "passed"
    return outcomes
