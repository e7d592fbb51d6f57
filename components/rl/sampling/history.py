"""Per-prompt memory across epochs (option `history`): a Beta posterior of the on-policy pass rate,
the run of recent zero-variance visits (GRESO-style skipping), and the teacher-prefix fraction that
prefix-fork sampling adapts per prompt.

Only on-policy attempts update the pass-rate posterior: a forked attempt starts from a teacher's
state, so its outcome says how hard the rest of the task is, not how often the policy solves it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from components.rl.sampling.records import Attempt
from components.rl.sampling.rules import carries_reward, p_mixed

if TYPE_CHECKING:
    from components.rl.sampling.config import RolloutConfig


class PromptStats(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alpha: float = Field(description="Beta posterior pseudo-count of on-policy successes (prior included).")
    beta: float = Field(description="Beta posterior pseudo-count of on-policy failures (prior included).")
    visits: int = Field(0, description="Times the prompt was sampled (skips excluded).")
    uniform_streak: int = Field(0, description="Consecutive most recent visits whose on-policy attempts agreed.")
    solved: int = Field(0, description="On-policy successes ever seen.")
    prefix_fraction: float = Field(description="Teacher-prefix fraction the next forked attempts start from.")
    fork_stuck: bool = Field(
        False, description="The last forked attempts, from the longest prefix allowed, all failed."
    )

    @property
    def mean(self) -> float:
        return self.alpha / (self.alpha + self.beta)


class PromptHistory:
    """What the sampler remembers of each prompt; one per training run (or comparison arm)."""

    def __init__(self, config: RolloutConfig, seed: int = 0):
        self.config = config
        self.rng = random.Random(seed)
        self.stats: dict[str, PromptStats] = {}

    def get(self, prompt_id: str) -> PromptStats:
        if prompt_id not in self.stats:
            c = self.config
            self.stats[prompt_id] = PromptStats(
                alpha=c.prior_alpha, beta=c.prior_beta, prefix_fraction=c.prefix_fraction
            )
        return self.stats[prompt_id]

    def never_solved(self, prompt_id: str) -> bool:
        s = self.get(prompt_id)
        return s.visits > 0 and s.solved == 0

    def skip(self, prompt_id: str, forkable: bool) -> bool:
        """Skip a prompt whose recent visits were all zero-variance, except with probability
        `skip_explore` (the pass rate moves as the policy learns). A never-solved prompt that can be
        forked from a teacher prefix is not skipped (prefix-fork sampling is what makes it useful) until
        its forks fail even from the longest prefix allowed."""
        s = self.get(prompt_id)
        if s.uniform_streak < self.config.skip_after_uniform_visits:
            return False
        if forkable and s.solved == 0 and not s.fork_stuck:
            return False
        return self.rng.random() >= self.config.skip_explore

    def update(self, prompt_id: str, pool: list[Attempt]) -> None:
        c, s = self.config, self.get(prompt_id)
        rewarded = [a for a in pool if carries_reward(a, c.time_truncated_to_backfill)]
        # carries_reward keeps no attempt without a verified reward: the `is not None` filters drop nothing.
        on_policy = [a.reward for a in rewarded if not a.forked and a.reward is not None]
        pos = sum(1 for r in on_policy if r > 0)
        neg = len(on_policy) - pos
        # Decay old evidence toward the prior so the posterior follows a policy that is learning.
        s.alpha = c.prior_alpha + c.history_decay * (s.alpha - c.prior_alpha) + pos
        s.beta = c.prior_beta + c.history_decay * (s.beta - c.prior_beta) + neg
        s.visits += 1
        s.solved += pos
        s.uniform_streak = s.uniform_streak + 1 if on_policy and (pos == 0 or neg == 0) else 0
        forked = [a.reward for a in rewarded if a.forked and a.reward is not None]
        if forked:
            s.fork_stuck = s.prefix_fraction >= c.prefix_fraction_max and all(r <= 0 for r in forked)
        if forked:  # aim the forked attempts at a pass rate of 1/2: longer prefix if all fail, shorter if all pass
            if all(r <= 0 for r in forked):
                s.prefix_fraction = min(c.prefix_fraction_max, s.prefix_fraction + c.prefix_fraction_step)
            elif all(r > 0 for r in forked):
                s.prefix_fraction = max(c.prefix_fraction_min, s.prefix_fraction - c.prefix_fraction_step)

    def informativeness(self, prompt_id: str) -> float:
        s = self.get(prompt_id)
        return p_mixed(s.alpha, s.beta, self.config.group_size)

    def prefer(self, prompts: Iterator[str]) -> Iterator[str]:
        """The prompts reordered within a window of `lookahead`: the one whose posterior makes a mixed
        group most likely (pass rate nearest 1/2, least certain) goes first; ties keep stream order.
        Scores are read when a prompt is handed out, so they include everything sampled so far."""
        window: list[str] = []
        for prompt_id in prompts:
            window.append(prompt_id)
            if len(window) >= self.config.lookahead:
                yield window.pop(self._best(window))
        while window:
            yield window.pop(self._best(window))

    def _best(self, window: list[str]) -> int:
        scores = [self.informativeness(p) for p in window]
        return max(range(len(window)), key=lambda i: (scores[i], -i))
