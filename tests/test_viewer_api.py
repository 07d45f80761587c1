"""`harnessrl view`'s API over real SQLite stores and JSONL records (no browser): paging,
filters and sorting done in SQL with exact figures, the conversation and token view decoded
with tiny-llama's real tokenizer, run figures, bad input answered 4xx naming the parameter,
and the command's own errors. The browser test (test_viewer_browser.py) drives the page."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from harnessrl.gym.proxy.store import Store
from harnessrl.gym.trajectory import Trajectory
from harnessrl.gym.tools.viewer import RunFolderError, RunIndex
from harnessrl.gym.tools.viewer.app import build_app
from harnessrl.gym.tools.viewer.episode_view import split_messages, tool_calls

N = 120


def _expected(i: int) -> dict:
    """What session i of `many_run` holds (the test's own arithmetic, not the viewer's)."""
    n_calls = i % 4 + 1
    split = i % 5 == 0 and n_calls >= 2
    infra = i % 11 == 0
    prompt = [3 + i % 7] + [0] * (n_calls - 1)  # new prompt tokens per call (0: the call reuses all)
    comps = [2 + (i + k) % 3 for k in range(n_calls)]
    return {"task_id": f"task-{i % 7}", "harness": "codex" if i % 2 else "mini-swe-agent",
            "reward": None if infra else (1.0 if i % 3 == 0 else 0.0),
            "status": "infra_error" if infra else "ok", "termination": "infra" if infra else "submitted",
            "n_calls": n_calls, "split": split, "prompt": prompt, "comps": comps}


def many_run(root: Path, n: int = N) -> dict[str, dict]:
    """n sessions through the real store: 1-4 calls each, a history rewrite (new segment) in
    every fifth, an extra detached engine failure in every seventh, some infra errors."""
    store = Store(root / "trajectories.db")
    out = {}
    for i in range(n):
        e = _expected(i)
        sid = f"s{i:04d}"
        store.open_session(sid, {"task_id": e["task_id"], "harness": e["harness"]}, "h", "tiny-llama")
        seg, have = 0, 0
        tokens = sampled = 0
        for k in range(e["n_calls"]):
            reason = None
            new = list(range(100, 100 + e["prompt"][k]))
            if e["split"] and k == e["n_calls"] - 1:  # the harness rewrote its history
                seg, have, reason, new = 1, 0, "history_rewrite", list(range(200, 206))
            comp = list(range(300, 300 + e["comps"][k]))
            store.add_call(call_id=f"{sid}-c{k}", session_id=sid, idx=k, dialect="openai_chat", segment=seg,
                           split_reason=reason, prefix_len=have, new_prompt=new, completion=comp,
                           logprobs=[-0.5] * len(comp), versions=[k] * len(comp), finish_reason="stop",
                           queue_s=0.001 * k, gen_s=0.1 * (k + 1), env_s=None if k == 0 else 0.25 * k, flags={})
            have += len(new) + len(comp)
            tokens += len(new) + len(comp)
            sampled += len(comp)
        if i % 7 == 0:  # an engine failure: a call in the record, in no segment
            store.add_call(call_id=f"{sid}-x", session_id=sid, idx=e["n_calls"], dialect="openai_chat",
                           segment=seg, split_reason=None, prefix_len=have, new_prompt=[7, 7], completion=[],
                           logprobs=[], versions=[], finish_reason="engine_error", queue_s=0.0, gen_s=0.0,
                           env_s=None, flags={"detached": "engine_error", "engine_error": "boom"})
        store.set_reward(sid, e["reward"], e["status"], e["termination"])
        out[sid] = dict(e, tokens=tokens, sampled=sampled, calls=e["n_calls"] + (i % 7 == 0),
                        segments=2 if e["split"] else 1)
    store.close()
    return out


@pytest.fixture
def many(tmp_path):
    expected = many_run(tmp_path / "run")
    return TestClient(build_app([RunIndex(tmp_path / "run")])), expected


def test_pages_cover_every_episode_once_with_exact_counts(many):
    client, expected = many
    seen = []
    for offset in range(0, N, 50):
        page = client.get(f"/api/runs/0/episodes?limit=50&offset={offset}").json()
        assert page["total"] == N and len(page["rows"]) == min(50, N - offset)
        seen += page["rows"]
    assert [r["sid"] for r in seen] == sorted(expected)  # recording order
    for r in seen:
        e = expected[r["sid"]]
        assert (r["task_id"], r["harness"], r["reward"], r["status"], r["termination"]) == \
            (e["task_id"], e["harness"], e["reward"], e["status"], e["termination"])
        assert (r["calls"], r["segments"], r["tokens"], r["sampled"]) == \
            (e["calls"], e["segments"], e["tokens"], e["sampled"]), r["sid"]
        assert r["splits"] == (["history_rewrite"] if e["split"] else [])


def test_sort_and_filter_happen_in_sql(many):
    client, expected = many
    rows = client.get("/api/runs/0/episodes?sort=tokens&desc=true&limit=500").json()["rows"]
    assert [r["tokens"] for r in rows] == sorted((e["tokens"] for e in expected.values()), reverse=True)
    rows = client.get("/api/runs/0/episodes?sort=reward&limit=500").json()["rows"]
    rewards = [r["reward"] for r in rows]
    n_none = sum(e["reward"] is None for e in expected.values())
    assert rewards[-n_none:] == [None] * n_none and rewards[:-n_none] == sorted(rewards[:-n_none])
    page = client.get("/api/runs/0/episodes?status=infra_error").json()
    assert page["total"] == sum(e["status"] == "infra_error" for e in expected.values()) == 11
    page = client.get("/api/runs/0/episodes?task=task-3&harness=codex&limit=500").json()
    assert {r["sid"] for r in page["rows"]} == {s for s, e in expected.items()
                                                 if e["task_id"] == "task-3" and e["harness"] == "codex"}
    page = client.get("/api/runs/0/episodes?min_reward=1&limit=500").json()
    assert page["total"] == sum(e["reward"] == 1.0 for e in expected.values())
    page = client.get("/api/runs/0/episodes?split=rewrite&limit=500").json()
    assert {r["sid"] for r in page["rows"]} == {s for s, e in expected.items() if e["split"]}
    page = client.get("/api/runs/0/episodes?sort=calls&desc=true&limit=3&offset=2").json()
    assert [r["calls"] for r in page["rows"]] == sorted((e["calls"] for e in expected.values()), reverse=True)[2:5]
    assert client.get("/api/runs/0/filters").json() == {
        "harness": ["codex", "mini-swe-agent"], "status": ["infra_error", "ok"], "termination": ["infra", "submitted"]}


@pytest.mark.parametrize("query,param", [
    ("episodes?limit=0", "limit"), ("episodes?limit=501", "limit"), ("episodes?offset=-1", "offset"),
    ("episodes?sort=bogus", "sort"), ("episodes?min_reward=abc", "min_reward"), ("episodes?desc=maybe", "desc"),
    ("episodes/s0001/tokens?segment=5", "segment"), ("episodes/s0001/tokens?limit=0", "limit"),
    ("episodes/s0001/calls?offset=x", "offset"), ("summary?max_points=1", "max_points"),
])
def test_bad_input_is_a_400_naming_the_parameter(many, query, param):
    client, _ = many
    r = client.get(f"/api/runs/0/{query}")
    assert r.status_code == 400, r.text
    assert r.json()["param"] == param and r.json()["error"].startswith(f"{param}: ")


def test_unknown_run_or_episode_is_a_404(many):
    client, _ = many
    assert client.get("/api/runs/3/episodes").status_code == 404
    assert client.get("/api/runs/3/episodes").json()["error"] == "no run 3: runs are 0..0"
    r = client.get("/api/runs/0/episodes/nope")
    assert r.status_code == 404 and "nope" in r.json()["error"]
    r = client.get("/api/compare/tasks?runs=0,x")
    assert r.status_code == 400 and r.json()["param"] == "runs"


def test_summary_histograms_and_curve_are_exact(many):
    client, expected = many
    s = client.get("/api/runs/0/summary").json()
    env = [0.25 * k for e in expected.values() for k in range(1, e["n_calls"])]
    assert s["env_latency_s"]["n"] == len(env) and sum(s["env_latency_s"]["counts"]) == len(env)
    assert s["env_latency_s"]["lo"] == min(env) and s["env_latency_s"]["hi"] == max(env)
    assert s["env_latency_s"]["p50"] == sorted(env)[(len(env) + 1) // 2 - 1]
    model = [0.001 * k + 0.1 * (k + 1) for e in expected.values() for k in range(e["n_calls"])]
    assert s["model_call_latency_s"]["n"] == len(model)  # detached engine failures are not model calls
    assert s["kind"] == "rollout" and s["episodes"] == N and s["by_status"] == {"infra_error": 11, "ok": N - 11}
    scored = [e["reward"] for e in expected.values() if e["reward"] is not None]
    assert s["success_rate"] == pytest.approx(sum(r >= 1 for r in scored) / len(scored))
    assert s["curve"]["x"] == "episode" and len(s["curve"]["points"]) == len(scored)
    w = s["curve"]["window"]
    assert s["curve"]["points"][-1]["reward"] == pytest.approx(sum(scored[-w:]) / w)
    thin = client.get("/api/runs/0/summary?max_points=10").json()["curve"]["points"]
    assert len(thin) == 10 and thin[-1] == s["curve"]["points"][-1]


def test_a_train_run_curve_is_per_step_and_staleness_from_the_report(tmp_path):
    run = tmp_path / "train"
    many_run(run / "rollouts", n=4)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "version": k, "reward_mean": k / 4,
                                                           "success_rate": k / 8}) + "\n" for k in range(3)))
    (run / "report.json").write_text(json.dumps({"staleness_hist": {"0": 30, "1": 6}, "trajectories_per_s": 0.5}))
    s = TestClient(build_app([RunIndex(run)])).get("/api/runs/0/summary").json()
    assert s["kind"] == "train" and s["curve"]["x"] == "step"
    assert [(p["x"], p["reward"], p["success"]) for p in s["curve"]["points"]] == [(0, 0.0, 0.0), (1, 0.25, 0.125),
                                                                                   (2, 0.5, 0.25)]
    assert s["staleness_hist"] == {"0": 30, "1": 6} and s["report"]["trajectories_per_s"] == 0.5


def test_the_cheat_rate_per_step_and_in_total(tmp_path):
    from harnessrl.gym.cheat import step_metrics
    from harnessrl.gym.grading import TAMPER_KINDS

    def ep(sid, kinds=(), canary=None):
        t = Trajectory(session_id=sid, task_id="t", reward=0.0, status="ok", segments=[])
        t.metadata["grading"] = {"tampered": bool(kinds), "tamper_kinds": list(kinds), "evidence": []}
        if canary is not None:
            t.metadata |= {"canary": True, "canary_passed": canary}
        return t

    run = tmp_path / "train"
    many_run(run / "rollouts", n=4)
    steps = [[ep("a"), ep("b", ["framework"])], [ep("c", ["channel", "framework"]), ep("d", canary=True), ep("e", canary=False)]]
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": k + 1, "reward_mean": 0.0} | step_metrics(b)) + "\n"
                                               for k, b in enumerate(steps)))
    client = TestClient(build_app([RunIndex(run)]))
    c = client.get("/api/runs/0/summary").json()["cheat"]
    assert [(p["x"], p["tampered_frac"], p["canary_pass_rate"], p["canary_episodes"]) for p in c["points"]] == \
        [(1, 0.5, None, 0), (2, 1 / 3, 0.5, 2)]
    t = c["totals"]  # no report.json: summed over the steps
    assert (t["graded_episodes"], t["tampered_episodes"]) == (5, 2)
    assert t["tampered_by_kind"] == dict.fromkeys(TAMPER_KINDS, 0) | {"framework": 2, "channel": 1}
    assert t["canary"] == {"passed": 1, "episodes": 2, "pass_rate": 0.5, "k_of_n": "1/2"}
    (run / "report.json").write_text(json.dumps({"cheat": t | {"tampered_episodes": 7}}))  # the report wins
    assert TestClient(build_app([RunIndex(run)])).get("/api/runs/0/summary").json()["cheat"]["totals"][
        "tampered_episodes"] == 7
    plain = TestClient(build_app([RunIndex(run / "rollouts")])).get("/api/runs/0/summary").json()["cheat"]
    assert plain == {"points": [], "totals": None}  # a rollout without a report: nothing to show


def _tok():
    from harnessrl.gym.models import ModelNotPrepared, resolve_model

    try:
        resolve_model("tiny-llama")
    except ModelNotPrepared as e:
        pytest.skip(str(e))
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(resolve_model("tiny-llama") / "tokenizer.json"))


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def test_conversation_and_tokens_decode_with_the_real_tokenizer(tmp_path):
    tok = _tok()
    p0 = _ids(tok, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nfix the bug<|im_end|>\n"
                   "<|im_start|>assistant\n")
    c0 = _ids(tok, '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call><|im_end|>')
    p1 = _ids(tok, "\n<|im_start|>user\n<tool_response>\nREADME.md\n</tool_response><|im_end|>\n"
                   "<|im_start|>assistant\n")
    c1 = _ids(tok, "Done.<|im_end|>")
    store = Store(tmp_path / "trajectories.db")
    store.open_session("e1", {"task_id": "t", "harness": "h"}, "h", "tiny-llama")
    base = dict(session_id="e1", dialect="openai_chat", segment=0, split_reason=None, finish_reason="stop", flags={})
    store.add_call(call_id="a", idx=0, prefix_len=0, new_prompt=p0, completion=c0, logprobs=[-0.1] * len(c0),
                   versions=[2] * len(c0), queue_s=0.01, gen_s=0.5, env_s=None, **base)
    store.add_call(call_id="b", idx=1, prefix_len=len(p0) + len(c0), new_prompt=p1, completion=c1,
                   logprobs=[-2.0] * len(c1), versions=[3] * len(c1), queue_s=0.0, gen_s=0.2, env_s=1.5, **base)
    store.set_reward("e1", 1.0, "ok", "submitted")
    store.close()
    client = TestClient(build_app([RunIndex(tmp_path)]))
    head = client.get("/api/runs/0/episodes/e1").json()
    assert head["decoded_with"] == "tiny-llama" and head["sampled_total"] == len(c0) + len(c1)
    calls = client.get("/api/runs/0/episodes/e1/calls").json()["calls"]
    assert calls[0]["messages"] == [{"role": "system", "content": "You are terse."},
                                    {"role": "user", "content": "fix the bug"}]
    assert calls[0]["tool_calls"] == [{"name": "bash", "arguments": {"command": "ls -la"}}]
    assert calls[1]["messages"] == [{"role": "user", "content": "<tool_response>\nREADME.md\n</tool_response>"}]
    assert calls[1]["reply"] == "Done." and calls[1]["env_s"] == 1.5 and calls[1]["versions"] == [3]
    page = client.get("/api/runs/0/episodes/e1/tokens?segment=0").json()
    ids = p0 + c0 + p1 + c1
    assert page["ids"] == ids and page["total"] == len(ids)
    assert page["mask"] == [0] * len(p0) + [1] * len(c0) + [0] * len(p1) + [1] * len(c1)
    assert page["version"] == [-1] * len(p0) + [2] * len(c0) + [-1] * len(p1) + [3] * len(c1)
    assert page["logprob"][len(p0)] == -0.1 and page["logprob"][-1] == -2.0
    assert "".join(page["text"]) == tok.decode(ids, skip_special_tokens=False)
    assert page["call"] == [0] * (len(p0) + len(c0)) + [1] * (len(p1) + len(c1))
    assert page["call_starts"] == {"0": 0, "1": len(p0) + len(c0)}
    part = client.get(f"/api/runs/0/episodes/e1/tokens?segment=0&offset={len(p0)}&limit=3").json()
    assert part["ids"] == c0[:3] and part["mask"] == [1, 1, 1] and part["call"] == [0, 0, 0]


def test_a_spawned_segment_names_its_parent(tmp_path):
    store = Store(tmp_path / "trajectories.db")
    store.open_session("p", {"task_id": "t", "harness": "h"}, "h", "tiny-llama")
    base = dict(session_id="p", dialect="openai_chat", finish_reason="stop", queue_s=0.0, gen_s=0.1, env_s=None)
    store.add_call(call_id="a", idx=0, segment=0, split_reason=None, prefix_len=0, new_prompt=[1, 2],
                   completion=[3], logprobs=[-0.1], versions=[0], flags={}, **base)
    store.add_call(call_id="b", idx=1, segment=1, split_reason="spawned", prefix_len=0, new_prompt=[4],
                   completion=[5, 6], logprobs=[-0.2, -0.3], versions=[0, 0],
                   flags={"spawned_by": {"segment": 0, "tool": "Task", "tool_call_id": "call_1", "call": 0}}, **base)
    store.close()
    head = TestClient(build_app([RunIndex(tmp_path)])).get("/api/runs/0/episodes/p").json()
    assert [s["split_reason"] for s in head["segments"]] == [None, "spawned"]
    assert head["segments"][1]["spawned_by"] == {"segment": 0, "tool": "Task", "tool_call_id": "call_1", "call_id": "a"}
    assert head["segments"][0]["spawned_by"] is None


def test_message_splitting_and_tool_calls():
    assert split_messages("plain text prompt") == [{"role": "prompt", "content": "plain text prompt"}]
    llama = ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
             "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert split_messages(llama) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert tool_calls("I will look.\n```bash\nls -la\n```") == [{"name": "bash", "arguments": {"command": "ls -la"}}]
    assert tool_calls("no tools here") == []


def test_jsonl_only_run_and_grading_metadata_from_the_jsonl(tmp_path):
    """A collect-style folder (JSONL, no store) is indexed line by line; with a store, the
    episode page reads the JSONL line (the grading record) by its offset."""
    many_run(tmp_path / "a", n=6)
    store = Store(tmp_path / "a" / "trajectories.db")
    trajs = [store.trajectory(sid) for sid in store.session_ids()]
    store.close()
    for t in trajs:
        t.metadata["grading"] = {"reason": f"graded {t.session_id}", "agent_diff": "diff --git a/x b/x\n",
                                 "agent_diff_chars": 20, "test_output": "1 passed", "tests": []}
    lines = "".join(t.to_json() + "\n" for t in trajs)
    (tmp_path / "a" / "trajectories.jsonl").write_text(lines)
    (tmp_path / "b" / "episodes").mkdir(parents=True)
    (tmp_path / "b" / "episodes" / "trajectories.jsonl").write_text(lines)
    client = TestClient(build_app([RunIndex(tmp_path / "a"), RunIndex(tmp_path / "b")]))
    for r in (0, 1):
        rows = client.get(f"/api/runs/{r}/episodes?limit=10").json()["rows"]
        assert [x["sid"] for x in rows] == [t.session_id for t in trajs]
        assert [x["tokens"] for x in rows] == [sum(len(s.token_ids) for s in t.segments) for t in trajs]
        head = client.get(f"/api/runs/{r}/episodes/s0003").json()
        assert head["grading"]["reason"] == "graded s0003" and head["grading"]["test_output"] == "1 passed"
    cmp = client.get("/api/compare/tasks?runs=0,1").json()
    assert cmp["total"] == len({t.task_id for t in trajs})
    row = next(x for x in cmp["rows"] if x["task_id"] == "task-3")
    assert row["by_run"]["0"] == row["by_run"]["1"] == {"episodes": 1, "successes": 1, "reward_mean": 1.0}


def test_a_jsonl_line_the_store_lacks_sits_after_its_neighbour_and_a_partial_line_waits(tmp_path):
    many_run(tmp_path, n=3)
    store = Store(tmp_path / "trajectories.db")
    trajs = [store.trajectory(sid) for sid in store.session_ids()]
    store.close()
    lost = Trajectory(session_id="unrecorded-1", segments=[], reward=None, status="infra_error",
                      termination="infra", task_id="t-lost", harness="h")
    lines = [trajs[0].to_json(), lost.to_json(), trajs[1].to_json(), trajs[2].to_json()]
    (tmp_path / "trajectories.jsonl").write_text("\n".join(lines) + "\n" + trajs[0].to_json()[:50])
    index = RunIndex(tmp_path)
    assert [r["sid"] for r in index.episodes()["rows"]] == ["s0000", "unrecorded-1", "s0001", "s0002"]
    assert index.trajectory("unrecorded-1").task_id == "t-lost"


def test_the_index_follows_a_live_store_and_reading_it_changes_nothing(tmp_path):
    many_run(tmp_path, n=3)
    index = RunIndex(tmp_path, refresh_s=0.0)
    assert index.episodes()["total"] == 3 and index.builds == 1
    assert index.trajectory("s0001").session_id == "s0001"  # opens the store: no rebuild for that
    assert index.episodes()["total"] == 3 and index.builds == 1
    store = Store(tmp_path / "trajectories.db")  # the proxy, still writing
    store.open_session("late", {"task_id": "t9", "harness": "h"}, "h", "tiny-llama")
    assert index.episodes()["total"] == 4 and index.episodes(task="t9")["rows"][0]["status"] == "running"
    store.set_reward("late", 1.0, "ok", "submitted")
    assert index.episodes(task="t9")["rows"][0]["reward"] == 1.0 and index.builds == 3
    store.close()


@pytest.mark.timeout(120)
def test_the_command_serves_the_page_and_api_over_http(tmp_path):
    import httpx

    many_run(tmp_path / "a", n=5)
    many_run(tmp_path / "b", n=2)
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl.cli", "view", str(tmp_path / "a"), str(tmp_path / "b"),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("harnessrl view: http://127.0.0.1:") and "(2 run(s), 7 episodes" in line, line
        base = line.split()[2].split("/#")[0]
        page = httpx.get(base + "/")
        assert page.status_code == 200 and '<script src="/static/app.js">' in page.text
        assert "https://" not in page.text and "cdn" not in page.text.lower()
        assert [r["episodes"] for r in httpx.get(base + "/api/runs").json()] == [5, 2]
        assert httpx.get(base + "/api/runs/1/episodes?limit=1&offset=1").json()["rows"][0]["sid"] == "s0001"
        assert httpx.get(base + "/static/charts.js").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_not_a_run_folder_is_one_clear_line(tmp_path):
    with pytest.raises(RunFolderError, match="no trajectories.db or trajectories.jsonl"):
        RunIndex(tmp_path)
    out = subprocess.run([sys.executable, "-m", "harnessrl.cli", "view", str(tmp_path / "missing")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip() == f"harnessrl view: {tmp_path / 'missing'}: no such run folder"
    assert "Traceback" not in out.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "trajectories.jsonl").write_text('{"session_id": "x", "segments": "nope"}\n')
    with pytest.raises(RunFolderError, match="trajectories.jsonl:1: not a trajectory record"):
        RunIndex(bad)


def test_the_summary_has_each_harness_s_figures(many):
    """A run of two harnesses: each one's episodes, scored, successes, mean reward, sampled tokens
    and failures, from the test's own arithmetic; the episodes filter takes the harness."""
    client, expected = many
    rows = {x["harness"]: x for x in client.get("/api/runs/0/summary").json()["by_harness"]}
    assert sorted(rows) == ["codex", "mini-swe-agent"]
    for name, row in rows.items():
        mine = [e for e in expected.values() if e["harness"] == name]
        scored = [e["reward"] for e in mine if e["reward"] is not None]
        assert row["episodes"] == len(mine) and row["scored"] == len(scored)
        assert row["success_rate"] == pytest.approx(sum(r >= 1 for r in scored) / len(scored))
        assert row["reward_mean"] == pytest.approx(sum(scored) / len(scored))
        assert row["sampled_tokens"] == sum(e["sampled"] for e in mine)
        assert row["infra_errors"] == sum(e["status"] == "infra_error" for e in mine) and row["harness_crashed"] == 0
        page = client.get(f"/api/runs/0/episodes?harness={name}&limit=500").json()
        assert page["total"] == len(mine) and {x["harness"] for x in page["rows"]} == {name}
