"""One decode step of a Llama-style model, without HF's per-layer Python, on `kv.BatchKV`.

Why: at batch 1 on CPU, 85% of a step is the weight matmuls, and MKL's matrix-vector
product over HF's `[out, in]` weight layout (`F.linear`) reads weights at ~half the
speed of the same product over `[in, out]` rows (`x @ W_t`). So for small batches this
module multiplies by fused, transposed copies: one `[hidden, q+k+v]` matrix per layer's
attention input, one `[hidden, 2 * intermediate]` for gate and up, `o` and `down`
transposed, and the (tied) output head transposed; larger batches use the model's own
weights (`F.linear`, MKL's faster layout at 16 rows). On a single thread, batches of up to
`C_ROWS` rows run the whole step in C (`cpu_matvec`: the same operations on the
same copies, read ~1.3x faster than MKL's small `bmm`, once for all rows, and without ~40 torch
ops a layer) when it could be built; a single row can also verify a speculative draft in one C
pass (`verify`).
Either way the step is the same
sequence of operations as HF's `LlamaDecoderLayer` (RMSNorm in float32, HF's rotary
embedding and `apply_rotary_pos_emb`, SDPA over the grouped KV heads as
`engine.attention` does, residuals), so outputs equal HF's to float rounding (tests:
greedy ids equal HF generate's, logprobs within 1e-5 in float32).

Contract: the copies follow the model's weights. Before each step every source
parameter's `(data_ptr, _version)` is compared with the copy's; torch bumps `_version` on
every in-place write (`load_state_dict`, an optimizer step), so any change to the weights,
through `/update_weights_from_disk` or otherwise, rebuilds the copies before they are used.

Supported: `model_type` llama (SmolLM2, TinyLlama, Llama 2/3 shapes) on CPU, no biases,
SiLU MLP; `FastDecoder.build` returns None for anything else and the engine keeps HF's
forward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harnessrl.trainers.engine import cpu_matvec

CHUNK = 64
"""Rows of a transposed weight summed serially before the partial sums are added (see `_mm`)."""

SMALL_BATCH = 4
"""Batches of at most this many rows multiply by the transposed copies; larger ones by the
model's own weights (measured: transposed is ~1.3x faster at 1 row, ~1.1x slower at 16)."""

C_ROWS = 8
"""Batches of at most this many rows step whole in C when the kernel is on (`uses_c_step`): its
products read the weights once for all rows, and each row attends over its own columns only (no
padding read). Measured on one thread, SmolLM2-135M: 93 vs 240 ms at 4 rows, 98 vs 166 ms at 8
(MKL's `F.linear`), 232 vs 368 ms at 16; tiny-llama ties at 16, where MKL keeps the step.
On an AMD EPYC VM (AVX2, slower memory: 66-72 ms at 1 row), after the products read the weights
in the one-row pattern (`cpu_matvec.matvec_rows`), two interleaved runs: 2 rows 76.5 / 81.2 ms
(before: 118.8 / 105.9), 4 rows 92.7 / 88.0 (145.6 / 142.7), 8 rows 148.6 / 136.0 (194.2 / 193.1)."""


def _supported(model) -> bool:
    cfg = model.config
    return (getattr(cfg, "model_type", None) == "llama" and model.device.type == "cpu"
            and not getattr(cfg, "attention_bias", False) and not getattr(cfg, "mlp_bias", False)
            and getattr(cfg, "hidden_act", "silu") == "silu" and getattr(cfg, "pretraining_tp", 1) == 1)


def _chunked(w: torch.Tensor) -> torch.Tensor:
    """`w` [out, in] as a contiguous transposed copy [in // CHUNK, CHUNK, out] (one chunk if `in`
    is not a multiple of CHUNK)."""
    k = w.shape[1]
    c = k // CHUNK if k % CHUNK == 0 else 1
    return w.t().contiguous().view(c, k // c, w.shape[0])


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [B, 1, in] @ a `_chunked` weight -> [B, 1, out]. Each chunk's product reads its rows of
    `w` in order (the fast matrix-vector layout), and the chunks' partial sums are added after:
    a product over all `in` rows at once would accumulate every output serially, which in
    float32 rounds ~3x worse than `F.linear`; by chunks it rounds as well or better."""
    B = x.shape[0]
    c, k, n = w.shape
    return torch.bmm(x.reshape(B, c, k).transpose(0, 1), w).sum(0).view(B, 1, n)


class FastDecoder:
    """`step(input_ids [B, 1], kv)` -> logits [B, vocab] of the model's next token per row; writes
    each layer's new key/value column into `kv`'s buffers as HF's forward would."""

    def __init__(self, model, matvec: str = "auto"):
        """`matvec`: "auto" runs steps of up to `C_ROWS` rows in C (`cpu_matvec`) when they run on one torch
        thread (the C step is single-threaded; MKL spreads over more), "on" always (when the
        library could be built), "off" never."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.model = model
        self._rope = apply_rotary_pos_emb
        inner = model.model
        self._layers = list(inner.layers)
        attn = self._layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.n_q = model.config.num_attention_heads * self.head_dim
        self.n_kv = model.config.num_key_value_heads * self.head_dim
        self.inter = model.config.intermediate_size
        self._sources = [p for p in model.parameters()]
        self._key: list[tuple[int, int]] | None = None
        self._fused: list[tuple[torch.Tensor, ...]] = []
        self._head_t: torch.Tensor | None = None
        self.generation = 0
        """Bumped whenever the copies are rebuilt (`cpu_matvec.DecodeStep` re-binds to the new ones)."""
        self.c_steps = 0
        """Steps taken whole in C (`_step_c`)."""
        if matvec not in ("auto", "on", "off"):
            raise ValueError(f"matvec must be 'auto', 'on' or 'off', not {matvec!r}")
        self.matvec_mode = matvec
        lib = None if matvec == "off" or model.dtype != torch.float32 else cpu_matvec.load()
        self._c_step = cpu_matvec.DecodeStep(lib, self) if lib is not None else None

    @classmethod
    def build(cls, model, matvec: str = "auto") -> "FastDecoder | None":
        return cls(model, matvec) if _supported(model) else None

    def uses_c_step(self, rows: int) -> bool:
        """Whether a step of `rows` rows on this thread runs in C (the compiled library)."""
        return (rows <= C_ROWS and self._c_step is not None
                and (self.matvec_mode == "on" or torch.get_num_threads() == 1))

    def _current(self) -> list[tuple[int, int]]:
        return [(p.data_ptr(), p._version) for p in self._sources]

    def refresh(self) -> None:
        """Rebuild the transposed copies if any weight changed since they were made."""
        key = self._current()
        if key == self._key:
            return
        with torch.no_grad():
            self._fused = []
            for layer in self._layers:
                a, m = layer.self_attn, layer.mlp
                self._fused.append((
                    _chunked(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                    _chunked(a.o_proj.weight),
                    _chunked(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
                    _chunked(m.down_proj.weight),
                ))
            self._head_t = _chunked(self.model.lm_head.weight)
        self._key = key
        self.generation += 1

    def _step_c(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, lengths: list[int]) -> torch.Tensor:
        """The whole step in C (`cpu_matvec.DecodeStep`): row r's token is written at the next
        column of the slabs and attends over its own `lengths[r]` columns before it and itself."""
        n = cache.layers[0].n  # every layer holds the same columns; the step writes column n of each
        return self._run_c(h, cos, sin, cache, 1, [n - k for k in lengths], [n] * len(lengths), False)

    def _run_c(self, h, cos, sin, cache, q: int, start: list[int], col: list[int], one_sequence: bool) -> torch.Tensor:
        """Reserve q columns in every layer's slabs, run the C step (rows attend over
        [start[r], col[r]] and write column col[r]), then count the q columns as written."""
        layers = cache.layers
        for layer in layers:
            layer.reserve(q)
        self._c_step.bind()
        logits = self._c_step(h, cos, sin, [layer.k_buf for layer in layers], [layer.v_buf for layer in layers],
                              start, col, one_sequence=one_sequence)
        for layer in layers:
            layer.advance(q)
        self.c_steps += 1
        return logits

    def can_verify(self, kv) -> bool:
        """Whether `verify` can run on `kv` now: one unpadded row in slabs, and the C step on."""
        return (kv.size == 1 and not kv._padded and self.uses_c_step(1)
                and kv.in_slabs)

    @torch.no_grad()
    def verify(self, tokens: list[int], kv) -> torch.Tensor:
        """Feed `tokens` at the next len(tokens) positions of `kv`'s one row in one pass of the C
        step; returns their logits [T, vocab], row t being bit for bit what a one-row `step` of
        tokens[t] after tokens[:t] returns (the kernel computes every row as a one-row step, and
        each row's embedding and cos/sin are taken here exactly as `step` takes them). All T
        columns are written; the caller drops the ones it rejects (`kv.truncate`)."""
        T = len(tokens)
        inputs = kv.step_inputs(T)
        positions = inputs["position_ids"][0].tolist()
        cache = inputs["past_key_values"]
        self.refresh()
        inner = self.model.model
        h = inner.embed_tokens(torch.tensor([tokens]))  # [1, T, H]
        cs = [inner.rotary_emb(h[:, t:t + 1], torch.tensor([[p]])) for t, p in enumerate(positions)]
        cos, sin = torch.cat([c for c, _ in cs], dim=1), torch.cat([s for _, s in cs], dim=1)
        n = cache.layers[0].n
        return self._run_c(h, cos, sin, cache, T, [0] * T, list(range(n, n + T)), True)

    @staticmethod
    def _norm(x: torch.Tensor, norm) -> torch.Tensor:
        # HF's LlamaRMSNorm, operation for operation
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * h.to(x.dtype)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, kv) -> torch.Tensor:
        inputs = kv.step_inputs()
        mask, position_ids = inputs["attention_mask"], inputs["position_ids"]
        cache = inputs["past_key_values"]
        B = input_ids.shape[0]
        small = B <= SMALL_BATCH
        in_c = self.uses_c_step(B) and kv.in_slabs
        if small or in_c:
            self.refresh()
        inner = self.model.model
        h = inner.embed_tokens(input_ids)  # [B, 1, H]
        cos, sin = inner.rotary_emb(h, position_ids)
        if in_c:  # each row's own columns: its real length before this step (padding is never read)
            return self._step_c(h, cos, sin, cache, position_ids[:, 0].tolist())
        nq, nkv, d = self.n_q, self.n_kv, self.head_dim
        for i, layer in enumerate(self._layers):
            a, m = layer.self_attn, layer.mlp
            x = self._norm(h, layer.input_layernorm)
            if small:
                wqkv, wo, wgu, wd = self._fused[i]
                qkv = _mm(x, wqkv)
                q, k, v = qkv[..., :nq], qkv[..., nq:nq + nkv], qkv[..., nq + nkv:]
            else:
                q, k, v = F.linear(x, a.q_proj.weight), F.linear(x, a.k_proj.weight), F.linear(x, a.v_proj.weight)
            q = q.view(B, 1, -1, d).transpose(1, 2)
            k = k.view(B, 1, -1, d).transpose(1, 2)
            v = v.view(B, 1, -1, d).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            keys, values = cache.layers[i].update(k, v)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling,
                                               enable_gqa=keys.shape[1] != q.shape[1])
            o = o.transpose(1, 2).reshape(B, 1, -1)
            h = h + (_mm(o, wo) if small else F.linear(o, a.o_proj.weight))
            x = self._norm(h, layer.post_attention_layernorm)
            if small:
                gu = _mm(x, wgu)
                x = _mm(F.silu(gu[..., :self.inter]) * gu[..., self.inter:], wd)
            else:
                x = F.linear(F.silu(F.linear(x, m.gate_proj.weight)) * F.linear(x, m.up_proj.weight),
                             m.down_proj.weight)
            h = h + x
        h = self._norm(h, inner.norm)
        return (_mm(h, self._head_t) if small else F.linear(h, self.model.lm_head.weight))[:, -1, :]
