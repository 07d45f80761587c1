"""The vLLM backend: token ids in, token ids + logprobs out, over vLLM's HTTP API.

Two routes (`route=`), shapes in `vllm_wire.py`:
- "generate": `POST /inference/v1/generate` `{"token_ids", "sampling_params": {max_tokens,
  temperature, top_p, top_k, stop_token_ids, seed, logprobs: 1}, "request_id"}`; ids from
  `choices[0].token_ids`, logprobs from `choices[0].logprobs.content[i].logprob`.
- "completions": `POST /v1/completions` with `prompt` a list of token ids, `return_token_ids`,
  `return_tokens_as_token_ids` and `logprobs: 1`; ids from `choices[0].token_ids` (or, on a
  vLLM without `return_token_ids`, the "token_id:N" tokens), logprobs from
  `choices[0].logprobs.token_logprobs`.
Streaming reads vLLM's SSE (`stream: true`; each chunk carries only its new ids); a stream
that reaches `[DONE]` without a finish reason was aborted between two tokens (vLLM sends no
chunk without new tokens), so it ends "abort".

Abort: vLLM aborts a request when its HTTP connection closes, so cancelling the caller's
task (the proxy does when its harness goes away) is the abort. A request that vLLM aborted
(pause mode abort for a weight update, `/abort_requests`) finishes "abort" with its partial
output, which the proxy resumes (`gym/proxy/generation.py`). "error" is an `EngineError`.

Weight version: vLLM's replies name none. A reply's `weight_version` (body, choice, or the
`x-weight-version` header; the local engine sends it) wins; otherwise each result carries
the version last given to `set_weight_version(v)` *when the request was sent*. With the
documented update order (pause with abort -> load -> `set_weight_version` -> resume), every
token of one request was sampled by that version. A trainer that syncs a real vLLM must
call `set_weight_version` on the proxy's backend (`ProxyServer.core.engine`) as it publishes.

Logprobs: vLLM's default `--logprobs-mode raw_logprobs` are the model's temperature-1,
unfiltered logprobs ("raw"); with `processed_logprobs` they are those of the distribution
sampled from ("sampled"). `model_info()` reports which (the server's own `logprob_space`,
if its /v1/models says, else `logprobs_mode`). `priority` is not sent unless
`send_priority` (vLLM refuses a non-zero one without `--scheduling-policy priority`); sent,
it is negated (ours: higher first; vLLM's: lower first).
Timeouts: `EngineTimeouts`, exactly as `EngineClient` (connect, first byte, idle, total).
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Literal

import httpx

from harnessrl.gym.backends.engine_client import EngineError, EngineTimeout, EngineTimeouts, GenerateResult, StreamBudget, bounded, within
from .vllm_wire import error_message, read_choice, reply_version

PATHS = {"generate": "/inference/v1/generate", "completions": "/v1/completions"}


def _json(resp: httpx.Response, url: str) -> Any:
    """A reply's JSON body; an EngineError quoting its start when it is not JSON."""
    try:
        return resp.json()
    except ValueError as e:
        raise EngineError(f"vLLM at {url} sent non-JSON: {resp.text[:200]!r}") from e


def _finish(reason: Any, url: str) -> str:
    r = str(reason or "")
    if r == "error":
        raise EngineError(f"vLLM at {url} failed the request (finish_reason 'error')")
    return {"abort": "abort", "length": "length"}.get(r, "stop" if r else "")


class VllmBackend:
    """`GenerationBackend` over a vLLM server; see the module doc."""

    def __init__(self, base_url: str, timeout: float = 600.0, timeouts: EngineTimeouts | None = None,
                 route: Literal["generate", "completions"] = "generate", api_key: str | None = None,
                 model: str | None = None, *, transport: httpx.AsyncBaseTransport | None = None,
                 weight_version: str = "default", logprobs_mode: str = "raw_logprobs", send_priority: bool = False):
        """`timeout` bounds control requests; `timeouts` bound generations (default as
        EngineClient's). `model`: the served name to send (completions: None asks /v1/models).
        `weight_version`: the version before any `set_weight_version`."""
        if route not in PATHS:
            raise ValueError(f"route: {route!r} is not a vLLM route; valid: {', '.join(PATHS)}")
        self.base_url = base_url.rstrip("/")
        self.route, self.model, self.timeout = route, model, timeout
        self.path = PATHS[route]
        self.timeouts = timeouts or EngineTimeouts(total_s=min(EngineTimeouts.total_s, timeout))
        self.weight_version = str(weight_version)
        self.lora_name: str | None = None
        self.logprobs_mode, self.send_priority = logprobs_mode, send_priority
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport, headers=headers)

    def set_weight_version(self, version: str | int) -> None:
        """The version of the weights now loaded; requests sent from now on carry it."""
        self.weight_version = str(version)

    def use_lora(self, name: str | None) -> None:
        """Select LoRA adapter `name` (loaded by `/v1/load_lora_adapter`) as the `model` of every
        request from now on, as vLLM selects adapters; None: the served base model again."""
        self.lora_name = name

    # ---- requests -------------------------------------------------------------------
    async def _payload(self, input_ids: list[int], max_new_tokens: int, temperature: float, top_p: float,
                       top_k: int, stop_token_ids, rid, seed, priority, stream: bool) -> dict:
        sp: dict[str, Any] = {"max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
                              "top_k": top_k if top_k >= 1 else -1, "logprobs": 1}
        if stop_token_ids:
            sp["stop_token_ids"] = list(stop_token_ids)
        if seed is not None:
            sp["seed"] = seed
        if self.route == "generate":
            body: dict[str, Any] = {"token_ids": list(input_ids), "sampling_params": sp, "stream": stream}
        else:
            body = dict(sp, prompt=list(input_ids), stream=stream, return_token_ids=True,
                        return_tokens_as_token_ids=True)
            if self.model is None:
                self.model = await self._served_name()
        if self.model is not None:
            body["model"] = self.model
        if self.lora_name is not None:
            body["model"] = self.lora_name
        if rid is not None:
            body["request_id"] = rid
        if priority is not None and self.send_priority:
            body["priority"] = -int(priority)
        return body

    async def _served_name(self) -> str | None:
        try:  # bounded like a first byte: a stopped server must not hold the call longer
            data = (await self._get("/v1/models", self.timeouts.first_byte_s)).get("data") or []
        except EngineError:
            return None
        return str(data[0]["id"]) if data and isinstance(data[0], dict) and "id" in data[0] else None

    def _build(self, payload: dict) -> httpx.Request:
        # connect bounded by httpx; reads by asyncio deadlines (they see a whole stalled exchange)
        return self._http.build_request("POST", self.path, json=payload,
                                        timeout=httpx.Timeout(None, connect=self.timeouts.connect_s))

    def _status_error(self, resp: httpx.Response, url: str) -> EngineError:
        try:
            msg = error_message(resp.json())
        except ValueError:
            msg = None
        msg = msg or resp.text.strip()[:500]
        return EngineError(f"vLLM at {url} answered HTTP {resp.status_code}: {msg}", resp.status_code)

    def _choice(self, body: Any, url: str) -> dict:
        msg = error_message(body)
        if msg is not None:
            raise EngineError(f"vLLM at {url} error: {msg}")
        try:
            return body["choices"][0]
        except (KeyError, IndexError, TypeError) as e:
            raise EngineError(f"vLLM at {url} sent an unreadable reply (no choices[0]): {str(body)[:300]}") from e

    def _read(self, choice: dict, url: str) -> tuple[list[int], list[float]]:
        try:
            return read_choice(choice, self.route)
        except (ValueError, TypeError, AttributeError) as e:
            raise EngineError(f"vLLM at {url} sent an unreadable choice ({e}): {str(choice)[:300]}") from e

    # ---- generation -----------------------------------------------------------------
    async def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, top_k: int = -1, stop_token_ids: list[int] | None = None,
                       rid: str | None = None, seed: int | None = None,
                       priority: int | None = None) -> GenerateResult:
        """One non-streamed request; cancelling it closes the connection, which aborts it in vLLM."""
        version = self.weight_version
        payload = await self._payload(input_ids, max_new_tokens, temperature, top_p, top_k, stop_token_ids, rid,
                                      seed, priority, False)
        url = self.base_url + self.path
        try:
            async with within(self.timeouts.total_s, "total", url):
                resp = await self._http.send(self._build(payload))
        except httpx.ConnectTimeout as e:
            raise EngineTimeout(f"vLLM at {url} timed out connecting (EngineTimeouts.connect_s): {e}",
                                "connect") from e
        except httpx.HTTPError as e:
            raise EngineError(f"vLLM at {url} unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise self._status_error(resp, url)
        body = _json(resp, url)
        choice = self._choice(body, url)
        ids, lps = self._read(choice, url)
        return GenerateResult(ids, lps, _finish(choice.get("finish_reason") or "stop", url),
                              reply_version(body, resp.headers) or version, len(input_ids),
                              str(choice.get("text") or ""))

    async def generate_stream(self, input_ids: list[int], *, max_new_tokens: int, temperature: float = 1.0,
                              top_p: float = 1.0, top_k: int = -1, stop_token_ids: list[int] | None = None,
                              rid: str | None = None, seed: int | None = None,
                              priority: int | None = None) -> AsyncIterator[GenerateResult]:
        """vLLM's SSE: each item holds only new ids/logprobs; the last one is finished."""
        version = self.weight_version
        payload = await self._payload(input_ids, max_new_tokens, temperature, top_p, top_k, stop_token_ids, rid,
                                      seed, priority, True)
        url = self.base_url + self.path
        left = StreamBudget(self.timeouts).left
        resp, finished, done = None, False, False
        try:
            async with within(*left("first_byte"), url):
                resp = await self._http.send(self._build(payload), stream=True)
            if resp.status_code >= 400:
                async with within(*left("idle"), url):
                    await resp.aread()
                raise self._status_error(resp, url)
            lines = resp.aiter_lines().__aiter__()
            got = False
            while not finished:
                try:
                    async with within(*left("idle" if got else "first_byte"), url):
                        line = await lines.__anext__()
                except StopAsyncIteration:
                    break
                if not line.startswith("data:"):
                    continue
                got, data = True, line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    body = json.loads(data)
                except ValueError as e:
                    raise EngineError(f"vLLM at {url} sent an unreadable stream chunk: {data[:200]!r}") from e
                if not body.get("choices") and error_message(body) is None:
                    continue  # a usage-only chunk
                choice = self._choice(body, url)
                ids, lps = self._read(choice, url)
                reason = _finish(choice.get("finish_reason"), url)
                finished = bool(reason)
                if ids or finished:
                    yield GenerateResult(ids, lps, reason, reply_version(body, resp.headers) or version,
                                         len(input_ids), str(choice.get("text") or ""))
        except httpx.ConnectTimeout as e:
            raise EngineTimeout(f"vLLM at {url} timed out connecting (EngineTimeouts.connect_s): {e}",
                                "connect") from e
        except httpx.HTTPError as e:
            raise EngineError(f"vLLM at {url} unreachable: {type(e).__name__}: {e}") from e
        finally:
            if resp is not None:
                await resp.aclose()
        if not finished:
            if not done:
                raise EngineError(f"vLLM at {url} ended the stream without a finish_reason or [DONE]")
            # [DONE] without a finish reason: aborted between two tokens (no chunk is sent without new ones)
            yield GenerateResult([], [], "abort", version, len(input_ids))

    # ---- control --------------------------------------------------------------------
    async def _get(self, path: str, limit: float | None = None) -> dict:
        url = self.base_url + path
        try:
            resp = await bounded(self._http.get(path), min(limit or self.timeout, self.timeout), "total", url)
        except httpx.HTTPError as e:
            raise EngineError(f"vLLM at {url} unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise self._status_error(resp, url)
        body = _json(resp, url)
        return body if isinstance(body, dict) else {"result": body}

    async def health(self) -> bool:
        """GET /health: True on 200; False on an error, a refusal, or no answer within the first-byte bound."""
        t = self.timeouts
        try:
            resp = await bounded(self._http.get("/health", timeout=httpx.Timeout(None, connect=t.connect_s)),
                                  t.first_byte_s, "first_byte", self.base_url + "/health")
        except (httpx.HTTPError, EngineTimeout):
            return False
        return resp.status_code == 200

    async def model_info(self) -> dict[str, Any]:
        """From GET /v1/models: model_path (the served name), max_context_length, logprob_space."""
        data = (await self._get("/v1/models")).get("data") or [{}]
        card = data[0] if isinstance(data[0], dict) else {}
        space = card.get("logprob_space") or {"processed_logprobs": "sampled"}.get(self.logprobs_mode, "raw")
        return {"model_path": card.get("id"), "max_context_length": card.get("max_model_len"),
                "logprob_space": space, "backend": "vllm", "route": self.route,
                "weight_version": self.weight_version}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "VllmBackend":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
