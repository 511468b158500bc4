#!/usr/bin/env bash
# The slime arguments that make a slime run take its rollouts from the service (slime at THUDM/slime 624b824a;
# miles 0.0.2 reads the same). Source this file from your slime run script (e.g. slime's
# scripts/run-qwen3-4B.sh, whose model, Megatron and SGLang arguments stay as they are) and add
# "${ROLLOUTS_ARGS[@]}" to its `python3 train.py` line. Rows: python examples/slime/make_rows.py --out "$ROWS".
# The service must serve the policy being trained (the same tokenizer: the records' token ids are the policy's),
# and slime's weight updates do not reach the service's vLLM: push each step's checkpoint with
# POST /v1/models/{model}/weights (docs/TRAINING.md), as the records' weight_versions then show.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROWS="${ROWS:-runs/slime-rows}"
: "${ROLLOUTS_API_URL:?set ROLLOUTS_API_URL (and ROLLOUTS_API_TOKEN) to the service}"
export ROLLOUTS_API_URL

ROLLOUTS_ARGS=(
  --rollout-function-path rollouts_client.trainers.slime.generate_rollout   # also evaluation (the default)
  --custom-config-path "$HERE/rollouts.yaml"                               # the bridge's settings: `rollouts:`
  --prompt-data "$ROWS/train.jsonl"
  --input-key prompt --label-key label --metadata-key metadata           # metadata.rollouts_task: the task
  --rollout-batch-size 8 --n-samples-per-prompt 4 --global-batch-size 32
  --rollout-max-response-len 1024 --rollout-temperature 1.0 --rollout-top-p 1.0
  # DAPO's dynamic sampling, run by the service's batch (min_informative_groups = rollout-batch-size,
  # max_groups_in_flight = over-sampling-batch-size); leave both out to run every prompt once
  --over-sampling-batch-size 16
  --dynamic-sampling-filter-path slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std
  --eval-prompt-data math "$ROWS/eval.jsonl" --n-samples-per-eval-prompt 2 --eval-interval 5
)
