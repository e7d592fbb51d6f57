"""The agent (PID 1 of a sandbox, root there) imports nothing a sandbox can write.

The attack: the agent's sys.path (and its packages' __path__) named host directories that, after the
pivot, resolved into the sandbox: the agent copy under a state dir in /tmp (the sandbox's own /tmp),
the interpreter's stdlib under /root (a read-only bind whose parent the sandbox's root may rename away
and rebuild). A module planted there under a stdlib name ran in PID 1 on its first lazy import (the
ports relay's, a tar download's). Here a module is planted under every stdlib name (and every path of
the stdlib and of the agent copy) in every directory a sandbox can write and at every host path the
agent was started with, then every route is exercised: none may run.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from sandbox_service.models import NetworkPolicy, SandboxCreate

pytestmark = pytest.mark.root

PLANTED = """import posix
if posix.getpid() == 1:
    with open("/workspace/.pwned-" + __name__, "a") as f:
        f.write(__name__)
"""

# Runs in the sandbox (-I -S: the planter imports nothing it planted).
PLANTER = r'''
import json, os, sys
spec = json.load(open("/workspace/.plan.json"))
code = spec["code"]

def own(path):
    """Make `path` a directory the sandbox wrote: rename away the first ancestor it may rename (a read-only
    bind's parent, say), then create the path afresh."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/" + "/".join(parts[:i])
        if not os.path.lexists(prefix):
            break
        try:
            os.rename(prefix, prefix + ".moved")
            break
        except OSError:
            continue
    os.makedirs(path, exist_ok=True)
    return os.access(path, os.W_OK)

planted, refused = 0, []
for base in spec["writable"] + spec["host_dirs"]:
    try:
        if not own(base):
            refused.append(base)
            continue
    except OSError as exc:
        refused.append(f"{base}: {exc}")
        continue
    for rel in spec["files"]:
        target = os.path.join(base, rel)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as f:
                f.write(code)
            planted += 1
        except OSError:
            pass
print(json.dumps({"planted": planted, "refused": refused}))
'''

RELAY_SITE = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=idna")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8125), H).serve_forever()
"""


def _stdlib_files() -> list[str]:
    """Every module path of this interpreter's stdlib (the agent's), relative, plus a top-level file per
    stdlib module name."""
    stdlib = os.path.dirname(os.__file__)
    skip = {"test", "idlelib", "tkinter", "lib2to3", "site-packages", "ensurepip", "turtledemo", "__pycache__"}
    files = {f"{name}.py" for name in sys.stdlib_module_names}
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = [d for d in dirnames if d not in skip]
        rel = os.path.relpath(dirpath, stdlib)
        for name in filenames:
            if name.endswith(".py"):
                files.add(os.path.normpath(os.path.join(rel, name)))
    return sorted(files)


def _host_dirs(state_dir) -> list[str]:
    """The host paths the agent was started with or imported from, as the sandbox may rebuild them."""
    agent_copies = [
        str(p) for p in (state_dir / "local" / "agent").iterdir() if p.is_dir() and not p.name.endswith(".tmp")
    ]
    stdlib = os.path.dirname(os.__file__)
    dirs = [
        *agent_copies,
        *(f"{a}/sandbox_service/agent" for a in agent_copies),
        stdlib,
        os.path.join(stdlib, "lib-dynload"),
        sys.prefix,
        sys.base_prefix,
    ]
    return [d for d in dirs if d]


def _pty_round_trip(service, sandbox_id: str) -> None:
    from websockets.sync.client import connect

    url = service.url.replace("http://", "ws://") + f"/v1/sandboxes/{sandbox_id}/exec/pty?command=/bin/sh"
    with connect(url, additional_headers={"Authorization": f"Bearer {service.token}"}) as ws:
        ws.send("echo pty-$((6*7)); exit\n")
        seen, deadline = "", time.monotonic() + 20
        while "pty-42" not in seen and time.monotonic() < deadline:
            frame = ws.recv(timeout=max(0.05, deadline - time.monotonic()))
            seen += frame.decode(errors="replace") if isinstance(frame, bytes) else frame
        assert "pty-42" in seen


def _pwned(sb) -> list[str]:
    return [e.name for e in sb.list_files("/workspace") if e.name.startswith(".pwned-")]


def test_modules_planted_everywhere_a_sandbox_writes_never_run_in_its_agent(
    sandbox_service, sandbox_client, labels, wait_for_port
):
    import httpx

    files = _stdlib_files()
    agent_files = [
        "sandbox_service/__init__.py",
        *(f"sandbox_service/agent/{n}" for n in ("__init__.py", "seccomp.py", "zygote.py", "boot.py")),
    ]
    plan = {
        "code": PLANTED,
        "files": [*files, *agent_files],
        "writable": [
            "/tmp",
            "/workspace",
            "/root",
            "/var/tmp",
            "/dev/shm",
            "/run",
            "/home",
            "/",
            "/.orchard",
            "/.orchard/agent",
        ],
        "host_dirs": _host_dirs(sandbox_service.state_dir),
    }
    with sandbox_client.create(SandboxCreate(labels=labels, network=NetworkPolicy(mode="loopback"))) as sb:
        sb.write_file("/workspace/.plan.json", json.dumps(plan))
        sb.write_file("/workspace/.planter.py", PLANTER)
        # cwd / keeps the planter's own python away from what it plants (it would import from cwd otherwise).
        out = sb.exec(["python3", "-I", "-S", "/workspace/.planter.py"], cwd="/", timeout=120)
        assert out.exit_code == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["planted"] > 10 * len(files), report  # the attack really planted, in most places

        # Every route, each with whatever lazy imports it makes in the agent.
        assert sb.exec("echo hi", cwd="/tmp", env={"LC_ALL": "C"}, stdin="x").stdout == "hi\n"
        assert sb.exec("sleep 5", timeout=0.5).outcome.value == "command_timeout"
        job = sb.exec_async(["sh", "-c", "echo job"], timeout=30)
        assert sandbox_client.wait_job(job.id, timeout=30).result.stdout == "job\n"
        sb.write_file("/workspace/a/b.txt", "b\n")
        assert sb.read_text("/workspace/a/b.txt") == "b\n"
        sb.list_files("/workspace/a")
        archive = sb.download_dir("/workspace/a")
        sb.apply_patch("--- a/a/b.txt\n+++ b/a/b.txt\n@@ -1 +1 @@\n-b\n+c\n", cwd="/workspace")
        assert sb.read_text("/workspace/a/b.txt") == "c\n"
        import tarfile
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            sb.upload_dir(tmp, "/workspace/up")
        sb.heartbeat()
        _pty_round_trip(sandbox_service, sb.id)
        sb.write_file("/workspace/.site.py", RELAY_SITE)
        sb.exec_async(["python3", "-I", "-S", "/workspace/.site.py"], cwd="/", timeout=120)
        wait_for_port(sb, 8125)
        url = sb.expose_port(8125).url
        for path in ("/", "/x%E2%82%AC?q=\u00e9", "/b\u00fccher.example"):
            got = httpx.get(url.rstrip("/") + path, timeout=20)
            assert got.status_code < 500, got.text  # (a non-ASCII path is a 400)
        sb.set_network_policy(NetworkPolicy(mode="none"))
        assert _pwned(sb) == []
        snap = sb.snapshot()
        sb.restore(snap.id)  # a fresh agent boots on the planted upper layer
        sb.exec("echo after restore")
        sb.read_text("/workspace/a/b.txt")
        sb.download_dir("/workspace/a")
        assert _pwned(sb) == []
        assert sb.exec("cat /proc/1/cmdline | tr '\\0' ' '").stdout.count("/") == 0  # no host path in it
