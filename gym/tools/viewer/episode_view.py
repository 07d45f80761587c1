"""One episode for the browser: the conversation per call and the token view.

Contract: the store keeps tokens, not request JSON, so the conversation is read back from the
exact ids the engine was sent, decoded with the run's own tokenizer (the `tokenizer.json` of
the record's model, through the Rust `tokenizers` library: no torch): each call's *new*
prompt tokens (the messages the harness added since its previous call; the whole prompt when
the call started a segment) are split into messages at the chat template's role markers
(ChatML `<|im_start|>role`, Llama-3 headers; any other template shows as one `prompt` block),
followed by the call's decoded completion and the tool calls found in it (Hermes
`<tool_call>` JSON, or a ```bash block as mini-swe-agent writes them). `calls_page` pages the
calls; `token_page` pages one segment's tokens: id, text of that one token, loss mask,
logprob, policy version and the call it belongs to, so the page colours sampled tokens by the
mask and a heat of their logprob, exactly as the record holds them.
"""
from __future__ import annotations

import functools
import json
import re
from bisect import bisect_right
from typing import Any

from harnessrl.gym.trajectory import CallRecord, Trajectory

_CHATML = re.compile(r"<\|im_start\|>([^\n]*)\n(.*?)(?=<\|im_start\|>|\Z)", re.S)
_LLAMA3 = re.compile(r"<\|start_header_id\|>([^<]*)<\|end_header_id\|>\n\n(.*?)(?=<\|start_header_id\|>|\Z)", re.S)
_ENDS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>")
_BASH_BLOCK = re.compile(r"```(?:bash|sh)\s*\n(.*?)```", re.S)


class Decoder:
    """ids -> text with the model's own tokenizer; special tokens kept (they are the template)."""

    def __init__(self, model: str):
        from tokenizers import Tokenizer

        from harnessrl.gym.models import resolve_model

        path = resolve_model(model) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"model {model!r} has no tokenizer.json at {path}: its tokens cannot be decoded")
        self.model = model
        self._tok = Tokenizer.from_file(str(path))
        self._piece: dict[int, str] = {}

    def text(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def pieces(self, ids: list[int]) -> list[str]:
        """Each id decoded alone (a byte of a multi-byte character shows as U+FFFD)."""
        missing = sorted({i for i in ids if i not in self._piece})
        if missing:
            for i, s in zip(missing, self._tok.decode_batch([[i] for i in missing], skip_special_tokens=False)):
                self._piece[i] = s
        return [self._piece[i] for i in ids]


@functools.lru_cache(maxsize=8)
def decoder(model: str) -> Decoder:
    return Decoder(model)


def split_messages(text: str) -> list[dict[str, str]]:
    """Rendered prompt text -> [{role, content}] at the template's role markers (module doc).
    Text before the first marker (the end of the previous turn) is kept only when not blank;
    the empty assistant turn that opens generation is dropped."""
    for pat in (_CHATML, _LLAMA3):
        found = list(pat.finditer(text))
        if found:
            out = []
            lead = text[:found[0].start()]
            for end in _ENDS:
                lead = lead.replace(end, "")
            if lead.strip():
                out.append({"role": "(end of previous turn)", "content": lead.strip("\n")})
            for m in found:
                body = m.group(2)
                for end in _ENDS:
                    if body.rstrip("\n").endswith(end):
                        body = body.rstrip("\n")[:-len(end)]
                out.append({"role": m.group(1).strip(), "content": body})
            if out and out[-1]["role"] == "assistant" and not out[-1]["content"].strip():
                out.pop()
            return out
    return [{"role": "prompt", "content": text}] if text else []


def tool_calls(text: str) -> list[dict[str, Any]]:
    """Tool calls in a completion: Hermes `<tool_call>` JSON, else ```bash blocks."""
    from harnessrl.gym.proxy.toolcalls import load_tool_format

    parsed = load_tool_format("hermes").parse(text, [])
    if parsed.tool_calls:
        out = []
        for tc in parsed.tool_calls:
            try:
                args: Any = json.loads(tc.arguments)
            except ValueError:
                args = tc.arguments
            out.append({"name": tc.name, "arguments": args})
        return out
    return [{"name": "bash", "arguments": {"command": cmd.strip()}} for cmd in _BASH_BLOCK.findall(text)]


def _strip_end(text: str) -> str:
    for end in _ENDS:
        if text.endswith(end):
            return text[:-len(end)]
    return text


def call_view(traj: Trajectory, c: CallRecord, dec: Decoder | None, starts_segment: bool) -> dict[str, Any]:
    new_text = dec.text(c.new_prompt_ids) if dec else None
    reply = dec.text(c.completion_ids) if dec else None
    return {
        "index": c.index, "call_id": c.call_id, "dialect": c.dialect, "segment": c.segment,
        "starts_segment": starts_segment,
        "split_reason": traj.segments[c.segment].split_reason if starts_segment and c.segment < len(traj.segments) else None,
        "detached": c.flags.get("detached"), "finish_reason": c.finish_reason,
        "queue_s": c.queue_s, "gen_s": c.gen_s, "env_s": c.env_s, "finished_at": c.finished_at,
        "prompt_tokens": c.prompt_prefix_len + len(c.new_prompt_ids), "prefix_reused": c.prompt_prefix_len,
        "new_prompt_tokens": len(c.new_prompt_ids), "completion_tokens": len(c.completion_ids),
        "versions": sorted(set(c.versions)),
        "messages": split_messages(new_text) if new_text is not None else [],
        "reply": _strip_end(reply) if reply is not None else None,
        "tool_calls": tool_calls(reply) if reply else [],
        "flags": c.flags,
    }


def calls_page(traj: Trajectory, dec: Decoder | None, offset: int, limit: int) -> dict[str, Any]:
    calls = sorted(traj.calls, key=lambda c: c.index)
    seen: set[int] = set()
    starts: dict[str, bool] = {}
    for c in calls:
        starts[c.call_id] = not c.detached and c.segment not in seen
        if not c.detached:
            seen.add(c.segment)
    page = calls[offset:offset + limit]
    return {"total": len(calls), "offset": offset, "limit": limit,
            "calls": [call_view(traj, c, dec, starts[c.call_id]) for c in page]}


def header(traj: Trajectory) -> dict[str, Any]:
    """Everything about the episode but its calls and tokens."""
    meta = dict(traj.metadata)
    grading = meta.pop("grading", None) or {}
    return {
        "session_id": traj.session_id, "task_id": traj.task_id, "harness": traj.harness, "model": traj.model,
        "reward": traj.reward, "status": traj.status, "termination": traj.termination,
        "chat_template_hash": traj.chat_template_hash, "n_calls": len(traj.calls),
        "sampled_total": sum(sum(s.loss_mask) for s in traj.segments),
        "segments": [{"index": i, "split_reason": s.split_reason, "n_tokens": len(s.token_ids),
                      "sampled": sum(s.loss_mask), "call_ids": s.call_ids,
                      "spawned_by": getattr(s, "spawned_by", None),  # a sub-agent's lineage: its parent
                      "compacted_from": getattr(s, "compacted_from", None)}  # after a compaction: its summary
                     for i, s in enumerate(traj.segments)],
        "grading": grading, "metadata": meta,
    }


def token_page(traj: Trajectory, dec: Decoder | None, segment: int, offset: int, limit: int) -> dict[str, Any]:
    """Tokens [offset, offset+limit) of one segment as parallel arrays (module doc)."""
    seg = traj.segments[segment]
    by_id = {c.call_id: c for c in traj.calls}
    starts = [by_id[cid].prompt_prefix_len for cid in seg.call_ids if cid in by_id]
    indices = [by_id[cid].index for cid in seg.call_ids if cid in by_id]
    ids = seg.token_ids[offset:offset + limit]
    pos = range(offset, offset + len(ids))
    return {
        "segment": segment, "split_reason": seg.split_reason, "total": len(seg.token_ids), "offset": offset,
        "limit": limit, "ids": ids, "text": dec.pieces(ids) if dec else None,
        "mask": seg.loss_mask[offset:offset + limit], "logprob": seg.logprobs[offset:offset + limit],
        "version": seg.versions[offset:offset + limit],
        "call": [indices[bisect_right(starts, p) - 1] if starts and p >= starts[0] else None for p in pos],
        "call_starts": {str(i): s for i, s in zip(indices, starts)},
    }
