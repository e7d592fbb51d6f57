"""Attacks from inside real sandboxes against the real service: each test is one attack class
that a policy under RL pressure could use to escape, read what it must not, or pass its own failures
off as the infrastructure's."""

from __future__ import annotations

import os
import signal
import time

import pytest

from sandbox_service.backends import fstree
from sandbox_service.config import ServiceConfig
from sandbox_service.embedded import EmbeddedService
from sandbox_service.models import ExecOutcome, SandboxCreate


def _agent_start_time(sb) -> str:
    return sb.exec("cut -d' ' -f22 /proc/1/stat").stdout.strip()


def test_agent_survives_every_signal_a_sandbox_process_can_send(sandbox_client, labels):
    """`kill -INT 1` used to end the agent, and the exec passed for SANDBOX_CRASHED (an infra error)."""
    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        born = _agent_start_time(sb)
        sigs = " ".join(str(int(s)) for s in sorted(signal.valid_signals()) if 0 < int(s) < 65)
        result = sb.exec(f"for s in {sigs}; do kill -$s 1 2>/dev/null; done; kill -INT 1; echo sent")
        assert result.outcome is ExecOutcome.ok and result.stdout == "sent\n", result
        after = sb.exec("echo alive")
        assert after.ok and after.stdout == "alive\n", after
        assert _agent_start_time(sb) == born  # the same agent, not a recreated sandbox
        assert sb.refresh().escalations == []


# A process in the sandbox that swaps `d` (a real directory) and `l` (a symlink out of the workspace)
# atomically, as fast as it can (renameat2 RENAME_EXCHANGE), for `seconds`.
FLIPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace/race")
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    libc.renameat2(-100, b"d", -100, b"l", 2)
    n += 1
print(n)
"""


def _race(sb, target: str, seconds: float = 4.0):
    sb.exec(
        f"mkdir -p /workspace/race/d && echo inside > /workspace/race/d/secret && ln -sfn {target} /workspace/race/l"
    )
    sb.write_file("/workspace/flip.py", FLIPPER)
    return sb.exec_async(["python3", "/workspace/flip.py", str(seconds)], timeout=seconds + 30)


def test_file_routes_never_follow_a_symlink_swapped_in_during_the_call(sandbox_client, labels):
    """The agent used to check a resolved path and open the unresolved one: a directory swapped for a
    symlink in between let reads, writes and listings of the API land outside the workspace."""
    from sandbox_service.errors import SandboxServiceError

    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        sb.exec("mkdir -p /tmp/out && echo OUTSIDE > /tmp/out/secret && touch /tmp/out/outside-marker")
        job = _race(sb, "/tmp/out")
        leaks, refused, served = [], 0, 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                if sb.read_text("/workspace/race/d/secret").strip() == "OUTSIDE":
                    leaks.append("read /tmp/out/secret")
                sb.write_file("/workspace/race/d/written.txt", "from the API")
                if any(e.name == "outside-marker" for e in sb.list_files("/workspace/race/d")):
                    leaks.append("listed /tmp/out")
                served += 1
            except SandboxServiceError as err:
                assert err.status_code in (400, 404), err  # refused or not there mid-swap: never a 500
                refused += 1
        sandbox_client.wait_job(job.id, timeout=60)
        outside = sb.exec("ls /tmp/out").stdout.split()
        assert "written.txt" not in outside, "a write landed outside the workspace"
        assert not leaks, f"{len(leaks)} escapes, e.g. {leaks[:3]}"
        assert served + refused > 20


def test_exec_cwd_cannot_go_through_the_agents_magic_links(sandbox_client, labels):
    """`cwd=/proc/1/fd/N` (the agent's own fds: its host cgroup directories) used to start the command
    in a host directory, from where it could write another sandbox's cgroup limits."""
    from sandbox_service.errors import PathOutsideSandboxError, SandboxServiceError

    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        sb.exec("ln -sfn /proc/1/fd/3 /workspace/fd3; ln -sfn /proc/1/root /workspace/agentroot")
        cwds = [f"/proc/1/fd/{n}" for n in range(0, 16)] + [
            "/proc/1/root",
            "/proc/1/cwd",
            "/workspace/fd3",
            "/workspace/agentroot",
            "/proc/self/root",
        ]
        refused = 0
        for cwd in cwds:
            try:
                r = sb.exec("pwd -P; ls", cwd=cwd)
            except PathOutsideSandboxError:
                refused += 1
                continue
            except SandboxServiceError as err:
                assert err.status_code in (400, 404), err
                continue
            assert "cgroup.procs" not in r.stdout and "tasks" not in r.stdout.split(), (cwd, r.stdout)
        assert refused >= 5  # every magic link is refused, not just failing to exist
        assert sb.exec("pwd", cwd="/tmp").stdout == "/tmp\n"  # plain directories anywhere still work
        assert sb.exec("pwd").stdout == "/workspace\n"


HOSTILE_TREE = r"""
import os, sys
depth, files = int(sys.argv[1]), int(sys.argv[2])
os.makedirs("/workspace/many", exist_ok=True)
for i in range(files):
    open(f"/workspace/many/f{i}", "w").close()
os.mkdir("/workspace/deep")
os.chdir("/workspace/deep")
for i in range(depth):
    os.mkdir("d")
    os.chdir("d")
os.symlink("/", "root-link")       # links are removed, never followed
os.mkdir("locked", 0)              # and so are directories nobody may enter
print("made")
"""


def _crash(service) -> None:
    service._collect_ids()
    os.killpg(service._proc.pid, signal.SIGKILL)  # no graceful shutdown: everything stays behind
    service._proc.wait()


def _deep_tree_on_host(root, depth: int) -> None:
    """A leftover as a crashed run leaves it (made on the host side: much faster than through an overlay)."""
    root.mkdir(parents=True)
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.symlink("/", "root-link", dir_fd=fd)
    os.close(fd)


@pytest.mark.parametrize(
    "depth, files, fork",
    [
        pytest.param(1100, 1000, False, id="1100-deep"),
        pytest.param(1100, 1000, True, id="1100-deep-with-snapshot-and-fork", marks=pytest.mark.slow),
        pytest.param(
            10_000, 200_000, False, id="10000-deep-200k-files", marks=[pytest.mark.slow, pytest.mark.timeout(1800)]
        ),
    ],
)
def test_hostile_trees_never_break_delete_snapshots_or_a_restart(tmp_path, depth, files, fork):
    """A deep tree made DELETE fail with a RecursionError, left the sandbox half-deleted and the next
    start refused the state dir. Delete (and, slow variant, snapshot and fork) must cope, and a restart
    after a crash removes the orphans and snapshots of the dead run, and says so on /healthz."""
    state_dir = tmp_path / "state"
    local = state_dir / "local"
    crashed = EmbeddedService(ServiceConfig(token="unused", state_dir=state_dir), check_leaks=False)
    crashed.start()
    try:
        with crashed.client(timeout=900) as client:
            sb = client.create(SandboxCreate(labels={"test": "hostile-tree"}))
            sb.write_file("/workspace/tree.py", HOSTILE_TREE)
            made = sb.exec(["python3", "/workspace/tree.py", str(depth), str(files)], timeout=900)
            assert made.stdout == "made\n", made
            orphans, snaps = [], []
            if fork:
                snaps.append(sb.snapshot().id)
                forked = client.create(SandboxCreate(labels={"test": "hostile-tree"}, from_snapshot=snaps[0]))
                assert forked.exec("ls /workspace/many | wc -l").stdout.strip() == str(files)
                orphans.append(forked.id)
            started = time.monotonic()
            sb.delete()
            took = time.monotonic() - started
            assert not (local / "s" / sb.id).exists(), "the sandbox was left half-deleted"
        _crash(crashed)
        if not fork:  # leftovers of a crashed run: an orphaned sandbox dir and a snapshot, both deep
            orphans.append("sb-left0000000000")
            _deep_tree_on_host(local / "s" / orphans[0] / "upper" / "workspace", depth)
            snaps.append("snap-left")
            _deep_tree_on_host(local / "snapshots" / snaps[0] / "upper", depth)
        with EmbeddedService(ServiceConfig(token="unused", state_dir=state_dir)) as restarted:
            with restarted.client() as client:  # the clean-up runs in the background, after listening
                deadline = time.monotonic() + 120
                while not (report := client.healthz()["startup_cleanup"])["finished"] and time.monotonic() < deadline:
                    time.sleep(0.2)
        assert report == {
            "sandboxes_adopted": [],
            "sandboxes_removed": sorted(orphans),
            "snapshots_removed": snaps,
            "errors": [],
            "finished": True,
        }, report
        assert list((local / "s").iterdir()) == [] and list((local / "snapshots").iterdir()) == []
        assert not (local / "quarantine").exists()
        assert crashed.find_leaks() == []
        print(f"delete of a {depth}-deep tree with {files} files: {took:.1f} s")
    finally:
        crashed.stop()
        # pytest's own clean-up of old temp dirs recurses: never leave a deep tree behind, even on failure
        fstree.remove_tree(tmp_path)


HOSTILE_SITE = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"cookie": self.headers.get("cookie"), "auth": self.headers.get("authorization"),
                           "html": "<script>fetch('/v1/sandboxes', {credentials: 'include'})</script>"}).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("set-cookie", "session=stolen; Path=/")
        self.send_header("access-control-allow-origin", "*")
        self.send_header("access-control-allow-credentials", "true")
        self.send_header("content-security-policy", "default-src *")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8124), H).serve_forever()
"""


def test_ports_proxy_confines_sandbox_content_away_from_the_api_origin(sandbox_client, labels, wait_for_port):
    """Sandbox HTML/JS, Set-Cookie and `Access-Control-Allow-Origin: *` used to be served as is on the
    service's own origin (where the API lives)."""
    import httpx

    from sandbox_service.models import NetworkPolicy

    with sandbox_client.create(SandboxCreate(labels=labels, network=NetworkPolicy(mode="loopback"))) as sb:
        sb.write_file("/workspace/site.py", HOSTILE_SITE)
        sb.exec_async(["python3", "/workspace/site.py"], timeout=120)
        wait_for_port(sb, 8124)
        url = sb.expose_port(8124).url
        got = httpx.get(url, headers={"cookie": "api_session=secret", "origin": "https://evil.example"}, timeout=10)
        assert got.status_code == 200
        names = {k.lower() for k in got.headers}
        assert "set-cookie" not in names and not any(n.startswith("access-control-") for n in names), got.headers
        assert got.headers["content-security-policy"].split()[0] == "sandbox"  # an opaque origin
        assert "allow-same-origin" not in got.headers["content-security-policy"]
        assert got.headers["x-content-type-options"] == "nosniff" and got.headers["referrer-policy"] == "no-referrer"
        assert got.json()["cookie"] is None and got.json()["auth"] is None  # no credentials reach the sandbox


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _upload(url: str, token: str, size: int, chunk: bytes) -> int:
    import httpx

    def body():
        for _ in range(size // len(chunk)):
            yield chunk

    r = httpx.put(
        url, content=body(), timeout=600, headers={"authorization": f"Bearer {token}", "content-length": str(size)}
    )
    return r.status_code


@pytest.mark.parametrize(
    "mb",
    [
        pytest.param(32, id="8x32MB"),
        pytest.param(100, id="8x100MB", marks=[pytest.mark.slow, pytest.mark.timeout(1200)]),
    ],
)
def test_concurrent_large_transfers_keep_service_memory_bounded(tmp_path, mb):
    """Uploads were buffered whole (8 concurrent 100 MB uploads: 1.6 GiB of service RSS). Now they are
    streamed to the agent, downloads streamed back, and the size caps answer 413."""
    import concurrent.futures
    import hashlib

    import httpx

    size = mb << 20
    chunk = bytes(range(256)) * 4096  # 1 MiB
    config = ServiceConfig(token="unused", max_request_bytes=size + 1024, max_download_bytes=size)
    with EmbeddedService(config) as service, service.client(timeout=600) as client:
        boxes = [client.create(SandboxCreate(labels={"test": "transfers"})) for _ in range(2)]
        try:
            pid = service._proc.pid
            base = _rss_mb(pid)
            urls = [f"{service.url}/v1/sandboxes/{boxes[i % 2].id}/files?path=/workspace/big{i}" for i in range(8)]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                futures = [pool.submit(_upload, u, service.token, size, chunk) for u in urls]
                peak = base
                while not all(f.done() for f in futures):
                    peak = max(peak, _rss_mb(pid))
                    time.sleep(0.05)
                assert [f.result() for f in futures] == [204] * 8
            growth = peak - base
            print(f"8 concurrent {mb} MB uploads: service RSS {base:.0f} -> peak {peak:.0f} MiB (+{growth:.0f})")
            assert growth < 100, f"service RSS grew by {growth:.0f} MiB during 8 x {mb} MB uploads"
            assert boxes[1].exec("stat -c %s /workspace/big7").stdout.strip() == str(size)
            digest = hashlib.sha256()
            with httpx.stream("GET", urls[7], headers={"authorization": f"Bearer {service.token}"}, timeout=600) as got:
                assert got.status_code == 200 and got.headers["content-length"] == str(size)
                for part in got.iter_bytes():
                    digest.update(part)
            assert digest.hexdigest() == hashlib.sha256(chunk * (size // len(chunk))).hexdigest()
            assert _rss_mb(pid) - base < 100
            # the caps: one byte over the upload limit, and a download over its limit, are 413
            too_big = _upload(urls[0], service.token, size + 2048, b"x" * 1024)
            assert too_big == 413
            boxes[0].exec(f"head -c {size + 1} /dev/zero > /workspace/huge")
            over = httpx.get(
                f"{service.url}/v1/sandboxes/{boxes[0].id}/files?path=/workspace/huge",
                headers={"authorization": f"Bearer {service.token}"},
                timeout=60,
            )
            assert over.status_code == 413 and over.json()["code"] == "request_too_large", over.text
        finally:
            for box in boxes:
                box.delete()


V6_PROBE = r"""
import errno, socket, sys, time
port = int(sys.argv[1])
for addr in sys.argv[2:]:
    deadline = time.monotonic() + 5  # a fresh link-local address is tentative (DAD) for a moment
    while True:
        try:
            socket.create_connection((addr + "%eth0", port), 2).close()
            print("CONNECTED", addr)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            print("FAILED", addr, exc)
        break
"""


def test_no_ipv6_path_out_of_allowlist_mode_and_no_host_loopback(sandbox_client, labels):
    """In allowlist mode the host veth's IPv6 link-local address was reachable (no route needed for
    fe80::/64); in loopback mode the host's own loopback must stay out of reach too."""
    import socket
    import subprocess

    from sandbox_service.models import NetworkPolicy

    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind(("::", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    try:
        policy = NetworkPolicy(mode="allowlist", allow_cidrs=["10.254.253.1/32"])
        with sandbox_client.create(SandboxCreate(labels=labels, network=policy)) as sb:
            inside_v6 = sb.exec("grep -c eth0 /proc/net/if_inet6 || true").stdout.strip()
            peer = sb.exec("cat /sys/class/net/eth0/iflink").stdout.strip()
            assert peer.isdigit(), peer
            host = subprocess.run(["ip", "-6", "-o", "addr", "show"], capture_output=True, text=True).stdout
            host_side = [line.split()[3].split("/")[0] for line in host.splitlines() if line.split(":")[0] == peer]
            # the host side's link-local address, or (once IPv6 is off) the one it would have had
            host_if = next(
                line.split()[1]
                for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
                if line.split(":")[0] == peer
            ).split("@")[0]
            mac = open(f"/sys/class/net/{host_if}/address").read().strip().split(":")
            eui = [int(x, 16) for x in mac]
            eui[0] ^= 2
            derived = "fe80::%02x%02x:%02xff:fe%02x:%02x%02x" % tuple(eui[:3] + eui[3:])
            sb.write_file("/workspace/v6.py", V6_PROBE)
            probe = sb.exec(["python3", "/workspace/v6.py", str(port), *host_side, derived])
            assert "CONNECTED" not in probe.stdout, probe.stdout
            assert inside_v6 == "0", "the sandbox's eth0 has an IPv6 address"
            assert host_side == [], f"the host side of the veth has IPv6 addresses {host_side}"
        with sandbox_client.create(SandboxCreate(labels=labels, network=NetworkPolicy(mode="loopback"))) as sb:
            r = sb.exec(
                [
                    "python3",
                    "-c",
                    "import socket, sys\nfor a in ('127.0.0.1', '::1'):\n"
                    "    try:\n        socket.create_connection((a, int(sys.argv[1])), 2); print('CONNECTED', a)\n"
                    "    except OSError as e:\n        print('FAILED', a, e)",
                    str(port),
                ]
            )
            assert "CONNECTED" not in r.stdout and r.stdout.count("FAILED") == 2, r.stdout
    finally:
        srv.close()


FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def test_a_fork_bomb_is_the_commands_timeout_not_the_services(sandbox_client, labels):
    """A tree that forks faster than a /proc walk can kill it outran the kill loop: the agent did not
    answer within timeout + grace and the exec became the service's TIMEOUT (an infra error the policy
    escapes its reward with). Sealing the command's cgroup (no more forks) and killing it ends it in time."""
    with sandbox_client.create(SandboxCreate(labels=labels)) as sb:
        start = time.monotonic()
        result = sb.exec(["python3", "-c", FORK_BOMB], timeout=3)
        assert result.outcome is ExecOutcome.command_timeout, result
        assert time.monotonic() - start < 3 + 5, "the kill must not take anywhere near the service's grace"
        after = sb.exec("echo alive", timeout=10)
        assert after.ok and after.stdout == "alive\n", after
        assert sb.exec("ps -e --no-headers | wc -l").stdout.strip() in {"1", "2", "3", "4"}  # agent, ps, wc, sh
