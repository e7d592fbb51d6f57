"""The ablation the field asks for: what do unresolved trajectories add to SFT, whole or credited?

    .venv/bin/python -m components.sft_ablation [--train-tasks 120] [--heldout-tasks 12] [--seeds 3] ...

One command: generate tasks (SWE difficulty 1), distill a scripted teacher with a high error rate (so
there are unresolved trajectories), label credit (Monte-Carlo continuations), then with the same model
config, steps and tasks train three arms and the untrained baseline on each seed:
  (a) resolved_only   (b) whole = resolved + whole unresolved   (c) credited = resolved + rise segments
and evaluate each on held-out tasks (greedy, components.evaluate). Every arm is one MLflow run with
its per-seed figures; the table (mean resolved rate and a 95 % t-interval over seeds) is printed
whichever arm wins. Arm/seed runs go `--jobs` at a time in separate processes (one torch thread each:
on 2 cores that is faster than one job on two threads); finished ones are kept when a run is resumed.
A sandbox service is started on loopback unless --sandbox-url is given.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from components.core.connection import SandboxConnection
from components.core.harness import HarnessConfig
from components.core.modeling import build_tiny_model, build_tokenizer, save_policy
from components.core.policy_base import GenerationConfig
from components.core.store import TaskStore
from components.core.tracking import (TrackingConfig, close_detached_run, log_json, log_metrics, open_detached_run,
                                      stage_run, ui_command)
from components.credit import CreditConfig, label_credit
from components.credit_mc import MonteCarloConfig
from components.sft import SFTConfig, train_sft
from components.sft_data import SFTMode

ARMS: tuple[SFTMode, ...] = ("resolved_only", "whole", "credited")
ALL_ARMS: tuple[str, ...] = ("untrained", *ARMS)
# Student t quantiles (0.975) for small numbers of seeds; beyond 10 the normal quantile is close.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


class AblationConfig(BaseModel):
    """The whole ablation: data, credit, SFT and evaluation settings shared by every arm."""

    model_config = ConfigDict(extra="forbid")
    train_tasks: int = Field(120, ge=1, description="Training tasks (SWE difficulty 1).")
    heldout_tasks: int = Field(12, ge=1, description="Held-out tasks for evaluation.")
    task_seed: int = Field(0, description="Seed of the task generator.")
    teacher_error_rate: float = Field(0.5, ge=0.0, le=1.0, description="Distillation teacher's error rate.")
    teacher_attempts: int = Field(1, ge=1, description="Teacher attempts per training task.")
    credit: CreditConfig = Field(default_factory=lambda: CreditConfig(
        monte_carlo=MonteCarloConfig(k=3, stride=2, teacher_error_rate=0.2)), description="Credit stage settings.")
    # 400 steps at lr 3e-3 is the shortest schedule measured to make the tiny policy resolve held-out tasks
    # (120 steps taught it the format only: 0/12); one torch thread per process is fastest on 2 shared cores.
    sft: SFTConfig = Field(default_factory=lambda: SFTConfig(steps=400, batch_size=8, learning_rate=3e-3,
                                                             max_len=1024, num_threads=1),
                           description="SFT settings (mode and seed are set per arm and seed).")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], description="Training seeds (model init and data order).")
    eval_max_steps: int = Field(8, ge=1, description="Assistant turns per held-out episode.")
    eval_max_new_tokens: int = Field(160, ge=8, description="Tokens per generated turn.")
    workers: int = Field(2, ge=1, description="Parallel episodes in distillation.")
    jobs: int = Field(2, ge=1, description="Arm/seed runs (train + evaluate) in parallel processes.")


class ArmResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    arm: str
    rates: list[float] = Field(description="Held-out resolved rate per seed.")
    mean: float
    ci95: tuple[float, float]
    valid_call_rate: float = Field(description="Share of held-out assistant turns that were a valid tool call.")
    mean_steps: float = Field(description="Mean assistant turns per held-out episode.")
    train_samples: float = Field(description="Mean trainable trajectories per seed.")
    loss_tokens: float = Field(description="Mean loss tokens in the training set.")
    final_loss: float


def _eval_figures(eval_dir: Path) -> tuple[float, float, float]:
    """(resolved rate, valid tool-call rate, mean steps) of one evaluation output directory."""
    from components.core.store import TrajectoryStore

    result = json.loads((eval_dir / "eval_result.json").read_text())
    turns = valid_turns = 0
    for traj in TrajectoryStore(eval_dir / "trajectories").read():
        for step, answer in zip(traj.steps, traj.steps[1:] + [None]):
            if step.role != "assistant":
                continue
            turns += 1
            # valid: it parsed, and the tool accepted it (unknown tools and bad arguments are policy errors)
            valid_turns += step.tool_call is not None and step.policy_error is None and (
                answer is None or answer.policy_error is None)
    valid = valid_turns / turns if turns else 0.0
    return result["resolved_rate"], valid, result["mean_steps"]


def arm_result(work_dir: Path, arm: str, seeds: list[int]) -> ArmResult:
    """An arm's row from what its runs left on disk (evaluations and SFT results)."""
    figures = [_eval_figures(work_dir / "eval" / arm / f"seed{s}") for s in seeds
               if (work_dir / "eval" / arm / f"seed{s}" / "eval_result.json").exists()]
    if not figures:
        raise FileNotFoundError(f"no finished evaluation of arm {arm!r} under {work_dir}/eval")
    rates = [f[0] for f in figures]
    mean, lo, hi = t_interval(rates)
    sft = [json.loads(p.read_text()) for s in seeds
           if (p := work_dir / "models" / arm / f"seed{s}" / "sft_result.json").exists()]
    return ArmResult(
        arm=arm, rates=rates, mean=mean, ci95=(lo, hi),
        valid_call_rate=statistics.fmean(f[1] for f in figures), mean_steps=statistics.fmean(f[2] for f in figures),
        train_samples=statistics.fmean(r["data"]["resolved_used"] + r["data"]["unresolved_used"] for r in sft) if sft else 0.0,
        loss_tokens=statistics.fmean(r["data"]["loss_tokens"] for r in sft) if sft else 0.0,
        final_loss=statistics.fmean(r["final_loss"] for r in sft) if sft else float("nan"),
    )


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and a 95 % Student-t interval over seeds (clipped to [0, 1]); a single seed has none."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = _T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def _distill(config: AblationConfig, sandbox: SandboxConnection, tasks_dir: Path, out_dir: Path,
             tracking: TrackingConfig | None) -> dict:
    from components.distill import DistillConfig, distill

    # Snapshots after every step let the Monte-Carlo credit fork intermediate states instead of replaying.
    distill_config = DistillConfig(error_rate=config.teacher_error_rate, attempts_per_task=config.teacher_attempts,
                                   max_parallel=config.workers, sandbox=sandbox, split="train",
                                   harness=HarnessConfig(snapshot_every_step=True, max_steps=12))
    return distill(distill_config, tasks_dir, out_dir, tracking=tracking).metrics


def _evaluate(config: AblationConfig, sandbox: SandboxConnection, tasks_dir: Path, model_dir: Path, out_dir: Path,
              tracking: TrackingConfig | None) -> float:
    from components.evaluate import EvalConfig, evaluate

    harness = HarnessConfig(max_steps=config.eval_max_steps, max_wall_seconds=300,
                            generation=GenerationConfig(max_new_tokens=config.eval_max_new_tokens, temperature=0.0))
    # One episode at a time per job: parallelism comes from `jobs` (separate processes, one torch thread each).
    eval_config = EvalConfig(k=1, temperature=0.0, harness=harness, sandbox=sandbox, workers=1)
    return evaluate(eval_config, tasks_dir, model_dir, out_dir, tracking=tracking).resolved_rate


def _run_job(config: AblationConfig, arm: str, seed: int, work: Path, sandbox: SandboxConnection,
             tracking: TrackingConfig | None) -> float:
    """Train one seed of one arm (or save the untrained model) and evaluate it; a worker process when jobs > 1."""
    if config.sft.num_threads:
        import torch

        torch.set_num_threads(config.sft.num_threads)  # evaluation too, so parallel jobs do not contend
    eval_dir = work / "eval" / arm / f"seed{seed}"
    if (eval_dir / "eval_result.json").exists():  # finished by an earlier, interrupted run: keep it
        return json.loads((eval_dir / "eval_result.json").read_text())["resolved_rate"]
    model_dir = work / "models" / arm / f"seed{seed}"
    model_config = config.sft.model.model_copy(update={"seed": seed})
    if arm == "untrained":
        tokenizer = build_tokenizer(model_config.tokenizer)
        save_policy(build_tiny_model(model_config, tokenizer), tokenizer, model_dir)
    else:
        sft_cfg = config.sft.model_copy(update={"mode": arm, "seed": seed, "model": model_config})
        train_sft(sft_cfg, work / "credited", model_dir, tracking=tracking)
    return _evaluate(config, sandbox, work / "tasks", model_dir, eval_dir, tracking)


def _seed_metrics(rates: dict[int, float]) -> list[tuple[str, float, int]]:
    return [("heldout_resolved_rate", rate, seed) for seed, rate in sorted(rates.items())]


def run_ablation(config: AblationConfig, work_dir: str | Path, sandbox: SandboxConnection,
                 tracking: TrackingConfig | None = None) -> list[ArmResult]:
    import concurrent.futures
    import multiprocessing

    from components.recipes import get_recipe

    work = Path(work_dir)
    recipe = get_recipe("swe", difficulty=1)
    tasks_dir = work / "tasks"
    if not TaskStore(tasks_dir).shards():
        TaskStore(tasks_dir).write(recipe.tasks("train", config.train_tasks, seed=config.task_seed)
                                   + recipe.tasks("heldout", config.heldout_tasks, seed=config.task_seed))
    raw, credited = work / "trajectories", work / "credited"
    with stage_run("sft-ablation", config, tracking) as parent:
        child = tracking.model_copy(update={"parent_run_id": parent.info.run_id}) if parent else None
        if not (raw / "manifest.json").exists():
            log_metrics({f"distill.{k}": v for k, v in _distill(config, sandbox, tasks_dir, raw, child).items()})
        if not (credited / "manifest.json").exists():
            credit_cfg = config.credit.model_copy(update={"sandbox": sandbox})
            result = label_credit(credit_cfg, raw, tasks_dir, credited, tracking=child)
            log_metrics({f"credit.{k}": v for k, v in result.metrics.items()})
        # Detached runs: the arms' seeds finish interleaved, in worker processes when jobs > 1.
        arm_runs = {arm: open_detached_run(f"ablation-arm-{arm}", config.sft, child, run_name=f"arm-{arm}")
                    for arm in ALL_ARMS}
        grand = {arm: child.model_copy(update={"parent_run_id": arm_runs[arm], "run_name": None}) if child else None
                 for arm in ALL_ARMS}
        jobs = [(arm, seed) for arm in ALL_ARMS for seed in config.seeds]
        rates: dict[str, dict[int, float]] = {arm: {} for arm in ALL_ARMS}
        try:
            if config.jobs == 1:
                for arm, seed in jobs:
                    rates[arm][seed] = _run_job(config, arm, seed, work, sandbox, grand[arm])
            else:
                # Processes, not threads: each job trains and generates on its own core without the GIL, and
                # "spawn" keeps the parent's active MLflow run and HTTP pools out of the children.
                ctx = multiprocessing.get_context("spawn")
                with concurrent.futures.ProcessPoolExecutor(config.jobs, mp_context=ctx) as pool:
                    futures = {pool.submit(_run_job, config, arm, seed, work, sandbox, grand[arm]): (arm, seed)
                               for arm, seed in jobs}
                    for future in concurrent.futures.as_completed(futures):
                        arm, seed = futures[future]
                        rates[arm][seed] = future.result()
                        print(f"ablation: {arm} seed {seed} -> held-out resolved {rates[arm][seed]:.3f}", flush=True)
        except BaseException:
            for arm in ALL_ARMS:
                close_detached_run(arm_runs[arm], child, _seed_metrics(rates[arm]), failed=True)
            raise
        arms = [arm_result(work, arm, config.seeds) for arm in ALL_ARMS]
        for arm, row in zip(ALL_ARMS, arms):
            summary = {"heldout_resolved_rate_mean": row.mean, "ci95_low": row.ci95[0], "ci95_high": row.ci95[1],
                       "valid_call_rate": row.valid_call_rate, "mean_steps": row.mean_steps,
                       "train_samples": row.train_samples, "loss_tokens": row.loss_tokens}
            close_detached_run(arm_runs[arm], child,
                               _seed_metrics(rates[arm]) + [(k, v, 0) for k, v in summary.items()])
        log_json([a.model_dump(mode="json") for a in arms], "ablation_table.json")
    (work / "ablation_table.json").write_text(json.dumps([a.model_dump(mode="json") for a in arms], indent=2))
    return arms


def print_table(arms: list[ArmResult], config: AblationConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"SFT ablation: held-out resolved rate ({config.heldout_tasks} tasks, greedy, "
                        f"{len(config.seeds)} seeds, {config.sft.steps} steps)")
    for col in ("arm", "resolved (mean)", "95% CI over seeds", "per seed", "valid tool calls", "steps",
                "train trajectories", "loss tokens", "final loss"):
        table.add_column(col, justify="right")
    for a in arms:
        table.add_row(a.arm, f"{a.mean:.3f}", f"[{a.ci95[0]:.3f}, {a.ci95[1]:.3f}]",
                      " ".join(f"{r:.3f}" for r in a.rates), f"{a.valid_call_rate:.3f}", f"{a.mean_steps:.1f}",
                      f"{a.train_samples:.0f}", f"{a.loss_tokens:.0f}", f"{a.final_loss:.3f}")
    Console(width=140).print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=Path("build/sft_ablation"))
    d = AblationConfig()  # the CLI's defaults are the config's, so the two cannot drift apart
    mc = d.credit.monte_carlo
    parser.add_argument("--train-tasks", type=int, default=d.train_tasks)
    parser.add_argument("--heldout-tasks", type=int, default=d.heldout_tasks)
    parser.add_argument("--seeds", type=int, default=len(d.seeds))
    parser.add_argument("--steps", type=int, default=d.sft.steps)
    parser.add_argument("--batch-size", type=int, default=d.sft.batch_size)
    parser.add_argument("--lr", type=float, default=d.sft.learning_rate)
    parser.add_argument("--num-threads", type=int, default=d.sft.num_threads, help="torch CPU threads per job")
    parser.add_argument("--jobs", type=int, default=d.jobs, help="arm/seed runs in parallel processes")
    parser.add_argument("--mc-k", type=int, default=mc.k)
    parser.add_argument("--mc-stride", type=int, default=mc.stride)
    parser.add_argument("--teacher-error-rate", type=float, default=d.teacher_error_rate)
    parser.add_argument("--tracking-uri", default=None, help="MLflow URI (default: sqlite in the work dir)")
    parser.add_argument("--sandbox-url", default=None, help="Use this sandbox service instead of starting one")
    parser.add_argument("--report-only", action="store_true", help="Print the table of finished runs in --work-dir")
    args = parser.parse_args(argv)

    config = AblationConfig(
        train_tasks=args.train_tasks, heldout_tasks=args.heldout_tasks, seeds=list(range(args.seeds)),
        teacher_error_rate=args.teacher_error_rate, jobs=args.jobs,
        credit=d.credit.model_copy(update={"monte_carlo": mc.model_copy(update={"k": args.mc_k, "stride": args.mc_stride})}),
        sft=d.sft.model_copy(update={"steps": args.steps, "batch_size": args.batch_size, "learning_rate": args.lr,
                                     "num_threads": args.num_threads}),
    )
    if args.report_only:
        rows = []
        for arm in ALL_ARMS:
            try:
                rows.append(arm_result(args.work_dir, arm, config.seeds))
            except FileNotFoundError as err:
                print(f"skipped: {err}")
        print_table(rows, config)
        return
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tracking = TrackingConfig(tracking_uri=args.tracking_uri or f"sqlite:///{args.work_dir.resolve()}/mlflow.db",
                              experiment="sft-ablation")
    if args.sandbox_url:
        arms = run_ablation(config, args.work_dir, SandboxConnection(url=args.sandbox_url), tracking)
    else:
        from sandbox_service.embedded import EmbeddedService

        with EmbeddedService() as service:
            arms = run_ablation(config, args.work_dir, service.connection(), tracking)
    print_table(arms, config)
    print(f"Compare the arms in MLflow: {ui_command(tracking)}")


if __name__ == "__main__":
    main()
