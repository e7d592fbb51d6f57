"""Monte-Carlo value estimator (the embedded default; needs no LLM).

V(s_t) = the fraction of k continuations by the teacher that resolve the task when started from the
state after assistant step t. The state is restored by forking the snapshot the harness took after
that step (`Step.sandbox_state_id`, with `HarnessConfig.snapshot_every_step`), or, without one, by
replaying the prefix's tool calls in a fresh sandbox (`run_episode(prefix_steps=...)`). A state after
the final `submit` is terminal: its value is the verified outcome itself. Each value comes with its
binomial standard error sqrt(p(1-p)/n); continuations that end in `infra_error` are excluded from n
(and reported), never counted as failures. Key steps every `stride` assistant steps; the rest are
linearly interpolated (as in the published labeling).

Departures from the published rule, and why:
1. Common random numbers: continuation j starts with the same teacher seed at every key state, so
   c_t = V(s_t) - V(s_{t-1}) is a mean of *paired* differences X_{t,j} - X_{t-1,j}. Noise the two
   states share (the teacher's own slips) cancels; with independent seeds it adds up, and at k=3 the
   credit was mostly noise (SE ~0.27 against epsilon = 0.05).
2. Each credit carries its standard error (spread evenly over the interpolated steps between two key
   states), so segment selection can ask for c_t >= z * SE(c_t). The variance of the paired differences
   pools the sample's with one pseudo-pair at 1/2, the variance of the difference of two independent fair
   outcomes (the most a flat value curve gives): `paired_credit_stderr`. With the plain sample variance a
   few continuations that happen to agree read as noise-free (three pairs +1, +1, 0 cleared z = 2 exactly),
   and a flat value curve with independent draws had ~9 % of its steps credited at k = 3; pooled, a step
   at k = 3 needs all three continuations to flip from failure to success, which a flat curve does for at
   most (1/4)^3 of key intervals (1-2 % of steps). k = 2 stays at ~6 % either way (two +1 pairs clear the
   bar). At k = 1 the pseudo-pair alone gives SE 0.71 per key interval, so nothing is credited at z = 2,
   while `segments.z = 0` (epsilon alone) credits ~20 % of a flat curve's steps.
"""

from __future__ import annotations

import concurrent.futures
import math
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from components.core.episode.harness import HarnessConfig, run_episode
from components.core.policy.base import GenerationConfig, Policy
from components.core.episode.recipe_base import RecipeBase
from components.core.data.schema import EpisodeStatus, Outcome, Task, Trajectory
from components.credit.base import (
    CreditEstimationError,
    ValueEstimate,
    assistant_positions,
    initial_end,
    state_end,
)
from components.core.policy.teacher import TeacherConfig
from components.credit.segments import interpolate
from components.teacher_policies import teacher_factory
from sandbox_service.client import SandboxClient


class MonteCarloConfig(BaseModel):
    """Continuations from each intermediate state."""

    model_config = ConfigDict(extra="forbid")
    k: int = Field(
        8, ge=1, description="Continuations per key state (8: SE(c_t) well under epsilon with common random numbers)."
    )
    stride: int = Field(
        1, ge=1, description="Estimate every stride-th assistant step (the last always); interpolate the rest."
    )
    common_random_numbers: bool = Field(
        True, description="Continuation j uses the same teacher seed at every state (paired credits)."
    )
    teacher_error_rate: float = Field(
        0.2, ge=0.0, le=1.0, description="Error rate of the scripted continuation teacher."
    )
    teacher: TeacherConfig | None = Field(
        None, description="Continuation teacher (scripted or an endpoint); None = scripted at teacher_error_rate."
    )
    seed: int = Field(0, description="Base seed of the continuation teachers.")
    max_steps: int = Field(12, ge=1, description="Assistant turns a continuation may add.")
    parallel: int = Field(4, ge=1, description="Continuations running at once (each in its own sandbox).")
    use_snapshots: bool = Field(True, description="Fork Step.sandbox_state_id when present instead of replaying.")
    max_infra_failures: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Give up on a state when more than this fraction of its continuations fail for infrastructure.",
    )


PolicyFactory = Callable[[int], Policy]


class MonteCarloEstimator:
    name = "monte_carlo"

    def __init__(
        self,
        config: MonteCarloConfig,
        recipe: RecipeBase,
        client: SandboxClient,
        policy_factory: PolicyFactory | None = None,
        harness: HarnessConfig | None = None,
    ) -> None:
        self.config = config
        self.recipe = recipe
        self.client = client
        if policy_factory is None:
            teacher = config.teacher or TeacherConfig(error_rate=config.teacher_error_rate)
            policy_factory = teacher_factory(teacher, recipe.name, config.seed)
        self.policy_factory = policy_factory
        self.harness = harness or HarnessConfig(
            max_steps=config.max_steps, max_wall_seconds=300, generation=GenerationConfig(temperature=0.0)
        )
        self.continuations = 0
        self.infra_failures = 0

    def _seed(self, t: int, j: int) -> int:
        return j if self.config.common_random_numbers else t * 1000 + j

    def _continue(self, task: Task, prefix, snapshot: str | None, seed: int) -> Outcome:
        # max_steps counts the prefix's assistant turns too: extend the budget by them.
        turns = sum(1 for s in prefix if s.role == "assistant")
        cfg = self.harness.model_copy(update={"max_steps": turns + self.config.max_steps})
        traj = run_episode(
            task, self.recipe, self.policy_factory(seed), self.client, cfg, prefix_steps=prefix, from_snapshot=snapshot
        )
        if snapshot and traj.outcome is Outcome.infra_error and "setup failed" in (traj.outcome_reason or ""):
            # The snapshot is gone (another service instance, or pruned): rebuild the state by replay.
            traj = run_episode(task, self.recipe, self.policy_factory(seed), self.client, cfg, prefix_steps=prefix)
        return traj.outcome

    def _value(self, trajectory: Trajectory, end: int, outcomes: list[Outcome]) -> tuple[float, float, int]:
        self.continuations += len(outcomes)
        valid = [o for o in outcomes if o is not Outcome.infra_error]
        failed = len(outcomes) - len(valid)
        self.infra_failures += failed
        if not valid or failed / len(outcomes) > self.config.max_infra_failures:
            raise CreditEstimationError(
                f"{failed}/{len(outcomes)} continuations from step {end} of {trajectory.id} failed for "
                "infrastructure; check the sandbox service"
            )
        p = sum(o is Outcome.resolved for o in valid) / len(valid)
        return p, math.sqrt(p * (1 - p) / len(valid)), len(valid)

    def estimate(self, trajectory: Trajectory, task: Task) -> ValueEstimate:
        positions = assistant_positions(trajectory)
        if not positions:
            raise CreditEstimationError(f"{trajectory.id} has no assistant steps to credit")
        T = len(positions)
        terminal = trajectory.status is EpisodeStatus.completed  # the last step was a successful submit
        final_value = 1.0 if trajectory.outcome is Outcome.resolved else 0.0
        keys = sorted({0, T} | set(range(self.config.stride, T + 1, self.config.stride)))
        known: dict[int, float] = {}
        stderr: list[float | None] = [None] * (T + 1)
        samples = [0] * (T + 1)
        jobs: dict[int, tuple[int, list]] = {}
        # Every continuation of every key state goes into one pool: k=1 runs still use all workers.
        with concurrent.futures.ThreadPoolExecutor(self.config.parallel, thread_name_prefix="mc") as pool:
            for t in keys:
                if t == T and terminal:
                    known[t], stderr[t] = final_value, 0.0
                    continue
                end = initial_end(trajectory) if t == 0 else state_end(trajectory, positions[t - 1])
                prefix = trajectory.steps[:end]
                snapshot = prefix[-1].sandbox_state_id if (self.config.use_snapshots and prefix) else None
                jobs[t] = (
                    end,
                    [
                        pool.submit(self._continue, task, prefix, snapshot, self._seed(t, j))
                        for j in range(self.config.k)
                    ],
                )
            outcomes: dict[int, list[float | None]] = {}
            for t, (end, futures) in jobs.items():
                results = [f.result() for f in futures]
                known[t], stderr[t], samples[t] = self._value(trajectory, end, results)
                outcomes[t] = [None if o is Outcome.infra_error else float(o is Outcome.resolved) for o in results]
        for t in keys:
            outcomes.setdefault(t, [known[t]] * self.config.k)  # the terminal state: its outcome, exactly
        return ValueEstimate(
            trajectory_id=trajectory.id,
            estimator=self.name,
            step_indices=[trajectory.steps[p].index for p in positions],
            values=interpolate(known, T + 1),
            stderr=stderr,
            samples=samples,
            credit_stderr=paired_credit_stderr(keys, outcomes, T)
            if self.config.common_random_numbers
            else independent_credit_stderr(
                keys, [value_stderr(known[t], samples[t]) if samples[t] else stderr[t] for t in range(T + 1)], T
            ),
        )


# The variance of X_b - X_a for two independent outcomes in {0, 1}: p_a(1 - p_a) + p_b(1 - p_b) <= 1/2. A flat
# value curve whose continuations are not coupled (an LLM teacher given two different states) reaches it.
FLAT_PAIR_VARIANCE = 0.5


def value_stderr(p: float, n: int) -> float:
    """SE of a value estimated from n continuations for the noise bar: the plus-two (Agresti-Coull) binomial
    SE, so that a state whose few continuations all agree (p = 0 or 1, always so at k = 1) is not taken as
    known exactly (the reported `stderr` stays sqrt(p(1-p)/n)); a single continuation gets the worst case."""
    if n < 2:  # one outcome says nothing about the spread: the worst case, sd 1/2
        return 0.5 / math.sqrt(max(n, 1))
    adjusted = (p * n + 1) / (n + 2)
    return math.sqrt(adjusted * (1 - adjusted) / (n + 2))


def paired_credit_stderr(keys: list[int], outcomes: dict[int, list[float | None]], T: int) -> list[float | None]:
    """SE of c_1..c_T from paired continuation outcomes at consecutive key states.

    Between key states a < b the interpolated curve rises (V_b - V_a)/(b - a) per step, so each of those
    steps gets SE(mean of paired differences)/(b - a). The differences' variance is the sample's pooled
    with one pseudo-pair at `FLAT_PAIR_VARIANCE`: (sum of squared deviations + 1/2) / n over n complete
    pairs (the sample's n - 1 degrees of freedom plus the pseudo-pair's one), so n agreeing pairs are not
    taken as noise-free and one pair (k = 1) gets the pseudo-pair's variance alone. No complete pair: None."""
    out: list[float | None] = [None] * T
    for a, b in zip(keys, keys[1:]):
        diffs = [xb - xa for xa, xb in zip(outcomes[a], outcomes[b]) if xa is not None and xb is not None]
        se = None
        if diffs:
            n, mean = len(diffs), sum(diffs) / len(diffs)
            variance = (sum((d - mean) ** 2 for d in diffs) + FLAT_PAIR_VARIANCE) / n
            se = math.sqrt(variance / n) / (b - a)
        for t in range(a + 1, b + 1):
            out[t - 1] = se
    return out


def independent_credit_stderr(keys: list[int], stderr: list[float | None], T: int) -> list[float | None]:
    """SE of c_1..c_T when the two states' continuations are independent: sqrt(SE_a^2 + SE_b^2)/(b - a)."""
    out: list[float | None] = [None] * T
    for a, b in zip(keys, keys[1:]):
        sa, sb = stderr[a], stderr[b]
        se = None if sa is None or sb is None else math.sqrt(sa * sa + sb * sb) / (b - a)
        for t in range(a + 1, b + 1):
            out[t - 1] = se
    return out
