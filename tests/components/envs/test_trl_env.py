"""TRL `environment_factory` classes: tools from the recipe, a verified reward, infra failures unscored, and
the example script's 2 GRPO steps on CPU through them."""

from __future__ import annotations

import inspect

import pytest

from components.core.policy.base import ChatMessage, GenerationConfig
from components.core.rendering.protocol import parse_tool_call
from components.envs.session import EnvConfig
from components.recipes import get_recipe, get_scripted_teacher

trl = pytest.importorskip("trl", reason="needs the orchard[trl] extra")
from components.envs.trl_env import ENVIRONMENTS, prepare_tokenizer  # noqa: E402


@pytest.mark.parametrize("recipe", ["swe", "gui", "claw"])
def test_public_methods_are_exactly_reset_get_reward_and_the_recipes_tools(recipe):
    from transformers.utils import get_json_schema

    cls = ENVIRONMENTS[recipe]
    public = {name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction) if not name.startswith("_")}
    tools = {t.name: t for t in get_recipe(recipe).tools()}
    assert public == set(tools) | {"reset", "get_reward"}  # what TRL exposes as tools (plus its two hooks)
    for name, spec in tools.items():
        schema = get_json_schema(getattr(cls, name))["function"]
        assert schema["name"] == name and schema["description"].startswith(spec.description.split("\n")[0])
        assert set(schema["parameters"]["properties"]) == set(spec.parameters.get("properties", {}))
        assert set(schema["parameters"].get("required", [])) == set(spec.parameters.get("required", []))


def test_prepared_tokenizer_renders_and_parses_tool_calls_in_our_chat_format():
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    from components.core.policy.modeling import TokenizerConfig
    from components.tiny_model import build_tokenizer

    tok = build_tokenizer(TokenizerConfig(corpus_recipes=[], vocab_size=512))
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls é"}}}
    chat = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "t", "tool_calls": [call]},
        {"role": "tool", "content": "o"},
    ]
    before = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    prepare_tokenizer(tok)
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == before  # ids unchanged
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    reply = 't\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls \u00e9"}}\n</tool_call><|im_end|>'
    assert reply.replace("\\u00e9", "é") in before  # what the template renders is what the parser reads
    prefix = tok.encode("<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    parsed = tok.parse_response(tok.encode(reply, add_special_tokens=False), prefix=prefix)
    assert parsed["tool_calls"][0]["function"] == {"name": "bash", "arguments": {"command": "ls é"}}
    with pytest.raises(ValueError, match="orchard's chat template"):
        tok.chat_template = "{{ messages }}"
        prepare_tokenizer(tok)


def test_a_rollout_through_the_tool_methods_reaches_the_verified_reward(sandbox_service):
    config = EnvConfig(recipe="swe", num_tasks=4, service=sandbox_service.connection())
    env = ENVIRONMENTS["swe"].factory(config)()
    prompt = env.reset(task_index=1, prompt=[{"role": "user", "content": "ignored row field"}])
    assert "submit" in prompt and "bug" in prompt.lower()
    task = get_recipe("swe").tasks("train", 4, 0)[1]
    teacher = get_scripted_teacher("swe", error_rate=0.0, seed=0)
    teacher.reset(task)
    messages = [ChatMessage(role="user", content=prompt)]
    for _ in range(16):
        text = teacher.generate(messages, GenerationConfig()).text
        call = parse_tool_call(text)
        output = getattr(env, call.name)(**call.arguments)  # TRL calls the bound method with the parsed arguments
        messages += [ChatMessage(role="assistant", content=text), ChatMessage(role="tool", content=output)]
        if call.name == "submit":
            break
    assert env.get_reward() == 1.0
    assert env.submit() == "The episode is over; no more tool calls are needed."


def test_infrastructure_failure_is_unscored_not_zero(sandbox_service, sandbox_client):
    config = EnvConfig(recipe="swe", num_tasks=4, service=sandbox_service.connection())
    env = ENVIRONMENTS["swe"].factory(config)()
    env.reset(task_index=0)
    sandbox_client.request("DELETE", f"/v1/sandboxes/{env._session.sandbox.id}")
    assert env.bash(command="ls").startswith("Environment error:")
    assert env.get_reward() is None


@pytest.mark.slow
def test_example_script_trains_two_grpo_steps_on_cpu(sandbox_service, sandbox_client, tmp_path):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "scripts" / "trl_grpo_env.py"
    spec = importlib.util.spec_from_file_location("trl_grpo_env", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trainer = module.train("swe", 2, sandbox_service.connection(), str(tmp_path))
    assert trainer.state.global_step == 2
    logged = [e for e in trainer.state.log_history if "rewards/SWEEnvironment/mean" in e]
    assert len(logged) == 2 and all(e["rewards/SWEEnvironment/mean"] == 0.0 for e in logged)  # untrained: verified 0
    live = [s for s in sandbox_client.list({"orchard.recipe": "swe"}) if s.state.value != "deleted"]
    assert live == []  # every rollout's sandbox was freed once get_reward verified it
