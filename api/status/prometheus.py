"""Prometheus families computed at scrape time from Redis: nothing is kept in the API's memory.

Any API replica serves the same numbers, and a restarted API loses nothing: gauges are read
from the job indexes, rq queues and the backend pool; the workers' histograms and counters
come from the aggregates they write (shared/metrics.py). Served by the status area's router (`GET /metrics`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from redis import Redis

from shared.backend_pool import BackendPool
from shared.config import STAGES
from shared.jobs.admission import redis_memory
from shared.jobs.queues import stage_queue, stage_workers
from shared.jobs.store import JobStore
from shared.keys import BatchKeys, Keys
from shared.metrics import COUNTERS, HISTOGRAMS, LABEL_SEP, CounterFamily, HistogramFamily, metric_key


class RedisCollector(Collector):
    """One scrape = a handful of pipelined Redis reads (plus one per stored batch for DAPO counts)."""

    def __init__(self, store: JobStore) -> None:
        self.redis: Redis = store.redis
        self.keys: Keys = store.keys
        self.settings = store.settings
        self.store = store

    def collect(self) -> Iterator[Metric]:
        yield self._jobs_by_status()
        yield from self._storage()
        yield from self._stages()
        yield from self._backends()
        yield from self._batches()
        for family in HISTOGRAMS:
            yield self._histogram(family)
        for counter in COUNTERS:
            yield self._counter(counter)

    # --- read at scrape time ---------------------------------------------------------
    def _jobs_by_status(self) -> Metric:
        jobs = GaugeMetricFamily(
            "rollouts_jobs", "Stored jobs by status (a stage status covers waiting and running).", labels=["status"]
        )
        for status, count in self.store.counts_by_status().items():
            jobs.add_metric([status], count)
        return jobs

    def _storage(self) -> Iterator[Metric]:
        """Where job data lives: Redis's memory against its limit, the results store's size and health."""
        memory = redis_memory(self.redis, self.settings)
        yield GaugeMetricFamily("rollouts_redis_used_bytes", "Redis used_memory.", value=memory.used)
        yield GaugeMetricFamily(
            "rollouts_redis_limit_bytes", "Redis maxmemory (or the configured size); 0: none.", value=memory.limit
        )
        usage = self.store.results_usage()
        yield GaugeMetricFamily(
            "rollouts_results_bytes", "Compressed bytes in the results store.", value=usage["bytes"]
        )
        yield GaugeMetricFamily("rollouts_results_files", "Files in the results store.", value=usage["files"])
        healthy = self.store.results.health().healthy
        yield GaugeMetricFamily(
            "rollouts_results_healthy", "1 if the results store can take results.", value=int(healthy)
        )
        swept = self.redis.hgetall(self.keys.results_sweep)
        removed = CounterMetricFamily(
            "rollouts_results_swept_files",
            "Stored results removed by the retention sweep.",
            value=int(swept.get(b"files_total", 0)),
        )
        removed_bytes = CounterMetricFamily(
            "rollouts_results_swept_bytes",
            "Bytes of stored results removed by the retention sweep.",
            value=int(swept.get(b"bytes_total", 0)),
        )
        yield from (removed, removed_bytes)

    def _stages(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("rollouts_queue_depth", "Jobs waiting in a stage's rq queue.", labels=["stage"])
        running = GaugeMetricFamily("rollouts_stage_running", "Jobs a stage's workers are running.", labels=["stage"])
        slots = GaugeMetricFamily(
            "rollouts_worker_slots", "Worker slots by stage and state.", labels=["stage", "state"]
        )
        for stage in STAGES:
            queue = stage_queue(stage, self.redis)
            depth.add_metric([stage], queue.count)
            running.add_metric([stage], self.redis.zcard(queue.started_job_registry.key))
            states: dict[str, int] = defaultdict(int)
            for worker in stage_workers(stage, queue.connection):
                states["busy" if worker.get_state() == "busy" else "idle"] += 1
            for state in ("busy", "idle"):
                slots.add_metric([stage, state], states[state])
        yield from (depth, running, slots)

    def _backends(self) -> Iterator[Metric]:
        labels = ["backend", "model"]
        inflight = GaugeMetricFamily("rollouts_backend_inflight", "Trajectories charged to a backend.", labels=labels)
        capacity = GaugeMetricFamily("rollouts_backend_capacity", "A backend's capacity weight.", labels=labels)
        healthy = GaugeMetricFamily("rollouts_backend_healthy", "1 if the backend is healthy.", labels=labels)
        draining = GaugeMetricFamily("rollouts_backend_draining", "1 if the backend takes no new pins.", labels=labels)
        for backend in BackendPool(self.redis, self.keys, self.settings).backends():
            names = [backend.id, backend.model]
            inflight.add_metric(names, backend.inflight)
            capacity.add_metric(names, backend.capacity)
            healthy.add_metric(names, int(backend.healthy))
            draining.add_metric(names, int(backend.draining))
        yield from (inflight, capacity, healthy, draining)

    def _batches(self) -> Iterator[Metric]:
        """Group outcomes summed over the batches still stored (they expire with their jobs)."""
        keys = BatchKeys(self.keys.prefix)
        groups = GaugeMetricFamily(
            "rollouts_batch_groups",
            "Completed groups of stored batches by mode and outcome (informative, uniform, failed).",
            labels=["mode", "outcome"],
        )
        filtered = GaugeMetricFamily(
            "rollouts_dapo_filtered_groups", "DAPO groups filtered out (all rewards equal), over stored batches."
        )
        totals: dict[tuple[str, str], int] = defaultdict(int)
        batch_ids = self.redis.zrange(keys.batches, 0, -1)
        with self.redis.pipeline(transaction=False) as pipe:
            for batch_id in batch_ids:
                pipe.hmget(keys.batch(batch_id.decode()), ["mode", "informative", "uniform", "failed"])
            rows = pipe.execute() if batch_ids else []
        for mode, *counts in rows:
            if mode is None:
                continue  # expired
            for outcome, value in zip(("informative", "uniform", "failed"), counts, strict=True):
                totals[(mode.decode(), outcome)] += int(value or 0)
        for (mode, outcome), value in sorted(totals.items()):
            groups.add_metric([mode, outcome], value)
        filtered.add_metric([], totals.get(("dapo", "uniform"), 0))
        yield from (groups, filtered)

    # --- the workers' aggregates -----------------------------------------------------------
    def _histogram(self, family: HistogramFamily) -> Metric:
        raw = self.redis.hgetall(metric_key(self.keys.prefix, family))
        series: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
        for field_raw, value_raw in raw.items():
            *labels, part = field_raw.decode().split(LABEL_SEP)
            series[tuple(labels)][part] = float(value_raw)
        metric = HistogramMetricFamily(family.name, family.help, labels=list(family.labels))
        for labels, parts in sorted(series.items()):
            if len(labels) != len(family.labels):
                continue
            cumulative, buckets = 0.0, []
            for index, bound in enumerate(family.buckets):
                cumulative += parts.get(str(index), 0.0)
                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
            metric.add_metric(list(labels), buckets, parts.get("sum", 0.0))
        return metric

    def _counter(self, family: CounterFamily) -> Metric:
        raw = self.redis.hgetall(metric_key(self.keys.prefix, family))
        metric = CounterMetricFamily(family.name, family.help, labels=list(family.labels))
        for field_raw, value_raw in sorted(raw.items()):
            labels = field_raw.decode().split(LABEL_SEP)
            if len(labels) == len(family.labels):
                metric.add_metric(labels, float(value_raw))
        return metric
