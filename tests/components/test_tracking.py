"""MLflow tracking helpers: what is masked, where artifacts go, how runs nest."""

from __future__ import annotations

from pydantic import BaseModel

from components.core.tracking import TrackingConfig, config_params, log_json, stage_run


class _Endpoint(BaseModel):
    token: str | None = "s3cret"
    hf_token: str = "hf_abc"
    db_password: str = "pw"
    api_key: str = "k"
    api_key_env: str = "OPENAI_API_KEY"  # the *name* of a variable, not its value


class _Config(BaseModel):
    max_new_tokens: int = 256
    max_prompt_tokens: int = 1024
    tokenizer: str = "bpe"
    endpoint: _Endpoint = _Endpoint()


def test_only_secrets_are_masked():
    params = config_params(_Config())
    assert params["max_new_tokens"] == 256 and params["max_prompt_tokens"] == 1024
    assert params["tokenizer"] == "bpe"
    assert params["endpoint.api_key_env"] == "OPENAI_API_KEY"
    for key in ("endpoint.token", "endpoint.hf_token", "endpoint.db_password", "endpoint.api_key"):
        assert params[key] == "***", key


def test_artifacts_live_beside_the_sqlite_store_not_in_the_working_directory(tmp_path, monkeypatch):
    import mlflow

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    store = tmp_path / "store"
    store.mkdir()
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{store}/mlflow.db", experiment="where")
    with stage_run("stage", _Config(), tracking) as run:
        log_json({"a": 1}, "thing.json")
    artifact_uri = mlflow.MlflowClient(tracking.tracking_uri).get_run(run.info.run_id).info.artifact_uri
    assert artifact_uri.startswith((store / "mlflow-artifacts").as_uri())
    assert not (cwd / "mlruns").exists()
    assert list((store / "mlflow-artifacts").rglob("thing.json"))


def test_the_ui_command_opens_the_same_store(tmp_path):
    from components.core.tracking import ui_command

    local = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/runs.db")
    assert ui_command(local) == f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/runs.db"
    assert "http://mlflow:5000" in ui_command(TrackingConfig(tracking_uri="http://mlflow:5000"))
