"""The results table and the exec-latency figures it quotes."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pipelines.config import PipelineConfig
from pipelines.report import build_report, to_markdown
from pipelines.service_metrics import histogram_summary


def test_histogram_summary_matches_the_observations():
    registry = CollectorRegistry()
    h = Histogram("orchard_exec_seconds", "exec", ["outcome"], buckets=(0.01, 0.1, 1.0, 10.0), registry=registry)
    for value in [0.05] * 50 + [0.5] * 45 + [5.0] * 5:
        h.labels(outcome="ok" if value < 1 else "slow").observe(value)
    summary = histogram_summary(generate_latest(registry).decode(), "orchard_exec_seconds")
    assert summary["n"] == 100
    assert math.isclose(summary["mean"], (0.05 * 50 + 0.5 * 45 + 5.0 * 5) / 100)
    assert 0.01 < summary["p50"] <= 0.1  # the 50th observation is in the (0.01, 0.1] bucket
    assert 0.1 < summary["p95"] <= 1.0
    assert histogram_summary("", "orchard_exec_seconds") == {}


def test_report_rows_come_from_typed_eval_results():
    evals = {
        "rl": {
            "resolved": 3,
            "valid_attempts": 6,
            "resolved_rate": 0.5,
            "pass_at_k": 0.5,
            "infra_error_rate": 0.0,
            "mean_steps": 4.0,
            "mean_hidden_pass_fraction": 0.625,
            "k": 2,
            "greedy_resolved": 2,
            "greedy_valid": 3,
            "metrics": {},
        },
        "untrained": {"resolved": 0, "valid_attempts": 6, "resolved_rate": 0.0, "metrics": {"mean_steps": 6.0}},
        "teacher": {
            "resolved": 5,
            "valid_attempts": 6,
            "resolved_rate": 5 / 6,
            "resolved_rate_ci95": [0.5, 1.0],
            "metrics": {},
        },
    }
    report = build_report(
        evals,
        {"resolved": 10, "unresolved": 4, "infra_error": 1, "metrics": {}},
        exec_latency={"n": 12, "p50": 0.02},
        stages_skipped=["sft (x)"],
        updates={"untrained": 0, "rl": 20},
    )
    assert [r.policy for r in report.rows] == ["teacher", "untrained", "rl"]
    assert report.rows[1].mean_steps == 6.0  # found in metrics when not a typed field
    assert report.trajectories == {"resolved": 10, "unresolved": 4, "infra_error": 1, "total": 15}
    md = to_markdown(report)
    assert "| teacher (reference) | - | 83.3% [50.0, 100.0] | 5 / 6 |" in md
    # the sampled attempts' rate and pass@k beside the greedy attempt, and the updates that trained each policy
    assert "| rl | - | 50.0% | 3 / 6 | 50.0% (k=2) | 2 / 3 | 20 | 0.0% | 4.00 | 62.5% |" in md
    assert "| untrained | - | 0.0% | 0 / 6 | - | - | 0 | - | 6.00 | - |" in md  # no hidden-test fraction: none shown
    assert "Not run: sft (x)" in md


def test_resolved_rates_carry_their_interval_and_n_in_table_and_plot():
    from matplotlib.container import ErrorbarContainer

    from pipelines.report import plot_resolved_rates

    evals = {
        "sft": {
            "resolved": 2,
            "valid_attempts": 8,
            "resolved_rate": 0.25,
            "resolved_rate_ci95": [0.0, 0.5],
            "metrics": {},
        },
        "rl": {
            "resolved": 4,
            "valid_attempts": 8,
            "resolved_rate": 0.5,  # interval only in metrics
            "metrics": {"resolved_rate_ci95_low": 0.25, "resolved_rate_ci95_high": 0.75},
        },
        "untrained": {"resolved": 0, "valid_attempts": 8, "resolved_rate": 0.0, "metrics": {}},
    }
    report = build_report(evals, None)
    md = to_markdown(report)
    assert "| sft | - | 25.0% [0.0, 50.0] | 2 / 8 |" in md and "| rl | - | 50.0% [25.0, 75.0] | 4 / 8 |" in md
    assert "| untrained | - | 0.0% | 0 / 8 |" in md  # no interval given: none invented
    fig = plot_resolved_rates(report)
    (ax,) = fig.axes
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    segments = bars.lines[2][0].get_segments()  # one vertical error segment per bar: (lo, hi) in percent
    assert [tuple(round(p[1], 6) for p in seg) for seg in segments] == [(0.0, 0.0), (0.0, 50.0), (25.0, 75.0)]
    assert sorted(t.get_text() for t in ax.texts) == ["n=8"] * 3


def test_presets_are_valid_and_overridable():
    tiny = PipelineConfig.preset_config("tiny", sft={"steps": 2})
    assert tiny.sft.steps == 2 and tiny.sft.batch_size == PipelineConfig.preset_config("tiny").sft.batch_size
    assert PipelineConfig.preset_config("demo").provision.n_train > tiny.provision.n_train
    import pytest

    with pytest.raises(ValueError, match="unknown preset"):
        PipelineConfig.preset_config("huge")
    with pytest.raises(ValueError):
        PipelineConfig.preset_config("tiny", sft={"stepz": 2})


def test_report_states_paired_differences_with_intervals_and_n():
    tasks = [f"t{i}" for i in range(12)]
    per_task = {
        "untrained": dict.fromkeys(tasks, 0.0),
        "sft": {t: float(i < 8) for i, t in enumerate(tasks)},  # 8 of 12 solved
        "rl": {t: float(i < 7) for i, t in enumerate(tasks)},
    }  # one fewer than SFT
    report = build_report({arm: {"resolved_rate": 0.0} for arm in per_task}, None, per_task=per_task)
    by_pair = {(c.better, c.than): c for c in report.comparisons}
    sft = by_pair[("sft", "untrained")]
    assert sft.tasks == 12 and math.isclose(sft.difference, 8 / 12)
    assert 0 < sft.ci95[0] < sft.difference < sft.ci95[1] <= 1
    rl = by_pair[("rl", "sft")]
    assert math.isclose(rl.difference, -1 / 12) and rl.ci95[0] < 0 <= rl.ci95[1]
    md = to_markdown(report)
    assert "- sft beats untrained by +66.7 points [" in md and "n=12 tasks" in md
    assert "- rl vs sft: no difference detected, -8.3 points [" in md


def test_the_table_says_whether_rl_beat_sft_with_units_beside_n():
    """RL 6/16 against SFT 7/16 (a case seen in a run): the table's verdict row says RL did not beat SFT, with the
    paired interval and the gate's exact test; tasks of one repository count once (16 tasks, 12 units)."""
    tasks = [f"t{i:02d}" for i in range(16)]
    units = {t: f"repo{min(i, 11)}" for i, t in enumerate(tasks)}  # the last five tasks share one repository
    per_task = {
        "untrained": dict.fromkeys(tasks, 0.0),
        "sft": {t: float(i < 7) for i, t in enumerate(tasks)},
        "rl": {t: float(i < 6) for i, t in enumerate(tasks)},
    }
    evals = {
        arm: {"resolved_rate": sum(v.values()) / 16, "tasks": 16, "units": 12, "metrics": {}}
        for arm, v in per_task.items()
    }
    gate = {"candidate_stage": "sft", "rl_vs_sft": {"passed": False, "p_value": 1.0, "alpha": 0.005, "units": 12}}
    report = build_report(evals, None, per_task=per_task, units=units, gate=gate)
    md = to_markdown(report)
    assert "| rl | 16 (12) | 37.5% |" in md
    assert report.rl_vs_sft.startswith("RL vs SFT (what RL added): rl vs sft: no difference detected, -6.2 points [")
    assert "n=16 tasks, 12 units" in report.rl_vs_sft and f"**{report.rl_vs_sft}**" in md
    assert "promotion gate: RL did not beat SFT (exact paired p = 1.0000, needs <= 0.005" in report.rl_vs_sft
    assert "the SFT model is the candidate" in report.rl_vs_sft
    clustered = {(c.better, c.than): c for c in report.comparisons}[("sft", "untrained")]
    plain = {(c.better, c.than): c for c in build_report(evals, None, per_task=per_task).comparisons}[
        ("sft", "untrained")
    ]
    assert clustered.units == 12 and plain.units == 16 and clustered.ci95 != plain.ci95
    untrained_rl = build_report(evals, None, per_task=per_task, gate={"candidate_stage": "sft", "rl_vs_sft": None})
    assert "no RL-vs-SFT test (RL made no optimizer update" in untrained_rl.rl_vs_sft


def test_a_report_of_validation_evaluations_says_they_are_not_heldout_results():
    from pipelines.steps import StepContext, finish_pipeline

    config = PipelineConfig.preset_config("tiny", evaluate={"split": "validation"})
    _, markdown = finish_pipeline(StepContext(config, None), {"evaluate-sft": {"resolved_rate": 0.5, "metrics": {}}})
    assert "evaluated on the validation split (for tuning), not on the held-out one" in markdown
    _, heldout = finish_pipeline(
        StepContext(PipelineConfig.preset_config("tiny"), None), {"evaluate-sft": {"resolved_rate": 0.5, "metrics": {}}}
    )
    assert "validation" not in heldout


def test_the_report_says_how_far_rl_moved_the_policy(tmp_path):
    """The weights' relative change (the RL result) and the held-out tasks whose greedy episodes differ between
    the SFT and RL models (their greedy trajectory stores): an RL stage that changed nothing says so."""
    from components.core.data.schema import Outcome, Step, Trajectory
    from components.core.data.parquet_store import TrajectoryStore
    from pipelines.steps import rl_movement

    def greedy(arm: str, texts: dict[str, str]) -> dict:
        TrajectoryStore(tmp_path / arm / "trajectories_greedy").append(
            [
                Trajectory(
                    task_id=t,
                    recipe="swe",
                    policy_id=arm,
                    outcome=Outcome.resolved,
                    attempt=-1,
                    steps=[Step(index=0, role="assistant", content=text)],
                )
                for t, text in texts.items()
            ]
        )
        return {"trajectories_dir": str(tmp_path / arm / "trajectories")}

    evals = {"sft": greedy("sft", {"a": "x", "b": "y", "c": "z"}), "rl": greedy("rl", {"a": "x", "b": "Y", "c": "z"})}
    note = rl_movement({"weight_change": 0.0123}, evals)
    assert (
        note == "RL moved the policy: weights 1.23 % from SFT's (relative L2); greedy episodes differ on 1 of 3 "
        "held-out tasks"
    )
    assert rl_movement(None, evals) is None
