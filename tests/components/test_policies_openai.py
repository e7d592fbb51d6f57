"""OpenAICompatiblePolicy against a real HTTP server on loopback (a fake of a third-party endpoint)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.core.policy.base import ChatMessage, GenerationConfig
from components.core.policy.policies import (
    OpenAICompatiblePolicy,
    PolicyHTTPError,
    PolicyUnavailableError,
)
from components.core.rendering.protocol import parse_tool_call


def completion(content, *, tool_calls=None, finish="stop"):
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


class FakeOpenAI:
    """Answers POST /v1/chat/completions from a script of (status, body, headers, delay) entries."""

    def __init__(self):
        self.script: list[tuple[int, dict | str, dict, float]] = []
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                status, payload, headers, delay = fake.script.pop(0) if fake.script else (200, completion("ok"), {}, 0)
                time.sleep(delay)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and hung up

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    server = FakeOpenAI()
    yield server
    server.close()


MESSAGES = [
    ChatMessage(role="system", content="sys"),
    ChatMessage(role="user", content="fix"),
    ChatMessage(role="assistant", content='<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'),
    ChatMessage(role="tool", content="a.py", tool_call_id="call-1", name="bash"),
]


def policy(url, **kw) -> OpenAICompatiblePolicy:
    settings = {
        "base_url": url,
        "model": "teacher-model",
        "api_key_env": "FAKE_OPENAI_KEY",
        "backoff_seconds": 0.01,
        "timeout_seconds": 5.0,
        **kw,
    }
    return OpenAICompatiblePolicy(**settings)


def test_completion_request_shape_and_generation(fake, monkeypatch):
    monkeypatch.setenv("FAKE_OPENAI_KEY", "sk-test")
    fake.script.append((200, completion('<tool_call>{"name": "submit", "arguments": {}}</tool_call>'), {}, 0))
    with policy(fake.url) as p:
        gen = p.generate(MESSAGES, GenerationConfig(max_new_tokens=64, temperature=0.0, stop=["</tool_call>"], seed=3))
    assert parse_tool_call(gen.text).name == "submit"
    assert (gen.prompt_tokens, gen.completion_tokens, gen.finish_reason) == (11, 7, "stop")
    (req,) = fake.requests
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == "teacher-model" and body["max_tokens"] == 64 and body["stop"] == ["</tool_call>"]
    assert body["seed"] == 3 and body["temperature"] == 0.0
    assert body["messages"][3] == {"role": "user", "content": "<tool_response>\na.py\n</tool_response>"}
    assert p.policy_id == "openai:teacher-model"


def test_retries_on_500_and_429_then_succeeds(fake):
    fake.script += [
        (500, {"error": "boom"}, {}, 0),
        (429, {"error": "slow down"}, {"Retry-After": "0.05"}, 0),
        (503, "upstream", {}, 0),
        (200, completion("done", finish="length"), {}, 0),
    ]
    with policy(fake.url, max_retries=3) as p:
        gen = p.generate(MESSAGES, GenerationConfig())
    assert gen.text == "done" and gen.finish_reason == "length" and len(fake.requests) == 4


def test_gives_up_with_a_typed_error_after_the_retries(fake):
    fake.script += [(502, "bad gateway", {}, 0)] * 3
    with policy(fake.url, max_retries=2) as p, pytest.raises(PolicyUnavailableError, match="failed 3 times.*502"):
        p.generate(MESSAGES, GenerationConfig())
    assert len(fake.requests) == 3


def test_client_errors_are_not_retried(fake):
    fake.script.append((400, {"error": {"message": "bad model"}}, {}, 0))
    with policy(fake.url) as p, pytest.raises(PolicyHTTPError, match="HTTP 400.*bad model"):
        p.generate(MESSAGES, GenerationConfig())
    assert len(fake.requests) == 1


def test_read_timeout_is_retried(fake):
    fake.script += [(200, completion("late"), {}, 1.0), (200, completion("on time"), {}, 0)]
    with policy(fake.url, timeout_seconds=0.3, max_retries=1) as p:
        assert p.generate(MESSAGES, GenerationConfig()).text == "on time"


def test_unreachable_endpoint_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    with (
        policy(f"http://127.0.0.1:{port}/v1", max_retries=1) as p,
        pytest.raises(PolicyUnavailableError, match="Connect"),
    ):
        p.generate(MESSAGES, GenerationConfig())


def test_native_tool_calls_become_protocol_text(fake):
    native = [{"id": "c9", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]
    fake.script.append((200, completion(None, tool_calls=native), {}, 0))
    with policy(fake.url, tool_message_role="tool") as p:
        gen = p.generate(MESSAGES, GenerationConfig())
    call = parse_tool_call(gen.text)
    assert (call.name, call.arguments) == ("read_file", {"path": "a.py"})
    assert fake.requests[0]["body"]["messages"][3] == {"role": "tool", "content": "a.py", "tool_call_id": "call-1"}
