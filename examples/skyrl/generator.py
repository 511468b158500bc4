"""SkyRL (0.3.0) with the service as its generator (docs/TRAINERS.md): SkyRL's own GRPO entrypoint, one line
changed, the generator.

    pip install "./client[skyrl]"
    ROLLOUTS_API_URL=http://<api>:8000 ROLLOUTS_RUN_ID=grpo-1 python examples/skyrl/generator.py \
        data.train_data="['runs/skyrl-rows/train.parquet']" trainer.policy.model.path=<model> \
        trainer.algorithm.advantage_estimator=grpo generator.n_samples_per_prompt=4

Rows: SkyRL's dataset passes each row's extra columns to `env_extras`; a column `rollouts_task`
(the service task, as in examples/verl/make_rows.py) is all the generator reads.
"""

from __future__ import annotations

import os
import sys

import ray
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.utils import validate_cfg
from skyrl.train.utils.utils import initialize_ray

from rollouts_client.trainers.skyrl_generator import RolloutsGenerator


class RolloutsExp(BasePPOExp):
    """SkyRL's PPO experiment whose generator is the service."""

    def get_generator(self, cfg, tokenizer, inference_engine_client):
        # ROLLOUTS_TRAINER_ENGINES=trainer: SkyRL's own servers (the client's server_urls, serving its
        # model_name) sample, registered in the service's pool; otherwise the service's backends do.
        return RolloutsGenerator(
            inference_engine_client,
            generator_cfg=cfg.generator,  # step_wise_trajectories: one row per turn when SkyRL asks for it
            run_id=os.environ.get("ROLLOUTS_RUN_ID", "default"),
            on_failure="retry",
            max_attempts=3,
            max_tokens_per_turn=cfg.generator.sampling_params.max_generate_length,
        )


@ray.remote(num_cpus=1)
def run(cfg: SkyRLTrainConfig) -> None:
    """As SkyRL's own `skyrl_entrypoint`, with this experiment: the training loop runs off the head node."""
    RolloutsExp(cfg).run()


if __name__ == "__main__":
    config = SkyRLTrainConfig.from_cli_overrides(sys.argv[1:])
    validate_cfg(config)
    initialize_ray(config)
    ray.get(run.remote(config))
