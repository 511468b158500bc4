"""The weights a restarted vLLM of the local stack must load before it rejoins the pool: its model's current ones.

A restarted vLLM loads the model from disk, and would otherwise serve an old policy under the current
version.
"""

from __future__ import annotations

from cli.supervision import StayDown
from cli.vllm_server import VLLMServer
from shared.config import Settings
from shared.errors import ValidationError
from shared.keys import Keys
from shared.redis_conn import connect
from shared.weights.checkpoint import check_checkpoint
from shared.weights.versions import WeightVersions
from shared.weights.vllm_routes import Checkpoint, StepFailed, StepTimes, apply


def load_current_weights(server: VLLMServer, model: str, settings: Settings) -> str | None:
    """Apply `model`'s current version (WeightVersions, in the Redis `settings` name) to `server`, as an update
    does; None: there is none. StayDown when it cannot be loaded: the backend stays out rather than serve
    older weights."""
    with connect(settings) as redis:
        current = WeightVersions(redis, Keys(settings.redis_prefix)).current(model)
    if current.version is None:
        return None
    what = f"the model {model!r}'s current weights {current.version!r} ({current.path})"
    if current.path.startswith("upload:"):
        raise StayDown(
            f"{what} were sent as bytes, which the service does not keep: it stays out of the "
            "pool (a new update cannot reach it either: restart `rollouts up` and send them again)"
        )
    try:
        check_checkpoint(current.path, str(server.model), lora=bool(current.lora))
        checkpoint = Checkpoint(current.path, current.version, lora=current.lora or None)
        apply(server.url, checkpoint, settings.weights_step_timeout_s, StepTimes())
    except (ValidationError, StepFailed) as exc:
        raise StayDown(f"{what} could not be loaded, so it stays out of the pool: {exc}") from None
    return current.version
