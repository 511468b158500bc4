"""Public dataset formats, read as they are published: which kind a row is, and what its fields mean.

A row of GSM8K, MATH, a plain-answer set (NuminaMath, DeepScaleR), MBPP, HumanEval or
SWE-bench becomes a task by adding `kind` and `format`; the kinds read the published
fields through this module (the question, the reference extracted from the worked
answer, the tests), so no row is rewritten and nothing is lost. `detect` names the
format of a row, or says what each format would need.
"""

from __future__ import annotations

import json
from typing import Any

from shared.errors import RolloutsError
from shared.jobs.spec import FORMAT_KINDS, FORMATS
from shared.kinds.latex import last_boxed
from shared.kinds.numbers import plain_final_answer
from shared.tasks.base import TaskValidationError

# What each format needs, for the message when a row matches none.
_NEEDS = {
    "swebench": "instance_id, repo, base_commit, FAIL_TO_PASS",
    "humaneval": "prompt, canonical_solution, test, entry_point",
    "mbpp": "text (or prompt), code, test_list",
    "gsm8k": 'question, answer ending in "#### <number>"',
    "answer": "problem (or question), answer",
    "math": "problem, solution with \\boxed{...}",
}
_GSM8K_MARK = "####"


class FormatError(RolloutsError, ValueError):
    """A row that matches no format, or lacks a field of the one named; the message names the field."""


def _has_text(row: dict[str, Any], field: str) -> bool:
    return isinstance(row.get(field), str) and bool(row[field].strip())


def detect(row: dict[str, Any]) -> str:
    """The format of a dataset row; raises FormatError saying what each format needs."""
    if all(k in row for k in ("instance_id", "base_commit", "FAIL_TO_PASS")):
        return "swebench"
    if all(k in row for k in ("canonical_solution", "test", "entry_point")):
        return "humaneval"
    if "test_list" in row and "code" in row:
        return "mbpp"
    if _has_text(row, "question") and isinstance(row.get("answer"), str) and _GSM8K_MARK in row["answer"]:
        return "gsm8k"
    if (_has_text(row, "problem") or _has_text(row, "question")) and _answer_given(row.get("answer")):
        return "answer"
    if _has_text(row, "problem") and _has_text(row, "solution"):
        return "math"
    fields = ", ".join(sorted(row)) or "none"
    needs = "; ".join(f"{name}: {what}" for name, what in _NEEDS.items())
    raise FormatError(f"matches no known format (its fields: {fields}). Formats need: {needs}")


# What NuminaMath-1.5 writes in `answer` where a problem has none to check.
_NO_ANSWER = frozenset({"proof", "notfound"})


def _answer_given(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or (isinstance(value, str) and bool(value.strip()))


def row_to_task(row: dict[str, Any], fmt: str | None = None) -> dict[str, Any]:
    """A dataset row as a task dict: the row as it is plus `kind` and `format` (detected if None)."""
    if fmt is None:
        fmt = detect(row)
    if fmt not in FORMAT_KINDS:
        raise FormatError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    task = dict(row)
    task["kind"] = FORMAT_KINDS[fmt]
    task["format"] = fmt
    check_task(task)
    return task


def task_format(task: dict[str, Any], kind: str) -> str | None:
    """The task's `format`, checked against its kind (None: the kind's own fields)."""
    fmt = task.get("format")
    if fmt is None:
        return None
    if fmt not in FORMAT_KINDS:
        raise TaskValidationError(f"task.format: one of {', '.join(FORMATS)}")
    if FORMAT_KINDS[fmt] != kind:
        raise TaskValidationError(f"task.format: {fmt!r} rows run as kind {FORMAT_KINDS[fmt]!r}, not {kind!r}")
    return fmt


def check_task(task: dict[str, Any]) -> None:
    """Raise FormatError if a task made by `row_to_task` lacks what its format needs (the kind's own checks
    of these fields, without loading the kind)."""
    fmt = task["format"]
    try:
        if fmt in ("gsm8k", "math", "answer"):
            math_problem(task)
            math_reference(task)
        elif fmt in ("mbpp", "humaneval"):
            code_fields(task)
    except TaskValidationError as exc:
        raise FormatError(str(exc)) from None


# --- math rows ---------------------------------------------------------------
def math_problem(task: dict[str, Any]) -> str:
    """The statement: `problem` (MATH, NuminaMath, the math kind) or `question` (GSM8K)."""
    for field in ("problem", "question"):
        if _has_text(task, field):
            return task[field]
    name = "question" if task.get("format") == "gsm8k" else "problem"
    raise TaskValidationError(f"task.{name}: required, a non-empty string")


def gsm8k_final(answer_text: str) -> str | None:
    """The number after the last "####" of a GSM8K answer ("1,000" -> "1000"), or None."""
    if _GSM8K_MARK not in answer_text:
        return None
    return plain_final_answer(answer_text.rsplit(_GSM8K_MARK, 1)[1]) or None


def math_reference(task: dict[str, Any]) -> str:
    """The reference answer as text, extracted as the row's format says."""
    fmt = task.get("format")
    if fmt == "gsm8k":
        found = gsm8k_final(task["answer"]) if isinstance(task.get("answer"), str) else None
        if found is None:
            raise TaskValidationError('task.answer: a GSM8K answer ending in "#### <final answer>"')
        return found
    if fmt == "math":
        solution = task.get("solution")
        boxed = last_boxed(solution) if isinstance(solution, str) else None
        if boxed is None or not boxed.strip():
            raise TaskValidationError("task.solution: a worked solution with the final answer in \\boxed{...}")
        return boxed.strip()
    value = task.get("answer")
    if not _answer_given(value):
        raise TaskValidationError("task.answer: required, the reference answer (a string or a number)")
    if isinstance(value, str) and value.strip().lower() in _NO_ANSWER:
        raise TaskValidationError(
            f"task.answer: {value.strip()!r} marks a problem with no checkable final answer (NuminaMath writes it "
            "for proofs and unsolved rows): this row could only ever score 0"
        )
    return value if isinstance(value, str) else repr(value)


def math_reference_output(task: dict[str, Any]) -> dict[str, Any]:
    """The row's own reference as a rollout would give it: the worked solution as the final text
    (so extraction runs as on a model's answer), or the plain answer via finish."""
    fmt = task.get("format")
    if fmt == "gsm8k":
        return {"final_text": task["answer"], "answer": None}
    if fmt == "math":
        return {"final_text": task["solution"], "answer": None}
    return {"final_text": "", "answer": math_reference(task)}


# --- code rows ---------------------------------------------------------------
_HUMANEVAL_INSTRUCTIONS = (
    "Complete the Python function below. Write the whole function (with the imports it needs) to "
    "`solution.py`.\n\n```python\n{prompt}```"
)
_MBPP_INSTRUCTIONS = "{text}\nWrite the function in `solution.py`. Your code should pass these tests:\n\n{tests}"


def _string_list(task: dict[str, Any], field: str, required: bool) -> list[str]:
    value = task.get(field)
    if value is None and not required:
        return []
    if isinstance(value, str):  # some exports store lists as JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (required and not value):
        raise TaskValidationError(f"task.{field}: a list of strings" + (" (at least one)" if required else ""))
    return value


def code_fields(task: dict[str, Any]) -> dict[str, Any]:
    """An MBPP or HumanEval row as the code kind's own fields (prompt, tests, starter code, reference),
    without `format` (so reading it again changes nothing); a task without a format is returned as it is.

    As their own harnesses run them: pass/fail per problem (`scoring` "all" unless the row says
    "fraction"), and MBPP's `test_setup_code` runs in the solution's module (`setup_code`) as well as
    before each assert, as in MBPP's one-program harness; `challenge_tests: true` adds the
    `challenge_test_list` asserts."""
    fmt = task.get("format")
    if fmt == "humaneval":
        for field in ("prompt", "canonical_solution", "test", "entry_point"):
            if not isinstance(task.get(field), str) or (field != "canonical_solution" and not task[field].strip()):
                raise TaskValidationError(f"task.{field}: required, a string (HumanEval)")
        if not task["entry_point"].isidentifier():
            raise TaskValidationError("task.entry_point: the name of the function under test")
        check = f"{task['test']}\n\ncheck({task['entry_point']})\n"
        return {
            **{k: v for k, v in task.items() if k != "format"},
            "scoring": task.get("scoring", "all"),
            "prompt": _HUMANEVAL_INSTRUCTIONS.format(prompt=task["prompt"]),
            "starter_code": task["prompt"],
            "tests": [{"name": "check", "code": check}],
            "reference_solution": task["prompt"] + task["canonical_solution"],
        }
    if fmt == "mbpp":
        text = task.get("text") if _has_text(task, "text") else task.get("prompt")
        if not isinstance(text, str) or not text.strip():
            raise TaskValidationError("task.text: required, the problem statement (MBPP; `prompt` in sanitized MBPP)")
        if not isinstance(task.get("code"), str) or not task["code"].strip():
            raise TaskValidationError("task.code: required, the reference solution (MBPP)")
        asserts = _string_list(task, "test_list", required=True)
        setup = task.get("test_setup_code") or ""
        if not isinstance(setup, str):
            raise TaskValidationError("task.test_setup_code: a string")
        challenge = task.get("challenge_tests", False)
        if not isinstance(challenge, bool):
            raise TaskValidationError("task.challenge_tests: true or false (also run MBPP's challenge_test_list)")
        named = [(f"test_list[{i}]", line) for i, line in enumerate(asserts)]
        if challenge:
            extra = _string_list(task, "challenge_test_list", required=False)
            named += [(f"challenge_test_list[{i}]", line) for i, line in enumerate(extra)]
        imports = "\n".join(_string_list(task, "test_imports", required=False))
        prefix = "\n".join(part for part in (imports, setup) if part.strip())
        tests = [{"name": name, "code": f"{prefix}\n{line}\n" if prefix else line} for name, line in named]
        fields = {k: v for k, v in task.items() if k != "format"}
        return {
            **fields,
            "prompt": _MBPP_INSTRUCTIONS.format(text=text.strip(), tests="\n".join(asserts)),
            "tests": tests,
            "reference_solution": task["code"],
            "scoring": task.get("scoring", "all"),
            **({"setup_code": setup} if setup.strip() else {}),
        }
    return task
