"""Real vLLM servers for the tests: vLLM's CPU build serving the tiny model, started as `rollouts up` starts it.

One server per test session (per xdist worker under `make test`: `vllm_server`, ~25-80 s to start on 2 cores,
launched in the background as soon as the collected tests show one uses it, then shared by every test that asks for it); `start_vllm_servers(n)` starts more for the tests that need two (routing,
failover, SIGKILL of a backend) and stops them at the end of the test. A server that tests change
(weights, adapters) or that serves another model is its own, not the session's `vllm_server`:
`weights_vllm_server`, shared by the modules that update weights (each restores the base weights
when it ends), or one a test module registers with `register_launch` (a tied-embedding model, LoRA);
those are launched in the background too, a few modules before their first test. Tests that use them are
marked `vllm` (`pytest -m "not vllm"` skips them where vLLM is not installed).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.embedded_redis import free_port
from cli.tiny_model import tiny_model_dir
from cli.vllm_server import VLLMServer
from shared.config import Settings

SERVED_NAME = "tiny"
# The context of the long-context server: Claude Code's and Codex CLI's first requests are ~50 kB of
# system prompt and tool schemas, a token a byte with the tiny model's tokenizer.
LONG_CONTEXT = 98304
# How the suite's servers run: float32, as the trainer computes, and eager. The suite starts about twenty
# servers; vLLM's torch.compile costs each start ~12 s of CPU on 2 cores (35 s eager, 47 s compiled, warm
# compile cache, 11-29) and nothing the suite checks depends on it. `rollouts up`'s own tests
# (tests/cli/test_cli.py) keep vLLM's default, compiled, as users run it.
TEST_VLLM_ARGS = ("--dtype", "float32", "--enforce-eager")


def tiny_model_path() -> Path:
    """The embedded default's model (tiny Llama, byte-level tokenizer, ChatML), built once per user.

    A stable path: vLLM keys its compile cache (~/.cache/vllm) by the model, so every later
    server on the same directory starts in about 25 s instead of 80 s.
    """
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollouts" / "test-models"
    return tiny_model_dir(cache, seed=0, max_model_len=4096)


def long_context_model_path() -> Path:
    """The same tiny model (same seed) built with room for LONG_CONTEXT tokens, for the harnesses' big prompts."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollouts" / "test-models"
    return tiny_model_dir(cache, seed=0, max_model_len=LONG_CONTEXT)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return tiny_model_path()


def launch_server(
    model: Path,
    log_dir: Path,
    served_name: str = SERVED_NAME,
    args: list[str] | None = None,
    max_model_len: int = 4096,
    env: dict[str, str] | None = None,
) -> VLLMServer:
    """Start one vLLM server on a free loopback port, without waiting for it, as the suite runs them (TEST_VLLM_ARGS).
    A prompt is prefilled in one step (vLLM refuses a model length over its batched-token budget).
    `env`: the server's own variables (e.g. VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""
    port = free_port()
    batched = ["--max-num-batched-tokens", str(max_model_len)] if max_model_len > 8192 else []  # 8192: vLLM's own
    server = VLLMServer.from_settings(
        Settings(),
        model,
        port,
        served_name=served_name,
        log_path=log_dir / f"vllm-{port}.log",
        args=[*TEST_VLLM_ARGS, "--max-model-len", str(max_model_len), *batched, *(args or [])],
    )
    server.env.update(env or {})
    return server.start()


def ready(server: VLLMServer) -> VLLMServer:
    """Wait until a launched server serves; stop it if it never does."""
    try:
        server.wait_until_ready(timeout_s=900)
    except BaseException:
        server.stop()
        raise
    return server


def start_server(model: Path, log_dir: Path, **options: Any) -> VLLMServer:
    """Start one vLLM server (launch_server, with its options) and wait until it serves."""
    return ready(launch_server(model, log_dir, **options))


# The suite's servers, launched in the background before the first test that uses them (a start costs
# 25-160 s on 2 cores, most of it vLLM's imports and compile): the tests that come before it run meanwhile,
# and its fixture only waits for what is left of the start. The session's `vllm_server` and
# `long_context_vllm_server`, used from the suite's first modules on, are launched at collection; the
# others LEAD_MODULES test modules before the first module that uses them, so that servers used only
# near the suite's end do not hold their memory (a few GB each) all along.
_SESSION_SERVERS: dict[str, Callable[[Path], VLLMServer]] = {
    "vllm_server": lambda logs: launch_server(tiny_model_path(), logs),
    "long_context_vllm_server": lambda logs: launch_server(long_context_model_path(), logs, max_model_len=LONG_CONTEXT),
    # The same tiny model for the tests that change its weights (tests/weights): never the session's
    # `vllm_server`, whose tests see the base weights; each module using it restores them as it ends.
    "weights_vllm_server": lambda logs: launch_server(tiny_model_path(), logs),
}
_AT_COLLECTION = {"vllm_server", "long_context_vllm_server"}
LEAD_MODULES = 2
_launched: dict[str, VLLMServer] = {}
_planned: dict[str, int] = {}  # server -> the position, in the run's order of modules, at which it is launched
_module_positions: dict[str, int] = {}
_log_dir: list[Path] = []


def register_launch(name: str, launch: Callable[[Path], VLLMServer]) -> None:
    """A test module's own server, launched ahead like the suite's when a collected test uses the fixture
    `name`, which takes it with `session_server(name, ...)` (module-scoped: stopped as the module ends).
    `launch` gets a fresh directory for its files and log, and must not wait for the server."""
    _SESSION_SERVERS.setdefault(name, launch)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _launch(name: str) -> None:
    try:
        server = _SESSION_SERVERS[name](_log_dir[0] / name)
    except Exception:  # noqa: BLE001 - not launched: its fixture starts it, and fails its tests with the error
        return
    _launched[name] = server


def launch_session_servers(items: list[pytest.Item], log_dir: Path, ahead: bool = True) -> None:
    """Plan a launch for each server some collected test uses, and launch those due now (pytest_collection_finish).

    `ahead=False` (an xdist worker, which collects every test but runs only the units it is sent, and cannot
    know which in advance): only the session's `vllm_server`, which nearly every unit uses, is launched now;
    the others start when a test first asks for them, while the other worker goes on."""
    _log_dir[:] = [log_dir]
    for item in items:
        _module_positions.setdefault(_module(item), len(_module_positions))
    for name in _SESSION_SERVERS if ahead else ("vllm_server",):
        users = [_module_positions[_module(item)] for item in items if name in getattr(item, "fixturenames", ())]
        if users and name not in _launched:
            _planned[name] = 0 if name in _AT_COLLECTION else max(0, min(users) - LEAD_MODULES)
    launch_due_servers(items[0] if items else None)


def launch_due_servers(item: pytest.Item | None) -> None:
    """Launch the planned servers whose time has come, as the run reaches `item` (pytest_runtest_protocol)."""
    position = _module_positions.get(_module(item), 0) if item is not None else 0
    for name, at in list(_planned.items()):
        if at <= position:
            del _planned[name]
            _launch(name)


def stop_session_servers() -> None:
    """Stop what was launched and never handed to a fixture (a session that ended early)."""
    while _launched:
        _launched.popitem()[1].stop()


def session_server(name: str, log_dir: Path) -> Iterator[VLLMServer]:
    """The server `name`: the launched one, else one started now; stopped as its fixture ends (the session's
    at the session's end, a module's as the module ends)."""
    _planned.pop(name, None)
    server = _launched.pop(name, None) or _SESSION_SERVERS[name](log_dir / name)
    try:
        yield ready(server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    yield from session_server("vllm_server", tmp_path_factory.mktemp("vllm-logs"))


@pytest.fixture(scope="session")
def long_context_vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A server of the tiny model with a LONG_CONTEXT window, for harnesses whose first prompt is tens of kB."""
    yield from session_server("long_context_vllm_server", tmp_path_factory.mktemp("vllm-logs"))


@pytest.fixture(scope="session")
def weights_vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A server of the tiny model whose weights tests change: each module that uses it restores
    them as it ends (`restore_base_weights`), so no module's checks depend on another's."""
    yield from session_server("weights_vllm_server", tmp_path_factory.mktemp("vllm-logs"))


def restore_base_weights(server: VLLMServer) -> None:
    """Load the server's own model directory back under vLLM's initial version label ("default"),
    through the service's per-backend steps: its weights, label and prefix cache as at start."""
    from shared.weights.vllm_routes import Checkpoint, StepTimes, apply

    apply(server.url, Checkpoint(str(server.model), "default"), 300, StepTimes())


@pytest.fixture()
def start_vllm_servers(tiny_model: Path, tmp_path: Path) -> Iterator[Callable[[int], list[VLLMServer]]]:
    """Start n more servers for this test (stopped at its end); the session's one is not among them."""
    started: list[VLLMServer] = []

    def start(n: int, args: list[str] | None = None) -> list[VLLMServer]:
        servers = [start_server(tiny_model, tmp_path, args=args) for _ in range(n)]
        started.extend(servers)
        return servers

    yield start
    for server in started:
        server.stop()


# Start a server with these to count the requests its engine took (`requests_taken`).
LOG_REQUESTS = ["--enable-log-requests"]


def freeze(server: VLLMServer) -> None:
    """Pause the server's scheduler with vLLM's own `/pause?mode=keep`: every request it takes from now
    on is queued and sampled not at all until `/resume` (or its death). A fault test holds a request
    mid-way by this, whatever the machine's speed, instead of asking for many tokens and hoping."""
    response = httpx.post(f"{server.url}/pause", params={"mode": "keep"}, timeout=60)
    assert response.status_code == 200, response.text


def requests_taken(server: VLLMServer) -> int:
    """Generation requests the server's engine has accepted so far: its "Added request" log lines, written
    once the request is in the engine (vLLM's /metrics gauges do not move while the scheduler is paused).
    Needs a server started with LOG_REQUESTS."""
    assert server.log_path is not None, "a server started by start_server logs to a file"
    return server.log_path.read_bytes().count(b"Added request ") if server.log_path.exists() else 0


def kill_server(server: VLLMServer) -> None:
    """SIGKILL a server's whole process group at once: a crashed node, for fault tests."""
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()
