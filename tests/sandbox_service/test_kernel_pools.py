"""No kernel pool that every sandbox shares can be drained by one of them.

Namespaces and per-sandbox uid ranges do not separate every counter: some are one pool for the machine
(fs.aio-max-nr, the ptys of kernel.pty.max, the host's connection table, TCP socket memory, fs.file-max).
One sandbox holding io_setup contexts filled fs.aio-max-nr for the whole machine, and one holding /dev/ptmx
open drained the ptys every other sandbox's openpty (and the service's PTY route) needed. Each test here
drains one pool from a real sandbox of the real service, holds it, and checks that another sandbox, its PTY
route and the host still get what they need; the inventory with the rule for each pool is in
docs/concepts/threat-model.md."""

from __future__ import annotations

import ctypes
import errno
import json
import time

import pytest
from websockets.sync.client import connect

from sandbox_service.backends.local.config import LocalBackendConfig
from sandbox_service.models import NetworkPolicy, Resources, SandboxCreate

pytestmark = pytest.mark.root

# In the sandbox: `hold POOL` takes from POOL until the kernel refuses, prints {"count", "errno"}, and holds
# everything until /workspace/release exists; `use POOL` takes one and prints "OK" or the errno.
POOLS = r"""
import ctypes, ctypes.util, errno, fcntl, json, os, resource, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
librt = ctypes.CDLL(ctypes.util.find_library("rt") or "librt.so.1", use_errno=True)
libc.syscall.restype = ctypes.c_long
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
IPC_CREAT, IPC_PRIVATE, F_SETPIPE_SZ = 0o1000, 0, 1031
NR = {"io_setup": 206, "add_key": 248, "fanotify_init": 300}

class MqAttr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("cur", ctypes.c_long)]

def checked(ret):
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret

def aio(n):
    ctx = ctypes.c_ulong(0)
    checked(libc.syscall(NR["io_setup"], 1024, ctypes.byref(ctx)))
    return ctx

def pipe(n):
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)  # charged to the uid's fs.pipe-user-pages-soft
    return r, w

TAKE = {
    "aio": aio,
    "keys": lambda n: checked(libc.syscall(NR["add_key"], b"user", f"k{n}".encode(), b"x", 1, -2)),
    "fanotify": lambda n: checked(libc.syscall(NR["fanotify_init"], 0, 0)),
    "ptys": lambda n: os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY),
    "pipe buffers": pipe,
    "sysv message queues": lambda n: checked(libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)),
    "sysv semaphores": lambda n: checked(libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600)),
    "sysv shared memory": lambda n: checked(libc.shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0o600)),
    "posix message queues": lambda n: checked(librt.mq_open(f"/q{os.getpid()}-{n}".encode(), os.O_CREAT | os.O_RDWR,
                                                            0o600, ctypes.byref(MqAttr(0, 1, 64, 0)))),
}

pool = sys.argv[2]
if sys.argv[1] == "use":
    try:
        TAKE[pool](0)
        print("OK")
    except OSError as exc:
        print(errno.errorcode.get(exc.errno, exc.errno))
    sys.exit()
open("/workspace/.held", "w").close()  # renamed once held: a full fd table cannot stop the signal
held, err = [], 0
while len(held) < 100000:
    try:
        held.append(TAKE[pool](len(held)))
    except OSError as exc:
        err = exc.errno
        break
print(json.dumps({"count": len(held), "errno": err}), flush=True)
os.rename("/workspace/.held", "/workspace/held")
deadline = time.monotonic() + 120
while not os.path.exists("/workspace/release") and time.monotonic() < deadline:
    time.sleep(0.05)
"""

PTY_MAX = LocalBackendConfig().pty_max
# pool: (what a sandbox gets, the errno the hog stops at): refused (seccomp, nothing taken), capped per
# sandbox (devpts max=, nothing left over for the hog beyond its cap) or per sandbox (its own namespace
# or uid range: the hog drains only its own).
CASES = {
    "aio": ("refused", errno.ENOSYS),
    "keys": ("refused", errno.EPERM),
    "fanotify": ("refused", errno.EPERM),
    "ptys": ("capped", errno.ENOSPC),
    "pipe buffers": ("per sandbox", errno.EPERM),
    "sysv message queues": ("per sandbox", errno.ENOSPC),
    "sysv semaphores": ("per sandbox", errno.ENOSPC),
    "sysv shared memory": ("per sandbox", errno.ENOSPC),
    "posix message queues": ("per sandbox", None),  # EMFILE (RLIMIT_MSGQUEUE, per uid) or ENOSPC (per namespace)
}


@pytest.fixture(scope="module")
def hog_and_other(sandbox_client):
    """Two sandboxes: one drains pools, the other must keep working."""
    with (
        sandbox_client.create(SandboxCreate(labels={"test": "kernel-pools"})) as hog,
        sandbox_client.create(SandboxCreate(labels={"test": "kernel-pools"})) as other,
    ):
        for sb in (hog, other):
            sb.write_file("/workspace/pools.py", POOLS)
        yield hog, other


def pty_route_answers(service, sandbox_id: str) -> str:
    """The service's PTY WebSocket route of `sandbox_id` runs a shell: what it printed (or why it closed)."""
    url = service.url.replace("http://", "ws://") + f"/v1/sandboxes/{sandbox_id}/exec/pty?command=/bin/sh"
    seen = ""
    try:
        with connect(url, additional_headers={"Authorization": f"Bearer {service.token}"}) as ws:
            ws.send("echo pty-$((6*7))\n")
            deadline = time.monotonic() + 15
            while "pty-42" not in seen and time.monotonic() < deadline:
                frame = ws.recv(timeout=max(0.05, deadline - time.monotonic()))
                seen += frame.decode(errors="replace") if isinstance(frame, bytes) else frame
            ws.send("exit\n")
    except Exception as exc:  # noqa: BLE001 - the route closing is the failure this reports
        return f"{seen} CLOSED {exc!r}"
    return seen


def host_io_setup() -> int:
    """0 when this (host) process gets an AIO context, else the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctx = ctypes.c_ulong(0)
    if libc.syscall(206, 1, ctypes.byref(ctx)) < 0:
        return ctypes.get_errno()
    libc.syscall(207, ctx)  # io_destroy
    return 0


@pytest.mark.parametrize("pool", list(CASES))
def test_one_sandbox_draining_a_pool_leaves_other_sandboxes_their_pty_route_and_the_host_working(
    pool, hog_and_other, sandbox_service, sandbox_client
):
    hog, other = hog_and_other
    kind, stop_errno = CASES[pool]
    hog.exec("rm -f /workspace/held /workspace/release")
    job = hog.exec_async(["python3", "/workspace/pools.py", "hold", pool], timeout=180)
    try:
        deadline = time.monotonic() + 120
        while hog.exec("test -e /workspace/held").exit_code != 0:
            assert time.monotonic() < deadline, sandbox_client.get_job(job.id)
            time.sleep(0.1)
        used = other.exec(["python3", "/workspace/pools.py", "use", pool]).stdout.strip()
        pty = pty_route_answers(sandbox_service, other.id)
        host_aio = host_io_setup() if pool == "aio" else 0
        same = hog.exec(["python3", "/workspace/pools.py", "use", pool]).stdout.strip()
    finally:
        hog.exec("touch /workspace/release")
        done = sandbox_client.wait_job(job.id, timeout=120)
    held = json.loads(done.result.stdout)
    assert "pty-42" in pty, f"the other sandbox's PTY route failed while {pool} was drained: {pty}"
    assert host_aio == 0, f"the host got no AIO context: {errno.errorcode[host_aio]}"
    if kind == "refused":
        assert held == {"count": 0, "errno": stop_errno}, held
    else:
        assert used == "OK", f"the other sandbox got no {pool}: {used} (the hog held {held})"
        assert held["count"] > 0 and same != "OK", (held, same)  # the hog did reach its limit
        if stop_errno is not None:
            assert held["errno"] == stop_errno, held
    if kind == "capped":
        assert held["count"] <= PTY_MAX, f"one sandbox held {held['count']} ptys (cap {PTY_MAX})"


def test_the_machine_wide_ceilings_fit_every_sandbox_at_its_caps(sandbox_service):
    """The pty pool holds userns_pool_size sandboxes at pty_max each; pids and open files are bounded per
    sandbox (pids cgroup, memory cgroup) before the machine's ceilings (local/ceilings.py)."""
    from sandbox_service.backends.local.ceilings import wanted

    def sysctl(name: str) -> int:
        return int(open(f"/proc/sys/{name}").read().split()[0])

    config = LocalBackendConfig()
    for name, least in wanted(config.userns_pool_size, config.pty_max, sysctl("kernel/pty/reserve")).items():
        assert sysctl(name) >= least, name


# In the sandbox: TCP connection pairs on its own loopback, each writer filling both buffers with nobody
# reading, until the kernel stops taking bytes; prints the MiB queued and holds them until released.
TCP_HOG = r"""
import os, socket, sys, time
server = socket.create_server(("127.0.0.1", 9999), backlog=1024)
pairs, queued = [], 0
for _ in range(int(sys.argv[1])):
    try:
        client = socket.create_connection(("127.0.0.1", 9999), timeout=2)
        peer, _ = server.accept()
    except OSError:
        break
    for sk in (client, peer):
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    client.setblocking(False)
    try:
        while True:
            queued += client.send(b"x" * 65536)
    except OSError:
        pass
    pairs.append((client, peer))
print(queued >> 20, flush=True)
open("/workspace/held", "w").close()
while not os.path.exists("/workspace/release"):
    time.sleep(0.05)
"""


def global_tcp_memory_mib() -> int:
    """net.ipv4.tcp_mem's counter (pages of every TCP socket of the machine), in MiB."""
    with open("/proc/net/sockstat") as f:
        fields = next(line for line in f if line.startswith("TCP:")).split()
    return int(fields[fields.index("mem") + 1]) * 4096 >> 20


def test_socket_buffers_count_against_the_sandboxs_memory_not_the_machines_tcp_pool(sandbox_client, labels):
    """Socket buffers were charged to no cgroup (cgroup v1 charges them only under a TCP limit): a 128 MiB
    sandbox queued over 1 GiB on its own loopback, out of net.ipv4.tcp_mem, the pool every TCP socket of
    the machine (the service's API among them) draws from."""
    spec = SandboxCreate(labels=labels, network=NetworkPolicy(mode="loopback"), resources=Resources(memory_mb=128))
    with sandbox_client.create(spec) as sb:
        sb.write_file("/workspace/tcp.py", TCP_HOG)
        before = global_tcp_memory_mib()
        job = sb.exec_async(["python3", "/workspace/tcp.py", "200"], timeout=120)
        try:
            deadline = time.monotonic() + 60
            while sb.exec("test -e /workspace/held").exit_code != 0:
                assert time.monotonic() < deadline, sandbox_client.get_job(job.id)
                time.sleep(0.2)
            during = global_tcp_memory_mib()
        finally:
            sb.exec("touch /workspace/release")
            queued = sandbox_client.wait_job(job.id, timeout=60).result.stdout.strip()
        assert during - before <= 160, f"a 128 MiB sandbox took {during - before} MiB of TCP memory ({queued} queued)"
        assert sb.exec("echo alive").stdout == "alive\n"


def test_sandbox_traffic_takes_no_slot_in_the_hosts_connection_table(
    sandbox_client, labels, host_addresses, host_services
):
    """Where the host tracks connections (kubelet's rules make it), every flow of an allowlist sandbox took
    an entry of nf_conntrack_max, one table for the whole host: a sandbox sending from many ports filled it,
    and then the host dropped new connections of its own."""
    import subprocess

    allowed, _ = host_addresses
    tracker = "inet orchard_test_conntrack"  # any ct rule turns connection tracking on in the host's namespace
    subprocess.run(
        ["nft", "-f", "-"],
        check=True,
        text=True,
        input=(
            f"table {tracker} {{\n chain input {{ type filter hook input priority 0; policy accept; "
            "ct state established accept; }\n}\n"
        ),
    )
    try:
        policy = NetworkPolicy(mode="allowlist", allow_cidrs=[f"{allowed}/32"])
        with sandbox_client.create(SandboxCreate(labels=labels, network=policy)) as sb:
            address = sb.exec("ip -o -4 addr show dev eth0").stdout.split()[3].split("/")[0]
            sent = sb.exec(
                [
                    "python3",
                    "-c",
                    "import socket, sys\nn = 0\nfor _ in range(200):\n"
                    " s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)\n"
                    " s.sendto(b'x', (sys.argv[1], int(sys.argv[2])))\n"
                    " n += s.recvfrom(100)[0].startswith(b'HOST-ONLY')\nprint(n)",
                    allowed,
                    str(host_services.ports[1]),
                ]
            )
            assert sent.stdout.strip() == "200", sent  # every datagram answered: the flows did happen
            port = f"port={host_services.ports[1]} "  # this test's flows only (entries outlive a test by 30 s)
            with open("/proc/net/nf_conntrack") as f:
                tracked = [line for line in f if f"={address} " in line and port in line]
        assert tracked == [], f"{len(tracked)} conntrack entries for the sandbox, e.g. {tracked[:2]}"
    finally:
        subprocess.run(["nft", "delete", "table", *tracker.split()], check=False)


# In the sandbox: workers that each open files up to their RLIMIT_NOFILE and hold them, until `target` files
# are open or the kernel refuses one (ENFILE: fs.file-max, one count for every process of the machine);
# prints the files held and how the last worker ended, and holds them until released.
FILE_HOG = r"""
import errno, os, resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
target, total, code = int(sys.argv[1]), 0, "full"
while total < target and code == "full":
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        fds, code = [], "full"
        try:
            while len(fds) < min(hard - 16, target - total):
                fds.append(os.open("/etc/hostname", os.O_RDONLY))
        except OSError as exc:
            code = errno.errorcode.get(exc.errno, str(exc.errno))
        os.write(w, f"{len(fds)} {code}".encode())
        while not os.path.exists("/workspace/release"):
            time.sleep(0.1)
        os._exit(0)
    os.close(w)
    got = os.read(r, 64).split() or [b"0", b"killed"]
    os.close(r)
    total, code = total + int(got[0]), got[1].decode()
print(total, code, flush=True)
open("/workspace/held", "w").close()
while not os.path.exists("/workspace/release"):
    time.sleep(0.1)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sandbox_holding_more_files_than_the_default_ceiling_leaves_the_others_working(
    sandbox_client, sandbox_service, labels
):
    """fs.file-max is one count for the machine (10 % of RAM in KiB: ~2.5M on 24 GiB) and each open file costs
    its sandbox ~0.5 KiB: a 1.5 GiB sandbox could hold them all, and every other sandbox's open, pipe and
    socket failed with ENFILE. With the ceiling raised (local/ceilings.py) only its memory bounds it: here it
    holds more files than the old ceiling while the other sandbox and its PTY route work."""
    with open("/proc/meminfo") as f:
        default_ceiling = int(f.readline().split()[1]) // 10  # the kernel's fs.file-max: RAM in KiB / 10
    target = default_ceiling + 100_000
    memory_mb = (target * 600 >> 20) + 256  # ~0.5 KiB per file, its fd and the workers' own memory
    spec = SandboxCreate(labels=labels, resources=Resources(memory_mb=memory_mb, pids=1024))
    with sandbox_client.create(spec) as hog, sandbox_client.create(SandboxCreate(labels=labels)) as other:
        hog.write_file("/workspace/files.py", FILE_HOG)
        job = hog.exec_async(["python3", "/workspace/files.py", str(target)], timeout=600)
        try:
            deadline = time.monotonic() + 500
            while hog.exec("test -e /workspace/held").exit_code != 0:
                assert time.monotonic() < deadline, sandbox_client.get_job(job.id)
                time.sleep(0.5)
            used = other.exec(["python3", "-c", "import os; os.pipe(); open('/etc/hostname').read(); print('OK')"])
            pty = pty_route_answers(sandbox_service, other.id)
        finally:
            hog.exec("touch /workspace/release")
            held = sandbox_client.wait_job(job.id, timeout=120).result.stdout.split()
        assert used.stdout == "OK\n", used
        assert "pty-42" in pty, pty
        assert held == [str(target), "full"], held  # more files than the old ceiling, and no ENFILE


def neighbour_entries() -> int:
    """The machine's count of IPv4 neighbour entries: one table for every namespace, capped at gc_thresh3."""
    with open("/proc/net/stat/arp_cache") as f:
        return int(f.read().split("\n")[1].split()[0], 16)


def test_sending_anywhere_takes_no_entry_of_the_machines_neighbour_table(sandbox_client, labels):
    """The IPv4 neighbour table is one for the machine (net.ipv4.neigh.default.gc_thresh3, 1024 by default,
    every namespace's entries counted together). A socket bound to the sandbox's interface sent to any
    address as if on-link, and so did one to a multicast group: each destination took an entry, and a
    sandbox sending to a few hundred new ones a second kept the table full, so the host resolved no new
    neighbour (its gateway among them)."""
    policy = NetworkPolicy(mode="allowlist", allow_cidrs=["10.254.253.1/32"])
    with sandbox_client.create(SandboxCreate(labels=labels, network=policy)) as sb:
        before = neighbour_entries()
        sent = sb.exec(
            [
                "python3",
                "-c",
                "import socket\nn = 0\nfor group in ('10.77.%d.%d', '239.77.%d.%d'):\n"
                " s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                " s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b'eth0')\n"
                " for i in range(300):\n  try:\n   s.sendto(b'x', (group % (i // 250, i % 250 + 1), 9)); n += 1\n"
                "  except OSError:\n   pass\nprint(n)",
            ]
        )
        grown = neighbour_entries() - before
    assert sent.exit_code == 0, sent
    assert grown < 30, f"{sent.stdout.strip()} sends took {grown} entries of the machine's neighbour table"
