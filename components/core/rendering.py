"""Token-level rendering of episodes: the one place that decides which token the model sees and which
token carries loss.

Format (see `modeling`): `<|role|>content<|end|>` per message, `<|assistant|>` opens a generation.
Every token is tagged with the role of its message and the index of its Step. Loss goes only on the
*content* of assistant steps chosen by `loss_on` (and their closing `<|end|>`); role headers, system,
user and tool text never carry loss.

Assistant steps that carry `Step.token_ids` (sampled by a local policy) are used verbatim: decoding and
re-encoding can produce a different, equally valid tokenization, and training RL on ids the policy did
not sample corrupts the importance of every token. `render_prompt` uses the same pieces, so the prompt
a policy generates from is exactly the prefix of the training sample.
"""

from __future__ import annotations

from typing import Iterable, Literal, Mapping

from components.core.modeling import END, ROLE_TOKENS
from components.core.policy_base import ChatMessage
from components.core.schema import Step, TokenizedSample, TokenRole, Trajectory

LossOn = Literal["assistant", "credited", "none"]


class _Ids:
    """Special-token ids of a tokenizer, looked up once."""

    def __init__(self, tokenizer) -> None:
        vocab = tokenizer.get_vocab()
        missing = [t for t in [END, *ROLE_TOKENS.values()] if t not in vocab]
        if missing:
            raise ValueError(
                f"tokenizer lacks the chat special tokens {missing}; build it with "
                "components.core.modeling.build_tokenizer (or add these tokens to yours)"
            )
        self.end = vocab[END]
        self.role = {role: vocab[tok] for role, tok in ROLE_TOKENS.items()}


def encode_text(text: str, tokenizer) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_prompt(
    messages: Iterable[ChatMessage | Mapping],
    tokenizer,
    sampled_ids: Mapping[str, list[int]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Prompt ids for a conversation; `sampled_ids` maps an assistant text to the ids it was sampled as."""
    ids = _Ids(tokenizer)
    out: list[int] = []
    for message in messages:
        role = message.role if isinstance(message, ChatMessage) else message["role"]
        content = message.content if isinstance(message, ChatMessage) else message["content"]
        out.append(ids.role[role])
        known = sampled_ids.get(content) if (sampled_ids and role == "assistant") else None
        if known is not None:
            out.extend(known)
            if not known or known[-1] != ids.end:
                out.append(ids.end)
        else:
            out.extend(encode_text(content, tokenizer))
            out.append(ids.end)
    if add_generation_prompt:
        out.append(ids.role["assistant"])
    return out


def step_has_loss(step: Step, trajectory: Trajectory, loss_on: LossOn) -> bool:
    if step.role != "assistant" or loss_on == "none":
        return False
    if loss_on == "assistant":
        return True
    return step.credited is True


def render_trajectory(trajectory: Trajectory, tokenizer, loss_on: LossOn = "credited") -> TokenizedSample:
    """The episode as one token sequence with a role, a step index and a loss flag per token.

    loss_on: "assistant" = every assistant step (resolved trajectories, whole-trajectory SFT, RL);
    "credited" = only assistant steps with `Step.credited` True; "none" = context only.
    """
    ids = _Ids(tokenizer)
    input_ids: list[int] = []
    roles: list[int] = []
    mask: list[int] = []
    step_index: list[int] = []

    def put(tokens: list[int], role: TokenRole, index: int, loss: bool) -> None:
        input_ids.extend(tokens)
        roles.extend([int(role)] * len(tokens))
        mask.extend([int(loss)] * len(tokens))
        step_index.extend([index] * len(tokens))

    for step in trajectory.steps:
        role = TokenRole[step.role]
        loss = step_has_loss(step, trajectory, loss_on)
        put([ids.role[step.role]], role, step.index, False)
        if step.role == "assistant" and step.token_ids is not None:
            put(list(step.token_ids), role, step.index, loss)
            if not step.token_ids or step.token_ids[-1] != ids.end:
                # The policy stopped on </tool_call> and never sampled <|end|>: context, not a target.
                put([ids.end], role, step.index, False)
        else:
            put(encode_text(step.content, tokenizer), role, step.index, loss)
            put([ids.end], role, step.index, loss)
    return TokenizedSample(
        trajectory_id=trajectory.id,
        input_ids=input_ids,
        roles=roles,
        loss_mask=mask,
        step_index=step_index,
    )


def steps_as_messages(steps: Iterable[Step]) -> list[ChatMessage]:
    """Steps as chat messages in the same order `render_trajectory` renders them."""
    return [ChatMessage(role=s.role, content=s.content, tool_call_id=s.tool_call_id) for s in steps]
