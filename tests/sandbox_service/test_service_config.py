"""ServiceConfig: env prefix, token sources, validation."""

from __future__ import annotations

import stat

import pytest
from pydantic import ValidationError

from sandbox_service.config import ServiceConfig


def test_settings_come_from_orchard_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ORCHARD_MAX_CONCURRENT_EXECS", "7")
    monkeypatch.setenv("ORCHARD_STATE_DIR", str(tmp_path))
    config = ServiceConfig()
    assert config.max_concurrent_execs == 7 and config.state_dir == tmp_path
    assert config.max_concurrent_creates == 50 and config.heartbeat_ttl_seconds == 180  # published defaults
    with pytest.raises(ValidationError):
        ServiceConfig(no_such_knob=1)


def test_token_sources(monkeypatch, tmp_path):
    monkeypatch.delenv("ORCHARD_TOKEN", raising=False)
    monkeypatch.setenv("ORCHARD_SANDBOX_TOKEN", "from-env")  # the clients' variable, one name for both sides
    assert ServiceConfig(state_dir=tmp_path).resolve_token() == ("from-env", "ORCHARD_SANDBOX_TOKEN")
    monkeypatch.delenv("ORCHARD_SANDBOX_TOKEN")
    monkeypatch.setenv("ORCHARD_TOKEN", "old-name")
    with pytest.warns(DeprecationWarning, match="ORCHARD_TOKEN is deprecated; set ORCHARD_SANDBOX_TOKEN"):
        assert ServiceConfig(state_dir=tmp_path).resolve_token()[0] == "old-name"
    monkeypatch.setenv("ORCHARD_SANDBOX_TOKEN", "new-name")  # the new name wins over the old one
    assert ServiceConfig(state_dir=tmp_path).resolve_token()[0] == "new-name"
    monkeypatch.delenv("ORCHARD_SANDBOX_TOKEN")
    monkeypatch.delenv("ORCHARD_TOKEN")
    assert ServiceConfig(state_dir=tmp_path, token="by-name").resolve_token()[0] == "by-name"
    token_file = tmp_path / "tok"
    token_file.write_text("from-file\n")
    assert ServiceConfig(state_dir=tmp_path, token_file=token_file).resolve_token()[0] == "from-file"
    token_file.write_text("")
    with pytest.raises(ValueError, match="empty"):
        ServiceConfig(state_dir=tmp_path, token_file=token_file).resolve_token()
    generated, source = ServiceConfig(state_dir=tmp_path / "fresh").resolve_token()
    assert len(generated) >= 32 and "generated" in source
    path = tmp_path / "fresh" / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ServiceConfig(state_dir=tmp_path / "fresh").resolve_token()[0] == generated  # stable across restarts


def test_unisolated_is_only_for_the_local_backend():
    with pytest.raises(ValidationError, match="unisolated"):
        ServiceConfig(backend="kubernetes", unisolated=True)
