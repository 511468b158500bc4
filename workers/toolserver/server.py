"""The tool server: one per sandbox, listening on a Unix domain socket.

A thread per connection; the worker normally keeps one connection for the
whole rollout. Calls to the same tool wait for each other (one shell, one
kernel), calls to different tools may overlap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import socketserver
import threading
from pathlib import Path
from typing import Any

from workers.toolserver.protocol import ProtocolError, recv_frame, send_frame
from workers.toolserver.reaper import OrphanReaper, become_subreaper, kill_descendants
from workers.toolserver.reset import reset_toolbox
from workers.toolserver.tools import ToolBox

log = logging.getLogger("rollouts.toolserver")


class _Handler(socketserver.BaseRequestHandler):
    server: ToolServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        while True:
            try:
                request = recv_frame(sock)
            except (ProtocolError, OSError, ValueError) as exc:
                log.warning("dropping connection: %s", exc)
                return
            if request is None:
                return
            reply = self.server.answer(request)
            try:
                send_frame(sock, reply)
            except OSError:
                return
            if reply.get("shutdown"):
                threading.Thread(target=self.server.shutdown, daemon=True).start()
                return


class ToolServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, socket_path: Path, toolbox: ToolBox) -> None:
        self.toolbox = toolbox
        self.socket_path = socket_path
        if socket_path.exists() or socket_path.is_symlink():
            socket_path.unlink()
        old_umask = os.umask(0o077)  # only the sandbox's user may connect
        try:
            super().__init__(str(socket_path), _Handler)
        finally:
            os.umask(old_umask)

    def answer(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request must be a map"}
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "shutdown":
            return {"ok": True, "shutdown": True}
        if op == "reset":  # a reused sandbox between two jobs (workers/sandbox/reset.py checks it)
            scratch, keep = request.get("scratch"), request.get("keep") or []
            if not isinstance(scratch, str) or not all(isinstance(name, str) for name in keep):
                return {"ok": False, "error": "reset needs the scratch dir and the names to keep"}
            return {"ok": True, **reset_toolbox(self.toolbox, Path(scratch), frozenset(keep))}
        if op == "warm":
            try:
                self.toolbox.warm(python=bool(request.get("python")))
            except Exception as exc:  # noqa: BLE001 - the worker discards the sandbox
                return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            return {"ok": True}
        if op == "call":
            timeout = request.get("timeout")
            if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
                timeout = None
            result = self.toolbox.call(request.get("tool"), request.get("args"), timeout)
            return {"ok": True, "result": result.to_dict()}
        return {"ok": False, "error": f"unknown op {op!r}"}

    def serve(self, subreaper: bool = True) -> None:
        """Serve until a shutdown request or SIGTERM, then stop the shell, the kernel and
        every process the agent left behind, daemonised ones included (see reaper.py)."""
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=self.shutdown, daemon=True).start())
        reaper = None
        if subreaper and become_subreaper():
            reaper = OrphanReaper(self.toolbox.child_pids)
            reaper.start()
        self.toolbox.start()
        try:
            self.serve_forever(poll_interval=0.5)
        finally:
            if reaper is not None:
                reaper.stop()
            self.toolbox.close()
            if reaper is not None:
                kill_descendants(os.getpid(), exclude=self.toolbox.child_pids())
            self.server_close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
