"""The allowlist's enforcement outside the sandbox: an nftables filter on the host end of each sandbox's link.

Routes inside the sandbox's namespace are not a boundary: a socket bound to the interface
(SO_BINDTODEVICE, unprivileged since Linux 5.7), given an output interface (IP_UNICAST_IF) or naming it in
a datagram's IP_PKTINFO needs no route, and the host end of the veth answers ARP for every address of the
host. So every packet a sandbox sends is decided in the service's namespace, where the sandbox has no
say, before routing, conntrack or any other rule of the host (priority raw of the prerouting hook):

    table inet orchard_egress
      map egress  { ifname : verdict }        "orc5h" : jump orc5h, one entry per sandbox link
      set links   { ifname }                  the same links, for the output hook
      chain prerouting (hook, priority raw)   iifname vmap @egress
      chain output     (hook, priority raw)   oifname @links notrack
      set n<digest>, w<digest>                named interval sets, one per content (below)
      chain orc5h                             one per sandbox, named after its link's host end:
        notrack                                 its packets never take a slot of the host's conntrack table
        ip daddr { <named /32s> } accept        single addresses the allowlist names, the host's included
        fib daddr type != unicast drop          the host's own addresses, broadcast, multicast: only if named
        ip daddr @n<digest> drop                the sandbox subnet and cloud metadata: other sandboxes only if
                                                named, metadata never
        ip daddr @w<digest> accept              the allowlist's wider CIDRs
        drop                                    everything else, and every IPv6 packet

The wider CIDRs and the never-reached ranges are named sets shared by every chain that names the same
list (a set's name is a digest of its content; the published API's unrestricted egress is one set of ~116
ranges for every such sandbox), not an anonymous set in each chain: libnftables reads every interval set's
elements before it changes a set's elements (its cache), so with an anonymous interval set per chain each
create and delete read every sandbox's ranges: 182 ms of CPU an allow + remove with 1,000 such sandboxes,
3 ms with 10; with shared sets, 5 ms with 1,000. A set goes when this process's last chain naming it goes
(the kernel refuses to delete a set a chain still names: another service's use keeps it).

A sandbox's chain, map entry and set entry are added in one transaction before its link exists, replaced
in one transaction when its policy changes (never an instant without a filter), and removed after its
link is gone. `notrack` keeps sandbox traffic out of the host's connection table (nf_conntrack_max is
one pool for the host): the local backend does not NAT sandbox traffic, so nothing needs its state. The
table is ours alone (kubelet's and kube-proxy's rules live in tables of their own; a drop here is final
whatever they accept). It is machine-wide, like the link names (`net_index_dir`): made by the first
allowlist create, and removed when a service stops while no allowlist slot of the machine is held.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import threading

from sandbox_service.backends import nftables
from sandbox_service.backends.allowlist import METADATA_CIDRS
from sandbox_service.errors import BackendUnavailableError

TABLE = "inet orchard_egress"
_HOOK_CHAINS = ("prerouting", "output")

_BASE = f"""add table {TABLE}
add map {TABLE} egress {{ type ifname : verdict; }}
add set {TABLE} links {{ type ifname; }}
add chain {TABLE} prerouting {{ type filter hook prerouting priority raw; policy accept; }}
flush chain {TABLE} prerouting
add rule {TABLE} prerouting iifname vmap @egress
add chain {TABLE} output {{ type filter hook output priority raw; policy accept; }}
flush chain {TABLE} output
add rule {TABLE} output oifname @links notrack
"""


def _check_link(link: str) -> None:
    if not link.isalnum() or link in _HOOK_CHAINS:  # it names a chain, and goes into the batch's text
        raise ValueError(f"{link!r} is not a sandbox link name")


def ensure() -> None:
    """Create the table and its hook chains, or put them back as they must be (idempotent, one transaction)."""
    try:
        nftables.run(_BASE)
    except nftables.NftablesError as exc:
        raise BackendUnavailableError(
            f"cannot install the sandbox egress filter (nftables table {TABLE}): {exc}. "
            "Allowlist sandboxes need nf_tables in the kernel and Debian's `nftables` "
            "(scripts/install-system-deps.sh)"
        ) from exc


def _shared_set(prefix: str, nets: list[ipaddress.IPv4Network]) -> tuple[str, list[str]]:
    """The named interval set holding `nets` (collapsed): its name, a digest of its content, and the lines
    that make it. `add`, never `create`: a batch that makes a set another chain already uses changes nothing."""
    elements = [str(n) for n in ipaddress.collapse_addresses(nets)]
    name = prefix + hashlib.sha256(",".join(elements).encode()).hexdigest()[:16]
    return name, [
        f"add set {TABLE} {name} {{ type ipv4_addr; flags interval; }}",
        f"add element {TABLE} {name} {{ {', '.join(elements)} }}",
    ]


def rules(link: str, cidrs: list[str], sandbox_subnet: str) -> tuple[str, frozenset[str]]:
    """The batch that makes `link`'s chain say `cidrs` (IPv4 CIDRs), and hooks it in, with the shared sets
    it names. `sandbox_subnet`: the other sandboxes' addresses, which, like the host's own, open only when
    named one by one."""
    _check_link(link)
    named, make_sets, never_set, wide_set = _ranges(tuple(cidrs), sandbox_subnet)
    chain = f"{TABLE} {link}"
    lines = [*make_sets, f"add chain {chain}", f"flush chain {chain}", f"add rule {chain} notrack"]
    if named:
        lines.append(f"add rule {chain} ip daddr {{ {', '.join(named)} }} accept")
    if wide_set:
        lines += [
            f"add rule {chain} fib daddr type != unicast drop",
            f"add rule {chain} ip daddr @{never_set} drop",
            f"add rule {chain} ip daddr @{wide_set} accept",
        ]
    lines += [
        f"add rule {chain} drop",
        f'add element {TABLE} egress {{ "{link}" : jump {link} }}',
        f'add element {TABLE} links {{ "{link}" }}',
    ]
    return "\n".join(lines) + "\n", frozenset({never_set, wide_set} - {""})


@functools.lru_cache(maxsize=256)
def _ranges(cidrs: tuple[str, ...], sandbox_subnet: str) -> tuple[tuple[str, ...], tuple[str, ...], str, str]:
    """What a chain of `cidrs` names, once per list (parsing and collapsing a hundred CIDRs on every create
    was most of the service's Python time in an allowlist set-up): the /32 addresses, the lines that make
    the shared sets, and the sets' names ("" without wide CIDRs). Callers never change what it returns."""
    nets = [ipaddress.IPv4Network(c) for c in cidrs]
    named = tuple(sorted({str(n.network_address) for n in nets if n.prefixlen == 32}))
    wide = [n for n in nets if n.prefixlen < 32]
    if not wide:
        return named, (), "", ""
    never = [sandbox_subnet, *(c for c in METADATA_CIDRS if ipaddress.ip_network(c).version == 4)]
    never_set, make_never = _shared_set("n", [ipaddress.IPv4Network(c) for c in never])
    wide_set, make_wide = _shared_set("w", wide)
    return named, (*make_never, *make_wide), never_set, wide_set


# The shared sets each link's chain names, for the links this process filtered: a set no chain of ours
# names any more is deleted (best effort: the kernel keeps one another service's chain still names).
_named_by: dict[str, frozenset[str]] = {}
_named_lock = threading.Lock()


def _note_sets(link: str, sets: frozenset[str] | None) -> None:
    """Record what `link`'s chain names now (None: no chain), and delete the shared sets nothing of ours names."""
    with _named_lock:
        before = _named_by.pop(link, frozenset())
        if sets:
            _named_by[link] = sets
        unused = before - frozenset().union(*_named_by.values())
    for name in sorted(unused):
        try:
            nftables.run(f"delete set {TABLE} {name}\n")
        except nftables.NftablesError:
            pass  # still named by another service's chain (EBUSY), or gone with the table


def allow(link: str, cidrs: list[str], sandbox_subnet: str) -> None:
    """Let packets arriving from `link` reach `cidrs` only; replaces what the link allowed before, in one
    transaction. Call before the link exists."""
    batch, sets = rules(link, cidrs, sandbox_subnet)
    try:
        nftables.run(batch)
    except nftables.NftablesError:
        ensure()  # the table went (`nft flush ruleset`?): put it back, then try once more
        try:
            nftables.run(batch)
        except nftables.NftablesError as exc:
            raise BackendUnavailableError(f"sandbox egress filter for {link}: {exc}") from exc
    _note_sets(link, sets)


def remove(link: str) -> None:
    """Remove `link`'s chain and entries (idempotent: whatever part exists goes, in one transaction)."""
    _check_link(link)
    chain = f"{TABLE} {link}"
    # `add` first makes each `delete` find its object: nft 1.0.6 has no delete-if-exists (`destroy`).
    batch = (
        f'add chain {chain}\nadd element {TABLE} egress {{ "{link}" : jump {link} }}\n'
        f'add element {TABLE} links {{ "{link}" }}\ndelete element {TABLE} egress {{ "{link}" }}\n'
        f'delete element {TABLE} links {{ "{link}" }}\nflush chain {chain}\ndelete chain {chain}\n'
    )
    try:
        nftables.run(batch)
    except nftables.NftablesError as exc:
        if not table_exists():
            _note_sets(link, None)
            return  # no table: nothing of the link can be left
        raise BackendUnavailableError(f"could not remove the egress filter of {link}: {exc}") from exc
    _note_sets(link, None)


def drop_table() -> None:
    """Remove the whole table (idempotent). Only when no sandbox link can exist: see local_network.release_table."""
    nftables.run(f"add table {TABLE}\ndelete table {TABLE}\n")
    with _named_lock:
        _named_by.clear()  # every set went with the table


def table_exists() -> bool:
    try:
        nftables.query(f"list table {TABLE}")
    except nftables.NftablesError:
        return False
    return True


def filtered_links() -> list[str]:
    """The links that have a chain in the table now (none without the table or the library)."""
    try:
        items = nftables.query(f"list chains {TABLE.split()[0]}")
    except nftables.NftablesError:
        return []
    name = TABLE.split()[1]
    return sorted(
        c["chain"]["name"]
        for c in items
        if "chain" in c and c["chain"]["table"] == name and c["chain"]["name"] not in _HOOK_CHAINS
    )


# In the sandbox's own namespace: no multicast or broadcast leaves eth0. Such a destination is sent to
# without a route lookup through the gateway, and each group would take an entry of the machine's IPv4
# neighbour table; dropped here, before the neighbour is looked up. The sandbox cannot change it (its
# namespace belongs to the host's user namespace, where it holds no CAP_NET_ADMIN).
_SOURCE = """add table ip orchard_source
add chain ip orchard_source output { type filter hook output priority 0; policy accept; }
flush chain ip orchard_source output
add rule ip orchard_source output oifname "eth0" ip daddr { 224.0.0.0/4, 255.255.255.255 } drop
"""


def confine_source_here() -> None:
    """Install the sandbox-side table in the calling thread's network namespace (idempotent): called from
    the thread that entered the sandbox's (local/network.py)."""
    try:
        nftables.run_here(_SOURCE)
    except nftables.NftablesError as exc:
        raise BackendUnavailableError(f"sandbox egress filter: {exc}") from exc
