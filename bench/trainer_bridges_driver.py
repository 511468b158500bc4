"""The trainers' side of bench.trainer_bridges: run in the trainers' virtualenv (it imports verl).

    python bench/trainer_bridges_driver.py MODEL_DIR OUT_JSON N CONCURRENCY

Per trajectory, side by side in one process (alternating, `CONCURRENCY` at a time), with ROLLOUTS_API_URL:
- **bridge**: verl's `AgentLoopWorker._run_agent_loop` on one row: verl builds our loop (hydra), its
  `run()` (submit, wait, split the record, build the AgentLoopOutput; also reported alone as **run()**,
  measured inside it), then verl's own padding (`_agent_loop_postprocess`);
- **client**: the same job through the plain AsyncRolloutClient (`submit_jobs`, `wait_jobs` at its
  50 ms poll), the baseline a trainer writing its own glue would have.
- **manager**: verl V1's agent-loop manager (RolloutsAgentLoopManager, made by verl's own TaskRunnerV1 from the
  config key, a local Ray and TransferQueue as in tests/trainers/verl_manager_driver.py) on N/2 prompts x
  `rollout.n` 2 as ONE batch, registered and dispatched as V1's trainer does, after the two paths above: a
  trajectory's call starts with the batch and ends when verl's own post-processing has put it in TransferQueue
  (**mgr end**: the part of it after the job's end).
Each sample is the call's wall time minus the job's own time on the service (created -> finished).
Also the cost of the split and the AgentLoopOutput per 1k tokens, on the records the run produced.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import ray
import transfer_queue as tq
import verl.trainer.config
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker
from verl.utils import tensordict_utils as tu

from rollouts_client.aio import AsyncRolloutClient
from rollouts_client.sync import RolloutClient
from rollouts_client.trainers.records import job_seconds, split_record

RUN_OVERHEADS: list[float] = []
REPO = Path(__file__).resolve().parents[1]
LOOPS = REPO / "examples" / "verl" / "agent_loops.yaml"
TASK = {
    "kind": "agent-parity",
    "problem": "[standin:turns=2 answer=4] bench",
    "stop_on_no_tool_call": False,
    "max_turns": 3,
}


def row(i: int) -> dict:
    return {
        "raw_prompt": [{"role": "user", "content": "-"}],
        "extra_info": {"index": i, "rollouts_task": TASK},
        "index": i,
        "data_source": "bench",
        "agent_name": "rollouts",
        "uid": f"bench-{time.time()}-{i}",
    }


async def bridge_once(worker: AgentLoopWorker, i: int) -> tuple[float, str, float]:
    started, started_at = time.perf_counter(), time.time()
    out = await worker._run_agent_loop(
        {"temperature": 1.0}, {"step": 0, "sample_index": i, "rollout_n": 0, "validate": False}, **row(i)
    )
    wall = time.perf_counter() - started
    job_id = out.extra_fields["rollouts_job_id"]
    RUN_OVERHEADS.append(out.extra_fields["rollouts_bridge_s"])  # run() alone, measured inside it
    return wall, job_id, started_at


async def client_once(client: AsyncRolloutClient, i: int) -> tuple[float, str, float]:
    started, started_at = time.perf_counter(), time.time()
    [job_id] = await client.submit_jobs({"task": TASK, "sampling": {"temperature": 1.0}})
    [job] = await client.wait_jobs([job_id], poll_s=0.05)
    assert job.trajectory
    return time.perf_counter() - started, job_id, started_at


async def main_async(model: str, n: int, concurrency: int) -> dict:
    with initialize_config_dir(config_dir=os.path.dirname(verl.trainer.config.__file__), version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.prompt_length=1024",
                "actor_rollout_ref.rollout.response_length=1024",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={LOOPS}",
            ],
        )
    worker = AgentLoopWorker(config, llm_client=None)
    client = AsyncRolloutClient()
    samples: dict[str, list[tuple[float, str, float]]] = {"bridge": [], "client": []}
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            if i % 2 == 0:
                samples["bridge"].append(await bridge_once(worker, i))
            else:
                samples["client"].append(await client_once(client, i))

    await asyncio.gather(*(one(i) for i in range(2 * n)))
    overheads: dict[str, list[float]] = {}
    jobs = {}
    for path, runs in samples.items():
        fetched = await asyncio.gather(*(client.get_job(job_id) for _, job_id, _ in runs))
        jobs.update({j.id: j for j in fetched})
        overheads[path] = [wall - job_seconds(job, at) for (wall, _, at), job in zip(runs, fetched)]

    # the split and the AgentLoopOutput, per 1k tokens, on these records
    records = list(jobs.values())
    tokens = sum(len(j.trajectory["token_ids"]) for j in records)
    started = time.perf_counter()
    for _ in range(20):
        for job in records:
            split = split_record(job)
            AgentLoopOutput(
                prompt_ids=split.prompt_ids,
                response_ids=split.response_ids,
                response_mask=split.response_mask,
                response_logprobs=split.response_logprobs,
                reward_score=job.reward,
                num_turns=split.num_turns,
                metrics=AgentLoopMetrics(),
            )
    per_1k = (time.perf_counter() - started) / 20 / tokens * 1000
    await client.close()
    overheads["run()"] = RUN_OVERHEADS
    return {"overheads": overheads, "split_s_per_1k_tokens": per_1k, "mean_tokens": tokens / len(records)}


def manager_overheads(model: str, n: int) -> tuple[list[float], list[float]]:
    """The manager's path: `n` trajectories as one batch; each one's time from the batch's dispatch to its
    TransferQueue put, minus its job's own time on the service; and the part of it after the job's end (seeing
    the end, reading the record, verl's post-processing and the put)."""
    sys.path.insert(0, str(REPO / "tests" / "trainers"))  # the manager test's drivers: verl's own set-up
    from verl_manager_driver import MANAGER_KEY, made_by_verl
    from verl_v1_driver import N, column, v1_config

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    manager = made_by_verl(v1_config(model, str(LOOPS), MANAGER_KEY))
    stored_at: dict[str, float] = {}
    postprocess = manager.worker._agent_loop_postprocess

    async def timed(outputs: list, validate: bool, **kwargs: object) -> None:
        await postprocess(outputs, validate, **kwargs)
        stored_at[outputs[0].extra_fields["rollouts_job_id"]] = time.time()

    manager.worker._agent_loop_postprocess = timed
    rows = [{**row(i), "uid": f"bench-manager-{os.getpid()}-{i}"} for i in range(max(n // N, 1))]
    uids = [r["uid"] for r in rows]
    tq.kv_batch_put(
        keys=uids, partition_id="train", tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}] * len(rows)
    )
    batch = tu.get_tensordict({key: column([r[key] for r in rows]) for key in rows[0]})
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    started_at = time.time()
    manager.generate_sequences(batch)
    manager.wait(timeout=600)
    manager.close()
    with RolloutClient() as client:
        jobs = [client.get_job(job_id) for job_id in stored_at]
    tq.close()
    ray.shutdown()
    overheads = [stored_at[job.id] - started_at - job_seconds(job, started_at) for job in jobs]
    after_end = [stored_at[job.id] - float(job.finished_at or 0.0) for job in jobs]
    return overheads, after_end


def main() -> int:
    model, out, n, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    result = asyncio.run(main_async(model, n, concurrency))
    result["overheads"]["manager"], result["overheads"]["mgr end"] = manager_overheads(model, n)
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
