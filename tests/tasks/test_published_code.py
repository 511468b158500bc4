"""MBPP and HumanEval rows scored as their own harnesses score them: MBPP's setup code in the solution's
program, `challenge_test_list` on request, pass/fail per problem unless the row asks for `fraction`."""

from __future__ import annotations

from typing import Any

import pytest

from shared.kinds.formats import code_fields, row_to_task
from shared.tasks import TaskValidationError, get_kind, load_task_modules
from tests.support.published_rows import HUMANEVAL

from .conftest import MakeCtx

load_task_modules()
pytestmark = pytest.mark.usefixtures("require_bwrap")

# In MBPP's schema; like MBPP's own rows that need `math`, only the setup code imports it.
MBPP_SETUP = {
    "task_id": 9001,
    "text": "Write a function to find the hypotenuse of a right angled triangle.",
    "code": "def hypotenuse(a, b):\r\n  return math.sqrt(a * a + b * b)",
    "test_list": [
        "assert hypotenuse(3, 4) == 5.0",
        "assert hypotenuse(5, 12) == 13.0",
        "assert hypotenuse(6, 8) == 10.0",
    ],
    "test_setup_code": "import math",
    "challenge_test_list": ["assert hypotenuse(0, 0) == 0.0", "assert math.isclose(hypotenuse(1, 1), 2 ** 0.5)"],
}


def score(make_ctx: MakeCtx, row: dict[str, Any], solution: str | None, **changes: Any) -> dict[str, Any]:
    """The code kind's reward for `solution` (None: the row's own reference), as a `given` job scores it."""
    task = {**row_to_task(row), **changes}
    kind = get_kind("code")
    kind.validate(task)
    return kind.evaluate(make_ctx(task, outputs={"rollout": kind.given_rollout(task, solution)}))


def test_an_mbpp_reference_relying_on_its_setup_code_scores_1(make_ctx: MakeCtx) -> None:
    result = score(make_ctx, MBPP_SETUP, None)
    assert (result["reward"], result["passed"], result["scoring"]) == (1.0, 3, "all"), result


def test_a_wrong_mbpp_solution_passing_some_asserts_scores_0_by_default(make_ctx: MakeCtx) -> None:
    two_of_three = "def hypotenuse(a, b):\n  return 5.0 if a == 3 else math.sqrt(a * a + b * b) + (a == 6)"
    result = score(make_ctx, MBPP_SETUP, two_of_three)
    assert (result["reward"], result["passed"], result["total"]) == (0.0, 2, 3), result
    one_of_three = "def hypotenuse(a, b):\n  return 5.0"
    assert score(make_ctx, MBPP_SETUP, one_of_three)["reward"] == 0.0
    asked = score(make_ctx, MBPP_SETUP, two_of_three, scoring="fraction")  # the job asks for partial credit
    assert asked["reward"] == pytest.approx(2 / 3) and asked["scoring"] == "fraction"


def test_setup_code_goes_after_a_solutions_future_imports(make_ctx: MakeCtx) -> None:
    future = '"""Hypotenuse."""\nfrom __future__ import annotations\n\ndef hypotenuse(a: float, b: float) -> float:\n'
    result = score(make_ctx, MBPP_SETUP, future + "  return math.sqrt(a * a + b * b)\n")
    assert result["reward"] == 1.0, result


def test_challenge_tests_run_on_request(make_ctx: MakeCtx) -> None:
    plain = score(make_ctx, MBPP_SETUP, None)
    challenged = score(make_ctx, MBPP_SETUP, None, challenge_tests=True)
    assert plain["total"] == 3 and challenged["total"] == 5 and challenged["reward"] == 1.0
    assert [t["name"] for t in challenged["tests"]][3:] == ["challenge_test_list[0]", "challenge_test_list[1]"]
    no_zero = "import math\ndef hypotenuse(a, b):\n  return math.hypot(a, b) or 1.0"
    assert score(make_ctx, MBPP_SETUP, no_zero)["reward"] == 1.0  # the published tests pass it
    assert score(make_ctx, MBPP_SETUP, no_zero, challenge_tests=True)["reward"] == 0.0


def test_the_solution_still_runs_in_a_process_of_its_own(make_ctx: MakeCtx) -> None:
    """The setup code joins the solution's module, not the judge: an always-true __eq__ there earns nothing."""
    cheat = "class Yes(float):\n  def __eq__(self, other):\n    return True\ndef hypotenuse(a, b):\n  return Yes(0)"
    result = score(make_ctx, MBPP_SETUP, cheat)
    assert result["reward"] == 0.0 and result["passed"] == 0, result


def test_humaneval_is_pass_fail_and_its_reference_passes(make_ctx: MakeCtx) -> None:
    assert score(make_ctx, HUMANEVAL, None)["reward"] == 1.0
    wrong = HUMANEVAL["prompt"] + "    return True\n"  # passes the first assert of check(), not the second
    result = score(make_ctx, HUMANEVAL, wrong)
    assert result["reward"] == 0.0 and result["scoring"] == "all"


def test_the_options_name_their_field() -> None:
    with pytest.raises(TaskValidationError, match=r"task\.challenge_tests"):
        code_fields({**MBPP_SETUP, "format": "mbpp", "challenge_tests": "yes"})
    with pytest.raises(TaskValidationError, match=r"task\.scoring"):
        get_kind("code").validate({**row_to_task(MBPP_SETUP), "scoring": "some"})
    with pytest.raises(TaskValidationError, match=r"task\.challenge_test_list"):
        code_fields({**MBPP_SETUP, "format": "mbpp", "challenge_tests": True, "challenge_test_list": [1]})
