/*
 * base.c — the runtime's smallest shared pieces: recording an error
 * (rt_fail) and reporting an emitter bug (rt_bug), the clock (rt_now), the
 * allocation counters (rt_count) and the check both backends make on a
 * product's sizes (rt_check_gemm).
 *
 * They sit apart from common.c so that the files that only need these
 * (ckpt.c, data.c, weights.c, hfnames.c) do not depend on the start-up
 * and step code there; every file of the runtime, either backend's
 * included, may call them.
 */
#include "internal.h"

#include <limits.h>
#include <stdarg.h>
#include <time.h>

/* ── errors ── */

void rt_fail(FsdRun *r, const char *fmt, ...)
{
    if (r->err[0])
        return;   /* the first error is the one to fix */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, ERR_MAX, fmt, ap);
    va_end(ap);
    if (!r->err[0])
        snprintf(r->err, ERR_MAX, "error");
}

_Noreturn void rt_bug(FsdRun *r, const char *file, int line, const char *fmt, ...)
{
    char msg[ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "train: rank %d: %s:%d: internal error: %s\n", r->rank, file, line, msg);
    bk_abort(r);
}

/* ── the clock, the counters, products' sizes ── */

double rt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rt_check_gemm(FsdRun *r, const char *what, bool transA, bool transB, int64_t M, int64_t N,
                   int64_t K, int64_t lda, int64_t ldb, int64_t ldc)
{
    if (M < 0 || N < 0 || K < 0 || M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX ||
        ldb > INT_MAX || ldc > INT_MAX || lda < (transA ? M : K) || ldb < (transB ? K : N) ||
        ldc < N)
        RT_BUG(r, "%s: M %lld N %lld K %lld with lda %lld ldb %lld ldc %lld", what, (long long)M,
               (long long)N, (long long)K, (long long)lda, (long long)ldb, (long long)ldc);
}

void rt_count(FsdRun *r, int64_t bytes)
{
    r->counters.alloc_bytes += bytes;
    if (r->counters.alloc_bytes > r->counters.peak_alloc_bytes)
        r->counters.peak_alloc_bytes = r->counters.alloc_bytes;
}

