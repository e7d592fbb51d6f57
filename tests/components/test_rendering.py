"""Token-level rendering: a role, a step and a loss flag per token, checked token by token."""

from __future__ import annotations

import pytest

from components.core.modeling import END, ROLE_TOKENS, TokenizerConfig, build_tokenizer
from components.core.policy_base import ChatMessage
from components.core.rendering import render_prompt, render_trajectory, steps_as_messages
from components.core.schema import Outcome, Step, TokenRole, Trajectory

CALL = '<tool_call>{"name": "bash", "arguments": {"command": "cat mathkit/core.py"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(TokenizerConfig(corpus_recipes=[]))


def _trajectory(credited: list[bool | None], outcome=Outcome.unresolved) -> Trajectory:
    steps = [Step(index=0, role="system", content="You fix bugs. Use tools."),
             Step(index=1, role="user", content="Bug in `mathkit/core.py`: fix `add`.")]
    for k, flag in enumerate(credited):
        steps.append(Step(index=len(steps), role="assistant", content=f"Step {k}.\n{CALL}", credited=flag))
        steps.append(Step(index=len(steps), role="tool", content=f"def add(a, b):\n    return a - b  # {k}\n"))
    return Trajectory(task_id="t1", recipe="swe", policy_id="teacher", steps=steps, outcome=outcome)


def test_every_token_has_role_step_and_loss_only_on_credited_assistant_content(tokenizer):
    traj = _trajectory([False, True, None])
    sample = render_trajectory(traj, tokenizer, loss_on="credited")
    n = len(sample.input_ids)
    assert len(sample.roles) == len(sample.loss_mask) == len(sample.step_index) == n
    header_ids = {tokenizer.convert_tokens_to_ids(t) for t in ROLE_TOKENS.values()}
    end_id = tokenizer.convert_tokens_to_ids(END)
    by_index = {s.index: s for s in traj.steps}
    for tok, role, loss, idx in zip(sample.input_ids, sample.roles, sample.loss_mask, sample.step_index):
        step = by_index[idx]
        assert role == TokenRole[step.role]
        if loss:
            assert step.role == "assistant" and step.credited is True
            assert tok not in header_ids
    # the credited step's content and its closing <|end|> carry loss, exactly
    credited_step = traj.steps[4]
    expected = tokenizer.encode(credited_step.content, add_special_tokens=False) + [end_id]
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == expected
    # no loss on tool, system or user tokens
    assert not any(m for m, r in zip(sample.loss_mask, sample.roles) if r != TokenRole.assistant)
    # the ids are the decoded conversation
    assert tokenizer.decode(sample.input_ids).startswith("<|system|>You fix bugs.")


def test_resolved_trajectory_trains_on_every_assistant_token(tokenizer):
    traj = _trajectory([None, None], outcome=Outcome.resolved)
    sample = render_trajectory(traj, tokenizer, loss_on="assistant")
    header = tokenizer.convert_tokens_to_ids(ROLE_TOKENS["assistant"])
    for tok, role, loss in zip(sample.input_ids, sample.roles, sample.loss_mask):
        if role == TokenRole.assistant and tok != header:
            assert loss == 1
        else:
            assert loss == 0
    assert sum(render_trajectory(traj, tokenizer, loss_on="none").loss_mask) == 0


def test_sampled_token_ids_are_used_verbatim(tokenizer):
    traj = _trajectory([True])
    text = traj.steps[2].content
    canonical = tokenizer.encode(text, add_special_tokens=False)
    # A valid but non-canonical tokenization: byte-level pieces one character at a time.
    pieces = [tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(tokenizer.encode(c, add_special_tokens=False))[0])
              for c in "Step 0."]
    rest = tokenizer.encode(text[len("Step 0."):], add_special_tokens=False)
    sampled = pieces + rest
    assert sampled != canonical and tokenizer.decode(sampled) == text
    traj.steps[2].token_ids = sampled
    sample = render_trajectory(traj, tokenizer, loss_on="credited")
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask) if m]
    assert trained == sampled  # exactly as sampled; the appended <|end|> was not sampled, so no loss on it
    end_id = tokenizer.convert_tokens_to_ids(END)
    start = sample.step_index.index(2)
    assert sample.input_ids[start + 1 + len(sampled)] == end_id
    # and the policy's prompt for the next turn is the same prefix when it knows its sampled ids
    prefix = render_prompt(steps_as_messages(traj.steps[:4]), tokenizer, sampled_ids={text: sampled},
                           add_generation_prompt=False)
    assert prefix == sample.input_ids[: len(prefix)]


def test_prompt_is_a_prefix_of_the_training_sample(tokenizer):
    traj = _trajectory([True, True, True])
    sample = render_trajectory(traj, tokenizer)
    for pos, step in enumerate(traj.steps):
        if step.role != "assistant":
            continue
        prompt = render_prompt([ChatMessage(role=s.role, content=s.content) for s in traj.steps[:pos]], tokenizer)
        assert sample.input_ids[: len(prompt)] == prompt
        assert sample.step_index[len(prompt) - 1] == step.index  # the assistant header opens this step


def test_tokenizer_without_chat_specials_is_refused():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel()
    plain = PreTrainedTokenizerFast(tokenizer_object=raw)
    with pytest.raises(ValueError, match="lacks the chat special tokens"):
        render_trajectory(_trajectory([True]), plain)
