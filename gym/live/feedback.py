"""A reward that arrives after a live session: the one validation of a feedback body, and how
it is recorded (used by the admin route and by `harnessrl feedback` on a stopped server).

Contract: the body is a JSON object with `reward` (a number in [0, 1]; not a bool, not NaN)
and optionally `note` (a string of at most `NOTE_MAX` characters); any other field is
refused, naming it. Recording sets the session's reward with status "ok" and termination
"feedback", merges `meta["feedback"] = {reward, note, at}` (epoch seconds, what
`trainers.live`'s `min_reward_age_s` reads) and closes the session: the reward judges what
was recorded up to then, and no later call can join it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

NOTE_MAX = 4096
"""Longest feedback note accepted (characters)."""


class FeedbackError(ValueError):
    """A malformed feedback body; `field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Feedback:
    reward: float
    note: str = ""


def parse_feedback(body: Any) -> Feedback:
    """A validated `Feedback` from a decoded JSON body; `FeedbackError` naming the field otherwise."""
    if body.__class__ is not dict:
        raise FeedbackError("body", f"must be a JSON object with a reward, got {type(body).__name__}")
    extra = sorted(set(body) - {"reward", "note"})
    if extra:
        raise FeedbackError(extra[0], "unknown field (a feedback body has reward and note)")
    if "reward" not in body:
        raise FeedbackError("reward", "missing (a number in [0, 1])")
    r = body["reward"]
    if r.__class__ not in (int, float) or not math.isfinite(r) or not 0.0 <= r <= 1.0:
        raise FeedbackError("reward", f"must be a number in [0, 1], got {repr(r)[:60]}")
    note = body.get("note", "")
    if note is None:
        note = ""
    if note.__class__ is not str or len(note) > NOTE_MAX:
        raise FeedbackError("note", f"must be a string of at most {NOTE_MAX} characters")
    return Feedback(float(r), note)


def record_feedback(store: Any, sid: str, fb: Feedback, now: float | None = None) -> dict[str, Any]:
    """Write `fb` for session `sid` into `store` (a `gym.proxy.Store`): reward, status "ok",
    termination "feedback", `meta["feedback"]`, closed. KeyError for an unknown session."""
    at = time.time() if now is None else now
    store.update_meta(sid, {"feedback": {"reward": fb.reward, "note": fb.note, "at": at}})  # KeyError first
    store.set_reward(sid, fb.reward, "ok", "feedback")
    store.close_session(sid)
    return {"session_id": sid, "reward": fb.reward, "at": at, "closed": True}
