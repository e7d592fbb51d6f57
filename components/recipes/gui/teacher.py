"""Scripted GUI teacher: an expert that reads the current page and picks the next action.

It is reactive, not a replay: every turn it parses the latest page view in the conversation and
decides from the page and the task's goal, so it can continue from any prefix (an RL rollout's
partial history, a student's mistakes) and it repairs what it sees (removes a wrong cart item,
re-fills a form that came back with an error). With probability `error_rate` per turn it makes a
mistake instead: usually a random click (recoverable), sometimes a harmful shortcut (a wrong
item, submitting early, a wrong answer) that usually ends the episode unresolved. That gives distillation both kinds
of trajectory.

The teacher knows the goal from `task.verifier.expected` (it is the reference solution); it never
looks at the site state file.
"""

from __future__ import annotations

import random
from typing import Any

from components.core.policy.base import ChatMessage, Generation, GenerationConfig
from components.core.rendering.protocol import format_tool_call
from components.core.data.schema import Task, ToolCall
from components.recipes.gui.page import Element, PageView, parse_page


def _call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


def _need(page: PageView, role: str, label: str) -> Element:
    """An element the expert's plan expects on this page (its site always shows it there)."""
    found = page.find(role, label)
    if found is None:
        raise LookupError(f"no {role} {label!r} on page {page.path}")
    return found


class ScriptedTeacher:
    """`EpisodeAwarePolicy`: the harness calls `reset(task)` before each episode."""

    def __init__(self, error_rate: float = 0.0, seed: int = 0):
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        self.error_rate = error_rate
        self.seed = seed
        self.policy_id = f"gui-scripted-teacher-e{error_rate:g}"
        self._task: Task | None = None
        self._episodes = 0
        self._rng = random.Random(seed)

    def reset(self, task: Task) -> None:
        self._task = task
        self._episodes += 1  # repeated attempts at one task (pass@k, RL groups) differ
        self._rng = random.Random(f"{self.seed}:{task.id}:{self._episodes}")

    # -- policy ----------------------------------------------------------------------------------
    def generate(self, messages: list[ChatMessage], config: GenerationConfig) -> Generation:
        if self._task is None:
            raise RuntimeError("ScriptedTeacher.generate called before reset(task); the harness must reset it")
        call = self.next_call(messages)
        text = format_tool_call(call)
        return Generation(text=text, completion_tokens=len(text) // 4, finish_reason="stop")

    @property
    def _current(self) -> Task:
        """The episode's task (set by reset)."""
        if self._task is None:
            raise RuntimeError("ScriptedTeacher used before reset(task); the harness must reset it")
        return self._task

    def next_call(self, messages: list[ChatMessage]) -> ToolCall:
        last = messages[-1] if messages else None
        page = self._latest_page(messages)
        # After an error or with no page seen yet, look before acting.
        if page is None or (last is not None and last.role == "tool" and parse_page(last.content) is None):
            return _call("read_page")
        if self.error_rate and self._rng.random() < self.error_rate:
            return self._mistake(page)
        expected = self._current.verifier.expected
        return {"shop_order": self._shop, "form_submission": self._form, "answer": self._info}[expected["kind"]](
            page, expected
        )

    @staticmethod
    def _latest_page(messages: list[ChatMessage]) -> PageView | None:
        for m in reversed(messages):
            if m.role == "tool" and (page := parse_page(m.content)) is not None:
                return page
        return None

    # -- mistakes --------------------------------------------------------------------------------
    def _mistake(self, page: PageView) -> ToolCall:
        kind = self._current.verifier.expected["kind"]
        # Mostly recoverable slips (a stray click the expert then repairs), sometimes a harmful shortcut:
        # GUI episodes are long (up to ~13 turns), so harmful-only mistakes would leave almost no success.
        if self._rng.random() < 0.75 and page.elements:
            return _call("click", element_id=self._rng.choice(page.elements).id)
        if kind == "shop_order":
            adds = page.find_all("button", prefix="Add ")
            target = f"Add {self._current.verifier.expected['product_name']} to cart"
            wrong = [b for b in adds if b.label != target]
            if wrong:
                return _call("click", element_id=self._rng.choice(wrong).id)
            if (place := page.find("button", "Place order")) is not None:
                return _call("click", element_id=place.id)
        if kind == "form_submission" and (submit := page.find("button", "Submit registration")) is not None:
            return _call("click", element_id=submit.id)
        if kind == "answer":
            cities = [
                c
                for c in self._current.metadata["site"]["cities"]
                if c["name"] != self._current.verifier.expected["city"]
            ]
            q = self._current.verifier.expected["question"]
            city = self._rng.choice(cities)
            return _call("answer", text=str(city["name"] if q == "largest" else city[q]))
        return _call("scroll", direction="down")

    # -- experts ---------------------------------------------------------------------------------
    def _search(self, page: PageView, query: str) -> ToolCall:
        box = page.find("textbox", "Search products")
        if box is None:
            return _call("navigate", url="/")
        if box.value != query:
            return _call("type", element_id=box.id, text=query)
        return _call("click", element_id=_need(page, "button", "Search").id)

    def _shop(self, page: PageView, exp: dict) -> ToolCall:
        if page.path.startswith("/order/"):
            return _call("answer", text="Order placed.")
        if page.path == "/checkout":
            if page.find("button", "Place order") is None:  # empty cart
                return self._search(page, exp["query"])
            for label, want in (("Full name", exp["name"]), ("Address", exp["address"])):
                box = _need(page, "textbox", label)
                if box.value != want:
                    return _call("type", element_id=box.id, text=want)
            ship = _need(page, "select", "Shipping")
            option = next(o for o in ship.options if o.startswith(exp["shipping_label"]))
            if ship.value != option:
                return _call("type", element_id=ship.id, text=option)
            return _call("click", element_id=_need(page, "button", "Place order").id)
        if page.path == "/cart":
            removes = page.find_all("button", prefix="Remove ")
            target = f"Remove {exp['product_name']}"
            wrong = [b for b in removes if b.label != target]
            if wrong:
                return _call("click", element_id=wrong[0].id)
            if len(removes) > 1:  # the right item twice
                return _call("click", element_id=removes[0].id)
            if len(removes) == 1:
                return _call("click", element_id=_need(page, "link", "Proceed to checkout").id)
            return self._search(page, exp["query"])
        if page.path == "/search" and page.query.get("q") == exp["query"]:
            q = page.query
            if q.get("color") == exp["color"] and q.get("sort") == "price_asc":
                add = page.find("button", f"Add {exp['product_name']} to cart")
                if add is not None:
                    return _call("click", element_id=add.id)
            color = _need(page, "select", "Color")
            if color.value != exp["color"].title():
                return _call("type", element_id=color.id, text=exp["color"].title())
            sort = _need(page, "select", "Sort")
            if sort.value != "Price: low to high":
                return _call("type", element_id=sort.id, text="Price: low to high")
            return _call("click", element_id=_need(page, "button", "Apply filters").id)
        return self._search(page, exp["query"])

    def _form(self, page: PageView, exp: dict) -> ToolCall:
        if page.path.startswith("/registered/"):
            return _call("answer", text="Registration submitted.")
        if page.find("button", "Submit registration") is None:
            return _call("navigate", url="/")
        for label in ("Full name", "Email"):
            box = _need(page, "textbox", label)
            want = exp["name" if label == "Full name" else "email"]
            if box.value != want:
                return _call("type", element_id=box.id, text=want)
        ticket = _need(page, "select", "Ticket type")
        if ticket.value != exp["ticket"]:
            return _call("type", element_id=ticket.id, text=exp["ticket"])
        for box in page.find_all("checkbox"):
            want = box.label.removesuffix(" workshop") in exp["workshops"]
            if box.checked != want:
                return _call("click", element_id=box.id)
        comments = _need(page, "textbox", "Comments")
        if comments.value != exp["comments"]:
            return _call("type", element_id=comments.id, text=exp["comments"])
        return _call("click", element_id=_need(page, "button", "Submit registration").id)

    def _info(self, page: PageView, exp: dict) -> ToolCall:
        region_path, city_path = f"/region/{exp['region']}", f"/city/{exp['city'].lower()}"
        if page.path == city_path and exp["question"] != "largest":
            return _call("answer", text=exp["answer"])
        if page.path == region_path:
            if exp["question"] == "largest":
                return _call("answer", text=exp["answer"])
            link = page.find("link", exp["city"])
            if link is not None:
                return _call("click", element_id=link.id)
        if page.path == "/":
            link = page.find("link", f"{exp['region'].title()} region")
            if link is not None:
                return _call("click", element_id=link.id)
        return _call("navigate", url="/")
