"""The store across a proxy restart, and records linear in the conversation.

- A proxy killed and restarted on the same SQLite file serves the sessions it finds there
  over its admin HTTP API: the trajectory (exact token ids), close, reward; a call on such
  a session gets a 404 (its key and token state died with the old process).
- A 40-turn session exports its prompts as deltas: the ids serialized are a small multiple
  of its segment's tokens (not calls x tokens), and every prompt rebuilt from its delta is
  exactly what the engine was sent.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer
from harnessrl.gym.trajectory import CallRecord, Segment, Trajectory

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import ServedApp, check_exact, post, standin

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


class ProxyProcess:
    """`python -m harnessrl.gym.proxy` as its own process on a given store."""

    def __init__(self, engine_url: str, db: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "harnessrl.gym.proxy", "--engine-url", engine_url,
                                      "--db", str(db), "--admin-token", "adm"], stdout=subprocess.PIPE, cwd=ROOT)
        self.url = json.loads(self.proc.stdout.readline())["url"]
        self.admin = httpx.Client(base_url=self.url, headers={"Authorization": "Bearer adm"}, timeout=60)

    def chat(self, sid: str, key: str, messages: list) -> httpx.Response:
        return post(f"{self.url}/s/{sid}/v1/chat/completions", key, {"model": "policy", "messages": messages})

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.admin.close()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        self.proc.wait(30)


def test_a_restarted_proxy_serves_closes_and_rewards_the_sessions_in_its_store(tok, tmp_path):
    eng, script = standin(tok)
    db = tmp_path / "calls.db"
    with ServedApp(eng.app()) as e:
        first = ProxyProcess(e.url, db)
        try:
            opened = {}
            for name in ("finished", "open"):
                d = first.admin.post("/admin/sessions", json={"meta": {"task_id": name}}).json()
                opened[name] = (d["session_id"], d["key"])
            msgs = [{"role": "user", "content": "x"}]
            for _ in range(2):
                r = first.chat(*opened["finished"], msgs)
                assert r.status_code == 200, r.text
                msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "y"}]
            assert first.chat(*opened["open"], [{"role": "user", "content": "z"}]).status_code == 200
            fin, still_open = opened["finished"][0], opened["open"][0]
            assert first.admin.post(f"/admin/sessions/{fin}/close").status_code == 200
            before = first.admin.get(f"/admin/sessions/{fin}/trajectory").json()
        finally:
            first.kill()  # before the episode runner could post the reward

        second = ProxyProcess(e.url, db)
        try:
            after = second.admin.get(f"/admin/sessions/{fin}/trajectory")
            assert after.status_code == 200, after.text
            refused = second.chat(*opened["open"], [{"role": "user", "content": "z"}])
            assert second.admin.post(f"/admin/sessions/{still_open}/close").status_code == 200
            r1 = second.admin.post(f"/admin/sessions/{fin}/reward", json={"reward": 1.0, "status": "ok",
                                                                          "termination": "submitted"})
            r2 = second.admin.post(f"/admin/sessions/{still_open}/reward",
                                   json={"reward": None, "status": "infra_error", "termination": "infra"})
            assert (r1.status_code, r2.status_code) == (200, 200), (r1.text, r2.text)
            final = Trajectory.from_dict(second.admin.get(f"/admin/sessions/{fin}/trajectory").json())
            other = Trajectory.from_dict(second.admin.get(f"/admin/sessions/{still_open}/trajectory").json())
            unknown = second.admin.get("/admin/sessions/nope/trajectory")
            stats = second.admin.get("/admin/stats").json()
        finally:
            second.kill(signal.SIGTERM)

    assert after.json() == before  # every token id, logprob and version as the first proxy served it
    assert before["status"] == "running" and len(before["calls"]) == 2
    check_exact(final, eng.calls[:2])
    assert (final.status, final.reward, final.termination, final.task_id) == ("ok", 1.0, "submitted", "finished")
    assert (other.status, other.reward, len(other.calls)) == ("infra_error", None, 1)
    assert refused.status_code == 404 and unknown.status_code == 404
    assert (stats["sessions"], stats["sessions_open"]) == (2, 0)


def _ids_serialized(d: dict) -> int:
    """Token ids in an exported trajectory: segments' token_ids and calls' prompt/completion ids."""
    segs = sum(len(s["token_ids"]) for s in d["segments"])
    calls = sum(len(c["new_prompt_ids"]) + len(c["completion_ids"]) for c in d["calls"])
    return segs + calls


def test_a_40_turn_session_exports_linear_in_its_tokens_and_prompts_rebuild_exactly(tok):
    eng, script = standin(tok)
    cfg = ProxyConfig(engine_url="")
    with ServedApp(eng.app()) as e, ProxyServer(cfg.model_copy(update={"engine_url": e.url}), tokenizer=tok) as p:
        sid, key = p.open_session({"task_id": "long"})
        msgs = [{"role": "user", "content": "start the long task"}]
        for turn in range(40):
            script.say(f"step {turn}: I ran the command and looked at its output carefully")
            r = post(p.openai_base_url(sid) + "/chat/completions", key, {"model": "policy", "messages": msgs})
            assert r.status_code == 200, r.text
            msgs += [r.json()["choices"][0]["message"],
                     {"role": "user", "content": f"observation {turn}: " + "output line " * 10}]
        raw = httpx.get(f"{p.url}/admin/sessions/{sid}/trajectory",
                        headers={"Authorization": f"Bearer {p.admin_token}"}, timeout=60)
        engine_calls = list(eng.calls)
    d = raw.json()
    t = Trajectory.from_dict(d)
    assert len(t.calls) == 40 and len(t.segments) == 1
    check_exact(t, engine_calls)  # every prompt rebuilt from its delta == the engine's input_ids
    assert [t.call_prompt(c) for c in t.calls] == [c["input_ids"] for c in engine_calls]
    seg_tokens = len(t.segments[0].token_ids)
    full_prompts = sum(len(c["input_ids"]) for c in engine_calls)
    assert _ids_serialized(d) == 2 * seg_tokens  # each id once in the segment, once in its call's delta
    assert full_prompts > 15 * seg_tokens  # what full prompts per call would have cost
    assert len(raw.content) < 40 * seg_tokens  # bytes: a few per-token fields, not per call
    # JSON round trip keeps the deltas
    assert Trajectory.from_dict(json.loads(t.to_json())).to_dict() == d


def test_records_from_before_deltas_still_load():
    """A JSONL line written when call records held full `prompt_ids`."""
    old = {"session_id": "s", "segments": [{"token_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1],
                                            "logprobs": [0.0, 0.0, -0.1, -0.2], "versions": [-1, -1, 0, 0]}],
           "calls": [{"call_id": "c", "session_id": "s", "index": 0, "dialect": "openai_chat",
                      "prompt_ids": [1, 2], "completion_ids": [3, 4], "logprobs": [-0.1, -0.2], "versions": [0, 0],
                      "finish_reason": "stop", "segment": 0}]}
    t = Trajectory.from_dict(old)
    c = t.calls[0]
    assert (c.prompt_prefix_len, c.new_prompt_ids, c.prompt_ids) == (0, [1, 2], [1, 2])
    t.validate()


def test_a_call_record_rebuilds_its_prompt_from_its_segment():
    seg = Segment([5, 6, 7, 8, 9, 10], [0, 1, 0, 0, 1, 1], [0, -1, 0, 0, -1, -1], [-1, 0, -1, -1, 0, 0])
    calls = [CallRecord("a", "s", 0, "openai_chat", 0, [5], [6], [-1.0], [0], "stop", 0),
             CallRecord("b", "s", 1, "openai_chat", 2, [7, 8], [9, 10], [-1.0, -1.0], [0, 0], "stop", 0)]
    t = Trajectory("s", [seg], calls=calls)
    assert [c.prompt_ids for c in t.calls] == [[5], [5, 6, 7, 8]] == [t.call_prompt(c) for c in calls]
    bad = Trajectory("s", [seg], calls=[CallRecord("c", "s", 0, "openai_chat", 9, [1], [], [], [], "stop", 0)])
    with pytest.raises(ValueError, match="reuses 9 tokens"):
        bad.validate()
