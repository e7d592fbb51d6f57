"""What a step returns: a tool call's result and a verification's verdict (the recipe contract's records,
shared by `recipe_base.py` and the blame rule in `step_blame.py`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from components.core.data.schema import TestReport, Verification


class ToolResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str = Field(description="Observation text returned to the policy.")
    policy_error: str | None = Field(None, description="Bad arguments or a failed action: the policy's fault.")
    infra_error: str | None = Field(
        None,
        description="The tool could not do its job for a reason it cannot "
        "attribute: whose failure it is, the one rule decides (core/episode/blame.py).",
    )
    submitted: bool = Field(False, description="The episode ends (submit / answer).")
    final_answer: str | None = None
    image_png: bytes | None = Field(None, description="Screenshot for vision policies (GUI).")


class VerifyResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resolved: bool
    report: TestReport = Field(default_factory=TestReport)
    infra_error: str | None = Field(
        None,
        description="No verdict. From `judge`: unattributed; from `verify`: the "
        "infrastructure failed (the one rule, core/episode/blame.py).",
    )
    reason: str | None = None
    verification: Verification | None = Field(None, description="Verifier version and what it ignored (audit).")


__all__ = ["ToolResult", "VerifyResult"]
