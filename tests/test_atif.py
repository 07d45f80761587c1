"""ATIF export: a harnessrl trajectory -> ATIF (validated against the schema written from
Harbor's RFC) -> back gives the same token ids, masks, logprobs, versions and segment splits;
`harnessrl export` writes ATIF, JSONL and Parquet of a real recorded run (a scripted-gold
mini-swe-agent episode in Docker, through the real proxy and its SQLite store)."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harnessrl.gym.tools.formats.atif import AtifError, from_atif, to_atif, validate
from harnessrl.gym.proxy.store import Store
from harnessrl.gym.trajectory import Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parent))


def stored_trajectory(tmp_path: Path) -> Trajectory:
    """Three calls through the real store: two in segment 0, a history rewrite opening segment 1,
    and one detached engine failure that extends no segment."""
    store = Store(tmp_path / "trajectories.db")
    store.open_session("s1", {"task": "t"}, "tmplhash", "tiny-llama")
    base = dict(session_id="s1", dialect="openai-chat", queue_s=0.01, gen_s=0.2, env_s=None)
    store.add_call(call_id="c0", idx=0, segment=0, split_reason=None, prefix_len=0, new_prompt=[1, 2, 3],
                   completion=[10, 11], logprobs=[-0.5, -0.25], versions=[3, 3], finish_reason="stop",
                   flags={"sampling": {"temperature": 1.0}}, **base)
    store.add_call(call_id="c1", idx=1, segment=0, split_reason=None, prefix_len=5, new_prompt=[4, 5],
                   completion=[12], logprobs=[-1.5], versions=[4], finish_reason="stop", flags={},
                   **{**base, "env_s": 0.7})
    store.add_call(call_id="c2", idx=2, segment=0, split_reason=None, prefix_len=8, new_prompt=[6],
                   completion=[], logprobs=[], versions=[], finish_reason="engine_error",
                   flags={"detached": "engine_error", "engine_error": "boom"}, **base)
    store.add_call(call_id="c3", idx=3, segment=1, split_reason="history_rewrite", prefix_len=0,
                   new_prompt=[1, 9], completion=[13, 14, 15], logprobs=[-0.1, -0.2, -0.3], versions=[4, 4, 5],
                   finish_reason="length", flags={"cached_tokens": 1}, **base)
    store.set_reward("s1", 0.5, "ok", "submitted")
    traj = store.trajectory("s1")
    store.close()
    return traj


def test_round_trip_is_exact_and_validates(tmp_path):
    traj = stored_trajectory(tmp_path)
    assert [s.split_reason for s in traj.segments] == [None, "history_rewrite"]
    doc = to_atif(traj, decode=lambda ids: " ".join(f"t{i}" for i in ids))
    validate(doc)
    assert [s["source"] for s in doc["steps"]] == ["user", "agent", "agent", "agent", "system", "agent"]
    assert [s["step_id"] for s in doc["steps"]] == [1, 2, 3, 4, 5, 6]
    first = doc["steps"][1]
    assert first["metrics"]["prompt_token_ids"] == [1, 2, 3]
    assert first["metrics"]["completion_token_ids"] == [10, 11] and first["metrics"]["logprobs"] == [-0.5, -0.25]
    assert first["observation"] == {"results": [{"content": "t4 t5"}]}  # what the harness sent next
    assert first["extra"]["harnessrl"]["loss_mask"] == [0, 0, 0, 1, 1]
    assert first["extra"]["harnessrl"]["versions"] == [-1, -1, -1, 3, 3]
    assert first["extra"]["harnessrl"]["flags"] == {"sampling": {"temperature": 1.0}}
    second = doc["steps"][2]
    assert second["metrics"]["prompt_token_ids"] == [1, 2, 3, 10, 11, 4, 5]
    assert second["extra"]["harnessrl"]["loss_mask"] == [0, 0, 0, 1, 1, 0, 0, 1]
    assert doc["steps"][4]["message"] == "new segment 1: history_rewrite"
    assert doc["steps"][5]["metrics"]["cached_tokens"] == 1
    assert doc["final_metrics"]["total_completion_tokens"] == 6
    assert doc["extra"]["harnessrl"]["segments"][1]["split_reason"] == "history_rewrite"

    back = from_atif(json.loads(json.dumps(doc)))
    assert back.to_dict() == traj.to_dict()
    assert back.segments[0].token_ids == [1, 2, 3, 10, 11, 4, 5, 12]
    assert back.segments[0].loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert back.segments[1].versions == [-1, -1, 4, 4, 5]
    assert [c.call_id for c in back.calls if c.detached] == ["c2"]


def test_an_episode_without_calls_exports_and_reads_back(tmp_path):
    store = Store(tmp_path / "trajectories.db")
    store.open_session("s0", {}, "h", "tiny-llama")
    store.set_reward("s0", 0.0, "ok", "harness_crashed")
    traj = store.trajectory("s0")
    doc = to_atif(traj)
    validate(doc)
    assert doc["steps"] == [{"step_id": 1, "source": "system", "message": "no model calls (harness_crashed)"}]
    assert from_atif(doc).to_dict() == traj.to_dict()


def test_tool_calls_and_their_observation(tmp_path):
    traj = stored_trajectory(tmp_path)
    texts = {(10, 11): 'Let me look.\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>',
             (12,): "THOUGHT: run it\n```bash\npython -m pytest -q\n```"}
    doc = to_atif(traj, decode=lambda ids: texts.get(tuple(ids), "x"))
    validate(doc)
    a, b = doc["steps"][1], doc["steps"][2]
    assert a["tool_calls"] == [{"tool_call_id": "c0-0", "function_name": "bash", "arguments": {"command": "ls"}}]
    assert a["observation"]["results"][0]["source_call_id"] == "c0-0"
    assert b["tool_calls"] == [{"tool_call_id": "c1-0", "function_name": "bash",
                                "arguments": {"command": "python -m pytest -q"}}]


def test_invalid_documents_are_refused_with_the_field(tmp_path):
    doc = to_atif(stored_trajectory(tmp_path))
    bad = copy.deepcopy(doc)
    bad["steps"][0]["source"] = "tool"
    with pytest.raises(AtifError, match=r"ATIF steps/0/source: 'tool' is not one of"):
        validate(bad)
    bad = copy.deepcopy(doc)
    bad["steps"][0]["metrics"] = {"prompt_tokens": 1}  # metrics only on agent steps
    with pytest.raises(AtifError, match=r"ATIF steps/0"):
        validate(bad)
    bad = copy.deepcopy(doc)
    bad["steps"][2]["step_id"] = 7
    with pytest.raises(AtifError, match=r"steps/2/step_id: is 7, must be 3"):
        validate(bad)
    bad = copy.deepcopy(doc)
    del bad["agent"]["version"]
    with pytest.raises(AtifError, match=r"ATIF agent: 'version' is a required property"):
        validate(bad)
    bad = copy.deepcopy(doc)
    bad["steps"][2]["extra"]["harnessrl"]["loss_mask"][-1] = 0
    with pytest.raises(AtifError, match=r"step 3: loss_mask/versions disagree"):
        from_atif(bad)


def export_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harnessrl.cli", "export", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_export_cli_missing_run_is_one_line(tmp_path):
    out = export_cli(str(tmp_path), "--format", "atif", "--out", str(tmp_path / "o"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"harnessrl export: {tmp_path}: no trajectories.jsonl")


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory):
    """A real run folder: one scripted-gold mini-swe-agent episode in Docker, recorded by the
    proxy's SQLite store, the trajectory also appended to trajectories.jsonl (as a rollout does)."""
    from harnessrl.adapters.toolchain import installed_spec
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    from adapter_helpers import builtin_task, docker_backend

    from harnessrl.adapters.mini_swe_agent import MiniSweAgentAdapter
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.served import ServedApp

    run = tmp_path_factory.mktemp("run")
    backend = docker_backend()
    task = builtin_task()
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    engine.set_tasks([task], gold=True)
    try:
        with ServedApp(engine.app()) as served, ProxyServer(ProxyConfig(
                engine_url=served.url, model="tiny-llama", db_path=str(run / "trajectories.db"))) as proxy:
            res = run_episode(task, MiniSweAgentAdapter(), lambda s, m: backend.create(s, mounts=m),
                              ProxyHandle.of(proxy), "policy", EpisodeConfig(max_calls=8, wall_time_s=400))
    finally:
        backend.reap(run_id=backend.run_id)
    assert (res.reason, res.trajectory.reward) == ("submitted", 1.0), res.error
    (run / "trajectories.jsonl").write_text(res.trajectory.to_json() + "\n")
    return run, res.trajectory, task


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_export_a_real_run_in_three_formats(recorded_run, tmp_path):
    run, traj, task = recorded_run
    out = export_cli(str(run), "--format", "atif", "--out", str(tmp_path / "atif"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"format": "atif", "trajectories": 1, "out": str(tmp_path / "atif")}
    (path,) = sorted((tmp_path / "atif").glob("*.json"))
    doc = json.loads(path.read_text())
    validate(doc)
    agent = [s for s in doc["steps"] if s["source"] == "agent"]
    assert len(agent) == len(traj.calls) == len(task.gold_plan) + 1
    assert doc["agent"]["name"] == "mini-swe-agent" and doc["extra"]["harnessrl"]["reward"] == 1.0
    # mini-swe-agent's actions are ```bash blocks: each plan command is a tool call, its output
    # the observation the harness sent back in the next request.
    commands = [tc["arguments"]["command"] for s in agent for tc in s.get("tool_calls", [])]
    assert commands[:len(task.gold_plan)] == task.gold_plan
    assert all("observation" in s for s in agent[:-1]) and "observation" not in agent[-1]
    assert all(s["timestamp"].endswith("Z") for s in doc["steps"])
    back = from_atif(doc)
    assert back.to_dict() == traj.to_dict()  # ids, masks, logprobs, versions, splits, flags, timings
    assert sum(back.segments[0].loss_mask) == sum(len(c.completion_ids) for c in traj.calls)

    out = export_cli(str(run), "--format", "jsonl", "--out", str(tmp_path / "t.jsonl"))
    assert out.returncode == 0, out.stderr
    (line,) = (tmp_path / "t.jsonl").read_text().splitlines()
    assert Trajectory.from_dict(json.loads(line)).to_dict() == traj.to_dict()

    out = export_cli(str(run), "--format", "parquet", "--out", str(tmp_path / "t.parquet"))
    assert out.returncode == 0, out.stderr
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert [(r["token_ids"], r["loss_mask"], r["versions"], r["split_reason"]) for r in rows] == [
        (s.token_ids, s.loss_mask, s.versions, s.split_reason) for s in traj.segments]
    # the store alone (a killed run's record): the same calls and segments, as ATIF too
    out = export_cli(str(run / "trajectories.db"), "--format", "atif", "--out", str(tmp_path / "db"))
    assert out.returncode == 0, out.stderr
    from_db = from_atif(json.loads(next((tmp_path / "db").glob("*.json")).read_text()))
    assert from_db.to_dict()["segments"] == traj.to_dict()["segments"]
    assert from_db.to_dict()["calls"] == traj.to_dict()["calls"]
    # the same rows as the store's own Parquet export
    store = Store(run / "trajectories.db")
    store.export_parquet(tmp_path / "store.parquet")
    store.close()
    assert pq.read_table(tmp_path / "store.parquet").to_pylist() == rows


def test_a_spawned_sub_agent_segment_keeps_its_attribution_through_atif(tmp_path):
    store = Store(tmp_path / "trajectories.db")
    store.open_session("s2", {}, "h", "tiny-llama")
    base = dict(session_id="s2", dialect="anthropic", queue_s=0.0, gen_s=0.1, env_s=None, flags={})
    store.add_call(call_id="m0", idx=0, segment=0, split_reason=None, prefix_len=0, new_prompt=[1, 2],
                   completion=[7], logprobs=[-0.5], versions=[1], finish_reason="stop", **base)
    store.add_call(call_id="a0", idx=1, segment=1, split_reason="spawned", prefix_len=0, new_prompt=[3],
                   completion=[8], logprobs=[-0.5], versions=[1], finish_reason="stop",
                   **{**base, "flags": {"spawned_by": {"segment": 0, "tool": "Agent", "tool_call_id": "call_9", "call": 0}}})
    store.set_reward("s2", 1.0, "ok", "submitted")
    traj = store.trajectory("s2")
    store.close()
    assert traj.segments[1].spawned_by == {"segment": 0, "tool": "Agent", "tool_call_id": "call_9", "call_id": "m0"}
    doc = to_atif(traj, decode=lambda ids: " ".join(f"t{i}" for i in ids))
    validate(doc)
    back = from_atif(json.loads(json.dumps(doc)))
    assert back.to_dict() == traj.to_dict()
