"""A real HTTP server on loopback serving the PyTorchJob endpoints of the Kubernetes API (kubeflow.org/v1).

What it does like the API server with the Training Operator installed: validates a created body
against the PyTorchJob schema and PodSpecs (422 with a `Status` body otherwise), fills `generateName`,
answers 404/409, and moves each job's status along a script of conditions, one step per read (the
operator's Created -> Running -> Succeeded|Failed). `on_create(job)` stands in for the pods' work, and
`status_of(job)` can report it instead of the script (e.g. a real torchrun process on this machine).
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pipelines.jobs.pytorchjob import validate_pytorchjob

_ROUTE = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/(?P<ns>[^/]+)/pytorchjobs(?:/(?P<name>[^/?]+))?")


def condition(kind: str, reason: str = "", message: str = "", t: int = 0) -> dict:
    return {
        "type": kind,
        "status": "True",
        "reason": reason or f"PyTorchJob{kind}",
        "message": message,
        "lastTransitionTime": f"2026-12-03T12:00:{t:02d}Z",
    }


SUCCEEDS = [
    {"conditions": [condition("Created", t=1)]},
    {
        "conditions": [condition("Created", t=1), condition("Running", t=2)],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}},
    },
    {
        "conditions": [condition("Created", t=1), condition("Running", t=2), condition("Succeeded", t=3)],
        "replicaStatuses": {"Master": {"succeeded": 1}, "Worker": {"succeeded": 1}},
    },
]


def fails(reason: str, message: str) -> list[dict]:
    return [
        *SUCCEEDS[:2],
        {
            "conditions": [
                condition("Created", t=1),
                condition("Running", t=2),
                condition("Failed", reason, message, t=3),
            ],
            "replicaStatuses": {"Master": {"failed": 1}, "Worker": {"active": 1}},
        },
    ]


class PyTorchJobAPI:
    def __init__(
        self,
        script: list[dict] | None = None,
        on_create: Callable[[dict], None] | None = None,
        status_of: Callable[[dict], dict] | None = None,
    ):
        self.script = script if script is not None else SUCCEEDS  # statuses a job goes through, one per read
        self.on_create = on_create
        self.status_of = status_of  # instead of the script: the job's status now (e.g. from a real process)
        self.jobs: dict[tuple[str, str], dict] = {}
        self.reads: dict[tuple[str, str], int] = {}
        self.deleted: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PyTorchJobAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def api_client(self):
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return client.ApiClient(config)

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet test output
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": reason,
                        "message": message,
                        "code": code,
                    },
                )

            def do_POST(self) -> None:  # noqa: N802 (http.server's names)
                route = _ROUTE.match(self.path)
                api.requests.append(("POST", self.path))
                if not route or route["name"]:
                    return self._status(404, "NotFound", self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    validate_pytorchjob(body, versions=["1.30"])
                except Exception as err:  # noqa: BLE001 (any schema error is the client's 422)
                    return self._status(422, "Invalid", f"PyTorchJob is invalid: {str(err).splitlines()[0]}")
                meta = body["metadata"]
                if "name" not in meta:
                    meta["name"] = meta.pop("generateName") + uuid.uuid4().hex[:5]
                key = (route["ns"], meta["name"])
                with api._lock:
                    if key in api.jobs:
                        return self._status(409, "AlreadyExists", f"pytorchjobs {meta['name']} already exists")
                    meta |= {"namespace": route["ns"], "uid": str(uuid.uuid4())}
                    api.jobs[key] = body
                if api.on_create is not None:
                    api.on_create(body)
                self._send(201, body)

            def do_GET(self) -> None:  # noqa: N802
                route = _ROUTE.match(self.path)
                api.requests.append(("GET", self.path))
                key = (route["ns"], route["name"]) if route else None
                with api._lock:
                    if key not in api.jobs:
                        return self._status(404, "NotFound", f"pytorchjobs {key} not found")
                    n = api.reads[key] = api.reads.get(key, 0) + 1
                    job = api.jobs[key]
                    if api.status_of is not None:
                        job["status"] = api.status_of(job)
                    elif api.script:
                        job["status"] = api.script[min(n, len(api.script)) - 1]
                self._send(200, job)

            def do_DELETE(self) -> None:  # noqa: N802
                route = _ROUTE.match(self.path)
                key = (route["ns"], route["name"]) if route else None
                with api._lock:
                    if api.jobs.pop(key, None) is None:
                        return self._status(404, "NotFound", f"pytorchjobs {key} not found")
                    api.deleted.append(key[1])
                self._send(200, {"kind": "Status", "status": "Success"})

        return Handler
