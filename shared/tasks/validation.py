"""The one check a job passes before anything is stored: its schema, its kind, the kind's own checks.

The jobs API and a batch's prompts both call `validate_job`, so a job is refused for the same
reasons, at the same locations and in the same words, wherever it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from shared.errors import Loc, NotPermitted, ValidationError
from shared.jobs.spec import JobRequest
from shared.tasks.registry import get_spec


@dataclass(frozen=True)
class Access:
    """Who submits. An admin may set execution settings inline; anyone may name one of the operator's
    `profiles` (ROLLOUTS_TASK_PROFILES), whose fields are merged into the task as it is stored."""

    admin: bool = True
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


ADMIN = Access()


def validate_job(item: Any, loc: Loc = ("body",), access: Access = ADMIN) -> JobRequest:
    """`item` (parsed JSON) as a JobRequest, or a ValidationError naming every problem under `loc`.

    Raises for: a schema violation (pydantic's errors, every one), an unknown task kind
    (UnknownKind, at task.kind), a task its kind refuses (TaskValidationError, at the field it
    names), a `given` the kind cannot evaluate (a row with no reference: said now, not as a 0), an
    unknown profile, and (NotPermitted, a 403) execution settings from a caller who is no admin.
    """
    try:
        job = JobRequest.model_validate(item)
    except pydantic.ValidationError as exc:
        raise ValidationError.from_pydantic(exc, loc) from None
    try:
        kind = get_spec(job.task["kind"])
        if not access.admin:
            refused = [
                NotPermitted("an execution setting: only an admin sets it, or name a task profile", where)
                for where in kind.execution_settings(job.task)
            ]
            if refused:
                raise ValidationError.combine(refused)
        job.task = with_profile(job.task, access.profiles)
        kind.validate(job.task)
        if job.given is not None:
            kind.given_rollout(job.task, job.given.output)
        if job.agent == "external":
            _check_external(job, kind)
    except ValidationError as exc:
        raise exc.within(*loc) from exc
    return job


def _check_external(job: JobRequest, kind: Any) -> None:
    """An external agent drives an agentic kind's model and tools; a given output needs no agent at all."""
    if job.given is not None:
        raise ValidationError("an external agent samples the rollout; a given output skips it: choose one", ("agent",))
    if not kind.uses_llm or not hasattr(kind, "tool_schemas"):
        raise ValidationError(f"kind {kind.name!r} has no agent rollout for an external agent to drive", ("agent",))


def with_profile(task: dict[str, Any], profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The task with its named profile's fields merged in (the profile's win); unchanged without one."""
    name = task.get("profile")
    if name is None:
        return task
    if not isinstance(name, str) or name not in profiles:
        known = ", ".join(sorted(profiles)) or "none are configured (ROLLOUTS_TASK_PROFILES)"
        raise ValidationError(f"unknown profile {name!r}; known profiles: {known}", ("task", "profile"))
    return _merged(task, profiles[name])


def _merged(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged
