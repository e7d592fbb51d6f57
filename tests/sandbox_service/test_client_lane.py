"""The blocking client's keep-alive lane for exec (sandbox_service/keepalive.py): the same answers and the same
errors as httpx, on the session's real service and on a scripted loopback server for the failure cases."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from sandbox_service.client import SandboxClient
from sandbox_service.errors import NotFoundError, SandboxNotReadyError, SandboxServiceError, ServiceUnavailableError
from sandbox_service.keepalive import KeepAliveLane
from sandbox_service.models import SandboxCreate

SCRIPT = "import sys; sys.stdout.write('o' * 300000); sys.stderr.write('e' * 7); sys.exit(3)"


def _exec_twice(client: SandboxClient, sb):
    """The same commands on the lane and, with the lane switched off, on httpx."""
    results = []
    for lane in (client._lane, None):
        saved, client._lane = client._lane, lane
        try:
            results.append(
                [
                    sb.exec(["python3", "-c", SCRIPT]),
                    sb.exec("echo hi; pwd", cwd="/tmp", env={"A": "1"}),
                    sb.exec(["cat"], stdin="piped"),
                ]
            )
        finally:
            client._lane = saved
    return results


def test_exec_on_the_lane_answers_as_httpx_does_and_reuses_one_connection(sandbox_client, sandbox, monkeypatch):
    lane = sandbox_client._lane
    assert lane is not None, "a plain http:// client without a proxy must get the lane"
    opened = []
    real_connect = socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: opened.append(a) or real_connect(*a, **k))
    on_lane, on_httpx = _exec_twice(sandbox_client, sandbox)
    big = on_lane[0]
    assert big.exit_code == 3 and len(big.stdout) == 300000 and big.stderr == "eeeeeee"  # a many-segment body
    assert [r.model_dump(exclude={"duration_seconds"}) for r in on_lane] == [
        r.model_dump(exclude={"duration_seconds"}) for r in on_httpx
    ]
    assert on_lane[1].stdout == "hi\n/tmp\n" and on_lane[2].stdout == "piped"
    for _ in range(20):
        sandbox.exec(["true"])
    assert len(opened) <= 1, f"the lane opened {len(opened)} connections for 23 sequential execs"


def test_errors_on_the_lane_are_the_services_typed_errors(sandbox_client, labels):
    sb = sandbox_client.create(SandboxCreate(labels=labels))
    sb.delete()
    gone = type(sb)(sandbox_client, sb.info.model_copy(update={"id": "sb-0000000000000000"}))
    raised = []
    for lane in (sandbox_client._lane, None):
        saved, sandbox_client._lane = sandbox_client._lane, lane
        try:
            for target in (sb, gone):
                with pytest.raises(SandboxServiceError) as err:
                    target.exec(["true"])
                raised.append((type(err.value), err.value.code, str(err.value)))
        finally:
            sandbox_client._lane = saved
    assert raised[:2] == raised[2:]
    assert raised[0][0] is SandboxNotReadyError and issubclass(raised[1][0], NotFoundError)


class ScriptedServer:
    """A loopback HTTP server whose connections each follow one step of a script: 'answer' (a keep-alive
    200 to every request), 'answer-once' (one 200, then close), 'close' (close without answering),
    'close-header' (200 with Connection: close), 'garbage', 'silent' (never answers)."""

    def __init__(self, *steps: str):
        self.steps = list(steps)
        self.accepted = 0
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            step = self.steps[min(self.accepted, len(self.steps) - 1)]
            self.accepted += 1
            threading.Thread(target=self._handle, args=(conn, step), daemon=True).start()

    def _handle(self, conn: socket.socket, step: str) -> None:
        with conn:
            while self._read_request(conn):
                if step == "close":
                    return
                if step == "silent":
                    conn.recv(1)  # until the client gives up
                    return
                if step == "garbage":
                    conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                    return
                close = step == "close-header"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                    + (b"connection: close\r\n" if close else b"")
                    + b"\r\n{}"
                )
                if step in ("answer-once", "close-header"):
                    return

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(
            [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0]
        )
        while len(body) < length:
            body += conn.recv(65536)
        self.requests.append(head + b"\r\n\r\n" + body)
        return True

    def lane(self) -> KeepAliveLane:
        return KeepAliveLane.for_client(f"http://127.0.0.1:{self.port}", {"Authorization": "Bearer t"}, None)

    def url(self) -> httpx.URL:
        return httpx.URL(f"http://127.0.0.1:{self.port}/v1/sandboxes/x/exec?q=1")

    def close(self) -> None:
        self.sock.close()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def scripted():
    servers = []

    def make(*steps):
        servers.append(ScriptedServer(*steps))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def _post(lane: KeepAliveLane, url: httpx.URL, timeout: float = 5.0) -> httpx.Response:
    return lane.post(url, b'{"a":1}', {"content-type": "application/json"}, timeout)


def test_the_request_is_one_well_formed_http_message(scripted):
    server = scripted("answer")
    response = _post(server.lane(), server.url())
    assert response.status_code == 200 and response.json() == {}
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/sandboxes/x/exec?q=1 HTTP/1.1"
    assert set(lines[1:]) == {
        f"Host: 127.0.0.1:{server.port}".encode(),
        b"Authorization: Bearer t",
        b"content-type: application/json",
        b"Content-Length: 7",
    }
    assert body == b'{"a":1}'


def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed(scripted):
    server = scripted("answer-once", "answer")
    lane = server.lane()
    assert _post(lane, server.url()).status_code == 200
    for _ in range(100):  # until the server's close reached the idle socket
        if lane._idle and not __import__("sandbox_service.keepalive", fromlist=["x"])._still_open(lane._idle[-1]):
            break
        threading.Event().wait(0.01)
    assert _post(lane, server.url()).status_code == 200
    assert _post(lane, server.url()).status_code == 200
    assert server.accepted == 2  # the second connection was kept alive for the third request


def test_a_connection_close_answer_is_not_pooled(scripted):
    server = scripted("close-header")
    lane = server.lane()
    _post(lane, server.url())
    assert lane._idle == []
    _post(lane, server.url())
    assert server.accepted == 2


@pytest.mark.parametrize(
    ("step", "error"),
    [("close", httpx.RemoteProtocolError), ("garbage", httpx.RemoteProtocolError), ("silent", httpx.ReadTimeout)],
)
def test_failures_are_raised_as_httpx_raises_them(scripted, step, error):
    server = scripted(step)
    with pytest.raises(error):
        _post(server.lane(), server.url(), timeout=0.5)


def test_a_refused_connection_is_a_connect_error_and_the_client_retries_it_as_unavailable():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    lane = KeepAliveLane.for_client(f"http://127.0.0.1:{port}", {}, None)
    with pytest.raises(httpx.ConnectError):
        _post(lane, httpx.URL(f"http://127.0.0.1:{port}/v1/sandboxes/x/exec"))
    with SandboxClient(f"http://127.0.0.1:{port}", "t") as client:
        assert client._lane is not None
        with pytest.raises(ServiceUnavailableError, match="unreachable"):
            client.request(
                "POST",
                httpx.URL(f"http://127.0.0.1:{port}/v1/sandboxes/x/exec"),
                content=b"{}",
                headers={"content-type": "application/json"},
                lane=True,
            )


def test_the_lane_applies_only_where_httpx_would_send_directly(monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert KeepAliveLane.for_client("http://127.0.0.1:1", {}, None) is not None
    assert KeepAliveLane.for_client("http://[::1]:8080", {}, None).host == "[::1]"
    assert KeepAliveLane.for_client("https://svc:443", {}, None) is None  # TLS settings stay httpx's
    assert KeepAliveLane.for_client("http://svc:1", {}, httpx.MockTransport(lambda r: None)) is None
    assert KeepAliveLane.for_client("http://svc:1", {"Authorization": "Bearer a\r\nX-Evil: 1"}, None) is None
    monkeypatch.setenv("http_proxy", "http://proxy:3128")
    assert KeepAliveLane.for_client("http://127.0.0.1:1", {}, None) is None
    assert SandboxClient("http://127.0.0.1:1", "t")._lane is None


def test_threads_sharing_one_client_each_get_a_connection_of_their_own(sandbox_client, sandbox, monkeypatch):
    errors, outputs, opened = [], [], []
    real_connect = socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: opened.append(a) or real_connect(*a, **k))

    def worker(i: int) -> None:
        try:
            for j in range(10):
                outputs.append(sandbox.exec(["echo", f"{i}-{j}"]).stdout)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(outputs) == sorted(f"{i}-{j}\n" for i in range(8) for j in range(10))
    assert len(opened) <= 8  # never more connections than threads in flight
    assert sandbox_client._lane._idle  # and they were kept for the next calls


def test_clients_share_one_tls_context_instead_of_loading_the_ca_bundle_each(monkeypatch):
    import sandbox_service.client as client_module

    built = []
    real = httpx.create_ssl_context
    monkeypatch.setattr(httpx, "create_ssl_context", lambda *a, **k: built.append(1) or real(*a, **k))
    client_module._tls_context.cache_clear()
    try:
        for _ in range(3):
            SandboxClient("http://127.0.0.1:1", "t").close()
            client_module.AsyncSandboxClient("https://svc:443", "t")
        assert len(built) == 1
    finally:
        client_module._tls_context.cache_clear()
