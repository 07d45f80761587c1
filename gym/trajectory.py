"""The trajectory record: what every trainer consumes.

One session (episode) is a list of segments. A segment is one growing token sequence: the
prompt of its first call, then each call's sampled completion and the templated suffix the
harness appended before the next call. `loss_mask` is 1 exactly on sampled tokens; those
tokens carry the engine's logprob and the policy version that sampled them. A new segment
starts when the harness rewrote its history (the token prefix broke); nothing is dropped.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

#: Episode statuses. Only "ok" and "truncated" episodes are trained on; "infra_error"
#: episodes are masked (never scored 0).
STATUSES = ("ok", "truncated", "infra_error", "running")


@dataclass
class Segment:
    token_ids: list[int]
    loss_mask: list[int]
    """1 on tokens the policy sampled, 0 on prompt/template/tool tokens."""
    logprobs: list[float]
    """Engine logprob of each sampled token; 0.0 where loss_mask is 0."""
    versions: list[int]
    """Policy version that sampled each token; -1 where loss_mask is 0."""
    split_reason: str | None = None
    """Why this segment started (None for the first): e.g. "history_rewrite", "template_mismatch"."""
    call_ids: list[str] = field(default_factory=list)

    def validate(self) -> None:
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"segment {name} has length {len(getattr(self, name))}, token_ids has {n}")
        for i, (m, v) in enumerate(zip(self.loss_mask, self.versions)):
            if m not in (0, 1):
                raise ValueError(f"segment loss_mask[{i}] is {m!r}, must be 0 or 1")
            if m == 1 and v < 0:
                raise ValueError(f"segment token {i} is sampled (mask 1) but has no policy version")


@dataclass
class CallRecord:
    """One model call as the proxy saw it."""

    call_id: str
    session_id: str
    index: int
    dialect: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    segment: int
    queue_s: float = 0.0
    gen_s: float = 0.0
    env_s: float | None = None
    """Harness/env time since the session's previous response (None on the first call)."""
    finished_at: float = 0.0
    """Wall-clock time (epoch seconds) the call was recorded; generation ran in [finished_at - gen_s, finished_at]."""
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    session_id: str
    segments: list[Segment]
    reward: float | None = None
    status: str = "running"
    termination: str = ""
    """Why the episode ended: submitted, harness_exited, call_limit, timeout, harness_crashed,
    sandbox_died, engine_error, ..."""
    task_id: str = ""
    harness: str = ""
    model: str = ""
    chat_template_hash: str = ""
    calls: list[CallRecord] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def trainable(self) -> bool:
        return self.status in ("ok", "truncated") and self.reward is not None

    def validate(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"trajectory {self.session_id}: status {self.status!r} not in {STATUSES}")
        for i, seg in enumerate(self.segments):
            try:
                seg.validate()
            except ValueError as e:
                raise ValueError(f"trajectory {self.session_id} segment {i}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["segments"] = [Segment(**s) for s in d.get("segments", [])]
        d["calls"] = [CallRecord(**c) for c in d.get("calls", [])]
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())
