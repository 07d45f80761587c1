"""Trainer checkpoints with exact resume, and atomic weight folders for the engine.

A checkpoint folder holds `state.pt` (model and optimizer/scheduler state dicts, the
trainer's shuffle generator) and `rng.pt` (the process RNGs: python, numpy, torch CPU and
CUDA), plus `meta.json` (step, version, config) for people. Resuming restores all of it,
so the next step is bit-for-bit the step the original run would have taken on the same
machine. Folders are written beside their target and renamed into place, so a reader
(an engine loading weights, a resumed job) never sees half a folder.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def atomic_dir(target: Path) -> Path:
    """A fresh temporary folder beside `target`; hand it to `commit_dir` when full."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit_dir(tmp: Path, target: Path) -> Path:
    """Replace `target` with `tmp` (old contents moved aside first, then removed)."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(ckpt_dir: Path, *, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    ckpt_dir = Path(ckpt_dir)
    tmp = atomic_dir(ckpt_dir)
    torch.save(state, tmp / "state.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    return commit_dir(tmp, ckpt_dir)


def load(ckpt_dir: Path, device: torch.device) -> tuple[dict[str, Any], dict[str, Any]]:
    """The saved state dicts and meta; restores the process RNGs as a side effect."""
    ckpt_dir = Path(ckpt_dir)
    for name in ("state.pt", "rng.pt", "meta.json"):
        if not (ckpt_dir / name).exists():
            raise FileNotFoundError(f"{ckpt_dir} is not a trainer checkpoint: {name} is missing")
    state = torch.load(ckpt_dir / "state.pt", map_location=device, weights_only=True)
    # RNG states hold python/numpy objects (tuples, arrays), hence the full unpickler on
    # a file this trainer wrote itself.
    set_rng_state(torch.load(ckpt_dir / "rng.pt", weights_only=False))
    return state, json.loads((ckpt_dir / "meta.json").read_text())
