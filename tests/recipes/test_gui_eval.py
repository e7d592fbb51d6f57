"""GUI held-out results through the evaluate stage (slow; prints the figures the issue asks for):
the scripted teacher at error rate 0 and 0.3, k=3 attempts per task, logged to MLflow.
Writes build/recipe_results/gui_eval.json.

    .venv/bin/python -m pytest -q -m slow tests/recipes/test_gui_eval.py -s
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.core.episode.harness import HarnessConfig
from components.core.data.parquet_store import TaskStore
from components.core.tracking import TrackingConfig
from components.evaluate import EvalConfig, evaluate
from components.recipes import get_recipe

OUT = Path(__file__).parents[2] / "build/recipe_results/gui_eval.json"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_gui_teacher_heldout_pass_at_k(sandbox_service, tmp_path):
    TaskStore(tmp_path / "tasks").write(get_recipe("gui").tasks("heldout", 6))
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="gui-eval")
    results = {}
    for error_rate in (0.0, 0.3):
        config = EvalConfig(
            recipe="gui",
            policy="scripted",
            scripted_error_rate=error_rate,
            k=3,
            seed=0,
            harness=HarnessConfig(max_steps=24),
            sandbox=sandbox_service.connection(),
            workers=2,
        )
        result = evaluate(config, tmp_path / "tasks", None, tmp_path / f"eval-{error_rate}", tracking=tracking)
        assert result.infra_errors == 0 and result.attempts == 18
        results[f"teacher_e{error_rate}"] = {
            k: getattr(result, k) for k in ("pass_at_1", "pass_at_k", "resolved_rate", "mean_steps", "infra_error_rate")
        }
    assert results["teacher_e0.0"]["pass_at_1"] == 1.0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
