/* mgk.h: the C API of the GEMM, the fused attention built on it, and the thread pool (native/mgk.c, mgk_attention.c,
   mgk_pool.c; the other ops, and the products with one of them fused: mgk_ops.h), loaded by
   minigpt/backends/native.py. Row-major float32 GEMM: C = op(A) @ op(B) + beta*C, op(X) = X or X^T by flag (ta,
   tb); beta == 0 never reads C. Every function that does work or sets
   a value returns MGK_OK (0) or a negative MGK_E* code (the queries return their value, and the peak loops GFLOP/s,
   0.0 on failure); nothing here allocates per call (packing buffers are allocated once per thread, on first use; the
   fused attention's per-thread scratch, the backward's T x T d(scores) and under dropout attd, T x Tk, grows to the
   largest asked for and never shrinks). Not a BLAS: no alpha, no column-major. */
#ifndef MGK_H
#define MGK_H

#define MGK_ABI     13   /* bumped when a signature changes; minigpt/backends/native.py refuses any other build */

#define MGK_OK       0
#define MGK_EBADARG -1   /* negative size, too small leading dimension, NULL pointer, or any other argument
                            outside its documented range */
#define MGK_ENOMEM  -2   /* a packing buffer or scratch allocation failed */
#define MGK_ETHREAD -3   /* could not start a worker thread */

/* A is (M,K) (or (K,M) stored if ta), B is (K,N) (or (N,K) stored if tb), C is (M,N); ld* = row strides in floats */
int mgk_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc);
/* L1*L2 independent products over a two-level batch (e.g. batch x head); item (i, j) uses A + i*sA1 + j*sA2,
   B + i*sB1 + j*sB2, C + i*sC1 + j*sC2 (strides in floats, >= 0), so attention reads its heads in place out of
   a (B, T, 3, n_head, hs) array. One level: L2 = 1. The C items must not overlap one another. */
int mgk_sgemm_batched(int L1, int L2, int ta, int tb, int M, int N, int K,
                      const float *A, int lda, long long sA1, long long sA2,
                      const float *B, int ldb, long long sB1, long long sB2,
                      float beta, float *C, int ldc, long long sC1, long long sC2);
/* attention's causal products: mgk_sgemm_batched (bf16: mgk_bgemm_batched) where every item involves the causal
   T x Tk matrix of attention (query i sees keys 0..start+i), and the packed paths (fp32 on every ISA, the
   vdpbf16ps kernel and AMX tiles, the latter in whole tiles of 32 x 32 by 32 deep) skip the products of its
   known zeros; the few-rows path (M <= 8) computes the full product:
     MGK_CAUSAL_OUT  the result C is that matrix: entries with j > start + i are written 0, and the micro-tiles
                     that hold only such entries are not computed (beta must be 0);
     MGK_CAUSAL_A    the stored A is that matrix, zero where column > start + row (so op(A) = A^T is zero where
                     k < row - start): each micro-tile multiplies only its rows' k range that can be nonzero.
   The result equals the plain product's (but for the zeroed entries of MGK_CAUSAL_OUT), up to summation order. */
#define MGK_CAUSAL_OUT 1
#define MGK_CAUSAL_A   2
int mgk_gemm_causal(int causal, int start, int bf16, int L1, int L2, int ta, int tb, int M, int N, int K,
                    const float *A, int lda, long long sA1, long long sA2,
                    const float *B, int ldb, long long sB1, long long sB2,
                    float beta, float *C, int ldc, long long sC1, long long sC2);
/* causal self-attention, fused: L1*L2 items (batch x head), each array a strided stack as in mgk_sgemm_batched
   (pointer, row stride, outer and inner item strides, in floats), so q, k, v and y are read and written in place
   in a (B, T, 3, n_head, hs) or (B, T, n_head, hs) array. hs >= 1 and Tk >= start + T (MGK_EBADARG otherwise);
   the outputs must not overlap the inputs or one another.
     forward:  att (T x Tk) = the causal softmax of scale * q k^T (query i sees keys 0..start+i; the rest exactly
               0), y (T x hs) = att v; q is T x hs, k and v are Tk x hs
     backward: from att and dy (T x hs), with Tk = T and start = 0: dv = att^T dy, ds = the softmax's backward of
               dy v^T (d scores), dq = ds k, dk = ds^T q; dq, dk, dv are written, not added into
   dropout (drop != 0; mgk_dropout's mask of seed, keep_from and drop_scale, its elements numbered as those of an
   (L1, L2, T, Tk) array, which must number fewer than 2**32): the forward computes y = attd v, attd = att * mask,
   and the backward draws the mask again: dv = attd^T dy, d scores from (dy v^T) * mask. Neither is stored: attd
   lives in a thread's scratch, a head at a time.
   bf16: every product's operands rounded to bf16 (as mgk_bgemm). The result has the same bits as that of the
   products (mgk_gemm_causal), softmaxes (mgk_causal_softmax_fwd/bwd) and dropouts (mgk_dropout) called one after
   another; fused, each thread runs whole items, whose probabilities stay in its caches between the steps. */
int mgk_attention_fwd(int bf16, int L1, int L2, int T, int Tk, int hs, int start, float scale,
                      const float *q, int ldq, long long sq1, long long sq2,
                      const float *k, int ldk, long long sk1, long long sk2,
                      const float *v, int ldv, long long sv1, long long sv2,
                      float *att, int ldatt, long long satt1, long long satt2,
                      float *y, int ldy, long long sy1, long long sy2,
                      int drop, unsigned long long seed, unsigned int keep_from, float drop_scale);
int mgk_attention_bwd(int bf16, int L1, int L2, int T, int hs, float scale,
                      const float *q, int ldq, long long sq1, long long sq2,
                      const float *k, int ldk, long long sk1, long long sk2,
                      const float *v, int ldv, long long sv1, long long sv2,
                      const float *att, int ldatt, long long satt1, long long satt2,
                      const float *dy, int lddy, long long sdy1, long long sdy2,
                      float *dq, int lddq, long long sdq1, long long sdq2,
                      float *dk, int lddk, long long sdk1, long long sdk2,
                      float *dv, int lddv, long long sdv1, long long sdv2,
                      int drop, unsigned long long seed, unsigned int keep_from, float drop_scale);
/* plain scalar loops, one thread: the reference the fast path is tested against (in bf16, the fast paths differ
   from it on subnormal operands only: mgk_bgemm) */
int mgk_sgemm_ref(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc);

/* bfloat16 products: as mgk_sgemm*, with every element of op(A) and op(B) rounded to bf16 (round to nearest,
   ties to even, as mgk_round_bf16; mgk_bgemm's fast paths round a subnormal operand to 0, as vcvtneps2bf16 does,
   while mgk_bgemm_ref keeps it) and the exact products summed in float32. Arrays stay float32. */
int mgk_bgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc);
int mgk_bgemm_batched(int L1, int L2, int ta, int tb, int M, int N, int K,
                      const float *A, int lda, long long sA1, long long sA2,
                      const float *B, int ldb, long long sB1, long long sB2,
                      float beta, float *C, int ldc, long long sC1, long long sC2);
int mgk_bgemm_ref(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc);
/* tests: on != 0 runs every bf16 product (mgk_bgemm*, mgk_gemm_causal with bf16) on the amx path's code
   (mgk_amx.inc) with a scalar emulation of the tile instructions (each thread its own tiles), with no few-rows
   path, on any CPU; 0 (the default) restores the path in use */
int mgk_emulate_amx(int on);
/* out[i] = x[i] rounded to bf16 (float32 with the low 16 bits zero; NaN stays NaN, overflow -> inf); out may be x */
int mgk_round_bf16(long long n, const float *x, float *out);

int mgk_abi(void);                   /* MGK_ABI of this build */

/* Instruction-set paths, all compiled into one library and chosen at run time (never -march=native) */
#define MGK_ISA_GENERIC 0            /* portable C that the compiler vectorizes for baseline x86-64 (or any CPU) */
#define MGK_ISA_AVX2    1            /* AVX2 + FMA */
#define MGK_ISA_AVX512  2            /* AVX-512 F/DQ/BW/VL */
#define MGK_ISA_AVX512BF16 3         /* AVX-512 + AVX512_BF16: bf16 products on vdpbf16ps (fp32 ones as AVX-512) */
#define MGK_ISA_AMX     4            /* ... + AMX-BF16: bf16 products on AMX tiles (Linux must grant the tile state) */
int mgk_cpu_isa(void);               /* the highest path this CPU (and OS) can run, from cpuid */
int mgk_isa(void);                   /* the path in use: the fastest one (mgk_cpu_isa(), but avx512bf16 only where
                                        vdpbf16ps measures clearly faster than the fp32 FMAs: mgk.c's
                                        BF16_MIN_GAIN), unless mgk_set_isa chose one */
int mgk_set_isa(int isa);            /* force a path <= mgk_cpu_isa() (tests, reports); MGK_EBADARG otherwise */
const char *mgk_isa_name(int isa);   /* "generic", "avx2", "avx512", "avx512bf16", "amx"; "?" if this CPU cannot */
int mgk_set_num_threads(int n);      /* n >= 1 threads including the caller */
int mgk_get_num_threads(void);
int mgk_set_spin_us(int us);         /* idle workers wait up to us microseconds on the CPU for the next job, and
                                        the caller as long for its job's workers, before sleeping; 0 (the
                                        default) sleeps at once. While > 0, the ops split smaller work over
                                        the threads (mgk_ops.c) */
double mgk_peak_gflops(long long iters); /* GFLOP/s of a register-only FMA loop on the current threads */
double mgk_peak_bf16_gflops(long long iters); /* ... of bf16 products: a vdpbf16ps or AMX tile loop, or the FMA one */

/* internal: the persistent worker pool (mgk_pool.c). fn(arg, tid, nt) runs on tids 0..nt-1, tid 0 = caller. */
int mgk_pool_run(void (*fn)(void *arg, int tid, int nt), void *arg, int nt);
void mgk_pool_set_ftz(void);         /* flush-to-zero + denormals-are-zero in the calling thread */
int mgk_pool_spin_us(void);          /* mgk_set_spin_us's wait: > 0 when idle workers stay awake that long */
#endif
