"""LocalBackend with real sandboxes (root, namespaces, overlay, cgroups): lifecycle, limits, OOM,
fork bombs, process-tree kills, network modes, snapshots, orphans, and that stop() leaves nothing."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from sandbox_service import errors
from sandbox_service.agent_link.client import AgentClient
from sandbox_service.backends.local.backend import LocalBackend, LocalBackendConfig
from sandbox_service.errors import IsolationUnavailableError
from sandbox_service.models import ExecOutcome, ExecRequest, InfraErrorKind, NetworkPolicy, Resources, SandboxCreate

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def backend():
    try:
        state = tempfile.mkdtemp(prefix="orb", dir="/tmp")
        b = LocalBackend(LocalBackendConfig(state_dir=state))
    except IsolationUnavailableError as exc:
        pytest.skip(f"no isolation on this machine: {exc}")
    yield b
    for orphan in b.list_orphans() + list(b._records):
        b.stop(orphan)
    b.close()
    shutil.rmtree(state, ignore_errors=True)


class Box:
    """A started sandbox plus a sync facade over its AgentClient (one event loop per box)."""

    def __init__(self, backend: LocalBackend, spec: SandboxCreate | None = None, **res):
        self.backend = backend
        self.id = f"t-{uuid.uuid4().hex[:10]}"
        spec = spec or SandboxCreate()
        self.spec = spec
        self.resources = spec.resources.model_copy(update=res)
        self.endpoint = backend.start(self.id, spec, self.resources, secrets.token_hex(16))
        self.loop = asyncio.new_event_loop()
        self.client = AgentClient(self.endpoint)

    def call(self, coro):
        return self.loop.run_until_complete(coro)

    def sh(self, command, timeout: float = 30, cap: int = 1 << 20, **kw):
        return self.call(
            self.client.exec(
                ExecRequest(command=command, timeout_seconds=timeout, **kw),
                workdir=self.spec.workdir,
                env=self.spec.env,
                max_output_bytes=cap,
            )
        )

    def close(self):
        self.call(self.client.close())
        self.loop.close()
        self.backend.stop(self.id)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _host_leftovers(backend: LocalBackend, sandbox_id: str) -> list[str]:
    state = str(backend.state_dir)
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                groups = (p / "cgroup").read_text()
            except OSError:
                continue
            if f"/{sandbox_id}" in groups:  # the agent's command line names no host path: go by its cgroups
                found.append(f"process {p.name}")
    found += [f"mount {line}" for line in Path("/proc/self/mountinfo").read_text().splitlines() if state in line]
    found += [f"cgroup {d}" for d in backend._cgroups(sandbox_id).dirs.values() if d.exists()]
    if (backend.state_dir / "s" / sandbox_id).exists():
        found.append("state dir")
    return found


def test_start_exec_stop_leaves_nothing(backend):
    start = time.monotonic()
    box = Box(backend, memory_mb=256, cpu=0.5, pids=100)
    ready_s = time.monotonic() - start
    info = box.call(box.client.ping())
    assert info["pid"] == 1 and info["isolation"] == "namespaces" and info["cgroup_tracking"]
    r = box.sh("echo hello; hostname; cat /proc/self/cgroup")
    assert r.ok and r.stdout.startswith("hello\nsbx-")
    limits = backend.cgroups(box.id).limits()
    assert limits == {"memory_bytes": 256 << 20, "cpu_quota_us": 50_000, "pids_max": 100}
    assert backend.status(box.id).alive
    assert ready_s < 2.0, f"create-to-ready took {ready_s:.2f} s"
    box.close()
    assert _host_leftovers(backend, box.id) == []
    backend.stop(box.id)  # idempotent
    with pytest.raises(errors.SandboxNotFoundError):
        backend.status(box.id)


def test_timeout_kills_escaped_grandchildren(backend):
    marker = f"{secrets.randbelow(10**6)}"
    with Box(backend) as box:
        cmd = (
            f"sleep 1{marker} & (setsid sleep 2{marker} &) ; nohup setsid sh -c 'sleep 3{marker}' "
            f">/dev/null 2>&1 & sleep 4{marker}"
        )
        r = box.sh(cmd, timeout=0.5)
        assert r.outcome is ExecOutcome.command_timeout and r.exit_code == -9
        ps = box.sh(["ps", "-eo", "pid,args"])
        assert marker not in ps.stdout, ps.stdout
        # a command that legitimately backgrounds a server and returns keeps it running
        r = box.sh(f"nohup sleep 5{marker} >/dev/null 2>&1 &")
        assert r.ok and r.duration_seconds < 1.0
        assert f"sleep 5{marker}" in box.sh(["ps", "-eo", "args"]).stdout


def test_memory_hog_is_oom_killed_and_agent_survives(backend):
    with Box(backend, memory_mb=64) as box:
        r = box.sh(["python3", "-c", "x = b'a' * (400 << 20); print(len(x))"])
        # the command's own OOM is its outcome (the policy's), never an infrastructure error
        assert r.outcome is ExecOutcome.command_failed and r.reason == "oom" and r.infra_error is None, r
        assert r.exit_code == -9
        assert box.call(box.client.ping())["pid"] == 1
        status = backend.status(box.id)
        assert status.alive and status.infra_error is InfraErrorKind.OOM_KILLED
        assert box.sh("echo still-here").stdout == "still-here\n"
        # through a shell that reports its child's death as 137
        r = box.sh("python3 -c \"x = b'a' * (400 << 20)\"; exit $?")
        assert r.exit_code == 137 and r.reason == "oom" and r.outcome is ExecOutcome.command_failed, r
        # a verification run (marked by the harness) that runs out of memory is the infrastructure's
        r = box.sh(["python3", "-c", "x = b'a' * (400 << 20)"], verification=True)
        assert r.outcome is ExecOutcome.infrastructure_error and r.infra_error is InfraErrorKind.OOM_KILLED, r


def test_fork_bomb_is_contained_and_agent_survives(backend):
    with Box(backend, pids=32) as box:
        r = box.sh("bomb() { bomb | bomb & }; bomb; sleep 2", timeout=3)
        assert r.outcome in (ExecOutcome.command_timeout, ExecOutcome.ok, ExecOutcome.command_failed)
        assert box.call(box.client.ping(timeout=5))["pid"] == 1  # a new connection needs a new agent thread
        current = int((backend.cgroups(box.id).work_pids_dir / "pids.current").read_text())
        assert current <= 32
        after = box.sh("echo ok", timeout=5)  # answers (ran, or could not fork: never an exception)
        assert after.ok or (after.exit_code is None and "could not start" in after.message), after
    assert _host_leftovers(backend, box.id) == []


def _host_server(host: str) -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, 0))
    srv.listen(16)

    def accept_loop():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(b"host-says-hi")
            conn.close()

    threading.Thread(target=accept_loop, daemon=True).start()
    return srv, srv.getsockname()[1]


CONNECT = (
    "import socket,sys\ntry:\n s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)\n"
    " print('CONNECTED', s.recv(100).decode())\nexcept OSError as e:\n print('FAILED', e)\n"
)


def test_no_network_by_default_and_loopback_mode(backend):
    srv, port = _host_server("127.0.0.1")
    try:
        with Box(backend) as box:
            r = box.sh(["python3", "-c", CONNECT, "127.0.0.1", str(port)])
            assert r.stdout.startswith("FAILED"), r.stdout
            assert "state DOWN" in box.sh("ip link show lo").stdout
            backend.apply_network_policy(box.id, NetworkPolicy(mode="loopback"))
            box.sh("nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &")
            for _ in range(100):
                status, _, body = box.call(box.client.http_request(8765, "GET", "/", {}, b""))
                if status == 200:
                    break
                time.sleep(0.05)
            assert status == 200 and b"Directory listing" in body
            r = box.sh(["python3", "-c", CONNECT, "127.0.0.1", str(port)])  # its own lo, not the host's
            assert r.stdout.startswith("FAILED"), r.stdout
    finally:
        srv.close()


def test_allowlist_reaches_only_listed_addresses_and_changes_live(backend, host_addresses):
    allowed, denied = host_addresses
    srv, port = _host_server("0.0.0.0")
    try:
        spec = SandboxCreate(network=NetworkPolicy(mode="allowlist", allow_cidrs=[f"{allowed}/32"]))
        with Box(backend, spec) as box:
            ok = box.sh(["python3", "-c", CONNECT, allowed, str(port)])
            assert ok.stdout.strip() == "CONNECTED host-says-hi", ok.stdout
            for target in (denied, "127.0.0.1"):
                r = box.sh(["python3", "-c", CONNECT, target, str(port)])
                assert r.stdout.startswith("FAILED"), (target, r.stdout)
            r = box.sh("ip route add default dev eth0")  # commands cannot widen their own policy
            assert not r.ok
            veth = f"orc{backend.record(box.id).net_index:x}h"
            assert subprocess.run(["ip", "link", "show", veth], capture_output=True).returncode == 0
            backend.apply_network_policy(box.id, NetworkPolicy(mode="none"))
            r = box.sh(["python3", "-c", CONNECT, allowed, str(port)])
            assert r.stdout.startswith("FAILED"), r.stdout
            assert subprocess.run(["ip", "link", "show", veth], capture_output=True).returncode != 0
        assert _host_leftovers(backend, box.id) == []
    finally:
        srv.close()


def test_snapshot_restore_and_fork(backend):
    snap = f"snap-{uuid.uuid4().hex[:8]}"
    with Box(backend) as box:
        box.call(box.client.write_file("state.txt", b"v1"))
        assert box.sh("echo sys > /etc/orchard-snap-test && rm /etc/hostname").ok
        size = backend.snapshot(box.id, snap)
        assert size > 0
        box.call(box.client.write_file("state.txt", b"v2"))
        box.sh("rm /etc/orchard-snap-test; touch /workspace/later.txt")
        backend.restore(box.id, snap)
        # the same endpoint and client keep working after the agent restarted
        assert box.call(box.client.read_file("state.txt")) == b"v1"
        r = box.sh("cat /etc/orchard-snap-test; ls /workspace; test -e /etc/hostname || echo no-hostname")
        assert r.stdout == "sys\nstate.txt\nno-hostname\n", r.stdout
        with Box(backend, SandboxCreate(from_snapshot=snap)) as fork:
            assert fork.call(fork.client.read_file("state.txt")) == b"v1"
            fork.call(fork.client.write_file("state.txt", b"fork"))
        assert box.call(box.client.read_file("state.txt")) == b"v1"
    assert not Path("/etc/orchard-snap-test").exists()
    backend.delete_snapshot(snap)
    backend.delete_snapshot(snap)
    with pytest.raises(errors.SnapshotNotFoundError):
        backend.start("t-nosnap", SandboxCreate(from_snapshot=snap), Resources(), "s")


def _uid_base(box):
    return box.sh("cat /proc/self/uid_map").stdout.split()[1]


def test_a_fork_mounts_the_snapshot_as_a_layer_copies_nothing_and_a_layer_outlives_its_name(backend):
    """Forks and restores used to copy the snapshot into the new upper layer (cp -a, then a chown pass into
    the new id range): a fork of a big tree cost its size in time and in the fork's memory-backed disk. Now
    the snapshot is a read-only layer the fork mounts through its own id range, and a snapshot of the fork
    saves only what the fork changed, over the same layer."""
    first, second = f"snap-{uuid.uuid4().hex[:8]}", f"snap-{uuid.uuid4().hex[:8]}"
    with Box(backend) as box:
        assert box.sh(
            "head -c 8M /dev/urandom > /workspace/big.bin && mkdir /workspace/d && echo x > /workspace/d/x"
            " && rm /etc/hostname && sha256sum /workspace/big.bin > /workspace/sum"
        ).ok
        backend.snapshot(box.id, first)
        (layer,) = backend.snapshots.meta(first)["layers"]
        on_disk = backend.snapshots.layer(layer) / "workspace" / "big.bin"
        assert (on_disk.stat().st_uid, on_disk.stat().st_gid) == (0, 0)  # saved from id 0, for any range
        with Box(backend, SandboxCreate(from_snapshot=first)) as fork:
            assert _uid_base(fork) != _uid_base(box)
            assert os.listdir(backend._dir(fork.id).upper) == []  # nothing copied
            assert backend.record(fork.id).layers == [layer]
            r = fork.sh(
                "sha256sum -c /workspace/sum && stat -c '%u %g' /workspace/big.bin /workspace/d/x"
                " && test ! -e /etc/hostname && df -k /workspace | tail -1"
            )
            assert r.ok and "big.bin: OK\n0 0\n0 0\n" in r.stdout, r.stdout
            assert int(r.stdout.split()[-4]) < 2048, r.stdout  # the fork's disk holds none of the 8 MiB
            assert fork.sh("echo more >> /workspace/d/x && rm /workspace/big.bin && touch /workspace/new").ok
            assert on_disk.exists() and (on_disk.parent / "d" / "x").read_text() == "x\n"  # the layer is read-only
            added = backend.snapshot(fork.id, second)
            chain = backend.snapshots.meta(second)["layers"]
            assert added < 1024 and chain[1:] == [layer]
            backend.delete_snapshot(first)  # its name goes; its layer stays: the fork and `second` use it
            with pytest.raises(errors.SnapshotNotFoundError):
                backend.start("t-gone", SandboxCreate(from_snapshot=first), Resources(), "s")
            assert backend.snapshots.layer(layer).is_dir()
        with Box(backend, SandboxCreate(from_snapshot=second)) as grandchild:
            r = grandchild.sh("cat /workspace/d/x; ls /workspace; stat -c %u /workspace/d/x")
            assert r.stdout == "x\nmore\nd\nnew\nsum\n0\n", r.stdout
            backend.restore(box.id, second)  # the original sandbox onto the chain: no copy either
            assert os.listdir(backend._dir(box.id).upper) == []
            assert box.sh("cat /workspace/d/x").stdout == "x\nmore\n"
        backend.delete_snapshot(second)
        assert backend.snapshots.layer(layer).is_dir()  # `box` still runs on it
    assert not any(backend.snapshots.layer(name).exists() for name in chain)  # their last user is gone


def test_a_chain_deeper_than_the_limit_is_folded_into_one_layer_that_shows_the_same_tree(tmp_path):
    """Each snapshot of a forked sandbox adds a layer; past `snapshot_max_layers` the chain is folded into
    one (whiteouts, opaque directories, a file replacing a directory and the reverse): the tree a fork of
    the folded snapshot sees is the tree the sandbox saw."""
    state = tempfile.mkdtemp(prefix="orb", dir="/tmp")
    b = LocalBackend(LocalBackendConfig(state_dir=state, snapshot_max_layers=2))
    tree = (  # sizes of files only: a directory's differs between tmpfs and the state dir's filesystem
        "find /workspace /etc -xdev -printf '%p %y %m %u\\n' | sort; find /workspace -type f -exec md5sum {} + | sort;"
        " cat /etc/hostname /workspace/a/in"
    )
    steps = [
        "mkdir -p /workspace/d /workspace/o /workspace/a && echo x > /workspace/d/x && echo y > /workspace/d/y"
        " && touch /workspace/o/1 /workspace/o/2 /workspace/a/in && rm /etc/hostname",
        "rm /workspace/d/x && rm -r /workspace/o && mkdir /workspace/o && touch /workspace/o/3"
        " && rm -r /workspace/a && echo file > /workspace/a",
        "echo back > /etc/hostname && rm /workspace/a && mkdir /workspace/a && echo dir > /workspace/a/in"
        " && chmod 750 /workspace/d",
    ]
    try:
        box, snap = Box(b), None
        for i, step in enumerate(steps):
            assert box.sh(step).ok, step
            expected = box.sh(tree).stdout
            b.snapshot(box.id, f"s{i}")
            box.close()
            snap = f"s{i}"
            box = Box(b, SandboxCreate(from_snapshot=snap))
            assert box.sh(tree).stdout == expected, (snap, b.snapshots.meta(snap))
        assert [len(b.snapshots.meta(f"s{i}")["layers"]) for i in range(3)] == [1, 2, 1]
        assert "/workspace/o/3" in expected and "/workspace/o/1" not in expected and "back\ndir\n" in expected
        box.close()
    finally:
        for sandbox_id in list(b._records):  # a failed step must not leave a sandbox running
            b.stop(sandbox_id)
        b.close()
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "/workspace"])
def test_filling_files_to_the_memory_limit_fails_that_command_and_the_next_one_runs(backend, where):
    """tmpfs pages count against the memory limit and cannot be reclaimed: filling /tmp (1 GiB tmpfs)
    in a 128 MiB sandbox left the memory full, so the *next* command was OOM-killed, then the agent
    (SANDBOX_CRASHED, an infrastructure error). All of them are one pool now, below the memory limit."""
    with Box(backend, memory_mb=128, disk_mb=512) as box:
        fill = box.sh(f"head -c 300M /dev/zero > {where}/fill")
        assert fill.outcome is ExecOutcome.command_failed and "No space left" in fill.stderr, fill
        after = box.sh("echo next; python3 -c 'print(len(bytearray(16 << 20)))'")
        assert after.ok and after.stdout == f"next\n{16 << 20}\n", after
        status = backend.status(box.id)
        assert status.alive and status.infra_error is None, status


def test_each_sandbox_gets_its_own_id_range_from_a_pool_returned_on_delete(tmp_path):
    """Every sandbox's root used to be the same host uid (shared per-user kernel counters, one delegated
    cgroup owner for all): now a range per sandbox, from a pool of configurable size."""
    state = tempfile.mkdtemp(prefix="orb", dir="/tmp")
    b = LocalBackend(
        LocalBackendConfig(
            state_dir=state, userns_base=2_000_000_000, userns_pool_size=2, userns_slot_dir=tmp_path / "slots"
        )
    )
    try:
        with Box(b, memory_mb=128) as one, Box(b, memory_mb=128) as two:
            bases = {box.sh("cat /proc/self/uid_map").stdout.split()[1] for box in (one, two)}
            assert bases == {"2000000000", "2000065536"}
            assert all(
                b._cgroups(box.id).work_pids_dir.stat().st_uid == int(b._uid_base(b.record(box.id)))
                for box in (one, two)
            )  # each delegated cgroup is its own sandbox's uid's
            with pytest.raises(errors.BackendUnavailableError, match="all 2 sandbox id ranges"):
                Box(b, memory_mb=128)
            freed = one.sh("cat /proc/self/uid_map").stdout.split()[1]
            one.close()
            with Box(b, memory_mb=128) as three:  # the deleted sandbox's range went back to the pool
                assert three.sh("cat /proc/self/uid_map").stdout.split()[1] == freed
            one.close = lambda: None
    finally:
        b.close()
        shutil.rmtree(state, ignore_errors=True)


def test_orphans_of_a_crashed_service_are_found_and_stopped(backend):
    box = Box(backend)
    try:
        second = LocalBackend(LocalBackendConfig(state_dir=backend.state_dir))  # a restarted service
        assert box.id in second.list_orphans()
        second.stop(box.id)
        assert _host_leftovers(backend, box.id) == []
        assert not backend.status(box.id).alive if (backend.state_dir / "s" / box.id).exists() else True
    finally:
        box.call(box.client.close())
        backend.stop(box.id)


def test_bad_image_and_unisolated_mode(tmp_path):
    state = tempfile.mkdtemp(prefix="oru", dir="/tmp")
    try:
        b = LocalBackend(LocalBackendConfig(state_dir=state, isolation="none"))
        with pytest.raises(errors.InvalidRequestError):
            b.start("x", SandboxCreate(image=str(tmp_path / "missing")), Resources(), "s")
        with Box(b) as box:
            assert box.call(box.client.ping())["isolation"] == "unisolated"
            assert "unisolated" in b.status(box.id).message
            assert box.sh("pwd").stdout.strip().endswith("/workspace")
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.slow
def test_many_sandboxes_concurrently_leave_nothing(backend):
    """100 sandboxes, 8 at a time: create, one exec, stop; every one works and nothing leaks."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> tuple[bool, float]:
        t0 = time.monotonic()
        box = Box(backend, memory_mb=128, pids=64)
        ready = time.monotonic() - t0
        try:
            return box.sh(f"echo {i}").stdout == f"{i}\n", ready
        finally:
            box.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(100)))
    assert all(ok for ok, _ in results)
    readies = sorted(r for _, r in results)
    print(f"create-to-ready p50 {readies[50] * 1000:.0f} ms, p99 {readies[98] * 1000:.0f} ms")
    assert list((backend.state_dir / "s").iterdir()) == []
    assert not [
        line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(backend.state_dir) in line
    ]


def _tiny_image(root: Path) -> Path:
    """An image directory holding only dash and the libraries it links against."""
    sh = Path(os.path.realpath("/bin/sh"))
    libs = [
        line.split("=>")[-1].split("(")[0].strip()
        for line in subprocess.run(["ldd", str(sh)], capture_output=True, text=True, check=True).stdout.splitlines()
    ]
    for src in [str(sh), *[lib for lib in libs if lib.startswith("/")]]:
        dest = root / src.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(src), dest)
    (root / "bin").mkdir(exist_ok=True)
    (root / "bin" / "sh").symlink_to(f"/{sh.relative_to('/')}")
    for d in ("etc", "tmp", "proc", "dev", "sys", "run"):
        (root / d).mkdir(exist_ok=True)
    return root


def test_custom_image_directory_is_the_root(backend, tmp_path):
    name = f"tiny-{uuid.uuid4().hex[:6]}"
    image = _tiny_image(backend.image_dir / name)
    with Box(backend, SandboxCreate(image=name)) as box:
        r = box.sh("echo from-image; echo /usr/*; test -e /work && echo host-visible || echo host-hidden")
        assert r.stdout.split("\n")[0] == "from-image" and "host-hidden" in r.stdout, r.stdout
        assert "python" not in r.stdout
        # the agent (host interpreter, modules preloaded before the pivot) still does archives
        box.call(box.client.write_file("a/b.txt", b"in image"))
        blob = box.call(box.client.get_archive("a"))
        box.call(box.client.put_archive("copy", blob))
        assert box.call(box.client.read_file("copy/b.txt")) == b"in image"
    assert not (image / "workspace").exists()  # writes went to the sandbox's upper layer
    shutil.rmtree(image)


def test_missing_isolation_is_refused_with_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(IsolationUnavailableError, match="not root.*ORCHARD_UNISOLATED=1"):
        LocalBackend(LocalBackendConfig(state_dir=tmp_path / "state"))
    monkeypatch.setenv("ORCHARD_UNISOLATED", "1")
    assert LocalBackendConfig.from_env(state_dir=tmp_path / "s2").isolation == "none"


def test_start_without_the_zygote_runs_the_agent_through_unshare():
    state = tempfile.mkdtemp(prefix="orb", dir="/tmp")
    b = LocalBackend(LocalBackendConfig(state_dir=state, fast_start=False))
    try:
        with Box(b, memory_mb=128) as box:
            assert box.call(box.client.ping())["pid"] == 1
            assert box.sh("echo via-unshare").stdout == "via-unshare\n"
            assert b.record(box.id).launcher_pid is not None
        assert _host_leftovers(b, box.id) == []
    finally:
        b.close()
        shutil.rmtree(state, ignore_errors=True)


def test_cgroup_v2_files_are_written_as_the_kernel_expects(tmp_path):
    """This machine mounts cgroup v1; the v2 layout is checked on a directory shaped like one."""
    from sandbox_service.backends.local.cgroups import AGENT_PIDS_RESERVE, SandboxCgroups

    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    cg = SandboxCgroups("sb1", "orchard-x", root=tmp_path)
    assert cg.version == 2 and cg.oom_counter == tmp_path / "orchard-x" / "sb1" / "memory.events"
    cg.create(Resources(memory_mb=300, cpu=1.5, pids=40))
    d = tmp_path / "orchard-x" / "sb1"
    assert (tmp_path / "orchard-x" / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (d / "memory.max").read_text() == str(300 << 20)
    assert (d / "cpu.max").read_text() == "150000 100000"
    assert (d / "pids.max").read_text() == str(40 + AGENT_PIDS_RESERVE)
    assert (d / "w" / "pids.max").read_text() == "40"
    assert (d / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert cg.procs_files() == [str(d / "agent" / "cgroup.procs")]  # v2: processes only in leaves
    assert cg.limits() == {"memory_bytes": 300 << 20, "cpu_quota_us": 150000, "pids_max": 40}


def test_the_service_venv_and_its_interpreter_are_bound_read_only_only_without_an_image(backend):
    """`python`/`pytest` on a sandbox's PATH are the service's: its venv and base interpreter are bound
    (wherever they live, even under the sandbox's private /tmp); an image brings its own."""
    import sys

    binds = backend._ro_binds(None)
    assert (
        os.path.realpath(sys.prefix) in binds
        and os.path.realpath(sys.base_prefix) in binds
        or any(os.path.realpath(sys.base_prefix).startswith(b + "/") for b in binds)
    )
    assert backend._ro_binds("/srv/image") == list(backend.config.extra_ro_binds)
