"""The trainer's side of the service: start it locally, run one DAPO batch, reload the backends' weights.

Everything after `start_stack` goes over HTTP: batches and jobs through
rollouts_client, the backend list through the API, and weight reloads through each
CPU backend's `POST /admin/load_weights` (docs/TRAINING.md says what vLLM offers
instead).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cli.stack import Stack
from rollouts_client import Batch, Group, RolloutClient
from rollouts_client.wire import decode
from shared.config import Settings

TASK_MODULE = "examples.train_grpo.arith_kind"


def start_stack(root: Path, base_model: Path, admin_token: str, rollout_slots: int) -> Stack:
    """Redis, API, one worker per stage and one CPU backend serving `base_model`, as `rollouts up` would."""
    env = {
        "ROLLOUTS_TASK_MODULES": TASK_MODULE,
        "ROLLOUTS_CPU_BACKEND_MODEL": str(base_model),  # also the agent loop's tokenizer and chat template
        "ROLLOUTS_CPU_BACKEND_ADMIN_TOKEN": admin_token,
        "ROLLOUTS_CPU_BACKEND_MAX_MODEL_LEN": "512",
        "ROLLOUTS_CPU_BACKEND_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    settings = Settings(redis_url=None, state_dir=root / "state")
    stack = Stack(settings, api_port=0, cpu_backend=True, log_dir=root / "logs", extra_env=env,
                  concurrency={"init": 2, "rollout": rollout_slots, "eval": 2})
    stack.start()
    stack.wait_for_workers(timeout=120)
    return stack


def new_admin_token() -> str:
    return secrets.token_urlsafe(24)


def backend_urls(client: RolloutClient) -> list[str]:
    listing = decode(client.request("GET", "/v1/backends"))
    return [b["url"] for b in listing["backends"] if b.get("healthy")]


def load_weights(client: RolloutClient, admin_token: str, path: Path, version: str) -> list[str]:
    """Every healthy backend loads `path` and reports `version` from now on; returns their URLs."""
    urls = backend_urls(client)
    if not urls:
        raise RuntimeError("no healthy backend to load weights into")
    for url in urls:
        response = httpx.post(f"{url}/admin/load_weights", json={"path": str(path), "version": version},
                              headers={"Authorization": f"Bearer {admin_token}"}, timeout=120)
        if response.status_code != 200 or response.json().get("version") != version:
            raise RuntimeError(f"{url} refused the weights: {response.status_code} {response.text}")
    return urls


@dataclass
class StepBatch:
    """One step's rollouts: the informative groups to train on, and every completed group's rewards."""

    batch: Batch
    groups: list[Group]
    rewards: list[float] = field(default_factory=list)  # every launched group: trained, filtered and late
    tool_use: list[bool] = field(default_factory=list)  # per reward: did the episode call python
    versions: set[str] = field(default_factory=set)  # policy versions recorded by any turn of those groups
    failed_groups: int = 0


def run_batch(client: RolloutClient, prompts: list[dict[str, Any]], *, n_samples: int, min_informative: int,
              in_flight: int, sampling: dict[str, Any], step: int, timeout: float) -> StepBatch:
    """Submit a DAPO batch and wait until no group runs; every group's rewards are read back by group id."""
    batch = client.submit_batch(prompts, n_samples=n_samples, min_informative_groups=min_informative,
                                max_groups_in_flight=in_flight, on_target="keep", advantages="grpo",
                                sampling=sampling, metadata={"step": step})
    deadline = time.monotonic() + timeout
    groups = client.collect_groups(batch.id, results=True, timeout=timeout)
    batch = wait_settled(client, batch.id, deadline)
    out = StepBatch(batch, [g for g in groups if g.used and g.outcome == "informative"])
    for index in range(batch.counts.launched):
        jobs = decode(client.request("GET", "/v1/jobs", params={"group_id": f"b.{batch.id}.{index}",
                                                                "limit": n_samples}))["jobs"]
        if any(job["status"] == "failed" for job in jobs):
            out.failed_groups += 1
        done = [job for job in jobs if job["status"] == "done" and job.get("reward") is not None]
        if len(done) < n_samples:  # a group with a failed sample is not a clean sample of the policy
            continue
        for summary in done:
            job = client.get_job(summary["id"])
            out.rewards.append(float(job.reward or 0.0))
            out.tool_use.append(called(job.trajectory or {}, "python"))
            out.versions |= policy_versions(job.trajectory or {})
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
    return any(call.get("name") == tool for turn in trajectory.get("turns", []) if turn["role"] == "assistant"
               for call in turn.get("tool_calls") or [])


def policy_versions(trajectory: dict[str, Any]) -> set[str]:
    """The policy version each assistant turn recorded (the backend's reported model)."""
    return {turn.get("policy_version") or "" for turn in trajectory.get("turns", []) if turn["role"] == "assistant"}


def wait_idle(client: RolloutClient, timeout: float = 60.0) -> None:
    """Cancelled groups may still hold a generation; wait until no backend has one in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = decode(client.request("GET", "/v1/backends"))
        if not listing.get("inflight", listing.get("total_inflight", 0)):
            return
        time.sleep(0.2)
