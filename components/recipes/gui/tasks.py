"""Seeded GUI tasks: a generated local website plus an open-ended goal on it.

Three families, one per site kind:
- `shop_checkout`: buy the cheapest product of a colour and kind under a budget, check out with a
  given shipping option (search, filters, sorting, cart, checkout form).
- `form_register`: fill a registration form (text fields, a select, checkboxes, a textarea).
- `info_lookup`: find a fact on an information site by browsing and `answer` it.

Every task carries its site data (`metadata["site"]`, what the server renders) and the expected final
state (`verifier.expected`, never shown to the agent). Each split draws from its own seed stream (train
from 0, held-out from 1_000_000, validation from 2_000_000) and keeps only tasks whose unit, the goal with
its expected outcome (`common.goal`), lies in the split's share (`components.core.data.splits.draw`): no seed of
one split can produce another's task, and no goal is asked with the same answer in two splits, whatever
site surrounds it.
"""

from __future__ import annotations

import random
from typing import Any

from components.recipes import common
from components.core.data.schema import EnvironmentSpec, Split, Task, VerifierSpec
from components.core.data.splits import draw, task_content

FAMILIES = ("shop_checkout", "form_register", "info_lookup")
SITE_PORT = 8080
START_URL = f"http://127.0.0.1:{SITE_PORT}/"
_SPLIT_BASE = {"train": 0, "heldout": 1_000_000, "validation": 2_000_000}

COLORS = ["red", "blue", "green", "black", "white", "yellow"]
KINDS = ["mug", "notebook", "lamp", "backpack", "bottle", "scarf", "candle", "umbrella"]
ADJECTIVES = ["Ceramic", "Classic", "Sturdy", "Cozy", "Minimal", "Vintage", "Travel", "Deluxe", "Compact", "Bold"]
FIRST = [
    "Ada",
    "Ben",
    "Chloe",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hugo",
    "Iris",
    "Jonas",
    "Kira",
    "Liam",
    "Mina",
    "Noah",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
]
LAST = [
    "Novak",
    "Okafor",
    "Lindqvist",
    "Moreau",
    "Tanaka",
    "Schmidt",
    "Rossi",
    "Kowalski",
    "Haddad",
    "Nguyen",
    "Silva",
    "Berg",
    "Costa",
    "Fischer",
]
STREETS = ["Oak Street", "Mill Road", "Harbor Lane", "Elm Avenue", "Station Road", "Park Way"]
SHIPPING = [("standard", "Standard", 0.0), ("express", "Express", 9.5), ("overnight", "Overnight", 19.0)]
EVENTS = ["Open Infra Summit", "Data Systems Day", "Agents Conference", "Cloud Native Forum"]
TICKETS = ["Standard", "VIP", "Student"]
WORKSHOPS = ["Kubernetes", "Rust", "PyTorch", "Observability", "Security", "SQL"]
COMMENTS = ["vegetarian meal please", "wheelchair access needed", "arriving late on day one", "need an invoice"]
SYLLABLES = ["ka", "lor", "ven", "mi", "dra", "sel", "tor", "ba", "quen", "ri", "sa", "mon", "el", "thu", "va"]
REGIONS = ["North", "South", "East", "West", "Coastal", "Highland"]


def _person(rng: random.Random) -> tuple[str, str]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return f"{first} {last}", f"{first.lower()}.{last.lower()}@example.org"


def _shop_task(rng: random.Random) -> tuple[dict, str, dict]:
    kind, color = rng.choice(KINDS), rng.choice(COLORS)
    budget = rng.choice([10, 15, 20, 25, 30])
    products: list[dict[str, Any]] = []
    used: set[str] = set()

    def add(c: str, k: str, price: float) -> dict:
        while True:
            name = f"{c.title()} {rng.choice(ADJECTIVES)} {k.title()}"
            if name not in used:
                break
        used.add(name)
        p = {"id": f"p{len(products) + 1:03d}", "name": name, "color": c, "category": k + "s", "price": price}
        products.append(p)
        return p

    # Traps around the target: pricier same-colour items under budget, one over budget, cheaper
    # items of the same kind in other colours, and same-colour items of other kinds.
    target = add(color, kind, round(rng.uniform(0.3, 0.6) * budget, 2))
    for _ in range(2):
        add(color, kind, round(rng.uniform(target["price"] + 0.5, budget - 0.01), 2))
    add(color, kind, round(budget + rng.uniform(1, 10), 2))
    for c in rng.sample([c for c in COLORS if c != color], 3):
        add(c, kind, round(rng.uniform(1.0, target["price"] - 0.1), 2))
    for k in rng.sample([k for k in KINDS if k != kind], 4):
        add(color, k, round(rng.uniform(1.0, budget), 2))
        add(rng.choice(COLORS), k, round(rng.uniform(1.0, 40.0), 2))
    rng.shuffle(products)
    ship_id, ship_label, _ = rng.choice(SHIPPING[1:])
    name, _ = _person(rng)
    address = f"{rng.randint(2, 199)} {rng.choice(STREETS)}"
    site = {
        "site": "shop",
        "title": rng.choice(["Mercato", "Shelfwise", "Goodsly", "Basket & Co"]),
        "products": products,
        "colors": COLORS,
        "categories": sorted({p["category"] for p in products}),
        "shipping": [{"id": i, "label": lbl, "price": pr} for i, lbl, pr in SHIPPING],
    }
    prompt = (
        f"Buy the cheapest {color} {kind} that costs under ${budget} and check out with {ship_label.lower()} "
        f"shipping. Ship it to {name}, {address}. Buy nothing else."
    )
    expected = {
        "kind": "shop_order",
        "product_id": target["id"],
        "product_name": target["name"],
        "query": kind,
        "color": color,
        "shipping": ship_id,
        "shipping_label": ship_label,
        "name": name,
        "address": address,
    }
    return site, prompt, expected


def _form_task(rng: random.Random) -> tuple[dict, str, dict]:
    event = rng.choice(EVENTS)
    workshops = rng.sample(WORKSHOPS, 4)
    chosen = sorted(rng.sample(workshops, 2))
    name, email = _person(rng)
    ticket, comment = rng.choice(TICKETS), rng.choice(COMMENTS)
    site = {
        "site": "forms",
        "title": f"{event} registration",
        "event": event,
        "tickets": TICKETS,
        "workshops": workshops,
    }
    prompt = (
        f"Register {name} ({email}) for {event} with a {ticket} ticket, sign up for the {chosen[0]} and "
        f"{chosen[1]} workshops (no others), and write '{comment}' in the comments."
    )
    expected = {
        "kind": "form_submission",
        "name": name,
        "email": email,
        "ticket": ticket,
        "workshops": chosen,
        "comments": comment,
    }
    return site, prompt, expected


def _info_task(rng: random.Random) -> tuple[dict, str, dict]:
    regions = rng.sample(REGIONS, 3)
    names: set[str] = set()
    cities: list[dict[str, Any]] = []
    for r in regions:
        for _ in range(4):
            while True:
                n = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).title()
                if n not in names:
                    break
            names.add(n)
            cities.append(
                {
                    "name": n,
                    "slug": n.lower(),
                    "region": r.lower(),
                    "population": rng.randint(5_000, 900_000),
                    "founded": rng.randint(1200, 1950),
                    "mayor": _person(rng)[0],
                }
            )
    site = {
        "site": "info",
        "title": "City directory",
        "cities": cities,
        "regions": [{"name": r, "slug": r.lower()} for r in regions],
    }
    question = rng.choice(["founded", "mayor", "largest"])
    if question == "largest":
        region = rng.choice(regions)
        best = max((c for c in cities if c["region"] == region.lower()), key=lambda c: c["population"])
        prompt = f"Which city in the {region} region has the largest population? Answer with the city name."
        expected = {
            "kind": "answer",
            "question": question,
            "answer": best["name"],
            "region": region.lower(),
            "city": best["name"],
        }
    else:
        city = rng.choice(cities)
        what = (
            "In which year was {} founded? Answer with the year."
            if question == "founded"
            else "Who is the mayor of {}? Answer with their full name."
        )
        prompt = what.format(city["name"])
        expected = {
            "kind": "answer",
            "question": question,
            "answer": str(city[question]),
            "region": city["region"],
            "city": city["name"],
        }
    return site, prompt, expected


_BUILDERS = {"shop_checkout": _shop_task, "form_register": _form_task, "info_lookup": _info_task}

DIFFICULTY = {"info_lookup": 1, "form_register": 2, "shop_checkout": 3}


def families_at(families: tuple[str, ...], difficulty: int | list[int] | None) -> tuple[str, ...]:
    """The families of `families` at the given difficulty level(s); all of them for None."""
    return common.families_at(families, difficulty, DIFFICULTY)


def generate_tasks(split: Split, n: int, seed: int = 0, families: tuple[str, ...] = FAMILIES) -> list[Task]:
    """`n` tasks cycling through `families`; the same (split, n, seed) always gives the same tasks."""
    unknown = set(families) - set(_BUILDERS)
    if unknown:
        raise ValueError(f"unknown GUI task families {sorted(unknown)}; choose from {list(FAMILIES)}")

    def candidate(i: int, attempt: int) -> Task:
        family = families[i % len(families)]
        task_seed = _SPLIT_BASE[split] + seed * 10_000 + i
        tag = f"{task_seed}:{attempt}" if attempt else str(task_seed)
        site, prompt, expected = _BUILDERS[family](random.Random(f"gui:{family}:{tag}"))
        return Task(
            id=f"gui-{split}-{family}-{tag.replace(':', '-')}",
            recipe="gui",
            split=split,
            family=family,
            seed=task_seed,
            prompt=f"{prompt}\nThe browser is open at {START_URL}",
            environment=EnvironmentSpec(workdir="/workspace", network="loopback", memory_mb=2048, cpu=1.0),
            verifier=VerifierSpec(kind="python", expected=expected, timeout_seconds=30.0),
            difficulty=DIFFICULTY[family],
            metadata={"site": site, "start_url": START_URL},
        )

    return draw(candidate, split, n, content=content, unit=common.goal)


def content(task: Task) -> dict:
    """What the agent is given: the goal and the site."""
    return task_content(task, site=task.metadata["site"])
