"""A float32 matrix-vector product that streams the weights: batch-1 CPU decode's kernel.

Why: a batch-1 decode step reads every weight once, so its speed is the speed at which the
matrix-vector products read memory. MKL's small `bmm` over `fast_decode`'s transposed copies
read them at ~12 GB/s on the 2-core dev VM, 0.69 of a read-only stream (17.3 GB/s); the plain
loop below (four weight rows at a time, each row read once, front to back, with AVX-512 where
the CPU has it) reads them at ~15.9 GB/s, 0.92 of it (measured side by side on the 121
products of a SmolLM2-135M step: 34 ms vs 42-53 ms). `bench/engine_throughput.py` prints the
decode step with and without it.

Rounding is `fast_decode._mm`'s: the rows are summed in chunks of `chunk` in order, each
chunk's partial sum then added to the output, so the error stays at or below `F.linear`'s
(against a float64 product: 1.1e-5 here, 1.7e-5 for `_mm`, 2.5e-5 for `F.linear`), and no
fused multiply-add changes it (`-ffp-contract=off`).

It is C, compiled at first use with the machine's C compiler (`cc`, `-march=native`: the
library is built for the CPU it runs on) into `<harnessrl home>/kernels/`, named by a hash of
the source, the flags, the compiler's version and the CPU's flags, and loaded with ctypes.
Single-threaded: `fast_decode` uses it where the step runs on one thread and keeps MKL
(multi-threaded) otherwise. No compiler, or a build that fails: `load()` returns None,
says why once in the log, and decoding keeps `_mm`. `HARNESSRL_CPU_MATVEC=0` turns it off.
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

log = logging.getLogger("harnessrl.engine")

SOURCE = r"""
/* y[n] = sum over chunks of rows (in order) of (sum over the chunk's rows i of x[i] * w[i, :]).
   w row-major [k, n]; acc: scratch of n floats. */
void harnessrl_matvec(const float *x, const float *w, float *y, float *acc, long k, long n, long chunk) {
    for (long j = 0; j < n; j++) y[j] = 0.f;
    for (long c0 = 0; c0 < k; c0 += chunk) {
        long c1 = c0 + chunk < k ? c0 + chunk : k;
        for (long j = 0; j < n; j++) acc[j] = 0.f;
        long i = c0;
        for (; i + 4 <= c1; i += 4) {
            const float *w0 = w + i * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
            const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3];
            for (long j = 0; j < n; j++) acc[j] += a0 * w0[j] + a1 * w1[j] + a2 * w2[j] + a3 * w3[j];
        }
        for (; i < c1; i++) {
            const float *w0 = w + i * n;
            const float a0 = x[i];
            for (long j = 0; j < n; j++) acc[j] += a0 * w0[j];
        }
        for (long j = 0; j < n; j++) y[j] += acc[j];
    }
}
"""

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
        subprocess.run([cc, *flags, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(lib, out)


@lru_cache(maxsize=1)
def load():
    """The compiled kernel (a ctypes function), or None when it cannot be had here."""
    if os.environ.get("HARNESSRL_CPU_MATVEC", "1") == "0":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("cpu_matvec: no C compiler; batch-1 decode keeps MKL's products")
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.info("cpu_matvec: %s --version failed (%s); batch-1 decode keeps MKL's products", cc, e)
        return None
    errors = []
    for flags in FLAGS:
        key = hashlib.sha256("\0".join([SOURCE, " ".join(flags), version, _cpu_flags()]).encode()).hexdigest()[:16]
        path = _kernels_dir() / f"matvec-{key}.so"
        try:
            if not path.is_file():
                _build(cc, flags, path)
            fn = ctypes.CDLL(str(path)).harnessrl_matvec
        except (OSError, subprocess.SubprocessError) as e:
            errors.append(f"{' '.join(flags)}: {getattr(e, 'stderr', None) or e}")
            continue
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 3
        fn.restype = None
        return fn
    log.warning("cpu_matvec: could not build the kernel (%s); batch-1 decode keeps MKL's products",
                "; ".join(errors)[:2000])
    return None


class MatVec:
    """`x [1, 1, k] @ w [k, n]` (float32, contiguous, `w` a `fast_decode._chunked` copy: its
    memory is the `[k, n]` rows) -> [1, 1, n], by the compiled kernel. One per decoder: it owns
    the scratch buffer, so it is not for two threads at once."""

    def __init__(self, fn):
        self.fn = fn
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
