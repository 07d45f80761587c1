"""The trajectory record: what every trainer consumes.

One session (episode) is a list of segments. A segment is one growing token sequence: the
prompt of its first call, then each call's sampled completion and the templated suffix the
harness appended before the next call. `loss_mask` is 1 exactly on sampled tokens; those
tokens carry the engine's logprob and the policy version that sampled them. A new segment
starts when the harness rewrote its history (the token prefix broke); nothing is dropped.

A call record stores its prompt as a delta against its segment: the first
`prompt_prefix_len` tokens of `segments[segment].token_ids`, then `new_prompt_ids`. A
session's record (and its JSON export) is therefore linear in its tokens, not in calls x
tokens; `Trajectory.call_prompt(c)` (or `c.prompt_ids` on a record that belongs to a
Trajectory) rebuilds the exact ids the engine was sent.

A *detached* call (`flags["detached"]`: "engine_error", "undelivered", "proxy_error") is
in `calls` but extends no segment: the engine failed (`finish_reason` "engine_error", no
completion tokens, `flags["engine_error"]` says why), the harness never received the reply
(`flags["undelivered"]`), or the proxy itself failed the call (`flags["proxy_error"]`). Its completion tokens (if any) appear in no segment, so no
trainer ever sees them with loss mask 1.
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
    """Why this segment started (None for the first): e.g. "history_rewrite", "template_mismatch",
    "spawned" (a sub-agent's or side conversation started by a tool call of another segment),
    "compaction_summary" (the harness's own request to summarize its conversation), "compaction"
    (the conversation going on from that summary)."""
    call_ids: list[str] = field(default_factory=list)
    spawned_by: dict[str, Any] | None = None
    """For a spawned segment: {"segment": the parent segment's index in this trajectory,
    "call_id": the parent's call whose tool call started it, "tool": the tool's name,
    "tool_call_id": that tool call's id as the parent's history holds it: the proxy's
    `call_<hex>` while the reply is the last message, else as the harness echoed it back,
    e.g. Anthropic's `toolu_<hex>`}. Each conversation of an episode is its own lineage of
    segments; all are trained with the episode's reward."""
    compacted_from: dict[str, Any] | None = None
    """For a segment whose reason is "compaction" (the harness compacted its context and went on
    from its own summary): {"segment": the segment of the summary call, "call_id": that call}.
    A summary call alone in its segment makes that segment's reason "compaction_summary". Both
    are trained with the episode's reward, like every segment."""

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
    """The proxy module that parsed the call (`openai_chat`, `openai_responses`, `anthropic_messages`,
    `gemini`: the target of its dialect in `harnessrl.registry.DIALECTS`, as stored trajectories say)."""
    prompt_prefix_len: int
    """How many leading tokens of its segment the prompt reuses (0: the prompt is all new)."""
    new_prompt_ids: list[int]
    """The prompt tokens after that prefix (the templated messages new in this call)."""
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    """stop | length | abort | tool_calls ...; "engine_error" for a failed engine call."""
    segment: int
    queue_s: float = 0.0
    gen_s: float = 0.0
    env_s: float | None = None
    """Harness/env time since the session's previous response (None on the first call)."""
    finished_at: float = 0.0
    """Wall-clock time (epoch seconds) the call was recorded; generation ran in [finished_at - gen_s, finished_at]."""
    flags: dict[str, Any] = field(default_factory=dict)

    @property
    def detached(self) -> bool:
        """True when this call extends no segment (engine error, undelivered, proxy error)."""
        return bool(self.flags.get("detached"))

    def prompt(self, segment_token_ids: list[int]) -> list[int]:
        """The full prompt, given its segment's token ids."""
        if len(segment_token_ids) < self.prompt_prefix_len:
            raise ValueError(f"call {self.call_id}: reuses {self.prompt_prefix_len} tokens of a segment "
                             f"of {len(segment_token_ids)}")
        return segment_token_ids[:self.prompt_prefix_len] + self.new_prompt_ids

    @property
    def prompt_ids(self) -> list[int]:
        """The full prompt (rebuilt on each access; needs the record to belong to a Trajectory)."""
        if self.prompt_prefix_len == 0:
            return list(self.new_prompt_ids)
        seg = getattr(self, "_segment_ref", None)
        if seg is None:
            raise ValueError(f"call {self.call_id} is not attached to its trajectory's segments; "
                             "use Trajectory.call_prompt")
        return self.prompt(seg.token_ids)


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

    def __post_init__(self) -> None:
        for c in self.calls:  # so that c.prompt_ids can rebuild the prompt from the delta
            if c.prompt_prefix_len and 0 <= c.segment < len(self.segments):
                c._segment_ref = self.segments[c.segment]

    def call_prompt(self, c: CallRecord) -> list[int]:
        """The exact prompt ids call `c` sent to the engine."""
        if c.prompt_prefix_len == 0:
            return list(c.new_prompt_ids)
        return c.prompt(self.segments[c.segment].token_ids)

    @property
    def delivered_calls(self) -> list[CallRecord]:
        """The calls whose reply the harness received (not detached)."""
        return [c for c in self.calls if not c.detached]

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
        for c in self.calls:
            if not c.prompt_prefix_len:
                continue
            if not 0 <= c.segment < len(self.segments):
                raise ValueError(f"trajectory {self.session_id} call {c.call_id}: reuses a prefix of segment "
                                 f"{c.segment}, which does not exist")
            if c.prompt_prefix_len > len(self.segments[c.segment].token_ids):
                raise ValueError(f"trajectory {self.session_id} call {c.call_id}: reuses {c.prompt_prefix_len} "
                                 f"tokens of segment {c.segment}, which has fewer")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["segments"] = [Segment(**s) for s in d.get("segments", [])]
        d["calls"] = [CallRecord(**_delta_call(c)) for c in d.get("calls", [])]
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _delta_call(c: dict[str, Any]) -> dict[str, Any]:
    """A call dict in the delta shape; records written before it carried full `prompt_ids`."""
    if "prompt_ids" in c:
        c = dict(c)
        c["new_prompt_ids"], c["prompt_prefix_len"] = c.pop("prompt_ids"), 0
    return c
