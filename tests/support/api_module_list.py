"""`rollouts api`, writing the names of every module it loaded to ROLLOUTS_TEST_MODULE_LIST when it exits.

A test double of the API's entry point for tests/api/test_api_loads_no_worker_code.py: the same
command line and code, plus an exit hook, so the test can read the API process's `sys.modules`.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from pathlib import Path

from cli.main import main


def _write_module_list() -> None:
    Path(os.environ["ROLLOUTS_TEST_MODULE_LIST"]).write_text("\n".join(sorted(sys.modules)) + "\n")


if __name__ == "__main__":
    atexit.register(_write_module_list)
    # uvicorn re-raises SIGTERM once it has shut down, under the handler it found: make that an exit
    # that runs atexit hooks, not the default handler's death.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    main()
