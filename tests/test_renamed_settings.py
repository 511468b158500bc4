"""Renamed settings: a deployment's old names keep working for a release, each with a deprecation line."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import config
from shared.config import RENAMED, Settings


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for old, new in RENAMED.items():
        monkeypatch.delenv(f"ROLLOUTS_{old.upper()}", raising=False)
        monkeypatch.delenv(f"ROLLOUTS_{new.upper()}", raising=False)


def test_an_old_environment_name_is_read_and_named_deprecated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_AGENT_PROXY_HOST", "10.1.2.3")
    with pytest.warns(DeprecationWarning, match="agent_proxy_host .* called external_agent_host now"):
        assert Settings().external_agent_host == "10.1.2.3"


def test_the_new_name_wins_over_the_old(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_AGENT_PROXY_HOST", "10.1.2.3")
    monkeypatch.setenv("ROLLOUTS_EXTERNAL_AGENT_HOST", "10.9.9.9")
    with pytest.warns(DeprecationWarning):
        assert Settings().external_agent_host == "10.9.9.9"


def test_an_old_keyword_is_read(recwarn: pytest.WarningsRecorder) -> None:
    secret = "s" * 32
    assert Settings(agent_key_secret=secret).external_agent_secret == secret
    assert any("agent_key_secret" in str(w.message) for w in recwarn.list)


def test_an_old_name_in_the_config_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config_file = tmp_path / "rollouts.env"
    config_file.write_text("ROLLOUTS_AGENT_KEY_SECRET=" + "k" * 32 + "\n")
    monkeypatch.setitem(Settings.model_config, "env_file", str(config_file))
    with pytest.warns(DeprecationWarning, match="agent_key_secret"):
        assert Settings().external_agent_secret == "k" * 32


def test_no_old_name_no_warning(recwarn: pytest.WarningsRecorder) -> None:
    assert Settings().external_agent_host == "127.0.0.1"
    assert not [w for w in recwarn.list if issubclass(w.category, DeprecationWarning) and "setting" in str(w.message)]
    assert set(RENAMED.values()) <= set(config.Settings.model_fields)


def test_a_gateways_old_key_names_are_read_as_its_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_BACKEND_KEY", "data-secret")
    monkeypatch.setenv("ROLLOUTS_BACKEND_ADMIN_KEY", "admin-secret")
    with pytest.warns(DeprecationWarning, match="backend_key .* called backend_token now"):
        settings = Settings()
    assert (settings.backend_token, settings.backend_admin_token) == ("data-secret", "admin-secret")
