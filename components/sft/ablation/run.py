"""The ablation end to end: tasks, distillation, credit, budgets, then every arm x seed trained and evaluated."""

from __future__ import annotations

import json
from pathlib import Path

from sandbox_service.connection import SandboxConnection
from components.core.episode.harness import HarnessConfig
from components.core.policy.modeling import save_policy
from components.tiny_model import build_tiny_model, build_tokenizer
from components.core.policy.base import GenerationConfig
from components.core.data.parquet_store import TaskStore
from components.core.tracking import (
    TrackingConfig,
    close_detached_run,
    log_json,
    log_metrics,
    open_detached_run,
    stage_run,
)
from components.credit.stage import label_credit
from components.sft.stage import train_sft
from components.sft.ablation.budget import ArmPlan, plan_arms
from components.sft.ablation.config import ALL_ARMS, AblationConfig
from components.sft.ablation.report import ArmResult, arm_results


def _distill(
    config: AblationConfig, sandbox: SandboxConnection, tasks_dir: Path, out_dir: Path, tracking: TrackingConfig | None
) -> dict:
    from components.distill import DistillConfig, distill

    # Snapshots after every step let the Monte-Carlo credit fork intermediate states instead of replaying.
    distill_config = DistillConfig(
        error_rate=config.teacher_error_rate,
        attempts_per_task=config.teacher_attempts,
        max_parallel=config.workers,
        sandbox=sandbox,
        split="train",
        harness=HarnessConfig(snapshot_every_step=True, max_steps=12),
    )
    return distill(distill_config, tasks_dir, out_dir, tracking=tracking).metrics


def _evaluate(
    config: AblationConfig,
    seed: int,
    sandbox: SandboxConnection,
    tasks_dir: Path,
    model_dir: Path,
    out_dir: Path,
    tracking: TrackingConfig | None,
) -> float:
    from components.evaluate import EvalConfig, evaluate

    generation = GenerationConfig(max_new_tokens=config.eval_max_new_tokens, temperature=config.eval_temperature)
    harness = HarnessConfig(max_steps=config.eval_max_steps, max_wall_seconds=300, generation=generation)
    # The attempt seeds depend on the training seed only: every arm meets the same sampling noise (paired).
    eval_config = EvalConfig(
        k=config.eval_k,
        temperature=config.eval_temperature,
        harness=harness,
        sandbox=sandbox,
        workers=config.eval_workers,
        seed=seed,
    )
    return evaluate(eval_config, tasks_dir, model_dir, out_dir, tracking=tracking).pass_at_1


def _run_job(
    config: AblationConfig,
    arm: str,
    seed: int,
    steps: int,
    work: Path,
    sandbox: SandboxConnection,
    tracking: TrackingConfig | None,
) -> float:
    """Train one seed of one arm (or save the untrained model) and evaluate it; a worker process when jobs > 1."""
    if config.sft.num_threads:
        import torch

        torch.set_num_threads(config.sft.num_threads)  # evaluation too, so parallel jobs do not contend
    eval_dir = work / "eval" / arm / f"seed{seed}"
    if (eval_dir / "eval_result.json").exists():  # finished by an earlier, interrupted run: keep it
        return json.loads((eval_dir / "eval_result.json").read_text())["pass_at_1"]
    model_dir = work / "models" / arm / f"seed{seed}"
    model_config = config.sft.model.model_copy(update={"seed": seed})
    if arm == "untrained":
        tokenizer = build_tokenizer(model_config.tokenizer)
        save_policy(build_tiny_model(model_config, tokenizer), tokenizer, model_dir)
    else:
        sft_cfg = config.sft.model_copy(update={"mode": arm, "seed": seed, "model": model_config, "steps": steps})
        train_sft(sft_cfg, work / "credited", model_dir, tracking=tracking)
    return _evaluate(config, seed, sandbox, work / "tasks", model_dir, eval_dir, tracking)


def _seed_metrics(rates: dict[int, float]) -> list[tuple[str, float, int]]:
    return [("heldout_pass_at_1", rate, seed) for seed, rate in sorted(rates.items())]


def _summary(row: ArmResult) -> list[tuple[str, float, int]]:
    figures = {
        "heldout_pass_at_1_mean": row.pass_at_1,
        "ci95_low": row.ci95[0],
        "ci95_high": row.ci95[1],
        "heldout_tasks": row.tasks,
        "valid_call_rate": row.valid_call_rate,
        "mean_steps": row.mean_steps,
        "final_loss": row.final_loss,
    } | {f"plan.{k}": v for k, v in row.plan.model_dump().items() if k != "arm"}
    for name in ("vs_resolved_only", "vs_untrained"):
        if (p := getattr(row, name)) is not None:
            figures |= {f"{name}.diff": p.diff, f"{name}.ci95_low": p.ci95[0], f"{name}.ci95_high": p.ci95[1]}
    return [(k, float(v), 0) for k, v in figures.items()]


def prepare(
    config: AblationConfig, work: Path, sandbox: SandboxConnection, tracking: TrackingConfig | None
) -> dict[str, ArmPlan]:
    """Tasks, teacher trajectories, credit labels and the arms' budgets (each kept when already on disk)."""
    from components.recipes import get_recipe

    recipe = get_recipe("swe", difficulty=1, bugs=config.bugs)
    tasks_dir, raw, credited = work / "tasks", work / "trajectories", work / "credited"
    if not TaskStore(tasks_dir).shards():
        TaskStore(tasks_dir).write(
            recipe.tasks("train", config.train_tasks, seed=config.task_seed)
            + recipe.tasks("heldout", config.heldout_tasks, seed=config.task_seed)
        )
    if not (raw / "manifest.json").exists():
        log_metrics({f"distill.{k}": v for k, v in _distill(config, sandbox, tasks_dir, raw, tracking).items()})
    if not (credited / "manifest.json").exists():
        credit_cfg = config.credit.model_copy(update={"sandbox": sandbox})
        result = label_credit(credit_cfg, raw, tasks_dir, credited, tracking=tracking)
        log_metrics({f"credit.{k}": v for k, v in result.metrics.items()})
    plans = plan_arms(config, credited)
    (work / "plans.json").write_text(json.dumps({a: p.model_dump() for a, p in plans.items()}, indent=2))
    log_json({a: p.model_dump() for a, p in plans.items()}, "plans.json")
    return plans


def run_ablation(
    config: AblationConfig, work_dir: str | Path, sandbox: SandboxConnection, tracking: TrackingConfig | None = None
) -> list[ArmResult]:
    import concurrent.futures
    import multiprocessing

    work = Path(work_dir)
    with stage_run("sft-ablation", config, tracking) as parent:
        # stage_run yields a run only with tracking on
        child = (
            tracking.model_copy(update={"parent_run_id": parent.info.run_id})
            if parent and tracking is not None
            else None
        )
        plans = prepare(config, work, sandbox, child)
        # Detached runs: the arms' seeds finish interleaved, in worker processes when jobs > 1.
        arm_runs = {
            arm: open_detached_run(f"ablation-arm-{arm}", config.sft, child, run_name=f"arm-{arm}") for arm in ALL_ARMS
        }
        grand = {
            arm: child.model_copy(update={"parent_run_id": arm_runs[arm], "run_name": None}) if child else None
            for arm in ALL_ARMS
        }
        jobs = [(arm, seed) for arm in ALL_ARMS for seed in config.seeds]
        rates: dict[str, dict[int, float]] = {arm: {} for arm in ALL_ARMS}
        try:
            if config.jobs == 1:
                # One worker thread: MLflow's active-run stack is per thread, so the jobs' stage runs nest
                # under their arm's detached run instead of clashing with this thread's active parent run.
                with concurrent.futures.ThreadPoolExecutor(1) as worker:
                    for arm, seed in jobs:
                        rates[arm][seed] = worker.submit(
                            _run_job, config, arm, seed, plans[arm].steps, work, sandbox, grand[arm]
                        ).result()
            else:
                # Processes, not threads: each job trains and generates on its own core without the GIL, and
                # "spawn" keeps the parent's active MLflow run and HTTP pools out of the children.
                ctx = multiprocessing.get_context("spawn")
                with concurrent.futures.ProcessPoolExecutor(config.jobs, mp_context=ctx) as pool:
                    futures = {
                        pool.submit(_run_job, config, arm, seed, plans[arm].steps, work, sandbox, grand[arm]): (
                            arm,
                            seed,
                        )
                        for arm, seed in jobs
                    }
                    for future in concurrent.futures.as_completed(futures):
                        arm, seed = futures[future]
                        rates[arm][seed] = future.result()
                        print(f"ablation: {arm} seed {seed} -> held-out pass@1 {rates[arm][seed]:.3f}", flush=True)
        except BaseException:
            for arm in ALL_ARMS:
                close_detached_run(arm_runs[arm], child, _seed_metrics(rates[arm]), failed=True)
            raise
        rows = arm_results(work, plans, config.seeds)
        for row in rows:
            close_detached_run(arm_runs[row.arm], child, _seed_metrics(rates[row.arm]) + _summary(row))
        table = [r.model_dump(mode="json") for r in rows]
        log_json(table, "ablation_table.json")
    (work / "ablation_table.json").write_text(json.dumps(table, indent=2))
    return rows
