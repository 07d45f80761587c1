"""The offline default model and the tiny test model: prepared folders, real tokenizer."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.gym.models import ModelNotPrepared, load_tokenizer, model_dir, resolve_model


def test_missing_model_error_says_how_to_prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESSRL_HOME", str(tmp_path))
    with pytest.raises(ModelNotPrepared, match="harnessrl model prepare smollm2-135m"):
        resolve_model("smollm2-135m")
    with pytest.raises(ModelNotPrepared, match="neither a known model"):
        resolve_model(str(tmp_path / "nowhere"))
    with pytest.raises(KeyError, match="known: smollm2-135m, tiny-llama"):
        model_dir("gpt-5")


def test_cli_reports_unprepared_model(tmp_path: Path) -> None:
    env = {"HARNESSRL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "harnessrl.cli", "model", "list"], capture_output=True, text=True, env=env)
    assert out.returncode == 0
    assert "not prepared (harnessrl model prepare smollm2-135m)" in out.stdout


@pytest.mark.parametrize("name", ["tiny-llama", "smollm2-135m"])
def test_prepared_model_has_real_tokenizer_and_chatml(name: str) -> None:
    tok = load_tokenizer(name)
    assert len(tok) == 49152
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tok.eos_token_id == 2
    ids = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tok.decode(ids) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == 1 and ids.count(2) == 2


@pytest.mark.model
def test_smollm2_answers_sensibly() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    tok = load_tokenizer("smollm2-135m")
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, return_tensors="pt",
                                  return_dict=False)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:])
    assert "4" in text  # the real de-quantized weights, not a random init
