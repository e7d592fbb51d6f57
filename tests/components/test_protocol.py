"""The text tool-call protocol: formatting, tolerant parsing, malformed output."""

from __future__ import annotations

import pytest

from components.core.rendering.protocol import ToolCallParseError, format_tool_call, parse_tool_call, tools_prompt
from components.core.data.schema import ToolCall


def test_format_then_parse_round_trip():
    call = ToolCall(name="str_replace", arguments={"path": "a.py", "old_str": 'x = "}"', "new_str": "y\n"})
    text = format_tool_call(call)
    assert text.startswith("<tool_call>{") and text.endswith("}</tool_call>")
    back = parse_tool_call(text)
    assert (back.name, back.arguments) == (call.name, call.arguments)


@pytest.mark.parametrize(
    "text",
    [
        'I will list files.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}',  # stop string cut the closing tag
        '<tool_call> {"name": "bash", "arguments": {"command": "ls"}} trailing </tool_call> more text',
        '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>',  # JSON-string args
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call><tool_call>{"name": "submit"}</tool_call>',  # noqa: E501
    ],
)
def test_tolerant_parsing_takes_the_first_call(text):
    call = parse_tool_call(text)
    assert call.name == "bash" and call.arguments == {"command": "ls"}


def test_missing_arguments_default_to_empty():
    assert parse_tool_call('<tool_call>{"name": "submit"}</tool_call>').arguments == {}


@pytest.mark.parametrize(
    "text, message",
    [
        ("just some prose", "no tool call found"),
        ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call>', "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'string "name"'),
        ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', '"arguments" must be a JSON object'),
        ('<tool_call>{"name": "bash", "arguments": "not json"}</tool_call>', '"arguments" must be a JSON object'),
    ],
)
def test_malformed_output_raises_a_message_for_the_model(text, message):
    with pytest.raises(ToolCallParseError, match=message):
        parse_tool_call(text)


def test_tools_prompt_lists_every_tool():
    text = tools_prompt(
        [
            {
                "type": "function",
                "function": {"name": "bash", "description": "Run.", "parameters": {"properties": {"command": {}}}},
            }
        ]
    )
    assert "- bash(command): Run." in text and "<tool_call>" in text
