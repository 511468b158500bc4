"""validate_job, the one check every job passes (the jobs API and a batch's pool), and the
ValidationError it raises: every problem, each with where it is and a message a person reads."""

from __future__ import annotations

import pickle

import pytest

from shared.errors import RolloutsError, ValidationError
from shared.jobs.spec import JobRequest
from shared.tasks import TaskValidationError, UnknownKind, get_kind, load_task_modules, validate_job

load_task_modules()
DEMO = {"task": {"kind": "demo", "text": "abc"}}


def fields(error: ValidationError) -> list[str]:
    return [part.field for part in error.errors]


def test_a_valid_job_comes_back_as_a_job_request_with_defaults() -> None:
    job = validate_job({**DEMO, "limits": {"max_turns": 3}})
    assert isinstance(job, JobRequest) and job.limits.max_turns == 3 and job.sampling.temperature == 1.0


def test_a_published_row_takes_its_kind_from_its_format() -> None:
    job = validate_job({"task": {"format": "gsm8k", "question": "2+2?", "answer": "It is 4.\n#### 4"}})
    assert job.task["kind"] == "math"


@pytest.mark.parametrize(
    ("item", "field", "message"),
    [
        ({"task": {"kind": "nope"}}, "body.task.kind", "unknown task kind 'nope'; known kinds: "),
        ({"task": {"kind": "demo"}}, "body.task.text", "required, a string"),  # the kind's own check
        ({"task": {"kind": "demo", "text": "x", "work_s": -1}}, "body.task.work_s", "a number of seconds"),
        ({**DEMO, "limits": {"max_turns": 0}}, "body.limits.max_turns", "Input should be greater than 0"),
        ({"task": {"text": "x"}}, "body.task", "task.kind (or task.format of a published row) is required"),
        ({**DEMO, "group_id": "b.x.1"}, "body.group_id", "group ids starting with 'b.' are reserved"),
        ({**DEMO, "given": {"reference": True}}, "body.given", "kind 'demo' cannot evaluate a given output"),
        ({**DEMO, "given": {}}, "body.given", "give exactly one of reference: true or output"),
        ("a string", "body", "Input should be a valid dictionary"),
    ],
)
def test_each_refusal_names_its_field_and_says_why(item: object, field: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_job(item)
    [problem] = caught.value.errors
    assert problem.field == field and problem.message.startswith(message), problem
    assert not problem.message.startswith("Value error")  # pydantic's prefix is gone
    assert str(problem) == f"{field}: {problem.message}"


def test_every_schema_problem_is_reported_at_once_under_the_given_location() -> None:
    bad = {"task": {"kind": "demo", "text": "x"}, "limits": {"max_turns": -1}, "sample_index": -1, "extra": 1}
    with pytest.raises(ValidationError) as caught:
        validate_job(bad, ("body", 4))
    assert sorted(fields(caught.value)) == ["body[4].extra", "body[4].limits.max_turns", "body[4].sample_index"]


def test_the_kind_keeps_its_class_and_the_location_its_prefix() -> None:
    with pytest.raises(UnknownKind) as unknown:
        validate_job({"task": {"kind": "nope"}}, ("body", "prompts", 2))
    assert unknown.value.field == "body.prompts[2].task.kind" and unknown.value.kind == "nope"
    assert "demo" in unknown.value.known
    with pytest.raises(TaskValidationError) as refused:
        validate_job({"task": {"kind": "demo"}}, ("body", "prompts_path:7"))
    assert refused.value.field == "body.prompts_path:7.task.text"


def test_an_unknown_kind_is_a_validation_error_not_a_key_error() -> None:
    with pytest.raises(UnknownKind) as caught:
        get_kind("nope")
    assert isinstance(caught.value, ValidationError) and isinstance(caught.value, ValueError)
    assert not isinstance(caught.value, KeyError) and caught.value.loc == ("task", "kind")


@pytest.mark.parametrize(
    ("message", "loc", "rest"),
    [
        ("task.text: required, a string", ("task", "text"), "required, a string"),
        ("task.tests[2].code: a string of Python", ("task", "tests", 2, "code"), "a string of Python"),
        ("task.test_patch: instance a: a path: b", ("task", "test_patch"), "instance a: a path: b"),
        ("given: kind 'x' cannot evaluate", ("given",), "kind 'x' cannot evaluate"),
        ("task.FAIL_TO_PASS/PASS_TO_PASS: instance a", (), "task.FAIL_TO_PASS/PASS_TO_PASS: instance a"),
        ("kind 'x' names unknown tools: y", (), "kind 'x' names unknown tools: y"),
    ],
)
def test_a_kinds_message_names_the_field_and_str_is_unchanged(message: str, loc: tuple, rest: str) -> None:
    error = TaskValidationError(message)
    assert (error.loc, error.message, str(error)) == (loc, rest, message)
    assert TaskValidationError("too big", loc=("task", "n")).field == "task.n"


def test_validation_errors_combine_copy_and_pickle() -> None:
    one = TaskValidationError("task.text: required, a string").within("body", 1)
    two = ValidationError("Input should be greater than 0", ("body", 3, "limits", "max_turns"))
    both = ValidationError.combine([one, two])
    assert fields(both) == ["body[1].task.text", "body[3].limits.max_turns"]
    assert isinstance(both.errors[0], TaskValidationError)
    assert str(both) == f"{one}; body[3].limits.max_turns: Input should be greater than 0"
    assert ValidationError.combine([one]) is one
    again = pickle.loads(pickle.dumps(both))
    assert fields(again) == fields(both) and type(again.errors[0]) is TaskValidationError
    unknown = pickle.loads(pickle.dumps(UnknownKind("nope", ["demo"])))
    assert (unknown.kind, unknown.field) == ("nope", "task.kind")
    assert isinstance(both, RolloutsError) and isinstance(both, ValueError)


def test_the_projects_exceptions_share_one_root_and_keep_their_builtin_base() -> None:
    from cli.stack import StackError
    from shared.backend_pool import NoBackendAvailable, NotAModelServer
    from shared.trajectory import TrajectoryError
    from workers.rollout.llm_errors import BackendUnavailable
    from workers.sandbox.sandbox import SandboxError

    for error, builtin in [
        (StackError, RuntimeError),
        (NoBackendAvailable, RuntimeError),
        (TrajectoryError, ValueError),
        (BackendUnavailable, RuntimeError),
        (SandboxError, RuntimeError),
    ]:
        assert issubclass(error, RolloutsError) and issubclass(error, builtin), error
    refused = NotAModelServer("model", "serves ['a'], not 'b'")
    assert isinstance(refused, ValidationError) and refused.field == "model"
    assert refused.within("body").field == "body.model"
