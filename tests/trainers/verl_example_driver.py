"""Run in the trainers' virtualenv, in place of `python -m verl.trainer.main_ppo` (a `python` shim on PATH): the
Hydra overrides examples/verl/run_grpo.sh passes, composed into verl's own ppo_trainer config and checked by the
validation verl's `main` runs first; the verdict is written as JSON.

    python verl_example_driver.py OUT_JSON OVERRIDE...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import verl.trainer.config
from hydra import compose, initialize_config_dir
from verl.trainer.main_ppo import need_critic, need_reference_policy
from verl.utils.config import validate_config


def main() -> int:
    out, overrides = Path(sys.argv[1]), sys.argv[2:]
    with initialize_config_dir(config_dir=os.path.dirname(verl.trainer.config.__file__), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    try:
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as exc:  # noqa: BLE001 - the verdict is the test's to judge
        out.write_text(json.dumps({"valid": False, "error": f"{type(exc).__name__}: {exc}", "overrides": overrides}))
        return 0
    rollout = config.actor_rollout_ref.rollout
    verdict = {
        "valid": True,
        "overrides": overrides,
        "use_v1": bool(config.trainer.use_v1),
        "default_agent_loop": rollout.agent.default_agent_loop,
        "manager": rollout.agent.get("agent_loop_manager_class"),
        "prompt_length": rollout.prompt_length,
    }
    out.write_text(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
