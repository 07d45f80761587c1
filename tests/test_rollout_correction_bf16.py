"""The bf16 case on CPU: the local engine samples in bfloat16 over real HTTP, the built-in trainer
scores in float32; the mismatch is measured, reported per step, and the rollout correction keeps
the loss bounded on a batch with a deliberately large mismatch where the uncorrected loss is not.

The model is tiny-llama's shape (SmolLM2's real tokenizer and chat template) with random weights
of initializer_range 0.1, so its logits are about as peaked as a trained model's and bf16
rounding moves logprobs by the ~1e-2 the GPU run measured (tiny-llama's own 0.02 init gives
7e-4). The records, tampering and variants are bench/rollout_correction.py's own functions.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harnessrl.gym.models import ModelNotPrepared, load_tokenizer, resolve_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from rollout_correction import TIS_CAP, build_model, engine_records, tamper, train_once  # noqa: E402

try:
    resolve_model("tiny-llama")
except ModelNotPrepared as e:  # pragma: no cover
    pytest.skip(f"tiny-llama not prepared: {e}", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)
PROMPTS, TOKENS = 8, 32


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(build_model(tmp_path_factory.mktemp("peaked") / "model", 0.1))


def _records(model: str, dtype: str) -> list:
    from harnessrl.trainers.engine import EngineServer

    with EngineServer(model=model, dtype=dtype, weight_version="0", random_seed=0, num_threads=1) as engine:
        return engine_records(engine.url, load_tokenizer(model), PROMPTS, TOKENS, seed=0)


@pytest.fixture(scope="module")
def bf16_batch(model) -> list:
    return _records(model, "bfloat16")


def test_bf16_engine_against_float32_trainer_mismatch_is_real_and_reported(model, bf16_batch):
    m = train_once(model, "tis", bf16_batch)
    assert m.mismatch_tokens == PROMPTS * TOKENS
    # measured on this machine: mean 7.2e-3, max 3.7e-2 (the GPU run: 0.011 / 0.05)
    assert 1e-3 < m.logprob_mismatch_mean < 5e-2 and 5e-3 < m.logprob_mismatch_max < 0.5
    # the step's ratio figures are over the same fresh tokens: |log ratio| is the mismatch
    assert m.log_ratio_abs_mean == pytest.approx(m.logprob_mismatch_mean, rel=1e-5)
    assert m.log_ratio_abs_max == pytest.approx(m.logprob_mismatch_max, rel=1e-5)
    assert m.log_ratio_abs_p50 <= m.log_ratio_abs_p95 <= m.log_ratio_abs_p99 <= m.log_ratio_abs_max
    # bf16 noise alone stays far below the cap and the default sequence band: nothing is cut
    assert m.tis_truncated_frac == m.masked_frac == m.seq_masked_frac == 0.0
    assert 0.97 < m.seq_ratio_min <= m.seq_ratio_max < 1.03
    # the same prompts and seeds from a float32 engine: the mismatch is bf16's, not the pipeline's
    f32 = train_once(model, "tis", _records(model, "float32"))
    assert f32.logprob_mismatch_max < 1e-4 < m.logprob_mismatch_mean


def test_corrected_loss_stays_bounded_where_uncorrected_does_not(model, bf16_batch):
    bad, hit = tamper(bf16_batch, 3.0)  # two advantage +1 sequences: ratio e^3 = 20 on each token
    assert len(hit) == 2
    clean = {v: train_once(model, v, bf16_batch) for v in ("uncorrected", "tis+seq")}
    m = {v: train_once(model, v, bad) for v in ("uncorrected", "tis", "tis+seq")}
    for x in m.values():  # every variant reports the tampering the same way
        assert x.log_ratio_abs_max == pytest.approx(3.0, abs=0.05) and x.log_ratio_abs_p99 > 2.9
    # uncorrected: those 64 tokens weigh ~20 each; the token-mean loss (advantages +-1, so at most
    # C = 2 for any capped weight) is ~(20·64 - 64)/256 = 4.75
    assert abs(m["uncorrected"].pg_loss) > 4.5 and m["uncorrected"].tis_truncated_frac == 0.0
    # TIS: exactly the tampered tokens are cut to C, the loss is within C·max|A|
    assert m["tis"].tis_truncated_frac == 64 / 256 and abs(m["tis"].pg_loss) <= TIS_CAP
    assert m["tis"].seq_masked_frac == 0.0
    # + sequence mask: exactly the two tampered sequences drop out, and only they
    assert m["tis+seq"].seq_masked_frac == 2 / PROMPTS and m["tis+seq"].masked_frac == 64 / 256
    assert clean["tis+seq"].seq_masked_frac == 0.0
    assert m["tis+seq"].seq_ratio_max == pytest.approx(20.0, rel=0.05) and m["tis+seq"].seq_ratio_min > 0.97
    # the gradient (before clipping): the uncorrected one grows ~10x, the masked one stays put
    assert m["uncorrected"].grad_norm > 3 * clean["uncorrected"].grad_norm
    assert m["tis+seq"].grad_norm < 1.5 * clean["tis+seq"].grad_norm
    assert m["tis"].grad_norm < m["uncorrected"].grad_norm / 3
