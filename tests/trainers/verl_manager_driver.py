"""Run in the trainers' virtualenv: verl's V1 trainer with the service's agent-loop manager, in verl's and
TransferQueue's own code; what they stored is written as JSON for the tests.

    python verl_manager_driver.py MODEL_DIR GIVEN_JSON OUT_JSON

GIVEN: `env` (set first), `loops` (the agent-loop YAML: the manager's loop settings), `steps` (each
{"name", "global_steps", "rows", "validate"?}), `sample` (verl_v1_driver's), `loop_path` (a step run again
through verl's own AgentLoopWorkerTQ and the agent loop, as verl_v1_driver runs it).
A local Ray and TransferQueue; the manager is made by verl's own TaskRunnerV1.init_agent_loop_manager from
`actor_rollout_ref.rollout.agent.agent_loop_manager_class` (its trainer stands in only for the three clients a
CPU run has none of), and each step is registered and dispatched as V1's trainer does it
(`_submit_batch_to_rollout`, `_validate`), then read back from TransferQueue once the manager has stored it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ray
import transfer_queue as tq
from omegaconf import OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1
from verl.utils import tensordict_utils as tu
from verl_v1_driver import TENSORS, column, items, plain_extra, reported, run_step, sample, v1_config

from rollouts_client.aio import AsyncRolloutClient

MANAGER = "rollouts_client.trainers.verl_manager.RolloutsAgentLoopManager"
MANAGER_KEY = f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER}"  # not in verl 0.9.1's YAML
N = 2  # rollout.n


def main() -> int:
    model, given_path, out_path = sys.argv[1:4]
    given = json.loads(Path(given_path).read_text())
    faulthandler.dump_traceback_later(480, exit=True)
    os.environ.update(given.get("env") or {})
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    submissions = count_submissions()
    manager = made_by_verl(v1_config(model, given["loops"], MANAGER_KEY))
    out: dict[str, Any] = {"setup_s": time.perf_counter() - started, "manager": type(manager).__qualname__}
    for step in given.get("steps", []):
        submissions.clear()
        out[step["name"]] = {**reported(run, manager, step), "submissions": list(submissions)}
    out["errors"] = [f"{type(e).__name__}: {e}" for e in manager.errors]
    if given.get("sample"):
        out["sample"] = reported(sample, manager.config, **given["sample"])
    if given.get("loop_path"):
        out["loop_path"] = reported(asyncio.run, run_step(manager.worker, given["loop_path"]))
    Path(out_path).write_text(json.dumps(out))
    manager.close()
    tq.close()
    ray.shutdown()
    return 0


def count_submissions() -> list[int]:
    """The jobs in each submit request this process makes (our client's, wrapped: the manager's one request)."""
    counted: list[int] = []
    submit = AsyncRolloutClient.submit_jobs

    async def counting(self: AsyncRolloutClient, jobs: Any, **kwargs: Any) -> list[str]:
        counted.append(len(jobs) if isinstance(jobs, list) else 1)
        return await submit(self, jobs, **kwargs)

    AsyncRolloutClient.submit_jobs = counting
    return counted


def made_by_verl(cfg: Any) -> Any:
    """verl's TaskRunnerV1 makes the manager from the config key (its own class, outside its Ray actor)."""
    runner = TaskRunnerV1.__ray_metadata__.modified_class()
    runner.config = cfg
    runner.trainer = SimpleNamespace(  # a CPU run has no servers, teacher or reward workers
        get_llm_client=lambda: None, get_teacher_client=lambda: None, get_reward_handles=lambda: None
    )
    runner.init_agent_loop_manager()
    return runner.agent_loop_manager


def run(manager: Any, step: dict[str, Any]) -> dict[str, Any]:
    """Register the step's prompts and dispatch them as V1's trainer does; what TransferQueue holds once stored."""
    rows, steps, validate = step["rows"], step["global_steps"], bool(step.get("validate"))
    partition = "val" if validate else "train"
    uids = [row["uid"] for row in rows]
    tags = [{"is_prompt": True, "status": "pending", "global_steps": steps}] * len(rows)
    tq.kv_batch_put(keys=uids, partition_id=partition, tags=tags)
    batch = tu.get_tensordict({key: column([row[key] for row in rows]) for key in rows[0]})
    tu.assign_non_tensor_data(batch, "global_steps", steps)
    if validate:
        tu.assign_non_tensor_data(batch, "validate", True)
    started = time.perf_counter()
    manager.generate_sequences(batch)
    at_return = stored(uids, partition)["keys"]  # what was stored when the call returned: it must not wait for it
    manager.wait(timeout=300)
    return {"stored_at_return": at_return, "seconds": time.perf_counter() - started, **stored(uids, partition)}


def stored(uids: list[str], partition: str) -> dict[str, Any]:
    """What TransferQueue holds for these prompts in `partition`: their tags, every trajectory's tags and tensors."""
    listed = tq.kv_list(partition).get(partition, {})
    keys = sorted(k for k in listed if k.split("_")[0] in set(uids) and k not in uids)
    out: dict[str, Any] = {"prompts": {u: listed.get(u) for u in uids}, "keys": keys, "tags": [listed[k] for k in keys]}
    if keys:
        data = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=[*TENSORS, "extra_fields"])
        out["tensors"] = {name: [t.tolist() for t in data[name].unbind()] for name in TENSORS}
        out["extra"] = [plain_extra(e) for e in items(data, "extra_fields")]
    return out


if __name__ == "__main__":
    sys.exit(main())
