"""`python -m workers.eval`: a eval-stage worker process."""

from workers.runtime.main import main

main("eval")
