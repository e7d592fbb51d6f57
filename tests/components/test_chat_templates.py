"""Any Hugging Face chat checkpoint as the policy: Qwen's real vocabulary with a ChatML+Hermes template
and a Llama 3 template (JSON tool calls), token-by-token masks, the history rule, ids and logprobs
as sampled (local model and an OpenAI-compatible endpoint double), and the stages end to end."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.core.rendering.tokens import (
    chat_format,
    render_prompt,
    render_trajectory,
    steps_as_messages,
    tokenizer_id,
)
from components.core.data.schema import Outcome, Step, TokenRole, ToolCall, Trajectory
from components.core.rendering.tool_formats import format_call, parse_call
from components.checkpoints import qwen_vocab_tokenizer, save_checkpoint

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {"name": "submit", "description": "Finish.", "parameters": {"type": "object", "properties": {}}},
    },
]
CALLS = [
    ToolCall(id="call-0", name="bash", arguments={"command": "cat src/módulo.py | grep -n 'def f'"}),
    ToolCall(id="call-1", name="submit", arguments={}),
]


@pytest.fixture(scope="module", params=["chatml", "llama3"])
def family_tokenizer(request):
    return request.param, qwen_vocab_tokenizer(request.param)


def _teacher_trajectory() -> Trajectory:
    """A trajectory as the scripted teacher stores it (text protocol, no ids)."""
    from components.core.rendering.protocol import format_tool_call

    steps = [
        Step(index=0, role="system", content="You fix bugs in Python repositories."),
        Step(index=1, role="user", content="`f` returns the wrong value.\n\nFix it."),
    ]
    for call, output in zip(CALLS, ["3:def f(x):\n4:    return x - 1\n", "submitted"]):
        steps.append(
            Step(
                index=len(steps),
                role="assistant",
                content=f"I check {call.name}.\n{format_tool_call(call)}",
                tool_call=call,
            )
        )
        steps.append(Step(index=len(steps), role="tool", content=output, tool_call_id=call.id, tool_name=call.name))
    return Trajectory(
        task_id="t", recipe="swe", policy_id="scripted", steps=steps, tools=TOOLS, outcome=Outcome.resolved
    )


def _template_messages(family: str) -> list[dict]:
    """The same conversation written directly in the template's message shape (the reference)."""
    out = [
        {"role": "system", "content": "You fix bugs in Python repositories."},
        {"role": "user", "content": "`f` returns the wrong value.\n\nFix it."},
    ]
    for call, output in zip(CALLS, ["3:def f(x):\n4:    return x - 1\n", "submitted"]):
        out.append(
            {
                "role": "assistant",
                "content": f"I check {call.name}.",
                "tool_calls": [
                    {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                ],
            }
        )
        out.append({"role": "tool", "content": output, "tool_call_id": call.id, "name": call.name})
    return out


def test_the_vocabulary_is_qwens(family_tokenizer):
    family, tok = family_tokenizer
    assert len(tok) > 151_643  # Qwen's 151,643 BPE ranks plus the family's specials
    text = "def f(x):\n    return x  # ünïcode ✓"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    eos = "<|im_end|>" if family == "chatml" else "<|eot_id|>"
    assert tok.eos_token == eos and chat_format(tok).stop_ids == {tok.convert_tokens_to_ids(eos)}
    assert chat_format(tok).tool_format == {"chatml": "hermes", "llama3": "llama3_json"}[family]


def test_training_ids_equal_the_rendered_conversation_and_masks_hold_token_by_token(family_tokenizer):
    family, tok = family_tokenizer
    fmt = chat_format(tok)
    sample = render_trajectory(_teacher_trajectory(), tok, loss_on="assistant")
    reference = tok.apply_chat_template(_template_messages(family), tools=TOOLS, tokenize=True)
    reference = reference["input_ids"] if hasattr(reference, "keys") else reference
    assert sample.input_ids == list(reference)  # the proof, per template
    # loss exactly on each assistant completion in the model's own format, through its end token
    expected: list[int] = []
    for call in CALLS:
        body = (
            f"I check {call.name}.\n{format_call(call, 'hermes')}"
            if family == "chatml"
            else format_call(call, "llama3_json")
        )
        expected += tok.encode(body + tok.eos_token, add_special_tokens=False)
        assert parse_call(body, fmt.tool_format, call_id=call.id) == call  # read back in the model's format
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == expected
    special = set(tok.all_special_ids)
    for t, role, loss in zip(sample.input_ids, sample.roles, sample.loss_mask):
        if role != TokenRole.assistant:
            assert loss == 0  # no system, user or tool token carries loss
        if loss and t in special:
            assert t in fmt.stop_ids  # the only special token with loss is the sampled end of turn
    assert sample.retokenized_steps == [2, 4]
    # every prompt the policy would see is a prefix of the training ids
    traj = _teacher_trajectory()
    for i in (2, 4):
        prompt = render_prompt(steps_as_messages(traj.steps[:i]), tok, tools=TOOLS)
        assert sample.input_ids[: len(prompt)] == prompt and sample.step_index[len(prompt)] == i


def test_history_rule_sampled_reasoning_stays_as_it_was_generated():
    """A template that drops <think> from earlier turns (DeepSeek-R1 / QwQ style): training keeps what was
    sampled, which is also what the policy saw when generating the next turn; text turns are refused."""
    tok = qwen_vocab_tokenizer("chatml_drop_think")
    turn = "<think>\nRead the file first.\n</think>\n\nI check bash.\n" + format_call(CALLS[0], "hermes")
    sampled = tok.encode(turn, add_special_tokens=False) + [tok.eos_token_id]
    traj = _teacher_trajectory()
    traj.steps[2] = traj.steps[2].model_copy(
        update={"content": turn, "token_ids": sampled, "tokenizer_id": tokenizer_id(tok)}
    )
    sample = render_trajectory(traj, tok, loss_on="assistant")
    step2 = [t for t, i, m in zip(sample.input_ids, sample.step_index, sample.loss_mask) if i == 2 and m]
    assert step2 == sampled  # reasoning tokens kept, verbatim
    prompt = render_prompt(steps_as_messages(traj.steps[:4]), tok, tools=TOOLS)
    assert sample.input_ids[: len(prompt)] == prompt  # = the prompt the policy generated turn 2 from
    # the template itself would have re-rendered turn 1 without its reasoning
    plain = [{"role": s.role, "content": s.content} for s in traj.steps[:4]]
    assert "Read the file first." not in tok.apply_chat_template(
        plain + [{"role": "user", "content": "x"}], tools=TOOLS, tokenize=False
    )
    assert "Read the file first." in tok.decode(prompt)
    # the same reasoning as text without ids: the history view trains it as it was when newest, and the
    # next prompt keeps it (never silently rewritten between sampling and training)
    text_only = traj.model_copy(deep=True)
    text_only.steps[2].token_ids = None
    text_only.steps[2].tool_call = None
    sample = render_trajectory(text_only, tok, loss_on="assistant")
    trained = [t for t, i, m in zip(sample.input_ids, sample.step_index, sample.loss_mask) if i == 2 and m]
    assert tok.decode(trained) == turn + "<|im_end|>" and sample.retokenized_steps[0] == 2
    prompt = render_prompt(steps_as_messages(text_only.steps[:4]), tok, tools=TOOLS)
    assert sample.input_ids[: len(prompt)] == prompt and "Read the file first." in tok.decode(prompt)


def test_qwen3_template_trains_every_turn_as_it_was_when_newest():
    """Qwen3's own template drops the empty <think> block of an earlier assistant turn once a tool message
    follows (once refused with TemplateError at SFT). The history view trains each turn as the template
    rendered it while newest, and every prompt the policy generates from is a prefix of the training ids."""
    tok = qwen_vocab_tokenizer("qwen3")
    assert chat_format(tok).tool_format == "hermes"
    traj = _teacher_trajectory()  # text-only teacher turns
    sample = render_trajectory(traj, tok, loss_on="assistant")
    messages = steps_as_messages(traj.steps)
    first = render_prompt(messages[:2], tok, tools=TOOLS)
    reference = tok.apply_chat_template(
        _template_messages("qwen3")[:2], tools=TOOLS, tokenize=True, add_generation_prompt=True
    )
    assert first == list(reference["input_ids"] if hasattr(reference, "keys") else reference)
    for k, call in zip((2, 4), CALLS):
        prompt = render_prompt(messages[:k], tok, tools=TOOLS)
        assert sample.input_ids[: len(prompt)] == prompt  # the context the turn is sampled in = trained on
        trained = [t for t, i, m in zip(sample.input_ids, sample.step_index, sample.loss_mask) if i == k and m]
        assert tok.decode(trained) == (
            f"<think>\n\n</think>\n\nI check {call.name}.\n{format_call(call, 'hermes')}<|im_end|>"
        )
        assert sample.input_ids[len(prompt) : len(prompt) + len(trained)] == trained
    assert sample.retokenized_steps == [2, 4]

    # a sampled turn with reasoning stays verbatim, and the next prompt shows it as it was generated
    turn = "<think>\nRead the file first.\n</think>\n\nI check bash.\n" + format_call(CALLS[0], "hermes")
    sampled = tok.encode(turn, add_special_tokens=False) + [tok.eos_token_id]
    traj.steps[2] = traj.steps[2].model_copy(
        update={"content": turn, "token_ids": sampled, "tokenizer_id": tokenizer_id(tok)}
    )
    sample = render_trajectory(traj, tok, loss_on="assistant")
    assert [t for t, i, m in zip(sample.input_ids, sample.step_index, sample.loss_mask) if i == 2 and m] == sampled
    prompt = render_prompt(steps_as_messages(traj.steps[:4]), tok, tools=TOOLS)
    assert sample.input_ids[: len(prompt)] == prompt and "Read the file first." in tok.decode(prompt)


# -------------------------------------------------------------------------------------------------
# An OpenAI-compatible endpoint double that answers like vLLM with logprobs and token ids
# -------------------------------------------------------------------------------------------------
class _VLLMDouble:
    """Loopback chat-completions server: submits, with vLLM's `token_ids` and `token_id:<n>` logprobs."""

    def __init__(self, tokenizer, id_style: str):
        self.bodies: list[dict] = []
        outer = self
        content = format_call(ToolCall(name="submit"), "hermes")
        self.ids = tokenizer.encode(content, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.logprobs = [-0.5 - 0.01 * k for k in range(len(self.ids))]

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                entries = [
                    {
                        "token": f"token_id:{i}" if id_style == "token_strings" else tokenizer.decode([i]),
                        "logprob": lp,
                        "top_logprobs": [],
                    }
                    for i, lp in zip(outer.ids, outer.logprobs)
                ]
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "logprobs": {"content": entries},
                    "finish_reason": "stop",
                }
                if id_style == "token_ids":
                    choice["token_ids"] = outer.ids
                body = json.dumps(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "choices": [choice],
                        "usage": {"prompt_tokens": 9, "completion_tokens": len(outer.ids)},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize("id_style", ["token_ids", "token_strings"])
def test_endpoint_ids_and_logprobs_are_stored_and_trained_verbatim(id_style, sandbox_service, tmp_path):
    from components.core.episode.harness import HarnessConfig
    from components.core.policy.policies import OpenAIPolicyConfig
    from components.core.data.parquet_store import TaskStore, TrajectoryStore
    from components.distill import DistillConfig, distill
    from components.recipes.swe.generator import generate_tasks

    checkpoint = save_checkpoint(tmp_path / "served", "chatml")
    tok = qwen_vocab_tokenizer("chatml")
    TaskStore(tmp_path / "tasks").write(generate_tasks("train", 1, 0))
    double = _VLLMDouble(tok, id_style)
    try:
        endpoint = OpenAIPolicyConfig(
            base_url=double.url,
            model="served",
            api_key_env=None,
            sampled_tokens=True,
            tokenizer_path=str(checkpoint),
            max_retries=0,
        )
        distill(
            DistillConfig(
                teacher="openai",
                openai=endpoint,
                sandbox=sandbox_service.connection(),
                progress=False,
                harness=HarnessConfig(max_steps=2),
            ),
            tmp_path / "tasks",
            tmp_path / "t",
        )
    finally:
        double.server.shutdown()
    assert double.bodies[0]["logprobs"] is True and double.bodies[0]["return_token_ids"] is True
    (traj,) = TrajectoryStore(tmp_path / "t").read()
    step = next(s for s in traj.steps if s.role == "assistant")
    assert step.token_ids == double.ids and step.logprobs == pytest.approx(double.logprobs)
    assert step.tokenizer_id == tokenizer_id(tok) and step.tool_call.name == "submit"
    sample = render_trajectory(traj, tok, loss_on="assistant")
    assert sample.retokenized_steps == []
    assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == double.ids


# -------------------------------------------------------------------------------------------------
# The stages on an outside checkpoint: init-policy -> distill -> SFT -> RL -> evaluate
# -------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("family", ["chatml", "llama3", "qwen3"])
def test_stages_end_to_end_on_a_user_checkpoint(family, sandbox_service, tmp_path):
    from components.core.episode.harness import HarnessConfig
    from components.core.policy.modeling import PolicySpec, load_tokenizer
    from components.tiny_model import init_policy
    from components.core.policy.base import GenerationConfig
    from components.core.data.schema import EnvironmentSpec, Task, VerifierSpec
    from components.core.data.parquet_store import TaskStore, TrajectoryStore
    from components.distill import DistillConfig, distill
    from components.evaluate import EvalConfig, evaluate
    from components.recipes.swe.generator import generate_tasks
    from components.rl.stage import RLConfig, train_rl
    from components.rl.sampling import RolloutConfig
    from components.sft.stage import SFTConfig, train_sft
    from components.sft.data import build_samples

    conn = sandbox_service.connection()
    user_dir = save_checkpoint(tmp_path / "user-model", family)
    base = init_policy(PolicySpec(path=str(user_dir)), None, tmp_path / "base")
    tok = load_tokenizer(base)
    fmt = chat_format(tok)
    coin = Task(
        id="coin",
        recipe="swe",
        split="train",
        prompt="Flip the coin, then submit.",
        environment=EnvironmentSpec(files={"README.md": "a coin\n"}),
        verifier=VerifierSpec(kind="command", command="python3 -c 'import os, sys; sys.exit(os.urandom(1)[0] % 2)'"),
    )
    TaskStore(tmp_path / "tasks").write(generate_tasks("train", 2, 0) + generate_tasks("heldout", 1, 0))
    distill(
        DistillConfig(error_rate=0.0, sandbox=conn, progress=False, harness=HarnessConfig(max_steps=12)),
        tmp_path / "tasks",
        tmp_path / "teacher",
    )
    teacher = TrajectoryStore(tmp_path / "teacher").read()
    assert any(t.resolved for t in teacher)

    # SFT data: teacher turns re-expressed in the checkpoint's own format, masks token by token
    samples, _ = build_samples(teacher, tok, "whole", 8192)
    for sample, traj in zip(samples, [t for t in teacher if t.outcome is not Outcome.infra_error]):
        assert sample.input_ids == render_trajectory(traj, tok, loss_on="assistant").input_ids
        by_step: dict[int, list[int]] = {}
        for t, i, m in zip(sample.input_ids, sample.step_index, sample.loss_mask):
            if m:
                by_step.setdefault(i, []).append(t)
        for i, ids in by_step.items():
            step = traj.steps[i]
            assert step.role == "assistant" and ids[-1] in fmt.stop_ids
            assert parse_call(tok.decode(ids[:-1]), fmt.tool_format).name == step.tool_call.name
        assert not any(m for m, r in zip(sample.loss_mask, sample.roles) if r != TokenRole.assistant)
    train_sft(
        SFTConfig(mode="whole", steps=2, batch_size=2, max_len=4096, learning_rate=1e-3, warmup_steps=0, num_threads=1),
        tmp_path / "teacher",
        tmp_path / "sft",
        base_model_dir=base,
    )

    TaskStore(tmp_path / "rl-tasks").write([coin])
    rl = train_rl(
        RLConfig(
            rollout=RolloutConfig(
                group_size=2,
                max_rollouts_per_prompt=6,
                stride=2,
                rho_min=0.5,
                rho_max=0.5,
                batch_prompts=1,
                max_prompts_per_batch=6,
            ),
            steps=1,
            save_rollouts=True,
            sandbox=conn,
            num_threads=1,
            seed=1,
            harness=HarnessConfig(max_steps=1, generation=GenerationConfig(max_new_tokens=6)),
        ),
        tmp_path / "rl-tasks",
        tmp_path / "sft",
        tmp_path / "rl",
    )
    assert rl.steps_done == 1
    rollouts = [t for t in TrajectoryStore(tmp_path / "rl" / "rollouts").read() if t.outcome is not Outcome.infra_error]
    assert rollouts and all(t.metadata["tool_format"] == fmt.tool_format for t in rollouts)
    for traj in rollouts:  # sampled ids round-trip into the training sequence, verbatim
        step = next(s for s in traj.steps if s.role == "assistant")
        assert step.tokenizer_id == fmt.tokenizer_id and len(step.logprobs) == len(step.token_ids) > 0
        sample = render_trajectory(traj, tok, loss_on="assistant")
        assert sample.retokenized_steps == []
        assert [t for t, m in zip(sample.input_ids, sample.loss_mask) if m] == step.token_ids
        assert "# Tools" in tok.decode(sample.input_ids) or "You have access to the following functions" in tok.decode(
            sample.input_ids
        )  # tools offered through the template, natively

    result = evaluate(
        EvalConfig(
            k=1, sandbox=conn, harness=HarnessConfig(max_steps=1, generation=GenerationConfig(max_new_tokens=6))
        ),
        tmp_path / "tasks",
        tmp_path / "rl",
        tmp_path / "eval",
    )
    assert result.valid_attempts == 1 and result.infra_errors == 0
