"""The one encoder of SGLang's `/generate` reply shape (../shared/docs/sglang-contract.md).

Every in-tree server that speaks the contract (the local engine, the stand-in engine and
the scripted policy in `gym/doubles/`, the gym env's bridge) builds its bodies here, so
the shape the proxy's client reads (`gym/backends/engine_client.py`) is written in one place.
"""
from __future__ import annotations

from typing import Any, Sequence


def finish_reason(kind: str | None, matched: int | str | None = None, length: int | None = None) -> dict | None:
    """SGLang's `meta_info.finish_reason`: None while running, else {"type": kind, ...}."""
    if not kind:
        return None
    fr: dict[str, Any] = {"type": kind}
    if kind == "stop" and matched is not None:
        fr["matched"] = matched
    if kind == "length" and length is not None:
        fr["length"] = length
    return fr


def sglang_reply(*, rid: str, output_ids: Sequence[int], logprobs: Sequence[float | None] | None,
                 finish: dict | str | None, prompt_tokens: int, weight_version: str, text: str = "",
                 completion_tokens: int | None = None, cached_tokens: int = 0,
                 token_texts: Sequence[str | None] | None = None, **meta_extra: Any) -> dict:
    """One reply body (or one stream chunk) over `output_ids`.

    `logprobs` None omits `output_token_logprobs` (the client then falls back to
    `output_ids`); a None entry is a token without a logprob. `finish` is a finish-reason
    dict, a bare kind ("stop" / "length" / "abort"), or None for an unfinished chunk.
    `completion_tokens` is the count so far (cumulative streams: all of `output_ids`).
    """
    if isinstance(finish, str):
        finish = finish_reason(finish, length=len(output_ids) if finish == "length" else None)
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(output_ids) if completion_tokens is None else completion_tokens,
        "cached_tokens": cached_tokens,
        "weight_version": weight_version,
    }
    if logprobs is not None:
        texts = token_texts if token_texts is not None else [None] * len(output_ids)
        meta["output_token_logprobs"] = [[lp, int(t), tx] for lp, t, tx in zip(logprobs, output_ids, texts)]
    meta.update(meta_extra)
    return {"text": text, "output_ids": list(output_ids), "meta_info": meta}
