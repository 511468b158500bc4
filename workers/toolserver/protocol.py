"""Wire format between the rollout worker and the in-sandbox tool server.

Length-prefixed msgpack frames over a Unix domain socket: a 4-byte big-endian
length, then one msgpack map. Why not HTTP over UDS: a tool call is one small
request and one reply on a connection the worker keeps open for the whole
rollout, so HTTP's headers, parsing and server framework buy nothing and add a
dependency inside the image; msgpack is already the project's codec
(shared/codec.py) and carries bytes and ints exactly.

Requests:  {"op": "call", "tool": str, "args": dict, "timeout": float | None}
           {"op": "ping"} | {"op": "shutdown"}
Replies:   {"ok": True, "result": ToolResult as dict} | {"ok": False, "error": str}
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from shared.codec import pack, unpack

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 * 1024 * 1024


class ProtocolError(RuntimeError):
    """The peer sent something that is not a frame of this protocol."""


class UnencodableMessage(ValueError):
    """The message cannot be framed (a lone surrogate in a string, or too large): nothing was sent."""


def encode_frame(message: Any) -> bytes:
    """The frame of ``message``; raises UnencodableMessage before anything touches the socket."""
    try:
        data = pack(message)
    except UnicodeEncodeError as exc:
        raise UnencodableMessage(f"not valid UTF-8: {exc.reason}") from exc
    if len(data) > MAX_FRAME_BYTES:
        raise UnencodableMessage(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return HEADER.pack(len(data)) + data


def send_frame(sock: socket.socket, message: Any) -> None:
    try:
        frame = encode_frame(message)
    except UnencodableMessage as exc:
        if isinstance(exc.__cause__, UnicodeEncodeError):
            raise exc.__cause__ from None
        raise ProtocolError(str(exc)) from None
    sock.sendall(frame)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            if remaining == size:
                return None
            raise ProtocolError("connection closed in the middle of a frame")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> Any | None:
    """One decoded message, or None when the peer closed the connection cleanly."""
    header = _recv_exact(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    body = _recv_exact(sock, length) if length else b""
    if body is None:
        raise ProtocolError("connection closed after a frame header")
    return unpack(body)
