"""GUI task generation and verifiers on hand-built site states (no browser)."""

from __future__ import annotations

import pytest

from components.recipes import get_recipe
from components.recipes.gui.page import parse_page
from components.recipes.gui.tasks import FAMILIES, generate_tasks
from components.recipes.gui.verify import verify_answer, verify_form, verify_shop, verify_state


def test_tasks_are_deterministic_seed_disjoint_and_cover_families():
    recipe = get_recipe("gui")
    train, again = recipe.tasks("train", 6, seed=0), recipe.tasks("train", 6, seed=0)
    heldout = recipe.tasks("heldout", 6, seed=0)
    assert [t.model_dump() for t in train] == [t.model_dump() for t in again]
    assert {t.family for t in train} == set(FAMILIES)
    assert not {t.id for t in train} & {t.id for t in heldout}
    assert {t.prompt for t in train}.isdisjoint({t.prompt for t in heldout})
    assert all(t.split == "heldout" and t.environment.network == "loopback" for t in heldout)
    # `difficulty` (what provision passes) keeps the families at those levels.
    assert {t.family for t in get_recipe("gui", difficulty=[1, 2]).tasks("train", 4)} == {
        "info_lookup",
        "form_register",
    }
    with pytest.raises(ValueError, match="no task family at difficulty"):
        get_recipe("gui", difficulty=9).tasks("train", 1)


def test_shop_target_is_the_unique_cheapest_matching_product_under_budget():
    for task in generate_tasks("train", 12, families=("shop_checkout",)):
        exp, products = task.verifier.expected, task.metadata["site"]["products"]
        budget = float(task.prompt.split("under $")[1].split()[0])
        matching = [
            p
            for p in products
            if p["color"] == exp["color"] and p["category"] == exp["query"] + "s" and p["price"] < budget
        ]
        cheapest = min(matching, key=lambda p: p["price"])
        assert cheapest["id"] == exp["product_id"]
        assert sum(p["price"] == cheapest["price"] for p in matching) == 1
        # Traps exist: a cheaper product of the same kind in another colour.
        assert any(
            p["category"] == exp["query"] + "s" and p["color"] != exp["color"] and p["price"] < cheapest["price"]
            for p in products
        )


def _shop_expected():
    return {
        "kind": "shop_order",
        "product_id": "p003",
        "product_name": "Red Classic Mug",
        "shipping": "express",
        "name": "Ada Novak",
        "address": "12 Oak Street",
    }


def test_verify_shop_on_hand_built_states():
    exp = _shop_expected()
    good = {"orders": [{"items": ["p003"], "shipping": "express", "name": "Ada Novak", "address": "12 Oak street"}]}
    assert verify_shop(good, exp).resolved
    for bad in (
        {"orders": []},
        {
            "orders": [
                {"items": ["p003", "p004"], "shipping": "express", "name": "Ada Novak", "address": "12 Oak Street"}
            ]
        },
        {"orders": [{"items": ["p003"], "shipping": "standard", "name": "Ada Novak", "address": "12 Oak Street"}]},
        {"orders": [{"items": ["p003"], "shipping": "express", "name": "Ada", "address": "12 Oak Street"}]},
        {"orders": good["orders"] * 2},
    ):
        result = verify_shop(bad, exp)
        assert not result.resolved and result.reason and result.report.failed >= 1


def test_verify_form_and_answer():
    exp = {
        "kind": "form_submission",
        "name": "Ben Berg",
        "email": "ben.berg@example.org",
        "ticket": "VIP",
        "workshops": ["Rust", "SQL"],
        "comments": "need an invoice",
    }
    sub = {
        "name": "Ben Berg",
        "email": "Ben.Berg@example.org",
        "ticket": "VIP",
        "workshops": ["SQL", "Rust"],
        "comments": "Hi, I need an invoice.",
    }
    assert verify_form({"submissions": [sub]}, exp).resolved
    assert not verify_form({"submissions": [{**sub, "workshops": ["Rust"]}]}, exp).resolved
    assert not verify_form({"submissions": [sub, sub]}, exp).resolved
    assert not verify_form({"submissions": []}, exp).resolved
    year = {"kind": "answer", "answer": "1616"}
    assert verify_answer("It was founded in 1616.", year).resolved
    assert not verify_answer("16160", year).resolved and not verify_answer(None, year).resolved
    city = {"kind": "answer", "answer": "Kalor"}
    assert verify_state({}, "kalor", city).resolved and not verify_state({}, "Kalorven", city).resolved
    with pytest.raises(ValueError, match="unknown GUI verifier kind"):
        verify_state({}, None, {"kind": "nope"})


def test_parse_page_reads_elements_values_and_options():
    text = (
        "URL: http://127.0.0.1:8080/search?q=mug&color=red\nTitle: Results\n"
        '[1] link "Home" [2] textbox "Search products" value="mu\\"g" [3] button "Search"\n'
        '[4] select "Color" value="Red" options=["Any color","Red"] [5] checkbox "Rust workshop" checked=true'
    )
    page = parse_page(text)
    assert page.path == "/search" and page.query == {"q": "mug", "color": "red"}
    assert page.find("textbox", "Search products").value == 'mu"g'
    assert page.find("select", "Color").options == ["Any color", "Red"]
    assert page.find("checkbox").checked is True and page.find("button", "Search").id == 3
    assert parse_page("Error: no element") is None
