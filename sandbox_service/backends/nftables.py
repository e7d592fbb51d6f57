"""libnftables (Debian `libnftables1`, the library behind the `nft` command) through ctypes.

Why the library and not the `nft` command: the local backend changes the ruleset on every allowlist
create and delete, and an `nft` process per change would be a process more per create (the network
set-up is three). The library runs the same command language in this process, and each call is one
netlink transaction: every command of a batch applies, or none does. Why ctypes: Debian's binding
(python3-nftables) is a ctypes wrapper installed for the system interpreter only; this is its few entry
points, the same way agent/seccomp.py reaches libseccomp.

A context is not thread-safe: one per process, every call under a lock (ctypes releases the GIL while
the library talks to the kernel, so other threads keep running).
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


class _Library:
    def __init__(self):
        name = ctypes.util.find_library("nftables") or "libnftables.so.1"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError as exc:
            raise NftablesUnavailable(f"libnftables is not installed ({exc}); install Debian's `nftables` "
                                      "(scripts/install-system-deps.sh)") from None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        for fn in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        for fn in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, fn).restype = ctypes.c_char_p
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self.lib = lib
        self.lock = threading.Lock()
        self.ctx = lib.nft_ctx_new(0)
        if not self.ctx:
            raise NftablesError("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(self.ctx)
        lib.nft_ctx_buffer_error(self.ctx)

    def run(self, commands: str, json_output: bool) -> str:
        lib, ctx = self.lib, self.ctx
        with self.lock:
            lib.nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON if json_output else 0)
            ret = lib.nft_run_cmd_from_buffer(ctx, commands.encode())
            output = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode()
            error = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode()
        if ret != 0:
            raise NftablesError(error.strip() or f"nftables refused the batch (return {ret})")
        return output


_library: list[_Library] = []
_library_lock = threading.Lock()


def _lib() -> _Library:
    with _library_lock:
        if not _library:
            _library.append(_Library())
        return _library[0]


def run(commands: str) -> None:
    """Apply `commands` (nft's language, one per line) as one transaction; NftablesError if refused."""
    _lib().run(commands, json_output=False)


def query(command: str) -> list[dict]:
    """The objects a `list ...` command prints, as nft's JSON (the `nftables` array without metainfo)."""
    out = _lib().run(command, json_output=True)
    return [item for item in json.loads(out or '{"nftables": []}')["nftables"] if "metainfo" not in item]


def available() -> bool:
    try:
        _lib()
    except NftablesError:
        return False
    return True
