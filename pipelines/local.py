"""Run the whole DAG on this machine: the embedded default behind `make demo`.

The same step functions as the KFP components and the Argo steps (`pipelines.steps.run_step`), in
DAG order, with the artifact layout of `pipelines/layout.py` under `runs/<timestamp>/`:

    provision -> distill -> credit -> sft -> rl -> evaluate(untrained, sft, rl [, teacher]) -> report

A real sandbox service runs for the duration (`EmbeddedService`, loopback). One MLflow parent run
stays RUNNING from the first step to the report, which closes it; every stage opens its child run
under it. A stage whose module is not installed is reported as not run (with its dependents), so
the runner works while stages are still being written; any other failure fails the run and marks
the parent run FAILED.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from components.core.tracking import close_pipeline_run, open_pipeline_run
from pipelines.config import PipelineConfig
from pipelines.layout import RunLayout
from pipelines.report import RunReport
from pipelines.steps import StepContext, finish_pipeline, run_step, tracking_uri_for

# (step name, evaluate arm, module it needs, steps it depends on)
PLAN: list[tuple[str, str | None, str | None, tuple[str, ...]]] = [
    ("provision", None, "components.provision", ()),
    ("init-policy", None, "components.core.modeling", ()),
    ("distill", None, "components.distill", ("provision",)),
    ("credit", None, "components.credit", ("distill",)),
    ("sft", None, "components.sft", ("credit", "init-policy")),
    ("rl", None, "components.rl", ("sft",)),
    ("evaluate-teacher", "teacher", "components.evaluate", ("provision",)),
    ("evaluate-untrained", "untrained", "components.evaluate", ("provision", "init-policy")),
    ("evaluate-sft", "sft", "components.evaluate", ("sft",)),
    ("evaluate-rl", "rl", "components.evaluate", ("rl",)),
]


class LocalRunResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_dir: str = Field(description="The run directory (artifacts, results, report.md).")
    tracking_uri: str = Field(description="MLflow store the run was logged to.")
    parent_run_id: str = Field(description="The MLflow parent run.")
    stages_ran: list[str] = Field(description="Steps that ran, in order.")
    stages_skipped: list[str] = Field(description="Steps that did not run, with the reason.")
    stage_seconds: dict[str, float] = Field(description="Wall time per step.")
    wall_seconds: float = Field(description="Wall time of the whole run, service start included.")
    report: RunReport
    markdown: str = Field(description="The results table as Markdown.")


def _have(module: str | None) -> bool:
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def run_local(config: PipelineConfig, runs_dir: str | Path = "runs", *, console: Any = None,
              service: Any = None) -> LocalRunResult:
    """Run the pipeline in this process against a local sandbox service; returns what it produced.

    `service`: an already running EmbeddedService to reuse (tests); else one is started and stopped.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = console or Console()
    t_start = time.perf_counter()
    layout = RunLayout.new(runs_dir)
    layout.root.mkdir(parents=True, exist_ok=False)
    config = config.model_copy(update={"tracking_uri": tracking_uri_for(config, layout.root)})
    layout.config.write_text(config.model_dump_json(indent=2))

    own_service = service is None
    if own_service:
        from sandbox_service.embedded import EmbeddedService

        service = EmbeddedService()
        service.start()
    try:
        config = config.model_copy(update={"sandbox_url": service.url})
        ctx = StepContext(config, None, sandbox=service.connection())
        parent = open_pipeline_run(ctx.tracking_config, f"local-{config.preset}-{layout.root.name}", config,
                                   tags={"orchard.preset": config.preset, "orchard.recipe": config.recipe,
                                         "orchard.runner": "local", "orchard.run_dir": str(layout.root)})
        ctx.parent_run_id = parent
        console.print(f"[bold]orchard[/] {config.preset} run -> {layout.root}  (MLflow {config.tracking_uri}, "
                      f"parent run {parent})")
        ran: list[str] = []
        skipped: list[str] = []
        seconds: dict[str, float] = {}
        try:
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                          TimeElapsedColumn(), console=console, transient=False) as progress:
                bar = progress.add_task("pipeline", total=len(PLAN) + 1)
                for name, arm, module, deps in PLAN:
                    missing = [d for d in deps if d not in ran]
                    if arm == "teacher" and not config.eval.include_teacher:
                        skipped.append(f"{name} (eval.include_teacher is off)")
                    elif not _have(module):
                        skipped.append(f"{name} ({module} not present)")
                    elif missing:
                        skipped.append(f"{name} (needs {', '.join(missing)})")
                    else:
                        progress.update(bar, description=f"[cyan]{name}")
                        t0 = time.perf_counter()
                        run_step("evaluate" if arm else name, layout, ctx, arm=arm)
                        seconds[name] = time.perf_counter() - t0
                        ran.append(name)
                        progress.console.print(f"  [green]done[/] {name} in {seconds[name]:.1f} s")
                    progress.advance(bar)
                progress.update(bar, description="[cyan]report")
                result = _report(layout, ctx, service, ran, skipped, seconds)
                progress.advance(bar)
        except BaseException:
            close_pipeline_run(ctx.tracking_config, parent, status="FAILED")
            raise
    finally:
        if own_service:
            service.stop()
    run_report, markdown = result
    layout.report.write_text(markdown)
    from pipelines.report import to_rich

    console.print(to_rich(run_report))
    console.print(markdown.split("\n\n", 1)[1] if "\n\n" in markdown else "")
    return LocalRunResult(run_dir=str(layout.root), tracking_uri=config.tracking_uri, parent_run_id=parent,
                          stages_ran=ran, stages_skipped=skipped, stage_seconds=seconds,
                          wall_seconds=time.perf_counter() - t_start, report=run_report, markdown=markdown)


def _report(layout: RunLayout, ctx: StepContext, service: Any, ran: list[str], skipped: list[str],
            seconds: dict[str, float]):
    import json

    from pipelines.service_metrics import exec_latency

    def read(step: str) -> dict | None:
        path = layout.result_path(step)
        return json.loads(path.read_text()) if path.exists() else None

    evals = {arm: r for arm in ("teacher", "untrained", "sft", "rl") if (r := read(f"evaluate-{arm}")) is not None}
    final = next((d for d, step in ((layout.rl_model, "rl"), (layout.sft_model, "sft")) if step in ran), None)
    return finish_pipeline(ctx, distill_result=read("distill"), eval_results=evals, final_model_dir=final,
                           exec_latency=exec_latency(service.url, service.token), stage_seconds=seconds,
                           stages_skipped=skipped,
                           stores={"trajectories": layout.trajectories, "credited": layout.credited})


def run_kfp_local(config: PipelineConfig, runs_dir: str | Path = "runs", *, service: Any = None) -> dict[str, Any]:
    """Run the compiled-pipeline path through `kfp.local` (SubprocessRunner, no venv, no Docker).

    Each component runs as its own Python subprocess through KFP's executor, reading and writing
    KFP artifacts under `<run dir>/kfp`: this exercises the lightweight-component path (component
    interfaces, artifact passing, the executor) that a cluster runs. Kubernetes settings do not
    apply locally (kfp.local ignores them) and the PVC and exit-handler steps are left out.
    Returns the run dir, the MLflow URI and parent run id, and the report's Markdown table.
    """
    import uuid

    import kfp.local
    import mlflow

    from pipelines.kfp_pipeline import build_pipeline

    layout = RunLayout.new(runs_dir)
    layout.root.mkdir(parents=True, exist_ok=False)
    config = config.model_copy(update={"tracking_uri": tracking_uri_for(config, layout.root)})
    layout.config.write_text(config.model_dump_json(indent=2))
    label = f"kfp-local-{uuid.uuid4().hex[:12]}"
    own_service = service is None
    if own_service:
        from sandbox_service.embedded import EmbeddedService

        service = EmbeddedService()
        service.start()
    old_token = os.environ.get("ORCHARD_SANDBOX_TOKEN")
    os.environ["ORCHARD_SANDBOX_TOKEN"] = service.token  # what a Secret provides on the cluster
    t0 = time.perf_counter()
    try:
        kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(layout.root / "kfp"))
        pipeline = build_pipeline(config, for_cluster=False)
        pipeline(sandbox_url=service.url, mlflow_uri=config.tracking_uri, image=config.images.stage,
                 gpu_image=config.images.gpu, overrides_json=config.model_dump_json(), run_label=label)
    finally:
        if old_token is None:
            os.environ.pop("ORCHARD_SANDBOX_TOKEN", None)
        else:
            os.environ["ORCHARD_SANDBOX_TOKEN"] = old_token
        if own_service:
            service.stop()
    client = mlflow.MlflowClient(config.tracking_uri)
    experiment = client.get_experiment_by_name(config.experiment)
    parents = client.search_runs([experiment.experiment_id], filter_string=f"tags.`orchard.run_label` = '{label}'")
    if len(parents) != 1:
        raise RuntimeError(f"expected one MLflow parent run labelled {label}, found {len(parents)}")
    parent = parents[0]
    report = client.download_artifacts(parent.info.run_id, "report.md", str(layout.root))
    return {"run_dir": str(layout.root), "tracking_uri": config.tracking_uri, "parent_run_id": parent.info.run_id,
            "markdown": Path(report).read_text(), "wall_seconds": time.perf_counter() - t0}
