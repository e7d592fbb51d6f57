"""The policy contract: anything that turns chat messages into the next assistant message.

Implementations: `policies.LocalTransformersPolicy` (tiny model or any `from_pretrained` path),
`policies.OpenAICompatiblePolicy` (vLLM or any OpenAI-compatible endpoint, the production teacher),
`teachers.ScriptedTeacher` (the built-in expert for the generated suites).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from components.core.data.schema import ToolCall


class ChatMessage(BaseModel):
    """OpenAI chat message shape (the subset we use), plus what a local renderer needs to reuse a turn
    exactly as it was sampled (`token_ids` of the tokenizer `tokenizer_id`)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_call_id: str | None = None
    name: str | None = None
    tool_call: ToolCall | None = Field(None, description="The parsed call of an assistant turn.")
    token_ids: list[int] | None = Field(None, description="Assistant turn ids as sampled.")
    tokenizer_id: str | None = Field(None, description="Tokenizer those ids belong to.")


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_new_tokens: int = Field(256, ge=1, description="Cap on generated tokens per turn.")
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: list[str] = Field(default_factory=list, description="Stop strings (e.g. '</tool_call>').")
    seed: int | None = Field(
        None,
        description="The episode's sampling seed (None: unseeded). Each turn samples "
        "with its own seed derived from it (`for_turn`).",
    )

    def for_turn(self, turn: int) -> GenerationConfig:
        """This config for the episode's `turn`-th assistant turn (0-based): the seed of turn t is a hash of
        (seed, t), so every turn draws fresh random numbers while the episode stays reproducible from its
        seed. One seed for every turn would replay the same uniforms at each turn (a policy that reseeds
        per call puts turn 2's first token at the same CDF position as turn 1's), and a multi-turn episode
        would not be a draw from the policy. Turn 0 keeps the episode seed itself."""
        if self.seed is None or turn == 0:
            return self
        return self.model_copy(update={"seed": turn_seed(self.seed, turn)})


def turn_seed(seed: int, turn: int) -> int:
    """A 63-bit seed for (episode seed, turn), independent of its neighbours (no seed + turn arithmetic: episode
    e's turn 1 would be episode e + 1's turn 0)."""
    import hashlib

    digest = hashlib.blake2b(f"{seed}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class Generation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    token_ids: list[int] | None = Field(None, description="Generated ids exactly as sampled (local models, vLLM).")
    logprobs: list[float] | None = Field(None, description="Log-probability of each sampled id.")
    tokenizer_id: str | None = Field(None, description="Tokenizer the ids belong to (rendering.tokenizer_id).")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: Literal["stop", "length", "error"] = "stop"
    raw: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    policy_id: str

    def generate(self, messages: list[ChatMessage], config: GenerationConfig) -> Generation:
        """Return the next assistant message for the conversation so far."""
        ...


@runtime_checkable
class ToolAwarePolicy(Protocol):
    """A policy that writes tool calls in a model-native format and takes the tool specs itself
    (through its chat template or the endpoint's `tools`), instead of the text protocol."""

    policy_id: str
    tool_format: str

    def generate(
        self, messages: list[ChatMessage], config: GenerationConfig, tools: list[dict[str, Any]] | None = None
    ) -> Generation: ...


@runtime_checkable
class EpisodeAwarePolicy(Protocol):
    """A policy that needs to know the task (scripted teachers). The harness calls `reset` first."""

    def reset(self, task: Any) -> None: ...
