"""Adaptive rollout vs fixed-size groups, DAPO dynamic sampling and BAR, per generated trajectory.

    .venv/bin/python scripts/compare_rollout.py                 # synthetic + real (tiny policy, sandboxes)
    .venv/bin/python scripts/compare_rollout.py --synthetic-only

Held constant between the arms: the group size N = 8, the prompt set, the order of every epoch, the
outcome draws (common random numbers: the k-th attempt of a prompt has the same luck in every arm), the
reward (verified outcome, +1/-1). Budget is counted in trajectories and in environment steps (a forked
attempt's teacher prefix included). Measured: informative groups (mixed verified rewards, the only
groups with a gradient) per generated trajectory and per 1k environment steps, trajectories trained on
/ generated, summed group reward variance per trajectory, and, for the real arms, the held-out
resolved rate after RL (beside the SFT checkpoint's own rate).

1. Synthetic: a fixed prompt set per population (pass rates known); every arm passes over it (reshuffled
   each pass) until the same number of trajectories is spent (`--synthetic-trajectories`): arms are
   compared at equal trajectories, not at equal passes (an arm that skips or abandons prompts would
   otherwise get a smaller denominator for free). Arms: fixed N=8, DAPO N=8 (drop uniform groups,
   refill), BAR with the published settings (N=8, N_max=16, s=16, [0.375, 0.625]), BAR's rule at s=4,
   the sampler's options added one at a time (early stop, + history, + prefix fork) and BAR with all
   of them. Each arm is an MLflow run with the group-statistics plot (unless --no-synthetic-tracking).

What the synthetic part assumes, and what it therefore cannot show:
- Prefix forking: a forked attempt's pass rate is *assumed* (`SyntheticSource`: p + (1 - p) * f^2 after
  a fraction f of a teacher trajectory). Every population is run under that assumption and under
  "forking adds nothing" (p_fork = p); a fork arm's gain that vanishes under the second is the formula's,
  not a measurement (on hard / bimodal prompts it then sits at or below "+ history").
- BAR with the published settings has s = N_max = 16: all 16 attempts are generated in one wave before
  a group is chosen, so it can never stop early and per trajectory it is built to lose to anything
  that can (the published system counts groups per step, not per trajectory). "BAR s=4" is the same
  rule given the chance to stop after each wave.
- Pass rates are fixed per prompt (no learning between passes), outcomes independent across attempts.
2. Real: tasks of the built-in SWE suite, an SFT checkpoint (given, or distilled from the scripted
   teacher and trained here), `components.rl.stage.train_rl` for each arm, `components.evaluate` on held-out
   tasks. Each arm is an MLflow run (with the BAR group-statistics plot) under one parent run.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.core.tracking import TrackingConfig, log_figure, log_json, log_metrics, stage_run  # noqa: E402
from components.rl.sampling import PromptHistory, RolloutBudget, RolloutConfig, sample_batch, summarize  # noqa: E402
from components.rl.sampling.synthetic import SyntheticPrompt, SyntheticSource  # noqa: E402

POPULATIONS = {  # pass rate of a prompt
    "uniform": lambda rng: rng.random(),
    "hard": lambda rng: rng.betavariate(0.5, 2.5),  # Beta(0.5, 2.5): mostly rarely solved
    "bimodal": lambda rng: 0.0 if (u := rng.random()) < 0.4 else 1.0 if u < 0.6 else rng.random(),  # 40/20/40
}
_ADAPTIVE = dict(sampler="fixed", stride=2, early_stop=True, advantage_baseline="pool")
ARMS = {  # the same N = 8 everywhere
    "fixed N=8": RolloutConfig(sampler="fixed", refill=False),
    "DAPO N=8": RolloutConfig(sampler="fixed", refill=True),
    "BAR published s=16": RolloutConfig(
        sampler="bar",
        stride=16,
        group_choice="ranked",  # s = N_max
        advantage_baseline="group",
    ),
    "BAR s=4": RolloutConfig(sampler="bar", stride=4, group_choice="ranked", advantage_baseline="group"),
    "early stop s=2": RolloutConfig(**_ADAPTIVE),
    "+ history": RolloutConfig(**_ADAPTIVE, history=True),
    "+ history + prefix fork": RolloutConfig(**_ADAPTIVE, history=True, prefix_fork=True),
    "BAR s=4 + all options": RolloutConfig(sampler="bar", stride=4, early_stop=True, history=True, prefix_fork=True),
}
HEADLINE = "+ history + prefix fork"
# What a forked attempt's pass rate is taken to be (SyntheticSource.prefix_exponent): the assumed formula,
# and forking adding nothing (f ** inf = 0: p_fork = p). Every population runs under both.
FORK_ASSUMPTIONS = {"assumed p+(1-p)f^2": 2.0, "none (p_fork = p)": math.inf}
# The real arms: each is a train_rl run (MLflow, group-statistics plot) and an evaluation, with the RL stage's
# advantages (the pool rule) and group choice (drawn). TRL deals exactly batch_prompts prompts per step, so DAPO
# refill has no real arm (the stage's refill replaces a dropped group instead: components/rl/stage.py's docstring).
REAL_ARMS = {
    "fixed": dict(sampler="fixed"),
    "bar": dict(sampler="bar"),
    "adaptive": dict(_ADAPTIVE, history=True, prefix_fork=True),
}


def prompt_stream(task_ids: list[str], seed: int):
    """Task ids forever, reshuffled on every pass."""
    rng = random.Random(seed)
    while True:
        order = list(task_ids)
        rng.shuffle(order)
        yield from order


def balance(records) -> float:
    """Mean |positive fraction - 1/2| of kept groups (0 = perfectly balanced)."""
    kept = [r for r in records if r.kept]
    return sum(abs(r.group_positives / r.group_size - 0.5) for r in kept) / len(kept) if kept else float("nan")


def synthetic_prompts(rates: list[float], seed: int, teacher_coverage: float) -> dict[str, SyntheticPrompt]:
    rng = random.Random(seed + 7)
    return {
        f"p{i}": SyntheticPrompt(pass_rate=r, steps=rng.randint(5, 20), has_teacher=rng.random() < teacher_coverage)
        for i, r in enumerate(rates)
    }


def run_arm(
    cfg: RolloutConfig, prompts: dict[str, SyntheticPrompt], trajectories: int, seed: int, prefix_exponent: float = 2.0
) -> list:
    """Every arm: the same prompt set, the same order of every pass, the same outcome draws (common random
    numbers), and the same number of trajectories (the budget ends the run, mid-prompt if need be)."""
    source = SyntheticSource(prompts, seed + 1, prefix_exponent=prefix_exponent)
    history = PromptHistory(cfg, seed + 2)
    budget = RolloutBudget(trajectories)
    records = []
    epoch = 0
    while budget.remaining > 0:
        order = sorted(prompts)
        random.Random(seed * 1000 + epoch).shuffle(order)
        stream = history.prefer(iter(order)) if cfg.history else iter(order)
        step = 0
        while budget.remaining > 0:
            batch = sample_batch(stream, source, cfg, budget, step=epoch * 10_000 + step, history=history, seed=seed)
            records += batch.records
            step += 1
            if batch.stop_reason == "prompts_exhausted":
                break
        epoch += 1
    return records


def synthetic(
    n_prompts: int,
    trajectories: int,
    seed: int,
    teacher_coverage: float,
    tracking: TrackingConfig | None,
    extra: dict[str, list[float]] | None = None,
):
    from components.rl.plots import plot_group_statistics

    rows = []
    populations = {name: None for name in POPULATIONS} | {name: rates for name, rates in (extra or {}).items()}
    for pop_name, given in populations.items():
        rng = random.Random(seed)
        draws = given if given is not None else [POPULATIONS[pop_name](rng) for _ in range(n_prompts)]
        prompts = synthetic_prompts(draws, seed, teacher_coverage)
        for (assumption, exponent), (arm_name, cfg) in [(f, a) for f in FORK_ASSUMPTIONS.items() for a in ARMS.items()]:
            if exponent != 2.0 and not cfg.prefix_fork:
                continue  # arms that never fork do not depend on the assumption
            cfg = cfg.model_copy(update={"max_prompts_per_batch": 10 * len(prompts), "batch_prompts": 8})
            label = arm_name if exponent == 2.0 else f"{arm_name}, p_fork=p"
            run_tracking = (
                tracking.model_copy(update={"run_name": f"synthetic {pop_name} / {label}"}) if tracking else None
            )
            with stage_run("compare-rollout-synthetic", cfg, run_tracking):
                records = run_arm(cfg, prompts, trajectories, seed, prefix_exponent=exponent)
                row = {
                    "population": pop_name,
                    "arm": label,
                    "fork_assumption": assumption,
                    **summarize(records),
                    "imbalance": balance(records),
                }
                log_metrics({k: v for k, v in row.items() if isinstance(v, float)})
                if tracking is not None and tracking.enabled:
                    import matplotlib.pyplot as plt

                    fig = plot_group_statistics(records, f"{arm_name}, {pop_name}")
                    log_figure(fig, "group_statistics.png")
                    plt.close(fig)
                rows.append(row)
    return rows


def print_synthetic(rows: list[dict], n_prompts: int, trajectories: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"Synthetic: {n_prompts} prompts, {trajectories} trajectories in every arm, N=8; "
        "fork arms under the assumed fork pass rate and under 'fork adds nothing'"
    )
    for col in (
        "population",
        "arm",
        "p_fork",
        "traj",
        "env steps",
        "groups",
        "groups/traj",
        "vs fixed",
        "vs DAPO",
        "groups/1k steps",
        "trained/gen",
        "var/traj",
        "skipped",
        "abandoned",
        "forked",
        "imbalance",
    ):
        table.add_column(col, justify="right")
    per = {(r["population"], r["arm"]): r for r in rows}

    def ratio(r: dict, base: str, key: str = "informative_groups_per_trajectory") -> str:
        b = per.get((r["population"], base), {}).get(key)
        return f"{r[key] / b:.2f}x" if b else "-"

    for r in rows:
        fork = "-" if not r["forked_trajectories"] else "p" if "p_fork=p" in r["arm"] else "p+(1-p)f^2"
        table.add_row(
            r["population"],
            r["arm"],
            fork,
            f"{r['trajectories']:.0f}",
            f"{r['env_steps']:.0f}",
            f"{r['informative_groups']:.0f}",
            f"{r['informative_groups_per_trajectory']:.4f}",
            ratio(r, "fixed N=8"),
            ratio(r, "DAPO N=8"),
            f"{r['informative_groups_per_1k_env_steps']:.2f}",
            f"{r['trained_over_generated']:.2f}",
            f"{r['group_reward_variance_per_trajectory']:.4f}",
            f"{r.get('dropped_skipped', 0):.0f}",
            f"{r.get('dropped_abandoned', 0):.0f}",
            f"{r['forked_trajectories']:.0f}",
            f"{r['imbalance']:.3f}",
        )
    Console(width=200).print(table)


def build_sft_model(args, sandbox, tasks_dir: Path, work: Path, tracking) -> Path:
    from components.distill import DistillConfig, distill
    from components.sft.stage import SFTConfig, train_sft

    model_dir = work / "sft"
    if (model_dir / "config.json").exists():
        return model_dir
    traj_dir = work / "distilled"
    if not (traj_dir / "manifest.json").exists():
        distill(
            DistillConfig(error_rate=args.teacher_error_rate, sandbox=sandbox, max_parallel=2, progress=True),
            tasks_dir,
            traj_dir,
            tracking=tracking,
        )
    train_sft(
        SFTConfig(mode="resolved_only", steps=args.sft_steps, batch_size=8, max_len=1024),
        traj_dir,
        model_dir,
        tracking=tracking,
    )
    return model_dir


def real(args, sandbox, work: Path, tracking: TrackingConfig | None) -> dict:
    from components.core.episode.harness import HarnessConfig
    from components.core.policy.base import GenerationConfig
    from components.core.data.parquet_store import TaskStore
    from components.evaluate import EvalConfig, evaluate
    from components.recipes import get_recipe
    from components.rl.stage import RLConfig, train_rl
    from components.rl.sampling import PromptRecord

    tasks_dir = work / "tasks"
    if not TaskStore(tasks_dir).shards():
        recipe = get_recipe("swe", difficulty=1)
        TaskStore(tasks_dir).write(
            recipe.tasks("train", args.train_tasks, seed=args.seed)
            + recipe.tasks("heldout", args.heldout_tasks, seed=args.seed)
        )
    model_dir = Path(args.model_dir) if args.model_dir else build_sft_model(args, sandbox, tasks_dir, work, tracking)
    harness = HarnessConfig(
        max_steps=args.max_steps, max_wall_seconds=300, generation=GenerationConfig(max_new_tokens=args.max_new_tokens)
    )
    eval_cfg = EvalConfig(
        k=args.eval_k, temperature=args.eval_temperature, harness=harness, sandbox=sandbox, workers=1, seed=args.seed
    )
    named = lambda name: tracking.model_copy(update={"run_name": name}) if tracking else None  # noqa: E731
    out = {"sft": evaluate(eval_cfg, tasks_dir, model_dir, work / "eval" / "sft", named("eval sft")).model_dump()}
    references = work / "distilled"  # the teacher's trajectories: what the adaptive arm forks from
    for arm in args.real_arms:
        rollout = {"stride": args.stride} | REAL_ARMS[arm]
        cfg = RLConfig(
            rollout=RolloutConfig(**rollout, batch_prompts=args.batch_prompts, max_prompts_per_batch=64),
            rollout_budget=args.budget,
            steps=-(-args.budget // 8),  # an upper bound: the budget ends it
            learning_rate=args.lr,
            harness=harness,
            sandbox=sandbox,
            temperature=1.0,
            seed=args.seed,
            num_threads=args.threads,
            prefix_trajectories=str(references) if rollout.get("prefix_fork") and references.exists() else None,
        )
        rl = train_rl(cfg, tasks_dir, model_dir, work / f"rl-{arm}", tracking=named(f"rl {arm}"))
        ev = evaluate(eval_cfg, tasks_dir, rl.model_dir, work / "eval" / arm, named(f"eval rl {arm}"))
        records = [PromptRecord.model_validate_json(line) for line in open(rl.records_path)]
        out[arm] = {
            "rl": rl.model_dump(),
            "eval": ev.model_dump(),
            "imbalance": balance(records),
            "pass_rates": _pass_rates(records),
        }
    return out


def teacher_sampling(args, sandbox, work: Path, tracking: TrackingConfig | None) -> dict:
    """Both samplers over real SWE episodes of the scripted teacher (no training): a policy whose
    per-task pass rates sit in between, which the tiny SFT model's do not."""
    from components.core.episode.harness import HarnessConfig
    from components.core.data.parquet_store import TaskStore
    from components.recipes import get_recipe
    from components.recipes.swe.teacher import ScriptedTeacher
    from components.rl.config import RLConfig
    from components.rl.rollout import EpisodeSource
    from components.rl.plots import plot_group_statistics

    recipe = get_recipe("swe", difficulty=1)
    tasks_dir = work / "tasks"
    if not TaskStore(tasks_dir).shards():
        TaskStore(tasks_dir).write(
            recipe.tasks("train", args.train_tasks, seed=args.seed)
            + recipe.tasks("heldout", args.heldout_tasks, seed=args.seed)
        )
    tasks = {t.id: t for t in TaskStore(tasks_dir).read(split="train")}
    out = {}
    with sandbox.client() as client:
        for arm in ("fixed", "bar"):
            cfg = RolloutConfig(sampler=arm, stride=args.stride, batch_prompts=1, max_prompts_per_batch=64)
            rl_cfg = RLConfig(rollout=cfg, harness=HarnessConfig(max_steps=12), sandbox=sandbox, seed=args.seed)
            run_tracking = tracking.model_copy(update={"run_name": f"teacher sampling {arm}"}) if tracking else None
            with stage_run("compare-rollout-teacher", rl_cfg, run_tracking):
                teacher = ScriptedTeacher(error_rate=args.teacher_sampling_error_rate, seed=args.seed)
                source = EpisodeSource(tasks, recipe, teacher, client, rl_cfg)
                budget, prompts, records = RolloutBudget(args.budget), prompt_stream(sorted(tasks), args.seed), []
                while budget.remaining > 0:
                    records += sample_batch(prompts, source, cfg, budget, seed=args.seed).records
                s = summarize(records) | {"imbalance": balance(records)}
                log_metrics(s)
                if tracking is not None:
                    import matplotlib.pyplot as plt

                    fig = plot_group_statistics(records, f"scripted teacher, {arm}")
                    log_figure(fig, "group_statistics.png")
                    plt.close(fig)
                out[arm] = s
    f, b = (out[a]["informative_groups_per_trajectory"] for a in ("fixed", "bar"))
    print(
        f"teacher sampling: fixed {out['fixed']['informative_groups']:.0f} groups / "
        f"{out['fixed']['trajectories']:.0f} episodes, BAR {out['bar']['informative_groups']:.0f} / "
        f"{out['bar']['trajectories']:.0f}; BAR / fixed per trajectory = "
        + (f"{b / f:.2f}x" if f else "undefined")
        + f"; imbalance fixed {out['fixed']['imbalance']:.3f}, "
        f"BAR {out['bar']['imbalance']:.3f}"
    )
    return out


def _pass_rates(records) -> dict[str, float]:
    """Empirical pass rate per prompt over every verified attempt (feeds a 'measured' synthetic population)."""
    pos: dict[str, int] = {}
    tot: dict[str, int] = {}
    for r in records:
        pos[r.prompt_id] = pos.get(r.prompt_id, 0) + r.pool_positives
        tot[r.prompt_id] = tot.get(r.prompt_id, 0) + r.pool_positives + r.pool_negatives
    return {k: pos[k] / tot[k] for k in tot if tot[k]}


def print_real(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Real: tiny SFT policy on the SWE suite, equal rollout budget")
    for col in (
        "arm",
        "trajectories",
        "informative groups",
        "per trajectory",
        "updates",
        "infra errors",
        "imbalance",
        "held-out resolved [95% CI]",
    ):
        table.add_column(col, justify="right")
    sft = out["sft"]
    table.add_row(
        "SFT (start)",
        "-",
        "-",
        "-",
        "-",
        "-",
        "-",
        f"{sft['resolved_rate']:.3f} [{sft['resolved_rate_ci95'][0]:.2f}, {sft['resolved_rate_ci95'][1]:.2f}]",
    )
    arms = [a for a in REAL_ARMS if a in out]
    for arm in arms:
        rl, ev = out[arm]["rl"], out[arm]["eval"]
        table.add_row(
            arm,
            str(rl["trajectories"]),
            str(rl["informative_groups"]),
            f"{rl['informative_groups_per_trajectory']:.4f}",
            str(rl["steps_done"]),
            str(rl["infra_errors"]),
            f"{out[arm]['imbalance']:.3f}",
            f"{ev['resolved_rate']:.3f} [{ev['resolved_rate_ci95'][0]:.2f}, {ev['resolved_rate_ci95'][1]:.2f}]",
        )
    Console(width=140).print(table)
    base = arms[0]
    f = out[base]["rl"]["informative_groups_per_trajectory"]
    for arm in arms[1:]:
        b = out[arm]["rl"]["informative_groups_per_trajectory"]
        print(
            f"real: {arm} / {base} informative groups per trajectory = {b / f:.2f}x"
            if f
            else f"real: {arm} {b:.4f} groups per trajectory; the {base} arm produced none (ratio undefined)"
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", type=Path, default=Path("build/compare_rollout"))
    p.add_argument("--synthetic-only", action="store_true", help="Skip the sandbox part.")
    p.add_argument(
        "--teacher-sampling",
        action="store_true",
        help="Sandbox part with the scripted teacher as the rollout policy (sampler only, no training).",
    )
    p.add_argument("--teacher-sampling-error-rate", type=float, default=0.5)
    p.add_argument("--synthetic-prompts", type=int, default=512, help="Fixed prompt set per synthetic population.")
    p.add_argument(
        "--synthetic-trajectories",
        type=int,
        default=None,
        help="Trajectories every synthetic arm spends (default: 3 passes of fixed N=8, 24 x prompts).",
    )
    p.add_argument(
        "--teacher-coverage",
        type=float,
        default=0.8,
        help="Fraction of synthetic prompts with a successful teacher trajectory to fork from.",
    )
    p.add_argument("--no-synthetic-tracking", action="store_true", help="Skip the per-arm MLflow runs and plots.")
    p.add_argument("--model-dir", default=None, help="SFT checkpoint (default: distill + SFT here).")
    p.add_argument("--train-tasks", type=int, default=16)
    p.add_argument("--heldout-tasks", type=int, default=8)
    p.add_argument("--budget", type=int, default=64, help="Rollouts per real arm.")
    p.add_argument("--batch-prompts", type=int, default=2, help="Groups per RL update.")
    p.add_argument("--stride", type=int, default=16, help="BAR stride s in the real arms.")
    p.add_argument(
        "--real-arms",
        nargs="+",
        choices=list(REAL_ARMS),
        default=list(REAL_ARMS),
        help="Real arms to train (the first is the ratio's baseline).",
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-steps", type=int, default=8, help="Assistant turns per episode.")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--eval-k", type=int, default=1)
    p.add_argument("--eval-temperature", type=float, default=0.0)
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--teacher-error-rate", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; on a shared 2-core box 1 is several times faster than 2.",
    )
    p.add_argument("--tracking-uri", default=None, help="MLflow URI (default: sqlite in the work dir).")
    p.add_argument("--sandbox-url", default=None, help="Use this sandbox service instead of starting one.")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tracking = TrackingConfig(
        tracking_uri=args.tracking_uri or f"sqlite:///{args.work_dir.resolve()}/mlflow.db", experiment="compare-rollout"
    )
    with stage_run("compare-rollout", None, tracking) as parent:
        child = tracking.model_copy(update={"parent_run_id": parent.info.run_id})
        out: dict = {}
        if not args.synthetic_only:
            from sandbox_service.connection import SandboxConnection

            part, key = (teacher_sampling, "teacher") if args.teacher_sampling else (real, "real")
            if args.sandbox_url:
                out[key] = part(args, SandboxConnection(url=args.sandbox_url), args.work_dir, child)
            else:
                from sandbox_service.embedded import EmbeddedService

                with EmbeddedService() as service:
                    out[key] = part(args, service.connection(), args.work_dir, child)
        measured = {}
        first = next((a for a in REAL_ARMS if a in out.get("real", {})), None)
        if first and out["real"][first]["pass_rates"]:
            measured["measured"] = list(out["real"][first]["pass_rates"].values())
        spend = args.synthetic_trajectories or 24 * args.synthetic_prompts
        out["synthetic"] = synthetic(
            args.synthetic_prompts,
            spend,
            args.seed,
            args.teacher_coverage,
            None if args.no_synthetic_tracking else child,
            measured,
        )
        print_synthetic(out["synthetic"], args.synthetic_prompts, spend)
        _log_synthetic_plot(out["synthetic"])
        if "real" in out:
            print_real(out["real"])
            arms = [a for a in REAL_ARMS if a in out["real"]]
            log_metrics(
                {
                    **{
                        f"real.{a}.informative_groups_per_trajectory": out["real"][a]["rl"][
                            "informative_groups_per_trajectory"
                        ]
                        for a in arms
                    },
                    **{f"real.{a}.heldout_resolved_rate": out["real"][a]["eval"]["resolved_rate"] for a in arms},
                    "real.sft.heldout_resolved_rate": out["real"]["sft"]["resolved_rate"],
                }
            )
        _log_comparison_plot(args.work_dir)
        log_json(out, "compare_rollout.json")
    (args.work_dir / "compare_rollout.json").write_text(json.dumps(out, indent=2, default=str))


def _log_synthetic_plot(rows: list[dict]) -> None:
    """Informative groups per trajectory of every synthetic arm relative to fixed N=8, on the parent run."""
    import matplotlib.pyplot as plt

    from components.rl.plots import plot_arm_ratios

    fig = plot_arm_ratios(rows, "fixed N=8")
    log_figure(fig, "synthetic_groups_per_trajectory.png")
    plt.close(fig)


def _log_comparison_plot(work: Path) -> None:
    """Cumulative informative groups vs trajectories of the real arms, if they ran."""
    from components.rl.plots import plot_comparison
    from components.rl.sampling import PromptRecord

    arms = {}
    for arm in REAL_ARMS:
        path = work / f"rl-{arm}" / "rollout_records.jsonl"
        if path.exists():
            arms[arm] = [PromptRecord.model_validate_json(line) for line in open(path)]
    if arms:
        import matplotlib.pyplot as plt

        fig = plot_comparison(arms)
        log_figure(fig, "real_informative_groups.png")
        plt.close(fig)


if __name__ == "__main__":
    main()
