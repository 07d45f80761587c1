"""One call's generated ids -> the reply the harness gets: cut at its stop strings (ids and
text together), tool calls parsed by the tool-call format, and the call's record flags
(`stop_cut`, `tool_call`, `cached_tokens`, `interruptions`, `weight_versions`)."""
from __future__ import annotations

from typing import Any

from .canonical import ChatRequest, Completion, Message
from .generation import Generation
from .render import Renderer


def finish_reply(r: Renderer, req: ChatRequest, gen: Generation, cid: str, created: int, n_prompt: int,
                 sent: str | None) -> tuple[Completion, Message, dict[str, Any]]:
    """The reply and its flags; `gen` is cut in place at a stop string. `sent`: what a streamed
    call has shown so far (the client keeps it, so it is the canonical reply), None if plain."""
    flags: dict[str, Any] = {}
    text = r.decode(gen.ids)
    finish = "length" if gen.finish_reason == "length" else "stop"
    stop_seq = None
    if req.stop:
        hits = [(text.find(st), st) for st in req.stop if st in text]
        if hits:
            pos, stop_seq = min(hits)
            lo, hi = 1, len(gen.ids)  # shortest id prefix whose text holds the stop string
            while lo < hi:
                mid = (lo + hi) // 2
                if stop_seq in r.decode(gen.ids[:mid]):
                    hi = mid
                else:
                    lo = mid + 1
            flags["stop_cut"] = len(gen.ids) - lo
            del gen.ids[lo:], gen.logprobs[lo:], gen.versions[lo:]
            gen.finish_reason = "stop"
            text, finish = text[:pos], "stop_sequence"
    content, calls = text, []
    if req.tools and req.tool_choice != "none":
        parsed = r.tool_format.parse(text, req.tools)
        content, calls = parsed.content, parsed.tool_calls
        if parsed.flag:
            flags["tool_call"] = parsed.flag
        if calls:
            finish = "tool_calls"
    if gen.cached_tokens:
        flags["cached_tokens"] = gen.cached_tokens  # prefix-cache hit (the engine's prefill it skipped)
    if gen.interruptions:
        flags["interruptions"] = gen.interruptions
        flags["interrupted_wait_s"] = round(gen.wait_s, 4)
    if len(set(gen.versions)) > 1 or (gen.versions and not gen.versions[0].lstrip("-").isdigit()):
        flags["weight_versions"] = sorted(set(gen.versions))
    if sent is not None:
        # What the client accumulated is what it will send back: the canonical reply.
        visible = content if content.startswith(sent) else sent
        content = visible
    c = Completion(cid, req.model, created, content, calls, finish, stop_seq, n_prompt, len(gen.ids))
    return c, c.assistant_message(), flags
