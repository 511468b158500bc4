"""The service on this machine serving SmolLM2: Redis, API, one worker per stage, one vLLM server.

Started as `rollouts up --model DIR` would start it (cli.stack.Stack), in float32 (what the
trainer computes in). With an adapter, vLLM also serves a LoRA adapter under the policy's
name (`--enable-lora --lora-modules NAME=DIR`) and the pool registers the backend under that
name: jobs and batches that name no model then sample from the adapter, never from the bare
base model, and the trainer swaps the adapter's weights in place (examples/smollm2/lora.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli.stack import Stack
from shared.config import Settings

MAX_MODEL_LEN = 4096
SERVED_NAME = "smollm2"


def start_stack(
    root: Path,
    model_dir: Path,
    *,
    rollout_slots: int,
    adapter: tuple[str, Path] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Stack:
    """Start everything under `root` (state, logs); `adapter`: (name, PEFT adapter dir) to serve and register."""
    args = f"--dtype float32 --max-model-len {MAX_MODEL_LEN}"
    register_as = None
    if adapter is not None:
        name, path = adapter
        rank = json.loads((path / "adapter_config.json").read_text())["r"]
        args += f" --enable-lora --max-loras 1 --max-lora-rank {rank} --lora-modules {name}={path}"
        register_as = name
        # vLLM's /v1/load_lora_adapter, inherited by the stack's vLLM, which listens on loopback only: like
        # the RL routes (VLLM_SERVER_DEV_MODE) it loads any path the server can read
        os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}
    settings = Settings(redis_url=None, state_dir=root / "state", vllm_served_model_name=SERVED_NAME, vllm_args=args)
    stack = Stack(
        settings,
        api_port=0,
        vllm=True,
        model=model_dir,
        log_dir=root / "logs",
        extra_env=env,
        concurrency={"init": 2, "rollout": rollout_slots, "eval": 2},
        register_as=register_as,
    )
    stack.start()
    stack.wait_for_workers(timeout=120)
    return stack
