"""Ray placement on a real local Ray cluster: the unchanged scheduler runs simulated episodes in
Ray actors with η kept and trajectories intact; a hung remote episode times out and its actor
is replaced; the real CPU engine serves /generate from a Ray actor."""
from __future__ import annotations

import asyncio
import functools
import itertools
import os
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray)")

from harnessrl.gym.ray_placement import RayEpisodes, RayPlacementConfig, engine_actor  # noqa: E402
from harnessrl.gym.ray_workers import SimWorker  # noqa: E402
from harnessrl.gym.scheduler import RolloutScheduler, SchedulerConfig, token_versions  # noqa: E402
from harnessrl.gym.stack import Publisher  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from adapter_helpers import docker_backend  # noqa: E402

pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


async def _train(sched: RolloutScheduler, steps: int, workers=None) -> list[tuple[int, list]]:
    """A trainer that takes `steps` batches, publishing a new version after each (to the
    scheduler, then pushed to the Ray workers)."""
    publisher = Publisher(sched, workers=workers)
    await sched.start()
    out = []
    try:
        for _ in range(steps):
            batch = await sched.next_batch()
            out.append((sched.version, batch))
            await asyncio.sleep(0.02)
            await publisher.publish(sched.version + 1)
    finally:
        await sched.close()
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("eta,policy", [(0, "wait"), (1, "requeue")])
def test_scheduler_places_simulated_episodes_on_ray_actors_within_eta(cluster, eta, policy):
    cfg = SchedulerConfig(env_pool_size=4, group_size=2, groups_per_step=2, staleness=eta, over_staleness=policy,
                          episode_timeout_s=120)
    episodes = RayEpisodes(functools.partial(SimWorker, turns=3, tokens_per_turn=4, latency_mean_s=0.03,
                                             latency_cv=1.0, seed=eta),
                           RayPlacementConfig(num_workers=2, episodes_per_worker=2, num_cpus_per_worker=0.5))
    try:
        episodes.wait_ready()
        sched = RolloutScheduler(cfg, episodes, itertools.cycle(["t0", "t1", "t2"]))
        batches = asyncio.run(_train(sched, steps=4, workers=episodes))
    finally:
        episodes.shutdown()
    lags = []
    for V, batch in batches:
        assert len(batch) >= 4  # two complete groups of two
        groups: dict[int, list] = {}
        for t in batch:
            groups.setdefault(t.metadata["group_id"], []).append(t)
            vs = token_versions(t)
            lags += [V - v for v in vs]
            # Intact: the record built on the worker arrives whole and valid.
            t.validate()
            seg = t.segments[0]
            assert seg.token_ids == [7, 7, 7, 7, 9] * 3 and seg.loss_mask == [1, 1, 1, 1, 0] * 3
            assert len(vs) == 12 and all(v >= t.metadata["start_version"] for v in vs)
            task, gid, index, start, attempt = t.metadata["slot"]
            assert (task, gid, start) == (t.task_id, t.metadata["group_id"], t.metadata["start_version"])
            assert t.session_id == f"{task}-g{gid}-{index}-a{attempt}"
            assert t.metadata["placement"]["pid"] != os.getpid()  # it ran in a Ray worker process
        assert all(len(g) == 2 for g in groups.values())
    assert max(lags) <= eta
    if eta == 0:
        assert set(lags) == {0}  # synchronous: exactly on-policy


@pytest.mark.timeout(300)
def test_hung_remote_episode_times_out_and_its_actor_is_replaced(cluster):
    class _Hang:  # defined here on purpose: cloudpickle ships it by value to the worker
        async def run(self, slot):
            if slot.task_id == "hang":
                await asyncio.Event().wait()
            return await SimWorker(turns=1, latency_mean_s=0.01).run(slot)

    cfg = SchedulerConfig(env_pool_size=3, group_size=1, groups_per_step=3, staleness=1, episode_timeout_s=10)
    episodes = RayEpisodes(_Hang, RayPlacementConfig(num_workers=3, num_cpus_per_worker=0.5))
    try:
        assert os.getpid() not in episodes.wait_ready()
        sched = RolloutScheduler(cfg, episodes, iter(["ok1", "hang", "ok2"]))
        [(V, batch)] = asyncio.run(_train(sched, steps=1))
    finally:
        episodes.shutdown()
    by_task = {t.task_id: t for t in batch}
    assert by_task["hang"].termination == "timeout" and not by_task["hang"].trainable
    assert by_task["ok1"].trainable and by_task["ok2"].trainable
    assert episodes.replaced == 1


def _waits_for_a_version():
    """A worker class whose episode ends once the version pushed to it moves past its start (a
    first attempt) or at once (a rerun), recording the version it saw (its one token's too). Made in a function:
    cloudpickle ships it by value to the worker, which cannot import the tests."""

    class WaitsForAVersion:
        async def run(self, slot):
            from harnessrl.gym.trajectory import Segment, Trajectory

            while slot.attempt == 0 and slot.version == slot.start_version:
                await asyncio.sleep(0.01)
            seg = Segment(token_ids=[7], loss_mask=[1], logprobs=[0.0], versions=[slot.version])  # sampled now
            return Trajectory(session_id=f"{slot.task_id}-a{slot.attempt}", segments=[seg], status="ok",
                              task_id=slot.task_id, metadata={"seen": slot.version, "attempt": slot.attempt})

    return WaitsForAVersion


async def _publish_while_running(sched: RolloutScheduler, episodes: RayEpisodes, version: int) -> list:
    """Start the scheduler, push `version` once an episode holds a worker, take one batch."""
    await sched.start()
    try:
        while not any(w.load for w in episodes.workers):
            await asyncio.sleep(0.01)
        await Publisher(sched, workers=episodes).publish(version)
        return await sched.next_batch()
    finally:
        await sched.close()


@pytest.mark.timeout(300)
def test_a_published_version_is_pushed_to_a_running_remote_episode(cluster):
    episodes = RayEpisodes(_waits_for_a_version(), RayPlacementConfig(num_workers=1, num_cpus_per_worker=0.5))
    try:
        episodes.wait_ready()
        sched = RolloutScheduler(SchedulerConfig(env_pool_size=1, group_size=1, groups_per_step=1, staleness=3,
                                                 episode_timeout_s=120), episodes, iter(["t"]))
        [t] = asyncio.run(_publish_while_running(sched, episodes, 3))
    finally:
        episodes.shutdown()
    assert (t.metadata["seen"], t.metadata["attempt"], t.metadata["start_version"]) == (3, 0, 0)
    assert episodes.replaced == 0


@pytest.mark.timeout(300)
def test_under_requeue_a_pushed_version_cancels_a_too_stale_remote_episode_and_reruns_it(cluster):
    episodes = RayEpisodes(_waits_for_a_version(), RayPlacementConfig(num_workers=1, num_cpus_per_worker=0.5))
    try:
        episodes.wait_ready()
        sched = RolloutScheduler(SchedulerConfig(env_pool_size=1, group_size=1, groups_per_step=1, staleness=0,
                                                 over_staleness="requeue", episode_timeout_s=120),
                                 episodes, iter(["t"]))
        [t] = asyncio.run(_publish_while_running(sched, episodes, 1))
    finally:
        episodes.shutdown()
    # the driver's watchdog woke on the publish (η = 0 exceeded), killed the episode's actor and the
    # scheduler reran the task at v1 on a fresh one
    assert (t.metadata["attempt"], t.metadata["start_version"], t.metadata["seen"]) == (1, 1, 1)
    assert sched.stats.requeued_turn == 1 and sched.stats.requeued_group == 0 and episodes.replaced == 1


@pytest.mark.model
@pytest.mark.timeout(300)
def test_engine_actor_serves_generate_to_a_client(cluster):
    from harnessrl.gym.backends.engine_client import EngineClient
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.trainers.engine import EngineServer

    actor = engine_actor(functools.partial(EngineServer, model="tiny-llama", port=0, num_threads=1), num_cpus=1)
    try:
        url = ray.get(actor.url.remote(), timeout=120)
        tok = load_tokenizer("tiny-llama")
        prompt = tok.encode("Hello there", add_special_tokens=False)

        async def go():
            async with EngineClient(url) as c:
                a = await c.generate(prompt, max_new_tokens=6, temperature=0.0)
                b = await c.generate(prompt, max_new_tokens=6, temperature=0.0)
                return a, b, await c.model_info()

        a, b, info = asyncio.run(go())
    finally:
        ray.get(actor.stop.remote(), timeout=60)
        ray.kill(actor)
    assert url.startswith("http://127.0.0.1:")
    assert len(a.output_ids) == 6 and a.finish_reason == "length" and a.prompt_tokens == len(prompt)
    assert a.output_ids == b.output_ids  # greedy: the served model is deterministic
    assert all(0 <= t < len(tok) for t in a.output_ids) and len(a.logprobs) == 6
    assert "tiny" in str(info.get("model_path", "")) or info.get("model_path")


def _tiny_agent(task_id: str):
    """A rollout config: the stdlib tiny-agent harness on one built-in task, in Docker."""
    from harnessrl.gym.rollout import RolloutConfig

    return RolloutConfig(harness=str(Path(__file__).resolve().parents[1] / "examples/harnesses/tiny-agent.toml"),
                         suite="builtin", tasks=[task_id], model="tiny-llama", sandbox="docker")


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_real_harness_episodes_run_on_ray_workers(cluster):
    """Sandbox + harness on Ray workers (RolloutWorker), proxy and engine reached by URL."""
    docker_backend()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import ProxyHandle
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.ray_workers import RolloutWorker
    from harnessrl.gym.stack import load_suite_tasks
    from harnessrl.gym.served import ServedApp

    task_id = "harnessrl-builtin__calc-1"
    cfg = _tiny_agent(task_id)
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    engine.set_tasks(load_suite_tasks(cfg))
    with ServedApp(engine.app()) as served, \
            ProxyServer(ProxyConfig(engine_url=served.url, model="tiny-llama")) as proxy:
        handle = ProxyHandle.of(proxy)
        episodes = RayEpisodes(functools.partial(RolloutWorker, cfg, handle),
                               RayPlacementConfig(num_workers=2, num_cpus_per_worker=0.5))
        try:
            episodes.wait_ready()
            sched = RolloutScheduler(SchedulerConfig(env_pool_size=2, group_size=2, groups_per_step=1, staleness=0,
                                                     episode_timeout_s=300), episodes, iter([task_id]))
            [(V, batch)] = asyncio.run(_train(sched, steps=1))
            metas = [proxy.trajectory(t.session_id).metadata for t in batch]
        finally:
            episodes.shutdown()
    assert len(batch) == 2
    # the session carries its start version and group (the engine priority); no staleness_limit under `wait`
    assert all(m["start_version"] == 0 and "staleness_limit" not in m for m in metas)
    assert [m["group_id"] for m in metas] == [t.metadata["group_id"] for t in batch]
    pids = {t.metadata["placement"]["pid"] for t in batch}
    assert os.getpid() not in pids and len(pids) == 2  # one episode on each worker
    for t in batch:
        assert (t.task_id, t.status, t.termination, t.reward) == (task_id, "ok", "submitted", 1.0), \
            t.metadata.get("error") or t.metadata.get("ending")
        assert len(t.calls) == 2 and t.trainable
    # Token-exact: what the scripted engine returned is what came back through Ray.
    sent = sorted(tuple(c.output_ids) for c in engine.calls)
    assert sorted(tuple(c.completion_ids) for t in batch for c in t.calls) == sent


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_ray_rollout_worker_turns_a_proxy_stale_abort_into_a_requeue():
    """The Ray env worker hands the proxy `staleness_limit` under `requeue`; when the policy
    moves past it mid-episode the proxy refuses the next turn and the worker raises
    StaleEpisode (the driver then reruns the task). Run in-process: the worker is plain code."""
    docker_backend()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.episode import ProxyHandle
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.ray_workers import RemoteSlot, RolloutWorker
    from harnessrl.gym.stack import load_suite_tasks
    from harnessrl.gym.scheduler import StaleEpisode
    from harnessrl.gym.served import ServedApp

    task_id = "harnessrl-builtin__calc-1"
    cfg = _tiny_agent(task_id)
    proxies = []

    class Engine(ScriptedEngine):  # the trainer publishes v1 as the first call is answered
        def _body(self, input_ids, ids, finish, rid):
            body = super()._body(input_ids, ids, finish, rid)
            if finish is not None and self.weight_version == "0":
                self.weight_version = "1"
                proxies[0].core.set_policy_version(1)
            return body

    engine = Engine(load_tokenizer("tiny-llama"), weight_version="0")
    engine.set_tasks(load_suite_tasks(cfg))
    with ServedApp(engine.app()) as served, \
            ProxyServer(ProxyConfig(engine_url=served.url, model="tiny-llama")) as proxy:
        proxies.append(proxy)
        proxy.core.set_policy_version(0)
        worker = RolloutWorker(cfg, ProxyHandle.of(proxy))
        try:
            slot = RemoteSlot(task_id, 0, 0, start_version=0, attempt=0, staleness=0, over_staleness="requeue")
            with pytest.raises(StaleEpisode, match="η=0"):
                worker.run(slot)
            [sid] = [s for s in proxy.core.sessions]
            t = proxy.trajectory(sid)
            assert (t.status, t.termination, t.reward, len(t.calls)) == ("infra_error", "stale", None, 1)
            assert t.metadata["staleness_limit"] == 0 and t.metadata["start_version"] == 0
            # the rerun at the new version is not refused
            fresh = worker.run(RemoteSlot(task_id, 0, 0, start_version=1, attempt=1, staleness=0,
                                          over_staleness="requeue"))
            assert (fresh.status, fresh.termination, fresh.reward) == ("ok", "submitted", 1.0)
            assert {v for c in fresh.calls for v in c.versions} == {1}
        finally:
            worker.close()
    # the worker's warm pool held its sandbox between episodes; closed, it leaves none
    run_id = worker.describe()["sandbox_run_id"]
    assert worker.backend.client.containers.list(all=True, filters={"label": f"harnessrl.run_id={run_id}"}) == []
