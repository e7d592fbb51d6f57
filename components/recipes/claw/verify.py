"""Verifiers on the assistant's final state and answer.

The rule (verifier `claw-journal-replay`, version `VERSION`): every Claw task means "use the
assistant's tools", in both harnesses. So the judged state is never the sandbox's `state.db`: it is
the task's world rebuilt on the host by the verifier's own copy of `claw.py`, with the journal of
state-changing API calls (`journal.jsonl`, appended by the tools) replayed through the same API and
its argument checks. Writing `state.db` directly (the shell harness can), deleting or corrupting it,
or editing the sandbox's `claw.py` changes nothing judged; such divergences are recorded as ignored.
A missing journal means no change was made; journal lines that are not a valid state-changing call
are rejected (recorded as ignored), whatever they hold (deep nesting, wrong types, huge lines). A
journal over `MAX_JOURNAL_BYTES` is the policy's failure (unresolved); a replay that fails or runs past
`REPLAY_TIMEOUT_SECONDS` gives no verdict, and the one rule (`core/episode/blame.py`) makes it the
infrastructure's only when the pristine world's own verification fails in a fresh sandbox too.

On the rebuilt state, only rows with origin 'user' (what the agent created) count as the agent's
changes, so a task fails both when the right change is missing and when a wrong one was made
alongside it. Checks are exact: the event's title and attendees, the mail's recipients, the note's
title; the one fact a body must carry (a note's total, a mail's phone number) and every answer follow
the one-answer rule (`common.one_answer`): every number or phone number the text mentions must be the
expected one, so a body listing every candidate never passes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from components.core.data.schema import IgnoredPart

from components.core.episode.recipe_base import VerifyResult
from components.recipes.common import checklist_result as _result
from components.recipes.common import normalize_text as _norm
from components.recipes.common import one_answer

NAME = "claw-journal-replay"
VERSION = "3"  # 1: the sandbox's state.db as read back, answers checked by containment; 2: bodies by containment
# Compared between the sandbox's state.db and the rebuilt one (mail.thread_id holds a process id).
_COLUMNS = {
    "contacts": "email, name, phone, company",
    "events": "title, start, duration_min, attendees, origin",
    "mail": "sender, recipients, cc, subject, body, date, folder, origin",
    "notes": "title, body, origin",
    "files": "path, content, origin",
}


class ReplayError(RuntimeError):
    """The rebuild of the state failed (no verdict: whose failure, the one rule decides)."""


REPLAY_TIMEOUT_SECONDS = 60.0  # one replay of a journal; beyond it the replay is a failure
DUMP_TIMEOUT_SECONDS = 10.0  # reading the agent's state.db; beyond it the file counts as unreadable

# Every compared table of a database as sorted row reprs (read-only), stopped by sqlite at `deadline`.
_DUMP = """
import json, sqlite3, sys, time

def dump(path, cols, deadline):
    db = sqlite3.connect("file:" + path + "?mode=ro", uri=True)
    db.set_progress_handler(lambda: time.monotonic() > deadline, 10000)
    try:
        return {t: sorted(repr(r)[:10000] for r in db.execute("SELECT " + c + " FROM " + t).fetchmany(100000))
                for t, c in cols.items()}
    finally:
        db.close()
"""
# The replay child: claw.py's own `replay`, then (optionally) the agent's state.db read under its own
# deadline. The agent's database is SQL the agent wrote (its "tables" may be views that never end), so
# it is only ever read here, in a child process with a time limit, never in the host process.
_REPLAY = (
    _DUMP
    + """
import runpy
claw = runpy.run_path(sys.argv[1])
print(json.dumps(claw["replay"](sys.argv[2], sys.argv[3])), flush=True)
if len(sys.argv) > 5:
    deadline = time.monotonic() + float(sys.argv[5])
    try:
        rows = {"rows": dump(sys.argv[4], json.loads(sys.argv[6]), deadline)}
    except Exception as exc:
        late = time.monotonic() > deadline
        rows = {"error": "reading it took over " + sys.argv[5] + "s" if late else (type(exc).__name__ + ": " + str(exc))[:200]}
    print(json.dumps(rows), flush=True)
"""
)


@dataclass
class Replayed:
    """The rebuilt database, the journal lines rejected, and the agent's own state.db as read (or why not)."""

    db: str
    rejected: list[IgnoredPart]
    agent_rows: dict[str, list[str]] | None = None
    agent_error: str | None = None


def replay_journal(world: dict, journal: bytes, directory: str | Path, agent_db: str | None = None) -> Replayed:
    """Rebuild the state from `world` and `journal` in `directory` (on the host, with the package's own
    claw.py, in a child process); with `agent_db`, the same child then reads that copy of the agent's database."""
    directory = Path(directory)
    seed, journal_path, db = directory / "seed.json", directory / "journal.jsonl", directory / "state.db"
    seed.write_text(json.dumps(world))
    journal_path.write_bytes(journal)
    claw_py = resources.files("components.recipes.claw.sandbox").joinpath("claw.py")
    env = {"CLAW_DB": str(db), "CLAW_JOURNAL": str(directory / "unused.jsonl"), "PATH": os.environ.get("PATH", "")}
    argv = [sys.executable, "-I", "-S", "-c", _REPLAY, str(claw_py), str(seed), str(journal_path)]
    if agent_db is not None:
        argv += [agent_db, str(DUMP_TIMEOUT_SECONDS), json.dumps(_COLUMNS)]
    try:
        res = subprocess.run(
            argv,
            capture_output=True,
            env=env,
            check=False,
            timeout=REPLAY_TIMEOUT_SECONDS + (DUMP_TIMEOUT_SECONDS if agent_db else 0),
        )
        out, code = res.stdout, res.returncode
    except subprocess.TimeoutExpired as exc:
        out, code = exc.stdout or b"", None
    lines = out.decode("utf-8", "replace").splitlines()
    try:
        replayed = json.loads(lines[0])
    except (IndexError, ValueError):
        if code is None:
            raise ReplayError(f"claw.py replay ran past {REPLAY_TIMEOUT_SECONDS:g}s") from None
        raise ReplayError(f"claw.py replay exited {code}: {out.decode('utf-8', 'replace')[-300:]}") from None
    result = Replayed(
        str(db),
        [
            IgnoredPart(path=f"journal.jsonl:{r['line']}", reason=f"rejected: {r['error']}")
            for r in replayed["rejected"]
        ],
    )
    if agent_db is not None:
        try:
            read = json.loads(lines[1])
        except (IndexError, ValueError):
            read = {"error": f"reading it took over {DUMP_TIMEOUT_SECONDS:g}s" if code is None else f"exit {code}"}
        result.agent_rows, result.agent_error = read.get("rows"), read.get("error")
    return result


def state_divergence(replayed: Replayed, agent_db_present: bool) -> list[IgnoredPart]:
    """What the sandbox's own state.db holds beyond the tools' journal (ignored by verification)."""
    if not agent_db_present:
        return [IgnoredPart(path="state.db", reason="deleted or unreadable; the state is rebuilt from the journal")]
    theirs = replayed.agent_rows
    if theirs is None or set(theirs) != set(_COLUMNS):
        return [
            IgnoredPart(
                path="state.db", reason=f"corrupt ({replayed.agent_error}); the state is rebuilt from the journal"
            )
        ]
    ns: dict = {}
    exec(_DUMP, ns)  # our own code, on the database we rebuilt
    ours = ns["dump"](replayed.db, _COLUMNS, float("inf"))
    return [
        IgnoredPart(
            path=f"state.db:{t}",
            reason="rows changed outside the assistant's tools "
            f"({len(theirs[t])} rows vs {len(ours[t])} from the journal)",
        )
        for t in _COLUMNS
        if theirs[t] != ours[t]
    ]


def verify_db(db_path: str, expected: dict, final_answer: str | None) -> VerifyResult:
    """Check the database at `db_path` (a host-side copy) against the task's expected state."""
    kind = expected.get("kind")
    db = sqlite3.connect(db_path)
    try:
        if kind == "event":
            rows = db.execute("SELECT title, start, attendees FROM events WHERE origin='user'").fetchall()
            ev = rows[0] if len(rows) == 1 else ("", "", "[]")
            attendees = sorted(a.strip().lower() for a in json.loads(ev[2] or "[]"))
            return _result(
                [
                    (f"exactly one event created (found {len(rows)})", len(rows) == 1),
                    (f"title is {expected['title']!r}", _norm(expected["title"]) == _norm(ev[0])),
                    (f"starts at {expected['start']}", ev[1] == expected["start"]),
                    (
                        f"attendees are {expected['attendees']} (got {attendees})",
                        attendees == sorted(a.lower() for a in expected["attendees"]),
                    ),
                ]
            )
        if kind == "sent_mail":
            rows = db.execute("SELECT recipients, body FROM mail WHERE origin='user' AND folder='sent'").fetchall()
            msg = rows[0] if len(rows) == 1 else ("[]", "")
            to = sorted(a.strip().lower() for a in json.loads(msg[0]))
            return _result(
                [
                    (f"exactly one email sent (found {len(rows)})", len(rows) == 1),
                    (f"sent to {expected['to']} (got {to})", to == sorted(a.lower() for a in expected["to"])),
                    (
                        f"body gives {expected['body_contains']!r} and no other phone number",
                        one_answer(msg[1], expected["body_contains"])[0],
                    ),
                ]
            )
        if kind == "note":
            rows = db.execute("SELECT title, body FROM notes WHERE origin='user'").fetchall()
            note = rows[0] if len(rows) == 1 else ("", "")
            return _result(
                [
                    (f"exactly one note created (found {len(rows)})", len(rows) == 1),
                    (f"title is {expected['title']!r}", _norm(note[0]) == _norm(expected["title"])),
                    (
                        f"body gives {expected['body_contains']} and no other number",
                        one_answer(note[1], expected["body_contains"])[0],
                    ),
                ]
            )
        if kind == "answer":
            changed = sum(
                db.execute(f"SELECT count(*) FROM {t} WHERE origin='user'").fetchone()[0]
                for t in ("events", "mail", "notes", "files")
            )
            ok, compared = one_answer(final_answer, expected["answer"])
            return _result(
                [
                    (f"one answer, {expected['answer']!r} (got {final_answer!r}: {compared})", ok),
                    (f"nothing was changed (found {changed} new rows)", changed == 0),
                ]
            )
    finally:
        db.close()
    raise ValueError(f"unknown Claw verifier kind {kind!r}; expected event, sent_mail, note or answer")
