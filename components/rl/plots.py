"""Plots of the rollout sampler's choices (one `PromptRecord` per prompt), for MLflow and the report."""

from __future__ import annotations

from collections import Counter
from typing import Any

from components.rl.sampling import PromptRecord


def plot_group_statistics(records: list[PromptRecord], title: str = "rollout groups") -> Any:
    """Four panels: attempts per prompt, positives per kept group, assembly rules, drop reasons."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    gen = [r.generated for r in records]
    axes[0].hist(gen, bins=range(0, max(gen, default=1) + 2), color="tab:blue", align="left")
    axes[0].set(title="attempts per prompt", xlabel="attempts", ylabel="prompts")
    pos = [r.group_positives for r in records if r.kept]
    size = max((r.group_size for r in records), default=1)
    axes[1].hist(pos, bins=range(0, size + 2), color="tab:green", align="left")
    axes[1].set(title="positives per kept group", xlabel="positives", ylabel="groups")
    rules: Counter[str] = Counter(r.rule for r in records)
    reasons: Counter[str] = Counter(r.drop_reason or "kept" for r in records)
    for ax, counts, colour in ((axes[2], rules, "tab:purple"), (axes[3], reasons, "tab:red")):
        labels = sorted(counts)
        ax.bar(labels, [counts[k] for k in labels], color=colour)
        ax.tick_params(axis="x", rotation=30)
    axes[2].set(title="how groups were assembled", ylabel="prompts")
    axes[3].set(title="kept / drop reason", ylabel="prompts")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_comparison(arms: dict[str, list[PromptRecord]]) -> Any:
    """Cumulative informative groups against cumulative generated trajectories, one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, records in arms.items():
        xs, ys, gen, kept = [0], [0], 0, 0
        for r in records:
            gen, kept = gen + r.generated, kept + int(r.kept)
            xs.append(gen)
            ys.append(kept)
        ax.step(xs, ys, where="post", label=name)
    ax.set(xlabel="generated trajectories", ylabel="informative groups", title="informative groups per trajectory")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_arm_ratios(rows: list[dict], baseline: str, metric: str = "informative_groups_per_trajectory") -> Any:
    """One bar per (population, arm): `metric` relative to the `baseline` arm of the same population."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    populations = list(dict.fromkeys(r["population"] for r in rows))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    base = {r["population"]: r[metric] for r in rows if r["arm"] == baseline}
    fig, ax = plt.subplots(figsize=(1.6 * len(populations) * len(arms) / 3 + 3, 4))
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        ys = [
            next((r[metric] / base[p] for r in rows if r["population"] == p and r["arm"] == arm and base.get(p)), 0.0)
            for p in populations
        ]
        ax.bar([i + j * width for i in range(len(populations))], ys, width, label=arm)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(populations))], populations)
    ax.set(ylabel=f"{metric} / {baseline}", title=f"{metric.replace('_', ' ')} relative to {baseline}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
