#!/usr/bin/env bash
# GRPO with verl (0.9.1: its default V1 trainer, trainer.use_v1=true), rollouts through the service
# (docs/TRAINERS.md). Run from the repository root, in an environment with verl and the client:
# pip install "./client[verl]".
#   ROLLOUTS_API_URL=http://<api>:8000 ROLLOUTS_API_TOKEN=<token> ROLLOUTS_RUN_ID=grpo-1 \
#     MODEL=Qwen/Qwen2.5-0.5B-Instruct bash examples/verl/run_grpo.sh
# BRIDGE=loop (default): verl's agent-loop workers run one job per sample through the service's agent loop.
# BRIDGE=manager: the service's agent-loop manager takes each batch as one submission and puts every
# trajectory into TransferQueue as its job ends (docs/TRAINERS.md, "verl: the agent-loop manager").
# prompt_length: the rendered prompt with the kind's tool schemas (math: ~1,240 tokens with a Qwen template);
# a longer one fails its job before generation (prompt_too_long), never a truncated prompt.
# What to change for your cluster: MODEL (the model the service's backends serve, same tokenizer),
# trainer.n_gpus_per_node / nnodes, the batch sizes (MICRO_BATCH: samples per GPU per forward pass; verl
# 0.9.1 refuses a config without one, tests/trainers/test_verl_example.py), and ROLLOUTS_API_URL (an address the rollout
# workers reach). The service's backends are updated through POST /v1/models/{model}/weights (its own
# mode); verl's rollout servers sample nothing here.
set -euo pipefail
: "${ROLLOUTS_API_URL:?set ROLLOUTS_API_URL to the service}"
MODEL=${MODEL:?set MODEL to the policy checkpoint}
ROWS=${ROWS:-runs/verl-rows}
[ -f "$ROWS/train.parquet" ] || python examples/verl/make_rows.py --out "$ROWS"
case "${BRIDGE:-loop}" in
  loop) MANAGER=() ;;
  # `+`: verl 0.9.1's ppo_trainer.yaml does not list agent_loop_manager_class (its dataclass does)
  manager) MANAGER=(+actor_rollout_ref.rollout.agent.agent_loop_manager_class=rollouts_client.trainers.verl_manager.RolloutsAgentLoopManager) ;;
  *) echo "BRIDGE must be loop or manager, not ${BRIDGE}" >&2; exit 2 ;;
esac

python -m verl.trainer.main_ppo \
  trainer.use_v1=true \
  algorithm.adv_estimator=grpo \
  data.train_files="$ROWS/train.parquet" data.val_files="$ROWS/val.parquet" \
  data.train_batch_size=8 data.max_prompt_length=2048 data.max_response_length=3072 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="${MICRO_BATCH:-4}" \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="${MICRO_BATCH:-4}" \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="${MICRO_BATCH:-4}" \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.prompt_length=2048 actor_rollout_ref.rollout.response_length=3072 \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loops.yaml \
  actor_rollout_ref.rollout.agent.default_agent_loop=rollouts \
  "${MANAGER[@]}" \
  trainer.n_gpus_per_node="${GPUS:-1}" trainer.nnodes=1 trainer.total_epochs=1 \
  trainer.project_name=rollouts trainer.experiment_name="${ROLLOUTS_RUN_ID:-grpo}" trainer.logger='[console]'
