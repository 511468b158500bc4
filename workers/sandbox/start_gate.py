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
    """Counting gates for all starts and for each image's; records how many ran at once.

    A job's own start (``spare=False``: a job is waiting on it) goes before the pool's refills
    (``spare=True``): a refill takes a turn only when no waiting job could take it, so a burst's
    cold starts never queue behind starts made for later jobs, and refills use the turns they leave.
    """

    def __init__(self, total: int, per_image: int) -> None:
        self.total = total
        self.per_image = per_image
        self._cond = threading.Condition()
        self._by_image: dict[str, int] = {}  # starts in progress per image
        self._jobs_waiting: dict[str, int] = {}  # jobs' own starts waiting for a turn, per image
        self.starting = 0  # starts in progress now
        self.most_starting = 0  # the most ever in progress at once (tests, metrics)
        self.waited = 0  # starts that had to wait for a turn

    def _free(self, image: str) -> bool:
        return self.starting < self.total and self._by_image.get(image, 0) < self.per_image

    def _may_enter(self, image: str, spare: bool) -> bool:
        if not self._free(image):
            return False
        return not spare or not any(n and self._free(img) for img, n in self._jobs_waiting.items())

    @contextmanager
    def turn(self, image: str, spare: bool = False) -> Iterator[None]:
        """Hold one start's turn for ``image`` (the local backend's key is "local"); ``spare``: a pool refill."""
        with self._cond:
            if not self._may_enter(image, spare):
                self.waited += 1
                if not spare:
                    self._jobs_waiting[image] = self._jobs_waiting.get(image, 0) + 1
                try:
                    self._cond.wait_for(lambda: self._may_enter(image, spare))
                finally:
                    if not spare:
                        self._jobs_waiting[image] -= 1
            self.starting += 1
            self._by_image[image] = self._by_image.get(image, 0) + 1
            self.most_starting = max(self.most_starting, self.starting)
        try:
            yield
        finally:
            with self._cond:
                self.starting -= 1
                self._by_image[image] -= 1
                self._cond.notify_all()


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
