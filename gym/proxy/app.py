"""HTTP surface of the proxy: per-session dialect routes, auth, and the admin API.

Session routes live under `/s/{session}`: OpenAI clients use `/s/{session}/v1` as base
URL, Anthropic clients `/s/{session}`. A session's secret key comes as
`Authorization: Bearer` or `x-api-key`; wrong key -> 401, unknown or closed session -> 404.
The admin API (`/admin/...`) answers loopback TCP clients only (or any client, with
`admin_clients = "any"`), always with its own bearer token.
Every refusal is a 4xx in the dialect's own error shape, and leaves the session usable,
except the staleness abort (403, `ProxyCore.check_staleness`), which ends the session.
`POST /admin/policy_version {"version": V}` tells the proxy the trainer's current version.

Bad input is never a 5xx, nor a 200 that then reports an error: each dialect's parser types
every field it reads (`fields`), and a streamed call sends its 200 only after its prompt is
rendered and the engine had a moment to refuse it (`stream_grace_s`). Nothing a handler
raises escapes to the server (that would reset the keep-alive connection): an unexpected
exception is a 5xx in the dialect's shape. Parsing of large bodies, rendering and trajectory
export run in worker threads (`offload`), so one huge request does not stall the other sessions.
Admin bodies are small JSON objects (`admin_max_body_bytes`), their fields typed as well.
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import secrets
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from . import anthropic_messages, openai_chat, openai_responses
from . import fields as F
from ..engine_client import EngineError
from .core import Prepared, ProxyCore
from .errors import ProxyError
from .offload import HEAVY_BYTES, OFF_LOOP_BYTES, offload

try:
    from jinja2 import TemplateError
except ImportError:  # pragma: no cover - transformers' chat templates need jinja2
    class TemplateError(Exception):  # type: ignore[no-redef]
        pass

log = logging.getLogger(__name__)

META_INTS = ("max_calls", "max_tokens", "staleness_limit", "start_version")
"""Session meta keys the proxy or the scheduler read as counts: non-negative int64 or null."""

try:
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    _loads = orjson.loads
    _JSONError: tuple = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - orjson is a dependency, json is the fallback
    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    _loads = json.loads
    _JSONError = (ValueError,)

DIALECTS = {"openai_chat": openai_chat, "openai_responses": openai_responses,
            "anthropic_messages": anthropic_messages}


def _json(obj: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(_dumps(obj), status_code=status, media_type="application/json", headers=headers)


def _error(dialect, e: ProxyError) -> Response:
    return _json(dialect.error_body(e.status, e.message, e.kind, e.param), e.status, e.headers)


async def _read_body(request: Request, limit: int) -> bytes:
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


def _decode(raw: bytes) -> dict:
    try:
        body = _loads(raw)
    except _JSONError as e:
        raise ProxyError(400, f"request body is not valid JSON: {e}") from None
    if body.__class__ is not dict:
        raise ProxyError(400, f"request body must be a JSON object, got {F.kind(body)}")
    F.check_depth(body)
    return body


async def _parsed(parse, raw: bytes):
    """`parse(_decode(raw))`, in a worker thread when the body is large; its size noted."""
    if len(raw) > OFF_LOOP_BYTES:
        req = await offload(lambda: parse(_decode(raw)), heavy=len(raw) > HEAVY_BYTES)
    else:
        req = parse(_decode(raw))
    req.body_bytes = len(raw)
    return req


def as_proxy_error(e: BaseException, engine_url: str = "") -> ProxyError:
    """What the harness is told about an exception raised while serving its call, never
    with the engine's address in it (the agent has no business calling the engine itself)."""
    pe = _as_proxy_error(e)
    url = engine_url.rstrip("/")
    if url and url in pe.message:
        pe = ProxyError(pe.status, pe.message.replace(url, "<engine>"), kind=pe.kind, param=pe.param,
                        headers=pe.headers)
    return pe


def _as_proxy_error(e: BaseException) -> ProxyError:
    if isinstance(e, ProxyError):
        return e
    if isinstance(e, EngineError):
        if e.status_code == 400:  # e.g. the prompt outgrew the context: the harness must compact
            return ProxyError(400, f"the engine refused the prompt: {e}")
        return ProxyError(502, f"generation failed: {e}", kind="api_error")
    if isinstance(e, TemplateError):  # the model's own chat template refused this conversation
        return ProxyError(400, f"the chat template cannot render these messages: {e}", param="messages")
    # a bug or an unreadable engine reply: a 502 naming the cause (and a traceback in the log)
    log.error("proxy call failed", exc_info=e)
    return ProxyError(502, f"generation failed: {type(e).__name__}: {e}", kind="api_error")


def is_loopback(client) -> bool:
    """A TCP client on a loopback address (127/8, ::1, ::ffff:127.x). A unix-socket client
    (no address) is not: harnesses inside containers reach the proxy that way."""
    if client is None or not client.host:
        return False
    try:
        ip = ipaddress.ip_address(client.host.split("%", 1)[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def session_meta(v: Any) -> dict[str, Any]:
    """An admin-supplied session meta: an object of at most 64 short string keys whose count
    fields (`META_INTS`) are non-negative int64 (the budgets and staleness checks read them)."""
    if v is None:
        return {}
    if v.__class__ is not dict:
        raise ValueError(f"meta must be an object, got {F.kind(v)}")
    if len(v) > 64:
        raise ValueError(f"meta has {len(v)} keys; at most 64 are accepted")
    for k in v:
        if len(k) > 128:
            raise ValueError(f"meta key {k[:40]!r}... is longer than 128 characters")
    for k in META_INTS:
        x = v.get(k)
        if x is not None and (x.__class__ is not int or not 0 <= x < F.INT63):
            raise ValueError(f"meta.{k} must be null or an integer in [0, 2**63), got {x!r}")
    F.check_depth(v, "meta", limit=8)
    return v


def build_app(core: ProxyCore, admin_token: str) -> Starlette:
    cfg = core.config

    def session_for(request: Request):
        sid = request.path_params["sid"]
        s = core.sessions.get(sid)
        if s is None or s.closed:
            raise ProxyError(404, f"unknown or closed session {sid!r}", kind="not_found_error")
        auth = request.headers.get("authorization", "")
        key = auth[7:] if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        if not key or not secrets.compare_digest(key.encode(), s.key.encode()):
            raise ProxyError(401, "invalid API key for this session", kind="authentication_error")
        return s

    def dialect_route(name: str):
        dialect = DIALECTS[name]

        async def handler(request: Request) -> Response:
            arrived = time.monotonic()
            try:
                s = session_for(request)
                req = await _parsed(dialect.parse, await _read_body(request, cfg.max_body_bytes))
                core.check_model(req)
                core.check_budget(s)
                core.check_staleness(s)
                await core.admit()
                core.check_staleness(s)  # a weight update may have landed while it waited
                p = Prepared(s, req, arrived, request.is_disconnected)
                if req.stream:
                    return await _stream(p, dialect)
                async for c in core.run(p):
                    return _json(dialect.response(req, c))
                raise RuntimeError("the call produced no completion")
            except Exception as e:  # never out to the server: that would reset the connection
                return _fail(dialect, e)
        return handler

    def _fail(dialect, e: BaseException) -> Response:
        pe = as_proxy_error(e, cfg.engine_url)
        core.counters["errors_4xx" if pe.status < 500 else "errors_5xx"] += 1
        return _error(dialect, pe)

    async def _stream(p: Prepared, dialect) -> Response:
        """Render (and have the engine start) before the 200: until the stream's first event
        is out, every refusal is still an HTTP error in the dialect's shape."""
        agen = core.run(p, dialect.Stream)
        try:
            head = [await agen.__anext__()]  # the prompt is rendered: the stream's start event
        except BaseException:
            await agen.aclose()
            raise
        nxt = asyncio.ensure_future(agen.__anext__())
        await asyncio.wait({nxt}, timeout=min(cfg.stream_grace_s, cfg.keepalive_s))
        if nxt.done():
            try:
                head.append(nxt.result())
            except StopAsyncIteration:
                nxt = None
            except BaseException:
                await agen.aclose()
                raise
            else:
                nxt = None
        return StreamingResponse(_sse(p, dialect, agen, head, nxt), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def _sse(p: Prepared, dialect, agen, head: list[bytes], nxt):
        try:
            for chunk in head:
                yield chunk
            if nxt is not None:
                try:
                    yield await nxt
                except StopAsyncIteration:
                    return
                nxt = None
            async for chunk in agen:
                yield chunk
        except Exception as e:  # headers are out: report in the dialect's stream error event
            pe = as_proxy_error(e, cfg.engine_url)
            core.counters["errors_4xx" if pe.status < 500 else "errors_5xx"] += 1
            yield dialect.Stream(p.req, "error", p.req.model, 0).error(pe.status, pe.message)
        finally:
            if nxt is not None and not nxt.done():
                nxt.cancel()
                with contextlib.suppress(BaseException):
                    await nxt
            await agen.aclose()

    async def count_tokens(request: Request) -> Response:
        """Anthropic's /v1/messages/count_tokens: the prompt a call would get, from scratch."""
        def count(body: dict) -> int:
            body.setdefault("max_tokens", 1)
            req = anthropic_messages.parse(body)
            return len(core.renderer.full_prompt(req.messages, req.tools))
        try:
            session_for(request)
            raw = await _read_body(request, cfg.max_body_bytes) or b"{}"
            return _json({"input_tokens": await offload(lambda: count(_decode(raw)), heavy=len(raw) > HEAVY_BYTES)})
        except Exception as e:
            return _fail(anthropic_messages, e)

    async def models(request: Request) -> Response:
        try:
            session_for(request)
        except ProxyError as e:
            return _error(openai_chat, e)
        names = cfg.served_models or [cfg.model]
        if "anthropic-version" in request.headers:
            data = [{"type": "model", "id": n, "display_name": n, "created_at": "2026-01-01T00:00:00Z"} for n in names]
            return _json({"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]})
        return _json({"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "harnessrl"}
                                                 for n in names]})

    async def ok(request: Request) -> Response:
        return Response(b"", 200) if request.method == "HEAD" else _json({"status": "ok"})

    # -- admin ------------------------------------------------------------------------
    def admin(fn):
        async def handler(request: Request) -> Response:
            if cfg.admin_clients == "loopback" and not is_loopback(request.client):
                return _json({"error": {"message": "the admin API answers loopback clients only "
                                                   "(ProxyConfig.admin_clients)"}}, 403)
            auth = request.headers.get("authorization", "")
            if not secrets.compare_digest(auth.encode(), f"Bearer {admin_token}".encode()):
                return _json({"error": {"message": "invalid admin token"}}, 401)
            try:
                body: Any = {}
                if request.method == "POST":
                    raw = await _read_body(request, cfg.admin_max_body_bytes)
                    body = _decode(raw) if raw.strip() else {}
                out = await fn(request, body)
                return out if isinstance(out, Response) else _json(out)
            except ProxyError as e:
                return _json({"error": {"message": e.message, "param": e.param}}, e.status)
            except KeyError as e:
                return _json({"error": {"message": str(e.args[0]) if e.args else "not found"}}, 404)
            except (ValueError, TypeError) as e:
                return _json({"error": {"message": str(e)}}, 400)
            except Exception as e:  # a bug: a 500 naming it, never a reset connection
                log.error("admin call failed", exc_info=e)
                return _json({"error": {"message": f"{type(e).__name__}: {e}"}}, 500)
        return handler

    async def a_open(request, body):
        sid, key = core.open_session(session_meta(body.get("meta")))
        return {"session_id": sid, "key": key, "openai_base_url": f"/s/{sid}/v1", "anthropic_base_url": f"/s/{sid}"}

    async def a_close(request, body):
        core.close_session(request.path_params["sid"])
        return {"closed": True}

    async def a_reward(request, body):
        r = body.get("reward")
        if r is not None and (r.__class__ not in (int, float) or not math.isfinite(r)):
            raise ValueError(f"reward must be a finite number or null, got {r!r}")
        status = body.get("status", "ok")
        termination = body.get("termination") or ""
        if status.__class__ is not str or termination.__class__ is not str or len(status) > 64 \
                or len(termination) > 4096:
            raise ValueError("status and termination must be strings (at most 64 and 4096 characters)")
        core.set_reward(request.path_params["sid"], None if r is None else float(r), status, termination)
        return {"ok": True}

    async def a_traj(request, body):
        sid = request.path_params["sid"]
        # Built and encoded in a worker thread: a long session's export must not stall streams.
        body = await offload(lambda: _dumps(core.export_trajectory(sid)))
        return Response(body, media_type="application/json")

    async def a_pause(request, body):
        core.gate.pause()
        return {"paused": True}

    async def a_resume(request, body):
        core.gate.resume()
        return {"paused": False}

    async def a_version(request, body):
        v = body.get("version")
        if v.__class__ is not int or not 0 <= v < F.INT63:
            raise ValueError(f"version: {v!r} is not a policy version (an integer in [0, 2**63))")
        core.set_policy_version(v)
        return {"policy_version": core.policy_version}

    async def a_stats(request, body):
        return core.stats()

    routes = [
        Route("/", ok, methods=["GET", "HEAD"]),
        Route("/s/{sid}", ok, methods=["GET", "HEAD"]),
        Route("/s/{sid}/", ok, methods=["GET", "HEAD"]),
        Route("/s/{sid}/v1/chat/completions", dialect_route("openai_chat"), methods=["POST"]),
        Route("/s/{sid}/v1/responses", dialect_route("openai_responses"), methods=["POST"]),
        Route("/s/{sid}/v1/messages", dialect_route("anthropic_messages"), methods=["POST"]),
        Route("/s/{sid}/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/s/{sid}/v1/models", models, methods=["GET"]),
        Route("/admin/sessions", admin(a_open), methods=["POST"]),
        Route("/admin/sessions/{sid}/close", admin(a_close), methods=["POST"]),
        Route("/admin/sessions/{sid}/reward", admin(a_reward), methods=["POST"]),
        Route("/admin/sessions/{sid}/trajectory", admin(a_traj), methods=["GET"]),
        Route("/admin/pause", admin(a_pause), methods=["POST"]),
        Route("/admin/resume", admin(a_resume), methods=["POST"]),
        Route("/admin/stats", admin(a_stats), methods=["GET"]),
        Route("/admin/policy_version", admin(a_version), methods=["POST"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await core.start()
        try:
            yield
        finally:
            await core.stop()

    return Starlette(routes=routes, lifespan=lifespan)

