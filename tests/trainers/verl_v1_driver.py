"""Run in the trainers' virtualenv: verl's V1 rollout path (the default `trainer.use_v1: true`) on the service's
agent loop, with verl's and TransferQueue's own code; what they stored is written as JSON for the tests.

    python verl_v1_driver.py MODEL_DIR GIVEN_JSON OUT_JSON

GIVEN's `loops`: the agent-loop YAML (default examples/verl/agent_loops.yaml), `env`: set first.
A local Ray (TransferQueue's controller and storage are Ray actors) and TransferQueue, then verl's
`AgentLoopWorkerTQ` (its class, in this process: the worker is a Ray actor in a real run, the same code):
- each of GIVEN's `steps` ({"name", "global_steps", "rows"}) is registered as the trainer registers prompts
  (`is_prompt` tags with the step) and handed to `generate_sequences`, which runs `rollout.n` sessions of each
  prompt through `_run_agent_loop` (the loop's `run()` with `uid`, `session_id`, `global_steps`) and stores
  every output with `_agent_loop_postprocess` as `{uid}_{session_id}_{i}`; what TransferQueue then holds
  (tags and tensors) is read back;
- each of `jobs` ({name: {"job_id", "uid", "global_steps"}}), a finished job, becomes the loop's outputs as
  `run()` makes them and goes through the same `_agent_loop_postprocess` (a record with earlier segments);
- `sample` ({"global_steps", "batch_size", "max_off_policy_threshold"}): verl's `ReplayBufferAsync` with
  the drop strategy samples a batch at that step, and the batch's tags go through the expression V1's trainer
  computes its staleness metrics with.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import ray
import transfer_queue as tq
import verl.trainer.config
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.utils import tensordict_utils as tu

from rollouts_client.sync import RolloutClient
from rollouts_client.trainers.verl_agent_loop import Sample
from rollouts_client.trainers.verl_manager import loop_as_verl_builds_it

LOOPS = Path(__file__).resolve().parents[2] / "examples" / "verl" / "agent_loops.yaml"
N = 2  # rollout.n: the sessions of each prompt
TENSORS = ("prompts", "responses", "response_mask", "rollout_log_probs", "input_ids", "position_ids", "rm_scores")


def main() -> int:
    model, given_path, out_path = sys.argv[1:4]
    given = json.loads(Path(given_path).read_text())
    faulthandler.dump_traceback_later(480, exit=True)  # a wait that never ends (the buffer polls) shows where
    os.environ.update(given.get("env") or {})
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    worker = worker_class()(v1_config(model, given.get("loops") or str(LOOPS)), llm_client=None)
    out: dict[str, Any] = {"setup_s": time.perf_counter() - started}
    for step in given.get("steps", []):
        out[step["name"]] = reported(asyncio.run, run_step(worker, step))
    for name, job in (given.get("jobs") or {}).items():
        out[name] = reported(asyncio.run, run_job(worker, job))
    if given.get("sample"):
        out["sample"] = reported(sample, worker.config, **given["sample"])
    Path(out_path).write_text(json.dumps(out))
    tq.close()
    ray.shutdown()
    return 0


def reported(part: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A part's result, or what it raised (the test shows it; the other parts still run)."""
    try:
        return part(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the test reads what verl or the loop raised
        return {"error": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()[-3000:]}


def worker_class() -> type:
    """AgentLoopWorkerTQ's own class under its Ray actor wrapper (`@ray.remote`)."""
    return AgentLoopWorkerTQ.__ray_metadata__.modified_class


def v1_config(model: str, loops: str, *overrides: str) -> Any:
    """verl's own ppo_trainer config (V1 by default) for the tiny model and the agent-loop YAML, plus `overrides`."""
    with initialize_config_dir(config_dir=os.path.dirname(verl.trainer.config.__file__), version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.n={N}",
                "actor_rollout_ref.rollout.prompt_length=1024",
                "actor_rollout_ref.rollout.response_length=1024",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
                *overrides,
            ],
        )


async def run_step(worker: Any, step: dict[str, Any]) -> dict[str, Any]:
    """One step's prompts as V1's trainer dispatches them (`_submit_batch_to_rollout`), run to their end."""
    rows, steps = step["rows"], step["global_steps"]
    uids = [row["uid"] for row in rows]
    tq.kv_batch_put(
        keys=uids,
        partition_id="train",
        tags=[{"is_prompt": True, "status": "pending", "global_steps": steps}] * len(rows),
    )
    batch = tu.get_tensordict({key: column([row[key] for row in rows]) for key in rows[0]})
    tu.assign_non_tensor_data(batch, "global_steps", steps)
    started = time.perf_counter()
    await worker.generate_sequences(batch)  # fire-and-forget, as in a real run: its tasks are awaited here
    await asyncio.gather(*list(worker.background_tasks))
    return {"seconds": time.perf_counter() - started, **await stored(uids)}


async def run_job(worker: Any, job: dict[str, Any]) -> dict[str, Any]:
    """A finished job's outputs as `run()` makes them (the loop built as the worker builds it), stored by V1."""
    loop = loop_as_verl_builds_it(worker.config, worker, llm_client=None)
    with RolloutClient() as client:
        record = client.get_job(job["job_id"])
    kwargs = {"uid": job["uid"], "session_id": 0, "global_steps": job["global_steps"], "raw_prompt": [], "index": 0}
    tag = {"is_prompt": True, "status": "finished", "global_steps": job["global_steps"]}
    tq.kv_put(key=job["uid"], partition_id="train", tag=tag)
    outputs = loop.outputs(record, 1, Sample.of(kwargs), "0", loop.segments_for(Sample.of(kwargs)))
    await worker._agent_loop_postprocess(outputs, False, **kwargs)
    return {"outputs": len(outputs), **await stored([job["uid"]])}


async def stored(uids: list[str]) -> dict[str, Any]:
    """What TransferQueue holds for these prompts: their tags and every trajectory's tags and tensors."""
    listed = (await tq.async_kv_list("train")).get("train", {})
    keys = sorted(k for k in listed if k.split("_")[0] in set(uids) and k not in uids)
    out: dict[str, Any] = {
        "prompts": {uid: listed.get(uid) for uid in uids},
        "keys": keys,
        "tags": [listed[k] for k in keys],
    }
    if not keys:
        return out
    data = await tq.async_kv_batch_get(keys=keys, partition_id="train", select_fields=[*TENSORS, "extra_fields"])
    out["tensors"] = {name: [t.tolist() for t in data[name].unbind()] for name in TENSORS}
    out["extra"] = [plain_extra(e) for e in items(data, "extra_fields")]
    return out


def sample(config: Any, global_steps: int, batch_size: int, max_off_policy_threshold: int) -> dict[str, Any]:
    """verl's async replay buffer, drop strategy, samples a batch at `global_steps`; the batch's
    min/max_global_steps as V1's trainer reads them (trainer_base.py, `_compute_metrics`)."""
    refills: list[int] = []
    buffer = ReplayBufferAsync(
        trainer_mode="colocate_async",
        trainer_config=config.trainer,
        max_off_policy_threshold=max_off_policy_threshold,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
        poll_interval=0.1,
        refill_fn=refills.append,
    )
    batch, metrics = buffer.sample(global_steps=global_steps, partition_id="train", batch_size=batch_size)
    non_padding_mask = np.array([not tag.get("is_padding", False) for tag in batch.tags], dtype=bool)
    # verl/trainer/ppo/v1/trainer_base.py, _compute_metrics: a None here is the TypeError of a real fit()
    min_global_steps = np.array([tag["min_global_steps"] for tag in batch.tags], dtype=int)[non_padding_mask]
    max_global_steps = np.array([tag["max_global_steps"] for tag in batch.tags], dtype=int)[non_padding_mask]
    return {
        "keys": list(batch.keys),
        "metrics": {k: json_safe(v) for k, v in metrics.items()},
        "refills": refills,
        "min_global_steps": min_global_steps.tolist(),
        "max_global_steps": max_global_steps.tolist(),
        "staleness": ((global_steps - 1) - max_global_steps).tolist(),
    }


def items(data: Any, name: str) -> list[Any]:
    """A non-tensor field of a TransferQueue batch, one item per key (as V1's trainer reads `extra_fields`)."""
    values = data.pop(name)
    return values.tolist() if hasattr(values, "tolist") else list(values)


def column(values: list[Any]) -> np.ndarray:
    """One field of the rows as the dataloader gives it: a 1-d object array (a list value stays one item)."""
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


def plain_extra(extra: dict[str, Any]) -> dict[str, Any]:
    keep = ("rollouts_", "min_global_steps", "max_global_steps", "reward_extra_info")
    return {k: json_safe(v) for k, v in extra.items() if k.startswith(keep)}


def json_safe(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
