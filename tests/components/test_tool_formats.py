"""Tool-call formats (protocol, Hermes, Llama 3 JSON): detection, parsing, and a native-format policy in
a real sandbox episode (tools through `tools=`, no protocol text in the system prompt)."""

from __future__ import annotations

import pytest

from components.core.rendering.chat_templates import CHATML_TOOLS, LLAMA3_TOOLS
from components.core.episode.harness import HarnessConfig, run_episode
from components.core.policy.base import Generation
from components.core.rendering.protocol import ToolCallParseError, tools_prompt
from components.core.data.schema import Outcome, ToolCall
from components.core.rendering.tool_formats import detect_tool_format, format_call, parse_call, thought_of
from components.recipes.swe import SWERecipe
from components.recipes.swe.generator import generate_tasks

CALL = ToolCall(id="c1", name="read_file", arguments={"path": "src/módulo.py"})


def test_detect_from_the_template():
    assert detect_tool_format(CHATML_TOOLS) == "hermes"
    assert detect_tool_format(LLAMA3_TOOLS) == "llama3_json"
    assert detect_tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "protocol"
    assert detect_tool_format(None) == "protocol"


@pytest.mark.parametrize("fmt", ["protocol", "hermes", "llama3_json"])
def test_each_format_round_trips_and_separates_the_thought(fmt):
    text = format_call(CALL, fmt)
    assert parse_call(text, fmt, call_id="c1") == CALL
    if fmt != "llama3_json":
        assert thought_of(f"I look first.\n{text}") == "I look first."
    assert thought_of(text) == ""


def test_llama3_variants_and_errors_are_for_the_model():
    assert parse_call('<|python_tag|>{"name": "submit", "parameters": {}}', "llama3_json").name == "submit"
    assert parse_call('{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}', "llama3_json").arguments == {
        "command": "ls"
    }
    for bad, message in [
        ("no json here", "no tool call found"),
        ('{"name": ', "not valid JSON"),
        ('{"parameters": {}}', 'string "name"'),
        ('{"name": "x", "parameters": [1]}', "JSON object"),
    ]:
        with pytest.raises(ToolCallParseError, match=message):
            parse_call(bad, "llama3_json")


class NativeJSON:
    """A tool-aware policy writing Llama 3 JSON calls: reads the file, then submits."""

    policy_id = "native-json"
    tool_format = "llama3_json"

    def __init__(self):
        self.calls: list[tuple[list, list | None]] = []

    def generate(self, messages, config, tools=None):
        self.calls.append((messages, tools))
        call = (
            {"name": "bash", "parameters": {"command": "ls"}}
            if len(self.calls) == 1
            else {"name": "submit", "parameters": {}}
        )
        import json

        return Generation(text=json.dumps(call), token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3], tokenizer_id="tok-x")


def test_a_native_policy_gets_tools_natively_and_its_calls_are_parsed(sandbox_client):
    recipe, task = SWERecipe(), generate_tasks("train", 1, 3, difficulty=1)[0]
    policy = NativeJSON()
    traj = run_episode(task, recipe, policy, sandbox_client, HarnessConfig(max_steps=3))
    assert traj.outcome is not Outcome.infra_error, traj.outcome_reason
    assert [s.tool_call.name for s in traj.steps if s.role == "assistant"] == ["bash", "submit"]
    system = traj.steps[0].content
    assert tools_prompt(traj.tools) not in system  # no text-protocol description for a native policy
    assert policy.calls[0][1] == traj.tools and len(traj.tools) > 0
    step = traj.steps[2]
    assert step.token_ids == [1, 2, 3] and step.logprobs == [-0.1, -0.2, -0.3] and step.tokenizer_id == "tok-x"
    assert traj.metadata["tool_format"] == "llama3_json"
    with pytest.raises(ValueError, match="build the policy with the same tool_format"):
        run_episode(task, recipe, NativeJSON(), sandbox_client, HarnessConfig(tool_format="hermes"))
