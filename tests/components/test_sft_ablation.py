"""The ablation command end to end at toy scale: every arm trained in parallel jobs, evaluated, logged to MLflow."""

from __future__ import annotations

import json

import pytest

from components.core.modeling import ModelConfig, TokenizerConfig
from components.core.tracking import TrackingConfig
from components.credit import CreditConfig
from components.credit_mc import MonteCarloConfig
from components.sft import SFTConfig
from components.sft_ablation import ARMS, AblationConfig, run_ablation


def test_ablation_runs_every_arm_and_logs_each_as_an_mlflow_run(sandbox_service, tmp_path):
    import mlflow

    config = AblationConfig(
        train_tasks=4, heldout_tasks=1, seeds=[0, 1], teacher_error_rate=0.5, jobs=2,
        credit=CreditConfig(monte_carlo=MonteCarloConfig(k=1, stride=3, teacher_error_rate=0.2)),
        sft=SFTConfig(steps=2, batch_size=2, max_len=512, num_threads=1,
                      model=ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[]))),
        eval_max_steps=2, eval_max_new_tokens=16,
    )
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = TrackingConfig(tracking_uri=uri, experiment="ablation-test")
    work = tmp_path / "work"
    rows = run_ablation(config, work, sandbox_service.connection(), tracking)

    assert [r.arm for r in rows] == ["untrained", *ARMS]
    for row in rows:
        assert len(row.rates) == 2 and all(0.0 <= r <= 1.0 for r in row.rates)
        assert row.mean == pytest.approx(sum(row.rates) / 2)
    trained = {r.arm: r for r in rows if r.arm != "untrained"}
    # whole adds every unresolved trajectory, credited only their rising segments: never more loss tokens
    assert trained["whole"].loss_tokens >= trained["credited"].loss_tokens >= trained["resolved_only"].loss_tokens
    assert json.loads((work / "ablation_table.json").read_text())[0]["arm"] == "untrained"

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("ablation-test")
    runs = client.search_runs([experiment.experiment_id], max_results=500)
    by_id = {r.info.run_id: r for r in runs}
    (parent,) = [r for r in runs if r.info.run_name == "sft-ablation"]
    arm_runs = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                and r.info.run_name.startswith("arm-")}
    assert set(arm_runs) == {f"arm-{a}" for a in ("untrained", *ARMS)}
    for name, run in arm_runs.items():
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "heldout_resolved_rate")
        assert sorted(m.step for m in history) == [0, 1]
        assert "heldout_resolved_rate_mean" in run.data.metrics
        # the seeds' SFT and evaluation runs (made in worker processes) nest under their arm's run
        stages = sorted(r.data.tags.get("orchard.stage") for r in by_id.values()
                        if r.data.tags.get("mlflow.parentRunId") == run.info.run_id)
        expected = ["evaluate"] * 2 if name == "arm-untrained" else ["evaluate", "evaluate", "sft", "sft"]
        assert stages == expected, (name, stages)

    # A rerun resumes: finished arm/seed runs are kept, not retrained.
    weights = work / "models" / "credited" / "seed0" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    again = run_ablation(config, work, sandbox_service.connection(), tracking)
    assert [r.rates for r in again] == [r.rates for r in rows]
    assert weights.stat().st_mtime_ns == before
