"""A local vLLM server as an operator starts one: vLLM's own OpenAI-compatible api_server, in its own environment.

`rollouts up`, the Slurm backend script and the tests all start vLLM through `VLLMServer`, so
what the tests exercise is what users run. vLLM lives in a virtualenv of its own
(`Settings.vllm_env`, made by scripts/setup.sh) because it pins its own torch and transformers.

The command line is `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
of the CPU build reads the metadata of a distribution named `vllm` and fails) with:
- `--served-model-name`: the name the pool registers and every request names;
- `--enable-scale-out`: serves the token-in/token-out endpoint `/inference/v1/generate`, the
  only one that reports the weight version of each generated token (`weight_versions`);
- `VLLM_SERVER_DEV_MODE=1` only on loopback: the RL routes (`/pause`, `/resume`,
  `/update_weight_version`, `/reset_prefix_cache`, `/collective_rpc`) a weight update needs,
  which must never face a network;
- `--worker-extension-cls rollouts_weight_loader.BytesWeightLoader`, with cli/vllm_extension/
  (that file alone) on vLLM's PYTHONPATH: the `load_weights_from_bytes` method that a weight
  update sent as bytes calls through `/collective_rpc` (unless the arguments name another class);
- `VLLM_CPU_KVCACHE_SPACE` (GiB) on machines without a GPU: the CPU build's KV cache size.
- without a GPU, chunked prefill off (`--no-enable-chunked-prefill`, with a token budget that
  holds a whole prompt): vLLM 0.32's CPU build kills its engine when a seeded request's prefill
  is split across steps (`gen.set_offset(...)` in `_bookkeeping_sync`: "CPU Generator does not
  use offset"), which many concurrent rollouts with seeds make happen within seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cli.connect import is_loopback
from shared.backend_pool.probe import probe_health
from shared.config import Settings
from shared.errors import RolloutsError

_WATCHDOG = Path(__file__).with_name("vllm_watchdog.py")
# A directory vLLM's own Python imports the worker extension from (it cannot import the project).
EXTENSION_DIR = Path(__file__).with_name("vllm_extension")
EXTENSION_CLS = "rollouts_weight_loader.BytesWeightLoader"
# vLLM's log prefix: "(APIServer pid=1) INFO 11-24 21:19:35 [launcher.py:195] " or "INFO 11-24 ... [x.py:1] ".
_LOG_PREFIX = re.compile(r"^(\([^)]*\)\s+)?[A-Z]+\s+\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\]\s*")


class VLLMError(RolloutsError, RuntimeError):
    """vLLM could not be started, or did not become ready; the message says why and where its log is."""


def has_gpu() -> bool:
    """A CUDA GPU is visible (nvidia-smi lists one): the regular vLLM build runs there, not the CPU build."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def vllm_python(settings: Settings) -> Path:
    """The vLLM environment's interpreter; a clear error when vLLM was never installed there."""
    python = settings.vllm_env / "bin" / "python"
    if not python.exists():
        raise VLLMError(
            f"vLLM is not installed in {settings.vllm_env}: run scripts/setup.sh (`make setup`), "
            "or point ROLLOUTS_VLLM_ENV at a virtualenv that has vllm (or vllm-cpu)"
        )
    return python


@dataclass
class VLLMServer:
    """One vLLM api_server process serving one model directory."""

    python: Path
    model: Path
    served_name: str
    port: int
    host: str = "127.0.0.1"
    args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    kv_cache_gib: int = 1
    cpu_build: bool = True  # no GPU here: vLLM's CPU build, with its workarounds
    env: dict[str, str] = field(default_factory=dict)  # this server's own variables (e.g. the cores it may use)
    process: subprocess.Popen[bytes] | None = None  # the watchdog, leader of vLLM's process group
    _lifeline: int | None = field(default=None, init=False, repr=False)  # write end of the watchdog's lifeline

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        model: Path,
        port: int,
        served_name: str | None = None,
        log_path: Path | None = None,
        host: str = "127.0.0.1",
        args: list[str] | None = None,
    ) -> VLLMServer:
        return cls(
            python=vllm_python(settings),
            model=model,
            served_name=served_name or settings.vllm_served_model_name or model.name,
            port=port,
            host=host,
            args=[*shlex.split(settings.vllm_args), *(args or [])],
            log_path=log_path,
            kv_cache_gib=settings.vllm_kv_cache_gib,
            cpu_build=not has_gpu(),
        )

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--enable-scale-out",
            "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens: prefix-cache hits per turn
            *(self._cpu_build_args() if self.cpu_build else []),
            *self._extension_args(),
            *self.args,
        ]

    def _extension_args(self) -> list[str]:
        """The bytes weight loader, unless the arguments bring their own worker extension."""
        if any(arg.startswith("--worker-extension-cls") for arg in self.args):
            return []
        return ["--worker-extension-cls", EXTENSION_CLS]

    def _cpu_build_args(self) -> list[str]:
        """Chunked prefill off on the CPU build (see the module doc), unless the arguments decide it."""
        if any(arg.startswith(("--enable-chunked-prefill", "--no-enable-chunked-prefill")) for arg in self.args):
            return []
        extra = ["--no-enable-chunked-prefill"]
        if not any(arg.startswith("--max-num-batched-tokens") for arg in self.args):
            extra += ["--max-num-batched-tokens", str(max(8192, self._max_model_len()))]
        return extra

    def _max_model_len(self) -> int:
        """The context the server will have: --max-model-len if given, else the model config's."""
        for i, arg in enumerate(self.args):
            if arg == "--max-model-len" and i + 1 < len(self.args):
                return int(self.args[i + 1])
            if arg.startswith("--max-model-len="):
                return int(arg.split("=", 1)[1])
        try:
            config = json.loads((self.model / "config.json").read_text())
        except (OSError, ValueError):
            return 0
        return int(config.get("max_position_embeddings") or config.get("max_seq_len") or 0)

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.setdefault("HF_HUB_OFFLINE", "1")  # no model hub: a model is a local directory
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        if is_loopback(self.host):
            env.setdefault("VLLM_SERVER_DEV_MODE", "1")
        else:  # never inherited either: the weight-reload routes read any path the server can
            env.pop("VLLM_SERVER_DEV_MODE", None)
        # The project's virtualenv must not leak into vLLM's: it has its own torch and transformers.
        # Only the worker extension's directory goes on its path.
        env["PYTHONPATH"] = str(EXTENSION_DIR)
        env.pop("VIRTUAL_ENV", None)
        return env

    def start(self) -> VLLMServer:
        """Start vLLM under cli/vllm_watchdog.py: its whole process tree ends with this process."""
        if not (self.model / "config.json").exists():
            raise VLLMError(f"{self.model} is not a Hugging Face model directory (no config.json)")
        output = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            output = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it open
        # The lifeline: only we hold its write end (not inheritable), so the watchdog reads EOF
        # when we die, however we die, and kills vLLM's whole process group.
        lifeline_read, self._lifeline = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_WATCHDOG), str(lifeline_read), "--", *self.command()],
                env=self.environment(),
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                pass_fds=(lifeline_read,),
                # Its own session and group: a terminal's Ctrl-C reaches only our parent, which stops
                # us in order, and the group holds vLLM's engine processes for the watchdog to kill.
                start_new_session=True,
            )
        finally:
            os.close(lifeline_read)
            if output is not None:
                output.close()
        return self

    def wait_until_ready(
        self, timeout_s: float, on_progress: Callable[[str], None] | None = None, progress_every_s: float = 10.0
    ) -> None:
        """Block until GET /health answers 200; report progress; raise VLLMError if it exits or times out."""
        assert self.process is not None, "start() first"
        started = time.monotonic()
        next_report = started + progress_every_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise VLLMError(
                    f"vLLM serving {self.model} exited with code {code} before it was ready{self._log_hint()}"
                )
            if _healthy(self.url):
                return
            now = time.monotonic()
            if now - started > timeout_s:
                raise VLLMError(f"vLLM at {self.url} was not ready within {timeout_s:.0f}s{self._log_hint()}")
            if on_progress is not None and now >= next_report:
                next_report = now + progress_every_s
                on_progress(f"vLLM loading {self.model.name} ({now - started:.0f}s): {self.last_log_line() or '...'}")
            time.sleep(0.5)

    def last_log_line(self) -> str:
        """The last line vLLM logged, without its prefix (what it is doing now)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
            lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
        return _LOG_PREFIX.sub("", lines[-1]).strip()[:160] if lines else ""

    def _log_hint(self) -> str:
        if self.log_path is None:
            return ""
        return f"; last line: {self.last_log_line()!r}; full log: {self.log_path}"

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group (its engine core is a child), SIGKILL what outlives it.

        The group is killed even when the api_server itself has already exited (it crashed, or
        failed to start): its engine processes would outlive it.
        """
        process, self.process = self.process, None
        if process is None:
            return
        try:
            self._stop_group(process, timeout_s)
        finally:
            lifeline, self._lifeline = self._lifeline, None
            if lifeline is not None:
                os.close(lifeline)

    @staticmethod
    def _stop_group(process: subprocess.Popen[bytes], timeout_s: float) -> None:
        if process.poll() is not None:
            _signal_group(process.pid, signal.SIGKILL)
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        _signal_group(process.pid, signal.SIGKILL)  # engine processes left behind in the group


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _healthy(url: str) -> bool:
    return probe_health(url, 2.0) is None
