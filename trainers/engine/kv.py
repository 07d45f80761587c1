"""The KV cache of the running decode batch: left-padded rows that join and leave.

Row i holds `lengths[i]` real positions, right-aligned in a shared [B, H, L, D] tensor per
layer; `mask` [B, L] is 1 on real positions. A new request is prefilled alone (no padding,
so its KV is exactly what `model.generate` computes) and then padded into the batch; a
finished row is dropped and the columns that became padding for every row are trimmed.
Each decode step feeds one token per row at position `lengths[i]` with the padding masked
out, so a row's attention sees exactly its own tokens.

`BatchKV` preallocates: each layer's keys/values are views `[:, :, :L]` of buffers with
room for more columns, and a decode step writes its column in place (no per-step
`torch.cat` of the whole cache, no mask rebuilt per step); the buffers are rebuilt only
when a row joins or leaves, or the room runs out. The values the model attends over are
the same numbers as in `ConcatKV` (the previous layout, a growing `DynamicCache`, kept to
measure against), so outputs are identical.

Only full-attention decoder models (Llama, SmolLM2, Qwen2 without sliding window, ...) are
supported: every layer is a plain `DynamicLayer`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _left_pad(t: torch.Tensor, to: int) -> torch.Tensor:
    extra = to - t.shape[-2]
    return t if extra == 0 else F.pad(t, (0, 0, extra, 0))


class ConcatKV:
    """The previous layout, kept to measure against (`EngineConfig.kv_preallocate = False`):
    a plain `DynamicCache` that concatenates one column per step, and a mask rebuilt per step."""

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


def _room(n: int) -> int:
    """Columns to allocate for n used ones: room for at least 64 more steps (1/8 more when long)."""
    return n + max(64, n // 8)


class _SlabLayer(DynamicLayer):
    """One layer's KV as views `[:, :, :n]` of preallocated buffers; `update` writes in place."""

    def __init__(self, k_buf: torch.Tensor, v_buf: torch.Tensor, n: int):
        super().__init__()
        self.k_buf, self.v_buf, self.n = k_buf, v_buf, n
        self.dtype, self.device = k_buf.dtype, k_buf.device
        self.is_initialized = True
        self._view()

    def _view(self) -> None:
        self.keys, self.values = self.k_buf[:, :, :self.n], self.v_buf[:, :, :self.n]

    def grow(self, cap: int) -> None:
        k, v = self.k_buf.new_zeros(*self.k_buf.shape[:2], cap, self.k_buf.shape[3]), self.v_buf.new_zeros(
            *self.v_buf.shape[:2], cap, self.v_buf.shape[3])
        k[:, :, :self.n], v[:, :, :self.n] = self.keys, self.values
        self.k_buf, self.v_buf = k, v
        self._view()

    def reserve(self, q: int) -> None:
        """Room for q more columns after the n used ones."""
        if self.n + q > self.k_buf.shape[-2]:
            self.grow(_room(self.n + q))

    def advance(self, q: int) -> None:
        """The q columns after the n used ones were written: they are used now."""
        self.n += q
        self._view()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        self.reserve(q)
        self.k_buf[:, :, self.n:self.n + q] = key_states
        self.v_buf[:, :, self.n:self.n + q] = value_states
        self.advance(q)
        return self.keys, self.values


class BatchKV:
    """Padded KV cache, attention mask and lengths of the running rows (in row order), in
    preallocated buffers (module doc). `cache.layers[i].keys` and `mask` are views of the
    used columns, so readers (the prefix cache's `_keep_finished`) see the same shapes as
    with `ConcatKV`."""

    def __init__(self) -> None:
        self.cache: Cache | None = None
        self.mask: torch.Tensor | None = None  # [B, L] long, a view of _mask_buf
        self.lengths: torch.Tensor | None = None  # [B] long
        self._mask_buf: torch.Tensor | None = None  # [B, cap]: 1 on real and on future columns
        self._add_buf: torch.Tensor | None = None  # [B, 1, 1, cap]: 0 or the dtype's min (padding)
        self._padded = False

    @property
    def size(self) -> int:
        return 0 if self.lengths is None else int(self.lengths.shape[0])

    def _build(self, rows: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], int]], lengths: torch.Tensor) -> None:
        """New buffers holding `rows` (per row: its layers' [1|k, H, >=n, D] KV whose last n
        columns are real, and n), right-aligned at L = max n."""
        L = int(lengths.max())
        cap = _room(L)
        first = rows[0][0]
        dev, dtype = first[0][0].device, first[0][0].dtype
        B = int(lengths.shape[0])
        layers = []
        for li, (k0, v0) in enumerate(first):
            H, D = k0.shape[1], k0.shape[3]
            k, v = k0.new_zeros(B, H, cap, D), v0.new_zeros(B, H, cap, D)
            b = 0
            for row_layers, n in rows:
                rk, rv = row_layers[li]
                m = rk.shape[0]
                k[b:b + m, :, L - n:L], v[b:b + m, :, L - n:L] = rk[:, :, rk.shape[2] - n:], rv[:, :, rv.shape[2] - n:]
                b += m
            layers.append(_SlabLayer(k, v, L))
        self.cache = Cache(layers=layers)
        self.lengths = lengths
        cols = torch.arange(cap, device=dev)
        self._mask_buf = (cols[None, :] >= (L - lengths)[:, None]).to(torch.long)
        self._add_buf = torch.zeros(B, 1, 1, cap, dtype=dtype, device=dev).masked_fill(
            self._mask_buf[:, None, None, :] == 0, torch.finfo(dtype).min)
        self._padded = bool((lengths < L).any())
        self.mask = self._mask_buf[:, :L]

    def add(self, row_cache: DynamicCache) -> None:
        """Append one prefilled request (batch 1, no padding) as the last row."""
        new = _layers(row_cache)
        n = new[0][0].shape[-2]
        lengths = torch.tensor([n], device=new[0][0].device)
        rows = [(new, n)]
        if self.cache is not None:
            L = self.mask.shape[1]
            # the running rows as one block: their L used columns, right-aligned already
            rows.insert(0, ([(layer.keys, layer.values) for layer in self.cache.layers], L))
            lengths = torch.cat([self.lengths, lengths])
        self._build(rows, lengths)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into the current order), then trim shared padding."""
        if not rows:
            self.clear()
            return
        if rows == list(range(self.size)):
            return
        idx = torch.tensor(rows, device=self.lengths.device)
        lengths = self.lengths.index_select(0, idx)
        kept = [(layer.keys.index_select(0, idx), layer.values.index_select(0, idx)) for layer in self.cache.layers]
        self._build([(kept, int(lengths.max()))], lengths)

    @property
    def in_slabs(self) -> bool:
        """Every layer's KV is in preallocated slabs (`_SlabLayer`), which the C step writes into."""
        return self.cache is not None and all(isinstance(layer, _SlabLayer) for layer in self.cache.layers)

    def step_inputs(self, q: int = 1) -> dict:
        """Forward kwargs for one decode step of q tokens a row (the caller adds input_ids [B, q]);
        q > 1 only for a speculative verify, whose unaccepted columns `truncate` drops after."""
        assert self.cache is not None and self.mask is not None and self.lengths is not None
        L = self.mask.shape[1]  # used columns; this step writes columns L..L + q - 1
        if L + q > self._mask_buf.shape[1]:
            cap = _room(L + q)
            for layer in self.cache.layers:
                layer.grow(cap)
            self._mask_buf = F.pad(self._mask_buf, (0, cap - self._mask_buf.shape[1]), value=1)
            self._add_buf = F.pad(self._add_buf, (0, cap - self._add_buf.shape[3]), value=0.0)
        self.mask = self._mask_buf[:, :L + q]
        position_ids = self.lengths.unsqueeze(1) + torch.arange(q, device=self.lengths.device)
        self.lengths = self.lengths + q
        return {
            "past_key_values": self.cache,
            # no padding: the exact path of an unbatched generate step; else a ready 4D additive
            # mask [B, 1, 1, L + q] that HF uses as is
            "attention_mask": self._add_buf[:, :, :, :L + q] if self._padded else None,
            "position_ids": position_ids,
            "cache_position": torch.arange(L, L + q, device=self.mask.device),
            "use_cache": True,
        }

    def truncate(self, q: int) -> None:
        """Forget the last q columns of every row (a speculative verify's rejected tokens): they are
        written over by the next step."""
        if q <= 0:
            return
        L = self.mask.shape[1]
        if q >= L or bool((self.lengths <= q).any()):
            raise ValueError(f"cannot drop {q} of {L} columns")
        self.mask = self._mask_buf[:, :L - q]
        self.lengths = self.lengths - q
        for layer in self.cache.layers:
            layer.n -= q
            layer._view()

    def clear(self) -> None:
        self.cache = self.mask = self.lengths = self._mask_buf = self._add_buf = None
        self._padded = False
