"""Screenshots for vision-language policies on the production path (an OpenAI-compatible endpoint).

Chat messages in the harness are text only, so screenshots travel beside them: the GUI recipe puts
each PNG into a `ScreenshotStore` under the tool call's id, and `VisionOpenAIPolicy` attaches the
most recent ones to the request in the OpenAI content-parts shape, right after the observation
they belong to:

    {"role": "user", "content": [
        {"type": "text", "text": "Screenshot after click:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR..."}}]}

(An image in a `user` message, because OpenAI-style `tool` messages carry text only.) Both objects
must live in one process, as they do in `distill`/`evaluate` runs; trajectories store only the
text, so training data stays text-only and the local small policy never sees images.

    store = ScreenshotStore()
    recipe = GUIRecipe(attach_screenshots=True, screenshot_store=store)
    policy = VisionOpenAIPolicy(store, base_url="http://vllm:8000/v1", model="Qwen2.5-VL-7B-Instruct")
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from typing import Any

from components.core.policy.policies import OpenAICompatiblePolicy, OpenAIPolicyConfig
from components.core.policy.base import ChatMessage


class ScreenshotStore:
    """Thread-safe, bounded map from tool-call id to PNG bytes (oldest dropped first)."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, call_id: str, png: bytes) -> None:
        with self._lock:
            self._items[call_id] = png
            self._items.move_to_end(call_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, call_id: str | None) -> bytes | None:
        with self._lock:
            return self._items.get(call_id) if call_id else None


def image_message(png: bytes, caption: str) -> dict[str, Any]:
    """A user message holding one PNG as an OpenAI `image_url` content part (a data URL)."""
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {
        "role": "user",
        "content": [{"type": "text", "text": caption}, {"type": "image_url", "image_url": {"url": url}}],
    }


class VisionOpenAIPolicy(OpenAICompatiblePolicy):
    """`OpenAICompatiblePolicy` that also sends the last `max_images` screenshots of the episode."""

    def __init__(
        self, store: ScreenshotStore, config: OpenAIPolicyConfig | None = None, *, max_images: int = 2, **settings: Any
    ):
        super().__init__(config, **settings)
        self.store, self.max_images = store, max_images
        self.policy_id = f"openai-vision:{self.config.model}"

    def _messages(self, messages: list[ChatMessage]) -> list[dict[str, Any]]:
        text_only = super()._messages(messages)
        # super() maps messages one to one, so positions line up with `messages`.
        # Each screenshot read once: the bounded store may drop one between two reads.
        images = {
            i: png for i, m in enumerate(messages) if m.role == "tool" and (png := self.store.get(m.tool_call_id))
        }
        keep = set(list(images)[-self.max_images :]) if self.max_images else set()
        out: list[dict[str, Any]] = []
        for i, (msg, wire) in enumerate(zip(messages, text_only)):
            out.append(wire)
            if i in keep:
                out.append(image_message(images[i], f"Screenshot after {msg.name or 'the action'}:"))
        return out
