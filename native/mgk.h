/* mgk.h: the C API of minigpt's native kernels (native/mgk.c, native/mgk_pool.c), loaded by minigpt/_native.py.
   Row-major float32 GEMM: C = op(A) @ op(B) + beta*C, op(X) = X or X^T by flag (ta, tb); beta == 0 never reads C.
   Every function returns MGK_OK (0) or a negative MGK_E* code; nothing here allocates per call
   (packing buffers are allocated once per thread, on first use). Not a BLAS: no alpha, no column-major. */
#ifndef MGK_H
#define MGK_H

#define MGK_OK       0
#define MGK_EBADARG -1   /* negative size, too small leading dimension, NULL pointer */
#define MGK_ENOMEM  -2   /* packing buffer allocation failed */
#define MGK_ETHREAD -3   /* could not start a worker thread */

/* A is (M,K) (or (K,M) stored if ta), B is (K,N) (or (N,K) stored if tb), C is (M,N); ld* = row strides in floats */
int mgk_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc);
/* L independent products; item l uses A + l*sA, B + l*sB, C + l*sC (strides in floats) */
int mgk_sgemm_batched(int L, int ta, int tb, int M, int N, int K, const float *A, int lda, long long sA,
                      const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC);
/* plain scalar loops, one thread: the reference the fast path is tested against */
int mgk_sgemm_ref(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc);

int mgk_has_avx512(void);            /* 1 if the CPU (and OS) run the AVX-512 path; else mgk_sgemm uses the reference */
int mgk_set_num_threads(int n);      /* n >= 1 threads including the caller; the only threading knob */
int mgk_get_num_threads(void);
int mgk_set_spin_us(int us);         /* workers (and the caller) wait up to us microseconds on the CPU for the
                                        next job before sleeping; 0 (the default) sleeps at once */
double mgk_peak_gflops(long long iters); /* GFLOP/s of a register-only FMA loop on the current threads */

/* internal: the persistent worker pool (mgk_pool.c). fn(arg, tid, nt) runs on tids 0..nt-1, tid 0 = caller. */
int mgk_pool_run(void (*fn)(void *arg, int tid, int nt), void *arg, int nt);
void mgk_pool_set_ftz(void);         /* flush-to-zero + denormals-are-zero in the calling thread */
#endif
