"""A seeded assistant world: the owner, contacts, background mail, calendar, notes and files.

Task families (`tasks.py`) add the items their goal is about on top of this background, so every
task has distractors: other threads, other people's proposals, other events and files.
"""

from __future__ import annotations

import random
from typing import Any

FIRST = [
    "Alice",
    "Bob",
    "Carol",
    "Dave",
    "Erin",
    "Frank",
    "Grace",
    "Heidi",
    "Ivan",
    "Judy",
    "Mallory",
    "Niaj",
    "Olivia",
    "Peggy",
    "Rupert",
    "Sybil",
    "Trent",
    "Victor",
    "Wendy",
    "Yusuf",
]
LAST = [
    "Nakamura",
    "Okoye",
    "Petrov",
    "Quintero",
    "Ramirez",
    "Svensson",
    "Thompson",
    "Ueda",
    "Varga",
    "Weiss",
    "Xu",
    "Yilmaz",
    "Zielinski",
    "Abara",
    "Becker",
]
COMPANIES = ["acme", "globex", "initech", "umbrella", "hooli"]
TOPICS = [
    "offsite",
    "roadmap review",
    "budget sync",
    "launch retro",
    "hiring plan",
    "security audit",
    "design review",
    "quarterly planning",
]
NOW = "2026-03-02 09:00"


def random_date(rng: random.Random, month: int, day_range: tuple[int, int]) -> str:
    return f"2026-{month:02d}-{rng.randint(*day_range):02d}"


def random_time(rng: random.Random) -> str:
    return f"{rng.choice([9, 10, 11, 13, 14, 15, 16]):02d}:{rng.choice(['00', '30'])}"


def build_world(rng: random.Random, n_contacts: int = 8) -> dict[str, Any]:
    """The background world; `world["contacts"]` have distinct first names (tasks refer to them by it)."""
    firsts = rng.sample(FIRST, n_contacts)
    contacts = []
    for first in firsts:
        last, company = rng.choice(LAST), rng.choice(COMPANIES)
        contacts.append(
            {
                "name": f"{first} {last}",
                "email": f"{first.lower()}.{last.lower()}@{company}.test",
                "phone": f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
                "company": company,
            }
        )
    owner = "sam.rivera@orchard.test"
    world: dict[str, Any] = {
        "owner": owner,
        "now": NOW,
        "contacts": contacts,
        "mail": [],
        "events": [],
        "notes": [],
        "files": {},
    }
    for i, topic in enumerate(rng.sample(TOPICS, 3)):  # background threads
        a, b = rng.sample(contacts, 2)
        add_mail(
            world,
            thread_id=f"bg{i}",
            sender=a["email"],
            to=[owner, b["email"]],
            subject=topic.title(),
            body=f"Quick note on the {topic}: {rng.choice(['draft attached', 'see agenda', 'numbers updated'])}.",
            date=f"{random_date(rng, 2, (1, 26))} {random_time(rng)}",
        )
    for _ in range(3):
        topic, who = rng.choice(TOPICS), rng.sample(contacts, 2)
        world["events"].append(
            {
                "title": topic.title(),
                "start": f"{random_date(rng, 3, (3, 27))} {random_time(rng)}",
                "duration_min": rng.choice([30, 60]),
                "attendees": [w["email"] for w in who],
            }
        )
    world["notes"].append({"title": "Groceries", "body": "milk, coffee, oats"})
    world["files"]["notes/todo.txt"] = "renew passport\nbook dentist\n"
    return world


def add_mail(
    world: dict,
    *,
    thread_id: str,
    sender: str,
    to: list[str],
    subject: str,
    body: str,
    date: str,
    cc: list[str] | None = None,
) -> int:
    mid = len(world["mail"]) + 1
    world["mail"].append(
        {
            "id": mid,
            "thread_id": thread_id,
            "sender": sender,
            "to": to,
            "cc": cc or [],
            "subject": subject,
            "body": body,
            "date": date,
        }
    )
    return mid


def finalize(world: dict) -> dict:
    """Re-number mail by date so ids carry no hint of which message the task is about."""
    world["mail"].sort(key=lambda m: (m["date"], m["id"]))
    for i, m in enumerate(world["mail"], start=1):
        m["id"] = i
    return world
