"""notebooks/compare_runs.ipynb executes headless against a small MLflow store logged here."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from components.core.tracking import (
    TrackingConfig, close_detached_run, close_pipeline_run, log_metrics, open_detached_run, open_pipeline_run, stage_run,
)
from pipelines.config import PipelineConfig

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "compare_runs.ipynb"

# (sft mode, rl sampler, seed) -> held-out resolved rates (untrained, sft, rl); RL informative groups / trajectory
ARMS = {
    ("resolved_only", "fixed", 0): ((0.0, 0.25, 0.25), 0.20),
    ("resolved_only", "bar", 1): ((0.0, 0.35, 0.40), 0.45),
    ("credited", "fixed", 0): ((0.0, 0.50, 0.50), 0.25),
    ("credited", "bar", 1): ((0.0, 0.60, 0.70), 0.50),
}


def _log_store(uri: str) -> None:
    for (mode, sampler, seed), ((untrained, sft, rl), informative) in ARMS.items():
        config = PipelineConfig.preset_config("tiny", seed=seed, sft={"mode": mode}, rl={"rollout": {"sampler": sampler}})
        tracking = TrackingConfig(tracking_uri=uri, experiment="orchard")
        parent = open_pipeline_run(tracking, f"{mode}-{sampler}-{seed}", config)
        child = tracking.model_copy(update={"parent_run_id": parent})
        with stage_run("sft", config.sft, child):
            for step in range(5):
                log_metrics({"loss": 3.0 - 0.4 * step}, step=step)
        with stage_run("rl", config.rl, child):
            for step in range(3):
                log_metrics({"reward_mean_all": -0.5 + 0.3 * step}, step=step)  # as components/rl/stage.py names it
            log_metrics({"informative_groups_per_trajectory": informative})
        with stage_run("evaluate", config.evaluate, child):
            log_metrics({"resolved_rate": rl})
        import mlflow

        client = mlflow.MlflowClient(uri)
        for policy, value in (("untrained", untrained), ("sft", sft), ("rl", rl)):
            client.log_metric(parent, f"heldout_resolved_rate.{policy}", value)
        close_pipeline_run(tracking, parent)


def test_compare_runs_notebook_executes(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _log_store(uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("ORCHARD_EXPERIMENT", "orchard")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    def text(i: int) -> str:
        return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in nb.cells[i].get("outputs", []))

    outputs = [text(i) for i in range(len(nb.cells))]
    joined = "\n".join(outputs)
    assert "runs in experiment 'orchard'" in joined
    sft_arms = next(o for o in outputs if "arm" in o and "credited" in o and "count" in o)
    assert "0.55" in sft_arms and "0.30" in sft_arms, sft_arms  # means over the two seeds of each arm
    rollout = next(o for o in outputs if "heldout_rl" in o and "sampler" in o)
    assert "0.475" in rollout and "0.225" in rollout, rollout  # informative groups per trajectory
    assert "3 stage runs" in joined
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert images >= 4, "every comparison draws a plot"


def _log_ablation(uri: str, arms: dict[str, list[float]]) -> None:
    """The SFT ablation's run layout (components/sft/ablation/run.py): parent, one run per arm, an `sft`
    child per seed with its loss curve (written by run id, as its worker processes do)."""
    from components.sft.stage import SFTConfig

    tracking = TrackingConfig(tracking_uri=uri, experiment="sft-ablation")
    parent = open_detached_run("sft-ablation", None, tracking)
    child = tracking.model_copy(update={"parent_run_id": parent})
    for arm, losses in arms.items():
        arm_run = open_detached_run(f"ablation-arm-{arm}", None, child, run_name=f"arm-{arm}")
        sft = open_detached_run("sft", SFTConfig(mode=arm), child.model_copy(update={"parent_run_id": arm_run}))
        close_detached_run(sft, child, [("loss", loss, step) for step, loss in enumerate(losses)])
        close_detached_run(arm_run, child, [("heldout_pass_at_1", 0.5, 0)])
    close_detached_run(parent, tracking, [])


def test_notebook_opened_from_notebooks_finds_the_repo_store_and_overlays_the_arms(tmp_path, monkeypatch):
    """Jupyter starts the kernel in notebooks/: the default store must be <repo>/runs/mlflow.db, not
    notebooks/runs/mlflow.db (which MLflow would silently create empty)."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[project]\nname = 'orchard'\n")
    shutil.copy(NOTEBOOK, repo / "notebooks" / NOTEBOOK.name)
    (repo / "runs").mkdir()
    uri = f"sqlite:///{repo / 'runs' / 'mlflow.db'}"
    _log_store(uri)
    _log_ablation(uri, {"resolved_only": [3.0, 2.5, 2.25], "credited": [3.0, 2.0, 1.5, 1.125]})
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("ORCHARD_EXPERIMENT", raising=False)
    monkeypatch.delenv("ORCHARD_ABLATION_TRACKING_URI", raising=False)
    nb = nbformat.read(repo / "notebooks" / NOTEBOOK.name, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(repo / "notebooks")}}).execute()
    assert not (repo / "notebooks" / "runs").exists()  # nothing created beside the notebook
    out = "\n".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert f"runs in experiment 'orchard' at {uri}" in out
    assert "ablation sft loss | credited | 4 steps | last 1.125" in out
    assert "ablation sft loss | resolved_only | 3 steps | last 2.250" in out
    assert out.count("pipeline sft loss | credited | 5 steps") == 2  # both seeds of the arm, one line each
    assert out.count("pipeline rl reward | bar | 3 steps") == 2
    last = nb.cells[-1].get("outputs", [])
    assert any("image/png" in o.get("data", {}) for o in last), "the overlay is drawn"
