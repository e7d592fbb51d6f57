"""The init-policy stage: the model every arm starts from (the untrained arm, SFT's start).

One path to a starting model: the registry's champion (retrain.start_from=champion, when one is registered),
else the configured checkpoint (model.path, a named model) or the tiny model built from scratch with its
tokenizer (`components.tiny_model`). Its parameter count is the stage's metric.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from components.core.policy.modeling import InitPolicyConfig
from components.promote.decision import PromotionConfig


class InitConfig(BaseModel):
    """The init-policy stage's config: the base model, or the champion to start from."""

    model_config = ConfigDict(extra="forbid")
    model: InitPolicyConfig
    start_from: str = Field("base", description="base | champion (retrain.start_from).")
    promotion: PromotionConfig
    enabled: bool = True


STARTED_FROM = "started_from.json"  # written next to a model that is a downloaded champion


def start_model(config: InitConfig, tracking, out: Path) -> str | None:
    """With start_from=champion and a champion in the registry: its weights into `out`; its URI, else None."""
    import shutil

    from components.promote.decision import current_champion, download_champion

    if config.start_from != "champion" or not config.enabled:
        return None
    if tracking is None or not tracking.enabled:
        raise RuntimeError("retrain.start_from=champion needs MLflow (the registry holds the champion)")
    version = current_champion(tracking.tracking_uri, config.promotion)
    if version is None:
        return None  # the first retraining run: nothing to start from but the base model
    src = download_champion(tracking.tracking_uri, version, out.parent / f"{out.name}-download")
    shutil.copytree(src, out, dirs_exist_ok=True)
    uri = f"models:/{config.promotion.model_name}/{version.version}"
    (out / STARTED_FROM).write_text(json.dumps({"model": uri}))
    return uri


def init_policy(config: InitConfig, out: Path, tracking) -> dict:
    """The starting model into `out`; the result names where it came from and its parameter count."""
    from components import tiny_model
    from components.core.policy import modeling
    from components.core.tracking import log_metrics, stage_run

    with stage_run("init-policy", config, tracking):
        started_from = start_model(config, tracking, out)
        if started_from is None:  # the configured checkpoint (model.path) or the tiny model
            tiny_model.init_policy(config.model, config.model.tiny, out)
        params = float(modeling.checkpoint_parameters(out))
        log_metrics({"num_parameters": params})
    return {"model_dir": str(out), "started_from": started_from or "base", "metrics": {"num_parameters": params}}
