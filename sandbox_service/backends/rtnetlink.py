"""The few rtnetlink requests the local backend's allowlist links need, encoded here and sent in batches.

Why not pyroute2 (tried, measured): its requests are built in Python through several layers of filters
and encoders, ~0.4 ms of CPU each; an allowlist create sends one route per allowed CIDR (the service's
unrestricted egress is ~120 CIDRs), and with pyroute2 a create cost the service 62 ms of CPU against 25 ms
for the `ip` processes it replaced (`ip -batch` encodes in C). These are fixed-layout structs from
<linux/rtnetlink.h>, <linux/if_link.h>, <linux/neighbour.h> and <linux/fib_rules.h>: a batch is packed
with `struct` and sent in datagrams of up to 64 requests, the kernel answers each request with an ack, and
the first refusal is raised with what was being done (the kernel goes on with the requests after a refused
one, as `ip -batch` keeps those before it: a failed set-up fails the create, which removes the sandbox and
its link).

A socket talks to the network namespace of the thread that opened it (see netns.py).
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

NETLINK_ROUTE = 0
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 1, 4, 0x100, 0x200, 0x400, 0x300
RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR = 16, 17, 20
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE, RTM_NEWNEIGH, RTM_NEWRULE = 24, 25, 26, 28, 32
IFF_UP = 1
IFLA_ADDRESS, IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_PID = 1, 3, 18, 19
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
NDA_DST, NDA_LLADDR, NUD_PERMANENT = 1, 2, 0x80
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE = 1, 4, 5, 15
FRA_PRIORITY, FRA_TABLE, FRA_OIFNAME, FR_ACT_TO_TBL = 6, 15, 17, 1
RTPROT_BOOT, RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RTN_UNICAST = 3, 0, 253, 1
RT_TABLE_MAIN = 254
RTNH_F_ONLINK = 4  # a next hop on the link whatever the link's addresses say (`ip route ... onlink`)

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefix length, flags, scope, index
_ND = struct.Struct("=BxxxiHBB")  # ndmsg: family, index, state, flags, type
_RT = struct.Struct("=BBBBBBBBI")  # rtmsg / fib_rule_hdr: family, dst_len, src_len, tos, table, protocol|res1,
#                                    scope|res2, type|action, flags
_ATTR = struct.Struct("=HH")
# Requests a datagram: each ack is a buffer of its own, charged ~1 KiB against the socket's receive buffer
# (212 KiB by default); 500 acks at once overran it (ENOBUFS, acks lost).
_PER_DATAGRAM = 64


class NetlinkRefused(OSError):
    """The kernel refused a request: `what` names it, errno says why."""

    def __init__(self, code: int, what: str):
        super().__init__(code, f"{what}: {os.strerror(code)}")
        self.what = what


def _attr(kind: int, payload: bytes) -> bytes:
    data = _ATTR.pack(_ATTR.size + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _u32(kind: int, value: int) -> bytes:
    return _attr(kind, struct.pack("=I", value))


def _name(kind: int, name: str) -> bytes:
    return _attr(kind, name.encode() + b"\0")


def _ipv4(kind: int, address: str) -> bytes:
    return _attr(kind, socket.inet_aton(address))


def _mac(address: str) -> bytes:
    return bytes.fromhex(address.replace(":", ""))


@dataclass(frozen=True)
class Route:
    dst: str  # "a.b.c.d/n"
    oif: int | None
    table: int


class Rtnetlink:
    """One rtnetlink socket (in the calling thread's namespace) and a batch of requests to send together."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self._seq = 0
        self._batch: list[tuple[int, bytes]] = []  # (sequence, message)
        self._what: dict[int, str] = {}

    def __enter__(self) -> Rtnetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _request(self, what: str, kind: int, flags: int, body: bytes) -> None:
        self._seq += 1
        self._what[self._seq] = what
        flags |= NLM_F_REQUEST | NLM_F_ACK
        self._batch.append((self._seq, _HEADER.pack(_HEADER.size + len(body), kind, flags, self._seq, 0) + body))

    def commit(self) -> None:
        """Send the batch, `_PER_DATAGRAM` requests a datagram (an allowlist may name thousands of CIDRs: the
        acks of one datagram must fit the receive buffer); read every ack; raise the first refusal."""
        refused = None
        for start in range(0, len(self._batch), _PER_DATAGRAM):
            chunk = self._batch[start : start + _PER_DATAGRAM]
            pending = {seq for seq, _ in chunk}
            self.sock.send(b"".join(message for _, message in chunk))
            while pending:
                for kind, seq, payload in self._messages(self.sock.recv(1 << 16)):
                    if kind != NLMSG_ERROR or seq not in pending:
                        continue
                    pending.discard(seq)
                    code = -struct.unpack_from("=i", payload)[0]
                    if code and refused is None:
                        refused = NetlinkRefused(code, self._what[seq])
        self._batch.clear()
        self._what.clear()
        if refused is not None:
            raise refused

    @staticmethod
    def _messages(data: bytes) -> list[tuple[int, int, bytes]]:
        out, offset = [], 0
        while offset + _HEADER.size <= len(data):
            length, kind, _flags, seq, _port = _HEADER.unpack_from(data, offset)
            out.append((kind, seq, data[offset + _HEADER.size : offset + length]))
            offset += (length + 3) & ~3
        return out

    # Requests (queued until commit).

    def add_veth(self, name: str, peer: str, peer_mac: str, peer_pid: int) -> None:
        """A veth pair: `name` here, `peer` (with its MAC) in the network namespace of process `peer_pid`."""
        peer_info = _IFINFO.pack(0, 0, 0, 0, 0) + _name(IFLA_IFNAME, peer) + _attr(IFLA_ADDRESS, _mac(peer_mac))
        peer_info += _u32(IFLA_NET_NS_PID, peer_pid)
        info = _attr(IFLA_INFO_KIND, b"veth") + _attr(IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer_info))
        body = _IFINFO.pack(0, 0, 0, 0, 0) + _name(IFLA_IFNAME, name) + _attr(IFLA_LINKINFO, info)
        self._request(f"making the veth pair {name}/{peer}", RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)

    def set_up(self, index: int, up: bool = True) -> None:
        body = _IFINFO.pack(0, 0, index, IFF_UP if up else 0, IFF_UP)
        self._request(f"link {index} {'up' if up else 'down'}", RTM_NEWLINK, 0, body)

    def delete_link(self, index: int) -> None:
        self._request(f"deleting link {index}", RTM_DELLINK, 0, _IFINFO.pack(0, 0, index, 0, 0))

    def add_address(self, index: int, address: str, prefix: int) -> None:
        body = _IFADDR.pack(socket.AF_INET, prefix, 0, RT_SCOPE_UNIVERSE, index)
        body += _ipv4(IFA_LOCAL, address) + _ipv4(IFA_ADDRESS, address)
        self._request(f"address {address}/{prefix} on link {index}", RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body)

    def permanent_neighbour(self, index: int, address: str, mac: str) -> None:
        body = _ND.pack(socket.AF_INET, index, NUD_PERMANENT, 0, 0) + _ipv4(NDA_DST, address)
        body += _attr(NDA_LLADDR, _mac(mac))
        self._request(f"neighbour {address} on link {index}", RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, body)

    def rule_to_table(self, oifname: str, table: int, priority: int) -> None:
        """`ip rule add oif <oifname> lookup <table> pref <priority>`."""
        body = _RT.pack(socket.AF_INET, 0, 0, 0, table, 0, 0, FR_ACT_TO_TBL, 0)
        body += _u32(FRA_TABLE, table) + _u32(FRA_PRIORITY, priority) + _name(FRA_OIFNAME, oifname)
        self._request(f"rule oif {oifname} lookup {table}", RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL, body)

    def route(
        self, dst: str, oif: int, gateway: str | None = None, table: int = RT_TABLE_MAIN, replace: bool = False
    ) -> None:
        """`ip route add|replace <dst> [via <gateway> onlink] dev <oif> [table <table>]` (scope link without a
        gateway, as `ip` sets it)."""
        prefixlen, address = _destination(dst)
        scope = RT_SCOPE_LINK if gateway is None else RT_SCOPE_UNIVERSE
        flags = 0 if gateway is None else RTNH_F_ONLINK
        body = _RT.pack(socket.AF_INET, prefixlen, 0, 0, min(table, 255), RTPROT_BOOT, scope, RTN_UNICAST, flags)
        body += _u32(RTA_TABLE, table) + _ipv4(RTA_DST, address) + _u32(RTA_OIF, oif)
        if gateway is not None:
            body += _ipv4(RTA_GATEWAY, gateway)
        mode = NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_EXCL)
        self._request(f"route {dst} dev {oif} table {table}", RTM_NEWROUTE, mode, body)

    def delete_route(self, route: Route) -> None:
        prefixlen, address = _destination(route.dst)
        body = _RT.pack(socket.AF_INET, prefixlen, 0, 0, min(route.table, 255), 0, 0, 0, 0)
        body += _u32(RTA_TABLE, route.table) + _ipv4(RTA_DST, address)
        if route.oif is not None:
            body += _u32(RTA_OIF, route.oif)
        self._request(f"deleting route {route.dst} table {route.table}", RTM_DELROUTE, 0, body)

    # Reads (sent at once, outside the batch).

    def routes(self) -> list[Route]:
        """Every IPv4 route of the namespace."""
        self._seq += 1
        body = _RT.pack(socket.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0)
        header = _HEADER.pack(_HEADER.size + len(body), RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, self._seq, 0)
        self.sock.send(header + body)
        routes: list[Route] = []
        while True:
            for kind, seq, payload in self._messages(self.sock.recv(1 << 16)):
                if seq != self._seq:
                    continue
                if kind == NLMSG_DONE:
                    return routes
                if kind == NLMSG_ERROR:
                    raise NetlinkRefused(-struct.unpack_from("=i", payload)[0] or errno.EIO, "listing routes")
                if kind == RTM_NEWROUTE:
                    routes.append(_route(payload))


@functools.lru_cache(maxsize=4096)
def _destination(dst: str) -> tuple[int, str]:
    """A route's prefix length and network address; parsed once per CIDR (an allowlist routes the same
    hundred on every create)."""
    net = ipaddress.ip_network(dst)
    return net.prefixlen, str(net.network_address)


def _route(payload: bytes) -> Route:
    family, dst_len, _s, _t, table, *_rest = _RT.unpack_from(payload)
    attrs, offset = {}, _RT.size
    while offset + _ATTR.size <= len(payload):
        length, kind = _ATTR.unpack_from(payload, offset)
        attrs[kind] = payload[offset + _ATTR.size : offset + length]
        offset += (length + 3) & ~3
    dst = socket.inet_ntoa(attrs[RTA_DST]) if RTA_DST in attrs else "0.0.0.0"
    oif = struct.unpack("=I", attrs[RTA_OIF])[0] if RTA_OIF in attrs else None
    table = struct.unpack("=I", attrs[RTA_TABLE])[0] if RTA_TABLE in attrs else table
    return Route(f"{dst}/{dst_len}", oif, table)
