"""Finished jobs' large outputs (trajectories, evaluation details), kept in files beside Redis."""

from shared.results.store import ResultStore, StoreHealth, SweepReport

__all__ = ["ResultStore", "StoreHealth", "SweepReport"]
