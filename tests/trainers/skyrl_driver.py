"""Run in the trainers' virtualenv: the service's SkyRL generator generates a batch, and SkyRL's own code
takes it: `validate_generator_output`, the trainer's `postprocess_generator_output`,
`convert_to_training_input` and `compute_advantages_and_returns` (GRPO); step-wise batches
(`generator.step_wise_trajectories`) also through SkyRL's `merge_stepwise_output`. Results are written as JSON.

    python skyrl_driver.py MODEL_DIR BATCHES_JSON OUT_JSON

BATCHES_JSON: {name: {"rows": [{"instance_id", "repetition_id", "env_extras"}], "global_step": int,
"settings": {...}, "step_wise": bool, "time_splits": bool}}, run in order in one process. OUT_JSON: {name: what SkyRL built, or {"error", "message"}
when generate raised}.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import json
import sys
import time
import typing
from pathlib import Path
from types import SimpleNamespace

import typing_extensions

# skyrl 0.3.0 imports only on Python >= 3.12 (skyrl.tinker.types puts typing.TypedDict under pydantic);
# the project's machines have 3.11, so the test gives pydantic the TypedDict it asks for on 3.11.
if sys.version_info < (3, 12):
    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]

from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.generators.base import BatchMetadata, GeneratorInput, TrajectoryID
from skyrl.train.generators.utils import merge_stepwise_output
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils.trainer_utils import validate_generator_output
from transformers import AutoTokenizer

from rollouts_client.trainers import skyrl_generator
from rollouts_client.trainers.skyrl_generator import RolloutsGenerator

DECLARED = skyrl_generator.TIME_SPLITS  # whether this SkyRL's GeneratorOutput has `trajectory_time_splits`
VERSION = importlib.metadata.version("skyrl")


def main() -> int:
    model, batches_path, out_path = sys.argv[1:4]
    tokenizer = AutoTokenizer.from_pretrained(model)
    batches = json.loads(Path(batches_path).read_text())
    Path(out_path).write_text(json.dumps({name: run_batch(tokenizer, batch) for name, batch in batches.items()}))
    return 0


def run_batch(tokenizer: AutoTokenizer, given: dict) -> dict:
    rows = given["rows"]
    generator_input = GeneratorInput(
        prompts=[[{"role": "user", "content": "unused"}] for _ in rows],
        env_classes=["rollouts"] * len(rows),
        env_extras=[row["env_extras"] for row in rows],
        sampling_params={"temperature": 1.0, "top_p": 1.0, "max_generate_length": 64},
        trajectory_ids=[TrajectoryID(row["instance_id"], row["repetition_id"]) for row in rows],
        batch_metadata=BatchMetadata(global_step=given["global_step"], training_phase="train"),
    )
    # "time_splits": the generator sets `trajectory_time_splits` as where SkyRL (0.4.0) declares it
    skyrl_generator.TIME_SPLITS = DECLARED or bool(given.get("time_splits"))
    cfg = SkyRLTrainConfig()
    step_wise = cfg.generator.step_wise_trajectories = bool(given.get("step_wise"))
    cfg.generator.n_samples_per_prompt = max(r["repetition_id"] for r in rows) + 1
    cfg.trainer.train_batch_size = cfg.trainer.policy_mini_batch_size = len({r["instance_id"] for r in rows})
    # The trainer's own methods, on the attributes they read; `dispatch` (its GPU worker groups) is a
    # one-rank test double: the batch is padded to a multiple of the data-parallel size, here 1.
    trainer = SimpleNamespace(
        cfg=cfg,
        tokenizer=tokenizer,
        all_metrics={},
        generator=RolloutsGenerator(generator_cfg=cfg.generator, **given.get("settings", {})),
        dispatch=SimpleNamespace(get_lcm_dp_size=lambda: 1),
    )
    started = time.perf_counter()
    try:  # the trainer's generate: our generator, then SkyRL's validate_generator_output
        output = asyncio.run(RayPPOTrainer.generate(trainer, generator_input))
    except Exception as exc:  # noqa: BLE001 - the test reads what the trainer raised
        return {"error": type(exc).__name__, "message": str(exc)}
    seconds = time.perf_counter() - started
    generated = {
        k: output[k]
        for k in ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons", "rollout_logprobs")
    }
    generated["trajectory_ids"] = [[t.instance_id, t.repetition_id] for t in output["trajectory_ids"]]
    generated["job_ids"] = [m["job_id"] for m in output["env_metrics"]]
    generated["is_last_step"] = output["is_last_step"]
    generated["fields"] = sorted(output)
    generated["time_splits"] = output.get("trajectory_time_splits")
    # once more, explicitly: raises on a malformed output
    validate_generator_output(len(rows), output, step_wise=step_wise)
    merged = merge_stepwise_output(copy.deepcopy(output)) if step_wise else None

    # the trainer's uids: the input's per trajectory, or (step-wise) each row's trajectory_ids' instance_id
    uids = [t.instance_id for t in output["trajectory_ids"]]
    output, uids = RayPPOTrainer.postprocess_generator_output(trainer, output, uids)
    batch = RayPPOTrainer.convert_to_training_input(trainer, output, uids)
    batch["values"] = None  # no critic: what the trainer's forward pass sets
    batch = RayPPOTrainer.compute_advantages_and_returns(trainer, batch)
    advantages = batch["advantages"]
    return {
        "skyrl": VERSION,
        "declares_time_splits": DECLARED,
        "seconds": seconds,
        "generated": generated,
        "merged": None
        if merged is None
        else {k: merged[k] for k in ("prompt_token_ids", "response_ids", "loss_masks", "rewards", "is_last_step")},
        "estimator": str(cfg.trainer.algorithm.advantage_estimator),
        "training": {
            k: batch[k].tolist()
            for k in ("sequences", "attention_mask", "response_mask", "rewards", "loss_mask", "rollout_logprobs")
        },
        "advantages": advantages.tolist(),
        "pad_token_id": tokenizer.pad_token_id,
        "metrics": {k: v for k, v in trainer.all_metrics.items() if k.startswith(("rollouts/", "loss/"))},
    }


if __name__ == "__main__":
    sys.exit(main())
