"""The SWE tools (bash, read_file, write_file, str_replace, submit) on a sandbox.

Boundary rule: a bad argument (over its schema's bounds, a path the filesystem cannot name: a NUL byte,
a name over 255 bytes, a path over PATH_MAX), a missing file, a request the service refuses, a failing
or timed-out command is the policy's error (an observation it can react to). What the tool cannot
attribute (`ToolResult.infra_error`, or any other `SandboxServiceError`) goes to the one rule
(`core/episode/blame.py`), which gives it to the infrastructure only on evidence no argument can produce.
"""

from __future__ import annotations

import posixpath
from typing import Any

from components.core.episode.recipe_base import ToolResult, ToolSpec
from components.core.data.schema import ToolCall
from sandbox_service.client import Sandbox
from sandbox_service.errors import FileNotFoundInSandboxError, InvalidRequestError, ValidationFailedError
from sandbox_service.models import ExecOutcome

MAX_PATH_BYTES = 4095  # PATH_MAX less its NUL: a longer path cannot be named in one system call
MAX_NAME_BYTES = 255  # NAME_MAX: one component of a path
MAX_TEXT = 1_000_000  # characters of a file's content or a command
_PATH = {"type": "string", "maxLength": MAX_PATH_BYTES}
_TEXT = {"type": "string", "maxLength": MAX_TEXT}

TOOL_SPECS = [
    ToolSpec(
        name="bash",
        description="Run a shell command in the repository.",
        parameters={"type": "object", "properties": {"command": _TEXT}, "required": ["command"]},
    ),
    ToolSpec(
        name="read_file",
        description="Show a file.",
        parameters={"type": "object", "properties": {"path": _PATH}, "required": ["path"]},
    ),
    ToolSpec(
        name="write_file",
        description="Replace a file's whole content.",
        parameters={"type": "object", "properties": {"path": _PATH, "content": _TEXT}, "required": ["path", "content"]},
    ),
    ToolSpec(
        name="str_replace",
        description="Replace the one occurrence of old_str in a file by new_str.",
        parameters={
            "type": "object",
            "properties": {"path": _PATH, "old_str": _TEXT, "new_str": _TEXT},
            "required": ["path", "old_str", "new_str"],
        },
    ),
    ToolSpec(
        name="submit",
        description="Finish: your changes to the repository are the answer.",
        parameters={"type": "object", "properties": {}},
    ),
]

# `git add -A` first so new files are part of the diff; excluded caches never are.
DIFF_COMMAND = "git add -A >/dev/null 2>&1 && git -c core.quotepath=off diff --cached --no-color --no-ext-diff"


def clip(text: str, limit: int) -> str:
    """Keep the head and tail of a long observation (errors are usually at the end)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} chars cut] ...\n{text[-half:]}"


def _policy_error(message: str) -> ToolResult:
    return ToolResult(output=f"Error: {message}", policy_error=message)


def _str_arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise _ArgError(f"argument {name!r} (a string) is required")
    return value


class _ArgError(ValueError):
    pass


class SWETools:
    """Runs one tool call; `workdir` is where relative paths and commands start."""

    def __init__(self, workdir: str, *, timeout_seconds: float = 30.0, max_output_chars: int = 2000):
        self.workdir = workdir
        self.timeout_seconds = timeout_seconds
        self.max_output_chars = max_output_chars

    def _path(self, args: dict[str, Any]) -> str:
        """The `path` argument, absolute, once the filesystem can name it (else the policy's error)."""
        path = _str_arg(args, "path")
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        if "\0" in full:
            raise _ArgError("path must not contain a NUL byte")
        encoded = full.encode("utf-8", "surrogateescape")
        if len(encoded) > MAX_PATH_BYTES:
            raise _ArgError(f"path is {len(encoded)} bytes long; at most {MAX_PATH_BYTES}")
        longest = max(encoded.split(b"/"), key=len)
        if len(longest) > MAX_NAME_BYTES:
            raise _ArgError(f"a path component is {len(longest)} bytes long; at most {MAX_NAME_BYTES}")
        return full

    def execute(self, sandbox: Sandbox, call: ToolCall) -> ToolResult:
        handler = getattr(self, f"_tool_{call.name}", None)
        if handler is None:
            names = ", ".join(t.name for t in TOOL_SPECS)
            return _policy_error(f"unknown tool {call.name!r}; use one of: {names}")
        try:
            return handler(sandbox, call.arguments)
        except _ArgError as err:
            return _policy_error(str(err))
        except FileNotFoundInSandboxError:
            return _policy_error(f"no such file: {call.arguments.get('path')}")
        except (InvalidRequestError, ValidationFailedError) as err:  # outside the sandbox, a directory, a NUL, ...
            return _policy_error(err.message)

    def _tool_bash(self, sandbox: Sandbox, args: dict[str, Any]) -> ToolResult:
        command = _str_arg(args, "command")
        result = sandbox.exec(["bash", "-c", command], cwd=self.workdir, timeout=self.timeout_seconds)
        if result.outcome is ExecOutcome.infrastructure_error:
            return ToolResult(output="", infra_error=f"{result.infra_error}: {result.message}")
        text = clip(result.stdout + result.stderr, self.max_output_chars)
        if result.outcome is ExecOutcome.command_timeout:
            return ToolResult(
                output=f"{text}\n[timed out after {self.timeout_seconds:g}s]", policy_error="command timed out"
            )
        if result.exit_code is None:  # it never ran: the service says why
            tail = f"[could not run: {result.message}]"
            return ToolResult(output=f"{text}\n{tail}" if text else tail, policy_error=result.message)
        tail = f"[exit code {result.exit_code}]"
        if result.reason == "oom":  # its own OOM: the policy's outcome, shown to it like any failure
            tail = f"[killed: out of memory, exit code {result.exit_code}]"
            return ToolResult(output=f"{text}\n{tail}" if text else tail, policy_error="command ran out of memory")
        return ToolResult(output=f"{text}\n{tail}" if text else tail)

    def _tool_read_file(self, sandbox: Sandbox, args: dict[str, Any]) -> ToolResult:
        text = sandbox.read_text(self._path(args))
        return ToolResult(output=clip(text, self.max_output_chars))

    def _tool_write_file(self, sandbox: Sandbox, args: dict[str, Any]) -> ToolResult:
        path, content, full = _str_arg(args, "path"), _str_arg(args, "content"), self._path(args)
        parent = posixpath.dirname(full)
        made = sandbox.exec(["mkdir", "-p", parent], timeout=self.timeout_seconds)
        if made.outcome is ExecOutcome.infrastructure_error:
            return ToolResult(output="", infra_error=f"{made.infra_error}: {made.message}")
        sandbox.write_file(full, content)
        return ToolResult(output=f"Wrote {path}.")

    def _tool_str_replace(self, sandbox: Sandbox, args: dict[str, Any]) -> ToolResult:
        path, old, new = _str_arg(args, "path"), _str_arg(args, "old_str"), _str_arg(args, "new_str")
        if not old:
            raise _ArgError("old_str must not be empty")
        full = self._path(args)
        text = sandbox.read_text(full)
        count = text.count(old)
        if count == 0:
            return _policy_error(f"old_str not found in {path}")
        if count > 1:
            return _policy_error(f"old_str occurs {count} times in {path}; include more context")
        sandbox.write_file(full, text.replace(old, new, 1))
        return ToolResult(output=f"Edited {path}.")

    def _tool_submit(self, sandbox: Sandbox, args: dict[str, Any]) -> ToolResult:
        # The diff is for the record only: verification compares the files themselves (change.py), so a
        # broken .git or a removed repository still submits, and never turns into an infrastructure error.
        try:
            result = sandbox.exec(["bash", "-c", DIFF_COMMAND], cwd=self.workdir, timeout=self.timeout_seconds)
        except FileNotFoundInSandboxError:
            return ToolResult(output="Submitted (the repository is gone).", submitted=True, final_answer="")
        if result.outcome is ExecOutcome.infrastructure_error:
            return ToolResult(output="", infra_error=f"computing the diff: {result.infra_error}: {result.message}")
        if result.outcome is not ExecOutcome.ok:
            return ToolResult(
                output=f"Submitted (git could not diff the repository: {result.stderr.strip()[-200:]}).",
                submitted=True,
                final_answer="",
            )
        return ToolResult(output="Submitted.", submitted=True, final_answer=result.stdout)


def git_init_script() -> str:
    """Shell run at setup: a fresh git baseline of the placed files, so `submit` can diff. Without git's
    template (its sample hooks and description are 15 of a new repository's 25 files), every download of
    the workdir, the kept set-up's and the final tree's at verification, archives and parses less."""
    exclude = "mkdir -p .git/info && printf '__pycache__/\\n*.pyc\\n.pytest_cache/\\n' >> .git/info/exclude"
    ident = "-c user.name=orchard -c user.email=orchard@localhost"
    return f"git init -q --template= && {exclude} && git add -A && git {ident} commit -q --allow-empty -m initial"
