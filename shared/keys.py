"""Every Redis key the service writes, in one place, under one prefix.

Keeping the names here means an operator can find what a key is for, and two
deployments can share a Redis by choosing different prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "ro"

    def job(self, job_id: str) -> str:
        """Hash: one job record (status, timings, msgpack blobs)."""
        return f"{self.prefix}:job:{job_id}"

    def idempotency(self, key: str) -> str:
        """String: idempotency key -> job id."""
        return f"{self.prefix}:idem:{key}"

    @property
    def jobs_all(self) -> str:
        """Sorted set: every job id, scored by creation time."""
        return f"{self.prefix}:idx:all"

    def jobs_by_status(self, status: str) -> str:
        """Sorted set: job ids in one status, scored by the time they entered it."""
        return f"{self.prefix}:idx:status:{status}"

    @property
    def status_index_prefix(self) -> str:
        return f"{self.prefix}:idx:status:"

    def jobs_by_group(self, group_id: str) -> str:
        """Sorted set: job ids of one GRPO group, scored by sample index."""
        return f"{self.prefix}:idx:group:{group_id}"

    @property
    def external_agent_secret(self) -> str:
        """String: the deployment's secret the per-job tokens of external agents derive from (unless configured)."""
        return f"{self.prefix}:agent:secret"

    def external_agent_endpoint(self, job_id: str) -> str:
        """String: where the rollout worker serves this job's external agent (URL), while it does (stored as `proxy`: the name it had)."""
        return f"{self.prefix}:agent:proxy:{job_id}"

    @property
    def job_events(self) -> str:
        """Pub/sub: "<job id> cancelled" on every cancellation (running workers act on it at once)."""
        return f"{self.prefix}:events"

    @property
    def job_ends(self) -> str:
        """Pub/sub: "<job id> <status>" when a job ends done, failed or timed out (the API's long polls listen;
        workers do not subscribe, so a job's end wakes no worker; cancels go on `job_events`)."""
        return f"{self.prefix}:events:ends"

    @property
    def maintenance_lock(self) -> str:
        """String: held by the one process trimming indexes right now."""
        return f"{self.prefix}:lock:maintenance"

    @property
    def results_usage(self) -> str:
        """Hash: bytes and files in the results store (added by writes, taken off by the retention sweep)."""
        return f"{self.prefix}:results:usage"

    @property
    def results_sweep(self) -> str:
        """Hash: what the last retention sweep of the results store removed, and when."""
        return f"{self.prefix}:results:swept"

    @property
    def results_sweep_lock(self) -> str:
        """String: held for one sweep interval by the process that swept the results store."""
        return f"{self.prefix}:lock:results-sweep"

    # --- LLM backend pool -----------------------------------------------------
    def backend(self, backend_id: str) -> str:
        """Hash: one backend's registration (url, model, capacity, labels, health, draining)."""
        return f"{self.prefix}:llm:backend:{backend_id}"

    @property
    def backend_ids(self) -> str:
        """Set: every registered backend id, healthy or not."""
        return f"{self.prefix}:llm:ids"

    @property
    def backend_capacity(self) -> str:
        """Hash: backend id -> capacity weight (the divisor of its load score)."""
        return f"{self.prefix}:llm:capacity"

    @property
    def backend_models(self) -> str:
        """Hash: backend id -> the model name it serves (selection only picks backends of a trajectory's model)."""
        return f"{self.prefix}:llm:models"

    @property
    def backend_inflight(self) -> str:
        """Hash: backend id -> trajectories charged to it right now."""
        return f"{self.prefix}:llm:inflight"

    @property
    def backend_usable(self) -> str:
        """Set: registered, healthy backends (draining ones too: their pins keep serving)."""
        return f"{self.prefix}:llm:usable"

    @property
    def backend_load(self) -> str:
        """Sorted set: backends open to new pins, scored by in-flight / capacity."""
        return f"{self.prefix}:llm:load"

    @property
    def llm_routes(self) -> str:
        """Hash: route key (job or GRPO group id) -> pinned backend id."""
        return f"{self.prefix}:llm:routes"

    @property
    def llm_route_refs(self) -> str:
        """Hash: route key -> number of live trajectories sharing the pin."""
        return f"{self.prefix}:llm:route_refs"

    @property
    def llm_charges(self) -> str:
        """Hash: trajectory id -> backend its in-flight count is charged to."""
        return f"{self.prefix}:llm:charges"

    @property
    def llm_leases(self) -> str:
        """Sorted set: trajectory id -> lease expiry; an expired lease is reaped (crashed rollout)."""
        return f"{self.prefix}:llm:leases"

    @property
    def llm_lease_routes(self) -> str:
        """Hash: trajectory id -> its route key."""
        return f"{self.prefix}:llm:lease_routes"

    @property
    def llm_waiting(self) -> str:
        """Sorted set: "<job id>-<stage>" of jobs waiting for a backend -> when to look again (0: now)."""
        return f"{self.prefix}:llm:waiting"

    # --- policy weight versions (shared/weights/) -------------------------------
    def weight_versions(self, model: str) -> str:
        """Hash: version -> its sequence number (1, 2, ... in the order updates applied them) for one model."""
        return f"{self.prefix}:weights:{model}:seq"

    def weight_current(self, model: str) -> str:
        """Hash: the model's last applied update: version, seq, path, applied_at."""
        return f"{self.prefix}:weights:{model}:current"

    # --- the stack `rollouts up` runs (cli/stack.py) -----------------------------
    @property
    def stack_restarts(self) -> str:
        """Hash: processes the stack restarted since it started, by kind (worker, api, redis, registrar, vllm)."""
        return f"{self.prefix}:stack:restarts"

    def weight_lock(self, model: str) -> str:
        """String: held while one weight update of the model runs (concurrent updates are serialised)."""
        return f"{self.prefix}:lock:weights:{model}"

    # --- the run page's aggregates (shared/run_stats/) ---------------------------
    # A scope is `all`, `run:<run id>` or `batch:<batch id>`; it comes last in a key, after a fixed
    # part, so no run id can make one scope's key another's.
    def run_stats_minute(self, minute: int, scope: str) -> str:
        """Hash: counts and sums of the scope's jobs that ended in this minute (epoch seconds, a multiple of 60)."""
        return f"{self.prefix}:runstats:m:{minute}:{scope}"

    def run_stats_minutes(self, scope: str) -> str:
        """Sorted set: the minutes in which a job of the scope ended (member and score: the minute)."""
        return f"{self.prefix}:runstats:idx:{scope}"

    @property
    def run_stats_scopes(self) -> str:
        """Sorted set: runs and batches (`run:<id>`, `batch:<id>`), scored by when their last job ended."""
        return f"{self.prefix}:runstats:scopes"


@dataclass(frozen=True)
class BatchKeys:
    """Keys of dynamic-sampling batches (shared/batches/), under the same prefix as the jobs'."""

    prefix: str = "ro"

    def batch(self, batch_id: str) -> str:
        """Hash: status, counters, pool cursor, settings and the request (msgpack) of one batch."""
        return f"{self.prefix}:batch:{batch_id}"

    def batch_prompts(self, batch_id: str) -> str:
        """List: the batch's prompts, one msgpack item per prompt, in order (stored as `pool`: the name it had)."""
        return f"{self.prefix}:batch:{batch_id}:pool"

    def group_prefix(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}:group:"

    def group(self, batch_id: str, prompt_index: int) -> str:
        """Hash: one group's per-sample status, reward and job id, its outcome and timestamps."""
        return f"{self.group_prefix(batch_id)}{prompt_index}"

    def inflight(self, batch_id: str) -> str:
        """Set: prompt indices of groups launched and not yet complete."""
        return f"{self.prefix}:batch:{batch_id}:inflight"

    def launching(self, batch_id: str) -> str:
        """Sorted set: groups reserved but whose jobs are not yet confirmed submitted, by reservation time."""
        return f"{self.prefix}:batch:{batch_id}:launching"

    def stream(self, batch_id: str) -> str:
        """Stream: completed groups to report, in completion order, then one `end` entry; ids are cursors."""
        return f"{self.prefix}:batch:{batch_id}:stream"

    @property
    def batches(self) -> str:
        """Sorted set: every batch id by creation time."""
        return f"{self.prefix}:batches"

    @property
    def live(self) -> str:
        """Set: batches with groups running or being launched (what the sweep looks at)."""
        return f"{self.prefix}:batches:live"

    @property
    def sweep_lock(self) -> str:
        return f"{self.prefix}:lock:batch_sweep"
