"""HTTP surface of the proxy: per-session dialect routes, auth, and the admin API.

Session routes live under `/s/{session}`: OpenAI clients use `/s/{session}/v1` as base
URL, Anthropic clients `/s/{session}`. A session's secret key comes as
`Authorization: Bearer` or `x-api-key`; wrong key -> 401, unknown or closed session -> 404.
The admin API (`/admin/...`) answers loopback TCP clients only (or any client, with
`admin_clients = "any"`), always with its own bearer token.
Every refusal is a 4xx in the dialect's own error shape, and leaves the session usable,
except the staleness abort (403, `ProxyCore.check_staleness`), which ends the session.
`POST /admin/policy_version {"version": V}` tells the proxy the trainer's current version.
"""
from __future__ import annotations

import contextlib
import json
import secrets
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from . import anthropic_messages, openai_chat, openai_responses
from ..engine_client import EngineError
from .core import Prepared, ProxyCore
from .errors import ProxyError

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
                raw = await _read_body(request, cfg.max_body_bytes)
                try:
                    body = _loads(raw)
                except _JSONError as e:
                    raise ProxyError(400, f"request body is not valid JSON: {e}") from None
                if not isinstance(body, dict):
                    raise ProxyError(400, "request body must be a JSON object")
                req = dialect.parse(body)
                core.check_model(req)
                core.check_budget(s)
                core.check_staleness(s)
                await core.admit()
                core.check_staleness(s)  # a weight update may have landed while it waited
            except ProxyError as e:
                core.counters["errors_4xx" if e.status < 500 else "errors_5xx"] += 1
                return _error(dialect, e)
            p = Prepared(s, req, arrived)
            if req.stream:
                return StreamingResponse(_sse(core, p, dialect), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            try:
                async for c in core.run(p):
                    return _json(dialect.response(req, c))
            except ProxyError as e:
                return _error(dialect, e)
            except EngineError as e:
                if e.status_code == 400:  # e.g. the prompt outgrew the context: the harness must compact
                    core.counters["errors_4xx"] += 1
                    return _error(dialect, ProxyError(400, f"the engine refused the prompt: {e}"))
                core.counters["errors_5xx"] += 1
                return _error(dialect, ProxyError(502, f"generation failed: {e}", kind="api_error"))
            except Exception as e:  # a bug or an unreadable engine reply: a 502 naming the cause
                core.counters["errors_5xx"] += 1
                return _error(dialect, ProxyError(502, f"generation failed: {type(e).__name__}: {e}",
                                                  kind="api_error"))
        return handler

    async def _sse(core, p, dialect):
        try:
            async for chunk in core.run(p, dialect.Stream):
                yield chunk
        except Exception as e:  # headers are out: report in the dialect's stream error event
            core.counters["errors_5xx"] += 1
            yield dialect.Stream(p.req, "error", p.req.model, 0).error(502, f"generation failed: {e}")

    async def count_tokens(request: Request) -> Response:
        """Anthropic's /v1/messages/count_tokens: the prompt a call would get, from scratch."""
        try:
            session_for(request)
            body = _loads(await _read_body(request, cfg.max_body_bytes) or b"{}")
            if not isinstance(body, dict):
                raise ProxyError(400, "request body must be a JSON object")
            body.setdefault("max_tokens", 1)
            req = anthropic_messages.parse(body)
        except ProxyError as e:
            return _error(anthropic_messages, e)
        except _JSONError as e:
            return _error(anthropic_messages, ProxyError(400, f"request body is not valid JSON: {e}"))
        return _json({"input_tokens": len(core.renderer.full_prompt(req.messages, req.tools))})

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
            client = request.client
            loopback = client is not None and client.host in ("127.0.0.1", "::1", "localhost")
            if cfg.admin_clients == "loopback" and not loopback:
                return _json({"error": {"message": "the admin API answers loopback clients only "
                                                   "(ProxyConfig.admin_clients)"}}, 403)
            auth = request.headers.get("authorization", "")
            if not secrets.compare_digest(auth.encode(), f"Bearer {admin_token}".encode()):
                return _json({"error": {"message": "invalid admin token"}}, 401)
            try:
                body = _loads(await request.body() or b"{}") if request.method == "POST" else {}
                return _json(await fn(request, body if isinstance(body, dict) else {}))
            except KeyError as e:
                return _json({"error": {"message": str(e.args[0]) if e.args else "not found"}}, 404)
            except (ValueError, TypeError) as e:
                return _json({"error": {"message": str(e)}}, 400)
        return handler

    async def a_open(request, body):
        sid, key = core.open_session(body.get("meta") or {})
        return {"session_id": sid, "key": key, "openai_base_url": f"/s/{sid}/v1", "anthropic_base_url": f"/s/{sid}"}

    async def a_close(request, body):
        core.close_session(request.path_params["sid"])
        return {"closed": True}

    async def a_reward(request, body):
        r = body.get("reward")
        core.set_reward(request.path_params["sid"], None if r is None else float(r), body.get("status", "ok"),
                        str(body.get("termination", "")))
        return {"ok": True}

    async def a_traj(request, body):
        sid = request.path_params["sid"]
        if sid not in core.sessions:
            raise KeyError(f"unknown session {sid!r}")
        return core.store.trajectory(sid).to_dict()

    async def a_pause(request, body):
        core.gate.pause()
        return {"paused": True}

    async def a_resume(request, body):
        core.gate.resume()
        return {"paused": False}

    async def a_version(request, body):
        core.set_policy_version(body.get("version"))
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

