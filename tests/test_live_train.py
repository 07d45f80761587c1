"""Live sessions as training data (`trainers.live`, `samples.live_baseline`): the advantage on
hand-computed numbers, which recorded sessions a run takes and refuses (real store, real HTTP),
and one `harnessrl train` step on the tiny model that consumes them beside a sandboxed task."""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.live.feedback import Feedback, record_feedback
from harnessrl.gym.live.serve import Serve, ServeConfig
from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy.store import Store
from harnessrl.gym.trajectory import Trajectory
from harnessrl.trainers.live import LiveConfig, LiveSource
from harnessrl.trainers.samples import RecordError, SampleConfig, build_samples

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from proxy_helpers import ServedApp, fill_placeholders, fixture_requests, standin  # noqa: E402
from test_samples import seg, traj  # noqa: E402


def live(sid: str, reward, baseline=0.5, weight=1.0, status="ok") -> Trajectory:
    t = traj(sid, task="", reward=reward, status=status)
    t.metadata = {"live": {"baseline": baseline, "policy_version": 0, "staleness": 0}, "weight": weight}
    return t


def test_live_advantage_is_reward_minus_baseline_scaled_by_weight() -> None:
    batch = [traj("a1", "A", 1.0), traj("a2", "A", 0.0), live("l1", 1.0, 0.25, 0.5), live("l2", 0.0, 0.25, 0.5),
             live("l3", None)]
    out = build_samples(batch, SampleConfig(normalize_std=False))
    # GRPO group A: +-0.5; live: (1 - 0.25) * 0.5 = 0.375, (0 - 0.25) * 0.5 = -0.125; l3 has no reward: never trained
    assert out.advantages == {"a1": 0.5, "a2": -0.5, "l1": 0.375, "l2": -0.125}
    assert out.groups == 1 and out.masked_infra == 1 and out.trajectories == 4
    assert out.reward_mean == 0.5  # the tasks' figure: live rewards are the user's, reported apart
    assert {s.session_id for s in out.samples} == {"a1", "a2", "l1", "l2"}
    for bad in (1.5, -0.1, "0.5", True, None, float("nan")):
        with pytest.raises(RecordError, match="metadata.live.baseline"):
            build_samples([live("x", 1.0, bad)], SampleConfig())


def _record(srv: Serve, label: str, reward: float | None, at: float) -> str:
    """One live session through real HTTP (mini-swe-agent's first request), then its feedback."""
    sid, key = srv.new_session(label)
    body = fill_placeholders(fixture_requests("mini-swe-agent.jsonl")[0]["body"]) | {"max_tokens": 8}
    r = httpx.post(f"{srv.url}/s/{sid}/v1/chat/completions", json=body, timeout=300,
                   headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    if reward is not None:
        srv.proxy.close_session(sid)
        record_feedback(srv.proxy.core.store, sid, Feedback(reward, label), now=at)
    return sid


def _foreign(store_dir: Path, tok_hash: str, at: float) -> str:
    """A rewarded live session recorded under another chat template (its hash differs)."""
    st = Store(str(store_dir / "calls.db"))
    st.open_session("f0f0f0f0f0f0f0f0", {"live": True, "harness": "other", "tokenizer_hash": tok_hash},
                    "0123456789abcdef", "tiny-llama")
    record_feedback(st, "f0f0f0f0f0f0f0f0", Feedback(1.0), now=at)
    st.close()
    return "f0f0f0f0f0f0f0f0"


def test_the_source_takes_rewarded_matching_sessions_once_and_refuses_the_rest(tmp_path) -> None:
    tok = load_tokenizer("tiny-llama")
    engine, _ = standin(tok)
    now = time.time()
    with ServedApp(engine.app()) as eng, Serve(ServeConfig(store=str(tmp_path), model="tiny-llama", port=0),
                                               eng.url) as srv:
        a = _record(srv, "a", 1.0, now - 30)
        b = _record(srv, "b", 0.0, now - 20)
        c = _record(srv, "c", 0.5, now - 1)  # too fresh for min_reward_age_s = 10
        _record(srv, "unrewarded", None, now)
        foreign = _foreign(tmp_path, srv.tokenizer_hash, now - 40)
        engine.weight_version = "3"  # a session sampled by a policy version this run has not reached
        newer = _record(srv, "newer", 1.0, now - 50)
    logged: list[str] = []
    src = LiveSource(LiveConfig(store=str(tmp_path), per_step=1, max_sessions=5, min_reward_age_s=10, weight=0.5),
                     "tiny-llama", tok, log=logged.append)
    (first,) = src.take(current_version=2)
    assert first.session_id == a  # oldest feedback first; the pool is a and b: baseline 0.5
    assert first.metadata["live"] == {"baseline": 0.5, "policy_version": 0, "staleness": 2}
    assert first.metadata["weight"] == 0.5
    assert src.refused == {
        foreign: "recorded with chat template hash '0123456789abcdef', this run's is "
                 f"{srv.proxy.core.renderer.template_hash!r}: its token ids would not mean the same",
        newer: "was sampled by policy version 3, newer than this run's 2 (another run's numbering)"}
    assert logged == [f"live session {foreign} refused: {src.refused[foreign]}",
                      f"live session {newer} refused: {src.refused[newer]}"]
    assert [t.session_id for t in src.take(2)] == [b] and src.take(2) == []  # each once; c too fresh
    assert src.used == [a, b] and c not in src.used
    other = LiveSource(LiveConfig(store=str(tmp_path)), "smollm2-135m", tok, log=logged.append)
    assert other.take(5) == [] and all("model 'tiny-llama', this run's is 'smollm2-135m'" in why
                                       for why in other.refused.values())


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_step_consumes_rewarded_live_sessions_beside_a_sandboxed_task(tmp_path: Path) -> None:
    from test_rollout_and_train import TASK, _need_stack

    _need_stack()
    from harnessrl.trainers.engine import EngineServer
    from harnessrl.trainers.loop import TrainConfig, train

    store = tmp_path / "live"
    now = time.time()
    with EngineServer(model="tiny-llama", port=0, weight_version="0") as engine, \
            Serve(ServeConfig(store=str(store), model="tiny-llama", port=0, max_tokens_cap=8), engine.url) as srv:
        good = _record(srv, "good", 1.0, now - 20)
        bad = _record(srv, "bad", 0.0, now - 10)
        unrewarded = _record(srv, "unrewarded", None, now)
        foreign = _foreign(store, srv.tokenizer_hash, now - 30)
    cfg = TrainConfig.model_validate({
        "model": "tiny-llama", "steps": 1, "out_dir": str(tmp_path / "run"), "progress": False, "tensorboard": False,
        "stages": ["rl"], "eval": {"points": []},
        "rollout": {"tasks": [TASK], "max_new_tokens": 32, "sandbox": "docker",
                    "episode": {"max_calls": 2, "wall_time_s": 180}},
        "scheduler": {"env_pool_size": 2, "group_size": 2, "groups_per_step": 1, "staleness": 1},
        "trainer": {"lr": 1e-5, "device": "cpu"},
        "sampling": {"zero_variance": "keep"},  # the tiny model scores 0 everywhere: train on it anyway
        "live": {"store": str(store), "per_step": 8},
    })
    (m,) = asyncio.run(train(cfg))
    assert m["live_sessions"] == [good, bad] and unrewarded not in m["live_sessions"]
    assert m["live_baseline"] == 0.5 and m["live_reward_mean"] == 0.5 and m["live_staleness"] == [0, 0]
    assert m["updated"] is True and m["version"] == 1
    assert m["trajectories"] + m["masked_infra"] == 4  # the group's 2 episodes and the 2 live sessions
    assert m["batch_report"]["episodes"] == 2  # the task's figures count the sandboxed episodes only
    run = json.loads((tmp_path / "run" / "report.json").read_text())
    assert run["live"]["trained"] == [good, bad]
    assert list(run["live"]["refused"]) == [foreign] and "chat template hash" in run["live"]["refused"][foreign]
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["live_sessions"] == [good, bad]
