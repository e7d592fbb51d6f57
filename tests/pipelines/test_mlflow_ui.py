"""The MLflow UI on a finished micro run, in a real browser (Playwright driving Debian's Chromium).

The pages a researcher uses: the experiment opens on its training runs (not the GenAI pages), a run's
description, metrics and registered model, its artifacts, the episode traces (with their tags, turns numbered
from 1, the final diff with its + and - lines) and a registered version's card.
The store is a real local run's (`run_local`), served by `orchard ui` (`mlflow server`) on a free loopback port.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _register_sft_model(uri: str, run_dir: Path, parent: str) -> str:
    """The SFT model registered the way the gate registers a promoted one (card, signature, lineage)."""
    from components.promote import PromotionConfig, PromotionDecision, log_policy_model, model_card, promote

    decision = PromotionDecision(
        promoted=True,
        reason="promoted for the UI test",
        candidate_mean=1.0,
        champion_mean=0.0,
        difference=1.0,
        ci_low=0.2,
        ci_high=1.0,
        p_value=0.01,
        reference="start",
        tasks=3,
    )
    lineage = {
        "orchard.parent_model": "base (init-policy)",
        "orchard.pipeline_run_id": parent,
        "orchard.candidate_stage": "sft",
        "orchard.trained_shards": "part-00000.parquet",
    }
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(experiment_id=mlflow.MlflowClient(uri).get_run(parent).info.experiment_id):
        model_uri = log_policy_model(run_dir / "sft" / "model")
    return promote(
        uri,
        PromotionConfig(model_name="orchard-ui-policy"),
        model_uri,
        lineage,
        description=model_card(decision, lineage),
    )


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_the_pages_a_researcher_uses_show_what_the_run_logged(tmp_path, external_service, micro_config):
    from playwright.sync_api import sync_playwright

    from components.core.tracking import TrackingConfig, ui_link
    from pipelines.local import run_local

    # the teacher gets its full turn budget: its episode then ends with an edit, a diff to look at
    config = micro_config.updated(
        sandbox_url=external_service.url, traces={"sample_rate": 1.0}, evaluate_teacher={"harness": {"max_steps": 12}}
    )
    result = run_local(config, tmp_path / "runs")
    uri, parent = result.tracking_uri, result.parent_run_id
    version = _register_sft_model(uri, Path(result.run_dir), parent)
    client = mlflow.MlflowClient(uri)
    experiment = client.get_run(parent).info.experiment_id
    traces = client.search_traces(experiment_ids=[experiment])
    assert traces

    from pipelines.ui import serve

    def pages(link: str, _server) -> int:  # `orchard ui` is serving the run's store on a free port
        base = link.split("/#/")[0]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000})

            def show(path: str, *texts: str) -> str:
                page.goto(f"{base}/#{path}")
                for text in texts:
                    page.get_by_text(text, exact=False).first.wait_for(timeout=30_000)
                return page.inner_text("body")

            # the link `orchard ui` prints opens the training pages (MLflow 3.17 ignores the experiment's kind
            # while its GenAI/training switch is on: the link sets it), here for the whole experiment
            assert link == ui_link(TrackingConfig(tracking_uri=base), experiment)
            body = show("/" + link.split("/#/", 1)[1], "Model registry", "local-tiny-")
            assert f"/experiments/{experiment}/runs?workflowType=machine_learning" in page.url, page.url
            assert "swe-heldout" in body and "swe-train" in body  # the task sets, with their digests
            # a run: its description (preset, model, data, commit) and metrics
            body = show(f"/experiments/{experiment}/runs/{parent}", "orchard tiny run", "heldout.resolved_rate")
            assert "data: swe tasks generated from seed 0" in body and "git commit" in body
            # the version the gate registers belongs to this run: its "Registered models" lists it
            registered = body.split("Registered models", 1)[1][:300]
            assert "orchard-ui-policy" in registered and "None" not in registered.split("Description")[0], registered
            # its artifacts, and the report rendered
            show(f"/experiments/{experiment}/runs/{parent}/artifacts", "report.md", "results_table.json")
            page.get_by_text("report.md").first.click()
            page.get_by_text("Held-out", exact=False).first.wait_for(timeout=30_000)
            # the traces: one row per traced episode with its tags; one opens turn by turn
            show(f"/experiments/{experiment}/traces", traces[0].info.tags["orchard.task"])
            assert "orchard.outcome: " in page.content()  # the tags column (its cells ellipsize)
            # the scripted teacher's episode: it always edits, so its verification holds a diff
            teacher = next(t for t in traces if t.info.tags["orchard.stage"] == "evaluate-teacher")
            show(f"/experiments/{experiment}/traces/{teacher.info.trace_id}", "episode", "turn 1", "verification")
            assert "turn 2" in page.inner_text("body") and "turn 0" not in page.inner_text("body")
            page.get_by_text("verification", exact=True).first.click()
            page.get_by_text("diff --git", exact=False).first.wait_for(timeout=30_000)
            lines = page.inner_text("body").splitlines()
            assert any(line.startswith("-") and not line.startswith("---") for line in lines), lines  # not bullets
            assert any(line.startswith("+") and not line.startswith("+++") for line in lines), lines
            # the registered version: its card
            show(f"/models/orchard-ui-policy/versions/{version}", "Agent policy trained by orchard", "Limits")
            browser.close()
        return 0

    assert serve(Path(result.run_dir).parent, port=0, browser=False, on_ready=pages) == 0
