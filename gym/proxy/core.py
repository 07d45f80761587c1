"""The proxy's state and its call pipeline, independent of HTTP.

One call: render (recorder.plan_call) -> generate (generation.generate) -> cut at stop
strings and parse tool calls (reply.finish_reply) -> record durably (store.add_call) ->
advance the session (recorder.commit) -> the dialect formats the reply. The record is written before the
reply's last byte leaves, for streamed calls too. Calls of one session run one at a time
(the session lock), so its segments grow in a well-defined order.

Every call that reached generation leaves exactly one row: failed engine calls (503, 504
on an `EngineTimeouts` bound) and replies the harness never received are recorded
*detached* (in the record, in no segment, never trained on) and do not advance the session.
A proxy restarted on the same store serves, closes and rewards the sessions it finds
there, and refuses new calls on them.

A streamed call either relays the engine's token stream (`engine_stream`; text is held
back from a possible tool-call or stop-string start) or, by default, generates in one
engine request with keep-alive events meanwhile. Both record the same ids.
"""
from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any, AsyncIterator

from ..backends import make_routed
from ..backends.protocol import SESSION, GenerationBackend
from harnessrl.gym.backends.engine_client import EngineError, EngineTimeout, EngineTimeouts
from .canonical import ChatRequest, Completion, Message
from .config import ProxyConfig
from .dialects import dialect_module
from .errors import ProxyError
from .generation import Generation, PauseGate, VersionMap, generate
from .call import Call, Prepared
from .recorder import Session, commit, plan_call
from .reply import finish_reply
from .render import Renderer
from .rows import CallRow
from .sampling import SamplingPolicy, priority
from .store import Store
from .streamtext import Detokenizer, safe_len
from .teacher import TeacherChat, mark
from .toolcalls import load_tool_format

_HEALTH_PROBE_S = 2.0
"""How long a timed-out call waits for the engine's /health before answering the harness."""


class _ClientGone(Exception):
    """A plain call's client disconnected while it was generating."""


class ProxyCore:
    def __init__(self, config: ProxyConfig, tokenizer=None, backend: GenerationBackend | None = None):
        """`backend`: generate through this object instead of the URL backend that
        `config.backend` names (a trainer's in-process generation side, a Tinker client)."""
        from ..models import load_tokenizer

        self.config = config
        self.renderer = Renderer(tokenizer or load_tokenizer(config.model), load_tool_format(config.tool_format))
        self.store = Store(config.db_path, config.synchronous)
        self.sessions: dict[str, Session] = {}
        self.versions = VersionMap()
        self._given_backend = backend
        self.engine: GenerationBackend | None = None  # made on the serving loop (httpx binds to it)
        self.gate: PauseGate | None = None
        self.sampling = SamplingPolicy(config)
        self.policy_version: int | None = None
        """The trainer's current policy version, as the scheduler last announced it."""
        self.counters = {"aborted_stale": 0, "calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "errors_4xx": 0, "errors_5xx": 0,
                         "interruptions": 0, "segments_split": 0, "tool_call_flags": 0, "rejected_paused": 0,
                         "rejected_budget": 0, "engine_errors": 0, "undelivered": 0}
        self._restore()

    def _restore(self) -> None:
        """A restarted proxy on the same store serves the sessions it finds there: their
        trajectories, close and reward. They accept no new calls (their keys and token state
        died with the old process): a call gets the 404 of a closed session."""
        for sid, meta, closed in self.store.sessions():
            self.sessions[sid] = Session(id=sid, key="", meta=meta, closed=True, records=self.store.call_count(sid),
                                         aborted=None if closed else "the proxy restarted while this session was open")

    async def start(self) -> None:
        c = self.config
        # control requests (model info, health) get the first-byte bound: a stopped engine fails them too
        if c.teacher_url is not None:  # pass-through: the teacher's replies in the student's tokens
            self.engine = TeacherChat(c.teacher_url, c.teacher_model, c.teacher_api_key,
                                      c.engine_total_timeout_s or 900.0)
        elif self._given_backend is not None:
            self.engine = self._given_backend
        else:
            extra = {"route": c.vllm_route} if c.backend == "vllm" else {}
            self.engine = make_routed(c.backend, c.engine_urls, timeout=c.engine_first_byte_timeout_s or 600.0,
                                       timeouts=EngineTimeouts(c.engine_connect_timeout_s, c.engine_first_byte_timeout_s,
                                                               c.engine_idle_timeout_s, c.engine_total_timeout_s), **extra)
        self.gate = PauseGate()

    @property
    def teacher(self) -> dict[str, str] | None:
        """`flags["teacher"]` of every call when this proxy records a teacher (`gym.proxy.teacher`)."""
        c = self.config
        if c.teacher is None and c.teacher_url is None:
            return None
        return {"teacher": c.teacher or c.teacher_url, "model": c.teacher_model if c.teacher_url else (c.teacher or "")}

    async def stop(self) -> None:
        if self.engine is not None and self.engine is not self._given_backend:  # a handed-in backend is its owner's
            await self.engine.aclose()

    # -- sessions (thread-safe: dict ops are atomic, the store locks) --------------------
    def open_session(self, meta: dict[str, Any] | None = None) -> tuple[str, str]:
        s = Session.new(meta or {})
        self.store.open_session(s.id, s.meta, self.renderer.template_hash, self.config.model)
        self.sessions[s.id] = s
        return s.id, s.key

    def close_session(self, sid: str) -> None:
        s = self.sessions.get(sid)
        if s is None:
            raise KeyError(f"unknown session {sid!r}")
        s.closed = True
        release = getattr(self.engine, "release", None)  # a router: the session no longer loads its engine
        if release is not None:
            release(sid)
        s.branches = []  # its token state is in the store; keep memory flat over long runs
        self.store.close_session(sid)

    def set_reward(self, sid: str, reward: float | None, status: str = "ok", termination: str = "") -> None:
        from ..trajectory import STATUSES

        if sid not in self.sessions:
            raise KeyError(f"unknown session {sid!r}")
        if status not in STATUSES:
            raise ValueError(f"status {status!r} not in {STATUSES}")
        self.store.set_reward(sid, reward, status, termination)

    def export_trajectory(self, sid: str) -> dict[str, Any]:
        """The session's trajectory as a JSON-ready dict, linear in its tokens (prompts as
        deltas). Blocking (SQLite and list building): the admin handler runs it with
        `await offload(...)` (a worker thread) so streams keep flowing."""
        if sid not in self.sessions:
            raise KeyError(f"unknown session {sid!r}")
        return self.store.trajectory(sid).to_dict()

    def stats(self) -> dict[str, Any]:
        """The counters; with several engines also `engines`, each one's service state and load."""
        out = dict(self.counters, sessions_open=sum(not s.closed for s in list(self.sessions.values())),
                   sessions=len(self.sessions), paused=bool(self.gate and self.gate.paused),
                   policy_version=self.policy_version,
                   chat_template_hash=self.renderer.template_hash,
                   incremental_exact=self.renderer.incremental_exact, stored_calls=self.store.call_count())
        engines = getattr(self.engine, "report", None)
        if engines is not None:
            out["engines"] = engines()
        return out

    # -- the call pipeline ---------------------------------------------------------------
    def check_model(self, req: ChatRequest) -> None:
        served = self.config.served_models
        if served and req.model not in served:
            raise ProxyError(404, f"model {req.model!r} is not served here; available: {', '.join(served)}",
                             kind="not_found_error", param="model")

    def check_budget(self, s: Session) -> None:
        """The episode's call and completion-token budgets (`max_calls` / `max_tokens` in the
        session's meta, set by the episode runner), enforced before any generation."""
        max_calls, max_tokens = s.meta.get("max_calls"), s.meta.get("max_tokens")
        if isinstance(max_calls, int) and s.n_calls >= max_calls:
            self.counters["rejected_budget"] += 1
            raise ProxyError(400, f"this episode's call budget is spent ({s.n_calls} of max_calls={max_calls})",
                             param="max_calls")
        if isinstance(max_tokens, int) and s.completion_tokens >= max_tokens:
            self.counters["rejected_budget"] += 1
            raise ProxyError(400, f"this episode's token budget is spent ({s.completion_tokens} of "
                             f"max_tokens={max_tokens} completion tokens)", param="max_tokens")

    def set_policy_version(self, version: int) -> None:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version: {version!r} is not a policy version (an int >= 0)")
        self.policy_version = version

    def check_staleness(self, s: Session) -> None:
        """The scheduler's per-turn η check, at the turn boundary: a session opened with
        `staleness_limit` η in its meta is aborted once the policy is more than η versions
        ahead of its oldest sampled token (that data could no longer be trained on). The
        refusal is a 403, which harness SDKs do not retry; the session is recorded
        `infra_error` / `stale`, so the episode is masked and the scheduler reruns its task."""
        if s.aborted is None:
            eta, v = s.meta.get("staleness_limit"), self.policy_version
            if not isinstance(eta, int) or v is None or s.oldest_version is None or v - s.oldest_version <= eta:
                return
            s.aborted = (f"this episode is stale: its oldest token is from policy version {s.oldest_version}, "
                         f"the policy is now at {v}, the staleness limit is {eta}; the episode is aborted and rerun")
            self.counters["aborted_stale"] += 1
            self.store.set_reward(s.id, None, "infra_error", "stale")
        raise ProxyError(403, s.aborted, kind="permission_error", param="staleness_limit")

    async def admit(self) -> None:
        """Wait out a pause, or refuse with a retryable 429 when it lasts too long."""
        if not await self.gate.wait(self.config.pause_wait_s):
            self.counters["rejected_paused"] += 1
            raise ProxyError(429, "generation is paused for a weight update; retry shortly",
                             kind="rate_limit_error", headers={"Retry-After": str(self.config.retry_after_s)})

    async def run(self, p: Prepared, stream_cls=None) -> AsyncIterator[Any]:
        """The whole call; yields SSE bytes when `stream_cls` (a dialect Stream) is given, else one Completion.

        Every call that reached generation leaves one row in the store: a delivered call
        extends its segment; a failed engine call (unreachable, error status, an
        `EngineTimeouts` bound passed) is recorded detached with `finish_reason`
        "engine_error" and `flags["engine_error"]` (on a timeout also its phase and
        `engine_healthy`: whether /health answered right after), and answered 503 (504 on a
        timeout) in the dialect's shape; a reply the harness never received (its client disconnected:
        `Prepared.disconnected` for plain calls, the stream closed before its final event)
        is recorded detached with `flags["undelivered"]`, and the session does not advance
        past it. Detached rows are in no segment, so nothing trains on them."""
        s, req = p.session, p.req
        SESSION.set(s.id)  # in-process backends route an episode's calls together by it
        if s.lock is None:
            s.lock = asyncio.Lock()
        async with s.lock:
            call = await self._open(p, stream_cls)
            rec, params = call.rec, call.params
            try:
                space = await self.sampling.space(self.engine)
                async with contextlib.aclosing(self._generate(call)) as events:
                    async for event in events:
                        yield event
            except EngineError as e:  # the app answers it: an HTTP status, or the stream's error event
                try:
                    healthy = await self._healthy() if isinstance(e, EngineTimeout) else None
                except asyncio.CancelledError:  # the client left during the probe: record it all the same
                    rec.failed(e, params)
                    raise
                raise rec.failed(e, params, healthy, engine=self._engine_of(s.id)) from e
            except _ClientGone:
                rec.detached("undelivered", params, undelivered="client_disconnected")
                raise ProxyError(499, "the client disconnected before the reply was ready") from None
            except (asyncio.CancelledError, GeneratorExit):  # a streamed call's client went away
                rec.detached("undelivered", params, undelivered="client_disconnected")
                raise
            except Exception as e:  # a proxy bug: recorded (not as an engine failure), then the app's 502
                rec.detached("proxy_error", params, finish_reason="proxy_error", completion=False,
                             proxy_error=f"{type(e).__name__}: {e}")
                raise
            c, reply, versions = await self._record(call, space)
            if call.writer is None:
                self._advance(s, call.pl, req, reply, call.gen, versions)
                yield c
                return
            try:
                yield call.writer.finish(c, c.content[len(call.sent):] if c.content.startswith(call.sent) else "")
            except (asyncio.CancelledError, GeneratorExit):
                # The stream was closed before its final event went out: the harness has no reply.
                self.store.mark_undelivered(call.cid, "client_disconnected")
                self.counters["undelivered"] += 1
                raise
            self._advance(s, call.pl, req, reply, call.gen, versions)

    def _engine_of(self, sid: str) -> str | None:
        """Which engine serves session `sid`, when several do (`gym.backends.router`); else None."""
        where = getattr(self.engine, "engine_of", None)
        return where(sid) if where is not None else None

    async def _open(self, p: Prepared, stream_cls) -> Call:
        """The call's first step, under its session's lock: its timings, its prompt rendered
        (off the event loop), its reply id, its sampling capped by the episode's token budget,
        and the writer of its row."""
        s, req = p.session, p.req
        queue_s = time.monotonic() - p.arrived
        env_s = (p.arrived - s.last_response_at) if s.last_response_at is not None else None
        pl = await plan_call(s, req, self.renderer)  # a heavy render goes to a worker thread
        cid = dialect_module(req.dialect).ID_PREFIX + secrets.token_hex(12)
        created = int(time.time())
        gen = Generation()
        writer = stream_cls(req, cid, req.model, created) if stream_cls is not None else None
        markers = list(req.stop)
        if req.tools and req.tool_choice != "none":
            markers.append(self.renderer.tool_format.start_marker)
        params, ignored = self.sampling.engine_params(req, self.renderer.stop_token_ids)
        params["priority"] = priority(s.oldest_version, s.meta) if self.config.staleness_priority else None
        budget = s.meta.get("max_tokens")
        if isinstance(budget, int):  # never sample past the episode's token budget
            params["max_new_tokens"] = max(1, min(params["max_new_tokens"], budget - s.completion_tokens))
        rec = CallRow(self.store, self.versions, self.counters, s, pl, req, cid, gen, queue_s, env_s)
        return Call(p, pl, cid, created, gen, writer, markers, params, ignored, rec)

    async def _generate(self, call: Call) -> AsyncIterator[bytes]:
        """A streamed call's start event, then the generation: the engine's token stream
        relayed as text (`engine_stream`), or one engine request meanwhile sending keep-alives
        (streamed) or watching the client (plain: a client gone stops the engine request)."""
        writer, gen, cid, params = call.writer, call.gen, call.cid, call.params
        maxi = self.config.max_interruptions
        if writer is not None:
            yield writer.start()
        if writer is not None and self.config.engine_stream and not isinstance(self.engine, TeacherChat):
            detok = Detokenizer(self.renderer)
            held, text = False, ""
            async with contextlib.aclosing(generate(self.engine, self.gate, call.pl.prompt_ids, stream=True,
                                                    params=params, max_interruptions=maxi, rid=cid,
                                                    out=gen)) as chunks:
                async for ids in chunks:
                    piece = detok.add(ids)
                    if held or not piece:
                        continue
                    text += piece
                    cut, held = safe_len(text, call.markers)
                    if cut > len(call.sent):
                        delta = text[len(call.sent):cut]
                        call.sent += delta
                        yield writer.text(delta)
            return
        task = asyncio.ensure_future(self._drain(call.pl.prompt_ids, params, cid, gen, call.p.req))
        try:
            while not (await asyncio.wait({task}, timeout=self.config.keepalive_s))[0]:
                if writer is not None:
                    yield writer.keepalive()
                elif call.p.disconnected is not None and await call.p.disconnected():
                    raise _ClientGone()
            task.result()
        finally:
            if not task.done():
                task.cancel()  # closing the engine request aborts it there

    async def _record(self, call: Call, space: str) -> tuple[Completion, Message, list[int]]:
        """The generated call cut, parsed and flagged, its row written (durable before the
        reply's last byte leaves) and the counters advanced; a plain call whose client is gone
        is recorded undelivered instead, and refused (499)."""
        p, req, gen, pl = call.p, call.p.req, call.gen, call.pl
        if self.teacher is not None:
            mark(gen)  # teacher tokens: no behaviour logprob, no policy version
        c, reply, flags = finish_reply(self.renderer, req, gen, call.cid, call.created, len(pl.prompt_ids),
                                       call.sent if call.writer is not None else None)
        if "tool_call" in flags:
            self.counters["tool_call_flags"] += 1
        if self.teacher is not None:
            flags["teacher"] = self.teacher
        flags["sampling"] = self.sampling.record(req, call.params, space, call.ignored)
        if pl.split_reason is not None:
            flags["split_reason"] = pl.split_reason
        if pl.spawned_by is not None:
            flags["spawned_by"] = pl.spawned_by
        if pl.compacted_from is not None:
            flags["compacted_from"] = pl.compacted_from
        engine = self._engine_of(p.session.id)
        if engine is not None:
            flags["engine"] = engine
        if call.writer is None and p.disconnected is not None and await p.disconnected():
            # generated, but nobody is left to receive it: keep it out of training
            call.rec.detached("undelivered", call.params, flags, undelivered="client_disconnected")
            raise ProxyError(499, "the client disconnected before the reply was ready")
        versions = call.rec.add(flags)  # durable before the reply's last byte leaves
        if pl.split_reason is not None:
            self.counters["segments_split"] += 1
        self.counters["calls"] += 1
        self.counters["prompt_tokens"] += len(pl.prompt_ids)
        self.counters["completion_tokens"] += len(gen.ids)
        self.counters["interruptions"] += gen.interruptions
        p.session.completion_tokens += len(gen.ids)
        return c, reply, versions

    async def _healthy(self) -> bool:
        """Does the engine answer /health right after a timed-out call? (briefly: a stopped
        engine does not). True says the timeout was more likely the call's own length or
        load than a dead engine; the record keeps it for whoever judges the episode."""
        try:
            return await asyncio.wait_for(self.engine.health(), _HEALTH_PROBE_S)
        except asyncio.TimeoutError:
            return False

    def _advance(self, s: Session, pl, req: ChatRequest, reply: Message, gen: Generation, versions: list[int]) -> None:
        """The harness has the reply: the session's segment now ends with it."""
        versions = [v for v in versions if v >= 0]  # teacher tokens (-1) have no policy version to be stale by
        if versions:
            s.oldest_version = min(versions + ([s.oldest_version] if s.oldest_version is not None else []))
        commit(s, pl, req, reply, gen.ids, gen.finish_reason, self.config.max_branches)

    async def _drain(self, prompt: list[int], params: dict[str, Any], cid: str, gen: Generation,
                     req: ChatRequest | None = None) -> None:
        if isinstance(self.engine, TeacherChat):
            await self.engine.reply(req, params, self.renderer, gen)
            return
        async for _ in generate(self.engine, self.gate, prompt, stream=False, params=params,
                                max_interruptions=self.config.max_interruptions, rid=cid, out=gen):
            pass
