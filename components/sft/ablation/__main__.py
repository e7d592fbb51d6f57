"""`python -m components.sft.ablation`: the command line (see the package docstring)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sandbox_service.connection import SandboxConnection
from components.core.tracking import TrackingConfig, ui_command
from components.sft.ablation import __doc__ as _DOC
from components.sft.ablation.budget import ArmPlan
from components.sft.ablation.config import AblationConfig, quick_config
from components.sft.ablation.report import arm_results, print_table
from components.sft.ablation.run import run_ablation


def _bugs(text: str) -> list[int]:
    return [int(b) for b in text.split(",") if b.strip()]


def config_from_args(args: argparse.Namespace) -> AblationConfig:
    base = quick_config() if args.quick else AblationConfig()
    update = {
        k: v
        for k, v in {
            "train_tasks": args.train_tasks,
            "heldout_tasks": args.heldout_tasks,
            "bugs": args.bugs,
            "seeds": list(range(args.seeds)) if args.seeds is not None else None,
            "jobs": args.jobs,
            "teacher_error_rate": args.teacher_error_rate,
            "resolved_epochs": args.resolved_epochs,
            "match": args.match,
            "eval_k": args.k,
            "eval_temperature": args.temperature,
            "eval_max_steps": args.eval_max_steps,
        }.items()
        if v is not None
    }
    sft = {
        k: v
        for k, v in {"batch_size": args.batch_size, "learning_rate": args.lr, "num_threads": args.num_threads}.items()
        if v is not None
    }
    mc = {k: v for k, v in {"k": args.mc_k, "stride": args.mc_stride}.items() if v is not None}
    credit = base.credit.model_copy(update={"monte_carlo": base.credit.monte_carlo.model_copy(update=mc)})
    # validate the merged settings (model_copy does not)
    return AblationConfig.model_validate(
        base.model_dump() | update | {"sft": base.sft.model_dump() | sft, "credit": credit.model_dump()}
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path("build/sft_ablation"))
    parser.add_argument("--quick", action="store_true", help="toy sizes (the test suite's); flags below override")
    # No defaults here: unset flags keep the config's (full or --quick), so the two cannot drift apart.
    parser.add_argument("--train-tasks", type=int)
    parser.add_argument("--heldout-tasks", type=int)
    parser.add_argument("--bugs", type=_bugs, help="planted bugs per task, cycled, e.g. 1,2 (default) or 1")
    parser.add_argument("--seeds", type=int, help="number of training seeds (0..N-1)")
    parser.add_argument("--resolved-epochs", type=float, help="reference arm's epochs over resolved data")
    parser.add_argument("--match", choices=["loss_tokens", "resolved_epochs"])
    parser.add_argument("--k", type=int, help="sampled attempts per held-out task")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--eval-max-steps", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--num-threads", type=int, help="torch CPU threads per job")
    parser.add_argument("--jobs", type=int, help="arm/seed runs in parallel processes")
    parser.add_argument("--mc-k", type=int)
    parser.add_argument("--mc-stride", type=int)
    parser.add_argument("--teacher-error-rate", type=float)
    parser.add_argument("--tracking-uri", default=None, help="MLflow URI (default: sqlite in the work dir)")
    parser.add_argument("--sandbox-url", default=None, help="Use this sandbox service instead of starting one")
    parser.add_argument("--report-only", action="store_true", help="Print the table of finished runs in --work-dir")
    args = parser.parse_args(argv)
    config = config_from_args(args)

    if args.report_only:
        plans = {a: ArmPlan(**p) for a, p in json.loads((args.work_dir / "plans.json").read_text()).items()}
        print_table(arm_results(args.work_dir, plans, config.seeds), config)
        return
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tracking = TrackingConfig(
        tracking_uri=args.tracking_uri or f"sqlite:///{args.work_dir.resolve()}/mlflow.db", experiment="sft-ablation"
    )
    if args.sandbox_url:
        rows = run_ablation(config, args.work_dir, SandboxConnection(url=args.sandbox_url), tracking)
    else:
        from sandbox_service.embedded import EmbeddedService

        with EmbeddedService() as service:
            rows = run_ablation(config, args.work_dir, service.connection(), tracking)
    print_table(rows, config)
    print(f"Compare the arms in MLflow: {ui_command(tracking)}")


if __name__ == "__main__":
    main()
