"""The production vision path: screenshots reach an OpenAI-compatible endpoint as image parts.
The endpoint is a real HTTP server on loopback that records what it was sent."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.core.policy.base import ChatMessage, GenerationConfig
from components.recipes.gui.vision import ScreenshotStore, VisionOpenAIPolicy

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


@pytest.fixture
def endpoint():
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps(
                {
                    "choices": [
                        {
                            "message": {"content": '<tool_call>{"name": "read_page", "arguments": {}}</tool_call>'},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()


def test_last_screenshots_are_sent_as_image_parts_after_their_observation(endpoint):
    url, seen = endpoint
    store = ScreenshotStore(capacity=2)
    for cid in ("c1", "c2", "c3"):
        store.put(cid, PNG + cid.encode())
    assert store.get("c1") is None  # bounded: the oldest was dropped
    msgs = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="task")]
    for cid in ("c1", "c2", "c3"):
        msgs += [
            ChatMessage(role="assistant", content="<tool_call>...</tool_call>"),
            ChatMessage(role="tool", content=f"page {cid}", tool_call_id=cid, name="click"),
        ]
    policy = VisionOpenAIPolicy(store, base_url=url, model="vlm", api_key_env=None, max_images=1)
    gen = policy.generate(msgs, GenerationConfig(max_new_tokens=8))
    assert gen.text.startswith("<tool_call>") and gen.prompt_tokens == 7
    sent = seen[0]["messages"]
    images = [m for m in sent if isinstance(m["content"], list)]
    assert len(images) == 1  # max_images=1: only the latest
    part = images[0]["content"][1]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    assert base64.b64decode(part["image_url"]["url"].split(",", 1)[1]) == PNG + b"c3"
    assert sent[sent.index(images[0]) - 1]["content"].endswith("page c3\n</tool_response>")
    assert len(sent) == len(msgs) + 1
