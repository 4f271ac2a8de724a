/* mgk.c: float32 GEMM for minigpt, C = op(A) @ op(B) + beta*C, row-major (API in mgk.h). This file holds the
   shared pack and causal helpers, bf16 rounding, the scalar reference, the generic instance, the path table,
   threading, the choice of path and the API; each ISA's code is in the .inc files it includes.
   The plain scalar loops (mgk_sgemm_ref) are the reference. The fast paths pack op(A) into MR-row panels and
   op(B) into NR-column panels (transposes happen while packing, so ta/tb cost no copies of the caller's arrays),
   then run a register-blocked micro-kernel; tails are zero-padded in the packs, so every shape takes them.
   Five paths are compiled into the one library, four under their own target pragma and generic for the
   baseline (no -march flag), and mgk_isa() picks one at run time from cpuid (and a measured rate: best_isa), or
   mgk_set_isa() a lower one:
     AVX-512  8x32 tile of zmm FMAs with masked tails, hand-written intrinsics (mgk_avx512.inc); avx512bf16 adds a
              vdpbf16ps kernel for bf16 products on the same tile (mgk_avx512bf16.inc), and amx runs bf16
              products on AMX tiles (mgk_amx.inc, bound to the instructions by mgk_amx_hw.inc)
     AVX2     6x16 tile of ymm FMAs, mgk_gemm_generic.inc compiled for avx2,fma (mgk_avx2.inc)
     generic  4x16 tile, mgk_gemm_generic.inc compiled for the baseline (SSE2 on x86-64; any CPU elsewhere)
   Products of at most SMALL_M rows (decoding) skip packing on AVX-512 and AVX2 (mgk_small.inc; its bf16 products
   round the operands as they are read). The fused attention (mgk_attention.c) runs a head's products on the same
   blocks, through the calls of mgk_job.h.
   A test build (-DMGK_EMULATE_AVX512) runs both AVX-512 paths on the scalar intrinsics of mgk_avx512_emu.h, so
   that CPUs without AVX-512 test them (tests/test_native_emulated.py).
   No -ffast-math: the packed paths sum plain (fused) multiply-adds in k order within each k block (KC deep,
   AVX2_KC on AVX2, KC_DP on vdpbf16ps and AMX), and add each block's sums into C (vdpbf16ps and AMX tiles add
   the two products of each k-pair in the instruction's own order). The few-rows path (small_*) sums a
   transposed op(B) in vector-lane partials, and a product split over k between threads (ksplit) adds the
   threads' partial sums: the same value up to float32 summation order, which depends on the path and the
   thread count.
   bfloat16 products (mgk_bgemm*, mgk.h): both operands are rounded to bf16 as they are packed (on the few-rows
   path, as they are read), and the exact products are summed in float32. generic, avx2 and avx512 round their
   fp32 packs (bf16 values are floats whose low 16 bits are zero); the avx512bf16 path packs k-pairs of bf16 for
   vdpbf16ps, mostly straight from the source, and amx packs straight into bf16 halves (mgk_amx.inc). Every path
   rounds a subnormal operand to zero (bf16_bits_daz, below), as its products would treat it anyway on x86. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif
#include "mgk.h"
#include "mgk_job.h"   /* job_t, and what this file lends the fused attention (mgk_attention.c) */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(MGK_NO_SIMD)
#include <immintrin.h>     /* each intrinsic carries its own target attribute: used only under target pragmas */
#ifdef MGK_EMULATE_AVX512  /* the test build (tests/test_native_emulated.py): AVX-512 intrinsics as scalar lanes */
#include "mgk_avx512_emu.h"
#endif
#endif

#define MR 8       /* micro-tile rows: 8x32 = 16 zmm accumulators */
#ifndef AVX2_MR
#define AVX2_MR 6  /* the AVX2 tile: 6x16 = 12 ymm accumulators */
#define AVX2_NR 16
#endif
#define NR 32      /* micro-tile columns: two zmm vectors */
#ifndef KC
#define KC 256     /* depth of one packed block (AVX-512, generic): a 32-wide B panel (32 KB) stays in L1.
                      KC_MAX below is max(KC, AVX2_KC): a KC over 368 fails the KC_DP asserts, and KC_DP's
                      multiple of 32 needs a KC of whole 16s */
#endif
#ifndef AVX2_KC
#define AVX2_KC 384  /* AVX2's depth: a 16-wide B panel is 24 KB, and a K of 384 or 1536 makes fewer passes over C
                        than with 256 (reports/benchmarks.md: the AVX2 packs and k blocks) */
#endif
#define KC_MAX (KC > AVX2_KC ? KC : AVX2_KC)   /* the deepest fp32 k block */
#define KC_DP (2 * KC)   /* avx512bf16's and amx's depth: k-pairs of bf16 fill a B panel's 32 KB at twice KC (a
                            panel packed through fp32 first takes twice that, in L2), and any K <= 512 is one block
                            (M's 384) */
#ifndef MC
#define MC 192     /* rows of A packed at once (192 KB, in L2) */
#endif
#define MC_TA (2 * MC)   /* ... on the AVX-512 paths' gemm_loops where op(A) = A^T, not causal (the weight
                            gradients x^T dy, K = the batch's tokens; ~390 KB packed): the pack reads whole
                            384-float rows of x, and each packed k block of op(B) serves twice the rows
                            (reports/benchmarks.md: MC_TA). AVX2, generic and amx keep MC */
#ifndef NC
#define NC 2048    /* columns of B packed at once */
#endif
#define PANEL_PAD 2  /* panels of a packed block lie a panel's depth and PANEL_PAD more (k slots or k-pairs) apart
                        (AVX-512 paths: 64 bytes more per 8-row panel of op(A), 256 per 32-column panel of op(B);
                        AVX2 and generic: op(A)'s panels): at 2^n bytes apart (8 KB, 32 KB), the packs that write
                        a row of every panel in turn (pack_at, pack_at_pairs, pack_b_pairs) stored into one set
                        of L1 and missed on each store (reports/benchmarks.md: PANEL_PAD) */
#define BUF_K (KC_MAX + 2 * PANEL_PAD)   /* the depth of the per-thread pack buffers (A_BUF for op(A), BUF_K
                                           x NC for op(B)): the deepest block, and the pads of two (a K of two fp32
                                           k blocks, as config M's 384, keeps its whole op(B) of 1536 columns) */
#define A_BUF ((long)MC_TA * BUF_K)         /* floats of a thread's op(A) pack buffer: MC_TA rows of BUF_K */
#define AMX_LD(kp) ((kp) + 32)              /* amx (mgk_amx.inc): bf16 from one packed row of op(A) to the next */
#define AMX_PANEL(kp) ((long)(kp) * 8 + 16) /* ... and words from one packed panel of op(B) to the next */
_Static_assert(KC_DP % 32 == 0 && MC % 32 == 0 && NC % 32 == 0 && (long)MC * AMX_LD(KC_DP) / 2 <= A_BUF &&
               NC / 16 * AMX_PANEL(KC_DP) <= (long)NC * BUF_K,
               "the amx packs (k, rows and columns padded to 32; rows AMX_LD, panels AMX_PANEL apart) fit the buffers");
_Static_assert((long)MC_TA * (KC_DP / 2 + PANEL_PAD) + (long)KC_DP * MR <= A_BUF &&
               (long)NC * (KC_DP / 2 + PANEL_PAD) + (long)KC_DP * NR <= (long)NC * BUF_K,
               "the k-pair packs of a KC_DP block (panels PANEL_PAD apart), and the last panel's fp32 before pairing, "
               "fit the pack buffers");
_Static_assert(MC % MR == 0 && MC % AVX2_MR == 0 && MC % 4 == 0,
               "pack_a pads the last row panel to a whole tile inside the A_BUF buffer: MC is whole tiles of rows");
#ifndef SMALL_M
#define SMALL_M 8  /* products with at most this many rows skip packing (mgk_small.inc): decoding, a few samples */
#endif
#define PF_ROWS 8  /* the packs that read a row of the source at a time prefetch the one this far ahead */

/* prefetch n rows of len floats at p, ld floats apart (every cache line, the last included): for packs whose
   source rows are short pieces of a long stride (attention's heads in the fused qkv, A^T's rows), which the
   hardware's prefetchers miss. Plain GNU C, inlined into every ISA path's packs */
static inline __attribute__((always_inline)) void prefetch_rows(const float *p, long ld, int n, int len)
{
    for (int r = 0; r < n && len > 0; r++) {
        for (int k = 0; k < len; k += 16) __builtin_prefetch(p + r * ld + k);
        __builtin_prefetch(p + r * ld + len - 1);
    }
}


/* rows i0..i0+mc of op(A) = A^T (ta), k0..k0+kc -> every row panel (mr rows each: the path's tile) at once, panel
   ir at ap + ir*d with d = kc + PANEL_PAD, as each path's pack_a lays one out (ap[k*mr + i]); reading A a row
   (one k) at a time, its mc floats in order. A pack_a of A^T reads a column strip of A per panel instead (mr
   floats of each of kc rows: a new cache line each; reports/benchmarks.md: pack_at). The row PF_ROWS
   ahead is prefetched: the rows are short pieces of a long stride, which the hardware's prefetchers miss. Plain
   C, inlined into every ISA path with its mr a constant */
static inline __attribute__((always_inline)) void pack_at(const job_t *g, const float *A, int i0, int mc, int k0,
                                                          int kc, float *ap, int mr)
{
    long d = kc + PANEL_PAD;
    for (int k = 0; k < kc; k++) {
        const float *a = A + (long)(k0 + k) * g->lda + i0;
        int ir = 0;
        if (k + PF_ROWS < kc)
            prefetch_rows(a + PF_ROWS * (long)g->lda, 0, 1, mc);
        for (; ir + mr <= mc; ir += mr)
            memcpy(ap + ir * d + k * mr, a + ir, sizeof(float) * (size_t)mr);
        for (int i = 0; ir < mc && i < mr; i++)                 /* the last panel's rows beyond mc are zero */
            ap[ir * d + k * mr + i] = ir + i < mc ? a[ir + i] : 0.0f;
    }
}

/* mgk_gemm_causal's skipping. causal_k: the part [*k0, *k1) of the k block pc..pc+kc in which rows i0..i0+mr of
   op(A) can hold nonzeros (MGK_CAUSAL_A; all of it otherwise), widened to even ends (or kc), so that it is whole
   k-pairs for vdpbf16ps; only that part of the row panel is packed and multiplied. */
static inline void causal_k(const job_t *g, int i0, int mr, int pc, int kc, int *k0, int *k1)
{
    *k0 = 0;
    *k1 = kc;
    if (g->causal != MGK_CAUSAL_A) return;
    if (g->ta) {                                          /* op(A)[i, k] = A[k, i]: zero for k < i - start */
        long long lo = (long long)i0 - g->start - pc;     /* long long: start may be any int */
        *k0 = lo <= 0 ? 0 : lo < kc ? (int)lo & ~1 : kc;
    } else {                                              /* op(A)[i, k] = A[i, k]: zero for k > i + start */
        long long hi = (long long)i0 + mr + g->start - pc;
        *k1 = hi <= 0 ? 0 : hi + 1 < kc ? (int)(hi + 1) & ~1 : kc;
    }
}

/* MGK_CAUSAL_OUT: the micro-tile of rows i0..i0+mr at column j0 holds only entries past the diagonal (a batched
   product zeroes them after the product, by zero_future; the fused attention's softmax writes them) */
static inline int causal_past(const job_t *g, int i0, int mr, int j0)
{
    return g->causal == MGK_CAUSAL_OUT && j0 > (long long)i0 + mr - 1 + g->start;
}

/* causal_k for amx's tiles: k0 down and k1 up to multiples of 32 (k1 at most kc rounded up to 32); empty stays
   empty */
static inline void causal_k32(const job_t *g, int i0, int mr, int pc, int kc, int *k0, int *k1)
{
    causal_k(g, i0, mr, pc, kc, k0, k1);
    int empty = *k0 >= *k1;
    *k0 &= ~31;
    *k1 = empty ? *k0 : (*k1 + 31) & ~31;
}

/* offset of item l of the batch, in floats, for outer/inner strides s1/s2 */
static inline long long item(const job_t *g, int l, long long s1, long long s2)
{
    return (long long)(l / g->L2) * s1 + (long long)(l % g->L2) * s2;
}

/* ----------------------------------------------------------------------------
   bfloat16 = the top 16 bits of a float32. bf16_bits(x): x rounded to the nearest bf16, ties to even, as
   float32 bits whose low 16 bits are zero; a NaN stays a NaN (made quiet), a finite value from halfway past the
   largest bf16 on (3.3962e38; the largest is 3.3895e38) rounds to inf. Plain C, always inlined: each ISA's file
   (mgk_avx512.inc, mgk_avx2.inc, ...) vectorizes it for its own target. */
static inline __attribute__((always_inline)) uint32_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u | 0x00400000u) & 0xffff0000u;    /* NaN */
    return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;   /* + half an ulp of bf16, odd halves up */
}

/* How every fast path rounds a bf16 product's operands: bf16_bits, but a subnormal x is a zero of its sign, as
   the instruction vcvtneps2bf16 rounds (the avx512bf16 and amx paths' packs use it). On x86 their products treat
   subnormal inputs as zero anyway (the fp32 FMAs run with denormals-are-zero set, mgk_pool.c; vdpbf16ps and the
   tiles always do); rounding them to zero first also zeroes the largest ones, which bf16_bits rounds up to the
   smallest normal (1.1755e-38), so that every path gives the same bits. The scalar reference (ref_operand) and
   mgk_round_bf16 keep bf16_bits, the specification's rounding. */
static inline __attribute__((always_inline)) uint32_t bf16_bits_daz(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7f800000u ? bf16_bits(x) : u & 0x80000000u;
}

/* bf16_bits_daz on every lane of u, a GCC vector of uint32 of type T (any width): the same operations, for the
   few-rows path (mgk_small.inc; the packs of avx512bf16 and amx round with the instruction itself). u is read
   several times: pass a variable */
#define BF16_DAZ_VEC(T, u) __extension__({                                                             \
        T nan_ = (T)(((u) & 0x7fffffffu) > 0x7f800000u);            /* all ones in NaN lanes */         \
        T sub_ = (T)(((u) & 0x7f800000u) == 0);                     /* ... in zero and subnormal ones */ \
        ((((u) + 0x7fffu + (((u) >> 16) & 1u)) & ~(nan_ | sub_)) | (((u) | 0x00400000u) & nan_) |         \
         ((u) & 0x80000000u & sub_)) & 0xffff0000u; })

/* p[0:n] = bf16(p[0:n]) in place (bf16_bits_daz): a packed panel becomes bf16 values in float32 slots */
static inline __attribute__((always_inline)) void round_bf16(float *p, long n)
{
    for (long i = 0; i < n; i++) {
        uint32_t r = bf16_bits_daz(p[i]);
        memcpy(p + i, &r, 4);
    }
}

int mgk_round_bf16(long long n, const float *x, float *out)
{
    if (n < 0 || (n && (!x || !out))) return MGK_EBADARG;
    for (long long i = 0; i < n; i++) {
        uint32_t r = bf16_bits(x[i]);
        memcpy(out + i, &r, 4);
    }
    return MGK_OK;
}

static int n_threads;                  /* 0 = not set yet -> number of online CPUs */
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;  /* one GEMM (or fused attention: mgk_call_lock) at a time:
                                                                buffers are per thread id */

/* the child of a fork() has only the thread that forked: call_mu, held by another thread of the parent that was
   inside a product, starts free there (as the pool's locks do: mgk_pool.c) */
static void free_call_mu_after_fork(void)
{
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    call_mu = m;
}
__attribute__((constructor)) static void at_load(void) { pthread_atfork(NULL, NULL, free_call_mu_after_fork); }

static int bad_args(int ta, int tb, int M, int N, int K, const void *A, int lda, const void *B, int ldb,
                    const void *C, int ldc)
{
    if (M < 0 || N < 0 || K < 0) return 1;
    if (ldc < N || lda < (ta ? M : K) || ldb < (tb ? K : N)) return 1;
    if ((M && N && !C) || (M && N && K && (!A || !B))) return 1;
    return 0;
}

/* ----------------------------------------------------------------------------
   scalar references: C[i,j] = sum_k op(A)[i,k] * op(B)[k,j] (+ beta*C[i,j]); float accumulation in k order.
   bf16: each operand rounded first (an exact product of two bf16 values fits a float) */
static inline float ref_operand(float x, int bf16)
{
    if (!bf16) return x;
    uint32_t r = bf16_bits(x);
    memcpy(&x, &r, 4);
    return x;
}

static int gemm_ref(int bf16, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
                    int ldb, float beta, float *C, int ldc)
{
    if (bad_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc)) return MGK_EBADARG;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += ref_operand(ta ? A[(long)k * lda + i] : A[(long)i * lda + k], bf16) *
                     ref_operand(tb ? B[(long)j * ldb + k] : B[(long)k * ldb + j], bf16);
            float *c = &C[(long)i * ldc + j];
            *c = beta == 0.0f ? s : s + beta * *c;
        }
    return MGK_OK;
}

int mgk_sgemm_ref(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc)
{
    return gemm_ref(0, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

int mgk_bgemm_ref(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc)
{
    return gemm_ref(1, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(MGK_NO_SIMD)
#define MGK_X86 1
#if defined(__x86_64__) && (__GNUC__ >= 11 || defined(__clang__))
#define MGK_BF16 1         /* the avx512bf16 and amx paths: their intrinsics and cpuid names need GCC 11 */
#endif
/* The AVX-512 regions' targets. The test build -DMGK_EMULATE_AVX512 compiles them for AVX2+FMA instead, on the
   scalar intrinsics of mgk_avx512_emu.h, and reports avx512bf16 as this CPU's path (mgk_cpu_isa); it has no amx
   path, whose tiles the tests run on the scalar tile emulation of mgk_amx_emu.inc (mgk_emulate_amx). */
#ifdef MGK_EMULATE_AVX512
#define TARGET_AVX512 _Pragma("GCC target(\"avx2,fma\")")
#define TARGET_AVX512BF16 TARGET_AVX512
#else
#define TARGET_AVX512 _Pragma("GCC target(\"avx512f,avx512dq,avx512vl,avx512bw,avx2,fma\")")
#define TARGET_AVX512BF16 _Pragma("GCC target(\"avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,avx2,fma\")")
#if defined(MGK_BF16)
#define MGK_AMX 1
#endif
#endif

/* ----------------------------------------------------------------------------
   8x8 register transposes shared by the ISA files' packs (AVX-512's, AVX2's tr6x8, avx512bf16's pair_rows8,
   amx's TRANSPOSE8), in place, up to their 128-bit halves: r[i] = row
   i -> r[c] holds rows 0-3 of column c in its low half and of column c+4 in its high half, r[4+c] rows 4-7 (c < 4) */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
static inline __attribute__((always_inline)) void transpose_quads(__m256 r[8])
{
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);          /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);      /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            __m256d x = _mm256_castps_pd(t[i + h]), y = _mm256_castps_pd(t[i + h + 2]);
            r[i + 2 * h] = _mm256_castpd_ps(_mm256_unpacklo_pd(x, y));      /* a0 b0 c0 d0 | a4 .. d4 */
            r[i + 2 * h + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(x, y));  /* a1 b1 c1 d1 | a5 .. d5 */
        }
}

/* dst[c*ldd + r] = src[r*lds + c] for an 8x8 block */
static inline __attribute__((always_inline)) void tr8x8(const float *src, long lds, float *dst, long ldd)
{
    __m256 r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    transpose_quads(r);
    for (int c = 0; c < 4; c++) {                        /* column c from r[c] (rows 0-3) and r[4+c] (rows 4-7) */
        _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
        _mm256_storeu_ps(dst + (c + 4) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
    }
}
#pragma GCC pop_options

#include "mgk_avx512.inc"     /* AVX-512 and avx512bf16: packs, micro-kernels, blocked loops */

#include "mgk_avx2.inc"       /* AVX2+FMA: mgk_gemm_generic.inc on ymm, the few-rows product */

#include "mgk_amx_hw.inc"     /* amx: mgk_amx.inc on the CPU's tiles */
#endif

#define GV(name) name##_generic
#define GV_W 4
#define GV_MR 4
#define GV_NR 16
#define GV_KC KC
#include "mgk_gemm_generic.inc"
#undef GV
#undef GV_W
#undef GV_MR
#undef GV_NR
#undef GV_KC

#include "mgk_amx_emu.inc"    /* amx: mgk_amx.inc on emulated tiles (the tests, any CPU) */

/* ----------------------------------------------------------------------------
   the paths: one entry per ISA, in mgk.h's MGK_ISA_* order (mgk_isa() indexes it): its tile, its blocked products
   (fp32, bf16), its few-rows product and its peak loops; a job reads only the entry choose_path() gave it */
typedef void block_fn(const job_t *g, const float *A, const float *B, float *C, int m0, int m1, int n0, int n1,
                      float *ap, float *bp);
typedef void small_fn(const job_t *g, const float *A, const float *B, float *C, int n0, int n1);
typedef void peak_fn(void *arg, int tid, int nt);
struct isa_gemm {
    const char *name;
    int mr, nr;                /* micro-tile: the unit of the thread grid */
    int bf16_mr, bf16_nr;      /* ... of bf16 products (amx: 32 x 32) */
    block_fn *block;           /* float32 products */
    block_fn *bf16_block;      /* bf16 products (mgk_bgemm*) */
    small_fn *small;           /* the few-rows product, unpacked (mgk_small.inc); NULL: packed blocks always */
    peak_fn *peak, *bf16_peak;
    int peak_flops;            /* flops of one iteration of the peak loop: 2 x chains x floats per vector */
    int bf16_peak_flops;       /* ... of the bf16 peak loop (0: bf16 products run on the fp32 FMAs) */
};
static const struct isa_gemm ISA_GEMM[] = {
    {"generic", 4, 16, 4, 16, gemm_block_generic, gemm_block_generic, NULL, peak_job_generic, NULL, 2 * 12 * 4, 0},
#ifdef MGK_X86
    {"avx2", AVX2_MR, AVX2_NR, AVX2_MR, AVX2_NR, gemm_block_avx2, gemm_block_avx2, small_block_avx2, peak_job_avx2,
     NULL, 2 * 12 * 8, 0},
    {"avx512", MR, NR, MR, NR, gemm_block, gemm_block, small_block_avx512, peak_job, NULL, 2 * 16 * 16, 0},
#ifdef MGK_BF16
    {"avx512bf16", MR, NR, MR, NR, gemm_block, gemm_block_dp, small_block_avx512, peak_job, peak_job_dp, 2 * 16 * 16,
     2 * 16 * 32},
#endif
#ifdef MGK_AMX
    {"amx", MR, NR, 32, 32, gemm_block, gemm_block_amx_amx, small_block_avx512, peak_job, peak_job_amx, 2 * 16 * 16,
     4 * 2 * 16 * 16 * 32 / 8},
#endif
#endif
};

/* mgk_emulate_amx(1): bf16 products on the amx path's code with the tiles emulated (its thread grid, no few-rows
   path; choose_path() keeps fp32 products on the path in use, so the entry's fp32 fields are never used) */
static const struct isa_gemm AMX_EMULATED = {"amx (emulated tiles)", 4, 16, 32, 32, gemm_block_generic,
                                             gemm_block_amx_amxemu, NULL, peak_job_generic, NULL, 2 * 12 * 4, 0};
static int amx_emulation;

/* the unit of the thread grid: a block edge between threads falls on a micro-tile edge */
static inline int tile_m(const job_t *g) { return g->bf16 ? g->isa->bf16_mr : g->isa->mr; }
static inline int tile_n(const job_t *g) { return g->bf16 ? g->isa->bf16_nr : g->isa->nr; }

/* ----------------------------------------------------------------------------
   threading: split the batch over threads, or each product over a pm x pn grid of tile-aligned blocks */
static float *bufs[256][2];   /* per thread id: packed A (A_BUF), packed B (BUF_K x NC); allocated once */

static void split(int n, int unit, int parts, int p, int *lo, int *hi)
{
    int tiles = (n + unit - 1) / unit;
    *lo = (int)((long)tiles * p / parts) * unit;
    *hi = (int)((long)tiles * (p + 1) / parts) * unit;
    if (*hi > n) *hi = n;
}

void mgk_epilogue(const job_t *g, float *C, int i0, int i1, int j0, int j1)
{
    if (!g->ep || i0 >= i1 || j0 >= j1) return;
#ifdef MGK_X86
    unsigned int own = _mm_getcsr();
    _mm_setcsr(g->csr);                        /* the composition's bits: it computes in the caller's mode */
#endif
    g->ep(g, C, i0, i1, j0, j1);
#ifdef MGK_X86
    _mm_setcsr(own);
#endif
}

/* MGK_CAUSAL_OUT: C[i, j] = 0 past the diagonal (j > start + i) in rows m0..m1, columns n0..n1 of one item */
static void zero_future(const job_t *g, float *C, int m0, int m1, int n0, int n1)
{
    for (int i = m0; i < m1; i++) {
        long j = (long)i + g->start + 1 > n0 ? (long)i + g->start + 1 : n0;
        if (j < n1) memset(C + (long)i * g->ldc + j, 0, sizeof(float) * (size_t)(n1 - j));
    }
}

/* block C[m0:m1, n0:n1] of one item, on thread tid: the few-rows path or the ISA's packed block; a causal
   product's future is left as the tiles wrote it (mgk_job.h) */
void mgk_item_block(const job_t *g, const float *A, const float *B, float *C, int m0, int m1, int n0, int n1, int tid)
{
    if (g->small) {
        g->isa->small(g, A, B, C, n0, n1);   /* all rows; no causal skipping there */
        if (g->ep) mgk_epilogue(g, C, 0, g->M, n0, n1);
    } else
        (g->bf16 ? g->isa->bf16_block : g->isa->block)(g, A, B, C, m0, m1, n0, n1, bufs[tid][0], bufs[tid][1]);
}

static void run_job(void *arg, int tid, int nt)
{
    job_t *g = arg;
    if (!bufs[tid][0]) return;
    if (g->ksplit) {                                       /* one product, rows k0..k1 of B into this thread's sum */
        job_t h = *g;
        int k0, k1;
        split(g->K, 16, nt, tid, &k0, &k1);
        h.K = k1 > k0 ? k1 - k0 : 0;
        if (tid > 0) { h.C = bufs[tid][1]; h.ldc = g->N; h.beta = 0.0f; }   /* added into C by run() */
        g->isa->small(&h, g->A + (long)k0 * (g->ta ? g->lda : 1), g->B + (long)k0 * g->ldb, h.C, 0, g->N);
        return;
    }
    for (int l = 0; l < g->L; l++) {
        int m0 = 0, m1 = g->M, n0 = 0, n1 = g->N;
        if (g->pm == 0) {                                  /* batch split: items tid, tid+nt, ... */
            if (l % nt != tid) continue;
        } else {
            split(g->M, tile_m(g), g->pm, tid % g->pm, &m0, &m1);
            split(g->N, tile_n(g), g->pn, tid / g->pm, &n0, &n1);
            if (m0 >= m1 || n0 >= n1) continue;
        }
        float *C = g->C + item(g, l, g->sC, g->sC2);
        mgk_item_block(g, g->A + item(g, l, g->sA, g->sA2), g->B + item(g, l, g->sB, g->sB2), C, m0, m1, n0, n1, tid);
        if (g->causal == MGK_CAUSAL_OUT)
            zero_future(g, C, m0, m1, n0, n1);
    }
}

static int threads_now(void)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)(n < 256 ? n : 256) : 1;
    }
    return n_threads;
}

int mgk_set_num_threads(int n)
{
    if (n < 1) return MGK_EBADARG;
    n_threads = n < 256 ? n : 256;
    return MGK_OK;
}

int mgk_get_num_threads(void) { return threads_now(); }

int mgk_abi(void) { return MGK_ABI; }

/* ----------------------------------------------------------------------------
   the choice of path: the best the CPU runs (cpuid, and a measured rate for avx512bf16), once; mgk_set_isa
   (MINIGPT_ISA, the tests) forces a lower one */
#ifdef MGK_BF16
/* the CPU has AMX-BF16 tiles and Linux lets this process use them (asked once; see mgk_amx_hw.inc) */
static int amx_allowed(void)
{
    static int allowed = -1;
    if (allowed < 0) {
        allowed = 0;
#if defined(__linux__) && defined(MGK_AMX)
        if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16"))
            allowed = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#endif
    }
    return allowed;
}
#endif

int mgk_cpu_isa(void)
{
#ifdef MGK_X86
    __builtin_cpu_init();   /* libgcc also checks that the OS saves the ymm/zmm state (XCR0) */
#ifdef MGK_EMULATE_AVX512
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#ifdef MGK_BF16
        return MGK_ISA_AVX512BF16;          /* the test build: the AVX-512 paths run on AVX2 (see the top) */
#else
        return MGK_ISA_AVX512;
#endif
#endif
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
#ifdef MGK_BF16
        return !__builtin_cpu_supports("avx512bf16") ? MGK_ISA_AVX512 : amx_allowed() ? MGK_ISA_AMX
                                                                                      : MGK_ISA_AVX512BF16;
#else
        return MGK_ISA_AVX512;
#endif
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return MGK_ISA_AVX2;
#endif
    return MGK_ISA_GENERIC;
}

static int isa_now = -1;               /* -1: not chosen yet -> best_isa() */

#ifdef MGK_BF16
static double peak_once(peak_fn *fn, int flops, long long iters)   /* GFLOP/s of one peak loop on this thread */
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fn(&iters, 0, 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return s > 0 ? (double)flops * (double)iters / s * 1e-9 : 0.0;
}
#endif

/* the fastest path: the highest the CPU runs, except that a bf16 path must beat fp32 FMAs on rounded operands
   by its own measured rate (vdpbf16ps does twice an FMA's work on some CPUs and half of it on others): the best
   of 3 short register-only loops each */
#define BF16_MIN_GAIN 1.2   /* a bf16 path must beat the fp32 FMAs by this margin: the rounding and k-pair packs
                               cost time that only a clearly faster dot product wins back */
static int best_isa(void)
{
    int isa = mgk_cpu_isa();                   /* amx: taken without a rate check (the tiles outrun the FMAs) */
#ifdef MGK_BF16
    if (isa == MGK_ISA_AVX512BF16) {
        const struct isa_gemm *b = &ISA_GEMM[MGK_ISA_AVX512BF16];
        double fp32 = 0, bf16 = 0;
        for (int r = 0; r < 3; r++) {
            double f = peak_once(b->peak, b->peak_flops, 200000);
            double h = peak_once(b->bf16_peak, b->bf16_peak_flops, 200000);
            fp32 = f > fp32 ? f : fp32;
            bf16 = h > bf16 ? h : bf16;
        }
        if (bf16 < BF16_MIN_GAIN * fp32) isa = MGK_ISA_AVX512;
    }
#endif
    return isa;
}

int mgk_isa(void)
{
    if (isa_now < 0) isa_now = best_isa();
    return isa_now;
}

int mgk_set_isa(int isa)
{
    if (isa < MGK_ISA_GENERIC || isa > mgk_cpu_isa()) return MGK_EBADARG;
    isa_now = isa;
    return MGK_OK;
}

/* pick the thread grid: split the batch when it divides well, else a pm x pn grid minimising the largest
   block's work (rows*cols) plus its packing (~8 flops' worth per packed element) */
static int plan(job_t *g)
{
    int nt = threads_now();
    double flops = 2.0 * g->M * g->N * (g->K + 1) * g->L;
    if (flops < 4e5) nt = 1;                   /* this little work: waking a thread costs more than it saves */
    g->pm = 0; g->pn = 1;
    if (g->L >= nt && (g->L % nt == 0 || g->L >= 4 * nt)) return nt;
    if (g->small) {                            /* few rows: split K (each thread streams its own rows of B), */
        g->ksplit = !g->tb && g->L == 1 && (long)g->M * g->N <= (long)KC * NC && g->K >= 64 * nt && !g->causal
                    && !g->ep;                 /* an epilogue needs the summed result */
        g->pm = 1; g->pn = nt;                 /* else the columns */
        return nt;
    }
    double best = 0;
    for (int pm = 1; pm <= nt; pm++) {
        if (nt % pm) continue;
        int pn = nt / pm;
        int mr = tile_m(g), nr = tile_n(g);
        double rows = (double)(((g->M + mr - 1) / mr + pm - 1) / pm) * mr;
        double cols = (double)(((g->N + nr - 1) / nr + pn - 1) / pn) * nr;
        double cost = rows * cols + 8.0 * (rows + cols);
        if (best == 0 || cost < best) { best = cost; g->pm = pm; g->pn = pn; }
    }
    return nt;
}

/* the path that runs g (under call_mu): the ISA's, or the emulated tiles; the few-rows path where it has one */
static void choose_path(job_t *g)
{
    g->isa = amx_emulation && g->bf16 ? &AMX_EMULATED : &ISA_GEMM[mgk_isa()];
    g->small = g->small && g->isa->small != NULL;         /* the job's own path, read once: not mgk_isa() again */
}

/* the pack buffers of threads 0..nt-1 (under call_mu), allocated on first use (mgk_job.h) */
int mgk_alloc_bufs(int nt)
{
    for (int t = 0; t < nt; t++)
        for (int b = 0; b < 2; b++)
            if (!bufs[t][b] && !(bufs[t][b] = aligned_alloc(64, sizeof(float) * (b ? (long)BUF_K * NC : A_BUF))))
                return MGK_ENOMEM;
    return MGK_OK;
}

/* one item's product, for the fused attention (mgk_job.h): beta 0, its path chosen as run() chooses it */
job_t mgk_item_job(int bf16, int start, int ta, int tb, int M, int N, int K, int lda, int ldb, int ldc, int causal)
{
    job_t g = {NULL, ta, tb, M, N, K, lda, ldb, ldc, 1, NULL, NULL, NULL, 0.0f, 0, 0, 0, 1, 0, 0, 0, 0, 1,
               M <= SMALL_M && !(ta && tb), 0, bf16, causal, start};
    choose_path(&g);
    return g;
}

void mgk_call_lock(void) { pthread_mutex_lock(&call_mu); }
void mgk_call_unlock(void) { pthread_mutex_unlock(&call_mu); }

static int run(job_t *g)
{
    if (g->M == 0 || g->N == 0 || g->L == 0) return MGK_OK;
    pthread_mutex_lock(&call_mu);
    choose_path(g);
    int nt = plan(g), rc = mgk_alloc_bufs(nt);
    if (rc == MGK_OK) {
#ifdef MGK_X86
        unsigned int csr = g->csr = _mm_getcsr();
        mgk_pool_set_ftz();                    /* the caller computes too; its FP mode is restored below */
#endif
        rc = mgk_pool_run(run_job, g, nt);
        if (rc == MGK_OK && g->ksplit)         /* C += the other threads' partial sums, in thread order (none
                                                  if the pool could not start: C is left as it was) */
            for (int t = 1; t < nt; t++)
                for (int i = 0; i < g->M; i++)
                    for (int j = 0; j < g->N; j++)
                        g->C[(long)i * g->ldc + j] += bufs[t][1][(long)i * g->N + j];
#ifdef MGK_X86
        _mm_setcsr(csr);
#endif
    }
    pthread_mutex_unlock(&call_mu);
    return rc;
}

/* ----------------------------------------------------------------------------
   exported entry points */
int mgk_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc)
{
    return mgk_sgemm_batched(1, 1, ta, tb, M, N, K, A, lda, 0, 0, B, ldb, 0, 0, beta, C, ldc, 0, 0);
}

static int gemm_batched(int bf16, int causal, int start, int L1, int L2, int ta, int tb, int M, int N, int K,
                        const float *A, int lda, long long sA1, long long sA2,
                        const float *B, int ldb, long long sB1, long long sB2,
                        float beta, float *C, int ldc, long long sC1, long long sC2)
{
    if (L1 < 0 || L2 < 1 || (long long)L1 * L2 > 0x7fffffff || sA1 < 0 || sB1 < 0 || sC1 < 0 || sA2 < 0 ||
        sB2 < 0 || sC2 < 0 || bad_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc))
        return MGK_EBADARG;
    /* small: few rows skip packing (bf16 too: mgk_small.inc rounds as it reads) */
    job_t g = {NULL, ta != 0, tb != 0, M, N, K, lda, ldb, ldc, L1 * L2, A, B, C, beta, sA1, sB1, sC1, L2, sA2, sB2, sC2,
               0, 1, M <= SMALL_M && !(ta && tb), 0, bf16, causal, start};
    return run(&g);
}

int mgk_gemm_causal(int causal, int start, int bf16, int L1, int L2, int ta, int tb, int M, int N, int K,
                    const float *A, int lda, long long sA1, long long sA2,
                    const float *B, int ldb, long long sB1, long long sB2,
                    float beta, float *C, int ldc, long long sC1, long long sC2)
{
    if ((causal != MGK_CAUSAL_OUT && causal != MGK_CAUSAL_A) || start < 0 || (causal == MGK_CAUSAL_OUT && beta != 0.0f))
        return MGK_EBADARG;
    return gemm_batched(bf16 != 0, causal, start, L1, L2, ta, tb, M, N, K, A, lda, sA1, sA2, B, ldb, sB1, sB2, beta,
                        C, ldc, sC1, sC2);
}

int mgk_sgemm_batched(int L1, int L2, int ta, int tb, int M, int N, int K,
                      const float *A, int lda, long long sA1, long long sA2,
                      const float *B, int ldb, long long sB1, long long sB2,
                      float beta, float *C, int ldc, long long sC1, long long sC2)
{
    return gemm_batched(0, 0, 0, L1, L2, ta, tb, M, N, K, A, lda, sA1, sA2, B, ldb, sB1, sB2, beta, C, ldc, sC1, sC2);
}

int mgk_bgemm_batched(int L1, int L2, int ta, int tb, int M, int N, int K,
                      const float *A, int lda, long long sA1, long long sA2,
                      const float *B, int ldb, long long sB1, long long sB2,
                      float beta, float *C, int ldc, long long sC1, long long sC2)
{
    return gemm_batched(1, 0, 0, L1, L2, ta, tb, M, N, K, A, lda, sA1, sA2, B, ldb, sB1, sB2, beta, C, ldc, sC1, sC2);
}

int mgk_bgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc)
{
    return mgk_bgemm_batched(1, 1, ta, tb, M, N, K, A, lda, 0, 0, B, ldb, 0, 0, beta, C, ldc, 0, 0);
}

job_t mgk_product_job(int bf16, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
                      int ldb, float *C, int ldc)
{
    job_t g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .L = 1, .A = A,
               .B = B, .C = C, .L2 = 1, .small = M <= SMALL_M && !(ta && tb), .bf16 = bf16 != 0};
    return g;
}

int mgk_run_job(job_t *g)
{
    if (bad_args(g->ta, g->tb, g->M, g->N, g->K, g->A, g->lda, g->B, g->ldb, g->C, g->ldc)) return MGK_EBADARG;
    return run(g);
}

int mgk_emulate_amx(int on)
{
    pthread_mutex_lock(&call_mu);              /* not while a product runs */
    amx_emulation = on != 0;
    pthread_mutex_unlock(&call_mu);
    return MGK_OK;
}

static double peak_gflops(int bf16, long long iters)
{
    if (iters <= 0) return 0.0;
    const struct isa_gemm *isa = &ISA_GEMM[mgk_isa()];
    int own = bf16 && isa->bf16_peak;          /* else bf16 products run on the fp32 FMAs */
    struct timespec t0, t1;
    pthread_mutex_lock(&call_mu);
    int nt = threads_now();
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = mgk_pool_run(own ? isa->bf16_peak : isa->peak, &iters, nt);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_mutex_unlock(&call_mu);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (rc != MGK_OK || s <= 0) return 0.0;                /* nothing ran, or no time to divide by */
    return (double)(own ? isa->bf16_peak_flops : isa->peak_flops) * (double)iters * nt / s * 1e-9;
}

double mgk_peak_gflops(long long iters) { return peak_gflops(0, iters); }
double mgk_peak_bf16_gflops(long long iters) { return peak_gflops(1, iters); }

const char *mgk_isa_name(int isa)
{
    return isa >= 0 && isa <= mgk_cpu_isa() ? ISA_GEMM[isa].name : "?";
}
