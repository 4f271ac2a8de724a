/* mgk_pool.c: the persistent worker pool behind the GEMM (mgk.c), the fused attention (mgk_attention.c) and the other
   ops (mgk_ops.c). Workers SLEEP on a condition variable between calls (no spin-waiting: the machine's cores are
   shared with numpy/numba and other processes) unless the caller asks for a bounded wait on the CPU first
   (mgk_set_spin_us: training and generation, whose calls come back to back, would otherwise pay a wake-up per call),
   and run with flush-to-zero/denormals-are-zero set, because subnormal inputs slow the FMA loop down by two orders of
   magnitude. The caller is thread 0 and does its share of every job. One job of more than one thread at a time:
   mgk_pool_run serialises those callers (run_mu); a one-thread job runs on its caller at once. */
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include "mgk.h"
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define MAX_WORKERS 255

static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time, whoever calls (GEMM or op) */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_go = PTHREAD_COND_INITIALIZER;     /* main -> workers: a new job (gen changed) */
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;   /* last worker -> main: pending hit 0 */
static int n_workers;                  /* started so far (they never exit) */
static unsigned long gen;              /* job generation counter */
static int pending;                    /* workers of the current job still running */
static void (*job_fn)(void *, int, int);
static void *job_arg;
static int job_nt;
static unsigned long start_gen[MAX_WORKERS + 1];
static int spin_us;                    /* 0: sleep at once; else wait this long on the CPU first */

int mgk_set_spin_us(int us)
{
    if (us < 0) return MGK_EBADARG;
    __atomic_store_n(&spin_us, us, __ATOMIC_RELAXED);
    return MGK_OK;
}

int mgk_pool_spin_us(void) { return __atomic_load_n(&spin_us, __ATOMIC_RELAXED); }

/* wait on the CPU for at most spin_us microseconds until the job generation moves past old (workers), or
   until no worker is pending (the caller, gen_p NULL); returns at once when spin_us is 0 */
static void spin_wait(const unsigned long *gen_p, unsigned long old)
{
    int us = __atomic_load_n(&spin_us, __ATOMIC_RELAXED);
    if (us <= 0) return;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 1; gen_p ? __atomic_load_n(gen_p, __ATOMIC_ACQUIRE) == old
                          : __atomic_load_n(&pending, __ATOMIC_ACQUIRE) > 0; i++) {
#if defined(__x86_64__) || defined(__i386__)
        _mm_pause();
#endif
        if (i % 64 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 >= us) return;
        }
    }
}

void mgk_pool_set_ftz(void)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(_mm_getcsr() | 0x8040);  /* FTZ (bit 15) | DAZ (bit 6) */
#endif
}

static void *worker(void *p)
{
    int tid = (int)(intptr_t)p;
    mgk_pool_set_ftz();
    pthread_mutex_lock(&mu);
    unsigned long seen = start_gen[tid];
    for (;;) {
        if (gen == seen && __atomic_load_n(&spin_us, __ATOMIC_RELAXED) > 0) {   /* optional (mgk_set_spin_us) */
            pthread_mutex_unlock(&mu);
            spin_wait(&gen, seen);
            pthread_mutex_lock(&mu);
        }
        while (gen == seen)
            pthread_cond_wait(&cv_go, &mu);   /* sleeps in the kernel (futex) */
        seen = gen;
        if (tid >= job_nt)                    /* not part of this job (threads were reduced) */
            continue;
        void (*fn)(void *, int, int) = job_fn;
        void *arg = job_arg;
        int nt = job_nt;
        pthread_mutex_unlock(&mu);
        fn(arg, tid, nt);
        pthread_mutex_lock(&mu);
        if (__atomic_sub_fetch(&pending, 1, __ATOMIC_RELEASE) == 0)
            pthread_cond_signal(&cv_done);
    }
    return NULL;
}

static void reset_after_fork(void)     /* the child of a fork() has no workers */
{
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    mu = m; run_mu = m; cv_go = c; cv_done = c;
    n_workers = 0; pending = 0;
}

/* ----------------------------------------------------------------------------
   run fn on nt threads; workers are started on first need and kept */
int mgk_pool_run(void (*fn)(void *arg, int tid, int nt), void *arg, int nt)
{
    static int atfork_done;
    if (nt > MAX_WORKERS + 1) nt = MAX_WORKERS + 1;
    if (nt <= 1) { fn(arg, 0, 1); return MGK_OK; }
    pthread_mutex_lock(&run_mu);
    pthread_mutex_lock(&mu);
    if (!atfork_done) { pthread_atfork(NULL, NULL, reset_after_fork); atfork_done = 1; }
    while (n_workers < nt - 1) {
        pthread_t th;
        int tid = n_workers + 1;
        start_gen[tid] = gen;
        if (pthread_create(&th, NULL, worker, (void *)(intptr_t)tid) != 0) {
            pthread_mutex_unlock(&mu);
            pthread_mutex_unlock(&run_mu);
            return MGK_ETHREAD;
        }
        pthread_detach(th);
        n_workers++;
    }
    job_fn = fn; job_arg = arg; job_nt = nt;
    pending = nt - 1;
    gen++;
    pthread_cond_broadcast(&cv_go);
    pthread_mutex_unlock(&mu);

    fn(arg, 0, nt);                     /* the caller's share */
    spin_wait(NULL, 0);                 /* optional: wait for the workers on the CPU before sleeping */

    pthread_mutex_lock(&mu);
    while (pending > 0)
        pthread_cond_wait(&cv_done, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&run_mu);
    return MGK_OK;
}
