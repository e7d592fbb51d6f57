"""Verifiers on the assistant's final state: the sqlite database read back from the sandbox, and the
answer. Only rows with origin 'user' (what the agent created) count as the agent's changes, so a task
fails both when the right change is missing and when a wrong one was made alongside it.
"""

from __future__ import annotations

import json
import re
import sqlite3

from components.core.recipe_base import VerifyResult
from components.recipes.common import checklist_result as _result
from components.recipes.common import normalize_text as _norm




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
            want = expected["answer"]
            return _result([
                (f"answer contains {want!r} (got {final_answer!r})",
                 re.search(rf"(^|\D){re.escape(want)}(\D|$)", final_answer or "") is not None),
                (f"nothing was changed (found {changed} new rows)", changed == 0),
            ])
    finally:
        db.close()
    raise ValueError(f"unknown Claw verifier kind {kind!r}; expected event, sent_mail, note or answer")
