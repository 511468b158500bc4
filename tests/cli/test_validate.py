"""`rollouts validate` and `given` jobs through a real stack (redis, API, one worker per stage, bubblewrap
sandboxes): published rows of every format, each row's own reference judged by the evaluation a rollout
gets; a wrong answer given the same way scores 0; rows that cannot be evaluated say why."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack import Stack
from shared.config import Settings
from tests.support.published_rows import (
    DEEPSCALER,
    GSM8K,
    GSM8K_THOUSANDS,
    HUMANEVAL,
    MATH,
    MBPP,
    NUMINA,
)
from tests.support.swe_repos import build_mirror
from tests.support.waiting import wait_for
from workers.sandbox.local import bwrap_usable

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS = [sys.executable, "-m", "cli"]


@pytest.fixture()
def stack(tmp_path: Path) -> Iterator[tuple[Stack, list[dict[str, Any]]]]:
    usable, reason = bwrap_usable()
    if not usable:
        pytest.skip(f"bubblewrap cannot run here: {reason}")
    swe_rows = build_mirror(tmp_path / "mirror")  # as published: no repo_path, the mirror has them
    settings = Settings(redis_url=None, state_dir=tmp_path / "state")
    stack = Stack(
        settings,
        api_port=0,
        concurrency={"init": 2, "rollout": 2, "eval": 3},
        log_dir=tmp_path / "logs",
        extra_env={"ROLLOUTS_SWE_REPO_MIRROR": str(tmp_path / "mirror")},
    )
    try:
        stack.start()
        stack.wait_for_workers()
        yield stack, swe_rows
    finally:
        stack.stop(timeout=10)


def _validate(stack: Stack, path: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list]:
    out = tmp_path / f"{path.stem}.verdicts.jsonl"
    done = subprocess.run(
        [*ROLLOUTS, "validate", str(path), "--url", stack.api_url, "--no-progress", "--output", str(out), *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=stack.env,
        check=False,
    )
    verdicts = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return done, verdicts


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_validate_scores_every_reference_1_and_says_why_for_the_rest(stack, tmp_path: Path) -> None:
    service, swe_rows = stack
    rows = [GSM8K, GSM8K_THOUSANDS, MATH, NUMINA, DEEPSCALER, MBPP, HUMANEVAL, *swe_rows]
    done, verdicts = _validate(service, _write_jsonl(tmp_path / "mixed.jsonl", rows), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [v["verdict"] for v in verdicts] == ["scored 1"] * len(rows), done.stdout
    assert [v["format"] for v in verdicts] == [
        "gsm8k",
        "gsm8k",
        "math",
        "answer",
        "answer",
        "mbpp",
        "humaneval",
        "swebench",
        "swebench",
        "swebench",
    ]
    assert f"{len(rows)} rows: {len(rows)} scored 1, 0 scored less, 0 cannot be evaluated" in done.stdout

    # Every result says why: what was extracted, the reference, the tests and their outcomes.
    client = httpx.Client(base_url=service.api_url, timeout=30)
    gsm = client.get(f"/v1/jobs/{verdicts[0]['job_id']}").json()["result"]["evaluation"]
    assert (gsm["extracted"], gsm["source"], gsm["reference"]) == ("72", "final_text.marker", "72")
    assert "matches reference '72'" in gsm["reason"]
    django = client.get(f"/v1/jobs/{verdicts[7]['job_id']}").json()
    assert django["result"]["trajectory"]["given"] is True
    evaluation = django["result"]["evaluation"]
    assert evaluation["runner"] == "django" and "runtests.py" in evaluation["test_command"]
    assert evaluation["PASS_TO_PASS"]["Adding nothing changes nothing."] == "passed"
    human = client.get(f"/v1/jobs/{verdicts[6]['job_id']}").json()["result"]["evaluation"]
    assert human["tests"] == [{"name": "check", "passed": True, "status": "passed"}] and "1/1" in human["reason"]
    client.close()


def test_validate_reports_rows_that_cannot_score_1(stack, tmp_path: Path) -> None:
    service, swe_rows = stack
    unrunnable = {**swe_rows[0], "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_adds"])}
    wrong_tests = {**MBPP, "test_list": ["assert similar_elements((1,), (2,)) == (1,)"]}
    rows = [
        {"title": "not a task"},
        {"problem": "1+1?", "solution": "It is two."},  # MATH-shaped, but no \boxed{} answer
        unrunnable,
        wrong_tests,
        GSM8K,
    ]
    done, verdicts = _validate(service, _write_jsonl(tmp_path / "bad.jsonl", rows), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    by_row = {v["row"]: v for v in verdicts}
    assert by_row[1]["verdict"] == "cannot be evaluated" and "matches no known format" in by_row[1]["why"]
    assert by_row[2]["verdict"] == "cannot be evaluated" and "task.solution" in by_row[2]["why"]
    assert by_row[3]["verdict"] == "cannot be evaluated" and "refused at submission" in by_row[3]["why"]
    assert "django__django-1" in by_row[3]["why"] and "tests/test_calc.py::test_adds" in by_row[3]["why"]
    assert by_row[4]["verdict"] == "scored less" and by_row[4]["reward"] == 0.0
    assert "0/1 tests passed" in by_row[4]["why"] and "test_list[0]: failed" in by_row[4]["why"]
    assert by_row[5]["verdict"] == "scored 1"
    assert "row 1 " in done.stdout and "5 rows: 1 scored 1, 1 scored less, 3 cannot be evaluated" in done.stdout

    # `submit` takes the same rows; the API's refusal names the file's row, the instance and the test id.
    submitted = subprocess.run(
        [
            *ROLLOUTS,
            "submit",
            str(_write_jsonl(tmp_path / "two.jsonl", [GSM8K, unrunnable])),
            "--url",
            service.api_url,
            "--no-wait",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=service.env,
        check=False,
    )
    assert submitted.returncode == 5 and "row 2: task.FAIL_TO_PASS/PASS_TO_PASS" in submitted.stderr  # refused input
    assert "django__django-1" in submitted.stderr and "row 1" not in submitted.stderr


def _run_given(client: httpx.Client, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    response = client.post("/v1/jobs", json=jobs)
    assert response.status_code == 202, response.text
    ids = response.json()["job_ids"]

    def finished() -> list[dict[str, Any]] | None:
        views = [client.get(f"/v1/jobs/{job_id}").json() for job_id in ids]
        return views if all(v["status"] in ("done", "failed", "timed_out", "cancelled") for v in views) else None

    return wait_for(finished, timeout=600, interval=0.5, what="the given-output jobs")


def test_given_outputs_are_judged_as_a_models_answer_would_be(stack, tmp_path: Path) -> None:
    service, swe_rows = stack
    client = httpx.Client(base_url=service.api_url, timeout=30)
    gsm8k = {"format": "gsm8k", **GSM8K}  # the kind comes from the format
    jobs = [
        {"task": gsm8k, "given": {"output": "72"}},
        {"task": gsm8k, "given": {"output": "71"}},
        {"task": {"format": "math", **MATH}, "given": {"output": "\\boxed{\\frac16}"}},
        {"task": {"format": "math", **MATH}, "given": {"output": "\\boxed{6}"}},
        {
            "task": {"format": "humaneval", **HUMANEVAL},
            "given": {"output": "def has_close_elements(n, t):\n    return True\n"},
        },
        {"task": {"format": "swebench", **swe_rows[1]}, "given": {"output": ""}},
    ]
    views = _run_given(client, jobs)
    assert [v["status"] for v in views] == ["done"] * len(jobs), views
    assert [v["result"]["reward"] for v in views] == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert views[1]["result"]["evaluation"]["reason"].startswith("answer '71' (from finish) does not match")

    # Bad input is a 422 at submission naming the row and the field, never a 0 later.
    refused = client.post(
        "/v1/jobs",
        json=[
            {"task": gsm8k, "given": {"reference": True}},
            {"task": {"format": "gsm8k", "question": "q", "answer": "no marker"}, "given": {"reference": True}},
            {"task": {"kind": "code", "prompt": "p", "tests": [{"code": "assert True"}]}, "given": {"reference": True}},
            {"task": gsm8k, "given": {"reference": True, "output": "72"}},
        ],
    )
    assert refused.status_code == 422
    fields = {e["field"]: e["message"] for e in refused.json()["errors"]}
    assert "#### <final answer>" in fields["body[1].task.answer"]
    assert "no reference solution" in fields["body[2].task.reference_solution"]
    assert any(f.startswith("body[3].given") for f in fields) and not any(f.startswith("body[0]") for f in fields)
    client.close()


def test_validate_answers_reports_what_was_read_by_which_rule(stack, tmp_path: Path) -> None:
    """A model's answers to published rows: right ones in GSM8K's sentence forms score 1, wrong ones 0, and
    every row says what was extracted and by which rule; only rows that cannot be judged fail the command."""
    service, _ = stack
    lines = [
        {"row": GSM8K, "output": "She sold 48 in April and 24 in May. The answer is 72."},
        {"row": GSM8K_THOUSANDS, "output": "The answer is 1,200."},
        {"row": GSM8K, "output": "So Natalia sold 71 clips altogether."},
        {"row": MATH, "output": "The final answer is $\\frac{1}{6}$."},
        {"row": MBPP, "output": "def similar_elements(a, b):\n    return tuple(a)\n"},
        {"row": GSM8K, "output": "I am not sure how to do this."},
        {"row": GSM8K},
    ]
    answers = _write_jsonl(tmp_path / "answers.jsonl", lines)
    out = tmp_path / "answers.verdicts.jsonl"
    done = subprocess.run(
        [
            *ROLLOUTS,
            "validate",
            "--answers",
            str(answers),
            "--url",
            service.api_url,
            "--no-progress",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=service.env,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # row 7 cannot be evaluated
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    got = [(v["reward"], v["extracted"], v["source"]) for v in verdicts[:6]]
    assert got == [
        (1.0, "72", "finish.phrase"),
        (1.0, "1200", "finish.phrase"),
        (0.0, "71", "finish.last_number"),
        (1.0, "$\\frac{1}{6}$", "finish.phrase"),
        (0.0, None, None),
        (0.0, None, "none"),
    ], done.stdout
    assert "0/2 tests passed" in verdicts[4]["why"]
    assert "sentence with no number" in verdicts[5]["why"]
    assert verdicts[6]["verdict"] == "cannot be evaluated" and "`output`" in verdicts[6]["why"]
    assert "row 1 " in done.stdout and "'72' by finish.phrase" in done.stdout
