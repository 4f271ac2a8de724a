/* mgk_ops.h: the C API of the non-matmul ops of a training step (native/mgk_ops.c), and of the products that run
   one of them in their epilogue, loaded by minigpt/backends/native.py next to the GEMM of mgk.h. float32,
   row-major, C-contiguous arrays; every op (the products: as mgk_sgemm) returns MGK_OK (0) or MGK_EBADARG (-1:
   negative size, NULL array, an index out of range, V < 1, a dropout over 2**32 elements or more, LayerNorm
   backward's dx partly over an input). Only mgk_layernorm_bwd allocates: a scratch of at most 64 x 2C floats per
   call (MGK_ENOMEM, -2, if it cannot); the other ops allocate nothing.
   The exact semantics of each op are those of minigpt/backends/numpy_ops.py (the specification).
   Two implementations of each: mgk_<op>, the fast path (run-time ISA dispatch on mgk_isa(), rows split over
   mgk_get_num_threads() threads when the work is large; the same bits for any thread count and any ISA), and
   mgk_ref_<op>, plain scalar loops with libm on one thread (the reference the tests hold the fast path to). */
#ifndef MGK_OPS_H
#define MGK_OPS_H

/* ---- products with an op fused: mgk.c's GEMM, each block of whose result gets the op in the GEMM's epilogue (a
   job_t.ep of mgk_ops.c) while it is still in cache. Errors as mgk_sgemm's (mgk.h) */
/* the MLP's first product with its GELU: C = gelu(A B + bias) and dgelu = gelu'(A B + bias), A (M,K), B (K,N),
   bias (N,) or NULL, dgelu (M,N) with rows ldd apart; bf16: operands rounded as mgk_bgemm's. The same bits as
   mgk_sgemm (mgk_bgemm) then mgk_gelu_fwd on C; fused, each block of C gets its GELU while it is in cache, so C is
   written once and not read back */
int mgk_gemm_gelu(int bf16, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *bias,
                  float *C, int ldc, float *dgelu, int ldd);
/* a Linear's backward into the output of an elementwise op whose derivative the forward kept (the MLP's GELU):
   C = (op(A) @ op(B)) * D elementwise, D (M, N) with rows ldd apart; bf16 as mgk_bgemm. The bits of mgk_sgemm
   (mgk_bgemm) then C *= D; fused, C is written once and not read back */
int mgk_gemm_mul(int bf16, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                 const float *D, int ldd, float *C, int ldc);
/* a Linear and the residual add after it: C = R + drop(A @ B + bias), R (M, N) with rows ldr apart (it must not
   overlap C), bias (N,) or NULL; bf16 as mgk_bgemm; drop != 0: dropout between them, mgk_dropout's mask of seed,
   keep_from and drop_scale over C's elements numbered as those of an (M, N) array (fewer than 2**32), else none.
   The bits of mgk_sgemm (mgk_bgemm), C += bias, mgk_dropout on C, then C = R + C; fused, as mgk_gemm_mul */
int mgk_gemm_add(int bf16, int M, int N, int K, const float *A, int lda, const float *B, int ldb, const float *bias,
                 const float *R, int ldr, float *C, int ldc,
                 int drop, unsigned long long seed, unsigned int keep_from, float drop_scale);

/* ---- the ops */

/* LayerNorm over rows: x (N, C) -> y (N, C), mean and rstd (N,) kept for backward; b may be NULL (no bias) */
int mgk_layernorm_fwd(long long N, int C, const float *x, const float *w, const float *b, double eps,
                      float *y, float *mean, float *rstd);
/* dy, x (N, C) -> dx (N, C) written, or added into with acc != 0 (a pre-LN block's residual stream: its gradient
   gets LayerNorm's without a pass of its own); dx may be dy or x without acc, and must not overlap them otherwise
   (MGK_EBADARG); dw, db (C,) += over the rows (db NULL: no bias), in row blocks fixed by N (a scratch of at most
   64 x 2C floats: MGK_ENOMEM if it cannot be had); xhat recomputed */
int mgk_layernorm_bwd(long long N, int C, const float *dy, const float *x, const float *w, const float *mean,
                      const float *rstd, float *dx, float *dw, float *db, int acc);
/* y = gelu(x + b), dgelu = gelu'(x + b), tanh form, x (N, H), b (H,) or NULL; y or dgelu may be x itself */
int mgk_gelu_fwd(long long N, int H, const float *x, const float *b, float *y, float *dgelu);
/* dx = dout * dgelu (dx may be dout itself); db (H,) += the column sums of dx, db NULL: no bias */
int mgk_gelu_bwd(long long N, int H, const float *dout, const float *dgelu, float *dx, float *db);
/* in place over att (L, T, Tk): softmax of scale * scores, query i sees keys 0..start+i, the rest exactly 0 */
int mgk_causal_softmax_fwd(long long L, int T, int Tk, int start, float scale, float *att);
/* datt (L, T, Tk): d(probabilities) -> d(scores) in place, from the probabilities att */
int mgk_causal_softmax_bwd(long long L, int T, int Tk, int start, float scale, const float *att, float *datt);
/* logits (N, V), targets (N,) in [0, V) -> lse (N,) row log-sum-exp; *loss_sum = sum_n lse_n - logits[n, t_n] */
int mgk_xent_fwd(long long N, int V, const float *logits, const long long *targets, float *lse, double *loss_sum);
/* dlogits (N, V) = (softmax(logits) - onehot(targets)) * scale, softmax from the kept lse */
int mgk_xent_bwd(long long N, int V, const float *logits, const long long *targets, const float *lse, float scale,
                 float *dlogits);
/* one in-place AdamW update of n elements (coefficients rounded to float32 as numba_kernels.adamw does) */
int mgk_adamw(long long n, float *p, const float *g, float *m, float *v, double lr, double b1, double b2,
              double eps, double wd, double bc1, double bc2);
/* dW (V, C): dW[idx[n]] += dout[n] for n = 0..N-1 in order (repeated ids add up), idx in [0, V) */
int mgk_embedding_bwd(long long N, int V, int C, float *dW, const long long *idx, const float *dout);
/* y[0:n] = x * an inverted-dropout mask (y may be x): element i's mask value is scale where the 24 high bits of
   mix32(mix32(i ^ k1) ^ k2) are >= keep_from, else 0; k1 = mix32(the seed's low 32 bits), k2 = mix32(its high 32
   bits ^ mix32(k1 ^ 0x9e3779b9)) (numpy_ops.dropout_hash is the specification); n < 2**32 */
int mgk_dropout(long long n, unsigned long long seed, unsigned int keep_from, float scale, const float *x, float *y);
/* y = e**x elementwise with the fast paths' inline exp (for tests: its accuracy over the float32 range) */
int mgk_exp(long long n, const float *x, float *y);

int mgk_ref_layernorm_fwd(long long N, int C, const float *x, const float *w, const float *b, double eps,
                          float *y, float *mean, float *rstd);
int mgk_ref_layernorm_bwd(long long N, int C, const float *dy, const float *x, const float *w, const float *mean,
                          const float *rstd, float *dx, float *dw, float *db, int acc);
int mgk_ref_gelu_fwd(long long N, int H, const float *x, const float *b, float *y, float *dgelu);
int mgk_ref_gelu_bwd(long long N, int H, const float *dout, const float *dgelu, float *dx, float *db);
int mgk_ref_causal_softmax_fwd(long long L, int T, int Tk, int start, float scale, float *att);
int mgk_ref_causal_softmax_bwd(long long L, int T, int Tk, int start, float scale, const float *att, float *datt);
int mgk_ref_xent_fwd(long long N, int V, const float *logits, const long long *targets, float *lse,
                     double *loss_sum);
int mgk_ref_xent_bwd(long long N, int V, const float *logits, const long long *targets, const float *lse,
                     float scale, float *dlogits);
int mgk_ref_adamw(long long n, float *p, const float *g, float *m, float *v, double lr, double b1, double b2,
                  double eps, double wd, double bc1, double bc2);
int mgk_ref_embedding_bwd(long long N, int V, int C, float *dW, const long long *idx, const float *dout);
int mgk_ref_dropout(long long n, unsigned long long seed, unsigned int keep_from, float scale, const float *x,
                    float *y);

/* internal: one item's causal softmax (fwd) or its backward, on the calling thread, rows lda (att) and ldg (g)
   floats apart, for the fused attention (mgk_attention.c); not exported from the library */
#ifdef __GNUC__
__attribute__((visibility("hidden")))
#endif
void mgk_softmax_item(int fwd, int T, int Tk, int start, float scale, const float *att, long long lda, float *g,
                      long long ldg);
/* internal, for the fused attention too: a seed's two keys (mgk_dropout's k1, k2), and one item's dropout on the
   calling thread: y[i, j] = x[i, j] times the mask value of element n0 + i*ldn + j (mgk_dropout's), for j <= upto + i,
   and 0 past it, where x is not read (the composition's x is 0 there; the fused backward's d(scores) holds what
   its tiles left), over rows 0..rows and columns 0..cols, rows ldx and ldy apart */
#ifdef __GNUC__
__attribute__((visibility("hidden")))
#endif
void mgk_dropout_keys(unsigned long long seed, unsigned int *k1, unsigned int *k2);
#ifdef __GNUC__
__attribute__((visibility("hidden")))
#endif
void mgk_dropout_rows(int rows, int cols, int upto, unsigned int n0, unsigned int ldn, unsigned int k1,
                      unsigned int k2, unsigned int keep_from, float scale, const float *x, long long ldx, float *y,
                      long long ldy);
#endif
