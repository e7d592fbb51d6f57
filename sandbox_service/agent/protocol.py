"""The agent's wire protocol: length-prefixed frames, each a JSON header plus raw payload bytes.

    frame   = u32 header_len | u32 payload_len | header (UTF-8 JSON object) | payload (bytes)

A request header always carries ``op`` and ``secret``; a response header carries ``ok`` and, when
``ok`` is false, ``code`` and ``message`` (codes are the `sandbox_service.errors` codes, so the client
re-raises the matching type). Payloads carry the bulky bytes (file contents, stdin, stdout+stderr,
archives, terminal I/O) so they are never base64-encoded. One connection carries one request at a
time; a PTY switches its connection into a stream of frames in both directions until it ends.

Stdlib only: this module is copied into every sandbox.
"""

from __future__ import annotations

import json
import struct

PROTOCOL_VERSION = 1
_HEAD = struct.Struct(">II")
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_PAYLOAD_BYTES = 2 * 1024 * 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not a frame (wrong length, bad JSON)."""


def encode(header: dict, payload: bytes = b"") -> bytes:
    return encode_head(header, len(payload)) + payload


def decode_lengths(prefix: bytes) -> tuple[int, int]:
    header_len, payload_len = _HEAD.unpack(prefix)
    if header_len > MAX_HEADER_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"frame too large: header {header_len} B, payload {payload_len} B")
    return header_len, payload_len


def decode_header(raw: bytes) -> dict:
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"frame header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ProtocolError("frame header is not a JSON object")
    return header


PREFIX_SIZE = _HEAD.size


def _recv_exact(sock, n: int) -> bytes:
    """Blocking read of exactly n bytes; b'' if the peer closed before the first byte."""
    if n == 0:
        return b""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if got == 0:
                return b""
            raise ProtocolError("connection closed in the middle of a frame")
        got += k
    return bytes(buf)


def recv_head(sock) -> tuple[dict, int] | None:
    """Read a frame's prefix and header (the payload stays on the socket); None on a clean close."""
    prefix = _recv_exact(sock, PREFIX_SIZE)
    if not prefix:
        return None
    if len(prefix) < PREFIX_SIZE:
        raise ProtocolError("short frame prefix")
    header_len, payload_len = decode_lengths(prefix)
    return decode_header(_recv_exact(sock, header_len)), payload_len


def recv_payload(sock, payload_len: int) -> bytes:
    payload = _recv_exact(sock, payload_len) if payload_len else b""
    if payload_len and len(payload) != payload_len:
        raise ProtocolError("connection closed in the middle of a payload")
    return payload


def recv_frame(sock) -> tuple[dict, bytes] | None:
    """Read one frame from a blocking socket; None on a clean close between frames."""
    head = recv_head(sock)
    if head is None:
        return None
    return head[0], recv_payload(sock, head[1])


class PayloadReader:
    """A large payload read from the socket as a file object (`read(n)`), never held whole in memory.
    `drain()` discards what the operation did not read, so the connection stays in step."""

    def __init__(self, sock, size: int):
        self.sock, self.left = sock, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        if n <= 0:
            return b""
        data = self.sock.recv(min(n, 1 << 20))
        if not data:
            raise ProtocolError("connection closed in the middle of a payload")
        self.left -= len(data)
        return data

    def drain(self) -> None:
        while self.left:
            self.read(1 << 20)


class FileBody:
    """A response payload sent from an open file: exactly `size` bytes from `f` (a binary file object),
    zero-padded if the file shrank meanwhile (the frame's length was already sent)."""

    def __init__(self, f, size: int):
        self.f, self.size = f, size

    def send(self, sock) -> None:
        left = self.size
        while left:
            chunk = self.f.read(min(left, 1 << 20)) or b"\0" * min(left, 1 << 20)
            sock.sendall(chunk)
            left -= len(chunk)

    def close(self) -> None:
        self.f.close()


def encode_head(header: dict, payload_len: int) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return _HEAD.pack(len(raw), payload_len) + raw


def send_frame(sock, header: dict, payload=b"") -> None:
    if isinstance(payload, FileBody):
        sock.sendall(encode_head(header, payload.size))
        payload.send(sock)
        return
    head = encode_head(header, len(payload))
    if len(payload) < 65536:
        sock.sendall(head + payload)  # one syscall for the common small frame
    else:
        sock.sendall(head)
        sock.sendall(payload)
