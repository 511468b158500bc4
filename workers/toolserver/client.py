"""The worker side of the tool protocol: one connection, one call at a time."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

from workers.toolserver.protocol import UnencodableMessage, encode_frame, recv_frame
from workers.toolserver.result import ToolResult

# Beyond the tool's own timeout, how long the server may take to interrupt and answer.
_REPLY_GRACE_S = 30.0


class ToolServerError(RuntimeError):
    """The tool server is unreachable or broke the protocol (not a failed tool call)."""


class ToolClient:
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.socket_path))
            except OSError as exc:
                sock.close()
                raise ToolServerError(f"cannot reach the tool server at {self.socket_path}: {exc}") from exc
            self._sock = sock
        return self._sock

    def request(self, message: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Send one request and wait for its reply.

        Raises UnencodableMessage (nothing sent, connection untouched) when the message
        cannot be framed, ToolServerError when the server cannot be reached or answered.
        """
        frame = encode_frame(message)
        with self._lock:
            sock = self._connect()
            sock.settimeout(None if timeout is None else timeout + _REPLY_GRACE_S)
            try:
                sock.sendall(frame)
                reply = recv_frame(sock)
            except (OSError, ValueError) as exc:
                self.close()
                raise ToolServerError(f"tool server connection failed: {exc}") from exc
            if reply is None:
                self.close()
                raise ToolServerError("tool server closed the connection")
            return reply

    def call(
        self, tool: str, args: dict[str, Any], timeout: float | None = None, max_timeout: float = 600.0
    ) -> ToolResult:
        """One tool call. Arguments that cannot be sent (a lone surrogate, which ``json.loads``
        accepts as ``"\\ud800"``, or a frame over the size limit) are the agent's mistake:
        they come back as an error result, not as a broken tool server."""
        try:
            reply = self.request({"op": "call", "tool": tool, "args": args, "timeout": timeout}, max_timeout)
        except UnencodableMessage as exc:
            if isinstance(exc.__cause__, UnicodeEncodeError):
                return ToolResult.error("arguments are not valid UTF-8")
            return ToolResult.error(f"arguments are too large to send ({exc})")
        if not reply.get("ok"):
            raise ToolServerError(str(reply.get("error")))
        return ToolResult.from_dict(reply["result"])

    def ping(self, timeout: float = 5.0) -> bool:
        try:
            return bool(self.request({"op": "ping"}, timeout).get("ok"))
        except ToolServerError:
            return False

    def wait_ready(self, timeout: float, alive: Any = None) -> None:
        """Poll until the server answers a ping; ``alive()`` False aborts early."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.socket_path.exists() and self.ping():
                return
            if alive is not None and not alive():
                raise ToolServerError("the sandbox exited before its tool server was ready")
            time.sleep(0.02)
        raise ToolServerError(f"tool server not ready after {timeout:g}s")

    def shutdown(self) -> None:
        with contextlib.suppress(ToolServerError):
            self.request({"op": "shutdown"}, 5.0)
        self.close()

    def close(self) -> None:
        """Close the connection; a call blocked on it in another thread fails at once."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
