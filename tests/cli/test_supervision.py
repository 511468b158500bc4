"""The one restart policy of `rollouts up` (cli/supervision.py), driven by a fake clock and fake processes; the
restart's weights rule and the restart counts in `rollouts status`, without vLLM (the real thing:
tests/reliability/test_stack_restarts.py)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

import cli.jobs
from cli.hang_watch import HangWatch
from cli.stack_weights import load_current_weights
from cli.supervision import RestartPolicy, StayDown, Supervised
from cli.vllm_server import VLLMServer
from shared.keys import Keys
from shared.weights import WeightVersions
from tests.support.waiting import wait_for


class Fake:
    """A process (Popen's poll and pid) that is dead until restarted; each restart may raise what `fail_with` says."""

    pid = 42

    def poll(self) -> int | None:
        return self.code

    def __init__(self) -> None:
        self.code: int | None = None
        self.restarts = 0
        self.deaths_seen = 0
        self.fail_with: BaseException | None = None

    def restart(self) -> str:
        self.restarts += 1
        if self.fail_with is not None:
            raise self.fail_with
        self.code = None
        return "back"


def unit(fake: Fake, policy: RestartPolicy, lines: list[str]) -> Supervised:
    def died() -> None:
        fake.deaths_seen += 1

    return Supervised("thing", lambda: fake, fake.restart, policy, lines.append, on_death=died)


def settle(supervised: Supervised, now: float) -> None:
    """Run check() at `now` until the restart thread (if one started) has been taken in."""
    supervised.check(now)
    while supervised.restarting:
        supervised._thread.join()  # type: ignore[union-attr]
        supervised.check(now)


def test_a_death_is_logged_then_restarted_after_a_pause_that_doubles_while_it_dies_young() -> None:
    fake, lines = Fake(), []
    supervised = unit(fake, RestartPolicy(first_delay_s=1, max_delay_s=4, reset_after_s=60), lines)
    supervised.started_at = 0.0
    delays = []
    now = 10.0
    for _ in range(4):
        fake.code = -9
        supervised.check(now)
        delays.append(supervised.delay)
        settle(supervised, now + supervised.delay)
        now += supervised.delay + 1
    assert delays == [1, 2, 4, 4], lines
    assert fake.restarts == 4 and fake.deaths_seen == 4, lines
    assert "thing (pid 42) exited with signal SIGKILL after 10 s; restarting it in 1 s" in lines, lines
    assert lines.count("thing restarted (back)") == 4, lines
    fake.code = 1  # it lived long this time: the pause starts over
    supervised.check(now + 120)
    assert supervised.delay == 1, lines


def test_past_its_budget_it_stays_down_and_says_so_once() -> None:
    fake, lines = Fake(), []
    supervised = unit(fake, RestartPolicy(budget=2, window_s=100), lines)
    supervised.started_at = 0.0
    for now in (1.0, 5.0):
        fake.code = 0
        supervised.check(now)
        settle(supervised, now + supervised.delay)
    fake.code = 0
    for now in (9.0, 20.0, 30.0):
        supervised.check(now)
    assert fake.restarts == 2 and supervised.down, lines
    assert [line for line in lines if "budget" in line] == [
        (
            "thing (pid 42) exited with code 0 after 2 s; its restart budget (2 in 100 s) is spent: it stays down, "
            "the rest of the stack goes on"
        )
    ], lines
    # outside the window the budget is whole again (a new unit: one that gave up stays down)
    again = unit(fake, RestartPolicy(budget=2, window_s=100), [])
    again.restarts = [1.0, 5.0]
    again.check(200.0)
    assert not again.down and again.due is not None


def test_a_failed_restart_is_retried_and_stay_down_is_final() -> None:
    fake, lines = Fake(), []
    supervised = unit(fake, RestartPolicy(), lines)
    fake.code = 0
    fake.fail_with = RuntimeError("port taken")
    supervised.check(1.0)
    settle(supervised, 2.0)
    assert supervised.due is not None and not supervised.down, lines
    assert "thing failed to restart (RuntimeError: port taken); restarting it in 2 s" in lines, lines
    fake.fail_with = StayDown("the weights are gone")
    settle(supervised, 10.0)
    assert supervised.down and lines[-1] == "thing stays down: the weights are gone", lines
    supervised.check(100.0)
    assert fake.restarts == 2, lines


def test_the_stacks_restarts_show_in_status(make_client, redis, settings, monkeypatch) -> None:
    """What `rollouts up` counted (cli/stack.py, by kind) is in GET /v1/status and `rollouts status`."""
    api = make_client()
    assert api.get("/v1/status").json()["restarts"] == {}
    redis.hset(Keys(settings.redis_prefix).stack_restarts, mapping={"vllm": 2, "api": 1})
    body = api.get("/v1/status").json()
    assert body["restarts"] == {"vllm": 2, "api": 1}, body

    class Client:  # the CLI's client, answering what the API just did
        def status(self) -> dict:
            return body

        def close(self) -> None:
            pass

    monkeypatch.setattr(cli.jobs, "connect", lambda url: Client())
    result = CliRunner().invoke(cli.jobs.status, [])
    assert result.exit_code == 0 and "restarts: api 1, vllm 2" in result.output, result.output


def test_a_restarted_vllm_stays_out_when_the_current_weights_cannot_be_loaded(settings, redis, tmp_path) -> None:
    """The restart's weights rule (cli/stack_weights.py), without a server: every refusal comes before
    vLLM is touched (a failed reload kills vLLM's engine: shared/weights/checkpoint.py)."""
    server = VLLMServer(python=tmp_path, model=tmp_path, served_name="tiny", port=9)  # nothing listens on port 9
    assert (
        load_current_weights(server, "tiny", settings) is None
    )  # never updated: the weights it starts with are current
    versions = WeightVersions(redis, Keys(settings.redis_prefix))
    versions.record("tiny", "up-1", "upload:sha256:0123456789abcdef")
    with pytest.raises(StayDown, match=r"'up-1' .* were sent as bytes, which the service does not keep"):
        load_current_weights(server, "tiny", settings)
    versions.record("tiny", "step-2", str(tmp_path / "gone"))
    with pytest.raises(StayDown, match=r"'step-2' .* could not be loaded, so it stays out of the pool: .* not a dir"):
        load_current_weights(server, "tiny", settings)


def test_a_restart_runs_on_the_supervising_thread_unless_threaded_and_rejoins_there() -> None:
    """Spawned from the supervising thread, a child gets die_with_parent's signal; only a slow restart
    (vLLM) takes a thread of its own, and what must be spawned after it (its registrar) comes back here."""
    fake, lines, threads = Fake(), [], []
    original = fake.restart

    def restart() -> str:
        threads.append(threading.current_thread())
        return original()

    inline = Supervised("inline", lambda: fake, restart, RestartPolicy(), lines.append)
    fake.code = 0
    inline.check(1.0)
    settle(inline, 2.0)
    assert threads == [threading.current_thread()] and not inline.restarting, lines

    rejoined: list[threading.Thread] = []
    slow = Supervised(
        "slow",
        lambda: fake,
        restart,
        RestartPolicy(),
        lines.append,
        threaded=True,
        on_restarted=lambda: rejoined.append(threading.current_thread()),
    )
    fake.code = 0
    slow.check(10.0)
    settle(slow, 11.0)
    assert threads[-1] is not threading.current_thread() and rejoined == [threading.current_thread()], lines
    assert lines[-1] == "slow restarted (back)", lines

    def refuse() -> None:
        raise RuntimeError("registrar would not start")

    slow.on_restarted = refuse
    fake.code = 0
    slow.check(100.0)
    settle(slow, 101.0)
    assert "slow failed to rejoin after its restart (RuntimeError: registrar would not start)" in lines[-1], lines
    assert slow.due is not None and not slow.down, lines


class HealthDouble(ThreadingHTTPServer):
    """A test double for a server's /health: answers 200 until `hang` is set, then holds every request
    unanswered (a hung vLLM keeps its port and answers nothing)."""

    def __init__(self) -> None:
        self.hang = threading.Event()
        self.released = threading.Event()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if double.hang.is_set():
                    double.released.wait()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def test_a_hung_process_is_killed_once_silent_long_enough_and_its_restart_starts_the_clock_again() -> None:
    """cli/hang_watch.py with a real HTTP server: silence past hang_after_s gets the running process killed, and
    its death is then handled as any other (restart); a restarted one (waited ready) is not judged on the silence
    before its restart, and is judged again once it stays silent."""
    double, stopping, lines, killed = HealthDouble(), threading.Event(), [], []
    fake = Fake()
    watch = HangWatch(double.url, hang_after_s=1.0, stopping=stopping, interval_s=0.1).start()
    try:
        supervised = Supervised(
            "vLLM",
            lambda: fake,
            fake.restart,
            RestartPolicy(),
            lines.append,
            hung=watch.hung,
            kill=lambda process: (killed.append(process.pid), setattr(fake, "code", -9)),
        )
        time.sleep(1.5)  # answering: never hung, however long
        supervised.check(time.monotonic())
        assert watch.hung() is None and not killed, lines

        double.hang.set()
        reason = wait_for(watch.hung, timeout=60, what="the watch to call it hung")
        assert "has not answered /health" in reason and "though it is running" in reason
        supervised.check(time.monotonic())
        assert killed == [42] and lines[-1].startswith("vLLM (pid 42) has not answered /health"), lines
        supervised.check(time.monotonic())  # the next look sees the death and schedules the restart
        assert "exited with signal SIGKILL" in lines[-1] and supervised.due is not None, lines

        watch.restarted()  # back and ready (still silent here): its clock starts again
        assert watch.hung() is None
        assert wait_for(watch.hung, timeout=60, what="the watch to call the silent restarted server hung")
    finally:
        stopping.set()
        double.released.set()
        double.shutdown()


def test_a_hang_timeout_of_zero_turns_the_check_off() -> None:
    """vllm_hang_timeout_s=0: the stack does not start the watch, and its hung() never calls anything hung."""
    watch = HangWatch("http://127.0.0.1:9", hang_after_s=0, stopping=threading.Event())
    watch._last_answer -= 3600  # an hour of silence
    assert watch.hung() is None
