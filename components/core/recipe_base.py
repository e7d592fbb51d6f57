"""The recipe contract: what changes between SWE, GUI and Claw. The sandbox service, harness loop,
stages and pipeline stay the same; a recipe supplies tasks, tools, environment setup and a verifier.
"""

from __future__ import annotations

import abc
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from components.core.schema import Split, Task, TestReport, ToolCall, Verification
from sandbox_service.client import Sandbox
from sandbox_service.models import SandboxCreate


class ToolSpec(BaseModel):
    """An OpenAI-style function tool offered to the policy."""

    model_config = ConfigDict(extra="forbid")
    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": self.model_dump()}


class ToolResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str = Field(description="Observation text returned to the policy.")
    policy_error: str | None = Field(None, description="Bad arguments or a failed action: the policy's fault.")
    infra_error: str | None = Field(None, description="The environment failed: never the policy's fault.")
    submitted: bool = Field(False, description="The episode ends (submit / answer).")
    final_answer: str | None = None
    image_png: bytes | None = Field(None, description="Screenshot for vision policies (GUI).")


class VerifyResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resolved: bool
    report: TestReport = Field(default_factory=TestReport)
    infra_error: str | None = Field(None, description="Verification itself failed (not the policy's fault).")
    reason: str | None = None
    verification: Verification | None = Field(None, description="Verifier version and what it ignored (audit).")


class RecipeBase(abc.ABC):
    name: str

    @abc.abstractmethod
    def tasks(self, split: Split, n: int, seed: int = 0) -> list[Task]:
        """Deterministic task generation from a seed."""

    @abc.abstractmethod
    def tools(self) -> list[ToolSpec]:
        """Tools offered to the policy."""

    @abc.abstractmethod
    def sandbox_spec(self, task: Task) -> SandboxCreate:
        """Resources, network and image of the task's sandbox."""

    @abc.abstractmethod
    def setup(self, sandbox: Sandbox, task: Task) -> None:
        """Place the task's files and start its services inside the sandbox (no hidden files)."""

    @abc.abstractmethod
    def execute_tool(self, sandbox: Sandbox, task: Task, call: ToolCall) -> ToolResult:
        """Run one tool call in the sandbox."""

    @abc.abstractmethod
    def verify(self, sandbox: Sandbox, task: Task, final_answer: str | None) -> VerifyResult:
        """Check the final state (hidden tests / site state / assistant state)."""

    def system_prompt(self, task: Task) -> str:
        return "You are an agent acting in a sandbox through tools."

    def reference_calls(self, task: Task) -> list[ToolCall]:
        """The tool calls of a clean solution of a training task, without running it (the local tokenizer's
        corpus learns how tool calls are written from them); [] when the recipe cannot say."""
        return []

    def release(self, sandbox: Sandbox) -> None:
        """The episode on `sandbox` is over (verified or aborted): free what `setup` kept for it."""
