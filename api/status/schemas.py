"""Response shape of the service status (`GET /v1/status`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class StageStatus(BaseModel):
    queued: int = Field(description="rq jobs waiting in the stage's queue.")
    running: int = Field(description="rq jobs a worker of the stage has started.")
    failed: int = Field(description="rq jobs in the stage's failed registry.")
    processes: int = Field(description="Worker processes listening on the stage's queue.")
    slots: int = Field(description="Concurrent jobs those processes can run.")
    busy_slots: int


class RedisMemoryStatus(BaseModel):
    used_bytes: int = Field(description="Redis's used_memory.")
    limit_bytes: int = Field(description="Its maxmemory (or the configured size); 0: no limit known.")
    high_water: float = Field(description="The fraction of the limit above which new submissions get 503.")
    accepting: bool = Field(description="False while new submissions are refused for lack of memory.")


class ResultsStatus(BaseModel):
    root: str = Field(description="The results directory.")
    bytes: int = Field(description="Compressed bytes of stored results (counted by writes and sweeps).")
    files: int = Field(description="Stored result files.")
    healthy: bool
    reason: str = Field(default="", description="Why not healthy, naming the path.")


class ServiceStatus(BaseModel):
    stages: dict[str, StageStatus]
    jobs: dict[str, int] = Field(description="Job records by status.")
    in_flight: int = Field(description="Jobs not yet in a terminal status.")
    redis: RedisMemoryStatus
    results: ResultsStatus
    restarts: dict[str, int] = Field(
        default_factory=dict,
        description="Processes `rollouts up` restarted since it started, by kind (worker, api, redis, registrar, "
        "vllm); empty when none was, or the service runs otherwise.",
    )
