"""A fake OpenAI-compatible teacher for a SWE-bench-format tasks file: `orchard fake-teacher --tasks F --port 8011`.

It stands in for a real teacher endpoint (vLLM serving a large model) when trying bring-your-own on a laptop: it
serves `GET /v1/models` and `POST /v1/chat/completions` like vLLM, and solves each task the way an agent would,
through the SWE tools, with the task's reference patch: it recognises the task by its problem statement in the
conversation, then, one turn per request, applies the patch with `git apply` (bash), shows the diff (bash) and
submits. Its replies are native `tool_calls`, as vLLM's tool parser returns them. A one-token request (the
run's preflight check) is answered "OK". A conversation about a task it does not know gets a submit without
changes, so the episode ends unresolved rather than hanging.

It is a stand-in only: every answer comes from the tasks file, no model runs.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PATCH_END = "ORCHARD_PATCH_END"


class FakeTeacher:
    """The replies (no HTTP): `reply(messages)` is the next assistant message of that conversation."""

    def __init__(self, tasks_path: str | Path, model: str = "fake-teacher"):
        self.model = model
        self.patches = {str(i["problem_statement"]).strip(): str(i["patch"]) for i in _instances(Path(tasks_path))}

    def _patch_for(self, messages: list[dict[str, Any]]) -> str | None:
        for message in messages:
            if message.get("role") == "user":
                text = str(message.get("content") or "")
                for statement, patch in self.patches.items():
                    if statement in text:
                        return patch
        return None

    def plan(self, patch: str | None) -> list[tuple[str, dict[str, Any]]]:
        """The tool calls of a whole episode: apply the patch, show the diff, submit."""
        if patch is None:
            return [("submit", {})]
        body = patch if patch.endswith("\n") else patch + "\n"
        return [
            ("bash", {"command": f"git apply --whitespace=nowarn - <<'{PATCH_END}'\n{body}{PATCH_END}"}),
            ("bash", {"command": "git diff --stat"}),
            ("submit", {}),
        ]

    def reply(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        plan = self.plan(self._patch_for(messages))
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        name, arguments = plan[min(turn, len(plan) - 1)]
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{turn}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """A chat completion for an OpenAI request body."""
        if int(body.get("max_tokens") or 2) <= 1:  # a preflight check: one token
            message, finish = {"role": "assistant", "content": "OK"}, "length"
        else:
            message, finish = self.reply(body.get("messages") or []), "tool_calls"
        text = json.dumps(message)
        return {
            "id": f"chatcmpl-{time.time_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": sum(len(str(m.get("content") or "")) // 4 for m in body.get("messages") or []),
                "completion_tokens": max(1, len(text) // 4),
                "total_tokens": 0,
            },
        }


def _instances(path: Path) -> list[dict[str, Any]]:
    """The tasks file's rows (JSONL or JSON here, parquet through pyarrow): the standard library alone for the
    usual case, so the server is up in a fraction of a second."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return data if isinstance(data, list) else [data]
    from components.recipes.swe.swebench import read_instances

    return read_instances(path)


def make_server(teacher: FakeTeacher, host: str = "127.0.0.1", port: int = 8011) -> ThreadingHTTPServer:
    """The HTTP server (not started): /v1/models and /v1/chat/completions."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, data: dict[str, Any]) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": teacher.model, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            except ValueError:
                self._send(400, {"error": {"message": "the body is not JSON"}})
                return
            if body.get("model") != teacher.model:
                self._send(
                    404,
                    {
                        "error": {
                            "message": f"model {body.get('model')!r} is not served; "
                            f"this server serves {teacher.model!r}"
                        }
                    },
                )
                return
            self._send(200, teacher.completion(body))

    return ThreadingHTTPServer((host, port), Handler)


def serve(
    tasks_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 8011,
    model: str = "fake-teacher",
    detach: bool = False,
    pid_file: str | Path | None = None,
) -> int:
    """Serve until Ctrl-C or SIGTERM. `detach`: return once the port listens, the server going on in a process of
    its own (its pid printed and written to `pid_file`), so a script can start it and go on at once."""
    import os
    import signal

    teacher = FakeTeacher(tasks_path, model)
    try:
        server = make_server(teacher, host, port)  # bound and listening from here: connections queue until served
    except OSError as err:
        raise OSError(
            f"cannot listen on {host}:{port} ({err.strerror}): another fake teacher still running? Stop it, "
            "or pass --port N and use that port in the config's base_url"
        ) from None
    if detach:
        pid = os.fork()
        if pid:
            if pid_file:
                Path(pid_file).write_text(f"{pid}\n")
            print(
                f"fake teacher for {len(teacher.patches)} task(s) at http://{host}:{port}/v1 (model {model!r}), "
                f"pid {pid}: stop it with kill {pid}",
                flush=True,
            )
            os._exit(0)  # the parent: nothing of the server's to tear down, the child owns the socket now
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    if not detach:
        print(
            f"fake teacher for {len(teacher.patches)} task(s) of {tasks_path} at http://{host}:{port}/v1 "
            f"(model {model!r}); Ctrl-C stops it",
            flush=True,
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    if detach:
        os._exit(0)
    return 0
