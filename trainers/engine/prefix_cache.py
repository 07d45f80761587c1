"""The local engine's prefix cache: KV of finished (and just-prefilled) sequences, reused.

Contract: `match(ids)` returns the longest prefix of `ids` whose KV some entry holds (any
entry whose token ids start the same way: attention is causal, so the KV of the first m
positions depends only on the first m tokens) and that KV, at most `len(ids) - 1`
positions (the last token is always prefilled, so the request gets its own logits). A hit
prefills only the suffix; in float32 its logits equal a cold prefill's to rounding (tests:
identical greedy ids, logprobs within 1e-5).

Entries belong to one weights epoch. Any weight change (`invalidate`, called by the
scheduler on every weight load and on /flush_cache) drops them all, and the scheduler
never inserts KV a request computed partly under older weights (an in-place pause over a
weight update), so a hit never serves stale KV.

Bounded by bytes: least recently used entries go first. An entry that is a prefix of a
newer one is dropped (the longer one matches everything it would). A linear scan over
entries is enough at the sizes one CPU engine holds (tens of entries).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer (keys, values), each [1, kv_heads, positions, head_dim]."""


@dataclass
class _Entry:
    ids: torch.Tensor  # [n] int64, on CPU
    layers: Layers
    nbytes: int


def _nbytes(layers: Layers) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


def _common(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D id tensors."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return n if diff.numel() == 0 else int(diff[0, 0])


class PrefixCache:
    def __init__(self, budget_bytes: int):
        self.budget = int(budget_bytes)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self.bytes = 0
        self.epoch = 0
        self.stats = {"lookups": 0, "hits": 0, "hit_tokens": 0, "prefill_tokens": 0, "inserts": 0,
                      "evictions": 0, "invalidations": 0}

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, ids: list[int]) -> tuple[int, Layers | None]:
        """(m, KV of ids[:m]) for the longest cached prefix, m <= len(ids) - 1; (0, None) on a miss."""
        if not self.enabled or len(ids) < 2 or not self._entries:
            if self.enabled:
                self.stats["lookups"] += 1
            return 0, None
        self.stats["lookups"] += 1
        q = torch.tensor(ids, dtype=torch.long)
        best, best_key = 0, None
        for key, e in self._entries.items():
            m = _common(q, e.ids)
            if m > best:
                best, best_key = m, key
        best = min(best, len(ids) - 1)
        if best_key is None or best == 0:
            return 0, None
        self._entries.move_to_end(best_key)
        e = self._entries[best_key]
        self.stats["hits"] += 1
        self.stats["hit_tokens"] += best
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in e.layers]

    def insert(self, ids: list[int], layers: Layers, epoch: int) -> bool:
        """Keep the KV of `ids` (one position per id) if it was computed under the current weights."""
        if not self.enabled or epoch != self.epoch or not ids:
            return False
        if layers[0][0].shape[-2] != len(ids):
            raise ValueError(f"prefix cache: {len(ids)} ids but KV of {layers[0][0].shape[-2]} positions")
        nbytes = _nbytes(layers)
        if nbytes > self.budget:
            return False
        q = torch.tensor(ids, dtype=torch.long)
        for key, e in list(self._entries.items()):
            m = _common(q, e.ids)
            if m == e.ids.shape[0]:  # an older entry is a prefix of this one: it adds nothing
                self._drop(key)
            elif m == len(ids):  # this one is a prefix of a kept entry: refresh that one instead
                self._entries.move_to_end(key)
                return False
        while self._entries and self.bytes + nbytes > self.budget:
            self._drop(next(iter(self._entries)))
            self.stats["evictions"] += 1
        self._entries[self._next] = _Entry(q, layers, nbytes)
        self._next += 1
        self.bytes += nbytes
        self.stats["inserts"] += 1
        return True

    def invalidate(self) -> None:
        """The weights changed (or a flush was asked for): every entry is stale."""
        self._entries.clear()
        self.bytes = 0
        self.epoch += 1
        self.stats["invalidations"] += 1

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key)
        self.bytes -= e.nbytes

    def report(self) -> dict:
        return {"entries": len(self._entries), "bytes": self.bytes, "budget_bytes": self.budget,
                "epoch": self.epoch, **self.stats}
