"""Policies: an OpenAI-compatible chat endpoint (vLLM, SGLang, any hosted API) and, lazily imported,
the local transformers model (`components.core.policy.local`).

The endpoint is driven with the text tool-call protocol, so any chat model works without native
function calling; if an endpoint answers with native `tool_calls` anyway, they are rendered into
protocol text so the harness sees one format. Tool observations are sent as user messages wrapped in
`<tool_response>` by default, because strict endpoints reject `tool` messages that do not answer a
native tool call.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from components.core.policy.base import ChatMessage, Generation, GenerationConfig
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import ToolCall
from components.core.policy.endpoint import (
    ChatEndpoint,
    PolicyError,
    PolicyHTTPError,
    PolicyResponseError,
    PolicyUnavailableError,
)
from sandbox_service.retry import Backoff

__all__ = ["PolicyError", "PolicyHTTPError", "PolicyResponseError", "PolicyUnavailableError"]


class OpenAIPolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(description="Endpoint base URL including /v1, e.g. http://vllm:8000/v1.")
    model: str = Field(description="Model name the endpoint serves.")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="Env var holding the API key (None: no auth).")
    timeout_seconds: float = Field(120.0, gt=0, description="Read timeout of one completion request.")
    connect_timeout_seconds: float = Field(10.0, gt=0, description="Connect timeout.")
    max_retries: int = Field(5, ge=0, description="Retries on 429, 5xx, timeouts and connection errors.")
    backoff_seconds: float = Field(0.5, ge=0, description="First backoff; doubles per retry (with jitter).")
    max_backoff_seconds: float = Field(20.0, ge=0, description="Cap on one backoff (and on Retry-After).")
    tool_message_role: Literal["user", "tool"] = Field(
        "user", description="How tool observations are sent: user + <tool_response> (portable) or role tool."
    )
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra request fields (vLLM options).")
    sampled_tokens: bool = Field(
        False,
        description="Ask for the sampled ids and their logprobs (OpenAI `logprobs`; vLLM `return_token_ids` "
        "and `return_tokens_as_token_ids`) and store them with each step.",
    )
    tokenizer_path: str | None = Field(
        None,
        description="The served model's tokenizer (a local directory): its fingerprint tags the returned ids "
        "so training on that tokenizer uses them verbatim. Without it they are kept but "
        "re-tokenized at training.",
    )


class OpenAICompatiblePolicy:
    """Chat completions against an OpenAI-compatible endpoint, with retries and explicit timeouts."""

    def __init__(
        self, config: OpenAIPolicyConfig | None = None, *, transport: httpx.BaseTransport | None = None, **settings: Any
    ):
        """`OpenAICompatiblePolicy(OpenAIPolicyConfig(...))` or `OpenAICompatiblePolicy(base_url=..., model=...)`."""
        if config is None:
            config = OpenAIPolicyConfig(**settings)
        elif settings:
            raise TypeError("pass either a config or keyword settings, not both")
        self.config = config
        self.policy_id = f"openai:{config.model}"
        self.tokenizer_id = f"endpoint:{config.model}"
        if config.tokenizer_path:
            from components.core.policy.modeling import load_tokenizer
            from components.core.rendering.tokens import tokenizer_id

            self.tokenizer_id = tokenizer_id(load_tokenizer(config.tokenizer_path))
        # The endpoint's one client (components/core/policy/endpoint.py): key, timeouts, retries.
        self.endpoint = ChatEndpoint(
            config.base_url,
            api_key_env=config.api_key_env,
            timeout_seconds=config.timeout_seconds,
            connect_timeout_seconds=config.connect_timeout_seconds,
            max_retries=config.max_retries,
            backoff=Backoff(config.backoff_seconds, config.max_backoff_seconds),
            transport=transport,
        )

    def close(self) -> None:
        self.endpoint.close()

    def __enter__(self) -> "OpenAICompatiblePolicy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _messages(self, messages: list[ChatMessage]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "tool" and (self.config.tool_message_role == "user" or not m.tool_call_id):
                out.append({"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"})
            elif m.role == "tool":
                out.append({"role": "tool", "content": m.content, "tool_call_id": m.tool_call_id})
            else:
                out.append({"role": m.role, "content": m.content})
        return out

    def _body(self, messages: list[ChatMessage], config: GenerationConfig) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": self._messages(messages),
            "max_tokens": config.max_new_tokens,
            "temperature": config.temperature,
            "top_p": config.top_p,
        }
        if config.stop:
            body["stop"] = config.stop
        if config.seed is not None:
            body["seed"] = config.seed
        if self.config.sampled_tokens:
            body.update(logprobs=True, return_token_ids=True, return_tokens_as_token_ids=True)
        body.update(self.config.extra_body)
        return body

    def generate(self, messages: list[ChatMessage], config: GenerationConfig) -> Generation:
        data = self.endpoint.complete(self._body(messages, config))
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise PolicyResponseError(f"no choices[0].message in response: {str(data)[:300]}") from None
        text = message.get("content") or ""
        for native in message.get("tool_calls") or []:  # native function calls -> protocol text
            fn = native.get("function", {})
            args = fn.get("arguments") or "{}"
            try:
                parsed = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                parsed = {"_raw": args}
            text += ("\n" if text else "") + format_tool_call(
                ToolCall(name=fn.get("name", ""), arguments=parsed if isinstance(parsed, dict) else {})
            )
            break  # one call per turn, like the text protocol
        usage = data.get("usage") or {}
        finish = choice.get("finish_reason")
        ids, logprobs = sampled_tokens(choice) if self.config.sampled_tokens else (None, None)
        return Generation(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            finish_reason="length" if finish == "length" else "stop",
            raw=data,
            token_ids=ids,
            logprobs=logprobs,
            tokenizer_id=self.tokenizer_id if ids is not None else None,
        )


def sampled_tokens(choice: dict[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """(ids, logprobs) of a chat-completion choice, when the endpoint returned them.

    Ids: vLLM's `choice.token_ids` (`return_token_ids`), else the `token_id:<n>` strings that
    `return_tokens_as_token_ids` puts in `logprobs.content[].token`. Logprobs: `logprobs.content[].logprob`.
    Logprobs whose count differs from the ids' do not describe the same tokens and are dropped.
    """
    content = ((choice.get("logprobs") or {}).get("content")) or []
    logprobs = [float(c["logprob"]) for c in content if "logprob" in c] or None
    ids = choice.get("token_ids")
    if ids is None and content and all(str(c.get("token", "")).startswith("token_id:") for c in content):
        ids = [int(str(c["token"]).split(":", 1)[1]) for c in content]
    if ids is None:
        return None, None
    ids = [int(i) for i in ids]
    if logprobs is not None and len(logprobs) != len(ids):
        logprobs = None
    return ids, logprobs


def __getattr__(name: str) -> Any:
    # The local model pulls in torch; import it only when asked for.
    if name == "LocalTransformersPolicy":
        from components.core.policy.local import LocalTransformersPolicy

        return LocalTransformersPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
