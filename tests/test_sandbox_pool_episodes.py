"""Warm sandboxes serve real episodes (gym.sandbox_source + sandboxes.pool), as clean as fresh ones.

The pool's own bookkeeping runs on a small in-memory backend (no engine needed); the episodes
run on real parts: Docker containers, the real proxy, the scripted gold policy, the real
mini-swe-agent and real processes as inside harnesses through the per-sandbox socket dir.
"""
from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harnessrl.adapters.base import HarnessResult
from harnessrl.adapters.command import CommandAdapter
from harnessrl.adapters.toolchain import installed_spec
from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode
from harnessrl.gym.sandbox_source import PooledSandboxes
from harnessrl.sandboxes.base import ExecResult, RepoSpec, SandboxDied
from harnessrl.sandboxes.pool import PoolConfig, SandboxPool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, scripted_stack  # noqa: E402


# -- the pool's bookkeeping, on an in-memory backend --------------------------------------------
class MemorySandbox:
    workdir = "/workspace/repo"

    def __init__(self, n: int, mounts):
        self.id, self.mounts, self.dead, self.closed, self.resets, self.files = f"m{n}", mounts, False, False, 0, {}

    def start(self):
        pass

    def exec(self, command, timeout=60.0, env=None, workdir=None):
        return ExecResult(0, "")

    def read_file(self, path):
        return self.files[path]

    def write_file(self, path, data, mode=0o644):
        self.files[path] = data

    def diff(self):
        return ""

    def reset(self):
        self.resets += 1
        self.files.clear()

    def alive(self):
        return not self.dead and not self.closed

    def close(self):
        self.closed = True


class MemoryBackend:
    name = "memory"

    def __init__(self):
        self.made: list[MemorySandbox] = []
        self.lock = threading.Lock()

    def create(self, spec, mounts=(), env=None, start=True):
        time.sleep(0.05)  # long enough for concurrent acquires to overlap
        with self.lock:
            sb = MemorySandbox(len(self.made), list(mounts))
            self.made.append(sb)
        return sb


SPEC = RepoSpec("mem", "/nonexistent", "main")


def test_pool_counts_held_sandboxes_so_release_and_acquire_rebuild_nothing():
    backend = MemoryBackend()
    with SandboxPool(backend, PoolConfig(size=2)) as pool:
        pool.prewarm(SPEC)
        for _ in range(5):
            a, b = pool.acquire(SPEC), pool.acquire(SPEC)
            assert a is not b
            a.write_file("x", b"1")
            assert pool.release(a) is not None and pool.release(b) is not None
        assert len(backend.made) == 2 and all(sb.resets == 5 for sb in backend.made)
        assert backend.made[0].files == {}
        c = pool.acquire(SPEC), pool.acquire(SPEC), pool.acquire(SPEC)  # one past size: made, then closed
        assert len({id(x) for x in c}) == 3 and len(backend.made) == 3
        for x in c:
            pool.release(x)
        assert pool.idle(SPEC) == 2 and sum(sb.closed for sb in backend.made) == 1


def test_pool_keys_by_mounts_and_never_hands_out_a_dead_or_discarded_sandbox():
    backend = MemoryBackend()
    with SandboxPool(backend, PoolConfig(size=1, refill=False)) as pool:
        a = pool.acquire(SPEC, [("/h", "/t", True)])
        b = pool.acquire(SPEC)
        assert a.mounts == [("/h", "/t", True)] and b.mounts == []
        pool.release(a), pool.release(b)
        assert pool.acquire(SPEC, [("/h", "/t", True)]) is a and pool.acquire(SPEC) is b
        a.dead = True
        assert pool.release(a) is None and a.closed  # died in its episode: closed, not kept
        pool.discard(b)
        assert b.closed and b.resets == 1  # its first release only: a discard does not reset
        fresh = pool.acquire(SPEC)
        assert fresh not in (a, b) and pool.acquire(SPEC, [("/h", "/t", True)]) not in (a, b)
        pool.release(fresh)
        assert pool.release(fresh) is None and not fresh.closed  # a second release leaves the idle one be
        fresh.dead = True
        assert pool.acquire(SPEC) is not fresh and fresh.closed  # found dead while idle


def test_concurrent_acquires_never_share_and_wait_for_a_sandbox_being_started():
    backend = MemoryBackend()
    with SandboxPool(backend, PoolConfig(size=4)) as pool:
        pool.prewarm(SPEC, wait=False)
        with ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda _: pool.acquire(SPEC), range(4)))
        assert len({id(x) for x in got}) == 4 and len(backend.made) == 4  # the prewarmed ones, no extra


def test_liveness_checks_of_concurrent_acquires_run_side_by_side_not_under_the_pool_lock():
    # Docker's liveness check is a round trip; two acquires must be able to ask at once. Each
    # check waits for the other at a barrier: under the pool's lock the second never arrives.
    backend = MemoryBackend()
    barrier = threading.Barrier(2, timeout=10)
    met: list[bool] = []
    with SandboxPool(backend, PoolConfig(size=2)) as pool:
        pool.prewarm(SPEC)
        for sb in backend.made:
            def alive(sb=sb):
                try:
                    barrier.wait()
                    met.append(True)
                except threading.BrokenBarrierError:
                    met.append(False)
                return not sb.closed
            sb.alive = alive
        with ThreadPoolExecutor(2) as ex:
            got = list(ex.map(lambda _: pool.acquire(SPEC), range(2)))
    assert met == [True, True] and {id(x) for x in got} == {id(x) for x in backend.made}


def test_resize_fills_every_key_up_and_closes_idle_surplus_and_settle_waits_for_the_starts():
    backend = MemoryBackend()
    with SandboxPool(backend, PoolConfig(size=1)) as pool:
        pool.prewarm(SPEC)
        pool.prewarm(SPEC, [("/h", "/t", True)])
        held = pool.acquire(SPEC)
        pool.resize(3)
        assert pool.settle(timeout=30)  # the four starts landed
        assert pool.idle(SPEC) == 2 and pool.idle(SPEC, [("/h", "/t", True)]) == 3 and len(backend.made) == 6
        assert pool.config.size == 3
        pool.resize(1)
        assert pool.idle(SPEC) == 0 and pool.idle(SPEC, [("/h", "/t", True)]) == 1  # held one counts
        assert sum(sb.closed for sb in backend.made) == 4 and not held.closed
        assert pool.release(held) is not None and not held.closed and pool.idle(SPEC) == 1
        with pytest.raises(ValueError, match="size must be >= 0"):
            pool.resize(-1)


def test_settle_returns_false_while_a_start_is_still_running():
    backend = MemoryBackend()
    gate = threading.Event()
    slow = backend.create

    def create(spec, mounts=(), env=None, start=True):
        gate.wait(30)
        return slow(spec, mounts, env, start)
    backend.create = create
    with SandboxPool(backend, PoolConfig(size=1)) as pool:
        pool.prewarm(SPEC, wait=False)
        assert pool.settle(timeout=0.2) is False
        gate.set()
        assert pool.settle(timeout=30) and pool.idle(SPEC) == 1


def test_a_revoked_view_refuses_late_calls_and_release_waits_for_calls_in_flight():
    backend = MemoryBackend()
    from harnessrl.gym.sandbox_source import SandboxView

    sb = backend.create(SPEC)
    view = SandboxView(sb)
    view.write_file("a", b"1")
    assert view.read_file("a") == b"1" and view.id == "m0"
    assert view.revoke(1.0) and not view.alive()
    with pytest.raises(SandboxDied, match="lease on the sandbox has ended"):
        view.exec("true")
    assert not sb.closed  # the view's end is not the sandbox's


# -- real episodes on warm docker containers --------------------------------------------------------
@pytest.fixture(scope="module")
def stack():
    with scripted_stack() as (engine, proxy, backend):
        yield engine, ProxyHandle.of(proxy), backend


def _mini():
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    from harnessrl.adapters.mini_swe_agent import MiniSweAgentAdapter

    return MiniSweAgentAdapter()


def _episode(stack, source, adapter, plan=None, **cfg):
    engine, handle, _ = stack
    task = builtin_task()
    engine.set_plans({task.problem_statement: list(task.gold_plan if plan is None else plan)})
    return run_episode(task, adapter, source, handle, "policy",
                       EpisodeConfig(**({"max_calls": 8, "wall_time_s": 240} | cfg)))


def _alive_ids(backend) -> set[str]:
    from harnessrl.sandboxes.docker import RUN_LABEL

    return {c.id for c in backend.client.containers.list(filters={"label": f"{RUN_LABEL}={backend.run_id}"})}


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_two_consecutive_mini_swe_agent_episodes_share_one_warm_container(stack):
    _, _, backend = stack
    adapter = _mini()
    with PooledSandboxes(backend, size=1) as source:
        source.prewarm(builtin_task().repo_spec(), adapter, wait=True)
        first = _episode(stack, source, adapter)
        second = _episode(stack, source, adapter)
    for res in (first, second):
        assert (res.reason, res.status, res.trajectory.reward) == ("submitted", "ok", 1.0), res.error
        assert res.timings["sandbox_reset_s"] > 0 and res.trajectory.metadata["timings"] is res.timings
    assert first.trajectory.metadata["sandbox_id"] == second.trajectory.metadata["sandbox_id"] is not None
    assert first.trajectory.session_id != second.trajectory.session_id
    assert len(source.acquire_s) == 2 and len(source.reset_s) == 2
    assert first.trajectory.metadata["sandbox_id"] not in _alive_ids(backend)  # the pool closed it at its end


# An inside harness (a real process in the sandbox, through the tunnel to its socket dir) that
# leaves a detached loop behind: every 0.1 s it appends to the repo and home, and calls the
# proxy at the URL it was handed (the sandbox's 127.0.0.1:18080) with this episode's session
# URL and key. Its exit status 199 (the
# relay failure code) makes the episode infra, so no grading reset runs: only the pool's does.
LOOP = """import os, socket, sys, time
url, key = sys.argv[1], sys.argv[2]
path = url.split("18080", 1)[1] + "/chat/completions"
body = b'{"model":"policy","messages":[{"role":"user","content":"late"}]}'
while True:
    for f in ("/workspace/repo/LEAK", "/home/agent/LEAK"):
        open(f, "a").write("tick\\n")
    try:
        s = socket.create_connection(("127.0.0.1", 18080), 5)
        s.sendall(("POST %s HTTP/1.1\\r\\nHost: x\\r\\nAuthorization: Bearer %s\\r\\nContent-Type: application/json\\r\\n"
                   "Content-Length: %d\\r\\nConnection: close\\r\\n\\r\\n" % (path, key, len(body))).encode() + body)
        s.recv(64)
        s.close()
    except OSError:
        pass
    time.sleep(0.1)
"""
CALL = ("import json,sys,urllib.request as u\n"
        "r=u.Request(sys.argv[1]+'/chat/completions',data=json.dumps({'model':'policy','messages':"
        "[{'role':'user','content':'hi'}]}).encode(),headers={'Authorization':'Bearer '+sys.argv[2],"
        "'Content-Type':'application/json'})\n"
        "print('status', u.urlopen(r,timeout=60).status)\n")
PROBE = ("echo probe leak=$(ls /workspace/repo/LEAK /home/agent/LEAK 2>/dev/null | wc -l)"
         " procs=$(grep -l '[l]eak_loop' /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"
         " tmp=$(ls -A /tmp | grep -v '^harnessrl$' | wc -l)")


def _inside(name: str, script: str, **files: str) -> CommandAdapter:
    return CommandAdapter({"name": name, "dialect": "openai-chat", "placement": "inside",
                           "files": {f"/tmp/harnessrl/{k}.py": v.replace("$", "$$") for k, v in
                                     {"call": CALL, **files}.items()},
                           "command": ["bash", "-c", script.replace("$", "$$"), "harness", "${openai_base_url}",
                                       "${api_key}"]})


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_process_left_by_the_last_episode_is_gone_and_never_reaches_the_next_session(stack):
    engine, handle, backend = stack
    leaver = _inside("leaver", 'setsid -f python3 /tmp/harnessrl/leak_loop.py "$1" "$2" >/dev/null 2>&1 </dev/null\n'
                               'until [ -s /workspace/repo/LEAK ]; do sleep 0.05; done\n'
                               'python3 /tmp/harnessrl/call.py "$1" "$2"; sleep 1; exit 199', leak_loop=LOOP)
    prober = _inside("prober", f'{PROBE}; sleep 1; {PROBE}; python3 /tmp/harnessrl/call.py "$1" "$2"')
    with PooledSandboxes(backend, size=1) as source:
        first = _episode(stack, source, leaver, plan=[])
        assert (first.status, first.reason) == ("infra_error", "infra") and first.reward is None  # never graded
        assert "relay to the proxy socket did not start" in first.error
        dirs = list(source._dirs.values())
        assert len(dirs) == 1 and list(dirs[0].iterdir()) == []  # the relay's socket is gone between episodes
        late_calls = len(first.trajectory.calls)
        assert late_calls >= 1  # its own call, and whatever the loop got in before the session closed
        second = _episode(stack, source, prober, plan=[])
    assert second.trajectory.metadata["sandbox_id"] == first.trajectory.metadata["sandbox_id"]
    assert (second.status, second.reason) == ("ok", "submitted"), second.error
    assert second.harness.stdout_tail.count("probe leak=0 procs=0 tmp=0") == 2, second.harness.stdout_tail
    assert len(second.trajectory.calls) == 1  # only its own call: nothing late reached this session
    from harnessrl.gym.proxy_admin import ProxyAdmin

    admin = ProxyAdmin(handle)
    try:
        assert len(admin.trajectory(first.trajectory.session_id).calls) == late_calls  # closed: none after
    finally:
        admin.close()
    assert first.trajectory.session_id != second.trajectory.session_id


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_an_episode_that_kills_its_container_is_not_served_again(stack):
    _, _, backend = stack
    adapter = _mini()
    killed: list[str] = []

    class Killer:
        name, version, placement, dialect, streams, install, completion = (
            "killer", "1", "beside", "openai-chat", False, "none", "kills its sandbox")

        def mounts(self, endpoint, toolchain=None):
            return []

        def launch(self, launch):
            launch.sandbox.backing.container.kill()
            killed.append(launch.sandbox.id)
            return HarnessResult("submitted", 0)

    with PooledSandboxes(backend, size=1) as source:
        source.prewarm(builtin_task().repo_spec(), adapter, wait=True)
        dead = _episode(stack, source, Killer())
        assert (dead.reason, dead.status, dead.trajectory.reward) == ("sandbox_died", "infra_error", None)
        assert "sandbox_reset_s" not in dead.timings and killed == [dead.trajectory.metadata["sandbox_id"]]
        after = _episode(stack, source, adapter)
    assert (after.reason, after.trajectory.reward) == ("submitted", 1.0), after.error
    assert after.trajectory.metadata["sandbox_id"] not in killed
    assert killed[0] not in _alive_ids(backend)


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_parallel_episodes_never_share_a_sandbox(stack):
    engine, handle, backend = stack
    adapter = _mini()
    task = builtin_task()
    engine.set_plans({task.problem_statement: list(task.gold_plan)})
    cfg = EpisodeConfig(max_calls=8, wall_time_s=400)
    with PooledSandboxes(backend, size=2) as source:
        source.prewarm(task.repo_spec(), adapter, wait=True)
        rounds = []
        for _ in range(2):
            with ThreadPoolExecutor(2) as ex:
                rounds.append(list(ex.map(lambda _: run_episode(task, adapter, source, handle, "policy", cfg),
                                          range(2))))
    ids = [[r.trajectory.metadata["sandbox_id"] for r in rnd] for rnd in rounds]
    for rnd in rounds:
        for r in rnd:
            assert (r.reason, r.trajectory.reward) == ("submitted", 1.0), r.error
    assert all(len(set(x)) == 2 for x in ids), ids
    assert set(ids[0]) == set(ids[1])  # the second round ran on the same two warm containers


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_cancelled_episode_discards_its_sandbox(stack):
    from harnessrl.adapters.cancel import Cancel

    engine, handle, backend = stack
    task = builtin_task()
    sleeper = CommandAdapter({"name": "proc", "dialect": "openai-chat", "placement": "beside",
                              "command": ["sleep", "60"]})
    with PooledSandboxes(backend, size=1) as source:
        cancel = Cancel()
        timer = threading.Timer(3.0, cancel.set, ("the scheduler timed it out",))
        timer.start()
        res = run_episode(task, sleeper, source, handle, "policy", EpisodeConfig(wall_time_s=120), cancel=cancel)
        timer.join()
        gone = res.trajectory.metadata["sandbox_id"]
        assert (res.status, res.reason) == ("infra_error", "cancelled") and "sandbox_reset_s" not in res.timings
        assert gone not in _alive_ids(backend)
        after = _episode(stack, source, _command_exit0())
        assert after.trajectory.metadata["sandbox_id"] not in (gone, None) and after.status == "ok", after.error


def _command_exit0() -> CommandAdapter:
    return CommandAdapter({"name": "proc", "dialect": "openai-chat", "placement": "beside", "command": ["true"]})


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_harnessrl_rollout_leases_warm_sandboxes_and_reports_their_times(tmp_path):
    import asyncio
    import json

    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.rollout import RolloutConfig, run_rollout
    from harnessrl.gym.served import ServedApp

    _mini()
    task = builtin_task()
    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    engine.set_tasks([task], gold=True)
    cfg = RolloutConfig(harness="mini-swe-agent", tasks=[task.instance_id], model="tiny-llama", sandbox="docker",
                        episode=EpisodeConfig(max_calls=8, wall_time_s=240))
    assert cfg.sandbox_pool_size == 2  # pooled by default
    with ServedApp(engine.app()) as served:
        rep = asyncio.run(run_rollout(cfg, served.url, tmp_path, episodes=4, concurrency=2, progress=False))
    assert rep["reward_distribution"] == {"1.0": 4}
    assert rep["sandbox_acquire_s"]["n"] == 4 and rep["sandbox_reset_s"]["n"] == 4
    assert 0 < rep["sandbox_reset_s"]["p50"] <= rep["sandbox_reset_s"]["p95"]
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    ids = [x["metadata"]["sandbox_id"] for x in lines]
    assert len(set(ids)) == 2, ids  # four episodes, two warm containers
    assert all(x["metadata"]["timings"]["sandbox_reset_s"] > 0 for x in lines)


@pytest.mark.bwrap
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_two_consecutive_mini_swe_agent_episodes_share_one_warm_local_sandbox(stack, tmp_path):
    from harnessrl.sandboxes import make_backend
    from harnessrl.sandboxes.local import LocalConfig

    adapter = _mini()
    try:
        local = make_backend("local", LocalConfig(root=str(tmp_path / "local")))
    except Exception as e:  # noqa: BLE001 - SandboxUnavailable: no bubblewrap here
        pytest.skip(f"local sandboxes unavailable here: {e}")
    with PooledSandboxes(local, size=1) as source:
        source.prewarm(builtin_task().repo_spec(), adapter, wait=True)
        first = _episode(stack, source, adapter,
                         plan=["echo leftover > LEFTOVER && echo x > /tmp/x && echo y > ~/y", *builtin_task().gold_plan])
        second = _episode(stack, source, adapter, plan=["ls LEFTOVER /tmp/x ~/y", *builtin_task().gold_plan])
    for res in (first, second):
        assert (res.reason, res.trajectory.reward) == ("submitted", 1.0), res.error
    assert first.trajectory.metadata["sandbox_id"] == second.trajectory.metadata["sandbox_id"] is not None
    assert "LEFTOVER" not in second.reward.agent_diff
    traj = second.trajectory  # the prompt after `ls` holds its output: none of the three is there
    after_ls = stack[0].tokenizer.decode(traj.call_prompt(traj.calls[1]))
    assert after_ls.count("No such file or directory") == 3, after_ls[-600:]


# The code under test, imported by the hidden tests, detaches a copier of them: it outlives the
# grading (which ends with the agent's code still running), so only the release reset stands
# between the copies and the next episode on this container.
COPIER = ("cat >> cachekit/__init__.py <<'EOF'\nimport subprocess\nsubprocess.Popen(['setsid', '-f', 'bash', '-c', "
          "'for i in $(seq 100); do cp -r /tmp/harnessrl-eval-* /dev/shm/ 2>/dev/null && "
          "cp -r /tmp/harnessrl-eval-* /home/agent/ 2>/dev/null && break; sleep 0.05; done; exec sleep 600'])\nEOF")


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_hidden_tests_copied_during_grading_never_reach_the_next_episode(stack):
    engine, _, backend = stack
    adapter = _mini()
    task = builtin_task()
    hidden = task.FAIL_TO_PASS[0].split("::")[-1]
    probe = (f"echo probe copies=$(ls -A /dev/shm /home/agent /tmp | grep -c harnessrl-eval)"
             f" hidden=$(grep -rl {hidden} /dev/shm /home/agent /tmp /workspace/repo 2>/dev/null | wc -l)"
             " sleepers=$(grep -l '^sleep' /proc/[0-9]*/comm 2>/dev/null | wc -l)")
    with PooledSandboxes(backend, size=1) as source:
        first = _episode(stack, source, adapter, plan=[*task.gold_plan, COPIER])
        second = _episode(stack, source, adapter, plan=[probe, *task.gold_plan])
    assert (first.reason, first.trajectory.reward) == ("submitted", 1.0), (first.error, first.reward)
    assert (second.reason, second.trajectory.reward) == ("submitted", 1.0), second.error
    assert first.trajectory.metadata["sandbox_id"] == second.trajectory.metadata["sandbox_id"]
    traj = second.trajectory
    after_probe = engine.tokenizer.decode(traj.call_prompt(traj.calls[1]))
    assert "probe copies=0 hidden=0 sleepers=0" in after_probe, after_probe[-600:]
    assert "subprocess" not in second.reward.agent_diff
