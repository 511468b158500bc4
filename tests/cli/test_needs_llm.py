"""`rollouts run` starts a vLLM only when some job's kind runs an agent; an unknown kind is the API's to refuse."""

from __future__ import annotations

from cli.service import _needs_llm
from shared.tasks import get_spec, load_task_modules


def test_an_unknown_kind_does_not_crash_the_check_and_needs_no_model() -> None:
    assert _needs_llm([{"task": {"kind": "no-such-kind"}}], []) is False


def test_a_kind_that_runs_an_agent_needs_a_model_whatever_else_is_in_the_file() -> None:
    load_task_modules([])
    agentic = next(name for name in ("math", "code", "swe") if get_spec(name).uses_llm)
    jobs = [{"task": {"kind": "no-such-kind"}}, "not a job", {"task": {"kind": agentic}}]
    assert _needs_llm(jobs, []) is True
