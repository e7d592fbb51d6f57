"""The warm worker: serves one verification after another inside a warm room (`warm_rooms.py`).

Runs as the room's root, `python -I -c <this file's text>`, stdlib only; it imports everything it uses
before the first verification, and nothing a verification wrote is ever on its path. Its configuration
(the control directory, the call worker's source, the uid range) comes on stdin. Then, one request at a
time: the harness writes `<dir>/request.json` through the file API and opens the FIFO `<dir>/answer` for
reading (`cat`); the worker, blocked opening it for writing, wakes, serves the request, writes the answer
and closes it. The control directory is root's, mode 0700: nothing a verification runs can read or write it.

A verification, in order:

1. **A fresh tree.** The task's workdir is made anew from its pristine files (sent once per task, kept in
   memory) with the agent's change applied, owned by uid U, a uid of the room's range no earlier
   verification of this worker used.
2. **A fork of this warm process runs the call worker** (`calls.WORKER`, exactly what a clean room runs
   with `python -I`): in a new session, in the workdir, with no groups, no new privileges (setuid files do
   not lift it), no POSIX message queues (RLIMIT_MSGQUEUE 0), as U. U owns nothing outside its tree, cannot
   signal, trace or write anything root's (this worker included), and sees only stdin (the request),
   its answer pipe and stderr.
3. **Everything U left is removed**, whether it answered, failed or ran out of time: every process of U
   is killed (through pidfds, so a reused pid is never hit) until none is left, the tree is removed, and
   every world-writable directory gets back exactly the entries it had when this worker started (anything
   else in it is deleted). A SysV IPC object of U, a process that survives 10 s of kills, an entry that
   changed or cannot be removed: the answer says `retire`, this worker exits, and the harness deletes
   the room. The verdict of that verification still stands (it ran in a clean state); the next one runs
   in a new room.

What differs from a clean room: the call worker runs as U, not as the room's root, so a package that
writes outside its own tree and the temporary directories (/root, /workspace) at import gets a
PermissionError where a clean room would let it; and it is a fork of a warm interpreter, so modules this
worker imported (json, os, ctypes, ...) are already imported, and the hash seed is the worker's.
"""

from __future__ import annotations

import base64
import builtins
import ctypes
import gc
import io
import json
import os
import resource
import select
import shutil
import signal
import stat
import sys
import time
import traceback
import types

PR_SET_NO_NEW_PRIVS = 38
SKIPPED_FILESYSTEMS = {
    "proc",
    "sysfs",
    "devpts",
    "cgroup",
    "cgroup2",
    "mqueue",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "autofs",
    "fusectl",
    "configfs",
    "binfmt_misc",
}
KILL_SECONDS = 10.0
STDERR_KEPT = 64 * 1024


class Retire(Exception):
    """The room cannot be put back as it was: serve no more verifications in it."""


def _writable_mounts() -> list[str]:
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields, fstype = head.split(), tail.split()[0]
            if fstype in SKIPPED_FILESYSTEMS or "ro" in fields[5].split(","):
                continue
            mounts.append(fields[4].encode().decode("unicode_escape"))
    return mounts


Baseline = tuple[dict[str, dict[str, tuple[int, int, int]]], dict[str, tuple[int, int, int, int, int]]]


def world_writable() -> Baseline:
    """Every world-writable directory on the room's writable mounts with its entries (inode, uid, mode), and
    every world-writable regular file with (inode, uid, mode, size, mtime): what U could change."""
    dirs: dict[str, dict[str, tuple[int, int, int]]] = {}
    files: dict[str, tuple[int, int, int, int, int]] = {}
    for top in _writable_mounts():
        try:
            dev = os.lstat(top).st_dev
        except OSError:
            continue
        todo = [top]
        while todo:
            path = todo.pop()
            try:
                st = os.lstat(path)
                names = os.listdir(path)
            except OSError:
                continue
            if st.st_dev != dev:  # another mount: walked on its own, if writable
                continue
            entries = {}
            for name in names:
                full = os.path.join(path, name)
                try:
                    est = os.lstat(full)
                except OSError:
                    continue
                entries[name] = (est.st_ino, est.st_uid, est.st_mode)
                if stat.S_ISDIR(est.st_mode):
                    todo.append(full)
                elif stat.S_ISREG(est.st_mode) and est.st_mode & stat.S_IWOTH:
                    files[full] = _file_state(est)
            if st.st_mode & stat.S_IWOTH:
                dirs[path] = entries
    return dirs, files


def _file_state(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_ino, st.st_uid, st.st_mode, st.st_size, st.st_mtime_ns


def _uid_of(pid: int) -> tuple[set[int], bool]:
    """The uids of `pid` (real, effective, saved, filesystem) and whether it is a zombie."""
    uids: set[int] = set()
    zombie = False
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("State:"):
                zombie = line.split()[1] in ("Z", "X")
            elif line.startswith("Uid:"):
                uids = {int(x) for x in line.split()[1:]}
                break
    return uids, zombie


def kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` until none is left (zombies are dead already)."""
    deadline = time.monotonic() + KILL_SECONDS
    while True:
        left = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                uids, zombie = _uid_of(pid)
                if uid not in uids or zombie:
                    continue
                fd = os.pidfd_open(pid)
            except (OSError, ValueError):
                continue
            try:
                if uid in _uid_of(pid)[0]:  # the same process still (the pidfd pins it)
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    left += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        if not left:
            return
        if time.monotonic() > deadline:
            raise Retire(f"processes of uid {uid} survived {KILL_SECONDS:g} s of kills")
        time.sleep(0.002)


def _remove(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: never follows a symlink out
    else:
        os.unlink(path)


def restore_world_writable(baseline: Baseline) -> None:
    """Put every world-writable directory back to its entries (extras removed); a changed entry or file
    cannot be put back: Retire."""
    dirs, files = baseline
    for path, entries in dirs.items():
        try:
            names = os.listdir(path)
        except OSError as exc:
            raise Retire(f"{path}: {exc}") from exc
        for name in names:
            full = os.path.join(path, name)
            if name not in entries:
                try:
                    _remove(full)
                except (OSError, RecursionError) as exc:
                    raise Retire(f"cannot remove {full}: {exc!r}") from exc
                continue
            st = os.lstat(full)
            if (st.st_ino, st.st_uid, st.st_mode) != entries[name]:
                raise Retire(f"{full} changed")
        if set(entries) - set(names):
            raise Retire(f"entries of {path} were removed")
    for path, state in files.items():
        try:
            if _file_state(os.lstat(path)) != state:
                raise Retire(f"{path} was written")
        except OSError as exc:
            raise Retire(f"{path}: {exc}") from exc


def sysv_objects(uid: int) -> list[str]:
    """SysV IPC objects (shared memory, semaphores, message queues) owned or made by `uid`."""
    found = []
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                header = f.readline().split()
                for line in f:
                    row = dict(zip(header, line.split()))
                    if str(uid) in (row.get("uid"), row.get("cuid")):
                        found.append(f"{kind} {row.get('key')}")
        except OSError:
            pass
    return found


def _safe_rel(rel: str) -> str:
    norm = os.path.normpath(rel)
    if norm.startswith(("/", "..")) or norm in (".", "") or "\0" in norm:
        raise ValueError(f"unsafe path {rel!r}")
    return norm


def build_tree(workdir: str, files: dict[str, bytes], uid: int) -> None:
    """`workdir` made anew (by root, nothing of U can race it yet) from `files`, then handed to `uid`."""
    if os.path.lexists(workdir):
        _remove(workdir)
    os.makedirs(os.path.dirname(workdir.rstrip("/")) or "/", exist_ok=True)
    os.mkdir(workdir, 0o755)
    for rel, data in files.items():
        target = os.path.join(workdir, _safe_rel(rel))
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    for path, dirs, names in os.walk(workdir):
        for name in (*dirs, *names):
            os.lchown(os.path.join(path, name), uid, uid)
    os.chown(workdir, uid, uid)


def open_import_paths() -> None:
    """Let every uid traverse to the interpreter and its import path: a host interpreter may live under the
    room's /root (mode 0700), where only root could import from it. Directories only gain o+x (no listing);
    those on read-only mounts are left as they are."""
    for entry in {sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), *filter(None, sys.path)}:
        path = os.path.abspath(entry)
        while path != "/":
            try:
                st = os.stat(path)
                if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
                    os.chmod(path, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
            except OSError:
                pass
            path = os.path.dirname(path)


class Worker:
    def __init__(self, config: dict):
        self.dir = config["dir"]
        self.worker_code = compile(config["worker"], "<string>", "exec")  # once, not per verification
        self.uids = range(config["uid_first"], config["uid_last"] + 1)
        self.next_uid = 0
        self.max_answer = config.get("max_answer_bytes", 20_000_000)
        self.pristine: dict[str, dict[str, bytes]] = {}
        self.env = dict(os.environ)
        self.libc = ctypes.CDLL(None, use_errno=True)
        open_import_paths()
        self.baseline = world_writable()

    def serve(self, req: dict) -> dict:
        if "pristine" in req:
            if len(self.pristine) >= 64:
                self.pristine.pop(next(iter(self.pristine)))
            self.pristine[req["pristine_id"]] = {k: base64.b64decode(v) for k, v in req["pristine"].items()}
        files = self.pristine.get(req["pristine_id"])
        if files is None:
            return {"nonce": req["nonce"], "need_pristine": True}
        files = dict(files)
        for rel in req["delete"]:
            files.pop(rel, None)
        files.update({k: base64.b64decode(v) for k, v in req["write"].items()})
        if self.next_uid >= len(self.uids):
            raise Retire("every uid of the range has been used")
        uid = self.uids[self.next_uid]
        self.next_uid += 1
        workdir = os.path.normpath(req["workdir"])
        if not workdir.startswith("/workspace/") or (self.dir + "/").startswith(workdir + "/"):
            raise ValueError(f"workdir {workdir!r} is not a directory of its own under /workspace")
        build_tree(workdir, files, uid)
        try:
            answer = self.run(uid, workdir, req)
        except BaseException:
            self.clean(uid, workdir)
            raise
        try:
            self.clean(uid, workdir)
        except Retire as exc:  # this run's answer stands (it began clean); the next one needs a new room
            answer.update(retire=True, why=str(exc))
        answer["nonce"] = req["nonce"]
        return answer

    def clean(self, uid: int, workdir: str) -> None:
        """Remove everything uid `uid` left: processes, its tree, entries in world-writable places."""
        kill_uid(uid)
        try:
            _remove(workdir)
        except (OSError, RecursionError) as exc:
            raise Retire(f"cannot remove the tree: {exc!r}") from exc
        restore_world_writable(self.baseline)
        left = sysv_objects(uid)
        if left:
            raise Retire(f"SysV IPC objects left: {', '.join(left[:5])}")

    def run(self, uid: int, workdir: str, req: dict) -> dict:
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        env = {**self.env, **req.get("env", {})}
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            self._child(uid, workdir, env, stdin_r, out_w, err_w)
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        request = req["stdin"].encode()
        out, err = bytearray(), bytearray()
        deadline = start + float(req["timeout"])
        readers = {out_r: (out, False), err_r: (err, True)}
        timed_out, status = False, None
        os.set_blocking(stdin_w, False)
        try:
            while status is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                writers = [stdin_w] if stdin_w >= 0 else []
                ready_r, ready_w, _ = select.select([*readers, pidfd], writers, [], left)
                if ready_w:
                    try:
                        request = request[os.write(stdin_w, request[:65536]) :]
                    except BrokenPipeError:
                        request = b""
                    if not request:
                        os.close(stdin_w)
                        stdin_w = -1
                for fd in ready_r:
                    if fd == pidfd:
                        status = os.waitpid(pid, 0)[1]
                    else:
                        self._read(fd, readers)
        finally:
            if stdin_w >= 0:
                os.close(stdin_w)
            kill_uid(uid)  # whatever it started (they hold the pipes open) or itself on a timeout
            if status is None:
                status = os.waitpid(pid, 0)[1]
            os.close(pidfd)
            while readers:  # every writer is dead: read to the end
                ready = select.select(list(readers), [], [], 5.0)[0]
                if not ready:
                    raise Retire("the answer pipes stayed open after every process of the run was killed")
                for fd in ready:
                    self._read(fd, readers)
        return {
            "exit_code": os.waitstatus_to_exitcode(status),
            "timed_out": timed_out,
            "stdout": bytes(out).decode("utf-8", "replace"),
            "stderr": bytes(err).decode("utf-8", "replace"),
            "seconds": round(time.monotonic() - start, 4),
        }

    def _read(self, fd: int, readers: dict[int, tuple[bytearray, bool]]) -> None:
        """A chunk from the answer pipe (kept up to max_answer bytes) or stderr (its tail kept)."""
        try:
            chunk = os.read(fd, 1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            os.close(fd)
            readers.pop(fd)
            return
        buf, tail = readers[fd]
        if tail:
            buf += chunk
            del buf[:-STDERR_KEPT]
        elif len(buf) < self.max_answer:
            buf += chunk[: self.max_answer - len(buf)]

    def _child(self, uid: int, workdir: str, env: dict, stdin_r: int, out_w: int, err_w: int) -> None:
        """In the fork: become U in the fresh tree and run the call worker as `python -I -c` would."""
        code = 1
        try:
            os.setsid()
            for fd, target in ((stdin_r, 0), (out_w, 1), (err_w, 2)):
                os.dup2(fd, target)
            os.closerange(3, 1 << 16)
            self.pristine.clear()
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
            sys.stderr = io.TextIOWrapper(
                io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
            )
            os.chdir(workdir)
            os.umask(0o022)
            if self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
            resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = ["-c"]
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = builtins  # the globals exec runs the worker in
            sys.modules["__main__"] = main
            exec(self.worker_code, main.__dict__)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - as an interpreter would: the traceback, exit 1
            try:
                traceback.print_exc()
            except BaseException:  # noqa: BLE001
                pass
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
            os._exit(code)


def main() -> int:
    os.umask(0o022)
    config = json.loads(sys.stdin.read())
    worker = Worker(config)
    gc.freeze()  # what is loaded now stays out of collections: a fork's pages stay shared
    answer_path = os.path.join(worker.dir, "answer")
    request_path = os.path.join(worker.dir, "request.json")
    while True:
        fd = os.open(answer_path, os.O_WRONLY)  # blocks until the harness opens it for reading
        if not os.path.exists(request_path):  # the last answer's reader, not gone yet: let it see EOF
            os.close(fd)
            continue
        retire = False
        nonce = None
        try:
            with open(request_path, "rb") as f:
                req = json.loads(f.read())
            os.unlink(request_path)
            nonce = req.get("nonce")
            answer = worker.serve(req)
        except Retire as exc:
            answer, retire = {"nonce": nonce, "retire": True, "why": str(exc)}, True
        except Exception as exc:  # noqa: BLE001 - the room's state is unknown: retire it
            answer, retire = {"nonce": nonce, "retire": True, "why": f"{type(exc).__name__}: {exc}"}, True
        retire = retire or bool(answer.get("retire"))
        data = memoryview(json.dumps(answer).encode())
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            pass
        os.close(fd)
        if retire:
            return 0


if __name__ == "__main__":
    sys.exit(main())
