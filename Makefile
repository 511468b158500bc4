# The two commands of the README. Both set up a fresh machine first (scripts/setup.sh).
.PHONY: setup demo test

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/rollouts run examples/mixed.jsonl

test: setup
	.venv/bin/python -m pytest -q
