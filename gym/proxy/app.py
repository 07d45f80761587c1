"""HTTP surface of the proxy: per-session dialect routes, auth, and the admin API.

Session routes live under `/s/{session}`: OpenAI clients use `/s/{session}/v1` as base
URL, Anthropic and Gemini clients `/s/{session}` (Gemini's model and method are in the path,
`/v1beta/models/{model}:generateContent`, or `/v1/...`). A session's secret key comes as
`Authorization: Bearer`, `x-api-key`, `x-goog-api-key` or `?key=`; wrong key -> 401,
unknown or closed session -> 404.
The admin API (`/admin/...`, `admin.py`) answers loopback TCP clients only (or any client,
with `admin_clients = "any"`), always with its own bearer token.
Every refusal is a 4xx in the dialect's own error shape, and leaves the session usable,
except the staleness abort (403, `ProxyCore.check_staleness`), which ends the session.

Bad input is never a 5xx, nor a 200 that then reports an error: each dialect's parser types
every field it reads (`fields`), and a streamed call sends its 200 only after its prompt is
rendered and the engine had a moment to refuse it (`stream_grace_s`). Nothing a handler
raises escapes to the server (that would reset the keep-alive connection): an unexpected
exception is a 5xx in the dialect's shape. Parsing of large bodies, rendering and trajectory
export run in worker threads (`offload`), so one huge request does not stall the other sessions.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any, Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from harnessrl.registry import DIALECTS as DIALECT_NAMES
from . import anthropic_messages, gemini, openai_chat, openai_responses
from harnessrl.gym.backends.engine_client import EngineError
from .admin import admin_routes
from .call import Prepared
from .core import ProxyCore
from .dialects import dialect_module
from .errors import ProxyError
from .offload import HEAVY_BYTES, OFF_LOOP_BYTES, offload
from .wire import SSEResponse, decode, json_response, read_body

try:
    from jinja2 import TemplateError
except ImportError:  # pragma: no cover - transformers' chat templates need jinja2
    class TemplateError(Exception):  # type: ignore[no-redef]
        pass

log = logging.getLogger(__name__)

#: The dialect modules by name (declared once, in `harnessrl.registry.DIALECTS`).
DIALECTS = {name: dialect_module(name) for name in DIALECT_NAMES}


def _error(dialect, e: ProxyError) -> Response:
    return json_response(dialect.error_body(e.status, e.message, e.kind, e.param), e.status, e.headers)


async def _parsed(parse, raw: bytes):
    """`parse(decode(raw))`, in a worker thread when the body is large; its size noted."""
    if len(raw) > OFF_LOOP_BYTES:
        req = await offload(lambda: parse(decode(raw)), heavy=len(raw) > HEAVY_BYTES)
    else:
        req = parse(decode(raw))
    req.body_bytes = len(raw)
    return req


def disconnect_probe(request: Request):
    """An async check whether the client of `request` has gone. Under uvicorn, its
    connection's own flag (set when the connection is lost, read in a few ns); elsewhere
    Starlette's `is_disconnected` (a receive polled under an anyio cancel scope, ~0.1 ms of
    CPU: a fifth of a call's budget)."""
    cycle = getattr(request.receive, "__self__", None)
    if getattr(cycle, "disconnected", None) is False:

        async def gone() -> bool:
            return cycle.disconnected
        return gone
    return request.is_disconnected


def as_proxy_error(e: BaseException, engine_urls: Sequence[str] = ()) -> ProxyError:
    """What the harness is told about an exception raised while serving its call, never
    with an engine's address in it (the agent has no business calling the engine itself)."""
    pe = _as_proxy_error(e)
    message = pe.message
    for url in engine_urls:
        url = url.rstrip("/")
        if url:
            message = message.replace(url, "<engine>")
    if message != pe.message:
        pe = ProxyError(pe.status, message, kind=pe.kind, param=pe.param, headers=pe.headers)
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


class ProxyApp:
    """The proxy's HTTP handlers over one `ProxyCore`: one method per kind of route."""

    def __init__(self, core: ProxyCore):
        self.core, self.config = core, core.config

    def session_for(self, request: Request):
        sid = request.path_params["sid"]
        s = self.core.sessions.get(sid)
        if s is None or s.closed:
            raise ProxyError(404, f"unknown or closed session {sid!r}", kind="not_found_error")
        auth = request.headers.get("authorization", "")
        key = (auth[7:] if auth[:7].lower() == "bearer " else request.headers.get("x-api-key")
               or request.headers.get("x-goog-api-key") or request.query_params.get("key", ""))
        if not key or not secrets.compare_digest(key.encode(), s.key.encode()):
            raise ProxyError(401, "invalid API key for this session", kind="authentication_error")
        return s

    def dialect_route(self, name: str, parser=None):
        """The handler of one dialect; `parser(request)`, when given, is the body parser of
        this request (Gemini reads the model and streaming from the URL)."""
        dialect = DIALECTS[name]

        async def handler(request: Request) -> Response:
            return await self.call(dialect, parser, request)
        return handler

    async def call(self, dialect, parser, request: Request) -> Response:
        """One model call of `dialect`: session, body, checks, admission, then the reply."""
        core, arrived = self.core, time.monotonic()
        try:
            s = self.session_for(request)
            parse = dialect.parse if parser is None else parser(request)
            req = await _parsed(parse, await read_body(request, self.config.max_body_bytes))
            core.check_model(req)
            core.check_budget(s)
            core.check_staleness(s)
            await core.admit()
            core.check_staleness(s)  # a weight update may have landed while it waited
            p = Prepared(s, req, arrived, disconnect_probe(request))
            if req.stream:
                return await self.stream(p, dialect)
            async for c in core.run(p):
                return json_response(dialect.response(req, c))
            raise RuntimeError("the call produced no completion")
        except Exception as e:  # never out to the server: that would reset the connection
            return self.fail(dialect, e)

    def fail(self, dialect, e: BaseException) -> Response:
        pe = as_proxy_error(e, self.config.engine_urls)
        self.core.counters["errors_4xx" if pe.status < 500 else "errors_5xx"] += 1
        return _error(dialect, pe)

    async def stream(self, p: Prepared, dialect) -> Response:
        """Render (and have the engine start) before the 200: until the stream's first event
        is out, every refusal is still an HTTP error in the dialect's shape."""
        cfg = self.config
        agen = self.core.run(p, dialect.Stream)
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
        return SSEResponse(self.sse(p, dialect, agen, head, nxt))

    async def sse(self, p: Prepared, dialect, agen, head: list[bytes], nxt):
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
            pe = as_proxy_error(e, self.config.engine_urls)
            self.core.counters["errors_4xx" if pe.status < 500 else "errors_5xx"] += 1
            yield dialect.Stream(p.req, "error", p.req.model, 0).error(pe.status, pe.message)
        finally:
            if nxt is not None and not nxt.done():
                nxt.cancel()
                with contextlib.suppress(BaseException):
                    await nxt
            await agen.aclose()

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's /v1/messages/count_tokens: the prompt a call would get, from scratch."""
        def count(body: dict) -> int:
            body.setdefault("max_tokens", 1)
            req = anthropic_messages.parse(body)
            return len(self.core.renderer.full_prompt(req.messages, req.tools))
        try:
            self.session_for(request)
            raw = await read_body(request, self.config.max_body_bytes) or b"{}"
            return json_response({"input_tokens": await offload(lambda: count(decode(raw)), heavy=len(raw) > HEAVY_BYTES)})
        except Exception as e:
            return self.fail(anthropic_messages, e)

    async def gemini_models(self, request: Request) -> Response:
        """`models/{model}:generateContent`, `:streamGenerateContent?alt=sse` and `:countTokens`."""
        try:
            self.session_for(request)
            model, method = gemini.split_target(request.path_params["target"])
            if method != "countTokens":
                return await self.gemini_generate(request)  # refuses a method it does not serve
            raw = await read_body(request, self.config.max_body_bytes) or b"{}"

            def count() -> int:
                req = gemini.parse(gemini.count_request(decode(raw)), model)
                return len(self.core.renderer.full_prompt(req.messages, req.tools))
            return json_response({"totalTokens": await offload(count, heavy=len(raw) > HEAVY_BYTES)})
        except Exception as e:
            return self.fail(gemini, e)

    async def gemini_generate(self, request: Request) -> Response:
        return await self.call(DIALECTS["gemini"], _gemini_parser, request)

    async def models(self, request: Request) -> Response:
        try:
            self.session_for(request)
        except ProxyError as e:
            return _error(openai_chat, e)
        cfg = self.config
        names = cfg.served_models or [cfg.model]
        if "anthropic-version" in request.headers:
            data = [{"type": "model", "id": n, "display_name": n, "created_at": "2026-01-01T00:00:00Z"} for n in names]
            return json_response({"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]})
        return json_response({"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "harnessrl"}
                                                 for n in names]})

    async def ok(self, request: Request) -> Response:
        return Response(b"", 200) if request.method == "HEAD" else json_response({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        await self.core.start()
        try:
            yield
        finally:
            await self.core.stop()


def _gemini_parser(request: Request):
    """Gemini's body parser for this request: the model and streaming come from the URL."""
    return gemini.request_parser(request.path_params["target"], request.query_params.get("alt"))


class SessionRoutes:
    """ASGI front of the proxy: a model call (`POST /s/{sid}/<dialect path>`) goes straight to
    its handler, found by splitting the path; everything else (admin, Gemini, models, health,
    lifespan, any other method) to the Starlette app behind. Starlette's middleware and
    route scan cost ~0.1 ms per call, a tenth of the proxy's budget, and the call handlers
    need none of it: they never raise (`ProxyApp.call` answers every exception itself)."""

    def __init__(self, calls: dict[str, Any], app: Starlette):
        self.calls, self.app = calls, app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith("/s/"):
            sid, _, rest = scope["path"][3:].partition("/")
            handler = self.calls.get(rest) if sid else None
            if handler is not None:
                scope["path_params"] = {"sid": sid}
                response = await handler(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


#: The session routes of each dialect: path under /s/{sid}/ -> dialect name.
CALL_PATHS = {"v1/chat/completions": "openai-chat", "v1/responses": "openai-responses", "v1/messages": "anthropic"}


def build_app(core: ProxyCore, admin_token: str) -> SessionRoutes:
    proxy = ProxyApp(core)
    ok, dialect_route, count_tokens, models, gemini_models = (
        proxy.ok, proxy.dialect_route, proxy.count_tokens, proxy.models, proxy.gemini_models)
    calls = {path: dialect_route(name) for path, name in CALL_PATHS.items()}
    routes = [
        Route("/", ok, methods=["GET", "HEAD"]),
        Route("/s/{sid}", ok, methods=["GET", "HEAD"]),
        Route("/s/{sid}/", ok, methods=["GET", "HEAD"]),
        *(Route(f"/s/{{sid}}/{path}", handler, methods=["POST"]) for path, handler in calls.items()),
        Route("/s/{sid}/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/s/{sid}/v1/models", models, methods=["GET"]),
        Route("/s/{sid}/v1beta/models/{target}", gemini_models, methods=["POST"]),
        Route("/s/{sid}/v1/models/{target}", gemini_models, methods=["POST"]),  # the SDKs' api_version="v1"
        *admin_routes(core, admin_token),
    ]
    return SessionRoutes(calls, Starlette(routes=routes, lifespan=proxy.lifespan))
