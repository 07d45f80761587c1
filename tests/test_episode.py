"""Every episode ending has its reason, status and reward, on real parts: Docker sandboxes, the
real proxy, the scripted engine (or a dead one), real processes as harnesses (generic
command adapter) and the real mini-swe-agent for the call limit."""
from __future__ import annotations

import re
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from harnessrl.adapters.command import CommandAdapter
from harnessrl.adapters.toolchain import installed_spec
from harnessrl.gym.episode import ENDINGS, EpisodeConfig, ProxyHandle, ending_for, run_episode
from harnessrl.adapters.base import HarnessResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, scripted_stack  # noqa: E402

pytestmark = [pytest.mark.docker]


def test_ending_for_maps_harness_reasons_and_spent_budget():
    assert ending_for(HarnessResult("submitted", 0), 1, 5).reason == "submitted"
    assert ending_for(HarnessResult("harness_exited", 1), 5, 5).reason == "call_limit"
    assert ending_for(HarnessResult("harness_exited", 1), 2, 5).reason == "harness_exited"
    assert ending_for(HarnessResult("timeout", None), 9, 5).reason == "timeout"
    statuses = {r: c.status for r, c in ENDINGS.items()}
    assert statuses["timeout"] == statuses["call_limit"] == "truncated"
    assert statuses["sandbox_died"] == statuses["engine_error"] == statuses["infra"] == "infra_error"


@pytest.fixture(scope="module")
def stack():
    with scripted_stack() as (engine, proxy, backend):
        yield engine, ProxyHandle.of(proxy), backend


def _command(*argv: str) -> CommandAdapter:
    return CommandAdapter({"name": "proc", "dialect": "openai-chat", "placement": "beside", "command": list(argv)})


def _run(stack, adapter, proxy=None, factory=None, **cfg):
    engine, handle, backend = stack
    task = builtin_task()
    engine.set_plans({task.problem_statement: task.gold_plan})
    make = factory or (lambda spec, mounts: backend.create(spec, mounts=mounts))
    return run_episode(task, adapter, make, proxy or handle, "policy", EpisodeConfig(**cfg))


@pytest.mark.timeout(300)
def test_timeout_is_truncated_and_scored(stack):
    res = _run(stack, _command("sleep", "60"), wall_time_s=2)
    assert (res.reason, res.status, res.trajectory.termination) == ("timeout", "truncated", "timeout")
    assert res.trajectory.reward == 0.0 and res.trajectory.status == "truncated"
    grading = res.trajectory.metadata["grading"]  # why the grader decided travels with the record
    assert (grading["status"], grading["tampered"], grading["cause"]) == ("ok", False, "")
    assert re.match(r"\d+ of \d+ tests not passing", grading["reason"]), grading


@pytest.mark.timeout(300)
def test_crashed_and_exited_harnesses_are_scored(stack):
    res = _run(stack, _command("bash", "-c", "kill -KILL $$$$"))  # $$ escapes $ in templates
    assert (res.reason, res.status, res.harness.exit_code) == ("harness_crashed", "ok", -9)
    assert res.trajectory.reward == 0.0
    res = _run(stack, _command("bash", "-c", "echo bye; exit 3"))
    assert (res.reason, res.status, res.harness.exit_code) == ("harness_exited", "ok", 3)
    assert res.harness.stdout_tail == "bye\n"


@pytest.mark.timeout(300)
def test_sandbox_killed_mid_episode_is_infra_error(stack):
    _, _, backend = stack
    killed = []

    def factory(spec, mounts):
        sb = backend.create(spec, mounts=mounts)
        timer = threading.Timer(1.0, lambda: (sb.container.kill(), killed.append(True)))
        timer.start()
        return sb

    res = _run(stack, _command("sleep", "6"), factory=factory)
    assert killed
    assert (res.reason, res.status) == ("sandbox_died", "infra_error")
    assert res.trajectory.reward is None and res.trajectory.status == "infra_error"
    assert not res.trajectory.trainable


@pytest.mark.timeout(300)
def test_engine_down_is_engine_error_not_a_zero(stack):
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer

    # A harness that makes one model call and exits 1 when it fails, as real ones do.
    client = ("import json,sys,urllib.request as u\n"
              "r=u.Request(sys.argv[1]+'/chat/completions',data=json.dumps({'model':'policy','messages':"
              "[{'role':'user','content':'hi'}]}).encode(),headers={'Authorization':'Bearer '+sys.argv[2],"
              "'Content-Type':'application/json'})\n"
              "try: u.urlopen(r,timeout=60)\nexcept Exception as e: print(e); sys.exit(1)\n")
    dead = "http://127.0.0.1:9"  # nothing listens on the discard port here
    with ProxyServer(ProxyConfig(engine_url=dead, model="tiny-llama")) as proxy:
        handle = ProxyHandle.of(proxy)
        res = _run(stack, _command(sys.executable, "-c", client, "${openai_base_url}", "${api_key}"), proxy=handle)
    assert "HTTP Error 5" in res.harness.stdout_tail
    assert (res.reason, res.status) == ("engine_error", "infra_error")
    assert res.trajectory.reward is None


@pytest.mark.timeout(300)
def test_harness_not_installed_is_infra_error(stack):
    from harnessrl.adapters.mini_swe_agent import MiniSweAgentAdapter

    with tempfile.TemporaryDirectory() as empty:
        engine, handle, backend = stack
        task = builtin_task()
        res = run_episode(task, MiniSweAgentAdapter(), lambda s, m: backend.create(s, mounts=m), handle, "policy",
                          EpisodeConfig(), toolchain=Path(empty))
    assert (res.reason, res.status) == ("infra", "infra_error")
    assert "not installed" in res.error and "install_harnesses.sh mini-swe-agent" in res.error


@pytest.mark.harness
@pytest.mark.timeout(300)
def test_call_limit_with_real_mini_swe_agent(stack):
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    from harnessrl.adapters.mini_swe_agent import MiniSweAgentAdapter

    task = builtin_task()
    res = _run(stack, MiniSweAgentAdapter(), max_calls=len(task.gold_plan))
    # Its budget covered the plan but not the submit: mini stops with LimitsExceeded.
    assert (res.reason, res.status, res.harness.harness_status) == ("call_limit", "truncated", "LimitsExceeded")
    assert len(res.trajectory.calls) == len(task.gold_plan)
    assert res.trajectory.reward == 1.0  # the fix was applied before the budget ran out
    assert res.trajectory.metadata["grading"]["reason"].startswith("all ")


@pytest.mark.harness
@pytest.mark.timeout(600)
def test_concurrent_episodes_keep_their_own_records(stack):
    """Three mini-swe-agent episodes on three tasks at once: each scores 1.0 and each record
    holds only its own task's calls, token-exact."""
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    from concurrent.futures import ThreadPoolExecutor

    from harnessrl.adapters.mini_swe_agent import MiniSweAgentAdapter
    from harnessrl.gym.tools.check_adapter import token_exact_problems
    from harnessrl.gym.tasks.suites.builtin import load

    engine, handle, backend = stack
    tasks = [t for t in load() if t.gold_plan][:3]
    engine.set_tasks(tasks, gold=True)
    start = len(engine.calls)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda t: run_episode(
            t, MiniSweAgentAdapter(), lambda s, m: backend.create(s, mounts=m), handle, "policy",
            EpisodeConfig(max_calls=8, wall_time_s=400)), tasks))
    for task, res in zip(tasks, results):
        assert (res.reason, res.trajectory.reward) == ("submitted", 1.0), res.error
        mine = [c for c in engine.calls[start:] if c.task_key == task.problem_statement]
        assert len(res.trajectory.calls) == len(mine) == len(task.gold_plan) + 1
        assert token_exact_problems(res.trajectory, mine) == []


_ONE_CALL = ("import json,sys,urllib.request as u\n"
             "r=u.Request(sys.argv[1]+'/chat/completions',data=json.dumps({'model':'policy','messages':"
             "[{'role':'user','content':'hi'}]}).encode(),headers={'Authorization':'Bearer '+sys.argv[2],"
             "'Content-Type':'application/json'})\n"
             "try: u.urlopen(r,timeout=60)\nexcept Exception as e: print('API error:', e); sys.exit(0)\n")


@pytest.mark.timeout(300)
def test_a_failed_engine_call_is_engine_error_even_when_the_harness_exits_0_and_the_engine_is_up(stack):
    """Only the proxy's record tells: the engine answers /health, its /generate fails once, and
    the harness prints the API error and exits 0 (which reads as a submitted answer)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Mount, Route

    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.served import ServedApp

    engine, _, _ = stack

    async def fail(request):
        return JSONResponse({"error": "CUDA error: an illegal memory access was encountered"}, 500)

    app = Starlette(routes=[Route("/generate", fail, methods=["POST"]), Mount("/", app=engine.app())])
    with ServedApp(app) as served, ProxyServer(ProxyConfig(engine_url=served.url, model="tiny-llama")) as proxy:
        res = _run(stack, _command(sys.executable, "-c", _ONE_CALL, "${openai_base_url}", "${api_key}"),
                   proxy=ProxyHandle.of(proxy))
    assert "API error" in res.harness.stdout_tail and res.harness.exit_code == 0
    assert (res.reason, res.status, res.trajectory.termination) == ("engine_error", "infra_error", "engine_error")
    assert res.reward is None and res.trajectory.reward is None and not res.trajectory.trainable  # not even scored
    assert [c.finish_reason for c in res.trajectory.calls] == ["engine_error"]


@pytest.mark.timeout(300)
def test_the_record_is_fetched_once_per_episode(stack):
    from harnessrl.gym.episode import ProxyAdmin

    _, handle, _ = stack

    class Counting:
        def __init__(self, inner):
            self.inner, self.calls = inner, []

        def __getattr__(self, name):
            fn = getattr(self.inner, name)

            def counted(*args, **kw):
                self.calls.append(name)
                return fn(*args, **kw)
            return counted

    admin = Counting(ProxyAdmin(handle))
    engine, _, backend = stack
    task = builtin_task()
    res = run_episode(task, _command("true"), lambda s, m: backend.create(s, mounts=m), handle, "policy",
                      EpisodeConfig(), admin=admin)
    assert res.harness.reason == "submitted" and res.trajectory.calls == []
    assert admin.calls == ["open", "close_session", "trajectory", "set_reward", "close"]
