"""Bounded capture of command output: keep the head and the tail, drop the middle."""

from __future__ import annotations

TRUNCATION_MARKER = "\n[... {dropped} bytes of output truncated ...]\n"


class CappedBuffer:
    """Collects a byte stream in bounded memory.

    The first ``cap // 2`` and the last ``cap // 2`` bytes are kept; whatever
    falls between is counted and dropped, so a command that prints gigabytes
    costs the server ``cap`` bytes of memory, not gigabytes.
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(cap, 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            keep = self.cap - self.cap // 2
            if len(self.tail) > 2 * keep:
                del self.tail[: len(self.tail) - keep]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        keep = self.cap - self.cap // 2
        tail = bytes(self.tail[-keep:]) if self.truncated else bytes(self.tail)
        if not self.truncated:
            return (bytes(self.head) + tail).decode("utf-8", errors="replace")
        dropped = self.total - len(self.head) - len(tail)
        return (
            bytes(self.head).decode("utf-8", errors="replace")
            + TRUNCATION_MARKER.format(dropped=dropped)
            + tail.decode("utf-8", errors="replace")
        )


def cap_text(text: str, cap: int) -> tuple[str, bool]:
    """``text`` cut to about ``cap`` bytes with the marker, and whether it was cut."""
    buffer = CappedBuffer(cap)
    buffer.write(text.encode("utf-8", errors="replace"))
    return buffer.text(), buffer.truncated
