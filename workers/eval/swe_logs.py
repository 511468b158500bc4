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

Outcomes are "passed", "failed", "error" or "skipped". Stricter than SWE-bench in two ways, since
here the verdict is a reward that the patched code could try to forge by printing runner lines: a
test once seen failing or erroring stays so (a later "ok" line for it does not pass it), and an
`ok` on its own line counts only when it is exactly `ok` and before the run's summary (after it,
tracebacks of failures follow, whose lines may well start with "ok").
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
    summary = False
    for raw in log.split("\n"):
        line = raw.strip()
        if line.startswith(("=" * 10, "-" * 10)) or (line.startswith("Ran ") and " test" in line):
            summary = True
        if " ... " in line:
            last_started = line.split(" ... ", 1)[0]
        passed = next((s for s in _DJANGO_PASS if line.endswith(s)), None)
        if passed is not None:
            _record(outcomes, line[: -len(passed)], "passed")
        if " ... skipped" in line:
            _record(outcomes, line.split(" ... skipped", 1)[0], "skipped")
        if line.endswith(" ... FAIL"):
            _record(outcomes, line[: -len(" ... FAIL")], "failed")
        if line.endswith(" ... ERROR"):
            _record(outcomes, line[: -len(" ... ERROR")], "error")
        for header, outcome in (("FAIL:", "failed"), ("ERROR:", "error")):
            if line.startswith(header) and len(line.split()) > 1:
                _record(outcomes, line.split()[1], outcome)
        if line == "ok" and last_started is not None and not summary:
            _record(outcomes, last_started, "passed")  # the test printed between its dots and its status
    for pattern in _DJANGO_SPLIT_OK:
        for match in pattern.finditer(log):
            _record(outcomes, match.group(1), "passed")
    return outcomes


def _record(outcomes: dict[str, str], test: str, outcome: str) -> None:
    """Set a test's outcome; a failure or error, once seen, is never overwritten by a pass or skip."""
    if outcomes.get(test) in ("failed", "error") and outcome not in ("failed", "error"):
        return
    outcomes[test] = outcome


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
            _record(outcomes, name, "error")
        elif line.endswith(" F"):
            _record(outcomes, name, "failed")
        elif line.endswith(" ok"):
            _record(outcomes, name, "passed")
    return outcomes
