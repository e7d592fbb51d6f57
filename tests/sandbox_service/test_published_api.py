"""Contract test of the published environment API (`/published`, microsoft/Orchard `docs/api.md`) against the
real service: every route of the reference, its bodies, status codes, the job life cycle and 408s."""

from __future__ import annotations

import base64
import shutil
import uuid
import json
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

# Every route of the reference (method, path); the auth test walks all of them.
REFERENCE_ROUTES = [
    ("GET", "/resources"),
    ("POST", "/sandboxes"),
    ("GET", "/sandboxes/x"),
    ("GET", "/sandboxes/x/wait"),
    ("DELETE", "/sandboxes/x"),
    ("POST", "/sandboxes/x/heartbeat"),
    ("POST", "/sandboxes/x/exec"),
    ("POST", "/sandboxes/x/apply_patch"),
    ("POST", "/sandboxes/x/files"),
    ("GET", "/sandboxes/x/files"),
    ("GET", "/sandboxes/x/files/list"),
    ("GET", "/jobs/x"),
    ("GET", "/jobs/x/wait"),
]


@pytest.fixture(scope="module")
def api(sandbox_service):
    with httpx.Client(
        base_url=sandbox_service.url + "/published", timeout=60, headers={"X-API-Key": sandbox_service.token}
    ) as client:
        yield client


@pytest.fixture(scope="module")
def sbx(api):
    """A sandbox created through the published API, with a custom id; deleted after the module."""
    created = api.post(
        "/sandboxes",
        json={
            "image": "python:3.11-slim",
            "sandbox_id": "pub-contract",
            "cpu": "500m",
            "memory": "256Mi",
            "timeout": 120,
        },
    )
    assert created.status_code == 200, created.text
    body = created.json()
    assert body == {
        "sandbox_id": "pub-contract",
        "namespace": "local",
        "image": "python:3.11-slim",
        "block_network": True,
        "cpu": "500m",
        "memory": "256Mi",
        "timeout": 120,
        "status": "pending",
    }
    ready = api.get("/sandboxes/pub-contract/wait", params={"timeout": 60})
    assert ready.status_code == 200 and ready.json()["ready"] is True and ready.json()["status"] == "ready"
    yield "pub-contract"
    gone = api.delete("/sandboxes/pub-contract")
    assert gone.status_code == 200 and gone.json() == {"status": "deleted", "sandbox_id": "pub-contract"}
    assert api.get("/sandboxes/pub-contract").status_code == 404


def test_banner_and_health_need_no_key(sandbox_service):
    base = sandbox_service.url + "/published"
    assert httpx.get(base + "/health").json() == {"status": "healthy"}
    assert httpx.get(base + "/").status_code == 200


@pytest.mark.parametrize(("method", "path"), REFERENCE_ROUTES)
def test_every_route_refuses_a_missing_key_401_and_a_wrong_key_403(sandbox_service, method, path):
    url = sandbox_service.url + "/published" + path
    missing = httpx.request(method, url, json={})
    assert missing.status_code == 401, missing.text
    assert "X-API-Key" in missing.json()["detail"]
    wrong = httpx.request(method, url, json={}, headers={"X-API-Key": "wrong"})
    assert wrong.status_code == 403, wrong.text
    # Our native bearer token does not open the published API: its key header is the credential.
    bearer = httpx.request(method, url, json={}, headers={"Authorization": f"Bearer {sandbox_service.token}"})
    assert bearer.status_code == 401


def test_sandbox_info_heartbeat_and_resources(api, sbx):
    info = api.get(f"/sandboxes/{sbx}").json()
    assert {
        "sandbox_id",
        "namespace",
        "image",
        "pod_name",
        "block_network",
        "cpu",
        "memory",
        "created_at",
        "ready",
        "status",
        "status_message",
    } <= set(info)
    assert info["sandbox_id"] == sbx and info["ready"] is True and isinstance(info["created_at"], float)
    assert api.post(f"/sandboxes/{sbx}/heartbeat").json() == {"status": "ok", "sandbox_id": sbx}
    assert api.post("/sandboxes/nope/heartbeat").status_code == 404
    assert api.get("/resources").json()["sandboxes"]["live"] >= 1


def test_exec_wait_returns_the_full_job_and_exit_code_decides_success(api, sbx):
    ok = api.post(
        f"/sandboxes/{sbx}/exec",
        json={"command": "echo Hello; echo err >&2", "wait": True, "timeout_seconds": 30, "env": {"K": "v"}},
    )
    job = ok.json()
    assert ok.status_code == 200
    assert {k: job[k] for k in ("sandbox_id", "command", "status", "stdout", "stderr", "exit_code", "error")} == {
        "sandbox_id": sbx,
        "command": "echo Hello; echo err >&2",
        "status": "succeeded",
        "stdout": "Hello\n",
        "stderr": "err\n",
        "exit_code": 0,
        "error": None,
    }
    assert job["created_at"] <= job["started_at"] <= job["completed_at"]
    bad = api.post(f"/sandboxes/{sbx}/exec", json={"command": ["sh", "-c", "exit 3"], "wait": True}).json()
    assert (bad["status"], bad["exit_code"], bad["outcome"]) == ("failed", 3, "command_failed")
    shell = api.post(
        f"/sandboxes/{sbx}/exec",
        json={"command": "echo $K-$0", "env": {"K": "v"}, "cwd": "/tmp", "login_shell": True, "wait": True},
    ).json()
    assert shell["stdout"] == "v-bash\n"


def test_job_life_cycle_queued_running_succeeded_and_408_on_wait(api, sbx):
    submitted = api.post(f"/sandboxes/{sbx}/exec", json={"command": "sleep 3; echo done"})
    assert submitted.status_code == 200
    body = submitted.json()
    assert body["status"] == "queued" and set(body) == {"job_id", "status"}
    job_id = body["job_id"]
    seen = []
    deadline = time.monotonic() + 10
    while "running" not in seen and time.monotonic() < deadline:
        seen.append(api.get(f"/jobs/{job_id}").json()["status"])
        time.sleep(0.05)
    assert seen[-1] == "running" and set(seen) <= {"queued", "running"}  # queued -> running, nothing else yet
    timed_out = api.get(f"/jobs/{job_id}/wait", params={"timeout": 0.1})
    assert timed_out.status_code == 408 and "detail" in timed_out.json()
    done = api.get(f"/jobs/{job_id}/wait", params={"timeout": 30}).json()
    assert (done["status"], done["stdout"], done["job_id"]) == ("succeeded", "done\n", job_id)
    assert api.get(f"/jobs/{job_id}").json()["completed_at"] == done["completed_at"]
    assert api.get("/jobs/job-nope").status_code == 404
    assert api.get("/jobs/job-nope/wait").status_code == 404


def test_exec_timeout_is_a_failed_job_with_an_error(api, sbx):
    job = api.post(f"/sandboxes/{sbx}/exec", json={"command": "sleep 5", "timeout_seconds": 1, "wait": True}).json()
    assert job["status"] == "failed" and job["outcome"] == "command_timeout" and job["error"]


def test_files_upload_download_list_with_base64_bodies(api, sbx):
    payload = bytes(range(256)) * 4
    up = api.post(
        f"/sandboxes/{sbx}/files",
        json={"path": "/workspace/pkg/data.bin", "content": base64.b64encode(payload).decode()},
    )
    assert up.json() == {"success": True, "path": "/workspace/pkg/data.bin", "size": 1024}
    down = api.get(f"/sandboxes/{sbx}/files", params={"path": "/workspace/pkg/data.bin"}).json()
    assert base64.b64decode(down["content"]) == payload and down["size"] == 1024
    assert down["path"] == "/workspace/pkg/data.bin"
    listing = api.get(f"/sandboxes/{sbx}/files/list").json()
    assert listing["path"] == "/workspace"
    pkg = {f["name"]: f for f in listing["files"]}["pkg"]
    assert pkg["type"] == "directory" and isinstance(pkg["size"], int) and "T" in pkg["modified"]
    inner = api.get(f"/sandboxes/{sbx}/files/list", params={"path": "/workspace/pkg"}).json()["files"]
    assert inner == [{"name": "data.bin", "type": "file", "size": 1024, "modified": inner[0]["modified"]}]
    assert api.get(f"/sandboxes/{sbx}/files", params={"path": "/workspace/none"}).status_code == 404
    assert api.post(f"/sandboxes/{sbx}/files", json={"path": "x", "content": "!!"}).status_code == 400


def test_files_reach_any_path_in_the_sandbox_root_and_nothing_beyond(api, sbx):
    """As in the reference, file routes take any path inside the sandbox (its SDK lists `/` by default);
    the sandbox's root is still the limit: no `..`, no magic links, the host's directories read-only."""
    listing = api.get(f"/sandboxes/{sbx}/files/list", params={"path": "/"})
    assert listing.status_code == 200, listing.text
    assert {"etc", "workspace", "tmp"} <= {f["name"] for f in listing.json()["files"]}
    passwd = api.get(f"/sandboxes/{sbx}/files", params={"path": "/etc/passwd"}).json()
    assert b"root:" in base64.b64decode(passwd["content"])
    up = api.post(f"/sandboxes/{sbx}/files", json={"path": "/tmp/pub/note.txt", "content": "eA=="})
    assert up.status_code == 200, up.text
    seen = api.post(f"/sandboxes/{sbx}/exec", json={"command": "cat /tmp/pub/note.txt", "wait": True}).json()
    assert seen["stdout"] == "x"  # the file the command sees is the one written
    refused = api.get(f"/sandboxes/{sbx}/files", params={"path": "/workspace/../etc/passwd"})
    assert refused.status_code == 400 and refused.json()["code"] == "path_outside_sandbox"
    for magic in ("/proc/1/root/etc/passwd", "/proc/self/cwd/x"):  # magic links could lead out: refused
        assert api.get(f"/sandboxes/{sbx}/files", params={"path": magic}).status_code in (400, 404), magic
    read_only = api.post(f"/sandboxes/{sbx}/files", json={"path": "/usr/bin/evil", "content": "eA=="})
    assert read_only.status_code >= 400  # the host's /usr is bound read-only into the sandbox
    # (The native API keeps its own rule, the workspace only: tests/sandbox_service/test_api_files.py.)


def test_file_routes_show_nothing_of_the_agents_own_process(api, sbx):
    """With scope root the agent (PID 1) listed its own /proc/1/fd and /proc/1/map_files (its memory layout)
    and read its /proc/1/maps: a command cannot (PID 1 is non-dumpable), but the file routes ran as the agent.
    Nothing on /proc is served by file routes now, whichever path leads there."""
    threads = api.post(f"/sandboxes/{sbx}/exec", json={"command": "ls /proc/1/task", "wait": True}).json()
    tid = max(threads["stdout"].split(), key=int)  # an agent thread: /proc/<tid> is the agent's too
    for path in (
        "/proc/1/fd",
        "/proc/1/map_files",
        "/proc/self/fd",
        "/proc/1/task/1/fd",
        f"/proc/{tid}/fd",
        "/proc/thread-self/fd",
        "/dev/fd",
        "/proc/1",
        "/proc",
    ):
        listed = api.get(f"/sandboxes/{sbx}/files/list", params={"path": path})
        assert listed.status_code == 400, (path, listed.text[:300])
    for path in ("/proc/1/maps", "/proc/self/maps", "/proc/1/environ", "/proc/1/status", f"/proc/{tid}/maps"):
        read = api.get(f"/sandboxes/{sbx}/files", params={"path": path})
        assert read.status_code == 400, (path, read.text[:300])
    for path in ("/proc/1/oom_score_adj", "/proc/1/comm"):
        written = api.post(f"/sandboxes/{sbx}/files", json={"path": path, "content": "MTAwMA=="})
        assert written.status_code == 400, (path, written.text[:300])
    seen = api.post(f"/sandboxes/{sbx}/exec", json={"command": "cat /proc/self/status | head -1", "wait": True})
    assert seen.json()["stdout"].startswith("Name:")  # commands still read /proc as the kernel lets them


def test_apply_patch(api, sbx):
    api.post(f"/sandboxes/{sbx}/files", json={"path": "file.txt", "content": base64.b64encode(b"line1\n").decode()})
    patch = "--- a/file.txt\n+++ b/file.txt\n@@ -1 +1,2 @@\n line1\n+line2\n"
    applied = api.post(f"/sandboxes/{sbx}/apply_patch", json={"patch": patch, "timeout_seconds": 30}).json()
    assert applied["success"] is True and applied["exit_code"] == 0
    content = api.get(f"/sandboxes/{sbx}/files", params={"path": "/workspace/file.txt"}).json()["content"]
    assert base64.b64decode(content) == b"line1\nline2\n"
    again = api.post(f"/sandboxes/{sbx}/apply_patch", json={"patch": patch}).json()
    assert again["success"] is False and again["exit_code"] != 0


def test_unknown_ids_404_bad_bodies_422_and_refused_options_400(api):
    assert api.get("/sandboxes/nope").status_code == 404
    assert api.get("/sandboxes/nope/wait").status_code == 404
    assert api.post("/sandboxes/nope/exec", json={"command": "true"}).status_code == 404
    assert api.post("/sandboxes", json={"block_network": True}).status_code == 422  # image is required
    refused = api.post("/sandboxes", json={"image": "x", "block_network": False})
    assert refused.status_code == 400 and "published_unrestricted_egress" in refused.json()["detail"]
    assert api.post("/sandboxes", json={"image": "x", "memory": "lots"}).status_code == 400
    assert api.post("/sandboxes", json={"image": "x", "sandbox_id": "Bad_Id"}).status_code == 422


def test_sandbox_wait_times_out_with_408_and_not_ready_is_400(api):
    created = api.post("/sandboxes", json={"image": "python:3.11-slim", "sandbox_id": "pub-slow"}).json()
    try:
        # Asked at once, the sandbox is still pending (create -> ready takes tens of ms): a zero wait
        # answers 408, and a file upload 400 (not ready), as in the reference.
        waited = api.get("/sandboxes/pub-slow/wait", params={"timeout": 0})
        assert waited.status_code == 408 and "detail" in waited.json()
        early = api.post("/sandboxes/pub-slow/files", json={"path": "a", "content": "eA=="})
        assert early.status_code == 400 and early.json()["code"] == "sandbox_not_ready"
        assert api.post("/sandboxes", json={"image": "x", "sandbox_id": "pub-slow"}).status_code == 400
    finally:
        assert api.delete(f"/sandboxes/{created['sandbox_id']}").status_code == 200
    again = api.post("/sandboxes", json={"image": "x", "sandbox_id": "pub-slow"})  # the id is free again
    assert again.status_code == 200
    assert api.delete("/sandboxes/pub-slow").status_code == 200


def _pty(sandbox_service, sbx: str, **kw):
    url = sandbox_service.url.replace("http://", "ws://") + f"/published/sandboxes/{sbx}/exec/pty"
    return connect(url + f"?api_key={sandbox_service.token}", **kw)


def _frames(ws, until: str, timeout: float = 15.0) -> list[dict]:
    out, deadline = [], time.monotonic() + timeout
    while True:
        frame = json.loads(ws.recv(timeout=max(0.05, deadline - time.monotonic())))
        out.append(frame)
        if frame["type"] == until:
            return out


def test_pty_init_ready_stdin_stdout_resize_exit_code(sandbox_service, sbx):
    with _pty(sandbox_service, sbx) as ws:
        ws.send(
            json.dumps(
                {
                    "type": "init",
                    "cmd": ["sh"],
                    "env": {"Q": "pty"},
                    "cwd": "/workspace",
                    "rows": 24,
                    "cols": 80,
                    "login_shell": False,
                }
            )
        )
        ready = _frames(ws, "ready")[-1]
        assert isinstance(ready["pid"], int)
        ws.send(json.dumps({"type": "resize", "rows": 33, "cols": 101}))
        for line in (b"echo $Q-$((6*7)); stty size\n", b"exit 7\n"):
            ws.send(json.dumps({"type": "stdin", "data": base64.b64encode(line).decode()}))
        frames = _frames(ws, "exit")
        text = b"".join(base64.b64decode(f["data"]) for f in frames if f["type"] == "stdout").decode()
        assert "pty-42" in text and "33 101" in text
        assert frames[-1] == {"type": "exit", "code": 7}


def test_pty_signal_kills_the_process_and_reports_a_negative_code(sandbox_service, sbx):
    with _pty(sandbox_service, sbx) as ws:
        ws.send(json.dumps({"type": "init", "cmd": ["sleep", "60"]}))
        _frames(ws, "ready")
        ws.send(json.dumps({"type": "signal", "sig": "KILL"}))
        assert _frames(ws, "exit", timeout=10)[-1] == {"type": "exit", "code": -9}


def test_pty_client_leaving_kills_the_command_and_removes_the_wrapper_files(api, sandbox_service, sbx):
    with _pty(sandbox_service, sbx) as ws:
        ws.send(json.dumps({"type": "init", "cmd": ["sleep", "4242"]}))
        _frames(ws, "ready")
    check = "ls /tmp/.orchard-pty-* 2>/dev/null; ps -eo args | grep -c '^sleep 4242' || true"
    deadline = time.monotonic() + 15
    while (out := api.post(f"/sandboxes/{sbx}/exec", json={"command": check, "wait": True}).json()["stdout"]) != "0\n":
        assert time.monotonic() < deadline, f"left behind after the client left: {out!r}"
        time.sleep(0.2)


def test_pty_auth_by_subprotocol_and_refusals(sandbox_service, sbx):
    base = sandbox_service.url.replace("http://", "ws://") + "/published/sandboxes"
    with connect(f"{base}/{sbx}/exec/pty", subprotocols=[f"api_key.{sandbox_service.token}"]) as ws:
        ws.send(json.dumps({"type": "init", "cmd": ["true"]}))
        assert _frames(ws, "exit")[-1]["code"] == 0
    for url, code in (
        (f"{base}/{sbx}/exec/pty?api_key=wrong", 4401),
        (f"{base}/nope/exec/pty?api_key={sandbox_service.token}", 4404),
    ):
        with connect(url) as ws:
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
            assert ws.close_code == code


def test_overload_is_503_with_retry_after():
    from sandbox_service.config import ServiceConfig
    from sandbox_service.embedded import EmbeddedService

    with EmbeddedService(ServiceConfig(token="unused", max_sandboxes=1, retry_after_seconds=2)) as service:
        with httpx.Client(base_url=service.url + "/published", timeout=60, headers={"X-API-Key": service.token}) as api:
            first = api.post("/sandboxes", json={"image": "python:3.11-slim"})
            assert first.status_code == 200
            try:
                full = api.post("/sandboxes", json={"image": "python:3.11-slim"})
                assert full.status_code == 503 and full.headers["Retry-After"] == "2"
                assert full.json()["code"] == "capacity_exceeded" and "retry" in full.json()["detail"]
            finally:
                assert api.delete(f"/sandboxes/{first.json()['sandbox_id']}").status_code == 200


def test_an_unisolated_service_keeps_published_file_routes_in_the_workspace():
    """Unisolated, a sandbox's root is the host's: published file paths stay in the workspace there, and a
    refusal says why."""
    from sandbox_service.config import ServiceConfig
    from sandbox_service.embedded import EmbeddedService

    with (
        EmbeddedService(ServiceConfig(token="unused", unisolated=True)) as service,
        service.client() as client,
        client.create() as sandbox,
        httpx.Client(base_url=service.url + "/published", timeout=60, headers={"X-API-Key": service.token}) as api,
    ):
        # (created natively: unisolated sandboxes run on the host root, so the published create's image is refused)
        refused = api.get(f"/sandboxes/{sandbox.id}/files", params={"path": "/etc/passwd"})
        assert refused.status_code == 400 and "unisolated" in refused.json()["detail"]
        assert refused.json()["code"] == "path_outside_sandbox"
        sandbox.write_file("/workspace/ok.txt", "in the workspace")
        inside = api.get(f"/sandboxes/{sandbox.id}/files", params={"path": "ok.txt"}).json()
        assert base64.b64decode(inside["content"]) == b"in the workspace"


def test_an_image_is_honoured_by_name(api, sandbox_service):
    """A name the local backend has built (a root under its image directory) is the sandbox's root; the
    name is echoed as given; a host path is refused."""
    from tests.sandbox_service.test_local_backend import _tiny_image

    name = f"tiny-{uuid.uuid4().hex[:6]}"
    root = _tiny_image(sandbox_service.state_dir / "local" / "images" / name)
    try:
        created = api.post("/sandboxes", json={"image": name, "sandbox_id": f"pub-{name}"})
        assert created.status_code == 200 and created.json()["image"] == name, created.text
        sid = created.json()["sandbox_id"]
        assert api.get(f"/sandboxes/{sid}/wait", params={"timeout": 60}).status_code == 200
        ran = api.post(
            f"/sandboxes/{sid}/exec",
            json={
                "command": ["/bin/sh", "-c", "[ -e /usr/bin/env ] && echo default || echo tiny"],
                "wait": True,
                "timeout_seconds": 30,
            },
        ).json()
        assert (ran["exit_code"], ran["stdout"]) == (0, "tiny\n"), ran  # the built root, not the default one
        api.delete(f"/sandboxes/{sid}")
        assert api.post("/sandboxes", json={"image": str(root)}).status_code == 400
    finally:
        shutil.rmtree(root)
