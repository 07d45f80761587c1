"""Sub-agents: several conversations in one episode, each its own lineage of segments.

A harness that runs a sub-agent (Claude Code's Agent/Task tool) sends, inside one episode, a
second conversation whose first user message is the tool call's prompt, then resumes the
main conversation with the tool's result. The record must keep each conversation
token-exact in its own segment, say which call spawned the sub-agent, and train both as
samples of the same trajectory with the episode's reward.

Over real HTTP with the stand-in engine (exact ids), then end to end with Claude Code in
Docker and the scripted policy delegating its plan to a sub-agent.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import ServedApp, check_exact, post, standin

pytestmark = pytest.mark.timeout(300)

AGENT_TOOL = {"name": "Agent", "description": "Launch a sub-agent",
              "input_schema": {"type": "object", "properties": {"description": {"type": "string"},
                                                                 "prompt": {"type": "string"}},
                               "required": ["description", "prompt"]}}
BASH_TOOL = {"name": "Bash", "description": "Run a command",
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                              "required": ["command"]}}
SUB_PROMPT = "Find the failing test in the calc package and report its name."


@pytest.fixture(scope="module")
def env():
    tok = load_tokenizer("tiny-llama")
    eng, script = standin(tok)
    with ServedApp(eng.app()) as e, ProxyServer(ProxyConfig(engine_url=e.url, model="tiny-llama"), tokenizer=tok) as p:
        yield SimpleNamespace(eng=eng, script=script, proxy=p)


def _call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _messages(env, sid, key, system, tools, messages) -> dict:
    body = {"model": "policy", "max_tokens": 400, "system": system, "tools": tools, "messages": messages}
    r = post(env.proxy.anthropic_base_url(sid) + "/v1/messages", key, body,
             headers={"x-api-key": key, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    return r.json()


def _tool_use(reply: dict) -> dict:
    return next(b for b in reply["content"] if b["type"] == "tool_use")


def _run_delegation(env, sub_first_message: str):
    """main: Agent call -> sub-agent: Bash call, final answer -> main: final answer."""
    sid, key = env.proxy.open_session({})
    n0 = len(env.eng.calls)
    main = [{"role": "user", "content": "Fix the calc package."}]
    env.script.say(_call("Agent", description="find the test", prompt=SUB_PROMPT))
    r0 = _messages(env, sid, key, "You are the main agent.", [AGENT_TOOL, BASH_TOOL], main)
    spawn = _tool_use(r0)
    main += [{"role": "assistant", "content": r0["content"]}]

    sub = [{"role": "user", "content": sub_first_message}]
    env.script.say(_call("Bash", command="python3 -m pytest -q"))
    r1 = _messages(env, sid, key, "You are a sub-agent.", [BASH_TOOL], sub)
    sub += [{"role": "assistant", "content": r1["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": _tool_use(r1)["id"],
                                          "content": "1 failed: test_add"}]}]
    env.script.say("The failing test is test_add.")
    r2 = _messages(env, sid, key, "You are a sub-agent.", [BASH_TOOL], sub)

    main += [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": spawn["id"],
                                           "content": r2["content"][0]["text"]}]}]
    env.script.say("Done.")
    _messages(env, sid, key, "You are the main agent.", [AGENT_TOOL, BASH_TOOL], main)
    return sid, spawn, env.eng.calls[n0:]


def test_sub_agent_is_its_own_lineage_attributed_to_the_spawning_call(env):
    sid, spawn, engine_calls = _run_delegation(env, SUB_PROMPT)
    t = env.proxy.trajectory(sid)
    # the main conversation resumed its own segment after the sub-agent ran
    assert [c.segment for c in t.calls] == [0, 1, 1, 0]
    assert [s.split_reason for s in t.segments] == [None, "spawned"]
    by = t.segments[1].spawned_by
    assert {k: by[k] for k in ("segment", "call_id", "tool")} == {"segment": 0, "call_id": t.calls[0].call_id,
                                                                   "tool": "Agent"}
    # the proxy's own id of the tool call; Anthropic shows it as toolu_<same suffix>
    assert by["tool_call_id"].startswith("call_") and spawn["id"] == "toolu_" + by["tool_call_id"][5:]
    assert t.segments[0].spawned_by is None
    check_exact(t, engine_calls)
    assert t.segments[0].token_ids == t.call_prompt(t.calls[3]) + t.calls[3].completion_ids
    # the record survives the JSON round trip with its attribution
    from harnessrl.gym.trajectory import Trajectory
    assert Trajectory.from_dict(json.loads(t.to_json())).segments[1].spawned_by == t.segments[1].spawned_by


def test_both_lineages_train_with_the_episode_reward(env):
    from harnessrl.trainers.samples import SampleConfig, build_samples

    sid, _, _ = _run_delegation(env, "Please: " + SUB_PROMPT + " Be brief.")
    t = env.proxy.trajectory(sid)
    assert t.segments[1].split_reason == "spawned"  # the prompt may be wrapped by the harness
    t.reward, t.status, t.task_id = 1.0, "ok", "calc-1"
    other = env.proxy.trajectory(_run_delegation(env, SUB_PROMPT)[0])
    other.reward, other.status, other.task_id = 0.0, "ok", "calc-1"
    batch = build_samples([t, other], SampleConfig())
    assert batch.trajectories == 2
    mine = [s for s in batch.samples if s.session_id == t.session_id]
    assert sorted(s.segment for s in mine) == [0, 1]
    assert len({s.advantage for s in mine}) == 1 and mine[0].advantage > 0
    assert sum(s.weight for s in mine) == pytest.approx(1.0)
    for s in mine:
        assert s.loss_mask == t.segments[s.segment].loss_mask


def test_an_unrelated_new_conversation_is_not_attributed(env):
    sid, _, _ = _run_delegation(env, "Write a short title for this session.")
    t = env.proxy.trajectory(sid)
    assert [s.split_reason for s in t.segments] == [None, "tools_changed"]
    assert t.segments[1].spawned_by is None



def test_parallel_sub_agents_interleave_each_in_its_own_lineage(env):
    """Two Agent calls in one reply; their conversations' calls interleave; main resumes."""
    sid, key = env.proxy.open_session({})
    n0 = len(env.eng.calls)
    prompts = ["Investigate the parser module and report the bug.", "Investigate the printer module and report."]
    both = (_call("Agent", description="a", prompt=prompts[0]) + "\n" + _call("Agent", description="b", prompt=prompts[1]))
    env.script.say(both)
    main = [{"role": "user", "content": "Fix it."}]
    r0 = _messages(env, sid, key, "main", [AGENT_TOOL, BASH_TOOL], main)
    uses = [b for b in r0["content"] if b["type"] == "tool_use"]
    assert len(uses) == 2
    subs = [[{"role": "user", "content": p}] for p in prompts]
    for step in range(2):
        for i in (0, 1):
            env.script.say(f"sub {i} step {step}")
            r = _messages(env, sid, key, "sub", [BASH_TOOL], subs[i])
            subs[i] += [{"role": "assistant", "content": r["content"]}, {"role": "user", "content": f"go on {step}"}]
    main += [{"role": "assistant", "content": r0["content"]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"], "content": "ok"} for u in uses]}]
    env.script.say("Done.")
    _messages(env, sid, key, "main", [AGENT_TOOL, BASH_TOOL], main)
    t = env.proxy.trajectory(sid)
    assert [c.segment for c in t.calls] == [0, 1, 2, 1, 2, 0]
    assert [s.split_reason for s in t.segments] == [None, "spawned", "spawned"]
    assert [s.spawned_by["call_id"] for s in t.segments[1:]] == [t.calls[0].call_id] * 2
    assert ["toolu_" + s.spawned_by["tool_call_id"][5:] for s in t.segments[1:]] == [u["id"] for u in uses]
    check_exact(t, env.eng.calls[n0:])

@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_claude_code_sub_agent_is_a_lineage_of_the_same_episode():
    """Real Claude Code in Docker: the scripted main agent hands its plan to Claude Code's own
    sub-agent tool; the sub-agent's Bash calls fix the repository (reward 1.0), its
    conversation is a spawned segment attributed to the main call that issued the tool call,
    the main conversation resumes its own segment, and every call is token-exact."""
    from harnessrl.adapters import get_adapter
    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.tools.check_adapter import token_exact_problems
    from harnessrl.gym.doubles.scripted import DELEGATED
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode
    from adapter_helpers import builtin_task, scripted_stack

    adapter = get_adapter("claude-code-agents")
    assert adapter.tools.endswith(",Agent")
    if installed_spec("npm", "claude-code") != adapter.install.split(":", 1)[1]:
        pytest.skip("claude-code not installed: run scripts/install_harnesses.sh claude-code")
    with scripted_stack() as (engine, proxy, backend):
        task = builtin_task()
        engine.set_tasks([task], gold=True)
        engine.policy.delegate_tool = "Agent"
        start = len(engine.calls)
        res = run_episode(task, adapter, lambda spec, mounts: backend.create(spec, mounts=mounts),
                          ProxyHandle.of(proxy), "policy", EpisodeConfig(max_calls=12, wall_time_s=300))
        calls = engine.calls[start:]
    t = res.trajectory
    assert (res.reason, res.status, t.reward) == ("submitted", "ok", 1.0), (res.reason, res.error)
    assert token_exact_problems(t, calls) == []
    spawned = [i for i, s in enumerate(t.segments) if s.split_reason == "spawned"]
    assert spawned, [s.split_reason for s in t.segments]
    seg = t.segments[spawned[0]]
    by = seg.spawned_by
    assert by["tool"] == "Agent"
    parent = next(c for c in t.calls if c.call_id == by["call_id"])
    assert parent.segment == by["segment"] != spawned[0]
    assert '"name": "Agent"' in engine.tokenizer.decode(parent.completion_ids)
    assert by["tool_call_id"].removeprefix("toolu_").removeprefix("call_")  # as the conversation shows it
    sub_calls = [c for c in t.calls if c.segment == spawned[0]]
    assert all(DELEGATED in engine.tokenizer.decode(t.call_prompt(c)) for c in sub_calls)
    assert len(sub_calls) >= len(task.gold_plan) + 1  # the plan's Bash calls, then its answer
    # the main conversation went on in its own segment (Claude Code 2.1.332 runs the sub-agent
    # in the background: the parent answers on, and a task notification brings the result)
    main_after = [c for c in t.calls if c.segment == by["segment"] and c.index > parent.index]
    assert main_after, "the main conversation did not go on in its own segment"
    assert len({c.segment for c in t.calls}) == 2

