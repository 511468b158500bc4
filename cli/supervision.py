"""What the stack does when one of its processes dies: one restart policy for every kind of process.

`Stack.supervise` keeps a `Supervised` per process it started (each worker, the API, the embedded
Redis, a registrar, the stack's vLLM server). A death is logged in one line (what died, how, when
it restarts). A restart runs on the supervising thread, so what it spawns gets `die_with_parent`'s
signal (armed only from the main thread); a slow one (vLLM: a minute to load) runs on a thread of
its own, so it holds up no other restart, and hands what must be spawned back to the supervising
thread (`on_restarted`). A process that is alive but hung (its `hung` check says why) is killed, and
its death handled like any other. The pause before a restart doubles while the process keeps dying young, so a
crash loop is logged and slowed, never spun; a policy with a budget gives up past it (one line).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.errors import RolloutsError


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart: `first_delay_s` after a death, doubling up to `max_delay_s` while the process keeps
    dying within `reset_after_s` of its start; with a `budget`, at most that many restarts per `window_s`."""

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    reset_after_s: float = 60.0
    budget: int | None = None
    window_s: float = 3600.0


class StayDown(RolloutsError, RuntimeError):
    """Raised by a restart that must not be retried (the process cannot rejoin as it is); the message says why."""


@dataclass(eq=False)
class Supervised:
    """One process the stack keeps running.

    `process`: the process to watch now (a restart replaces it; None: nothing to watch); `restart`: start it
    again (returns a few words for the log, raises StayDown to give up, anything else to retry later);
    `on_death`: what must happen at once, before the pause (e.g. take a backend out of the pool);
    `threaded`: run `restart` on a thread of its own (a slow one); `on_restarted`: run on the supervising
    thread once a restart succeeded (e.g. spawn what a threaded restart must not); `hung`: why the running
    process counts as hung (None: it does not), and `kill` ends it then, so the next look restarts it.
    """

    name: str
    process: Callable[[], subprocess.Popen[bytes] | None]
    restart: Callable[[], str]
    policy: RestartPolicy
    say: Callable[[str], None]
    on_death: Callable[[], None] = lambda: None
    threaded: bool = False
    on_restarted: Callable[[], None] = lambda: None
    hung: Callable[[], str | None] = lambda: None
    kill: Callable[[subprocess.Popen[bytes]], None] = lambda process: process.kill()
    started_at: float = field(init=False, default_factory=time.monotonic)
    delay: float = field(init=False, default=0.0)
    due: float | None = field(init=False, default=None)  # when the pending restart starts
    restarts: list[float] = field(init=False, default_factory=list)  # when each restart started (in the window)
    down: bool = field(init=False, default=False)  # given up: past its budget, or its restart said StayDown
    _thread: threading.Thread | None = field(init=False, default=None)
    _outcome: str | BaseException = field(init=False, default="")

    @property
    def restarting(self) -> bool:
        return self._thread is not None

    def check(self, now: float) -> None:
        """One look: notice a death, start a due restart, or take the outcome of a finished one."""
        if self.down:
            return
        if self._thread is not None:
            if not self._thread.is_alive():
                self._finished(now)
            return
        if self.due is not None:
            if now >= self.due:
                self._start_restart(now)
            return
        process = self.process()
        code = process.poll() if process is not None else None
        if process is not None and code is not None:
            self.on_death()
            lived = now - self.started_at
            self._schedule(now, f"(pid {process.pid}) exited with {exit_text(code)} after {lived:.0f} s")
        elif process is not None and (reason := self.hung()):
            self.say(f"{self.name} (pid {process.pid}) {reason}: killing it")
            self.kill(process)

    def _schedule(self, now: float, what_happened: str) -> None:
        p = self.policy
        young = now - self.started_at < p.reset_after_s
        self.delay = min(2 * self.delay, p.max_delay_s) if young and self.delay else p.first_delay_s
        self.restarts = [t for t in self.restarts if now - t < p.window_s]
        if p.budget is not None and len(self.restarts) >= p.budget:
            self.down = True
            self.say(
                f"{self.name} {what_happened}; its restart budget ({p.budget} in {p.window_s:.0f} s) is spent: "
                "it stays down, the rest of the stack goes on"
            )
            return
        self.due = now + self.delay
        self.say(f"{self.name} {what_happened}; restarting it in {self.delay:.0f} s")

    def _start_restart(self, now: float) -> None:
        self.due = None
        self.restarts.append(now)
        if not self.threaded:
            self._run()
            self._finished(now)
            return
        self._thread = threading.Thread(target=self._run, name=f"restart {self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._outcome = self.restart()
        except BaseException as exc:  # noqa: BLE001 - reported by check() on the supervising thread
            self._outcome = exc

    def _finished(self, now: float) -> None:
        self._thread, outcome, self._outcome = None, self._outcome, ""
        if isinstance(outcome, StayDown):
            self.down = True
            self.say(f"{self.name} stays down: {outcome}")
        elif isinstance(outcome, BaseException):
            self._schedule(now, f"failed to restart ({type(outcome).__name__}: {outcome})")
        else:
            try:
                self.on_restarted()
            except Exception as exc:  # noqa: BLE001 - a failed hand-over is a failed restart: retried
                self._schedule(now, f"failed to rejoin after its restart ({type(exc).__name__}: {exc})")
                return
            self.started_at = now
            self.say(f"{self.name} restarted{f' ({outcome})' if outcome else ''}")


def exit_text(code: int) -> str:
    """How a process ended, for a person: `signal SIGKILL` or `code 1`."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
