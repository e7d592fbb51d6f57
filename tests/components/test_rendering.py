"""Token-level rendering with the tokenizer's chat template: a role, a step and a loss flag per token,
checked token by token on the tiny model's ChatML template (the same code path as any checkpoint)."""

from __future__ import annotations

import pytest

from components.core.policy.modeling import END, TokenizerConfig
from components.tiny_model import build_tokenizer
from components.core.rendering.tokens import (
    TemplateError,
    chat_format,
    render_prompt,
    render_trajectory,
    steps_as_messages,
    tokenizer_id,
)
from components.core.data.schema import Outcome, Step, TokenRole, ToolCall, Trajectory

CALL = ToolCall(name="bash", arguments={"command": "cat mathkit/core.py"})
PROTOCOL = '<tool_call>{"name": "bash", "arguments": {"command": "cat mathkit/core.py"}}</tool_call>'
NATIVE = '<tool_call>\n{"name": "bash", "arguments": {"command": "cat mathkit/core.py"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(TokenizerConfig(corpus_recipes=[]))


def _trajectory(credited: list[bool | None], outcome=Outcome.unresolved) -> Trajectory:
    steps = [
        Step(index=0, role="system", content="You fix bugs. Use tools."),
        Step(index=1, role="user", content="Bug in `mathkit/core.py`: fix `add`."),
    ]
    for k, flag in enumerate(credited):
        call = CALL.model_copy(update={"id": f"call-{k}"})
        steps.append(
            Step(index=len(steps), role="assistant", content=f"Step {k}.\n{PROTOCOL}", tool_call=call, credited=flag)
        )
        steps.append(
            Step(
                index=len(steps),
                role="tool",
                content=f"def add(a, b):\n    return a - b  # {k}\n",
                tool_call_id=call.id,
                tool_name="bash",
            )
        )
    return Trajectory(task_id="t1", recipe="swe", policy_id="teacher", steps=steps, tools=TOOLS, outcome=outcome)


def _enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_every_token_has_role_step_and_loss_only_on_credited_assistant_completions(tokenizer):
    traj = _trajectory([False, True, None])
    sample = render_trajectory(traj, tokenizer, loss_on="credited")
    n = len(sample.input_ids)
    assert len(sample.roles) == len(sample.loss_mask) == len(sample.step_index) == n
    by_index = {s.index: s for s in traj.steps}
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    for tok, role, loss, idx in zip(sample.input_ids, sample.roles, sample.loss_mask, sample.step_index):
        assert role == TokenRole[by_index[idx].role]
        if loss:
            assert by_index[idx].role == "assistant" and by_index[idx].credited is True and tok != im_start
    # the credited step's completion, re-expressed in the model's native (Hermes) format, up to <|im_end|>
    expected = _enc(tokenizer, f"Step 1.\n{NATIVE}{END}")
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == expected
    assert not any(m for m, r in zip(sample.loss_mask, sample.roles) if r != TokenRole.assistant)
    assert sample.retokenized_steps == [4]  # teacher text, no sampled ids: re-tokenized and said so
    # the whole sequence is the chat template's rendering of the conversation, tools and all
    text = tokenizer.decode(sample.input_ids)
    assert text.startswith("<|im_start|>system\nYou fix bugs. Use tools.\n\n# Tools") and '"name": "bash"' in text
    assert "<|im_start|>user\n<tool_response>\ndef add" in text


def test_resolved_trajectory_trains_on_every_completion_token_and_no_header_or_glue(tokenizer):
    traj = _trajectory([None, None], outcome=Outcome.resolved)
    sample = render_trajectory(traj, tokenizer, loss_on="assistant")
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask) if m]
    assert trained == _enc(tokenizer, f"Step 0.\n{NATIVE}{END}") + _enc(tokenizer, f"Step 1.\n{NATIVE}{END}")
    newline = _enc(tokenizer, "\n")
    for i, (tok, loss) in enumerate(zip(sample.input_ids, sample.loss_mask)):
        if loss and tok == tokenizer.eos_token_id:
            assert sample.loss_mask[i + 1] == 0 and [sample.input_ids[i + 1]] == newline  # glue: no loss
    assert sum(render_trajectory(traj, tokenizer, loss_on="none").loss_mask) == 0


def test_sampled_token_ids_are_used_verbatim(tokenizer):
    traj = _trajectory([True])
    text = f"Step 0.\n{NATIVE}"
    canonical = _enc(tokenizer, text)
    # A valid but non-canonical tokenization: byte-level pieces one character at a time.
    pieces = [
        tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(_enc(tokenizer, c))[0]) for c in "Step 0."
    ]
    sampled = pieces + _enc(tokenizer, text[len("Step 0.") :]) + [tokenizer.eos_token_id]
    assert sampled[:-1] != canonical and tokenizer.decode(sampled[:-1]) == text
    traj.steps[2] = traj.steps[2].model_copy(
        update={"content": text, "token_ids": sampled, "tokenizer_id": tokenizer_id(tokenizer)}
    )
    sample = render_trajectory(traj, tokenizer, loss_on="credited")
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == sampled
    assert sample.retokenized_steps == []
    # the template's own <|im_end|> is not repeated after the sampled one; its newline is context
    end = sample.input_ids.index(tokenizer.eos_token_id, sample.step_index.index(2))
    assert sample.input_ids[end + 1 : end + 2] == _enc(tokenizer, "\n") and sample.loss_mask[end + 1] == 0
    # the policy's prompt for the next turn is the same prefix
    prefix = render_prompt(steps_as_messages(traj.steps[:4]), tokenizer, tools=TOOLS, add_generation_prompt=False)
    assert prefix == sample.input_ids[: len(prefix)]
    # ids of another tokenizer (or of none recorded, as v1 stores) are never trusted: re-tokenized, flagged
    other = traj.model_copy(deep=True)
    other.steps[2].tokenizer_id = "tok-another"
    resample = render_trajectory(other, tokenizer, loss_on="credited")
    assert resample.retokenized_steps == [2]
    assert [t for t, m in zip(resample.input_ids, resample.loss_mask) if m] == canonical + [tokenizer.eos_token_id]


def test_a_sampled_turn_cut_short_gets_the_end_token_as_context(tokenizer):
    traj = _trajectory([True])
    sampled = _enc(tokenizer, "Step 0. I was cut")
    traj.steps[2] = traj.steps[2].model_copy(
        update={
            "content": "Step 0. I was cut",
            "tool_call": None,
            "token_ids": sampled,
            "tokenizer_id": tokenizer_id(tokenizer),
        }
    )
    sample = render_trajectory(traj, tokenizer, loss_on="credited")
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == sampled
    after = sample.input_ids.index(sampled[-1], sample.step_index.index(2)) + 1
    assert sample.input_ids[after] == tokenizer.eos_token_id and sample.loss_mask[after] == 0


def test_prompt_is_a_prefix_of_the_training_sample(tokenizer):
    traj = _trajectory([True, True, True])
    sample = render_trajectory(traj, tokenizer)
    for pos, step in enumerate(traj.steps):
        if step.role != "assistant":
            continue
        prompt = render_prompt(steps_as_messages(traj.steps[:pos]), tokenizer, tools=TOOLS)
        assert sample.input_ids[: len(prompt)] == prompt
        assert sample.step_index[len(prompt) - 1] == step.index  # the assistant header opens this step


def test_protocol_format_keeps_the_text_protocol_in_the_system_prompt(tokenizer):
    from components.core.rendering.protocol import tools_prompt

    traj = _trajectory([True])
    sample = render_trajectory(traj, tokenizer, loss_on="credited", tool_format="protocol")
    text = tokenizer.decode(sample.input_ids)
    assert tools_prompt(TOOLS) in text and "# Tools" not in text  # no native tool block
    assert tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m]) == f"Step 0.\n{PROTOCOL}{END}"
    # and a trajectory collected with the protocol renders natively without the protocol description
    traj.steps[0].content += f"\n\n{tools_prompt(TOOLS)}"
    assert tools_prompt(TOOLS) not in tokenizer.decode(render_trajectory(traj, tokenizer).input_ids)


def test_tokenizer_without_a_chat_template_is_refused():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel()
    plain = PreTrainedTokenizerFast(tokenizer_object=raw)
    with pytest.raises(TemplateError, match="no chat_template"):
        render_trajectory(_trajectory([True]), plain)
    with pytest.raises(TemplateError):
        chat_format(plain)


def test_a_v1_store_shard_with_sampled_ids_still_loads_and_is_re_tokenized(tokenizer, tmp_path):
    """Trajectories written before schema v2 (no tokenizer_id) load; their ids, of an unknown vocabulary
    (the old `<|role|>` tiny tokenizer), are not trusted: re-tokenized and flagged."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from components.core.data.schema import SCHEMA_VERSION
    from components.core.data.parquet_store import TrajectoryStore, trajectory_to_row

    row = trajectory_to_row(_trajectory([True], outcome=Outcome.resolved))
    steps = json.loads(row["steps"])
    for s in steps:
        s.pop("logprobs", None), s.pop("tokenizer_id", None)
    steps[2]["token_ids"] = [5, 6, 7]
    pq.write_table(
        pa.Table.from_pylist([{**row, "schema_version": 1, "steps": json.dumps(steps)}]),
        tmp_path / "part-00000000000000000001-v1.parquet",
    )
    (old,) = TrajectoryStore(tmp_path).read()
    assert old.schema_version == SCHEMA_VERSION and old.steps[2].token_ids == [5, 6, 7]
    assert old.steps[2].tokenizer_id is None
    sample = render_trajectory(old, tokenizer, loss_on="assistant")
    assert sample.retokenized_steps == [2]
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == _enc(tokenizer, f"Step 0.\n{NATIVE}{END}")


def test_the_prefix_cache_gives_the_same_prompts_as_a_fresh_render(tokenizer):
    from components.core.rendering.tokens import PrefixCache

    traj = _trajectory([True, True, True])
    messages = steps_as_messages(traj.steps)
    cache = PrefixCache()
    for pos in range(2, len(messages) + 1, 2):  # an episode's turns, then a conversation that diverges
        assert render_prompt(messages[:pos], tokenizer, tools=TOOLS, cache=cache) == render_prompt(
            messages[:pos], tokenizer, tools=TOOLS
        )
    assert [len(e.keys) for e in cache.entries] == [len(messages)]  # one conversation, one entry as it grew
    changed = [m.model_copy() for m in messages]
    changed[3] = changed[3].model_copy(update={"content": "another output"})
    assert render_prompt(changed, tokenizer, tools=TOOLS, cache=cache) == render_prompt(changed, tokenizer, tools=TOOLS)
    assert render_prompt(messages[:4], tokenizer, cache=cache) == render_prompt(messages[:4], tokenizer)  # no tools


def test_the_prefix_cache_keeps_interleaved_conversations_apart(tokenizer, monkeypatch):
    """A batched wave renders its episodes' turns in turn: each episode renders only its new messages."""
    from components.core.rendering.tokens import PrefixCache

    episodes = []
    for k in range(3):
        messages = steps_as_messages(_trajectory([True, True]).steps)
        messages[1] = messages[1].model_copy(update={"content": f"Bug {k} in `mathkit/core.py`."})
        episodes.append(messages)
    cache = PrefixCache()
    rendered_messages = []
    real = type(tokenizer).apply_chat_template

    def counting(self, conversation, *args, **kwargs):
        rendered_messages.append(len(conversation))
        return real(self, conversation, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "apply_chat_template", counting)
    for pos in range(2, len(episodes[0]) + 1, 2):  # turn by turn, every episode in each turn
        for messages in episodes:
            rendered_messages.clear()
            got = render_prompt(messages[:pos], tokenizer, tools=TOOLS, cache=cache)
            monkeypatch.setattr(type(tokenizer), "apply_chat_template", real)
            assert got == render_prompt(messages[:pos], tokenizer, tools=TOOLS)
            monkeypatch.setattr(type(tokenizer), "apply_chat_template", counting)
            if pos > 2:  # the two messages appended since the last turn (+ their headers), not the history
                assert len(rendered_messages) <= 4, rendered_messages
    assert sorted(len(e.keys) for e in cache.entries) == [len(episodes[0])] * 3
    monkeypatch.setattr(type(tokenizer), "apply_chat_template", real)
    small = PrefixCache(size=2)  # bounded: the least recently used conversation goes
    for messages in episodes:
        render_prompt(messages, tokenizer, tools=TOOLS, cache=small)
    assert [e.keys[1] for e in small.entries] == [cache.entries[1].keys[1], cache.entries[2].keys[1]]
