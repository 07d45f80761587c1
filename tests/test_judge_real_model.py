"""The real embedded SmolLM2-135M as the judge, served by the project's own local engine behind its
own proxy (an OpenAI-compatible chat endpoint, a session of its own): the judge's call is recorded
in the reward (request, response, latency) and by the proxy token-exact, and its answer goes
through the strict parse. A 135M model does not follow the strict format, so the episode is
masked as a judge failure, never scored."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import real_model_stack  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def real_stack():
    yield from real_model_stack(48)


@pytest.mark.timeout(600)
def test_smollm2_through_our_proxy_as_the_judge_is_recorded_and_parsed_strictly(real_stack, monkeypatch):
    from harnessrl.gym.grading.judge import JudgeConfig, parse_answer
    from harnessrl.gym.grading.score import score
    from harnessrl.gym.grading.verdict import RewardConfig
    from harnessrl.gym.models import load_tokenizer
    from harnessrl.gym.proxy_admin import ProxyAdmin
    from harnessrl.gym.tasks import Task
    from harnessrl.gym.tasks.loaders import load_suite

    handle, backend = real_stack
    calc2 = next(t for t in load_suite("builtin") if t.instance_id.endswith("__calc-2"))
    task = Task.model_validate({**calc2.model_dump(), "FAIL_TO_PASS": [], "PASS_TO_PASS": [], "test_patch": "",
                                "reward": {"kind": "judge", "rubric": "Binary '-' must be left-associative."}})
    admin = ProxyAdmin(handle)
    sid, key = admin.open({"task_id": "judge-of-calc-2", "harness": "judge"})
    monkeypatch.setenv("HARNESSRL_TEST_JUDGE_KEY", key)
    cfg = RewardConfig(judge=JudgeConfig(base_url=f"{handle.url.rstrip('/')}/s/{sid}/v1", model="policy",
                                         api_key_env="HARNESSRL_TEST_JUDGE_KEY", max_tokens=48))
    sb = backend.create(task.repo_spec())
    try:
        for cmd in task.gold_plan:
            assert sb.exec(cmd, timeout=60).exit_code == 0
        r = score(sb, task, cfg)
    finally:
        sb.close()
    admin.close_session(sid)
    recorded = admin.trajectory(sid)
    admin.close()

    j = r.judge
    assert j["response"]["status"] == 200, (j["url"], j["response"], r.reason)
    assert j["response"]["status"] == 200 and j["latency_s"] > 0
    assert j["request"]["model"] == "policy" and calc2.patch in j["request"]["messages"][1]["content"]
    content = json.loads(j["response"]["body"])["choices"][0]["message"]["content"]
    # The proxy recorded the judge's one call token-exact, in its own session: what the judge
    # answered is what the engine sampled.
    (call,) = recorded.calls
    assert 0 < len(call.completion_ids) <= 48
    tokenizer = load_tokenizer("smollm2-135m")
    assert tokenizer.decode(call.completion_ids, skip_special_tokens=True).strip() == content.strip()
    try:
        expected = parse_answer(content, j["verdict_id"])[0]
    except ValueError as e:
        expected, why = None, str(e)
    if expected is None:  # the likely case: SmolLM2 does not answer in the strict format
        assert (r.reward, r.status, r.cause, j["failure"]) == (None, "infra_error", "infra", "unparsable")
        assert r.reason == f"judge unparsable: the judge's answer is unusable: {why}"
    else:
        assert (r.reward, r.status, r.kind) == (expected, "ok", "judge")
