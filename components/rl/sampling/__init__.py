"""Group sampling for group-relative RL: fixed / DAPO / BAR groups with early abandon, history-aware
prompt selection and prefix-fork sampling as options of one sampler (see `sampler.py`'s header)."""

from components.rl.sampling.history import PromptHistory, PromptStats
from components.rl.sampling.records import (
    Attempt,
    PrefixForkSource,
    PromptRecord,
    PromptResult,
    RolloutBudget,
    RolloutSource,
    SampledBatch,
    StrideRecord,
    summarize,
)
from components.rl.sampling.rules import advantages, group_advantages, outcome_reward, p_all_same, p_mixed
from components.rl.sampling.config import RolloutConfig
from components.rl.sampling.sampler import sample_batch, sample_prompt, skipped_record

__all__ = [
    "Attempt",
    "PrefixForkSource",
    "PromptHistory",
    "PromptRecord",
    "PromptResult",
    "PromptStats",
    "RolloutBudget",
    "RolloutConfig",
    "RolloutSource",
    "SampledBatch",
    "StrideRecord",
    "advantages",
    "group_advantages",
    "outcome_reward",
    "p_all_same",
    "p_mixed",
    "sample_batch",
    "sample_prompt",
    "skipped_record",
    "summarize",
]
