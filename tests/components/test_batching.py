"""Batched generation: `LocalTransformersPolicy.generate_batch` and the `BatchingPolicy` wrapper."""

from __future__ import annotations

import threading

import pytest
import torch

from components.core.policy.batching import BatchingPolicy, generation_logprobs
from components.core.policy.local import LocalTransformersPolicy
from components.core.policy.modeling import ModelConfig, TokenizerConfig
from components.tiny_model import build_policy
from components.core.policy.base import ChatMessage, GenerationConfig
from components.core.rendering.tokens import render_prompt

SHORT = [ChatMessage(role="system", content="You fix bugs."), ChatMessage(role="user", content="Fix `add`.")]
LONG = [
    ChatMessage(role="system", content="You fix bugs in a Python package with the tools you are given."),
    ChatMessage(role="user", content="Bug in `mathkit/core.py`: `add` subtracts. Fix it and run the tests."),
]
CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'


@pytest.fixture(scope="module")
def policy():
    """A tiny model trained (~2 s) to answer SHORT with a tool call (it stops early there, not on LONG)."""
    torch.manual_seed(0)
    model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[])))
    prompt = render_prompt(SHORT, tokenizer)
    ids = torch.tensor([prompt + tokenizer.encode("Read.\n" + CALL + "<|im_end|> then more", add_special_tokens=False)])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(40):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return LocalTransformersPolicy(model.eval(), tokenizer)


def test_batched_greedy_ids_equal_unbatched_per_row_and_stop_per_row(policy):
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=40)
    conversations = [SHORT, LONG, SHORT[:1] + [ChatMessage(role="user", content="Hi")]]
    single = [policy.generate(c, cfg) for c in conversations]
    batched = policy.generate_batch(conversations, cfg)
    assert [len(policy.prompt_ids(c)) for c in conversations][0] != len(policy.prompt_ids(LONG))  # padding is real
    assert [g.token_ids for g in batched] == [g.token_ids for g in single]
    assert [g.text for g in batched] == [g.text for g in single]
    # Row 0 stopped on its own end of turn while row 1 ran to its cap: per-row stop, nothing after it.
    assert batched[0].text.endswith("</tool_call>") and batched[0].finish_reason == "stop"
    assert len(batched[1].token_ids) > len(batched[0].token_ids)
    pad = policy.tokenizer.pad_token_id
    assert all(pad not in g.token_ids for g in batched)


def test_per_row_token_caps_and_a_full_context_row(policy):
    cfgs = [GenerationConfig(temperature=0.0, max_new_tokens=5), GenerationConfig(temperature=0.0, max_new_tokens=30)]
    out = policy.generate_batch([LONG, LONG], cfgs)
    assert len(out[0].token_ids) == 5 and out[0].token_ids == out[1].token_ids[:5]
    small = LocalTransformersPolicy(
        policy.model, policy.tokenizer, max_context_tokens=len(policy.prompt_ids(SHORT)) + 3
    )
    a, b = small.generate_batch([LONG, SHORT], GenerationConfig(temperature=0.0, max_new_tokens=10))
    assert a.finish_reason == "length" and a.token_ids == [] and "fills the context" in a.raw["reason"]
    assert 0 < len(b.token_ids) <= 3


def test_logprobs_match_a_forward_pass_at_the_sampling_temperature(policy):
    cfg = GenerationConfig(temperature=0.7, max_new_tokens=12, seed=5)
    out = policy.generate_batch([SHORT, LONG], cfg)
    for conv, gen in zip([SHORT, LONG], out):
        prompt = policy.prompt_ids(conv)
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
        logits[:, policy._suppress] = float("-inf")  # as sampled: a turn never opens another turn
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        got = torch.tensor(generation_logprobs(gen))
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()


def test_a_single_row_samples_exactly_as_generate(policy):
    cfg = GenerationConfig(temperature=1.3, max_new_tokens=10, seed=11)
    assert policy.generate_batch([LONG], [cfg])[0].token_ids == policy.generate(LONG, cfg).token_ids


def test_mixed_sampling_settings_in_one_call_are_refused(policy):
    with pytest.raises(ValueError, match="group rows"):
        policy.generate_batch([SHORT, LONG], [GenerationConfig(temperature=0.0), GenerationConfig(temperature=1.0)])


def test_the_wrapper_serves_concurrent_callers_in_one_batch(policy):
    greedy = GenerationConfig(temperature=0.0, max_new_tokens=20)
    conversations = [SHORT, LONG] * 3
    expected = [policy.generate(c, greedy).token_ids for c in conversations]
    barrier = threading.Barrier(len(conversations))
    results: dict[int, list[int]] = {}

    with BatchingPolicy(policy, window_seconds=0.5) as batching:
        assert batching.policy_id == policy.policy_id

        def call(i: int) -> None:
            barrier.wait()
            results[i] = batching.generate(conversations[i], greedy).token_ids

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(conversations))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert [results[i] for i in range(len(conversations))] == expected  # each caller got its own row
    assert batching.batches < len(conversations) and max(batching.batch_sizes) > 1
    assert sum(batching.batch_sizes) == len(conversations)


def test_the_wrapper_groups_rows_by_sampling_settings_and_passes_errors_to_every_caller(policy):
    class Failing:
        policy_id = "failing"

        def generate_batch(self, conversations, configs, tools=None):
            raise RuntimeError("device lost")

    with BatchingPolicy(Failing()) as batching, pytest.raises(RuntimeError, match="device lost"):
        batching.generate(SHORT, GenerationConfig())
    with BatchingPolicy(policy, window_seconds=0.5) as batching:
        barrier = threading.Barrier(2)
        cfgs = [
            GenerationConfig(temperature=0.0, max_new_tokens=4),
            GenerationConfig(temperature=1.0, max_new_tokens=4),
        ]

        def call(cfg):
            barrier.wait()
            batching.generate(SHORT, cfg)

        threads = [threading.Thread(target=call, args=(c,)) for c in cfgs]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
    assert sorted(batching.batch_sizes) == [1, 1]
    with pytest.raises(TypeError, match="generate_batch"):
        BatchingPolicy(object())


def test_evaluate_workers_share_one_batched_model_with_the_same_greedy_episodes(sandbox_service, tmp_path, monkeypatch):
    from components.core.episode.harness import HarnessConfig
    from components.core.policy.modeling import save_policy
    from components.core.data.schema import EnvironmentSpec, Task, VerifierSpec
    from components.core.data.parquet_store import TaskStore, TrajectoryStore
    from components.evaluate import EvalConfig, evaluate

    tasks = [
        Task(
            id=f"t{i}",
            recipe="swe",
            split="heldout",
            prompt=f"Task {i}: look around, then submit.",
            environment=EnvironmentSpec(files={"README.md": "x\n"}),
            verifier=VerifierSpec(kind="command", command="true"),
        )
        for i in range(3)
    ]
    TaskStore(tmp_path / "tasks").write(tasks)
    model, tokenizer = build_policy(ModelConfig(tokenizer=TokenizerConfig(corpus_recipes=[], corpus_tasks=0)))
    save_policy(model, tokenizer, tmp_path / "model")
    sizes: list[int] = []
    real = LocalTransformersPolicy.generate_batch

    def spy(self, conversations, configs, tools=None):
        sizes.append(len(conversations))
        return real(self, conversations, configs, tools)

    monkeypatch.setattr(LocalTransformersPolicy, "generate_batch", spy)
    harness = HarnessConfig(max_steps=2, generation=GenerationConfig(max_new_tokens=8))

    def run(name: str, workers: int) -> dict:
        config = EvalConfig(
            k=2, temperature=0.0, workers=workers, harness=harness, sandbox=sandbox_service.connection()
        )
        evaluate(config, tmp_path / "tasks", tmp_path / "model", tmp_path / name)
        return {
            (t.task_id, t.attempt): [s.token_ids for s in t.steps if s.role == "assistant"]
            for t in TrajectoryStore(tmp_path / name / "trajectories").read()
        }

    one = run("one", workers=1)
    assert set(sizes) == {1}  # one worker: one row per forward (plain generate)
    sizes.clear()
    batched = run("batched", workers=6)
    assert batched == one and len(one) == 6
    assert max(sizes) > 1  # the workers' turns met in one forward


def test_the_wrapper_passes_each_rows_tools_and_speaks_the_policys_tool_format(policy):
    from components.core.policy.base import ToolAwarePolicy

    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {}}},
            },
        }
    ]
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=6)
    with BatchingPolicy(policy) as batching:
        assert isinstance(batching, ToolAwarePolicy) and batching.tool_format == policy.tool_format
        got = batching.generate(SHORT, cfg, tools=tools)
    assert got.prompt_tokens == len(policy.prompt_ids(SHORT, tools)) > len(policy.prompt_ids(SHORT))
    assert got.token_ids == policy.generate(SHORT, cfg, tools=tools).token_ids


def test_batches_run_with_the_generation_threads_and_leave_the_callers_setting_alone(monkeypatch):
    import os

    class Recording:
        policy_id = "recording"

        def __init__(self):
            self.threads: list[int] = []

        def generate_batch(self, conversations, configs, tools=None):
            self.threads.append(torch.get_num_threads())
            return [None] * len(conversations)

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        # default: half the usable CPUs (at least 1, at most torch's setting); or as given
        for cpus, setting, expected in [(2, None, 1), (1, None, 1), (4, None, 2), (16, None, 3), (2, 2, 2), (2, 5, 5)]:
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
            inner = Recording()
            with BatchingPolicy(inner, generation_threads=setting) as batching:
                batching.generate(SHORT, GenerationConfig())
            assert inner.threads == [expected], (cpus, setting)
            assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="generation_threads"):
        BatchingPolicy(Recording(), generation_threads=0)
