"""One typed settings object for every process of the service.

Every field can be set from the environment with the ``ROLLOUTS_`` prefix
(``ROLLOUTS_REDIS_URL``, ``ROLLOUTS_ROLLOUT_CONCURRENCY``...), or from a shared
config file named by ``ROLLOUTS_CONFIG`` (``KEY=value`` lines, the format Slurm
jobs and shells both read). The API, the workers and the CLI all read the same
object so a whole fleet is configured in one place.
"""

from __future__ import annotations

import logging
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from dotenv import dotenv_values
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

STAGES: tuple[str, ...] = ("init", "rollout", "eval")
SANDBOX_LIFETIMES: tuple[str, ...] = ("single-use", "reuse")

# Settings that were renamed: the old name is still read (environment, config file or keyword), with a
# deprecation line, so a deployment's config keeps working for a release after the rename.
RENAMED: dict[str, str] = {
    "agent_proxy_host": "external_agent_host",
    "agent_key_secret": "external_agent_secret",
    "backend_key": "backend_token",
    "backend_admin_key": "backend_admin_token",
}

log = logging.getLogger("rollouts.config")

# A list setting reads from the environment as comma-separated words.
WordList = Annotated[list[str], NoDecode]


def _config_file_values() -> dict[str, str | None]:
    """The shared config file's lines (ROLLOUTS_CONFIG, as the settings read it), for names no field has."""
    path = Settings.model_config.get("env_file")
    return dotenv_values(path) if isinstance(path, str) and Path(path).is_file() else {}


def _default_vllm_env() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollouts" / "vllm"


def _default_state_dir() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "rollouts"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ROLLOUTS_",
        env_file=os.environ.get("ROLLOUTS_CONFIG"),
        extra="ignore",
    )

    # --- Redis -------------------------------------------------------------
    redis_url: str | None = Field(
        default=None,
        description="Redis to use. Unset: `rollouts up` starts an embedded redis-server.",
    )
    redis_url_file: Path | None = Field(
        default=None,
        description="A file (mode 0600) holding the Redis URL and its password, read when redis_url is unset; "
        "`rollouts up` writes <state_dir>/redis.url for its embedded Redis and names it here for its processes.",
    )
    redis_prefix: str = Field(default="ro", description="Namespace of every key the service writes.")
    redis_request_timeout_s: float = Field(
        default=0.5,
        gt=0,
        description="The API's limit on one Redis call: while Redis is away a request gets its 503 this soon.",
    )
    redis_tcp_user_timeout_s: float = Field(
        default=20.0,
        ge=1,
        description="How long a process's Redis connection may go with its data or keepalive probes unanswered before "
        "the kernel drops it (TCP_USER_TIMEOUT and keepalive timings): a worker whose network path to Redis is cut "
        "finds out this soon and restarts its slots, not after the kernel's ~15 minutes of retransmissions.",
    )
    state_dir: Path = Field(default_factory=_default_state_dir)
    redis_maxmemory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="maxmemory of the embedded redis-server (noeviction), and the limit the API admits against for "
        "a Redis that sets none. Unset: redis_maxmemory_fraction of this machine's memory.",
    )
    redis_maxmemory_fraction: float = Field(
        default=0.25, gt=0, le=1, description="The embedded Redis's share of the machine's memory when no size is set."
    )
    redis_high_water: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Above this fraction of Redis's maxmemory the API refuses new submissions (503, Retry-After).",
    )
    admission_retry_after_s: int = Field(
        default=30, gt=0, description="The Retry-After of a submission refused for lack of room (Redis or results)."
    )

    # --- Results store -----------------------------------------------------
    results_root: Path | None = Field(
        default=None,
        description="Where finished jobs' trajectories and evaluations are stored (shared storage on a cluster). "
        "Default: <state_dir>/results, created on start; a path set here must exist.",
    )
    results_ttl_s: int = Field(default=7 * 24 * 3600, gt=0, description="How long stored results are kept.")
    results_sweep_interval_s: int = Field(
        default=600, gt=0, description="How often one worker removes stored results older than results_ttl_s."
    )
    results_min_free_bytes: int = Field(
        default=256 * 1024**2,
        ge=0,
        description="Below this much free space the results store is unhealthy and submissions are refused.",
    )
    results_compression_level: int = Field(default=3, ge=1, le=22, description="zstd level of stored results.")

    # --- API ---------------------------------------------------------------
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    api_url: str | None = Field(default=None, description="Where clients and workers reach the API.")
    api_tokens: WordList = Field(
        default_factory=list,
        description="Bearer tokens accepted on every route but health. Empty: auth off.",
    )
    admin_tokens: WordList = Field(
        default_factory=list,
        description="Tokens with the admin scope (backend registration). Empty: any API token.",
    )
    token: str | None = Field(default=None, description="Bearer token the CLI and clients send.")
    allow_open_api: bool = Field(
        default=False,
        description="Serve the API beyond loopback with no tokens (auth off). Off: `rollouts api` refuses to start so.",
    )
    progress_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="Without a terminal (CI, Slurm, nohup), the CLI's progress line every this often.",
    )
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    max_weight_bytes: int = Field(
        default=2 * 1024**3,
        gt=0,
        description="Largest weight update sent as bytes (PUT /v1/models/{model}/weights): "
        "the API holds it in memory and sends it base64 (4/3 the size) to every backend.",
    )
    max_jobs_per_request: int = Field(default=5000, gt=0)
    max_json_depth: int = Field(
        default=64, ge=4, description="Request bodies nested deeper than this are refused (422 naming the field)."
    )
    list_page_max: int = Field(default=1000, gt=0)
    prompt_files_root: Path | None = Field(
        default=None,
        description="When set, batches' server-side prompt files (prompts_path) must lie under it.",
    )
    prompt_file_max_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, description="The largest server-side prompt file a batch may read."
    )
    batch_default_groups_in_flight: int = Field(
        default=64, gt=0, description="A batch's groups in flight when the request names none (or the target, if less)."
    )
    batch_max_groups_in_flight: int = Field(
        default=4096, gt=0, description="The most groups in flight a batch may ask for (larger requests are capped)."
    )

    # --- Workers -----------------------------------------------------------
    init_concurrency: int = Field(default=4, gt=0)
    rollout_concurrency: int = Field(default=32, gt=0)
    eval_concurrency: int | None = Field(default=None, gt=0, description="Unset: rollout_concurrency / 4, at least 4.")
    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="Job and worker heartbeats.")
    heartbeat_ttl_s: int = Field(
        default=20, gt=0, description="A job whose worker sent no heartbeat for this long is abandoned."
    )
    maintenance_interval_s: int = Field(default=10, gt=0, description="How often abandoned jobs are requeued.")
    stage_retries: int = Field(default=3, ge=0, description="Re-runs of a stage whose worker died.")
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long running jobs may finish before they are handed back."
    )
    renew_command: str | None = Field(
        default=None,
        description="Run by a worker (bash -c) on SIGUSR1, a scheduler's time-limit warning, before it drains: "
        "slurm/lib.sh sets it to submit the task's successor.",
    )
    task_profiles: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "Named execution settings an operator allows (JSON: {name: task fields}, e.g. "
            '{"web": {"sandbox": {"network": true}}}); a task names one as `profile`.'
        ),
    )
    task_modules: WordList = Field(
        default_factory=list, description="Extra modules imported at start-up to register task kinds."
    )
    workspace_root: Path | None = Field(
        default=None, description="Shared storage for job workspaces. Default: <state_dir>/workspaces."
    )

    # --- Job defaults ------------------------------------------------------
    default_init_timeout_s: float = 600.0
    default_rollout_timeout_s: float = 3600.0
    default_eval_timeout_s: float = 900.0
    default_total_timeout_s: float = 7200.0
    job_ttl_s: int = Field(default=7 * 24 * 3600, gt=0, description="How long finished job records are kept.")

    # --- LLM backends -------------------------------------------------------
    llm_heartbeat_interval_s: float = Field(default=5.0, gt=0, description="How often `rollouts register` beats.")
    llm_heartbeat_timeout_s: float = Field(
        default=20.0, gt=0, description="A backend silent this long leaves the pool until it beats again."
    )
    llm_pin_ttl_s: float = Field(
        default=1800.0, gt=0, description="A trajectory pin not refreshed for this long is reaped (crashed rollout)."
    )
    llm_pin_per_group: bool = Field(
        default=False, description="Pin a whole GRPO group to one backend (shared prompt prefix cache)."
    )
    llm_probe_timeout_s: float = Field(default=2.0, gt=0, description="Timeout of a backend's /health probe.")
    llm_connect_timeout_s: float = Field(default=5.0, gt=0)
    llm_request_timeout_s: float = Field(default=600.0, gt=0, description="One /v1/completions call, end to end.")
    llm_max_retries: int = Field(default=3, ge=0, description="Retries of a call on connection errors and 5xx.")
    llm_retry_backoff_s: float = Field(default=0.5, gt=0, description="First retry delay; doubles each retry.")
    weights_step_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="One step of a weight update on one backend (pause, reload, ...); `pause?mode=wait` waits for "
        "running requests, so this also bounds how long a generation may hold an update up.",
    )
    backend_wait_s: float = Field(
        default=900.0,
        gt=0,
        description="How long a job may wait for an LLM backend to be open to it (none registered yet, all "
        "draining, its own gone) before it fails; meanwhile it waits in no worker slot.",
    )
    backend_wait_retry_s: float = Field(
        default=30.0,
        gt=0,
        description="The longest a waiting job sleeps between looks at the pool; a backend that registers or "
        "reopens wakes the waiting jobs at once, so this only bounds a wake that was missed.",
    )
    llm_load_ceiling: float = Field(
        default=16.0,
        gt=0,
        description="How far (in-flight trajectories per unit of capacity) a route's pinned backend may run ahead of "
        "the least-loaded one before new trajectories of that route (a GRPO group's next samples) go to the least "
        "loaded instead: past it, a shared prefix cache is worth less than the queue. Running trajectories never move.",
    )

    # --- Node gateways (gateway/, `rollouts register --gateway`) -------------------
    backend_token: str | None = Field(
        default=None,
        description="Bearer token of the data routes (generate, completions, models, health, metrics) of every node "
        "gateway; the workers and the API send it to the backends. Unset: backends are called without one.",
    )
    backend_admin_token: str | None = Field(
        default=None,
        description="Bearer token of a node gateway's control routes (pause, resume, reload, bytes upload, prefix "
        "cache, weight version, LoRA load); only the API, which runs weight updates, sends it.",
    )
    checkpoint_roots: WordList = Field(
        default_factory=list,
        description="Directories a node gateway lets its vLLM reload checkpoints and LoRA adapters from (comma "
        "separated); a path outside them is refused with 403. Empty: every path reload is refused.",
    )

    # --- The embedded vLLM server (`rollouts up`) ------------------------------
    vllm_env: Path = Field(
        default_factory=_default_vllm_env,
        description="The virtualenv vLLM is installed in (scripts/setup.sh puts it here).",
    )
    vllm_model: Path | None = Field(
        default=None,
        description="Local HF model dir `rollouts up` serves. Unset: the tiny model built under state_dir.",
    )
    vllm_served_model_name: str | None = Field(
        default=None, description="The name vLLM serves the model under. Unset: the model dir's name."
    )
    vllm_args: str = Field(default="", description="Extra command-line arguments for vLLM's api_server.")
    vllm_start_timeout_s: float = Field(default=900.0, gt=0, description="How long `rollouts up` waits for vLLM.")
    vllm_kv_cache_gib: int = Field(default=1, gt=0, description="VLLM_CPU_KVCACHE_SPACE of a CPU-only server.")
    vllm_restart_budget: int = Field(
        default=3,
        ge=0,
        description="Restarts `rollouts up` gives its vLLM server within vllm_restart_window_s; past them the server "
        "stays down (said in one line) and the rest of the stack keeps serving: a crash loop is not retried forever.",
    )
    vllm_hang_timeout_s: float = Field(
        default=120.0,
        ge=0,
        description="`rollouts up` kills and restarts its vLLM server when it is running but has not answered /health "
        "for this long (a hung engine); 0 turns the check off. Counted from when the server is ready (start, restart).",
    )
    vllm_restart_window_s: float = Field(
        default=3600.0, gt=0, description="The window vllm_restart_budget counts restarts in (seconds)."
    )
    tiny_model_seed: int = Field(default=0, description="Seed of the built tiny model's weights.")
    tiny_model_max_len: int = Field(default=4096, gt=0, description="Context length of the built tiny model.")

    # --- Sandboxes ----------------------------------------------------------
    sandbox_backend: str = Field(default="local", pattern="^(local|singularity)$")
    sandbox_require_isolation: bool = Field(
        default=False, description="Refuse the plain-process fallback when bubblewrap cannot run."
    )
    sandbox_workdir: str = Field(default="/workspace", description="Where the workspace appears inside a sandbox.")
    sandbox_image_cache: Path | None = Field(
        default=None, description="Built/pulled .sif images, shared by all jobs. Default: <state_dir>/images."
    )
    sandbox_default_image: str | None = Field(
        default=None, description="Singularity image (.sif path, docker://, oras://) when a spec names none."
    )
    singularity_executable: str = Field(default="apptainer", description="apptainer or singularity.")
    swe_repo_mirror: Path | None = Field(
        default=None,
        description="Git repositories of SWE-bench-style rows that name no repo_path, on storage every worker "
        "sees: <mirror>/<owner>__<name> (SWE-bench's naming) or <mirror>/<owner>/<name>, optionally ending .git.",
    )
    sandbox_cpu_seconds: int = Field(default=3600, gt=0, description="RLIMIT_CPU of every sandbox process.")
    sandbox_memory_bytes: int = Field(default=4 * 1024**3, gt=0, description="RLIMIT_AS of every sandbox process.")
    sandbox_processes: int = Field(default=256, gt=0, description="RLIMIT_NPROC (threads count too).")
    sandbox_file_size_bytes: int = Field(default=1024**3, gt=0, description="RLIMIT_FSIZE: largest file written.")
    sandbox_disk_bytes: int = Field(
        default=8 * 1024**3,
        gt=0,
        description="Disk quota of one sandbox: its workspace and /tmp together; over it, the sandbox is ended.",
    )
    sandbox_disk_files: int = Field(default=500_000, gt=0, description="Entries (files, dirs) in that quota.")
    sandbox_disk_check_interval_s: float = Field(
        default=0.5, gt=0, description="How often the worker measures a running sandbox's disk use."
    )
    sandbox_uid_base: int = Field(
        default=200000, gt=0, description="Run as root: each live sandbox runs as its own uid from here."
    )
    sandbox_uid_slots: int = Field(default=4096, gt=0)
    sandbox_start_timeout_s: float = Field(default=60.0, gt=0)
    sandbox_start_concurrency: int = Field(
        default_factory=lambda: max(2, len(os.sched_getaffinity(0))),  # the node's cores, as measured
        gt=0,
        description="Most sandboxes one worker process starts at a time (a job's own first, then pool refills); "
        "more wait their turn. Default: the cores, at least 2 (docs/BENCHMARKS.md, sandbox start cap).",
    )
    sandbox_start_concurrency_per_image: int = Field(
        default_factory=lambda: max(2, len(os.sched_getaffinity(0))), gt=0, description="The same, per image."
    )
    sandbox_on_demand: bool = Field(default=True, description="Open a job's sandbox at its first tool call.")
    sandbox_pool: bool = Field(
        default=True,
        description="Keep started sandboxes ready for the rollout stage (workers/sandbox/pool.py); off: every "
        "job starts its own on its critical path.",
    )
    sandbox_pool_memory_bytes: int = Field(
        default=2 * 1024**3,
        gt=0,
        description="Memory the ready sandboxes of one worker process may hold together; the pool never "
        "keeps more than this / sandbox_pool_sandbox_bytes of them.",
    )
    sandbox_pool_sandbox_bytes: int = Field(
        default=76 * 1024**2,
        gt=0,
        description="Memory of one ready sandbox (tool server, shell, kernel fork server and IPython kernel: 75 MiB "
        "PSS measured in docs/BENCHMARKS.md, Sandbox pool), for the bound above.",
    )
    sandbox_pool_idle_s: float = Field(
        default=120.0,
        gt=0,
        description="A sandbox profile no job asked for in this long has its ready sandboxes stopped.",
    )
    sandbox_pool_interval_s: float = Field(
        default=1.0, gt=0, description="How often the pool re-reads its queue's depth and refills or shrinks."
    )
    sandbox_lifetimes: dict[str, str] = Field(
        default_factory=dict,
        description='Per task kind: "single-use" (the default: a used sandbox is stopped) or "reuse" (reset, '
        "proven clean, and handed to the next job; docs/SANDBOX.md, Sandbox lifetimes).",
    )
    tool_output_cap_bytes: int = Field(default=16 * 1024, gt=0, description="Output the agent sees per call.")
    tool_hard_output_bytes: int = Field(
        default=8 * 1024 * 1024, gt=0, description="A command printing more than this is interrupted."
    )
    tool_default_timeout_s: float = Field(default=60.0, gt=0)
    tool_max_timeout_s: float = Field(default=600.0, gt=0)

    # --- Agent loop ---------------------------------------------------------
    agent_tool_parser: str = Field(default="hermes", description="Tool-call format: hermes or llama3_json.")
    agent_stop_on_no_tool_call: bool = Field(
        default=True, description="An assistant turn without a tool call ends the trajectory (else: nudge, go on)."
    )
    agent_no_tool_call_message: str = Field(
        default="No tool call found. Call a tool, or call finish when you are done.",
        description="The user message sent after a turn without a tool call, when that does not stop the loop.",
    )
    agent_max_context_tokens: int = Field(
        default=32768, gt=0, description="Most tokens of one trajectory (the model's context); jobs can ask for less."
    )
    agent_max_tokens_per_turn: int = Field(
        default=4096, gt=0, description="Generation cap of one turn when the job's sampling sets none."
    )
    agent_time_reserve_s: float = Field(
        default=10.0, ge=0, description="Stop cleanly (time_budget) when less than this is left of the stage."
    )
    external_agent_secret: str | None = Field(
        default=None,
        min_length=16,
        description="Secret the per-job tokens of external agents derive from; unset: one made once and kept in Redis.",
    )
    external_agent_host: str = Field(
        default="127.0.0.1",
        description="Where a rollout worker serves an external agent's job (the API forwards there): an address the "
        "API's node reaches.",
    )
    external_agent_max_conversations: int = Field(
        default=32,
        gt=0,
        description="Conversations one external agent's job may hold (sub-agents, parallel agents, rewritten "
        "histories); a call that would start one more is refused (409).",
    )

    # --- Logging -----------------------------------------------------------
    log_level: str = "INFO"
    rq_log_level: str = Field(
        default="WARNING", description="rq's own logs (a line or two per job at INFO): quiet unless asked for."
    )
    log_json: bool = False

    @model_validator(mode="before")
    @classmethod
    def _read_renamed(cls, data: Any) -> Any:
        """An old setting name still counts (a new name given too wins), and says what it is called now."""
        if not isinstance(data, dict):
            return data
        config_file = _config_file_values()
        for old, new in RENAMED.items():
            env = f"ROLLOUTS_{old.upper()}"
            value = data.pop(old, None)
            for source in (os.environ, config_file):
                if value is None:
                    value = next((v for k, v in source.items() if k.upper() == env), None)
            if value is None:
                continue
            message = f"setting {old} (ROLLOUTS_{old.upper()}) is deprecated: it is called {new} now"
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            log.warning(message)
            data.setdefault(new, value)
        return data

    @field_validator("api_tokens", "admin_tokens", "task_modules", "checkpoint_roots", mode="before")
    @classmethod
    def _split_words(cls, value: object) -> object:
        if isinstance(value, str):
            return [word.strip() for word in value.split(",") if word.strip()]
        return value

    @field_validator("sandbox_lifetimes")
    @classmethod
    def _known_lifetimes(cls, value: dict[str, str]) -> dict[str, str]:
        wrong = {kind: life for kind, life in value.items() if life not in SANDBOX_LIFETIMES}
        if wrong:
            raise ValueError(f"sandbox lifetimes are one of {', '.join(SANDBOX_LIFETIMES)}, not {wrong}")
        return value

    @model_validator(mode="after")
    def _read_redis_url_file(self) -> Settings:
        """The URL from `redis_url_file`: it carries the password, which is kept out of argv and env."""
        if not self.redis_url and self.redis_url_file is not None and self.redis_url_file.is_file():
            self.redis_url = self.redis_url_file.read_text().strip() or None
        return self

    @property
    def workspaces(self) -> Path:
        return self.workspace_root or self.state_dir / "workspaces"

    @property
    def results(self) -> Path:
        return self.results_root or self.state_dir / "results"

    def redis_maxmemory(self) -> int:
        """The embedded Redis's maxmemory in bytes: the setting, or a share of this machine's memory."""
        if self.redis_maxmemory_bytes is not None:
            return self.redis_maxmemory_bytes
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(physical * self.redis_maxmemory_fraction)

    @property
    def image_cache(self) -> Path:
        return self.sandbox_image_cache or self.state_dir / "images"

    def concurrency(self, stage: str) -> int:
        return {
            "init": self.init_concurrency,
            "rollout": self.rollout_concurrency,
            "eval": self.eval_concurrency or max(4, self.rollout_concurrency // 4),
        }[stage]

    def default_stage_timeout(self, stage: str) -> float:
        return {
            "init": self.default_init_timeout_s,
            "rollout": self.default_rollout_timeout_s,
            "eval": self.default_eval_timeout_s,
        }[stage]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
