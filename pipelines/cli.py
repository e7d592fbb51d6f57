"""`orchard`: compile the pipelines, run them locally, show the config, schedule them.

    orchard compile --out build/pipelines [--image-registry R | --overlay manifests/overlays/prod] [--set ...]
                                                                  KFP YAML + Argo WorkflowTemplate/CronWorkflow
    orchard run [--preset tiny] [--config F] [--set sft.steps=400] [--kfp-local] [--retrain]   the whole DAG here
    orchard demo                                                  = orchard run --preset demo (`make demo`)
    orchard config show [--preset P] [--set ...]                  the resolved PipelineConfig
    orchard export tokens --trajectories DIR --model M --out F    the token-level dataset (also: export openai)
    orchard schedule --host URL --cron "0 3 * * 0" --package build/pipelines/orchard-training.kfp.yaml
                     [--namespace kubeflow] [--service-account orchard-pipeline]

A bad preset, --set, recipe or config file is reported as one line (exit 2), not a traceback; so is a
KFP API that `orchard schedule` cannot reach (exit 1); any other error too (exit 1), with its traceback only
under --debug. Ctrl-C or SIGTERM stops `orchard run` cleanly (exit 130
or 143; the current stage ends, its sandboxes are deleted, MLflow marks the runs KILLED); twice exits at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

KFP_FILE = "orchard-training.kfp.yaml"
ARGO_TEMPLATE_FILE = "orchard-training.workflowtemplate.yaml"
ARGO_CRON_FILE = "orchard-retrain.cronworkflow.yaml"


def compile_all(out_dir: str | Path, preset: str = "demo", schedule: str = "0 3 * * 0",
                cluster=None, sets: list[str] | None = None, config_file: str | None = None) -> dict[str, Path]:
    """Write the KFP pipeline YAML and both Argo YAMLs; returns their paths by kind.

    `sets`/`config_file` change the compiled config: its values become the parameter defaults
    (`overrides_json`), and a stage whose `launch` asks for more than one process becomes a PyTorchJob."""
    from pipelines.argo_workflow import build_cron_workflow, build_workflow_template
    from pipelines.cluster import ClusterConfig
    from pipelines.config import resolve
    from pipelines.kfp_pipeline import compile_pipeline

    cluster = cluster or ClusterConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    defaults = resolve(preset, sets, config_file)
    paths = {"kfp": compile_pipeline(out / KFP_FILE, cluster, defaults),
             "argo_template": out / ARGO_TEMPLATE_FILE, "argo_cron": out / ARGO_CRON_FILE}
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
        print(f"run dir: {out['run_dir']}\nMLflow: {out['tracking_uri']} (parent run {out['parent_run_id']})\n"
              f"wall time: {out['wall_seconds']:.1f} s")
        return 0
    from pipelines.local import run_local

    result = run_local(config, args.runs_dir)
    from pipelines.layout import RunLayout
    from pipelines.report import promotion_note

    layout = RunLayout(result.run_dir)
    data = layout.read_result("accumulate")
    if data and data.get("data_store"):
        print(f"\ntraining data: {len(data['trained_on'])} trajectory shard(s) from {data['data_store']}, "
              f"{len(data['added_shards'])} shard(s) added by this run: {', '.join(data['trained_on'])}")
    gate = layout.read_result("promote")
    if gate:
        print(f"\npromotion gate: {promotion_note(gate)}")
    import mlflow

    from components.core.tracking import TrackingConfig, ui_link

    tracking = TrackingConfig(tracking_uri=result.tracking_uri, experiment=config.experiment)
    experiment = mlflow.MlflowClient(result.tracking_uri).get_run(result.parent_run_id).info.experiment_id
    print(f"\nrun dir: {result.run_dir}\nMLflow: {result.tracking_uri} (parent run {result.parent_run_id})\n"
          f"open it: {ui_link(tracking, experiment, result.parent_run_id)}\n"
          f"stages run: {', '.join(result.stages_ran) or 'none'}\nwall time: {result.wall_seconds:.1f} s")
    return 0


def _config_args(p: argparse.ArgumentParser, preset: bool = True) -> None:
    if preset:
        p.add_argument("--preset", default="demo", help="demo, tiny or smol (SmolLM2-135M-Instruct; make smol-model)")
    p.add_argument("--config", default=None, help="YAML/JSON file of PipelineConfig settings (nested or dotted keys)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a PipelineConfig setting in the stage configs' own names, e.g. sft.steps=400 (repeatable)")


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
    parser = argparse.ArgumentParser(prog="orchard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", parents=[common], help="write the KFP and Argo YAML")
    p.add_argument("--out", default="build/pipelines", help="output directory")
    p.add_argument("--preset", default="demo", help="preset whose values become the parameter defaults")
    p.add_argument("--schedule", default="0 3 * * 0", help="cron schedule of the Argo CronWorkflow")
    p.add_argument("--image-registry", default=None, help="registry of every image (as `make images REGISTRY=`)")
    p.add_argument("--image-tag", default=None, help="tag of every image (as `make images TAG=`)")
    p.add_argument("--overlay", default=None,
                   help="compile for the registry and tag a kustomize overlay's `images:` name, e.g. "
                        "manifests/overlays/prod (instead of --image-registry/--image-tag)")
    p.add_argument("--cluster", action="append", metavar="KEY=VALUE",
                   help="a ClusterConfig name (pipelines/cluster.py), e.g. namespace=ml")
    _config_args(p, preset=False)  # compiled in: e.g. --set sft.launch.nproc_per_node=4 (a PyTorchJob)

    for name, help_text in (("run", "run the whole DAG on this machine"), ("demo", "the demo run (make demo)")):
        p = sub.add_parser(name, parents=[common], help=help_text)
        _config_args(p, preset=name == "run")
        if name == "run":
            p.add_argument("--kfp-local", action="store_true", help="through kfp.local (SubprocessRunner)")
            p.add_argument("--retrain", action="store_true",
                           help="scheduled retraining: start from the registry's champion (retrain.start_from="
                                "champion), add new tasks to and train on the data store <runs-dir>/data-store "
                                "(retrain.data_store); the promotion gate decides whether the model replaces it")
        p.add_argument("--runs-dir", default="runs", help="where run directories and mlflow.db go")

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
    p.add_argument("--namespace", default=None,
                   help="KFP namespace the runs go to (multi-user KFP: your profile's; default: the client's)")
    p.add_argument("--service-account", default=None,
                   help="ServiceAccount of the runs' pods (default: ClusterConfig.service_account, orchard-pipeline)")

    args = parser.parse_args(argv)
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

        print(f"orchard: {error_line(err) or type(err).__name__} ({type(err).__name__}; --debug shows the "
              "traceback)", file=sys.stderr)
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
            raise ConfigError("; ".join(f"--cluster {'.'.join(map(str, x['loc']))}: {x['msg']}"
                                        for x in e.errors())) from None
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
    if args.command == "schedule":
        from pipelines.cluster import ClusterConfig
        from pipelines.schedule import KfpUnreachable, RecurringRunSpec, create_recurring_run

        spec = RecurringRunSpec(experiment=args.experiment, name=args.name, cron=args.cron,
                                package_path=args.package, params=parse_set(args.param or []),
                                service_account=args.service_account or ClusterConfig().service_account,
                                namespace=args.namespace)
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
