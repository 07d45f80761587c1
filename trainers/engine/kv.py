"""The KV cache of the running decode batch: left-padded rows that join and leave.

Row i holds `lengths[i]` real positions, right-aligned in a shared [B, H, L, D] tensor per
layer; `mask` [B, L] is 1 on real positions. A new request is prefilled alone (no padding,
so its KV is exactly what `model.generate` computes) and then padded into the batch; a
finished row is dropped and the columns that became padding for every row are trimmed.
Each decode step feeds one token per row at position `lengths[i]` with the padding masked
out, so a row's attention sees exactly its own tokens.

Only full-attention decoder models (Llama, SmolLM2, Qwen2 without sliding window, ...) are
supported: every layer is a plain `DynamicLayer`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _left_pad(t: torch.Tensor, to: int) -> torch.Tensor:
    extra = to - t.shape[-2]
    return t if extra == 0 else F.pad(t, (0, 0, extra, 0))


class BatchKV:
    """Padded KV cache, attention mask and lengths of the running rows (in row order)."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [B, L] long
        self.lengths: torch.Tensor | None = None  # [B] long

    @property
    def size(self) -> int:
        return 0 if self.lengths is None else int(self.lengths.shape[0])

    def add(self, row_cache: DynamicCache) -> None:
        """Append one prefilled request (batch 1, no padding) as the last row."""
        new = _layers(row_cache)
        n, dev = new[0][0].shape[-2], new[0][0].device
        if self.cache is None:
            self.cache = DynamicCache(ddp_cache_data=new)
            self.mask = torch.ones(1, n, dtype=torch.long, device=dev)
            self.lengths = torch.tensor([n], device=dev)
            return
        old = _layers(self.cache)
        L = max(old[0][0].shape[-2], n)
        merged = [
            (torch.cat([_left_pad(k0, L), _left_pad(k1, L)]), torch.cat([_left_pad(v0, L), _left_pad(v1, L)]))
            for (k0, v0), (k1, v1) in zip(old, new)
        ]
        self.cache = DynamicCache(ddp_cache_data=merged)
        self.mask = torch.cat([F.pad(self.mask, (L - self.mask.shape[1], 0)),
                               F.pad(torch.ones(1, n, dtype=torch.long, device=dev), (L - n, 0))])
        self.lengths = torch.cat([self.lengths, torch.tensor([n], device=dev)])

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into the current order), then trim shared padding."""
        if not rows:
            self.cache = self.mask = self.lengths = None
            return
        if rows == list(range(self.size)):
            return
        idx = torch.tensor(rows, device=self.lengths.device)
        self.lengths = self.lengths.index_select(0, idx)
        drop = self.mask.shape[1] - int(self.lengths.max())  # columns that are padding in every row
        self.mask = self.mask.index_select(0, idx)[:, drop:]
        self.cache = DynamicCache(ddp_cache_data=[
            (k.index_select(0, idx)[:, :, drop:].contiguous(), v.index_select(0, idx)[:, :, drop:].contiguous())
            for k, v in _layers(self.cache)
        ])

    def step_inputs(self) -> dict:
        """Forward kwargs for one decode step (the caller adds input_ids [B, 1])."""
        assert self.cache is not None and self.mask is not None and self.lengths is not None
        dev, dtype = self.mask.device, self.cache.layers[0].keys.dtype
        self.mask = torch.cat([self.mask, torch.ones(self.size, 1, dtype=torch.long, device=dev)], dim=1)
        position_ids = self.lengths.unsqueeze(1).clone()
        self.lengths = self.lengths + 1
        L = self.mask.shape[1]
        if bool(self.mask.all()):
            attention_mask = None  # no padding: the exact path of an unbatched generate step
        else:
            # a ready 4D additive mask [B, 1, 1, L]: HF uses it as is, instead of building one
            # from the 2D mask per step (slow on CPU for padded batches); in the model's dtype
            attention_mask = torch.zeros(self.size, 1, 1, L, dtype=dtype, device=dev).masked_fill(
                self.mask[:, None, None, :] == 0, torch.finfo(dtype).min)
        return {
            "past_key_values": self.cache,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "cache_position": torch.tensor([L - 1], device=dev),
            "use_cache": True,
        }

    def clear(self) -> None:
        self.cache = self.mask = self.lengths = None
