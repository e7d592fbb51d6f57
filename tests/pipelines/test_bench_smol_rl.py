"""scripts/bench_smol_rl.py's estimate: RL − SFT over tasks and seeds with a conservative interval."""

from __future__ import annotations

import math
import random

import pytest

from scripts.bench_smol_rl import rl_minus_sft


def _runs(gain: float, seeds: int, tasks: int = 100, seed_noise: float = 0.0, rng_seed: int = 0):
    rng = random.Random(rng_seed)
    base = [rng.random() for _ in range(tasks)]
    runs = {}
    for s in range(seeds):
        shift = gain + rng.gauss(0, seed_noise)
        sft = {f"t{i}": round(rng.random() < b, 0) for i, b in enumerate(base)}
        rl = {f"t{i}": round(rng.random() < min(1.0, max(0.0, b + shift)), 0) for i, b in enumerate(base)}
        runs[s] = (sft, rl)
    return runs


def test_a_real_gain_is_found_and_no_gain_is_not_claimed():
    up = rl_minus_sft(_runs(0.3, seeds=3))
    assert up["ci_low"] > 0 and up["sign_flip_p"] < 0.01 and up["tasks"] == 100 and up["seeds"] == 3
    null = [rl_minus_sft(_runs(0.0, seeds=3, seed_noise=0.05, rng_seed=r)) for r in range(40)]
    assert sum(n["ci_low"] > 0 for n in null) <= 3  # ~2.5 % one-sided at 95 %, conservative
    one = rl_minus_sft(_runs(0.0, seeds=1))
    assert one["seeds"] == 1 and one["se_seeds"] == 0.0 and one["df"] == pytest.approx(99)


def test_tasks_without_a_verified_result_in_every_arm_are_left_out():
    runs = _runs(0.1, seeds=2, tasks=10)
    runs[1][1]["t3"] = math.nan
    assert rl_minus_sft(runs)["tasks"] == 9
    with pytest.raises(ValueError, match="share none"):
        rl_minus_sft({0: ({"a": math.nan}, {"a": 1.0})})
    with pytest.raises(ValueError, match="every seed"):
        rl_minus_sft({0: ({"a": 0.0}, {"a": 1.0}), 1: ({"b": 0.0}, {"b": 1.0})})


def test_arms_that_never_differ_get_no_interval_not_a_point():
    same = {f"t{i}": 0.0 for i in range(5)}
    summary = rl_minus_sft({0: (same, dict(same))})
    assert summary["difference"] == 0.0 and math.isnan(summary["ci_low"]) and summary["sign_flip_p"] == 1.0
