"""Retention of stored results: one process per interval removes what is older than results_ttl_s.

Run from the workers' maintenance thread. It takes its own lock for a whole interval (not the
per-pass maintenance lock), so a fleet sweeps once per interval, and it reports what it removed:
a log line, the usage gauge taken down, and running totals the metrics endpoint exposes.
"""

from __future__ import annotations

import logging
import time

from redis import Redis

from shared.config import Settings
from shared.keys import Keys
from shared.results.store import ResultStore, SweepReport

log = logging.getLogger("rollouts.results")


def sweep_results(redis: Redis, keys: Keys, results: ResultStore, settings: Settings) -> SweepReport | None:
    """Sweep now if no process did within the interval; None when another did."""
    if not redis.set(keys.results_sweep_lock, "1", nx=True, ex=settings.results_sweep_interval_s):
        return None
    report = results.sweep(settings.results_ttl_s)
    record_sweep(redis, keys, report)
    if report.files:
        log.info(
            "results sweep removed %d files (%d bytes) in %d buckets older than %ds under %s",
            report.files,
            report.bytes,
            len(report.buckets),
            settings.results_ttl_s,
            results.root,
        )
    return report


def record_sweep(redis: Redis, keys: Keys, report: SweepReport) -> None:
    """Take the removed files off the usage gauge and add them to the sweep's running totals."""
    with redis.pipeline(transaction=False) as pipe:
        pipe.hincrby(keys.results_usage, "bytes", -report.bytes)
        pipe.hincrby(keys.results_usage, "files", -report.files)
        pipe.hset(keys.results_sweep, mapping={"at": repr(time.time()), "files": report.files, "bytes": report.bytes})
        pipe.hincrby(keys.results_sweep, "files_total", report.files)
        pipe.hincrby(keys.results_sweep, "bytes_total", report.bytes)
        pipe.execute()
