"""verl's V1 agent-loop manager backed by the service: one batch -> one submission -> its trajectories in TransferQueue.

Select it with `actor_rollout_ref.rollout.agent.agent_loop_manager_class=
rollouts_client.trainers.verl_manager.RolloutsAgentLoopManager` (verl 0.9.1, `trainer.use_v1: true`).
verl's TaskRunnerV1 (verl/trainer/main_ppo.py, `init_agent_loop_manager`) loads the class by that name and
calls `create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)`; V1's trainer then calls
`generate_sequences(batch)` (trainer_base.py: `_submit_batch_to_rollout`, `_validate`,
`_reissue_inflight_prompts`) with a TensorDict of prompts (each with its `uid`, registered in TransferQueue
as `is_prompt` with its `global_steps`) and expects it to return at once and to put every trajectory into
TransferQueue as `{uid}_{session_id}_{i}` when it is done, then the prompt's status `finished` or `failure`.

Where verl's own manager (AgentLoopManagerTQ) splits the batch over Ray agent-loop workers that run one loop per
(prompt, session), this one sends the batch's `n` sessions of every prompt to the service as ONE request and
follows them with one watch. Each job is keyed and built exactly as the agent loop (RolloutsAgentLoop) keys and
builds it under V1 (run id, row identity, session id), so either path finds the other's jobs after a resume;
its outputs are the loop's own (`outputs()`, V1's min/max_global_steps), stored by verl's own
`AgentLoopWorkerTQ._agent_loop_postprocess` (an instance of the worker's class in this process: no Ray actor)
as the job ends. Every row goes to the service (the rows' `agent_name` is not read); the settings are the
agent-loop YAML entry named by `rollout.agent.default_agent_loop` when it is RolloutsAgentLoop's, else the entry
`rollouts`, else the defaults. A failed job is resubmitted or raised by those settings, and a prompt with a failed
session (or a batch the service refused) is marked `failure` with no trajectory, never a reward; what failed is
logged and kept in `errors`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import hydra
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ, apply_greedy_sampling_params

from rollouts_client.trainers.records import job_seconds
from rollouts_client.trainers.verl_agent_loop import AGENT_NAME, RolloutsAgentLoop, Sample
from rollouts_client.trainers.waiting import ServiceConnection

logger = logging.getLogger(__name__)
LOOP_TARGET = f"{RolloutsAgentLoop.__module__}.{RolloutsAgentLoop.__qualname__}"


@dataclass(frozen=True)
class Session:
    """One sample of a prompt: the kwargs verl's worker passes the loop, and the job the loop makes of them."""

    kwargs: dict[str, Any]
    sample: Sample
    body: dict[str, Any]
    key: str
    row: str

    @property
    def uid(self) -> str:
        return str(self.kwargs["uid"])

    @property
    def id(self) -> int:
        return int(self.kwargs["session_id"])


class RolloutsAgentLoopManager:
    """verl V1's agent-loop manager: each batch is one service submission; trajectories go to TransferQueue."""

    def __init__(
        self,
        config: Any,
        llm_client: Any = None,
        teacher_client: Any = None,
        reward_loop_worker_handles: Any = None,
    ) -> None:
        if config.trainer.get("use_v1") is False:
            raise ValueError(
                "RolloutsAgentLoopManager is verl V1's manager (trainer.use_v1: true, TransferQueue); the legacy "
                "trainer awaits a padded batch from its manager: use the agent loop there (RolloutsAgentLoop)"
            )
        self.config = config
        # verl's own worker, in this process: its post-processing (reward loop, teacher, position ids, TQ put)
        self.worker = AgentLoopWorkerTQ.__ray_metadata__.modified_class(
            config, llm_client, teacher_client, reward_loop_worker_handles
        )
        self.loop = loop_as_verl_builds_it(self.config, self.worker, llm_client)
        self._pending: list[Future[None]] = []  # the batches started (the done ones dropped at each start)
        self.errors: list[BaseException] = []  # what failed a batch or a session (also logged)
        self._events = asyncio.new_event_loop()  # jobs are followed here while verl's trainer goes on
        self._thread = threading.Thread(target=self._events.run_forever, name="rollouts-manager", daemon=True)
        self._thread.start()

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> RolloutsAgentLoopManager:
        """As TaskRunnerV1 calls it (verl's own managers start Ray workers here; this one needs none)."""
        return cls(*args, **kwargs)

    def generate_sequences(self, prompts: TensorDict) -> None:
        """Start the batch and return: its trajectories reach TransferQueue as their jobs end."""
        validate = bool(prompts["validate"]) if "validate" in prompts else False
        future = asyncio.run_coroutine_threadsafe(self._run_batch(rows_of(prompts), validate), self._events)
        self._pending = [*(f for f in self._pending if not f.done()), future]

    def wait(self, timeout: float | None = None) -> None:
        """Block until every batch started so far is stored (tests, shutdown); verl itself polls TransferQueue."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for future in list(self._pending):
            future.result(None if deadline is None else max(deadline - time.monotonic(), 0.0))

    def close(self) -> None:
        self._events.call_soon_threadsafe(self._events.stop)
        self._thread.join(timeout=5)

    async def _run_batch(self, prompts: list[dict[str, Any]], validate: bool) -> None:
        """Submit every session of every prompt in one request, store each as its job ends, then each prompt's
        status (`failure` where a session failed, as AgentLoopWorkerTQ._run_prompt: verl's buffer evicts it)."""
        partition = "val" if validate else "train"
        uids = [str(p["uid"]) for p in prompts]
        await self._status(uids, partition, "running")
        try:
            sessions = [s for p in prompts for s in self._sessions(p, validate)]
            if not sessions:  # every prompt asked for 0 sessions (`__rollout_n__`)
                await self._status(uids, partition, "finished")
                return
            if self.loop.settings.engines == "trainer":
                await self.loop.declare_step(sessions[0].sample)
            connection = ServiceConnection.shared(self.loop.settings)
            ids = await connection.submit(  # run_jobs' submit: each job is stored as it ends, not with the batch
                [s.body for s in sessions], [s.key for s in sessions], [s.row for s in sessions]
            )
        except Exception as exc:
            logger.exception("rollouts: a batch of %d prompts was not submitted", len(uids))
            self.errors.append(exc)
            await self._status(uids, partition, "failure")
            raise
        started = (time.perf_counter(), time.time())
        ends = [self._store(connection, s, job_id, validate, started) for s, job_id in zip(sessions, ids)]
        failed: set[str] = set()
        for session, result in zip(sessions, await asyncio.gather(*ends, return_exceptions=True)):
            if isinstance(result, BaseException):
                logger.error("rollouts: %s session %d failed", session.uid, session.id, exc_info=result)
                self.errors.append(result)
                failed.add(session.uid)
        await self._status([u for u in uids if u not in failed], partition, "finished")
        await self._status([u for u in uids if u in failed], partition, "failure")

    def _sessions(self, prompt: dict[str, Any], validate: bool) -> list[Session]:
        """The prompt's n sessions as AgentLoopWorkerTQ._run_prompt runs them, each job built and keyed by the loop
        (a RowError here fails the prompt, as it fails the loop's session)."""
        rollout = self.config.actor_rollout_ref.rollout
        prompt = dict(prompt)
        n = int(prompt.pop("__rollout_n__", rollout.val_kwargs.n if validate else rollout.n))
        do_sample = prompt.pop("__do_sample__", True)
        prompt.pop("agent_name", None)
        params = sampling_params(rollout, validate)
        if not validate and not do_sample:
            apply_greedy_sampling_params(params)
        sessions = []
        for session_id in range(n):
            kwargs = {**prompt, "session_id": session_id}
            sample = Sample.of(kwargs)
            row = self.loop.row_name(kwargs)
            body = self.loop.job_body(params, kwargs, row)
            sessions.append(Session(kwargs, sample, body, self.loop.job_key(kwargs, sample), row))
        return sessions

    async def _store(
        self, connection: ServiceConnection, session: Session, job_id: str, validate: bool, started: tuple[float, float]
    ) -> None:
        """Wait for one job (resubmitted or raised by the settings: a failure never becomes a reward) and store its
        outputs with verl's own post-processing, as `{uid}_{session_id}_{i}`."""
        job, attempts = await connection.settle(session.body, session.key, session.row, job_id)
        outputs = self.loop.outputs(job, attempts, session.sample, session.row, self.loop.segments_for(session.sample))
        bridge_s = time.perf_counter() - started[0] - job_seconds(job, started[1])
        for output in outputs:
            output.extra_fields["rollouts_bridge_s"] = bridge_s
        await self.worker._agent_loop_postprocess(outputs, validate, **session.kwargs)

    @staticmethod
    async def _status(uids: list[str], partition: str, status: str) -> None:
        if uids:
            await tq.async_kv_batch_put(keys=uids, partition_id=partition, tags=[{"status": status}] * len(uids))


def sampling_params(rollout: Any, validate: bool) -> dict[str, Any]:
    """verl's sampling parameters for a batch, as AgentLoopWorkerTQ.generate_sequences sets them."""
    values = rollout.val_kwargs if validate else rollout
    return dict(
        temperature=values.temperature,
        top_p=values.top_p,
        top_k=values.top_k,
        repetition_penalty=1.0,
        logprobs=rollout.calculate_log_probs,
    )


def rows_of(batch: TensorDict) -> list[dict[str, Any]]:
    """The batch's prompts as the worker unpacks them: tensors and non-tensor stacks per row, shared data to all."""
    rows: list[dict[str, Any]] = [{} for _ in range(len(batch))]
    for key, value in batch.items():
        if key == "validate":
            continue
        for i, row in enumerate(rows):
            if isinstance(value, torch.Tensor):
                row[key] = value[i]
            elif isinstance(value, NonTensorStack):
                row[key] = value[i].data
            elif isinstance(value, NonTensorData):
                row[key] = value.data
    return rows


def loop_as_verl_builds_it(config: Any, worker: Any, llm_client: Any) -> RolloutsAgentLoop:
    """The agent loop as verl's worker builds it (`_run_agent_loop`), from its YAML entry when it has one."""
    agent = config.actor_rollout_ref.rollout.agent
    entry = None
    for name in (agent.get("default_agent_loop"), AGENT_NAME):
        found = _agent_loop_registry.get(name)
        if found is not None and found.get("_target_") == LOOP_TARGET:
            entry = found
            break
    return hydra.utils.instantiate(
        config=entry if entry is not None else OmegaConf.create({"_target_": LOOP_TARGET}),
        trainer_config=DictConfigWrap(config=config),
        server_manager=llm_client,
        tokenizer=worker.tokenizer,
        processor=worker.processor,
        hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap(worker.tools),
    )
