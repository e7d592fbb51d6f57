"""Rise-segment selection: from a value curve V(s_0..s_T) to the assistant steps that earn loss.

Following the published recipe: c_t = V(s_t) - V(s_{t-1}) is the credit of assistant step t (V(s_0)
is the value before the first action); a rise segment is a maximal run of consecutive steps with
c_t >= epsilon. We add three knobs: a noise bar (a step counts only when c_t >= max(epsilon,
z * SE(c_t)), where the estimator gives SE(c_t); Monte-Carlo credit with few continuations is otherwise
mostly noise), a minimum segment length, and an optional centred moving average over V before
differencing. The noise bar applies to the smoothed credit with the unsmoothed SE (conservative:
averaging only shrinks the SE).
Values between key steps are linearly interpolated (`interpolate`), as in the published labeling.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SegmentConfig(BaseModel):
    """How rise segments are chosen from a value curve."""

    model_config = ConfigDict(extra="forbid")
    epsilon: float = Field(0.05, ge=0.0, description="Minimum per-step rise c_t to count as credited (published 0.05).")
    z: float = Field(
        2.0,
        ge=0.0,
        description="Noise bar: c_t must also reach z * SE(c_t) when the estimator gives an SE "
        "(0 = off: epsilon alone; Monte Carlo with k = 1 credits nothing at z = 2).",
    )
    min_length: int = Field(1, ge=1, description="Drop rise segments shorter than this many assistant steps.")
    smoothing_window: int = Field(1, ge=1, description="Centred moving-average window over V (1 = none; odd).")


def smooth(values: list[float], window: int) -> list[float]:
    """Centred moving average; the window shrinks at the ends so the curve keeps its length."""
    if window <= 1 or len(values) <= 2:
        return list(values)
    half = window // 2
    out = []
    for i in range(len(values)):
        lo, hi = max(0, i - half), min(len(values), i + half + 1)
        out.append(sum(values[lo:hi]) / (hi - lo))
    return out


def interpolate(known: dict[int, float], length: int) -> list[float]:
    """A curve of `length` points from values at some positions (linear between, flat beyond the ends)."""
    if not known:
        raise ValueError("interpolate needs at least one known value")
    xs = sorted(known)
    out = []
    for i in range(length):
        if i <= xs[0]:
            out.append(known[xs[0]])
        elif i >= xs[-1]:
            out.append(known[xs[-1]])
        else:
            right = next(x for x in xs if x >= i)
            left = max(x for x in xs if x <= i)
            if left == right:
                out.append(known[left])
            else:
                w = (i - left) / (right - left)
                out.append(known[left] * (1 - w) + known[right] * w)
    return out


def credits(values: list[float], config: SegmentConfig) -> list[float]:
    """c_t for t = 1..T from V(s_0..s_T) (after smoothing)."""
    curve = smooth(values, config.smoothing_window)
    return [curve[t] - curve[t - 1] for t in range(1, len(curve))]


def thresholds(config: SegmentConfig, credit_stderr: list[float | None] | None, steps: int) -> list[float]:
    """The bar each c_t must reach: max(epsilon, z * SE(c_t)), epsilon where the SE is unknown."""
    ses = credit_stderr if credit_stderr is not None else [None] * steps
    if len(ses) != steps:
        raise ValueError(f"{len(ses)} credit standard errors for {steps} steps")
    return [max(config.epsilon, config.z * se) if se is not None else config.epsilon for se in ses]


def select_segments(
    values: list[float], config: SegmentConfig | None = None, credit_stderr: list[float | None] | None = None
) -> list[bool]:
    """Per assistant step (T of them for T+1 values): inside a kept rise segment or not."""
    config = config or SegmentConfig()
    if len(values) < 2:
        return []
    # A rise of exactly epsilon counts; the tolerance keeps 0.25 - 0.2 (= 0.04999...) from missing it.
    c = [x + 1e-9 for x in credits(values, config)]
    bar = thresholds(config, credit_stderr, len(c))
    selected = [False] * len(c)
    t = 0
    while t < len(c):
        if c[t] >= bar[t]:
            end = t
            while end + 1 < len(c) and c[end + 1] >= bar[end + 1]:
                end += 1
            if end - t + 1 >= config.min_length:
                for i in range(t, end + 1):
                    selected[i] = True
            t = end + 1
        else:
            t += 1
    return selected


def segments(selected: list[bool]) -> list[tuple[int, int]]:
    """(start, end) inclusive runs of True, for reporting."""
    runs, start = [], None
    for i, flag in enumerate(selected + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i - 1))
            start = None
    return runs
