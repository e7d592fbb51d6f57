"""The results of a pipeline run: the table people read, the plots, and what goes to MLflow.

Rows: the untrained, SFT and RL policies on the held-out tasks (plus the scripted teacher as a
reference row when it was evaluated), each with its tasks and independent units (repositories); below,
the paired differences clustered by unit, and whether RL beat SFT (the interval, and the promotion gate's
exact test that decides whether the RL model ships); around it, trajectory counts and sandbox exec latency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from components.core.tracking import (
    TrackingConfig,
    log_artifact_path,
    log_dataset_input,
    log_figure,
    log_json,
    log_table,
    resume_run,
)


class EvalRow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = Field(description="untrained, sft, rl or teacher.")
    tasks: int | None = Field(None, description="Held-out tasks evaluated (n).")
    units: int | None = Field(
        None, description="Independent units among them (distinct repositories): what the intervals count."
    )
    resolved_rate: float | None = Field(None, description="Resolved / evaluated attempts (infra errors excluded).")
    resolved_rate_ci95: tuple[float, float] | None = Field(
        None, description="95% interval (attempts clustered by task and unit), from the evaluation."
    )
    resolved: int | None = Field(None, description="Resolved attempts.")
    evaluated: int | None = Field(None, description="Attempts that count (not infra errors).")
    pass_at_k: float | None = Field(None, description="Unbiased pass@k over the attempts per task.")
    k: int | None = Field(None, description="Sampled attempts per task (at the evaluation's temperature).")
    greedy_resolved: int | None = Field(None, description="Tasks the greedy attempt resolved (evaluate.greedy).")
    greedy_evaluated: int | None = Field(None, description="Greedy attempts that count (not infra errors).")
    updates: int | None = Field(
        None,
        description="Optimizer updates that trained this policy (RL: only steps whose "
        "batch held a kept group; a step of dropped groups moves nothing).",
    )
    infra_error_rate: float | None = Field(None, description="Attempts lost to infrastructure (reported apart).")
    mean_steps: float | None = Field(None, description="Mean tool-loop steps per attempt.")
    hidden_pass_fraction: float | None = Field(
        None,
        description="Mean share of hidden tests passing (analysis "
        "only: partial progress the binary reward does not see).",
    )


class Comparison(BaseModel):
    """One policy against another on the same held-out tasks: mean per-task pass@1 difference."""

    model_config = ConfigDict(extra="forbid")
    better: str = Field(description="The policy whose score is subtracted from (e.g. sft in sft - untrained).")
    than: str = Field(description="The policy it is compared with.")
    difference: float = Field(description="mean over tasks of pass@1(better) - pass@1(than), in [-1, 1].")
    ci95: tuple[float, float] = Field(
        description="Newcombe's paired interval over the same tasks "
        "(components.core.statistics.intervals.paired_difference_ci)."
    )
    tasks: int = Field(description="Tasks both were evaluated on (n).")
    units: int | None = Field(
        None, description="Independent units (repositories) among them; the interval clusters by unit."
    )

    def verdict(self) -> str:
        lo, hi = self.ci95
        units = f", {self.units} units" if self.units is not None else ""
        span = f"{100 * self.difference:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}], n={self.tasks} tasks{units}"
        if lo > 0:
            return f"{self.better} beats {self.than} by {span}"
        if hi < 0:
            return f"{self.better} is worse than {self.than} by {span}"
        return f"{self.better} vs {self.than}: no difference detected, {span} (the interval holds 0)"


# Which arms are compared, in this order: what SFT adds, what RL adds on top, and both together.
COMPARED = (("sft", "untrained"), ("rl", "sft"), ("rl", "untrained"))


def compare_arms(per_task: dict[str, dict[str, float]], units: dict[str, str] | None = None) -> list[Comparison]:
    """Paired comparisons of the arms in `COMPARED` that were both evaluated (per-task pass@1 by task id),
    clustered by `units` (task id -> unit; None: each task its own)."""
    from components.core.statistics.intervals import common_tasks, count_units, paired_difference_ci

    out = []
    for a, b in COMPARED:
        if a in per_task and b in per_task:
            diff, lo, hi, n = paired_difference_ci(per_task[a], per_task[b], units=units)
            out.append(
                Comparison(
                    better=a,
                    than=b,
                    difference=diff,
                    ci95=(lo, hi),
                    tasks=n,
                    units=count_units(common_tasks(per_task[a], per_task[b]), units),
                )
            )
    return out


def rl_verdict(comparisons: list[Comparison], gate: dict | None) -> str | None:
    """Whether RL beat SFT, in one line: the paired interval, and the promotion gate's exact test, which decides
    whether the RL model or the SFT model it started from is the candidate. None when RL was not evaluated."""
    paired = next((c for c in comparisons if (c.better, c.than) == ("rl", "sft")), None)
    test = (gate or {}).get("rl_vs_sft")
    if paired is None and not test:
        return None
    parts = [paired.verdict()] if paired is not None else []
    if test:
        said = "RL beat SFT" if test["passed"] else "RL did not beat SFT"
        shipped = "the RL model is the candidate" if test["passed"] else "the SFT model is the candidate"
        parts.append(
            f"promotion gate: {said} (exact paired p = {test['p_value']:.4f}, needs <= {test['alpha']:.4g} "
            f"and a gain; {test['units']} units): {shipped}"
        )
    elif gate is not None and gate.get("candidate_stage"):
        parts.append(
            "promotion gate: no RL-vs-SFT test (RL made no optimizer update, or an evaluation has no "
            "verified attempt): the SFT model is the candidate"
        )
    return "RL vs SFT (what RL added): " + "; ".join(parts)


class RunReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[EvalRow] = Field(default_factory=list, description="One row per evaluated policy.")
    comparisons: list[Comparison] = Field(default_factory=list, description="Paired arm differences.")
    rl_vs_sft: str | None = Field(None, description="Whether RL beat SFT: the paired interval and the gate's test.")
    trajectories: dict[str, float] = Field(default_factory=dict, description="Teacher trajectory counts by outcome.")
    exec_latency: dict[str, float] = Field(default_factory=dict, description="Sandbox exec latency (s): p50, p95, n.")
    stage_seconds: dict[str, float] = Field(default_factory=dict, description="Wall time per step.")
    stages_skipped: list[str] = Field(default_factory=list, description="Steps that did not run (and why).")
    notes: list[str] = Field(default_factory=list, description="What a reader must know, e.g. an untrained model.")


def _pick(result: dict, *names: str) -> Any:
    """A value from a stage result, looked up in its typed fields first, then in `metrics`."""
    for source in (result, result.get("metrics") or {}):
        for name in names:
            if source.get(name) is not None and not isinstance(source.get(name), (dict, list)):
                return source[name]
    return None


def _interval(result: dict, name: str) -> tuple[float, float] | None:
    """`<name>_ci95` as a typed field, else its `_ci95_low` / `_ci95_high` metrics; None if absent or NaN."""
    ci = result.get(f"{name}_ci95")
    if ci is None:
        lo, hi = (_pick(result, f"{name}_ci95_{end}") for end in ("low", "high"))
        ci = (lo, hi) if lo is not None and hi is not None else None
    if ci is None or any(v != v for v in ci):
        return None
    return float(ci[0]), float(ci[1])


def _rate(r: EvalRow) -> str:
    """'50.0% [20.0, 80.0]': the rate with its interval when the evaluation gave one."""
    if r.resolved_rate is None or r.resolved_rate_ci95 is None:
        return _fmt(r.resolved_rate, True)
    lo, hi = r.resolved_rate_ci95
    return f"{100 * r.resolved_rate:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def _greedy(r: EvalRow) -> str:
    """'7 / 16': tasks the greedy attempt resolved, of those verified; '-' when there was no greedy attempt."""
    return "-" if r.greedy_evaluated is None else f"{r.greedy_resolved} / {r.greedy_evaluated}"


def _tasks(r: EvalRow) -> str:
    """'16 (12)': tasks and, when the evaluation said, the independent units among them."""
    return f"{_fmt(r.tasks)} ({_fmt(r.units)})" if r.units is not None else _fmt(r.tasks)


def eval_row(policy: str, result: dict) -> EvalRow:
    return EvalRow(
        policy=policy,
        resolved_rate=_pick(result, "resolved_rate"),
        tasks=_pick(result, "tasks"),
        units=_pick(result, "units"),
        resolved_rate_ci95=_interval(result, "resolved_rate"),
        resolved=_pick(result, "resolved", "n_resolved"),
        evaluated=_pick(result, "valid_attempts", "evaluated"),
        pass_at_k=_pick(result, "pass_at_k", "pass@k"),
        k=_pick(result, "k"),
        greedy_resolved=_pick(result, "greedy_resolved"),
        greedy_evaluated=_pick(result, "greedy_valid"),
        infra_error_rate=_pick(result, "infra_error_rate"),
        mean_steps=_pick(result, "mean_steps"),
        hidden_pass_fraction=_finite(_pick(result, "mean_hidden_pass_fraction", "hidden_pass_fraction_mean")),
    )


def _finite(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def trajectory_counts(distill_result: dict) -> dict[str, float]:
    out = {}
    for key in ("resolved", "unresolved", "infra_error"):
        value = _pick(distill_result, key, f"n_{key}", f"{key}_count")
        if value is not None:
            out[key] = float(value)
    if out:
        out["total"] = sum(out.values())
    return out


def build_report(
    eval_results: dict[str, dict],
    distill_result: dict | None,
    *,
    exec_latency: dict | None = None,
    stage_seconds: dict | None = None,
    stages_skipped: list[str] | None = None,
    notes: list[str] | None = None,
    per_task: dict[str, dict[str, float]] | None = None,
    units: dict[str, str] | None = None,
    gate: dict | None = None,
    updates: dict[str, int] | None = None,
) -> RunReport:
    """`per_task`: each arm's pass@1 by held-out task id (from its per_task.parquet) for the paired comparisons,
    clustered by `units` (task id -> unit); `gate`: the promote stage's result (whether RL beat SFT);
    `updates`: each trained arm's own optimizer updates (untrained 0)."""
    order = ["teacher", "untrained", "sft", "rl"]
    rows = [
        eval_row(k, eval_results[k]).model_copy(update={"updates": (updates or {}).get(k)})
        for k in sorted(eval_results, key=lambda k: (order.index(k) if k in order else 9, k))
    ]
    comparisons = compare_arms(per_task or {}, units)
    return RunReport(
        rows=rows,
        comparisons=comparisons,
        rl_vs_sft=rl_verdict(comparisons, gate),
        trajectories=trajectory_counts(distill_result or {}),
        exec_latency=exec_latency or {},
        stage_seconds=stage_seconds or {},
        stages_skipped=stages_skipped or [],
        notes=notes or [],
    )


def promotion_note(gate: dict) -> str:
    """The gate's decision as one line of the report."""
    if gate.get("promoted"):
        return (
            f"promoted {gate.get('candidate_stage')} model as version {gate.get('candidate_version')}: {gate['reason']}"
        )
    kept = f"kept champion v{gate['champion_version']}" if gate.get("champion_version") else "not registered"
    return f"{kept}: {gate['reason']}"


def _fmt(value: Any, pct: bool = False) -> str:
    if value is None:
        return "-"
    if pct:
        return f"{100 * float(value):.1f}%"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def to_markdown(report: RunReport) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in report.rows:
        lines.append("| " + " | ".join(_cells(r)) + " |")
    if report.rl_vs_sft:
        lines += ["", f"**{report.rl_vs_sft}**"]
    if report.comparisons:
        lines += ["", "Paired differences in held-out pass@1 (95% paired interval, clustered by unit):"]
        lines += [f"- {c.verdict()}" for c in report.comparisons]
    if report.trajectories:
        lines += ["", "Teacher trajectories: " + ", ".join(f"{k} {int(v)}" for k, v in report.trajectories.items())]
    if report.exec_latency:
        lines += [
            "",
            "Sandbox exec latency: "
            + ", ".join(f"{k} {v:.3f}" if k != "n" else f"n {int(v)}" for k, v in report.exec_latency.items()),
        ]
    if report.stage_seconds:
        lines += ["", "Step wall time (s): " + ", ".join(f"{k} {v:.1f}" for k, v in report.stage_seconds.items())]
    if report.stages_skipped:
        lines += ["", "Not run: " + "; ".join(report.stages_skipped)]
    if report.notes:
        lines += ["", "Notes: " + "; ".join(report.notes)]
    return "\n".join(lines) + "\n"


# The console table's columns, most important first: a narrow terminal loses the last ones, never a wrapped cell.
# Short headers for `COLUMNS` (report.md spells them out).
RICH_COLUMNS = (
    "policy",
    "resolved [95% CI]",
    "resolved",
    "greedy",
    "updates",
    "pass@k",
    "infra",
    "steps",
    "tasks",
    "hidden",
)
RICH_NAMES = {
    "resolved [95% CI]": "resolved rate [95% CI]",
    "resolved": "resolved / evaluated",
    "infra": "infra errors",
    "steps": "mean steps",
    "tasks": "tasks (units)",
    "hidden": "hidden tests passing",
}


def to_rich(report: RunReport, width: int | None = None):
    """The results table for a console `width` columns wide (None: all columns): cells never wrap; when the
    table would not fit, the least important columns are left out (the report.md table keeps them all)."""
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    def cells(r: EvalRow) -> list[str]:
        full = dict(zip(COLUMNS, _cells(r)))
        full["policy"] = f"{r.policy} (ref.)" if r.policy == "teacher" else r.policy
        return [full[RICH_NAMES.get(c, c)] for c in RICH_COLUMNS]

    def build(columns: int) -> Table:
        said = {
            "resolved": "resolved / evaluated attempts",
            "infra": "attempts lost to infrastructure",
            "steps": "mean tool steps",
            "hidden": "hidden tests passing",
            "greedy": "tasks the greedy attempt resolved",
            "updates": "optimizer updates that trained the policy",
            "tasks": "tasks (repositories)",
        }
        caption = "; ".join(f"{c}: {said[c]}" for c in RICH_COLUMNS[:columns] if c in said)
        table = Table(title="Held-out tasks: untrained vs SFT vs RL", box=box.SIMPLE_HEAD, caption=caption)
        for name in RICH_COLUMNS[:columns]:
            table.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True)
        for r in report.rows:
            table.add_row(*cells(r)[:columns])
        return table

    columns = len(RICH_COLUMNS)
    if width is not None:
        measure = Console(width=10_000)
        while columns > 2 and Measurement.get(measure, measure.options, build(columns)).maximum > width:
            columns -= 1
    return build(columns)


# The results table's columns (markdown and console alike). The rate is over the sampled attempts (k per task at
# the evaluation's temperature: pass@1); "greedy" is the one greedy attempt per task beside them.
COLUMNS = (
    "policy",
    "tasks (units)",
    "resolved rate [95% CI]",
    "resolved / evaluated",
    "pass@k",
    "greedy",
    "updates",
    "infra errors",
    "mean steps",
    "hidden tests passing",
)


def _cells(r: EvalRow) -> tuple[str, ...]:
    pass_at_k = _fmt(r.pass_at_k, True) if r.k is None else f"{_fmt(r.pass_at_k, True)} (k={r.k})"
    return (
        f"{r.policy} (reference)" if r.policy == "teacher" else r.policy,
        _tasks(r),
        _rate(r),
        f"{_fmt(r.resolved)} / {_fmt(r.evaluated)}",
        pass_at_k,
        _greedy(r),
        _fmt(r.updates),
        _fmt(r.infra_error_rate, True),
        _fmt(r.mean_steps),
        _fmt(r.hidden_pass_fraction, True),
    )


def plot_resolved_rates(report: RunReport):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if r.resolved_rate is not None]
    rates = [100 * r.resolved_rate for r in rows]  # type: ignore[operator]
    # Asymmetric error bars from the evaluation's interval; none where the evaluation gave no interval.
    below = [rate - 100 * r.resolved_rate_ci95[0] if r.resolved_rate_ci95 else 0.0 for rate, r in zip(rates, rows)]
    above = [100 * r.resolved_rate_ci95[1] - rate if r.resolved_rate_ci95 else 0.0 for rate, r in zip(rates, rows)]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    bars = ax.bar(
        [r.policy for r in rows],
        rates,
        color="#4c72b0",
        yerr=[[max(0.0, b) for b in below], [max(0.0, a) for a in above]],
        capsize=4,
    )
    for bar, r in zip(bars, rows):
        ax.annotate(
            f"n={r.evaluated if r.evaluated is not None else '?'}",
            (bar.get_x() + bar.get_width() / 2, 1),
            ha="center",
            va="bottom",
            fontsize=8,
            color="white" if bar.get_height() > 8 else "black",
        )
    ax.set_ylabel("held-out resolved rate (%)")
    ax.set_title("resolved rate, 95% interval (clustered by task and unit), n attempts", fontsize=9)
    ax.set_ylim(0, 100)
    fig.tight_layout()
    return fig


def plot_child_curves(tracking_uri: str, parent_run_id: str, keys: tuple[str, ...]) -> Any | None:
    """One panel per child-run metric whose name contains one of `keys` (loss, reward, group...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )
    series = []
    for child in children:
        for name in sorted(child.data.metrics):
            # per-step series only: final.* and data.* are one-off summaries
            if any(k in name for k in keys) and not name.startswith(("final.", "data.")):
                history = client.get_metric_history(child.info.run_id, name)
                if history:
                    series.append(
                        (f"{child.info.run_name}: {name}", [m.step for m in history], [m.value for m in history])
                    )
    if not series:
        return None
    series = series[:12]
    cols = min(3, len(series))
    rows = (len(series) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax, (label, steps, values) in zip(axes.flat, series):
        ax.plot(steps, values, marker=".")
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("step", fontsize=8)
    for ax in list(axes.flat)[len(series) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def log_to_parent(
    tracking: TrackingConfig,
    parent_run_id: str,
    report: RunReport,
    markdown: str,
    *,
    stores: dict[str, Path] | None = None,
    tasks_dir: Path | None = None,
    training_steps: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Table, plots and the trajectory stores on the pipeline's parent run; with `tasks_dir` its tasks as the
    run's datasets (one per split, with its digest: two runs evaluated on the same held-out set show the same).

    `training_steps`: optimizer updates behind each trained arm (untrained 0, sft its steps, rl the SFT steps
    plus its own): the arms' held-out rates are then also one curve over training, `heldout.resolved_rate`
    (and its interval bounds) at those steps, beside the per-arm values."""
    import matplotlib.pyplot as plt
    import mlflow
    import pandas as pd

    out: dict[str, Any] = {}
    with resume_run(tracking, parent_run_id):
        log_table(pd.DataFrame([r.model_dump() for r in report.rows]), "results_table.json")
        mlflow.log_text(markdown, "report.md")
        log_json(report.model_dump(mode="json"), "report.json")
        for r in report.rows:
            if r.resolved_rate is not None:
                mlflow.log_metric(f"heldout_resolved_rate.{r.policy}", float(r.resolved_rate))
            if r.resolved_rate_ci95 is not None:
                mlflow.log_metric(f"heldout_resolved_rate_ci95_low.{r.policy}", r.resolved_rate_ci95[0])
                mlflow.log_metric(f"heldout_resolved_rate_ci95_high.{r.policy}", r.resolved_rate_ci95[1])
            if r.evaluated is not None:
                mlflow.log_metric(f"heldout_evaluated.{r.policy}", float(r.evaluated))
            for name, value in (("tasks", r.tasks), ("units", r.units)):
                if value is not None:
                    mlflow.log_metric(f"heldout_{name}.{r.policy}", float(value))
            step = (training_steps or {}).get(r.policy)
            if step is not None and r.resolved_rate is not None:
                mlflow.log_metric("heldout.resolved_rate", float(r.resolved_rate), step=step)
                if r.resolved_rate_ci95 is not None:
                    mlflow.log_metric("heldout.resolved_rate_ci95_low", r.resolved_rate_ci95[0], step=step)
                    mlflow.log_metric("heldout.resolved_rate_ci95_high", r.resolved_rate_ci95[1], step=step)
        for k, v in report.trajectories.items():
            mlflow.log_metric(f"trajectories.{k}", v)
        for k, v in report.exec_latency.items():
            mlflow.log_metric(f"exec_latency.{k}", v)
        for name, fig in (
            ("plots/resolved_rates.png", plot_resolved_rates(report)),
            ("plots/loss_curves.png", plot_child_curves(tracking.tracking_uri, parent_run_id, ("loss",))),
            (
                "plots/reward_curves.png",
                plot_child_curves(tracking.tracking_uri, parent_run_id, ("reward", "resolved_rate")),
            ),
            (
                "plots/bar_groups.png",
                plot_child_curves(tracking.tracking_uri, parent_run_id, ("group", "informative", "sampler.")),
            ),
        ):
            if fig is not None:
                log_figure(fig, name)
                plt.close(fig)
                out[name] = True
        for name, path in (stores or {}).items():  # parquet shards, e.g. stores/trajectories/*.parquet
            if Path(path).is_dir():
                log_artifact_path(path, f"stores/{name}")
        if tasks_dir is not None and Path(tasks_dir).is_dir():
            from components.core.data.parquet_store import TaskStore

            tasks = TaskStore(tasks_dir).read()
            for split in sorted({t.split for t in tasks}):
                log_dataset_input(
                    [
                        {"task_id": t.id, "family": t.family, "difficulty": t.difficulty, "seed": t.seed}
                        for t in tasks
                        if t.split == split
                    ],
                    tasks_dir,
                    name=f"{tasks[0].recipe}-{split}",
                    context=split,
                )
    return out
