"""Scripted Claw teachers, one per harness, rendering the same reference plan.

The plan (`task.metadata["plan"]`) is a list of API calls; the `tools` teacher emits them as
function calls, the `shell` teacher as `./claw ...` command lines. Each turn the teacher finds the
first plan step that the conversation has not yet completed successfully (an identical call whose
result was not an error), so it continues from any prefix, including a student's partial rollout.
When every step is done it answers. With probability `error_rate` per turn it errs instead: a
corrupted write (wrong time, a missing attendee, a wrong recipient or total) that leaves a wrong
row behind, a wasted wrong read, or a premature or wrong answer.
"""

from __future__ import annotations

import json
import random
import shlex
from typing import Any, Literal

from components.core.policy.base import ChatMessage, Generation, GenerationConfig
from components.core.rendering.protocol import ToolCallParseError, format_tool_call, parse_tool_call
from components.core.data.schema import Task, ToolCall

_WRITES = {"calendar_create", "mail_send", "notes_create"}


def render_cli(name: str, arguments: dict[str, Any]) -> str:
    """The `./claw` command line for an API call (lists are comma-separated)."""
    group, cmd = name.split("_", 1)
    parts = ["./claw", group, cmd]
    for key, value in arguments.items():
        text = ",".join(value) if isinstance(value, list) else str(value)
        parts += [f"--{key.replace('_', '-')}", shlex.quote(text)]
    return " ".join(parts)


class ScriptedTeacher:
    """`EpisodeAwarePolicy` for the Claw recipe (tools or shell harness)."""

    def __init__(self, error_rate: float = 0.0, seed: int = 0, harness: Literal["auto", "tools", "shell"] = "auto"):
        """`harness="auto"` reads the harness off the system prompt (a stage that only knows the
        recipe name, e.g. `evaluate` with policy='scripted', then gets the matching teacher)."""
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        if harness not in ("auto", "tools", "shell"):
            raise ValueError(f"harness must be 'auto', 'tools' or 'shell', got {harness!r}")
        self.harness, self.error_rate, self.seed = harness, error_rate, seed
        self.policy_id = f"claw-{harness}-scripted-teacher-e{error_rate:g}"
        self._harness = "tools" if harness == "auto" else harness  # the one in use this episode
        self._task: Task | None = None
        self._episodes = 0
        self._rng = random.Random(seed)

    def reset(self, task: Task) -> None:
        self._task = task
        self._episodes += 1
        self._rng = random.Random(f"{self.seed}:{task.id}:{self._episodes}")

    def generate(self, messages: list[ChatMessage], config: GenerationConfig) -> Generation:
        if self._task is None:
            raise RuntimeError("ScriptedTeacher.generate called before reset(task); the harness must reset it")
        if self.harness == "auto":
            system = next((m.content for m in messages if m.role == "system"), "")
            self._harness = "shell" if "./claw GROUP COMMAND" in system else "tools"
        text = format_tool_call(self.next_call(messages))
        return Generation(text=text, completion_tokens=len(text) // 4, finish_reason="stop")

    @property
    def _current(self) -> Task:
        """The episode's task (set by reset)."""
        if self._task is None:
            raise RuntimeError("ScriptedTeacher used before reset(task); the harness must reset it")
        return self._task

    # -- decisions -------------------------------------------------------------------------------
    def render(self, name: str, arguments: dict[str, Any]) -> ToolCall:
        if name == "answer" or self._harness == "tools":
            return ToolCall(name=name, arguments=arguments)
        return ToolCall(name="bash", arguments={"command": render_cli(name, arguments)})

    @staticmethod
    def _key(call: ToolCall) -> str:
        return json.dumps([call.name, call.arguments], sort_keys=True)

    def _done(self, messages: list[ChatMessage]) -> set[str]:
        done = set()
        for i, m in enumerate(messages):
            if m.role != "assistant" or i + 1 >= len(messages) or messages[i + 1].role != "tool":
                continue
            try:
                call = parse_tool_call(m.content)
            except ToolCallParseError:
                continue
            if '{"error"' not in messages[i + 1].content and not messages[i + 1].content.startswith("Error"):
                done.add(self._key(call))
        return done

    def next_call(self, messages: list[ChatMessage]) -> ToolCall:
        plan = [(s["name"], s["arguments"]) for s in self._current.metadata["plan"]]
        done = self._done(messages)
        pending = [(n, a) for n, a in plan if self._key(self.render(n, a)) not in done]
        final = self._current.metadata["final_answer"]
        if self.error_rate and self._rng.random() < self.error_rate:
            return self._mistake(pending, final)
        if not pending:
            return self.render("answer", {"text": final})
        return self.render(*pending[0])

    def _mistake(self, pending: list[tuple[str, dict]], final: str) -> ToolCall:
        rng, world = self._rng, self._current.metadata["world"]
        if not pending:  # wrong answer (only harmful for questions; a report text is not checked)
            return self.render(
                "answer", {"text": "12:45" if self._current.verifier.expected["kind"] == "answer" else final}
            )
        name, args = pending[0]
        args = dict(args)
        if name not in _WRITES and rng.random() < 0.3:
            return self.render("answer", {"text": final})  # gives up before the work is done
        if name == "calendar_create":
            if rng.random() < 0.5 and len(args["attendees"]) > 1:
                args["attendees"] = args["attendees"][1:]
            else:
                day, hhmm = args["start"].split()
                args["start"] = f"{day} {int(hhmm[:2]) + 1:02d}{hhmm[2:]}"
        elif name == "mail_send":
            others = [c["email"] for c in world["contacts"] if c["email"] not in args["to"]]
            args["to"] = [rng.choice(others)]
        elif name == "notes_create":
            args["body"] = args["body"].replace("$", "$1")  # a misread total
        elif name == "mail_read":
            args["id"] = max(1, int(args["id"]) - 1)
        elif name == "contacts_search":
            args["query"] = rng.choice(world["contacts"])["name"].split()[0]
        elif name == "calendar_list":
            args["date"] = "2026-03-01"
        elif name == "files_read":
            args["path"] = "notes/todo.txt"
        else:
            args = {k: (v if not isinstance(v, str) else v[:-1]) for k, v in args.items()}
        return self.render(name, args)
