"""Does RL beat SFT? The learning benchmark on the tiny model (`make bench-learning`; a script, not a test).

    .venv/bin/python scripts/bench_learning.py                      # one seed, ~2 h on an idle 2-core machine
    .venv/bin/python scripts/bench_learning.py --seeds 0 1          # more seeds, if there is time
    .venv/bin/python scripts/bench_learning.py --pilot              # every step at toy sizes (minutes)

Per seed, in one process with one sandbox service (every stage is the pipeline's own function and config):
1. Tasks: generated SWE tasks at difficulty 1, two bug families, all eight package names (the held-out set
   needs >= 150 distinct repositories); train / validation / held-out disjoint by repository
   (components/core/data/splits.py); the held-out set is the same for every seed (its digest is checked).
2. Teacher data: the scripted teacher, one attempt per training task, at error rate `--teacher-error-rate` (0.3:
   per decision it may open the wrong file first, make a wrong edit and repair it, or give up; SFT on its
   resolved trajectories imitates the recoverable mistakes too, which is what RL, rewarded for the outcome, can
   unlearn and more imitation cannot).
3. SFT from scratch, run to convergence: `--sft-steps` steps, and the run says whether the loss had stopped
   falling (the mean of its last tenth within 10 % of the tenth before).
4. The training temperature is chosen on the VALIDATION split, never the held-out one: among `--temperatures`,
   the one whose SFT pass@1 (k = 4) is nearest 0.4 with pass@4 - pass@1 >= 0.2 (headroom that sampling shows and
   RL can sharpen), else nearest 0.4.
5. From the SFT model, two arms with the same extra training compute:
   - RL: TRL GRPO with BAR (groups of 8 from up to 16, 8 prompts per update, `--rl-steps` updates) at that
     temperature, the pool baseline, refill; learning rate `--rl-lr`;
   - SFT-continued: the same SFT, on the same teacher data, for as many more tokens through the model as RL
     trained on (TRL's num_tokens of the RL run), so "more training" is not mistaken for RL.
6. SFT, SFT-continued and RL on the held-out tasks: k = 4 attempts each at the training temperature (the same
   attempt seeds for every model) and one greedy attempt.
7. RL - SFT and RL - SFT-continued in pass@1 per task (from the k sampled attempts): the mean difference with a
   95 % interval over tasks (clustered by repository; with several seeds, task and seed variance combined:
   `intervals.paired_difference_over_seeds`), and the exact one-sided sign-flip p-value.

Everything is logged to MLflow (`<work-dir>/mlflow.db`: a parent run per seed, a child per stage), and the
results to `<work-dir>/bench_learning.json`. Run it with nothing beside it: a busy machine makes it many times
slower and the wall time meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_PASS_AT_1 = 0.4  # the middle of the band the SFT model should sit in at the training temperature
BAND = (0.3, 0.5)
MIN_HEADROOM = 0.2  # pass@4 - pass@1 at that temperature


def settings(args: argparse.Namespace, seed: int) -> list[str]:
    """The benchmark's PipelineConfig overrides (on the demo preset), as `orchard run --set` items."""
    pilot = args.pilot
    return [
        f"seed={seed}",
        "register_model_name=null",
        # tasks: two single-line bug families, every package name (enough distinct repositories for the held-out set)
        f"provision.n_train={12 if pilot else args.train_tasks}",
        f"provision.n_validation={8 if pilot else args.validation_tasks}",
        f"provision.n_heldout={8 if pilot else args.heldout_tasks}",
        # (packages [] = all eight: the demo preset's two would hold only ~45 distinct held-out repositories)
        'provision.recipe_options={"families": ["off_by_one", "wrong_operator"], "packages": []}',
        "provision.check_sandbox=false",
        "distill.max_parallel=4",
        f"distill.error_rate={args.teacher_error_rate}",
        "sft.mode=resolved_only",
        f"sft.steps={6 if pilot else args.sft_steps}",
        "sft.warmup_steps=20",
        # RL: BAR groups of 8 from up to 16 in waves of 8, 8 prompts per update
        f"rl.steps={2 if pilot else args.rl_steps}",
        f"rl.learning_rate={args.rl_lr}",
        f"rl.kl_coef={args.kl_coef}",
        f"rl.rollout_budget={64 if pilot else args.rl_steps * 8 * 24}",
        f"rl.rollout.group_size={2 if pilot else 8}",
        f"rl.rollout.max_rollouts_per_prompt={4 if pilot else 16}",
        f"rl.rollout.stride={2 if pilot else 8}",
        f"rl.rollout.batch_prompts={2 if pilot else 8}",
        "rl.rollout.max_prompts_per_batch=16",
        "rl.rollout.refill=true",
        "evaluate.k=4",
        "evaluate.greedy=true",
        "evaluate.workers=16",
    ]


def headroom_pick(rows: dict[float, dict[str, float]]) -> float:
    """The temperature whose pass@1 is nearest TARGET_PASS_AT_1 among those with enough pass@4 - pass@1 headroom
    (all of them when none has it)."""
    good = {t: r for t, r in rows.items() if r["pass_at_4"] - r["pass_at_1"] >= MIN_HEADROOM} or rows
    return min(good, key=lambda t: (abs(good[t]["pass_at_1"] - TARGET_PASS_AT_1), t))


def converged(losses: list[float]) -> bool:
    """The loss had stopped falling: the mean of its last tenth is within 10 % of the tenth before."""
    tenth = max(1, len(losses) // 10)
    if len(losses) < 2 * tenth:
        return False
    last, before = statistics.fmean(losses[-tenth:]), statistics.fmean(losses[-2 * tenth : -tenth])
    return last >= 0.9 * before


def per_task(eval_dir: Path) -> tuple[dict[str, float], dict[str, str]]:
    """(task -> pass@1, task -> unit) of one evaluation."""
    import pandas as pd

    table = pd.read_parquet(eval_dir / "per_task.parquet")
    return dict(zip(table.task_id, table.pass_at_1.astype(float))), dict(zip(table.task_id, table.unit))


def run_seed(args: argparse.Namespace, seed: int, connection: Any, tracking_uri: str) -> dict[str, Any]:
    import mlflow

    from components.core.tracking import TrackingConfig
    from components.distill import distill
    from components.evaluate import evaluate
    from components.provision import provision_environment
    from components.rl.stage import train_rl
    from components.sft.stage import train_sft
    from pipelines.config import resolve

    config = resolve("demo", settings(args, seed))
    work = args.work_dir / f"seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    client = mlflow.MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("bench-learning") or client.get_experiment(
        client.create_experiment("bench-learning")
    )
    parent = client.create_run(
        experiment.experiment_id, run_name=f"bench-learning-seed{seed}", tags={"orchard.bench": "learning"}
    ).info.run_id
    tracking = TrackingConfig(tracking_uri=tracking_uri, experiment="bench-learning", parent_run_id=parent)

    def section(name: str, **update: Any) -> Any:
        return getattr(config, name).model_copy(update={"sandbox": connection, **update})

    seconds: dict[str, float] = {}

    def timed(name: str, fn, *a, **kw):
        t0 = time.perf_counter()
        print(f"[seed {seed}] {name} ...", flush=True)
        out = fn(*a, **kw, tracking=tracking.model_copy(update={"run_name": name}))
        seconds[name] = time.perf_counter() - t0
        print(f"[seed {seed}] {name} done in {seconds[name]:.0f} s", flush=True)
        return out

    tasks = work / "tasks"
    prov = timed("provision", provision_environment, section("provision"), tasks)
    timed("distill", distill, section("distill"), tasks, work / "teacher")
    sft = timed("sft", train_sft, config.sft, work / "teacher", work / "sft")
    sft_losses = (
        json.loads((work / "sft" / "sft_result.json").read_text()).get("losses")
        if (work / "sft" / "sft_result.json").exists()
        else None
    )

    # the training temperature, chosen on validation
    calibration: dict[float, dict[str, float]] = {}
    for temperature in args.temperatures:
        result = timed(
            f"calibrate-T{temperature}",
            evaluate,
            section("evaluate", split="validation", temperature=temperature, greedy=False),
            tasks,
            work / "sft",
            work / f"validation-T{temperature}",
        )
        calibration[temperature] = {"pass_at_1": result.pass_at_1, "pass_at_4": result.pass_at_k}
    temperature = headroom_pick(calibration)
    print(f"[seed {seed}] training temperature {temperature} (validation: {calibration})", flush=True)

    rl = timed("rl", train_rl, section("rl", temperature=temperature), tasks, work / "sft", work / "rl")
    rl_tokens = rl.metrics.get("num_tokens", 0.0)
    sft_tokens_per_step = sft.metrics.get("tokens_per_step") or sft.metrics.get("tokens", 0.0) / max(1, sft.steps)
    extra_steps = max(1, round(rl_tokens / max(sft_tokens_per_step, 1.0)))
    continued_config = config.sft.model_copy(update={"steps": extra_steps, "warmup_steps": 0})
    continued = timed(
        "sft-continued",
        train_sft,
        continued_config,
        work / "teacher",
        work / "sft-continued",
        base_model_dir=work / "sft",
    )

    arms = {"sft": work / "sft", "sft_continued": work / "sft-continued", "rl": work / "rl"}
    results = {}
    for arm, model_dir in arms.items():
        results[arm] = timed(
            f"evaluate-{arm}",
            evaluate,
            section("evaluate", temperature=temperature),
            tasks,
            model_dir,
            work / f"heldout-{arm}",
        )
    client.set_terminated(parent)
    scores = {arm: per_task(work / f"heldout-{arm}")[0] for arm in arms}
    units = per_task(work / "heldout-sft")[1]
    return {
        "seed": seed,
        "heldout_digest": prov.heldout_digest,
        "heldout_tasks": prov.counts.get("heldout"),
        "temperature": temperature,
        "calibration": calibration,
        "seconds": seconds,
        "sft": {
            "steps": sft.steps,
            "converged": converged(sft_losses) if sft_losses else None,
            "final_loss": sft.metrics.get("final_loss"),
        },
        "rl": {
            "updates": rl.steps_done,
            "episodes": rl.trajectories,
            "informative_groups": rl.informative_groups,
            "tokens": rl_tokens,
            "learning_rate": args.rl_lr,
        },
        "sft_continued": {
            "steps": extra_steps,
            "tokens_per_step": sft_tokens_per_step,
            "tokens": continued.metrics.get("tokens", extra_steps * sft_tokens_per_step),
        },
        "evaluations": {
            arm: {
                "pass_at_1": r.pass_at_1,
                "pass_at_1_ci95": r.pass_at_1_ci95,
                "pass_at_4": r.pass_at_k,
                "greedy_resolved": r.greedy_resolved,
                "greedy_valid": r.greedy_valid,
                "tasks": r.tasks,
                "units": r.units,
            }
            for arm, r in results.items()
        },
        "scores": scores,
        "units": units,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--work-dir", type=Path, default=Path("build/bench-learning"))
    p.add_argument("--pilot", action="store_true", help="toy sizes: checks the wiring in minutes, measures nothing")
    p.add_argument("--train-tasks", type=int, default=400)
    p.add_argument("--validation-tasks", type=int, default=48)
    p.add_argument("--heldout-tasks", type=int, default=160)
    p.add_argument("--sft-steps", type=int, default=800)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0, 1.3])
    p.add_argument(
        "--teacher-error-rate",
        type=float,
        default=0.3,
        help="the scripted teacher's mistake rate per decision (its resolved trajectories keep the mistakes "
        "it recovered from: imitation learns them, RL can unlearn them)",
    )
    p.add_argument("--rl-steps", type=int, default=40)
    p.add_argument("--rl-lr", type=float, default=1e-4)
    p.add_argument("--kl-coef", type=float, default=0.01)
    args = p.parse_args(argv)

    from components.core.statistics.intervals import paired_difference_over_seeds
    from sandbox_service.embedded import EmbeddedService

    args.work_dir.mkdir(parents=True, exist_ok=True)
    tracking_uri = f"sqlite:///{(args.work_dir / 'mlflow.db').resolve()}"
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    runs = []
    with EmbeddedService() as service:
        for seed in args.seeds:
            runs.append(run_seed(args, seed, service.connection(), tracking_uri))
    digests = {r["heldout_digest"] for r in runs}
    if len(digests) != 1:
        raise SystemExit(f"the seeds were evaluated on different held-out sets (digests {sorted(digests)})")
    units = runs[0]["units"]
    summary = {}
    for baseline in ("sft", "sft_continued"):
        summary[f"rl_minus_{baseline}"] = paired_difference_over_seeds(
            {r["seed"]: (r["scores"][baseline], r["scores"]["rl"]) for r in runs}, units=units
        )
    wall = time.perf_counter() - t0
    out = {
        "summary": summary,
        "runs": runs,
        "wall_seconds": wall,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    (args.work_dir / "bench_learning.json").write_text(json.dumps(out, indent=2, default=str))
    for r in runs:
        ev = r["evaluations"]
        print(
            f"seed {r['seed']} (T = {r['temperature']}, {r['heldout_tasks']} held-out tasks in "
            f"{ev['sft']['units']} repositories, k = 4): "
            + "; ".join(
                f"{arm} pass@1 {e['pass_at_1']:.3f} pass@4 {e['pass_at_4']:.3f} greedy {e['greedy_resolved']}/"
                f"{e['greedy_valid']}"
                for arm, e in ev.items()
            )
        )
    for name, s in summary.items():
        print(
            f"{name.replace('_', ' ')}: {s['difference']:+.4f} pass@1, 95 % interval [{s['ci_low']:+.4f}, "
            f"{s['ci_high']:+.4f}] over {s['tasks']} tasks x {s['seeds']} seed(s); exact paired sign-flip p "
            f"= {s['sign_flip_p']:.4g}"
        )
    print(
        f"wall {wall / 60:.1f} min; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
        f"written {args.work_dir / 'bench_learning.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
