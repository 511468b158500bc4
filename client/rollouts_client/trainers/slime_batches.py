"""A slime rollout step as the service's batches (docs/BATCHES.md): every prompt once, or DAPO's dynamic sampling.

Every prompt (no dynamic filter): one batch of the step's prompts, `n_samples_per_prompt` jobs each; each group
is taken as the service reports it, and a sample whose job failed is resubmitted as a job of its own (keyed by the
run, the step and the sample: `ServiceConnection.settle`, the bridges' one way to retry) up to `max_attempts`,
then returned as its JobFailed (the caller marks it `remove_sample`); `on_failure: raise` raises it at once.

DAPO (slime's `check_reward_nonzero_std` filter): a batch with `min_informative_groups` = the groups still
needed and `max_groups_in_flight` = slime's over-sampling batch size; the service drops the groups whose rewards
are all equal and the failed ones, and launches the next prompt at once. A batch whose prompts ran out
(`exhausted`) is followed by another on the data source's next prompts, as slime's own loop draws again.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollouts_client.errors import ApiError
from rollouts_client.models import Group, Job, JobStatus
from rollouts_client.models import Sample as GroupSample
from rollouts_client.trainers.records import JobFailed, input_error
from rollouts_client.trainers.rows import RowError, group_id, idempotency_key
from rollouts_client.trainers.waiting import ServiceConnection

_PROMPT_FIELD = re.compile(r"^body\.prompts\[(\d+)\](.*)$")  # how the API names a batch item's field

Result = tuple[Job, int] | JobFailed  # a done job and its attempts, or the failure that ended the last attempt


@dataclass(frozen=True)
class Prompt:
    """One prompt group of the data source: its samples (n copies), the service task, and how keys and errors name it."""

    samples: list[Any]
    task: dict[str, Any]
    identity: tuple[Any, ...]  # run, phase, step, the data source's group index
    row: str

    def item(self) -> dict[str, Any]:
        return {"task": self.task, "metadata": {"slime_group_index": self.samples[0].group_index}}

    def job(self, sample_index: int, sampling: dict[str, Any], limits: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The body and key of one sample's job outside the batch (a retry): never a batch-shaped group id."""
        body = {
            "task": self.task,
            "sampling": sampling,
            "limits": limits,
            "group_id": group_id(*self.identity),
            "sample_index": sample_index,
            "metadata": {"trainer": "slime", "slime_index": self.samples[sample_index].index},
        }
        return body, idempotency_key(*self.identity, sample_index)


class StepRunner:
    """Runs the prompts of one slime step through one service connection (its client and its waiter)."""

    def __init__(
        self, connection: ServiceConnection, sampling: dict[str, Any], limits: dict[str, Any], metadata: dict[str, Any]
    ) -> None:
        self.connection = connection
        self.sampling = sampling
        self.limits = limits
        self.metadata = metadata
        self.batches: list[str] = []  # the batches submitted (tests, logs)
        self.failed_groups = 0  # DAPO: groups the service reported failed and replaced

    async def every_prompt(self, prompts: list[Prompt], n: int) -> list[list[Result]]:
        """Every prompt's n samples, in order; failed samples retried by the settings, else their JobFailed."""
        batch_id = await self._submit(prompts, n, None, None)
        settling: dict[tuple[int, int], asyncio.Task[Result]] = {}
        async for group in self.connection.client.iter_groups(batch_id, results=True, partial=True):
            prompt = prompts[group.prompt_index]
            for sample in group.samples:
                settling[(group.prompt_index, sample.sample_index)] = asyncio.ensure_future(
                    self._sample(prompt, sample)
                )
        missing = [(k, i) for k in range(len(prompts)) for i in range(n) if (k, i) not in settling]
        if missing:
            raise RuntimeError(f"batch {batch_id} ended without samples {missing[:5]} (prompt, sample)")
        done = await asyncio.gather(*settling.values())
        by_key = dict(zip(settling, done))
        return [[by_key[(k, i)] for i in range(n)] for k in range(len(prompts))]

    async def dapo(
        self, draw: Callable[[], list[Prompt]], target: int, n: int, in_flight: int
    ) -> list[tuple[Prompt, list[Result]]]:
        """`target` informative groups (unequal rewards, every sample done), in the order they completed."""
        kept: list[tuple[Prompt, list[Result]]] = []
        while len(kept) < target:
            prompts = draw()
            batch_id = await self._submit(prompts, n, target - len(kept), in_flight)
            async for group in self.connection.client.iter_groups(batch_id, results=True, partial=True):
                if group.outcome == "failed":
                    await self._failed_group(prompts[group.prompt_index], group)
                elif group.used and len(kept) < target:
                    jobs: list[Result] = [(_job(s), 1) for s in sorted(group.samples, key=lambda s: s.sample_index)]
                    kept.append((prompts[group.prompt_index], jobs))
        return kept

    async def _submit(self, prompts: list[Prompt], n: int, target: int | None, in_flight: int | None) -> str:
        """One POST /v1/batches; a 422 is the row's: RowError naming it and the service's field."""
        options: dict[str, Any] = {"sampling": self.sampling, "limits": self.limits, "advantages": "none"}
        options["metadata"] = self.metadata
        if target is not None:
            options |= {"max_groups_in_flight": in_flight, "on_target": "cancel"}
        try:
            batch = await self.connection.client.submit_batch(
                [p.item() for p in prompts], n_samples=n, min_informative_groups=target, **options
            )
        except ApiError as exc:
            if exc.status_code != 422:
                raise
            first = (exc.errors or [{"field": "body", "message": str(exc.detail)}])[0]
            field = str(first.get("field", "body"))
            listed = _PROMPT_FIELD.match(field)
            row = prompts[int(listed[1])].row if listed and int(listed[1]) < len(prompts) else "*"
            raise RowError(row, f"body{listed[2]}" if listed else field, str(first.get("message", exc.detail))) from exc
        self.batches.append(batch.id)
        return batch.id

    async def _sample(self, prompt: Prompt, sample: GroupSample) -> Result:
        """A reported sample: done, or its job waited for and resubmitted as the settings say (settle); the failure
        that ended the last attempt is returned, and raised when `on_failure` is raise or the input cannot run."""
        if sample.status == JobStatus.DONE and sample.reward is not None:
            return _job(sample), 1
        body, key = prompt.job(sample.sample_index, self.sampling, self.limits)
        row = f"{prompt.samples[sample.sample_index].index} (group {prompt.samples[0].group_index})"
        job_id = sample.job_id or (await self.connection.submit([body], [key], [row]))[0]
        try:
            return await self.connection.settle(body, key, row, job_id)
        except JobFailed as exc:
            if self.connection.settings.on_failure == "raise" or input_error(exc.job):
                raise
            return exc

    async def _failed_group(self, prompt: Prompt, group: Group) -> None:
        """DAPO: the service replaces a failed group (never trained on); `on_failure: raise` raises its failure."""
        self.failed_groups += 1
        if self.connection.settings.on_failure != "raise":
            return
        failed = next(s for s in group.samples if s.status != JobStatus.DONE or s.reward is None)
        job = await self.connection.client.get_job(failed.job_id) if failed.job_id else None
        if job is None:
            raise RuntimeError(f"row {prompt.row}: group {group.group_id} failed: {group.error}")
        raise JobFailed(job, 1, prompt.row)


def _job(sample: GroupSample) -> Job:
    """A reported done sample as the Job the record helpers read (its result came with the group)."""
    return Job(id=str(sample.job_id), status=str(sample.status), reward=sample.reward, result=sample.result)
