"""JSON over HTTP, as every proxy route reads and writes it: bodies read up to a size limit
(413 past it, the connection kept), decoded into a JSON object of bounded nesting (400
otherwise), answers encoded with orjson, streamed answers as server-sent events (`SSEResponse`)."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from . import fields as F
from .errors import ProxyError

try:
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    _loads = orjson.loads
    _JSONError: tuple = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - orjson is a dependency, json is the fallback
    def dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    _loads = json.loads
    _JSONError = (ValueError,)


def json_response(obj: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(obj), status_code=status, media_type="application/json", headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ProxyError(413, f"request body is {declared} bytes; the limit is {limit}", kind="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProxyError(413, f"request body exceeds the limit of {limit} bytes", kind="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def decode(raw: bytes) -> dict:
    """A request body as a JSON object nested at most `fields.MAX_DEPTH` deep, else a 400."""
    try:
        body = _loads(raw)
    except _JSONError as e:
        raise ProxyError(400, f"request body is not valid JSON: {e}") from None
    if body.__class__ is not dict:
        raise ProxyError(400, f"request body must be a JSON object, got {F.kind(body)}")
    F.check_depth(body)
    return body


class SSEResponse:
    """A 200 `text/event-stream` reply whose events come from `events` (an async generator,
    closed when the reply ends, however it ends).

    A client that hangs up mid-stream cancels the iteration at once (its `http.disconnect`,
    awaited by a small listener task, cancels the task serving the reply), so the generator
    sees the CancelledError where it waits (the proxy records the call undelivered and stops
    the engine request there) and the reply ends quietly, as Starlette's StreamingResponse
    does; without its anyio task group, cancel scopes and task names (~0.1 ms per reply)."""

    HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]

    def __init__(self, events: AsyncIterator[bytes]):
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        task, gone = asyncio.current_task(), []

        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.append(True)
            task.cancel()

        await send({"type": "http.response.start", "status": 200, "headers": self.HEADERS})
        listener = asyncio.ensure_future(listen())
        try:
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            listener.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            if hasattr(task, "uncancel"):
                task.uncancel()  # our own cancellation, for a client that left: the reply just ends
        finally:
            listener.cancel()
            await self.events.aclose()
