"""`python -m workers.rollout`: a rollout-stage worker process."""

from workers.runtime.main import main

main("rollout")
