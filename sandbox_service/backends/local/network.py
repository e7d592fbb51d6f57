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
  on eth0 (each group would take an entry of the machine's neighbour table; local_egress.confine_source_here).
- No IPv6 path: both ends of the veth have IPv6 disabled before they come up (no link-local fe80::
  addresses; allowlists are IPv4 only), and the host's filter drops IPv6 from the link whatever the
  sysctls say. The sandbox keeps ::1 on its own lo. Commands cannot re-enable it (/proc/sys is read-only
  for them).

Reaching addresses off this host additionally needs IP forwarding on the host and a network that
routes the sandbox subnet back (we configure no NAT, and sandbox traffic is untracked, see local/egress.py).

Per-create cost (allowlist): no process. The links, addresses, neighbour, rule and routes are netlink
requests from this process, sent in batches (backends/rtnetlink.py): the sandbox's side from a thread that
enters its namespace (backends/netns.py; its sysctls are written and its nftables table made from the same
thread), the host's side from the service's namespace; plus the host's nftables transaction. They were
processes before (`nsenter` + `ip` twice and `ip -batch` on the host a create, `ip link del` a delete):
~14 of the service's ~26 ms of CPU per allowlist create.
"""

from __future__ import annotations

import contextlib
import functools
import errno
import ipaddress
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from sandbox_service.backends import nftables
from sandbox_service.backends.netns import NamespaceEntryError, call_in_netns
from sandbox_service.backends.rtnetlink import RT_TABLE_MAIN, NetlinkRefused, Rtnetlink

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
SANDBOX_IF = "eth0"
_LOOPBACK_INDEX = 1  # lo is the first link of every network namespace
# One link set-up of this service at a time. Its IPv6 sysctl writes take the kernel's RTNL with a trylock
# and restart the write while another holder has it: set-ups in parallel made the writes spin (~8 % of the
# service's CPU in a 100-sandbox burst, perf). Each set-up is a few ms, so a burst queues briefly.
_RTNL = threading.Lock()
T = TypeVar("T")


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


@functools.lru_cache(maxsize=256)
def _ipv4_cidrs(allow_cidrs: tuple[str, ...]) -> tuple[str, ...]:
    """The checked CIDRs (a cloud metadata endpoint is refused, as on every backend), IPv4 only; once per
    list (see allowlist._checked)."""
    cidrs = checked_cidrs(list(allow_cidrs))
    for cidr in cidrs:
        if ipaddress.ip_network(cidr).version != 4:
            raise InvalidRequestError(f"allow_cidrs entry {cidr!r}: only IPv4 allowlists are supported")
    return tuple(cidrs)


def resolve_allowlist(policy: NetworkPolicy) -> list[str]:
    cidrs = list(_ipv4_cidrs(tuple(policy.allow_cidrs)))
    for host in policy.allow_hosts:
        try:
            infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise InvalidRequestError(f"allow_hosts entry {host!r} does not resolve: {exc}") from exc
        cidrs.extend(sorted({f"{info[4][0]}/32" for info in infos}))
    return sorted(set(cidrs))


@contextlib.contextmanager
def _rtnetlink() -> Iterator[Rtnetlink]:
    """An rtnetlink socket in the calling thread's network namespace; a request the kernel refuses fails
    the set-up with what was being done and the kernel's reason."""
    try:
        with Rtnetlink() as nl:
            yield nl
            nl.commit()
    except NetlinkRefused as exc:
        raise BackendUnavailableError(f"network setup failed: {exc}") from exc


def _ipv6_off(dev: str) -> None:
    """IPv6 off for `dev` in the calling thread's network namespace (/proc/sys/net resolves against it);
    nothing to do where the kernel has no IPv6."""
    path = f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"
    if not os.path.exists(path):
        return
    try:
        with open(path, "w") as f:
            f.write("1")
    except OSError as exc:  # the link must not come up with IPv6 on: the set-up fails
        raise BackendUnavailableError(f"network setup failed: IPv6 off for {dev}: {exc}") from exc


def link_exists(name: str) -> bool:
    """Whether the host (the service's network namespace) has a link `name`: one ioctl, no `ip` process."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def delete_veth(name: str) -> None:
    try:
        index = socket.if_nametoindex(name)
    except OSError:
        return  # no such link: what was asked
    try:
        with _RTNL, Rtnetlink() as nl:
            nl.delete_link(index)
            nl.commit()
    except NetlinkRefused as exc:
        if exc.errno != errno.ENODEV:  # gone meanwhile (its namespace ended): what was asked
            raise BackendUnavailableError(f"network setup failed: {exc}") from exc


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


def set_loopback(pid: int, up: bool) -> None:
    def switch() -> None:
        with _rtnetlink() as nl:
            nl.set_up(_LOOPBACK_INDEX, up)

    _in_namespace(pid, switch)


def _in_namespace(pid: int, fn: Callable[[], T]) -> T:
    try:
        return call_in_netns(pid, fn)
    except NamespaceEntryError as exc:
        raise BackendUnavailableError(f"network setup failed: {exc}") from exc


def _sandbox_end(index: int, host_if: str, sip: str) -> None:
    """In the sandbox's namespace (a thread that entered it): IPv6 off by default before any link exists (the
    sandbox's end never gets a link-local address), the multicast/broadcast filter, then the pair, made
    from here with its host end born in the service's namespace (IPv6 turned off there before it comes up:
    `_host_end`), and the sandbox's end addressed with its one neighbour and the bound sockets' table."""
    _ipv6_off("default")
    local_egress.confine_source_here()  # before the sandbox's end exists
    with _rtnetlink() as nl:
        nl.add_veth(SANDBOX_IF, host_if, host_mac(index), os.getpid())
    _ipv6_off(SANDBOX_IF)  # the second lock: already off by the namespace's default
    eth0 = socket.if_nametoindex(SANDBOX_IF)  # an ioctl on a socket of this thread's namespace
    with _rtnetlink() as nl:
        nl.set_up(_LOOPBACK_INDEX)
        nl.add_address(eth0, sip, 32)
        nl.set_up(eth0)
        nl.permanent_neighbour(eth0, GATEWAY, host_mac(index))
        nl.route("0.0.0.0/0", eth0, gateway=GATEWAY, table=BOUND_TABLE, replace=True)
    try:
        with Rtnetlink() as nl:
            nl.rule_to_table(SANDBOX_IF, BOUND_TABLE, BOUND_TABLE)
            nl.commit()
    except NetlinkRefused as exc:
        if exc.errno != errno.EEXIST:  # kept from an earlier link of this sandbox (rules outlive links)
            raise BackendUnavailableError(f"network setup failed: {exc}") from exc


def _sandbox_routes(cidrs: list[str]) -> None:
    """In the sandbox's namespace: one route per allowed CIDR through the host end, the old ones gone (the
    main table only: the bound sockets' default route stays)."""
    eth0 = socket.if_nametoindex(SANDBOX_IF)
    with _rtnetlink() as nl:
        for route in nl.routes():
            if route.oif == eth0 and route.table == RT_TABLE_MAIN:
                nl.delete_route(route)
        nl.commit()
        for cidr in cidrs:
            nl.route(cidr, eth0, gateway=GATEWAY)


def _host_end(host_if: str, sip: str) -> None:
    """In the service's namespace: the host end's IPv6 off before it comes up, then up, routed to the sandbox."""
    _ipv6_off(host_if)
    link = socket.if_nametoindex(host_if)
    with _rtnetlink() as nl:
        nl.set_up(link)
        nl.route(f"{sip}/32", link, replace=True)


def apply(pid: int, index: int, subnet: str, policy: NetworkPolicy) -> list[str]:
    """Make the namespace of `pid` match `policy`; returns the CIDRs now allowed."""
    host_if = veth_name(index)
    if policy.mode != "allowlist":
        remove_link(index)
        set_loopback(pid, policy.mode == "loopback")
        return []
    cidrs = resolve_allowlist(policy)
    sip = sandbox_address(subnet, index)
    local_egress.allow(host_if, cidrs, subnet)  # before the link exists, or before its routes change
    if link_exists(host_if):
        _in_namespace(pid, lambda: _sandbox_routes(cidrs))
        return cidrs

    def make() -> None:
        _sandbox_end(index, host_if, sip)
        _sandbox_routes(cidrs)

    with _RTNL:
        _in_namespace(pid, make)
        _host_end(host_if, sip)
    return cidrs
