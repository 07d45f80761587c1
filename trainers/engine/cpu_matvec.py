"""Small-batch CPU decode in C, built and loaded: `load()` compiles the kernel of `cpu_kernel`
(a float32 matrix-vector product that streams the weights, and a whole decode step built on
it) and wraps its functions for torch tensors (`MatVec`, `DecodeStep`). Why the kernel is
written as it is, and what it computes, is `cpu_kernel`'s docstring.

Compiled at first use with the machine's C compiler (`cc`, `-march=native`: built for the CPU
it runs on) into `<harnessrl home>/kernels/`, named by a hash of the source, the flags, the
compiler's version and the CPU's flags, and loaded with ctypes. Single-threaded: `fast_decode`
uses it for up to `fast_decode.C_ROWS` rows when the step runs on one torch thread
(`EngineConfig.cpu_matvec` "auto") and keeps MKL (multi-threaded) otherwise. No compiler, or a
build that fails: `load()` returns None, says why in the log, and decoding keeps the Python
step. `HARNESSRL_CPU_MATVEC=0` turns it off.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from harnessrl.trainers.engine.cpu_kernel import SOURCE

log = logging.getLogger("harnessrl.engine")

FLAGS = (["-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off"],
         ["-O3", "-march=native", "-ffp-contract=off"])
"""Tried in order (the first for compilers that know the vector-width option)."""


def _kernels_dir() -> Path:
    from harnessrl.adapters.toolchain import harnessrl_home

    return harnessrl_home() / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def _build(cc: str, flags: list[str], out: Path) -> None:
    """Compile SOURCE to `out`, atomically (concurrent builders each write their own file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src, lib = Path(tmp) / "matvec.c", Path(tmp) / out.name
        src.write_text(SOURCE)
        subprocess.run([cc, *flags, "-shared", "-fPIC", str(src), "-o", str(lib), "-lm"], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(lib, out)


@lru_cache(maxsize=4)
def load(defines: tuple[str, ...] = ()):
    """The compiled library (ctypes; `harnessrl_matvec`, `harnessrl_decode_rows`, `harnessrl_draw_rows`), or None when it
    cannot be had here. `defines`: extra `-D` flags (a test builds the scalar attention with
    ("HARNESSRL_SCALAR_ATTENTION",) to compare it with the vectorized one)."""
    if os.environ.get("HARNESSRL_CPU_MATVEC", "1") == "0":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("cpu_matvec: no C compiler; batch-1 decode keeps the torch step")
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.info("cpu_matvec: %s --version failed (%s); batch-1 decode keeps the torch step", cc, e)
        return None
    errors = []
    for flags in FLAGS:
        flags = [*flags, *(f"-D{d}" for d in defines)]
        key = hashlib.sha256("\0".join([SOURCE, " ".join(flags), version, _cpu_flags()]).encode()).hexdigest()[:16]
        path = _kernels_dir() / f"matvec-{key}.so"
        try:
            if not path.is_file():
                _build(cc, flags, path)
            lib = ctypes.CDLL(str(path))
            mv, step, draw = lib.harnessrl_matvec, lib.harnessrl_decode_rows, lib.harnessrl_draw_rows
        except (OSError, AttributeError, subprocess.SubprocessError) as e:
            errors.append(f"{' '.join(flags)}: {getattr(e, 'stderr', None) or e}")
            continue
        mv.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3
        step.argtypes = [ctypes.c_long] * 2 + [ctypes.c_void_p] * 13 + [ctypes.c_long] + [ctypes.c_void_p] * 2 \
            + [ctypes.c_long] * 7 + [ctypes.c_float] * 2 + [ctypes.c_void_p] * 2
        draw.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * 4
        mv.restype = step.restype = draw.restype = None
        return lib
    log.warning("cpu_matvec: could not build the kernel (%s); batch-1 decode keeps the torch step",
                "; ".join(errors)[:2000])
    return None


class MatVec:
    """The kernel's product on its own (the decode step calls the same C function; its test
    checks the rounding here): `x [1, 1, k] @ w [k, n]` (float32, contiguous, `w` a
    `fast_decode._chunked` copy: its memory is the `[k, n]` rows) -> [1, 1, n]. It owns a
    scratch buffer, so it is not for two threads at once."""

    def __init__(self, lib):
        self.fn = lib.harnessrl_matvec
        self._acc = torch.empty(0)

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        n = w.shape[-1]
        k = w.numel() // n
        chunk = w.shape[-2] if w.dim() == 3 else k  # a chunked copy's rows per chunk
        if x.dtype != torch.float32 or w.dtype != torch.float32 or x.numel() != k:
            raise ValueError(f"matvec wants float32 x of {k} values and w [{k}, {n}]: got x {tuple(x.shape)} "
                             f"{x.dtype}, w {tuple(w.shape)} {w.dtype}")
        if not w.is_contiguous():
            raise ValueError("matvec wants a contiguous w")
        x = x.contiguous()
        if self._acc.numel() < n:
            self._acc = torch.empty(n)
        y = torch.empty(1, 1, n)
        self.fn(x.data_ptr(), w.data_ptr(), y.data_ptr(), self._acc.data_ptr(), k, n, chunk)
        return y


def _ptrs(tensors) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


class DecodeStep:
    """A whole decode step in C (`harnessrl_decode_rows`): the layers' norms, products, rope,
    attention over the KV buffers and MLP in one call, where Python would issue ~40 small torch
    ops a layer (~16 ms of a ~56 ms SmolLM2 step). Built from a `FastDecoder`'s copies (`bind`
    after every `refresh`); `__call__` takes the embeddings [rows, hidden] of `rows` consecutive
    tokens of one sequence, their cos/sin [rows, d], the layers' KV buffers [1, n_kv, cap, d] and
    the first token's position, writes their keys and values there, and returns their logits
    [rows, vocab]: one token is a plain decode step, more a speculative verify whose every row
    equals the one-row step's logits bit for bit (the kernel's contract)."""

    def __init__(self, lib, dec):
        self.fn = lib.harnessrl_decode_rows
        self.dec = dec
        self._key = None
        self._scratch = torch.empty(0)

    def bind(self) -> None:
        dec = self.dec
        fused = dec._fused
        if self._key == dec.generation:
            return
        inner = dec.model.model
        self._keep = [w for f in fused for w in f]  # the arrays below point into these
        self._w = [_ptrs([f[i] for f in fused]) for i in range(4)]
        self._ln1 = _ptrs([layer.input_layernorm.weight for layer in dec._layers])
        self._ln2 = _ptrs([layer.post_attention_layernorm.weight for layer in dec._layers])
        self._fnorm, self._head = inner.norm.weight, dec._head_t
        self.eps = float(dec._layers[0].input_layernorm.variance_epsilon)
        self._key = dec.generation

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kbufs: list[torch.Tensor],
                 vbufs: list[torch.Tensor], start: list[int], col: list[int], one_sequence: bool) -> torch.Tensor:
        """Logits [rows, vocab] of `rows` tokens (embeddings h [rows, hidden], cos/sin [rows, d]).
        `one_sequence`: the rows are consecutive tokens of the one sequence in kbufs/vbufs
        [1, n_kv, cap, d] (a verify: row r at column col[r] = col[0] + r, start 0); else row r is
        the next token of batch row r of kbufs/vbufs [rows, n_kv, cap, d], written at col[r] and
        attending over its columns start[r]..col[r]."""
        dec = self.dec
        hidden, inter, d = h.shape[-1], dec.inter, dec.head_dim
        rows = h.numel() // hidden
        n_q, n_kv = dec.n_q // d, dec.n_kv // d
        vocab, cap = self._head.shape[-1], kbufs[0].shape[-2]
        kb = kbufs[0]
        if (len(start) != rows or len(col) != rows or cos.numel() != rows * d or sin.numel() != rows * d
                or max(col) >= cap or any(s < 0 or s > c for s, c in zip(start, col))
                or kb.shape[0] != (1 if one_sequence else rows) or not kb.is_contiguous()):
            raise ValueError(f"decode step of {rows} rows: start {start}, col {col}, cap {cap}, "
                             f"KV {tuple(kb.shape)}, cos/sin {cos.numel()}/{sin.numel()}")
        if one_sequence:
            span = rows * (col[-1] + 1)
        else:
            span = max(c - s + 1 for s, c in zip(start, col))
        # x, qkv, att, gu, act (rows each), scores (group * span), then the products' scratch:
        # rows times the widest product's output
        need = rows * (hidden + dec.n_q + 2 * dec.n_kv + dec.n_q + 3 * inter) + (n_q // n_kv) * span \
            + rows * max(vocab, 2 * inter, dec.n_q + 2 * dec.n_kv, hidden)
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need + 4096)
        h = h.reshape(-1).contiguous().clone()
        cos, sin = cos.reshape(-1).contiguous(), sin.reshape(-1).contiguous()
        starts, cols = (ctypes.c_long * rows)(*start), (ctypes.c_long * rows)(*col)
        logits = torch.empty(rows, vocab)
        self.fn(rows, len(kbufs), h.data_ptr(), cos.data_ptr(), sin.data_ptr(), *self._w, self._ln1, self._ln2,
                self._fnorm.data_ptr(), self._head.data_ptr(), _ptrs(kbufs), _ptrs(vbufs), cap, starts, cols,
                0 if one_sequence else kb[0].numel(), n_q, n_kv, d, hidden, inter, vocab, self.eps,
                float(dec.scaling), logits.data_ptr(), self._scratch.data_ptr())
        return logits
