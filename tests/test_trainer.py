"""The built-in torch trainer on tiny-llama (CPU, float32), with records sampled from the model.

Rollouts are sampled token by token from a plain forward pass of the same prepared model,
and their logprobs recorded the way the engine records them; prompts come from the real
tokenizer's chat template.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harnessrl.gym.models import ModelNotPrepared, load_tokenizer, resolve_model
from harnessrl.gym.trajectory import Segment, Trajectory
from harnessrl.trainers.base import Checkpointable, TensorPublisher, Trainer, trainer_class
from harnessrl.trainers.samples import RecordError
from harnessrl.trainers.torch_trainer import TorchTrainer, TorchTrainerConfig

try:
    resolve_model("tiny-llama")
except ModelNotPrepared as e:  # pragma: no cover
    pytest.skip(f"tiny-llama not prepared: {e}", allow_module_level=True)

SUFFIX = "<|im_end|>\n<|im_start|>user\nobservation: ok<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def policy():
    return AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-llama")), dtype=torch.float32).eval()


class Recorder:
    """Builds one segment the way the proxy does: prompt, sampled completion, templated suffix, ..."""

    def __init__(self, model, tok, seed: int, temperature: float = 1.0):
        self.model, self.tok, self.temperature = model, tok, temperature
        self.gen = torch.Generator().manual_seed(seed)

    def segment(self, prompt: str, lengths: tuple[int, ...] = (5, 5), version: int = 0) -> Segment:
        """One completion of lengths[c] sampled tokens per call, joined by the templated suffix."""
        ids = self.tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           return_dict=False)
        mask, lps, vers = [0] * len(ids), [0.0] * len(ids), [-1] * len(ids)
        for c, n_new in enumerate(lengths):
            if c:
                extra = self.tok.encode(SUFFIX, add_special_tokens=False)
                ids += extra
                mask += [0] * len(extra); lps += [0.0] * len(extra); vers += [-1] * len(extra)
            with torch.no_grad():
                for _ in range(n_new):
                    logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                    lp = torch.log_softmax(logits / self.temperature, -1)
                    t = int(torch.multinomial(lp.exp(), 1, generator=self.gen).item())
                    ids.append(t); mask.append(1); lps.append(float(lp[t])); vers.append(version)
        return Segment(token_ids=ids, loss_mask=mask, logprobs=lps, versions=vers)


def rollouts(policy, tok, seed=0, temperature=1.0):
    rec = Recorder(policy, tok, seed, temperature)
    spec = [("a1", "A", 1.0), ("a2", "A", 0.0), ("b1", "B", 1.0), ("b2", "B", 0.25)]
    return [
        Trajectory(session_id=sid, task_id=task, reward=r, status="ok", segments=[rec.segment(f"fix bug {task}")])
        for sid, task, r in spec
    ]


def config(**kw) -> TorchTrainerConfig:
    base = dict(model="tiny-llama", device="cpu", lr=1e-3, seed=0)
    base.update(kw)
    return TorchTrainerConfig(**base)


def params(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def assert_same_gradients(a, b, atol=1e-6):
    """The last update's gradients agree. (Parameters are not compared: Adam's first step
    is ~lr * sign(g), which turns float noise on near-zero gradients into lr-sized steps.)"""
    ga = dict(a.model.named_parameters())
    for name, p in b.model.named_parameters():
        assert torch.allclose(ga[name].grad, p.grad, rtol=1e-4, atol=atol), name


@pytest.mark.timeout(300)
def test_step_changes_parameters_and_reports_metrics(policy, tok):
    batch = rollouts(policy, tok)
    trainer = TorchTrainer(config())
    assert isinstance(trainer, Trainer) and isinstance(trainer, Checkpointable) and isinstance(trainer, TensorPublisher)
    before = params(trainer)
    m = trainer.step(batch)
    after = params(trainer)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "model.embed_tokens.weight" in changed and "model.layers.1.mlp.down_proj.weight" in changed
    assert m.updated and math.isfinite(m.loss) and m.grad_norm > 0
    # 4 trajectories x 1 segment x 2 completions x 5 sampled tokens
    assert (m.tokens, m.samples, m.trajectories, m.step, m.version) == (40, 4, 4, 1, 1)
    assert m.reward_mean == pytest.approx((1 + 0 + 1 + 0.25) / 4) and m.success_rate == 0.5
    assert (m.staleness_max, m.staleness_mean) == (0, 0.0)
    # one on-policy update: ratio 1, clip inactive, the loss is the advantage-weighted mean
    assert m.clip_frac == 0.0 and m.behav_filtered_frac == 0.0
    assert trainer.version == 1 and m.lr == pytest.approx(1e-3)
    json.dumps(m.to_dict())  # one JSONL line of the main job


@pytest.mark.timeout(300)
def test_logprob_mismatch_is_zero_in_float32(policy, tok):
    batch = rollouts(policy, tok, seed=1)
    m = TorchTrainer(config()).step(batch)
    assert m.mismatch_tokens == 40
    assert m.logprob_mismatch_max < 1e-5 and m.logprob_mismatch_mean < 1e-6
    assert abs(m.kl_behaviour) < 1e-6


@pytest.mark.timeout(300)
def test_sampling_temperature_is_scored_with_the_same_temperature(policy, tok):
    batch = rollouts(policy, tok, seed=2, temperature=0.7)
    same = TorchTrainer(config(temperature=0.7)).step(batch)
    assert same.logprob_mismatch_max < 1e-5
    wrong = TorchTrainer(config(temperature=1.0)).step(batch)
    assert wrong.logprob_mismatch_mean > 1e-2  # the fidelity metric catches a temperature mix-up


@pytest.mark.timeout(400)
def test_resume_from_checkpoint_reproduces_next_step_exactly(policy, tok, tmp_path):
    cfg = config(minibatches=2, warmup_steps=3)  # shuffling RNG and scheduler state matter
    first, second = rollouts(policy, tok, seed=3), rollouts(policy, tok, seed=4)
    a = TorchTrainer(cfg)
    a.step(first)
    a.save_checkpoint(tmp_path / "ckpt")
    m_a = a.step(second)
    b = TorchTrainer(cfg)
    b.load_checkpoint(tmp_path / "ckpt")
    assert (b.step_count, b.version) == (1, 1)
    m_b = b.step(second)
    pa, pb = params(a), params(b)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    da, db = m_a.to_dict(), m_b.to_dict()
    da.pop("step_s"), db.pop("step_s")
    assert da == db
    # a fresh trainer that did not resume takes a different step
    c = TorchTrainer(cfg)
    c.step(second)
    assert not torch.equal(params(c)["model.embed_tokens.weight"], pa["model.embed_tokens.weight"])


@pytest.mark.timeout(300)
def test_micro_batching_accumulates_to_the_same_update(policy, tok):
    batch = rollouts(policy, tok, seed=5)
    longest = max(len(t.segments[0].token_ids) for t in batch)
    one = TorchTrainer(config(micro_batch_tokens=100_000))
    many = TorchTrainer(config(micro_batch_tokens=longest))  # one sample per micro-batch
    assert len(many._micro_batches([s for s in _samples(many, batch)])) == 4
    m1, m4 = one.step(batch), many.step(batch)
    assert m1.loss == pytest.approx(m4.loss, abs=1e-6) and m1.grad_norm == pytest.approx(m4.grad_norm, rel=1e-5)
    assert_same_gradients(one, many)


def _samples(trainer, batch):
    from harnessrl.trainers.samples import build_samples

    return build_samples(batch, trainer.config.samples).samples


@pytest.mark.timeout(300)
def test_activation_checkpointing_gives_the_same_update(policy, tok):
    batch = rollouts(policy, tok, seed=6)
    plain, ckpt = TorchTrainer(config()), TorchTrainer(config(activation_checkpointing=True))
    plain.step(batch), ckpt.step(batch)
    assert_same_gradients(plain, ckpt)


@pytest.mark.timeout(300)
def test_infra_failed_episode_does_not_touch_the_update(policy, tok):
    batch = rollouts(policy, tok, seed=7)
    infra = Trajectory(session_id="infra", task_id="A", reward=0.0, status="infra_error",
                       segments=[Recorder(policy, tok, 99).segment("fix bug A")])
    clean, with_infra = TorchTrainer(config()), TorchTrainer(config())
    m_clean, m_infra = clean.step(batch), with_infra.step(batch + [infra])
    assert m_infra.masked_infra == 1 and m_infra.tokens == m_clean.tokens == 40
    pa, pb = params(clean), params(with_infra)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("normalization", ["sequence", "token"])
def test_split_trajectory_is_not_over_weighted(policy, tok, normalization):
    """The same tokens recorded as one segment or split in two train identically."""
    rec = Recorder(policy, tok, 8)
    whole = rec.segment("fix bug A", lengths=(3, 7))
    others = rollouts(policy, tok, seed=9)
    # Split at the suffix: segment 0 = prompt + first completion; segment 1 = the whole
    # history again (a re-templated prefix, mask 0) + the second completion.
    first_end = whole.loss_mask.index(1) + 3
    seg0 = Segment(whole.token_ids[:first_end], whole.loss_mask[:first_end], whole.logprobs[:first_end], whole.versions[:first_end])
    m1 = [0] * first_end + whole.loss_mask[first_end:]
    seg1 = Segment(list(whole.token_ids), m1, [lp if m else 0.0 for lp, m in zip(whole.logprobs, m1)],
                   [v if m else -1 for v, m in zip(whole.versions, m1)], split_reason="history_rewrite")
    unsplit_t = Trajectory(session_id="x", task_id="A", reward=1.0, status="ok", segments=[whole])
    split_t = Trajectory(session_id="x", task_id="A", reward=1.0, status="ok", segments=[seg0, seg1])
    batch_rest = [t for t in others if t.session_id != "a1"]
    u, s = TorchTrainer(config(normalization=normalization)), TorchTrainer(config(normalization=normalization))
    mu, ms = u.step(batch_rest + [unsplit_t]), s.step(batch_rest + [split_t])
    assert ms.samples == mu.samples + 1 and ms.tokens == mu.tokens
    assert ms.loss == pytest.approx(mu.loss, abs=1e-6)
    assert_same_gradients(u, s)
    if normalization == "sequence":
        # Splitting the weight equally (1/2 to 3 tokens, 1/2 to 7) is a different update:
        # the weighting is what makes the two records train alike.
        eq = TorchTrainer(config(normalization="sequence", samples={"segment_weighting": "equal"}))
        eq.step(batch_rest + [split_t])
        with pytest.raises(AssertionError):
            assert_same_gradients(u, eq)


@pytest.mark.timeout(400)
def test_staleness_and_decoupled_ppo_across_versions(policy, tok, tmp_path):
    trainer = TorchTrainer(config(minibatches=2, lr=1e-2))
    m0 = trainer.step(rollouts(policy, tok, seed=10))
    # proximal logprobs are recomputed before the first of the two updates, so the
    # fidelity number stays exact although the first update moved the weights a lot
    assert m0.logprob_mismatch_max < 1e-5 and m0.mismatch_tokens == 40
    out = tmp_path / "weights"
    assert trainer.publish(out) == 1
    engine = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    fresh = rollouts(engine, tok, seed=11)  # sampled by version 1
    for t in fresh:
        t.segments[0].versions = [1 if v == 0 else v for v in t.segments[0].versions]
    stale = rollouts(policy, tok, seed=12)  # sampled by version 0
    for t in stale:
        t.session_id += "-old"
    m1 = trainer.step(fresh + stale)
    assert (m1.staleness_max, m1.staleness_mean) == (1, 0.5)
    assert m1.mismatch_tokens == 40 and m1.logprob_mismatch_max < 1e-5  # only fresh tokens are compared
    assert m1.kl_behaviour > 1e-3  # the stale half was sampled by a different policy
    assert trainer.version == 2


@pytest.mark.timeout(300)
def test_behaviour_weight_mask_and_cap(policy, tok):
    batch = rollouts(policy, tok, seed=13)
    # Pretend the engine gave the first sampled token of a1 a much lower logprob: the
    # behaviour weight pi_prox / pi_behav is then e^3 ~ 20 > cap 5.
    seg = batch[0].segments[0]
    i = seg.loss_mask.index(1)
    seg.logprobs[i] -= 3.0
    masked = TorchTrainer(config(behav_mode="mask")).step(batch)
    capped = TorchTrainer(config(behav_mode="cap")).step(batch)
    plain = TorchTrainer(config(policy_loss="ppo_clip")).step(batch)
    assert masked.behav_filtered_frac == capped.behav_filtered_frac == pytest.approx(1 / 40)
    assert plain.behav_filtered_frac == 0.0
    # PPO-clip against the engine's logprobs sees ratio e^3 on that token: clipped (a1 has A > 0)
    assert plain.clip_frac == pytest.approx(1 / 40)
    assert masked.loss != pytest.approx(capped.loss)


@pytest.mark.timeout(400)
def test_kl_to_reference(policy, tok):
    trainer = TorchTrainer(config(kl_coef=0.1, lr=1e-2))
    m0 = trainer.step(rollouts(policy, tok, seed=14))
    assert m0.kl == 0.0  # the reference is the initial policy
    m1 = trainer.step(rollouts(policy, tok, seed=15))
    assert m1.kl > 1e-4 and m1.loss != pytest.approx(m1.pg_loss)
    assert TorchTrainer(config()).step(rollouts(policy, tok, seed=14)).kl is None


@pytest.mark.timeout(300)
def test_publish_writes_a_loadable_folder(policy, tok, tmp_path):
    trainer = TorchTrainer(config())
    trainer.step(rollouts(policy, tok, seed=16))
    out = tmp_path / "pub"
    assert trainer.publish(out) == 1
    assert {"model.safetensors", "config.json", "tokenizer.json", "harnessrl_version.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "harnessrl_version.json").read_text()) == {"version": 1, "step": 1}
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    mine = trainer.model.state_dict()
    assert all(torch.equal(v, mine[k]) for k, v in loaded.state_dict().items())
    t2 = AutoTokenizer.from_pretrained(str(out))
    msgs = [{"role": "user", "content": "hi"}]
    assert (t2.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
            == tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False))
    trainer.step(rollouts(policy, tok, seed=17))
    assert trainer.publish(out) == 2 and not (tmp_path / "pub.tmp").exists()
    assert json.loads((out / "harnessrl_version.json").read_text())["version"] == 2
    names = dict(trainer.named_weights())
    assert torch.equal(names["model.norm.weight"], trainer.model.model.norm.weight)


@pytest.mark.timeout(300)
def test_bad_records_and_configs_are_named(policy, tok):
    trainer = TorchTrainer(config())
    batch = rollouts(policy, tok, seed=18)
    batch[2].segments[0].versions[-1] = 3
    with pytest.raises(RecordError, match=r"trajectory 'b1' segment 0 field 'versions': \[\d+\] = 3 is newer than the trainer's version 0"):
        trainer.step(batch)
    with pytest.raises(ValueError, match="lr"):
        TorchTrainerConfig(lr=-1.0)
    with pytest.raises(ValueError, match="device"):
        TorchTrainerConfig(device="tpu")
    with pytest.raises(ValueError, match="micro_batch_size"):
        TorchTrainerConfig(micro_batch_size=4)
    cls = trainer_class("torch")
    assert cls is TorchTrainer and cls.Config(**{"model": "tiny-llama", "lr": 3e-4}).lr == 3e-4
    assert trainer_class("harnessrl.trainers.torch_trainer:TorchTrainer") is TorchTrainer
    with pytest.raises(KeyError, match="known: tinker, torch"):
        trainer_class("jax")


@pytest.mark.timeout(60)
def test_batch_without_trainable_tokens_takes_no_step(policy, tok):
    trainer = TorchTrainer(config())
    before = params(trainer)
    m = trainer.step([Trajectory(session_id="i", task_id="A", reward=None, status="infra_error", segments=[])])
    assert not m.updated and m.masked_infra == 1 and trainer.version == 0 and m.reward_mean is None
    assert all(torch.equal(before[k], v) for k, v in params(trainer).items())


@pytest.mark.timeout(300)
def test_bf16_autocast_path_on_cpu(policy, tok):
    """The bf16 code path (autocast, fp32 master weights, fp32 logprobs) runs on CPU when asked."""
    batch = rollouts(policy, tok, seed=19)
    trainer = TorchTrainer(config(dtype="bfloat16"))
    assert trainer.autocast_dtype is torch.bfloat16 and TorchTrainer(config()).autocast_dtype is None
    before = params(trainer)
    m = trainer.step(batch)
    assert m.updated and math.isfinite(m.loss) and m.grad_norm > 0
    assert all(v.dtype == torch.float32 for v in params(trainer).values())
    assert not torch.equal(before["model.embed_tokens.weight"], trainer.model.model.embed_tokens.weight)
    # bf16 logits lose precision against the fp32 engine logprobs: measurable, bounded
    assert 1e-5 < m.logprob_mismatch_max < 0.5
