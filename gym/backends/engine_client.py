"""The one engine client: SGLang's native HTTP API (../shared/docs/sglang-contract.md).

Contract: token ids in, token ids + per-token logprobs out. The same client talks to the
local CPU engine (`harnessrl.trainers.engine`) and, unchanged, to a real SGLang server.

- Sampled ids are read from `meta_info.output_token_logprobs[i][1]` (real SGLang may omit
  `output_ids` in some modes); `output_ids` is only a fallback when logprobs are missing.
- `weight_version` comes from `meta_info` of every reply.
- Streaming: SGLang sends *cumulative* output in every chunk by default and *incremental*
  output with `--incremental-streaming-output`. `generate_stream` yields only the new ids
  and logprobs of each chunk in both cases, telling them apart by `completion_tokens`.
- An aborted request (abort_request, pause_generation(mode="abort")) comes back as a result
  with `finish_reason == "abort"` and whatever partial output the engine returned.
- Every /generate request runs under `EngineTimeouts` (connect, first byte, idle between
  stream chunks, total), enforced with asyncio deadlines whatever the transport, so a
  stopped engine (SIGSTOP: the kernel still accepts connections, nothing answers) fails
  the call with `EngineTimeout` instead of holding it. A non-streamed reply arrives whole,
  so its only byte-level bound is `total_s`.

No torch import here: the env layer (proxy) uses this client.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

import httpx

try:
    from orjson import loads as _loads  # stream chunks: one JSON object per token batch
except ImportError:  # pragma: no cover
    _loads = json.loads


@dataclass
class GenerateResult:
    """One generation (or, from `generate_stream`, one chunk of new tokens)."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort" | "" (stream chunk not yet finished)
    weight_version: str
    prompt_tokens: int
    text: str = ""
    versions: list[str] | None = None
    """Per-token weight versions, when a backend knows them (else every token has `weight_version`)."""
    cached_tokens: int = 0
    """Prompt tokens the engine reused from its prefix cache (`meta_info.cached_tokens`)."""


class EngineError(RuntimeError):
    """The engine is unreachable, answered an error status, or sent a reply we cannot read."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class EngineTimeout(EngineError):
    """A /generate request ran past one of its `EngineTimeouts`; `phase` names which one:
    "connect", "first_byte", "idle" or "total"."""

    def __init__(self, message: str, phase: str):
        super().__init__(message)
        self.phase = phase


@dataclass(frozen=True)
class EngineTimeouts:
    """Bounds on one /generate request, in seconds; None leaves that bound off."""

    connect_s: float | None = 10.0
    """Opening the TCP connection."""
    first_byte_s: float | None = 300.0
    """Streamed: from sending the request to the first data chunk (queueing and prefill)."""
    idle_s: float | None = 120.0
    """Streamed: between two chunks once the first has come."""
    total_s: float | None = 900.0
    """The whole request, streamed or not (the only bound on a non-streamed reply's wait)."""


@contextlib.asynccontextmanager
async def within(limit: float | None, phase: str, url: str):
    """Bound a block to `limit` seconds; past it, an EngineTimeout naming the phase. The block
    runs in the calling task (a timer cancels it): `asyncio.wait_for` would run the awaitable in a
    helper task, and on Python 3.11 a cancelled stream read awaited that way can wait forever,
    so a harness that hung up would never close its engine connection nor abort the request."""
    if limit is None:
        yield
        return
    task, fired = asyncio.current_task(), []
    handle = asyncio.get_running_loop().call_later(limit, lambda: (fired.append(1), task.cancel()))
    try:
        yield
    except asyncio.CancelledError:
        if not fired:
            raise
        if hasattr(task, "uncancel"):
            task.uncancel()
        what = {"total": "complete reply", "first_byte": "first chunk", "idle": "next chunk"}.get(phase, phase)
        raise EngineTimeout(f"engine at {url} timed out: no {what} within {limit:g} s "
                            f"(EngineTimeouts.{phase}_s)", phase) from None
    finally:
        handle.cancel()


class StreamBudget:
    """The bounds of one streamed request: each phase's own bound, capped by what is left of
    `total_s` (then the phase reported is "total"). Made when the request starts."""

    def __init__(self, timeouts: EngineTimeouts):
        self.t = timeouts
        self.loop = asyncio.get_running_loop()
        self.deadline = self.loop.time() + timeouts.total_s if timeouts.total_s is not None else None

    def left(self, phase: str) -> tuple[float | None, str]:
        """(seconds, phase name) for the next wait in `phase` ("first_byte" or "idle")."""
        limit = getattr(self.t, phase + "_s")
        if self.deadline is None:
            return limit, phase
        rest = max(0.0, self.deadline - self.loop.time())
        return (rest, "total") if limit is None or rest < limit else (limit, phase)


async def bounded(aw, limit: float | None, phase: str, url: str):
    """Await `aw` for at most `limit` seconds (in this task); past it, an EngineTimeout naming the phase."""
    async with within(limit, phase, url):
        return await aw


def _finish_reason(meta: dict) -> str:
    """SGLang sends `{"type": "stop"|"length"|"abort", ...}` or null (still running)."""
    fr = meta.get("finish_reason")
    if fr is None:
        return ""
    if isinstance(fr, dict):
        return str(fr.get("type") or "")
    return str(fr)


def _ids_and_logprobs(body: dict) -> tuple[list[int], list[float]]:
    meta = body.get("meta_info") or {}
    lps = meta.get("output_token_logprobs")
    if lps is not None:
        return [int(e[1]) for e in lps], [float(e[0]) if e[0] is not None else float("nan") for e in lps]
    ids = body.get("output_ids")
    if ids is None:
        raise ValueError("reply has neither meta_info.output_token_logprobs nor output_ids")
    return [int(i) for i in ids], []


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:500]
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        return json.dumps(err)[:500]
    return str(body)[:500]


class EngineClient:
    """Async client for one engine base URL (e.g. http://127.0.0.1:30000)."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        timeouts: EngineTimeouts | None = None,
    ):
        """`timeout` bounds control requests (httpx semantics); `timeouts` bound /generate
        (default: `EngineTimeouts()` with `total_s` no larger than `timeout`)."""
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.timeouts = timeouts or EngineTimeouts(total_s=min(EngineTimeouts.total_s, timeout))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, transport=transport, headers=headers
        )
        self.lora_name: str | None = None
        """The LoRA adapter every /generate names (`lora_path`, SGLang's per-request adapter),
        set by `use_lora` when a weight sync has loaded it; None: the engine's base weights."""

    def use_lora(self, name: str | None) -> None:
        """Name adapter `name` in every generation from now on (None: the base weights).
        A real SGLang serves a loaded adapter only to the requests that name it."""
        self.lora_name = name

    # ---- plumbing -------------------------------------------------------------------
    async def _request(self, method: str, path: str, json_body: Any = None) -> httpx.Response:
        url = self.base_url + path
        try:  # bounded whatever the transport (the proxy's own enforces only the connect bound)
            resp = await bounded(self._http.request(method, path, json=json_body), self.timeout, "total", url)
        except httpx.HTTPError as e:
            raise EngineError(f"engine at {url} unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise EngineError(
                f"engine at {url} answered HTTP {resp.status_code}: {_error_text(resp)}",
                resp.status_code,
            )
        return resp

    async def _json(self, method: str, path: str, json_body: Any = None) -> dict:
        resp = await self._request(method, path, json_body)
        try:
            body = resp.json()
        except ValueError as e:
            raise EngineError(f"engine at {self.base_url + path} sent non-JSON: {resp.text[:200]!r}") from e
        return body if isinstance(body, dict) else {"result": body}

    @staticmethod
    def _payload(input_ids, max_new_tokens, temperature, top_p, top_k, stop_token_ids, rid, seed, stream,
                 priority=None) -> dict:
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
        }
        if stop_token_ids:
            params["stop_token_ids"] = list(stop_token_ids)
        if seed is not None:
            params["sampling_seed"] = seed
        payload: dict[str, Any] = {
            "input_ids": input_ids if input_ids.__class__ is list else list(input_ids),  # no copy of a 16k-id list
            "sampling_params": params,
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": stream,
        }
        if rid is not None:
            payload["rid"] = rid
        if priority is not None:  # SGLang honours it with --enable-priority-scheduling (higher first)
            payload["priority"] = int(priority)
        return payload

    def _generate_request(self, payload: dict) -> httpx.Request:
        # httpx enforces the connect bound (as does the proxy's transport); reads are bounded
        # by asyncio deadlines, which see a whole stalled exchange, not a single socket read.
        t = self.timeouts
        if self.lora_name is not None:
            payload = dict(payload, lora_path=self.lora_name)
        return self._http.build_request("POST", "/generate", json=payload,
                                        timeout=httpx.Timeout(None, connect=t.connect_s))

    async def post_generate(self, payload: dict, stream: bool):
        """POST /generate; the response (read whole unless `stream`). The one place a
        /generate request is sent: a leaner transport overrides it (`gym.proxy.engine_http`),
        answering an object with httpx.Response's `status_code`, `json()`, `text`, `aread()`,
        `aiter_lines()` and `aclose()`, and raising httpx's errors."""
        return await self._http.send(self._generate_request(payload), stream=stream)

    def _result(self, body: dict, url: str) -> GenerateResult:
        try:
            meta = body["meta_info"]
            ids, lps = _ids_and_logprobs(body)
            return GenerateResult(
                output_ids=ids,
                logprobs=lps,
                finish_reason=_finish_reason(meta),
                weight_version=str(meta.get("weight_version") or ""),
                prompt_tokens=int(meta.get("prompt_tokens") or 0),
                text=str(body.get("text") or ""),
                cached_tokens=int(meta.get("cached_tokens") or 0),
            )
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise EngineError(f"engine at {url} sent an unreadable /generate reply ({e}): {str(body)[:300]}") from e

    # ---- generation -----------------------------------------------------------------
    async def generate(
        self,
        input_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        stop_token_ids: list[int] | None = None,
        rid: str | None = None,
        seed: int | None = None,
        priority: int | None = None,
    ) -> GenerateResult:
        """One non-streamed /generate call."""
        payload = self._payload(input_ids, max_new_tokens, temperature, top_p, top_k, stop_token_ids, rid, seed, False,
                                priority)
        url = self.base_url + "/generate"
        try:
            resp = await bounded(self.post_generate(payload, False), self.timeouts.total_s, "total", url)
        except httpx.ConnectTimeout as e:
            raise EngineTimeout(f"engine at {url} timed out connecting (EngineTimeouts.connect_s): {e}",
                                "connect") from e
        except httpx.HTTPError as e:
            raise EngineError(f"engine at {url} unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            msg = _error_text(resp)
            # Some SGLang versions answer a non-streamed abort with an error status instead
            # of a 200 whose finish_reason is abort; the partial output is lost there.
            if "abort" in msg.lower():
                return GenerateResult([], [], "abort", "", len(input_ids))
            raise EngineError(f"engine at {url} answered HTTP {resp.status_code}: {msg}", resp.status_code)
        try:
            body = resp.json()
        except ValueError as e:
            raise EngineError(f"engine at {url} sent non-JSON: {resp.text[:200]!r}") from e
        if isinstance(body, list):  # a batch reply; we send one prompt
            body = body[0] if body else {}
        return self._result(body, url)

    async def generate_stream(
        self,
        input_ids: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        stop_token_ids: list[int] | None = None,
        rid: str | None = None,
        seed: int | None = None,
        priority: int | None = None,
    ) -> AsyncIterator[GenerateResult]:
        """Streamed /generate: each item holds only the new ids/logprobs; the last one is finished."""
        payload = self._payload(input_ids, max_new_tokens, temperature, top_p, top_k, stop_token_ids, rid, seed, True,
                                priority)
        url = self.base_url + "/generate"
        seen = 0  # output tokens already yielded
        text_seen = ""
        finished = False
        left = StreamBudget(self.timeouts).left
        resp = None
        try:
            resp = await bounded(self.post_generate(payload, True), *left("first_byte"), url)
            if resp.status_code >= 400:
                await bounded(resp.aread(), *left("idle"), url)
                raise EngineError(
                    f"engine at {url} answered HTTP {resp.status_code}: {_error_text(resp)}", resp.status_code
                )
            lines = resp.aiter_lines().__aiter__()
            got_data = False
            while True:
                try:
                    line = await bounded(lines.__anext__(), *left("idle" if got_data else "first_byte"), url)
                except StopAsyncIteration:
                    break
                if not line.startswith("data:"):
                    continue
                got_data = True
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    body = _loads(data)
                except ValueError as e:
                    raise EngineError(f"engine at {url} sent an unreadable stream chunk: {data[:200]!r}") from e
                if isinstance(body, dict) and "error" in body:
                    err = body["error"]
                    msg = err.get("message") if isinstance(err, dict) else err
                    raise EngineError(f"engine at {url} stream error: {msg}")
                chunk = self._result(body, url)
                meta = body.get("meta_info") or {}
                total = meta.get("completion_tokens")
                ids, lps = chunk.output_ids, chunk.logprobs
                # Cumulative chunks carry every token so far; incremental ones only the new.
                cumulative = (len(ids) == total and total >= seen) if isinstance(total, int) else len(ids) >= seen
                if cumulative:
                    ids, lps = ids[seen:], lps[seen:]
                    text = chunk.text[len(text_seen):] if chunk.text.startswith(text_seen) else chunk.text
                    text_seen = chunk.text if chunk.text.startswith(text_seen) else text_seen + chunk.text
                else:
                    text = chunk.text
                    text_seen += chunk.text
                seen += len(ids)
                finished = bool(chunk.finish_reason)
                if ids or finished:
                    yield GenerateResult(ids, lps, chunk.finish_reason, chunk.weight_version,
                                         chunk.prompt_tokens, text, cached_tokens=chunk.cached_tokens)
        except httpx.ConnectTimeout as e:
            raise EngineTimeout(f"engine at {url} timed out connecting (EngineTimeouts.connect_s): {e}",
                                "connect") from e
        except httpx.HTTPError as e:
            raise EngineError(f"engine at {url} unreachable: {type(e).__name__}: {e}") from e
        finally:
            if resp is not None:
                await resp.aclose()
        if not finished:
            raise EngineError(f"engine at {url} ended the stream without a finish_reason")

    # ---- control --------------------------------------------------------------------
    async def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        """POST /abort_request: one request by rid, or all of them."""
        if rid is None and not abort_all:
            raise ValueError("abort needs a rid or abort_all=True")
        body: dict[str, Any] = {"abort_all": abort_all}
        if rid is not None:
            body["rid"] = rid
        await self._request("POST", "/abort_request", body)

    async def pause(self, mode: str = "abort") -> None:
        """POST /pause_generation; mode abort returns running requests with finish reason abort."""
        await self._request("POST", "/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        """POST /continue_generation."""
        await self._request("POST", "/continue_generation", {})

    async def update_weights_from_disk(self, model_path: str, weight_version: str, flush_cache: bool = True) -> dict:
        """POST /update_weights_from_disk; raises EngineError when the engine reports failure."""
        url = self.base_url + "/update_weights_from_disk"
        body = await self._json(
            "POST",
            "/update_weights_from_disk",
            {"model_path": model_path, "weight_version": weight_version, "flush_cache": flush_cache},
        )
        if not body.get("success", False):
            raise EngineError(f"engine at {url} could not load {model_path}: {body.get('message')}")
        return body

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict:
        """POST /load_lora_adapter {lora_name, lora_path} (a peft adapter folder the engine can
        read); raises EngineError when the engine reports failure (404: no LoRA routes)."""
        body = await self._json("POST", "/load_lora_adapter", {"lora_name": lora_name, "lora_path": lora_path})
        if not body.get("success", False):
            raise EngineError(f"engine at {self.base_url} could not load adapter {lora_path}: "
                              f"{body.get('error_message')}")
        return body

    async def unload_lora_adapter(self, lora_name: str) -> dict:
        """POST /unload_lora_adapter {lora_name}."""
        return await self._json("POST", "/unload_lora_adapter", {"lora_name": lora_name})

    async def update_weight_version(self, version: str, abort_all_requests: bool = False) -> dict:
        """POST /update_weight_version {new_version, abort_all_requests}: the version stamped on
        tokens from now on (an adapter load changes weights but names no version)."""
        return await self._json("POST", "/update_weight_version",
                                {"new_version": version, "abort_all_requests": abort_all_requests})

    async def flush_cache(self) -> None:
        """POST /flush_cache (SGLang answers plain text)."""
        await self._request("POST", "/flush_cache")

    async def health(self) -> bool:
        """GET /health: True on 200, False on any error, refusal, or no answer within the
        first-byte bound (a stopped engine)."""
        t = self.timeouts
        try:
            resp = await bounded(self._http.get("/health", timeout=httpx.Timeout(None, connect=t.connect_s)),
                                  t.first_byte_s, "first_byte", self.base_url + "/health")
        except (httpx.HTTPError, EngineTimeout):
            return False
        return resp.status_code == 200

    async def model_info(self) -> dict:
        """GET /get_model_info (model_path, tokenizer_path, is_generation, ...)."""
        return await self._json("GET", "/get_model_info")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "EngineClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
