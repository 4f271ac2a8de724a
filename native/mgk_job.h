/* mgk_job.h: internal to the native library, not its API (mgk.h). One product as mgk.c's paths run it (job_t), and
   what mgk.c lends the code built on it: to the fused attention (mgk_attention.c), which runs each head's products
   on the batched products' own blocks, a job for one item's product, one block of it on a thread, the lock that
   every product and fused attention runs under, and the per-thread pack buffers; to the products with an op fused
   (mgk_ops.c), a product's job, whose epilogue they set, and its run. */
#ifndef MGK_JOB_H
#define MGK_JOB_H
#ifdef __GNUC__
#define MGK_INTERNAL __attribute__((visibility("hidden")))   /* not exported: calls inside the library stay direct */
#else
#define MGK_INTERNAL
#endif

struct isa_gemm;
typedef struct job job_t;
struct job {
    const struct isa_gemm *isa;  /* the path that runs this job: its tile and its block function */
    int ta, tb, M, N, K, lda, ldb, ldc, L;
    const float *A, *B; float *C; float beta;
    long long sA, sB, sC;        /* strides of the outer batch index l / L2 (floats) */
    int L2;                      /* inner batch size: item l is (l / L2, l % L2), e.g. (batch, head) */
    long long sA2, sB2, sC2;     /* strides of the inner index l % L2 */
    int pm, pn;    /* thread grid over (M, N); pm*pn == threads, or 0 when threads split the batch */
    int small;     /* AVX-512 or AVX2, few rows, A not transposed with B: the unpacked path (isa->small) */
    int ksplit;    /* small, one product, op(B) = B: threads split K, each its own partial sum (see run) */
    int bf16;      /* round both operands to bfloat16 while packing, or reading on the few rows path (mgk_bgemm*) */
    int causal, start;   /* 0, or MGK_CAUSAL_OUT / MGK_CAUSAL_A with the diagonal's offset (mgk_gemm_causal) */
    /* the epilogue: NULL, or the op that a block of C gets once it holds its final sums, while it is still in
       cache (rows i0..i1, columns j0..j1 of the item's result C), with the operands below: the products with an op
       fused (mgk_ops.c: mgk_gemm_gelu, mgk_gemm_mul, mgk_gemm_add) set them; the GEMM only calls it */
    void (*ep)(const job_t *g, float *C, int i0, int i1, int j0, int j1);
    const float *ep_bias;        /* (N,) or NULL */
    float *ep_d; int ldd;        /* (M, N), rows ldd apart: GELU's derivative (written), the scale or the residual */
    unsigned int csr;            /* the caller's FP mode, which the epilogue computes in (the tiles run flush-to-zero) */
    int drop;                    /* mgk_gemm_add: dropout before the add, mgk_dropout's mask of the seed whose */
    unsigned int k1, k2, keep_from; float drop_scale;   /* keys are k1, k2, numbering C's elements i*N + j */
};

/* the job of one item's product op(A) (M x K) @ op(B), beta 0, causal 0, MGK_CAUSAL_OUT or MGK_CAUSAL_A (diagonal
   offset start), operands rounded to bf16 or not, with the path that runs it chosen as the batched products choose
   theirs; mgk_item_block runs it. Call under mgk_call_lock */
MGK_INTERNAL job_t mgk_item_job(int bf16, int start, int ta, int tb, int M, int N, int K, int lda, int ldb, int ldc,
                                int causal);
/* block C[m0:m1, n0:n1] of one item of g into C (rows g->ldc apart), on pool thread tid: under mgk_call_lock, after
   mgk_alloc_bufs(nt > tid), with the GEMM's FP mode (mgk_pool_set_ftz). MGK_CAUSAL_OUT leaves the entries past the
   diagonal as they are, or as the tiles that straddle it wrote them: the caller writes them (the batched products
   zero them; the fused attention's softmaxes write every column). The few-rows path (g->small) writes all M rows
   and the whole product past the diagonal */
MGK_INTERNAL void mgk_item_block(const job_t *g, const float *A, const float *B, float *C, int m0, int m1, int n0,
                                 int n1, int tid);
/* the epilogue of g (job_t.ep) over rows i0..i1, columns j0..j1 of C, the item's result (rows g->ldc apart): each
   block loop calls it once per block of C, after the block's last k block */
MGK_INTERNAL void mgk_epilogue(const job_t *g, float *C, int i0, int i1, int j0, int j1);
/* one product op(A) (M x K) @ op(B) -> C, beta 0, with no epilogue yet: the job a product with an op fused starts
   from (mgk_ops.c), which sets its ep fields and runs it with mgk_run_job */
MGK_INTERNAL job_t mgk_product_job(int bf16, int ta, int tb, int M, int N, int K, const float *A, int lda,
                                   const float *B, int ldb, float *C, int ldc);
/* run a job of mgk_product_job: MGK_OK, MGK_EBADARG for the arguments mgk_sgemm refuses, MGK_ENOMEM, MGK_ETHREAD */
MGK_INTERNAL int mgk_run_job(job_t *g);
/* one product or fused attention at a time: the pack buffers (and the attention's scratch) are per thread id */
MGK_INTERNAL void mgk_call_lock(void);
MGK_INTERNAL void mgk_call_unlock(void);
/* allocate the pack buffers of threads 0..nt-1 (under mgk_call_lock) on first use: MGK_OK or MGK_ENOMEM */
MGK_INTERNAL int mgk_alloc_bufs(int nt);
#endif
