"""The agent's protocol against a real agent process (unisolated, on a Unix socket and on TLS/TCP).

Process-tree kills with escaped grandchildren, OOM and isolation need a real sandbox: see
test_local_backend.py and test_isolation.py.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from sandbox_service import errors
from sandbox_service.agent import protocol
from sandbox_service.agent_link.client import AgentClient
from sandbox_service.agent_link.base import AgentUnreachableError
from sandbox_service.agent_link.tls import make_ca, make_server_cert
from sandbox_service.backends.base import AgentEndpoint
from sandbox_service.models import ExecOutcome, ExecRequest

REPO = Path(__file__).resolve().parents[2]
SECRET = "agent-test-secret"
LAUNCH = (
    f"import sys; sys.path.insert(0, {str(REPO)!r}); from sandbox_service.agent.__main__ import main; sys.exit(main())"
)


def _start_agent(tmp: Path, *listen: str) -> subprocess.Popen:
    (tmp / "secret").write_text(SECRET)
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            LAUNCH,
            *listen,
            "--secret-file",
            str(tmp / "secret"),
            "--workspace",
            str(tmp / "ws"),
            "--ready-fd",
            str(ready_w),
        ],
        pass_fds=(ready_w,),
        start_new_session=True,
    )
    os.close(ready_w)
    with os.fdopen(ready_r) as ready:
        line = ready.readline()
    assert '"ok": true' in line, line
    return proc


@pytest.fixture(scope="module")
def agent_dir():
    with tempfile.TemporaryDirectory(prefix="agt") as d:
        tmp = Path(d)
        proc = _start_agent(tmp, "--unix", str(tmp / "a.sock"))
        yield tmp
        os.killpg(proc.pid, 9)
        proc.wait()


def run(agent_dir: Path, coro_fn, secret: str = SECRET):
    async def main():
        client = AgentClient(AgentEndpoint(transport="unix", address=str(agent_dir / "a.sock"), secret=secret))
        try:
            return await coro_fn(client)
        finally:
            await client.close()

    return asyncio.run(main())


def ex(command, **kw) -> ExecRequest:
    return ExecRequest(command=command, **kw)


async def _exec(c: AgentClient, command, cap: int = 1 << 20, **kw):
    return await c.exec(ex(command, **kw), workdir="", env={"ORCH_BASE": "base"}, max_output_bytes=cap)


def test_ping_and_wrong_secret_refused(agent_dir):
    info = run(agent_dir, lambda c: c.ping())
    assert info["version"] == "1" and info["isolation"] == "none"
    with pytest.raises(errors.UnauthorizedError):
        run(agent_dir, lambda c: c.ping(), secret="wrong")
    # a raw frame without any secret is refused too
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(agent_dir / "a.sock"))
        protocol.send_frame(s, {"op": "exec", "argv": ["touch", str(agent_dir / "ws" / "pwned")]})
        header, _ = protocol.recv_frame(s)
    assert header["code"] == "unauthorized"
    assert not (agent_dir / "ws" / "pwned").exists()


def test_exec_exit_codes_env_stdin_cwd(agent_dir):
    async def body(c):
        ok = await _exec(c, ["sh", "-c", "echo $ORCH_BASE $X; pwd"], env={"X": "req"}, cwd="sub")
        fail = await _exec(c, "echo oops >&2; exit 7")
        missing = await _exec(c, ["/no/such/binary"])
        cat = await _exec(c, ["cat"], stdin="fed through stdin")
        signalled = await _exec(c, "kill -TERM $$")
        return ok, fail, missing, cat, signalled

    (agent_dir / "ws" / "sub").mkdir(exist_ok=True)
    ok, fail, missing, cat, signalled = run(agent_dir, body)
    assert ok.outcome is ExecOutcome.ok and ok.stdout == f"base req\n{agent_dir / 'ws' / 'sub'}\n"
    assert fail.outcome is ExecOutcome.command_failed and fail.exit_code == 7 and fail.stderr == "oops\n"
    assert missing.exit_code == 127 and "not found" in missing.stderr
    assert cat.stdout == "fed through stdin"
    assert signalled.exit_code == -15
    assert ok.duration_seconds > 0


def test_output_cap_sets_truncated_flags(agent_dir):
    r = run(agent_dir, lambda c: _exec(c, "head -c 300000 /dev/zero | tr '\\0' a; echo -n err >&2", cap=1000))
    assert r.stdout == "a" * 1000 and r.stdout_truncated
    assert r.stderr == "err" and not r.stderr_truncated


def test_timeout_kills_process_group_children_and_escapees(agent_dir):
    marker = f"{time.time() % 1000:.4f}"
    start = time.monotonic()
    # 2: own session; 4: double fork + setsid, so neither a descendant nor in the session (found by
    # its ORCHARD_EXEC_ID, as no cgroup tracks an unisolated agent's commands)
    r = run(
        agent_dir,
        lambda c: _exec(
            c,
            f"sleep 1{marker} & setsid sleep 2{marker} & (setsid sleep 4{marker} &); sleep 3{marker}",
            timeout_seconds=0.5,
        ),
    )
    # -9: the shell itself got the SIGKILL; 137: under load the shell saw its child die first and reported
    # it before its own kill landed. Either way the whole tree is gone (checked below).
    assert r.outcome is ExecOutcome.command_timeout and r.exit_code in (-9, 137)
    assert time.monotonic() - start < 3
    time.sleep(0.1)
    assert not _procs_with(marker)


def _procs_with(marker: str) -> list[str]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmd and "sleep" in cmd:
                found.append(cmd)
    return found


def test_files_round_trip_and_listing(agent_dir):
    async def body(c):
        await c.write_file("dir/a.bin", bytes(range(256)) * 10, mode=0o600)
        data = await c.read_file(str(agent_dir / "ws" / "dir" / "a.bin"))  # absolute inside the workspace
        entries = await c.list_files("dir")
        return data, entries

    data, entries = run(agent_dir, body)
    assert data == bytes(range(256)) * 10
    assert [(e.name, e.type, e.size) for e in entries] == [("a.bin", "file", 2560)]
    assert (agent_dir / "ws" / "dir" / "a.bin").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("path", ["../outside", "dir/../../outside", "/etc/passwd", "/"])
def test_traversal_and_absolute_paths_refused(agent_dir, path):
    with pytest.raises(errors.PathOutsideSandboxError):
        run(agent_dir, lambda c: c.read_file(path))
    with pytest.raises(errors.PathOutsideSandboxError):
        run(agent_dir, lambda c: c.write_file(path, b"x"))


def test_symlink_escape_refused_and_missing_file(agent_dir):
    ws = agent_dir / "ws"
    (ws / "link_out").unlink(missing_ok=True)
    (ws / "link_out").symlink_to("/etc")
    (ws / "file_link").unlink(missing_ok=True)
    (ws / "file_link").symlink_to("/etc/hostname")
    for path in ("link_out/passwd", "file_link"):
        with pytest.raises(errors.PathOutsideSandboxError):
            run(agent_dir, lambda c: c.read_file(path))
    with pytest.raises(errors.PathOutsideSandboxError):
        run(agent_dir, lambda c: c.write_file("link_out/evil", b"x"))
    with pytest.raises(errors.PathOutsideSandboxError):
        run(agent_dir, lambda c: c.list_files("link_out"))
    with pytest.raises(errors.FileNotFoundInSandboxError):
        run(agent_dir, lambda c: c.read_file("no/such/file"))


def _tar(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def test_archive_round_trip(agent_dir):
    async def body(c):
        await c.put_archive("arch", _tar({"a.txt": b"A", "sub/b.txt": b"B"}))
        return await c.get_archive("arch")

    blob = run(agent_dir, body)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        names = {m.name: (tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}
    assert names["a.txt"] == b"A" and names["sub/b.txt"] == b"B"


@pytest.mark.parametrize(
    "bad",
    [
        {"members": {"../escape.txt": b"x"}},
        {"members": {"/tmp/abs.txt": b"x"}},
        {"members": {}, "links": {"out": "/etc"}},
    ],
)
def test_archive_escape_refused_before_extracting(agent_dir, bad):
    blob = _tar({"first_ok.txt": b"ok", **bad["members"]}, bad.get("links"))
    with pytest.raises(errors.PathOutsideSandboxError):
        run(agent_dir, lambda c: c.put_archive("evil", blob))
    assert not (agent_dir / "ws" / "evil" / "first_ok.txt").exists()
    assert not (agent_dir / "escape.txt").exists()


def test_pty_echo_and_resize(agent_dir):
    async def body(c):
        pty = await c.open_pty(["/bin/sh"], rows=30, cols=100)
        await pty.write(b"stty size; echo hello-$((6*7))\n")
        out = b""
        deadline = time.monotonic() + 10
        while b"hello-42" not in out and time.monotonic() < deadline:
            out += await asyncio.wait_for(pty.read(), 10)
        await pty.resize(40, 120)
        await pty.write(b"stty size; exit 3\n")
        while True:
            chunk = await asyncio.wait_for(pty.read(), 10)
            if not chunk:
                break
            out += chunk
        await pty.close()
        return out, pty.exit_code

    out, code = run(agent_dir, body)
    assert b"30 100" in out and b"hello-42" in out and b"40 120" in out
    assert code == 3


def test_http_relay_to_port_inside(agent_dir):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=agent_dir / "ws",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    (agent_dir / "ws" / "page.html").write_text("<h1>relayed</h1>")
    try:

        async def body(c):
            for _ in range(100):
                status, headers, data = await c.http_request(port, "GET", "/page.html", {"X-Test": "1"}, b"")
                if status != 502:
                    return status, headers, data
                await asyncio.sleep(0.05)
            return status, headers, data

        status, headers, data = run(agent_dir, body)
        assert status == 200 and data == b"<h1>relayed</h1>"
        status, _, data = run(agent_dir, lambda c: c.http_request(1, "GET", "/", {}, b""))
        assert status == 502 and b"port 1" in data
    finally:
        server.kill()
        server.wait()


def test_unreachable_agent_raises(tmp_path):
    ep = AgentEndpoint(transport="unix", address=str(tmp_path / "none.sock"), secret="x")
    with pytest.raises(AgentUnreachableError):
        asyncio.run(AgentClient(ep).ping())


def test_tls_on_loopback_verifies_the_ca(tmp_path):
    ca = make_ca()
    cert_pem, key_pem = make_server_cert(ca)
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(key_pem)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = _start_agent(
        tmp_path,
        "--tcp",
        f"127.0.0.1:{port}",
        "--tls-cert",
        str(tmp_path / "cert.pem"),
        "--tls-key",
        str(tmp_path / "key.pem"),
    )
    try:
        ep = AgentEndpoint(
            transport="tcp", address=f"127.0.0.1:{port}", secret=SECRET, tls=True, ca_cert_pem=ca.cert_pem.decode()
        )

        async def body():
            c = AgentClient(ep)
            try:
                return await c.ping(), await _exec(c, "echo over-tls")
            finally:
                await c.close()

        info, r = asyncio.run(body())
        assert info["ok"] and r.stdout == "over-tls\n"
        other = make_ca()  # a client trusting another CA must refuse the agent
        bad = ep.model_copy(update={"ca_cert_pem": other.cert_pem.decode()})
        with pytest.raises(AgentUnreachableError):
            asyncio.run(AgentClient(bad).ping())
        with socket.create_connection(("127.0.0.1", port)) as plain:  # plaintext is never answered
            plain.settimeout(5)
            protocol.send_frame(plain, {"op": "ping", "secret": SECRET})
            try:
                data = plain.recv(4096)
            except OSError:
                data = b""
            assert b'"ok":true' not in data
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_cancelled_call_closes_its_connection(agent_dir):
    """A call cancelled mid-exec (service-side timeout, job cancel) must neither leak its connection
    nor return it to the pool (a late reply would be read as the next call's answer)."""

    async def body(c):
        opened = []
        connect = c._connect

        async def tracking_connect():
            conn = await connect()
            opened.append(conn)
            return conn

        c._connect = tracking_connect
        task = asyncio.ensure_future(_exec(c, ["sleep", "5"], timeout_seconds=10))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(opened) == 1 and opened[0].writer.is_closing()
        assert opened[0] not in c._idle
        with pytest.raises(asyncio.TimeoutError):  # the same through wait_for, as operations.py does it
            await asyncio.wait_for(_exec(c, ["sleep", "5"], timeout_seconds=10), 0.3)
        assert len(opened) == 2 and opened[1].writer.is_closing() and not c._idle
        result = await _exec(c, ["echo", "after"])  # the client still works, on a fresh connection
        assert result.stdout == "after\n" and len(opened) == 3

    run(agent_dir, body)
