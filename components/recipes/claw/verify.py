"""Verifiers on the assistant's final state and answer.

The rule (verifier `claw-journal-replay`, version `VERSION`): every Claw task means "use the
assistant's tools", in both harnesses. So the judged state is never the sandbox's `state.db`: it is
the task's world rebuilt on the host by the verifier's own copy of `claw.py`, with the journal of
state-changing API calls (`journal.jsonl`, appended by the tools) replayed through the same API and
its argument checks. Writing `state.db` directly (the shell harness can), deleting or corrupting it,
or editing the sandbox's `claw.py` changes nothing judged; such divergences are recorded as ignored.
A missing journal means no change was made; journal lines that are not a valid state-changing call
are rejected (recorded as ignored). Only the verifier's own replay failing is an infrastructure error.

On the rebuilt state, only rows with origin 'user' (what the agent created) count as the agent's
changes, so a task fails both when the right change is missing and when a wrong one was made
alongside it. Questions need one answer equal to the expected one (`common.one_answer`).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from importlib import resources
from pathlib import Path

from components.core.schema import IgnoredPart

from components.core.recipe_base import VerifyResult
from components.recipes.common import checklist_result as _result
from components.recipes.common import normalize_text as _norm
from components.recipes.common import one_answer

NAME = "claw-journal-replay"
VERSION = "2"  # 1: the sandbox's state.db as read back, answers checked by containment
# Compared between the sandbox's state.db and the rebuilt one (mail.thread_id holds a process id).
_COLUMNS = {"contacts": "email, name, phone, company", "events": "title, start, duration_min, attendees, origin",
            "mail": "sender, recipients, cc, subject, body, date, folder, origin", "notes": "title, body, origin",
            "files": "path, content, origin"}


class ReplayError(RuntimeError):
    """The verifier's own rebuild of the state failed: an infrastructure error."""


def replay_journal(world: dict, journal: bytes, directory: str | Path) -> tuple[str, list[IgnoredPart]]:
    """Rebuild the state from `world` and `journal` in `directory` (on the host, with the package's own
    claw.py); the database path and the journal lines that were rejected."""
    directory = Path(directory)
    seed, journal_path, db = directory / "seed.json", directory / "journal.jsonl", directory / "state.db"
    seed.write_text(json.dumps(world))
    journal_path.write_bytes(journal)
    claw_py = resources.files("components.recipes.claw.sandbox").joinpath("claw.py")
    env = {"CLAW_DB": str(db), "CLAW_JOURNAL": str(directory / "unused.jsonl"), "PATH": os.environ.get("PATH", "")}
    res = subprocess.run([sys.executable, "-I", "-S", str(claw_py), "replay", str(seed), str(journal_path)],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    if res.returncode != 0:
        raise ReplayError(f"claw.py replay exited {res.returncode}: {res.stdout[-300:]} {res.stderr[-500:]}")
    out = json.loads(res.stdout)
    return str(db), [IgnoredPart(path=f"journal.jsonl:{r['line']}", reason=f"rejected: {r['error']}")
                     for r in out["rejected"]]


def _rows(db_path: str) -> dict[str, list[tuple]]:
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return {t: sorted(db.execute(f"SELECT {cols} FROM {t}").fetchall(), key=repr) for t, cols in _COLUMNS.items()}
    finally:
        db.close()


def state_divergence(sandbox_db: str | None, rebuilt_db: str) -> list[IgnoredPart]:
    """What the sandbox's own state.db holds beyond the tools' journal (ignored by verification)."""
    if sandbox_db is None:
        return [IgnoredPart(path="state.db", reason="deleted or unreadable; the state is rebuilt from the journal")]
    try:
        theirs = _rows(sandbox_db)
    except sqlite3.Error as err:
        return [IgnoredPart(path="state.db", reason=f"corrupt ({err}); the state is rebuilt from the journal")]
    ours = _rows(rebuilt_db)
    return [IgnoredPart(path=f"state.db:{t}", reason="rows changed outside the assistant's tools "
                        f"({len(theirs[t])} rows vs {len(ours[t])} from the journal)")
            for t in _COLUMNS if theirs[t] != ours[t]]




def _digits(s: str | None) -> str:
    return re.sub(r"[,\s]", "", s or "")


def verify_db(db_path: str, expected: dict, final_answer: str | None) -> VerifyResult:
    """Check the database at `db_path` (a host-side copy) against the task's expected state."""
    kind = expected.get("kind")
    db = sqlite3.connect(db_path)
    try:
        if kind == "event":
            rows = db.execute("SELECT title, start, attendees FROM events WHERE origin='user'").fetchall()
            ev = rows[0] if len(rows) == 1 else ("", "", "[]")
            attendees = sorted(a.strip().lower() for a in json.loads(ev[2] or "[]"))
            return _result([
                (f"exactly one event created (found {len(rows)})", len(rows) == 1),
                (f"title mentions {expected['title']!r}", _norm(expected["title"]) in _norm(ev[0])),
                (f"starts at {expected['start']}", ev[1] == expected["start"]),
                (f"attendees are {expected['attendees']} (got {attendees})",
                 attendees == sorted(a.lower() for a in expected["attendees"])),
            ])
        if kind == "sent_mail":
            rows = db.execute("SELECT recipients, body FROM mail WHERE origin='user' AND folder='sent'").fetchall()
            msg = rows[0] if len(rows) == 1 else ("[]", "")
            to = sorted(a.strip().lower() for a in json.loads(msg[0]))
            return _result([
                (f"exactly one email sent (found {len(rows)})", len(rows) == 1),
                (f"sent to {expected['to']} (got {to})", to == sorted(a.lower() for a in expected["to"])),
                (f"body contains {expected['body_contains']!r}", _digits(expected["body_contains"]) in _digits(msg[1])),
            ])
        if kind == "note":
            rows = db.execute("SELECT title, body FROM notes WHERE origin='user'").fetchall()
            note = rows[0] if len(rows) == 1 else ("", "")
            return _result([
                (f"exactly one note created (found {len(rows)})", len(rows) == 1),
                (f"title is {expected['title']!r}", _norm(note[0]) == _norm(expected["title"])),
                (f"body contains {expected['body_contains']}",
                 re.search(rf"(^|\D){expected['body_contains']}(\D|$)", _digits(note[1])) is not None),
            ])
        if kind == "answer":
            changed = sum(db.execute(f"SELECT count(*) FROM {t} WHERE origin='user'").fetchone()[0]
                          for t in ("events", "mail", "notes", "files"))
            ok, compared = one_answer(final_answer, expected["answer"])
            return _result([
                (f"one answer, {expected['answer']!r} (got {final_answer!r}: {compared})", ok),
                (f"nothing was changed (found {changed} new rows)", changed == 0),
            ])
    finally:
        db.close()
    raise ValueError(f"unknown Claw verifier kind {kind!r}; expected event, sent_mail, note or answer")
