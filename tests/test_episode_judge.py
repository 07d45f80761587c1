"""How an episode's ending is judged from the harness's account and the proxy's final record
(no Docker needed: the record is built as the proxy stores it)."""
from __future__ import annotations

import pytest

from harnessrl.adapters.base import HarnessResult
from harnessrl.adapters.cancel import Cancel
from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, Submitted, _judge, _Run
from harnessrl.gym.trajectory import CallRecord, Trajectory

HANDLE = ProxyHandle("http://127.0.0.1:1", "token", engine_url=None)


def _call(i: int, finish: str = "stop", **flags) -> CallRecord:
    return CallRecord(call_id=f"c{i}", session_id="s", index=i, dialect="openai-chat", prompt_prefix_len=0,
                      new_prompt_ids=[1], completion_ids=[2], logprobs=[0.0], versions=[0], finish_reason=finish,
                      segment=0, flags=flags)


def _judged(calls, *, exit_reason="submitted", termination="", cancel=False, early=None):
    run = _Run(Cancel())
    run.harness = HarnessResult(exit_reason, 0)
    if cancel:
        run.cancel.set("timeout")
    end = _judge(run, early, Trajectory("s", [], termination=termination, calls=calls), HANDLE, EpisodeConfig(max_calls=5))
    return end.reason, end.status


@pytest.mark.parametrize("calls, expected", [
    ([_call(0), _call(1)], ("submitted", "ok")),
    ([_call(0), _call(1, "engine_error", detached="engine_error", engine_error="refused")], ("engine_error", "infra_error")),
    # a timed-out call on an engine that still answered /health is still the engine's failure
    ([_call(0, "engine_error", engine_error="timeout", engine_timeout_phase="total", engine_healthy=True)],
     ("engine_error", "infra_error")),
    ([_call(0), _call(1, "proxy_error", detached="proxy_error", proxy_error="KeyError: 'x'")], ("infra", "infra_error")),
    ([_call(0), _call(1, "stop", detached="undelivered", undelivered="client_disconnected")], ("submitted", "ok")),
])
def test_the_record_decides_over_a_harness_that_exited_0(calls, expected):
    assert _judged(calls) == expected


def test_cancel_and_stale_override_everything():
    failed = [_call(0, "engine_error", engine_error="x")]
    assert _judged(failed, cancel=True) == ("cancelled", "infra_error")
    assert _judged(failed, termination="stale") == ("stale", "infra_error")
    assert _judged([_call(i) for i in range(5)], exit_reason="harness_exited") == ("call_limit", "truncated")
    assert _judged([], early=Submitted("the adapter said so")) == ("submitted", "ok")
