"""Weights sent as bytes (PUT, a safetensors body) through the service into a real vLLM server.

The same server as test_weight_update_on_vllm.py (the suite's `weights_vllm_server`, base weights
restored as each module ends), and a stack of this module's own (its fixture, its own instance here),
and its helpers: checkpoints are the tiny model with other seeds, and the logprobs
vLLM reports after an upload are compared with transformers' on the same checkpoint.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from rollouts_client import ApiError, AsyncRolloutClient, RolloutClient
from tests.support.vllm_server import SERVED_NAME
from tests.support.weight_checks import checkpoint, gap_to, sample
from tests.weights.test_weight_update_on_vllm import served  # noqa: F401 - the fixture

pytestmark = pytest.mark.vllm


def payload(directory: Path) -> bytes:
    """The checkpoint's one safetensors file, as a trainer without shared disk would send it."""
    [file] = directory.glob("*.safetensors")
    return file.read_bytes()


def test_an_upload_serves_the_new_weights_under_the_new_version(served) -> None:  # noqa: F811
    url, stack, root = served.url, served.stack, served.root
    client = RolloutClient(stack.api_url)
    result = client.upload_weights(SERVED_NAME, "up-1", payload(checkpoint(root, 11)))
    [backend] = result["backends"]
    assert (result["seq"], backend["status"]) == (1, "updated"), result
    assert list(backend["seconds"]) == ["pause", "reload", "reset_prefix_cache", "set_version", "resume"]
    assert httpx.get(f"{url}/weight_info").json()["weight_version"] == "up-1"
    assert client.current_weights(SERVED_NAME)["path"].startswith("upload:sha256:")
    tokens, logprobs = sample(url, seed=3)
    assert gap_to(checkpoint(root, 11), tokens, logprobs) < 1e-3

    # the async client, and a second upload over the first
    async def upload() -> dict:
        async with AsyncRolloutClient(stack.api_url) as aclient:
            return await aclient.upload_weights(SERVED_NAME, "up-2", payload(checkpoint(root, 12)), pause_mode="keep")

    assert asyncio.run(upload())["seq"] == 2
    tokens, logprobs = sample(url, seed=4)
    assert gap_to(checkpoint(root, 12), tokens, logprobs) < 1e-3


def test_an_upload_that_does_not_fit_is_refused_and_serving_goes_on(served) -> None:  # noqa: F811
    url, stack, root = served.url, served.stack, served.root
    client = RolloutClient(stack.api_url)
    for bad, words in [(payload(checkpoint(root, 13, intermediate=256)), "mlp"), (b"\0" * 64, "not a safetensors")]:
        with pytest.raises(ApiError) as refused:
            client.upload_weights(SERVED_NAME, "up-3", bad)
        assert refused.value.status_code == 422 and words in str(refused.value), refused.value
        assert refused.value.errors[0]["field"] == "body"
    assert client.current_weights(SERVED_NAME)["version"] == "up-2"
    [backend] = client.list_backends()
    assert backend["healthy"], backend
    tokens, logprobs = sample(url, seed=5)
    assert gap_to(checkpoint(root, 12), tokens, logprobs) < 1e-3  # still up-2's weights, and serving
    # the path form still works after uploads: both go through the same steps and version order
    response = httpx.post(
        f"{stack.api_url}/v1/models/{SERVED_NAME}/weights",
        json={"version": "up-4", "path": str(checkpoint(root, 14))},
        timeout=300,
    )
    assert response.json()["seq"] == 3, response.text
    tokens, logprobs = sample(url, seed=6)
    assert gap_to(checkpoint(root, 14), tokens, logprobs) < 1e-3
