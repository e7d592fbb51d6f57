"""Programmatic verifiers on the final site state (`state.json` written by the site server) and the
agent's answer. Pure functions, so they are tested on hand-built states without a browser.

The rule (verifier `gui-site-state`, version `VERSION`):

- Site tasks are judged on the server's state only, which only the site's own POST handlers change:
  the site serves no JavaScript, the policy has no shell, `navigate` opens only http(s) pages of
  127.0.0.1/localhost, and the state file lives outside what any page or form can address.
- A missing or unreadable state file after the episode gives no verdict; it is the infrastructure's
  only when the one rule says so (`core/episode/blame.py`: the service reports the sandbox lost, or the
  pristine site's own state cannot be read in a fresh sandbox either), never on the recipe's say-so.
- Every field is checked exactly (after normalising case, punctuation and spacing): the order's items,
  shipping, name and address; the form's name, email, ticket and workshops. Free-text comments must
  carry the requested text and none of the other requests a task can ask for, so comments that hold
  every candidate never pass.
- Answer tasks need one answer equal to the expected one after normalisation (`common.one_answer`):
  an answer that lists every candidate fails.
"""

from __future__ import annotations

from components.core.episode.recipe_base import VerifyResult
from components.recipes.common import checklist_result as _result
from components.recipes.common import normalize_text as _norm
from components.recipes.common import one_answer
from components.recipes.gui.tasks import COMMENTS

NAME = "gui-site-state"
VERSION = "3"  # 1: answers checked by containment; 2: comments by containment


def verify_shop(state: dict, expected: dict) -> VerifyResult:
    orders = state.get("orders", [])
    order = orders[0] if len(orders) == 1 else {}
    return _result(
        [
            (f"exactly one order placed (found {len(orders)})", len(orders) == 1),
            (
                f"order contains only {expected['product_name']} ({expected['product_id']})",
                order.get("items") == [expected["product_id"]],
            ),
            (f"shipping is {expected['shipping']}", order.get("shipping") == expected["shipping"]),
            ("ship-to name matches", _norm(order.get("name")) == _norm(expected["name"])),
            ("ship-to address matches", _norm(order.get("address")) == _norm(expected["address"])),
        ]
    )


def verify_form(state: dict, expected: dict) -> VerifyResult:
    subs = state.get("submissions", [])
    sub = subs[0] if len(subs) == 1 else {}
    return _result(
        [
            (f"exactly one registration submitted (found {len(subs)})", len(subs) == 1),
            ("name matches", _norm(sub.get("name")) == _norm(expected["name"])),
            ("email matches", (sub.get("email") or "").strip().lower() == expected["email"].lower()),
            (f"ticket is {expected['ticket']}", sub.get("ticket") == expected["ticket"]),
            (
                f"workshops are {expected['workshops']}",
                sorted(sub.get("workshops") or []) == sorted(expected["workshops"]),
            ),
            (
                f"comments give {expected['comments']!r} and no other request",
                _one_request(sub.get("comments"), expected),
            ),
        ]
    )


def _one_request(comments: str | None, expected: dict) -> bool:
    """The comments carry the requested text and none of the other requests a form task can ask for."""
    text = _norm(comments)
    others = [c for c in COMMENTS if _norm(c) != _norm(expected["comments"])]
    return _norm(expected["comments"]) in text and not any(_norm(c) in text for c in others)


def verify_answer(final_answer: str | None, expected: dict) -> VerifyResult:
    ok, compared = one_answer(final_answer, expected["answer"])
    return _result([(f"one answer, {expected['answer']!r} (got {final_answer!r}: {compared})", ok)])


def verify_state(state: dict, final_answer: str | None, expected: dict) -> VerifyResult:
    kind = expected.get("kind")
    if kind == "shop_order":
        return verify_shop(state, expected)
    if kind == "form_submission":
        return verify_form(state, expected)
    if kind == "answer":
        return verify_answer(final_answer, expected)
    raise ValueError(f"unknown GUI verifier kind {kind!r}; expected shop_order, form_submission or answer")
