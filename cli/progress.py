"""Progress that shows wherever the output goes: a bar on a terminal, a plain line now and then elsewhere.

tqdm draws nothing useful into a file (CI logs, Slurm's output, nohup): without a terminal it
is silent, and forced on it writes carriage returns. There the same figures go out as one line
every `interval_s` seconds and once at the end:
"progress: 40/100 jobs (done 38, failed 2), in flight 60 (rollout 52, eval 8), 3.1/s, ETA 19s".
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Counts toward `total`; `update(n, ended=..., running=...)` as things finish, `close()` at the end."""

    def __init__(
        self, total: int, unit: str, interval_s: float = 30.0, stream: TextIO | None = None, enabled: bool = True
    ) -> None:
        self.stream = stream or sys.stderr
        self.total, self.unit, self.interval_s = total, unit, interval_s
        self.terminal = enabled and self.stream.isatty()
        self.plain = enabled and not self.terminal
        self.bar = tqdm(total=total, unit=unit, file=self.stream, disable=not self.terminal, dynamic_ncols=True)
        self.count = 0
        self.ended: dict[str, int] = {}
        self.running: dict[str, int] = {}
        self.started = time.monotonic()
        self.last_line = self.started

    def update(
        self, n: int = 0, ended: Mapping[str, int] | None = None, running: Mapping[str, int] | None = None
    ) -> None:
        """`n` more finished; `ended` (done, failed, ...) and `running` (by stage) replace the last figures."""
        self.count += n
        self.ended = dict(ended) if ended is not None else self.ended
        self.running = dict(running) if running is not None else self.running
        if self.terminal:
            self.bar.update(n)
            self.bar.set_postfix(dict(sorted(self.running.items())), refresh=True)
        elif self.plain and time.monotonic() - self.last_line >= self.interval_s:
            self._line()

    def close(self) -> None:
        self.bar.close()
        if self.plain:
            self._line()

    def _line(self) -> None:
        now = time.monotonic()
        self.last_line = now
        elapsed = max(now - self.started, 1e-9)
        rate = self.count / elapsed
        parts = [f"progress: {self.count}/{self.total} {self.unit}s"]
        if self.ended:
            parts[0] += " (" + ", ".join(f"{k} {v}" for k, v in sorted(self.ended.items())) + ")"
        in_flight = sum(self.running.values())
        if self.running:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(self.running.items()))
            parts.append(f"in flight {in_flight} ({detail})")
        parts.append(f"{rate:.2f}/s")
        left = self.total - self.count
        if left > 0:
            parts.append(f"ETA {left / rate:.0f}s" if rate > 0 else "ETA unknown")
        print(", ".join(parts), file=self.stream, flush=True)
