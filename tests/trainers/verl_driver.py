"""Run in the trainers' virtualenv (not the project's): verl's own AgentLoopWorker runs a batch of rows through
the service's agent loop and post-processes them; the tensors it builds are written as JSON for the test.

    python verl_driver.py MODEL_DIR ROWS_JSON OUT_JSON [hydra overrides...]

The API is ROLLOUTS_API_URL; the agent loop is registered from examples/verl/agent_loops.yaml (or VERL_AGENT_LOOPS),
as a user does.
Exit 3 with the error's type and message in OUT_JSON when the batch raises (the fault tests read it).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

import verl.trainer.config
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto

REPO = Path(__file__).resolve().parents[2]
LOOPS = REPO / "examples" / "verl" / "agent_loops.yaml"
TENSORS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids",
           "rollout_log_probs", "rm_scores")  # fmt: skip


def main() -> int:
    model, rows_path, out_path, *overrides = sys.argv[1:]
    rows = json.loads(Path(rows_path).read_text())
    with initialize_config_dir(config_dir=os.path.dirname(verl.trainer.config.__file__), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model}",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.prompt_length=1024",
            "actor_rollout_ref.rollout.response_length=1024",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={os.environ.get('VERL_AGENT_LOOPS', LOOPS)}",
            *overrides,
        ])  # fmt: skip
    worker = AgentLoopWorker(config, llm_client=None)
    batch = DataProto.from_single_dict(
        {key: np.array([row[key] for row in rows], dtype=object) for key in rows[0]}, meta_info={"global_steps": 1}
    )
    started = time.perf_counter()
    try:
        output = asyncio.run(worker.generate_sequences(batch))
    except Exception as exc:
        Path(out_path).write_text(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return 3
    result = {
        "seconds": time.perf_counter() - started,
        "tensors": {k: output.batch[k].tolist() for k in TENSORS if k in output.batch.keys()},
        "extra": {
            key: [json_safe(v) for v in output.non_tensor_batch[key]]
            for key in output.non_tensor_batch
            if key.startswith("rollouts_") or key == "__num_turns__"
        },
        "pad_token_id": worker.tokenizer.pad_token_id,
    }
    Path(out_path).write_text(json.dumps(result))
    return 0


def json_safe(value: object) -> object:
    return value.tolist() if hasattr(value, "tolist") else value


if __name__ == "__main__":
    sys.exit(main())
