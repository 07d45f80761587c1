"""Teacher data and the SFT stage, on real parts: the proxy over real HTTP, the local engine
(tiny-llama) behind a second proxy as the OpenAI-compatible teacher, the real tokenizer, the
built-in trainer, and (docker) mini-swe-agent with the scripted gold teacher in a sandbox."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import httpx
import pytest

from harnessrl.gym.models import ModelNotPrepared, load_tokenizer, resolve_model
from harnessrl.gym.proxy.config import ProxyConfig
from harnessrl.gym.proxy.server import ProxyServer
from harnessrl.gym.trajectory import Segment, Trajectory

try:
    resolve_model("tiny-llama")
except ModelNotPrepared as e:  # pragma: no cover
    pytest.skip(f"tiny-llama not prepared: {e}", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def _chat(proxy: ProxyServer, sid: str, key: str, messages: list[dict], **kw) -> dict:
    r = httpx.post(f"{proxy.openai_base_url(sid)}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "policy", "messages": messages, **kw}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _no_logprob(x) -> bool:
    return x is None or math.isnan(x)  # NaN in process; JSON exports (orjson) write it null


def _assert_teacher_segment(traj: Trajectory, label: str) -> None:
    """One linear segment; mask 1 exactly on the calls' completions, no logprobs, version -1."""
    assert len(traj.segments) == 1
    seg = traj.segments[0]
    spans = []
    for c in traj.calls:
        assert c.flags["teacher"]["teacher"] == label
        start = len(traj.call_prompt(c))
        assert seg.token_ids[start:start + len(c.completion_ids)] == c.completion_ids
        spans += range(start, start + len(c.completion_ids))
        assert all(_no_logprob(x) for x in c.logprobs) and c.versions == [-1] * len(c.completion_ids)
    assert [i for i, m in enumerate(seg.loss_mask) if m] == spans
    assert all(_no_logprob(seg.logprobs[i]) and seg.versions[i] == -1 for i in spans)


# -- (b) pass-through: the local engine behind a proxy is the OpenAI-compatible teacher ------------
@pytest.mark.model
@pytest.mark.timeout(600)
def test_teacher_pass_through_records_the_reply_in_the_students_tokens():
    from harnessrl.trainers.engine import EngineServer

    student_tok = load_tokenizer("smollm2-135m")
    im_end = student_tok.convert_tokens_to_ids("<|im_end|>")
    with EngineServer(model="tiny-llama", weight_version="0", num_threads=1) as engine, \
            ProxyServer(ProxyConfig(engine_url=engine.url, model="tiny-llama", honor_seed=True)) as teacher:
        tsid, tkey = teacher.open_session({"role": "teacher"})
        cfg = ProxyConfig(engine_url="", model="smollm2-135m", teacher_url=teacher.openai_base_url(tsid),
                          teacher_model="policy", teacher_api_key=tkey)
        with ProxyServer(cfg, tokenizer=student_tok) as student:
            sid, key = student.open_session({"teacher": "pass-through"})
            msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Say hi."}]
            first = _chat(student, sid, key, msgs, max_tokens=12, seed=3)
            msgs += [first["message"], {"role": "user", "content": "Once more."}]
            second = _chat(student, sid, key, msgs, max_tokens=12, seed=4)
            traj = student.trajectory(sid)
        tt = teacher.trajectory(tsid)
    # the teacher generated both replies (in its own session, with its own tokens)
    assert len(tt.calls) == 2 and all(c.versions and min(c.versions) >= 0 for c in tt.calls)
    teacher_texts = [teacher.core.renderer.decode(c.completion_ids) for c in tt.calls]
    assert [first["message"]["content"], second["message"]["content"]] == teacher_texts
    # the student's record: each reply re-tokenized by the student's tokenizer + its end of turn
    assert len(traj.calls) == 2
    for c, text, teacher_call in zip(traj.calls, teacher_texts, tt.calls):
        ends = [im_end] if teacher_call.finish_reason != "length" else []
        assert c.completion_ids == student_tok.encode(text, add_special_tokens=False) + ends
        assert c.flags["teacher"] == {"teacher": cfg.teacher_url, "model": "policy"}
    _assert_teacher_segment(traj, cfg.teacher_url)
    # and the segment is exactly the student's chat template over the whole conversation
    full = student_tok.apply_chat_template(msgs + [second["message"]], tokenize=False)
    seg_text = student_tok.decode(traj.segments[0].token_ids, skip_special_tokens=False)
    assert full.startswith(seg_text) and len(seg_text) >= len(full) - len("<|im_end|>\n")


class _ToolTeacher:
    """A minimal OpenAI chat server whose reply is one tool call (a real server on loopback)."""

    def __init__(self):
        self.bodies: list[dict] = []

    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def chat(request):
            self.bodies.append(await request.json())
            return JSONResponse({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls",
                                 "message": {"role": "assistant", "content": "Listing.", "tool_calls": [
                                     {"id": "t1", "type": "function",
                                      "function": {"name": "bash", "arguments": "{\"command\": \"ls -la\"}"}}]}}]})
        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.mark.timeout(120)
def test_teacher_tool_call_is_written_in_the_students_tool_format():
    from harnessrl.gym.served import ServedApp

    tok = load_tokenizer("tiny-llama")
    fake = _ToolTeacher()
    with ServedApp(fake.app()) as served, ProxyServer(ProxyConfig(
            engine_url="", model="tiny-llama", teacher_url=served.url + "/v1", teacher_model="big")) as proxy:
        sid, key = proxy.open_session({})
        msgs = [{"role": "user", "content": "list files"}]
        choice = _chat(proxy, sid, key, msgs, tools=TOOLS, max_tokens=64)
        traj = proxy.trajectory(sid)
    body = fake.bodies[0]
    assert (body["model"], body["messages"], body["tools"][0]["function"]["name"]) == ("big", msgs, "bash")
    # the harness gets the call parsed from the student's rendering, as if the student sampled it
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("bash", {"command": "ls -la"})
    expected = 'Listing.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    c = traj.calls[0]
    assert c.completion_ids == tok.encode(expected, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    _assert_teacher_segment(traj, served.url + "/v1")


# -- the token-level teacher, then SFT and RL on the built-in trainer --------------------------------
GOLD = "The bug is in add(): it returns a - b. Fix: return a + b."


def _teacher_records(n: int = 2) -> list[Trajectory]:
    """Real teacher records: a proxy with `teacher="scripted"` over a token-level teacher that
    writes GOLD in the student's tokens (as the scripted gold policy does)."""
    from harnessrl.gym.backends.inprocess import CallableBackend, TokenReply

    tok = load_tokenizer("tiny-llama")
    gold = tok.encode(GOLD, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]

    async def fn(ids, params, rid):
        return TokenReply(gold, [-0.5] * len(gold), "stop", weight_version="7")

    out = []
    with ProxyServer(ProxyConfig(engine_url="", model="tiny-llama", teacher="scripted"),
                     backend=CallableBackend(fn)) as proxy:
        for i in range(n):
            sid, key = proxy.open_session({"teacher": "scripted"})
            msgs = [{"role": "user", "content": f"Task {i}: fix add()."}]
            first = _chat(proxy, sid, key, msgs)
            _chat(proxy, sid, key, msgs + [first["message"], {"role": "user", "content": "tests still fail"}])
            proxy.set_reward(sid, 1.0, "ok", "submitted")
            out.append(proxy.trajectory(sid))
    for t in out:  # the backend's logprobs and version are not kept: a teacher is no policy version
        _assert_teacher_segment(t, "scripted")
        assert sum(t.segments[0].loss_mask) == 2 * len(gold)
    return out


def _trainer(**kw):
    from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig

    return TorchTrainer(TorchTrainerConfig(**dict(dict(model="tiny-llama", device="cpu", lr=1e-3, seed=0), **kw)))


def test_sft_loss_on_hand_computed_numbers():
    import torch

    from harnessrl.trainers.sft import sft_loss

    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -1.5]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    loss = sft_loss(logp, mask)
    assert loss.item() == pytest.approx((1 + 3 + 4) / 3)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1 / 3, 0, -1 / 3, 0, -1 / 3, 0])
    assert sft_loss(logp, mask, denominator=8.0).item() == pytest.approx(1.0)  # a micro-batch's share


@pytest.mark.timeout(600)
def test_sft_step_lowers_the_masked_loss_and_rl_refuses_teacher_data():
    from harnessrl.trainers.samples import RecordError, SampleConfig, build_samples
    from harnessrl.trainers.sft import sft_samples

    batch = _teacher_records()
    with pytest.raises(RecordError, match="teacher data") as e:
        build_samples(batch, SampleConfig())
    assert e.value.field == "metadata.teacher"
    from harnessrl.trainers.samples import validate_trajectory  # the bridges' entry check (verl)

    with pytest.raises(RecordError, match="teacher data"):
        validate_trajectory(batch[0])
    samples = sft_samples(batch)
    assert [s.n_sampled for s in samples] == [sum(t.segments[0].loss_mask) for t in batch]
    assert all(s.logprobs == [0.0] * len(s.token_ids) and set(s.versions) == {-1} for s in samples)
    trainer = _trainer(micro_batch_tokens=64)  # several micro-batches per update
    m1 = trainer.sft_step(batch)
    m2 = trainer.sft_step(batch)  # its loss is measured on the same batch before its own update
    assert m1["updated"] and m1["tokens"] == sum(s.n_sampled for s in samples) and m1["grad_norm"] > 0
    assert m2["loss"] < m1["loss"], (m1, m2)
    assert (trainer.version, m2["version"], m2["step"]) == (2, 2, 2)
    # not teacher data, failed teacher episodes and malformed masks are named
    plain = Trajectory("p", [Segment([1, 2], [0, 1], [0.0, -0.1], [-1, 0])], 1.0, "ok", task_id="t")
    with pytest.raises(RecordError, match="not teacher data"):
        sft_samples([plain])
    failed = Trajectory.from_dict(dict(batch[0].to_dict(), reward=0.0))
    with pytest.raises(RecordError, match="failed teacher episode") as e:
        sft_samples([failed])
    assert e.value.field == "reward"
    assert len(sft_samples([failed], min_reward=None)) == 1


@pytest.mark.timeout(600)
def test_trainable_layers_trains_only_the_top_blocks():
    import torch

    batch = _teacher_records()
    trainer = _trainer(trainable_layers=1)
    blocks = trainer.model.model.layers
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    m1 = trainer.sft_step(batch)
    m2 = trainer.sft_step(batch)
    assert m2["loss"] < m1["loss"], (m1, m2)
    top = f"model.layers.{len(blocks) - 1}."
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith(top) or n == "model.norm.weight" for n in changed), sorted(changed)
    assert any(n.startswith(top) for n in changed) and "model.embed_tokens.weight" not in changed
    with pytest.raises(ValueError, match="trainable_layers"):
        _trainer(trainable_layers=len(blocks) + 1)


def _on_policy(trainer, tok, version: int, seed: int = 0) -> list[Trajectory]:
    """Trajectories sampled from the trainer's current weights (engine-style records)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    model = trainer.model.eval()
    out = []
    for sid, task, reward in (("a1", "A", 1.0), ("a2", "A", 0.0), ("b1", "B", 1.0), ("b2", "B", 0.0)):
        ids = tok.apply_chat_template([{"role": "user", "content": f"fix bug {task}"}], add_generation_prompt=True,
                                      return_dict=False)
        mask, lps, vers = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids)
        with torch.no_grad():
            for _ in range(6):
                lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
                t = int(torch.multinomial(lp.exp(), 1, generator=gen).item())
                ids.append(t), mask.append(1), lps.append(float(lp[t])), vers.append(version)
        out.append(Trajectory(sid, [Segment(ids, mask, lps, vers)], reward, "ok", task_id=task))
    return out


@pytest.mark.timeout(600)
def test_rl_step_after_sft_changes_parameters_and_keeps_mismatch_zero():
    import torch

    tok = load_tokenizer("tiny-llama")
    trainer = _trainer()
    trainer.sft_step(_teacher_records(1))
    assert trainer.version == 1
    batch = _on_policy(trainer, tok, trainer.version)
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    m = trainer.step(batch)
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(before[k], v)]
    assert "model.embed_tokens.weight" in changed and m.updated and m.version == 2
    assert m.mismatch_tokens == 24 and m.logprob_mismatch_max < 1e-5 and m.logprob_mismatch_mean < 1e-6


# -- (a) collect: the scripted gold teacher through mini-swe-agent in Docker --------------------------
@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_collect_with_the_scripted_teacher_keeps_only_successful_episodes(tmp_path):
    import asyncio

    from adapter_helpers import builtin_task, docker_backend
    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.tools.collect import CollectConfig, collect
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.rollout import RolloutConfig

    backend = docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    good = builtin_task()
    # the same bug, a different statement, and a "gold" plan that fixes nothing: the teacher fails it
    lines = good.problem_statement.splitlines()
    bad = good.model_copy(update={"instance_id": good.instance_id + "-noop", "gold_plan": ["true"],
                                  "problem_statement": "\n".join(["Something in this repository is broken."] + lines[1:])})
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps(t.model_dump(mode="json")) + "\n" for t in (good, bad)))
    cfg = CollectConfig(teacher="scripted", episodes=2, concurrency=2, rollout=RolloutConfig(
        harness="mini-swe-agent", suite=str(suite), model="tiny-llama", sandbox="docker", sandbox_pool_size=0,
        episode=EpisodeConfig(max_calls=4, wall_time_s=300)))
    try:
        rep = asyncio.run(collect(cfg, tmp_path / "out"))
    finally:
        backend.reap(run_id=backend.run_id)
    every = [Trajectory.from_dict(json.loads(x)) for x in (tmp_path / "out/episodes/trajectories.jsonl").read_text().splitlines()]
    assert sorted((t.task_id, t.reward) for t in every) == sorted([(good.instance_id, 1.0), (bad.instance_id, 0.0)])
    kept = [Trajectory.from_dict(json.loads(x)) for x in (tmp_path / "out/trajectories.jsonl").read_text().splitlines()]
    assert [(t.task_id, t.reward, t.metadata["teacher"]) for t in kept] == [(good.instance_id, 1.0, "scripted")]
    assert (rep["kept"], rep["episodes"], rep["teacher"]) == (1, 2, "scripted")
    t = kept[0]
    assert len(t.calls) == len(good.gold_plan) + 1  # the plan's edits, then mini's submit
    _assert_teacher_segment(t, "scripted")
    from harnessrl.trainers.samples import RecordError, SampleConfig, build_samples
    from harnessrl.trainers.sft import load_teacher_file, sft_samples

    with pytest.raises(RecordError, match="teacher data"):
        build_samples(kept, SampleConfig())
    assert [s.n_sampled for s in sft_samples(load_teacher_file(tmp_path / "out/trajectories.jsonl"))] == \
        [sum(len(c.completion_ids) for c in t.calls)]


# -- `harnessrl train` stages ------------------------------------------------------------------------
def test_stages_are_validated_and_named():
    from harnessrl.trainers.loop import TrainConfig

    assert TrainConfig().stages == ["sft", "rl"]  # the default: a teacher warm start, then RL
    with pytest.raises(ValueError, match="sft.data"):
        TrainConfig(stages=["sft", "rl"], sft={}, prepare={})
    with pytest.raises(ValueError, match=r"stages: \['rl', 'sft'\]"):
        TrainConfig(stages=["rl", "sft"], sft={"data": "x.jsonl"})
    with pytest.raises(ValueError, match="stages"):
        TrainConfig(stages=[], sft={"data": "x.jsonl"})


@pytest.mark.timeout(600)
def test_train_runs_the_sft_stage_from_one_config(tmp_path):
    import asyncio

    from harnessrl.trainers.loop import TrainConfig, train

    data = tmp_path / "teacher.jsonl"
    data.write_text("".join(t.to_json() + "\n" for t in _teacher_records(2)))
    cfg = TrainConfig(model="tiny-llama", stages=["sft"], out_dir=str(tmp_path / "run"), tensorboard=False,
                      progress=False, eval={"points": []}, prepare={},
                      trainer={"device": "cpu", "lr": 1e-6, "micro_batch_tokens": 128},
                      sft={"data": str(data), "steps": 3, "batch_size": 1, "lr": 1e-3})
    history = asyncio.run(train(cfg))
    assert [(m["stage"], m["step"], m["version"], m["trajectories"]) for m in history] == \
        [("sft", 1, 1, 1), ("sft", 2, 2, 1), ("sft", 3, 3, 1)]
    assert all(m["lr"] == 1e-3 for m in history)
    assert history[2]["loss"] < history[0]["loss"]  # step 3 sees step 1's trajectory again, after 2 updates
    lines = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [x["stage"] for x in lines] == ["sft"] * 3
    assert (tmp_path / "run/checkpoints/sft").is_dir() and (tmp_path / "run/checkpoints/last").is_dir()
    with pytest.raises(FileNotFoundError, match="sft.data"):
        asyncio.run(train(cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"data": str(tmp_path / "no")})})))


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_train_runs_sft_then_rl_from_one_config(tmp_path):
    """collect (scripted gold teacher, mini-swe-agent, Docker) -> train stages ["sft", "rl"]:
    the RL batch is sampled by the SFT policy's version and trained at it, mismatch ~ 0."""
    import asyncio

    from adapter_helpers import builtin_task, docker_backend
    from harnessrl.adapters.toolchain import installed_spec
    from harnessrl.gym.tools.collect import CollectConfig, collect
    from harnessrl.gym.episode import EpisodeConfig
    from harnessrl.gym.proxy import Store
    from harnessrl.gym.rollout import RolloutConfig
    from harnessrl.trainers.loop import TrainConfig, train

    backend = docker_backend()
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    task = builtin_task().instance_id
    try:
        rep = asyncio.run(collect(CollectConfig(episodes=1, concurrency=1, rollout=RolloutConfig(
            tasks=[task], model="tiny-llama", sandbox="docker", episode=EpisodeConfig(max_calls=4, wall_time_s=300))),
            tmp_path / "teacher"))
        assert rep["kept"] == 1
        cfg = TrainConfig.model_validate({
            "model": "tiny-llama", "steps": 1, "out_dir": str(tmp_path / "run"), "progress": False,
            "tensorboard": False, "stages": ["sft", "rl"], "eval": {"points": []},
            "sft": {"data": str(tmp_path / "teacher/trajectories.jsonl"), "steps": 2, "lr": 1e-4},
            "rollout": {"tasks": [task], "max_new_tokens": 32, "sandbox": "docker",
                        "episode": {"max_calls": 2, "wall_time_s": 180}},
            "scheduler": {"env_pool_size": 2, "group_size": 2, "groups_per_step": 1, "staleness": 1},
            "trainer": {"lr": 1e-5, "device": "cpu"},
            "sampling": {"zero_variance": "keep"},  # the RL step trains whatever the rewards
        })
        history = asyncio.run(train(cfg))
    finally:
        backend.reap(run_id=backend.run_id)
    lines = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [(x.get("stage"), x["version"]) for x in lines[:2]] == [("sft", 1), ("sft", 2)]
    assert lines[1]["loss"] < lines[0]["loss"]
    (m,) = history
    assert m["step"] == 3 and m["staleness_max"] == 0  # sampled by the SFT policy (v2), trained at v2
    if m["updated"]:
        assert m["version"] == 3 and m["mismatch_tokens"] > 0 and m["logprob_mismatch_mean"] < 1e-3
    store = Store(str(tmp_path / "run/rollouts/trajectories.db"))
    versions = {v for sid in store.session_ids() for c in store.trajectory(sid).calls for v in c.versions}
    # the engine served the SFT weights (v2) from the first RL call, never the base model's v0
    # or an SFT step's v1; with staleness 1 an episode may already have begun after the RL
    # update (v3) when the run stops
    assert min(versions) == 2 and versions <= {2, 3}, versions
    assert (tmp_path / "run/checkpoints/sft").is_dir() and (tmp_path / "run/checkpoints/last").is_dir()
