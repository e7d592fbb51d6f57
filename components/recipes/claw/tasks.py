"""Seeded Claw tasks: a personal-assistant goal over a generated world.

Families:
- `schedule_from_thread`: find a person's latest email about a topic and put the meeting it
  proposes on the calendar, inviting everyone on the thread (earlier proposals and the person's
  other mail are distractors).
- `email_contact`: email one contact another contact's phone number.
- `note_from_file`: read a report file and save its total in a note.
- `calendar_answer`: answer when a given meeting starts (a question, checked on the answer).

Each task carries its world (`metadata["world"]`, loaded into sqlite at setup), the expected end
state (`verifier.expected`), and the reference plan (`metadata["plan"]`: the API calls that solve
it, which the scripted teachers render for their harness). Splits are drawn as in GUI: own seed streams, and
only tasks whose unit (the goal with its expected outcome, `common.goal`) lies in the split's share
(`components.core.data.splits.draw`).
"""

from __future__ import annotations

import random

from components.recipes import common
from components.core.data.schema import EnvironmentSpec, Split, Task, VerifierSpec
from components.core.data.splits import draw, task_content
from components.recipes.claw.world import add_mail, build_world, finalize, random_date, random_time

FAMILIES = ("schedule_from_thread", "email_contact", "note_from_file", "calendar_answer")
_SPLIT_BASE = {"train": 0, "heldout": 1_000_000, "validation": 2_000_000}
REPORTS = ["q3-budget", "travel-expenses", "hardware-order", "team-offsite", "cloud-costs"]


def _first(c: dict) -> str:
    return c["name"].split()[0]


def _schedule(rng: random.Random, world: dict) -> tuple[str, dict, list]:
    org, o1, o2 = rng.sample(world["contacts"], 3)
    used = {m["subject"].lower() for m in world["mail"]}
    topic = rng.choice(
        [
            t
            for t in ("offsite", "roadmap review", "budget sync", "launch retro", "hiring plan", "security audit")
            if t not in used
        ]
    )
    title, owner = topic.title(), world["owner"]
    everyone = [org["email"], o1["email"], o2["email"]]
    first, (d1, d2, d3) = random_date(rng, 2, (10, 14)), sorted(rng.sample(range(15, 25), 3))
    proposals = [(f"2026-03-{day:02d}", random_time(rng)) for day in rng.sample(range(3, 28), 3)]
    add_mail(
        world,
        thread_id="th",
        sender=o1["email"],
        to=[owner, org["email"]],
        cc=[o2["email"]],
        subject=title,
        body=f"Can we meet on {proposals[0][0]} at {proposals[0][1]} for the {topic}?",
        date=f"{first} {random_time(rng)}",
    )
    add_mail(
        world,
        thread_id="th",
        sender=org["email"],
        to=[owner, o1["email"], o2["email"]],
        subject=f"Re: {title}",
        body=f"That day is bad for me. How about {proposals[1][0]} at {proposals[1][1]} for the {topic}?",
        date=f"2026-02-{d1:02d} {random_time(rng)}",
    )
    add_mail(
        world,
        thread_id="th",
        sender=org["email"],
        to=[owner, o1["email"], o2["email"]],
        subject=f"Re: {title}",
        body=f"Update on the {topic}: let's make it {proposals[2][0]} at {proposals[2][1]}, 60 minutes.",
        date=f"2026-02-{d2:02d} {random_time(rng)}",
    )
    other = rng.choice([t for t in ("design review", "quarterly planning") if t != topic])
    add_mail(
        world,
        thread_id="th-other",
        sender=org["email"],
        to=[owner],
        subject=other.title(),
        body=f"For the {other}, could we do 2026-03-{rng.randint(3, 27):02d} at {random_time(rng)}?",
        date=f"2026-02-{d3:02d} {random_time(rng)}",
    )
    finalize(world)
    latest = max(
        (m for m in world["mail"] if m["thread_id"] == "th" and m["sender"] == org["email"]), key=lambda m: m["date"]
    )
    start = f"{proposals[2][0]} {proposals[2][1]}"
    prompt = (
        f"Find {_first(org)}'s latest email about the {topic} and add the meeting it proposes to my calendar "
        f"as '{title}', inviting everyone on the thread."
    )
    expected = {"kind": "event", "title": title, "start": start, "attendees": sorted(everyone)}
    plan = [
        ("mail_search", {"sender": _first(org).lower(), "query": topic}),
        ("mail_read", {"id": latest["id"]}),
        ("calendar_create", {"title": title, "start": start, "duration_min": 60, "attendees": everyone}),
    ]
    return prompt, expected, plan


def _email_contact(rng: random.Random, world: dict) -> tuple[str, dict, list]:
    who, to = rng.sample(world["contacts"], 2)
    finalize(world)
    prompt = f"Send {_first(to)} an email with {_first(who)}'s phone number."
    expected = {"kind": "sent_mail", "to": [to["email"]], "body_contains": who["phone"]}
    plan = [
        ("contacts_search", {"query": _first(who)}),
        ("contacts_search", {"query": _first(to)}),
        (
            "mail_send",
            {
                "to": [to["email"]],
                "subject": f"{_first(who)}'s phone number",
                "body": f"{who['name']}'s phone number is {who['phone']}.",
            },
        ),
    ]
    return prompt, expected, plan


def _note_from_file(rng: random.Random, world: dict) -> tuple[str, dict, list]:
    name, other = rng.sample(REPORTS, 2)
    totals = {}
    for report in (name, other):
        items = [
            (w, rng.randint(20, 900))
            for w in rng.sample(["travel", "food", "hotel", "licenses", "hardware", "training", "misc"], 3)
        ]
        totals[report] = sum(v for _, v in items)
        world["files"][f"reports/{report}.txt"] = (
            "".join(f"{w}: ${v}\n" for w, v in items) + f"Total: ${totals[report]}\n"
        )
    finalize(world)
    title = f"{name.replace('-', ' ').title()} total"
    path = f"reports/{name}.txt"
    prompt = f"Read {path} and save a note titled '{title}' with the total amount from the file."
    expected = {"kind": "note", "title": title, "body_contains": str(totals[name])}
    plan = [
        ("files_list", {"prefix": "reports/"}),
        ("files_read", {"path": path}),
        ("notes_create", {"title": title, "body": f"Total: ${totals[name]}"}),
    ]
    return prompt, expected, plan


def _calendar_answer(rng: random.Random, world: dict) -> tuple[str, dict, list]:
    day = f"2026-03-{rng.randint(3, 27):02d}"
    titles = rng.sample(["1:1 with manager", "Dentist", "Vendor call", "Team lunch", "Interview loop"], 2)
    times = rng.sample(["09:30", "11:00", "13:30", "15:00", "16:30"], 2)
    for t, hhmm in zip(titles, times):
        world["events"].append(
            {
                "title": t,
                "start": f"{day} {hhmm}",
                "duration_min": 30,
                "attendees": [rng.choice(world["contacts"])["email"]],
            }
        )
    finalize(world)
    prompt = f"What time does my '{titles[0]}' meeting on {day} start? Answer with the time as HH:MM."
    expected = {"kind": "answer", "answer": times[0]}
    return prompt, expected, [("calendar_list", {"date": day})]


_BUILDERS = {
    "schedule_from_thread": _schedule,
    "email_contact": _email_contact,
    "note_from_file": _note_from_file,
    "calendar_answer": _calendar_answer,
}
_FINAL = {
    "schedule_from_thread": "Added the meeting to your calendar.",
    "email_contact": "Email sent.",
    "note_from_file": "Note saved.",
}

DIFFICULTY = {"calendar_answer": 1, "email_contact": 2, "note_from_file": 2, "schedule_from_thread": 3}


def families_at(families: tuple[str, ...], difficulty: int | list[int] | None) -> tuple[str, ...]:
    """The families of `families` at the given difficulty level(s); all of them for None."""
    return common.families_at(families, difficulty, DIFFICULTY)


def generate_tasks(split: Split, n: int, seed: int = 0, families: tuple[str, ...] = FAMILIES) -> list[Task]:
    unknown = set(families) - set(_BUILDERS)
    if unknown:
        raise ValueError(f"unknown Claw task families {sorted(unknown)}; choose from {list(FAMILIES)}")

    def candidate(i: int, attempt: int) -> Task:
        family = families[i % len(families)]
        task_seed = _SPLIT_BASE[split] + seed * 10_000 + i
        tag = f"{task_seed}:{attempt}" if attempt else str(task_seed)
        rng = random.Random(f"claw:{family}:{tag}")
        world = build_world(rng)
        prompt, expected, plan = _BUILDERS[family](rng, world)
        final = expected["answer"] if expected["kind"] == "answer" else _FINAL[family]
        return Task(
            id=f"claw-{split}-{family}-{tag.replace(':', '-')}",
            recipe="claw",
            split=split,
            family=family,
            seed=task_seed,
            prompt=prompt,
            environment=EnvironmentSpec(workdir="/workspace", network="none", memory_mb=512, cpu=1.0),
            verifier=VerifierSpec(kind="python", expected=expected, timeout_seconds=30.0),
            difficulty=DIFFICULTY[family],
            metadata={"world": world, "plan": [{"name": n_, "arguments": a} for n_, a in plan], "final_answer": final},
        )

    return draw(candidate, split, n, content=content, unit=common.goal)


def content(task: Task) -> dict:
    """What the agent is given: the goal and the world."""
    return task_content(task, world=task.metadata["world"])
