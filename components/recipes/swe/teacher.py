"""A scripted expert for the generated SWE suite: it works like an agent, through the same harness.

It lists the files, reads the module, runs the visible tests, applies the fix with `str_replace`,
reruns the tests and submits. It knows the reference fix (from `reset(task)`), but it decides every
action from the conversation so far: it replays the edits it sees onto the last file contents it
read, so it can continue from any prefix of an episode (the credit stage's Monte-Carlo rollouts
start from intermediate states). With probability `error_rate` per decision it makes a strategic
mistake, the kind an agent makes and a policy can learn to avoid: opening the wrong file first,
a wrong or incomplete edit, or giving up early. It never emits a malformed tool call: those would be
imitated as a format to learn, not a decision (a malformed call from a *policy* is still a policy
error observation, see components/core/rendering/protocol.py). Its text is only the tool call, in exactly the
protocol format, because the tiny model is trained on it.
"""

from __future__ import annotations

import hashlib
import posixpath
import random
from dataclasses import dataclass, field

from components.core.policy.base import ChatMessage, Generation, GenerationConfig
from components.core.rendering.protocol import ToolCallParseError, format_tool_call, parse_tool_call
from components.core.data.schema import Task, ToolCall

LIST_COMMAND = "find . -name '*.py' | sort"
TEST_COMMAND = "python -m pytest -q"
# Commands the teacher knows do not change files; any other bash command may have edited the target.
_READ_ONLY_PREFIXES = ("find ", "ls", "cat ", "grep ", "python -m pytest", "pytest", "git diff", "git status")


@dataclass
class _View:
    """What the conversation says about the episode so far."""

    listed: bool = False
    contents: dict[str, str | None] = field(default_factory=dict)  # last known content of each file to fix
    edits: int = 0
    tests_since_edit: bool = False
    tests_ever: bool = False
    read_other: bool = False  # has opened a file other than the targets
    listing: str = ""  # output of the last file listing


class ScriptedTeacher:
    """`ScriptedTeacher(error_rate=0.3, seed=0)`; an `EpisodeAwarePolicy` (the harness calls `reset`)."""

    def __init__(self, error_rate: float = 0.3, seed: int = 0):
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        self.error_rate = error_rate
        self.seed = seed
        self.policy_id = f"scripted-teacher-e{error_rate:g}"
        self._task: Task | None = None
        self._episodes = 0

    def reset(self, task: Task) -> None:
        fix = task.metadata.get("fix")
        if not fix or "fixed_source" not in task.metadata:
            raise ValueError(
                f"task {task.id} has no reference fix in metadata; the scripted teacher only "
                "works on generated SWE tasks (use OpenAICompatiblePolicy for imported ones)"
            )
        self._task = task
        self._episodes += 1

    def _rng(self, view: _View) -> random.Random:
        """The randomness of one decision, keyed by the situation the teacher is in.

        Two continuations with the same seed that reach the same situation decide the same way, wherever
        they started: this is what makes the credit stage's common random numbers work (V(s_t) and
        V(s_{t+1}) differ only where step t changed the situation). Different seeds, tasks or episodes
        still decide independently."""
        assert self._task is not None
        known = repr(sorted(view.contents.items()))
        content = hashlib.sha256(known.encode()).hexdigest()[:16] if any(view.contents.values()) else "-"
        situation = (view.listed, view.read_other, content, view.edits, view.tests_since_edit, view.tests_ever)
        return random.Random(f"{self.seed}:{self._task.id}:{self._episodes}:{situation}")

    # -- reading the conversation -----------------------------------------------------------
    def _rel(self, path: str) -> str:
        assert self._task is not None
        workdir = self._task.environment.workdir.rstrip("/") + "/"
        path = posixpath.normpath(path)
        return path[len(workdir) :] if path.startswith(workdir) else path

    def _fixes(self) -> list[dict]:
        """Every planted bug (`fixes` in two-bug tasks; tasks from before them carry `fix` only)."""
        assert self._task is not None
        meta = self._task.metadata
        return meta.get("fixes") or [{**meta["fix"], "function": meta["function"]}]

    def _fixed_sources(self) -> dict[str, str]:
        assert self._task is not None
        meta = self._task.metadata
        return meta.get("fixed_sources") or {meta["fix"]["path"]: meta["fixed_source"]}

    def _view(self, messages: list[ChatMessage]) -> _View:
        assert self._task is not None
        targets = {f["path"] for f in self._fixes()}
        view = _View(contents={path: None for path in sorted(targets)})
        for i, msg in enumerate(messages):
            if msg.role != "assistant":
                continue
            obs = messages[i + 1].content if i + 1 < len(messages) else ""
            try:
                call = parse_tool_call(msg.content)
            except ToolCallParseError:
                continue
            failed = obs.startswith("Error:")
            args = call.arguments
            target = self._rel(args["path"]) if isinstance(args.get("path"), str) else None
            on_target = target if target is not None and target in targets else None  # the file, when a target
            if call.name == "bash":
                command = str(args.get("command", "")).strip()
                if command.startswith(("find ", "ls", "grep ")):
                    view.listed = True
                    view.listing = obs
                if "pytest" in command:
                    view.tests_ever = view.tests_since_edit = True
                if not command.startswith(_READ_ONLY_PREFIXES):
                    view.contents = dict.fromkeys(view.contents)  # it may have changed files: read them again
            elif call.name == "read_file" and on_target is not None and not failed:
                view.contents[on_target] = obs
            elif call.name == "read_file":
                view.read_other = True
            elif call.name == "str_replace" and on_target is not None and not failed:
                old, new = str(args.get("old_str", "")), str(args.get("new_str", ""))
                known = view.contents[on_target]
                view.contents[on_target] = known.replace(old, new, 1) if known is not None else None
                view.edits += 1
                view.tests_since_edit = False
            elif call.name == "write_file" and on_target is not None and not failed:
                view.contents[on_target] = str(args.get("content", ""))
                view.edits += 1
                view.tests_since_edit = False
        return view

    # -- deciding ---------------------------------------------------------------------------
    def _decide(self, view: _View) -> ToolCall:
        """The next action: find, read and fix each planted bug in turn, test, submit."""
        assert self._task is not None
        fixes, fixed_sources = self._fixes(), self._fixed_sources()
        rng = self._rng(view)
        e, roll = self.error_rate, rng.random()
        if not view.listed:
            if self._task.difficulty >= 2:  # the issue does not name the file: search for the function
                return ToolCall(
                    name="bash", arguments={"command": f"grep -rn 'def {fixes[0]['function']}' --include=*.py ."}
                )
            return ToolCall(name="bash", arguments={"command": LIST_COMMAND})
        for fix in fixes:
            path, content = fix["path"], view.contents[fix["path"]]
            if content is None:
                wrong = self._distractor(view.listing, path, set(fixed_sources))
                if wrong and not view.read_other and roll < 0.5 * e:  # opens the wrong file first
                    return ToolCall(name="read_file", arguments={"path": wrong})
                return ToolCall(name="read_file", arguments={"path": path})
            if content == fixed_sources[path]:
                continue
            if fix["old"] in content:  # this bug is still there
                if not view.tests_ever:
                    return ToolCall(name="bash", arguments={"command": TEST_COMMAND})
                if roll < 0.5 * e:  # gives up early
                    return ToolCall(name="submit", arguments={})
                if roll < 1.5 * e and fix["wrong"]:  # a wrong or incomplete edit
                    wrong = rng.choice(fix["wrong"])
                    return ToolCall(
                        name="str_replace", arguments={"path": path, "old_str": fix["old"], "new_str": wrong}
                    )
                return ToolCall(
                    name="str_replace", arguments={"path": path, "old_str": fix["old"], "new_str": fix["new"]}
                )
            if fix["new"] in content.splitlines():  # this one is fixed; another bug of the file remains
                continue
            # Neither buggy nor fixed: an earlier edit went wrong.
            if not view.tests_since_edit:
                return ToolCall(name="bash", arguments={"command": TEST_COMMAND})
            if view.edits < 3 * len(fixes) and rng.random() >= e:  # notices the mistake and repairs it
                return self._repair(content, fixed_sources[path], path)
            return ToolCall(name="submit", arguments={})
        if not view.tests_since_edit:
            return ToolCall(name="bash", arguments={"command": TEST_COMMAND})
        return ToolCall(name="submit", arguments={})

    @staticmethod
    def _distractor(listing: str, target: str, targets: set[str]) -> str | None:
        """Another source file of the listing (not a test, not one to fix), if there is one."""
        files = sorted(
            {
                posixpath.normpath(line.split(":", 1)[0].strip())
                for line in listing.splitlines()
                if line.strip().endswith(".py") or ".py:" in line
            }
        )
        skip = {posixpath.normpath(t) for t in targets | {target}}
        others = [f for f in files if f not in skip and "test" not in posixpath.basename(f)]
        others.sort(key=lambda f: f.endswith("__init__.py"))  # a sibling module before the package file
        return others[0] if others else None

    @staticmethod
    def _repair(content: str, fixed_source: str, path: str) -> ToolCall:
        have, want = content.splitlines(), fixed_source.splitlines()
        if len(have) == len(want):
            diff = [(a, b) for a, b in zip(have, want) if a != b]
            if len(diff) == 1 and content.count(diff[0][0]) == 1:
                return ToolCall(
                    name="str_replace", arguments={"path": path, "old_str": diff[0][0], "new_str": diff[0][1]}
                )
        return ToolCall(name="write_file", arguments={"path": path, "content": fixed_source})

    def generate(self, messages: list[ChatMessage], config: GenerationConfig) -> Generation:
        if self._task is None:
            raise RuntimeError("ScriptedTeacher.generate before reset(task): run it through the harness")
        text = format_tool_call(self._decide(self._view(messages)))
        prompt_tokens = sum(len(m.content) for m in messages) // 4
        return Generation(
            text=text, prompt_tokens=prompt_tokens, completion_tokens=len(text) // 4 + 1, finish_reason="stop"
        )
