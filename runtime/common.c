/*
 * common.c — the runtime's backend-independent half: start-up and the
 * trainer's flags, the step loop (learning-rate schedule, clipping, the log
 * line), the trace, counters, and shutdown.
 *
 * fsdrt_init turns the emitted program's tables and its command line into a
 * running FsdRun: flags override the .fsd train section, shard groups are
 * sized for this world, the arena is placed, the data files are validated
 * and the shards initialised (or read from --init-from). A user's mistake
 * found on any rank (a bad flag, a bad token file) reaches every rank at the
 * next agreement point, and every rank prints the same `train: ...` line and
 * exits 1, so none is left waiting in a collective. Mistakes of the emitted
 * program itself (a wait without its collective, say) are bugs: they are
 * reported with their call site and abort the job.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
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

static void free_all(FsdRun *r);

/* Leaves the program on every rank; only start-up calls it, where every
 * rank reaches the same calls. */
static _Noreturn void finish(FsdRun *r, int status)
{
    fflush(stdout);
    free_all(r);
    bk_stop(r);
    free(r);
    exit(status);
}

/* An agreement point: if any rank has an error, every rank prints the
 * lowest rank's and exits 1. */
static void agree_or_exit(FsdRun *r)
{
    if (!bk_agree(r))
        return;
    fprintf(stderr, "train: %s\n", r->err);
    finish(r, 1);
}

/* After start-up a failure (a file that cannot be written) does not end the
 * run early: every rank prints it and fsdrt_finalize returns 1. */
static void agree_or_note(FsdRun *r)
{
    if (!bk_agree(r))
        return;
    fprintf(stderr, "train: %s\n", r->err);
    r->err[0] = 0;
    r->status = 1;
}

/* ── small helpers ── */

double rt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rt_count(FsdRun *r, int64_t bytes)
{
    r->counters.alloc_bytes += bytes;
    if (r->counters.alloc_bytes > r->counters.peak_alloc_bytes)
        r->counters.peak_alloc_bytes = r->counters.alloc_bytes;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* 1234567 → "1,234,567" */
static const char *thousands(char *buf, size_t n, int64_t v)
{
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%lld", (long long)(v < 0 ? -v : v));
    size_t k = 0;
    if (v < 0 && k + 1 < n)
        buf[k++] = '-';
    for (int i = 0; i < len && k + 2 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0)
            buf[k++] = ',';
        buf[k++] = digits[i];
    }
    buf[k] = 0;
    return buf;
}

static const char *mem_str(char *buf, size_t n, int64_t bytes)
{
    if (bytes >= (int64_t)1 << 30)
        snprintf(buf, n, "%.2f GiB", (double)bytes / (1 << 30));
    else
        snprintf(buf, n, "%.2f MiB", (double)bytes / (1 << 20));
    return buf;
}

/* ── flags ── */

/* A flag's value, checked as it is read. Checkpoint flags (--ckpt-dir,
 * --ckpt-every, --resume) join the table when checkpoints land. */
typedef enum { ARG_NONE, ARG_COUNT, ARG_POSITIVE, ARG_REAL, ARG_FILE } ArgKind;

typedef struct Flag {
    const char *name;        /* without its leading -- */
    ArgKind kind;
    void *dst;               /* bool, int64_t, double or const char * */
    int64_t max;             /* for whole numbers */
    const char *meta, *help;
} Flag;

enum { NFLAGS = 14 };

static void flag_table(FsdRun *r, Flag *f)
{
    FsdTrainConfig *c = &r->cfg;
    const Flag t[NFLAGS] = {
        {"steps", ARG_COUNT, &c->steps, INT64_MAX / 2, "N", "run steps 0 … N−1"},
        {"micro-batch", ARG_POSITIVE, &c->micro_batch, 1 << 20, "N", "sequences per micro-batch per rank"},
        {"grad-accum", ARG_POSITIVE, &c->grad_accum, 1 << 20, "N", "micro-batches per step"},
        {"lr", ARG_REAL, &c->lr, 0, "X", "peak learning rate"},
        {"seed", ARG_COUNT, &c->seed, INT64_MAX, "N", "initialisation seed"},
        {"data", ARG_FILE, &c->data, 0, "FILE", "training tokens (llm.c's format; see fsdata)"},
        {"val-data", ARG_FILE, &c->val_data, 0, "FILE", "validation tokens (checked at start-up)"},
        {"log", ARG_FILE, &r->log_path, 0, "FILE", "one JSON object per step"},
        {"init-from", ARG_FILE, &r->init_from, 0, "FILE", "initial weights (safetensors, F32)"},
        {"export", ARG_FILE, &r->export_path, 0, "FILE", "write the weights after the last step (safetensors)"},
        {"trace-out", ARG_FILE, &r->trace_path, 0, "FILE", "Chrome trace of what ran on each rank"},
        {"quiet", ARG_NONE, &r->quiet, 0, NULL, "no log lines on stdout"},
        {"help", ARG_NONE, NULL, 0, NULL, "this text"},
        {NULL, ARG_NONE, NULL, 0, NULL, NULL},
    };
    memcpy(f, t, sizeof t);
}

static void usage(FsdRun *r, FILE *out)
{
    const FsdModel *m = r->m;
    const FsdTrainConfig *c = &m->train;
    fprintf(out, "usage: train [flags]   (under mpirun -np N, or srun, for N ranks)\n\n");
    fprintf(out, "Trains model %s (compiled from %s) with fully sharded data parallelism.\n",
            m->name, m->source ? m->source : "?");
    fprintf(out, "Flags override the train section (now: steps %lld, micro-batch %lld, grad-accum "
                 "%lld, lr %g, seed %lld, data %s).\n\n",
            (long long)c->steps, (long long)c->micro_batch, (long long)c->grad_accum, c->lr,
            (long long)c->seed, c->data ? c->data : "none");
    Flag f[NFLAGS];
    flag_table(r, f);
    for (int i = 0; f[i].name; i++) {
        char lhs[64];
        snprintf(lhs, sizeof lhs, "--%s%s%s", f[i].name, f[i].meta ? " " : "",
                 f[i].meta ? f[i].meta : "");
        fprintf(out, "  %-20s %s\n", lhs, f[i].help);
    }
}

static bool parse_whole(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!*s || *s == '-' || *s == '+' || *s == ' ')
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Reads the flags into r; returns whether --help was asked for. */
static bool parse_flags(FsdRun *r, int argc, char **argv)
{
    Flag f[NFLAGS];
    flag_table(r, f);
    bool help = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            rt_fail(r, "unexpected argument '%s' (flags start with --; see --help)", a);
            return false;
        }
        const char *eq = strchr(a + 2, '=');
        size_t n = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        const Flag *fl = NULL;
        for (int k = 0; f[k].name; k++)
            if (strlen(f[k].name) == n && strncmp(f[k].name, a + 2, n) == 0)
                fl = &f[k];
        if (!fl) {
            rt_fail(r, "unknown flag --%.*s (see --help)", (int)n, a + 2);
            return false;
        }
        if (fl->kind == ARG_NONE) {
            if (eq) {
                rt_fail(r, "--%s takes no value", fl->name);
                return false;
            }
            if (fl->dst)
                *(bool *)fl->dst = true;
            else
                help = true;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v || (!eq && strncmp(v, "--", 2) == 0)) {
            rt_fail(r, "--%s needs a value (%s)", fl->name, fl->meta);
            return false;
        }
        switch (fl->kind) {
        case ARG_COUNT:
        case ARG_POSITIVE: {
            int64_t lo = fl->kind == ARG_POSITIVE;
            if (!parse_whole(v, lo, fl->max, fl->dst)) {
                rt_fail(r, "--%s: '%s' is not a whole number from %lld to %lld", fl->name, v,
                        (long long)lo, (long long)fl->max);
                return false;
            }
            break;
        }
        case ARG_REAL: {
            char *end;
            errno = 0;
            double x = strtod(v, &end);
            if (!*v || *end || errno || !isfinite(x) || x < 0) {
                rt_fail(r, "--%s: '%s' is not a number of 0 or more", fl->name, v);
                return false;
            }
            *(double *)fl->dst = x;
            break;
        }
        case ARG_FILE:
            if (!*v) {
                rt_fail(r, "--%s needs a file name", fl->name);
                return false;
            }
            *(const char **)fl->dst = v;
            break;
        case ARG_NONE:
            break;
        }
    }
    return help;
}

/* ── start-up ── */

/* What the emitted tables and the settings promise, checked against this
 * world before anything is allocated. */
static void check_model(FsdRun *r)
{
    const FsdModel *m = r->m;
    const FsdTrainConfig *c = &r->cfg;
    if (c->micro_batch < 1 || c->grad_accum < 1 || c->grad_accum > (1 << 20) || c->steps < 0 ||
        c->seed < 0) {
        rt_fail(r, "the train section has micro_batch %lld, grad_accum %lld, steps %lld, seed %lld; "
                   "each must be positive (steps and seed: 0 or more)",
                (long long)c->micro_batch, (long long)c->grad_accum, (long long)c->steps,
                (long long)c->seed);
        return;
    }
    if (m->seq < 1 || m->vocab < 1 || c->micro_batch > ((int64_t)1 << 31) / m->seq) {
        rt_fail(r, "a micro-batch of %lld sequences of %lld tokens is too large", (long long)c->micro_batch,
                (long long)m->seq);
        return;
    }
    for (int g = 0; g < m->ngroups; g++)
        if (m->groups[g].flat_numel < r->world) {
            rt_fail(r, "world size %d is larger than shard group %s's %lld parameters", r->world,
                    m->groups[g].name, (long long)m->groups[g].flat_numel);
            return;
        }
    for (int p = 0; p < m->nparams; p++) {
        const FsdParamInfo *P = &m->params[p];
        if (P->group < 0 || P->group >= m->ngroups || P->offset < 0 ||
            P->offset + P->numel > m->groups[P->group].flat_numel) {
            rt_fail(r, "parameter %s lies outside its shard group (the model's tables are "
                       "inconsistent: regenerate the trainer with fsdpc)",
                    P->name);
            return;
        }
    }
}

static int by_begin(const void *a, const void *b)
{
    const Segment *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* Cuts group g's shard into runs that do and do not take weight decay. */
static bool build_segments(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    int n = 0;
    for (int p = 0; p < r->m->nparams; p++)
        n += r->m->params[p].group == g && r->m->params[p].decay;
    Segment *d = malloc(sizeof *d * (size_t)(n + 1));
    G->seg = malloc(sizeof *G->seg * (size_t)(2 * n + 2));
    if (!d || !G->seg) {
        free(d);
        return false;
    }
    n = 0;
    for (int p = 0; p < r->m->nparams; p++) {
        const FsdParamInfo *P = &r->m->params[p];
        if (P->group != g || !P->decay)
            continue;
        int64_t b = P->offset > G->lo ? P->offset : G->lo;
        int64_t e = P->offset + P->numel < G->lo + G->shard ? P->offset + P->numel : G->lo + G->shard;
        if (b < e)
            d[n++] = (Segment){b - G->lo, e - G->lo, true};
    }
    qsort(d, (size_t)n, sizeof *d, by_begin);
    int64_t at = 0;
    G->nseg = 0;
    for (int i = 0; i < n; i++) {
        if (d[i].begin > at)
            G->seg[G->nseg++] = (Segment){at, d[i].begin, false};
        G->seg[G->nseg++] = d[i];
        at = d[i].end;
    }
    if (at < G->shard)
        G->seg[G->nseg++] = (Segment){at, G->shard, false};
    free(d);
    return true;
}

static void allocate(FsdRun *r)
{
    const FsdModel *m = r->m;
    const int64_t W = r->world, B = r->cfg.micro_batch, T = m->seq;
    r->groups = calloc((size_t)m->ngroups + 1, sizeof *r->groups);
    if (!r->groups) {
        rt_fail(r, "out of memory");
        return;
    }
    int states = r->cfg.optimizer == FSD_ADAMW ? 2 : r->cfg.momentum != 0 ? 1 : 0;
    for (int g = 0; g < m->ngroups; g++) {
        Group *G = &r->groups[g];
        G->flat = m->groups[g].flat_numel;
        G->padded = round_up(G->flat, W);
        G->shard = G->padded / W;
        G->lo = r->rank * G->shard;
        int64_t bytes = G->shard * (int64_t)sizeof(real);
        G->master = bk_alloc(r, bytes);
        G->grad = bk_alloc(r, bytes);
        if (states >= 1)
            G->m = bk_alloc(r, bytes);
        if (states >= 2)
            G->v = bk_alloc(r, bytes);
        if (!G->master || !G->grad || (states >= 1 && !G->m) || (states >= 2 && !G->v) ||
            !build_segments(r, g)) {
            rt_fail(r, "out of memory allocating the shards of group %s (%lld elements)",
                    m->groups[g].name, (long long)G->shard);
            return;
        }
    }

    /* the activation arena, placed for this micro-batch size */
    int n = m->nacts;
    int64_t *bytes = malloc(sizeof *bytes * (size_t)(n + 1));
    int *first = malloc(sizeof *first * (size_t)(n + 1)), *last = malloc(sizeof *last * (size_t)(n + 1));
    r->act_offset = malloc(sizeof *r->act_offset * (size_t)(n + 1));
    if (!bytes || !first || !last || !r->act_offset) {
        free(bytes), free(first), free(last);
        rt_fail(r, "out of memory");
        return;
    }
    for (int i = 0; i < n; i++) {
        bytes[i] = (m->acts[i].per_sample * B + m->acts[i].fixed) * (int64_t)sizeof(real);
        first[i] = m->acts[i].first;
        last[i] = m->acts[i].last;
    }
    r->arena_bytes = fsdrt_place_arena(n, bytes, first, last, FSDRT_ARENA_ALIGN, r->act_offset);
    free(bytes), free(first), free(last);
    if (r->arena_bytes < 0 || !(r->arena = bk_alloc(r, r->arena_bytes))) {
        rt_fail(r, "out of memory allocating the activation arena (%lld bytes)",
                (long long)r->arena_bytes);
        return;
    }

    /* token inputs: not counted, as the memory plan does not count them */
    r->idx = malloc(sizeof(int32_t) * (size_t)(B * T));
    r->targets = malloc(sizeof(int32_t) * (size_t)(B * T));
    r->positions = malloc(sizeof(int32_t) * (size_t)T);
    if (!r->idx || !r->targets || !r->positions) {
        rt_fail(r, "out of memory");
        return;
    }
    memset(r->idx, 0, sizeof(int32_t) * (size_t)(B * T));
    memset(r->targets, 0, sizeof(int32_t) * (size_t)(B * T));
    for (int64_t t = 0; t < T; t++)
        r->positions[t] = (int32_t)t;
}

static void free_all(FsdRun *r)
{
    if (r->groups)
        for (int g = 0; g < r->m->ngroups; g++) {
            Group *G = &r->groups[g];
            int64_t bytes = G->shard * (int64_t)sizeof(real);
            bk_free(r, G->master, bytes);
            bk_free(r, G->grad, bytes);
            bk_free(r, G->m, bytes);
            bk_free(r, G->v, bytes);
            free(G->seg);
        }
    free(r->groups);
    r->groups = NULL;
    bk_free(r, r->arena, r->arena_bytes);
    r->arena = NULL;
    free(r->act_offset);
    free(r->idx), free(r->targets), free(r->positions);
    r->act_offset = NULL;
    r->idx = r->targets = r->positions = NULL;
    data_close(&r->data);
    data_close(&r->val);
    free(r->trace);
    r->trace = NULL;
    if (r->log)
        fclose(r->log);
    r->log = NULL;
}

FsdRun *fsdrt_init(int argc, char **argv, const FsdModel *m)
{
    FsdRun *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "train: out of memory\n");
        exit(1);
    }
    r->m = m;
    r->cfg = m->train;
    if (!bk_start(r, &argc, &argv)) {
        /* no communication: this process reports for itself */
        fprintf(stderr, "train: %s\n", r->err);
        bk_stop(r);
        free(r);
        exit(1);
    }
    agree_or_exit(r);

    bool help = parse_flags(r, argc, argv);
    agree_or_exit(r);
    if (help) {
        if (r->rank == 0)
            usage(r, stdout);
        finish(r, 0);
    }
    check_model(r);
    agree_or_exit(r);

    /* data: needed only to train; --steps 0 --export writes initial weights */
    if (r->cfg.steps > 0 && !r->cfg.data)
        rt_fail(r, "no training data: pass --data FILE (model %s's train section names none)",
                m->name);
    else if (r->cfg.data)
        data_open(r, &r->data, r->cfg.data);
    if (r->cfg.val_data)
        data_open(r, &r->val, r->cfg.val_data);
    if (r->rank == 0 && r->log_path && !(r->log = fopen(r->log_path, "w")))
        rt_fail(r, "cannot write --log file %s: %s", r->log_path, strerror(errno));
    agree_or_exit(r);

    allocate(r);
    agree_or_exit(r);
    if (r->init_from)
        weights_import(r, r->init_from);
    else
        weights_init(r);
    agree_or_exit(r);

    bk_barrier(r);   /* one time origin for every rank's trace */
    r->t0 = rt_now();
    if (r->rank == 0 && !r->quiet) {
        int64_t n = 0;
        for (int p = 0; p < m->nparams; p++)
            n += m->params[p].numel;
        int64_t G = r->cfg.micro_batch * r->cfg.grad_accum * r->world;
        char a[32], b[32];
        printf("model %s: %s parameters in %d shard groups | world %d | %lld x %lld tokens per "
               "micro-batch, %lld micro-batches | %s tokens per step | %lld steps\n",
               m->name, thousands(a, sizeof a, n), m->ngroups, r->world,
               (long long)r->cfg.micro_batch, (long long)m->seq, (long long)r->cfg.grad_accum,
               thousands(b, sizeof b, G * m->seq), (long long)r->cfg.steps);
        fflush(stdout);
    }
    return r;
}

/* ── the trace ── */

void rt_trace(FsdRun *r, const char *name, const char *what, int tid, double begin, double end,
              int64_t bytes)
{
    if (!r->trace_path)
        return;
    if (r->ntrace == r->trace_cap) {
        int cap = r->trace_cap ? 2 * r->trace_cap : 1024;
        TraceEvent *t = realloc(r->trace, sizeof *t * (size_t)cap);
        if (!t)
            return;   /* a trace short of memory loses events, not the run */
        r->trace = t;
        r->trace_cap = cap;
    }
    r->trace[r->ntrace++] =
        (TraceEvent){name, what, tid, (begin - r->t0) * 1e6, (end - r->t0) * 1e6, bytes};
}

void fsdrt_trace_begin(FsdRun *r, const char *name)
{
    if (!r->trace_path)
        return;
    if (r->nopen == (int)(sizeof r->open_t / sizeof *r->open_t))
        RT_BUG(r, "fsdrt_trace_begin(\"%s\") nested more than %d deep", name, r->nopen);
    r->open_name[r->nopen] = name;
    r->open_t[r->nopen++] = rt_now();
}

void fsdrt_trace_end(FsdRun *r)
{
    if (!r->trace_path)
        return;
    if (r->nopen == 0)
        RT_BUG(r, "fsdrt_trace_end without fsdrt_trace_begin");
    r->nopen--;
    rt_trace(r, r->open_name[r->nopen], NULL, 0, r->open_t[r->nopen], rt_now(), 0);
}

static void json_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
}

/* Chrome's trace event format: one process per rank, one thread per
 * stream (compute, all-gathers, reduce-scatters); Perfetto opens it. Each
 * rank writes its events to memory, rank 0 gathers and writes the file. */
static void write_trace(FsdRun *r)
{
    char *mine = NULL, *all = NULL;
    size_t n = 0;
    int64_t alln = 0;
    FILE *mem = open_memstream(&mine, &n);
    if (mem) {
        static const char *const threads[] = {"compute", "all-gather", "reduce-scatter"};
        fprintf(mem, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
                r->rank, r->rank);
        for (int t = 0; t < 3; t++)
            fprintf(mem, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                         "\"args\":{\"name\":\"%s\"}}",
                    r->rank, t, threads[t]);
        for (int i = 0; i < r->ntrace; i++) {
            const TraceEvent *e = &r->trace[i];
            fprintf(mem, ",\n{\"name\":\"");
            if (e->what)
                fprintf(mem, "%s ", e->what);
            json_escaped(mem, e->name);
            fprintf(mem, "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f",
                    e->what ? "comm" : "compute", r->rank, e->tid, e->begin_us,
                    e->end_us - e->begin_us);
            if (e->what)
                fprintf(mem, ",\"args\":{\"bytes\":%lld}", (long long)e->bytes);
            fprintf(mem, "}");
        }
        if (fclose(mem) != 0) {
            free(mine);
            mine = NULL;
            n = 0;
        }
    }
    if (!mine)
        rt_fail(r, "out of memory writing the trace");
    if (!bk_gather_bytes(r, mine ? mine : "", (int64_t)n, &all, &alln))
        rt_fail(r, "out of memory gathering the trace on rank 0");
    free(mine);
    if (r->rank == 0 && all) {
        FILE *f = fopen(r->trace_path, "w");
        if (!f)
            rt_fail(r, "cannot write --trace-out file %s: %s", r->trace_path, strerror(errno));
        else {
            /* every rank's text starts with ",\n" and its process name, so
             * the list starts after rank 0's separator */
            fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
            if (alln > 2)
                fwrite(all + 2, 1, (size_t)alln - 2, f);
            fprintf(f, "\n]}\n");
            if (ferror(f) | (fclose(f) != 0))
                rt_fail(r, "cannot write --trace-out file %s", r->trace_path);
        }
    }
    free(all);
}

int fsdrt_finalize(FsdRun *r)
{
    if (!r)
        return 1;
    if (r->trace_path) {
        write_trace(r);
        agree_or_note(r);
    }
    if (r->log && (ferror(r->log) | (fclose(r->log) != 0)))
        rt_fail(r, "cannot write --log file %s", r->log_path);
    r->log = NULL;
    agree_or_note(r);
    int status = r->status;
    fflush(stdout);
    free_all(r);
    bk_stop(r);
    free(r);
    return status;
}

/* ── settings ── */

int64_t fsdrt_batch(const FsdRun *r) { return r->cfg.micro_batch; }
int fsdrt_micro_batches(const FsdRun *r) { return (int)r->cfg.grad_accum; }
int fsdrt_rank(const FsdRun *r) { return r->rank; }
int fsdrt_world(const FsdRun *r) { return r->world; }
FsdCounters fsdrt_counters(const FsdRun *r) { return r->counters; }

/* ── tensors ── */

real *fsdrt_act(FsdRun *r, int act)
{
    if (act < 0 || act >= r->m->nacts)
        RT_BUG(r, "fsdrt_act(%d): the model has %d arena tensors", act, r->m->nacts);
    return (real *)(r->arena + r->act_offset[act]);
}

real *fsdrt_param(FsdRun *r, int param)
{
    if (param < 0 || param >= r->m->nparams)
        RT_BUG(r, "fsdrt_param(%d): the model has %d parameters", param, r->m->nparams);
    const FsdParamInfo *P = &r->m->params[param];
    if (!r->groups[P->group].params)
        RT_BUG(r, "fsdrt_param(%s) while group %s is not gathered", P->name,
               r->m->groups[P->group].name);
    return r->groups[P->group].params + P->offset;
}

real *fsdrt_grad(FsdRun *r, int param)
{
    if (param < 0 || param >= r->m->nparams)
        RT_BUG(r, "fsdrt_grad(%d): the model has %d parameters", param, r->m->nparams);
    const FsdParamInfo *P = &r->m->params[param];
    if (!r->groups[P->group].grads)
        RT_BUG(r, "fsdrt_grad(%s) while group %s has no gradient buffer", P->name,
               r->m->groups[P->group].name);
    return r->groups[P->group].grads + P->offset;
}

const int32_t *fsdrt_idx(const FsdRun *r) { return r->idx; }
const int32_t *fsdrt_targets(const FsdRun *r) { return r->targets; }
const int32_t *fsdrt_positions(const FsdRun *r) { return r->positions; }

/* ── the step ── */

int fsdrt_train(FsdRun *r, FsdStepFn step)
{
    while (fsdrt_begin_step(r)) {
        step(r);
        fsdrt_end_step(r);
    }
    return fsdrt_finalize(r);
}

bool fsdrt_begin_step(FsdRun *r)
{
    if (r->in_step)
        RT_BUG(r, "fsdrt_begin_step while step %lld is running", (long long)r->step);
    if (r->step >= r->cfg.steps) {
        if (!r->done) {
            r->done = true;
            if (r->export_path) {
                weights_export(r, r->export_path);
                agree_or_note(r);
            }
        }
        return false;
    }
    r->in_step = true;
    r->loss_sum = 0;
    r->step_t0 = rt_now();
    r->comm_at_step = r->counters.gather_bytes + r->counters.reduce_bytes;
    return true;
}

void fsdrt_load_micro_batch(FsdRun *r, int micro)
{
    if (!r->in_step || micro < 0 || micro >= r->cfg.grad_accum)
        RT_BUG(r, "fsdrt_load_micro_batch(%d) outside a step of %lld micro-batches", micro,
               (long long)r->cfg.grad_accum);
    data_load(r, micro);
}

void fsdrt_add_loss(FsdRun *r, real loss) { r->loss_sum += (double)loss; }

real fsdrt_loss_scale(const FsdRun *r)
{
    return (real)(1.0 / ((double)r->cfg.micro_batch * (double)r->m->seq * (double)r->cfg.grad_accum));
}

static void json_number(char *buf, size_t n, double x)
{
    if (isfinite(x))
        snprintf(buf, n, "%.9g", x);
    else
        snprintf(buf, n, "null");
}

/* Design section 9's schedules, for step s of S. */
static double lr_at(const FsdTrainConfig *c, int64_t s)
{
    if (c->schedule == FSD_LR_CONSTANT)
        return c->lr;
    if (s < c->warmup)
        return c->lr * (double)(s + 1) / (double)c->warmup;
    if (c->steps <= c->warmup)
        return c->lr;
    const double pi = 3.14159265358979323846;
    double progress = (double)(s - c->warmup) / (double)(c->steps - c->warmup);
    return c->min_lr + 0.5 * (1 + cos(pi * progress)) * (c->lr - c->min_lr);
}

void fsdrt_end_step(FsdRun *r)
{
    if (!r->in_step)
        RT_BUG(r, "fsdrt_end_step outside a step");
    bk_check_idle(r);
    const FsdTrainConfig *c = &r->cfg;

    /* the step's loss (mean over every micro-batch of every rank) and the
     * global gradient norm, in one all-reduce */
    double v[2] = {r->loss_sum, bk_grad_sumsq(r)};
    bk_allreduce_sum(r, v, 2);
    double loss = v[0] / ((double)r->world * (double)c->grad_accum);
    double norm = sqrt(v[1]);
    /* torch.nn.utils.clip_grad_norm_: scale by c / (‖g‖ + 1e-6) when that is below 1 */
    double coef = 1;
    if (c->grad_clip > 0 && c->grad_clip / (norm + 1e-6) < 1)
        coef = c->grad_clip / (norm + 1e-6);
    double lr = lr_at(c, r->step);
    bk_optimizer(r, lr, coef, r->step + 1);

    double secs = rt_now() - r->step_t0;
    int64_t tokens = c->micro_batch * c->grad_accum * r->world * r->m->seq;
    double tok_s = secs > 0 ? (double)tokens / secs : 0;
    int64_t comm = r->counters.gather_bytes + r->counters.reduce_bytes - r->comm_at_step;
    if (r->rank == 0) {
        if (!r->quiet) {
            char a[32], b[32];
            printf("step %4lld/%lld | loss %.6f | lr %.2e | norm %.4f | %s tok/s | %.1f ms | mem %s\n",
                   (long long)r->step, (long long)c->steps, loss, lr, norm,
                   thousands(a, sizeof a, (int64_t)tok_s), secs * 1e3,
                   mem_str(b, sizeof b, r->counters.peak_alloc_bytes));
            fflush(stdout);
        }
        if (r->log) {
            char ls[32], ns[32];
            /* JSON has no NaN: a diverged run logs null */
            json_number(ls, sizeof ls, loss);
            json_number(ns, sizeof ns, norm);
            fprintf(r->log,
                    "{\"step\": %lld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, "
                    "\"tokens_per_s\": %.1f, \"step_ms\": %.3f, \"mem_peak_bytes\": %lld, "
                    "\"comm_bytes\": %lld}\n",
                    (long long)r->step, ls, lr, ns, tok_s, secs * 1e3,
                    (long long)r->counters.peak_alloc_bytes, (long long)comm);
            fflush(r->log);
        }
    }
    r->step++;
    r->in_step = false;
}
