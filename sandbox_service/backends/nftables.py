"""libnftables (Debian `libnftables1`, the library behind the `nft` command) through ctypes.

Why the library and not the `nft` command: the local backend changes the ruleset on every allowlist
create and delete, and an `nft` process per change would be a process more per create (the network
set-up is three). The library runs the same command language in this process, and each call is one
netlink transaction: every command of a batch applies, or none does. Why ctypes: Debian's binding
(python3-nftables) is a ctypes wrapper installed for the system interpreter only; this is its few entry
points, the same way agent/seccomp.py reaches libseccomp.

A context is not thread-safe and talks to the network namespace it was made in: one for the service's
namespace, every call under a lock (ctypes releases the GIL while the library talks to the kernel, so
other threads keep running), and a fresh one per call from a thread that entered a sandbox's namespace
(`run_here`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import threading

NFT_CTX_OUTPUT_JSON = 1 << 4


class NftablesError(Exception):
    """A batch the kernel (or the library's parser) refused; nothing of it was applied."""


class NftablesUnavailable(NftablesError):
    """libnftables is not installed."""


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("nftables") or "libnftables.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise NftablesUnavailable(
            f"libnftables is not installed ({exc}); install Debian's `nftables` (scripts/install-system-deps.sh)"
        ) from None
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    for fn in ("nft_ctx_buffer_output", "nft_ctx_buffer_error", "nft_ctx_free"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    for fn in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
        getattr(lib, fn).restype = ctypes.c_char_p
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


class _Context:
    """One libnftables context: its netlink socket talks to the network namespace it was made in."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.ctx = lib.nft_ctx_new(0)
        if not self.ctx:
            raise NftablesError("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)

    def run(self, commands: str, json_output: bool) -> str:
        lib, ctx = self.lib, self.ctx
        lib.nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON if json_output else 0)
        ret = lib.nft_run_cmd_from_buffer(ctx, commands.encode())
        output = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode()
        error = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode()
        if ret != 0:
            raise NftablesError(error.strip() or f"nftables refused the batch (return {ret})")
        return output

    def free(self) -> None:
        self.lib.nft_ctx_free(self.ctx)


_state: dict = {}
_lock = threading.Lock()


def _lib() -> ctypes.CDLL:
    lib = _state.get("lib")
    if lib is not None:  # loaded: no lock, which a host transaction holds for its whole length
        return lib
    with _lock:
        if "lib" not in _state:
            _state["lib"] = _load()
        return _state["lib"]


def _host(commands: str, json_output: bool) -> str:
    lib = _lib()
    with _lock:  # the service's namespace: one context, every call in turn
        if "host" not in _state:
            _state["host"] = _Context(lib)
        return _state["host"].run(commands, json_output)


def run(commands: str) -> None:
    """Apply `commands` (nft's language, one per line) as one transaction; NftablesError if refused."""
    _host(commands, json_output=False)


def query(command: str) -> list[dict]:
    """The objects a `list ...` command prints, as nft's JSON (the `nftables` array without metainfo)."""
    out = _host(command, json_output=True)
    return [item for item in json.loads(out or '{"nftables": []}')["nftables"] if "metainfo" not in item]


def run_here(commands: str) -> None:
    """`run`, with a context made in the calling thread's network namespace (for a thread that entered a
    sandbox's: netns.call_in_netns)."""
    ctx = _Context(_lib())
    try:
        ctx.run(commands, json_output=False)
    finally:
        ctx.free()


def available() -> bool:
    try:
        _lib()
    except NftablesError:
        return False
    return True
