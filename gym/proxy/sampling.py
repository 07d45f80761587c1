"""Who decides how a call samples, and the record of what it did.

Contract: under `sampling_policy = "run"` (default) every call samples at the run's
`temperature` / `top_p` / `top_k` (ProxyConfig) whatever the harness sends: the behaviour
policy is the run's, so every member of a GRPO group samples from the same distribution and
a harness that asks for temperature 0 (aider) cannot make its group degenerate. Under
`"honor"` each valid harness value wins and absent ones take the run's; an invalid one
(a negative temperature, top_p outside (0, 1], a non-integer top_k) is ignored in favour
of the run's value, and the record says so. `top_k` 0 or -1 from a harness means "off".

Every recorded call carries `flags["sampling"]`:
  {"policy": "run" | "honor", "temperature": T, "top_p": p, "top_k": k,
   "logprobs": "sampled" | "tempered" | "raw", "requested": {...what the harness sent...},
   "ignored": [fields], (only when some were)}
with the EFFECTIVE values sent to the engine and, in "logprobs", which distribution the
recorded logprobs belong to (`harnessrl.trainers.engine.sampling`): "sampled" (the
filtered, renormalized distribution at T that was sampled from: the local engine) or
"tempered" (log_softmax(logits / T) before top-p/top-k: SGLang's default). With
`engine_logprobs = "auto"` the proxy asks the engine once (`/get_model_info` field
`logprob_space`); an engine that does not say (SGLang) is "tempered". Temperature 0 is
recorded as 0: greedy data, which trainers refuse.
"""
from __future__ import annotations

import asyncio
import math
from typing import Any

from harnessrl.gym.backends.engine_client import EngineError, EngineTimeout
from .canonical import ChatRequest
from .config import ProxyConfig


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _requested(x: Any) -> Any:
    """A harness value as it may be stored: numbers and null as they are, anything else as short text."""
    if x is None or isinstance(x, bool) or _number(x) is not None:
        return x
    return repr(x)[:40]


GROUP_SPAN = 1 << 20
"""Groups one policy version's priority band holds: the engine priority is
-(oldest version * GROUP_SPAN + group id), the group id capped at GROUP_SPAN - 1 (absent: 0)."""


def priority(oldest: int | None, meta: dict[str, Any]) -> int | None:
    """A call's engine priority, higher first: the session's oldest policy version (else its
    meta's `start_version`), then the oldest group (`GROUP_SPAN`); None without a version."""
    if oldest is None:
        oldest = meta.get("start_version")
    if not isinstance(oldest, int) or isinstance(oldest, bool):
        return None
    group = meta.get("group_id")
    group = min(group, GROUP_SPAN - 1) if isinstance(group, int) and not isinstance(group, bool) else 0
    return max(-(1 << 63), -(oldest * GROUP_SPAN + group))  # an int64 for any engine


class SamplingPolicy:
    """Resolves each call's effective sampling parameters and the engine's logprob space."""

    def __init__(self, config: ProxyConfig):
        self.config = config
        self._space: str | None = None if config.engine_logprobs == "auto" else config.engine_logprobs

    def engine_params(self, req: ChatRequest, stop_token_ids: list[int]) -> tuple[dict[str, Any], list[str]]:
        """A call's engine sampling params (max_new_tokens capped, temperature/top_p/top_k by
        `sampling_policy`, stop ids, seed when honoured) and the harness fields ignored as invalid."""
        c = self.config
        mt = req.max_tokens if isinstance(req.max_tokens, int) and req.max_tokens > 0 else c.default_max_tokens
        sampling, ignored = self.effective(req)
        return {"max_new_tokens": min(mt, c.max_tokens_cap), **sampling, "stop_token_ids": stop_token_ids,
                "seed": req.seed if c.honor_seed and isinstance(req.seed, int) else None}, ignored

    def effective(self, req: ChatRequest) -> tuple[dict[str, Any], list[str]]:
        """{"temperature", "top_p", "top_k"} to send, and the harness fields ignored as invalid."""
        c = self.config
        out: dict[str, Any] = {"temperature": c.temperature, "top_p": c.top_p, "top_k": c.top_k}
        ignored: list[str] = []
        if c.sampling_policy != "honor":
            return out, ignored
        t, p, k = req.temperature, req.top_p, req.top_k
        if t is not None:
            if (v := _number(t)) is not None and v >= 0:
                out["temperature"] = v
            else:
                ignored.append("temperature")
        if p is not None:
            if (v := _number(p)) is not None and 0 < v <= 1:
                out["top_p"] = v
            else:
                ignored.append("top_p")
        if k is not None:
            if isinstance(k, int) and not isinstance(k, bool) and k >= -1:
                out["top_k"] = k if k >= 1 else -1
            else:
                ignored.append("top_k")
        return out, ignored

    async def space(self, engine) -> str:
        """The engine's logprob space, asked once; EngineError if the engine cannot be reached."""
        if self._space is None:
            # bounded like a generation's first byte: a stopped engine must fail the call, not hold it
            limit = getattr(getattr(engine, "timeouts", None), "first_byte_s", None)
            try:
                try:
                    info = await asyncio.wait_for(engine.model_info(), limit)
                except asyncio.TimeoutError:
                    raise EngineTimeout(f"engine at {engine.base_url} timed out: no /get_model_info reply within "
                                        f"{limit:g} s (EngineTimeouts.first_byte_s)", "first_byte") from None
                reported = info.get("logprob_space")
            except EngineError as e:
                if e.status_code is None or e.status_code >= 500:
                    raise  # unreachable or failing: the call fails like a failed generation
                reported = None  # answers, but has no such route: not the local engine
            self._space = reported if reported in ("sampled", "tempered", "raw") else "tempered"
        return self._space

    def record(self, req: ChatRequest, params: dict[str, Any], space: str, ignored: list[str]) -> dict[str, Any]:
        """The call's `flags["sampling"]` (module doc)."""
        rec: dict[str, Any] = {
            "policy": self.config.sampling_policy,
            "temperature": float(params["temperature"]), "top_p": float(params["top_p"]),
            "top_k": int(params["top_k"]), "logprobs": space,
            "requested": {"temperature": _requested(req.temperature), "top_p": _requested(req.top_p),
                          "top_k": _requested(req.top_k)},
        }
        if ignored:
            rec["ignored"] = ignored
        return rec
