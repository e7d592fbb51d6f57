"""RL − SFT on the smol preset: does RL on TRL with our sampler beat SFT on a real pretrained model?

    .venv/bin/python scripts/bench_smol_rl.py                       # seeds 0 1 2, the smol preset as it is
    .venv/bin/python scripts/bench_smol_rl.py --seeds 0 --set provision.n_train=4 ...   # a smoke run

Per seed, the whole pipeline (`pipelines.local.run_local`: teacher data, credit, SFT, RL, evaluations) on
SmolLM2-135M-Instruct (`make smol-model` converts it once). The SFT and RL models of a seed are evaluated on
the same held-out tasks (the preset fixes `provision.heldout_seed`: the same digest for every seed, checked
here) with the same attempt seeds, k attempts each at the RL temperature.

The estimate and its interval:
- d_{i,s} = pass@1_RL - pass@1_SFT of held-out task i in seed s (pass@1 from k attempts).
- RL − SFT = the mean of d over tasks and seeds.
- Two sources of noise: which tasks were held out (task sampling) and how training went (seed). The
  standard error combines the SE of the task means of d (over tasks, averaged over seeds) and the SE of the
  seed means of d (over seeds); their sum of squares counts the task-by-seed interaction twice, so the
  interval is conservative. 95 % Student-t with Welch-Satterthwaite degrees of freedom (tasks - 1 with one
  seed, whose interval then covers task sampling only and says so).
- Also printed: the exact one-sided paired sign-flip p-value over tasks (`intervals.paired_sign_flip_p`).

Hours on 2 CPU cores (1,200 RL episodes and 2 x 400 evaluation episodes per seed); the wall time of every
stage is printed. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_task(run_dir: Path, arm: str) -> dict[str, float]:
    """Per-task pass@1 of one evaluation arm of a run (NaN: no verified attempt)."""
    import pandas as pd

    from pipelines.layout import RunLayout

    table = pd.read_parquet(RunLayout(run_dir).artifact(f"evaluate-{arm}", "results") / "per_task.parquet")
    return dict(zip(table.task_id, table.pass_at_1.astype(float)))


def rl_minus_sft(runs: dict[int, tuple[dict[str, float], dict[str, float]]], level: float = 0.95) -> dict:
    """RL - SFT over tasks and seeds (`intervals.paired_difference_over_seeds`), keyed as this script prints it."""
    from components.core.statistics.intervals import paired_difference_over_seeds

    s = paired_difference_over_seeds(runs, level)
    return {**s, "se_tasks": s["se_units"], "sft_pass_at_1": s["a_pass_at_1"], "rl_pass_at_1": s["b_pass_at_1"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="smol")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="PipelineConfig overrides (as `orchard run --set`), e.g. rl.rollout_budget=64",
    )
    p.add_argument("--runs-dir", type=Path, default=Path("build/bench_smol"))
    p.add_argument("--sandbox-url", default=None, help="Use this sandbox service (default: the runner starts one).")
    args = p.parse_args(argv)

    from components.core.statistics.intervals import task_mean_ci
    from pipelines.config import resolve
    from pipelines.local import run_local

    runs: dict[int, tuple[dict[str, float], dict[str, float]]] = {}
    digests, rows = set(), []
    for seed in args.seeds:
        sets = [*args.sets, f"seed={seed}", "register_model_name=null"]  # a benchmark registers nothing
        if args.sandbox_url:
            sets.append(f"sandbox_url={args.sandbox_url}")
        config = resolve(args.preset, sets)
        t0 = time.perf_counter()
        result = run_local(config, args.runs_dir / f"seed{seed}")
        run_dir = Path(result.run_dir)
        provision = json.loads((run_dir / "results" / "provision.json").read_text())
        digests.add(provision.get("heldout_digest", ""))
        sft, rl = per_task(run_dir, "sft"), per_task(run_dir, "rl")
        runs[seed] = (sft, rl)
        rl_result = json.loads((run_dir / "results" / "rl.json").read_text())
        k = config.evaluate.k
        rows.append(
            {
                "seed": seed,
                "wall_seconds": time.perf_counter() - t0,
                "stage_seconds": result.stage_seconds,
                "sft": statistics.fmean(v for v in sft.values() if v == v),
                "sft_ci95": task_mean_ci(list(sft.values()), attempts_per_task=k),
                "rl": statistics.fmean(v for v in rl.values() if v == v),
                "rl_ci95": task_mean_ci(list(rl.values()), attempts_per_task=k),
                "rl_updates": rl_result.get("steps_done"),
                "rl_episodes": rl_result.get("trajectories"),
                "informative_groups": rl_result.get("informative_groups"),
                "run_dir": str(run_dir),
            }
        )
        r = rows[-1]
        print(
            f"seed {seed}: SFT pass@1 {r['sft']:.3f} [{r['sft_ci95'][0]:.3f}, {r['sft_ci95'][1]:.3f}], "
            f"RL {r['rl']:.3f} [{r['rl_ci95'][0]:.3f}, {r['rl_ci95'][1]:.3f}] (k={k}, {len(sft)} tasks); RL "
            f"{r['rl_updates']} updates from {r['rl_episodes']} episodes ({r['informative_groups']} informative "
            f"groups); wall {r['wall_seconds'] / 60:.1f} min: "
            + ", ".join(f"{s} {v:.0f} s" for s, v in r["stage_seconds"].items()),
            flush=True,
        )
    if len(digests) != 1:
        raise SystemExit(
            f"the seeds were evaluated on different held-out sets (digests {sorted(digests)}); fix "
            "provision.heldout_seed"
        )
    summary = rl_minus_sft(runs)
    one_seed = " (one seed: the interval covers task sampling only)" if summary["seeds"] == 1 else ""
    if math.isnan(summary["ci_low"]):
        one_seed += " (no task differs between the arms: no interval)"
    print(
        f"RL − SFT pass@1 = {summary['difference']:+.4f}, {summary['level']:.0%} interval "
        f"[{summary['ci_low']:+.4f}, {summary['ci_high']:+.4f}] over {summary['tasks']} tasks x "
        f"{summary['seeds']} seed(s){one_seed}; SE tasks {summary['se_tasks']:.4f}, seeds {summary['se_seeds']:.4f}; "
        f"exact paired sign-flip p (RL no better) = {summary['sign_flip_p']:.4f}; held-out digest {digests.pop()}"
    )
    out = args.runs_dir / "bench_smol_rl.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "seeds": rows}, indent=2, default=str))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
