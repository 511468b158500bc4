"""DAPO through the real service: workers run dapo_sim jobs, the hook replenishes from the stage runner."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from click.testing import CliRunner
from redis import Redis

from cli.main import main
from cli.stack import Stack
from rollouts_client import AsyncRolloutClient, BatchExhausted, RolloutClient, groups_to_tensors
from shared.batches.store import BatchStore
from shared.config import Settings
from shared.jobs.store import JobStore
from tests.batches.live import start_stack
from tests.support.holds import Gate
from tests.support.waiting import wait_for

SLOW_INFORMATIVE = {"kind": "dapo_sim", "rewards": [0.0, 1.0]}  # held: slow_informative(gate)
FAST_INFORMATIVE = {"kind": "dapo_sim", "rewards": [1.0, 0.0], "rollout_s": 0.1}
FAST_UNIFORM = {"kind": "dapo_sim", "reward": 1.0, "rollout_s": 0.1}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(tmp_path_factory.mktemp("batches-live"))
    yield stack
    stack.stop(timeout=10)


def slow_informative(gate: Gate) -> dict:
    """An informative prompt whose rollouts run until the test releases `gate` (a file, not a time)."""
    return {**SLOW_INFORMATIVE, **gate.hold("rollout")}


def test_uniform_prompts_are_replaced_while_slow_groups_still_run(stack, tmp_path):
    # the target needs the two slow groups: only four prompts of the pool are informative
    gate = Gate(tmp_path / "release-slow")
    fast = [FAST_UNIFORM, FAST_UNIFORM, FAST_INFORMATIVE] * 2 + [FAST_UNIFORM] * 3
    pool = [slow_informative(gate), slow_informative(gate), *fast]
    with RolloutClient(stack.api_url) as client:
        batch = client.submit_batch(pool, n_samples=2, min_informative_groups=4, max_groups_in_flight=4)

        def only_the_slow_groups_left() -> bool:
            counts = client.get_batch(batch.id).counts
            return counts.launched == len(pool) and counts.in_flight == 2

        try:  # every fast group runs and ends while the slow ones are held
            wait_for(only_the_slow_groups_left, timeout=120, what="every fast group to end beside the held ones")
        finally:
            gate.release()
        groups = list(client.iter_groups(batch.id, results=False, timeout=120))
        final = client.get_batch(batch.id)
    assert final.status == "completed" and final.counts.used == 4 == len(groups), (final, groups)
    assert all(g.outcome == "informative" and g.used for g in groups), groups
    assert len({g.prompt_index for g in groups}) == 4
    counts = final.counts
    assert counts.filtered >= 1 and counts.filtered + counts.late == counts.launched - 4, counts
    slow = [g for g in groups if g.prompt_index in (0, 1)]
    assert len(slow) == 2, "the slow informative groups count toward the target"
    slow_end = min(g.completed_at for g in slow)
    replacements = [g for g in groups if g.prompt_index >= 4]
    assert replacements, "a prompt after the first four was launched and used"
    # asynchronous replenishment: replacements were launched, ran and completed while the slow groups ran
    assert max(g.launched_at for g in replacements) < slow_end
    assert groups[0].completed_at < slow_end and groups[0].prompt_index >= 2
    # a filtered group's jobs really ran to the end, with equal rewards
    jobs = httpx.get(f"{stack.api_url}/v1/jobs", params={"group_id": f"b.{batch.id}.2"}).json()["jobs"]
    assert [j["status"] for j in jobs] == ["done", "done"] and {j["reward"] for j in jobs} == {1.0}


def test_all_prompts_mode_reports_every_group_with_advantages(stack):
    pool = [FAST_UNIFORM, FAST_INFORMATIVE, FAST_INFORMATIVE]
    with RolloutClient(stack.api_url) as client:
        batch = client.submit_batch(pool, n_samples=2, advantages="mean")
        groups = sorted(client.collect_groups(batch.id, timeout=120), key=lambda g: g.prompt_index)
        final = client.get_batch(batch.id)
    assert final.status == "completed" and final.mode == "all" and final.counts.used == 3
    assert [g.outcome for g in groups] == ["uniform", "informative", "informative"]
    assert groups[0].advantages == [0.0, 0.0] and groups[1].advantages == [0.5, -0.5]


def test_cli_batch_follows_to_the_target_and_export_writes_trajectories(stack, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    lines = [FAST_UNIFORM, FAST_INFORMATIVE, FAST_UNIFORM, {"task": FAST_INFORMATIVE, "metadata": {"row": 3}}]
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    groups_out, export_out = tmp_path / "groups.jsonl", tmp_path / "export.jsonl"
    argv = ["batch", str(prompts), "--url", stack.api_url, "-n", "2", "--min-informative", "2", "--max-in-flight", "2"]
    ran = CliRunner().invoke(main, [*argv, "--output", str(groups_out), "--timeout", "120"])
    assert ran.exit_code == 0, ran.output
    assert "completed: used 2/2" in ran.output and "filtered" in ran.output
    groups = [json.loads(line) for line in groups_out.read_text().splitlines()]
    assert sorted(g["prompt_index"] for g in groups) == [1, 3] and groups[0]["samples"][0]["result"]["trajectory"]
    batch_id = groups[0]["batch_id"]
    ran = CliRunner().invoke(main, ["export", batch_id, "-o", str(export_out), "--url", stack.api_url])
    assert ran.exit_code == 0, ran.output
    rows = [json.loads(line) for line in export_out.read_text().splitlines()]
    assert len(rows) == 4 and {r["prompt_index"] for r in rows} == {1, 3}
    assert all(r["result"]["trajectory"]["token_ids"][:3] == [1, 2, 3] and r["advantage"] is not None for r in rows)


def test_a_failing_sample_fails_its_group_which_is_reported_and_replaced(stack):
    failing = {**FAST_INFORMATIVE, "fail_samples": [1]}
    with RolloutClient(stack.api_url) as client:
        batch = client.submit_batch(
            [failing, FAST_INFORMATIVE], n_samples=2, min_informative_groups=1, max_groups_in_flight=1
        )
        groups = client.collect_groups(batch.id, results=False, timeout=120)
        final = client.get_batch(batch.id)
    assert [(g.prompt_index, g.outcome, g.used) for g in groups] == [(0, "failed", False), (1, "informative", True)]
    assert "fails by request" in groups[0].error and groups[0].rewards == [1.0, None]
    assert final.status == "completed" and final.counts.failed == 1 and final.counts.used == 1


def test_worker_maintenance_sweeps_a_reservation_whose_submission_was_lost(stack, tmp_path):
    gate = Gate(tmp_path / "release")  # prompt 0 stays in flight until prompt 1 is reserved by hand
    with RolloutClient(stack.api_url) as client:
        pool = [slow_informative(gate), FAST_INFORMATIVE]
        batch = client.submit_batch(pool, n_samples=2, min_informative_groups=2, max_groups_in_flight=1)
        redis = Redis.from_url(stack.redis_url)
        batches = BatchStore(JobStore(redis, Settings(redis_url=stack.redis_url)))
        try:
            # a process reserves prompt 1 and dies before submitting its jobs
            redis.hset(batches.keys.batch(batch.id), "max_in_flight", 2)
            assert batches.fill(batch.id) == [1]
            assert batches.group_job_ids(batch.id, 1) == []
        finally:
            gate.release()
        final = client.wait_batch(batch.id, timeout=120)
        redis.close()
    assert final.status == "completed" and final.counts.used == 2 and final.counts.launched == 2


def test_long_poll_and_sse_readers_each_get_every_group_exactly_once(stack):
    pool = [FAST_INFORMATIVE, FAST_UNIFORM] * 6
    with RolloutClient(stack.api_url) as poller, RolloutClient(stack.api_url) as listener:
        batch = poller.submit_batch(pool, n_samples=2, min_informative_groups=5, max_groups_in_flight=3)
        via_sse: list[int] = []
        reader = threading.Thread(
            target=lambda: via_sse.extend(g.prompt_index for g in listener.iter_events(batch.id, timeout=120))
        )
        reader.start()
        via_poll = [g.prompt_index for g in poller.iter_groups(batch.id, results=False, timeout=120)]
        reader.join(timeout=120)
    assert len(via_poll) == 5 == len(set(via_poll))
    assert via_sse == via_poll  # the same groups, in the same (completion) order


def test_more_long_polls_than_redis_py_default_pool_all_answer(stack, tmp_path):
    """Each waiting long-poll holds one async Redis connection; redis-py 8 caps a pool at 100 by default."""
    polls = 120
    gate = Gate(tmp_path / "release")  # the batch stays unfinished, so every poll waits its full 3 s
    with RolloutClient(stack.api_url) as client:
        batch = client.submit_batch([slow_informative(gate)], n_samples=2)
    url = f"{stack.api_url}/v1/batches/{batch.id}/groups"
    barrier = threading.Barrier(polls)

    def long_poll(_: int) -> int:
        with httpx.Client(timeout=60) as http:
            barrier.wait()
            return http.get(url, params={"wait": 3}).status_code

    try:
        with ThreadPoolExecutor(polls) as pool:
            codes = list(pool.map(long_poll, range(polls)))
    finally:
        gate.release()
    assert codes == [200] * polls


def test_a_batch_that_cannot_fill_says_why_and_fails_loudly(stack, tmp_path):
    uniform = [FAST_UNIFORM] * 3
    with RolloutClient(stack.api_url) as client:
        batch = client.submit_batch(uniform, n_samples=2, min_informative_groups=2)
        with pytest.raises(BatchExhausted) as raised:
            client.wait_batch(batch.id, timeout=120)
    reason = raised.value.batch.reason
    assert raised.value.batch.status == "exhausted"
    assert "0 of 2 groups informative after 3 of 3 prompts" in reason and "3 groups had one reward" in reason

    prompts = tmp_path / "uniform.jsonl"
    prompts.write_text("".join(json.dumps({"task": row}) + "\n" for row in uniform))
    ran = CliRunner().invoke(
        main, ["batch", str(prompts), "-n", "2", "--min-informative", "2", "--url", stack.api_url, "--timeout", "120"]
    )
    assert ran.exit_code == 7, ran.output
    assert "could not fill" in ran.output and "0 of 2 groups informative" in ran.output


def test_streaming_an_exhausted_batch_ends_with_batch_exhausted_unless_partial(stack):
    # one informative prompt of three, target 2: the batch reports one group, then runs out of prompts
    with RolloutClient(stack.api_url) as client:
        batch = client.submit_batch(
            [FAST_INFORMATIVE, FAST_UNIFORM, FAST_UNIFORM], n_samples=2, min_informative_groups=2
        )
        with pytest.raises(BatchExhausted) as polled:
            list(client.iter_groups(batch.id, results=False, timeout=120))
        with pytest.raises(BatchExhausted) as streamed:
            list(client.iter_events(batch.id, timeout=120))
        partial = client.collect_groups(batch.id, results=True, timeout=120, partial=True)
        tensors = groups_to_tensors(partial, tensors="numpy")

    async def over_async_events() -> BatchExhausted:
        async with AsyncRolloutClient(stack.api_url) as aclient:
            with pytest.raises(BatchExhausted) as raised:
                _ = [group async for group in aclient.iter_events(batch.id, timeout=120)]
            return raised.value

    for exhausted in (polled.value, streamed.value, asyncio.run(over_async_events())):
        assert exhausted.received == 1 and exhausted.batch.status == "exhausted", exhausted
        assert "(1 of 2 groups used, 1 streamed)" in str(exhausted), exhausted
        assert "1 of 2 groups informative after 3 of 3 prompts" in str(exhausted), exhausted
    assert [g.outcome for g in partial] == ["informative"] and tensors["input_ids"].shape[0] == 2


def test_collating_nothing_from_an_exhausted_batch_names_its_state(stack):
    with RolloutClient(stack.api_url) as client:
        batch = client.submit_batch([FAST_UNIFORM] * 2, n_samples=2, min_informative_groups=1)
        groups = client.collect_groups(batch.id, timeout=120, partial=True)  # every group filtered: none reported
        final = client.get_batch(batch.id)
    assert groups == []
    with pytest.raises(ValueError, match=f"batch {final.id} is exhausted .0 of 1 groups used.: the batch's prompts"):
        groups_to_tensors(groups, batch=final, tensors="numpy")
