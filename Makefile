# The README's commands. Each sets up a fresh machine first (scripts/setup.sh).
.PHONY: setup demo test train

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/rollouts run examples/mixed.jsonl

test: setup
	.venv/bin/python -m pytest -q

# GRPO on the CPU through the service, 3 seeds (examples/train_grpo, docs/TRAINING.md); writes runs/grpo/
train: setup
	.venv/bin/python -m examples.train_grpo --out runs/grpo --seeds 3
