"""One watch on the service instance's sandbox pods, instead of polling each pod.

Informer-style: LIST once, then WATCH from that list's resourceVersion; on `410 Gone` (the API server
compacted past our version) LIST again. Waiters block on a condition that every event wakes, so a
create costs no API call between its POST and its pod running, and `status()` costs none at all.

Pods are kept as the JSON dicts the API sends and decoded into `V1Pod` only when someone asks for
that pod (decoding costs ~2 ms of Python per pod; a busy namespace sends thousands of events that no
one waits for). Hand-written rather than a library informer: the `kubernetes` client ships `Watch`
but no cache, and the asyncio clients would mean a second client stack for one loop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from sandbox_service.backends.kubernetes.decode import decode

log = logging.getLogger("sandbox_service.kubernetes")


def decode_pod(data: dict) -> k8s.V1Pod:
    return decode(data, "V1Pod")


class PodCache:
    """The pods matching `selector` in `namespace`, kept current by one watch (a daemon thread)."""

    def __init__(
        self,
        core: k8s.CoreV1Api,
        namespace: str,
        selector: str,
        *,
        before_request: Callable[[], None] = lambda: None,
        watch_timeout_seconds: int = 240,
        request_timeout_seconds: float = 30.0,
        backoff_max_seconds: float = 10.0,
        list_fn: Callable[..., Any] | None = None,
        selector_kind: str = "label_selector",
    ):
        self.core, self.namespace, self.selector = core, namespace, selector
        # What is listed and watched: pods by a label selector, or (kubernetes_events) another kind by a field selector.
        self._list_fn = list_fn or core.list_namespaced_pod
        self._selector_arg = {selector_kind: selector}
        self._before_request = before_request  # the shared rate limiter
        self._watch_timeout = watch_timeout_seconds
        self._request_timeout = request_timeout_seconds
        self._backoff_max = backoff_max_seconds
        self._pods: dict[str, dict] = {}
        self._decoded: dict[str, tuple[str, k8s.V1Pod]] = {}  # name -> (resourceVersion, pod)
        self._cond = threading.Condition()
        self._waiters: dict[str, threading.Event] = {}  # pod name -> set on each change of that pod
        self._synced = False
        self._stopped = threading.Event()
        self._watch: k8s_watch.Watch | None = None
        self.last_error: str | None = None
        self.relists = 0
        self.resource_version = 0  # of the last event or list applied (tests wait for it to catch up)
        self._thread = threading.Thread(target=self._run, name=f"pod-watch-{namespace}", daemon=True)
        self._thread.start()

    # -- readers ------------------------------------------------------------------------------------
    def wait_synced(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._synced or self._stopped.is_set(), timeout) and self._synced

    def get(self, name: str, timeout: float = 30.0) -> k8s.V1Pod | None:
        """The pod as last seen, or None if it does not exist (after the first sync)."""
        if not self.wait_synced(timeout):
            raise TimeoutError(f"the pod watch did not sync within {timeout:g} s ({self.last_error or 'no error'})")
        with self._cond:
            return self._decode(name)

    def find(self, label: str, value: str, timeout: float = 30.0) -> list[k8s.V1Pod]:
        if not self.wait_synced(timeout):
            raise TimeoutError(f"the pod watch did not sync within {timeout:g} s ({self.last_error or 'no error'})")
        with self._cond:
            names = [n for n, p in self._pods.items() if (p["metadata"].get("labels") or {}).get(label) == value]
            return [pod for n in names if (pod := self._decode(n)) is not None]

    def wait(self, name: str, done: Callable[[k8s.V1Pod | None], Any], timeout: float) -> Any:
        """Block until `done(pod)` is truthy (re-checked on every change of any pod); return its value,
        or None at the timeout. Blocks on a condition: no API call and no polling while waiting."""
        deadline = time.monotonic() + timeout
        if not self.wait_synced(timeout):
            return None
        try:
            while True:
                with self._cond:
                    changed = self._waiters.setdefault(name, threading.Event())
                    changed.clear()
                    pod = self._decode(name)
                if result := done(pod):
                    return result
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped.is_set():
                    return None
                # Woken by this pod's changes only (a thousand waiters must not all wake on every event),
                # and at least each second: `done` may depend on the clock (grace periods).
                changed.wait(min(left, 1.0))
        finally:
            with self._cond:
                self._waiters.pop(name, None)

    def wait_version(self, resource_version: int, timeout: float) -> bool:
        """Wait until the cache has seen `resource_version` (resourceVersions are opaque in general;
        the fake's are integers, and only tests call this)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.resource_version >= resource_version, timeout)

    def poke(self, name: str) -> None:
        """Wake whoever waits on this pod now (something else about it changed, e.g. an Event came)."""
        with self._cond:
            if (waiter := self._waiters.get(name)) is not None:
                waiter.set()

    def _decode(self, name: str) -> k8s.V1Pod | None:
        data = self._pods.get(name)
        if data is None:
            return None
        rv = data["metadata"].get("resourceVersion", "")
        cached = self._decoded.get(name)
        if cached is None or cached[0] != rv:
            cached = self._decoded[name] = (rv, decode_pod(data))
        return cached[1]

    # -- the watch loop -----------------------------------------------------------------------------
    def _relist(self) -> str:
        self._before_request()
        resp = self._list_fn(
            self.namespace, **self._selector_arg, _preload_content=False, _request_timeout=self._request_timeout
        )
        body = json.loads(resp.data)
        with self._cond:
            self._pods = {p["metadata"]["name"]: p for p in body.get("items") or []}
            self._decoded = {n: d for n, d in self._decoded.items() if n in self._pods}
            self._synced = True
            self.relists += 1
            self.resource_version = int(body["metadata"]["resourceVersion"] or 0)
            for waiter in self._waiters.values():
                waiter.set()
            self._cond.notify_all()
        return body["metadata"]["resourceVersion"]

    def _apply(self, kind: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        with self._cond:
            if kind == "DELETED":
                self._pods.pop(name, None)
                self._decoded.pop(name, None)
            else:
                self._pods[name] = obj
            if (waiter := self._waiters.get(name)) is not None:
                waiter.set()
            self._cond.notify_all()

    def _run(self) -> None:
        rv: str | None = None
        failures = 0
        while not self._stopped.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                self._before_request()
                self._watch = k8s_watch.Watch(return_type="object")
                for event in self._watch.stream(
                    self._list_fn,
                    self.namespace,
                    **self._selector_arg,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self._watch_timeout,
                    _request_timeout=self._watch_timeout + self._request_timeout,
                ):
                    obj = event["raw_object"]
                    rv = obj.get("metadata", {}).get("resourceVersion") or rv
                    if event["type"] != "BOOKMARK":
                        self._apply(event["type"], obj)
                    with self._cond:
                        self.resource_version = int(rv or 0)
                        self._cond.notify_all()
                    failures = 0
                    if self._stopped.is_set():
                        return
            except ApiException as err:
                if err.status == 410:  # our version is compacted away: start over from a fresh list
                    log.info("pod watch in %s: 410 Gone, listing again", self.namespace)
                    rv = None
                    continue
                failures += 1
                self.last_error = f"{err.status} {err.reason}"
            except (Urllib3Error, ConnectionError, TimeoutError, OSError, ValueError) as err:
                failures += 1
                self.last_error = f"{type(err).__name__}: {err}"
            if failures:
                delay = min(self._backoff_max, 0.1 * 2 ** min(failures, 10))
                log.warning("pod watch in %s failed (%s); again in %.1fs", self.namespace, self.last_error, delay)
                self._stopped.wait(delay)

    def close(self) -> None:
        self._stopped.set()
        with self._cond:
            for waiter in self._waiters.values():
                waiter.set()
        if self._watch is not None:
            self._watch.stop()
        with self._cond:
            self._cond.notify_all()
