"""Tool-call formats: how a model writes a tool call, and how we read it back.

- `protocol`: our plain-text protocol (`protocol.py`), described in the system prompt; works with any
  chat template, even one that knows nothing about tools.
- `hermes`: Qwen / Hermes native calls, `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
  the tools offered through the chat template's `tools=`.
- `llama3_json`: Llama 3 JSON calls, `{"name": ..., "parameters": {...}}` as the whole reply
  (optionally after `<|python_tag|>`), the tools offered through `tools=`.

`detect_tool_format` reads the format off a tokenizer's chat template; a harness may override it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from components.core.rendering.protocol import (
    CLOSE_TAG,
    OPEN_TAG,
    ToolCallParseError,
    format_tool_call,
    parse_tool_call,
)
from components.core.data.schema import ToolCall

ToolFormat = Literal["protocol", "hermes", "llama3_json"]
ToolFormatSetting = Literal["auto", "protocol", "hermes", "llama3_json"]  # a config's choice: auto = the policy's own
NATIVE_FORMATS: tuple[ToolFormat, ...] = ("hermes", "llama3_json")
PYTHON_TAG = "<|python_tag|>"

_DECODER = json.JSONDecoder()


def detect_tool_format(chat_template: str | None) -> ToolFormat:
    """The format a chat template renders tool calls in; `protocol` when it takes no `tools`."""
    template = chat_template or ""
    if "tools" not in template:
        return "protocol"
    if OPEN_TAG in template:
        return "hermes"
    if "parameters" in template:
        return "llama3_json"
    return "protocol"


def _parse_llama3(text: str, call_id: str | None) -> ToolCall:
    body = text.replace(PYTHON_TAG, "")
    start = body.find("{")
    if start < 0:
        raise ToolCallParseError(
            'no tool call found. Reply with exactly one JSON object {"name": ..., "parameters": {...}}.'
        )
    try:
        payload, _ = _DECODER.raw_decode(body[start:])
    except json.JSONDecodeError as err:
        raise ToolCallParseError(f"the tool call is not valid JSON ({err.msg} at char {err.pos}).") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or not payload["name"]:
        raise ToolCallParseError('the tool call must be a JSON object with a string "name" and "parameters".')
    arguments: Any = payload.get("parameters", payload.get("arguments", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise ToolCallParseError('"parameters" must be a JSON object.') from None
    if not isinstance(arguments, dict):
        raise ToolCallParseError('"parameters" must be a JSON object.')
    kwargs: dict[str, Any] = {"name": payload["name"], "arguments": arguments}
    if call_id is not None:
        kwargs["id"] = call_id
    return ToolCall(**kwargs)


def parse_call(text: str, tool_format: ToolFormat, *, call_id: str | None = None) -> ToolCall:
    """The tool call in `text`, read in `tool_format`; raises `ToolCallParseError` (a message for the model)."""
    try:
        if tool_format == "llama3_json":
            call = _parse_llama3(text, call_id)
        else:  # protocol and hermes share the tag syntax; the parser tolerates hermes' newlines around the JSON
            call = parse_tool_call(text, call_id=call_id)
        json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")  # storable as the trajectory stores it
    except RecursionError:
        raise ToolCallParseError("the tool call's JSON is nested too deeply") from None
    except UnicodeEncodeError:
        raise ToolCallParseError("the tool call's arguments hold escapes that are not text (lone surrogates)") from None
    return call


def format_call(call: ToolCall, tool_format: ToolFormat) -> str:
    """The text a model of `tool_format` writes for `call` (for endpoints that answer natively)."""
    if tool_format == "llama3_json":
        return json.dumps({"name": call.name, "parameters": call.arguments}, ensure_ascii=False)
    if tool_format == "hermes":
        payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{OPEN_TAG}\n{payload}\n{CLOSE_TAG}"
    return format_tool_call(call)


def thought_of(text: str) -> str:
    """`text` without its tool-call markup (any format): the free text a model wrote around the call."""
    if OPEN_TAG in text:
        head, _, rest = text.partition(OPEN_TAG)
        tail = rest.partition(CLOSE_TAG)[2] if CLOSE_TAG in rest else ""
        return (head.rstrip() + ("\n" + tail.strip() if tail.strip() else "")).strip()
    stripped = text.replace(PYTHON_TAG, "").strip()
    if stripped.startswith("{"):
        try:
            payload, end = _DECODER.raw_decode(stripped)
        except json.JSONDecodeError:
            return text
        if isinstance(payload, dict) and "name" in payload:
            return stripped[end:].strip()
    return text
