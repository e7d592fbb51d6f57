"""The assistant's tools inside the sandbox: mail, calendar, contacts, notes and files on one sqlite
database (stdlib only). Both harness variants reach the same functions:

    python claw.py call mail_search < args.json              # function-call harness: one tool per API
                                                             # (arguments on stdin; or as one more argv)
    ./claw mail search --sender bob                          # shell harness: a CLI, documented in the prompt
    python claw.py init seed.json                            # setup: build the database from a world
    python claw.py replay seed.json journal.jsonl            # the verifier, on the host: world + journal

Every change the API makes is also appended to `journal.jsonl` (one {"name", "arguments"} line per
successful call of a MUTATING function). The verifier rebuilds the state from the world and that
journal with its own copy of this file, so writing `state.db` by other means changes no verdict.

Every command prints one JSON document. Errors print {"error": ...} and exit 2 (a usage mistake, the
policy's fault: arguments of the wrong type or over their bounds, which are set well inside sqlite's own
limits on expression depth and LIKE patterns) or 3 (the database or the filesystem refused what was
asked: the tool failed, whose failure is for the harness's rule to decide). Rows written by `init` have
origin 'seed'; everything the agent creates has origin 'user', which is how verifiers tell the agent's
changes from the world it was given.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Callable  # loaded anyway: sqlite3 imports collections.abc

DB = os.environ.get("CLAW_DB", os.path.join(os.path.dirname(os.path.abspath(__file__)), "state.db"))
JOURNAL = os.environ.get("CLAW_JOURNAL", os.path.join(os.path.dirname(os.path.abspath(DB)), "journal.jsonl"))
MUTATING = ("mail_send", "calendar_create", "notes_create")
MAX_JOURNAL_LINE = 1_000_000  # characters; a longer line is rejected unparsed

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS contacts (email TEXT PRIMARY KEY, name TEXT, phone TEXT, company TEXT);
CREATE TABLE IF NOT EXISTS mail (id INTEGER PRIMARY KEY, thread_id TEXT, sender TEXT, recipients TEXT, cc TEXT,
  subject TEXT, body TEXT, date TEXT, folder TEXT, origin TEXT DEFAULT 'user');
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, title TEXT, start TEXT, duration_min INTEGER,
  attendees TEXT, location TEXT, origin TEXT DEFAULT 'user');
CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, title TEXT, body TEXT, origin TEXT DEFAULT 'user');
CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, content TEXT, origin TEXT DEFAULT 'user');
"""


class UsageError(ValueError):
    """A bad argument: reported to the policy as {"error": ...}."""


MAX_TEXT = 100_000  # characters of a text argument (a body, a subject)
MAX_PATTERN = 1_000  # characters of a search or filter argument (sqlite refuses LIKE patterns over 50,000 bytes)
MAX_WORDS = 32  # words of mail_search's query (each adds two LIKE terms; sqlite's expression depth is 1,000)
MAX_ITEMS = 100  # entries of one list argument
INT_RANGE = (-(1 << 63), (1 << 63) - 1)  # what sqlite stores


class Param:
    """One argument of an API function (a plain class: dataclasses/argparse cost start-up time per call).
    `max_len`: most characters of a str (or of each list entry); the tool specs carry it as `maxLength`."""

    __slots__ = ("name", "kind", "help", "required", "max_len")

    def __init__(self, name: str, kind: str, help: str, required: bool = False, max_len: int = MAX_TEXT):
        self.name, self.kind, self.help, self.required = name, kind, help, required  # kind: str | int | list
        self.max_len = max_len


def connect() -> sqlite3.Connection:
    db = sqlite3.connect(DB)
    db.row_factory = sqlite3.Row
    return db


def _list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def _me(db: sqlite3.Connection) -> str:
    return db.execute("SELECT value FROM meta WHERE key='owner'").fetchone()[0]


def _mail_row(r: sqlite3.Row, full: bool) -> dict:
    out = {"id": r["id"], "thread_id": r["thread_id"], "from": r["sender"], "subject": r["subject"], "date": r["date"]}
    if full:
        out.update(to=json.loads(r["recipients"]), cc=json.loads(r["cc"]), body=r["body"], folder=r["folder"])
    return out


# -- the API -----------------------------------------------------------------------------------------
def mail_search(sender: str | None = None, query: str | None = None, limit: int = 10) -> list[dict]:
    if len((query or "").split()) > MAX_WORDS:
        raise UsageError(f"mail_search: 'query' takes at most {MAX_WORDS} words")
    sql, args = "SELECT * FROM mail WHERE 1=1", []
    if sender:
        sql += " AND lower(sender) LIKE ?"
        args.append(f"%{sender.lower()}%")
    for word in (query or "").lower().split():
        sql += " AND (lower(subject) LIKE ? OR lower(body) LIKE ?)"
        args += [f"%{word}%", f"%{word}%"]
    with connect() as db:
        rows = db.execute(sql + " ORDER BY date DESC, id DESC LIMIT ?", [*args, int(limit)]).fetchall()
    return [_mail_row(r, full=False) for r in rows]


def mail_read(id: int) -> dict:
    with connect() as db:
        r = db.execute("SELECT * FROM mail WHERE id=?", (int(id),)).fetchone()
    if r is None:
        raise UsageError(f"no message with id {id}; ids come from mail_search")
    return _mail_row(r, full=True)


def mail_send(to: list[str], subject: str, body: str, cc: list[str] | None = None) -> dict:
    to, cc = _list(to), _list(cc)
    if not to:
        raise UsageError("mail_send needs at least one recipient in 'to'")
    for addr in to + cc:
        if "@" not in addr:
            raise UsageError(f"{addr!r} is not an email address; look it up with contacts_search")
    with connect() as db:
        now = db.execute("SELECT value FROM meta WHERE key='now'").fetchone()[0]
        cur = db.execute(
            "INSERT INTO mail (thread_id, sender, recipients, cc, subject, body, date, folder) "
            "VALUES (?,?,?,?,?,?,?, 'sent')",
            (f"t-sent-{os.getpid()}", _me(db), json.dumps(to), json.dumps(cc), subject, body, now),
        )
    return {"sent": True, "id": cur.lastrowid}


def calendar_list(date: str | None = None) -> list[dict]:
    sql, args = "SELECT * FROM events", []
    if date:
        sql += " WHERE start LIKE ?"
        args.append(f"{date}%")
    with connect() as db:
        rows = db.execute(sql + " ORDER BY start", args).fetchall()
    return [
        {
            "id": r["id"],
            "title": r["title"],
            "start": r["start"],
            "duration_min": r["duration_min"],
            "attendees": json.loads(r["attendees"]),
            "location": r["location"],
        }
        for r in rows
    ]


def calendar_create(
    title: str, start: str, duration_min: int = 60, attendees: list[str] | None = None, location: str = ""
) -> dict:
    import datetime as dt

    try:
        dt.datetime.strptime(start, "%Y-%m-%d %H:%M")
    except ValueError:
        raise UsageError(f"start must look like 2026-03-12 14:00, got {start!r}") from None
    people = _list(attendees)
    for addr in people:
        if "@" not in addr:
            raise UsageError(f"attendee {addr!r} is not an email address; look it up with contacts_search")
    with connect() as db:
        cur = db.execute(
            "INSERT INTO events (title, start, duration_min, attendees, location) VALUES (?,?,?,?,?)",
            (title, start, int(duration_min), json.dumps(people), location),
        )
    return {"created": True, "id": cur.lastrowid}


def contacts_search(query: str) -> list[dict]:
    q = f"%{query.lower()}%"
    with connect() as db:
        rows = db.execute(
            "SELECT * FROM contacts WHERE lower(name) LIKE ? OR lower(email) LIKE ? OR lower(company) "
            "LIKE ? ORDER BY name",
            (q, q, q),
        ).fetchall()
    return [dict(r) for r in rows]


def notes_search(query: str = "") -> list[dict]:
    q = f"%{query.lower()}%"
    with connect() as db:
        rows = db.execute(
            "SELECT id, title, body FROM notes WHERE lower(title) LIKE ? OR lower(body) LIKE ? ORDER BY id", (q, q)
        ).fetchall()
    return [dict(r) for r in rows]


def notes_create(title: str, body: str) -> dict:
    with connect() as db:
        cur = db.execute("INSERT INTO notes (title, body) VALUES (?,?)", (title, body))
    return {"created": True, "id": cur.lastrowid}


def files_list(prefix: str = "") -> list[str]:
    with connect() as db:
        return [r[0] for r in db.execute("SELECT path FROM files WHERE path LIKE ? ORDER BY path", (f"{prefix}%",))]


def files_read(path: str) -> dict:
    with connect() as db:
        r = db.execute("SELECT content FROM files WHERE path=?", (path,)).fetchone()
    if r is None:
        raise UsageError(f"no file {path!r}; see files_list")
    return {"path": path, "content": r[0]}


API: dict[str, tuple[Callable[..., object], str, list[Param]]] = {
    "mail_search": (
        mail_search,
        "Search mail, newest first.",
        [
            Param("sender", "str", "part of the sender's name or address", max_len=MAX_PATTERN),
            Param(
                "query", "str", f"words that must appear in subject or body (at most {MAX_WORDS})", max_len=MAX_PATTERN
            ),
            Param("limit", "int", "maximum results (default 10)"),
        ],
    ),
    "mail_read": (
        mail_read,
        "Read one message (sender, to, cc, body).",
        [Param("id", "int", "message id from mail_search", True)],
    ),
    "mail_send": (
        mail_send,
        "Send an email.",
        [
            Param("to", "list", "recipient addresses", True),
            Param("subject", "str", "subject line", True),
            Param("body", "str", "message text", True),
            Param("cc", "list", "cc addresses"),
        ],
    ),
    "calendar_list": (
        calendar_list,
        "List calendar events, optionally on one date.",
        [Param("date", "str", "YYYY-MM-DD", max_len=MAX_PATTERN)],
    ),
    "calendar_create": (
        calendar_create,
        "Create a calendar event.",
        [
            Param("title", "str", "event title", True),
            Param("start", "str", "YYYY-MM-DD HH:MM", True),
            Param("duration_min", "int", "length in minutes (default 60)"),
            Param("attendees", "list", "attendee email addresses"),
            Param("location", "str", "where"),
        ],
    ),
    "contacts_search": (
        contacts_search,
        "Find contacts by name, email or company.",
        [Param("query", "str", "text to match", True, max_len=MAX_PATTERN)],
    ),
    "notes_search": (notes_search, "Search notes.", [Param("query", "str", "text to match", max_len=MAX_PATTERN)]),
    "notes_create": (
        notes_create,
        "Create a note.",
        [Param("title", "str", "note title", True), Param("body", "str", "note text", True)],
    ),
    "files_list": (
        files_list,
        "List files.",
        [Param("prefix", "str", "path prefix, e.g. reports/", max_len=MAX_PATTERN)],
    ),
    "files_read": (
        files_read,
        "Read a file.",
        [Param("path", "str", "path from files_list", True, max_len=MAX_PATTERN)],
    ),
}


def _check(tool: str, p: Param, value: object) -> None:
    """`value` against the parameter's JSON-schema type (the tool specs are built from the same
    Param kinds): str = a string, int = an integer (not a bool) sqlite can store, list = an array of
    strings (or, from the shell harness's CLI, one comma-separated string). Raises UsageError."""
    where = f"{tool}: {p.name!r}"
    if p.kind == "int":
        if type(value) is not int or not INT_RANGE[0] <= value <= INT_RANGE[1]:
            raise UsageError(f"{where} must be an integer (got {type(value).__name__})")
        return
    if p.kind == "list" and type(value) is list:
        if len(value) > MAX_ITEMS or any(type(v) is not str or len(v) > p.max_len for v in value):
            raise UsageError(f"{where} must be a list of at most {MAX_ITEMS} strings of at most {p.max_len} characters")
        texts = value
    elif type(value) is not str or len(value) > p.max_len:
        raise UsageError(
            f"{where} must be a string of at most {p.max_len} characters (got {type(value).__name__}"
            f"{f' of {len(value)}' if type(value) is str else ''})"
        )
    else:
        texts = [value]
    for text in texts:  # a lone surrogate (JSON can carry one) cannot be stored or printed as UTF-8
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"{where} is not valid Unicode (a lone surrogate)") from None


def validate(name: object, arguments: object) -> None:
    """Raise UsageError unless `name` is an API function and `arguments` fit its parameters (names,
    required ones, types): the check every call passes before anything runs, in the sandbox and on the host."""
    if not isinstance(name, str) or name not in API:
        raise UsageError(f"unknown tool {name!r}; available: {sorted(API)}")
    if not isinstance(arguments, dict):
        raise UsageError(f"{name}: arguments must be a JSON object")
    _, _, params = API[name]
    known = {p.name for p in params}
    extra = set(arguments) - known
    if extra:
        raise UsageError(f"{name} does not take {sorted(map(str, extra))[:10]}; it takes {sorted(known)}")
    missing = [p.name for p in params if p.required and arguments.get(p.name) in (None, "", [])]
    if missing:
        raise UsageError(f"{name} needs {missing}")
    for p in params:
        if arguments.get(p.name) is not None:
            _check(name, p, arguments[p.name])


class ToolFailed(Exception):
    """The database or the filesystem refused what a valid call asked (printed as {"error": ...}, exit 3)."""


def call(name: str, arguments: dict, journal: bool = True) -> object:
    validate(name, arguments)
    fn = API[name][0]
    try:
        out = fn(**arguments)
    except (TypeError, ValueError, OverflowError, sqlite3.InterfaceError) as err:
        if isinstance(err, UsageError):
            raise
        raise UsageError(f"bad arguments for {name}: {err}") from None
    except (sqlite3.Error, OSError) as err:
        raise ToolFailed(f"{name} failed: {type(err).__name__}: {err}"[:500]) from None
    if name in MUTATING and journal:
        with open(JOURNAL, "a") as f:
            f.write(json.dumps({"name": name, "arguments": arguments}) + "\n")
    return out


def replay(seed_path: str, journal_path: str) -> dict:
    """Build the world, then re-run the journal's calls in order; lines that are not a valid mutating
    call are reported, never applied."""
    init(seed_path)
    applied, rejected = 0, []
    with open(journal_path, "rb") as f:
        lines = f.read().decode("utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines, start=1):
        try:
            if len(line) > MAX_JOURNAL_LINE:
                raise UsageError(f"line of {len(line)} characters (at most {MAX_JOURNAL_LINE})")
            entry = json.loads(line)
            name, arguments = entry["name"], entry["arguments"]
            if name not in MUTATING or not isinstance(arguments, dict):
                raise UsageError(f"{name!r} is not a state-changing call")
            call(name, arguments, journal=False)
            applied += 1
        except Exception as err:  # noqa: BLE001 - whatever a line does (deep nesting, odd types), it is not applied
            rejected.append({"line": i, "error": f"{type(err).__name__}: {err}"[:300]})
    return {"applied": applied, "rejected": rejected}


def init(seed_path: str) -> dict:
    with open(seed_path) as f:
        world = json.load(f)
    if os.path.exists(DB):
        os.unlink(DB)
    with connect() as db:
        db.executescript(SCHEMA)
        db.executemany("INSERT INTO meta VALUES (?,?)", [("owner", world["owner"]), ("now", world["now"])])
        db.executemany("INSERT INTO contacts VALUES (:email, :name, :phone, :company)", world["contacts"])
        for m in world["mail"]:
            db.execute(
                "INSERT INTO mail (id, thread_id, sender, recipients, cc, subject, body, date, folder, origin) "
                "VALUES (?,?,?,?,?,?,?,?,?, 'seed')",
                (
                    m["id"],
                    m["thread_id"],
                    m["sender"],
                    json.dumps(m["to"]),
                    json.dumps(m.get("cc", [])),
                    m["subject"],
                    m["body"],
                    m["date"],
                    m.get("folder", "inbox"),
                ),
            )
        for e in world["events"]:
            db.execute(
                "INSERT INTO events (title, start, duration_min, attendees, location, origin) "
                "VALUES (?,?,?,?,?, 'seed')",
                (e["title"], e["start"], e["duration_min"], json.dumps(e["attendees"]), e.get("location", "")),
            )
        for n in world["notes"]:
            db.execute("INSERT INTO notes (title, body, origin) VALUES (?,?, 'seed')", (n["title"], n["body"]))
        for path, content in world["files"].items():
            db.execute("INSERT INTO files (path, content, origin) VALUES (?,?, 'seed')", (path, content))
    return {"initialized": DB}


def cli_usage() -> str:
    """The shell harness's documentation: one line per command."""
    lines = ["./claw GROUP COMMAND [--option VALUE ...]   (prints JSON; lists are comma-separated)"]
    for name, (_, doc, params) in API.items():
        group, cmd = name.split("_", 1)
        opts = " ".join(
            f"--{p.name.replace('_', '-')} {p.name.upper()}"
            if p.required
            else f"[--{p.name.replace('_', '-')} {p.name.upper()}]"
            for p in params
        )
        lines.append(f"  ./claw {group} {cmd} {opts}".rstrip() + f"   # {doc}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    out: object
    try:
        if argv[:1] == ["init"]:
            out = init(argv[1])
        elif argv[:1] == ["replay"]:
            out = replay(argv[1], argv[2])
        elif argv[:1] == ["call"]:  # the arguments as one more argv string, or on stdin (never bound by argv's limits)
            out = call(argv[1], json.loads(argv[2] if len(argv) > 2 else (sys.stdin.read() or "{}")))
        else:
            import argparse  # only the shell harness pays for it

            parser = argparse.ArgumentParser(
                prog="./claw", description=cli_usage(), formatter_class=argparse.RawDescriptionHelpFormatter
            )
            groups = parser.add_subparsers(dest="group", required=True)
            subs: dict = {}
            for name, (_, doc, params) in API.items():
                group, cmd = name.split("_", 1)
                if group not in subs:
                    subs[group] = groups.add_parser(group).add_subparsers(dest="cmd", required=True)
                p = subs[group].add_parser(cmd, help=doc)
                for prm in params:
                    p.add_argument(
                        f"--{prm.name.replace('_', '-')}",
                        dest=prm.name,
                        required=prm.required,
                        type=int if prm.kind == "int" else str,
                        help=prm.help,
                    )
            ns = vars(parser.parse_args(argv))
            name = f"{ns.pop('group')}_{ns.pop('cmd')}"
            out = call(name, {k: v for k, v in ns.items() if v is not None})
    except UsageError as err:
        print(json.dumps({"error": str(err)}))
        return 2
    except (json.JSONDecodeError, RecursionError) as err:
        print(json.dumps({"error": f"arguments must be a JSON object: {type(err).__name__}"}))
        return 2
    except ToolFailed as err:
        print(json.dumps({"error": str(err)}))
        return 3
    print(json.dumps(out, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
