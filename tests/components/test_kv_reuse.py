"""KV reuse across turns: a conversation's next turn decodes from its kept cache; greedy outputs
equal a full prefill's, batched rows with and without a kept prefix mix, and kept KV never outlives the
weights it was computed with."""

from __future__ import annotations

import torch

from components.core.policy.local import LocalTransformersPolicy
from components.core.policy.modeling import ModelConfig, TokenizerConfig
from components.tiny_model import build_policy
from components.core.policy.base import ChatMessage, GenerationConfig

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=12)


def _conversations(n: int) -> list[list[ChatMessage]]:
    return [
        [
            ChatMessage(role="system", content="You fix bugs."),
            ChatMessage(role="user", content=f"Bug {i} in `pkg{i}/core.py`." + " Details." * i),
        ]
        for i in range(n)
    ]


def _play(policy: LocalTransformersPolicy, turns: int, n: int = 3, on_turn=None) -> list[list[tuple]]:
    """`turns` batched greedy turns of `n` conversations (a tool answer after each); per turn the rows'
    (ids, logprobs). The third conversation joins at the second turn: its rows have no kept prefix."""
    conversations, seen = _conversations(n), []
    for turn in range(turns):
        if on_turn:
            on_turn(turn)
        active = conversations if turn else conversations[:-1]
        out = policy.generate_batch(active, GREEDY)
        seen.append([(g.token_ids, g.logprobs) for g in out])
        for messages, g in zip(active, out):
            messages += [
                ChatMessage(role="assistant", content=g.text, token_ids=g.token_ids, tokenizer_id=g.tokenizer_id),
                ChatMessage(role="tool", content=f"output of turn {turn}", name="bash", tool_call_id="c"),
            ]
    return seen


def _models():
    torch.manual_seed(0)
    model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])))
    return model, tokenizer


def test_greedy_turns_equal_a_full_prefill_and_reuse_the_kept_prefix():
    model, tokenizer = _models()
    plain = _play(LocalTransformersPolicy(model, tokenizer, kv_reuse=False), turns=3)
    reusing = LocalTransformersPolicy(model, tokenizer)
    kept = _play(reusing, turns=3)
    for turn_plain, turn_kept in zip(plain, kept):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(turn_plain, turn_kept):
            assert ids_a == ids_b
            assert torch.allclose(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-4)
    stats = reusing.turns.stats
    assert (stats.hits, stats.misses) == (0 + 2 + 3, 2 + 1 + 0)  # turn 2: the newcomer has nothing kept
    assert stats.reused_tokens > stats.prefilled_tokens / 2  # most of each later prompt came from the cache


def test_kept_kv_is_dropped_when_the_weights_change():
    model, tokenizer = _models()
    reference_model, _ = _models()

    def step(m):  # an optimizer step between the turns, the same on both models
        def at(turn):
            if turn == 1:
                with torch.no_grad():
                    next(m.parameters()).add_(0.5)

        return at

    plain = _play(
        LocalTransformersPolicy(reference_model, tokenizer, kv_reuse=False), turns=2, on_turn=step(reference_model)
    )
    reusing = LocalTransformersPolicy(model, tokenizer)
    kept = _play(reusing, turns=2, on_turn=step(model))
    assert [[ids for ids, _ in turn] for turn in kept] == [[ids for ids, _ in turn] for turn in plain]
    assert reusing.turns.stats.hits == 0 and reusing.turns.stats.evicted == 2


def test_the_cache_is_bounded_in_bytes():
    model, tokenizer = _models()
    policy = LocalTransformersPolicy(model, tokenizer)
    policy.turns.max_bytes = 1
    _play(policy, turns=2)
    assert policy.turns.nbytes == 0 and policy.turns.stats.hits == 0
