"""Work done inside a sandbox's network namespace from a thread of this process, not an `nsenter` process.

setns(CLONE_NEWNET) moves only the calling thread, and what that thread makes there stays there: a netlink
socket talks to the namespace it was opened in, and /proc/sys/net resolves against the opening thread's
namespace. So a short-lived thread enters the namespace, does its work and ends; it never returns to the
service's namespace, so no thread of the service is ever left in a sandbox's. The same pattern the
kernel's own network selftests use (tools/testing/selftests/net/lib/py/netns.py).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

T = TypeVar("T")


class NamespaceEntryError(OSError):
    """The namespace could not be entered (its process is gone, or this process may not)."""


def call_in_netns(pid: int, fn: Callable[[], T]) -> T:
    """`fn()` in the network namespace of process `pid`, from a thread that enters it; its result or its
    exception, in the caller's thread."""
    result: list[T] = []
    failure: list[BaseException] = []

    def enter_and_call() -> None:
        try:
            try:
                fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise NamespaceEntryError(exc.errno, f"no network namespace of process {pid}: {exc.strerror}")
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise NamespaceEntryError(err, f"cannot enter the network namespace of {pid}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=enter_and_call, name=f"netns-{pid}")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
