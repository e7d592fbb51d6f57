"""Synthetic rollout sources with known pass rates, for tests and `scripts/compare_rollout.py`.

Outcomes use common random numbers: the k-th on-policy attempt of a prompt draws the same uniform in
every sampler arm (and the k-th forked attempt its own), so arms differ by their choices, not their luck.

Forked attempts: a prompt with a teacher trajectory of `steps` environment steps, forked after the
first `fraction` of it, succeeds with p + (1 - p) * fraction ** `prefix_exponent` (an assumption: the
further along a successful trajectory, the likelier the rest succeeds; exponent 2 makes half a prefix
worth a quarter of the gap). Every attempt costs the prompt's `steps` environment steps in all: the
prefix's share is recorded as `prefix_steps`, the rest as the attempt's own.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from components.rl.sampling.records import Attempt


class SyntheticPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pass_rate: float = Field(ge=0.0, le=1.0, description="On-policy probability of success.")
    steps: int = Field(10, ge=1, description="Environment steps of one attempt.")
    has_teacher: bool = Field(True, description="A successful teacher trajectory exists to fork from.")


class SyntheticSource:
    """A `RolloutSource` and `PrefixForkSource` over prompts with known pass rates."""

    def __init__(self, prompts: dict[str, SyntheticPrompt], seed: int = 0, prefix_exponent: float = 2.0):
        self.prompts, self.seed, self.prefix_exponent = prompts, seed, prefix_exponent
        self.drawn: dict[tuple[str, bool], int] = {}
        self.calls: list[tuple[str, int, float | None]] = []

    def _uniform(self, prompt_id: str, forked: bool) -> float:
        k = self.drawn.get((prompt_id, forked), 0)
        self.drawn[(prompt_id, forked)] = k + 1
        return random.Random(f"{self.seed}/{prompt_id}/{'fork' if forked else 'policy'}/{k}").random()

    def __call__(self, prompt_id: str, n: int) -> list[Attempt]:
        self.calls.append((prompt_id, n, None))
        p = self.prompts[prompt_id]
        return [
            Attempt(reward=1.0 if self._uniform(prompt_id, False) < p.pass_rate else -1.0, env_steps=p.steps)
            for _ in range(n)
        ]

    def has_prefix(self, prompt_id: str) -> bool:
        return self.prompts[prompt_id].has_teacher

    def forked_pass_rate(self, prompt_id: str, fraction: float) -> float:
        p = self.prompts[prompt_id].pass_rate
        return p + (1 - p) * fraction**self.prefix_exponent

    def fork(self, prompt_id: str, n: int, fraction: float) -> list[Attempt]:
        p = self.prompts[prompt_id]
        if not p.has_teacher:
            raise ValueError(f"prompt {prompt_id!r} has no teacher trajectory to fork from; check has_prefix first")
        self.calls.append((prompt_id, n, fraction))
        prefix = max(1, min(p.steps - 1, round(fraction * p.steps)))
        rate = self.forked_pass_rate(prompt_id, fraction)
        return [
            Attempt(
                reward=1.0 if self._uniform(prompt_id, True) < rate else -1.0,
                env_steps=p.steps - prefix,
                prefix_steps=prefix,
            )
            for _ in range(n)
        ]
