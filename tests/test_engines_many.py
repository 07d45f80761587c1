"""Three real local engines (tiny-llama, each its own process on loopback) behind one proxy:
sessions stick to one engine and spread over the three (the second call of a session hits
its engine's prefix cache), a weight sync reaches all three (the same weights and version on
each, read back from the engines), and a killed engine fails only the calls routed to it:
its session's call is recorded `engine_error` and moves, new sessions go to the other two,
the next sync leaves it behind without failing, and in real episodes (Docker sandboxes, a
real harness process) only the episode on it is masked. Real HTTP and tokenizer, no mocks."""
from __future__ import annotations

import asyncio
import collections
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.backends.fleet import EngineFleet
from harnessrl.gym.episode import engine_failures
from harnessrl.gym.models import load_tokenizer, resolve_model
from harnessrl.gym.proxy import ProxyConfig, ProxyServer
from harnessrl.trainers.weight_sync import DiskWeightSync

#: One client for the module's requests: a new one per request (httpx.get/post) loads the CA bundle, ~34 ms of CPU.
HTTP = httpx.Client()

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_helpers import start_engines  # noqa: E402
from proxy_helpers import post  # noqa: E402

pytestmark = pytest.mark.timeout(600)
MAX = 8


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def engines():
    trio = start_engines(3)
    yield trio
    for e in trio:
        e.kill()


@pytest.fixture
def fresh_engines():
    """Three engines of this test's own (it kills one)."""
    trio = start_engines(3)
    yield trio
    for e in trio:
        e.kill()


def _proxy(urls: list[str], tok) -> ProxyServer:
    # "honor": the calls below ask for greedy decoding, so each record can be re-checked
    return ProxyServer(ProxyConfig(engine_url=urls, model="tiny-llama", sampling_policy="honor"), tokenizer=tok)


def _chat(proxy: ProxyServer, sid: str, key: str, messages: list[dict], max_tokens: int = MAX,
          stream: bool = False) -> httpx.Response:
    return post(proxy.openai_base_url(sid) + "/chat/completions", key,
                {"model": "policy", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream})


def _say(proxy, sid, key, messages: list[dict]) -> None:
    """One call that must succeed; its reply and a new user turn are appended to `messages`."""
    r = _chat(proxy, sid, key, messages)
    assert r.status_code == 200, r.text
    messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "go on"}]


def _direct(url: str, prompt: list[int], n: int = MAX) -> tuple[list[int], list[float]]:
    """Greedy ids and logprobs straight from one engine."""
    r = HTTP.post(url + "/generate", json={"input_ids": prompt, "return_logprob": True, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "stop_token_ids": [2]}}, timeout=120).json()
    lps = r["meta_info"]["output_token_logprobs"]
    return [e[1] for e in lps], [e[0] for e in lps]


def _perturbed(folder: Path) -> Path:
    """tiny-llama with every weight moved (seeded), saved as a weights folder."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-llama")), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(folder)
    return folder


class SavedPolicy:
    """The publish side of the `Trainer` contract: weights from a folder into `target`, a version out."""

    def __init__(self, source: Path, version: int):
        self.source, self.version = source, version

    def publish(self, target: Path) -> int:
        import shutil

        shutil.copytree(self.source, target)
        return self.version


def test_sessions_stick_to_one_engine_and_spread_over_three(engines, tok):
    urls = [e.url for e in engines]
    with _proxy(urls, tok) as proxy:
        sessions = [proxy.open_session({}) for _ in range(6)]
        convs = [[{"role": "user", "content": f"Session {i}: list {i + 3} fruits."}] for i in range(6)]
        for _ in range(2):
            for (sid, key), messages in zip(sessions, convs):
                _say(proxy, sid, key, messages)
        for i, (sid, _) in enumerate(sessions):
            first, second = proxy.trajectory(sid).calls
            # least sessions, ties to the lowest index: session i on engine i % 3, both calls
            assert first.flags["engine"] == second.flags["engine"] == urls[i % 3]
            # its second prompt extends the first: that engine holds the whole first prompt in its cache
            assert second.prompt_ids[:len(first.prompt_ids)] == first.prompt_ids
            assert second.flags["cached_tokens"] >= len(first.prompt_ids)
            for c in (first, second):  # exactly what that engine samples for the recorded prompt
                ids, lps = _direct(c.flags["engine"], c.prompt_ids)  # (a cached prefix moves logprobs ~1e-6)
                assert c.completion_ids == ids and c.logprobs == pytest.approx(lps, abs=1e-4)
        report = {e["url"]: e for e in proxy.stats()["engines"]}
        assert [(report[u]["in_service"], report[u]["sessions"], report[u]["calls"]) for u in urls] == [(True, 2, 4)] * 3
        for sid, _ in sessions:
            proxy.close_session(sid)
        assert [e["sessions"] for e in proxy.stats()["engines"]] == [0, 0, 0]


def test_streamed_engine_requests_stick_too(engines, tok):
    """`engine_stream`: the proxy relays the engine's token stream (`generate_stream`), routed the same way."""
    urls = [e.url for e in engines]
    cfg = ProxyConfig(engine_url=urls, model="tiny-llama", sampling_policy="honor", engine_stream=True)
    with ProxyServer(cfg, tokenizer=tok) as proxy:
        sessions = [proxy.open_session({}) for _ in range(3)]
        for _ in range(2):
            for i, (sid, key) in enumerate(sessions):
                r = _chat(proxy, sid, key, [{"role": "user", "content": f"stream {i}"}], stream=True)
                assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
        for i, (sid, _) in enumerate(sessions):
            calls = proxy.trajectory(sid).calls
            assert [c.flags["engine"] for c in calls] == [urls[i]] * 2
            for c in calls:
                assert c.completion_ids == _direct(urls[i], c.prompt_ids)[0]


def test_a_dead_first_engine_is_routed_around_from_the_first_call(engines, tok):
    """The proxy asks an engine for its model facts before the first generation; when the first
    listed is dead, the next one answers, and the call is served there."""
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port here
    with _proxy([dead, engines[0].url], tok) as proxy:
        sid, key = proxy.open_session({})
        _say(proxy, sid, key, [{"role": "user", "content": "hello"}])
        assert proxy.trajectory(sid).calls[0].flags["engine"] == engines[0].url
        report = proxy.stats()["engines"]
        assert [e["in_service"] for e in report] == [False, True] and "refused" in report[0]["reason"]


def test_with_every_engine_out_a_call_takes_back_those_that_answer(engines, tok):
    urls = [engines[0].url, engines[1].url, "http://127.0.0.1:9"]
    with _proxy(urls, tok) as proxy:
        for u in urls:
            proxy.core.engine.take_out(u, "taken out by the test")
        sid, key = proxy.open_session({})
        _say(proxy, sid, key, [{"role": "user", "content": "anyone?"}])
        assert proxy.trajectory(sid).calls[0].flags["engine"] == urls[0]
        assert [(e["in_service"], e["reason"]) for e in proxy.stats()["engines"]] == [
            (True, ""), (True, ""), (False, "taken out by the test")]


def test_a_weight_sync_reaches_all_three_engines(engines, tok, tmp_path):
    urls = [e.url for e in engines]
    prompt = tok.encode("The three engines hold the same weights:", add_special_tokens=False)
    before = [_direct(u, prompt) for u in urls]
    assert before[0] == before[1] == before[2]
    policy = SavedPolicy(_perturbed(tmp_path / "perturbed"), version=7)

    async def push(proxy) -> tuple[int, EngineFleet]:
        fleet = EngineFleet(urls)
        try:
            return await DiskWeightSync(fleet, tmp_path / "weights", gate=proxy).push(policy), fleet
        finally:
            await fleet.aclose()

    with _proxy(urls, tok) as proxy:
        version, fleet = asyncio.run(push(proxy))
        assert version == 7 and fleet.version == 7 and fleet.behind() == []
        assert [(e["in_service"], e["version"]) for e in fleet.report()] == [(True, "7")] * 3
        infos = [HTTP.get(u + "/get_model_info", timeout=30).json() for u in urls]
        assert [(i["weight_version"], i["model_path"]) for i in infos] == [("7", str(tmp_path / "weights" / "v7"))] * 3
        after = [_direct(u, prompt) for u in urls]
        assert after[0] == after[1] == after[2] != before[0]  # the same new weights, bit for bit, on each
        assert not proxy.stats()["paused"]
        sid, key = proxy.open_session({})
        _say(proxy, sid, key, [{"role": "user", "content": "hello"}])
        [c] = proxy.trajectory(sid).calls
        assert c.versions == [7] * len(c.completion_ids)


def test_a_lora_sync_loads_the_adapter_on_all_three_engines(engines, tok, tmp_path):
    """`AdapterWeightSync` over the fleet: the adapter loaded and the version stamped on every
    engine in one pause, and the proxy's router names it to each engine's generations."""
    from harnessrl.gym.trajectory import Segment, Trajectory
    from harnessrl.trainers.lora import LoraConfig
    from harnessrl.trainers.lora_sync import AdapterWeightSync
    from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig

    urls = [e.url for e in engines]
    trainer = TorchTrainer(TorchTrainerConfig(model="tiny-llama", device="cpu", lr=5e-3, seed=0,
                                              lora=LoraConfig(rank=8, alpha=16)))
    ids = tok.apply_chat_template([{"role": "user", "content": "Name a prime."}], add_generation_prompt=True,
                                  return_dict=False)
    group = []
    for i in range(2):  # two completions the engine sampled, rewards 1 and 0: one update
        out, lps = _direct(urls[0], ids)
        seg = Segment(token_ids=ids + out, loss_mask=[0] * len(ids) + [1] * len(out), logprobs=[0.0] * len(ids) + lps,
                      versions=[-1] * len(ids) + [0] * len(out))
        group.append(Trajectory(session_id=f"lora-{i}", task_id="lora", reward=float(i == 0), status="ok",
                                segments=[seg]))
    trainer.step(group)

    async def push(proxy) -> tuple[int, str, list]:
        fleet = EngineFleet(urls)
        try:
            sync = AdapterWeightSync(fleet, tmp_path / "weights", gate=proxy)
            return await sync.push(trainer), sync.last_mode, fleet.report()
        finally:
            await fleet.aclose()

    with _proxy(urls, tok) as proxy:
        version, mode, report = asyncio.run(push(proxy))
        assert (version, mode) == (1, "adapter")
        assert [(e["in_service"], e["version"]) for e in report] == [(True, "1")] * 3
        assert [s.backend.lora_name for s in proxy.core.engine.slots] == ["policy"] * 3
        assert [HTTP.get(u + "/get_model_info", timeout=30).json()["weight_version"] for u in urls] == ["1"] * 3
        named = [HTTP.post(u + "/generate", timeout=60, json={
            "input_ids": ids, "lora_path": "policy", "return_logprob": True,
            "sampling_params": {"max_new_tokens": MAX, "temperature": 0}}).json()["meta_info"]["output_token_logprobs"]
            for u in urls]
        assert named[0] == named[1] == named[2]  # the same adapter on each
        served = []
        for _ in range(3):  # one session per engine, each call naming the adapter there
            sid, key = proxy.open_session({})
            _say(proxy, sid, key, [{"role": "user", "content": "Hi"}])
            [c] = proxy.trajectory(sid).calls
            assert c.versions == [1] * len(c.completion_ids)
            served.append(c.flags["engine"])
        assert served == urls


def test_a_killed_engine_fails_only_its_session_and_is_left_behind(fresh_engines, tok, tmp_path):
    urls = [e.url for e in fresh_engines]
    dead = urls[1]
    with _proxy(urls, tok) as proxy:
        sessions = [proxy.open_session({}) for _ in range(3)]
        convs = [[{"role": "user", "content": f"Episode {i} begins."}] for i in range(3)]
        for (sid, key), messages in zip(sessions, convs):
            _say(proxy, sid, key, messages)
        (s0, k0), (s1, k1), (s2, k2) = sessions
        # killed while it generates session 1's second reply (a long one: greedy, 1500 tokens)
        out: dict = {}
        long_call = threading.Thread(target=lambda: out.update(r=_chat(proxy, s1, k1, convs[1], max_tokens=1500)))
        long_call.start()
        while not HTTP.get(dead + "/get_model_info", timeout=30).json().get("running"):
            time.sleep(0.02)  # until the engine is decoding it
        fresh_engines[1].kill()
        long_call.join(120)
        r = out["r"]
        assert r.status_code == 503 and "<engine>" in r.text and dead not in r.text  # no engine address leaks
        failed = proxy.trajectory(s1).calls[1]
        assert (failed.finish_reason, failed.flags["detached"], failed.flags["engine"]) == (
            "engine_error", "engine_error", dead)
        assert failed.flags["engine_error_kind"] == "unavailable" and failed.completion_ids == []
        assert engine_failures(proxy.trajectory(s1)) == [1]  # what masks the episode (gym.episode)
        for sid, key, messages in ((s0, k0, convs[0]), (s2, k2, convs[2])):  # the others go on where they were
            _say(proxy, sid, key, messages)
        _say(proxy, s1, k1, convs[1])  # the harness retries: its session moved to a live engine
        assert proxy.trajectory(s1).calls[2].flags["engine"] == urls[0]  # fewest sessions, lowest index
        later = [proxy.open_session({}) for _ in range(4)]
        for sid, key in later:
            _say(proxy, sid, key, [{"role": "user", "content": f"later {sid}"}])
        served = collections.Counter(proxy.trajectory(sid).calls[0].flags["engine"] for sid, _ in later)
        assert served == {urls[0]: 2, urls[2]: 2}
        report = {e["url"]: e for e in proxy.stats()["engines"]}
        assert not report[dead]["in_service"] and "unreachable" in report[dead]["reason"]
        assert report[urls[0]]["in_service"] and report[urls[2]]["in_service"]

        async def push() -> tuple[int, list, list, dict]:
            fleet = EngineFleet(urls)
            try:
                v = await DiskWeightSync(fleet, tmp_path / "weights", gate=proxy).push(
                    SavedPolicy(resolve_model("tiny-llama"), version=1))
                return v, fleet.serving(), fleet.behind(), await fleet.read_versions()
            finally:
                await fleet.aclose()

        version, serving, behind, versions = asyncio.run(push())
        assert version == 1 and serving == [urls[0], urls[2]]
        [b] = behind
        assert b["url"] == dead and b["version"] is None and "unreachable" in b["reason"]
        assert versions == {urls[0]: "1", dead: None, urls[2]: "1"}
        assert not {e["url"]: e for e in proxy.stats()["engines"]}[dead]["in_service"]  # still routed around

        # A stopped engine accepts connections and never answers: the sync waits `late_s` for it
        # once the others are done, then goes on without it, and the proxy routes around it too.
        stopped = urls[2]
        os.kill(fresh_engines[2].proc.pid, signal.SIGSTOP)
        try:
            async def push_late() -> tuple[int, list, list]:
                fleet = EngineFleet(urls, late_s=2.0)
                try:
                    v = await DiskWeightSync(fleet, tmp_path / "weights", gate=proxy).push(
                        SavedPolicy(resolve_model("tiny-llama"), version=2))
                    return v, fleet.serving(), fleet.behind()
                finally:
                    await fleet.aclose()

            version, serving, behind = asyncio.run(push_late())
            assert version == 2 and serving == [urls[0]]
            assert [b["url"] for b in behind] == [dead, stopped]
            assert "no answer within 2 s of the other engines" in behind[1]["reason"]
            assert [e["in_service"] for e in proxy.stats()["engines"]] == [True, False, False]
            sid, key = proxy.open_session({})
            _say(proxy, sid, key, [{"role": "user", "content": "after the stop"}])
            [c] = proxy.trajectory(sid).calls
            assert c.flags["engine"] == urls[0] and c.versions == [2] * len(c.completion_ids)
        finally:
            os.kill(fresh_engines[2].proc.pid, signal.SIGCONT)


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_on_three_engines_masks_only_the_episode_on_the_killed_one(fresh_engines, tmp_path):
    """`harnessrl train` with `engine_url` a list of three: one group of three real mini-swe-agent
    episodes (Docker sandboxes), the first on engine 0, which is SIGKILLed once it has served a
    call. Only that episode is masked (`engine_error`); the two on the other engines are scored."""
    import json
    import sqlite3

    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.trainers.loop import TrainConfig, train
    from adapter_helpers import docker_backend

    docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    urls = [e.url for e in fresh_engines]
    cfg = TrainConfig.model_validate({
        "model": "tiny-llama", "steps": 1, "out_dir": str(tmp_path), "progress": False, "tensorboard": False,
        "engine_url": urls, "stages": ["rl"], "eval": {"points": []},
        "rollout": {"tasks": ["harnessrl-builtin__cachekit-2"], "max_new_tokens": 16, "sandbox": "docker",
                    "episode": {"max_calls": 8, "wall_time_s": 300}},
        "scheduler": {"env_pool_size": 3, "group_size": 3, "groups_per_step": 1, "staleness": 0},
        "trainer": {"lr": 1e-5, "device": "cpu"},
        "sampling": {"zero_variance": "drop"},  # no refill: the step is this one group
    })
    db = tmp_path / "rollouts" / "trajectories.db"
    db.parent.mkdir()

    def kill_engine_0_once_it_served() -> None:
        while True:
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
                    if c.execute("SELECT COUNT(*) FROM calls WHERE instr(flags, ?) > 0", (urls[0],)).fetchone()[0]:
                        fresh_engines[0].kill()
                        return
            except sqlite3.Error:
                pass  # not created yet
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_engine_0_once_it_served, daemon=True)
    watcher.start()
    [m] = asyncio.run(train(cfg))
    watcher.join(60)
    assert fresh_engines[0].proc.returncode == -9
    assert m["masked_infra"] == 1 and m["batch_report"]["failures_by_reason"] == {"engine_error": 1}
    assert [e["url"] for e in m["engines_out"]] == [urls[0]]
    trajs = [json.loads(x) for x in (tmp_path / "rollouts" / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 3
    engines_of = [[c["flags"].get("engine") for c in t["calls"]] for t in trajs]
    [masked] = [i for i, t in enumerate(trajs) if t["status"] == "infra_error"]
    assert (trajs[masked]["termination"], trajs[masked]["reward"]) == ("engine_error", None)
    assert engines_of[masked][0] == urls[0]
    assert any(c["finish_reason"] == "engine_error" and c["flags"]["engine"] == urls[0] for c in trajs[masked]["calls"])
    scored = [i for i in range(3) if i != masked]
    assert all(trajs[i]["status"] in ("ok", "truncated") and trajs[i]["reward"] is not None for i in scored)
    # each scored episode stayed on one engine, not the killed one (which of the two depends on
    # when its first call came: the masked episode's moved session counts as load too)
    for i in scored:
        assert len(set(engines_of[i])) == 1 and engines_of[i][0] in (urls[1], urls[2]), engines_of[i]
