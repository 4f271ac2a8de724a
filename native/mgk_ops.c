/* mgk_ops.c: the non-matmul ops of a training step (API in mgk_ops.h; semantics: minigpt/backends/numpy_ops.py):
   LayerNorm, bias + GELU, causal softmax and softmax cross-entropy (forward and backward each), AdamW, the
   embedding scatter-add and dropout, float32; and at the end, the products that run one of them in the GEMM's
   epilogue (mgk_gemm_gelu, mgk_gemm_mul, mgk_gemm_add). Each op has a fast path, mgk_<op>: ONE C body per op,
   compiled three times (no target: any x86-64 or other CPU; AVX2+FMA; AVX-512) and picked at run time by mgk_isa(),
   so the file needs no -march flag. Right after it comes its scalar reference, mgk_ref_<op>: numpy_ops.py's formula
   in plain loops, one thread, libm, sums in index order (the algorithmic reference the tests hold the fast path
   to).
   The bodies are plain loops for the auto-vectorizer (no -ffast-math): exp is an inline polynomial instead of a
   libm call, and row sums and maxima run in 16 independent lanes (GNU vectors of 4 floats) folded in a fixed
   order. FMA contraction is off in this file, so the three paths give the same bits; rows (or, for a bias's
   gradient and the embedding's dW, columns; for LayerNorm's dw and db, row blocks that N alone fixes) are split
   over the thread pool so that no result depends on the thread count either.
   Not here: the GEMM (mgk.c). minigpt/backends/native.py calls every op of this file, AdamW and the scatter-add
   included (memory-bound, they gain little from C, and a ctypes call costs more than a numba one: the price of
   one backend that needs neither numba nor BLAS). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "mgk.h"
#include "mgk_job.h"   /* job_t: the products with an op fused run on mgk.c's GEMM, the op in its epilogue */
#include "mgk_ops.h"

/* a*b+c stays two roundings: the same bits on every ISA path. (The build also passes -fno-math-errno, without
   which sqrtf keeps an errno branch that stops AdamW's loop from vectorizing; gcc ignores it in a pragma.) */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MGK_NO_SIMD)
#define OPS_X86 1
#include <xmmintrin.h>     /* _mm_getcsr/_mm_setcsr (baseline SSE): the caller's FP mode, handed to the workers */
#endif

#define BODY static inline __attribute__((always_inline))
#define LANES 16           /* independent partial sums of a row sum (below: four vectors of 4 floats) */
/* Threads: an op runs on the calling thread alone unless its work, estimated as elements times the cost of one
   element on one AVX-512 thread (the PS_* below, in picoseconds, from timings at config S's sizes:
   reports/benchmarks.md), passes a threshold. Waking the pool's sleeping workers is slow, so an op must take
   PAR_MIN_PS on one thread before a second one pays. While mgk_set_spin_us is > 0 (the native backend sets it),
   workers wait awake between back-to-back calls and handing them work is cheap, so each thread that gets
   PAR_SPIN_PS of work pays (config S's ops all cross it; the thresholds tried: reports/benchmarks.md,
   PAR_SPIN_PS). A call after a longer pause still wakes sleeping workers. */
#define PAR_MIN_PS 100000000LL
#define PAR_SPIN_PS 5000000LL
enum { PS_LN_FWD = 300, PS_LN_BWD = 400, PS_GELU_FWD = 700, PS_GELU_BWD = 150, PS_SM_FWD = 450, PS_SM_BWD = 250,
       PS_XENT = 800, PS_ADAM = 150, PS_EMB = 100, PS_EXP = 300,
       PS_DROPOUT = 100 };

typedef void (*job_fn)(const void *args, int tid, int nt);

/* A bias's gradient summed over rows (GELU backward's db) sums a thread's columns into a local array, COL_BLOCK
   columns at a time: summed straight into db[j], whose stores the compiler must assume may change the inputs, the
   loop would not vectorize. Each column still adds its rows in order, from its old value, on one thread. A block
   as wide as a row keeps one sequential pass over the rows (narrower blocks make strided passes, which are
   slower). */
#define COL_BLOCK 4096

/* VARIANTS(op, args_t) compiles op##_body three times and makes op##_fns[isa]; the body is always_inline, so
   each copy is vectorized for its own target. */
#ifdef OPS_X86
#ifdef MGK_EMULATE_AVX512  /* the test build of mgk.c's AVX-512 paths: no AVX-512 instruction here either */
#define TARGET_AVX512 "avx2,fma"
#else
#define TARGET_AVX512 "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"
#endif
#define VARIANTS(op, A)                                                                                 \
    static void op##_generic(const void *a, int tid, int nt) { op##_body((const A *)a, tid, nt); }     \
    __attribute__((target("avx2,fma")))                                                                \
    static void op##_avx2(const void *a, int tid, int nt) { op##_body((const A *)a, tid, nt); }        \
    __attribute__((target(TARGET_AVX512)))                                                             \
    static void op##_avx512(const void *a, int tid, int nt) { op##_body((const A *)a, tid, nt); }      \
    static const job_fn op##_fns[3] = {op##_generic, op##_avx2, op##_avx512};
#else
#define VARIANTS(op, A)                                                                                 \
    static void op##_generic(const void *a, int tid, int nt) { op##_body((const A *)a, tid, nt); }     \
    static const job_fn op##_fns[3] = {op##_generic, op##_generic, op##_generic};
#endif

/* ----------------------------------------------------------------------------
   threads: mgk_pool runs one job at a time, whoever calls (an op or a GEMM, from any thread of the caller) */

typedef struct { job_fn fn; const void *args; unsigned int csr; } par_t;

static void par_job(void *p, int tid, int nt)
{
    const par_t *j = p;
#ifdef OPS_X86
    unsigned int own = _mm_getcsr();
    _mm_setcsr(j->csr);    /* the pool's workers run with flush-to-zero; here they compute as the caller would */
    j->fn(j->args, tid, nt);
    _mm_setcsr(own);
#else
    j->fn(j->args, tid, nt);
#endif
}

/* run fns[mgk_isa()] on `units` independent pieces (rows or column blocks), `ps` picoseconds of work on one thread */
static void run(const job_fn *fns, const void *args, long long ps, long long units)
{
    int isa = mgk_isa();
    job_fn fn = fns[isa < MGK_ISA_AVX512 ? isa : MGK_ISA_AVX512];   /* avx512bf16 and amx run the AVX-512 ops */
    int nt = mgk_get_num_threads();
    if (mgk_pool_spin_us() > 0) {
        if (ps / PAR_SPIN_PS < nt) nt = (int)(ps / PAR_SPIN_PS);  /* at least PAR_SPIN_PS of work per thread */
    } else if (ps < PAR_MIN_PS)
        nt = 1;
    if (nt > units) nt = (int)units;
    if (nt <= 1) { fn(args, 0, 1); return; }
    par_t j = {fn, args, 0};
#ifdef OPS_X86
    j.csr = _mm_getcsr();
#endif
    int rc = mgk_pool_run(par_job, &j, nt);
    if (rc != MGK_OK) fn(args, 0, 1);         /* no worker could start: the caller does it all */
}

/* [lo, hi) of n items for thread tid of nt, in blocks of `block` items (16 floats: one cache line of a column sum) */
BODY void span(long long n, int tid, int nt, long long block, long long *lo, long long *hi)
{
    long long nb = (n + block - 1) / block;
    *lo = nb * tid / nt * block;
    *hi = nb * (tid + 1) / nt * block;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

/* ----------------------------------------------------------------------------
   scalar helpers of the fast bodies */

/* Row sums and maxima run in 16 independent lanes, held as four GNU vectors of 4 floats (the width every x86-64
   has, so they stay in registers on every path; a 16-float vector type lives on the stack where the target has
   no 512-bit registers). Lane k sums the terms j % 16 == k of the whole blocks of 16, the lanes are folded
   pairwise (k + 8, k + 4, k + 2, k + 1), and the last n % 16 terms are added in order: a fixed order, the same
   on every ISA path. Without -ffast-math a plain running sum would not vectorize at all. */
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));
typedef struct { f32x4 v[LANES / 4]; } lanes_t;

BODY f32x4 load4(const float *p) { f32x4 v; memcpy(&v, p, sizeof v); return v; }

BODY f32x4 max4(f32x4 a, f32x4 b)         /* a > b ? a : b per lane, as the scalar max below */
{
    i32x4 m = a > b;
    return (f32x4)(((i32x4)a & m) | ((i32x4)b & ~m));
}

BODY float max1(float a, float b) { return a > b ? a : b; }

BODY float fold_sum(lanes_t s)
{
    f32x4 u = (s.v[0] + s.v[2]) + (s.v[1] + s.v[3]);           /* lanes k + 8, then k + 4 */
    return (u[0] + u[2]) + (u[1] + u[3]);
}

BODY float fold_max(lanes_t s)
{
    f32x4 u = max4(max4(s.v[0], s.v[2]), max4(s.v[1], s.v[3]));
    return max1(max1(u[0], u[2]), max1(u[1], u[3]));
}

BODY float row_sum(const float *x, long long n)                /* sum_j x[j] */
{
    lanes_t s = {{{0}}};
    long long j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int q = 0; q < LANES / 4; q++) s.v[q] += load4(x + j + 4 * q);
    float r = fold_sum(s);
    for (; j < n; j++) r += x[j];
    return r;
}

BODY float row_max(const float *x, float c, long long n)       /* max_j c x[j]; -inf for n = 0 */
{
    lanes_t s;
    for (int q = 0; q < LANES / 4; q++) s.v[q] = (f32x4){-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    long long j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int q = 0; q < LANES / 4; q++) s.v[q] = max4(load4(x + j + 4 * q) * c, s.v[q]);
    float r = fold_max(s);
    for (; j < n; j++) r = max1(x[j] * c, r);
    return r;
}

BODY float row_sqdev(const float *x, float m, long long n)     /* sum_j (x[j] - m)^2 */
{
    lanes_t s = {{{0}}};
    long long j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int q = 0; q < LANES / 4; q++) {
            f32x4 d = load4(x + j + 4 * q) - m;
            s.v[q] += d * d;
        }
    float r = fold_sum(s);
    for (; j < n; j++) r += (x[j] - m) * (x[j] - m);
    return r;
}

BODY float row_dot(const float *a, const float *b, long long n) /* sum_j a[j] b[j] */
{
    lanes_t s = {{{0}}};
    long long j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int q = 0; q < LANES / 4; q++) s.v[q] += load4(a + j + 4 * q) * load4(b + j + 4 * q);
    float r = fold_sum(s);
    for (; j < n; j++) r += a[j] * b[j];
    return r;
}

/* sum_j a[j] b[j] ((x[j] - m) r): LayerNorm backward's sum of dxhat * xhat */
BODY float row_dot_xhat(const float *a, const float *b, const float *x, float m, float r, long long n)
{
    lanes_t s = {{{0}}};
    long long j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int q = 0; q < LANES / 4; q++) {
            long long k = j + 4 * q;
            s.v[q] += load4(a + k) * load4(b + k) * ((load4(x + k) - m) * r);
        }
    float t = fold_sum(s);
    for (; j < n; j++) t += a[j] * b[j] * ((x[j] - m) * r);
    return t;
}

BODY float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
BODY uint32_t to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* c ? a : b as a bitwise select: gcc turns two float ?: in a row into branches, which stops vectorization */
BODY float pick(int c, float a, float b)
{
    uint32_t m = 0u - (uint32_t)(c != 0);
    return from_bits((to_bits(a) & m) | (to_bits(b) & ~m));
}

/* e**x in float32 within 1 ulp of the correctly rounded value where that is a normal float, else 0 or inf
   (tests/test_native_ops.py). x = n ln2 + r, n = round(x / ln2) by the 1.5 * 2**23 trick (no floorf call),
   |r| <= ln2/2; ln2 = HI + LO with HI ln2 rounded to a multiple of 2**-11, so n * HI is exact (|n| <= 128).
   e**r = 1 + r + r^2 q(r), q of degree 4 fitted (least squares, Lawson-reweighted to the minimax relative error
   3.1e-9) on [-ln2/2, ln2/2]. 2**n is two exponent-field factors, so n = 128 works. Below ln(FLT_MIN) the result
   is 0 (-inf -> exactly 0) and above ln(FLT_MAX) inf, both by a select on an in-range dummy: results that would
   be subnormal cost a microcode assist per vector here, and very negative arguments (scores far
   below a row's max) are common.
   NaN stays NaN. */
#define EXP_SHIFT 12582912.0f             /* 1.5 * 2**23: adding it rounds x / ln2 to an integer in the low bits */
BODY float exp_fast(float x)
{
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float q0 = 0.49999994f, q1 = 0.16666521f, q2 = 0.041668389f, q3 = 0.0083687101f, q4 = 0.0013814613f;
    int under = x < -87.3365448f, over = x > 88.7228391f;          /* ln(FLT_MIN), ln(FLT_MAX) */
    float xc = pick(under | over, 0.0f, x);
    float t = xc * log2e + EXP_SHIFT;
    float n = t - EXP_SHIFT;
    int32_t ni = (int32_t)(to_bits(t) - to_bits(EXP_SHIFT));      /* n as an integer, from the low bits of t */
    float r = xc - n * ln2_hi;
    r = r - n * ln2_lo;
    float q = (((q4 * r + q3) * r + q2) * r + q1) * r + q0;
    float p = q * (r * r) + r + 1.0f;
    int32_t h = ni >> 1;                                           /* 2**n = 2**h 2**(n-h), each a normal float */
    float e = p * from_bits((uint32_t)(h + 127) << 23) * from_bits((uint32_t)(ni - h + 127) << 23);
    return pick(over, INFINITY, pick(under, 0.0f, e));
}

#define GELU_C 0.7978845608028654f        /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* y = 0.5 v (1 + tanh u), u = c (v + a v^3), and dy/dv, from one exp: 0.5 (1 + tanh u) = s = 1 / (1 + e^{-2u})
   (no cancellation where tanh u ~ -1), 0.5 (1 - tanh^2 u) = 2 s (1 - s), 1 - s = e s when e <= 1.
   gelu_arg gives -2u, and gelu_from_exp the rest from e = exp_fast(-2u). */
BODY float gelu_arg(float v) { return -2.0f * GELU_C * (v + GELU_A * v * v * v); }

BODY void gelu_from_exp(float v, float e, float *y, float *d)
{
    float s = 1.0f / (1.0f + e);
    float sm = pick(e > 1.0f, 1.0f - s, e * s);                     /* 1 - s, accurate at both ends */
    float xk = v * s * sm;                                          /* x s (1 - s), 0 for large |v| */
    *y = v * s;
    *d = s + 2.0f * GELU_C * (xk + 3.0f * GELU_A * v * (v * xk));   /* v * (v * xk): no inf * 0 for big |v| */
}

/* ----------------------------------------------------------------------------
   LayerNorm: keep mean and rstd (N,), recompute xhat in backward */

typedef struct { long long N; int C; const float *x, *w, *b; double eps; float *y, *mean, *rstd; } ln_fwd_t;

BODY void ln_fwd_body(const ln_fwd_t *a, int tid, int nt)
{
    const long long C = a->C;
    const float *w = a->w, *b = a->b;
    long long lo, hi;
    span(a->N, tid, nt, 1, &lo, &hi);
    for (long long i = lo; i < hi; i++) {
        const float *x = a->x + i * C;
        float *y = a->y + i * C;
        float m = (float)(row_sum(x, C) / (double)C);
        float var = row_sqdev(x, m, C);
        float r = (float)(1.0 / sqrt(var / (double)C + a->eps));
        a->mean[i] = m;
        a->rstd[i] = r;
        if (b)
            for (long long j = 0; j < C; j++) y[j] = (x[j] - m) * r * w[j] + b[j];    /* y = xhat * w + b */
        else
            for (long long j = 0; j < C; j++) y[j] = (x[j] - m) * r * w[j];
    }
}
VARIANTS(ln_fwd, ln_fwd_t)

int mgk_layernorm_fwd(long long N, int C, const float *x, const float *w, const float *b, double eps,
                      float *y, float *mean, float *rstd)
{
    if (N < 0 || C < 0 || (N && C && (!x || !w || !y)) || (N && (!mean || !rstd))) return MGK_EBADARG;
    ln_fwd_t a = {N, C, x, w, b, eps, y, mean, rstd};
    run(ln_fwd_fns, &a, N * C * PS_LN_FWD, N);
    return MGK_OK;
}

int mgk_ref_layernorm_fwd(long long N, int C, const float *x, const float *w, const float *b, double eps,
                          float *y, float *mean, float *rstd)
{
    if (N < 0 || C < 0 || (N && C && (!x || !w || !y)) || (N && (!mean || !rstd))) return MGK_EBADARG;
    for (long long i = 0; i < N; i++, x += C, y += C) {
        float m = 0.0f, v = 0.0f;
        for (int j = 0; j < C; j++) m += x[j];
        m /= C;
        for (int j = 0; j < C; j++) v += (x[j] - m) * (x[j] - m);
        float r = 1.0f / sqrtf(v / C + (float)eps);
        for (int j = 0; j < C; j++) y[j] = (x[j] - m) * r * w[j] + (b ? b[j] : 0.0f);
        mean[i] = m, rstd[i] = r;
    }
    return MGK_OK;
}

/* One pass over dy and x: a row's dw and db terms go into the sums of its row block (pw, pb: one row of C floats
   per block), and its dx follows from the same row while it is in cache. The blocks depend on N alone (at most
   LN_BLOCKS, of at least LN_BLOCK_ROWS rows), each summed in row order by the one thread that takes it;
   mgk_layernorm_bwd then adds them into dw and db in block order, so no result depends on the thread count (and
   at most LN_BLOCKS threads share a call).
   (Summing each column over all rows on one thread instead would read dy and x twice.) */
#define LN_BLOCKS 64
#define LN_BLOCK_ROWS 16
typedef struct {
    long long N; int C; const float *dy, *x, *w, *mean, *rstd; float *dx; long long block_rows, blocks; float *pw, *pb;
    int acc;
} ln_bwd_t;

BODY void ln_bwd_body(const ln_bwd_t *a, int tid, int nt)
{
    const long long C = a->C, N = a->N;
    const float *w = a->w;
    long long b0, b1;
    span(a->blocks, tid, nt, 1, &b0, &b1);
    for (long long blk = b0; blk < b1; blk++) {
        float *restrict sw = a->pw + blk * C, *restrict sb = a->pb ? a->pb + blk * C : NULL;
        memset(sw, 0, sizeof(float) * (size_t)C);
        if (sb) memset(sb, 0, sizeof(float) * (size_t)C);
        long long end = (blk + 1) * a->block_rows < N ? (blk + 1) * a->block_rows : N;
        for (long long i = blk * a->block_rows; i < end; i++) {
            const float *dy = a->dy + i * C, *x = a->x + i * C, m = a->mean[i], r = a->rstd[i];
            float *dx = a->dx + i * C;                 /* may be dy or x: the row is read before dx is written */
            for (long long j = 0; j < C; j++) sw[j] += dy[j] * ((x[j] - m) * r);       /* dw += dy * xhat */
            if (sb)
                for (long long j = 0; j < C; j++) sb[j] += dy[j];                       /* db += dy */
            /* fwd: y = xhat * w + b -> dxhat = dy * w; the means of dxhat and of dxhat * xhat */
            float ma = (float)(row_dot(dy, w, C) / (double)C);
            float mc = (float)(row_dot_xhat(dy, w, x, m, r, C) / (double)C);
            /* fwd: xhat = (x - mean) * rstd  ->  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) */
            if (a->acc)                      /* dx += ...: the residual stream's gradient (apart from dy and x) */
                for (long long j = 0; j < C; j++) dx[j] += r * (dy[j] * w[j] - ma - ((x[j] - m) * r) * mc);
            else
                for (long long j = 0; j < C; j++) dx[j] = r * (dy[j] * w[j] - ma - ((x[j] - m) * r) * mc);
        }
    }
}
VARIANTS(ln_bwd, ln_bwd_t)

static int overlap(const void *p, const void *q, long long n)     /* two arrays of n floats share memory */
{
    const char *a = p, *b = q;
    return a < b + 4 * n && b < a + 4 * n;
}

int mgk_layernorm_bwd(long long N, int C, const float *dy, const float *x, const float *w, const float *mean,
                      const float *rstd, float *dx, float *dw, float *db, int acc)
{
    if (N < 0 || C < 0 || (N && C && (!dy || !x || !w || !mean || !rstd || !dx || !dw)) ||
        ((dx != dy || acc) && overlap(dx, dy, N * C)) || ((dx != x || acc) && overlap(dx, x, N * C)))
        return MGK_EBADARG;                                        /* in place (not with acc), or apart */
    if (N == 0 || C == 0) return MGK_OK;
    long long rows = (N + LN_BLOCKS - 1) / LN_BLOCKS > LN_BLOCK_ROWS ? (N + LN_BLOCKS - 1) / LN_BLOCKS : LN_BLOCK_ROWS;
    ln_bwd_t a = {N, C, dy, x, w, mean, rstd, dx, rows, (N + rows - 1) / rows, NULL, NULL, acc != 0};
    if (!(a.pw = malloc(sizeof(float) * (size_t)(a.blocks * C * (db ? 2 : 1))))) return MGK_ENOMEM;
    a.pb = db ? a.pw + a.blocks * C : NULL;
    run(ln_bwd_fns, &a, N * C * PS_LN_BWD, a.blocks);
    for (long long blk = 0; blk < a.blocks; blk++)                 /* the blocks' sums, in block order */
        for (long long j = 0; j < C; j++) dw[j] += a.pw[blk * C + j];
    for (long long blk = 0; db && blk < a.blocks; blk++)
        for (long long j = 0; j < C; j++) db[j] += a.pb[blk * C + j];
    free(a.pw);
    return MGK_OK;
}

int mgk_ref_layernorm_bwd(long long N, int C, const float *dy, const float *x, const float *w, const float *mean,
                          const float *rstd, float *dx, float *dw, float *db, int acc)
{
    if (N < 0 || C < 0 || (N && C && (!dy || !x || !w || !mean || !rstd || !dx || !dw))) return MGK_EBADARG;
    for (long long i = 0; i < N; i++, dy += C, x += C, dx += C) {
        float m = mean[i], r = rstd[i], ma = 0.0f, mc = 0.0f;
        for (int j = 0; j < C; j++) {
            float xhat = (x[j] - m) * r;
            dw[j] += dy[j] * xhat;
            if (db) db[j] += dy[j];
            ma += dy[j] * w[j];
            mc += dy[j] * w[j] * xhat;
        }
        ma /= C, mc /= C;
        for (int j = 0; j < C; j++) {
            float v = r * (dy[j] * w[j] - ma - (x[j] - m) * r * mc);
            dx[j] = acc ? dx[j] + v : v;
        }
    }
    return MGK_OK;
}

/* ----------------------------------------------------------------------------
   GELU (tanh form) of x + b: rows; backward: columns when db is summed, else flat */

typedef struct { long long N; int H; const float *x, *b; float *y, *d; } gelu_fwd_t;

/* One element's GELU is a chain of ~50 dependent operations (the exp and a divide inside it), and a loop over
   whole elements ran at the latency of that chain: the CPU's scheduler holds only a few elements' worth in
   flight. So a row goes through in chunks, one stage at a time over the chunk (v = x + b, -2u, exp, the rest),
   each stage a loop of short independent chains; the same operations on each element, so the same bits. */
#define GELU_CHUNK 64

BODY void gelu_fwd_body(const gelu_fwd_t *a, int tid, int nt)
{
    const long long H = a->H;
    const float *b = a->b;
    long long lo, hi;
    span(a->N, tid, nt, 1, &lo, &hi);
    for (long long i = lo; i < hi; i++)
        for (long long j0 = 0; j0 < H; j0 += GELU_CHUNK) {
            const float *x = a->x + i * H + j0;
            float *y = a->y + i * H + j0, *d = a->d + i * H + j0;
            int n = H - j0 < GELU_CHUNK ? (int)(H - j0) : GELU_CHUNK;
            float v[GELU_CHUNK], e[GELU_CHUNK];                     /* x may be y itself: read before written */
            if (b)
                for (int j = 0; j < n; j++) v[j] = x[j] + b[j0 + j];
            else
                for (int j = 0; j < n; j++) v[j] = x[j];
            for (int j = 0; j < n; j++) e[j] = gelu_arg(v[j]);
            for (int j = 0; j < n; j++) e[j] = exp_fast(e[j]);
            for (int j = 0; j < n; j++) gelu_from_exp(v[j], e[j], &y[j], &d[j]);
        }
}
VARIANTS(gelu_fwd, gelu_fwd_t)

int mgk_gelu_fwd(long long N, int H, const float *x, const float *b, float *y, float *dgelu)
{
    if (N < 0 || H < 0 || (N && H && (!x || !y || !dgelu))) return MGK_EBADARG;
    gelu_fwd_t a = {N, H, x, b, y, dgelu};
    run(gelu_fwd_fns, &a, N * H * PS_GELU_FWD, N);
    return MGK_OK;
}

/* mgk_gemm_gelu's epilogue: a block of rows, each one row of gelu_fwd_body (so the same bits) */
typedef struct { int rows, n; float *y; long long ldy; const float *b; float *d; long long ldd; } gelu_block_t;

BODY void gelu_block_body(const gelu_block_t *a, int tid, int nt)
{
    for (int i = 0; i < a->rows; i++) {
        gelu_fwd_t r = {1, a->n, a->y + i * a->ldy, a->b, a->y + i * a->ldy, a->d + i * a->ldd};
        gelu_fwd_body(&r, 0, 1);
    }
    (void)tid; (void)nt;
}
VARIANTS(gelu_block, gelu_block_t)

static void gelu_block(int rows, int n, float *y, long long ldy, const float *b, float *d, long long ldd)
{
    int isa = mgk_isa();
    gelu_block_t a = {rows, n, y, ldy, b, d, ldd};
    gelu_block_fns[isa < MGK_ISA_AVX512 ? isa : MGK_ISA_AVX512](&a, 0, 1);
}

/* the other epilogues' steps: a block of rows, each read and written once while the product's block is in cache.
   MUL y = y * d (mgk_gelu_bwd's bits, without db); BIAS y = y + b (numpy's out += b); ADD y = d + (y + b), or
   d + y without b (out += b, then np.add(d, out)) */
enum { EPB_MUL, EPB_BIAS, EPB_ADD };
typedef struct { int kind, rows, n; float *y; long long ldy; const float *b, *d; long long ldd; } ep_block_t;

BODY void ep_block_body(const ep_block_t *a, int tid, int nt)
{
    for (int i = 0; i < a->rows; i++) {
        float *restrict y = a->y + i * a->ldy;
        const float *restrict d = a->d + i * a->ldd, *b = a->b;
        if (a->kind == EPB_MUL)
            for (int j = 0; j < a->n; j++) y[j] = y[j] * d[j];               /* dz = (dout w^T) act'(z) */
        else if (a->kind == EPB_BIAS)
            for (int j = 0; j < a->n; j++) y[j] = y[j] + b[j];               /* z + b */
        else if (b)
            for (int j = 0; j < a->n; j++) y[j] = d[j] + (y[j] + b[j]);      /* x + (z + b) */
        else
            for (int j = 0; j < a->n; j++) y[j] = d[j] + y[j];               /* x + z */
    }
    (void)tid; (void)nt;
}
VARIANTS(ep_block, ep_block_t)

static void ep_block(int kind, int rows, int n, float *y, long long ldy, const float *b, const float *d, long long ldd)
{
    int isa = mgk_isa();
    ep_block_t a = {kind, rows, n, y, ldy, b, d, ldd};
    ep_block_fns[isa < MGK_ISA_AVX512 ? isa : MGK_ISA_AVX512](&a, 0, 1);
}

int mgk_ref_gelu_fwd(long long N, int H, const float *x, const float *b, float *y, float *dgelu)
{
    if (N < 0 || H < 0 || (N && H && (!x || !y || !dgelu))) return MGK_EBADARG;
    for (long long i = 0; i < N * H; i++) {
        float v = b ? x[i] + b[i % H] : x[i];
        float t = tanhf(GELU_C * (v + GELU_A * v * v * v));
        dgelu[i] = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_A * v * v);
        y[i] = 0.5f * v * (1.0f + t);
    }
    return MGK_OK;
}

typedef struct { long long N; int H; const float *dout, *dg; float *dx, *db; } gelu_bwd_t;

BODY void gelu_bwd_body(const gelu_bwd_t *a, int tid, int nt)
{
    const long long H = a->H, N = a->N;
    const float *dout = a->dout, *dg = a->dg;
    float *dx = a->dx, *db = a->db;
    long long lo, hi;
    if (!db) {                                                     /* elementwise over the flat array */
        span(N * H, tid, nt, LANES, &lo, &hi);
        for (long long j = lo; j < hi; j++) dx[j] = dout[j] * dg[j];
        return;
    }
    span(H, tid, nt, LANES, &lo, &hi);                             /* db[j]: one thread, rows in order */
    for (long long j0 = lo; j0 < hi; j0 += COL_BLOCK) {            /* sums in a local array: see COL_BLOCK */
        int n = hi - j0 < COL_BLOCK ? (int)(hi - j0) : COL_BLOCK;
        float sb[COL_BLOCK];
        for (int j = 0; j < n; j++) sb[j] = db[j0 + j];
        for (long long i = 0; i < N; i++) {
            const float *dout_i = dout + i * H + j0, *dg_i = dg + i * H + j0;   /* row i, from column j0 */
            float *dx_i = dx + i * H + j0;
            for (int j = 0; j < n; j++) {
                float v = dout_i[j] * dg_i[j];                     /* fwd: y = gelu(x + b) -> dx = dy gelu'(x + b) */
                dx_i[j] = v;
                sb[j] += v;                                        /*                          db = sum_rows dx */
            }
        }
        for (int j = 0; j < n; j++) db[j0 + j] = sb[j];
    }
}
VARIANTS(gelu_bwd, gelu_bwd_t)

int mgk_gelu_bwd(long long N, int H, const float *dout, const float *dgelu, float *dx, float *db)
{
    if (N < 0 || H < 0 || (N && H && (!dout || !dgelu || !dx))) return MGK_EBADARG;
    gelu_bwd_t a = {N, H, dout, dgelu, dx, db};
    run(gelu_bwd_fns, &a, N * H * PS_GELU_BWD, db ? (H + LANES - 1) / LANES : (N * H + LANES - 1) / LANES);
    return MGK_OK;
}

int mgk_ref_gelu_bwd(long long N, int H, const float *dout, const float *dgelu, float *dx, float *db)
{
    if (N < 0 || H < 0 || (N && H && (!dout || !dgelu || !dx))) return MGK_EBADARG;
    for (long long i = 0; i < N * H; i++) {
        dx[i] = dout[i] * dgelu[i];
        if (db) db[i % H] += dx[i];
    }
    return MGK_OK;
}

/* ----------------------------------------------------------------------------
   causal softmax over (L, T, Tk) rows; query i sees keys 0..start+i, the masked tail is skipped, then zeroed */

typedef struct { long long L; int T, Tk, start; float scale; const float *att; float *g; long long lda, ldg; } sm_t;
/* lda, ldg: floats from one row of att (of g) to the next, over all L * T rows (Tk for contiguous items) */

BODY long long visible(long long T, long long Tk, long long start, long long row)   /* keys row may see */
{
    long long n = start + row % T + 1;
    return n < Tk ? n : Tk;
}

BODY void sm_fwd_body(const sm_t *a, int tid, int nt)
{
    const long long T = a->T, Tk = a->Tk, start = a->start;
    const float scale = a->scale;
    long long lo, hi;
    span(a->L * T, tid, nt, 1, &lo, &hi);
    for (long long i = lo; i < hi; i++) {
        float *r = a->g + i * a->ldg;
        long long n = visible(T, Tk, start, i), j;
        /* each pass reads what the one before wrote at the same width or narrower: a load wider than the stores
           it overlaps (a vector over a scalar tail) waits for them to drain, which cost more than the exps here */
        float m = row_max(r, scale, n);                            /* max of s = scale * scores, read-only */
        /* whole blocks of 16 up to P (or Tk), the entries past n set to exactly 0: the sum needs no tail */
        long long P = (n + LANES - 1) / LANES * LANES < Tk ? (n + LANES - 1) / LANES * LANES : Tk;
        for (int k = 0; k < (int)P; k++)                           /* max-subtracted: exp never overflows */
            r[k] = pick(k < (int)n, exp_fast(r[k] * scale - m), 0.0f);    /* int k: SSE2 has no 64-bit compare */
        float inv = (float)(1.0 / row_sum(r, P));
        for (j = 0; j < P; j++) r[j] *= inv;
        for (; j < Tk; j++) r[j] = 0.0f;                           /* the future gets exactly zero weight */
    }
}
VARIANTS(sm_fwd, sm_t)

BODY void sm_bwd_body(const sm_t *a, int tid, int nt)
{
    const long long T = a->T, Tk = a->Tk, start = a->start;
    const float scale = a->scale;
    long long lo, hi;
    span(a->L * T, tid, nt, 1, &lo, &hi);
    for (long long i = lo; i < hi; i++) {
        const float *p = a->att + i * a->lda;
        float *g = a->g + i * a->ldg;
        long long n = visible(T, Tk, start, i), j;
        float d = row_dot(g, p, n);                                /* sum_j datt_j att_j */
        /* fwd: att = softmax(scale s) -> ds = scale att (datt - d) */
        for (j = 0; j < n; j++) g[j] = scale * p[j] * (g[j] - d);
        for (; j < Tk; j++) g[j] = 0.0f;
    }
}
VARIANTS(sm_bwd, sm_t)

int mgk_causal_softmax_fwd(long long L, int T, int Tk, int start, float scale, float *att)
{
    if (L < 0 || T < 0 || Tk < 0 || start < 0 || (L && T && Tk && !att)) return MGK_EBADARG;
    if (Tk == 0) return MGK_OK;
    sm_t a = {L, T, Tk, start, scale, att, att, Tk, Tk};
    run(sm_fwd_fns, &a, L * T * Tk * PS_SM_FWD, L * T);
    return MGK_OK;
}

int mgk_ref_causal_softmax_fwd(long long L, int T, int Tk, int start, float scale, float *att)
{
    if (L < 0 || T < 0 || Tk < 0 || start < 0 || (L && T && Tk && !att)) return MGK_EBADARG;
    for (long long i = 0; i < L * T && Tk; i++) {
        float *r = att + i * Tk, m = -INFINITY, s = 0.0f;
        long long n = start + i % T + 1 < Tk ? start + i % T + 1 : Tk;
        for (long long j = 0; j < n; j++) m = fmaxf(m, r[j] * scale);
        for (long long j = 0; j < n; j++) s += r[j] = expf(r[j] * scale - m);
        for (long long j = 0; j < Tk; j++) r[j] = j < n ? r[j] / s : 0.0f;
    }
    return MGK_OK;
}

int mgk_causal_softmax_bwd(long long L, int T, int Tk, int start, float scale, const float *att, float *datt)
{
    if (L < 0 || T < 0 || Tk < 0 || start < 0 || (L && T && Tk && (!att || !datt))) return MGK_EBADARG;
    if (Tk == 0) return MGK_OK;
    sm_t a = {L, T, Tk, start, scale, att, datt, Tk, Tk};
    run(sm_bwd_fns, &a, L * T * Tk * PS_SM_BWD, L * T);
    return MGK_OK;
}

int mgk_ref_causal_softmax_bwd(long long L, int T, int Tk, int start, float scale, const float *att, float *datt)
{
    if (L < 0 || T < 0 || Tk < 0 || start < 0 || (L && T && Tk && (!att || !datt))) return MGK_EBADARG;
    for (long long i = 0; i < L * T && Tk; i++) {
        const float *p = att + i * Tk;
        float *g = datt + i * Tk, d = 0.0f;
        long long n = start + i % T + 1 < Tk ? start + i % T + 1 : Tk;
        for (long long j = 0; j < n; j++) d += g[j] * p[j];
        for (long long j = 0; j < Tk; j++) g[j] = j < n ? scale * p[j] * (g[j] - d) : 0.0f;
    }
    return MGK_OK;
}

/* one item of mgk_attention_fwd/bwd (mgk_attention.c), on the calling thread: mgk_causal_softmax_fwd over the
   T x Tk rows at g (fwd), or mgk_causal_softmax_bwd of g from att (bwd), rows lda and ldg floats apart; the same
   bits */
void mgk_softmax_item(int fwd, int T, int Tk, int start, float scale, const float *att, long long lda, float *g,
                      long long ldg)
{
    int isa = mgk_isa();
    sm_t a = {1, T, Tk, start, scale, att, g, lda, ldg};
    (fwd ? sm_fwd_fns : sm_bwd_fns)[isa < MGK_ISA_AVX512 ? isa : MGK_ISA_AVX512](&a, 0, 1);
}

/* ----------------------------------------------------------------------------
   softmax cross-entropy: forward keeps the row log-sum-exp, backward writes (softmax - onehot) * scale */

typedef struct { long long N; int V; const float *l; const long long *t; const float *lse; float *lse_out;
                 float scale; float *dl; } xent_t;

BODY void xent_fwd_body(const xent_t *a, int tid, int nt)
{
    const long long V = a->V;
    float e[256];                                                  /* exps of 256 logits at a time */
    long long lo, hi;
    span(a->N, tid, nt, 1, &lo, &hi);
    for (long long i = lo; i < hi; i++) {
        const float *r = a->l + i * V;
        float m = row_max(r, 1.0f, V), s = 0.0f;
        for (long long j0 = 0; j0 < V; j0 += 256) {                /* max-subtracted: no overflow */
            long long n = V - j0 < 256 ? V - j0 : 256;
            for (long long j = 0; j < n; j++) e[j] = exp_fast(r[j0 + j] - m);
            s += row_sum(e, n);
        }
        a->lse_out[i] = (float)((double)m + log((double)s));      /* log-sum-exp, never log(softmax) */
    }
}
VARIANTS(xent_fwd, xent_t)

BODY void xent_bwd_body(const xent_t *a, int tid, int nt)
{
    const long long V = a->V;
    const float scale = a->scale;
    long long lo, hi;
    span(a->N, tid, nt, 1, &lo, &hi);
    for (long long i = lo; i < hi; i++) {
        float *d = a->dl + i * V;
        const float *r = a->l + i * V, li = a->lse[i];
        for (long long j = 0; j < V; j++) d[j] = exp_fast(r[j] - li) * scale;   /* softmax * scale */
        d[a->t[i]] -= scale;                                       /* - onehot * scale */
    }
}
VARIANTS(xent_bwd, xent_t)

static int bad_ids(long long N, const long long *ids, long long n_ids)   /* any id outside [0, n_ids) */
{
    for (long long i = 0; i < N; i++)
        if (ids[i] < 0 || ids[i] >= n_ids) return 1;
    return 0;
}

int mgk_xent_fwd(long long N, int V, const float *logits, const long long *targets, float *lse, double *loss_sum)
{
    if (N < 0 || V < 1 || !loss_sum || (N && (!logits || !targets || !lse)) || bad_ids(N, targets, V))
        return MGK_EBADARG;
    xent_t a = {N, V, logits, targets, NULL, lse, 0.0f, NULL};
    run(xent_fwd_fns, &a, N * V * PS_XENT, N);
    double total = 0.0;                                            /* in row order: independent of threads */
    for (long long i = 0; i < N; i++) total += (double)lse[i] - (double)logits[i * V + targets[i]];
    *loss_sum = total;
    return MGK_OK;
}

int mgk_ref_xent_fwd(long long N, int V, const float *logits, const long long *targets, float *lse,
                     double *loss_sum)
{
    if (N < 0 || V < 1 || !loss_sum || (N && (!logits || !targets || !lse)) || bad_ids(N, targets, V))
        return MGK_EBADARG;
    *loss_sum = 0.0;
    for (long long i = 0; i < N; i++) {
        const float *r = logits + i * V;
        float m = -INFINITY, s = 0.0f;
        for (int j = 0; j < V; j++) m = fmaxf(m, r[j]);
        for (int j = 0; j < V; j++) s += expf(r[j] - m);
        lse[i] = m + logf(s);
        *loss_sum += (double)lse[i] - (double)r[targets[i]];
    }
    return MGK_OK;
}

int mgk_xent_bwd(long long N, int V, const float *logits, const long long *targets, const float *lse, float scale,
                 float *dlogits)
{
    if (N < 0 || V < 1 || (N && (!logits || !targets || !lse || !dlogits)) || bad_ids(N, targets, V))
        return MGK_EBADARG;
    xent_t a = {N, V, logits, targets, lse, NULL, scale, dlogits};
    run(xent_bwd_fns, &a, N * V * PS_XENT, N);
    return MGK_OK;
}

int mgk_ref_xent_bwd(long long N, int V, const float *logits, const long long *targets, const float *lse,
                     float scale, float *dlogits)
{
    if (N < 0 || V < 1 || (N && (!logits || !targets || !lse || !dlogits)) || bad_ids(N, targets, V))
        return MGK_EBADARG;
    for (long long i = 0; i < N; i++) {
        for (int j = 0; j < V; j++) dlogits[i * V + j] = expf(logits[i * V + j] - lse[i]) * scale;
        dlogits[i * V + targets[i]] -= scale;
    }
    return MGK_OK;
}

/* ----------------------------------------------------------------------------
   AdamW (elementwise, flat) and the embedding scatter-add (columns: each dW[r, j] takes its adds in order) */

typedef struct { long long n; float *p, *m, *v; const float *g; float a, rb, decay, b1, c1, b2, c2, eps; } adam_t;

/* coefficients in float32, as numba_kernels.adamw: lr / bc1, 1 / sqrt(bc2), 1 - lr wd, 1 - b1, 1 - b2 rounded once */
static adam_t adam_args(long long n, float *p, const float *g, float *m, float *v, double lr, double b1, double b2,
                        double eps, double wd, double bc1, double bc2)
{
    adam_t a = {n, p, m, v, g, (float)(lr / bc1), (float)(1.0 / sqrt(bc2)), (float)(1.0 - lr * wd),
                (float)b1, (float)(1.0 - b1), (float)b2, (float)(1.0 - b2), (float)eps};
    return a;
}

BODY void adam_body(const adam_t *a, int tid, int nt)
{
    const adam_t c = *a;                                           /* coefficients in registers */
    long long lo, hi;
    span(c.n, tid, nt, LANES, &lo, &hi);
    for (long long i = lo; i < hi; i++) {
        float g = c.g[i];
        float m = c.b1 * c.m[i] + c.c1 * g;                        /* m = b1 m + (1 - b1) g */
        float v = c.b2 * c.v[i] + c.c2 * (g * g);                  /* v = b2 v + (1 - b2) g^2 */
        c.m[i] = m;
        c.v[i] = v;
        c.p[i] = c.p[i] * c.decay - c.a * m / (sqrtf(v) * c.rb + c.eps);   /* decoupled decay, then Adam */
    }
}
VARIANTS(adam, adam_t)

int mgk_adamw(long long n, float *p, const float *g, float *m, float *v, double lr, double b1, double b2,
              double eps, double wd, double bc1, double bc2)
{
    if (n < 0 || (n && (!p || !g || !m || !v))) return MGK_EBADARG;
    adam_t a = adam_args(n, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2);
    run(adam_fns, &a, n * PS_ADAM, (n + LANES - 1) / LANES);
    return MGK_OK;
}

int mgk_ref_adamw(long long n, float *p, const float *g, float *m, float *v, double lr, double b1, double b2,
                  double eps, double wd, double bc1, double bc2)
{
    if (n < 0 || (n && (!p || !g || !m || !v))) return MGK_EBADARG;
    adam_t a = adam_args(n, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2);
    for (long long i = 0; i < n; i++) {
        m[i] = a.b1 * m[i] + a.c1 * g[i];
        v[i] = a.b2 * v[i] + a.c2 * (g[i] * g[i]);
        p[i] = p[i] * a.decay - a.a * m[i] / (sqrtf(v[i]) * a.rb + a.eps);
    }
    return MGK_OK;
}

typedef struct { long long N; int C; float *dW; const long long *idx; const float *dout; } emb_t;

BODY void emb_body(const emb_t *a, int tid, int nt)
{
    const long long C = a->C;
    long long lo, hi;
    span(C, tid, nt, LANES, &lo, &hi);
    for (long long n = 0; n < a->N; n++) {                         /* in order: repeated ids add up in order */
        float *w = a->dW + a->idx[n] * C;
        const float *d = a->dout + n * C;
        for (long long j = lo; j < hi; j++) w[j] += d[j];           /* fwd: out = W[idx] -> dW[idx] += dout */
    }
}
VARIANTS(emb, emb_t)

int mgk_embedding_bwd(long long N, int V, int C, float *dW, const long long *idx, const float *dout)
{
    if (N < 0 || V < 0 || C < 0 || (N && C && (!dW || !dout)) || (N && !idx) || bad_ids(N, idx, V))
        return MGK_EBADARG;
    emb_t a = {N, C, dW, idx, dout};
    run(emb_fns, &a, N * C * PS_EMB, (C + LANES - 1) / LANES);
    return MGK_OK;
}

int mgk_ref_embedding_bwd(long long N, int V, int C, float *dW, const long long *idx, const float *dout)
{
    if (N < 0 || V < 0 || C < 0 || (N && C && (!dW || !dout)) || (N && !idx) || bad_ids(N, idx, V))
        return MGK_EBADARG;
    for (long long n = 0; n < N; n++)
        for (int j = 0; j < C; j++) dW[idx[n] * C + j] += dout[n * C + j];
    return MGK_OK;
}

/* ----------------------------------------------------------------------------
   dropout: element i's mask value comes from 32 random bits, a hash of (seed, i), so threads (and backends) need no
   shared generator state, and no mask is stored: the backward draws it again. mix32: a bijection of 32-bit words;
   its multipliers are those of "lowbias32" (Chris Wellons' hash-prospector search), as numpy_ops.mix32's */

BODY uint32_t mix32(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

/* the two keys of a seed (numpy_ops.dropout_keys) */
BODY void drop_keys(unsigned long long seed, uint32_t *k1, uint32_t *k2)
{
    *k1 = mix32((uint32_t)seed);
    *k2 = mix32((uint32_t)(seed >> 32) ^ mix32(*k1 ^ 0x9e3779b9u));
}

/* y = x * element i's mask value: scale where the 24 high bits of its hash are >= keep_from, else 0 */
BODY float drop_one(uint32_t i, uint32_t k1, uint32_t k2, uint32_t keep_from, float scale, float x)
{
    return x * pick(mix32(mix32(i ^ k1) ^ k2) >> 8 >= keep_from, scale, 0.0f);
}

typedef struct { long long n; uint32_t k1, k2, keep_from; float scale; const float *x; float *y; } drop_t;

BODY void drop_body(const drop_t *a, int tid, int nt)
{
    long long lo, hi;
    span(a->n, tid, nt, LANES, &lo, &hi);
    for (long long i = lo; i < hi; i++)
        a->y[i] = drop_one((uint32_t)i, a->k1, a->k2, a->keep_from, a->scale, a->x[i]);
}
VARIANTS(drop, drop_t)

int mgk_dropout(long long n, unsigned long long seed, unsigned int keep_from, float scale, const float *x, float *y)
{
    if (n < 0 || n > 0xffffffffLL || (n && (!x || !y))) return MGK_EBADARG;
    drop_t a = {n, 0, 0, keep_from, scale, x, y};
    drop_keys(seed, &a.k1, &a.k2);
    run(drop_fns, &a, n * PS_DROPOUT, (n + LANES - 1) / LANES);
    return MGK_OK;
}

int mgk_ref_dropout(long long n, unsigned long long seed, unsigned int keep_from, float scale, const float *x,
                    float *y)
{
    if (n < 0 || n > 0xffffffffLL || (n && (!x || !y))) return MGK_EBADARG;
    uint32_t k1, k2;
    drop_keys(seed, &k1, &k2);
    for (long long i = 0; i < n; i++)
        y[i] = x[i] * ((mix32(mix32((uint32_t)i ^ k1) ^ k2) >> 8) >= keep_from ? scale : 0.0f);
    return MGK_OK;
}

/* the fused attention's dropout of one item (mgk_ops.h), on the calling thread: rows of x times their elements'
   mask values, element (i, j) numbered n0 + i*ldn + j; past column `upto + i` of row i the output is 0 and x is not
   read (the composition's x is 0 there, so the same bits as its product; the fused backward's d(scores) holds what
   its tiles left) */
typedef struct { int rows, cols, upto; uint32_t n0, ldn, k1, k2, keep_from; float scale; const float *x;
                 long long ldx; float *y; long long ldy; } drop_rows_t;

BODY void drop_rows_body(const drop_rows_t *a, int tid, int nt)
{
    (void)tid; (void)nt;
    for (int i = 0; i < a->rows; i++) {
        const float *x = a->x + i * a->ldx;
        float *y = a->y + i * a->ldy;
        uint32_t n = a->n0 + (uint32_t)i * a->ldn;
        int m = a->upto + i + 1 < a->cols ? a->upto + i + 1 : a->cols;
        for (int j = 0; j < m; j++) y[j] = drop_one(n + (uint32_t)j, a->k1, a->k2, a->keep_from, a->scale, x[j]);
        for (int j = m; j < a->cols; j++) y[j] = 0.0f;
    }
}
VARIANTS(drop_rows, drop_rows_t)

void mgk_dropout_keys(unsigned long long seed, unsigned int *k1, unsigned int *k2)
{
    uint32_t a, b;
    drop_keys(seed, &a, &b);
    *k1 = a, *k2 = b;
}

void mgk_dropout_rows(int rows, int cols, int upto, unsigned int n0, unsigned int ldn, unsigned int k1,
                      unsigned int k2, unsigned int keep_from, float scale, const float *x, long long ldx, float *y,
                      long long ldy)
{
    int isa = mgk_isa();
    drop_rows_t a = {rows, cols, upto, n0, ldn, k1, k2, keep_from, scale, x, ldx, y, ldy};
    drop_rows_fns[isa < MGK_ISA_AVX512 ? isa : MGK_ISA_AVX512](&a, 0, 1);
}

typedef struct { long long n; const float *x; float *y; } exp_t;

BODY void exp_body(const exp_t *a, int tid, int nt)
{
    long long lo, hi;
    span(a->n, tid, nt, LANES, &lo, &hi);
    for (long long i = lo; i < hi; i++) a->y[i] = exp_fast(a->x[i]);
}
VARIANTS(exp, exp_t)

int mgk_exp(long long n, const float *x, float *y)
{
    if (n < 0 || (n && (!x || !y))) return MGK_EBADARG;
    exp_t a = {n, x, y};
    run(exp_fns, &a, n * PS_EXP, (n + LANES - 1) / LANES);
    return MGK_OK;
}

/* ----------------------------------------------------------------------------
   products with an op fused (mgk_ops.h): a job of mgk.c's GEMM whose epilogue (job_t.ep) runs the op on each block
   of the result once its sums are final, in the caller's FP mode (mgk_epilogue), with the bits of the product and
   the op called one after the other */

static void gelu_ep(const job_t *g, float *C, int i0, int i1, int j0, int j1)      /* C = gelu(C + b), d = gelu' */
{
    gelu_block(i1 - i0, j1 - j0, C + (long long)i0 * g->ldc + j0, g->ldc, g->ep_bias ? g->ep_bias + j0 : NULL,
               g->ep_d + (long long)i0 * g->ldd + j0, g->ldd);
}

static void mul_ep(const job_t *g, float *C, int i0, int i1, int j0, int j1)       /* C = C * d */
{
    ep_block(EPB_MUL, i1 - i0, j1 - j0, C + (long long)i0 * g->ldc + j0, g->ldc, NULL,
             g->ep_d + (long long)i0 * g->ldd + j0, g->ldd);
}

static void add_ep(const job_t *g, float *C, int i0, int i1, int j0, int j1)       /* C = d + dropout(C + b) */
{
    float *c = C + (long long)i0 * g->ldc + j0;
    const float *d = g->ep_d + (long long)i0 * g->ldd + j0, *b = g->ep_bias ? g->ep_bias + j0 : NULL;
    if (!g->drop) {
        ep_block(EPB_ADD, i1 - i0, j1 - j0, c, g->ldc, b, d, g->ldd);
        return;
    }
    if (b) ep_block(EPB_BIAS, i1 - i0, j1 - j0, c, g->ldc, b, NULL, 0);    /* the composition's three steps */
    mgk_dropout_rows(i1 - i0, j1 - j0, j1 - j0, (unsigned int)((long long)i0 * g->N + j0), (unsigned int)g->N,
                     g->k1, g->k2, g->keep_from, g->drop_scale, c, g->ldc, c, g->ldc);
    ep_block(EPB_ADD, i1 - i0, j1 - j0, c, g->ldc, NULL, d, g->ldd);
}

int mgk_gemm_gelu(int bf16, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *bias,
                  float *C, int ldc, float *dgelu, int ldd)
{
    if (M > 0 && N > 0 && (!dgelu || ldd < N)) return MGK_EBADARG;
    job_t g = mgk_product_job(bf16, 0, 0, M, N, K, A, lda, B, ldb, C, ldc);
    g.ep = gelu_ep, g.ep_bias = bias, g.ep_d = dgelu, g.ldd = ldd;
    return mgk_run_job(&g);
}

int mgk_gemm_mul(int bf16, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                 const float *D, int ldd, float *C, int ldc)
{
    if (M > 0 && N > 0 && (!D || ldd < N)) return MGK_EBADARG;
    job_t g = mgk_product_job(bf16, ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
    g.ep = mul_ep, g.ep_d = (float *)D, g.ldd = ldd;                  /* read only: the scale */
    return mgk_run_job(&g);
}

int mgk_gemm_add(int bf16, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *bias,
                 const float *R, int ldr, float *C, int ldc,
                 int drop, unsigned long long seed, unsigned int keep_from, float drop_scale)
{
    if ((M > 0 && N > 0 && (!R || ldr < N)) || (drop && (long long)M * N > 0xffffffffLL)) return MGK_EBADARG;
    job_t g = mgk_product_job(bf16, 0, 0, M, N, K, A, lda, B, ldb, C, ldc);
    g.ep = add_ep, g.ep_bias = bias, g.ep_d = (float *)R, g.ldd = ldr;    /* read only: the residual */
    if (drop) {
        g.drop = 1, g.keep_from = keep_from, g.drop_scale = drop_scale;
        drop_keys(seed, &g.k1, &g.k2);
    }
    return mgk_run_job(&g);
}
