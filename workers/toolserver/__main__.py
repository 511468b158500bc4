"""``python -m workers.toolserver --socket PATH --workspace DIR``: run the in-sandbox tool server."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from workers.toolserver.server import ToolServer
from workers.toolserver.tools import ToolBox, ToolLimits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.toolserver", description=__doc__)
    parser.add_argument("--socket", required=True, type=Path, help="Unix socket to listen on")
    parser.add_argument("--workspace", required=True, type=Path, help="the only tree file tools may touch")
    parser.add_argument(
        "--state-dir", type=Path, help="private dir for the shell and kernel (default: next to the socket)"
    )
    parser.add_argument("--output-cap", type=int, default=ToolLimits.output_cap)
    parser.add_argument("--hard-output-cap", type=int, default=ToolLimits.hard_output_cap)
    parser.add_argument("--default-timeout", type=float, default=ToolLimits.default_timeout_s)
    parser.add_argument("--max-timeout", type=float, default=ToolLimits.max_timeout_s)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("ROLLOUTS_LOG_LEVEL", "WARNING"))
    limits = ToolLimits(args.output_cap, args.hard_output_cap, args.default_timeout, args.max_timeout)
    state_dir = args.state_dir or args.socket.parent / "toolserver"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTS_")}
    toolbox = ToolBox(args.workspace, state_dir, env, limits)
    ToolServer(args.socket, toolbox).serve()


if __name__ == "__main__":
    main()
