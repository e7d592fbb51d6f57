"""A keep-alive HTTP/1.1 lane for the client's hot path (exec): a socket per request in flight and
httptools (llhttp, the parser uvicorn runs on the service side) for the response.

Why not httpx here: an exec of `true` cost the calling thread 0.85-1.08 ms of CPU through httpx (request and
response models, httpcore's pool, h11's pure-Python event machine) and 0.44-0.55 ms through
`http.client`, whose header parsing goes through the `email` package; this lane takes less still
(docs/performance-exec.md has the figures and the command). On a rollout that runs thousands of short
commands that is a third of an exec's latency. Everything else the client sends still goes through httpx,
and so does exec wherever this lane does not apply (`KeepAliveLane.for_client`): a custom transport, an
`https` URL (TLS settings stay httpx's), or proxy variables in the environment.

Failures are raised as the httpx exceptions the client already handles (`ConnectError`,
`RemoteProtocolError`, `ReadTimeout`, ...), so its retry policy is the same on both paths.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from typing import Mapping

import httptools
import httpx

# The variables httpx reads (trust_env) to route requests through a proxy.
_PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_RECV_BYTES = 65536


class KeepAliveLane:
    """Idle keep-alive connections to one `http://host:port`, shared by threads (one request per connection
    at a time, as HTTP/1.1 without pipelining requires)."""

    def __init__(self, host: str, port: int, headers: Mapping[str, str], max_idle: int = 16):
        self.host, self.port = host, port
        self._fixed_head = _header_lines({"Host": f"{host}:{port}", **headers})
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._max_idle = max_idle
        self._closed = False

    @classmethod
    def for_client(cls, base_url: str, headers: Mapping[str, str], transport: object | None) -> KeepAliveLane | None:
        """The lane for a client's base URL, or None where httpx must carry every request."""
        if transport is not None or any(os.environ.get(name) for name in _PROXY_VARIABLES):
            return None
        url = httpx.URL(base_url)
        if url.scheme != "http" or not url.host:
            return None
        host = f"[{url.host}]" if ":" in url.host else url.host
        try:
            return cls(host, url.port or 80, headers)
        except ValueError:  # a header httpx must refuse, with its own error, at the first request
            return None

    def post(self, url: httpx.URL, body: bytes, headers: Mapping[str, str], timeout: float) -> httpx.Response:
        """POST `body` to `url` (on this lane's host); the response as an httpx.Response (any status)."""
        head = (
            b"POST "
            + url.raw_path
            + b" HTTP/1.1\r\n"
            + self._fixed_head
            + _header_lines(headers)
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        sock, reused = self._take(url, timeout)
        try:
            sock.settimeout(timeout)
            try:
                sock.sendall(head + body)  # one segment where it fits: no second wakeup for the body
            except OSError as err:
                raise _write_failure(err, url, reused) from err
            response = _read_response(sock, url, timeout)
        except BaseException:
            sock.close()
            raise
        if response.keep_alive:
            self._give_back(sock)
        else:
            sock.close()
        return httpx.Response(
            response.status,
            headers=response.headers,
            content=b"".join(response.body),
            request=httpx.Request("POST", url),
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def _take(self, url: httpx.URL, timeout: float) -> tuple[socket.socket, bool]:
        """An idle connection the server has not closed, or a new one (connected here, so that a refused
        connection is a ConnectError, safe to retry: nothing was sent)."""
        while True:
            with self._lock:
                sock = self._idle.pop() if self._idle else None
            if sock is None:
                break
            if _still_open(sock):
                return sock, True
            sock.close()
        try:
            sock = socket.create_connection((url.host, self.port), timeout=timeout)
        except (socket.timeout, TimeoutError) as err:
            raise httpx.ConnectTimeout(
                f"connecting to {self.host}:{self.port} took over {timeout:g} s", request=httpx.Request("POST", url)
            ) from err
        except OSError as err:
            raise httpx.ConnectError(str(err), request=httpx.Request("POST", url)) from err
        # The response may come in two segments: never let Nagle hold either side's last one for a delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, False

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(sock)
                return
        sock.close()


class _Response:
    """httptools' callbacks, collecting one response."""

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.complete = False
        self.status = 0
        self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        # Read here: once the message is complete the parser resets its flags (it would say False).
        assert self.parser is not None  # set before the parser is fed, and the parser is what calls this
        self.keep_alive = self.parser.should_keep_alive()


def _read_response(sock: socket.socket, url: httpx.URL, timeout: float) -> _Response:
    response = _Response()
    parser = response.parser = httptools.HttpResponseParser(response)
    received = False
    while not response.complete:
        try:
            data = sock.recv(_RECV_BYTES)
        except (socket.timeout, TimeoutError) as err:
            raise httpx.ReadTimeout(f"no response within {timeout:g} s", request=httpx.Request("POST", url)) from err
        except OSError as err:
            if not received and isinstance(err, ConnectionResetError):
                raise _disconnected(url) from err
            raise httpx.ReadError(str(err), request=httpx.Request("POST", url)) from err
        if not data:
            if not received:
                raise _disconnected(url)
            raise httpx.RemoteProtocolError(
                "the service closed the connection in the middle of a response", request=httpx.Request("POST", url)
            )
        received = True
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as err:
            raise httpx.RemoteProtocolError(f"malformed response: {err}", request=httpx.Request("POST", url)) from err
    response.status = parser.get_status_code()
    return response


def _disconnected(url: httpx.URL) -> httpx.RemoteProtocolError:
    # As httpcore words it, so that logs read the same on both paths.
    return httpx.RemoteProtocolError(
        "Server disconnected without sending a response.", request=httpx.Request("POST", url)
    )


def _header_lines(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if any(c in f"{name}{value}" for c in "\r\n\0"):
            raise ValueError(f"HTTP header {name!r} holds a line break or NUL")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    return b"".join(lines)


def _still_open(sock: socket.socket) -> bool:
    """An idle keep-alive socket is readable only when the server closed it (EOF) or broke the protocol."""
    poller = select.poll()  # not select(): file descriptors above 1023 are common in a busy trainer
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


def _write_failure(err: OSError, url: httpx.URL, reused: bool) -> httpx.HTTPError:
    request = httpx.Request("POST", url)
    if isinstance(err, (socket.timeout, TimeoutError)):
        return httpx.WriteTimeout(str(err) or "timed out sending the request", request=request)
    if reused and isinstance(err, (BrokenPipeError, ConnectionResetError)):
        # The server closed the idle connection as we sent.
        return _disconnected(url)
    return httpx.WriteError(str(err), request=request)
