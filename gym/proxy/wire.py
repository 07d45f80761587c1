"""JSON over HTTP, as every proxy route reads and writes it: bodies read up to a size limit
(413 past it, the connection kept), decoded into a JSON object of bounded nesting (400
otherwise), answers encoded with orjson."""
from __future__ import annotations

import json
from typing import Any

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
