/* mgk_pool.c: the persistent worker pool behind mgk_sgemm. Workers SLEEP on a condition variable between
   calls (no spin-waiting: the machine's cores are shared with numpy/numba and other processes) and run with
   flush-to-zero/denormals-are-zero set, because subnormal inputs slow the FMA loop down by two orders of magnitude.
   The caller is thread 0 and does its share of every job. One job at a time (mgk.c serialises calls). */
#include <pthread.h>
#include <stdint.h>
#include "mgk.h"
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define MAX_WORKERS 255

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
        while (gen == seen)
            pthread_cond_wait(&cv_go, &mu);   /* sleeps in the kernel (futex), no spinning */
        seen = gen;
        if (tid >= job_nt)                    /* not part of this job (threads were reduced) */
            continue;
        void (*fn)(void *, int, int) = job_fn;
        void *arg = job_arg;
        int nt = job_nt;
        pthread_mutex_unlock(&mu);
        fn(arg, tid, nt);
        pthread_mutex_lock(&mu);
        if (--pending == 0)
            pthread_cond_signal(&cv_done);
    }
    return NULL;
}

static void reset_after_fork(void)     /* the child of a fork() has no workers */
{
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    mu = m; cv_go = c; cv_done = c;
    n_workers = 0; pending = 0;
}

/* ----------------------------------------------------------------------------
   run fn on nt threads; workers are started on first need and kept */
int mgk_pool_run(void (*fn)(void *arg, int tid, int nt), void *arg, int nt)
{
    static int atfork_done;
    if (nt > MAX_WORKERS + 1) nt = MAX_WORKERS + 1;
    if (nt <= 1) { fn(arg, 0, 1); return MGK_OK; }
    pthread_mutex_lock(&mu);
    if (!atfork_done) { pthread_atfork(NULL, NULL, reset_after_fork); atfork_done = 1; }
    while (n_workers < nt - 1) {
        pthread_t th;
        int tid = n_workers + 1;
        start_gen[tid] = gen;
        if (pthread_create(&th, NULL, worker, (void *)(intptr_t)tid) != 0) {
            pthread_mutex_unlock(&mu);
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

    pthread_mutex_lock(&mu);
    while (pending > 0)
        pthread_cond_wait(&cv_done, &mu);
    pthread_mutex_unlock(&mu);
    return MGK_OK;
}
