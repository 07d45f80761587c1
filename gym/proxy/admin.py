"""The admin API (`/admin/...`): sessions, rewards, live feedback, deletion, exports, pause/resume,
the policy version.

Contract: it answers loopback TCP clients only, decided on the parsed address (127/8, ::1,
::ffff:127.x; a unix-socket client, which harnesses inside containers use, is not one), or
any client with `admin_clients = "any"`; always with its own bearer token. Bodies are small
JSON objects (`admin_max_body_bytes`, 413 past it) and every value is checked before it is
stored: rewards finite numbers or null, policy versions integers in [0, 2**63), session
meta an object of short keys whose counts are such integers. Refusals are 4xx JSON errors;
nothing raised escapes to the server (that would reset the connection).
`POST /admin/policy_version {"version": V}` tells the proxy the trainer's current version;
`POST /admin/lora {"name": N}` and `POST /admin/engines {"urls": [...]}` do what a weight sync
asks of an in-process proxy (`ProxyServer.use_lora`, `use_engines`) for one in another process
(`gym.proxies`): `{"applied": false}` when its generation backend has no such choice.
"""
from __future__ import annotations

import ipaddress
import logging
import math
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import fields as F
from .core import ProxyCore
from .errors import ProxyError
from .offload import offload
from .wire import decode, dumps, json_response, read_body

log = logging.getLogger(__name__)

META_INTS = ("max_calls", "max_tokens", "staleness_limit", "start_version", "group_id")
"""Session meta keys the proxy or the scheduler read as counts: non-negative int64 or null."""


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
            raise ValueError(f"meta.{k} must be null or an integer in [0, 2**63), got {repr(x)[:60]}")
    F.check_depth(v, "meta", limit=8)
    return v


class AdminGuard:
    """Wraps each admin handler: loopback check, bearer token, the small JSON body read, and
    every exception turned into its 4xx/5xx JSON error (nothing escapes to the server)."""

    def __init__(self, core: ProxyCore, admin_token: str):
        self.core, self.config, self.token = core, core.config, admin_token

    def __call__(self, fn):
        """The Starlette endpoint of `fn(core, request, body)`."""
        async def handler(request: Request) -> Response:
            return await self.serve(fn, request)
        return handler

    async def serve(self, fn, request: Request) -> Response:
        cfg = self.config
        if cfg.admin_clients == "loopback" and not is_loopback(request.client):
            return json_response({"error": {"message": "the admin API answers loopback clients only "
                                                       "(ProxyConfig.admin_clients)"}}, 403)
        auth = request.headers.get("authorization", "")
        if not secrets.compare_digest(auth.encode(), f"Bearer {self.token}".encode()):
            return json_response({"error": {"message": "invalid admin token"}}, 401)
        try:
            body: Any = {}
            if request.method == "POST":
                raw = await read_body(request, cfg.admin_max_body_bytes)
                body = decode(raw) if raw.strip() else {}
            out = await fn(self.core, request, body)
            return out if isinstance(out, Response) else json_response(out)
        except ProxyError as e:
            return json_response({"error": {"message": e.message, "param": e.param}}, e.status)
        except KeyError as e:
            return json_response({"error": {"message": str(e.args[0]) if e.args else "not found"}}, 404)
        except (ValueError, TypeError) as e:
            return json_response({"error": {"message": str(e)}}, 400)
        except Exception as e:  # a bug: a 500 naming it, never a reset connection
            log.error("admin call failed", exc_info=e)
            return json_response({"error": {"message": f"{type(e).__name__}: {e}"}}, 500)


# -- the handlers: (core, request, body) -> a JSON-ready value or a Response -------------------
async def open_session(core: ProxyCore, request: Request, body: Any):
    sid, key = core.open_session(session_meta(body.get("meta")))
    return {"session_id": sid, "key": key, "openai_base_url": f"/s/{sid}/v1", "anthropic_base_url": f"/s/{sid}"}


async def close_session(core: ProxyCore, request: Request, body: Any):
    core.close_session(request.path_params["sid"])
    return {"closed": True}


async def set_reward(core: ProxyCore, request: Request, body: Any):
    r = body.get("reward")
    if r is not None and (r.__class__ not in (int, float) or not math.isfinite(r)):
        raise ValueError(f"reward must be a finite number or null, got {repr(r)[:60]}")
    status = body.get("status", "ok")
    termination = body.get("termination") or ""
    if status.__class__ is not str or termination.__class__ is not str or len(status) > 64 \
            or len(termination) > 4096:
        raise ValueError("status and termination must be strings (at most 64 and 4096 characters)")
    core.set_reward(request.path_params["sid"], None if r is None else float(r), status, termination)
    return {"ok": True}


async def feedback(core: ProxyCore, request: Request, body: Any):
    """A live session's reward, arriving after it (`gym.live.feedback`): validated, recorded,
    the session closed; an unknown session is a 404 naming it."""
    from harnessrl.gym.live.feedback import FeedbackError, parse_feedback, record_feedback

    sid = request.path_params["sid"]
    try:
        fb = parse_feedback(body)
    except FeedbackError as e:
        raise ProxyError(400, str(e), param=e.field) from None
    if sid not in core.sessions:
        raise ProxyError(404, f"unknown session {sid!r}", param="session")
    core.close_session(sid)
    return record_feedback(core.store, sid, fb)


async def delete_session(core: ProxyCore, request: Request, body: Any):
    """The session closed, its in-flight call (if any) let finish, then its rows removed from
    disk and the removal verified (`Store.delete_session`)."""
    sid = request.path_params["sid"]
    s = core.sessions.get(sid)
    if s is None:
        raise ProxyError(404, f"unknown session {sid!r}", param="session")
    core.close_session(sid)
    if s.lock is not None:
        async with s.lock:  # a call under way records before it goes
            pass
    del core.sessions[sid]
    return await offload(lambda: core.store.delete_session(sid))


async def trajectory(core: ProxyCore, request: Request, body: Any):
    sid = request.path_params["sid"]
    # Built and encoded in a worker thread: a long session's export must not stall streams.
    return Response(await offload(lambda: dumps(core.export_trajectory(sid))), media_type="application/json")


async def pause(core: ProxyCore, request: Request, body: Any):
    core.gate.pause()
    return {"paused": True}


async def resume(core: ProxyCore, request: Request, body: Any):
    core.gate.resume()
    return {"paused": False}


async def policy_version(core: ProxyCore, request: Request, body: Any):
    v = body.get("version")
    if v.__class__ is not int or not 0 <= v < F.INT63:
        raise ValueError(f"version: {repr(v)[:60]} is not a policy version (an integer in [0, 2**63))")
    core.set_policy_version(v)
    return {"policy_version": core.policy_version}


async def lora(core: ProxyCore, request: Request, body: Any):
    """Name LoRA adapter `name` in every generation from now on (null: the base weights)."""
    name = body.get("name")
    if name is not None and (name.__class__ is not str or not 0 < len(name) <= 256):
        raise ProxyError(400, f"name must be null or a string of 1..256 characters, got {repr(name)[:60]}",
                         param="name")
    select = getattr(core.engine, "use_lora", None)
    if select is not None:
        select(name)
    return {"applied": select is not None}


async def engines(core: ProxyCore, request: Request, body: Any):
    """Route generations only to these engines from now on (each one of the proxy's own)."""
    urls = body.get("urls")
    if urls.__class__ is not list or not urls or len(urls) > 1024 or any(u.__class__ is not str for u in urls):
        raise ProxyError(400, f"urls must be a non-empty list of engine URLs, got {repr(urls)[:60]}", param="urls")
    serve = getattr(core.engine, "serve_only", None)
    if serve is not None:
        serve(urls)  # an engine that is not one of this proxy's: a ValueError naming it (400)
    return {"applied": serve is not None}


async def stats(core: ProxyCore, request: Request, body: Any):
    return core.stats()


ADMIN_ROUTES = (
    ("/admin/sessions", open_session, "POST"),
    ("/admin/sessions/{sid}/close", close_session, "POST"),
    ("/admin/sessions/{sid}/reward", set_reward, "POST"),
    ("/admin/sessions/{sid}/trajectory", trajectory, "GET"),
    ("/admin/sessions/{sid}/feedback", feedback, "POST"),
    ("/admin/sessions/{sid}", delete_session, "DELETE"),
    ("/admin/pause", pause, "POST"),
    ("/admin/resume", resume, "POST"),
    ("/admin/stats", stats, "GET"),
    ("/admin/policy_version", policy_version, "POST"),
    ("/admin/lora", lora, "POST"),
    ("/admin/engines", engines, "POST"),
)
"""(path, handler, method) of every admin route."""


def admin_routes(core: ProxyCore, admin_token: str) -> list[Route]:
    guard = AdminGuard(core, admin_token)
    return [Route(path, guard(fn), methods=[method]) for path, fn, method in ADMIN_ROUTES]
