"""The promotion gate: `decision` (the rule: which model is the candidate, whether it beats the champion, the
registry) and `stage` (the pipeline's promote stage: evaluate the champion, decide, register)."""

from components.promote.decision import (
    PairedTest,
    PromotionConfig,
    PromotionDecision,
    Scorecard,
    current_champion,
    decide,
    download_champion,
    gate_decision,
    git_commit,
    log_policy_model,
    model_card,
    paired_test,
    policy_signature,
    promote,
    scorecard_from_evaluation,
    select_candidate,
)

__all__ = [
    "PairedTest",
    "PromotionConfig",
    "PromotionDecision",
    "Scorecard",
    "current_champion",
    "decide",
    "download_champion",
    "gate_decision",
    "git_commit",
    "log_policy_model",
    "model_card",
    "paired_test",
    "policy_signature",
    "promote",
    "scorecard_from_evaluation",
    "select_candidate",
]
