"""Streaming file transfers between HTTP clients and sandbox agents, with memory bounded per transfer.

Uploads (`PUT …/files`, `PUT …/files/archive`) over `STREAM_MIN_BYTES` are relayed chunk by chunk from
the request to the agent (which writes them to disk as they come), so eight concurrent 100 MB uploads
cost the service a few MiB, not 800. A body without Content-Length (chunked) is first spooled to a
temporary file (in memory up to `SPOOL_MEMORY_BYTES`), since the agent protocol frames carry their
length up front. The request-size cap (`max_request_bytes`, 413) is enforced by the middleware on both.
Downloads (`GET …/files`, `GET …/files/archive`) are streamed from the agent to the client with their
length known up front; over `max_download_bytes` the agent refuses them (413).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator

from fastapi import Request
from starlette.responses import StreamingResponse

STREAM_MIN_BYTES = 1 << 20  # smaller bodies are read whole: one frame, the cheapest path
SPOOL_MEMORY_BYTES = 8 << 20
CHUNK = 1 << 20


def declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


async def spooled(request: Request) -> tuple[int, AsyncIterator[bytes]]:
    """A chunked body of unknown length: spooled, then (size, chunks read back from the spool)."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)
    size = 0
    try:
        async for chunk in request.stream():
            spool.write(chunk)
            size += len(chunk)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise

    async def chunks() -> AsyncIterator[bytes]:
        with spool:
            while chunk := spool.read(CHUNK):
                yield chunk

    return size, chunks()


def stream_response(size: int, chunks: AsyncIterator[bytes], media_type: str) -> StreamingResponse:
    return StreamingResponse(chunks, media_type=media_type, headers={"content-length": str(size)})
