"""What a control call may ask for through a node gateway (checked before vLLM sees the call), and the keys
without which a gateway does not start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.app import GatewayConfig
from gateway.routes import ControlPolicy, Refused, ReloadedAdapter
from shared.config import Settings


def rpc(method: str, **kwargs: object) -> bytes:
    return json.dumps({"method": method, "kwargs": kwargs}).encode()


@pytest.fixture()
def roots(tmp_path: Path) -> Path:
    (tmp_path / "ckpts" / "step-1").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    return tmp_path


def refused(policy: ControlPolicy, path: str, body: bytes) -> Refused:
    with pytest.raises(Refused) as caught:
        policy.check(path, body)
    return caught.value


def test_a_reload_from_under_a_root_passes(roots: Path) -> None:
    policy = ControlPolicy([str(roots / "ckpts")])
    assert policy.check("/collective_rpc", rpc("reload_weights", weights_path=str(roots / "ckpts" / "step-1"))) is None


@pytest.mark.parametrize("escape", ["elsewhere", "ckpts/../elsewhere", "ckpts/link-out", "/etc", "ckpts-sibling"])
def test_a_reload_from_outside_the_roots_is_refused_naming_the_path(roots: Path, escape: str) -> None:
    (roots / "ckpts" / "link-out").symlink_to(roots / "elsewhere")  # inside by name, outside once resolved
    (roots / "ckpts-sibling").mkdir()  # a prefix of the root's name is not the root
    path = escape if escape.startswith("/") else str(roots / escape)
    caught = refused(ControlPolicy([str(roots / "ckpts")]), "/collective_rpc", rpc("reload_weights", weights_path=path))
    assert caught.status == 403 and path in caught.message and "outside the checkpoint roots" in caught.message


def test_without_roots_every_reload_is_refused_naming_the_setting(roots: Path) -> None:
    caught = refused(ControlPolicy([]), "/collective_rpc", rpc("reload_weights", weights_path=str(roots / "ckpts")))
    assert caught.status == 403 and "ROLLOUTS_CHECKPOINT_ROOTS" in caught.message


@pytest.mark.parametrize(
    "body",
    [
        {"method": "save_sharded_state", "kwargs": {"path": "/tmp/x"}},  # any other worker method
        {"method": "reload_weights", "args": ["/tmp/x"]},  # positional arguments slip past the kwargs check
        {"method": "reload_weights", "kwargs": {"weights_path": "/x", "is_checkpoint_format": "false"}},
        {"method": "load_weights_from_bytes", "kwargs": {"data": "AAAA", "extra": "1"}},
    ],
)
def test_other_collective_rpc_calls_are_refused(roots: Path, body: dict) -> None:
    caught = refused(ControlPolicy([str(roots)]), "/collective_rpc", json.dumps(body).encode())
    assert caught.status == 403


def test_a_body_that_is_not_a_json_object_is_a_400(roots: Path) -> None:
    assert refused(ControlPolicy([str(roots)]), "/collective_rpc", b"[1, 2]").status == 400
    assert refused(ControlPolicy([str(roots)]), "/collective_rpc", b"{not json").status == 400


def test_a_lora_load_must_replace_in_place_from_under_a_root(roots: Path) -> None:
    policy = ControlPolicy([str(roots / "ckpts")])
    body = {"lora_name": "policy", "lora_path": str(roots / "ckpts" / "step-1"), "load_inplace": True}
    adapter = policy.check("/v1/load_lora_adapter", json.dumps(body).encode())
    assert adapter is not None and adapter.name == "policy"
    assert refused(policy, "/v1/load_lora_adapter", json.dumps({**body, "load_inplace": False}).encode()).status == 403
    outside = {**body, "lora_path": str(roots / "elsewhere")}
    assert refused(policy, "/v1/load_lora_adapter", json.dumps(outside).encode()).status == 403


def test_a_lora_name_must_be_an_adapter_the_server_serves(roots: Path) -> None:
    body = {"lora_name": "other", "lora_path": str(roots / "ckpts" / "step-1"), "load_inplace": True}
    adapter = ControlPolicy([str(roots / "ckpts")]).check("/v1/load_lora_adapter", json.dumps(body).encode())
    assert adapter is not None
    models = {"data": [{"id": "base", "parent": None}, {"id": "policy", "parent": "base"}]}
    with pytest.raises(Refused, match="'other' is not served here \\(served adapters: policy\\)"):
        adapter.check(models)
    ReloadedAdapter("policy").check(models)


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({}, "ROLLOUTS_BACKEND_TOKEN and ROLLOUTS_BACKEND_ADMIN_TOKEN not set"),
        ({"backend_token": "k"}, "ROLLOUTS_BACKEND_ADMIN_TOKEN not set"),
        ({"backend_token": "same", "backend_admin_token": "same"}, "must differ"),
    ],
)
def test_a_gateway_will_not_start_without_two_distinct_keys(keys: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        GatewayConfig.from_settings("http://127.0.0.1:8000", Settings(**keys))
