"""Which distribution each sampled token's recorded logprob belongs to, read from the record.

Contract: the proxy records every call's effective sampling in `flags["sampling"]`
(`harnessrl.gym.proxy.sampling`): temperature, top_p, top_k and `logprobs`, the space its
engine reported ("sampled" or "tempered", `harnessrl.trainers.engine.sampling`). A trainer
must score each token in exactly that distribution, per call: a trajectory can mix
temperatures across calls. `token_sampling` turns one trajectory into per-token SCORING
parameters (temperature, top_p, top_k) for `engine.sampling.processed_logprobs`:

- "sampled": the recorded (T, top_p, top_k): the filtered, renormalized distribution the
  token was drawn from; the importance ratio is then against the true behaviour policy.
- "tempered" (SGLang's default): (T, 1.0, -1), the tempered distribution before filtering,
  the only thing such logprobs can be compared with. With top-p/top-k on this is not the
  behaviour policy (the ratio ignores the filter); without them the two spaces coincide.
- "raw" (vLLM's default `raw_logprobs`): (1.0, 1.0, -1), the model's own distribution before
  temperature and filters; the behaviour policy only when sampling was at T = 1 unfiltered.

Refused with a `RecordError` naming the field (`calls[j].flags.sampling.<name>`): a call
without a sampling record, values out of range, an unknown space, and greedy data
(temperature 0, or top_k 1): a point mass has no importance ratio, and the recorded
logprobs of a greedy call are a score, not a probability of what was sampled. A record
without any call (hand-built segments, no proxy) is scored at `fallback_temperature`
without filters: the trainer's own `temperature`.
"""
from __future__ import annotations

import math
from typing import Any

from harnessrl.gym.trajectory import CallRecord, Trajectory
from harnessrl.trainers.engine.sampling import LOGPROB_SPACES as ENGINE_SPACES
from harnessrl.trainers.records import RecordError

#: The spaces a record's logprobs can be in: the local engine's two, and vLLM's raw logprobs.
LOGPROB_SPACES: tuple[str, ...] = (*ENGINE_SPACES, "raw")

#: Scoring parameters of positions that are not sampled (never used by the loss).
NEUTRAL = (1.0, 1.0, -1)


def _error(sid: str, message: str, field: str) -> RecordError:
    return RecordError(sid, message, field=field)


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
        return None
    return float(x)


def _completion_start(c: CallRecord) -> int:
    """Where the call's completion starts in its segment: right after its prompt, stored as
    a delta (`prompt_prefix_len` tokens of the segment, then `new_prompt_ids`)."""
    return c.prompt_prefix_len + len(c.new_prompt_ids)


def call_scoring(sid: str, j: int, call: CallRecord) -> tuple[float, float, int]:
    """The (temperature, top_p, top_k) to score call `j`'s sampled tokens with (module doc)."""
    where = f"calls[{j}].flags.sampling"
    rec = call.flags.get("sampling") if isinstance(call.flags, dict) else None
    if not isinstance(rec, dict):
        raise _error(sid, f"missing: call {call.call_id!r} does not say how it sampled (temperature, top_p, top_k, "
                          "logprobs), so its logprobs cannot be recomputed; record it through the harnessrl proxy", where)
    t, p, k, space = rec.get("temperature"), rec.get("top_p"), rec.get("top_k"), rec.get("logprobs")
    if _number(t) is None or t < 0:
        raise _error(sid, f"{t!r} is not a temperature (a finite number >= 0)", where + ".temperature")
    if t == 0:
        raise _error(sid, "is 0: greedy data; a point mass has no importance ratio, so it cannot be trained on "
                          "(sample at temperature > 0: the proxy's default sampling_policy 'run' does)", where + ".temperature")
    if _number(p) is None or not 0 < p <= 1:
        raise _error(sid, f"{p!r} is not a top_p in (0, 1]", where + ".top_p")
    if isinstance(k, bool) or not isinstance(k, int) or (k < 1 and k != -1):
        raise _error(sid, f"{k!r} is not a top_k (-1 or an integer >= 1)", where + ".top_k")
    if k == 1:
        raise _error(sid, "is 1: greedy data; a point mass has no importance ratio, so it cannot be trained on",
                     where + ".top_k")
    if space not in LOGPROB_SPACES:
        raise _error(sid, f"{space!r} is not a logprob space this trainer can recompute ({', '.join(LOGPROB_SPACES)})",
                     where + ".logprobs")
    if space == "raw":
        return NEUTRAL
    return (float(t), float(p), k) if space == "sampled" else (float(t), 1.0, -1)


def token_sampling(traj: Trajectory, fallback_temperature: float) -> list[list[tuple[float, float, int]]]:
    """Per segment, per token: the scoring (temperature, top_p, top_k); NEUTRAL off the sampled tokens.

    Each call's completion sits right after its prompt in its segment (the store builds
    segments that way); a call whose completion is not there, or a sampled token that no
    call covers, is a `RecordError`.
    """
    sid = traj.session_id
    if not traj.calls:
        return [[(fallback_temperature, 1.0, -1) if m else NEUTRAL for m in seg.loss_mask] for seg in traj.segments]
    out = [[NEUTRAL] * len(seg.token_ids) for seg in traj.segments]
    covered = [[False] * len(seg.token_ids) for seg in traj.segments]
    for j, c in enumerate(traj.calls):
        n = len(c.completion_ids)
        if n == 0 or (isinstance(c.flags, dict) and c.flags.get("detached")):
            continue  # a detached call (engine error, undelivered, refused) extends no segment
        s = c.segment
        if not isinstance(s, int) or not 0 <= s < len(traj.segments):
            raise _error(sid, f"{s!r} is not a segment of this trajectory", f"calls[{j}].segment")
        seg, start = traj.segments[s], _completion_start(c)
        if seg.token_ids[start:start + n] != list(c.completion_ids):
            raise _error(sid, f"the completion of call {c.call_id!r} is not at position {start} of segment {s}",
                         f"calls[{j}].completion_ids")
        params = call_scoring(sid, j, c)
        for i in range(start, start + n):
            out[s][i], covered[s][i] = params, True
    for s, seg in enumerate(traj.segments):
        for i, m in enumerate(seg.loss_mask):
            if m and not covered[s][i]:
                raise _error(sid, f"segment {s} token [{i}] is sampled (loss_mask 1) but no call's completion holds it, "
                                  "so its sampling is unknown", "calls")
    return out
