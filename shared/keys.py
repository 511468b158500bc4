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
    def cancel_channel(self) -> str:
        """Pub/sub: job ids whose cancellation running workers must act on."""
        return f"{self.prefix}:cancel"

    def events_channel(self, job_id: str) -> str:
        """Pub/sub: status changes of one job (for waiters and streams)."""
        return f"{self.prefix}:events:{job_id}"
