"""Programmatic verifiers on the final site state (`state.json` written by the site server) and the
agent's answer. Pure functions, so they are tested on hand-built states without a browser.
"""

from __future__ import annotations

import re

from components.core.recipe_base import VerifyResult
from components.recipes.common import checklist_result as _result
from components.recipes.common import normalize_text as _norm


def verify_shop(state: dict, expected: dict) -> VerifyResult:
    orders = state.get("orders", [])
    order = orders[0] if len(orders) == 1 else {}
    return _result([
        (f"exactly one order placed (found {len(orders)})", len(orders) == 1),
        (f"order contains only {expected['product_name']} ({expected['product_id']})",
         order.get("items") == [expected["product_id"]]),
        (f"shipping is {expected['shipping']}", order.get("shipping") == expected["shipping"]),
        ("ship-to name matches", _norm(order.get("name")) == _norm(expected["name"])),
        ("ship-to address matches", _norm(order.get("address")) == _norm(expected["address"])),
    ])


def verify_form(state: dict, expected: dict) -> VerifyResult:
    subs = state.get("submissions", [])
    sub = subs[0] if len(subs) == 1 else {}
    return _result([
        (f"exactly one registration submitted (found {len(subs)})", len(subs) == 1),
        ("name matches", _norm(sub.get("name")) == _norm(expected["name"])),
        ("email matches", (sub.get("email") or "").strip().lower() == expected["email"].lower()),
        (f"ticket is {expected['ticket']}", sub.get("ticket") == expected["ticket"]),
        (f"workshops are {expected['workshops']}", sorted(sub.get("workshops") or []) == sorted(expected["workshops"])),
        ("comments mention the request", _norm(expected["comments"]) in _norm(sub.get("comments"))),
    ])


def verify_answer(final_answer: str | None, expected: dict) -> VerifyResult:
    want = _norm(expected["answer"]).replace(" ", "")
    # Numbers may be written with separators ("1,204"); names must appear as whole words.
    got_compact = _norm(final_answer).replace(" ", "")
    ok = bool(final_answer) and (re.search(rf"(^|\D){re.escape(want)}(\D|$)", got_compact) is not None
                                 if want.isdigit() else f" {_norm(expected['answer'])} " in f" {_norm(final_answer)} ")
    return _result([(f"answer contains {expected['answer']!r} (got {final_answer!r})", ok)])


def verify_state(state: dict, final_answer: str | None, expected: dict) -> VerifyResult:
    kind = expected.get("kind")
    if kind == "shop_order":
        return verify_shop(state, expected)
    if kind == "form_submission":
        return verify_form(state, expected)
    if kind == "answer":
        return verify_answer(final_answer, expected)
    raise ValueError(f"unknown GUI verifier kind {kind!r}; expected shop_order, form_submission or answer")
