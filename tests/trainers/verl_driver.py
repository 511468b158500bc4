"""Run in the trainers' virtualenv (not the project's): verl's own AgentLoopWorker runs batches of rows through
the service's agent loop and post-processes them; what it builds is written as JSON for the tests.

    python verl_driver.py MODEL_DIR BATCHES_JSON OUT_JSON

BATCHES_JSON: {name: {"rows": [...], "loops": agent-loop YAML (default examples/verl/agent_loops.yaml, as a
user registers it), "env": {...} (set before the batch: ROLLOUTS_API_URL, ROLLOUTS_RUN_ID)}}, run in order in
one process (verl's import and config take most of a run). OUT_JSON: {name: tensors and extra fields, or
{"error", "message"} when the batch raised}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import verl.trainer.config
from hydra import compose, initialize_config_dir
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto

REPO = Path(__file__).resolve().parents[2]
LOOPS = REPO / "examples" / "verl" / "agent_loops.yaml"
TENSORS = (
    "prompts",
    "responses",
    "response_mask",
    "input_ids",
    "attention_mask",
    "position_ids",
    "rollout_log_probs",
    "rm_scores",
)


def main() -> int:
    model, batches_path, out_path = sys.argv[1:4]
    results = {name: run_batch(model, batch) for name, batch in json.loads(Path(batches_path).read_text()).items()}
    Path(out_path).write_text(json.dumps(results))
    return 0


def run_batch(model: str, batch: dict) -> dict:
    """One batch through a fresh AgentLoopWorker: its tensors, or the error it raised."""
    os.environ.update(batch.get("env") or {})
    loops = batch.get("loops") or str(LOOPS)
    with initialize_config_dir(config_dir=os.path.dirname(verl.trainer.config.__file__), version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.prompt_length=1024",
                "actor_rollout_ref.rollout.response_length=1024",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
            ],
        )
    worker = AgentLoopWorker(config, llm_client=None)
    rows = batch["rows"]
    data = DataProto.from_single_dict(
        {key: np.array([row[key] for row in rows], dtype=object) for key in rows[0]}, meta_info={"global_steps": 1}
    )
    started = time.perf_counter()
    try:
        output = asyncio.run(worker.generate_sequences(data))
    except Exception as exc:  # noqa: BLE001 - the test reads what the trainer raised
        return {"error": type(exc).__name__, "message": str(exc)}
    return {
        "seconds": time.perf_counter() - started,
        "tensors": {k: output.batch[k].tolist() for k in TENSORS if k in output.batch.keys()},  # noqa: SIM118 - a TensorDict
        "extra": {
            key: [json_safe(v) for v in output.non_tensor_batch[key]]
            for key in output.non_tensor_batch
            if key.startswith("rollouts_") or key == "__num_turns__"
        },
        "pad_token_id": worker.tokenizer.pad_token_id,
    }


def json_safe(value: object) -> object:
    return value.tolist() if hasattr(value, "tolist") else value


if __name__ == "__main__":
    sys.exit(main())
