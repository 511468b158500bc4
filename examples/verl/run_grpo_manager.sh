#!/usr/bin/env bash
# GRPO with verl's V1 trainer (0.9.1, trainer.use_v1: true) and the service's agent-loop manager: each batch is
# one submission to the service, its trajectories go straight into TransferQueue (docs/TRAINERS.md, "verl: the
# agent-loop manager"). Same rows, settings and environment as run_grpo.sh (the loop's YAML entry gives the
# manager its settings):
#   ROLLOUTS_API_URL=http://<api>:8000 ROLLOUTS_API_TOKEN=<token> ROLLOUTS_RUN_ID=grpo-1 \
#     MODEL=Qwen/Qwen2.5-0.5B-Instruct bash examples/verl/run_grpo_manager.sh
set -euo pipefail
: "${ROLLOUTS_API_URL:?set ROLLOUTS_API_URL to the service}"
MODEL=${MODEL:?set MODEL to the policy checkpoint}
ROWS=${ROWS:-runs/verl-rows}
[ -f "$ROWS/train.parquet" ] || python examples/verl/make_rows.py --out "$ROWS"

# `+`: verl 0.9.1's ppo_trainer.yaml does not list agent_loop_manager_class (its dataclass does)
python -m verl.trainer.main_ppo \
  trainer.use_v1=true \
  algorithm.adv_estimator=grpo \
  data.train_files="$ROWS/train.parquet" data.val_files="$ROWS/val.parquet" \
  data.train_batch_size=8 data.max_prompt_length=1024 data.max_response_length=3072 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.prompt_length=1024 actor_rollout_ref.rollout.response_length=3072 \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loops.yaml \
  actor_rollout_ref.rollout.agent.default_agent_loop=rollouts \
  +actor_rollout_ref.rollout.agent.agent_loop_manager_class=rollouts_client.trainers.verl_manager.RolloutsAgentLoopManager \
  trainer.n_gpus_per_node="${GPUS:-1}" trainer.nnodes=1 trainer.total_epochs=1 \
  trainer.project_name=rollouts trainer.experiment_name="${ROLLOUTS_RUN_ID:-grpo}" trainer.logger='[console]'
