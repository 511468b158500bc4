"""A TCP pass-through the test can cut: one process's connections to a server go through it.

`blackhole()` stops moving bytes in both directions without closing anything, as a network
partition does: each side's connections stay open, its writes are accepted into buffers and its
reads wait, with no error and no EOF (TCP retransmits across a short partition; a keepalive
sees the proxy's own socket answer). New connections are accepted and held the same way.
`restore()` lets the held bytes through in order, as a partition that heals: whatever the cut-off
process wrote meanwhile reaches the server late. Only the processes pointed at `port` are cut;
everyone else reaches the server directly.
"""

from __future__ import annotations

import contextlib
import socket
import threading

CHUNK = 65536


class TcpBlackhole:
    """Forwards 127.0.0.1:`port` to `target`; `blackhole()` holds every byte until `restore()`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.held_bytes = 0  # bytes read from either side while cut off (delivered on restore)
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return self._listener.getsockname()[1]

    def start(self) -> TcpBlackhole:
        self._listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True, name="blackhole-accept").start()
        return self

    def blackhole(self) -> None:
        """From now on no byte moves either way; nothing is closed."""
        self._open.clear()

    def restore(self) -> None:
        """Held bytes go on, in order, and so does everything after them."""
        self._open.set()

    def stop(self) -> None:
        """Close the listener and every forwarded connection (both ends see EOF)."""
        self._open.set()
        with self._lock:
            sockets = [s for s in (self._listener, *self._sockets) if s is not None]
            self._sockets.clear()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True, name="blackhole-pump").start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy one direction; a chunk read while cut off waits (counted) until the cut is restored."""
        while True:
            try:
                data = source.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            if not self._open.is_set():
                with self._lock:
                    self.held_bytes += len(data)
                self._open.wait()
            try:
                sink.sendall(data)
            except OSError:
                return
