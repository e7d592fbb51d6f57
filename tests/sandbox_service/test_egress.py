"""The allowlist is enforced outside the sandbox, whatever socket options its code uses.

The allowlist used to be only routes inside the sandbox's namespace. A socket bound to the sandbox's
interface (SO_BINDTODEVICE, unprivileged since Linux 5.7), given an output interface (IP_UNICAST_IF), or a
UDP datagram naming the interface in its IP_PKTINFO needs no route: the kernel sends it on-link, the host end
of the veth answers ARP for every address the host holds, and every service the host runs on 0.0.0.0
answered. Each test here is that attack from a real sandbox of the real service, against listeners on all
of the host's addresses."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sandbox_service.models import NetworkPolicy, SandboxCreate

pytestmark = pytest.mark.root

# Runs in the sandbox: every way of reaching `target` that needs no route, plus a plain connect. Prints one
# JSON object {target: {method: "ANSWER <reply>" | "NONE <why>"}}.
PROBE = r"""
import json, socket, struct, sys, threading
IP_UNICAST_IF, IP_PKTINFO = 50, 8
tcp_port, udp_port = int(sys.argv[1]), int(sys.argv[2])
targets = sys.argv[3:]
index = socket.if_nametoindex("eth0")

def tcp(target, how):
    s = socket.socket()
    s.settimeout(1.5)
    try:
        if how == "bind":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"eth0")
        elif how == "unicast_if":
            s.setsockopt(socket.IPPROTO_IP, IP_UNICAST_IF, struct.pack("!I", index))  # IPv4: network order
        s.connect((target, tcp_port))
        return "ANSWER " + s.recv(100).decode()
    except OSError as exc:
        return f"NONE {exc}"
    finally:
        s.close()

def udp(target, how):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    try:
        if how == "bind":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"eth0")
        elif how == "unicast_if":
            s.setsockopt(socket.IPPROTO_IP, IP_UNICAST_IF, struct.pack("!I", index))
        for _ in range(3):  # a datagram or its answer may be lost on a busy machine: ask again
            if how == "pktinfo":  # the output interface in each datagram's IP_PKTINFO: no socket option to refuse
                info = struct.pack("@i4s4s", index, bytes(4), bytes(4))
                s.sendmsg([b"ping"], [(socket.IPPROTO_IP, IP_PKTINFO, info)], 0, (target, udp_port))
            else:
                s.sendto(b"ping", (target, udp_port))
            try:
                return "ANSWER " + s.recvfrom(100)[0].decode()
            except socket.timeout:
                continue
        return "NONE timed out"
    except OSError as exc:
        return f"NONE {exc}"
    finally:
        s.close()

methods = {"tcp": lambda t: tcp(t, "plain"), "tcp SO_BINDTODEVICE": lambda t: tcp(t, "bind"),
           "tcp IP_UNICAST_IF": lambda t: tcp(t, "unicast_if"), "udp SO_BINDTODEVICE": lambda t: udp(t, "bind"),
           "udp IP_UNICAST_IF": lambda t: udp(t, "unicast_if"), "udp IP_PKTINFO": lambda t: udp(t, "pktinfo")}
out = {t: {} for t in targets}

def run(target, name):
    try:
        out[target][name] = methods[name](target)
    except Exception as exc:  # a probe that breaks must show, not vanish
        out[target][name] = f"BROKEN {exc!r}"

threads = [threading.Thread(target=run, args=(t, m)) for t in targets for m in methods]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
"""


def host_ipv4_addresses() -> list[str]:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return sorted({line.split()[3].split("/")[0] for line in out.splitlines()})


def probe(sb, services, targets: list[str]) -> dict[str, dict[str, str]]:
    sb.write_file("/workspace/probe.py", PROBE)
    result = sb.exec(["python3", "/workspace/probe.py", *map(str, services.ports), *targets], timeout=60)
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


METHODS = (
    "tcp",
    "tcp SO_BINDTODEVICE",
    "tcp IP_UNICAST_IF",
    "udp SO_BINDTODEVICE",
    "udp IP_UNICAST_IF",
    "udp IP_PKTINFO",
)


def answered(results: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    assert all(
        sorted(methods) == sorted(METHODS) and not any(r.startswith("BROKEN") for r in methods.values())
        for methods in results.values()
    ), results
    return {target: [m for m, r in methods.items() if r.startswith("ANSWER")] for target, methods in results.items()}


def test_socket_options_reach_no_host_address_beyond_the_allowlist(
    sandbox_client, labels, host_addresses, host_services
):
    """With one /32 allowed, every other address of the host's namespace (and its broadcast) stays out of
    reach through SO_BINDTODEVICE, IP_UNICAST_IF and IP_PKTINFO; the allowed one answers every way."""
    allowed, denied = host_addresses
    others = [a for a in host_ipv4_addresses() if a != allowed]
    assert denied in others
    policy = NetworkPolicy(mode="allowlist", allow_cidrs=[f"{allowed}/32"])
    with sandbox_client.create(SandboxCreate(labels=labels, network=policy)) as sb:
        reached = answered(probe(sb, host_services, [allowed, *others, "255.255.255.255"]))
    assert len(reached.pop(allowed)) == len(METHODS), f"the allowed address must answer every way: {reached}"
    assert not any(reached.values()), f"reached beyond the allowlist: {reached}"


def test_a_wide_cidr_does_not_open_the_hosts_own_addresses(sandbox_client, labels, host_addresses, host_services):
    """The host's own addresses are reachable only when named one by one: a CIDR that merely contains them
    (here two of the host's addresses and its main interface's) opens none of them, whatever the socket."""
    allowed, denied = host_addresses
    wide = NetworkPolicy(mode="allowlist", allow_cidrs=["10.0.0.0/8", "192.0.0.0/3"])
    with sandbox_client.create(SandboxCreate(labels=labels, network=wide)) as sb:
        reached = answered(probe(sb, host_services, host_ipv4_addresses()))
        assert not any(reached.values()), f"a wide CIDR opened the host's own addresses: {reached}"
        sb.set_network_policy(NetworkPolicy(mode="allowlist", allow_cidrs=["10.0.0.0/8", f"{allowed}/32"]))
        reached = answered(probe(sb, host_services, [allowed, denied]))  # named, it opens (a live change)
        assert len(reached[allowed]) == len(METHODS) and reached[denied] == [], reached


def _host_link(sb) -> str:
    """The host end of the sandbox's link."""
    import socket

    return socket.if_indextoname(int(sb.exec("cat /sys/class/net/eth0/iflink").stdout))


def test_a_wide_cidr_opens_neither_other_sandboxes_nor_the_metadata_endpoint(sandbox_client, labels):
    """With every packet sent to the host end, a wide CIDR would reach another sandbox wherever the host
    forwards (kubelet turns forwarding on), and the cloud metadata endpoint off the host: both are dropped
    by the sandbox's filter. Counted by a chain that runs right after it (this host does not forward)."""
    wide = NetworkPolicy(mode="allowlist", allow_cidrs=["0.0.0.0/0"])
    with (
        sandbox_client.create(SandboxCreate(labels=labels, network=wide)) as sb,
        sandbox_client.create(SandboxCreate(labels=labels, network=wide)) as neighbour,
    ):
        neighbour_ip = neighbour.exec("ip -o -4 addr show dev eth0").stdout.split()[3].split("/")[0]
        targets = {"neighbour": neighbour_ip, "metadata": "169.254.169.254", "control": "192.0.2.99"}
        counter = "inet orchard_test_egress_count"
        rules = "".join(
            f'  iifname "{_host_link(sb)}" ip daddr {ip} counter comment "{name}"\n' for name, ip in targets.items()
        )
        subprocess.run(
            ["nft", "-f", "-"],
            check=True,
            text=True,
            input=(
                f"table {counter} {{\n chain c {{ type filter hook prerouting priority -250; policy accept;\n"
                f"{rules} }}\n}}\n"
            ),
        )
        try:
            sent = sb.exec(
                [
                    "python3",
                    "-c",
                    "import socket, sys\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                    "\nfor ip in sys.argv[1:]:\n for _ in range(3):\n  s.sendto(b'x', (ip, 9))",
                    *targets.values(),
                ]
            )
            assert sent.exit_code == 0, sent
            listed = json.loads(
                subprocess.run(
                    ["nft", "-j", "list", "table", *counter.split()], check=True, capture_output=True, text=True
                ).stdout
            )["nftables"]
        finally:
            subprocess.run(["nft", "delete", "table", *counter.split()], check=False)
    passed = {
        r["rule"]["comment"]: next(e["counter"]["packets"] for e in r["rule"]["expr"] if "counter" in e)
        for r in (item for item in listed if "rule" in item)
    }
    assert passed == {"neighbour": 0, "metadata": 0, "control": 3}, passed


def test_a_filter_left_without_its_slot_is_a_leak_and_goes_at_the_next_start(tmp_path):
    """A service that died between removing a sandbox's link and its filter left the filter behind: the leak
    check reports it, and the next start of any local backend removes it (its slot is free)."""
    from sandbox_service.backends.local import egress as local_egress
    from sandbox_service.backends.local.backend import LocalBackend
    from sandbox_service.backends.local.config import LocalBackendConfig
    from sandbox_service.tools.leaks import leaked_network

    stale = "orcfffe0h"  # slot 0xfffe0, beyond any slot a backend hands out
    local_egress.allow(stale, ["10.254.253.1/32"], LocalBackendConfig().allowlist_subnet)
    try:
        assert f"egress filter {stale}" in leaked_network(tmp_path)
        LocalBackend(LocalBackendConfig(state_dir=tmp_path / "state")).close()
        assert stale not in local_egress.filtered_links()
        assert leaked_network(tmp_path) == []
    finally:
        local_egress.remove(stale)


def test_the_egress_table_goes_when_a_service_stops_with_no_allowlist_sandbox_left(tmp_path):
    """The table is the machine's, made by the first allowlist create: a backend that stops while an
    allowlist sandbox still holds a slot keeps it; once none does, stopping removes it."""
    import asyncio
    import secrets as _secrets

    from sandbox_service.agent_link.client import AgentClient
    from sandbox_service.backends.local import egress as local_egress
    from sandbox_service.backends.local import network as local_network
    from sandbox_service.backends.local.backend import LocalBackend, LocalBackendConfig

    backend = LocalBackend(LocalBackendConfig(state_dir=tmp_path / "state"))
    spec = SandboxCreate(network=NetworkPolicy(mode="allowlist", allow_cidrs=["10.254.253.1/32"]))
    endpoint = backend.start("t-table", spec, spec.resources, _secrets.token_hex(8))
    asyncio.run(AgentClient(endpoint).close())
    link = local_network.veth_name(backend.record("t-table").net_index)
    try:
        assert link in local_egress.filtered_links()
        assert local_network.release_table(backend.net_indexes) is False  # this sandbox holds a slot
        assert local_egress.table_exists()
    finally:
        backend.stop("t-table")
    with backend.net_indexes.locked():
        others = backend.net_indexes.held()
    backend.close()
    if others:
        pytest.skip(f"allowlist sandboxes of another service hold slots {sorted(others)} on this machine")
    assert not local_egress.table_exists()
    assert "orchard_egress" not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def test_the_host_filter_drops_ipv6_from_a_sandbox_link_whatever_its_sysctls(tmp_path):
    """A sandbox's link has IPv6 off at both ends; the host's filter drops IPv6 from it anyway (were a
    sysctl ever left on): a link named like a sandbox's, IPv6 on at both ends, reaches a host listener
    over link-local IPv6 until the link's filter is installed, and not after."""
    import secrets as _secrets
    import socket

    from sandbox_service.backends.local import egress as local_egress

    from sandbox_service.backends.local import network as local_network
    from sandbox_service.backends.local.config import LocalBackendConfig
    from sandbox_service.backends.local.slots import MachineSlots

    link, netns = "orcfffe1h", f"orct6{_secrets.token_hex(2)}"  # slot 0xfffe1: beyond any a backend hands out
    sh = lambda *cmd: subprocess.run(cmd, check=True, capture_output=True, text=True).stdout  # noqa: E731
    listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    listener.bind(("::", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    sh("ip", "netns", "add", netns)
    try:
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", "e0", "netns", netns)
        sh("sysctl", "-qw", f"net.ipv6.conf.{link}.accept_dad=0")
        sh("ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv6.conf.e0.accept_dad=0")
        sh("ip", "link", "set", link, "up")
        sh("ip", "-n", netns, "link", "set", "e0", "up")
        host_ll = next(
            line.split()[3].split("/")[0]
            for line in sh("ip", "-6", "-o", "addr", "show", "dev", link).splitlines()
            if "fe80" in line
        )
        probe = (
            "import socket, sys\ntry:\n socket.create_connection((sys.argv[1] + '%e0', int(sys.argv[2])), 2)"
            "\n print('CONNECTED')\nexcept OSError as e:\n print('NONE', e)"
        )

        def connect() -> str:
            return sh("ip", "netns", "exec", netns, "python3", "-c", probe, host_ll, str(port)).strip()

        assert connect() == "CONNECTED"  # the path exists: what follows is the filter's doing
        local_egress.allow(link, ["10.254.253.1/32"], LocalBackendConfig().allowlist_subnet)
        assert connect().startswith("NONE"), "IPv6 from a sandbox link passed the host's filter"
    finally:
        local_egress.remove(link)
        local_network.release_table(MachineSlots(LocalBackendConfig().net_index_dir, 65000, "allowlist slots"))
        subprocess.run(["ip", "netns", "del", netns], check=False)
        subprocess.run(["ip", "link", "del", link], check=False, capture_output=True)
        listener.close()


@pytest.mark.parametrize(
    "cidr, refusal", [("169.254.169.254/32", "metadata"), ("10.0.0.0/33", "not a CIDR"), ("2001:db8::/32", "only IPv4")]
)
def test_the_local_allowlist_refuses_the_metadata_endpoint_and_what_it_cannot_enforce(cidr, refusal):
    """The same check as on Kubernetes (backends/allowlist.py): the cloud metadata endpoint is never a CIDR of
    its own; the local backend also refuses IPv6, which its links do not carry."""
    from sandbox_service.backends.local.network import resolve_allowlist
    from sandbox_service.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match=refusal):
        resolve_allowlist(NetworkPolicy(mode="allowlist", allow_cidrs=[cidr]))


# Commands the local backend's network set-up ran as processes before it spoke netlink itself.
_NETWORK_COMMANDS = {"ip", "nsenter", "sh"}
_spawned: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _spawned is not None and event == "subprocess.Popen":
        _spawned.append(os.path.basename(os.fsdecode(args[0])))


def _route_lines(routes: str) -> list[str]:
    return [" ".join(w for w in line.split() if w not in ("proto", "static")) for line in routes.splitlines()]


def test_an_allowlist_link_is_made_changed_and_removed_without_a_process(tmp_path):
    """Create, a new allowlist, none, an allowlist again and delete: no `ip`/`nsenter` process, and after each
    step the namespace holds what the policy says (routes, the bound sockets' rule once, IPv6 off at both ends)."""
    import asyncio
    import secrets as _secrets
    import sys

    global _spawned
    from sandbox_service.agent_link.client import AgentClient
    from sandbox_service.backends.local import network as local_network
    from sandbox_service.backends.local.backend import LocalBackend, LocalBackendConfig

    def inside(pid: int, *argv: str) -> str:  # the test's own look inside, not counted
        global _spawned
        kept, _spawned = _spawned, None
        try:
            return subprocess.run(["nsenter", "-t", str(pid), "-n", *argv], capture_output=True, text=True).stdout
        finally:
            _spawned = kept

    sys.addaudithook(_audit)
    backend = LocalBackend(LocalBackendConfig(state_dir=tmp_path / "state"))
    spec = SandboxCreate(network=NetworkPolicy(mode="allowlist", allow_cidrs=["10.254.253.1/32"]))
    _spawned = []
    try:
        endpoint = backend.start("t-netlink", spec, spec.resources, _secrets.token_hex(8))
        asyncio.run(AgentClient(endpoint).close())
        rec = backend.record("t-netlink")
        pid, link = rec.host_pid, local_network.veth_name(rec.net_index)
        backend.apply_network_policy("t-netlink", NetworkPolicy(mode="allowlist", allow_cidrs=["10.254.252.0/24"]))
        seen = {"changed": [inside(pid, "ip", "-4", "route"), inside(pid, "ip", "rule")]}
        backend.apply_network_policy("t-netlink", NetworkPolicy(mode="none"))
        seen["none"] = [inside(pid, "ip", "-br", "link")]
        backend.apply_network_policy("t-netlink", NetworkPolicy(mode="allowlist", allow_cidrs=["10.254.251.1/32"]))
        seen["again"] = [
            inside(pid, "ip", "-4", "route"),
            inside(pid, "ip", "rule"),
            inside(pid, "ip", "neigh"),
            inside(pid, "cat", "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"),
            Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").read_text(),
        ]
        spawned = [name for name in _spawned if name in _NETWORK_COMMANDS]
    finally:
        _spawned = None
        backend.stop("t-netlink")
        backend.close()
    assert spawned == [], f"network set-up ran processes: {spawned}"
    routes, rules = seen["changed"]
    assert _route_lines(routes) == ["10.254.252.0/24 via 169.254.0.1 dev eth0 onlink"]
    assert rules.count("lookup 100") == 1
    links = seen["none"][0]
    assert "eth0" not in links and links.split()[:2] == ["lo", "DOWN"]
    routes, rules, neigh, ipv6_sandbox, ipv6_host = seen["again"]
    assert _route_lines(routes) == ["10.254.251.1 via 169.254.0.1 dev eth0 onlink"]
    assert rules.count("lookup 100") == 1
    assert f"169.254.0.1 dev eth0 lladdr {local_network.host_mac(rec.net_index)} PERMANENT" in neigh
    assert ipv6_sandbox.strip() == "1" and ipv6_host.strip() == "1"
    assert not local_network.link_exists(link)


def test_chains_with_the_same_ranges_share_one_set_which_goes_with_the_last():
    """The wider CIDRs are a named set per content, not an anonymous set per chain (libnftables reads every
    interval set's elements whenever a set's elements change: per-chain sets made each create and delete
    read every sandbox's ranges). Two chains with the same ranges name one set; it goes with the last."""
    from sandbox_service.backends import nftables
    from sandbox_service.backends.local import egress as local_egress
    from sandbox_service.backends.local import network as local_network
    from sandbox_service.backends.local.config import LocalBackendConfig
    from sandbox_service.backends.local.slots import MachineSlots

    subnet = LocalBackendConfig().allowlist_subnet
    first, second, other = "orcfffe2h", "orcfffe3h", "orcfffe4h"  # slots beyond any a backend hands out
    wide = ["10.254.0.0/16", "192.0.2.0/24"]

    def shared_sets() -> set[str]:
        items = nftables.query(f"list sets {local_egress.TABLE.split()[0]}")
        return {i["set"]["name"] for i in items if "set" in i and i["set"]["name"] not in ("links",)}

    def named_by(link: str) -> set[str]:
        text = json.dumps(nftables.query(f"list chain {local_egress.TABLE} {link}"))
        return {name for name in shared_sets() if f'"@{name}"' in text}

    before = shared_sets()
    try:
        local_egress.allow(first, wide, subnet)
        local_egress.allow(second, list(reversed(wide)), subnet)
        local_egress.allow(other, ["10.253.0.0/16"], subnet)
        assert len(named_by(first)) == 2 and named_by(first) == named_by(second)
        assert len(named_by(other) - named_by(first)) == 1  # its own ranges; the never-reached set is shared
        sets_of_first = named_by(first)
        local_egress.remove(first)
        assert sets_of_first <= shared_sets()  # the second chain still names them
        local_egress.remove(second)
        assert shared_sets() - before == named_by(other)
        local_egress.remove(other)
        assert shared_sets() - before == set()
    finally:
        for link in (first, second, other):
            local_egress.remove(link)
        local_network.release_table(MachineSlots(LocalBackendConfig().net_index_dir, 65000, "allowlist slots"))


def test_an_allowlist_of_thousands_of_cidrs_is_routed_whole(tmp_path):
    """Requests go to the kernel in datagrams of bounded size: 2,000 CIDRs (one route each) all arrive."""
    import asyncio
    import secrets as _secrets

    from sandbox_service.agent_link.client import AgentClient
    from sandbox_service.backends.local.backend import LocalBackend, LocalBackendConfig

    cidrs = [f"10.{100 + i // 100}.{(i % 100) * 2}.0/24" for i in range(2000)]  # none adjacent: 2,000 routes
    backend = LocalBackend(LocalBackendConfig(state_dir=tmp_path / "state"))
    spec = SandboxCreate(network=NetworkPolicy(mode="allowlist", allow_cidrs=cidrs))
    try:
        endpoint = backend.start("t-many", spec, spec.resources, _secrets.token_hex(8))
        asyncio.run(AgentClient(endpoint).close())
        pid = backend.record("t-many").host_pid
        routes = subprocess.run(
            ["nsenter", "-t", str(pid), "-n", "ip", "-4", "route"], capture_output=True, text=True
        ).stdout
    finally:
        backend.stop("t-many")
        backend.close()
    assert len(_route_lines(routes)) == 2000
