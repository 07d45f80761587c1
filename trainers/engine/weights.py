"""Loading the policy model, and new weights from a `save_pretrained` folder.

`load_model` is the engine's start-up load; `read_weights` reads and checks a folder of
safetensors against the running model (names and shapes must match; a tied `lm_head`
may be absent) so that a bad update is refused before anything is touched.
"""
from __future__ import annotations

from pathlib import Path

import torch


class WeightLoadError(ValueError):
    """New weights cannot be used; the message says which file or tensor and why."""


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The model in `dtype` on `device` (float32 on CPU by default), in eval mode, checked to be
    one the engine can batch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
    model.eval()
    layer_types = getattr(model.config.get_text_config(decoder=True), "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise WeightLoadError(
            f"{path}: layer types {sorted(set(layer_types))}; the local engine batches only "
            "full-attention models (Llama/SmolLM2 style)"
        )
    return model


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every eos id the model declares (config, generation config, tokenizer)."""
    ids: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def read_weights(folder: str | Path, model, load_format: str | None = None) -> dict[str, torch.Tensor]:
    """All tensors of `folder/*.safetensors`, checked against `model`'s parameters."""
    from safetensors.torch import load_file

    if load_format not in (None, "auto", "safetensors"):
        raise WeightLoadError(f"load_format {load_format!r} is not supported (use 'auto' or 'safetensors')")
    folder = Path(folder)
    if not folder.is_dir():
        raise WeightLoadError(f"model_path {str(folder)!r} is not a folder")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"model_path {str(folder)!r} has no *.safetensors files (save with save_pretrained)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise WeightLoadError(f"{f}: cannot read safetensors ({e})") from e
    expected = model.state_dict()
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise WeightLoadError(f"{folder}: tensors the model does not have: {', '.join(unknown[:5])}")
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = sorted(set(expected) - set(state) - tied)
    if missing:
        raise WeightLoadError(f"{folder}: missing tensors: {', '.join(missing[:5])}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise WeightLoadError(
                f"{folder}: {name} has shape {tuple(tensor.shape)}, model has {tuple(expected[name].shape)}"
            )
    return {k: v.to(torch.float32) for k, v in state.items()}


@torch.no_grad()
def apply_weights(model, state: dict[str, torch.Tensor]) -> None:
    """Copy checked tensors into the model in place (tied weights stay tied)."""
    model.load_state_dict(state, strict=False)
