"""No drift, with the real CPU backend: the record is token for token what the model saw and produced.

Each test runs real multi-turn rollouts through the pool (complete_routed) and checks,
turn by turn, that every generated token and logprob is what the backend returned,
that each call saw exactly the record before it, that the loss mask covers exactly the
generated tokens, that decode(token_ids) is the conversation the chat template renders,
and, with an independent forward pass of the same model over the whole record, that
the logprobs belong to these tokens in this context.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from redis import Redis

from shared.backend_pool import BackendPool
from shared.config import Settings
from shared.keys import Keys
from shared.toolserver.schemas import TOOL_SCHEMAS
from shared.training import collate_trajectories
from shared.trajectory import ASSISTANT, Trajectory
from tests.agent.conftest import MAX_MODEL_LEN, Unlimited
from tests.backends.backend_procs import CpuBackendProcess
from tests.support.trajectory_checks import Served, assert_decodes_to_conversation, assert_exact_against_backend
from workers.rollout.agent_loop import AgentLoop, LoopConfig
from workers.rollout.chat_delta import ChatRenderer, tool_instructions_json
from workers.rollout.llm_client import LLMClient, Sampling
from workers.rollout.llm_routing import complete_routed
from workers.rollout.tool_parsers import get_parser

ROLLOUTS = 50
TOOLS = [s for s in TOOL_SCHEMAS if s["function"]["name"] == "finish"]
TASK = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something, then finish."}]


@pytest.fixture(scope="module")
def model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()


def model_logprobs(model: Any, token_ids: list[int]) -> list[float]:
    """log p(token_t | tokens_<t) for t >= 1 from one full forward pass (no cache)."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(token_ids[1:])[:, None])[:, 0].tolist()


def assert_logprobs_match_the_model(model: Any, record: Trajectory) -> None:
    expected = model_logprobs(model, record.token_ids)
    for turn in record.turns:
        if turn.role == ASSISTANT:
            for i in range(turn.start, turn.end):
                assert abs(record.logprobs[i] - expected[i - 1]) < 1e-3, (i, record.logprobs[i], expected[i - 1])


class Rollout:
    """One trajectory through the pool, with every call it made recorded as the backend answered it."""

    def __init__(self, pool: BackendPool, client: LLMClient, tokenizer: Any, job_id: str, seed: int,
                 config: LoopConfig, on_call: Callable[[int], None] | None = None, ignore_eos: bool = False) -> None:
        self.served: list[Served] = []
        self.renderer = ChatRenderer(tokenizer, TOOLS, tool_instructions_json(TOOLS, get_parser("hermes").call_format))

        def generate(prompt: list[int], sampling: Sampling):
            if on_call is not None:
                on_call(len(self.served))
            completion = complete_routed(pool, client, job_id, prompt, sampling)
            self.served.append(Served(list(prompt), completion.token_ids, completion.logprobs, sampling.max_tokens,
                                      completion.backend_id))
            return completion

        self.loop = AgentLoop(self.renderer, get_parser("hermes"), generate, None, config,
                              Sampling(max_tokens=config.max_tokens_per_turn, temperature=1.0, seed=seed,
                                       ignore_eos=ignore_eos), Unlimited())
        self.job_id, self.pool = job_id, pool

    def run(self) -> Trajectory:
        try:
            return self.loop.run(TASK)
        finally:
            self.pool.release(self.job_id)


def loop_config(**overrides: Any) -> LoopConfig:
    values = {"max_turns": 3, "max_context_tokens": 2000, "max_tokens_per_turn": 24, "stop_on_no_tool_call": False,
              "allowed_tools": ("finish",)}
    return LoopConfig(**{**values, **overrides})


@pytest.fixture()
def pool(redis: Redis, settings: Settings) -> BackendPool:
    return BackendPool(redis, Keys(settings.redis_prefix), settings)


def test_fifty_multi_turn_rollouts_have_no_drift(cpu_backend: CpuBackendProcess, pool: BackendPool, tokenizer: Any,
                                                  model: Any) -> None:
    pool.register(cpu_backend.url, "tiny")
    with LLMClient(request_timeout_s=120, max_retries=1, backoff_s=0.05) as client:
        rollouts = [Rollout(pool, client, tokenizer, f"job-{i}", seed=i, config=loop_config()) for i in range(ROLLOUTS)]
        with ThreadPoolExecutor(4) as executor:  # slot threads share the tokenizer, the pool and the client
            records = list(executor.map(Rollout.run, rollouts))

    multi_turn = 0
    for rollout, record in zip(rollouts, records, strict=True):
        assert_exact_against_backend(record, rollout.served)
        assert_decodes_to_conversation(record, rollout.renderer, TASK)
        assert_logprobs_match_the_model(model, record)
        assert record.stop_reason in ("max_turns", "finish")
        multi_turn += record.counts.turns > 1
    assert multi_turn >= ROLLOUTS // 2, "most rollouts must really be multi-turn"
    assert len({tuple(r.token_ids) for r in records}) > ROLLOUTS // 2, "seeds give different trajectories"
    assert pool.inflight_total() == 0

    # The trainer's batch is the records, unchanged: no re-tokenization on the way to the loss.
    batch = collate_trajectories([r.to_dict() for r in records], pad_token_id=tokenizer.pad_token_id)
    for row, record in enumerate(records):
        n = len(record.token_ids)
        assert batch["input_ids"][row, :n].tolist() == record.token_ids
        assert batch["loss_mask"][row, :n].tolist() == record.loss_mask
        expected = torch.tensor([0.0 if lp is None else lp for lp in record.logprobs], dtype=torch.float32)
        assert torch.equal(batch["old_logprobs"][row, :n], expected)
        assert batch["attention_mask"][row].sum().item() == n


def test_context_length_stop_with_the_real_backend(cpu_backend: CpuBackendProcess, pool: BackendPool,
                                                   tokenizer: Any) -> None:
    pool.register(cpu_backend.url, "tiny")
    renderer = ChatRenderer(tokenizer, TOOLS, tool_instructions_json(TOOLS, get_parser("hermes").call_format))
    prompt_tokens = len(renderer.prompt(renderer.prepare(TASK)).token_ids)
    context = prompt_tokens + 60  # a turn and a nudge fit; the second turn gets what is left, then nothing is
    with LLMClient(request_timeout_s=120, max_retries=1, backoff_s=0.05) as client:
        rollout = Rollout(pool, client, tokenizer, "ctx-job", seed=7,
                          config=loop_config(max_turns=10, max_context_tokens=context, max_tokens_per_turn=24))
        record = rollout.run()
    assert record.stop_reason == "context_length" and len(record.token_ids) <= context
    assert_exact_against_backend(record, rollout.served)
    for call in rollout.served:
        assert call.max_tokens == min(24, context - len(call.prompt))


def test_a_backend_with_a_smaller_context_stops_the_loop_cleanly(cpu_backend: CpuBackendProcess, pool: BackendPool,
                                                                 tokenizer: Any) -> None:
    """Configured for 10k tokens, served by a 2048-token backend: its 400 teaches the loop the real limit."""
    pool.register(cpu_backend.url, "tiny")
    with LLMClient(request_timeout_s=120, max_retries=1, backoff_s=0.05) as client:
        rollout = Rollout(pool, client, tokenizer, "small-ctx-job", seed=5, ignore_eos=True,
                          config=loop_config(max_turns=10, max_context_tokens=10_000, max_tokens_per_turn=500))
        record = rollout.run()
    assert record.stop_reason == "context_length" and rollout.loop.context_tokens == MAX_MODEL_LEN
    assert len(record.token_ids) == MAX_MODEL_LEN, "the last turn got exactly what the backend had left"
    assert rollout.served[-1].max_tokens == MAX_MODEL_LEN - len(rollout.served[-1].prompt) < 500
    assert_exact_against_backend(record, rollout.served)


def kill_when_generating(backend: CpuBackendProcess) -> None:
    """Kill the backend as soon as its vLLM gauge shows a request running: the kill lands mid-generation."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            metrics = httpx.get(backend.url + "/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        if any(line.startswith("vllm:num_requests_running{") and float(line.rsplit(" ", 1)[1]) >= 1
               for line in metrics.splitlines()):
            backend.kill()
            return
        time.sleep(0.01)
    raise AssertionError("the second turn never started")


def test_backend_failover_mid_trajectory_keeps_the_record_exact(
    start_cpu_backends: Callable[[int], list[CpuBackendProcess]], pool: BackendPool, tokenizer: Any, model: Any
) -> None:
    """The pinned backend dies while generating turn 2: the turn is redone elsewhere and the record stays exact."""
    processes = start_cpu_backends(2)
    by_id = {pool.register(p.url, "tiny").id: p for p in processes}
    killed: list[str] = []
    killers: list[threading.Thread] = []

    with LLMClient(request_timeout_s=120, connect_timeout_s=1, max_retries=1, backoff_s=0.05) as client:
        rollout: Rollout

        def kill_pinned_during_turn_two(calls_so_far: int) -> None:
            if calls_so_far == 1:
                pinned = rollout.served[-1].backend_id
                killed.append(pinned)
                killers.append(threading.Thread(target=kill_when_generating, args=(by_id[pinned],)))
                killers[-1].start()

        rollout = Rollout(pool, client, tokenizer, "failover-job", seed=3, ignore_eos=True,
                          config=loop_config(max_turns=3, max_tokens_per_turn=300),
                          on_call=kill_pinned_during_turn_two)
        record = rollout.run()
    killers[0].join()

    backends = [t.backend_id for t in record.turns if t.role == ASSISTANT]
    assert len(backends) == 3 and backends[0] == killed[0]
    assert all(b != killed[0] for b in backends[1:]), "from the killed turn on, every turn ran on the other backend"
    assert all(t.length == 300 for t in record.turns if t.role == ASSISTANT), "the killed turn was redone whole"
    assert_exact_against_backend(record, rollout.served)
    assert_decodes_to_conversation(record, rollout.renderer, TASK)
    assert_logprobs_match_the_model(model, record)
    assert not pool.get(killed[0]).healthy and pool.inflight_total() == 0
