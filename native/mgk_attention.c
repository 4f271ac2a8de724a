/* mgk_attention.c: fused causal self-attention for minigpt (mgk_attention_fwd/bwd, API in mgk.h).
   Unfused, each of attention's products and softmaxes makes a pass over every item's T x T probabilities in memory
   (config M: 100 MB a layer, eight passes). Here each thread takes whole items (batch x head), items tid, tid+nt,
   ..., and runs one item's products and softmax back to back, so its probabilities, and the backward's d(scores) in
   the thread's own scratch, stay in L2 between them. Every product is the batched products' own block of the item
   (mgk_item_block, lent by mgk.c through mgk_job.h) and the softmax mgk_ops.c's (mgk_softmax_item): the same bits
   as the ops called one by one (minigpt/backends/interface.py's Ops.attention, the composition). The two products
   into T x T (scores, d(scores)) leave the entries past the diagonal as their tiles left them, unlike the batched
   products, which zero them: the softmax after each writes every column, those with 0. Under dropout the
   item's probabilities are multiplied by its mask there too, the mask drawn from the seed as they are (attd, in
   the thread's scratch; mgk_dropout_rows): no mask or attd is stored, and the backward draws them again. */
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
    view_t q, k, v, att, y, dy, dq, dk, dv;
    int drop;                           /* dropout: 0 none, else the mask of element n (mgk_dropout's numbering of
                                           an (L, T, Tk) array) from keys k1, k2 */
    unsigned int k1, k2, keep_from;
    float drop_scale;
    job_t s, o, dvj, dsj, dqj, dkj;     /* the products: forward s = q k^T, y = att v; backward dv, ds, dq, dk */
} attn_t;

static float *item_scratch[2][256];    /* per thread id: the backward's d(scores) of one item, T x T, and attd,
                                          the probabilities of one item after dropout, T x Tk */
static long long scratch_cap[2][256];

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

/* dropout of item l, in the caller's FP mode as the composition's multiplies: out (T x Tk, ldo) = x * the mask of
   the item's elements up to the diagonal (column start + i of row i), 0 past it, where the composition's x is 0:
   att (forward: the composition's dropout(att), attd) and d(scores) (backward, start 0: its dropout(datt) after
   dy v^T, which the composition zeroes there; here x past the diagonal is what the tiles left, never read) */
static void drop_item(const attn_t *a, int l, const float *x, long long ldx, float *out, long long ldo)
{
#ifdef ATTN_X86
    unsigned int own = _mm_getcsr();
    _mm_setcsr(a->csr);
#endif
    mgk_dropout_rows(a->T, a->Tk, a->start, (unsigned int)l * (unsigned int)a->T * (unsigned int)a->Tk,
                     (unsigned int)a->Tk, a->k1, a->k2, a->keep_from, a->drop_scale, x, ldx, out, ldo);
#ifdef ATTN_X86
    _mm_setcsr(own);
#endif
}

static void attn_fwd_job(void *arg, int tid, int nt)
{
    const attn_t *a = arg;
    int T = a->T;
    for (int l = tid; l < a->L; l += nt) {
        const float *q = at(a, &a->q, l), *k = at(a, &a->k, l), *v = at(a, &a->v, l);
        float *att = (float *)at(a, &a->att, l), *y = (float *)at(a, &a->y, l);
        mgk_item_block(&a->s, q, k, att, 0, T, 0, a->Tk, tid);       /* s = q k^T (past the diagonal: below) */
        softmax_item(a, 1, att, att, a->att.ld);                     /* att = softmax(scale s), 0 in the future */
        const float *p = att;
        if (a->drop) {                                               /* attd = dropout(att) */
            drop_item(a, l, att, a->att.ld, item_scratch[1][tid], a->Tk);
            p = item_scratch[1][tid];
        }
        mgk_item_block(&a->o, p, v, y, 0, T, 0, a->o.N, tid);        /* y = att v (attd v) */
    }
}

static void attn_bwd_job(void *arg, int tid, int nt)
{
    const attn_t *a = arg;
    float *ds = item_scratch[0][tid], *attd = item_scratch[1][tid];
    int T = a->T, hs = a->dvj.N;
    for (int l = tid; l < a->L; l += nt) {
        const float *q = at(a, &a->q, l), *k = at(a, &a->k, l), *v = at(a, &a->v, l);
        const float *att = at(a, &a->att, l), *dy = at(a, &a->dy, l);
        float *dq = (float *)at(a, &a->dq, l), *dk = (float *)at(a, &a->dk, l), *dv = (float *)at(a, &a->dv, l);
        const float *p = att;                                        /* what multiplied v: */
        if (a->drop) {                                               /* attd = dropout(att), drawn again */
            drop_item(a, l, att, a->att.ld, attd, T);
            p = attd;
        }
        mgk_item_block(&a->dvj, p, dy, dv, 0, T, 0, hs, tid);        /* fwd: y = att v -> dv = att^T dy */
        mgk_item_block(&a->dsj, dy, v, ds, 0, T, 0, T, tid);         /*                   datt = dy v^T */
        if (a->drop)                                                 /* fwd: attd = dropout(att) */
            drop_item(a, l, ds, T, ds, T);
        softmax_item(a, 0, att, ds, T);                              /* fwd: att = softmax(scale s) -> ds (0 in
                                                                        the future) */
        mgk_item_block(&a->dqj, ds, k, dq, 0, T, 0, hs, tid);        /* fwd: s = q k^T -> dq = ds k */
        mgk_item_block(&a->dkj, ds, q, dk, 0, T, 0, hs, tid);        /*                   dk = ds^T q */
    }
}

/* do L items of T x Tk elements number 2**32 or more (dropout numbers them in 32 bits)? */
static int too_many(int L, int T, int Tk)
{
    return T > 0 && Tk > 0 && (unsigned long long)L > 0xffffffffULL / ((unsigned long long)T * (unsigned long long)Tk);
}

static int bad_view(const view_t *x, int cols)
{
    return !x->p || x->ld < (cols > 1 ? cols : 1) || x->s1 < 0 || x->s2 < 0;
}

/* run fn over the items on min(threads, L) threads (one for work too small to split, as mgk.c's plan), with the
   GEMM's FP mode; scratch: floats of each thread's item_scratch[0] (ds) and item_scratch[1] (attd) (grown, never
   shrunk) */
static int run_attention(attn_t *a, void (*fn)(void *, int, int), double flops, long long ds_floats,
                         long long attd_floats)
{
    int nt = mgk_get_num_threads();
    if (flops < 4e5) nt = 1;
    if (nt > a->L) nt = a->L;
    int rc = mgk_alloc_bufs(nt);
    long long want[2] = {ds_floats, attd_floats};
    for (int t = 0; t < nt && rc == MGK_OK; t++)
        for (int b = 0; b < 2 && rc == MGK_OK; b++)
            if (scratch_cap[b][t] < want[b]) {
                free(item_scratch[b][t]);
                item_scratch[b][t] = aligned_alloc(64, sizeof(float) * (size_t)((want[b] + 15) / 16 * 16));
                scratch_cap[b][t] = item_scratch[b][t] ? want[b] : 0;
                if (!item_scratch[b][t]) rc = MGK_ENOMEM;
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
                      int drop, unsigned long long seed, unsigned int keep_from, float drop_scale)
{
    if (L1 < 0 || L2 < 1 || (long long)L1 * L2 > 0x7fffffff || T < 0 || hs < 1 || start < 0 ||
        Tk < (long long)start + T || (drop && too_many(L1 * L2, T, Tk)))
        return MGK_EBADARG;
    attn_t a = {.L = L1 * L2, .L2 = L2, .T = T, .Tk = Tk, .scale = scale, .start = start,
                .q = VIEW(q), .k = VIEW(k), .v = VIEW(v), .att = VIEW(att), .y = VIEW(y), .drop = drop != 0,
                .keep_from = keep_from, .drop_scale = drop_scale};
    if (a.L == 0 || T == 0) return MGK_OK;
    if (bad_view(&a.q, hs) || bad_view(&a.k, hs) || bad_view(&a.v, hs) || bad_view(&a.att, Tk) || bad_view(&a.y, hs))
        return MGK_EBADARG;
    mgk_dropout_keys(seed, &a.k1, &a.k2);
    mgk_call_lock();
    a.s = mgk_item_job(bf16 != 0, start, 0, 1, T, Tk, hs, ldq, ldk, ldatt, MGK_CAUSAL_OUT);
    a.o = mgk_item_job(bf16 != 0, start, 0, 0, T, hs, Tk, drop ? Tk : ldatt, ldv, ldy, MGK_CAUSAL_A);
    int rc = run_attention(&a, attn_fwd_job, 4.0 * T * Tk * hs * a.L, 0, drop ? (long long)T * Tk : 0);
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
                      int drop, unsigned long long seed, unsigned int keep_from, float drop_scale)
{
    if (L1 < 0 || L2 < 1 || (long long)L1 * L2 > 0x7fffffff || T < 0 || hs < 1 ||
        (drop && too_many(L1 * L2, T, T)))
        return MGK_EBADARG;
    attn_t a = {.L = L1 * L2, .L2 = L2, .T = T, .Tk = T, .scale = scale, .q = VIEW(q), .k = VIEW(k), .v = VIEW(v),
                .att = VIEW(att), .dy = VIEW(dy), .dq = VIEW(dq), .dk = VIEW(dk), .dv = VIEW(dv), .drop = drop != 0,
                .keep_from = keep_from, .drop_scale = drop_scale};
    if (a.L == 0 || T == 0) return MGK_OK;
    if (bad_view(&a.q, hs) || bad_view(&a.k, hs) || bad_view(&a.v, hs) || bad_view(&a.att, T) ||
        bad_view(&a.dy, hs) || bad_view(&a.dq, hs) || bad_view(&a.dk, hs) || bad_view(&a.dv, hs))
        return MGK_EBADARG;
    mgk_dropout_keys(seed, &a.k1, &a.k2);
    mgk_call_lock();
    int b = bf16 != 0;
    a.dvj = mgk_item_job(b, 0, 1, 0, T, hs, T, drop ? T : ldatt, lddy, lddv, MGK_CAUSAL_A);
    a.dsj = mgk_item_job(b, 0, 0, 1, T, T, hs, lddy, ldv, T, MGK_CAUSAL_OUT);
    a.dqj = mgk_item_job(b, 0, 0, 0, T, hs, T, T, ldk, lddq, MGK_CAUSAL_A);
    a.dkj = mgk_item_job(b, 0, 1, 0, T, hs, T, T, ldq, lddk, MGK_CAUSAL_A);
    int rc = run_attention(&a, attn_bwd_job, 8.0 * T * T * hs * a.L, (long long)T * T, drop ? (long long)T * T : 0);
    mgk_call_unlock();
    return rc;
}
#undef VIEW
