/* mgk_attention.c: fused causal self-attention for minigpt (mgk_attention_fwd/bwd, API in mgk.h).
   Unfused, each of attention's products and softmaxes makes a pass over every item's T x T probabilities in memory
   (config M: 100 MB a layer, eight passes). Here each thread takes whole items (batch x head), items tid, tid+nt,
   ..., and runs one item's products and softmax back to back, so its probabilities, and the backward's d(scores) in
   the thread's own scratch, stay in L2 between them. Every product is the batched products' own block of the item
   (mgk_item_block, lent by mgk.c through mgk_job.h) and the softmax mgk_ops.c's (mgk_softmax_item): the same bits
   as the ops called one by one (minigpt/backends/__init__.py's Ops.attention, the composition). Under dropout the
   item's probabilities are multiplied by its mask there too (attd, drop_rows), as the composition's NumPy does. */
#include <stdlib.h>
#include "mgk.h"
#include "mgk_job.h"
#include "mgk_ops.h"       /* mgk_softmax_item */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(MGK_NO_SIMD)   /* mgk.c's MGK_X86 */
#define ATTN_X86 1
#include <xmmintrin.h>     /* _mm_getcsr/_mm_setcsr (baseline SSE): the caller's FP mode, for the softmax */
#endif

typedef struct { const float *p; int ld; long long s1, s2; } view_t;   /* a strided stack, as mgk_sgemm_batched's */

typedef struct {
    int L, L2, T, Tk;
    float scale;
    int start;
    unsigned int csr;                   /* the caller's FP mode: the softmax runs in it, as mgk_ops.c's ops do */
    view_t q, k, v, att, y, dy, dq, dk, dv, mask, attd;   /* mask.p NULL: no dropout */
    job_t s, o, dvj, dsj, dqj, dkj;     /* the products: forward s = q k^T, y = att v; backward dv, ds, dq, dk */
} attn_t;

static float *ds_bufs[256];             /* per thread id: the backward's d(scores) of one item, T x T */
static long long ds_cap[256];

static const float *at(const attn_t *a, const view_t *x, int l)
{
    return x->p + (long long)(l / a->L2) * x->s1 + (long long)(l % a->L2) * x->s2;
}

static void softmax_item(const attn_t *a, int fwd, const float *att, float *g, long long ldg)
{
#ifdef ATTN_X86
    unsigned int own = _mm_getcsr();
    _mm_setcsr(a->csr);
#endif
    mgk_softmax_item(fwd, a->T, a->Tk, a->start, a->scale, att, a->att.ld, g, ldg);
#ifdef ATTN_X86
    _mm_setcsr(own);
#endif
}

/* dropout, in the caller's FP mode as the composition's NumPy multiplies: out = p * m elementwise, rows 0..T
   (ldp, ldm, ldo floats apart), columns 0..cols of each row, or (causal) 0..min(i + 1, cols) of row i: the
   composition's np.multiply(att, mask, out=attd) (forward, every column), or its datt *= mask (backward, start
   0: the softmax's backward reads no column past i, and writes 0 there) */
static void drop_rows(const attn_t *a, int T, int cols, int causal, const float *p, long long ldp, const float *m,
                      long long ldm, float *out, long long ldo)
{
#ifdef ATTN_X86
    unsigned int own = _mm_getcsr();
    _mm_setcsr(a->csr);
#endif
    for (int i = 0; i < T; i++)
        for (int j = 0, n = causal && i + 1 < cols ? i + 1 : cols; j < n; j++)
            out[i * ldo + j] = p[i * ldp + j] * m[i * ldm + j];
#ifdef ATTN_X86
    _mm_setcsr(own);
#endif
    (void)a;
}

static void attn_fwd_job(void *arg, int tid, int nt)
{
    const attn_t *a = arg;
    int T = a->T;
    for (int l = tid; l < a->L; l += nt) {
        const float *q = at(a, &a->q, l), *k = at(a, &a->k, l), *v = at(a, &a->v, l);
        float *att = (float *)at(a, &a->att, l), *y = (float *)at(a, &a->y, l);
        mgk_item_block(&a->s, q, k, att, 0, T, 0, a->Tk, tid);       /* s = q k^T, 0 past the diagonal */
        softmax_item(a, 1, att, att, a->att.ld);                     /* att = softmax(scale s) */
        const float *p = att;
        if (a->mask.p) {                                             /* attd = att * mask (dropout) */
            float *attd = (float *)at(a, &a->attd, l);
            drop_rows(a, T, a->Tk, 0, att, a->att.ld, at(a, &a->mask, l), a->mask.ld, attd, a->attd.ld);
            p = attd;
        }
        mgk_item_block(&a->o, p, v, y, 0, T, 0, a->o.N, tid);        /* y = att v (attd v) */
    }
}

static void attn_bwd_job(void *arg, int tid, int nt)
{
    const attn_t *a = arg;
    float *ds = ds_bufs[tid];
    int T = a->T, hs = a->dvj.N;
    for (int l = tid; l < a->L; l += nt) {
        const float *q = at(a, &a->q, l), *k = at(a, &a->k, l), *v = at(a, &a->v, l);
        const float *att = at(a, &a->att, l), *dy = at(a, &a->dy, l);
        float *dq = (float *)at(a, &a->dq, l), *dk = (float *)at(a, &a->dk, l), *dv = (float *)at(a, &a->dv, l);
        const float *p = a->mask.p ? at(a, &a->attd, l) : att;      /* what multiplied v */
        mgk_item_block(&a->dvj, p, dy, dv, 0, T, 0, hs, tid);        /* fwd: y = att v -> dv = att^T dy */
        mgk_item_block(&a->dsj, dy, v, ds, 0, T, 0, T, tid);         /*                   datt = dy v^T */
        if (a->mask.p)                                               /* fwd: attd = att * mask */
            drop_rows(a, T, T, 1, ds, T, at(a, &a->mask, l), a->mask.ld, ds, T);
        softmax_item(a, 0, att, ds, T);                              /* fwd: att = softmax(scale s) -> ds */
        mgk_item_block(&a->dqj, ds, k, dq, 0, T, 0, hs, tid);        /* fwd: s = q k^T -> dq = ds k */
        mgk_item_block(&a->dkj, ds, q, dk, 0, T, 0, hs, tid);        /*                   dk = ds^T q */
    }
}

static int bad_view(const view_t *x, int cols)
{
    return !x->p || x->ld < (cols > 1 ? cols : 1) || x->s1 < 0 || x->s2 < 0;
}

/* run fn over the items on min(threads, L) threads (one below ~4 us of work), with the GEMM's FP mode; scratch:
   floats of each thread's ds_bufs (grown, never shrunk) */
static int run_attention(attn_t *a, void (*fn)(void *, int, int), double flops, long long scratch)
{
    int nt = mgk_get_num_threads();
    if (flops < 4e5) nt = 1;
    if (nt > a->L) nt = a->L;
    int rc = mgk_alloc_bufs(nt);
    for (int t = 0; t < nt && rc == MGK_OK; t++)
        if (ds_cap[t] < scratch) {
            free(ds_bufs[t]);
            ds_bufs[t] = aligned_alloc(64, sizeof(float) * (size_t)((scratch + 15) / 16 * 16));
            ds_cap[t] = ds_bufs[t] ? scratch : 0;
            if (!ds_bufs[t]) rc = MGK_ENOMEM;
        }
    if (rc != MGK_OK) return rc;
#ifdef ATTN_X86
    a->csr = _mm_getcsr();
    mgk_pool_set_ftz();
#endif
    rc = mgk_pool_run(fn, a, nt);
#ifdef ATTN_X86
    _mm_setcsr(a->csr);
#endif
    return rc;
}

#define VIEW(x) {x, ld##x, s##x##1, s##x##2}

int mgk_attention_fwd(int bf16, int L1, int L2, int T, int Tk, int hs, int start, float scale,
                      const float *q, int ldq, long long sq1, long long sq2,
                      const float *k, int ldk, long long sk1, long long sk2,
                      const float *v, int ldv, long long sv1, long long sv2,
                      float *att, int ldatt, long long satt1, long long satt2,
                      float *y, int ldy, long long sy1, long long sy2,
                      const float *mask, int ldmask, long long smask1, long long smask2,
                      float *attd, int ldattd, long long sattd1, long long sattd2)
{
    if (L1 < 0 || L2 < 1 || (long long)L1 * L2 > 0x7fffffff || T < 0 || hs < 1 || start < 0 || Tk < start + T)
        return MGK_EBADARG;
    attn_t a = {.L = L1 * L2, .L2 = L2, .T = T, .Tk = Tk, .scale = scale, .start = start,
                .q = VIEW(q), .k = VIEW(k), .v = VIEW(v), .att = VIEW(att), .y = VIEW(y), .mask = VIEW(mask),
                .attd = VIEW(attd)};
    if (a.L == 0 || T == 0) return MGK_OK;
    if (bad_view(&a.q, hs) || bad_view(&a.k, hs) || bad_view(&a.v, hs) || bad_view(&a.att, Tk) || bad_view(&a.y, hs)
        || (mask && (bad_view(&a.mask, Tk) || bad_view(&a.attd, Tk))))
        return MGK_EBADARG;
    mgk_call_lock();
    a.s = mgk_item_job(bf16 != 0, start, 0, 1, T, Tk, hs, ldq, ldk, ldatt, MGK_CAUSAL_OUT);
    a.o = mgk_item_job(bf16 != 0, start, 0, 0, T, hs, Tk, mask ? ldattd : ldatt, ldv, ldy, MGK_CAUSAL_A);
    int rc = run_attention(&a, attn_fwd_job, 4.0 * T * Tk * hs * a.L, 0);
    mgk_call_unlock();
    return rc;
}

int mgk_attention_bwd(int bf16, int L1, int L2, int T, int hs, float scale,
                      const float *q, int ldq, long long sq1, long long sq2,
                      const float *k, int ldk, long long sk1, long long sk2,
                      const float *v, int ldv, long long sv1, long long sv2,
                      const float *att, int ldatt, long long satt1, long long satt2,
                      const float *dy, int lddy, long long sdy1, long long sdy2,
                      float *dq, int lddq, long long sdq1, long long sdq2,
                      float *dk, int lddk, long long sdk1, long long sdk2,
                      float *dv, int lddv, long long sdv1, long long sdv2,
                      const float *mask, int ldmask, long long smask1, long long smask2,
                      const float *attd, int ldattd, long long sattd1, long long sattd2)
{
    if (L1 < 0 || L2 < 1 || (long long)L1 * L2 > 0x7fffffff || T < 0 || hs < 1)
        return MGK_EBADARG;
    attn_t a = {.L = L1 * L2, .L2 = L2, .T = T, .Tk = T, .scale = scale, .q = VIEW(q), .k = VIEW(k), .v = VIEW(v),
                .att = VIEW(att), .dy = VIEW(dy), .dq = VIEW(dq), .dk = VIEW(dk), .dv = VIEW(dv), .mask = VIEW(mask),
                .attd = VIEW(attd)};
    if (a.L == 0 || T == 0) return MGK_OK;
    if (bad_view(&a.q, hs) || bad_view(&a.k, hs) || bad_view(&a.v, hs) || bad_view(&a.att, T) ||
        bad_view(&a.dy, hs) || bad_view(&a.dq, hs) || bad_view(&a.dk, hs) || bad_view(&a.dv, hs) ||
        (mask && (bad_view(&a.mask, T) || bad_view(&a.attd, T))))
        return MGK_EBADARG;
    mgk_call_lock();
    int b = bf16 != 0;
    a.dvj = mgk_item_job(b, 0, 1, 0, T, hs, T, mask ? ldattd : ldatt, lddy, lddv, MGK_CAUSAL_A);
    a.dsj = mgk_item_job(b, 0, 0, 1, T, T, hs, lddy, ldv, T, MGK_CAUSAL_OUT);
    a.dqj = mgk_item_job(b, 0, 0, 0, T, hs, T, T, ldk, lddq, MGK_CAUSAL_A);
    a.dkj = mgk_item_job(b, 0, 1, 0, T, hs, T, T, ldq, lddk, MGK_CAUSAL_A);
    int rc = run_attention(&a, attn_bwd_job, 8.0 * T * T * hs * a.L, (long long)T * T);
    mgk_call_unlock();
    return rc;
}
#undef VIEW
