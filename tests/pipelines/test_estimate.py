"""The whole-run estimate before the first stage and the time left while a run goes (`pipelines/estimate.py`)."""

from __future__ import annotations

import json

import pytest

from pipelines import stages
from pipelines.config import resolve
from pipelines.estimate import BUILT_IN, Schedule, StageEstimate, duration, estimate, record, summary

NAMES = [s.name for s in stages.STAGES]


def _total(config, runs_dir=None) -> float:
    return sum(e.seconds for e in estimate(config, NAMES, runs_dir))


def test_the_built_in_costs_give_back_the_measured_demo_and_the_first_run_is_minutes():
    # the demo on the idle development machine: 524.9 s of pipeline (docs/results.md), 6 s of it outside stages
    assert 500 < _total(resolve("demo")) < 550
    quick = _total(resolve("quick"))
    assert 120 < quick < 300 and quick < _total(resolve("demo")) / 2  # plain `orchard run`: a few minutes
    assert _total(resolve("tiny")) < 60
    by_stage = {e.stage: e for e in estimate(resolve("demo"), NAMES)}
    assert by_stage["sft"].seconds == pytest.approx(53.4, rel=0.05)  # 200 steps x 8 x 1024 tokens
    assert by_stage["rl"].seconds == pytest.approx(300.0, rel=0.05)  # 20 steps, a budget of 800 episodes
    assert by_stage["sft"].unit == "k tokens" and by_stage["sft"].units == pytest.approx(1638.4)


def test_the_estimate_follows_the_sizes():
    base = {e.stage: e.seconds for e in estimate(resolve("quick"), NAMES)}
    bigger = {
        e.stage: e.seconds for e in estimate(resolve("quick", ["sft.steps=400", "provision.n_heldout=32"]), NAMES)
    }
    assert bigger["sft"] == pytest.approx(1 + 2 * (base["sft"] - 1))  # fixed 1 s + twice the tokens
    assert bigger["evaluate-sft"] > base["evaluate-sft"] and bigger["distill"] == base["distill"]


def test_a_model_without_costs_says_so_and_one_run_teaches_them(tmp_path):
    config = resolve("tiny", ["model.path=/some/checkpoint"])
    first = {e.stage: e for e in estimate(config, NAMES, tmp_path)}
    assert first["sft"].seconds is None and first["sft"].source == "unknown"
    assert first["distill"].source == "built in"  # the scripted teacher's cost does not depend on the model
    line = summary(list(first.values()), config)
    assert line.startswith("estimate: at least ~") and "no estimate yet for init-policy, sft, rl" in line
    assert "with model /some/checkpoint on this machine (this run measures them)" in line
    record(tmp_path, config, "sft", 41.0)  # what the runner does after each stage
    learned = {e.stage: e for e in estimate(config, NAMES, tmp_path)}["sft"]
    assert learned.source == "learned here" and learned.seconds == pytest.approx(41.0)
    record(tmp_path, config, "sft", 21.0)  # the mean of the last runs, the newest weighing half
    assert {e.stage: e for e in estimate(config, NAMES, tmp_path)}["sft"].seconds == pytest.approx(31.0)
    # another size of the same stage and model: the same cost per unit, scaled
    double = config.updated(sft={"steps": 2 * config.sft.steps})
    assert {e.stage: e for e in estimate(double, NAMES, tmp_path)}["sft"].seconds == pytest.approx(62.0)
    assert json.loads((tmp_path / "estimates.json").read_text())["sft|/some/checkpoint"]["runs"] == 2


def test_learned_costs_are_per_machine_and_replace_the_built_in_ones(tmp_path):
    config = resolve("tiny")
    built_in = {e.stage: e for e in estimate(config, NAMES, tmp_path)}["evaluate-sft"]
    record(tmp_path, config, "evaluate-sft", 10 * built_in.seconds)  # a machine ten times slower
    learned = {e.stage: e for e in estimate(config, NAMES, tmp_path)}["evaluate-sft"]
    assert learned.source == "learned here" and learned.seconds == pytest.approx(10 * built_in.seconds)
    assert BUILT_IN[("evaluate-sft", "tiny")].fixed < learned.seconds


def test_the_time_left_follows_the_pace_of_the_finished_stages():
    schedule = Schedule(
        [StageEstimate("a", 1, "run", 60.0, "built in"), StageEstimate("b", 1, "run", 120.0, "built in")]
    )
    assert schedule.left() == 180.0
    assert schedule.left("a", elapsed=20.0) == 160.0  # a third of a's time gone
    assert schedule.left("a", elapsed=90.0) == 120.0  # a overran: b is still to come
    schedule.finish("a", 180.0)  # three times slower than estimated...
    pace = (180.0 + Schedule.PRIOR_SECONDS) / (60.0 + Schedule.PRIOR_SECONDS)
    assert schedule.pace() == pytest.approx(pace) and schedule.left() == pytest.approx(120.0 * pace)
    short = Schedule([StageEstimate("a", 1, "run", 1.0, "built in"), StageEstimate("b", 1, "run", 100.0, "built in")])
    short.finish("a", 0.1)  # a one-second stage that was quick does not make the run look ten times faster
    assert short.left() > 90.0
    unknown = Schedule([StageEstimate("a", 1, "run", None, "unknown")])
    assert unknown.left() is None


def test_durations_read_like_a_person_wrote_them():
    assert [duration(s) for s in (4.4, 59.6, 200, 610, 3725)] == [
        "4 s",
        "1 min 00 s",
        "3 min 20 s",
        "10 min",
        "1 h 02 min",
    ]
