"""Per-session token state: decides, for each call, the exact prompt ids and its segment.

Contract: when a request's messages start with the messages of a live segment (its last
request plus the reply the proxy returned, compared in canonical form), the prompt is that
segment's token sequence (previous prompt + sampled completion ids, untouched) plus the
rendered extension. Otherwise the conversation was rewritten and a new segment starts from
a full render, with the reason class: new_conversation, tools_changed, retry,
assistant_edited, truncation, summarization, edited, template_mismatch. Nothing is dropped:
every call's tokens stay in the store.

Several conversations in one episode (a sub-agent, Claude Code's Agent/Task tool; a side
request) are kept apart: each live segment is a branch, and a request extends whichever
branch it continues, so the main conversation resumes its own segment after a sub-agent ran.
A new conversation whose opening user text holds a string argument of a tool call in a live
branch's history was spawned by it: its segment's reason is "spawned" and `Plan.spawned_by`
names the parent segment, the tool call and which of the segment's calls made it.

A harness that compacts its own context (OpenCode, Codex CLI, Claude Code, ...) first asks
for a summary in a call of its own, then goes on with a history that holds that summary in
place of the conversation. The proxy recognises it by structure, after the fact: a request
that extends no branch and whose opening messages (before its first tool call) contain a live
branch's last reply verbatim, a plain text reply of at least `MIN_SUMMARY` characters,
starts a segment with the reason "compaction", and `Plan.compacted_from` names the summary's
segment and call (`summarizer`). A new conversation whose opening quotes a live branch's tool
results (a transcript handed to the summary call) is not taken for a sub-agent it spawned.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from .canonical import ChatRequest, Message
from .offload import HEAVY_BYTES, OFF_LOOP_BYTES, offload
from .render import OverBudget, Renderer, TemplateMismatch

INLINE_CHARS = 2048
"""Most characters of uncached text a call's plan may tokenize on the event loop (~1 ms);
a plan that needs more is made in a worker thread instead (`plan_call`)."""


@dataclass
class Branch:
    """The live end of one segment."""

    index: int
    history: list[Message]
    keys: list[tuple]
    tools_key: str
    tokens: list[int]
    completion_ids: list[int]
    finish_reason: str
    n_calls: int = 1
    """Calls committed to this segment: its last `n_calls` assistant messages are their replies."""


@dataclass
class Plan:
    prompt_ids: list[int]
    segment: int
    prefix_len: int
    split_reason: str | None
    branch: Branch | None
    keys: list[tuple]
    tools_key: str
    spawned_by: dict[str, Any] | None = None
    """For a spawned conversation: {"segment": parent segment, "tool": name, "tool_call_id": id,
    "call": the spawning reply's position among that segment's calls, or None} (`spawner`)."""
    compacted_from: dict[str, Any] | None = None
    """After a compaction: {"segment": the summary call's segment, "call": its position among
    that segment's calls} (`summarizer`)."""


@dataclass
class Session:
    id: str
    key: str
    meta: dict[str, Any]
    closed: bool = False
    branches: list[Branch] = field(default_factory=list)
    n_segments: int = 0
    n_calls: int = 0
    records: int = 0
    """Rows this session has in the store (delivered calls and detached ones: failed, undelivered)."""
    completion_tokens: int = 0
    last_response_at: float | None = None
    lock: asyncio.Lock | None = None
    oldest_version: int | None = None
    """The oldest policy version among the tokens sampled so far (None before any)."""
    aborted: str | None = None
    """Why the proxy stopped serving this session (every later call is refused with it)."""

    @classmethod
    def new(cls, meta: dict[str, Any]) -> "Session":
        return cls(id=secrets.token_hex(8), key="sk-hrl-" + secrets.token_urlsafe(24), meta=dict(meta))


def classify(prev: Branch | None, keys: list[tuple], tools_key: str) -> str | None:
    """Why a request does not extend the most recent segment."""
    if prev is None:
        return None
    if tools_key != prev.tools_key:
        return "tools_changed"
    old = prev.keys
    if keys == old[:-1]:
        return "retry"
    i = next((j for j, (a, b) in enumerate(zip(keys, old)) if a != b), min(len(keys), len(old)))
    if i == 0:
        return "new_conversation"
    if i == len(old) - 1 and len(keys) >= len(old):
        return "assistant_edited"
    olds = set(old)
    last = max((j for j, k in enumerate(keys) if k in olds), default=-1)
    head = keys[:last + 1]
    if head and head[-1] == old[-1] and len(head) < len(old) and all(k in olds for k in head):
        return "truncation"  # old messages dropped, the rest kept up to our last reply
    if len(keys) >= len(old):
        return "edited"  # nothing dropped, something changed in place
    return "summarization"  # old messages replaced by fewer, new ones


#: Shortest tool-call string argument that attributes a new conversation to its call (shorter
#: ones, like a file name, could appear in an unrelated first message by chance).
MIN_SPAWN_ARG = 16


def _strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj.strip()]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def _opening(messages: list[Message]) -> list[Message]:
    """The messages before the first assistant turn (a harness may split its first user turn
    into several, e.g. reminders before the prompt)."""
    i = next((j for j, m in enumerate(messages) if m.role == "assistant"), len(messages))
    return messages[:i]


#: Shortest reply taken for a summary when it reappears in a later conversation's opening
#: (a short final answer such as "Done." could be quoted by chance).
MIN_SUMMARY = 32


def summarizer(branches: list[Branch], messages: list[Message]) -> dict[str, Any] | None:
    """The live branch whose last reply is the summary this rewritten history goes on from:
    a plain text reply (no tool calls, >= MIN_SUMMARY characters) that reappears verbatim in
    a message before the request's first tool call (as the assistant turn OpenCode keeps, or
    inside the user turn Codex and Claude Code wrap it in). Failure modes: a harness that
    rewrites its summary before re-sending it is not recognised (the segment keeps the generic
    reason); one that quotes an earlier final answer at the top of an unrelated new
    conversation would be taken for a compaction."""
    end = next((j for j, m in enumerate(messages) if m.tool_calls), len(messages))
    texts = [m.content for m in messages[:end] if m.content]
    if not texts:
        return None
    for br in reversed(branches):
        reply = br.history[-1]
        summary = reply.content.strip()
        if reply.role == "assistant" and not reply.tool_calls and len(summary) >= MIN_SUMMARY \
                and any(summary in t for t in texts):
            return {"segment": br.index, "call": br.n_calls - 1}
    return None


def _quotes_results(br: Branch, text: str) -> bool:
    """Does `text` quote the start of one of the branch's tool results (a transcript of it)?"""
    return any(m.role == "tool" and len(m.content.strip()) >= MIN_SPAWN_ARG and m.content.strip()[:64] in text
               for m in br.history)


def spawner(branches: list[Branch], messages: list[Message]) -> dict[str, Any] | None:
    """The live branch and tool call this new conversation was started by, if any: its opening
    user text contains a (long enough) string argument of a tool call in that branch's
    history. The most recent such call wins: a harness may run the sub-agent in the background
    (Claude Code 2.1.3xx answers the tool call at once and the parent goes on), so the call
    need not still be waiting. `call` is that reply's position among the segment's calls
    (None when it came before the segment began)."""
    first = "\n".join(m.content for m in _opening(messages) if m.role == "user")
    if not first:
        return None
    for br in reversed(branches):
        found = _spawning_call(br, first)
        # a transcript of the branch (a summary request) is not a task for a sub-agent
        if found is not None and not _quotes_results(br, first):
            return found
    return None


def _spawning_call(br: Branch, first: str) -> dict[str, Any] | None:
    """The most recent tool call in `br` with a (long enough) string argument inside `first`."""
    if not any(m.tool_calls for m in br.history):
        return None  # most branches: no tool call, nothing to search
    replies = [m for m in br.history if m.role == "assistant"]
    for j in range(len(replies) - 1, -1, -1):
        for tc in replies[j].tool_calls:
            if any(len(a) >= MIN_SPAWN_ARG and a in first for a in _strings(tc.arguments_obj())):
                k = j - (len(replies) - br.n_calls)
                return {"segment": br.index, "tool": tc.name, "tool_call_id": tc.id, "call": k if k >= 0 else None}
    return None


def plan(session: Session, req: ChatRequest, renderer: Renderer) -> Plan:
    """The prompt ids of this call and where they go (no state is changed here)."""
    keys = [m.key() for m in req.messages]
    tk = req.tools_key()
    for br in reversed(session.branches):
        n = len(br.keys)
        if br.tools_key == tk and len(keys) >= n and keys[:n] == br.keys:
            try:
                ext = renderer.extension(br.completion_ids, br.finish_reason, req.messages[n:], br.history, req.tools)
            except TemplateMismatch:
                break
            return Plan(br.tokens + ext, br.index, len(br.tokens), None, br, keys, tk)
    else:
        compacted = summarizer(session.branches, req.messages)
        spawn = None if compacted else spawner(session.branches, req.messages)
        reason = ("compaction" if compacted else "spawned" if spawn else
                  classify(session.branches[-1] if session.branches else None, keys, tk))
        return Plan(renderer.full_prompt(req.messages, req.tools), session.n_segments, 0, reason, None, keys, tk,
                    spawn, compacted)
    return Plan(renderer.full_prompt(req.messages, req.tools), session.n_segments, 0, "template_mismatch",
                None, keys, tk)


async def plan_call(session: Session, req: ChatRequest, renderer: Renderer) -> Plan:
    """`plan(...)`, on the event loop when it is light (a body parsed on the loop, at most
    `INLINE_CHARS` of text to tokenize that the piece cache does not hold: a thread hop
    costs more than that), else in a worker (`offload`), so one long prompt never stalls the
    other sessions. A plan found too heavy is abandoned before it tokenizes anything more
    (`Renderer.budget`) and made again in the worker: `plan` changes no state."""
    if req.body_bytes <= OFF_LOOP_BYTES:
        try:
            with renderer.budget(INLINE_CHARS):
                return plan(session, req, renderer)
        except OverBudget:
            pass
    return await offload(plan, session, req, renderer, heavy=req.body_bytes > HEAVY_BYTES)


def commit(session: Session, p: Plan, req: ChatRequest, reply: Message, completion_ids: list[int],
           finish_reason: str, max_branches: int) -> None:
    """Advance the session after a finished call: the segment now ends with this reply."""
    tokens = p.prompt_ids
    tokens.extend(completion_ids)
    history = req.messages + [reply]
    keys = p.keys + [reply.key()]
    if p.branch is not None:
        br = p.branch
        br.history, br.keys, br.tokens, br.completion_ids, br.finish_reason = (
            history, keys, tokens, completion_ids, finish_reason)
        br.n_calls += 1
        session.branches.remove(br)
        session.branches.append(br)
    else:
        session.branches.append(Branch(p.segment, history, keys, p.tools_key, tokens, completion_ids, finish_reason))
        session.n_segments += 1
        del session.branches[:-max_branches]
    session.n_calls += 1
    session.last_response_at = time.monotonic()
