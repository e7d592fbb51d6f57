"""The teacher: the recipe's scripted expert, or a model behind an OpenAI-compatible endpoint.

One definition for every stage that needs a teacher (distill's trajectories, credit's Monte-Carlo
continuations). The endpoint's API key is never in the config: `endpoint.api_key_env` names the
environment variable (a Kubernetes secret mounted as env in the cluster) it is read from. The policies a
config makes come from `components.teacher_policies.teacher_factory` (a scripted teacher is the recipe's own).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from components.core.policy.policies import OpenAIPolicyConfig


class TeacherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["scripted", "openai"] = Field("scripted", description="scripted expert | OpenAI-compatible endpoint.")
    error_rate: float = Field(0.3, ge=0.0, le=1.0, description="The scripted teacher's mistake rate.")
    endpoint: OpenAIPolicyConfig | None = Field(
        None, description="base_url, model and api_key_env (the env var holding the key) when kind='openai'."
    )

    @model_validator(mode="after")
    def _check(self) -> "TeacherConfig":
        if self.kind == "openai" and self.endpoint is None:
            raise ValueError(
                "teacher kind 'openai' needs endpoint=OpenAIPolicyConfig(base_url=..., model=..., api_key_env=...)"
            )
        return self
