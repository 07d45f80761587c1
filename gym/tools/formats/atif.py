"""harnessrl trajectories <-> ATIF (Agent Trajectory Interchange Format, Harbor's RFC 0001, v1.4).

Contract: `to_atif(traj, decode)` writes one ATIF document per session. The first call's prompt
is a `user` step; every model call is an `agent` step whose message is the decoded completion,
whose `tool_calls` are those the proxy's tool format (or a mini-swe-agent style ```bash block)
finds in it, and whose `observation` is what the harness appended before its next call (the
next request's new prompt tokens, decoded as sent: tool results, command output). A call that
starts a new segment (the harness rewrote its history) is preceded by a `system` step naming
the split reason. Token data sits where ATIF puts it: `metrics.prompt_token_ids` (the full
prompt the engine was sent), `completion_token_ids`, `logprobs`. What ATIF has no field for is
in `extra["harnessrl"]`: per step the loss mask and policy versions aligned with
prompt + completion (exactly the segment's values over those positions), the completion's
versions, segment index, prompt prefix reuse, timings and the call's flags (sampling...); at
the root the reward, status, termination, task, chat template hash, metadata and each
segment's split reason.

`from_atif(doc)` rebuilds the Trajectory from the agent steps alone (as the store does from its
rows) and checks every step's loss mask and versions against the rebuilt segments, so
to_atif -> from_atif gives back the same token ids, masks, logprobs, versions and splits.
`validate(doc)` checks a document against `atif_schema.json` (written from the RFC: Harbor's own
models need Python >= 3.12) plus the rules a schema cannot say (step ids 1..n in order,
observation results naming a tool call of their step). Without `decode` messages are empty.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from harnessrl.gym.trajectory import CallRecord, Segment, Trajectory

SCHEMA_VERSION = "ATIF-v1.4"
SCHEMA_PATH = Path(__file__).with_name("atif_schema.json")
_BASH_BLOCK = re.compile(r"```(?:bash|sh)\s*\n(.*?)```", re.S)


class AtifError(ValueError):
    """An ATIF document is invalid, or does not carry what a harnessrl trajectory needs."""


def _iso(t: float) -> str | None:
    if not t:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _tool_calls(call_id: str, text: str) -> list[dict[str, Any]]:
    from harnessrl.gym.proxy.toolcalls import load_tool_format

    parsed = load_tool_format("hermes").parse(text, [])
    if parsed.tool_calls:
        return [{"tool_call_id": f"{call_id}-{k}", "function_name": tc.name, "arguments": json.loads(tc.arguments)}
                for k, tc in enumerate(parsed.tool_calls)]
    return [{"tool_call_id": f"{call_id}-{k}", "function_name": "bash", "arguments": {"command": cmd.strip()}}
            for k, cmd in enumerate(_BASH_BLOCK.findall(text))]


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def to_atif(traj: Trajectory, decode: Callable[[list[int]], str] | None = None,
            agent_version: str | None = None) -> dict[str, Any]:
    """One ATIF document for one trajectory (module doc). `decode`: token ids -> text;
    `agent_version`: default the harness version the episode recorded."""
    agent_version = agent_version or str(traj.metadata.get("harness_version") or "unknown")
    text = decode or (lambda ids: "")
    steps: list[dict[str, Any]] = []
    agent_steps: list[dict[str, Any]] = []
    seen_segments: set[int] = set()
    calls = sorted(traj.calls, key=lambda c: c.index)
    for i, c in enumerate(calls):
        prompt = traj.call_prompt(c)
        starts = not c.detached and c.segment not in seen_segments
        if starts and c.segment > 0:
            reason = traj.segments[c.segment].split_reason
            steps.append({"source": "system", "message": f"new segment {c.segment}: {reason}",
                          "timestamp": _iso(c.finished_at - c.gen_s - c.queue_s),
                          "extra": {"harnessrl": {"segment": c.segment, "split_reason": reason}}})
        if not steps:
            steps.append({"source": "user", "message": text(prompt),
                          "timestamp": _iso(c.finished_at - c.gen_s - c.queue_s)})
        if not c.detached:
            seen_segments.add(c.segment)
            seg = traj.segments[c.segment]
            end = len(prompt) + len(c.completion_ids)
            mask, versions = seg.loss_mask[:end], seg.versions[:end]
        else:
            mask = [0] * (len(prompt) + len(c.completion_ids))
            versions = [-1] * len(prompt) + list(c.versions)
        message = text(c.completion_ids)
        step = {"source": "agent", "model_name": traj.model or None, "message": message,
                "timestamp": _iso(c.finished_at),
                "metrics": _drop_none({"prompt_tokens": len(prompt), "completion_tokens": len(c.completion_ids),
                                       "cached_tokens": c.flags.get("cached_tokens"),
                                       "prompt_token_ids": prompt, "completion_token_ids": list(c.completion_ids),
                                       "logprobs": list(c.logprobs)}),
                "extra": {"harnessrl": {
                    "call_id": c.call_id, "index": c.index, "dialect": c.dialect, "segment": c.segment,
                    "prompt_prefix_len": c.prompt_prefix_len, "completion_versions": list(c.versions),
                    "loss_mask": mask, "versions": versions, "finish_reason": c.finish_reason,
                    "queue_s": c.queue_s, "gen_s": c.gen_s, "env_s": c.env_s, "finished_at": c.finished_at,
                    "flags": c.flags}}}
        tool_calls = _tool_calls(c.call_id, message) if message else []
        if tool_calls:
            step["tool_calls"] = tool_calls
        nxt = calls[i + 1] if i + 1 < len(calls) else None
        if nxt is not None and nxt.prompt_prefix_len and nxt.new_prompt_ids:  # what the harness sent back
            content = text(nxt.new_prompt_ids)
            step["observation"] = {"results": [_drop_none({
                "source_call_id": tool_calls[0]["tool_call_id"] if tool_calls else None, "content": content})]}
        steps.append(_drop_none(step))
        agent_steps.append(step)
    if not steps:  # an episode that ended before its first model call (ATIF needs one step)
        steps.append({"source": "system", "message": f"no model calls ({traj.termination or traj.status})"})
    for n, step in enumerate(steps, 1):
        step["step_id"] = n
    return _drop_none({
        "schema_version": SCHEMA_VERSION,
        "session_id": traj.session_id,
        "agent": _drop_none({"name": traj.harness or "unknown", "version": agent_version,
                             "model_name": traj.model or None, "extra": {"dialects": sorted({c.dialect for c in calls})}}),
        "steps": [{"step_id": s.pop("step_id"), **s} for s in steps],
        "notes": None if decode else "no tokenizer was given: messages are empty, token ids are exact",
        "final_metrics": {
            "total_prompt_tokens": sum(s["metrics"]["prompt_tokens"] for s in agent_steps),
            "total_completion_tokens": sum(s["metrics"]["completion_tokens"] for s in agent_steps),
            "total_cached_tokens": sum(s["metrics"].get("cached_tokens", 0) for s in agent_steps),
            "total_steps": len(steps),
            "extra": {"reward": traj.reward, "status": traj.status, "termination": traj.termination}},
        "extra": {"harnessrl": {
            "reward": traj.reward, "status": traj.status, "termination": traj.termination, "task_id": traj.task_id,
            "harness": traj.harness, "model": traj.model, "chat_template_hash": traj.chat_template_hash,
            "metadata": traj.metadata,
            "segments": [{"split_reason": s.split_reason, "call_ids": s.call_ids, "n_tokens": len(s.token_ids),
                          "spawned_by": s.spawned_by, "compacted_from": s.compacted_from} for s in traj.segments]}},
    })


def from_atif(doc: dict[str, Any]) -> Trajectory:
    """The Trajectory a `to_atif` document was made from (module doc); AtifError if it disagrees."""
    validate(doc)
    root = (doc.get("extra") or {}).get("harnessrl")
    if root is None:
        raise AtifError(f"session {doc['session_id']}: extra.harnessrl is missing: not a harnessrl export")
    sid = doc["session_id"]
    calls: list[CallRecord] = []
    steps = [s for s in doc["steps"] if s["source"] == "agent"]
    for s in steps:
        x = (s.get("extra") or {}).get("harnessrl")
        m = s.get("metrics") or {}
        if x is None or "prompt_token_ids" not in m or "completion_token_ids" not in m:
            raise AtifError(f"session {sid} step {s['step_id']}: an agent step needs metrics.prompt_token_ids, "
                            "completion_token_ids and extra.harnessrl")
        prompt = m["prompt_token_ids"]
        calls.append(CallRecord(
            call_id=x["call_id"], session_id=sid, index=x["index"], dialect=x["dialect"],
            prompt_prefix_len=x["prompt_prefix_len"], new_prompt_ids=prompt[x["prompt_prefix_len"]:],
            completion_ids=m["completion_token_ids"], logprobs=m.get("logprobs", []),
            versions=x["completion_versions"], finish_reason=x["finish_reason"], segment=x["segment"],
            queue_s=x["queue_s"], gen_s=x["gen_s"], env_s=x["env_s"], finished_at=x["finished_at"], flags=x["flags"]))
    seg_meta = root["segments"]
    segs = [Segment([], [], [], [], split_reason=m["split_reason"], spawned_by=m.get("spawned_by"),
                    compacted_from=m.get("compacted_from")) for m in seg_meta]
    for c in calls:
        if c.detached:
            continue
        if not 0 <= c.segment < len(segs):
            raise AtifError(f"session {sid} call {c.call_id}: segment {c.segment} is not among the "
                            f"{len(segs)} segments of extra.harnessrl.segments")
        seg = segs[c.segment]
        if c.prompt_prefix_len != len(seg.token_ids):
            raise AtifError(f"session {sid} call {c.call_id}: reuses {c.prompt_prefix_len} tokens but segment "
                            f"{c.segment} has {len(seg.token_ids)} before it")
        n = len(c.new_prompt_ids)
        seg.token_ids += c.new_prompt_ids + c.completion_ids
        seg.loss_mask += [0] * n + [1] * len(c.completion_ids)
        seg.logprobs += [0.0] * n + c.logprobs
        seg.versions += [-1] * n + c.versions
        seg.call_ids.append(c.call_id)
    for s, c in zip(steps, calls):
        x = s["extra"]["harnessrl"]
        if not c.detached:
            end = c.prompt_prefix_len + len(c.new_prompt_ids) + len(c.completion_ids)
            seg = segs[c.segment]
            if x["loss_mask"] != seg.loss_mask[:end] or x["versions"] != seg.versions[:end]:
                raise AtifError(f"session {sid} step {s['step_id']}: loss_mask/versions disagree with the "
                                "segment rebuilt from the token ids")
    for i, (seg, meta) in enumerate(zip(segs, seg_meta)):
        if len(seg.token_ids) != meta["n_tokens"] or seg.call_ids != meta["call_ids"]:
            raise AtifError(f"session {sid} segment {i}: rebuilt {len(seg.token_ids)} tokens from calls "
                            f"{seg.call_ids}, the export says {meta['n_tokens']} from {meta['call_ids']}")
    traj = Trajectory(sid, segs, root["reward"], root["status"], root["termination"], root["task_id"],
                      root["harness"], root["model"], root["chat_template_hash"], calls, root["metadata"])
    traj.validate()
    return traj


def validate(doc: Any) -> None:
    """AtifError naming the first problem when `doc` is not a valid ATIF document."""
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise AtifError(f"ATIF {where}: {e.message}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    for n, step in enumerate(doc["steps"], 1):
        if step["step_id"] != n:
            raise AtifError(f"ATIF steps/{n - 1}/step_id: is {step['step_id']}, must be {n} (1..n in order)")
        ids = {tc["tool_call_id"] for tc in step.get("tool_calls", [])}
        for r in (step.get("observation") or {}).get("results", []):
            if r.get("source_call_id") is not None and r["source_call_id"] not in ids:
                raise AtifError(f"ATIF steps/{n - 1}/observation: source_call_id {r['source_call_id']!r} "
                                "names no tool call of this step")
        m = step.get("metrics") or {}
        if "logprobs" in m and "completion_token_ids" in m and len(m["logprobs"]) != len(m["completion_token_ids"]):
            raise AtifError(f"ATIF steps/{n - 1}/metrics: {len(m['logprobs'])} logprobs for "
                            f"{len(m['completion_token_ids'])} completion tokens")
