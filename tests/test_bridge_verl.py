"""The verl bridge (trainers/bridges/verl.py) on verl 0.9.1's own parts: its composed trainer
config (the module doc's launch line), its `AgentLoopWorker` (registry loaded from our YAML,
hydra instantiation, padding, batching), its `RLHFDataset` over our parquet rows and its
`TokenOutput`; the server manager is a small class whose `generate` calls a real engine
through harnessrl's `EngineClient` over loopback HTTP: the scripted gold policy (reward 1.0)
or the real local torch engine (tiny-llama). Episodes are real: Docker sandboxes, the real
proxy, mini-swe-agent or a command harness, hidden tests."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

NO_VERL = "verl is not installed (scripts/setup.sh installs verl==0.9.1)"
if importlib.util.find_spec("verl") is None:  # its import (4.6 s) waits for the tests: see _verl_parts
    pytest.skip(NO_VERL, allow_module_level=True)

from harnessrl.adapters.toolchain import installed_spec  # noqa: E402
from harnessrl.gym.backends.engine_client import EngineClient  # noqa: E402
from harnessrl.gym.models import load_tokenizer, resolve_model  # noqa: E402
from harnessrl.gym.trajectory import Trajectory  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, docker_backend  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
YAML = ROOT / "examples" / "verl" / "agent_loop.yaml"
sys.path.insert(0, str(ROOT / "examples" / "verl"))
from make_dataset import dataset_rows, write_dataset  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def _verl_parts():
    """verl's parts and our bridge, imported when this module's tests run: every xdist worker
    collects every module, and these imports cost about 4 s of CPU (after torch's)."""
    global OmegaConf, AgentLoopWorker, DictConfigWrap, ToolListWrap, _agent_loop_registry, DataProto
    global RLHFDataset, collate_fn, TokenOutput, bridge
    pytest.importorskip("verl", reason=NO_VERL)
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import (AgentLoopWorker, DictConfigWrap, ToolListWrap,
                                                         _agent_loop_registry)
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.workers.rollout.replica import TokenOutput

    from harnessrl.trainers.bridges import verl as bridge
#: Every output carries the same extra_fields (verl batches them as per-sample arrays).
EXTRA_KEYS = {"min_global_steps", "max_global_steps", "harnessrl_trajectory_id", "harnessrl_task_id",
              "harnessrl_status", "harnessrl_termination", "harnessrl_masked", "harnessrl_segment",
              "harnessrl_segments", "dropped_tokens", "truncated_tokens", "truncated_sampled_tokens",
              "prompt_overflow_tokens", "reward_extra_info"}


# -- verl's side: config, worker, dataset -------------------------------------------------------
def launch_overrides() -> list[str]:
    """The `key=value` overrides of the launch line in the bridge's module doc."""
    doc = bridge.__doc__
    line = doc[doc.index("python -m verl.trainer.main_ppo"):].split("\n\"\"\"")[0]
    line = re.split(r"\n\s*\n", line)[0].replace("\\\n", " ")
    return [a for a in line.split()[3:] if "=" in a]


def compose(*extra: str):
    """verl 0.9.1's real trainer config, composed with the launch line's overrides (local paths)."""
    import verl
    from hydra import compose as hydra_compose, initialize_config_dir

    local = {"actor_rollout_ref.model.path": str(resolve_model("tiny-llama")),
             "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(YAML)}
    overrides = [f"{k}={local.get(k, v)}" for k, v in (o.split("=", 1) for o in launch_overrides())] + list(extra)
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def worker(tok):
    """verl's own AgentLoopWorker (not as a Ray actor) built from the composed config; tests set its
    `llm_client` to their server manager. Its tokenizer is harnessrl's `load_tokenizer`: under
    transformers 5, AutoTokenizer builds tiny-llama's named `LlamaTokenizer` class (Metaspace),
    which drops the spaces of SmolLM2's byte-level BPE (a real Llama/Qwen tokenizer loads as is)."""
    w = AgentLoopWorker(compose("actor_rollout_ref.rollout.prompt_length=4096",
                                "actor_rollout_ref.rollout.response_length=16384"), None)
    w.tokenizer = tok
    return w


def register(monkeypatch, name: str, **keys) -> str:
    """The shipped YAML entry with some keys changed, registered under `name` (as verl loads it)."""
    entry = OmegaConf.load(YAML)[0]
    entry.name = name
    for k, v in keys.items():
        OmegaConf.update(entry, k, v, merge=False)
    monkeypatch.setitem(_agent_loop_registry, name, entry)
    return name


def batch(tok, rows: list[dict], tmp_path: Path) -> DataProto:
    """Rows -> our parquet -> verl's RLHFDataset -> collate_fn -> DataProto, as the trainer does."""
    path = write_dataset(tmp_path / "rows.parquet", rows)
    ds = RLHFDataset(str(path), tok, OmegaConf.create({"max_prompt_length": 4096, "filter_overlong_prompts": False}))
    return DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]), meta_info={"global_steps": 3})


class EngineServerManager:
    """verl's `LLMServerClient.generate` contract over a real engine, through harnessrl's
    EngineClient: token ids in, `TokenOutput` out (verl's names: max_tokens, logprobs)."""

    def __init__(self, url: str, global_steps: int = 3, fail: str | None = None):
        self.url, self.global_steps, self.fail = url, global_steps, fail
        self.requests: list[tuple[str, list[int], dict]] = []
        self.replies: list[TokenOutput] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.requests.append((request_id, list(prompt_ids), dict(sampling_params)))
        if self.fail:
            raise RuntimeError(self.fail)
        sp = sampling_params
        async with EngineClient(self.url) as client:
            res = await client.generate(list(prompt_ids), max_new_tokens=sp["max_tokens"],
                                        temperature=sp["temperature"], top_p=sp["top_p"], top_k=sp["top_k"],
                                        stop_token_ids=sp.get("stop_token_ids"))
        out = TokenOutput(token_ids=res.output_ids, log_probs=res.logprobs,
                          stop_reason="aborted" if res.finish_reason == "abort" else "completed",
                          extra_fields={"global_steps": self.global_steps})
        self.replies.append(out)
        return out


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def scripted():
    """The scripted gold policy behind /generate, on loopback."""
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.served import ServedApp

    engine = ScriptedEngine(load_tokenizer("tiny-llama"), weight_version="3")
    with ServedApp(engine.app()) as served:
        yield engine, served.url


@pytest.fixture(scope="module")
def sandboxes():
    backend = docker_backend()
    yield backend
    backend.reap(run_id=backend.run_id)


def records(path: Path) -> list[Trajectory]:
    return [Trajectory.from_dict(json.loads(line)) for line in path.read_text().splitlines()]


def unpad(out: DataProto, i: int = 0) -> dict:
    """Sample i of a generate_sequences batch without verl's padding."""
    b = out.batch
    p = b["prompts"].shape[1]
    att = b["attention_mask"][i]
    n = int(att[p:].sum())
    return {"prompt": b["prompts"][i][att[:p].bool()].tolist(), "response": b["responses"][i][:n].tolist(),
            "mask": b["response_mask"][i][:n].tolist(), "logprobs": b["rollout_log_probs"][i][:n].tolist(),
            "reward": float(b["rm_scores"][i].sum()), "reward_at": int(b["rm_scores"][i].nonzero()[0, 0]), "n": n}


def _needs_mini():
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")


# -- without episodes ----------------------------------------------------------------------------
def test_registered_in_verls_registry_and_built_from_the_yaml_like_verl_does(worker, tok):
    assert _agent_loop_registry["harnessrl"]["name"] == "harnessrl"  # the worker loaded our YAML
    assert _agent_loop_registry["harnessrl"]["_target_"] == "harnessrl.trainers.bridges.verl.HarnessrlAgentLoop"
    assert launch_overrides()[:2] == ["trainer.use_v1=True", "algorithm.adv_estimator=grpo"]
    cfg = worker.config
    assert (cfg.actor_rollout_ref.rollout.agent.default_agent_loop, cfg.actor_rollout_ref.rollout.name) == \
        ("harnessrl", "sglang")
    import hydra
    loop = hydra.utils.instantiate(config=_agent_loop_registry["harnessrl"], trainer_config=DictConfigWrap(cfg),
                                   server_manager=None, tokenizer=tok, processor=None, hf_model_type="llama",
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                   tools=ToolListWrap([]))
    assert isinstance(loop, bridge.HarnessrlAgentLoop)
    b = loop.bridge
    assert (b.suite, b.harness, b.sandbox, b.segment_policy, b.max_new_tokens) == \
        ("builtin", "mini-swe-agent", "docker", "longest", 1024)
    assert (b.episode.max_calls, b.episode.wall_time_s, loop.on_infra_error) == (30, 600.0, "raise")
    kw = dict(trainer_config=DictConfigWrap(cfg), server_manager=None, tokenizer=tok, processor=None,
              dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data))
    with pytest.raises(ValueError, match="harnessrl agent loop config: segment_polcy: Extra inputs"):
        bridge.HarnessrlAgentLoop(**kw, segment_polcy="last")
    legacy = compose("trainer.use_v1=False")
    kw.update(trainer_config=DictConfigWrap(legacy))
    with pytest.raises(ValueError, match="segment_policy: 'all' needs verl's v1 trainer"):
        bridge.HarnessrlAgentLoop(**kw, segment_policy="all")
    assert bridge.HarnessrlAgentLoop(**kw).on_infra_error == "mask"  # auto, legacy trainer


def test_rows_reach_the_loop_through_verls_dataset(tok, tmp_path):
    task = builtin_task()
    rows = dataset_rows("builtin", tasks=[task.instance_id], max_calls=7)
    b = batch(tok, rows, tmp_path)
    nt = b.non_tensor_batch
    assert list(nt["agent_name"]) == ["harnessrl"] and list(nt["index"]) == [0]
    assert list(nt["raw_prompt"][0]) == [{"role": "user", "content": task.problem_statement}]
    row = {k: v[0] for k, v in nt.items()}
    spec = bridge.RowSpec.of(row)
    assert (spec.task_id, spec.suite, spec.max_calls, spec.harness) == (task.instance_id, "builtin", 7, None)
    with pytest.raises(ValueError, match="extra_info.task_id: Field required"):
        bridge.RowSpec.of({"extra_info": {"index": 0}})
    with pytest.raises(ValueError, match="extra_info.max_calls: Input should be greater than or equal to 1"):
        bridge.RowSpec.of({"extra_info": {"task_id": "t", "max_calls": 0}})
    with pytest.raises(ValueError, match="extra_info.task_id: 'nope' is not in suite 'builtin'"):
        bridge._Shared.task("builtin", "nope")


def test_sampling_params_and_token_output_mapping():
    ours = {"max_new_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "stop_token_ids": [2], "seed": 5}
    run = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}
    assert bridge.verl_sampling_params(ours, run, "sglang") == {
        "repetition_penalty": 1.0, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 64, "logprobs": True,
        "stop_token_ids": [2], "sampling_seed": 5}
    assert bridge.verl_sampling_params(ours, run, "vllm")["seed"] == 5
    steps = {"global_steps": 9, "min_global_steps": 7, "max_global_steps": 9}
    r = bridge.token_reply(TokenOutput(token_ids=[5, 6], log_probs=[-0.5, -0.25], stop_reason="completed",
                                       extra_fields=steps), 8)
    assert (r.token_ids, r.logprobs, r.finish_reason, r.weight_version) == ([5, 6], [-0.5, -0.25], "completed", 7)
    r = bridge.token_reply(TokenOutput(token_ids=[1] * 8, log_probs=[0.0] * 8, stop_reason="completed",
                                       extra_fields={"global_steps": 4}), 8)
    assert (r.finish_reason, r.weight_version) == ("length", 4)  # completed at the budget: length
    r = bridge.token_reply(TokenOutput(token_ids=[1], stop_reason="aborted"), 8)
    assert (r.finish_reason, r.logprobs, r.weight_version) == ("aborted", None, None)


# -- real episodes -------------------------------------------------------------------------------
@pytest.mark.docker
@pytest.mark.harness
def test_gold_mini_swe_agent_episode_is_reward_1_and_the_proxys_record_token_for_token(
        worker, tok, scripted, sandboxes, monkeypatch, tmp_path):
    _needs_mini()
    engine, url = scripted
    task = builtin_task()
    engine.set_tasks([task])
    log = tmp_path / "trajectories.jsonl"
    rows = dataset_rows("builtin", tasks=[task.instance_id])
    rows[0]["agent_name"] = register(monkeypatch, "harnessrl-gold", trajectories_path=str(log))
    worker.llm_client = manager = EngineServerManager(url)
    out = asyncio.run(worker.generate_sequences(batch(tok, rows, tmp_path)))

    (t,) = records(log)
    assert (t.reward, t.status, t.termination, len(t.segments)) == (1.0, "ok", "submitted", 1)
    seg, first = t.segments[0], t.calls[0]
    p = len(first.new_prompt_ids)
    s = unpad(out)
    assert s["prompt"] == first.new_prompt_ids == manager.requests[0][1]
    assert s["response"] == seg.token_ids[p:] and s["mask"] == seg.loss_mask[p:]
    assert s["logprobs"] == [-0.125 if m else 0.0 for m in seg.loss_mask[p:]]  # the scripted engine's logprob
    assert (s["reward"], s["reward_at"]) == (1.0, s["n"] - 1)  # verl puts it on the last response token
    sampled = [tid for tid, m in zip(s["response"], s["mask"]) if m]
    assert sampled == [i for c in t.calls for i in c.completion_ids] == \
        [i for r in manager.replies for i in r.token_ids]
    assert len(t.calls) == len(task.gold_plan) + 1  # the plan, then the submit
    nt = out.non_tensor_batch
    assert (nt["min_global_steps"][0], nt["max_global_steps"][0]) == (3, 3)
    assert nt["harnessrl_trajectory_id"][0] == t.session_id and nt["dropped_tokens"][0] == 0
    assert (nt["truncated_tokens"][0], nt["harnessrl_masked"][0]) == (0, False)
    assert nt["__num_turns__"][0] == 2 * len(t.calls)
    assert len({r[0] for r in manager.requests}) == 1  # one sticky request id per episode


@pytest.mark.docker
@pytest.mark.harness
@pytest.mark.slow
def test_real_engine_failing_policy_scores_0_with_the_engines_own_logprobs(worker, tok, sandboxes, monkeypatch):
    _needs_mini()
    from harnessrl.trainers.engine import EngineServer

    task = builtin_task()
    kw = dict(trainer_config=DictConfigWrap(worker.config), tokenizer=tok, processor=None, dataset_cls=RLHFDataset,
              data_config=DictConfigWrap(worker.config.data))
    with EngineServer(model="tiny-llama") as eng:
        manager = EngineServerManager(eng.url, global_steps=5)
        entry = OmegaConf.to_container(_agent_loop_registry["harnessrl"])
        entry.pop("name"), entry.pop("_target_")
        entry.update(max_new_tokens=24, episode={"max_calls": 2, "wall_time_s": 300})

        async def go():
            loop = bridge.HarnessrlAgentLoop(server_manager=manager, **kw, **entry)
            out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                                  "logprobs": True}, raw_prompt=[{"role": "user", "content": "x"}],
                                 extra_info={"task_id": task.instance_id, "index": 0})
            return loop, out
        loop, out = asyncio.run(go())
    t = loop.last_result.trajectory
    assert t.reward == 0.0 and t.status in ("ok", "truncated") and out.reward_score == 0.0
    assert len({r[0] for r in manager.requests}) == 1 and len(manager.requests) == len(t.calls) == 2
    assert {k: manager.requests[0][2][k] for k in ("temperature", "top_p", "top_k", "max_tokens", "logprobs",
                                                    "repetition_penalty")} == \
        {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 24, "logprobs": True, "repetition_penalty": 1.0}
    # a random policy's garbled replies may make the harness rewrite its history: "longest" picks
    (row,), dropped = bridge.select(bridge.segment_rows(t), "longest")
    assert (out.extra_fields["harnessrl_segment"], out.extra_fields["dropped_tokens"]) == (row.segment, dropped)
    assert dropped == sum(sum(s.loss_mask) for s in t.segments) - row.sampled_tokens
    first = next(i for i, c in enumerate(t.calls) if c.segment == row.segment)
    assert out.prompt_ids == row.prompt_ids == manager.requests[first][1]
    assert (out.response_ids, out.response_mask, out.response_logprobs) == \
        (row.response_ids, row.response_mask, row.response_logprobs)
    sampled = [(i, lp) for i, lp, m in zip(out.response_ids, out.response_logprobs, out.response_mask) if m]
    replies = [r for r, c in zip(manager.replies, t.calls) if c.segment == row.segment]  # calls run one at a time
    assert sampled == [(i, lp) for r in replies for i, lp in zip(r.token_ids, r.log_probs)] and sampled
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (5, 5)


def _rewrite_harness(tmp_path: Path) -> str:
    """A command harness whose third call starts a new conversation (two segments)."""
    script = tmp_path / "rewrite.py"
    script.write_text(
        "import json, sys, urllib.request\n"
        "base, key, model = sys.argv[1:4]\n"
        "def chat(messages):\n"
        "    req = urllib.request.Request(base + '/chat/completions', json.dumps({'model': model, 'messages': messages,"
        " 'max_tokens': 16}).encode(), {'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})\n"
        "    return json.load(urllib.request.urlopen(req, timeout=300))['choices'][0]['message']\n"
        "msgs = [{'role': 'system', 'content': 'You fix bugs.'}, {'role': 'user', 'content': 'task one'}]\n"
        "for i in range(2):\n"
        "    msgs += [chat(msgs), {'role': 'user', 'content': 'observation %d' % i}]\n"
        "chat([{'role': 'system', 'content': 'You summarize.'}, {'role': 'user', 'content': 'Summary: two steps.'}])\n")
    cfg = tmp_path / "rewrite.yaml"
    cfg.write_text(json.dumps({"name": "rewrite", "dialect": "openai-chat", "placement": "beside",
                               "command": [sys.executable, str(script), "${openai_base_url}", "${api_key}",
                                           "${model}"]}))
    return str(cfg)


def _loop(worker, tok, manager, *extra: str, **keys):
    cfg = compose(*extra) if extra else worker.config
    entry = OmegaConf.to_container(_agent_loop_registry["harnessrl"])
    entry.pop("name"), entry.pop("_target_")
    entry.update(keys)
    return bridge.HarnessrlAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=manager, tokenizer=tok,
                                     processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                     **entry)


@pytest.mark.docker
def test_history_rewrite_follows_the_segment_policy_and_reports_dropped_tokens(worker, tok, scripted, sandboxes,
                                                                               tmp_path):
    engine, url = scripted
    task = builtin_task()
    manager = EngineServerManager(url)
    row = {"raw_prompt": [{"role": "user", "content": "x"}],
           "extra_info": {"task_id": task.instance_id, "harness": _rewrite_harness(tmp_path)}}

    async def go():
        loop = _loop(worker, tok, manager, segment_policy="all")
        return loop, await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1}, **row)
    loop, outs = asyncio.run(go())
    t = loop.last_result.trajectory
    assert (t.reward, t.status, [s.split_reason for s in t.segments]) == (0.0, "ok", [None, "new_conversation"])
    assert [c.segment for c in t.calls] == [0, 0, 1]
    n0, n1 = (sum(s.loss_mask) for s in t.segments)
    assert n0 == len(t.calls[0].completion_ids) + len(t.calls[1].completion_ids) > n1 == len(t.calls[2].completion_ids)
    # "all": one output per segment (verl's v1 trainer), nothing dropped
    assert [o.extra_fields["harnessrl_segment"] for o in outs] == [0, 1]
    assert all(set(o.extra_fields) == EXTRA_KEYS for o in outs)
    assert [o.extra_fields["dropped_tokens"] for o in outs] == [0, 0] and [o.reward_score for o in outs] == [0.0, 0.0]
    for o, s in zip(outs, t.segments):
        assert o.prompt_ids + o.response_ids == s.token_ids and o.response_mask == s.loss_mask[len(o.prompt_ids):]
        d = o.as_dict()  # what verl's v1 (TransferQueue) worker stores per output
        assert d["responses"].tolist() == o.response_ids and d["rollout_log_probs"].shape == d["responses"].shape
        assert d["rm_scores"].tolist() == [0.0] * len(o.response_ids)
    # the same record under the other policies
    longest = _loop(worker, tok, manager).outputs(t, row)
    assert (longest.extra_fields["harnessrl_segment"], longest.extra_fields["dropped_tokens"]) == (0, n1)
    assert longest.prompt_ids + longest.response_ids == t.segments[0].token_ids and longest.num_turns == 4
    last = _loop(worker, tok, manager, segment_policy="last").outputs(t, row)
    assert (last.extra_fields["harnessrl_segment"], last.extra_fields["dropped_tokens"]) == (1, n0)
    assert last.prompt_ids == t.calls[2].new_prompt_ids and last.response_ids == t.calls[2].completion_ids
    # rollout.response_length cuts the tail (counted); a prompt over rollout.prompt_length keeps its
    # tail at the head of the response, unmasked, so the sequence stays exact
    p = len(t.calls[0].new_prompt_ids)
    small = _loop(worker, tok, manager, "actor_rollout_ref.rollout.prompt_length=10",
                  "actor_rollout_ref.rollout.response_length=" + str(p - 10 + 3)).outputs(t, row)
    assert small.prompt_ids == t.segments[0].token_ids[:10]
    assert small.response_ids == t.segments[0].token_ids[10:p + 3]
    assert small.response_mask == [0] * (p - 10) + [1, 1, 1]
    ex = small.extra_fields
    assert (ex["prompt_overflow_tokens"], ex["truncated_tokens"], ex["truncated_sampled_tokens"]) == \
        (p - 10, len(t.segments[0].token_ids) - p - 3, n0 - 3)


@pytest.mark.docker
def test_masked_infra_failure_gives_the_masked_output_or_raises(worker, tok, sandboxes, tmp_path):
    task = builtin_task()
    row = {"raw_prompt": [{"role": "user", "content": "x"}],
           "extra_info": {"task_id": task.instance_id, "harness": _rewrite_harness(tmp_path)}}
    manager = EngineServerManager("http://127.0.0.1:9", fail="rollout replica died")

    async def go(**keys):
        loop = _loop(worker, tok, manager, **keys)
        try:
            return loop, await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1}, **row)
        except bridge.MaskedEpisode as e:
            return loop, e
    loop, out = asyncio.run(go(on_infra_error="mask"))
    t = loop.last_result.trajectory
    assert (t.status, t.termination, t.reward) == ("infra_error", "engine_error", None)
    assert out.prompt_ids == manager.requests[0][1] == t.calls[0].new_prompt_ids
    assert (out.response_ids, out.response_mask, out.response_logprobs) == ([tok.eos_token_id], [0], [0.0])
    assert (out.reward_score, out.num_turns, out.extra_fields["harnessrl_masked"]) == (0.0, 0, True)
    assert out.extra_fields["harnessrl_termination"] == "engine_error" and set(out.extra_fields) == EXTRA_KEYS
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (0, 0)  # nothing sampled
    loop, err = asyncio.run(go())  # auto under trainer.use_v1=True: raise, verl marks the group failure
    assert isinstance(err, bridge.MaskedEpisode) and err.trajectory.termination == "engine_error"
    assert "is masked: engine_error" in str(err)
