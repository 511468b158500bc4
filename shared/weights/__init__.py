"""Policy weight updates: one call loads a checkpoint into every backend of a model, in version order."""

from shared.weights.update import BackendOutcome, NoBackendsForModel, UpdateInProgress, UpdateReport, update_model
from shared.weights.versions import Current, WeightVersions
from shared.weights.vllm_routes import Checkpoint, PauseMode

__all__ = [
    "BackendOutcome",
    "Checkpoint",
    "Current",
    "NoBackendsForModel",
    "PauseMode",
    "UpdateInProgress",
    "UpdateReport",
    "WeightVersions",
    "update_model",
]
