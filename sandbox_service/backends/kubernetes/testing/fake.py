"""An in-process fake of the Kubernetes API endpoints the backend uses: the contract double of
`tests/sandbox_service/test_kubernetes_contract.py` and the API server of `scripts/sim_k8s_scale.py`.
Never used by the service itself.

What it does like the API server: checks every created or replaced body against the Kubernetes
OpenAPI schema (kubernetes-validate, strict; the CNIs' policy resources, served as if their CRDs were
installed, against kubernetes_fake_crds) and the name/label rules; assigns uids and
resourceVersions; answers 404/409/422 with `Status` bodies; garbage-collects dependents by their
ownerReferences; serves LIST and WATCH (JSON lines from a resourceVersion, bookmarks not sent,
`410 Gone` once the version is compacted away, see `compact()`); injects faults (`fail()`), latency
per (method, kind), and API Priority and Fairness-style throttling (`inflight_limit`: requests over
it get 429 with Retry-After). Pod status comes from a `kubelet(pod, ticks)` function called by a
ticker thread (and on reads); each change is a MODIFIED event, as a kubelet's status update is.
Events about pods come from `emit_event()` (what a kubelet or the scheduler reports; the same reason
again bumps `count`), listed and watched with equality field selectors (`type=Warning,involvedObject.kind=Pod`).

What it does not do: admission (quotas, PodSecurity, webhooks), scheduling, images, a CNI.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import ipaddress
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import jsonschema
import kubernetes_validate

from sandbox_service.backends.kubernetes.testing.crds import CUSTOM_RESOURCES
from sandbox_service.backends.kubernetes.testing.crds import SCHEMAS as CRD_SCHEMAS
from sandbox_service.backends.kubernetes.testing.store import Key, ObjectStore

K8S_VERSION = "1.30"  # the API version kubernetes==30 (the installed client) speaks
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ROUTE = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<gv>[^/]+/[^/]+))/namespaces/(?P<ns>[^/]+)/"
    r"(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$"
)
_KIND = {
    "pods": ("Pod", "v1"),
    "secrets": ("Secret", "v1"),
    "networkpolicies": ("NetworkPolicy", "networking.k8s.io/v1"),
    "events": ("Event", "v1"),
    **CUSTOM_RESOURCES,
}  # as with the CRDs installed
_RESOURCES = {(api_version, key.split(".")[0]): key for key, (_, api_version) in _KIND.items()}  # -> kind key


def _route(path: str) -> tuple[str, str, str | None] | None:
    """(namespace, kind, name) of a path the fake serves. kind is the plural, or kubectl's `plural.group`
    for a custom resource whose plural a built-in resource has (networkpolicies.crd.antrea.io)."""
    route = _ROUTE.match(path)
    kind = route and _RESOURCES.get((route["core"] or route["gv"], route["plural"]))
    return (route["ns"], kind, route["name"]) if kind else None


_FORMATS = jsonschema.FormatChecker()
_FORMATS.checks("cidr", raises=ValueError)(lambda value: bool(ipaddress.ip_network(value)))  # the API server's "cidr"
_CRD_VALIDATORS = {
    kind: jsonschema.Draft202012Validator(schema, format_checker=_FORMATS) for kind, schema in CRD_SCHEMAS.items()
}

Kubelet = Callable[[dict, int], "dict | None"]
# A kubelet may also have `revisit(pod) -> seconds | None`: when its status can next change by itself
# (None: not until something else happens). Without it every pod is visited every tick, as a script
# counting ticks needs; with it the ticker visits only pods with a transition due (scale simulation).


def ts(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def label_problems(labels: dict[str, str]) -> list[str]:
    """The API server's label rules (apimachinery validation), which the OpenAPI schema does not hold."""
    bad = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (
            (prefix and (len(prefix) > 253 or not _NAME.match(prefix)))
            or not name
            or len(name) > 63
            or not _LABEL_VALUE.match(name)
        ):
            bad.append(f"label key {key!r}")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            bad.append(f"label value {value!r}")
    return bad


def _matches(obj: dict, selector: dict[str, str], fields: dict[str, str] | None = None) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items()) and all(
        _field(obj, path) == value for path, value in (fields or {}).items()
    )


def _field(obj: dict, path: str) -> str | None:
    """A field selector's field (`involvedObject.name`, `type`): dotted path into the object."""
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj if isinstance(obj, str) else None


def _selectors(query: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(label selector, field selector) of a LIST or WATCH query: equality terms, comma-separated."""

    def parse(key: str) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in query.get(key, [""])[0].split(",") if kv)

    return parse("labelSelector"), parse("fieldSelector")


class FakeKubernetesAPI:
    """The handful of endpoints the backend uses, with the API server's observable behaviour."""

    def __init__(self, *, validate: bool = True, tick_seconds: float = 0.02) -> None:
        self._due: list[tuple[float, Key]] = []  # (when, pod key): the kubelet's next visits, a heap
        self._visit_at: dict[Key, float] = {}  # pod key -> its one current entry in _due
        self._tick_seconds = tick_seconds
        self._store = ObjectStore(on_add=self._added)
        self.requests: list[dict] = []
        self.faults: list[dict] = []
        self.kubelet: Kubelet | None = None  # fn(pod, ticks) -> status dict | None
        self.reads: dict[str, int] = {}  # pod name -> how often the kubelet was asked about it
        self.content_types: list[tuple[str, str, str]] = []
        self.on_delete: Callable[[dict], None] = lambda obj: None  # what a kubelet does when a pod goes
        self.gc_enabled = True  # False: the garbage collector lags, dependents outlive their owner a while
        self.latency: dict[tuple[str, str], float] = {}  # (method, kind) -> seconds each such request takes
        self.inflight_limit: int | None = None  # APF: concurrent non-watch requests over this get 429
        self.retry_after = "1"
        self.event_history = 20000  # events kept for watches that resume
        self.validate = validate
        self.throttled = 0
        self.bytes_out = 0
        self.lock = threading.Condition()
        self._rv = 0
        self._inflight = 0
        self._events: list[tuple[int, str, str, str, dict]] = []  # (rv, kind, ns, type, object)
        self._compacted = 0
        self._expired = 0  # bumped by expire_watches()
        self._closed = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.server.request_queue_size = 1024
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()
        self.ticker = threading.Thread(target=self._tick, args=(tick_seconds,), daemon=True)
        self.ticker.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def objects(self) -> ObjectStore:
        """Every object by (kind, namespace, name). Tests may assign a plain dict: it is re-indexed."""
        return self._store

    @objects.setter
    def objects(self, items: dict) -> None:
        with self.lock:
            self._due, self._visit_at = [], {}
            self._store = ObjectStore(items, on_add=self._added)

    def _added(self, key: Key) -> None:
        if key[0] == "pods":  # the kubelet looks at a new pod at its next tick
            self._schedule(key, time.monotonic())

    def _schedule(self, key: Key, at: float) -> None:
        self._visit_at[key] = at
        heapq.heappush(self._due, (at, key))

    def close(self) -> None:
        self._closed.set()
        with self.lock:
            self.lock.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # -- test helpers -------------------------------------------------------------------------------
    def fail(
        self,
        method: str,
        kind: str,
        status: int,
        reason: str = "",
        *,
        times: int = 1,
        headers: dict | None = None,
        after: bool = False,
    ) -> None:
        """The next `times` matching requests answer `status`; `after`: the operation happens first
        (a lost response)."""
        self.faults.append(
            dict(
                method=method, kind=kind, status=status, reason=reason, times=times, headers=headers or {}, after=after
            )
        )

    def of_kind(self, kind: str) -> list[dict]:
        with self.lock:
            return self.objects.of(kind)

    def sent(self, method: str, kind: str) -> list[dict]:
        return [r for r in self.requests if r["method"] == method and r["kind"] == kind]

    def set_pod_status(self, name: str, status: dict, namespace: str = "orchard") -> None:
        with self.lock:
            pod = self.objects[("pods", namespace, name)]
            pod["status"] = status
            self._record("MODIFIED", "pods", namespace, pod)

    def emit_event(
        self, pod_name: str, reason: str, message: str, *, type: str = "Warning", namespace: str = "orchard"
    ) -> dict:
        """What a kubelet or the scheduler reports about a pod: a new Event, or the same (pod, reason)
        again with its count bumped, as the API server's event deduplication does."""
        with self.lock:
            pod = self.objects.get(("pods", namespace, pod_name), {"metadata": {"uid": ""}})
            key = ("events", namespace, f"{pod_name}.{reason.lower()}")
            now = ts(datetime.now(timezone.utc))
            event = self.objects.get(key)
            if event is None:
                event = self.objects[key] = {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "type": type,
                    "reason": reason,
                    "message": message,
                    "metadata": {"name": key[2], "namespace": namespace, "uid": str(uuid.uuid4())},
                    "involvedObject": {
                        "kind": "Pod",
                        "name": pod_name,
                        "namespace": namespace,
                        "uid": pod["metadata"]["uid"],
                    },
                    "count": 1,
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "source": {"component": "kubelet"},
                }
                self._record("ADDED", "events", namespace, event)
            else:
                event.update(message=message, count=event["count"] + 1, lastTimestamp=now)
                self._record("MODIFIED", "events", namespace, event)
            return copy.deepcopy(event)

    def compact(self) -> None:
        """Drop the event history, as etcd compaction does: watches from older versions get 410 Gone."""
        with self.lock:
            self._compacted = self._rv
            self._events.clear()
            self.lock.notify_all()

    def expire_watches(self) -> None:
        """Every open watch gets `410 Gone` now (the API server's watch cache was re-initialised)."""
        with self.lock:
            self._expired += 1
            self._compacted = self._rv + 1
            self._events.clear()
            self.lock.notify_all()

    # -- state --------------------------------------------------------------------------------------
    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _record(self, kind_of_event: str, kind: str, ns: str, obj: dict) -> None:
        """Log a change for watchers (caller holds the lock; the object's resourceVersion is bumped)."""
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._events.append((self._rv, kind, ns, kind_of_event, copy.deepcopy(obj)))
        if len(self._events) > self.event_history:  # etcd keeps a window too: older versions get 410
            drop = len(self._events) - self.event_history // 2
            self._compacted = self._events[drop][0] - 1
            del self._events[:drop]
        self.lock.notify_all()

    def _status(self, code: int, reason: str, message: str) -> tuple[int, dict]:
        return code, {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }

    def _validate(self, kind: str, body: dict) -> str | None:
        if self.validate and kind in CRD_SCHEMAS:  # a custom resource: its CRD's schema (kubernetes_fake_crds)
            error = jsonschema.exceptions.best_match(_CRD_VALIDATORS[kind].iter_errors(body))
            if error is not None:
                return f"schema: {error.message} at {list(error.absolute_path)}"
        elif self.validate:
            try:
                kubernetes_validate.validate(body, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                return f"schema: {err.message} at {list(err.absolute_path)}"
        meta = body.get("metadata", {})
        if not _NAME.match(meta.get("name", "")) or len(meta.get("name", "")) > 253:
            return f"metadata.name {meta.get('name')!r} is not a DNS subdomain"
        if kind == "pods" and len(meta["name"]) > 63:
            return "pod name longer than 63 characters (it is the hostname)"
        return "; ".join(label_problems(meta.get("labels") or {})) or None

    def _gc(self, uid: str) -> None:
        """The garbage collector: dependents of a deleted owner go too (found by the store's owner index)."""
        if not self.gc_enabled:
            return
        for key in self.objects.dependents(uid):
            obj = self.objects[key]
            del self.objects[key]
            self._record("DELETED", key[0], key[1], obj)

    def _kubelet(self, pod: dict, ns: str) -> None:
        if self.kubelet is None:
            return
        name = pod["metadata"]["name"]
        self.reads[name] = self.reads.get(name, 0) + 1
        status = self.kubelet(pod, self.reads[name])
        if status is not None and status != pod.get("status"):
            pod["status"] = status
            self._record("MODIFIED", "pods", ns, pod)

    def _tick(self, seconds: float) -> None:
        """Every `seconds`, the kubelet visits the pods whose visit is due (each pod's next visit is a
        tick later, or when the kubelet's `revisit` says): O(due pods) per tick, not O(pods)."""
        while not self._closed.wait(seconds):
            with self.lock:
                now = time.monotonic()
                while self._due and self._due[0][0] <= now:
                    at, key = heapq.heappop(self._due)
                    if self._visit_at.get(key) != at:
                        continue  # rescheduled since, or deleted
                    del self._visit_at[key]
                    pod = self.objects.get(key)
                    if pod is None:
                        continue
                    self._kubelet(pod, key[1])
                    revisit = getattr(self.kubelet, "revisit", None)
                    delay = seconds if revisit is None else revisit(pod)
                    if delay is not None:
                        self._schedule(key, now + max(delay, seconds))

    # -- requests -------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict, dict]:
        route = _route(path)
        if not route:
            return (*self._status(404, "NotFound", f"no route {path}"), {})
        ns, kind, name = route
        with self.lock:
            self.requests.append(dict(method=method, kind=kind, name=name, query=query, body=body, at=time.monotonic()))
            if self.inflight_limit is not None and self._inflight >= self.inflight_limit:
                self.throttled += 1
                return (
                    *self._status(429, "TooManyRequests", "too many requests (priority and fairness)"),
                    {"Retry-After": self.retry_after},
                )
            self._inflight += 1
        try:
            if (delay := self.latency.get((method, kind))) is not None:
                time.sleep(delay)
            with self.lock:
                for fault in self.faults:
                    if fault["times"] > 0 and fault["method"] == method and fault["kind"] == kind:
                        fault["times"] -= 1
                        if fault["after"]:
                            self._apply(method, ns, kind, name, query, body)
                        return (*self._status(fault["status"], fault["reason"], "injected fault"), fault["headers"])
                return (*self._apply(method, ns, kind, name, query, body), {})
        finally:
            with self.lock:
                self._inflight -= 1

    def _apply(self, method, ns, kind, name, query, body) -> tuple[int, dict]:
        api_kind, api_version = _KIND[kind]
        if method == "POST":
            body = {"apiVersion": api_version, "kind": api_kind, **body}  # as the API server fills them in
            problem = self._validate(kind, body)
            if problem:
                return self._status(422, "Invalid", problem)
            key = (kind, ns, body["metadata"]["name"])
            if key in self.objects:
                return self._status(409, "AlreadyExists", f'{kind} "{key[2]}" already exists')
            obj = copy.deepcopy(body)
            obj["metadata"].update(
                uid=str(uuid.uuid4()), creationTimestamp=ts(datetime.now(timezone.utc)), namespace=ns
            )
            if kind == "pods":
                obj["status"] = {"phase": "Pending"}
            self.objects[key] = obj
            self._record("ADDED", kind, ns, obj)
            return 201, obj
        if name is None and method == "GET":
            items = self._list(kind, ns, query)
            for item in items:
                if kind == "pods":
                    self._kubelet(item, ns)
            return 200, {
                "kind": f"{api_kind}List",
                "apiVersion": api_version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        key = (kind, ns, name)
        if key not in self.objects:
            return self._status(404, "NotFound", f'{kind} "{name}" not found')
        obj = self.objects[key]
        if method == "GET":
            if kind == "pods":
                self._kubelet(obj, ns)
            return 200, obj
        if method == "DELETE":
            del self.objects[key]
            self._record("DELETED", kind, ns, obj)
            self.on_delete(obj)
            self._gc(obj["metadata"]["uid"])
            return 200, obj if kind == "pods" else {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        if method == "PATCH":
            return self._patch(kind, ns, obj, body)
        if method == "PUT":
            if body["metadata"].get("resourceVersion") != obj["metadata"]["resourceVersion"]:
                return self._status(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version and try again",
                )
            problem = self._validate(kind, {k: v for k, v in body.items() if k != "status"})
            if problem:
                return self._status(422, "Invalid", problem)
            new = copy.deepcopy(body)
            self.objects[key] = new
            self._record("MODIFIED", kind, ns, new)
            return 200, new
        return self._status(405, "MethodNotAllowed", method)

    def _patch(self, kind: str, ns: str, obj: dict, body: dict) -> tuple[int, dict]:
        """Strategic merge as far as the backend uses it: metadata maps merge (null deletes a key), lists
        replace; `metadata.resourceVersion` in the patch is a precondition (409 when stale); a pod's
        `spec.activeDeadlineSeconds` may only be set or lowered; an immutable Secret's data never changes."""
        meta = dict(body.get("metadata") or {})
        expected = meta.pop("resourceVersion", None)
        if expected is not None and expected != obj["metadata"]["resourceVersion"]:
            return self._status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        spec = body.get("spec") or {}
        if kind == "pods" and set(spec) - {"activeDeadlineSeconds"}:
            return self._status(
                422,
                "Invalid",
                f"pod updates may not change fields other than activeDeadlineSeconds here: {sorted(spec)}",
            )
        if "activeDeadlineSeconds" in spec:
            new, old = spec["activeDeadlineSeconds"], obj["spec"].get("activeDeadlineSeconds")
            if not isinstance(new, int) or new < 1 or (old is not None and new > old):
                return self._status(
                    422,
                    "Invalid",
                    f"spec.activeDeadlineSeconds: {new!r}: must be positive and may not be increased (was {old})",
                )
        if kind == "secrets" and obj.get("immutable") and ("data" in body or body.get("immutable") is False):
            return self._status(422, "Invalid", "data: Forbidden: field is immutable when `immutable` is set")
        for field, value in meta.items():
            if isinstance(value, dict) and isinstance(obj["metadata"].get(field), dict):
                merged = {**obj["metadata"][field], **value}
                obj["metadata"][field] = {k: v for k, v in merged.items() if v is not None}
            else:
                obj["metadata"][field] = value
        if "activeDeadlineSeconds" in spec:
            obj["spec"]["activeDeadlineSeconds"] = spec["activeDeadlineSeconds"]
        if kind == "secrets":
            obj["data"] = {
                k: v for k, v in {**obj.get("data", {}), **(body.get("data") or {})}.items() if v is not None
            }
            if "immutable" in body:
                obj["immutable"] = body["immutable"]
        self.objects[(kind, ns, obj["metadata"]["name"])] = obj  # re-indexed: labels or owners may have changed
        self._record("MODIFIED", kind, ns, obj)
        return 200, obj

    def _list(self, kind: str, ns: str, query: dict) -> list[dict]:
        selector, fields = _selectors(query)
        return [o for o in self.objects.labelled(kind, ns, selector) if _matches(o, selector, fields)]

    def watch(self, write: Callable[[bytes], None], path: str, query: dict) -> None:
        """Stream events after `resourceVersion` as JSON lines until `timeoutSeconds` or close."""
        ns, kind, _ = _route(path)
        selector, fields = _selectors(query)
        cursor = int(query.get("resourceVersion", ["0"])[0] or 0)
        until = time.monotonic() + float(query.get("timeoutSeconds", ["300"])[0])
        generation = self._expired
        with self.lock:
            self.requests.append(
                dict(method="WATCH", kind=kind, name=None, query=query, body=None, at=time.monotonic())
            )
        while not self._closed.is_set() and time.monotonic() < until:
            with self.lock:
                if cursor < self._compacted or generation != self._expired:
                    gone = self._status(410, "Expired", f"too old resource version: {cursor} ({self._compacted})")
                    lines = [{"type": "ERROR", "object": gone[1]}]
                else:  # the events after `cursor` only: found by bisection, resourceVersions only grow
                    first = bisect.bisect_right(self._events, cursor, key=lambda event: event[0])
                    lines = [
                        {"type": t, "object": o}
                        for rv, k, n, t, o in self._events[first:]
                        if k == kind and n == ns and _matches(o, selector, fields)
                    ]
                    cursor = max(cursor, self._rv)
                    if not lines:
                        self.lock.wait(min(0.5, max(0.0, until - time.monotonic())))
                        continue
            data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
            self.bytes_out += len(data)
            write(data)
            if lines[0]["type"] == "ERROR":
                return

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # a watch is a chunked response, as the API server sends it

            def log_message(self, *args):  # keep pytest output clean
                pass

            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                if method == "GET" and query.get("watch", [""])[0] in ("true", "1", "True"):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()

                    def write(data: bytes) -> None:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()

                    try:
                        fake.watch(write, url.path, query)
                        self.wfile.write(b"0\r\n\r\n")
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    self.close_connection = True
                    return
                if method in ("POST", "PUT", "PATCH"):
                    fake.content_types.append((method, url.path, self.headers.get("Content-Type")))
                status, payload, headers = fake.handle(method, url.path, query, body)
                raw = json.dumps(payload).encode()
                fake.bytes_out += len(raw)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_PUT(self):
                self._serve("PUT")

            def do_PATCH(self):
                self._serve("PATCH")

            def do_DELETE(self):
                self._serve("DELETE")

        return Handler


# -- kubelet scripts: what a pod's status looks like over successive ticks -----------------------------
def running_status(pod: dict, ip: str) -> dict:
    return {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "containerStatuses": [
            {
                "name": "sandbox",
                "image": pod["spec"]["containers"][0]["image"],
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": pod["metadata"]["creationTimestamp"]}},
            }
        ],
    }


def running_after(reads_pending: int, ip: str = "10.244.1.7") -> Kubelet:
    def kubelet(pod: dict, reads: int) -> dict:
        if reads <= reads_pending:
            return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
        return running_status(pod, ip)

    return kubelet


def waiting(reason: str, message: str) -> Kubelet:
    def kubelet(pod: dict, reads: int) -> dict:
        return {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "sandbox",
                    "image": pod["spec"]["containers"][0]["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ],
        }

    return kubelet
