"""`python -m workers.init`: a init-stage worker process."""

from workers.runtime.main import main

main("init")
