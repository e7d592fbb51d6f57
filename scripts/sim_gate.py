"""The promotion gate's false-promotion rates, by simulating the whole two-step rule with equal policies.

Start (untrained), SFT, RL and champion are one policy: per-task pass rates spread out (Beta(0.6, 0.9)), every
evaluation an independent draw of k attempts per task on the same tasks, so any promotion is false. Schedules of
`--gates` gates alternate 16 tasks x 1 attempt and 30 tasks x 2; every other gate is a first run (no champion: the
start is the reference). `components.promote.gate_decision` decides each gate as the promote stage does. The former
rule (RL as soon as it made an update, tested at alpha 0.05 per gate against the champion or the start) is
simulated on the same draws for comparison.

    python scripts/sim_gate.py                      # the defaults: alpha 0.05 over 10 gates (minutes of CPU)
    python scripts/sim_gate.py --alpha 0.3 --schedules 200

`tests/components/test_promote.py` runs it at alpha 0.3 (0.03 per gate), where 200 schedules resolve the rates.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from components.promote import PromotionConfig, Scorecard, decide, gate_decision


def equal_policies(rng: np.random.Generator, tasks: int, k: int):
    """A function arm -> one independent evaluation of the same policy on the same `tasks` (k attempts each)."""
    rates = rng.beta(0.6, 0.9, size=tasks)
    names = [f"t{i}" for i in range(tasks)]

    def evaluated(arm: str) -> Scorecard:
        return Scorecard(
            policy=arm,
            valid_attempts=tasks * k,
            infra_error_rate=0.0,
            trained=arm != "start",
            per_task_pass_at_1=dict(zip(names, rng.binomial(k, rates) / k)),
        )

    return evaluated


def simulate(config: PromotionConfig, schedules: int, gates: int, seed: int = 17) -> dict[str, float]:
    """Shares of gates and of schedules with a (false) promotion, under the rule and under the former one."""
    rng = np.random.default_rng(seed)
    former_config = PromotionConfig(
        alpha=0.05, schedule_gates=1, min_tasks=config.min_tasks, resamples=config.resamples
    )
    counts = {"gates": 0, "schedules": 0, "rl": 0, "former_gates": 0, "former_schedules": 0}
    for schedule in range(schedules):
        evaluated = equal_policies(rng, *((16, 1) if schedule % 2 else (30, 2)))
        any_false = any_former = False
        for gate in range(gates):
            champion = evaluated("champion") if gate % 2 else None
            version = "1" if champion is not None else None
            start, sft, rl = evaluated("start"), evaluated("sft"), evaluated("rl")
            decision = gate_decision(sft, rl, config, champion=champion, champion_version=version, start=start)
            former = decide(rl, champion, former_config, version, start).promoted
            counts["gates"] += decision.promoted
            counts["rl"] += decision.candidate_stage == "rl"
            counts["former_gates"] += former
            any_false |= decision.promoted
            any_former |= former
        counts["schedules"] += any_false
        counts["former_schedules"] += any_former
    n = schedules * gates
    return {
        "per_gate": counts["gates"] / n,
        "per_schedule": counts["schedules"] / schedules,
        "rl_labelled": counts["rl"] / n,
        "former_per_gate": counts["former_gates"] / n,
        "former_per_schedule": counts["former_schedules"] / schedules,
        "gates": float(n),
        "stated_per_gate": config.gate_alpha,
        "stated_per_schedule": config.alpha,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alpha", type=float, default=PromotionConfig().alpha)
    p.add_argument("--gates", type=int, default=PromotionConfig().schedule_gates, help="gates per schedule")
    p.add_argument("--schedules", type=int, default=1500)
    p.add_argument("--seed", type=int, default=23)
    args = p.parse_args(argv)
    config = PromotionConfig(alpha=args.alpha, schedule_gates=args.gates, resamples=200)
    print(json.dumps(simulate(config, args.schedules, args.gates, args.seed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
