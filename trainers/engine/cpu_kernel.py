"""Small-batch CPU decode in C: a float32 matrix-vector product that streams the weights, and a
whole decode step built on it (one row, a few rows of a batch, or a speculative verify).

Why: a batch-1 decode step reads every weight once, so it can go no faster than memory can
be read. Two things kept `fast_decode`'s Python step well below that on the 2-core dev VM:
- MKL's small `bmm` over the transposed copies read them at 10-13 GB/s; the plain loop
  `harnessrl_matvec` (eight weight rows a pass, each row read once, front to back, AVX-512
  where the CPU has it) reads them at 14.6-17.0 GB/s in interleaved runs on the 121 products
  of a SmolLM2-135M step (32-37 ms vs 42-53 ms; the VM's bandwidth moves between runs);
- around the products, ~40 small torch ops a layer (norms, rope, attention, MLP glue, the KV
  write) cost ~16 ms of a ~56 ms step. `harnessrl_decode_rows` does the whole step (every
  layer, the final norm and the head) in one call: the step is then the products + ~2 ms.
`bench/engine_throughput.py` prints the step with and without them ("new" vs "new-mkl").
Since then:
- attention is vectorized without reassociating anything implicitly (16-lane dot products and
  max/sum reductions written out, a polynomial exp in plain arithmetic) and reads each key and
  value once per kv head for all its query heads: a SmolLM2 step at 5,000 tokens of context
  went from 88.9 to 55.8 ms (at 200 tokens ~37 ms either way);
- then its scores are taken 16 positions at a time (`dot16`: the lanes of 16 dot products added
  by a transposed tree made of `dot`'s own adds) and its weighted sum keeps the outputs in
  registers (`wsum`), with every result unchanged bit for bit: one kv head of tiny-llama over
  2,000 positions 0.043 -> 0.012 ms, of SmolLM2 over 3,000 0.137 -> 0.058 ms (interleaved, on
  the AMD EPYC VM with AVX-512); the step's attention is a row's largest cost beside the head
  at the async bench's contexts (each row attends over its own);
- the step takes several rows (`harnessrl_decode_rows`): a batch's rows, each attending over
  its own columns only, or consecutive tokens of one sequence (a speculative verify). Products
  of several rows read each weight tile once for all of them (`matvec_rows`) and sum every
  output in exactly the one-row order, so a row's logits do not depend on the rows beside it:
  a verify's row t equals the one-row step at its position bit for bit (test_speculative).

Same operations in the same order as `fast_decode.FastDecoder.step` (HF's `LlamaDecoderLayer`):
RMSNorm in float32, HF's cos/sin (computed by the model's rotary embedding and passed in), the
rope of `apply_rotary_pos_emb`, softmax attention over the grouped KV heads, SiLU MLP,
residuals. Products sum the rows in chunks of `fast_decode.CHUNK` (as `_mm` does), each
chunk's partial then added to the output, so their error stays at or below `F.linear`'s
(against a float64 product: ~1.1e-5 vs 1.7e-5 for `_mm` and 2.5e-5 for `F.linear`), and no
fused multiply-add is contracted (`-ffp-contract=off`). Tests (test_engine_fast_decode): greedy
ids equal HF `generate`'s, logprobs within 1e-5 of HF's forward, across joins, leaves, an abort,
a retract and weights changed in place, with batches of 1 to 7 rows (padded) stepped in C.

This module is the C source alone (`SOURCE`); `cpu_matvec` compiles it, loads it and wraps its
functions for torch tensors.
"""

SOURCE = r"""
#include <math.h>

/* y[n] = sum over chunks of rows (in order) of (sum over the chunk's rows i of x[i] * w[i, :]).
   w row-major [k, n]; acc: scratch of n floats. */
void harnessrl_matvec(const float *x, const float *w, float *y, float *acc, long k, long n, long chunk) {
    for (long j = 0; j < n; j++) y[j] = 0.f;
    for (long c0 = 0; c0 < k; c0 += chunk) {
        long c1 = c0 + chunk < k ? c0 + chunk : k;
        for (long j = 0; j < n; j++) acc[j] = 0.f;
        long i = c0;
        for (; i + 8 <= c1; i += 8) {  /* eight rows a pass: fewer passes over acc, one forward stream */
            const float *w0 = w + i * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n,
                        *w4 = w3 + n, *w5 = w4 + n, *w6 = w5 + n, *w7 = w6 + n;
            const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3],
                        a4 = x[i + 4], a5 = x[i + 5], a6 = x[i + 6], a7 = x[i + 7];
            for (long j = 0; j < n; j++)
                acc[j] += ((a0 * w0[j] + a1 * w1[j]) + (a2 * w2[j] + a3 * w3[j]))
                          + ((a4 * w4[j] + a5 * w5[j]) + (a6 * w6[j] + a7 * w7[j]));
        }
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

static long chunk_of(long k) { return k % 64 == 0 ? 64 : k; }  /* fast_decode._chunked's rows per chunk */

#define TILE 256  /* output columns of a multi-row product kept hot while every row uses them */

/* Y[r, :] = harnessrl_matvec(X[r, :], w) for each of the rows, each output summed in exactly that
   function's order (same chunks, same eight/four/one-row groups, same expression), so a row's
   result does not depend on how many rows are multiplied with it. w is read from memory once,
   in the one-row kernel's pattern (a group of eight weight rows front to back, eight streams),
   each TILE columns of the group used by every row while they are hot. acc: rows * n floats. */
static void matvec_rows(const float *X, const float *w, float *Y, float *acc, long rows, long k, long n,
                        long chunk) {
    if (rows == 1) { harnessrl_matvec(X, w, Y, acc, k, n, chunk); return; }
    for (long j = 0; j < rows * n; j++) Y[j] = 0.f;
    for (long c0 = 0; c0 < k; c0 += chunk) {
        long c1 = c0 + chunk < k ? c0 + chunk : k;
        for (long j = 0; j < rows * n; j++) acc[j] = 0.f;
        long i = c0;
        for (; i + 8 <= c1; i += 8) {
            const float *w0 = w + i * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n,
                        *w4 = w3 + n, *w5 = w4 + n, *w6 = w5 + n, *w7 = w6 + n;
            for (long j0 = 0; j0 < n; j0 += TILE) {
                const long j1 = j0 + TILE < n ? j0 + TILE : n;
                for (long r = 0; r < rows; r++) {
                    const float *x = X + r * k;
                    float *a = acc + r * n;
                    const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3],
                                a4 = x[i + 4], a5 = x[i + 5], a6 = x[i + 6], a7 = x[i + 7];
                    for (long j = j0; j < j1; j++)
                        a[j] += ((a0 * w0[j] + a1 * w1[j]) + (a2 * w2[j] + a3 * w3[j]))
                                + ((a4 * w4[j] + a5 * w5[j]) + (a6 * w6[j] + a7 * w7[j]));
                }
            }
        }
        for (; i + 4 <= c1; i += 4) {
            const float *w0 = w + i * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
            for (long j0 = 0; j0 < n; j0 += TILE) {
                const long j1 = j0 + TILE < n ? j0 + TILE : n;
                for (long r = 0; r < rows; r++) {
                    const float *x = X + r * k;
                    float *a = acc + r * n;
                    const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3];
                    for (long j = j0; j < j1; j++) a[j] += a0 * w0[j] + a1 * w1[j] + a2 * w2[j] + a3 * w3[j];
                }
            }
        }
        for (; i < c1; i++) {
            const float *w0 = w + i * n;
            for (long j0 = 0; j0 < n; j0 += TILE) {
                const long j1 = j0 + TILE < n ? j0 + TILE : n;
                for (long r = 0; r < rows; r++) {
                    const float a0 = X[r * k + i];
                    float *a = acc + r * n;
                    for (long j = j0; j < j1; j++) a[j] += a0 * w0[j];
                }
            }
        }
        for (long j = 0; j < rows * n; j++) Y[j] += acc[j];
    }
}

/* HF's LlamaRMSNorm in float32: w * (x * rsqrt(mean(x^2) + eps)) */
static void rms_norm(const float *x, const float *w, float *out, long n, float eps) {
    float ss = 0.f;
    for (long j = 0; j < n; j++) ss += x[j] * x[j];
    const float r = 1.f / sqrtf(ss / (float)n + eps);
    for (long j = 0; j < n; j++) out[j] = w[j] * (x[j] * r);
}

/* HF's apply_rotary_pos_emb on one head of d values: x * cos + rotate_half(x) * sin */
static void rope(float *x, const float *cos, const float *sin, long d) {
    const long h = d / 2;
    for (long j = 0; j < h; j++) {
        const float a = x[j], b = x[j + h];
        x[j] = a * cos[j] - b * sin[j];
        x[j + h] = b * cos[j + h] + a * sin[j + h];
    }
}

#define LANES 16  /* partial sums of a dot product (one vector register of AVX-512) */

/* a . b over d values: when d is a multiple of LANES, LANES partial sums (lane l takes j = l mod
   LANES) added pairwise at the end; a serial sum otherwise. Vectorized without reassociating: the
   order is written out, so every build rounds the same way. */
static inline float dot(const float *a, const float *b, long d) {
    if (d % LANES != 0) {
        float s = 0.f;
        for (long j = 0; j < d; j++) s += a[j] * b[j];
        return s;
    }
    float s[LANES];
    for (int l = 0; l < LANES; l++) s[l] = a[l] * b[l];
    for (long j = LANES; j < d; j += LANES)
        for (int l = 0; l < LANES; l++) s[l] += a[j + l] * b[j + l];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) s[l] += s[l + w];
    return s[0];
}

/* exp(x) for x <= 0 (a softmax's shifted scores), Cephes' expf in plain arithmetic so that loops
   over it vectorize: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its degree-7 polynomial, times 2^n
   built in the exponent bits. Within 2 ulp of exp; below -87 it returns exp(-87) ~ 1.6e-38, which
   no softmax sum of at least 1 can see. */
static inline float exp_le0(float x) {
    x = x < -87.f ? -87.f : x;
    const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    const int e = ((int)n + 127) << 23;
    float s;
    __builtin_memcpy(&s, &e, sizeof s);
    return p * s;
}

/* Vectorized attention without changing a bit of it (where the compiler has
   __builtin_shufflevector; else, or built with -DHARNESSRL_SCALAR_ATTENTION as a test does to
   compare, the scalar loops below run):
   - dot16: the scores of 16 consecutive positions at once. Each position's 16 lanes of products
     are formed as `dot` forms them; the lanes of the 16 positions are then added by a transposed
     tree (two vectors' halves shuffled together and added, four times over) whose every add is
     one of `dot`'s own tree (lane l + lane l + w, w = 8, 4, 2, 1), so each score equals `dot`'s
     bit for bit, for ~3 vector operations a score instead of a horizontal sum each. Positions go
     in bit-reversed order, which the tree's shuffles reverse again.
   - wsum: a query's weighted sum of values with the d outputs held in registers across positions
     (the scalar loop kept them in memory: a store and a load per position), same adds in the
     same order. */
#if LANES == 16 && !defined(HARNESSRL_SCALAR_ATTENTION) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
typedef float v16f __attribute__((vector_size(64)));
#define SHUF __builtin_shufflevector
static inline v16f red8(v16f x, v16f y) {
    return SHUF(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
         + SHUF(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}
static inline v16f red4(v16f x, v16f y) {
    return SHUF(x, y, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
         + SHUF(x, y, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
}
static inline v16f red2(v16f x, v16f y) {
    return SHUF(x, y, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
         + SHUF(x, y, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
}
static inline v16f red1(v16f x, v16f y) {
    return SHUF(x, y, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
         + SHUF(x, y, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
}
#define DOT16 1
/* o[j] = sum over t < n, in order, of p[t] * V[t, j] (the scalar loop's order: o starts at 0), for
   d = 16 * NC, with the NC sums held in registers across t */
static inline __attribute__((always_inline)) void wsum_nc(const float *p, const float *V, long n, long d, float *o, int nc) {
    v16f acc[4], v;
    for (int c = 0; c < nc; c++) acc[c] = (v16f){0};
    for (long t = 0; t < n; t++) {
        const float *vt = V + t * d;
        for (int c = 0; c < nc; c++) {
            __builtin_memcpy(&v, vt + 16 * c, sizeof v);
            acc[c] = acc[c] + p[t] * v;
        }
    }
    for (int c = 0; c < nc; c++) __builtin_memcpy(o + 16 * c, &acc[c], sizeof acc[c]);
}
static void wsum(const float *p, const float *V, long n, long d, float *o) {
    switch (d / 16) {  /* attend calls it for d = 16, 32, 48 or 64 */
    case 1: wsum_nc(p, V, n, d, o, 1); break;
    case 2: wsum_nc(p, V, n, d, o, 2); break;
    case 3: wsum_nc(p, V, n, d, o, 3); break;
    case 4: wsum_nc(p, V, n, d, o, 4); break;
    }
}
/* out[t] = dot(q, K + t * d, d) * scale for t < 16, bit for bit (d a multiple of 16) */
static void dot16(const float *q, const float *K, long d, float scale, float *out) {
    static const int rev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    v16f p[16], c[8], e[4], g[2], a, b;
    for (int i = 0; i < 16; i++) {
        const float *k = K + rev[i] * d;
        __builtin_memcpy(&a, q, sizeof a);
        __builtin_memcpy(&b, k, sizeof b);
        v16f s = a * b;
        for (long j = 16; j < d; j += 16) {
            __builtin_memcpy(&a, q + j, sizeof a);
            __builtin_memcpy(&b, k + j, sizeof b);
            s = s + a * b;
        }
        p[i] = s;
    }
    for (int i = 0; i < 8; i++) c[i] = red8(p[2 * i], p[2 * i + 1]);
    for (int i = 0; i < 4; i++) e[i] = red4(c[2 * i], c[2 * i + 1]);
    for (int i = 0; i < 2; i++) g[i] = red2(e[2 * i], e[2 * i + 1]);
    v16f r = red1(g[0], g[1]);
    r = r * scale;
    __builtin_memcpy(out, &r, sizeof r);
}
#endif

/* Causal softmax attention of `rows` consecutive tokens of one sequence for one kv head: row r's
   group query heads (q + r * q_stride: [group, d]) attend over positions 0..pos + r of K, V
   [cap, d], into out + r * out_stride ([group, d]). Keys are read a block of 16 positions
   at a time for every row and head that sees the whole block (`dot16`); each query's scores,
   softmax and weighted sum are the same operations in the same order whatever `rows` is.
   scores: rows * group * (pos + rows). */
static void attend(const float *q, long q_stride, const float *K, const float *V, float *out, long out_stride,
                   float *scores, long rows, long group, long pos, long d, float scale) {
    const long span = pos + rows;
    for (long t0 = 0; t0 < span; t0 += 16) {
        const long t1 = t0 + 16 < span ? t0 + 16 : span;
        for (long r = 0; r < rows; r++) {
            const long n = pos + r + 1;  /* row r sees positions 0..pos + r */
            if (t0 >= n) continue;
            for (long i = 0; i < group; i++) {
                const float *qq = q + r * q_stride + i * d;
                float *s = scores + (r * group + i) * span;
#ifdef DOT16
                if (d % LANES == 0 && t0 + 16 <= n) { dot16(qq, K + t0 * d, d, scale, s + t0); continue; }
#endif
                for (long t = t0; t < t1 && t < n; t++) s[t] = dot(qq, K + t * d, d) * scale;
            }
        }
    }
    for (long r = 0; r < rows; r++)
        for (long i = 0; i < group; i++) {
            const long n = pos + r + 1;
            float *s = scores + (r * group + i) * span;
            float mx[LANES], sm[LANES];
            for (int l = 0; l < LANES; l++) mx[l] = -INFINITY;
            long t = 0;
            for (; t + LANES <= n; t += LANES)
                for (int l = 0; l < LANES; l++) mx[l] = s[t + l] > mx[l] ? s[t + l] : mx[l];
            float m = -INFINITY;
            for (int l = 0; l < LANES; l++) m = mx[l] > m ? mx[l] : m;
            for (; t < n; t++) m = s[t] > m ? s[t] : m;
            for (long u = 0; u < n; u++) s[u] = exp_le0(s[u] - m);
            for (int l = 0; l < LANES; l++) sm[l] = 0.f;
            for (t = 0; t + LANES <= n; t += LANES)
                for (int l = 0; l < LANES; l++) sm[l] += s[t + l];
            for (int w = LANES / 2; w > 0; w /= 2)
                for (int l = 0; l < w; l++) sm[l] += sm[l + w];
            float sum = sm[0];
            for (; t < n; t++) sum += s[t];
            for (long u = 0; u < n; u++) s[u] /= sum;
            float *o = out + r * out_stride + i * d;
            for (long j = 0; j < d; j++) o[j] = 0.f;
        }
#ifdef DOT16
    if (d % 16 == 0 && d <= 64) {
        for (long r = 0; r < rows; r++)
            for (long i = 0; i < group; i++)
                wsum(scores + (r * group + i) * span, V, pos + r + 1, d, out + r * out_stride + i * d);
        return;
    }
#endif
    for (long t = 0; t < span; t++) {
        const float *v = V + t * d;
        const long r0 = t > pos ? t - pos : 0;
        for (long r = r0; r < rows; r++)
            for (long i = 0; i < group; i++) {
                const float p = scores[(r * group + i) * span + t];
                float *o = out + r * out_stride + i * d;
                for (long j = 0; j < d; j++) o[j] += p * v[j];
            }
    }
}

#define DRAW_BLOCK 1024  /* sampling.BLOCK */

/* Weight of a log-probability in a draw: exp(x), and 0 below -87 (a -inf of a token that top-k
   or top-p dropped is 0: it is never drawn; a finite one below -87 weighs < 2e-38 beside the
   top token's 1 and is treated as 0). */
static inline float draw_weight(float x) { return x < -87.f ? 0.f : exp_le0(x); }

/* One token per row of `table` [rows, v] (log-probabilities, <= 0; -inf where not kept) at the
   uniform u[r] in [0, 1): the first token whose running float64 sum of weights exceeds u[r] times
   the row's total, found in two short scans as sampling.draw does: the blocks of DRAW_BLOCK
   tokens (sums of 8 float64 lanes each, added pairwise), then the running sum inside the block.
   A token of weight 0 is never drawn (the running sum does not move past it). ids[r] = -1 when
   the row's total is not finite and positive. e: scratch of v floats; bsum: of v / DRAW_BLOCK + 1
   doubles. */
void harnessrl_draw_rows(const float *table, long rows, long v, const double *u, long *ids, float *e, double *bsum) {
    const long nb = (v + DRAW_BLOCK - 1) / DRAW_BLOCK;
    for (long r = 0; r < rows; r++) {
        const float *x = table + r * v;
        for (long j = 0; j < v; j++) e[j] = draw_weight(x[j]);
        double total = 0.0;
        for (long b = 0; b < nb; b++) {
            const long j0 = b * DRAW_BLOCK, j1 = j0 + DRAW_BLOCK < v ? j0 + DRAW_BLOCK : v;
            double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            long j = j0;
            for (; j + 8 <= j1; j += 8)
                for (int l = 0; l < 8; l++) lane[l] += (double)e[j + l];
            for (int w = 4; w > 0; w /= 2)
                for (int l = 0; l < w; l++) lane[l] += lane[l + w];
            for (; j < j1; j++) lane[0] += (double)e[j];
            total += lane[0];
            bsum[b] = total;  /* running sums of the blocks */
        }
        if (!(total > 0.0 && total <= 1.7976931348623157e308)) { ids[r] = -1; continue; }
        const double target = u[r] * total;
        long b = 0;
        while (b < nb && !(bsum[b] > target)) b++;
        if (b == nb) {  /* u * total rounded up to the total: the last block of positive mass */
            b = 0;
            while (bsum[b] != total) b++;
        }
        const long j0 = b * DRAW_BLOCK, j1 = j0 + DRAW_BLOCK < v ? j0 + DRAW_BLOCK : v;
        double run = b ? bsum[b - 1] : 0.0;
        long pick = -1, last = -1;
        for (long j = j0; j < j1; j++) {
            if (e[j] > 0.f) last = j;
            run += (double)e[j];
            if (run > target) { pick = j; break; }
        }
        /* the block's own running sum rounded below the target: its last token of positive mass */
        ids[r] = pick >= 0 && e[pick] > 0.f ? pick : last;
    }
}

/* A decode step of a Llama-style model (no biases, SiLU MLP) for `rows` tokens at once,
   fast_decode.FastDecoder's operations in the same order: h [rows, hidden] (the tokens'
   embeddings) is overwritten; row r's cos/sin are row r of cos, sin [rows, d]; its new key and
   value of every layer are written at column col[r] of its KV, kbuf/vbuf + r * kv_stride
   ([n_kv, cap, d]), and it attends over columns start[r]..col[r]; the logits go to logits
   [rows, vocab]. Two uses:
   - a batch of sequences, one token each: kv_stride = n_kv * cap * d (row r's own slab of a
     left-padded batch), start[r] its first real column, col[r] the column after its last;
   - a speculative verify of rows consecutive tokens of one sequence: kv_stride = 0, start[r] = 0,
     col[r] = pos + r (causal); the rows share each key/value read (`attend`).
   Every row's numbers are computed exactly as in a one-row step of its token at its position
   (`matvec_rows`, and per-row norms, rope and attention), so a verify gives the logits the
   one-row steps would, bit for bit. Weights are fast_decode's transposed copies: wqkv [hidden,
   q+k+v], wo [q, hidden], wgu [hidden, 2*inter], wd [inter, hidden], head [hidden, vocab].
   scratch: see cpu_matvec.DecodeStep.__call__. */
void harnessrl_decode_rows(long rows, long n_layers, float *h, const float *cos, const float *sin,
                           const float *const *wqkv, const float *const *wo, const float *const *wgu,
                           const float *const *wd, const float *const *ln1, const float *const *ln2,
                           const float *fnorm, const float *head, float *const *kbuf, float *const *vbuf,
                           long cap, const long *start, const long *col, long kv_stride, long n_q, long n_kv,
                           long d, long hidden, long inter, long vocab, float eps, float scale, float *logits,
                           float *scratch) {
    const long nq = n_q * d, nkv = n_kv * d, group = n_q / n_kv, nqkv = nq + 2 * nkv;
    long span = 0;  /* the most scores one attend call holds */
    for (long r = 0; r < rows; r++) {
        const long n = col[r] - start[r] + 1;
        if (n > span) span = n;
    }
    if (kv_stride == 0) span = rows * (col[rows - 1] + 1);
    float *x = scratch, *qkv = x + rows * hidden, *att = qkv + rows * nqkv, *gu = att + rows * nq,
          *act = gu + rows * 2 * inter, *scores = act + rows * inter, *acc = scores + group * span;
    for (long l = 0; l < n_layers; l++) {
        for (long r = 0; r < rows; r++) rms_norm(h + r * hidden, ln1[l], x + r * hidden, hidden, eps);
        matvec_rows(x, wqkv[l], qkv, acc, rows, hidden, nqkv, chunk_of(hidden));
        for (long r = 0; r < rows; r++) {
            float *q = qkv + r * nqkv, *k = q + nq, *v = q + nq + nkv;
            const float *c = cos + r * d, *s = sin + r * d;
            for (long i = 0; i < n_q; i++) rope(q + i * d, c, s, d);
            for (long g = 0; g < n_kv; g++) {
                rope(k + g * d, c, s, d);
                float *kc = kbuf[l] + r * kv_stride + (g * cap + col[r]) * d,
                      *vc = vbuf[l] + r * kv_stride + (g * cap + col[r]) * d;
                for (long j = 0; j < d; j++) { kc[j] = k[g * d + j]; vc[j] = v[g * d + j]; }
            }
        }
        for (long g = 0; g < n_kv; g++) {
            if (kv_stride == 0) {
                attend(qkv + g * group * d, nqkv, kbuf[l] + g * cap * d, vbuf[l] + g * cap * d, att + g * group * d,
                       nq, scores, rows, group, col[0], d, scale);
            } else {
                for (long r = 0; r < rows; r++) {
                    const long off = r * kv_stride + (g * cap + start[r]) * d;
                    attend(qkv + r * nqkv + g * group * d, nqkv, kbuf[l] + off, vbuf[l] + off,
                           att + r * nq + g * group * d, nq, scores, 1, group, col[r] - start[r], d, scale);
                }
            }
        }
        matvec_rows(att, wo[l], x, acc, rows, nq, hidden, chunk_of(nq));
        for (long j = 0; j < rows * hidden; j++) h[j] += x[j];
        for (long r = 0; r < rows; r++) rms_norm(h + r * hidden, ln2[l], x + r * hidden, hidden, eps);
        matvec_rows(x, wgu[l], gu, acc, rows, hidden, 2 * inter, chunk_of(hidden));
        for (long r = 0; r < rows; r++) {
            const float *g = gu + r * 2 * inter;
            float *a = act + r * inter;
            for (long j = 0; j < inter; j++) { const float z = g[j]; a[j] = z / (1.f + expf(-z)) * g[inter + j]; }
        }
        matvec_rows(act, wd[l], x, acc, rows, inter, hidden, chunk_of(inter));
        for (long j = 0; j < rows * hidden; j++) h[j] += x[j];
    }
    for (long r = 0; r < rows; r++) rms_norm(h + r * hidden, fnorm, x + r * hidden, hidden, eps);
    matvec_rows(x, head, logits, acc, rows, hidden, vocab, chunk_of(hidden));
}
"""
