"""Every episode ends in exactly one record with a reason, whatever raises at which stage of
`run_episode`: real Docker sandboxes, the real proxy over loopback HTTP, a real harness
process (the generic command adapter), the real grader; faults are injected by thin
wrappers that satisfy the same protocols (the sandbox, the adapter, the proxy admin client)
and raise an arbitrary exception at one stage. Each episode runs under the real scheduler."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harnessrl.adapters.command import CommandAdapter
from harnessrl.gym.episode import EpisodeConfig, ProxyAdmin, ProxyHandle, run_episode
from harnessrl.gym.failures import describe
from harnessrl.gym.scheduler import RolloutScheduler, SchedulerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, scripted_stack  # noqa: E402

pytestmark = [pytest.mark.docker]


class Boom(BaseException):
    """A BaseException that is neither an Exception nor a stop signal."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


RAISED = st.sampled_from([ValueError, KeyError, RuntimeError, OSError, ZeroDivisionError, TimeoutError,
                          asyncio.CancelledError, GeneratorExit, Boom, Unprintable])


class Fault:
    def __init__(self, stage: str, exc: BaseException):
        self.stage, self.exc = stage, exc

    def at(self, stage: str) -> None:
        if stage == self.stage:
            raise self.exc


class FaultyAdmin:
    """The real admin client, failing at one of its calls."""

    def __init__(self, inner: ProxyAdmin, fault: Fault):
        self.inner, self.fault = inner, fault
        self.sid: str | None = None

    def open(self, meta):
        self.fault.at("session open")
        self.sid, key = self.inner.open(meta)
        return self.sid, key

    def close_session(self, sid):
        self.fault.at("session close")
        self.inner.close_session(sid)

    def trajectory(self, sid):
        self.fault.at("trajectory fetch")
        return self.inner.trajectory(sid)

    def set_reward(self, sid, reward, status, termination):
        self.fault.at("finish")
        self.inner.set_reward(sid, reward, status, termination)

    def close(self):
        self.inner.close()


class FaultySandbox:
    """A real sandbox that fails while it is being scored, or when it is closed (after
    closing the real one: the fault is in the report, not a leak)."""

    def __init__(self, inner, fault: Fault):
        self.inner, self.fault = inner, fault
        self.workdir = inner.workdir
        self.scoring = False

    def start(self):
        self.inner.start()

    def exec(self, command, timeout=60.0, env=None, workdir=None):
        if self.scoring:
            self.fault.at("scoring")
        return self.inner.exec(command, timeout=timeout, env=env, workdir=workdir)

    def read_file(self, path):
        return self.inner.read_file(path)

    def write_file(self, path, data, mode=0o644):
        self.inner.write_file(path, data, mode)

    def diff(self):
        if self.scoring:
            self.fault.at("scoring")
        return self.inner.diff()

    def reset(self):
        self.inner.reset()

    def alive(self):
        return self.inner.alive()

    def close(self):
        self.inner.close()
        self.fault.at("sandbox close")


class FaultyAdapter:
    """A real harness process (`true`: it exits 0, a submitted answer that fixes nothing)."""

    def __init__(self, fault: Fault):
        self.inner = CommandAdapter({"name": "proc", "dialect": "openai-chat", "placement": "beside",
                                     "command": ["true"]})
        self.fault = fault
        self.name, self.version, self.placement = "proc", "1", "beside"
        self.dialect, self.streams, self.install, self.completion = "openai-chat", False, "none", "exit 0"

    def mounts(self, endpoint, toolchain=None):
        return self.inner.mounts(endpoint, toolchain)

    def launch(self, launch):
        self.fault.at("harness launch")
        result = self.inner.launch(launch)
        launch.sandbox.scoring = True  # from here on the runner only scores it
        return result


@pytest.fixture(scope="module")
def stack():
    with scripted_stack() as (_, proxy, backend):
        yield proxy, backend


def _run_under_scheduler(stack, fault: Fault):
    proxy, backend = stack
    task = builtin_task()
    handle = ProxyHandle.of(proxy)
    admins: list[FaultyAdmin] = []

    def make_sandbox(spec, mounts):
        fault.at("sandbox creation")
        return FaultySandbox(backend.create(spec, mounts=mounts), fault)

    def one():
        admin = FaultyAdmin(ProxyAdmin(handle), fault)
        admins.append(admin)
        return run_episode(task, FaultyAdapter(fault), make_sandbox, handle, "policy",
                           EpisodeConfig(wall_time_s=60), admin=admin)

    results = []

    async def episode(slot):
        res = await asyncio.to_thread(one)
        results.append(res)
        return res.trajectory

    async def main():
        s = RolloutScheduler(SchedulerConfig(env_pool_size=1, group_size=1, groups_per_step=1), episode,
                             iter([task.instance_id]))
        await s.start()
        batch = await s.next_batch()
        free = s._free
        await s.close()
        return batch, free

    batch, free = asyncio.run(main())
    return batch, free, results, admins[0].sid


INFRA_STAGES = ["session open", "sandbox creation", "harness launch", "session close", "trajectory fetch",
                "scoring", "finish"]
#: How each injection point is named in the episode's error (the runner's own stage names).
RUNNER_STAGE = {"session close": "trajectory fetch"}


def _containers(backend) -> list:
    from harnessrl.sandboxes.docker import RUN_LABEL

    return backend.client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={backend.run_id}"})


@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage", INFRA_STAGES)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(exc=RAISED, msg=st.text(max_size=20))
def test_an_exception_at_any_stage_ends_the_episode_as_one_masked_record(stack, stage, exc, msg):
    proxy, backend = stack
    raised = exc(msg)
    batch, free, results, sid = _run_under_scheduler(stack, Fault(stage, raised))
    assert free == 1 and len(batch) == 1 and len(results) == 1
    res, traj = results[0], batch[0]
    assert traj is res.trajectory
    assert (res.status, res.reason, traj.status, traj.termination) == ("infra_error", "infra", "infra_error", "infra")
    assert traj.reward is None and not traj.trainable
    if stage == "scoring" and isinstance(raised, Exception):  # the grader names its own failures
        assert res.error == f"reward: grader error: {describe(raised)}"
    else:
        assert res.error == f"{RUNNER_STAGE.get(stage, stage)}: {describe(raised)}"
    if stage != "session open":  # the proxy's record is closed and masked too (where the fault lets it)
        assert sid is not None and proxy.core.sessions[sid].closed == (stage != "session close")
        if stage != "finish":
            stored = proxy.core.store.trajectory(sid)
            assert (stored.status, stored.termination, stored.reward) == ("infra_error", "infra", None)
    else:
        assert sid is None and traj.session_id.startswith("unrecorded-")
    assert _containers(backend) == []  # whatever failed, the sandbox was released


@pytest.mark.timeout(600)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(exc=RAISED)
def test_a_failing_teardown_is_reported_but_does_not_void_the_score(stack, exc):
    """A sandbox whose close raises after scoring keeps its score (a policy must not be able to
    turn its own 0 into a mask by breaking the teardown); the failure is in the record."""
    proxy, backend = stack
    raised = exc("teardown")
    batch, free, results, sid = _run_under_scheduler(stack, Fault("sandbox close", raised))
    res, traj = results[0], batch[0]
    assert free == 1 and (res.status, res.reason, traj.reward) == ("ok", "submitted", 0.0)
    assert traj.metadata["cleanup_error"] == f"closing the sandbox: {describe(raised)}"
    assert proxy.core.store.trajectory(sid).reward == 0.0
    assert _containers(backend) == []
