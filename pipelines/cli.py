"""`orchard`: compile the pipelines, run them locally, schedule them.

    orchard compile --out build/pipelines        KFP pipeline YAML + Argo WorkflowTemplate/CronWorkflow YAML
    orchard run [--preset tiny] [--kfp-local]     the whole DAG on this machine
    orchard demo                                  = orchard run --preset demo (what `make demo` runs)
    orchard schedule --host URL --cron "0 3 * * 0" --package build/pipelines/orchard-training.kfp.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KFP_FILE = "orchard-training.kfp.yaml"
ARGO_TEMPLATE_FILE = "orchard-training.workflowtemplate.yaml"
ARGO_CRON_FILE = "orchard-retrain.cronworkflow.yaml"


def compile_all(out_dir: str | Path, preset: str = "demo", schedule: str = "0 3 * * 0") -> dict[str, Path]:
    """Write the KFP pipeline YAML and both Argo YAMLs; returns their paths by kind."""
    from pipelines.argo_workflow import build_cron_workflow, build_workflow_template
    from pipelines.config import PipelineConfig
    from pipelines.kfp_pipeline import compile_pipeline

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    defaults = PipelineConfig.preset_config(preset)
    paths = {"kfp": compile_pipeline(out / KFP_FILE, defaults),
             "argo_template": out / ARGO_TEMPLATE_FILE, "argo_cron": out / ARGO_CRON_FILE}
    paths["argo_template"].write_text(build_workflow_template(defaults).to_yaml())
    paths["argo_cron"].write_text(build_cron_workflow(schedule).to_yaml())
    return paths


def _parse_set(values: list[str]) -> dict:
    """`--set sft.steps=10 --set tasks.n_train=8` -> nested overrides (values parsed as JSON when they can be)."""
    out: dict = {}
    for item in values:
        if "=" not in item:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _run(args: argparse.Namespace) -> int:
    from pipelines.config import PipelineConfig

    config = PipelineConfig.preset_config(args.preset, **_parse_set(args.set or []))
    if args.kfp_local:
        from pipelines.local import run_kfp_local

        out = run_kfp_local(config, args.runs_dir)
        print(out["markdown"])
        print(f"run dir: {out['run_dir']}\nMLflow: {out['tracking_uri']} (parent run {out['parent_run_id']})\n"
              f"wall time: {out['wall_seconds']:.1f} s")
        return 0
    from pipelines.local import run_local

    result = run_local(config, args.runs_dir)
    print(f"\nrun dir: {result.run_dir}\nMLflow: {result.tracking_uri} (parent run {result.parent_run_id})\n"
          f"stages run: {', '.join(result.stages_ran) or 'none'}\nwall time: {result.wall_seconds:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["env"]:  # `orchard env serve ...`: the trainer-facing environments (components/envs/cli.py)
        from components.envs.cli import main as env_main
        return env_main(args_in[1:])
    parser = argparse.ArgumentParser(prog="orchard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="write the KFP and Argo YAML")
    p.add_argument("--out", default="build/pipelines", help="output directory")
    p.add_argument("--preset", default="demo", help="preset whose values become the parameter defaults")
    p.add_argument("--schedule", default="0 3 * * 0", help="cron schedule of the Argo CronWorkflow")

    for name, help_text in (("run", "run the whole DAG on this machine"), ("demo", "the demo run (make demo)")):
        p = sub.add_parser(name, help=help_text)
        if name == "run":
            p.add_argument("--preset", default="demo", choices=["demo", "tiny"])
            p.add_argument("--kfp-local", action="store_true", help="through kfp.local (SubprocessRunner)")
        p.add_argument("--runs-dir", default="runs", help="where run directories and mlflow.db go")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a PipelineConfig knob")

    p = sub.add_parser("schedule", help="create a KFP recurring run (needs a KFP server)")
    p.add_argument("--host", required=True, help="KFP API endpoint")
    p.add_argument("--package", required=True, help="compiled pipeline YAML (orchard compile)")
    p.add_argument("--cron", default="0 3 * * 0", help="5-field cron (a seconds field is prepended for KFP)")
    p.add_argument("--experiment", default="orchard")
    p.add_argument("--name", default="orchard-retrain")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="pipeline parameter")

    args = parser.parse_args(argv)
    if args.command == "compile":
        for kind, path in compile_all(args.out, args.preset, args.schedule).items():
            print(f"{kind}: {path}")
        return 0
    if args.command == "demo":
        args.preset, args.kfp_local = "demo", False
        return _run(args)
    if args.command == "run":
        return _run(args)
    if args.command == "schedule":
        from pipelines.schedule import RecurringRunSpec, create_recurring_run

        spec = RecurringRunSpec(experiment=args.experiment, name=args.name, cron=args.cron,
                                package_path=args.package, params=_parse_set(args.param or []))
        run = create_recurring_run(spec, host=args.host)
        print(getattr(run, "recurring_run_id", run))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
