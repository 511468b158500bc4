"""At most N sandbox starts at a time per worker process and per image, so a burst cannot stampede.

A new batch can hand every rollout slot a job at the same moment; each starting its sandbox at
once overloads the node (and, with Apptainer, its image handling) until starts time out. Every
start (a pool refill or a job's cold start) passes this gate; a start beyond the cap waits its
turn, which is waiting, never failing. Per process: a forked child (rq's work horse) gets a
gate of its own, as it gets its own spawner thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from shared.config import Settings


class StartGate:
    """Counting gates for all starts and for each image's; records how many ran at once."""

    def __init__(self, total: int, per_image: int) -> None:
        self.total = total
        self.per_image = per_image
        self._all = threading.BoundedSemaphore(total)
        self._images: dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()
        self.starting = 0  # starts in progress now
        self.most_starting = 0  # the most ever in progress at once (tests, metrics)
        self.waited = 0  # starts that had to wait for a turn

    def _image_gate(self, image: str) -> threading.BoundedSemaphore:
        with self._lock:
            gate = self._images.get(image)
            if gate is None:
                gate = self._images[image] = threading.BoundedSemaphore(self.per_image)
            return gate

    @contextmanager
    def turn(self, image: str) -> Iterator[None]:
        """Hold one start's turn for ``image`` (the local backend's key is "local")."""
        image_gate = self._image_gate(image)
        if not image_gate.acquire(blocking=False):
            self._count_wait()
            image_gate.acquire()
        try:
            if not self._all.acquire(blocking=False):
                self._count_wait()
                self._all.acquire()
            try:
                with self._lock:
                    self.starting += 1
                    self.most_starting = max(self.most_starting, self.starting)
                try:
                    yield
                finally:
                    with self._lock:
                        self.starting -= 1
            finally:
                self._all.release()
        finally:
            image_gate.release()

    def _count_wait(self) -> None:
        with self._lock:
            self.waited += 1


_gate: tuple[int, StartGate] | None = None
_gate_lock = threading.Lock()


def start_gate(settings: Settings) -> StartGate:
    """This process's gate, sized from the first settings that asked for it."""
    global _gate
    with _gate_lock:
        if _gate is None or _gate[0] != os.getpid():
            gate = StartGate(settings.sandbox_start_concurrency, settings.sandbox_start_concurrency_per_image)
            _gate = (os.getpid(), gate)
        return _gate[1]


def reset_start_gate() -> None:
    """Forget this process's gate, so the next start sizes a new one (tests that change the cap)."""
    global _gate
    with _gate_lock:
        _gate = None
