/*
 * internal.h — what the runtime's own files share, and nothing the emitted
 * program may see: the FsdRun behind the public header, and the handful of
 * calls common.c makes into its backend (cpu.c now, cuda later).
 *
 * common.c holds everything that is the same on every backend: flags, the
 * data loader, initialisation, the learning-rate schedule, logging,
 * safetensors, the trace, counters. The backend owns communication, the
 * unsharded buffers and every loop over a shard's elements (the optimizer,
 * the gradient norm), because on the GPU those are kernels. Shards are
 * host memory on the CPU backend; common.c writes initial weights straight
 * into them.
 */
#ifndef FSDRT_INTERNAL_H
#define FSDRT_INTERNAL_H

#include "fsdrt.h"

#include <stdio.h>

#define ERR_MAX 1024

/* A run of a shard's elements that all do, or all do not, take weight
 * decay; the segments of a group cover its shard end to end, so the
 * optimizer never looks up which parameter an element belongs to. */
typedef struct Segment {
    int64_t begin, end;      /* shard-relative elements */
    bool decay;
} Segment;

/* One shard group on this rank. */
typedef struct Group {
    int64_t flat, padded, shard, lo;   /* elements; this rank owns [lo, lo + shard) */
    real *master;            /* fp32 master shard (double in the float64 build) */
    real *grad;              /* gradient shard, averaged over ranks */
    real *m, *v;             /* AdamW moments; SGD keeps its momentum in m */
    Segment *seg;
    int nseg;
    real *params;            /* unsharded parameters while gathered, else NULL */
    real *grads;             /* unsharded gradients while allocated, else NULL */
} Group;

/* A token file (llm.c's format), mapped read-only. */
typedef struct TokenFile {
    const char *path;
    void *map;
    size_t map_bytes;
    const unsigned char *tokens;   /* after the 256-int32 header */
    int version;                   /* 1: uint16 tokens, 2: uint32 */
    int64_t ntok, nseq;            /* tokens; whole sequences of T + 1 */
} TokenFile;

/* One finished slice of the trace. */
typedef struct TraceEvent {
    const char *name;        /* static, the emitted program's or a group's */
    const char *what;        /* NULL, or the collective's kind */
    int tid;                 /* 0: compute, 1: all-gathers, 2: reduce-scatters */
    double begin_us, end_us;
    int64_t bytes;
} TraceEvent;

typedef struct Backend Backend;

struct FsdRun {
    const FsdModel *m;
    FsdTrainConfig cfg;      /* the train section after flags */
    int rank, world, local_rank, local_world;
    Backend *bk;

    /* flags that are not train settings */
    const char *log_path, *init_from, *export_path, *trace_path;
    bool quiet;
    FILE *log;

    Group *groups;
    int64_t *act_offset;     /* bytes into the arena, by FsdActInfo index */
    unsigned char *arena;
    int64_t arena_bytes;

    TokenFile data, val;
    int32_t *idx, *targets, *positions;

    /* the step */
    int64_t step;            /* the step running, or the next to run */
    bool in_step, done;
    double step_t0, loss_sum;
    int64_t comm_at_step;

    FsdCounters counters;

    TraceEvent *trace;
    int ntrace, trace_cap;
    double t0;               /* trace time origin (seconds, after a barrier) */
    double open_t[64];       /* fsdrt_trace_begin's stack */
    const char *open_name[64];
    int nopen;

    char err[ERR_MAX];       /* this rank's first error, "" if none */
    int status;              /* what fsdrt_finalize returns */
};

/* ── common.c, for the backend ── */

double rt_now(void);                           /* seconds, monotonic */
void rt_trace(FsdRun *r, const char *name, const char *what, int tid, double begin,
              double end, int64_t bytes);
void rt_count(FsdRun *r, int64_t bytes);       /* + allocated, − freed */
/* Records this rank's first error (printf-style); the next agreement point
 * reports it on every rank. */
void rt_fail(FsdRun *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An emitted program broke the schedule's rules: not a user error, so it is
 * reported with the call site and the run aborted on every rank. */
_Noreturn void rt_bug(FsdRun *r, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define RT_BUG(r, ...) rt_bug((r), __FILE__, __LINE__, __VA_ARGS__)

static inline int dtype_bytes(FsdDtype t) { return t == FSD_FP32 ? (int)sizeof(real) : 2; }

/* ── data.c: token files and the data order ── */

/* Maps and validates a token file, this rank checking its share of the
 * tokens; errors go to rt_fail (the caller agrees on them). */
void data_open(FsdRun *r, TokenFile *f, const char *path);
void data_close(TokenFile *f);
/* Fills r->idx and r->targets for micro-batch `micro` of step r->step. */
void data_load(FsdRun *r, int micro);

/* ── weights.c: initialisation, safetensors ── */

void weights_init(FsdRun *r);                          /* this rank's shards */
void weights_import(FsdRun *r, const char *path);      /* this rank's shards */
void weights_export(FsdRun *r, const char *path);      /* collective */

/* ── the backend, for common.c ── */

/* Starts communication and fills rank, world, local_rank, local_world; on
 * failure writes why into r->err and returns false (world is then 1). */
bool bk_start(FsdRun *r, int *argc, char ***argv);
/* Frees the backend's buffers and stops communication. */
void bk_stop(FsdRun *r);
_Noreturn void bk_abort(FsdRun *r);
/* Collective: true when some rank has an error; every rank then holds the
 * message of the lowest such rank in r->err. */
bool bk_agree(FsdRun *r);
void bk_barrier(FsdRun *r);
void bk_allreduce_sum(FsdRun *r, double *v, int n);
/* Collective: group g's full flat buffer (padded elements) on rank 0. */
void bk_gather_shards(FsdRun *r, int g, real *dst);
/* Collective: every rank's n bytes, concatenated in rank order, on rank 0
 * (*out malloc'ed there, NULL elsewhere). */
bool bk_gather_bytes(FsdRun *r, const char *buf, int64_t n, char **out, int64_t *outn);

/* Shard-sized and unsharded buffers, counted. */
void *bk_alloc(FsdRun *r, int64_t bytes);      /* zeroed */
void bk_free(FsdRun *r, void *p, int64_t bytes);
/* A pooled buffer of at least `bytes`, counted as `count` while out. */
void *bk_pool_get(FsdRun *r, int64_t bytes, int64_t count);
void bk_pool_put(FsdRun *r, void *p, int64_t count);

/* Σ g² over every grad shard of this rank. */
double bk_grad_sumsq(FsdRun *r);
/* Scales the grad shards by coef, runs the optimizer with learning rate lr
 * for step t (from 1), then zeroes the grad shards. */
void bk_optimizer(FsdRun *r, double lr, double coef, int64_t t);
/* Collective state left over at the end of a step is a schedule bug. */
void bk_check_idle(FsdRun *r);

#endif
