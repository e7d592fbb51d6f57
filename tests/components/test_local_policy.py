"""LocalTransformersPolicy: sampling, stopping on </tool_call>, ids as sampled, loading from a directory."""

from __future__ import annotations

import pytest
import torch

from components.core.local_policy import LocalTransformersPolicy
from components.core.modeling import ModelConfig, TokenizerConfig, build_policy, save_policy
from components.core.policy_base import ChatMessage, GenerationConfig, Policy
from components.core.protocol import parse_tool_call
from components.core.rendering import render_prompt

MESSAGES = [ChatMessage(role="system", content="You fix bugs."),
            ChatMessage(role="user", content="Bug in `mathkit/core.py`. Fix `add`.")]
RESPONSE = 'Look first.\n<tool_call>{"name": "read_file", "arguments": {"path": "mathkit/core.py"}}</tool_call>'


@pytest.fixture(scope="module")
def memorized():
    """A tiny model trained (plain torch, ~2 s) to answer MESSAGES with RESPONSE and then ramble on."""
    model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])))
    prompt = render_prompt(MESSAGES, tokenizer)
    target = tokenizer.encode(RESPONSE + " more text after the call", add_special_tokens=False)
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(60):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < 0.1
    return model, tokenizer


def test_greedy_generation_stops_at_tool_call_and_returns_sampled_ids(memorized):
    model, tokenizer = memorized
    policy = LocalTransformersPolicy(model, tokenizer)
    assert isinstance(policy, Policy) and policy.policy_id.startswith("local:")
    gen = policy.generate(MESSAGES, GenerationConfig(temperature=0.0, max_new_tokens=128))
    assert gen.text == RESPONSE  # stopped on </tool_call>: nothing after it
    assert gen.finish_reason == "stop"
    assert tokenizer.decode(gen.token_ids) == gen.text
    assert gen.token_ids[-1] == tokenizer.convert_tokens_to_ids("</tool_call>")
    assert gen.completion_tokens == len(gen.token_ids) and gen.prompt_tokens == len(render_prompt(MESSAGES, tokenizer))
    assert parse_tool_call(gen.text).arguments == {"path": "mathkit/core.py"}
    # The next prompt re-uses the ids as sampled, so it is exactly what RL will train on.
    history = MESSAGES + [ChatMessage(role="assistant", content=gen.text), ChatMessage(role="tool", content="x")]
    assert policy.prompt_ids(history)[len(policy.prompt_ids(MESSAGES)):][: len(gen.token_ids)] == gen.token_ids


def test_sampling_is_reproducible_with_a_seed_and_respects_the_token_cap(memorized):
    model, tokenizer = memorized
    policy = LocalTransformersPolicy(model, tokenizer)
    cfg = GenerationConfig(temperature=1.5, top_p=0.95, max_new_tokens=6, seed=7)
    first, second = policy.generate(MESSAGES, cfg), policy.generate(MESSAGES, cfg)
    assert first.token_ids == second.token_ids
    assert len(first.token_ids) <= 6
    if len(first.token_ids) == 6 and first.token_ids[-1] not in policy._stop_ids:
        assert first.finish_reason == "length"
    role_ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|user|>", "<|tool|>", "<|system|>", "<|pad|>")}
    many = [policy.generate(MESSAGES, GenerationConfig(temperature=2.0, max_new_tokens=24, seed=s)) for s in range(4)]
    assert all(not (set(g.token_ids) & role_ids) for g in many)  # a turn never opens another turn


def test_policy_from_a_saved_directory(memorized, tmp_path):
    model, tokenizer = memorized
    path = save_policy(model, tokenizer, tmp_path / "sft-model")
    policy = LocalTransformersPolicy(path)
    assert policy.policy_id.startswith("local:sft-model@")
    assert LocalTransformersPolicy(path).policy_id == policy.policy_id
    gen = policy.generate(MESSAGES, GenerationConfig(temperature=0.0, max_new_tokens=128))
    assert gen.text == RESPONSE


def test_a_prompt_that_fills_the_context_is_a_length_stop_not_a_crash(memorized):
    model, tokenizer = memorized
    policy = LocalTransformersPolicy(model, tokenizer, max_context_tokens=8)
    gen = policy.generate(MESSAGES, GenerationConfig(max_new_tokens=4))
    assert gen.finish_reason == "length" and gen.token_ids == [] and "fills the context" in gen.raw["reason"]
