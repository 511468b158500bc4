"""TRL's own GRPOTrainer takes its rollouts and rewards from the service (trl 1.16, real vLLM backend).

Two optimizer steps of GRPOTrainer on the tiny model with the bridge's `rollout_func` and
`service_reward`, on the multi-turn `agent-parity` kind (nudges between turns: tokens TRL must not
train on). What TRL built from the hook's output (its padded prompt and completion tensors, the
`tool_mask` it multiplies into the loss mask, the backend logprobs it keeps, the rewards its reward
function returned) is read off the trainer and compared with the jobs' records, token by token.
The weight callback is the example's (tests/train/test_grpo_smoke.py): pushing here would change
the session's shared vLLM server.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from rollouts_client import RolloutClient
from rollouts_client.trainers.records import JobFailed
from rollouts_client.trainers.rows import RowError
from rollouts_client.trainers.trl_rollout import RolloutsTRL, task_of_prompt, task_prompt
from tests.trainers.conftest import Service

pytestmark = pytest.mark.vllm

GROUP = 2


def parity(problem: str, **more: Any) -> str:
    return task_prompt(
        {"kind": "agent-parity", "problem": problem, "stop_on_no_tool_call": False, "max_turns": 3, **more}
    )


def spy(obj: Any, name: str, seen: list[Any]) -> None:
    """Record what `obj.name` returns (TRL's own method runs unchanged)."""
    original = getattr(obj, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        seen.append(result)
        return result

    setattr(obj, name, recorded)


@pytest.fixture(scope="module")
def trained(service: Service, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(service.model_dir)
    model = AutoModelForCausalLM.from_pretrained(service.model_dir, dtype=torch.float32)
    bridge = RolloutsTRL(api_url=service.api_url, run_id="trl-test", max_tokens_per_turn=8)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        per_device_train_batch_size=2 * GROUP,
        num_generations=GROUP,
        max_steps=2,
        learning_rate=1e-3,
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    rows = Dataset.from_list([{"prompt": parity(f"p{i}?")} for i in range(4)])
    trainer = GRPOTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        train_dataset=rows,
        reward_funcs=[bridge.service_reward],
        rollout_func=bridge.rollout_func,
    )
    hook, built, rewards = [], [], []
    spy(bridge, "rollout_func", hook)  # what the hook handed TRL
    trainer.rollout_func = bridge.rollout_func
    spy(trainer, "_generate_and_score_completions", built)  # the tensors TRL trains on
    spy(trainer, "_calculate_rewards", rewards)  # its reward functions' output
    trainer.train()
    bridge.close()
    return {"hook": hook, "built": built, "rewards": rewards, "log": trainer.state.log_history}


def unpad(row: torch.Tensor, mask: torch.Tensor) -> list[int]:
    return [int(t) for t, m in zip(row.tolist(), mask.tolist()) if m]


def test_grpo_trainer_trains_on_the_records_tokens_masks_logprobs_and_rewards(service: Service, trained) -> None:
    assert len(trained["hook"]) == len(trained["built"]) == len(trained["rewards"]) == 2  # one generation per step
    with RolloutClient(service.api_url) as client:
        for step, (out, built, rewards) in enumerate(zip(trained["hook"], trained["built"], trained["rewards"])):
            jobs = [client.get_job(job_id) for job_id in out["rollouts_job_id"]]
            assert len(jobs) == 2 * GROUP
            masked = 0
            for i, job in enumerate(jobs):
                record = job.trajectory
                start = record["prompt_length"]
                assert unpad(built["prompt_ids"][i], built["prompt_mask"][i]) == record["token_ids"][:start]
                completion = unpad(built["completion_ids"][i], built["completion_mask"][i])
                assert completion == record["token_ids"][start:]
                n = len(completion)
                assert built["tool_mask"][i][:n].tolist() == record["loss_mask"][start:]
                masked += n - sum(record["loss_mask"][start:])
                logprobs = built["sampling_per_token_logps"][i][:n]
                want = torch.tensor(
                    [lp if m else 0.0 for lp, m in zip(record["logprobs"][start:], record["loss_mask"][start:])]
                )
                assert torch.allclose(logprobs, want, atol=1e-6)
                assert float(rewards[i, 0]) == job.reward  # the service's reward, as TRL's reward function gave it
                assert job.raw["request"]["metadata"]["global_step"] == step
                assert job.raw["request"]["metadata"]["policy_version"] == f"step-{step}"
            assert masked > 0, "the nudges between turns must reach TRL as tool_mask 0"
            # runs of num_generations are the service's groups, sample_index in order
            for g in range(0, len(jobs), GROUP):
                group = jobs[g : g + GROUP]
                assert len({j.group_id for j in group}) == 1
                assert [j.sample_index for j in group] == list(range(GROUP))
                assert len({json.dumps(j.raw["request"]["task"], sort_keys=True) for j in group}) == 1
            assert jobs[0].group_id != jobs[GROUP].group_id
    assert [e["step"] for e in trained["log"] if "loss" in e] == [1, 2]


def test_a_failed_job_is_raised_never_a_reward(service: Service) -> None:
    bridge = RolloutsTRL(api_url=service.api_url, run_id="trl-fail", on_failure="raise")
    try:
        with pytest.raises(JobFailed):
            bridge.loop.run_until_complete(
                bridge._run(*bridge.job_bodies([parity("f?", fail_eval=True)], 1, 0, "train"))
            )
    finally:
        bridge.close()


def test_rows_without_a_task_or_with_unequal_groups_are_refused_before_submitting() -> None:
    bridge = RolloutsTRL(api_url="http://127.0.0.1:9", run_id="trl-rows")
    with pytest.raises(RowError, match="row 0: prompt"):
        bridge.job_bodies(["What is 2+2?", "What is 2+2?"], 2, 0, "train")
    with pytest.raises(RowError, match="differ"):
        bridge.job_bodies([parity("a"), parity("b")], 2, 0, "train")
    with pytest.raises(RowError, match="num_generations"):
        bridge.job_bodies([parity("a")] * 3, 2, 0, "train")
    chat = [{"role": "user", "content": "hi", "rollouts_task": {"kind": "agent-parity", "problem": "x"}}]
    assert task_of_prompt(chat, "0") == {"kind": "agent-parity", "problem": "x"}
    bodies, keys, _ = bridge.job_bodies([parity("a")] * 2 + [parity("b")] * 2, 2, 5, "train")
    assert [b["sample_index"] for b in bodies] == [0, 1, 0, 1]
    assert bodies[0]["group_id"] == bodies[1]["group_id"] != bodies[2]["group_id"]
    assert len(set(keys)) == 4 and bodies[0]["metadata"]["policy_version"] == "step-5"
    bridge.close()
