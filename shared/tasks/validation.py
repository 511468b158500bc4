"""The one check a job passes before anything is stored: its schema, its kind, the kind's own checks.

The jobs API and a batch's prompt pool both call `validate_job`, so a job is refused for the same
reasons, at the same locations and in the same words, wherever it comes from.
"""

from __future__ import annotations

from typing import Any

import pydantic

from shared.errors import Loc, ValidationError
from shared.jobs.spec import JobRequest
from shared.tasks.registry import get_kind


def validate_job(item: Any, loc: Loc = ("body",)) -> JobRequest:
    """`item` (parsed JSON) as a JobRequest, or a ValidationError naming every problem under `loc`.

    Raises for: a schema violation (pydantic's errors, every one), an unknown task kind
    (UnknownKind, at task.kind), a task its kind refuses (TaskValidationError, at the field it
    names), and a `given` the kind cannot evaluate (a row with no reference: said now, not as a 0).
    """
    try:
        job = JobRequest.model_validate(item)
    except pydantic.ValidationError as exc:
        raise ValidationError.from_pydantic(exc, loc) from None
    try:
        kind = get_kind(job.task["kind"])
        kind.validate(job.task)
        if job.given is not None:
            kind.given_rollout(job.task, job.given.output)
    except ValidationError as exc:
        raise exc.within(*loc) from exc
    return job
