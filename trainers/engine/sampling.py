"""Next-token choice and its logprob, for a batch of rows with per-row parameters.

The contract: which distribution a reported logprob belongs to (`LOGPROB_SPACES`).

- "sampled" (the local engine's default): the distribution the token was actually drawn
  from. Logits are divided by the temperature; top-k keeps every token whose scaled logit
  is >= the k-th largest; top-p then keeps every token whose probability (after top-k,
  renormalized) is >= that of the last token of the smallest descending-probability prefix
  whose mass reaches p (the top token is always kept); the logprob is the scaled logit
  minus the log-sum-exp over the kept tokens (`processed_logprobs`). Both filters compare
  values, so tied tokens are kept or dropped together and the kept set does not depend on
  a sort order: a trainer recomputing with the same function and the same parameters gets
  the same distribution.
- Greedy (temperature 0) samples a point mass on the argmax, a degenerate distribution with
  no importance ratio: trainers refuse such records (they say temperature 0). Its reported
  logprob is, in both spaces, SGLang's: `log_softmax(logits)` at temperature 1, a score of
  the token under the model, not a behaviour probability (`processed_logprobs` itself gives
  the point mass). top_k = 1 at a positive temperature is a point mass too and reports 0 in
  "sampled"; trainers refuse it as well.
- "tempered": `log_softmax(logits / temperature)` before top-p/top-k, over the whole
  vocabulary (raw logits when greedy). This is what SGLang reports by default; with top-p
  or top-k on it is not the sampling distribution, and a trainer can only recompute that
  same quantity. `EngineConfig.logprob_space = "tempered"` makes the local engine report it.

Without top-p/top-k the two spaces are the same numbers. The proxy records the space with
every call (`flags["sampling"]["logprobs"]`), the trainer recomputes in it
(`harnessrl.trainers.samples`), and `processed_logprobs` is the one implementation of the
"sampled" distribution both sides use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from harnessrl.trainers.engine import cpu_matvec

LogprobSpace = Literal["sampled", "tempered"]
LOGPROB_SPACES: tuple[str, ...] = ("sampled", "tempered")


@dataclass
class RowParams:
    """Sampling parameters of one row."""

    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    generator: torch.Generator | None = None


def processed_logprobs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                       top_k: torch.Tensor, always_keep: torch.Tensor | None = None) -> torch.Tensor:
    """[N, V] log-probabilities of the "sampled" distribution of each row (see module doc).

    `logits` [N, V] float; `temperature` [N] (0 = greedy), `top_p` [N] in (0, 1],
    `top_k` [N] long (-1 or >= V: off). Tokens outside the kept set get -inf. Rows without
    any filter are exactly `log_softmax(logits / temperature)`. `always_keep` [N] (token
    ids) forces one token per row into the kept set: a trainer scoring a token the engine
    did sample, whose own logits put it a float rounding outside the boundary, gets a finite
    logprob instead of -inf. Differentiable in `logits`; the kept set itself is not.
    """
    n, v = logits.shape
    greedy = temperature <= 0
    temps = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits.dtype)
    # x / 1 is x exactly: rows all at temperature 1 (the common case) skip a pass over [N, V]
    scaled = logits if bool((temps == 1).all()) else logits / temps[:, None]
    k_on = (top_k > 0) & (top_k < v)
    p_on = top_p < 1.0
    if not bool((greedy | k_on | p_on).any()):
        return torch.log_softmax(scaled, dim=-1)
    with torch.no_grad():
        s = scaled.detach()
        desc = torch.sort(s, dim=-1, descending=True).values
        idx = (top_k.clamp(min=1, max=v) - 1).to(torch.long)
        kth = torch.where(k_on, desc.gather(1, idx[:, None])[:, 0], torch.full_like(desc[:, 0], -torch.inf))
        kth = torch.where(greedy, desc[:, 0], kth)  # greedy: only the maximum survives
        desc = desc.masked_fill(desc < kth[:, None], -torch.inf)
        probs = torch.softmax(desc, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above
        n_keep = ((before < top_p.to(probs.dtype)[:, None]) | (torch.arange(v, device=s.device) == 0)).sum(-1)
        pth = desc.gather(1, (n_keep - 1)[:, None])[:, 0]
        threshold = torch.where(p_on & ~greedy, torch.maximum(pth, kth), kth)
        keep = s >= threshold[:, None]
        if always_keep is not None:
            keep[torch.arange(n, device=keep.device), always_keep] = True
    return torch.log_softmax(scaled.masked_fill(~keep, -torch.inf), dim=-1)


BLOCK = 1024
"""Tokens per block of the two-level inversion in `draw`."""


def block_sums(e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`e` [N, V] (unnormalized probabilities, >= 0) as blocks [N, nb, BLOCK] (zero-padded to a
    multiple of BLOCK) and the running sums of the blocks' totals [N, nb] in float64."""
    n, v = e.shape
    nb = -(-v // BLOCK)
    if nb * BLOCK != v:
        e = torch.nn.functional.pad(e, (0, nb * BLOCK - v))
    blocks = e.view(n, nb, BLOCK)
    return blocks, torch.cumsum(blocks.sum(-1, dtype=torch.float64), -1)


def draw(blocks: torch.Tensor, block_cdf: torch.Tensor, generator: torch.Generator) -> int:
    """One token from the distribution whose unnormalized probabilities are `blocks` [nb, BLOCK]
    (one row of `block_sums`), by inverting the running sums at one uniform draw of
    `generator`: the first token whose running sum (float64) exceeds u * total. The block is
    found from the blocks' running sums, then the token from that block's own: two short
    scans in place of one over the vocabulary (a float64 cumsum over 49k tokens took 0.31 ms
    a row on one CPU thread, more than the rest of a 4-row step's sampling). A token of
    probability 0 never is drawn (its running sum equals the one before it). One uniform per
    call, so a generator's state after n rows' draws does not depend on the vocabulary or
    the batch. (`torch.multinomial`, used first, took ~1.7 ms a row over 49k tokens.) `sample`
    uses it where the compiled `draw_rows` cannot be had (no C compiler, or
    HARNESSRL_CPU_MATVEC=0)."""
    total = float(block_cdf[-1])
    if not (math.isfinite(total) and total > 0):
        raise RuntimeError(f"invalid probability distribution (sum {total})")
    u = torch.rand((), generator=generator, dtype=torch.float64, device=block_cdf.device)
    target = u * total
    nb = block_cdf.shape[0]
    b = int(torch.searchsorted(block_cdf, target, right=True))
    if b >= nb:  # u * total rounded up to total: the last block of positive mass
        b = int(torch.searchsorted(block_cdf, block_cdf[-1], right=False))
    within = torch.cumsum(blocks[b], 0, dtype=torch.float64)
    if b:
        within += block_cdf[b - 1]
    j = int(torch.searchsorted(within, target, right=True))
    if j >= within.shape[0]:  # the block's own sums rounded below the target: its last positive token
        j = int(torch.searchsorted(within, within[-1], right=False))
    return b * BLOCK + j


def draw_rows(lib, table: torch.Tensor, generators: list[torch.Generator]) -> list[int]:
    """One token per row of `table` [N, V] (float32 log-probabilities, -inf where not kept) by the
    compiled inversion (`cpu_matvec`'s `harnessrl_draw_rows`): `draw`'s two-level inversion over
    the rows' exp, with each row's uniform drawn as `draw` draws it (one float64 from its generator,
    in row order), in one C call for all rows. The weights are the kernel's polynomial exp (within
    2 ulp of torch's), 0 below -87, so a token whose float sums sit within rounding of a boundary
    may differ from `draw`'s; the logprob reported for it is the table's either way. On a 4-row
    step over 49k tokens: ~0.05 ms against ~0.35 ms for exp, `block_sums` and four `draw`s."""
    t = table.detach().to(torch.float32).contiguous()
    n, v = t.shape
    us = torch.tensor([float(torch.rand((), generator=g, dtype=torch.float64)) for g in generators],
                      dtype=torch.float64)
    ids = torch.empty(n, dtype=torch.long)
    weights, block_cdf = torch.empty(v), torch.empty(v // BLOCK + 2, dtype=torch.float64)  # the C call's scratch
    lib.harnessrl_draw_rows(t.data_ptr(), n, v, us.data_ptr(), ids.data_ptr(), weights.data_ptr(),
                            block_cdf.data_ptr())
    out = ids.tolist()
    for k, token in enumerate(out):
        if token < 0:
            raise RuntimeError(f"invalid probability distribution (row {k}: its weights do not sum to a "
                               "finite positive number)")
    return out


def sample(logits: torch.Tensor, rows: list[RowParams], default_gen: torch.Generator,
           top_logprobs_num: int = 0, space: LogprobSpace = "sampled",
           ) -> tuple[list[int], list[float], list[list[tuple[float, int]]]]:
    """Pick one token per row of `logits` [B, V]; return ids, their logprobs in `space`, and
    top-n lists in the same space (tokens outside the kept set are left out of those).
    The reported logprobs are `processed_logprobs`' own float32 numbers, bit for bit, so a
    trainer recomputing them from the same logits gets the same values."""
    logits = logits.float()
    # A greedy row takes the argmax and reports SGLang's temperature-1 score: scored unfiltered at 1.
    temperature = torch.tensor([1.0 if r.temperature <= 0 else r.temperature for r in rows], dtype=logits.dtype)
    top_p = torch.tensor([1.0 if r.temperature <= 0 else r.top_p for r in rows], dtype=logits.dtype)
    top_k = torch.tensor([-1 if r.temperature <= 0 else r.top_k for r in rows], dtype=torch.long)
    table = processed_logprobs(logits, temperature, top_p, top_k)
    drawn = [i for i, r in enumerate(rows) if r.temperature > 0]
    ids: list[int] = logits.argmax(dim=-1).tolist() if len(drawn) < len(rows) else [0] * len(rows)
    if drawn:
        sub = table[drawn] if len(drawn) < len(rows) else table
        gens = [rows[i].generator or default_gen for i in drawn]  # in row order, one uniform each
        lib = cpu_matvec.load()
        if lib is not None:
            picked = draw_rows(lib, sub, gens)
        else:
            blocks, cdf = block_sums(sub.exp())
            picked = [draw(blocks[k], cdf[k], g) for k, g in enumerate(gens)]
        for k, i in enumerate(drawn):
            ids[i] = picked[k]
    if space == "tempered":  # SGLang's default: temperature applied, top-p/top-k not
        table = torch.log_softmax(logits / temperature[:, None], dim=-1)
    chosen = table[torch.arange(len(rows)), torch.tensor(ids)].tolist()
    tops: list[list[tuple[float, int]]] = []
    if top_logprobs_num > 0:
        values, indices = torch.topk(table, top_logprobs_num, dim=-1)
        tops = [[(lv, ix) for lv, ix in zip(v.tolist(), x.tolist()) if lv > -float("inf")]
                for v, x in zip(values, indices)]
    return ids, chosen, tops
