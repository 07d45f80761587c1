"""The SkyRL bridge (trainers/bridges/skyrl.py) on real parts: SkyRL's own types, its output
validation and step-wise merge; an inference-engine client double whose `generate` runs on our
real engines (the scripted gold policy and the local tiny-llama engine, through EngineClient);
real mini-swe-agent and real harness processes in Docker sandboxes; hidden tests."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

try:
    base = pytest.importorskip("skyrl.train.generators.base", reason="skyrl not installed (scripts/setup.sh installs it)")
except Exception as e:  # noqa: BLE001 - skyrl 0.3.0 on Python < 3.12 without the typing_extensions fix
    pytest.skip(f"skyrl does not import here: {type(e).__name__}: {str(e)[:200]}", allow_module_level=True)

from harnessrl.adapters.command import CommandAdapter
from harnessrl.adapters.toolchain import installed_spec
from harnessrl.gym.backends.engine_client import EngineClient
from harnessrl.gym.models import load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_helpers import builtin_task, docker_backend  # noqa: E402

TrajectoryID = base.TrajectoryID
pytestmark = [pytest.mark.timeout(600)]


class EngineClientDouble:
    """SkyRL's inference engine client contract (`generate(InferenceEngineInput, model=None) ->
    InferenceEngineOutput`, `finish_session`, `weight_version`) over one of our real engines'
    /generate; it keeps what it was asked and what the engine answered."""

    def __init__(self, url: str):
        self.url, self.calls, self.finished, self.weight_version = url, [], [], 3
        self._engine: EngineClient | None = None
        self._loop = None

    async def generate(self, batch: dict, model: str | None = None) -> dict:
        if self._loop is not asyncio.get_running_loop():  # httpx binds to the trainer's loop
            self._engine, self._loop = EngineClient(self.url), asyncio.get_running_loop()
        sp, outs = batch["sampling_params"], []
        for ids, sid in zip(batch["prompt_token_ids"], batch["session_ids"]):
            r = await self._engine.generate(ids, max_new_tokens=sp["max_tokens"], temperature=sp["temperature"],
                                            top_p=sp["top_p"], top_k=sp["top_k"], stop_token_ids=sp.get("stop_token_ids"),
                                            seed=sp.get("seed"))
            self.calls.append({"session_id": sid, "input_ids": list(ids), "output_ids": r.output_ids,
                               "logprobs": r.logprobs, "sampling_params": dict(sp), "model": model})
            outs.append(r)
        return {"responses": [r.text for r in outs], "response_ids": [r.output_ids for r in outs],
                "stop_reasons": [r.finish_reason for r in outs], "prompt_logprobs": None,
                "response_logprobs": [r.logprobs for r in outs] if sp.get("logprobs") is not None else None,
                "rollout_expert_indices": None}

    async def finish_session(self, session_id: str) -> None:
        self.finished.append(session_id)


# A harness that rewrites its history: two model calls, the second a new conversation.
_TWO_CONVERSATIONS = (
    "import json,sys,urllib.request as u\n"
    "def ask(text):\n"
    "    r=u.Request(sys.argv[1]+'/chat/completions',data=json.dumps({'model':'policy','max_tokens':12,"
    "'messages':[{'role':'user','content':text}]}).encode(),headers={'Authorization':'Bearer '+sys.argv[2],"
    "'Content-Type':'application/json'})\n"
    "    return json.load(u.urlopen(r,timeout=300))\n"
    "ask('First conversation: describe the repository.')\n"
    "ask('A different conversation: list two files.')\n")


def _two_conversations() -> CommandAdapter:
    return CommandAdapter({"name": "two-conversations", "dialect": "openai-chat", "placement": "beside",
                           "command": [sys.executable, "-c", _TWO_CONVERSATIONS, "${openai_base_url}", "${api_key}"]})


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 512, "min_p": 0.0, "logprobs": 1,
            "min_tokens": 1, "skip_special_tokens": True, "include_stop_str_in_output": True, "stop": None}


def _batch(task_ids: list[str], instances: list[str], sampling: dict | None = None) -> dict:
    return {"prompts": [[{"role": "user", "content": "(unused: the harness writes its own prompts)"}]] * len(task_ids),
            "env_classes": ["harnessrl"] * len(task_ids), "env_extras": [{"task_id": t} for t in task_ids],
            "sampling_params": dict(sampling or SAMPLING),
            "trajectory_ids": [TrajectoryID(inst, rep) for inst, rep in zip(instances, range(len(instances)))],
            "batch_metadata": base.BatchMetadata(global_step=1, training_phase="train")}


def _generator(client, adapter=None, step_wise=False, **cfg):
    from skyrl.train.config import GeneratorConfig

    from harnessrl.trainers.bridges.skyrl import HarnessrlGenerator, SkyRLBridgeConfig

    gcfg = GeneratorConfig(step_wise_trajectories=step_wise)
    return HarnessrlGenerator(gcfg, load_tokenizer("tiny-llama"), client, SkyRLBridgeConfig(sandbox="docker", **cfg),
                              adapter=adapter)


def _validate(out: dict, n_prompts: int, step_wise: bool) -> None:
    from skyrl.train.utils.trainer_utils import validate_generator_output

    validate_generator_output(n_prompts, out, step_wise=step_wise)


@pytest.fixture(scope="module")
def scripted():
    docker_backend()
    from harnessrl.gym.doubles.scripted import ScriptedEngine
    from harnessrl.gym.served import ServedApp

    engine = ScriptedEngine(load_tokenizer("tiny-llama"))
    with ServedApp(engine.app()) as served:
        yield engine, served.url


@pytest.fixture(scope="module")
def gold(scripted):
    """One real mini-swe-agent episode with the scripted gold policy, through the bridge."""
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    engine, url = scripted
    task = builtin_task()
    engine.set_tasks([task])
    client = EngineClientDouble(url)
    gen = _generator(client, episode={"max_calls": 8, "wall_time_s": 400})
    start = len(engine.calls)
    try:
        out = asyncio.run(gen.generate(_batch([task.instance_id], ["p0"])))
    finally:
        gen.close()
        gen.sandboxes.reap(run_id=gen.sandboxes.run_id)
    return task, client, gen, out, engine.calls[start:]


@pytest.mark.docker
@pytest.mark.harness
def test_gold_mini_swe_agent_episode_is_reward_1_and_token_exact(gold):
    task, client, gen, out, scripted_calls = gold
    _validate(out, 1, step_wise=False)
    (ep,) = gen.last_episodes
    traj = ep.trajectory
    assert (traj.termination, traj.status, traj.reward) == ("submitted", "ok", 1.0)
    assert out["rewards"] == [1.0] and out["stop_reasons"] == ["stop"] and out["is_last_step"] is None
    assert out["trajectory_ids"] == [TrajectoryID("p0", 0)]
    # every call went through SkyRL's client, sticky on the episode's session, then finished
    assert len(client.calls) == len(traj.calls) == len(task.gold_plan) + 1 == len(scripted_calls)
    assert {c["session_id"] for c in client.calls} == {traj.session_id} and client.finished == [traj.session_id]
    assert all(c["sampling_params"]["temperature"] == 1.0 and c["sampling_params"]["logprobs"] == 1
               and c["sampling_params"]["min_p"] == 0.0 and "stop" not in c["sampling_params"] for c in client.calls)
    # the row is the proxy's record, token for token, and the record is what the engine sampled
    (seg,) = traj.segments
    p = len(traj.call_prompt(traj.calls[0]))
    assert out["prompt_token_ids"] == [seg.token_ids[:p]] == [client.calls[0]["input_ids"]]
    assert out["response_ids"] == [seg.token_ids[p:]]
    assert out["loss_masks"] == [seg.loss_mask[p:]]
    assert out["rollout_logprobs"] == [seg.logprobs[p:]]
    sampled = [t for t, m in zip(out["response_ids"][0], out["loss_masks"][0]) if m]
    assert sampled == [t for c in client.calls for t in c["output_ids"]] == [t for c in scripted_calls for t in c.output_ids]
    lps = [lp for lp, m in zip(out["rollout_logprobs"][0], out["loss_masks"][0]) if m]
    assert lps == [lp for c in client.calls for lp in c["logprobs"]]
    assert all(lp == 0.0 for lp, m in zip(out["rollout_logprobs"][0], out["loss_masks"][0]) if not m)
    m = out["rollout_metrics"]
    assert (m["harnessrl/episodes"], m["harnessrl/masked_episodes"], m["harnessrl/dropped_tokens"]) == (1, 0, 0)
    assert m["harnessrl/success_rate"] == 1.0 and m["harnessrl/endings/submitted"] == 1
    assert m["harnessrl/env_latency_s_p50"] > 0 and m["generate/avg_assistant_tokens"] == len(sampled)
    assert out["trajectory_generation_times"][0] == pytest.approx(ep.seconds) and ep.seconds > 0


@pytest.mark.docker
@pytest.mark.harness
def test_step_wise_call_rows_merge_back_into_the_segment(gold):
    """Harbor's shape: one row per model call, reward on the last; SkyRL's own
    merge_stepwise_output turns them back into exactly the segment row."""
    from skyrl.train.generators.utils import merge_stepwise_output

    from harnessrl.trainers.bridges.skyrl_output import build_output

    task, client, gen, out, _ = gold
    calls = build_output(gen.last_episodes, step_wise=True, step_rows="call")
    _validate(calls, 1, step_wise=True)
    n = len(task.gold_plan) + 1
    assert calls["prompt_token_ids"] == [c["input_ids"] for c in client.calls]
    assert calls["response_ids"] == [c["output_ids"] for c in client.calls]
    assert calls["loss_masks"] == [[1] * len(c["output_ids"]) for c in client.calls]
    assert calls["rollout_logprobs"] == [c["logprobs"] for c in client.calls]
    assert calls["is_last_step"] == [False] * (n - 1) + [True] and calls["rewards"] == [0.0] * (n - 1) + [1.0]
    assert calls["trajectory_ids"] == [TrajectoryID("p0", 0)] * n
    merged = merge_stepwise_output(calls)
    segs = build_output(gen.last_episodes, step_wise=True, step_rows="segment")
    for key in ("prompt_token_ids", "response_ids", "loss_masks", "rollout_logprobs", "is_last_step"):
        assert merged[key] == segs[key] == (out[key] if key != "is_last_step" else [True]), key
    assert merged["rewards"] == segs["rewards"] == [1.0]  # a per-turn reward: the last turn's


@pytest.mark.docker
@pytest.mark.harness
def test_skyrl_tensorizes_the_rows_with_the_sampled_tokens_under_its_loss_mask(gold):
    """SkyRL's own batch builder (dataset.preprocess) over the output, rewards made per token
    as its trainer does: the loss mask it trains on covers exactly the sampled tokens, with
    their engine logprobs, and the reward sits on the last response token."""
    import torch
    from skyrl.train.dataset.preprocess import convert_prompts_responses_to_batch_tensors

    _, client, _, out, _ = gold
    rewards = [[0.0] * (len(r) - 1) + [x] for r, x in zip(out["response_ids"], out["rewards"])]
    seqs, attn, action, rew, masks, lps, _ = convert_prompts_responses_to_batch_tensors(
        load_tokenizer("tiny-llama"), out["prompt_token_ids"], out["response_ids"], rewards, out["loss_masks"],
        out["rollout_logprobs"])
    n = len(out["response_ids"][0])
    assert masks.shape[1] == n and seqs.shape[1] == n + len(out["prompt_token_ids"][0])
    trained = seqs[0, -n:][masks[0].bool()].tolist()
    assert trained == [t for c in client.calls for t in c["output_ids"]]
    assert lps[0][masks[0].bool()].tolist() == pytest.approx([lp for c in client.calls for lp in c["logprobs"]])
    assert rew[0, -1].item() == 1.0 and torch.count_nonzero(rew).item() == 1


@pytest.mark.docker
def test_a_cancelled_batch_releases_its_episodes(scripted):
    """SkyRL cancels generate() while a harness runs: the cancellation goes through promptly and
    the episode's sandbox is gone."""
    import time

    sleeper = CommandAdapter({"name": "sleeper", "dialect": "openai-chat", "placement": "beside",
                              "command": ["sleep", "300"]})
    gen = _generator(EngineClientDouble(scripted[1]), sleeper)
    mine = {"label": f"harnessrl.run_id={gen.sandboxes.run_id}"}

    async def main() -> float:
        task = asyncio.ensure_future(gen.generate(_batch([builtin_task().instance_id], ["c0"])))
        for _ in range(240):  # until the episode's sandbox is up
            if await asyncio.to_thread(gen.sandboxes.client.containers.list, filters=mine):
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError("the episode's sandbox never came up")
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - t0

    try:
        took = asyncio.run(main())
        assert took < 60, took
        assert gen.sandboxes.client.containers.list(all=True, filters=mine) == []
    finally:
        gen.close()
        gen.sandboxes.reap(run_id=gen.sandboxes.run_id)


@pytest.mark.docker
@pytest.mark.harness
def test_max_seq_len_cuts_the_response_and_skyrl_filters_apply(gold):
    """A response cut to fit max_seq_len ends "length": its cut sampled tokens are counted as
    dropped, and SkyRL's overlong filtering / zero-reward-on-non-stop act on it."""
    from harnessrl.trainers.bridges.skyrl_output import build_output

    _, _, gen, out, _ = gold
    p, full = len(out["prompt_token_ids"][0]), out["loss_masks"][0]
    cut = build_output(gen.last_episodes, step_wise=False, max_seq_len=p + 10)
    assert cut["response_ids"] == [out["response_ids"][0][:10]] and cut["loss_masks"] == [full[:10]]
    assert cut["stop_reasons"] == ["length"] and cut["rewards"] == [1.0]
    assert cut["rollout_metrics"]["harnessrl/dropped_tokens"] == sum(full[10:]) > 0
    strict = build_output(gen.last_episodes, step_wise=False, max_seq_len=p + 10, overlong_filtering=True,
                          zero_reward_on_non_stop=True)
    assert strict["loss_masks"] == [[0] * 10] and strict["rewards"] == [0.0]
    _validate(strict, 1, step_wise=False)
    whole = build_output(gen.last_episodes, step_wise=False, max_seq_len=p + len(full), overlong_filtering=True)
    assert whole["loss_masks"] == out["loss_masks"] and whole["stop_reasons"] == ["stop"]


def _rewrite(scripted, step_wise, rollouts=1, **cfg):
    engine, url = scripted
    task = builtin_task()
    client = EngineClientDouble(url)
    gen = _generator(client, _two_conversations(), step_wise=step_wise, **cfg)
    try:
        out = asyncio.run(gen.generate(_batch([task.instance_id] * rollouts, ["p1"] * rollouts)))
    finally:
        gen.close()
        gen.sandboxes.reap(run_id=gen.sandboxes.run_id)
    return client, gen, out


@pytest.mark.docker
def test_history_rewrite_not_step_wise_keeps_one_segment_and_reports_the_dropped_tokens(scripted):
    client, gen, out = _rewrite(scripted, step_wise=False, segment_policy="last")
    _validate(out, 1, step_wise=False)
    traj = gen.last_episodes[0].trajectory
    assert (traj.termination, traj.reward) == ("submitted", 0.0)  # nothing fixed: scored, not masked
    assert [s.split_reason for s in traj.segments] == [None, "new_conversation"]
    first, second = client.calls
    assert out["prompt_token_ids"] == [second["input_ids"]] and out["response_ids"] == [second["output_ids"]]
    assert out["loss_masks"] == [[1] * len(second["output_ids"])] and out["rollout_logprobs"] == [second["logprobs"]]
    m = out["rollout_metrics"]
    assert m["harnessrl/dropped_tokens"] == len(first["output_ids"]) > 0 and m["harnessrl/history_rewrites"] == 1
    assert out["rewards"] == [0.0] and client.finished == [traj.session_id]


@pytest.mark.docker
def test_history_rewrite_step_wise_gives_one_row_per_segment(scripted):
    """A GRPO group of two rollouts run at once: each episode's rows are its two segments, in
    input order, and each episode's calls share one session of their own."""
    client, gen, out = _rewrite(scripted, step_wise=True, rollouts=2, max_concurrency=2)
    _validate(out, 2, step_wise=True)
    assert out["trajectory_ids"] == [TrajectoryID("p1", 0)] * 2 + [TrajectoryID("p1", 1)] * 2
    assert out["is_last_step"] == [False, True] * 2 and out["rewards"] == [0.0] * 4
    sids = [e.trajectory.session_id for e in gen.last_episodes]
    assert len(set(sids)) == 2 and sorted(client.finished) == sorted(sids)
    for k, sid in enumerate(sids):
        first, second = [c for c in client.calls if c["session_id"] == sid]
        rows = slice(2 * k, 2 * k + 2)
        assert out["prompt_token_ids"][rows] == [first["input_ids"], second["input_ids"]]
        assert out["response_ids"][rows] == [first["output_ids"], second["output_ids"]]
        assert out["loss_masks"][rows] == [[1] * len(first["output_ids"]), [1] * len(second["output_ids"])]
        assert out["rollout_logprobs"][rows] == [first["logprobs"], second["logprobs"]]
    assert len(client.calls) == 4 and out["rollout_metrics"]["harnessrl/dropped_tokens"] == 0
    assert out["rollout_metrics"]["harnessrl/history_rewrites"] == 2


@pytest.fixture(scope="module")
def failed(scripted):
    """An episode whose client's engine is down: nothing listens on the discard port."""
    client = EngineClientDouble("http://127.0.0.1:9")
    gen = _generator(client, _two_conversations())
    try:
        out = asyncio.run(gen.generate(_batch([builtin_task().instance_id], ["p2"])))
    finally:
        gen.close()
        gen.sandboxes.reap(run_id=gen.sandboxes.run_id)
    return gen, out


@pytest.mark.docker
def test_engine_failure_is_masked_as_skyrl_masks_a_failed_trial(failed):
    """The call fails, the episode is an engine error (infra), and its row is SkyRL Harbor's
    placeholder for a failed trial: nothing trains on it, no zero is taught."""
    gen, out = failed
    _validate(out, 1, step_wise=False)
    traj = gen.last_episodes[0].trajectory
    assert (traj.termination, traj.status, traj.reward) == ("engine_error", "infra_error", None)
    assert [c.finish_reason for c in traj.calls] == ["engine_error"]
    assert (out["prompt_token_ids"], out["response_ids"], out["loss_masks"]) == ([[0]], [[0]], [[0]])
    assert (out["rewards"], out["stop_reasons"], out["rollout_logprobs"]) == ([0.0], ["error"], [[0.0]])
    m = out["rollout_metrics"]
    assert (m["harnessrl/masked_episodes"], m["harnessrl/masked_fraction"], m["harnessrl/infra_errors"]) == (1, 1.0, 1)
    assert m["harnessrl/endings/engine_error"] == 1
    assert "generate/avg_num_tokens" not in m  # nothing trained, nothing to average


@pytest.mark.docker
@pytest.mark.harness
def test_a_masked_rollout_masks_its_group(gold, failed):
    """The gold rollout and the failed one share a prompt: both masked (a GRPO baseline over the
    survivors only would be biased); with mask_failed_groups off, only the failure."""
    from harnessrl.trainers.bridges.skyrl_output import Episode, build_output

    ok, bad = gold[2].last_episodes[0], failed[0].last_episodes[0]
    same = [Episode(TrajectoryID("g", 0), ok.trajectory, 1.0), Episode(TrajectoryID("g", 1), bad.trajectory, 1.0)]
    grouped = build_output(same, step_wise=True)
    _validate(grouped, 2, step_wise=True)
    assert grouped["loss_masks"] == [[0], [0]] and grouped["is_last_step"] == [True, True]
    assert grouped["rewards"] == [0.0, 0.0] and grouped["rollout_metrics"]["harnessrl/masked_fraction"] == 1.0
    alone = build_output(same, step_wise=True, mask_failed_groups=False)
    assert alone["loss_masks"] == [gold[3]["loss_masks"][0], [0]] and alone["rewards"] == [1.0, 0.0]
    assert alone["rollout_metrics"]["harnessrl/masked_fraction"] == 0.5


@pytest.mark.docker
@pytest.mark.harness
def test_rows_pick_their_harness_among_several(scripted):
    """Two prompts, each row naming its harness (mini-swe-agent, tiny-agent): each runs through
    the harness it named, solved on the gold policy; a row naming none runs the first."""
    if installed_spec("venvs", "mini-swe-agent") is None:
        pytest.skip("mini-swe-agent not installed: run scripts/install_harnesses.sh mini-swe-agent")
    engine, url = scripted
    task = builtin_task()
    engine.set_tasks([task], gold=True)
    tiny = str(Path(__file__).resolve().parent.parent / "examples" / "harnesses" / "tiny-agent.toml")
    gen = _generator(EngineClientDouble(url), harnesses=["mini-swe-agent", tiny],
                     episode={"max_calls": 8, "wall_time_s": 400})
    batch = _batch([task.instance_id] * 3, ["h0", "h1", "h2"])
    batch["env_extras"] = [{"task_id": task.instance_id, "harness": "tiny-agent"},
                           {"task_id": task.instance_id, "harness": "mini-swe-agent"},
                           {"task_id": task.instance_id}]
    try:
        out = asyncio.run(gen.generate(batch))
    finally:
        gen.close()
        gen.sandboxes.reap(run_id=gen.sandboxes.run_id)
    _validate(out, 3, False)
    trajs = [e.trajectory for e in gen.last_episodes]
    assert [t.harness for t in trajs] == ["tiny-agent", "mini-swe-agent", "mini-swe-agent"]
    assert [t.reward for t in trajs] == [1.0, 1.0, 1.0] == list(out["rewards"]), [t.termination for t in trajs]
    with pytest.raises(ValueError, match=r"env_extras\[4\]\.harness: 'aider' is not one of this generator's "
                                         r"harnesses \['mini-swe-agent', 'tiny-agent'\]"):
        gen.harness({"task_id": task.instance_id, "harness": "aider"}, 4)


@pytest.mark.docker
def test_bad_rows_name_their_field(scripted):
    client = EngineClientDouble(scripted[1])
    gen = _generator(client)
    with pytest.raises(ValueError, match=r"env_extras\[0\]\.task_id"):
        gen.task({"suite": "builtin"}, 0)
    with pytest.raises(ValueError, match=r"env_extras\[1\]\.task_id: 'nope' is not in suite 'builtin'"):
        gen.task({"task_id": "nope"}, 1)
    with pytest.raises(ValueError, match=r"env_extras\[2\]\.harness: 'codex' is not one of this generator's "
                                         r"harnesses \['mini-swe-agent'\]"):
        gen.harness({"task_id": "x", "harness": "codex"}, 2)
    batch = _batch(["x"], ["p"])
    batch["env_extras"] = None
    with pytest.raises(ValueError, match="env_extras: one dict per prompt"):
        asyncio.run(gen.generate(batch))


@pytest.mark.docker
@pytest.mark.model
def test_sampled_episode_on_the_real_local_engine(scripted):
    """tiny-llama sampling through SkyRL's client contract: the rows hold exactly the tokens and
    logprobs the engine sampled, at the batch's temperature; a greedy eval batch gets a proxy
    of its own, recorded as greedy."""
    from harnessrl.trainers.engine import EngineServer

    task = builtin_task()
    with EngineServer(model="tiny-llama") as engine:
        client = EngineClientDouble(engine.url)
        gen = _generator(client, _two_conversations(), step_wise=True, step_rows="call")
        try:
            out = asyncio.run(gen.generate(_batch([task.instance_id], ["s0"], dict(SAMPLING, temperature=0.7, top_k=20))))
            train_traj = gen.last_episodes[0].trajectory
            evals = asyncio.run(gen.generate(_batch([task.instance_id], ["s1"], dict(SAMPLING, temperature=0.0))))
            eval_traj = gen.last_episodes[0].trajectory
        finally:
            gen.close()
            gen.sandboxes.reap(run_id=gen.sandboxes.run_id)
    _validate(out, 1, step_wise=True)
    _validate(evals, 1, step_wise=True)
    first, second = client.calls[:2]
    assert out["response_ids"] == [first["output_ids"], second["output_ids"]]
    assert out["rollout_logprobs"] == [first["logprobs"], second["logprobs"]]
    assert all(lp < 0 for c in (first, second) for lp in c["logprobs"])
    assert out["prompt_token_ids"] == [first["input_ids"], second["input_ids"]]
    assert [c["sampling_params"]["temperature"] for c in client.calls] == [0.7, 0.7, 0.0, 0.0]
    assert [c["sampling_params"]["top_k"] for c in client.calls] == [20, 20, -1, -1]
    assert {c.flags["sampling"]["temperature"] for c in train_traj.calls} == {0.7}
    assert {c.flags["sampling"]["temperature"] for c in eval_traj.calls} == {0.0}
    assert {c["session_id"] for c in client.calls[:2]} == {train_traj.session_id} != {eval_traj.session_id}
    assert train_traj.segments[0].versions[-1] == 3  # the client's weight_version is the tokens' version


@pytest.mark.docker
def test_example_entrypoint_builds_the_bridge_from_skyrl_config(scripted):
    """examples/skyrl/main_harnessrl.py: SkyRL parses `harnessrl.*` with its own config, and the
    experiment's `get_generator` hook returns the bridge (no Ray, no GPUs: only the hook)."""
    import importlib.util
    import multiprocessing as mp

    import pydantic

    path = Path(__file__).resolve().parents[1] / "examples" / "skyrl" / "main_harnessrl.py"
    before = mp.get_start_method(allow_none=True)
    try:
        spec = importlib.util.spec_from_file_location("harnessrl_skyrl_main", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    finally:
        mp.set_start_method(before, force=True)  # SkyRL's main_base forces "spawn" on import
    args = ["trainer.policy.model.path=tiny", "trainer.logger=console", "generator.step_wise_trajectories=true",
            "generator.merge_stepwise_output=true", "trainer.algorithm.max_seq_len=4096",
            "harnessrl.harness=mini-swe-agent", "harnessrl.sandbox=docker", "harnessrl.max_concurrency=3",
            "harnessrl.episode.max_calls=5", "harnessrl.step_rows=call"]
    cfg = mod.HarnessrlSkyRLConfig.from_cli_overrides(args)
    from skyrl.train.utils import validate_cfg

    validate_cfg(cfg)
    bridge = mod.bridge_config(cfg)
    assert (bridge.max_concurrency, bridge.episode.max_calls, bridge.max_seq_len, bridge.step_rows) == (3, 5, 4096, "call")
    exp = mod.HarnessrlExp.__new__(mod.HarnessrlExp)
    gen = exp.get_generator(cfg, load_tokenizer("tiny-llama"), EngineClientDouble(scripted[1]))
    assert isinstance(gen, base.GeneratorInterface) and gen.step_wise and gen.policy_model_name == "tiny"
    assert gen.adapter.name == "mini-swe-agent" and gen.config == bridge
    with pytest.raises(pydantic.ValidationError, match="max_concurency"):
        mod.bridge_config(mod.HarnessrlSkyRLConfig.from_cli_overrides(["harnessrl.max_concurency=3"]))


def test_prepared_dataset_reaches_the_generator_as_env_extras(tmp_path):
    """examples/skyrl/prepare_dataset.py writes what SkyRL's own PromptDataset reads back as
    (prompt, env_class, env_extras={task_id, suite})."""
    import importlib.util

    from skyrl.train.dataset import PromptDataset

    path = Path(__file__).resolve().parents[1] / "examples" / "skyrl" / "prepare_dataset.py"
    spec = importlib.util.spec_from_file_location("harnessrl_skyrl_dataset", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    task = builtin_task()
    out = tmp_path / "train.jsonl"
    out.write_text("".join(__import__("json").dumps(r) + "\n" for r in mod.rows("builtin", [task.instance_id])))
    ds = PromptDataset(datasets=[str(out)], tokenizer=load_tokenizer("tiny-llama"), max_prompt_length=512, num_workers=1)
    (prompt, env_class, extras, uid), = [ds[i] for i in range(len(ds))]
    assert env_class == "harnessrl" and extras == {"task_id": task.instance_id, "suite": "builtin"} and uid == "0"
    assert prompt == [{"role": "user", "content": task.problem_statement.strip().splitlines()[0][:200]}]
    with pytest.raises(SystemExit, match="no task of suite"):
        mod.rows("builtin", ["no-such-task"])
