"""A timed-out episode holds nothing afterwards: the scheduler's episode timeout kills the
harness's whole process tree (a child that left the group with setsid too) and releases its
sandbox before the timeout record is handed out. Real parts: Docker sandboxes, the proxy,
`Rollout.episode` under the real scheduler, harnesses that never end (generic command
adapter configs, beside and inside the sandbox)."""
from __future__ import annotations

import asyncio
import concurrent.futures.thread
import json
import sys
import threading
from pathlib import Path

import psutil
import pytest

from harnessrl.gym.episode import EpisodeConfig
from harnessrl.gym.rollout import Rollout, RolloutConfig
from harnessrl.gym.scheduler import RolloutScheduler, SchedulerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, docker_backend  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _harness(tmp: Path, placement: str) -> Path:
    pids = tmp / "pids"
    if placement == "beside":  # a child in its own session, a plain child, the shell itself
        script = f"setsid sleep 86400 & echo $$! >> {pids}; sleep 86400 & echo $$! >> {pids}; echo $$$$ >> {pids}; wait"
    else:
        script = "sleep 86400 & sleep 86400"
    cfg = tmp / f"forever-{placement}.toml"
    cfg.write_text(f'name = "forever"\ndialect = "openai-chat"\nplacement = "{placement}"\n'
                   f"command = {json.dumps(['bash', '-c', script])}\n")
    return cfg


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _our_threads() -> set[threading.Thread]:
    # thread pools (event loops' default executors, the proxy's CPU pool) keep their idle
    # workers: pooled threads that hold no episode; so does a proxy-only launch's door to the
    # proxy (adapters/netns.door: one relay per proxy port, shared by every launch)
    from harnessrl.adapters.netns import DOOR_THREAD

    return {t for t in threading.enumerate()
            if getattr(t, "_target", None) is not concurrent.futures.thread._worker and t.name != DOOR_THREAD}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("placement", ["beside", "inside"])
def test_a_timed_out_episode_kills_its_harness_and_releases_its_sandbox(tmp_path: Path, placement: str) -> None:
    docker_backend()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.served import ServedApp
    from harnessrl.sandboxes.docker import RUN_LABEL

    task = builtin_task()
    cfg = RolloutConfig(harness=str(_harness(tmp_path, placement)), tasks=[task.instance_id], model="tiny-llama",
                        sandbox="docker", episode=EpisodeConfig(wall_time_s=3600),
                        sandbox_pool_size=0)  # fresh sandboxes: any container left is a leak
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))

    async def main(ro: Rollout):
        s = RolloutScheduler(SchedulerConfig(env_pool_size=1, group_size=1, groups_per_step=1, episode_timeout_s=20),
                             ro.episode, iter([task.instance_id]))
        await s.start()
        try:
            return await s.next_batch(), s.stats.as_dict()
        finally:
            await s.close()

    with ServedApp(engine.app()) as served, Rollout(cfg, served.url, tmp_path / "out") as ro:
        def containers() -> list:
            return ro.backend.client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={ro.backend.run_id}"})

        threads, children = _our_threads(), {p.pid for p in psutil.Process().children(recursive=True)}
        batch, stats = asyncio.run(main(ro))
        # the timeout record is handed out only after the episode released everything
        assert containers() == []
        left = _our_threads() - threads
        for t in left:
            t.join(10)  # a thread that was ending as we looked; one that holds on fails below
        assert [t.name for t in left if t.is_alive()] == []
        assert {p.pid for p in psutil.Process().children(recursive=True) if _alive(p.pid)} <= children
        [res] = ro.results
        stored = ro.proxy.core.store.trajectory(res.trajectory.session_id)
    [traj] = batch
    assert stats["timeouts"] == 1 and (traj.status, traj.termination, traj.trainable) == ("truncated", "timeout", False)
    assert (res.status, res.reason) == ("infra_error", "cancelled") and res.reward is None
    assert (stored.status, stored.termination, stored.reward) == ("infra_error", "cancelled", None)
    if placement == "beside":
        pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
        assert len(pids) == 3  # the harness had started its tree
        assert [p for p in pids if _alive(p)] == []
    else:
        assert "sandbox_s" in res.timings  # the sandbox was up: the cancel closed it under the harness
