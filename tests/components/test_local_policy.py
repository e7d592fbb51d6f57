"""LocalTransformersPolicy: sampling, stopping on the end-of-turn token, ids and logprobs as sampled."""

from __future__ import annotations

import pytest
import torch

from components.core.policy.local import LocalTransformersPolicy
from components.core.policy.modeling import ModelConfig, TokenizerConfig, save_policy
from components.tiny_model import build_policy
from components.core.policy.base import ChatMessage, GenerationConfig, Policy, ToolAwarePolicy
from components.core.rendering.tokens import render_prompt, tokenizer_id
from components.core.rendering.tool_formats import parse_call

MESSAGES = [
    ChatMessage(role="system", content="You fix bugs."),
    ChatMessage(role="user", content="Bug in `mathkit/core.py`. Fix `add`."),
]
RESPONSE = 'Look first.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "mathkit/core.py"}}\n</tool_call>'


@pytest.fixture(scope="module")
def memorized():
    """A tiny model trained (plain torch, ~2 s) to answer MESSAGES with RESPONSE and then ramble on."""
    model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])))
    prompt = render_prompt(MESSAGES, tokenizer)
    target = (
        tokenizer.encode(RESPONSE, add_special_tokens=False)
        + [tokenizer.eos_token_id]
        + tokenizer.encode(" more text after the turn", add_special_tokens=False)
    )
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


def test_greedy_generation_stops_at_end_of_turn_and_returns_sampled_ids_and_logprobs(memorized):
    model, tokenizer = memorized
    policy = LocalTransformersPolicy(model, tokenizer)
    assert isinstance(policy, Policy) and isinstance(policy, ToolAwarePolicy) and policy.tool_format == "hermes"
    gen = policy.generate(MESSAGES, GenerationConfig(temperature=0.0, max_new_tokens=128))
    assert gen.text == RESPONSE  # stopped on <|im_end|>: nothing after it
    assert gen.finish_reason == "stop"
    assert gen.token_ids[-1] == tokenizer.eos_token_id and tokenizer.decode(gen.token_ids[:-1]) == gen.text
    assert gen.tokenizer_id == tokenizer_id(tokenizer)
    assert gen.completion_tokens == len(gen.token_ids) and gen.prompt_tokens == len(render_prompt(MESSAGES, tokenizer))
    assert parse_call(gen.text, "hermes").arguments == {"path": "mathkit/core.py"}
    # logprobs are those of the sampling distribution (suppressed ids excluded): recomputed, they agree
    prompt = render_prompt(MESSAGES, tokenizer)
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logits[:, policy._suppress] = float("-inf")
    again = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]
    assert len(gen.logprobs) == len(gen.token_ids)
    assert torch.allclose(torch.tensor(gen.logprobs), again, atol=1e-4)
    # The next prompt re-uses the ids as sampled, so it is exactly what RL will train on.
    history = MESSAGES + [
        ChatMessage(role="assistant", content=gen.text, token_ids=gen.token_ids, tokenizer_id=gen.tokenizer_id),
        ChatMessage(role="tool", content="x"),
    ]
    assert policy.prompt_ids(history)[len(policy.prompt_ids(MESSAGES)) :][: len(gen.token_ids)] == gen.token_ids


def test_sampling_is_reproducible_with_a_seed_and_respects_the_token_cap(memorized):
    model, tokenizer = memorized
    policy = LocalTransformersPolicy(model, tokenizer)
    cfg = GenerationConfig(temperature=1.5, top_p=0.95, max_new_tokens=6, seed=7)
    first, second = policy.generate(MESSAGES, cfg), policy.generate(MESSAGES, cfg)
    assert first.token_ids == second.token_ids
    assert len(first.token_ids) <= 6
    # The cap cuts a turn that had not ended: greedy decoding of the memorized reply, stopped after 3 tokens
    # (the reply is far longer), is its first 3 tokens with finish_reason "length".
    full = policy.generate(MESSAGES, GenerationConfig(temperature=0.0, max_new_tokens=128))
    capped = policy.generate(MESSAGES, GenerationConfig(temperature=0.0, max_new_tokens=3))
    assert len(full.token_ids) > 3 and full.finish_reason == "stop"
    assert capped.token_ids == full.token_ids[:3] and capped.finish_reason == "length"
    role_ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|pad|>")}
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
