"""What the built-in trainer trains: the model loaded in float32 master weights, and every
parameter, the top N decoder blocks (`freeze_below`), or LoRA adapters (`trainers.lora`)."""
from __future__ import annotations

import torch


def load_model(name: str, device: torch.device):
    from transformers import AutoModelForCausalLM

    from harnessrl.gym.models import resolve_model

    path = resolve_model(name)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.to(device), path


def freeze_below(model, n: int) -> None:
    """requires_grad only on the top `n` decoder blocks and the final norm (TorchTrainerConfig.trainable_layers)."""
    inner = getattr(model, "model", None)
    blocks, norm = getattr(inner, "layers", None), getattr(inner, "norm", None)
    if blocks is None or norm is None:
        raise ValueError(f"trainable_layers: {type(model).__name__} has no model.layers / model.norm to freeze below")
    if n > len(blocks):
        raise ValueError(f"trainable_layers: {n} > the model's {len(blocks)} decoder blocks")
    model.requires_grad_(False)
    for block in list(blocks)[len(blocks) - n:]:
        block.requires_grad_(True)
    norm.requires_grad_(True)
