"""Pure pieces of the tool server: framing, output capping, argument validation."""

from __future__ import annotations

import socket
import struct

import pytest

from shared.tool_schemas import TOOL_NAMES, TOOL_SCHEMAS, validate_call
from workers.toolserver.output import CappedBuffer, cap_text
from workers.toolserver.protocol import MAX_FRAME_BYTES, ProtocolError, recv_frame, send_frame


def test_frames_round_trip_and_eof() -> None:
    left, right = socket.socketpair()
    message = {"op": "call", "tool": "bash", "args": {"command": "ls"}, "blob": b"\x00\xff", "n": 2**40}
    send_frame(left, message)
    send_frame(left, {})
    assert recv_frame(right) == message
    assert recv_frame(right) == {}
    left.close()
    assert recv_frame(right) is None


def test_oversized_and_truncated_frames_are_rejected() -> None:
    left, right = socket.socketpair()
    left.sendall(struct.pack(">I", MAX_FRAME_BYTES + 1))
    with pytest.raises(ProtocolError):
        recv_frame(right)
    left2, right2 = socket.socketpair()
    left2.sendall(struct.pack(">I", 10) + b"abc")
    left2.close()
    with pytest.raises(ProtocolError):
        recv_frame(right2)


def test_capped_buffer_keeps_head_and_tail() -> None:
    buffer = CappedBuffer(100)
    buffer.write(b"H" * 50)
    for _ in range(1000):
        buffer.write(b"x" * 100)
    buffer.write(b"T" * 50)
    text = buffer.text()
    assert buffer.truncated and buffer.total == 50 + 100_000 + 50
    assert text.startswith("H" * 50) and text.endswith("T" * 50)
    assert "100000 bytes of output truncated" in text
    assert len(buffer.tail) <= 100


def test_short_output_is_untouched() -> None:
    assert cap_text("hello\n", 100) == ("hello\n", False)


def test_schemas_are_openai_function_tools() -> None:
    assert set(TOOL_NAMES) == {"bash", "python", "view", "create", "str_replace", "finish"}
    for tool in TOOL_SCHEMAS:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])


@pytest.mark.parametrize(
    ("tool", "args", "fragment"),
    [
        ("rm_rf", {}, "unknown tool"),
        (None, {}, "unknown tool"),
        ("bash", "ls", "must be an object"),
        ("bash", {}, "missing required argument"),
        ("bash", {"command": "ls", "sudo": True}, "unknown argument"),
        ("bash", {"command": 3}, "must be of type string"),
        ("view", {"path": "a", "view_range": "1-3"}, "must be of type array"),
        ("bash", {"command": "ls", "timeout": True}, "must be of type number"),
    ],
)
def test_bad_calls_are_described(tool: object, args: object, fragment: str) -> None:
    problem = validate_call(tool, args)
    assert problem is not None and fragment in problem


def test_good_calls_pass() -> None:
    assert validate_call("bash", {"command": "ls", "timeout": 3}) is None
    assert validate_call("finish", {}) is None
    assert validate_call("view", {"path": "a", "view_range": [1, -1]}) is None
