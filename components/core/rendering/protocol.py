"""The text tool-call protocol: how a policy (even a tiny model) asks for a tool in plain text.

An assistant message calls one tool with

    <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>

Parsing is tolerant where a model's slip is harmless: text before the tag is ignored (a thought),
only the first call counts, anything after its JSON object is ignored, and a missing closing tag is
accepted (a stop string `</tool_call>` is usually cut off by the endpoint). Anything else raises
`ToolCallParseError`, whose message is written for the model: the harness returns it as a
policy-error observation and the episode goes on.
"""

from __future__ import annotations

import json
from typing import Any

from components.core.data.schema import ToolCall

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

_DECODER = json.JSONDecoder()


class ToolCallParseError(ValueError):
    """The assistant text holds no valid tool call; the message says what to emit instead."""


def format_tool_call(call: ToolCall) -> str:
    """The exact protocol text for `call` (what the scripted teacher emits and the model learns)."""
    payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{OPEN_TAG}{payload}{CLOSE_TAG}"


def parse_tool_call(text: str, *, call_id: str | None = None) -> ToolCall:
    """The first tool call in `text`; raises `ToolCallParseError` when there is none or it is malformed."""
    start = text.find(OPEN_TAG)
    if start < 0:
        raise ToolCallParseError(
            f'no tool call found. Reply with exactly one {OPEN_TAG}{{"name": ..., "arguments": {{...}}}}{CLOSE_TAG}.'
        )
    body = text[start + len(OPEN_TAG) :].lstrip()
    try:
        payload, _ = _DECODER.raw_decode(body)
    except json.JSONDecodeError as err:
        raise ToolCallParseError(f"the tool call is not valid JSON ({err.msg} at char {err.pos}).") from None
    if not isinstance(payload, dict):
        raise ToolCallParseError('the tool call must be a JSON object with keys "name" and "arguments".')
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallParseError('the tool call needs a string "name".')
    arguments: Any = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models emit OpenAI-style JSON-encoded arguments
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise ToolCallParseError('"arguments" must be a JSON object.') from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolCallParseError('"arguments" must be a JSON object.')
    kwargs: dict[str, Any] = {"name": name, "arguments": arguments}
    if call_id is not None:
        kwargs["id"] = call_id
    return ToolCall(**kwargs)


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """A compact description of the offered tools and the protocol, appended to the system prompt."""
    lines = [
        "Call exactly one tool per reply, as:",
        f'{OPEN_TAG}{{"name": "<tool>", "arguments": {{...}}}}{CLOSE_TAG}',
        "Tools:",
    ]
    for tool in tools:
        fn = tool.get("function", tool)
        params = ", ".join(fn.get("parameters", {}).get("properties", {}))
        lines.append(f"- {fn['name']}({params}): {fn.get('description', '')}")
    return "\n".join(lines)
