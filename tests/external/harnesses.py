"""Run the unmodified harnesses from the package registries against a job's endpoint, each to its own end.

Each is installed by `scripts/setup.sh test` where it cannot clash with the project: mini-swe-agent in a
virtualenv of its own, Codex CLI and Claude Code from npm in their own prefixes. Each is run as a
user runs it, non-interactively, with only its documented settings (flags, config file, env vars)
pointing it at the job's endpoint and turning off everything that would leave the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollouts"
MINI_ENV = Path(os.environ.get("ROLLOUTS_MINI_SWE_AGENT_ENV", CACHE / "mini-swe-agent"))
NPM_PREFIX = Path(os.environ.get("ROLLOUTS_NPM_PREFIX", CACHE / "npm"))
CODEX = NPM_PREFIX / "node_modules/.bin/codex"
CLAUDE = NPM_PREFIX / "node_modules/.bin/claude"
HERE = Path(__file__).resolve().parent


@dataclass
class Ran:
    """One harness run: its exit status and what it printed (its own account of the run)."""

    returncode: int
    stdout: str
    stderr: str

    def tail(self) -> str:
        return f"exit {self.returncode}\nstdout: {self.stdout[-3000:]}\nstderr: {self.stderr[-3000:]}"


def _run(command: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> Ran:
    """Run with stdin closed (nobody is there to answer a prompt) and only `env` plus PATH and HOME."""
    base = {"PATH": os.environ["PATH"], "HOME": str(cwd), "LANG": "C.UTF-8"}
    done = subprocess.run(
        command,
        env={**base, **env},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def run_mini_swe_agent(
    base_url: str, key: str, model: str, task: str, workdir: Path, step_limit: int = 3, max_tokens: int = 64
) -> dict[str, Any]:
    """The `mini` CLI (its default config, mini.yaml) with litellm's OpenAI client on the job's chat route and
    JobToolsEnvironment (mini_swe_agent_env.py) running its commands through the job's tools; returns its
    saved trajectory (mini-swe-agent's own format: `info.exit_status`, `messages`)."""
    mini = MINI_ENV / "bin/mini"
    assert mini.exists(), f"no mini-swe-agent environment at {MINI_ENV}: run scripts/setup.sh test"
    trajectory = workdir / "mini.traj.json"
    settings = {
        "model.model_kwargs.api_base": f"{base_url}/v1",
        "model.model_kwargs.api_key": key,
        "model.model_kwargs.max_tokens": max_tokens,
        "model.cost_tracking": "ignore_errors",  # a local model has no price in litellm's table
        "agent.step_limit": step_limit,
        "environment.base_url": base_url,
        "environment.api_key": key,
    }
    command = [str(mini), "-m", f"openai/{model}", "-t", task, "--yolo", "--exit-immediately", "-o", str(trajectory)]
    command += ["--environment-class", "mini_swe_agent_env.JobToolsEnvironment", "-c", "mini.yaml"]
    for name, value in settings.items():
        command += ["-c", f"{name}={json.dumps(value) if isinstance(value, int) else value}"]
    env = {
        "PYTHONPATH": str(HERE),  # for mini_swe_agent_env only
        "MSWEA_CONFIGURED": "true",  # no first-run questionnaire
        "MSWEA_GLOBAL_CONFIG_DIR": str(workdir / "mswea"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm fetches its price table from the internet otherwise
    }
    ran = _run(command, env, workdir, timeout_s=600)
    assert ran.returncode == 0 and trajectory.exists(), ran.tail()
    return json.loads(trajectory.read_text())


def codex_config(base_url: str, model: str) -> str:
    """Codex CLI's config.toml: the job's endpoint as a custom provider on the Responses wire API, and
    off what would leave the machine or send a tool the endpoint refuses (docs/TRAJECTORY.md)."""
    return f"""\
model = "{model}"
model_provider = "rollouts"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.rollouts]
name = "rollouts job"
base_url = "{base_url}/v1"
env_key = "ROLLOUTS_JOB_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
goals = false

[agents]
enabled = false
"""


def run_codex(
    base_url: str, key: str, model: str, prompt: str, workdir: Path, sandbox: str = "read-only"
) -> list[dict[str, Any]]:
    """`codex exec` (non-interactive) on the job's endpoint; returns its JSONL events (`--json`).

    Its read-only `sandbox` (the default) runs commands under bwrap through a helper it links under
    CODEX_HOME, which it refuses to do under /tmp (where the tests' directories are): a command then
    fails with `bwrap: execvp codex-linux-sandbox`, so a test that has it run one asks for
    `danger-full-access` (the command runs in the test's own directory)."""
    assert CODEX.exists(), f"no Codex CLI at {CODEX}: run scripts/setup.sh test"
    home = workdir / "codex-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(codex_config(base_url, model))
    command = [str(CODEX), "exec", "--skip-git-repo-check", "--json", "--sandbox", sandbox, prompt]
    ran = _run(command, {"CODEX_HOME": str(home), "ROLLOUTS_JOB_KEY": key}, workdir, timeout_s=900)
    assert ran.returncode == 0, ran.tail()
    return [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]


def run_claude_code(
    base_url: str,
    key: str,
    model: str,
    prompt: str,
    workdir: Path,
    max_turns: int = 2,
    allowed_tools: tuple[str, ...] = (),
) -> dict[str, Any]:
    """`claude -p` (non-interactive) on the job's endpoint; returns its result (`--output-format json`).
    `allowed_tools` run without asking (`--allowedTools`, e.g. "Bash(ls:*)"); nobody is there to ask."""
    assert CLAUDE.exists(), f"no Claude Code at {CLAUDE}: run scripts/setup.sh test"
    env = {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        "CLAUDE_CONFIG_DIR": str(workdir / "claude-config"),
        # no telemetry, error reports, update checks or other calls that are not the model's
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",  # a refusal is the test's to see, not the harness's to retry
    }
    command = [str(CLAUDE), "-p", prompt, "--model", model, "--max-turns", str(max_turns), "--output-format", "json"]
    command += ["--allowedTools", *allowed_tools] if allowed_tools else []
    ran = _run(command, env, workdir, timeout_s=900)
    assert ran.returncode == 0, ran.tail()
    return json.loads(ran.stdout.strip().splitlines()[-1])
