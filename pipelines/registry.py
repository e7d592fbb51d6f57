"""Registering a trained policy in the MLflow model registry."""

from __future__ import annotations

from pathlib import Path


def register_policy_model(model_dir: str | Path, name: str) -> tuple[str, int | None]:
    """Log a `save_pretrained` directory as a pyfunc LoggedModel under the active run and register it.

    Returns (model_uri, registered version). Requirements are given explicitly so MLflow does not
    spend a minute inferring them from the environment.
    """
    import mlflow

    if mlflow.active_run() is None:
        raise RuntimeError("register_policy_model needs an active MLflow run (use tracking.resume_run)")
    if not (Path(model_dir) / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} is not a save_pretrained directory (no config.json)")
    info = mlflow.pyfunc.log_model(
        name="policy",
        python_model=str(Path(__file__).resolve().parents[1] / "components" / "policy_pyfunc.py"),
        artifacts={"model_dir": str(model_dir)},
        pip_requirements=["torch", "transformers"],
        registered_model_name=name,
    )
    return info.model_uri, info.registered_model_version
