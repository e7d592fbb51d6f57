"""`orchard`: compile the pipelines, run them locally, show the config, schedule them.

    orchard run [--preset quick] [--config F] [--set sft.steps=400] [--kfp-local] [--retrain] [--verbose]
                                                                  the whole DAG here (plain `orchard run`: quick)
    orchard demo                                                  = orchard run --preset demo (`make demo`)
    orchard check [--preset P] [--config F] [--set ...]           the run's checks only (endpoints, store, files)
    orchard ui [--runs-dir runs] [--port 5000] [--run ID]         the MLflow UI on the runs' store, on its runs table
    orchard config show [--preset P] [--set ...]                  the resolved PipelineConfig
    orchard compile --out build/pipelines [--image-registry R | --overlay manifests/overlays/prod] [--set ...]
                                                                  KFP YAML + Argo WorkflowTemplate/CronWorkflow
    orchard make-checkpoint --out DIR [--family chatml]           a small local checkpoint (Qwen vocabulary, tools)
    orchard fake-teacher --tasks F [--port 8011]                  an OpenAI-compatible teacher for a tasks file
    orchard export tokens --trajectories DIR --model M --out F    the token-level dataset (also: export openai)
    orchard schedule --host URL --cron "0 3 * * 0" --package build/pipelines/orchard-training.kfp.yaml
                     [--namespace kubeflow] [--service-account orchard-pipeline]

A bad preset, --set, recipe or config file is reported as one line (exit 2), not a traceback; so is a
KFP API that `orchard schedule` cannot reach (exit 1); any other error too (exit 1), with its traceback only
under --debug. Before the first stage, `orchard run` checks everything external its config names (MLflow
tracking URI, sandbox service, checkpoints, tasks file, endpoints: `pipelines/preflight.py`) in seconds, and
prints an estimate of the whole run (`pipelines/estimate.py`). Ctrl-C or SIGTERM stops `orchard run` cleanly
(exit 130 or 143; the current stage ends, its sandboxes are deleted, MLflow marks the runs KILLED); twice
exits at once. The console is quiet (one line per stage); `--verbose` shows every library warning and log.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# What plain `orchard run` and `orchard config show` run: the quick preset, minutes on a laptop, showing learning.
DEFAULT_PRESET = "quick"
KFP_FILE = "orchard-training.kfp.yaml"
ARGO_TEMPLATE_FILE = "orchard-training.workflowtemplate.yaml"
ARGO_CRON_FILE = "orchard-retrain.cronworkflow.yaml"


def compile_all(
    out_dir: str | Path,
    preset: str = "demo",
    schedule: str = "0 3 * * 0",
    cluster=None,
    sets: list[str] | None = None,
    config_file: str | None = None,
) -> dict[str, Path]:
    """Write the KFP pipeline YAML and both Argo YAMLs; returns their paths by kind.

    `sets`/`config_file` change the compiled config: its values become the parameter defaults
    (`overrides_json`), and a stage whose `launch` asks for more than one process becomes a PyTorchJob."""
    from pipelines.argo.workflow import build_cron_workflow, build_workflow_template
    from pipelines.cluster import ClusterConfig
    from pipelines.config import resolve
    from pipelines.kfp.pipeline import compile_pipeline

    cluster = cluster or ClusterConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    defaults = resolve(preset, sets, config_file)
    paths = {
        "kfp": compile_pipeline(out / KFP_FILE, cluster, defaults),
        "argo_template": out / ARGO_TEMPLATE_FILE,
        "argo_cron": out / ARGO_CRON_FILE,
    }
    paths["argo_template"].write_text(build_workflow_template(cluster, defaults).to_yaml())
    paths["argo_cron"].write_text(build_cron_workflow(schedule, cluster).to_yaml())
    return paths


def _config(args: argparse.Namespace):
    from pipelines.config import resolve

    sets = args.set or []
    if getattr(args, "retrain", False):  # before --set, so an explicit setting still wins
        store = Path(getattr(args, "runs_dir", "runs")).resolve() / "data-store"
        sets = ["retrain.start_from=champion", f"retrain.data_store={store}", *sets]
    return resolve(args.preset, sets, getattr(args, "config", None))


def _run(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.kfp_local:
        from pipelines.local import run_kfp_local

        out = run_kfp_local(config, args.runs_dir)
        print(out["markdown"])
        print(
            f"run dir: {out['run_dir']}\nMLflow: {out['tracking_uri']} (parent run {out['parent_run_id']})\n"
            f"wall time: {out['wall_seconds']:.1f} s"
        )
        return 0
    from pipelines.local import run_local

    result = run_local(config, args.runs_dir, quiet=not args.verbose)
    from pipelines.layout import RunLayout
    from pipelines.report import promotion_note

    layout = RunLayout(result.run_dir)
    data = layout.read_result("accumulate")
    if data and data.get("data_store"):
        print(
            f"\ntraining data: {len(data['trained_on'])} trajectory shard(s) from {data['data_store']}, "
            f"{len(data['added_shards'])} shard(s) added by this run: {', '.join(data['trained_on'])}"
        )
    gate = layout.read_result("promote")
    if gate:
        print(f"\npromotion gate: {promotion_note(gate)}")
    print(
        f"\nrun dir: {result.run_dir}\nMLflow: {result.tracking_uri} (parent run {result.parent_run_id})\n"
        f"open it: {_open_it(result.tracking_uri, config.experiment, result.parent_run_id, args.runs_dir)}\n"
        f"stages run: {', '.join(result.stages_ran) or 'none'}\nwall time: {result.wall_seconds:.1f} s"
    )
    return 0


def _open_it(uri: str, experiment: str, run_id: str, runs_dir: str) -> str:
    """How to see a finished run: its page on a tracking server, or the `orchard ui` command for a local store."""
    if uri.startswith(("http://", "https://")):
        import mlflow

        from components.core.tracking import TrackingConfig, ui_link

        experiment_id = mlflow.MlflowClient(uri).get_run(run_id).info.experiment_id
        return ui_link(TrackingConfig(tracking_uri=uri, experiment=experiment), experiment_id, run_id)
    default = f"{Path(runs_dir).resolve() / 'mlflow.db'}" == uri.removeprefix("sqlite:///")
    where = f"--runs-dir {runs_dir}" if default else f"--tracking-uri {uri}"
    return (
        f"orchard ui {where} --run {run_id} (the MLflow UI on port 5000, or the next free one, "
        "opened on this run's runs table)"
    )


def _config_args(p: argparse.ArgumentParser, preset: bool = True) -> None:
    if preset:
        p.add_argument(
            "--preset",
            default=DEFAULT_PRESET,
            help="quick (the default: learning in minutes), demo (make demo), tiny (a smoke test: seconds, "
            "shows no learning) or smol (SmolLM2-135M-Instruct; make smol-model; hours)",
        )
    p.add_argument("--config", default=None, help="YAML/JSON file of PipelineConfig settings (nested or dotted keys)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a PipelineConfig setting in the stage configs' own names, e.g. sft.steps=400 (repeatable)",
    )


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["env"]:  # `orchard env serve ...`: the trainer-facing environments (components/envs/cli.py)
        from components.envs.cli import main as env_main

        return env_main(args_in[1:])
    if args_in[:1] == ["export"]:  # `orchard export tokens|openai ...`: datasets for other trainers
        from components.export_cli import main as export_main

        return export_main(args_in[1:])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="on an error, print the traceback (not one line)")
    parser = argparse.ArgumentParser(
        prog="orchard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", parents=[common], help="write the KFP and Argo YAML")
    p.add_argument("--out", default="build/pipelines", help="output directory")
    p.add_argument("--preset", default="demo", help="preset whose values become the parameter defaults")
    p.add_argument("--schedule", default="0 3 * * 0", help="cron schedule of the Argo CronWorkflow")
    p.add_argument("--image-registry", default=None, help="registry of every image (as `make images REGISTRY=`)")
    p.add_argument("--image-tag", default=None, help="tag of every image (as `make images TAG=`)")
    p.add_argument(
        "--overlay",
        default=None,
        help="compile for the registry and tag a kustomize overlay's `images:` name, e.g. "
        "manifests/overlays/prod (instead of --image-registry/--image-tag)",
    )
    p.add_argument(
        "--cluster",
        action="append",
        metavar="KEY=VALUE",
        help="a ClusterConfig name (pipelines/cluster.py), e.g. namespace=ml",
    )
    _config_args(p, preset=False)  # compiled in: e.g. --set sft.launch.nproc_per_node=4 (a PyTorchJob)

    for name, help_text in (("run", "run the whole DAG on this machine"), ("demo", "the demo run (make demo)")):
        p = sub.add_parser(name, parents=[common], help=help_text)
        _config_args(p, preset=name == "run")
        if name == "run":
            p.add_argument("--kfp-local", action="store_true", help="through kfp.local (SubprocessRunner)")
            p.add_argument(
                "--retrain",
                action="store_true",
                help="scheduled retraining: start from the registry's champion (retrain.start_from="
                "champion), add new tasks to and train on the data store <runs-dir>/data-store "
                "(retrain.data_store); the promotion gate decides whether the model replaces it",
            )
        p.add_argument("--runs-dir", default="runs", help="where run directories and mlflow.db go")
        p.add_argument(
            "--verbose",
            action="store_true",
            help="every library warning, log and progress bar (default: one line per stage)",
        )

    p = sub.add_parser("check", parents=[common], help="check what the run's config names (seconds), run nothing")
    _config_args(p)

    p = sub.add_parser("ui", parents=[common], help="the MLflow UI on the runs' store, opened on the runs table")
    p.add_argument("--runs-dir", default="runs", help="the runs directory whose mlflow.db is served")
    p.add_argument("--tracking-uri", default=None, help="serve this store instead (sqlite:///...)")
    p.add_argument(
        "--port", type=int, default=None, help="port of the UI (default: 5000, or the next free one; 0: any free port)"
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to serve on")
    p.add_argument("--run", default=None, help="open this run's experiment (default: the latest pipeline run's)")
    p.add_argument("--no-browser", action="store_true", help="print the link only")

    p = sub.add_parser(
        "make-checkpoint",
        parents=[common],
        help="a small local checkpoint shaped like a user's (Qwen's vocabulary, a tool chat template)",
    )
    p.add_argument("--out", required=True, help="directory to write (save_pretrained layout)")
    p.add_argument(
        "--family", default="chatml", choices=["chatml", "llama3", "qwen3"], help="the chat template and special tokens"
    )
    p.add_argument("--hidden-size", type=int, default=32, help="model width (random init)")
    p.add_argument("--layers", type=int, default=1, help="transformer blocks")

    p = sub.add_parser(
        "fake-teacher",
        parents=[common],
        help="an OpenAI-compatible teacher that solves a SWE-bench-format tasks file with its patches",
    )
    p.add_argument("--tasks", required=True, help="the tasks file (JSONL/JSON/parquet, SWE-bench fields)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--model", default="fake-teacher", help="the model name it serves")
    p.add_argument("--detach", action="store_true", help="return once it listens; it serves in the background")
    p.add_argument("--pid-file", default=None, help="with --detach: write the server's pid here")

    p = sub.add_parser("config", parents=[common], help="show the resolved PipelineConfig")
    p.add_argument("action", choices=["show"])
    _config_args(p)

    p = sub.add_parser("schedule", parents=[common], help="create a KFP recurring run (needs a KFP server)")
    p.add_argument("--host", required=True, help="KFP API endpoint")
    p.add_argument("--package", required=True, help="compiled pipeline YAML (orchard compile)")
    p.add_argument("--cron", default="0 3 * * 0", help="5-field cron (a seconds field is prepended for KFP)")
    p.add_argument("--experiment", default="orchard")
    p.add_argument("--name", default="orchard-retrain")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="pipeline parameter")
    p.add_argument(
        "--namespace",
        default=None,
        help="KFP namespace the runs go to (multi-user KFP: your profile's; default: the client's)",
    )
    p.add_argument(
        "--service-account",
        default=None,
        help="ServiceAccount of the runs' pods (default: ClusterConfig.service_account, orchard-pipeline)",
    )

    args = parser.parse_args(argv)
    if args.command in ("run", "demo") and not args.verbose:
        from components.core.console import no_bars_when_piped

        no_bars_when_piped()  # before anything imports tqdm
    from components.core.interrupts import RunInterrupted, exit_at_once_on_signals
    from pipelines.config import ConfigError

    try:
        return _dispatch(args)
    except ConfigError as err:
        print(f"orchard: {err}", file=sys.stderr)
        return 2
    except RunInterrupted as err:  # the runner has ended the stage, its sandboxes and the MLflow runs
        exit_at_once_on_signals()  # a second Ctrl-C during the interpreter's shutdown still ends it at once
        print(f"orchard: {err}: run stopped", file=sys.stderr)
        return err.exit_code
    except Exception as err:
        if args.debug:
            raise
        from components.core.tracking import error_line

        print(
            f"orchard: {error_line(err) or type(err).__name__} ({type(err).__name__}; --debug shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    from pipelines.config import ConfigError, parse_set

    if args.command == "compile":
        from pydantic import ValidationError

        from pipelines.cluster import ClusterConfig

        fields = parse_set(args.cluster or [])
        if args.overlay:
            from pipelines.cluster import overlay_images

            if args.image_registry or args.image_tag:
                raise ConfigError("--overlay names the registry and tag; drop --image-registry/--image-tag")
            try:
                fields["image_registry"], fields["image_tag"] = overlay_images(args.overlay)
            except ValueError as err:
                raise ConfigError(str(err)) from None
        if args.image_registry:
            fields["image_registry"] = args.image_registry
        if args.image_tag:
            fields["image_tag"] = args.image_tag
        try:
            cluster = ClusterConfig.model_validate(fields)
        except ValidationError as e:
            raise ConfigError(
                "; ".join(f"--cluster {'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
            ) from None
        for kind, path in compile_all(args.out, args.preset, args.schedule, cluster, args.set, args.config).items():
            print(f"{kind}: {path}")
        return 0
    if args.command == "demo":
        args.preset, args.kfp_local = "demo", False
        return _run(args)
    if args.command == "run":
        return _run(args)
    if args.command == "config":
        print(_config(args).model_dump_json(indent=2))
        return 0
    if args.command == "check":
        from pipelines.preflight import checks, preflight

        config = _config(args)
        preflight(config)
        names = [name for name, _ in checks(config)]
        print(
            f"ok: {', '.join(names)}"
            if names
            else "ok: nothing external to check (the run starts its own "
            "sandbox service and logs to sqlite under --runs-dir)"
        )
        return 0
    if args.command == "ui":
        from pipelines.ui import UIError, serve

        try:
            return serve(args.runs_dir, args.tracking_uri, args.host, args.port, args.run, not args.no_browser)
        except UIError as err:
            raise ConfigError(str(err)) from None
    if args.command == "make-checkpoint":
        from huggingface_hub.utils import disable_progress_bars

        from components.checkpoints import save_checkpoint

        disable_progress_bars()  # transformers' "Writing model shards" bar: one file, nothing to follow
        out = save_checkpoint(Path(args.out), args.family, hidden_size=args.hidden_size, layers=args.layers)
        print(f"checkpoint: {out} ({args.family} template, random init): --set model.path={out}")
        return 0
    if args.command == "fake-teacher":
        from components.fake_teacher import serve as serve_teacher

        return serve_teacher(args.tasks, args.host, args.port, args.model, args.detach, args.pid_file)
    if args.command == "schedule":
        from pipelines.cluster import ClusterConfig
        from pipelines.kfp.schedule import KfpUnreachable, RecurringRunSpec, create_recurring_run

        spec = RecurringRunSpec(
            experiment=args.experiment,
            name=args.name,
            cron=args.cron,
            package_path=args.package,
            params=parse_set(args.param or []),
            service_account=args.service_account or ClusterConfig().service_account,
            namespace=args.namespace,
        )
        try:
            run = create_recurring_run(spec, host=args.host)
        except KfpUnreachable as err:
            print(f"orchard schedule: {err}", file=sys.stderr)
            return 1
        print(getattr(run, "recurring_run_id", run))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
