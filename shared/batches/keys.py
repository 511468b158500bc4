"""Redis keys of batches, under the deployment's prefix (shared/keys.py belongs to the job pipeline)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchKeys:
    prefix: str = "ro"

    def batch(self, batch_id: str) -> str:
        """Hash: status, counters, pool cursor, settings and the request (msgpack) of one batch."""
        return f"{self.prefix}:batch:{batch_id}"

    def pool(self, batch_id: str) -> str:
        """List: the prompt pool, one msgpack item per prompt, in order."""
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
