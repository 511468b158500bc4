"""The rollout stage: the kind samples its trajectory, or takes the output the job gives instead.

`run` is the stage's rq entry point (shared/jobs/queues.py enqueues `workers.rollout.stage.run`).
"""

from __future__ import annotations

from typing import Any

from shared.jobs.record_fields import ROLLOUT_SUMMARY
from shared.metrics import MetricsRecorder
from shared.run_stats.summary import rollout_summary
from shared.tasks import StageContext, TaskKind
from workers.rollout.external_agent.stage import run_external_agent
from workers.rollout.llm_services import warm_tokenizers
from workers.runtime.stage_runner import Stage, run_stage


class RolloutStage(Stage):
    name = "rollout"

    def call(self, kind: TaskKind, ctx: StageContext) -> dict[str, Any]:
        given = ctx.request.given
        if ctx.request.agent == "external":  # validated at submit: an agentic kind
            return run_external_agent(kind, ctx)  # type: ignore[arg-type]
        if given is None:
            return kind.rollout(ctx)
        # A given output (validation) is judged exactly as a sampled one; only the sampling is skipped.
        return {**kind.given_rollout(ctx.task, given.output), "given": True}

    def record(self, output: dict[str, Any], metrics: MetricsRecorder) -> None:
        metrics.tool_calls(output)  # latencies of the tool calls the trajectory made

    def summary_fields(self, output: dict[str, Any]) -> dict[str, Any]:
        summary = rollout_summary(output)  # tokens, LLM time, versions, sandbox: for the run page
        return {ROLLOUT_SUMMARY: summary} if summary is not None else {}

    def warm_up(self) -> None:
        warm_tokenizers()  # ~5 s of CPU here (transformers imports torch), once per process, once a backend is up


STAGE = RolloutStage()


def run(job_id: str) -> str:
    return run_stage(STAGE, job_id)
