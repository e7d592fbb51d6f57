"""Run the whole DAG on this machine: the embedded default behind `make demo`.

The rows of the stage table (`pipelines/stages.py`) in order, each through `pipelines.steps.run_stage`
like the KFP components and the Argo steps, with the artifact layout of `pipelines/layout.py` under
`runs/<timestamp>/`: start -> the stages -> report.

The sandbox service: `config.sandbox_url` when given (token from ORCHARD_SANDBOX_TOKEN; the run stops
at once if it does not answer), else a real service on loopback for the run's duration
(`EmbeddedService`). One MLflow parent run stays RUNNING from start to report, which closes it; every
stage opens its child run under it. A failing stage fails the run and marks the parent and the stage's run
FAILED, with the reason (`orchard.failure_reason`). Ctrl-C or SIGTERM ends the current stage (its episodes
delete their sandboxes), stops the embedded service and marks the runs KILLED; a second one exits at once
(`components/core/interrupts.py`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_service.connection import SandboxConnection
from components.core.interrupts import FORWARDED_STOP, RunInterrupted, raise_if_stopping, stop_on_signals, stopping
from components.core.tracking import FAILURE_REASON_TAG, fail_pipeline_run, open_pipeline_run
from pipelines import stages
from pipelines.config import PipelineConfig
from pipelines.layout import RunLayout
from pipelines.preflight import preflight
from pipelines.report import RunReport
from pipelines.steps import StepContext, parent_run_tags, report_in_layout, run_in_layout, tracking_uri_for


class LocalRunResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_dir: str = Field(description="The run directory (artifacts, results, report.md).")
    tracking_uri: str = Field(description="MLflow store the run was logged to.")
    parent_run_id: str = Field(description="The MLflow parent run.")
    stages_ran: list[str] = Field(description="Stages that ran, in order (the stage table's names).")
    stage_seconds: dict[str, float] = Field(description="Wall time per stage.")
    wall_seconds: float = Field(description="Wall time of the whole run, service start included.")
    report: RunReport
    markdown: str = Field(description="The results table as Markdown.")


class SandboxUnreachable(RuntimeError):
    """The configured sandbox_url does not answer: the run refuses to start."""


def external_connection(url: str) -> SandboxConnection:
    """The configured service, checked before any stage runs (token from ORCHARD_SANDBOX_TOKEN)."""
    connection = SandboxConnection(url=url)
    try:
        with connection.client() as client:
            client.healthz()
    except Exception as err:
        raise SandboxUnreachable(
            f"sandbox_url {url} does not answer ({type(err).__name__}: {err}); start the "
            "service there, or leave sandbox_url unset to run one locally"
        ) from err
    return connection


def run_local(
    config: PipelineConfig, runs_dir: str | Path = "runs", *, console: Any = None, quiet: bool = False
) -> LocalRunResult:
    """Run the pipeline in this process; returns what it produced. `quiet`: the quiet console of
    `components.core.console` (the CLI's default; `--verbose` turns it off)."""
    from tqdm.auto import tqdm

    from pipelines import estimate
    from pipelines.report import to_rich
    from pipelines.run_console import make_console, stage_note, time_left
    from pipelines.service_metrics import exec_latency

    console = console or make_console()
    t_start = time.perf_counter()
    preflight(config)  # everything external the config names: a run that cannot work fails now, in seconds
    names = [stage.name for stage in stages.STAGES]
    planned = estimate.estimate(config, names, Path(runs_dir))
    console.print(estimate.summary(planned, config))
    schedule = estimate.Schedule(planned)
    if quiet:
        from components.core.console import quiet as quiet_console

        quiet_console()
    services: list[Any] = []  # the embedded service, for a second Ctrl-C (stop_on_signals)

    def stop_services() -> None:
        for s in services:
            s.request_stop()

    with stop_on_signals(on_force_exit=stop_services):
        if config.sandbox_url:
            connection = external_connection(config.sandbox_url)
        else:
            from sandbox_service.embedded import EmbeddedService

            services.append(EmbeddedService())
            services[0].start()
            connection = services[0].connection()
        try:
            layout = RunLayout.new(runs_dir)
            layout.root.mkdir(parents=True, exist_ok=False)
            config = config.updated(tracking_uri=tracking_uri_for(config, layout.root))
            layout.config.write_text(config.model_dump_json(indent=2))
            ctx = StepContext(config, None, sandbox=connection)
            parent = open_pipeline_run(
                ctx.tracking_config,
                f"local-{config.preset}-{layout.root.name}",
                config,
                tags=parent_run_tags(config, **{"orchard.runner": "local", "orchard.run_dir": str(layout.root)}),
            )
            ctx.parent_run_id = parent
            console.print(
                f"[bold]orchard[/] {config.preset} run -> {layout.root}  (MLflow {config.tracking_uri}, "
                f"parent run {parent}; sandboxes at {connection.url})"
            )
            ran: list[str] = []
            seconds: dict[str, float] = {}
            current: str | None = None  # the stage running now (named on the parent run if it fails)
            clock: dict[str, Any] = {}  # the stage running now and when it started, for the time-left column
            try:
                # The project's one progress library (tqdm, as the stages' bars and the Hugging Face stack's):
                # the run's lines print above the bar (`external_write_mode`), the stages' bars nest below it.
                with tqdm(total=len(stages.STAGES) + 1, desc="pipeline", unit="stage", dynamic_ncols=True) as bar:

                    def say(line: str) -> None:
                        with tqdm.external_write_mode():
                            console.print(line)

                    for stage in stages.STAGES:
                        bar.set_description(stage.name)
                        t0, c0 = time.perf_counter(), time.process_time()
                        clock.update(stage=stage.name, started=time.monotonic())
                        bar.set_postfix_str(time_left(schedule, clock))
                        current = stage.name  # a stop request now stops the run before this stage
                        raise_if_stopping()
                        record = run_in_layout(stage.name, layout, ctx)
                        current = None
                        seconds[stage.name] = time.perf_counter() - t0
                        ran.append(stage.name)
                        schedule.finish(stage.name, seconds[stage.name])
                        estimate.record(Path(runs_dir), config, stage.name, seconds[stage.name])
                        left = schedule.left()
                        note = stage_note(stage.name, record)
                        # CPU time of this process (all its threads; not the sandbox service's): on a shared
                        # machine it says what the stage costs where wall time only says how busy the machine was.
                        say(
                            f"  [green]done[/] {stage.name} in {seconds[stage.name]:.1f} s (CPU "
                            f"{time.process_time() - c0:.1f} s){': ' + note if note else ''}"
                            + (f"; ~{estimate.duration(left)} left" if left else "")
                        )
                        bar.update(1)
                    bar.set_description(stages.REPORT)
                    clock.update(stage=stages.REPORT, started=time.monotonic())
                    bar.set_postfix_str(time_left(schedule, clock))
                    current = stages.REPORT
                    run_report, markdown = report_in_layout(
                        layout, ctx, exec_latency=exec_latency(connection.url, connection.token), stage_seconds=seconds
                    )
                    bar.update(1)
            except BaseException as err:
                status = fail_pipeline_run(ctx.tracking_config, parent, err, stage=current)
                console.print(
                    f"[red]{status}[/] at {current or 'a stage boundary'}: MLflow parent run {parent} "
                    f"and the runs under it marked {status} ({FAILURE_REASON_TAG} says why)"
                )
                raise
        finally:
            for service in services:
                service.stop()
    console.print(to_rich(run_report, width=console.width))
    console.print(markdown.split("\n\n", 1)[1] if "\n\n" in markdown else "")
    return LocalRunResult(
        run_dir=str(layout.root),
        tracking_uri=config.tracking_uri,
        parent_run_id=parent,
        stages_ran=ran,
        stage_seconds=seconds,
        wall_seconds=time.perf_counter() - t_start,
        report=run_report,
        markdown=markdown,
    )


def run_kfp_local(config: PipelineConfig, runs_dir: str | Path = "runs") -> dict[str, Any]:
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

    from pipelines.kfp.pipeline import build_pipeline

    preflight(config)  # the files too: the components run here, on this machine's paths
    layout = RunLayout.new(runs_dir)
    layout.root.mkdir(parents=True, exist_ok=False)
    config = config.updated(tracking_uri=tracking_uri_for(config, layout.root))
    layout.config.write_text(config.model_dump_json(indent=2))
    label = f"kfp-local-{uuid.uuid4().hex[:12]}"
    service = None
    if config.sandbox_url:
        url, token = config.sandbox_url, external_connection(config.sandbox_url).token
    else:
        from sandbox_service.embedded import EmbeddedService

        service = EmbeddedService()
        service.start()
        url, token = service.url, service.token
    old_token = os.environ.get("ORCHARD_SANDBOX_TOKEN")
    if token:
        os.environ["ORCHARD_SANDBOX_TOKEN"] = token  # what a Secret provides on the cluster
    t0 = time.perf_counter()
    keep = {service._proc.pid} if service is not None and service._proc is not None else set()

    signalled: set[int] = set()
    main = threading.main_thread().ident
    assert main is not None  # the main thread has started: it is running this

    def interrupt(signum: int, _frame: object) -> None:  # SIGUSR1, sent by `forward` below to this thread
        raise_if_stopping()

    def stop(signum: int) -> None:
        # The running component (a process below this one) ends its stage as the local runner would
        # (sandboxes deleted, its MLflow run KILLED) while kfp.local keeps reading its output; a component
        # that starts meanwhile (kfp.local retries a failed task) is stopped at once. When none is left, the
        # main thread is interrupted wherever kfp.local has it (waiting, or sleeping before a retry).
        def forward() -> None:
            while stopping():
                live = set(_descendants(keep))
                for pid in live - signalled:
                    signalled.add(pid)
                    if _is_component(pid):
                        try:
                            os.kill(pid, FORWARDED_STOP)
                        except ProcessLookupError:
                            pass
                if not live:
                    signal.pthread_kill(main, signal.SIGUSR1)
                    return
                time.sleep(0.05)

        threading.Thread(target=forward, name="forward-stop", daemon=True).start()

    previous_usr1 = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with stop_on_signals(
            on_force_exit=lambda: service.request_stop() if service is not None else None, on_stop=stop
        ):
            kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(layout.root / "kfp"))
            pipeline = build_pipeline(for_cluster=False)
            try:
                pipeline(
                    preset=config.preset,
                    recipe=config.recipe,
                    seed=config.seed,
                    sandbox_url=url,
                    mlflow_uri=config.tracking_uri,
                    experiment=config.experiment,
                    overrides_json=config.model_dump_json(exclude={"sandbox_url", "tracking_uri"}),
                    run_label=label,
                )
            except Exception:
                if not stopping():
                    raise
            raise_if_stopping()  # a stop that came while the last component ended
    except RunInterrupted as err:
        _wait_children(keep, timeout=120)
        _kill_parent_run(config, label, err)
        raise
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
        if old_token is None:
            os.environ.pop("ORCHARD_SANDBOX_TOKEN", None)
        else:
            os.environ["ORCHARD_SANDBOX_TOKEN"] = old_token
        if service is not None:
            service.stop()
    client = mlflow.MlflowClient(config.tracking_uri)
    experiment = client.get_experiment_by_name(config.experiment)
    if experiment is None:
        raise RuntimeError(f"expected one MLflow parent run labelled {label}, found no experiment {config.experiment}")
    parents = client.search_runs([experiment.experiment_id], filter_string=f"tags.`orchard.run_label` = '{label}'")
    if len(parents) != 1:
        raise RuntimeError(f"expected one MLflow parent run labelled {label}, found {len(parents)}")
    parent = parents[0]
    report = client.download_artifacts(parent.info.run_id, "report.md", str(layout.root))
    return {
        "run_dir": str(layout.root),
        "tracking_uri": config.tracking_uri,
        "parent_run_id": parent.info.run_id,
        "markdown": Path(report).read_text(),
        "wall_seconds": time.perf_counter() - t0,
    }


def _is_component(pid: int) -> bool:
    """A KFP component's executor process (not the shell kfp.local wraps it in)."""
    try:
        return b"executor_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wait_children(keep: set[int], timeout: float) -> None:
    """Wait until no process below this one lives but `keep` and theirs (the stopped component cleaning up)."""
    deadline = time.monotonic() + timeout
    while _descendants(keep) and time.monotonic() < deadline:
        time.sleep(0.1)


def _descendants(keep: set[int]) -> list[int]:
    """Live processes below this one, leaving out `keep` and everything below them (zombies have exited)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
                if state != "Z":
                    children.setdefault(int(ppid), []).append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    out, stack = [], [p for p in children.get(os.getpid(), []) if p not in keep]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack += [p for p in children.get(pid, []) if p not in keep]
    return out


def _kill_parent_run(config: PipelineConfig, label: str, err: RunInterrupted) -> None:
    """Mark the interrupted kfp.local run's parent MLflow run (and anything still running under it) KILLED."""
    import mlflow

    client = mlflow.MlflowClient(config.tracking_uri)
    experiment = client.get_experiment_by_name(config.experiment)
    if experiment is None:
        return
    for parent in client.search_runs([experiment.experiment_id], filter_string=f"tags.`orchard.run_label` = '{label}'"):
        fail_pipeline_run(StepContext(config, parent.info.run_id).tracking_config, parent.info.run_id, err)
