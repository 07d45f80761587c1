"""`harnessrl train` with `placement = "ray"` on a two-node local Ray cluster (two raylets on this
machine, `ray.cluster_utils.Cluster`), one episode worker pinned to each node by a custom
resource, real sandboxes (Docker) and a real harness (the stdlib tiny-agent) on each. Node B's
raylet is killed while its episode waits for its first model call: that episode ends masked
with the lost worker named, the other is scored, and the run completes its second step on node A."""
from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray)")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers sit beside us
from adapter_helpers import docker_backend, train_in_thread, until  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.docker]

TASK = "harnessrl-builtin__calc-1"
TINY_AGENT = str(Path(__file__).resolve().parents[1] / "examples/harnesses/tiny-agent.toml")


@pytest.fixture
def two_nodes():
    """Node A (the head, where the driver connects) and node B, one CPU each; all stopped after."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="rc-")  # short: Ray's unix sockets live under it
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"node_a": 1}, "include_dashboard": False, "temp_dir": temp})
    node_b = cluster.add_node(num_cpus=1, resources={"node_b": 1}, temp_dir=temp)
    try:
        yield cluster, node_b
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


class Gate:
    """An ASGI wrapper holding every /generate until `open` is set; `waiting` counts the held calls."""

    def __init__(self, app):
        self.app, self.open, self.waiting, self._lock = app, threading.Event(), 0, threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/generate" and not self.open.is_set():
            with self._lock:
                self.waiting += 1
            while not self.open.is_set():
                await asyncio.sleep(0.05)
        await self.app(scope, receive, send)


@pytest.mark.harness
@pytest.mark.timeout(600)
def test_train_on_two_ray_nodes_survives_losing_one_mid_episode(two_nodes, tmp_path: Path) -> None:
    docker_backend()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.served import ServedApp
    from harnessrl.gym.tasks.loaders import load_suite
    from harnessrl.sandboxes.docker import reap
    from harnessrl.trainers.loop import TrainConfig

    cluster, node_b = two_nodes
    node_a = cluster.head_node.node_id
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))  # the gold plan: every scored episode earns 1.0
    engine.set_tasks([t for t in load_suite("builtin") if t.instance_id == TASK])
    gate = Gate(engine.app())
    with ServedApp(gate) as served:
        cfg = TrainConfig.model_validate({
            "model": "tiny-llama", "steps": 2, "out_dir": str(tmp_path), "progress": False, "tensorboard": False,
            "stages": ["rl"], "eval": {"points": []}, "engine_url": served.url,
            "rollout": {"harness": TINY_AGENT, "suite": "builtin", "tasks": [TASK], "sandbox": "docker",
                        "sandbox_pool_size": 1, "episode": {"max_calls": 4, "wall_time_s": 120}},
            "scheduler": {"env_pool_size": 2, "group_size": 2, "groups_per_step": 1, "staleness": 0},
            "trainer": {"lr": 1e-5, "device": "cpu"},
            "sampling": {"zero_variance": "drop"},  # equal rewards: no update, so the scripted engine needs no sync
            "placement": "ray",
            "ray": {"address": cluster.address, "num_workers": 2, "num_cpus_per_worker": 1,
                    "resources": [{"node_a": 1}, {"node_b": 1}]},
        })
        runner, results = train_in_thread(cfg)
        # Both workers (one per node) hold an episode whose first model call waits at the gate.
        until(lambda: gate.waiting >= 2 or not runner.is_alive(), "two episodes waiting for the engine", limit_s=240.0)
        assert "error" not in results, results.get("error")
        assert ray.get_runtime_context().get_node_id() != node_b.node_id  # the driver is not on node B
        cluster.remove_node(node_b, allow_graceful=False)  # node B's raylet and its workers killed
        gate.open.set()
        runner.join(timeout=500)
    assert not runner.is_alive(), "train did not finish"
    if "error" in results:
        raise results["error"]
    history = results["history"]
    endings = [f["ending"] for m in history for f in m["batch_report"]["failures"]]
    left = [m.group(1) for e in endings for m in [re.search(r"its sandboxes \(run id (\w+)\) are left", e)] if m]
    for run_id in left:
        reap(run_id=run_id)  # the lost node's container, which no one else will close
    assert len(history) == 2 and len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2  # it went on

    first, second = history
    assert first["masked_infra"] == 1 and first["batch_report"]["episodes"] == 2
    [lost] = first["batch_report"]["failures"]
    assert (lost["task_id"], lost["status"], lost["termination"]) == (TASK, "infra_error", "infra")
    assert lost["ending"].startswith("WorkerLost: the Ray worker running this episode was lost (node "
                                     f"{node_b.node_id}")
    assert len(left) == 1 and f"its sandboxes (run id {left[0]}) are left to the reaper" in lost["ending"]
    assert first["batch_report"]["endings"] == {"infra": 1, "submitted": 1}
    assert first["batch_report"]["reward_distribution"] == {"1.0": 1, "None": 1}
    # The second step's group ran wholly on node A (node B's worker could not be placed again).
    assert second["masked_infra"] == 0 and second["batch_report"]["endings"] == {"submitted": 2}
    assert second["batch_report"]["reward_distribution"] == {"1.0": 2}
    assert second["scheduler"]["errors"] == 1 and second["scheduler"]["completed"] >= 4

    from harnessrl.gym.proxy import Store

    store = Store(str(tmp_path / "rollouts" / "trajectories.db"))
    scored = [t for t in (store.trajectory(sid) for sid in store.session_ids()) if t.reward == 1.0]
    assert len(scored) == 3  # one of step 1, two of step 2, each through the driver's proxy
    assert {t.metadata["placement"]["node_id"] for t in scored} == {node_a}  # node A's worker
    [kept] = {t.metadata["placement"]["sandbox_run_id"] for t in scored}  # its warm pool served all three
    assert kept != left[0] and docker_backend().client.containers.list(  # closed when the run ended
        all=True, filters={"label": f"harnessrl.run_id={kept}"}) == []
    sent = sorted(tuple(c.output_ids) for c in engine.calls)
    got = sorted(tuple(c.completion_ids) for t in scored for c in t.calls)
    assert set(got) <= set(sent) and len(got) == sum(len(t.calls) for t in scored)
