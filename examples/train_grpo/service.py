"""The trainer's side of the service: start it locally; run one DAPO batch (examples/smollm2's loop).

Everything after `start_stack` goes over HTTP through rollouts_client. examples/train_grpo's TRL run
talks to the service through the client's TRL bridge (rollouts_client.trainers.trl_rollout), which
also loads each step's weights (one `update_weights` call per step: the service pauses, reloads,
resets the prefix cache, labels and resumes every backend of the model).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.stack import Stack
from examples.train_grpo.policy import MAX_LEN
from rollouts_client import Batch, Group, RolloutClient
from shared.config import Settings

TASK_MODULE = "examples.train_grpo.arith_kind"


def start_stack(root: Path, base_model: Path, rollout_slots: int) -> Stack:
    """Redis, API, one worker per stage and one vLLM server on `base_model`, as `rollouts up --model` would.

    float32, as the trainer computes: the first minibatch's ratio is then 1 up to float noise.
    """
    env = {"ROLLOUTS_TASK_MODULES": TASK_MODULE, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    settings = Settings(
        redis_url=None,
        state_dir=root / "state",
        vllm_served_model_name="policy",
        vllm_args=f"--dtype float32 --max-model-len {MAX_LEN}",
    )
    stack = Stack(
        settings,
        api_port=0,
        vllm=True,
        model=base_model,
        log_dir=root / "logs",
        extra_env=env,
        concurrency={"init": 2, "rollout": rollout_slots, "eval": 2},
    )
    stack.start()
    stack.wait_for_workers(timeout=120)
    return stack


def backend_urls(client: RolloutClient) -> list[str]:
    return [b["url"] for b in client.list_backends() if b.get("healthy")]


@dataclass
class StepBatch:
    """One step's rollouts: the informative groups to train on, and every completed group's rewards."""

    batch: Batch
    groups: list[Group]
    rewards: list[float] = field(default_factory=list)  # every launched group: trained, filtered and late
    tool_use: list[bool] = field(default_factory=list)  # per reward: did the episode call python
    versions: set[str] = field(default_factory=set)  # policy versions recorded by any turn of those groups
    failed_groups: int = 0
    stage_seconds: dict[str, list[float]] = field(default_factory=dict)  # per stage: each read job's queued-to-ended

    def where_the_time_went(self) -> str:
        """Median seconds per stage (queue wait included), e.g. `init 0.3s rollout 2.9s eval 0.1s`."""
        return " ".join(f"{stage} {statistics.median(seconds):.1f}s" for stage, seconds in self.stage_seconds.items())


def run_batch(
    client: RolloutClient,
    prompts: list[dict[str, Any]],
    *,
    n_samples: int,
    min_informative: int,
    in_flight: int,
    sampling: dict[str, Any],
    step: int,
    timeout: float,
) -> StepBatch:
    """Submit a DAPO batch and wait until no group runs; every group's rewards are read back by group id."""
    batch = client.submit_batch(
        prompts,
        n_samples=n_samples,
        min_informative_groups=min_informative,
        max_groups_in_flight=in_flight,
        on_target="keep",
        advantages="grpo",
        sampling=sampling,
        metadata={"step": step},
    )
    deadline = time.monotonic() + timeout
    # partial: a step whose prompts run out before the target trains on the groups it got (the row says so)
    groups = client.collect_groups(batch.id, results=True, timeout=timeout, partial=True)
    batch = wait_settled(client, batch.id, deadline)
    out = StepBatch(batch, [g for g in groups if g.used and g.outcome == "informative"])
    for index in range(batch.counts.launched):
        jobs = client.list_jobs(group_id=f"b.{batch.id}.{index}", limit=n_samples)
        if any(job.status == "failed" for job in jobs):
            out.failed_groups += 1
        done = [job for job in jobs if job.status == "done" and job.reward is not None]
        if len(done) < n_samples:  # a group with a failed sample is not a clean sample of the policy
            continue
        for summary in done:
            job = client.get_job(summary.id)
            out.rewards.append(float(job.reward or 0.0))
            out.tool_use.append(called(job.trajectory or {}, "python"))
            out.versions |= policy_versions(job.trajectory or {})
            for stage, times in (job.raw.get("timings") or {}).items():
                if "queued" in times and "ended" in times:
                    out.stage_seconds.setdefault(stage, []).append(times["ended"] - times["queued"])
    return out


def wait_settled(client: RolloutClient, batch_id: str, deadline: float) -> Batch:
    """The batch once no group runs: with on_target=keep the groups in flight at the target finish as `late`.

    The reward curve averages every launched group; reading it at the target instead would
    drop the slowest groups, and episode length correlates with reward here (a correct
    episode takes two turns, many wrong ones end after one).
    """
    while True:
        batch = client.get_batch(batch_id)
        if batch.counts.in_flight == 0 or time.monotonic() > deadline:
            return batch
        time.sleep(0.2)


def called(trajectory: dict[str, Any], tool: str) -> bool:
    """Whether any assistant turn of the episode called `tool`: the choice GRPO has to learn here."""
    return any(
        call.get("name") == tool
        for turn in trajectory.get("turns", [])
        if turn["role"] == "assistant"
        for call in turn.get("tool_calls") or []
    )


def policy_versions(trajectory: dict[str, Any]) -> set[str]:
    """The policy version each assistant turn recorded (the weight version vLLM reported for its tokens)."""
    return {turn.get("policy_version") or "" for turn in trajectory.get("turns", []) if turn["role"] == "assistant"}


def wait_idle(client: RolloutClient, timeout: float = 60.0) -> None:
    """Cancelled groups may still hold a generation; wait until no backend has one in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sum(backend.get("inflight", 0) for backend in client.list_backends()):
            return
        time.sleep(0.2)
