"""Network policy of local sandboxes, applied from the host into the sandbox's network namespace.

- none: a fresh network namespace with no interface up, not even lo.
- loopback: lo up; nothing leaves the namespace.
- allowlist: lo up plus a veth pair (host side `orc<index>h`, sandbox side `eth0` with a /32 address
  from `subnet`), every route through the host end (GATEWAY below). What the sandbox reaches is decided
  on the host, outside the sandbox: an nftables filter on the host end of the link (local/egress.py)
  drops every packet whose destination the allowlist does not name, whatever socket options the
  sandbox's code uses (SO_BINDTODEVICE, IP_UNICAST_IF, IP_PKTINFO need no route), every packet to the
  host's own addresses, broadcast or multicast unless named one by one (/32 or a host name), and every
  IPv6 packet. Host names are resolved to /32s when the policy is applied. Inside the sandbox, one route
  per allowed CIDR and no default route (but for sockets bound to eth0), so an ordinary connect elsewhere
  fails at once with "Network is unreachable" instead of timing out; the routes are a convenience, not
  the boundary (commands cannot change them anyway: CAP_NET_ADMIN is dropped, see agent/boot.py). The
  host side has no address of its own. A filter in the sandbox's namespace drops multicast and broadcast
  on eth0 (each group would take an entry of the machine's neighbour table; local_egress.confine_source).
- No IPv6 path: both ends of the veth have IPv6 disabled before they come up (no link-local fe80::
  addresses; allowlists are IPv4 only), and the host's filter drops IPv6 from the link whatever the
  sysctls say. The sandbox keeps ::1 on its own lo. Commands cannot re-enable it (/proc/sys is read-only
  for them).

Reaching addresses off this host additionally needs IP forwarding on the host and a network that
routes the sandbox subnet back (we configure no NAT, and sandbox traffic is untracked, see local/egress.py).

Per-create cost (allowlist): three processes (the link made from inside the namespace, the host end
brought up, the sandbox end addressed and routed) and two nftables transactions in this process (the
host's filter, and the sandbox namespace's from a thread that enters it).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
from pathlib import Path

from sandbox_service.backends import nftables

from sandbox_service.backends.local import egress as local_egress
from sandbox_service.backends.allowlist import checked_cidrs
from sandbox_service.backends.local.slots import MachineSlots
from sandbox_service.errors import BackendUnavailableError, InvalidRequestError
from sandbox_service.models import NetworkPolicy


def veth_name(index: int) -> str:
    return f"orc{index:x}h"  # <= 15 chars for any index below 16**11


# Every packet of the sandbox leaves through one next hop, the host end of its link, reached through a
# permanent neighbour entry: the sandbox's namespace holds that one entry, whatever it sends to. The IPv4
# neighbour table is one for the machine (gc_thresh3 counts every namespace's entries), and a destination
# routed on-link took an entry each. Sockets bound to eth0 (SO_BINDTODEVICE, IP_UNICAST_IF, IP_PKTINFO)
# look up BOUND_TABLE, whose default route goes there too: without a route the kernel takes an unrouted
# destination for on-link. Ordinary sockets see only the allowed routes, so elsewhere fails at once.
GATEWAY = "169.254.0.1"
BOUND_TABLE = 100


def host_mac(index: int) -> str:
    """The host end's MAC (locally administered, one per slot), the sandbox's permanent neighbour."""
    return "02:6f:72:" + ":".join(f"{(index >> shift) & 0xFF:02x}" for shift in (16, 8, 0))


def veth_index(name: str) -> int | None:
    """The slot index of a sandbox link's host end (None for another name)."""
    match = re.fullmatch(r"orc([0-9a-f]+)h", name)
    return int(match.group(1), 16) if match else None


def sandbox_address(subnet: str, index: int) -> str:
    net = ipaddress.ip_network(subnet)
    if index + 2 >= net.num_addresses:
        raise BackendUnavailableError(f"allowlist subnet {subnet} is exhausted (index {index})")
    return str(net.network_address + index + 2)


def resolve_allowlist(policy: NetworkPolicy) -> list[str]:
    cidrs = checked_cidrs(policy.allow_cidrs)  # a cloud metadata endpoint is refused, as on every backend
    for cidr in cidrs:
        if ipaddress.ip_network(cidr).version != 4:
            raise InvalidRequestError(f"allow_cidrs entry {cidr!r}: only IPv4 allowlists are supported")
    for host in policy.allow_hosts:
        try:
            infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise InvalidRequestError(f"allow_hosts entry {host!r} does not resolve: {exc}") from exc
        cidrs.extend(sorted({f"{info[4][0]}/32" for info in infos}))
    return sorted(set(cidrs))


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise BackendUnavailableError(f"network setup failed: {' '.join(argv)}: {proc.stderr.strip()}")
    return proc


def _in_netns(pid: int, batch: str) -> None:
    _run(["nsenter", "-t", str(pid), "-n", "ip", "-batch", "-"], stdin=batch)


def link_exists(name: str) -> bool:
    """Whether the host (the service's network namespace) has a link `name`: one ioctl, no `ip` process."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def delete_veth(name: str) -> None:
    if link_exists(name):
        _run(["ip", "link", "del", name], check=False)


def remove_stale_filters(slots: MachineSlots) -> list[str]:
    """At start-up, where the egress table exists: its hook chains put as this version makes them, and the
    filters of links whose slot is free (left by a service that died before it removed them) removed, under
    the slots' lock so that no slot is taken meanwhile; returns the links cleaned."""
    if not nftables.available() or not local_egress.table_exists():
        return []  # no filter exists (the first allowlist create makes the table, or says what to install)
    local_egress.ensure()  # the hook chains as this version makes them
    removed = []
    with slots.locked():
        held = slots.held()
        for link in local_egress.filtered_links():
            if veth_index(link) not in held:
                local_egress.remove(link)
                removed.append(link)
    return removed


def release_table(slots: MachineSlots) -> bool:
    """When a service stops: the egress table goes if no allowlist slot of the machine is held (under the
    slots' lock: every link's filter is made after its slot is taken, so none is made meanwhile, and the
    next create makes the table again). Returns whether it went."""
    if not nftables.available():
        return False
    with slots.locked():
        if slots.held():
            return False
        local_egress.drop_table()
    return True


def remove_link(index: int) -> None:
    """The sandbox's link and then its egress filter (the link goes first: no instant of a link unfiltered)."""
    name = veth_name(index)
    delete_veth(name)
    local_egress.remove(name)


_NO_IPV6 = (
    "for f in /proc/sys/net/ipv6/conf/default/disable_ipv6 /proc/sys/net/ipv6/conf/{dev}/disable_ipv6; "
    "do if [ -e $f ]; then echo 1 > $f || exit 1; fi; done"
)
# Inside the namespace, in one process: IPv6 off on the peer (it already is, by the namespace's default
# written before the peer existed; this is the second lock), then the links and routes as one `ip -batch`.
_NO_IPV6_THEN_BATCH = _NO_IPV6 + " && exec ip -batch -"


def disable_ipv6_host(dev: str) -> None:
    path = Path(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6")
    if path.exists():
        path.write_text("1")


def disable_ipv6_in_netns(pid: int, dev: str = "default") -> None:
    """Disable IPv6 for `dev` (and every interface made later) in the namespace of `pid` (net sysctls
    are per namespace: written by a process that entered it)."""
    _run(["nsenter", "-t", str(pid), "-n", "sh", "-c", _NO_IPV6.format(dev=dev)])


def set_loopback(pid: int, up: bool) -> None:
    _in_netns(pid, f"link set lo {'up' if up else 'down'}\n")


def apply(pid: int, index: int, subnet: str, policy: NetworkPolicy) -> list[str]:
    """Make the namespace of `pid` match `policy`; returns the CIDRs now allowed."""
    host_if = veth_name(index)
    if policy.mode != "allowlist":
        remove_link(index)
        _in_netns(pid, f"link set lo {'up' if policy.mode == 'loopback' else 'down'}\n")
        return []
    cidrs = resolve_allowlist(policy)
    sip = sandbox_address(subnet, index)
    peer = f"orc{index:x}s"
    local_egress.allow(host_if, cidrs, subnet)  # before the link exists, or before its routes change
    new_link = not link_exists(host_if)
    lines = []
    if new_link:
        # Two processes in the namespace and one on the host (was eight). The pair is made from inside the
        # namespace, after its IPv6 default is off, so the sandbox's end never gets a link-local address;
        # the host's end is born in the service's namespace and has IPv6 off before it comes up.
        local_egress.confine_source(pid)  # in the sandbox's namespace, before its end exists
        _run(
            [
                "nsenter",
                "-t",
                str(pid),
                "-n",
                "sh",
                "-c",
                _NO_IPV6.format(dev="default") + " && exec ip link add "
                f"{peer} type veth peer name {host_if} address {host_mac(index)} netns {os.getpid()}",
            ]
        )
        disable_ipv6_host(host_if)
        _run(["ip", "-batch", "-"], stdin=f"link set {host_if} up\nroute replace {sip}/32 dev {host_if}\n")
        lines = [
            "link set lo up",
            f"link set {peer} name eth0",
            f"addr add {sip}/32 dev eth0",
            "link set eth0 up",
            f"neigh replace {GATEWAY} lladdr {host_mac(index)} dev eth0 nud permanent",
            f"rule add oif eth0 lookup {BOUND_TABLE} pref {BOUND_TABLE}",
            f"route replace default via {GATEWAY} dev eth0 onlink table {BOUND_TABLE}",
        ]
    lines += ["route flush dev eth0"] + [f"route add {c} via {GATEWAY} dev eth0 onlink" for c in cidrs]
    batch = "\n".join(lines) + "\n"
    if new_link:
        _run(["nsenter", "-t", str(pid), "-n", "sh", "-c", _NO_IPV6_THEN_BATCH.format(dev=peer)], stdin=batch)
    else:
        _in_netns(pid, batch)
    return cidrs
