"""Token-level rendering of episodes with the model's own chat template: the one place that decides
which token the model sees and which token carries loss.

A conversation is rendered by `tokenizer.apply_chat_template(messages, tools=...)` incrementally:
message i's segment is what the template adds when message i is appended, i.e.
`render(messages[:i+1])[len(render(messages[:i])):]`. An assistant segment splits into the generation
header (`render(messages[:i], add_generation_prompt=True)` minus `render(messages[:i])`), which is
context, and the completion, whose tokens up to and including the first end-of-turn token carry loss
(what follows it, e.g. ChatML's newline after `<|im_end|>`, is template glue the model never samples).
Every token is tagged with the role and the Step index of its message. System, user and tool
segments never carry loss.

Sampled turns are used verbatim. An assistant turn whose `token_ids` belong to this tokenizer
(`tokenizer_id` matches) is rendered as header + those ids + the template's glue after the end token:
decoding and re-encoding can give another, equally valid tokenization, and RL on ids the policy did not
sample corrupts every ratio. Turns without such ids are rendered from their text and reported in
`TokenizedSample.retokenized_steps`.

The history rule (templates that re-render earlier turns). Rendering is append-only: a segment never
changes once a later message is appended. Most templates are append-only as they are. For those that
rewrite history (Qwen3 renders the newest assistant turn with a `<think>` block, an empty one if it has
no reasoning, and drops it once any message follows; DeepSeek-R1 and QwQ drop earlier reasoning), the
history view `_render_frozen` takes over: each assistant turn is frozen as the tokens it had when it
was the newest message (sampled ids verbatim, whatever the template would put before them; a text turn,
e.g. a teacher's, as the template renders it while it is last, so Qwen3's empty `<think>` block is part
of what the policy learns to write) and later renders see it as a placeholder, so nothing emitted
changes. `render_prompt` is the same function, so the ids the local policy generates from are the ids
training sees. A template is switched to the history view the first time it fails append-only, and the
switch is remembered; the view renders without the prefix cache (one template render per message).
`TemplateError` remains for templates even the view cannot hold (a frozen turn's surroundings change).

Per-template proof (tests/components/test_chat_templates.py): for conversations without sampled ids,
the ids equal `apply_chat_template(..., tokenize=True)` of the whole conversation.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping

from components.core.policy.base import ChatMessage
from components.core.rendering.protocol import tools_prompt
from components.core.data.schema import Step, TokenizedSample, TokenRole, Trajectory
from components.core.rendering.tool_formats import (
    NATIVE_FORMATS,
    ToolFormat,
    detect_tool_format,
    parse_call,
    thought_of,
)

LossOn = Literal["assistant", "credited", "none"]

_PLACEHOLDER = "\ue000{}\ue001"  # private-use characters: never in real text, kept verbatim by templates
_PROBE = "def f(x):\n    return x  # ünïcode 123\n"


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be rendered append-only (or has none)."""


@dataclass(frozen=True)
class ChatFormat:
    """What rendering needs to know about a tokenizer, derived once from it."""

    tokenizer_id: str
    tool_format: ToolFormat
    stop_ids: frozenset[int]


_FORMATS: dict[tuple[int, str], tuple[Any, ChatFormat]] = {}
_LOCK = threading.Lock()


def chat_format(tokenizer, tool_format: ToolFormat | None = None) -> ChatFormat:
    """The tokenizer's fingerprint, tool-call format (from its template unless given) and end-of-turn ids."""
    template = tokenizer.chat_template
    if not template:
        raise TemplateError(
            "the tokenizer has no chat_template; set one (tokenizer.chat_template = ...) "
            "and save it with save_pretrained"
        )
    key = (id(tokenizer), template)
    with _LOCK:
        cached = _FORMATS.get(key)
    if cached is None:
        digest = hashlib.sha256(
            json.dumps(
                [
                    len(tokenizer),
                    sorted(tokenizer.get_added_vocab().items()),
                    template,
                    list(tokenizer.encode(_PROBE, add_special_tokens=False)),
                ]
            ).encode()
        ).hexdigest()[:16]
        stops = frozenset({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else ())
        fmt = ChatFormat(tokenizer_id=f"tok-{digest}", tool_format=detect_tool_format(template), stop_ids=stops)
        with _LOCK:
            _FORMATS[key] = (tokenizer, fmt)  # the tokenizer is held so its id() is not reused
    else:
        fmt = cached[1]
    if tool_format is not None and tool_format != fmt.tool_format:
        fmt = ChatFormat(fmt.tokenizer_id, tool_format, fmt.stop_ids)
    return fmt


def tokenizer_id(tokenizer) -> str:
    return chat_format(tokenizer).tokenizer_id


def encode_text(text: str, tokenizer) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@dataclass
class _Message:
    template: dict[str, Any]  # what the chat template sees
    role: str
    step_index: int
    sampled: list[int] | None  # verbatim ids (this tokenizer's)
    loss: bool = False


def _system_content(content: str, tools: list[dict[str, Any]], tool_format: ToolFormat) -> str:
    """The system text for `tool_format`: the text protocol's tool description only where it is used."""
    suffix = f"\n\n{tools_prompt(tools)}" if tools else ""
    has = bool(suffix) and content.endswith(suffix)
    if tool_format in NATIVE_FORMATS and has:
        return content[: -len(suffix)]
    if tool_format == "protocol" and suffix and not has:
        return content + suffix
    return content


def _template_message(m: ChatMessage, tools: list[dict[str, Any]], fmt: ChatFormat, index: int, loss: bool) -> _Message:
    if m.role == "system":
        return _Message(
            {"role": "system", "content": _system_content(m.content, tools, fmt.tool_format)}, "system", index, None
        )
    if m.role == "tool":
        msg: dict[str, Any] = {"role": "tool", "content": m.content}
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.name:
            msg["name"] = m.name
        return _Message(msg, "tool", index, None)
    if m.role != "assistant":
        return _Message({"role": m.role, "content": m.content}, m.role, index, None)
    if m.token_ids is not None and m.tokenizer_id == fmt.tokenizer_id:
        return _Message(
            {"role": "assistant", "content": _PLACEHOLDER.format(index)}, "assistant", index, list(m.token_ids), loss
        )
    call = m.tool_call
    if call is not None and fmt.tool_format in NATIVE_FORMATS:
        msg = {
            "role": "assistant",
            "content": thought_of(m.content),
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ],
        }
        return _Message(msg, "assistant", index, None, loss)
    content = m.content
    if call is not None:  # protocol: keep the text if it already is this call in the protocol
        try:
            same = parse_call(content, "protocol").model_dump(exclude={"id"}) == call.model_dump(exclude={"id"})
        except ValueError:
            same = False
        if not same:
            from components.core.rendering.protocol import format_tool_call

            thought = thought_of(content)
            content = f"{thought}\n{format_tool_call(call)}" if thought else format_tool_call(call)
    return _Message({"role": "assistant", "content": content}, "assistant", index, None, loss)


@dataclass
class Rendered:
    input_ids: list[int]
    roles: list[int]
    loss_mask: list[int]
    step_index: list[int]
    retokenized: list[int]


@dataclass
class _Cached:
    context: str  # tokenizer, tool format and tools the conversation was rendered with
    keys: list[str]  # one per message
    text: str  # render(messages): render(messages[:i+1]) is its first text_ends[i] characters (append-only)
    text_ends: list[int]
    ends: list[tuple[int, int]]  # (token count, retokenized count) after each message
    out: Rendered


class PrefixCache:
    """The conversations a policy rendered last (up to `size`): a conversation's next turn renders only the
    messages appended since the longest cached prefix (an episode's prompts cost O(n) template renders each
    instead of re-rendering the history). It keeps one entry per conversation because a batched wave
    (`BatchingPolicy`) renders the turns of all its episodes in turn; a single entry would be evicted by
    every other episode. Valid because rendering is append-only: a segment never changes once later
    messages are appended."""

    # 256 conversations: a wave larger than the cache would miss on every turn (least recently used goes
    # first); an entry holds its text once and ~40 bytes per token.
    def __init__(self, size: int = 256) -> None:
        self.lock = threading.Lock()
        self.size = size
        self.entries: list[_Cached] = []  # least recently used first

    def longest_prefix(self, context: str, keys: list[str]) -> tuple[_Cached | None, int]:
        """The entry sharing the most leading messages with `keys` (and how many), or (None, 0)."""
        best, best_n = None, 0
        for entry in self.entries:
            if entry.context != context:
                continue
            n, limit = 0, min(len(keys), len(entry.keys))
            while n < limit and keys[n] == entry.keys[n]:
                n += 1
            if n > best_n:
                best, best_n = entry, n
        return best, best_n

    def store(self, entry: _Cached, extends: _Cached | None) -> None:
        """Add `entry`; `extends` (an entry it grew from: all its messages are a prefix of `entry`'s) is
        dropped, so a conversation holds one entry as it grows."""
        self.entries = [e for e in self.entries if e is not extends] + [entry]
        del self.entries[: -self.size]


def _key(m: _Message) -> str:
    return json.dumps([m.template, m.sampled, m.loss, m.step_index, m.role], sort_keys=True, default=str)


_REWRITES_HISTORY: set[str] = set()  # templates (by `ChatFormat.tokenizer_id`) rendered by the history view


def _render(
    messages: list[_Message],
    tokenizer,
    tools: list[dict[str, Any]] | None,
    fmt: ChatFormat,
    add_generation_prompt: bool,
    cache: PrefixCache | None = None,
) -> Rendered:
    if fmt.tokenizer_id in _REWRITES_HISTORY:
        return _render_frozen(messages, tokenizer, tools, fmt, add_generation_prompt)
    try:
        if cache is None:
            return _render_from(messages, tokenizer, tools, fmt, add_generation_prompt, None)
        with cache.lock:
            return _render_from(messages, tokenizer, tools, fmt, add_generation_prompt, cache)
    except TemplateError:
        rendered = _render_frozen(messages, tokenizer, tools, fmt, add_generation_prompt)
        with _LOCK:
            _REWRITES_HISTORY.add(fmt.tokenizer_id)
        return rendered


def _render_frozen(
    messages: list[_Message],
    tokenizer,
    tools: list[dict[str, Any]] | None,
    fmt: ChatFormat,
    add_generation_prompt: bool,
) -> Rendered:
    """The history view (module docstring): every assistant turn frozen as it was when newest."""
    tools_arg = tools if tools and fmt.tool_format in NATIVE_FORMATS else None
    shown = [m.template for m in messages]  # what the template sees: frozen turns become placeholders

    def text(msgs: list[dict[str, Any]], generation: bool = False) -> str:
        if not msgs and not generation:
            return ""
        return tokenizer.apply_chat_template(msgs, tools=tools_arg, tokenize=False, add_generation_prompt=generation)

    out = Rendered([], [], [], [], [])
    prev = ""  # the rendered text so far, up to where the next segment starts

    def put(ids: list[int], m: _Message, loss: bool) -> None:
        out.input_ids.extend(ids)
        out.roles.extend([int(TokenRole[m.role])] * len(ids))
        out.loss_mask.extend([int(loss)] * len(ids))
        out.step_index.extend([m.step_index] * len(ids))

    pending: tuple[str, str, str] | None = None  # (placeholder, header, glue) of the last frozen turn

    def settle(rendered: str, i: int) -> str:
        """The text up to the end of the frozen turn `pending` in a render where it is no longer last."""
        assert pending is not None
        marker, header, glue = pending
        before, found, after = rendered.partition(marker)
        if not found or before != prev + header or not after.startswith(glue):
            raise TemplateError(
                f"the chat template re-renders earlier messages when message {i} is appended, "
                "even with every assistant turn frozen as it was generated; use a template that "
                "renders history as it was generated"
            )
        return before + marker + glue

    for i, m in enumerate(messages):
        if m.role != "assistant":
            cur = text(shown[: i + 1])
            if pending is not None:
                prev, pending = settle(cur, i), None
            if not cur.startswith(prev):
                raise TemplateError(
                    f"the chat template re-renders earlier messages when message {i} ({m.role}) is "
                    "appended, even with every assistant turn frozen as it was generated"
                )
            put(encode_text(cur[len(prev) :], tokenizer), m, False)
            prev = cur
            continue
        if pending is not None:
            raise TemplateError(f"message {i}: two assistant turns in a row cannot be rendered by the history view")
        generation = text(shown[:i], generation=True)
        if not generation.startswith(prev):
            raise TemplateError(f"message {i}: the generation prompt re-renders earlier messages")
        header = generation[len(prev) :]
        put(encode_text(header, tokenizer), m, False)
        if m.sampled is not None:
            completion = list(m.sampled)
        else:
            segment = text(shown[: i + 1])[len(prev) :]
            if not segment.startswith(header):
                raise TemplateError(
                    f"message {i}: the assistant turn does not start with the generation prompt "
                    f"{header!r} (rendered {segment[:80]!r})"
                )
            ids = encode_text(segment[len(header) :], tokenizer)
            completion = ids[: next((k + 1 for k, t in enumerate(ids) if t in fmt.stop_ids), len(ids))]
            if m.loss:
                out.retokenized.append(m.step_index)
        put(completion, m, m.loss)
        marker = _PLACEHOLDER.format(i)
        shown[i] = {"role": "assistant", "content": marker}
        _, found, glue = text(shown[: i + 1]).partition(marker)
        if not found:
            raise TemplateError(f"message {i}: the template drops assistant content")
        glue_ids = encode_text(glue, tokenizer)
        if completion and completion[-1] in fmt.stop_ids and glue_ids and glue_ids[0] in fmt.stop_ids:
            glue_ids = glue_ids[1:]  # the end token was generated; the template's own copy is not repeated
        put(glue_ids, m, False)
        pending = (marker, header, glue)
    if add_generation_prompt:
        generation = text(shown, generation=True)
        if pending is not None:  # the conversation ends on an assistant turn
            _, _, after = generation.partition(pending[0])
            tail = after[len(pending[2]) :] if after.startswith(pending[2]) else None
        else:
            tail = generation[len(prev) :] if generation.startswith(prev) else None
        if tail is None:
            raise TemplateError("the generation prompt re-renders earlier messages")
        out.input_ids.extend(encode_text(tail, tokenizer))
    return out


def _render_from(
    messages: list[_Message],
    tokenizer,
    tools: list[dict[str, Any]] | None,
    fmt: ChatFormat,
    add_generation_prompt: bool,
    cache: PrefixCache | None,
) -> Rendered:
    tools_arg = tools if tools and fmt.tool_format in NATIVE_FORMATS else None

    def text(upto: int, generation: bool = False) -> str:
        if upto == 0 and not generation:
            return ""
        return tokenizer.apply_chat_template(
            [m.template for m in messages[:upto]], tools=tools_arg, tokenize=False, add_generation_prompt=generation
        )

    out = Rendered([], [], [], [], [])
    keys = [_key(m) for m in messages] if cache is not None else []
    context = json.dumps([fmt.tokenizer_id, fmt.tool_format, tools_arg], sort_keys=True, default=str)
    start, prev, text_ends, ends = 0, "", [], []
    hit = None
    if cache is not None:
        hit, start = cache.longest_prefix(context, keys)
        if hit is not None:
            n, r = hit.ends[start - 1]
            out = Rendered(
                hit.out.input_ids[:n],
                hit.out.roles[:n],
                hit.out.loss_mask[:n],
                hit.out.step_index[:n],
                hit.out.retokenized[:r],
            )
            prev, text_ends, ends = hit.text[: hit.text_ends[start - 1]], hit.text_ends[:start], hit.ends[:start]

    def put(ids: list[int], m: _Message, loss: bool) -> None:
        out.input_ids.extend(ids)
        out.roles.extend([int(TokenRole[m.role])] * len(ids))
        out.loss_mask.extend([int(loss)] * len(ids))
        out.step_index.extend([m.step_index] * len(ids))

    for i in range(start, len(messages)):
        m = messages[i]
        cur = text(i + 1)
        if not cur.startswith(prev):
            raise TemplateError(
                f"the chat template re-renders earlier messages when message {i} ({m.role}) is appended, so the "
                f"conversation cannot be rendered append-only; earlier text {prev[-80:]!r} became "
                f"{cur[max(0, len(prev) - 80) : len(prev)]!r}. Give such turns their sampled token_ids, or use a "
                "template that renders history as it was generated"
            )
        segment = cur[len(prev) :]
        if m.role != "assistant":
            put(encode_text(segment, tokenizer), m, False)
            prev = cur
            text_ends.append(len(cur))
            ends.append((len(out.input_ids), len(out.retokenized)))
            continue
        header = text(i, generation=True)[len(prev) :]
        if not segment.startswith(header):
            raise TemplateError(
                f"message {i}: the assistant turn does not start with the generation prompt "
                f"{header!r} (rendered {segment[:80]!r})"
            )
        put(encode_text(header, tokenizer), m, False)
        body = segment[len(header) :]
        if m.sampled is not None:
            marker = m.template["content"]
            before, found, after = body.partition(marker)
            if not found or before:
                raise TemplateError(f"message {i}: the template changes assistant content (rendered {body[:80]!r})")
            put(m.sampled, m, m.loss)
            glue = encode_text(after, tokenizer)
            if m.sampled and m.sampled[-1] in fmt.stop_ids and glue and glue[0] in fmt.stop_ids:
                glue = glue[1:]  # the end token was sampled; the template's own copy is not repeated
            put(glue, m, False)  # glue the policy never sampled (an end token after a cut, a newline)
        else:
            ids = encode_text(body, tokenizer)
            end = next((k + 1 for k, t in enumerate(ids) if t in fmt.stop_ids), len(ids))
            put(ids[:end], m, m.loss)
            put(ids[end:], m, False)
            if m.loss:
                out.retokenized.append(m.step_index)
        prev = cur
        text_ends.append(len(cur))
        ends.append((len(out.input_ids), len(out.retokenized)))
    if cache is not None and keys and (hit is None or start < len(keys)):  # else nothing new to keep
        rendered = Rendered(
            list(out.input_ids), list(out.roles), list(out.loss_mask), list(out.step_index), list(out.retokenized)
        )
        cache.store(
            _Cached(context, keys, prev, text_ends, ends, rendered),
            extends=hit if hit is not None and start == len(hit.keys) else None,
        )
    if add_generation_prompt:
        tail = text(len(messages), generation=True)[len(prev) :]
        out.input_ids.extend(encode_text(tail, tokenizer))
    return out


def render_prompt(
    messages: Iterable[ChatMessage | Mapping],
    tokenizer,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    tool_format: ToolFormat | None = None,
    cache: PrefixCache | None = None,
) -> list[int]:
    """Prompt ids for a conversation; assistant messages with this tokenizer's `token_ids` are used verbatim.
    `cache` (one per policy) re-uses the rendering of the longest unchanged prefix among recent calls."""
    fmt = chat_format(tokenizer, tool_format)
    msgs = [m if isinstance(m, ChatMessage) else ChatMessage(**m) for m in messages]
    rendered = _render(
        [_template_message(m, tools or [], fmt, i, False) for i, m in enumerate(msgs)],
        tokenizer,
        tools,
        fmt,
        add_generation_prompt,
        cache,
    )
    return rendered.input_ids


def malformed_call(step: Step) -> bool:
    """An assistant turn whose tool call did not parse (the harness answered it with a protocol error)."""
    return step.role == "assistant" and step.tool_call is None and step.policy_error is not None


def step_has_loss(step: Step, trajectory: Trajectory, loss_on: LossOn, malformed_loss: bool = True) -> bool:
    if step.role != "assistant" or loss_on == "none":
        return False
    if not malformed_loss and malformed_call(step):
        return False
    if loss_on == "assistant":
        return True
    return step.credited is True


def steps_as_messages(steps: Iterable[Step]) -> list[ChatMessage]:
    """Steps as chat messages (tool observations keep their call id and tool name; sampled turns their ids)."""
    return [
        ChatMessage(
            role=s.role,
            content=s.content,
            tool_call_id=s.tool_call_id,
            name=s.tool_name if s.role == "tool" else None,
            tool_call=s.tool_call if s.role == "assistant" else None,
            token_ids=s.token_ids if s.role == "assistant" else None,
            tokenizer_id=s.tokenizer_id if s.role == "assistant" else None,
        )
        for s in steps
    ]


def render_trajectory(
    trajectory: Trajectory,
    tokenizer,
    loss_on: LossOn = "credited",
    tool_format: ToolFormat | None = None,
    *,
    malformed_loss: bool = True,
) -> TokenizedSample:
    """The episode as one token sequence with a role, a step index and a loss flag per token.

    loss_on: "assistant" = every assistant step (resolved trajectories, whole-trajectory SFT, RL);
    "credited" = only assistant steps with `Step.credited` True; "none" = context only.
    malformed_loss: False = a turn whose tool call did not parse (`malformed_call`) is context only
    (SFT imitates; RL keeps it: its negative advantage is what teaches the policy to stop writing them).
    """
    fmt = chat_format(tokenizer, tool_format)
    messages = [
        _template_message(m, trajectory.tools, fmt, s.index, step_has_loss(s, trajectory, loss_on, malformed_loss))
        for m, s in zip(steps_as_messages(trajectory.steps), trajectory.steps)
    ]
    r = _render(messages, tokenizer, trajectory.tools, fmt, add_generation_prompt=False)
    return TokenizedSample(
        trajectory_id=trajectory.id,
        input_ids=r.input_ids,
        roles=r.roles,
        loss_mask=r.loss_mask,
        step_index=r.step_index,
        retokenized_steps=r.retokenized,
    )
