"""A harness compacting its own context: the summary call and the conversation that goes on
from it, recorded token-exact as segments of one episode and trained with its reward.

Over real HTTP with the stand-in engine (exact ids) in the request shapes OpenCode and Codex CLI
send when they compact (read off their real runs below), then end to end: real OpenCode and
real Codex CLI in Docker, each told a small context so that the scripted policy's tool outputs
fill it, compact on their own, go on from the scripted summary and solve the task (reward 1.0).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy import ProxyConfig, ProxyServer

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers sit beside us
from proxy_helpers import ServedApp, check_exact, post, standin  # noqa: E402

pytestmark = pytest.mark.timeout(300)

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
TASK = "Fix the off-by-one in calc.add and make the tests pass."
OUTPUT = "\n".join(str(100000 + i) for i in range(40))
SUMMARY = "## Objective\n- Fix calc.add\n## Work State\n- listed the numbers; the edit is next"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tok = load_tokenizer("tiny-llama")
    eng, script = standin(tok)
    db = tmp_path_factory.mktemp("compaction") / "trajectories.db"
    with ServedApp(eng.app()) as e, \
            ProxyServer(ProxyConfig(engine_url=e.url, model="tiny-llama", db_path=str(db)), tokenizer=tok) as p:
        yield SimpleNamespace(eng=eng, script=script, proxy=p, tok=tok, db=db)


def _chat(env, sid, key, messages, tools=(BASH,)) -> dict:
    body = {"model": "policy", "messages": messages, "max_tokens": 200}
    if tools:
        body["tools"] = list(tools)
    r = post(env.proxy.openai_base_url(sid) + "/chat/completions", key, body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def _call(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def _act(env, sid, key, msgs, command, output):
    """One tool step: the reply's tool call and its result appended to `msgs`."""
    env.script.say(_call(command))
    reply = _chat(env, sid, key, msgs)
    msgs += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": output}]
    return reply


def _run(env, shape: str, summary: str = SUMMARY):
    """Two tool steps, the harness's summary call, then two calls that go on from the summary."""
    sid, key = env.proxy.open_session({})
    n0 = len(env.eng.calls)
    system = {"role": "system", "content": "You are a coding agent."}
    msgs = [system, {"role": "user", "content": TASK}]
    _act(env, sid, key, msgs, "seq 100000 100039", OUTPUT)
    _act(env, sid, key, msgs, "cat calc.py", "def add(a, b):\n    return a + b + 1\n")
    env.script.say(summary)
    if shape == "opencode":  # a new conversation: the transcript in one user turn, no tools
        transcript = ('<conversation>\n[User]: ' + TASK + '\n[Assistant tool call]: bash({"command":"seq 100000 '
                      '100039"})\n[Tool result]: ' + OUTPUT + '\n</conversation>\n\nCreate a new anchored summary '
                      'from the conversation history in the <conversation> tags above.')
        got = _chat(env, sid, key, [{"role": "user", "content": transcript}], tools=())["content"]
        after = [system, {"role": "user", "content": "What did we do so far?"}, {"role": "assistant", "content": got},
                 {"role": "user", "content": "Continue if you have next steps."}]
    else:  # codex: the same conversation plus its compaction prompt, no tools
        got = _chat(env, sid, key, msgs + [{"role": "user", "content": "You are performing a CONTEXT CHECKPOINT "
                                                                        "COMPACTION. Create a handoff summary."}],
                    tools=())["content"]
        after = [system, {"role": "user", "content": TASK},
                 {"role": "user", "content": "Another language model started to solve this problem and produced a "
                                             "summary of its thinking process.\n" + got}]
    assert got == summary
    _act(env, sid, key, after, "sed -i 's/ + 1//' calc.py", "")
    env.script.say("Fixed.")
    _chat(env, sid, key, after)
    return sid, env.eng.calls[n0:]


@pytest.mark.parametrize("shape", ["opencode", "codex"])
def test_the_summary_call_and_what_follows_are_segments_with_their_reasons(env, shape):
    sid, engine_calls = _run(env, shape)
    t = env.proxy.trajectory(sid)
    assert [c.segment for c in t.calls] == [0, 0, 1, 2, 2]
    assert [s.split_reason for s in t.segments] == [None, "compaction_summary", "compaction"]
    assert t.segments[2].compacted_from == {"segment": 1, "call_id": t.calls[2].call_id}
    assert t.segments[1].spawned_by is None  # the transcript quotes the bash call: still no sub-agent
    assert t.calls[3].flags["split_reason"] == "compaction"
    check_exact(t, engine_calls)
    # the summary is policy-sampled text: its tokens, and only they, are loss-masked in its segment
    summary_ids = env.tok.encode(SUMMARY, add_special_tokens=False) + [2]
    seg = t.segments[1]
    assert [i for i, m in zip(seg.token_ids, seg.loss_mask) if m] == summary_ids == t.calls[2].completion_ids
    assert seg.token_ids[-len(summary_ids):] == summary_ids and sum(seg.loss_mask) == len(summary_ids)
    # the record (and its JSON export) keeps the link
    from harnessrl.gym.trajectory import Trajectory
    assert Trajectory.from_dict(json.loads(t.to_json())).segments[2].compacted_from == t.segments[2].compacted_from


def test_every_segment_trains_with_the_episode_reward(env):
    from harnessrl.trainers.samples import SampleConfig, build_samples

    won, lost = (env.proxy.trajectory(_run(env, "opencode")[0]) for _ in range(2))
    for t, reward in ((won, 1.0), (lost, 0.0)):
        t.reward, t.status, t.task_id = reward, "ok", "calc-1"
    batch = build_samples([won, lost], SampleConfig())
    mine = [s for s in batch.samples if s.session_id == won.session_id]
    assert sorted(s.segment for s in mine) == [0, 1, 2]
    assert len({s.advantage for s in mine}) == 1  # the summary segment too: one advantage per episode
    assert mine[0].advantage > 0 and sum(s.weight for s in mine) == pytest.approx(1.0)
    theirs = [s for s in batch.samples if s.session_id == lost.session_id]
    assert len({s.advantage for s in theirs}) == 1 and theirs[0].advantage == -mine[0].advantage
    for s in mine:
        assert s.loss_mask == won.segments[s.segment].loss_mask


def test_a_short_reply_or_one_quoted_after_a_tool_call_is_no_summary(env):
    # a reply under MIN_SUMMARY characters reappearing is no evidence of a compaction
    sid, _ = _run(env, "codex", summary="Listed; edit next.")
    assert [s.split_reason for s in env.proxy.trajectory(sid).segments] == [None, "tools_changed", "tools_changed"]
    # a long reply quoted only after the new conversation's first tool call (a tool result, as a
    # sub-agent's answer comes back) does not make it a compaction
    sid, key = env.proxy.open_session({})
    env.script.say(SUMMARY)
    got = _chat(env, sid, key, [{"role": "user", "content": "Report on calc."}], tools=())["content"]
    msgs = [{"role": "user", "content": "Fix calc."}]
    _act(env, sid, key, msgs, "report", got)
    t = env.proxy.trajectory(sid)
    assert [s.split_reason for s in t.segments] == [None, "tools_changed"]
    assert t.segments[1].compacted_from is None


def test_the_scripted_policy_summarizes_and_goes_on_from_its_summary():
    from harnessrl.gym.doubles.scripted import SUMMARY_MARK, ScriptedPolicy

    plan = ["seq 1 40 # pad 0", "seq 1 40 # pad 1", "python3 fix.py"]
    p = ScriptedPolicy(tokenizer=None, plans={TASK: plan})
    tools = "<tools>\n" + json.dumps(BASH) + "\n</tools>"
    ask = ("<|im_start|>user\n<conversation>\n[User]: " + TASK + '\n[Assistant tool call]: bash({"command":"seq 1 40 '
           '# pad 0"})\n[Assistant tool call]: bash({"command":"seq 1 40 # pad 1"})\n</conversation>\nCreate a new '
           "anchored summary<|im_end|>\n<|im_start|>assistant\n")
    text, task, _ = p.decide(ask)
    assert task == TASK and text.startswith(f"{SUMMARY_MARK} 2\n") and TASK in text
    # the conversation that goes on from the summary alone: the plan's third step, then the answer
    after = (f"<|im_start|>system\n{tools}<|im_end|>\n<|im_start|>user\nWhat did we do so far?<|im_end|>\n"
             f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>user\nContinue.<|im_end|>\n<|im_start|>assistant\n")
    assert p.decide(after) == (_call("python3 fix.py"), TASK, 2)
    done = after + _call("python3 fix.py") + "<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"
    assert p.decide(done) == (p.final_text, TASK, 3)
    # a tool output that mentions a summary (pytest's) is not a request for one
    pytest_out = (f"<|im_start|>system\n{tools}<|im_end|>\n<|im_start|>user\n{TASK}<|im_end|>\n<|im_start|>assistant\n"
                  + _call(plan[0]) + "<|im_end|>\n<|im_start|>user\n<tool_response>\n=== short test summary info ===\n"
                  "Please write a summary\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert p.decide(pytest_out) == (_call(plan[1]), TASK, 1)
    # a title request (no summary asked, no step begun) is not a compaction
    title = f"<|im_start|>system\nYou are a title generator.<|im_end|>\n<|im_start|>user\n{TASK}<|im_end|>\n"
    assert p.decide(title + "<|im_start|>assistant\n")[0] == p.final_text


def test_the_store_labels_the_summary_and_atif_keeps_the_link(tmp_path):
    """From the rows alone: the compaction row's flag names the summary's segment and position;
    the record gives its call id, relabels a summary alone in its segment, renumbers segments
    densely (a detached row's segment is skipped), and survives the ATIF round trip."""
    from harnessrl.gym.proxy.store import Store
    from harnessrl.gym.tools.formats.atif import from_atif, to_atif, validate

    store = Store(tmp_path / "trajectories.db")
    store.open_session("s", {}, "h", "tiny-llama")
    base = dict(session_id="s", dialect="openai_chat", queue_s=0.0, gen_s=0.1, env_s=None, finish_reason="stop")
    row = dict(logprobs=[-0.5], versions=[1])
    store.add_call(call_id="m0", idx=0, segment=0, split_reason=None, prefix_len=0, new_prompt=[1, 2],
                   completion=[7], flags={}, **row, **base)
    store.add_call(call_id="x", idx=1, segment=1, split_reason="tools_changed", prefix_len=0, new_prompt=[5],
                   completion=[], logprobs=[], versions=[], flags={"detached": "engine_error"}, **base)
    store.add_call(call_id="s0", idx=2, segment=2, split_reason="tools_changed", prefix_len=0, new_prompt=[3],
                   completion=[8], flags={}, **row, **base)
    store.add_call(call_id="c0", idx=3, segment=3, split_reason="compaction", prefix_len=0, new_prompt=[4, 8],
                   completion=[9], flags={"compacted_from": {"segment": 2, "call": 0}}, **row, **base)
    store.set_reward("s", 1.0, "ok", "submitted")
    traj = store.trajectory("s")
    store.close()
    assert [s.split_reason for s in traj.segments] == [None, "compaction_summary", "compaction"]
    assert traj.segments[2].compacted_from == {"segment": 1, "call_id": "s0"}
    assert [s.token_ids for s in traj.segments] == [[1, 2, 7], [3, 8], [4, 8, 9]]
    doc = to_atif(traj, decode=lambda ids: " ".join(f"t{i}" for i in ids))
    validate(doc)
    assert from_atif(json.loads(json.dumps(doc))).to_dict() == traj.to_dict()


@pytest.mark.browser
def test_the_viewer_shows_the_compaction_where_its_segments_start(env):
    """Headless Chromium on the viewer over this store: both reasons where the segments start
    (call banner and segment head) and the link from the conversation to its summary."""
    from test_viewer_browser import _browser, _open  # skips without chromium/selenium
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from harnessrl.gym.tools.viewer import RunIndex
    from harnessrl.gym.tools.viewer.app import build_app

    sid, _ = _run(env, "opencode")
    env.proxy.set_reward(sid, 1.0, "ok", "submitted")
    t = env.proxy.trajectory(sid)
    driver = _browser()
    try:
        with ServedApp(build_app([RunIndex(env.db.parent, name="compaction")])) as served:
            _open(driver, f"{served.url}/#/run/0/episode/{sid}")
            WebDriverWait(driver, 120).until(
                lambda d: d.find_element(By.ID, "token-view").get_attribute("data-loaded") == "true")
            reasons = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".split-reason")]
            assert sorted(reasons) == ["compaction", "compaction", "compaction_summary", "compaction_summary"]
            assert len(driver.find_elements(By.CSS_SELECTOR, "#token-view .segment")) == 3
            link = driver.find_element(By.CSS_SELECTOR, "#token-view .segment[data-segment='2'] .compacted-from")
            assert link.text == f"· goes on from the summary in segment 1 ({t.calls[2].call_id})"
            assert len(driver.find_elements(By.CSS_SELECTOR, "#token-view .tok.sampled")) == \
                sum(sum(s.loss_mask) for s in t.segments)
    finally:
        driver.quit()


# -- end to end: real harnesses compacting in Docker ----------------------------------------------
def _compacting_episode(adapter, pads: list[str]):
    from adapter_helpers import builtin_task, scripted_stack
    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.episode import EpisodeConfig, ProxyHandle, run_episode

    if installed_spec("npm", adapter.name) != adapter.install.split(":", 1)[1]:
        pytest.skip(f"{adapter.name} not installed: run scripts/install_harnesses.sh {adapter.name}")
    with scripted_stack() as (engine, proxy, backend):
        task = builtin_task()
        engine.set_plans({task.problem_statement: pads + list(task.gold_plan)})
        start = len(engine.calls)
        res = run_episode(task, adapter, lambda spec, mounts: backend.create(spec, mounts=mounts),
                          ProxyHandle.of(proxy), "policy", EpisodeConfig(max_calls=12, wall_time_s=240))
        return res, engine.calls[start:], engine.tokenizer


def _assert_compacted(res, calls, tok):
    from harnessrl.gym.doubles.scripted import SUMMARY_MARK
    from harnessrl.gym.tools.check_adapter import token_exact_problems
    from harnessrl.trainers.samples import SampleConfig, build_samples

    t = res.trajectory
    assert (res.reason, res.status, t.reward) == ("submitted", "ok", 1.0), (res.reason, res.error)
    assert token_exact_problems(t, calls) == []
    reasons = [s.split_reason for s in t.segments]
    assert reasons.count("compaction") == 1 and reasons.count("compaction_summary") == 1, reasons
    k = reasons.index("compaction")
    link = t.segments[k].compacted_from
    assert link["segment"] == reasons.index("compaction_summary") < k
    summary_call = next(c for c in t.calls if c.call_id == link["call_id"])
    text = tok.decode(summary_call.completion_ids, skip_special_tokens=True)
    assert text.startswith(SUMMARY_MARK)  # the scripted engine's summary, as sampled
    seg = t.segments[link["segment"]]
    assert seg.call_ids == [summary_call.call_id]
    assert [i for i, m in zip(seg.token_ids, seg.loss_mask) if m] == summary_call.completion_ids
    # the conversation went on from the summary: the summary's text is in its first prompt,
    # and the plan's edit ran after it (the reward says it worked)
    first = next(c for c in t.calls if c.segment == k)
    assert text.strip() in tok.decode(t.call_prompt(first), skip_special_tokens=False)
    assert any("HARNESSRL_EDIT" in tok.decode(c.completion_ids) for c in t.calls if c.segment == k)
    assert all(len(t.call_prompt(c)) < 8192 for c in t.calls)  # within SmolLM2's context throughout
    t.task_id = "g"
    batch = build_samples([t], SampleConfig(baseline="none"))
    assert sorted(s.segment for s in batch.samples) == list(range(len(t.segments)))
    assert {s.advantage for s in batch.samples} == {1.0}
    # and a real update on it: every sampled token of every segment (the summary's included)
    # goes into one step of the built-in trainer on the model whose tokenizer rendered it
    from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig

    trainer = TorchTrainer(TorchTrainerConfig(model="tiny-llama", device="cpu", lr=1e-3, seed=0,
                                              samples=SampleConfig(baseline="none")))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    m = trainer.step([t])
    assert m.updated and m.version == 1 and m.samples == len(t.segments)
    assert m.tokens == sum(sum(s.loss_mask) for s in t.segments) and m.grad_norm > 0
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters() if n in before)
    return t


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_opencode_compacts_its_own_context_and_both_segments_train():
    """OpenCode told a context of 8192 with 400 for output compacts once a reply's usage reaches
    7792 tokens: its first prompt (system and tools) is ~7.5k, so two 40-line tool outputs
    take it there; it sends its summary request as a new conversation without tools, then goes
    on from the summary (kept as an assistant turn) and the plan's edit follows."""
    from harnessrl.adapters.opencode import OpenCodeAdapter

    res, calls, tok = _compacting_episode(OpenCodeAdapter(context=8192, output=400),
                                          [f"seq 100000 100060 # pad {i}" for i in range(2)])
    _assert_compacted(res, calls, tok)


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_codex_compacts_its_own_context_and_both_segments_train():
    """Codex CLI with `model_auto_compact_token_limit = 7400`: its first prompt is ~6.6k, two
    100-line tool outputs pass the limit; it asks for a handoff summary (its conversation plus
    its compaction prompt, without tools) and goes on from a history holding the summary in a
    user turn."""
    from harnessrl.adapters.codex import CodexAdapter

    res, calls, tok = _compacting_episode(CodexAdapter(auto_compact_tokens=7400),
                                          [f"seq 100000 100100 # pad {i}" for i in range(2)])
    _assert_compacted(res, calls, tok)
