"""vLLM's two token routes, both directions: the reply encoders and the reply readers.

- `POST /inference/v1/generate` (vLLM's tokens-in/tokens-out route,
  `vllm/entrypoints/serve/disagg`): `{"token_ids", "sampling_params", "request_id", "stream"}`
  -> `{"request_id", "choices": [{"index", "token_ids", "finish_reason", "logprobs":
  {"content": [{"token": "token_id:N", "logprob", "top_logprobs"}]}}], "usage"}`. Streamed,
  every `data:` chunk holds only the new `token_ids` (chunks without new tokens are not sent),
  then `data: [DONE]`.
- `POST /v1/completions` with a token-id `prompt`, `return_token_ids: true` and `logprobs`:
  `choices[0].token_ids` and `choices[0].logprobs.token_logprobs` (+ `tokens`, `text_offset`,
  `top_logprobs`); streamed chunks carry the new ids in `token_ids`; the finishing chunk is
  sent even when it adds none.

Finish reasons are vLLM's strings ("stop", "length", "abort"; "error" is a failed request).
vLLM puts no weight version in its replies; a server that knows it (the local engine) adds a
top-level `weight_version`, which `reply_version` reads (also from a choice or the
`x-weight-version` header). The local engine (`trainers/engine/vllm_api.py`) renders its
replies here and `VllmBackend` (`vllm.py`) reads them here, so the shape is written once.
"""
from __future__ import annotations

import math
import time
from typing import Any, Mapping, Sequence

#: vLLM clamps -inf logprobs to this in JSON replies.
MIN_LOGPROB = -9999.0


def _lp(x: float) -> float:
    return max(float(x), MIN_LOGPROB) if not math.isnan(x) else MIN_LOGPROB


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


# ---- encoders (the local engine) ------------------------------------------------------

def generate_logprobs(ids: Sequence[int], logprobs: Sequence[float],
                      tops: Sequence[Sequence[tuple[float, int]]], num: int) -> dict:
    """`choices[i].logprobs` of the generate route: the sampled token, then up to `num` top ones."""
    content = []
    for j, (t, lp) in enumerate(zip(ids, logprobs)):
        alts = [(lp, t)] + [(a, b) for a, b in (tops[j] if j < len(tops) else []) if b != t]
        content.append({"token": f"token_id:{t}", "logprob": _lp(lp), "bytes": None,
                        "top_logprobs": [{"token": f"token_id:{b}", "logprob": _lp(a), "bytes": None}
                                         for a, b in alts[: max(num, 1)]]})
    return {"content": content}


def generate_reply(*, request_id: str, model: str, token_ids: Sequence[int], logprobs: dict | None,
                   finish_reason: str | None, prompt_tokens: int, completion_tokens: int,
                   weight_version: str | None = None, stream: bool = False) -> dict:
    """One generate-route body (or, `stream`, one chunk whose `token_ids` are the new ones)."""
    body: dict[str, Any] = {"id": request_id, "request_id": request_id, "created": int(time.time()),
                            "model": model,
                            "choices": [{"index": 0, "logprobs": logprobs, "finish_reason": finish_reason,
                                         "token_ids": list(token_ids)}]}
    if not stream:
        body["usage"] = _usage(prompt_tokens, completion_tokens)
        body["prompt_logprobs"] = None
        body["kv_transfer_params"] = None
    if weight_version is not None:
        body["weight_version"] = weight_version
    return body


def completion_logprobs(ids: Sequence[int], logprobs: Sequence[float], texts: Sequence[str],
                        tops: Sequence[Sequence[tuple[float, int]]], num: int, offset0: int,
                        name: Any) -> dict:
    """`choices[i].logprobs` of /v1/completions; `name(id)` spells a token (text or "token_id:N")."""
    offsets, at = [], offset0
    for tx in texts:
        offsets.append(at)
        at += len(tx)
    top = None
    if num > 0:
        top = []
        for j, (t, lp) in enumerate(zip(ids, logprobs)):
            d = {name(t): _lp(lp)}
            for a, b in (tops[j] if j < len(tops) else []):
                if len(d) >= num + 1:
                    break
                d.setdefault(name(b), _lp(a))
            top.append(d)
    return {"text_offset": offsets, "token_logprobs": [_lp(x) for x in logprobs],
            "tokens": [name(t) for t in ids], "top_logprobs": top if top is not None else [None] * len(ids)}


def completion_reply(*, request_id: str, model: str, text: str, token_ids: Sequence[int] | None,
                     prompt_token_ids: Sequence[int] | None, logprobs: dict | None, finish_reason: str | None,
                     stop_reason: int | str | None, prompt_tokens: int, completion_tokens: int,
                     weight_version: str | None = None, stream: bool = False) -> dict:
    """One /v1/completions body (or stream chunk); ids only when the request set return_token_ids."""
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
                              "stop_reason": stop_reason}
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    if prompt_token_ids is not None:
        choice["prompt_token_ids"] = list(prompt_token_ids)
    body: dict[str, Any] = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": int(time.time()),
                            "model": model, "choices": [choice]}
    if not stream:
        body["usage"] = _usage(prompt_tokens, completion_tokens)
    if weight_version is not None:
        body["weight_version"] = weight_version
    return body


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """vLLM's `ErrorResponse`: `{"error": {"message", "type", "param", "code"}}`."""
    kind = {400: "BadRequestError", 401: "UnauthorizedError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# ---- readers (VllmBackend) ------------------------------------------------------------

def _token_id(name: Any) -> int:
    """A token spelled "token_id:N" (return_tokens_as_token_ids) as N."""
    if isinstance(name, str) and name.startswith("token_id:"):
        return int(name[9:])
    raise ValueError(f"token {name!r} is not spelled 'token_id:N' and the reply has no token_ids")


def _float(x: Any) -> float:
    return float("nan") if x is None else float(x)


def read_choice(choice: Mapping[str, Any], route: str) -> tuple[list[int], list[float]]:
    """Sampled ids and their logprobs from one choice of either route (NaN where none)."""
    lp = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if route == "generate":
        content = lp.get("content") or []
        if ids is None:
            ids = [_token_id(c.get("token")) for c in content]
        lps = [_float(c.get("logprob")) for c in content]
    else:
        if ids is None:
            ids = [_token_id(t) for t in lp.get("tokens") or []]
        lps = [_float(x) for x in lp.get("token_logprobs") or []]
    ids = [int(t) for t in ids]
    if len(lps) != len(ids):
        lps = [float("nan")] * len(ids)
    return ids, lps


def reply_version(body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> str | None:
    """The weight version a reply names, if any (vLLM's own replies name none)."""
    for where in (body, *(body.get("choices") or [])[:1]):
        v = where.get("weight_version") if isinstance(where, Mapping) else None
        if v is not None:
            return str(v)
    if headers is not None and headers.get("x-weight-version"):
        return str(headers["x-weight-version"])
    return None


def error_message(body: Any) -> str | None:
    """The message of a vLLM error body or stream chunk, else None. Shapes: `{"error": {...}}`
    (current), `{"object": "error", "message"}` (older), `{"detail": ...}` (FastAPI), `{"error": "..."}`."""
    if not isinstance(body, Mapping):
        return None
    err = body.get("error")
    if isinstance(err, Mapping):
        return str(err.get("message") or err)
    if err is not None:
        return str(err)
    if body.get("object") == "error":
        return str(body.get("message"))
    if "detail" in body and "choices" not in body:
        return str(body["detail"])
    return None
