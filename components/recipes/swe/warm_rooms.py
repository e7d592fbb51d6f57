"""Warm rooms: verification sandboxes kept across the verifications of generated SWE tasks (verifier kind
`calls`), each with a warm worker (`warm_worker.py`) that forks a child per verification.

Why: a clean room per verification pays a sandbox start, a copy of the pristine state, a Python start-up
and a delete (most of a verification's CPU); a warm room pays them once, and a verification then costs one
file write, one `cat` and a fork of a warm interpreter. What each verification still gets, and what the
worker removes after it (every process, file and IPC object of the verification's own uid), is in
`warm_worker.py`; the verdict is judged on the host from the call worker's answer exactly as for a clean room.

A warm room is never the only way to a verdict: when it cannot answer (it cannot be started, a request
fails in any way, the worker retires it before answering), `run` returns None and the caller verifies in
a clean room, so nothing a verification does to a warm room is anyone's failure. Rooms are kept per sandbox
spec (the task's labels aside) and per service, at most `max_rooms` each, one verification at a time each,
in one pool per process (`shared()`: recipes come and go, rooms outlive them), which talks to each service
through a client of its own (a clone of the first caller's). Rooms live while verifications keep coming: one
is deleted when its worker retires it, when a request to it fails, when it is older than `max_age_seconds`,
when it has been idle `idle_seconds` (a daemon thread looks every second), when the process exits, by
`close()`, and by the service once no call reaches it for `idle_seconds` + 20 s (its heartbeat limit: a
process killed outright leaves nothing for long).
"""

from __future__ import annotations

import atexit
import base64
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sandbox_service.client import Sandbox, SandboxClient
from sandbox_service.errors import ServiceUnavailableError
from sandbox_service.models import SandboxCreate, SandboxInfo

log = logging.getLogger(__name__)

ROLE = "verifier-warm"
CONTROL_DIR = "/workspace/.orchard-warm"  # root's, 0700: the request file and the answer FIFO
WORKER_SOURCE = (Path(__file__).with_name("warm_worker.py")).read_text()
UIDS = (20000, 59999)  # the verifications' uids, inside every sandbox's 65,536 ids
MAX_ANSWER_BYTES = 64_000_000


@dataclass
class WarmRun:
    """What the call worker did in a warm room: as an exec's result would say it."""

    exit_code: int
    timed_out: bool
    stdout: str
    stderr: str
    seconds: float


@dataclass(eq=False)
class _Room:
    info: SandboxInfo
    key: str
    url: str
    born: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    pristine_ids: set[str] = field(default_factory=set)
    served: int = 0


class WarmRooms:
    """Warm rooms of one harness process (thread-safe); see the module docstring."""

    def __init__(self, max_rooms: int = 4, idle_seconds: float = 10.0, max_age_seconds: float = 1800.0):
        self.max_rooms, self.idle_seconds, self.max_age_seconds = max_rooms, idle_seconds, max_age_seconds
        self._cond = threading.Condition()
        self._idle: dict[str, list[_Room]] = {}
        self._count: dict[str, int] = {}
        self._clients: dict[str, SandboxClient] = {}  # service URL -> the pool's own client
        self._busy: set[_Room] = set()
        self._reaper: threading.Thread | None = None

    # -- the one entry point -------------------------------------------------------------------------------
    def run(
        self,
        client: SandboxClient,
        spec: SandboxCreate,
        worker: str,
        *,
        workdir: str,
        pristine_id: str,
        pristine: dict[str, bytes],
        write: dict[str, bytes],
        delete: list[str],
        stdin: str,
        timeout: float,
        env: dict[str, str],
    ) -> WarmRun | None:
        """Run the call worker `worker` on `stdin` in a warm room, in `workdir` made from `pristine` (by
        `pristine_id`) with `write` and `delete` applied; None when no warm room gave an answer."""
        if not workdir.startswith("/workspace/") or (CONTROL_DIR + "/").startswith(workdir.rstrip("/") + "/"):
            return None  # the tree is made and removed whole: never /workspace or the control directory
        client = self._client(client)
        key = self._key(client, spec)
        room = self._take(client, spec, key, worker)
        if room is None:
            return None
        keep = False
        sandbox = Sandbox(client, room.info)
        try:
            run, keep = self._ask(
                sandbox,
                room,
                {
                    "nonce": secrets.token_hex(8),
                    "workdir": workdir,
                    "pristine_id": pristine_id,
                    "write": _b64(write),
                    "delete": list(delete),
                    "stdin": stdin,
                    "timeout": timeout,
                    "env": env,
                },
                pristine,
            )
            return run
        except Exception as err:  # noqa: BLE001 - any failure: this room is done, the caller uses a clean room
            log.warning(
                "warm room %s failed (%s: %s); verifying in a clean room", room.info.id, type(err).__name__, err
            )
            return None
        finally:
            self._give_back(client, key, room, keep)

    def close(self) -> None:
        """Delete every idle room now (a room in use is kept for its verification)."""
        self._drop(lambda room, now: True)

    def close_at_exit(self) -> None:
        """Delete every room, in use or not: the process is ending (registered with atexit for `shared()`)."""
        self._drop(lambda room, now: True)
        with self._cond:
            busy, self._busy = list(self._busy), set()
        for room in busy:
            _delete(self._clients[room.url], room)

    def rooms(self, client: SandboxClient) -> list[str]:
        """Ids of the idle rooms of `client`'s service (for tests and status pages)."""
        prefix = json.dumps([str(client.base_url)])[:-1]
        with self._cond:
            return [r.info.id for key, rs in self._idle.items() if key.startswith(prefix) for r in rs]

    def _drop(self, doomed: Callable[[_Room, float], bool]) -> int:
        """Delete the idle rooms `doomed(room, now)` picks; how many rooms are left (idle or in use)."""
        with self._cond:
            now, gone = time.monotonic(), []
            for key, rooms in self._idle.items():
                gone += [r for r in rooms if doomed(r, now)]
                self._idle[key] = [r for r in rooms if r not in gone]
            for room in gone:
                self._count[room.key] -= 1
            left = sum(self._count.values())
            self._cond.notify_all()
        for room in gone:
            _delete(self._clients[room.url], room)
        return left

    def _reap_idle(self) -> None:
        """Delete rooms idle for `idle_seconds`, once a second, until none is left."""
        while True:
            time.sleep(1.0)
            left = self._drop(lambda room, now: now - room.last_used > self.idle_seconds)
            with self._cond:
                if not left and not sum(self._count.values()):
                    self._reaper = None
                    return

    def _client(self, caller: SandboxClient) -> SandboxClient:
        with self._cond:
            own = self._clients.get(caller.base_url)
            if own is None:
                own = self._clients[caller.base_url] = caller.clone()
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap_idle, name="warm-rooms-reaper", daemon=True)
                self._reaper.start()
            return own

    # -- rooms -------------------------------------------------------------------------------------------
    @staticmethod
    def _key(client: SandboxClient, spec: SandboxCreate) -> str:
        shape = spec.model_dump(mode="json", exclude={"labels", "from_snapshot", "request_id"})
        return json.dumps([str(client.base_url), shape], sort_keys=True)

    def _take(self, client: SandboxClient, spec: SandboxCreate, key: str, worker: str) -> _Room | None:
        stale: list[_Room] = []
        try:
            with self._cond:
                while True:
                    now = time.monotonic()
                    rooms = self._idle.get(key, [])
                    while rooms:
                        room = rooms.pop()
                        if now - room.last_used > self.idle_seconds or now - room.born > self.max_age_seconds:
                            stale.append(room)
                            self._count[key] -= 1
                            continue
                        self._busy.add(room)
                        return room
                    if self._count.get(key, 0) < self.max_rooms:
                        self._count[key] = self._count.get(key, 0) + 1
                        break
                    self._cond.wait()
        finally:
            for room in stale:
                _delete(client, room)
        opened = self._open(client, spec, worker, key, self.idle_seconds)
        with self._cond:
            if opened is None:
                self._count[key] -= 1
                self._cond.notify()
            else:
                self._busy.add(opened)
        return opened

    def _give_back(self, client: SandboxClient, key: str, room: _Room, keep: bool) -> None:
        room.last_used = time.monotonic()
        with self._cond:
            self._busy.discard(room)
            if keep:
                self._idle.setdefault(key, []).append(room)
            else:
                self._count[key] -= 1
            self._cond.notify()
        if not keep:
            _delete(client, room)

    @staticmethod
    def _open(client: SandboxClient, spec: SandboxCreate, worker: str, key: str, idle_seconds: float) -> _Room | None:
        """A new room: a sandbox of `spec` (no task state in it), the control directory, the warm worker."""
        spec = spec.model_copy(
            update={
                "labels": {"orchard.role": ROLE},
                "from_snapshot": None,
                "request_id": None,
                "heartbeat_ttl_seconds": idle_seconds + 20,
            }
        )
        sandbox = None
        try:
            sandbox = client.create(spec)
            made = sandbox.exec(
                ["sh", "-c", 'umask 077 && mkdir -p -- "$0" && mkfifo -- "$0/answer"', CONTROL_DIR], cwd="/", timeout=30
            )
            if not made.ok:
                raise RuntimeError(f"control directory: exit {made.exit_code}: {made.stderr[-300:]}")
            config = {"dir": CONTROL_DIR, "worker": worker, "uid_first": UIDS[0], "uid_last": UIDS[1]}
            sandbox.exec_async(
                ["python", "-I", "-c", WORKER_SOURCE],
                stdin=json.dumps(config),
                cwd="/",
                timeout=86400,
                env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"},
            )
            return _Room(sandbox.info, key, client.base_url)
        except Exception as err:  # noqa: BLE001 - no warm room: the caller uses a clean room
            log.warning("could not start a warm room (%s: %s); verifying in a clean room", type(err).__name__, err)
            if sandbox is not None:
                _delete(client, _Room(sandbox.info, key, client.base_url))
            return None

    @staticmethod
    def _ask(sandbox: Sandbox, room: _Room, request: dict, pristine: dict[str, bytes]) -> tuple[WarmRun | None, bool]:
        """Send `request` (the pristine files too when the worker lacks them); (the run or None, keep the room)."""
        if request["pristine_id"] not in room.pristine_ids:
            request["pristine"] = _b64(pristine)
        for _ in range(2):
            sandbox.write_file(f"{CONTROL_DIR}/request.json", json.dumps(request))
            relay = sandbox.exec(
                ["cat", "--", f"{CONTROL_DIR}/answer"],
                cwd="/",
                timeout=float(request["timeout"]) + 60,
                max_output_bytes=MAX_ANSWER_BYTES,
            )
            if not relay.ok:
                raise RuntimeError(
                    f"no answer ({relay.outcome.value}, exit {relay.exit_code}): "
                    f"{(relay.stderr or relay.message or '')[-300:]}"
                )
            answer = json.loads(relay.stdout)
            if answer.get("nonce") != request["nonce"]:
                raise RuntimeError("the answer is not this request's")
            if answer.get("need_pristine") and "pristine" not in request:
                request["pristine"] = _b64(pristine)
                continue
            break
        else:
            raise RuntimeError("the worker kept asking for the pristine files")
        room.pristine_ids.add(request["pristine_id"])
        room.served += 1
        keep = not answer.get("retire")
        if not keep:
            log.info("warm room %s retired after %d verifications: %s", room.info.id, room.served, answer.get("why"))
        if "exit_code" not in answer:
            return None, False
        return WarmRun(
            exit_code=int(answer["exit_code"]),
            timed_out=bool(answer["timed_out"]),
            stdout=str(answer["stdout"]),
            stderr=str(answer["stderr"]),
            seconds=float(answer["seconds"]),
        ), keep


def _b64(files: dict[str, bytes]) -> dict[str, str]:
    return {path: base64.b64encode(data).decode() for path, data in files.items()}


def _delete(client: SandboxClient, room: _Room) -> None:
    try:
        Sandbox(client, room.info).delete()
    except ServiceUnavailableError as err:  # a stopped service deleted it; a live one reaps it when idle
        log.info("could not delete warm room %s: %s", room.info.id, err)
    except Exception as err:  # noqa: BLE001 - the service's reaper collects it
        log.warning("could not delete warm room %s: %s", room.info.id, err)


_SHARED = WarmRooms()
atexit.register(_SHARED.close_at_exit)  # a stage ending (a signal included) leaves no room behind


def shared() -> WarmRooms:
    """The process's pool of warm rooms (every SWE recipe of the process uses it)."""
    return _SHARED
