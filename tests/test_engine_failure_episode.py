"""An engine that dies mid-episode ends the episode as masked `infra_error` / `engine_error`,
never as a scored 0, in `harnessrl rollout` (run_rollout) and `harnessrl train` (train):
the REAL local engine (its own process, SIGKILLed once the first model call is recorded),
the real mini-swe-agent (which exits 0 whatever happened), Docker sandboxes, the proxy."""
from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from harnessrl.adapters.toolchain import installed_spec
from harnessrl.gym.episode import EpisodeConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import docker_backend  # noqa: E402
import engine_helpers  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.harness, pytest.mark.slow]
TASK = "harnessrl-builtin__cachekit-2"


class LocalEngine(engine_helpers.LocalEngine):
    """The engine process, killed once the proxy has recorded a call."""

    def __init__(self) -> None:
        super().__init__()
        self.wait_ready()

    def kill_after_first_call(self, db: Path) -> threading.Thread:
        """SIGKILL the engine as soon as the proxy's store at `db` holds a recorded call."""
        def watch() -> None:
            while self.proc.poll() is None:
                try:
                    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as c:
                        if c.execute("SELECT COUNT(*) FROM calls").fetchone()[0] >= 1:
                            self.proc.kill()
                            break
                except sqlite3.Error:
                    pass  # not created yet
                time.sleep(0.05)
            self.proc.wait()

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        return t


@pytest.fixture
def engine():
    docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    eng = LocalEngine()
    yield eng
    eng.stop()


def _assert_engine_error(traj: dict) -> None:
    assert (traj["status"], traj["termination"], traj["reward"]) == ("infra_error", "engine_error", None)
    assert traj["calls"], "the engine was killed after the first recorded call"


@pytest.mark.timeout(900)
def test_rollout_engine_killed_mid_episode_is_engine_error(tmp_path: Path, engine: LocalEngine) -> None:
    from harnessrl.gym.rollout import RolloutConfig, run_rollout

    cfg = RolloutConfig(harness="mini-swe-agent", tasks=[TASK], model="tiny-llama", sandbox="docker",
                        max_new_tokens=16, episode=EpisodeConfig(max_calls=8, wall_time_s=300))
    watcher = engine.kill_after_first_call(tmp_path / "trajectories.db")
    rep = asyncio.run(run_rollout(cfg, engine.url, tmp_path, episodes=1, concurrency=1, progress=False))
    watcher.join()
    assert engine.proc.returncode == -9  # it was killed mid-episode, not at the end
    assert rep["scored"] == 0 and rep["failures_by_reason"] == {"engine_error": 1}
    [line] = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    _assert_engine_error(json.loads(line))


@pytest.mark.timeout(900)
def test_train_engine_killed_mid_episode_masks_the_episode(tmp_path: Path, engine: LocalEngine) -> None:
    from harnessrl.trainers.loop import TrainConfig, train

    cfg = TrainConfig.model_validate({
        "model": "tiny-llama", "steps": 1, "out_dir": str(tmp_path), "progress": False, "tensorboard": False,
        "engine_url": engine.url, "stages": ["rl"], "eval": {"points": []},
        "rollout": {"tasks": [TASK], "max_new_tokens": 16, "sandbox": "docker",
                    "episode": {"max_calls": 8, "wall_time_s": 300}},
        "scheduler": {"env_pool_size": 1, "group_size": 1, "groups_per_step": 1, "staleness": 0},
        "trainer": {"lr": 1e-5, "device": "cpu"},
        "sampling": {"zero_variance": "drop"},  # one episode: a refill would run a second on the dead engine
    })
    (tmp_path / "rollouts").mkdir()
    watcher = engine.kill_after_first_call(tmp_path / "rollouts" / "trajectories.db")
    [m] = asyncio.run(train(cfg))
    watcher.join()
    assert engine.proc.returncode == -9
    assert m["masked_infra"] == 1 and m["trajectories"] == 0 and not m["updated"]
    assert m["batch_report"]["failures_by_reason"] == {"engine_error": 1}
    [line] = (tmp_path / "rollouts" / "trajectories.jsonl").read_text().splitlines()
    _assert_engine_error(json.loads(line))

