"""Noticing a vLLM server that is alive but no longer answers, so the supervisor can restart it.

A process that exits is seen by `Supervised.check`; a hung one (a deadlocked engine, a stuck
collective, a process stopped by a debugger or the kernel) keeps its pid and its port and only
stops answering. The pool's probes take such a backend out of selection, but nothing would ever
bring it back. `HangWatch` probes `/health` on a thread of its own (a probe that blocks must not
hold up the supervising loop) and says the server is hung once it has gone `hang_after_s` without
an answer. Its clock starts when the server is known to serve (the stack starts the watch once its
vLLM is ready, and calls `restarted()` once a restart was waited ready): a loading vLLM is silent
for a minute and is not hung.
"""

from __future__ import annotations

import threading
import time

from shared.backend_pool import probe_health


class HangWatch:
    """Probes `url`/health every `interval_s`; `hung()` gives the reason once `hang_after_s` passed without an answer."""

    def __init__(self, url: str, hang_after_s: float, stopping: threading.Event, interval_s: float = 5.0) -> None:
        self.url = url
        self.hang_after_s = hang_after_s
        self.interval_s = interval_s
        self._stopping = stopping
        self._lock = threading.Lock()
        self._last_answer = time.monotonic()
        self._last_problem = ""
        self._thread = threading.Thread(target=self._probe_forever, name=f"hang watch {url}", daemon=True)

    def start(self) -> HangWatch:
        """Watch from now on; call once the server serves."""
        self.restarted()
        self._thread.start()
        return self

    def restarted(self) -> None:
        """The server serves again (a restart waited until it was ready): its silence counts from now."""
        with self._lock:
            self._last_answer = time.monotonic()

    def hung(self) -> str | None:
        """Why the server counts as hung now, or None (always None with `hang_after_s` 0: the check is off)."""
        if self.hang_after_s <= 0:
            return None
        with self._lock:
            last, problem = self._last_answer, self._last_problem
        if time.monotonic() - last < self.hang_after_s:
            return None
        return f"has not answered /health for {time.monotonic() - last:.0f} s ({problem}) though it is running"

    def _probe_forever(self) -> None:
        while not self._stopping.is_set():
            problem = probe_health(self.url, timeout_s=max(self.interval_s, 2.0))
            with self._lock:
                if problem is None:
                    self._last_answer = time.monotonic()
                else:
                    self._last_problem = problem
            self._stopping.wait(self.interval_s)
