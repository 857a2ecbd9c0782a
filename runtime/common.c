/*
 * common.c — the runtime's backend-independent half: start-up and the
 * trainer's flags, the step loop (clipping, the log line; the learning-rate
 * schedule is lr.c's, evaluation after a step eval.c's), the collectives'
 * entry points (the schedule's rules, then the backend's bk_* hook), the
 * trace, counters, and shutdown.
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
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static const char *dtype_name(FsdDtype t)
{
    return t == FSD_FP32 ? "fp32" : t == FSD_BF16 ? "bf16" : t == FSD_FP16 ? "fp16" : "unknown";
}

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

/* --grad-check passes when every direction's relative error is below this
 * (float64). Its default step: a direction has normal(0, 1) elements, so ε
 * moves each parameter by about ε; the central difference's truncation
 * error grows as ε² and its rounding error as 1/ε, and on the examples
 * 1e-5 leaves up to ~1e-5 of truncation, 1e-6 ~1e-7 of either. */
#define GRAD_CHECK_BOUND 1e-6
#define GRAD_CHECK_EPS 1e-6

/* A flag's value, checked as it is read. ARG_MAYBE is a name whose value
 * may be left out (--resume alone means --resume latest). */
typedef enum { ARG_NONE, ARG_COUNT, ARG_POSITIVE, ARG_REAL, ARG_FILE, ARG_MAYBE } ArgKind;

typedef struct Flag {
    const char *name;        /* without its leading -- */
    ArgKind kind;
    void *dst;               /* bool, int64_t, double or const char * */
    int64_t max;             /* for whole numbers */
    const char *meta, *help;
} Flag;

enum { NFLAGS = 32 };   /* the table's entries, its terminator included */

static void flag_table(FsdRun *r, Flag *f)
{
    FsdTrainConfig *c = &r->cfg;
    const Flag t[] = {
        {"steps", ARG_COUNT, &c->steps, INT64_MAX / 2, "N", "run steps 0 … N−1"},
        {"micro-batch", ARG_POSITIVE, &c->micro_batch, 1 << 20, "N", "sequences per micro-batch per rank"},
        {"grad-accum", ARG_POSITIVE, &c->grad_accum, 1 << 20, "N", "micro-batches per step"},
        {"lr", ARG_REAL, &c->lr, 0, "X", "peak learning rate"},
        {"seed", ARG_COUNT, &c->seed, INT64_MAX, "N", "initialisation seed"},
        {"data", ARG_FILE, &c->data, 0, "FILE|PATTERN",
         "training tokens (llm.c's format; see fsdata): a file, or shards by glob ('dir/train_*.bin')"},
        {"val-data", ARG_FILE, &c->val_data, 0, "FILE|PATTERN", "validation tokens (checked at start-up)"},
        {"shuffle", ARG_NONE, &r->shuffle, 0, NULL,
         "train on the sequences in a seeded order, a new one each epoch (the seed is --seed's)"},
        {"eval-every", ARG_COUNT, &c->eval_every, INT64_MAX / 2, "N",
         "the validation loss after every N-th step and the last (0: none)"},
        {"eval-sequences", ARG_COUNT, &c->eval_sequences, INT64_MAX / 2, "K",
         "evaluate on the first K sequences of --val-data (0: all)"},
        {"log", ARG_FILE, &r->log_path, 0, "FILE", "one JSON object per step"},
        {"init-from", ARG_FILE, &r->init_from, 0, "FILE|DIR",
         "initial weights: safetensors (F32, BF16, F16), or a model directory (sharded, with its index)"},
        {"export", ARG_FILE, &r->export_path, 0, "FILE|DIR", "write the weights after the last step (safetensors)"},
        {"export-dtype", ARG_FILE, &r->export_dtype_flag, 0, "TYPE", "--export's element type: fp32 (the default), bf16, fp16"},
        {"export-shard-size", ARG_FILE, &r->export_shard_flag, 0, "SIZE",
         "--export DIR: shards of at most SIZE (5GB, 500MB, bytes) and their index"},
        {"trace-out", ARG_FILE, &r->trace_path, 0, "FILE", "Chrome trace of what ran on each rank"},
        {"quiet", ARG_NONE, &r->quiet, 0, NULL, "no log lines on stdout"},
        {"grad-check", ARG_COUNT, &r->grad_check, 1 << 20, "N",
         "check step 0's gradient along N random directions, then exit (float64 build)"},
        {"grad-check-eps", ARG_REAL, &r->grad_check_eps, 0, "X", "--grad-check's step (1e-6)"},
        {"ckpt-dir", ARG_FILE, &c->ckpt_dir, 0, "DIR", "where checkpoints go (train section's, or ckpt)"},
        {"ckpt-every", ARG_COUNT, &c->ckpt_every, INT64_MAX / 2, "K", "a checkpoint every K steps and after the last (0: none)"},
        {"ckpt-keep", ARG_COUNT, &c->ckpt_keep, INT64_MAX / 2, "N", "keep the newest N checkpoints (0: all)"},
        {"ckpt-async", ARG_NONE, &c->ckpt_async, 0, NULL, "write checkpoints on a background thread"},
        {"ckpt-overwrite", ARG_NONE, &r->ckpt_overwrite, 0, NULL, "save into a --ckpt-dir holding another run's checkpoints"},
        {"ckpt-max-failures", ARG_POSITIVE, &r->ckpt_max_failures, 1 << 20, "N", "stop after N checkpoint saves in a row fail (3)"},
        {"resume", ARG_MAYBE, &r->resume, 0, "[DIR]",
         "resume from checkpoint DIR; alone (or `latest`): --ckpt-dir's latest; `auto`: that if it "
         "exists, else start fresh"},
        {"collective-timeout", ARG_REAL, &r->collective_timeout_s, 0, "SECONDS",
         "end the job when a collective waits this long (600; 0: never)"},
        {"on-nonfinite", ARG_FILE, &r->on_nonfinite, 0, "stop|skip",
         "a step with a non-finite loss or gradient norm stops the run (exit 4), or is skipped"},
        {"max-skips", ARG_COUNT, &r->max_skips, INT64_MAX / 2, "N",
         "with --on-nonfinite skip: stop after N skipped steps in a row (10)"},
        {"hf-names", ARG_FILE, &r->hf_names, 0, "NAMES", "gpt2 or llama: --export/--init-from in Hugging Face's layout"},
        {"help", ARG_NONE, NULL, 0, NULL, "this text"},
        {NULL, ARG_NONE, NULL, 0, NULL, NULL},
    };
    _Static_assert(sizeof t / sizeof *t == NFLAGS, "NFLAGS is not the flag table's size");
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
        fprintf(out, "  %-24s %s\n", lhs, f[i].help);
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
        if (fl->kind == ARG_MAYBE && !eq && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
            *(const char **)fl->dst = "latest";
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
        case ARG_MAYBE:
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
/* The mesh of replicate = R (docs/design.md#hsdp): R replicas of S = W/R
 * consecutive ranks (replica r: ranks r*S .. r*S+S-1, a node when S is the
 * GPUs of one); a world R does not divide is refused with the numbers. */
static void set_mesh(FsdRun *r)
{
    const int64_t R = r->m->replicate > 1 ? r->m->replicate : 1;
    r->replicas = 1;
    r->shard_world = r->world;
    r->shard_rank = r->rank;
    r->replica = 0;
    if (r->world % R != 0 && r->m->replicate_auto) {
        /* the planner's choice, for the world fsdpc planned: say so, and
         * how to plan for this one */
        rt_fail(r, "model %s has replicate = %lld, which `replicate = auto` chose for the world "
                   "of %lld ranks fsdpc planned; this run has %d ranks, not a multiple of %lld: "
                   "run on a multiple of %lld (%lld as planned), or recompile for this world "
                   "(fsdpc --world %d, or --sim for its cluster) so that the planner chooses again",
                r->m->name, (long long)R, (long long)r->m->plan_world, r->world, (long long)R,
                (long long)R, (long long)r->m->plan_world, r->world);
        return;
    }
    if (r->world % R != 0) {
        rt_fail(r, "model %s has replicate = %lld (HSDP: %lld replicas of world / %lld ranks), "
                   "but this run has %d ranks, not a multiple of %lld: run on %lld or %lld ranks, "
                   "or recompile with a replicate that divides %d",
                r->m->name, (long long)R, (long long)R, (long long)R, r->world, (long long)R,
                (long long)(r->world / R * R > 0 ? r->world / R * R : R),
                (long long)((r->world / R + 1) * R), r->world);
        return;
    }
    r->replicas = (int)R;
    r->shard_world = (int)(r->world / R);
    r->shard_rank = r->rank % r->shard_world;
    r->replica = r->rank / r->shard_world;
    /* a divisible world other than the planned one trains the same (HSDP
     * computes plain FSDP's step at any R), but the mesh was weighed for
     * another cluster */
    if (r->m->replicate_auto && r->world != r->m->plan_world && r->rank == 0)
        fprintf(stderr, "train: note: replicate = %lld was chosen by `replicate = auto` for a "
                        "world of %lld ranks; at %d ranks it trains the same, but may not be the "
                        "fastest mesh here: recompile with fsdpc --world %d (or --sim) to weigh "
                        "it for this world\n",
                (long long)R, (long long)r->m->plan_world, r->world, r->world);
    /* reshard_after_forward = N (docs/design.md#partial-resharding): N
     * consecutive ranks of the shard group keep each copy, so N divides S;
     * each distinct N gets one sub-communicator (bk_mesh) */
    r->npartial = 0;
    for (int g = 0; g < r->m->ngroups; g++) {
        const int64_t N = r->m->groups[g].reshard_ranks;
        if (N == 0)
            continue;
        if (N < 2 || r->shard_world % N != 0) {
            rt_fail(r, "group %s of model %s has reshard_after_forward = %lld, which does not "
                       "divide its shard group of %d ranks (world %d%s): run on a world whose "
                       "shard group N divides, or recompile with a divisor of %d",
                    r->m->groups[g].name, r->m->name, (long long)N, r->shard_world, r->world,
                    R > 1 ? " / replicate" : "", r->shard_world);
            return;
        }
        int k = 0;
        while (k < r->npartial && r->partial_n[k] != N)
            k++;
        if (k == r->npartial) {
            if (r->npartial == FSD_MAX_PARTIAL) {
                rt_fail(r, "model %s uses more than %d values of reshard_after_forward = N",
                        r->m->name, FSD_MAX_PARTIAL);
                return;
            }
            r->partial_n[r->npartial++] = N;
        }
    }
}

static void check_model(FsdRun *r)
{
    const FsdModel *m = r->m;
    const FsdTrainConfig *c = &r->cfg;
    set_mesh(r);
    if (r->err[0])
        return;
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
    /* bf16 act is a GPU's storage type, narrowed from fp32 masters: the
     * float64 build (gradient checks) computes in real throughout, and the
     * unsharded parameters are gathered in the act dtype itself */
    if (m->act_dtype != FSD_FP32 && m->act_dtype != FSD_BF16) {
        rt_fail(r, "model %s stores its tensors in dtype %d; the runtime knows fp32 (%d) and bf16 "
                   "(%d): regenerate the trainer with fsdpc",
                m->name, (int)m->act_dtype, (int)FSD_FP32, (int)FSD_BF16);
        return;
    }
    if (m->act_dtype == FSD_BF16 && sizeof(real) != sizeof(float)) {
        rt_fail(r, "model %s computes in bf16, which the float64 build cannot: build it without "
                   "FSD_FLOAT64 (BACKEND=cpu), or with FSD_FLOAT64 and without FSD_ACT_BF16",
                m->name);
        return;
    }
    if (m->act_dtype == FSD_BF16 && m->param_dtype != FSD_BF16) {
        rt_fail(r, "model %s computes in bf16 but gathers its parameters in %s (the tables are "
                   "inconsistent: regenerate the trainer with fsdpc)",
                m->name, dtype_name(m->param_dtype));
        return;
    }
    /* bf16 gradients reduced in fp16 would be rounded twice, to two formats */
    if (m->act_dtype == FSD_BF16 && m->reduce_dtype == FSD_FP16) {
        rt_fail(r, "model %s: mixed_precision(param = bf16, reduce = fp16) is not supported; use "
                   "reduce = bf16 or reduce = fp32",
                m->name);
        return;
    }
    /* the same for each group's own dtypes (fsdpc refuses these per target
     * too: docs/design.md#per-target-mixed-precision) */
    for (int g = 0; g < m->ngroups; g++) {
        const FsdGroupInfo *gi = &m->groups[g];
        const bool dts_known = gi->param_dtype <= FSD_FP16 && gi->reduce_dtype <= FSD_FP16 &&
                               (int)gi->param_dtype >= 0 && (int)gi->reduce_dtype >= 0;
        if (!dts_known ||
            (m->act_dtype == FSD_BF16 &&
             (gi->param_dtype != FSD_BF16 || gi->reduce_dtype == FSD_FP16))) {
            rt_fail(r, "model %s: group %s gathers in dtype %d and reduces in dtype %d, which a "
                       "program that computes in %s cannot (the tables are inconsistent: "
                       "regenerate the trainer with fsdpc)",
                    m->name, gi->name, (int)gi->param_dtype, (int)gi->reduce_dtype,
                    dtype_name(m->act_dtype));
            return;
        }
    }
    /* flat_numel counts the group's parameters with their alignment gaps,
     * so "elements": a group of 2 parameters aligned to 16 has 16 */
    int64_t fits = INT64_MAX;
    for (int g = 0; g < m->ngroups; g++)
        if (m->groups[g].flat_numel < fits)
            fits = m->groups[g].flat_numel;
    for (int g = 0; g < m->ngroups; g++)
        if (m->groups[g].flat_numel < r->shard_world) {
            rt_fail(r, "world size %d is larger than shard group %s's %lld elements (its "
                       "parameters, aligned): run on at most %lld ranks, or merge the group "
                       "into a larger one",
                    r->shard_world, m->groups[g].name, (long long)m->groups[g].flat_numel,
                    (long long)fits);
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
    const int64_t W = r->shard_world, B = r->cfg.micro_batch, T = m->seq;
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
        G->lo = r->shard_rank * G->shard;
        G->part = -1;
        G->part_ranks = m->groups[g].reshard_ranks;
        for (int k = 0; k < r->npartial; k++)
            if (r->partial_n[k] == G->part_ranks)
                G->part = k;
        if (G->part >= 0)   /* this rank's slice among its N: N divides S, so rank % N */
            G->part_lo = (r->shard_rank % G->part_ranks) * (G->padded / G->part_ranks);
        int64_t bytes = G->shard * (int64_t)sizeof(real);
        G->master = bk_alloc_shard(r, bytes);
        G->grad = bk_alloc_shard(r, bytes);
        if (states >= 1)
            G->m = bk_alloc_shard(r, bytes);
        if (states >= 2)
            G->v = bk_alloc_shard(r, bytes);
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
        bytes[i] = act_tensor_bytes(r, i, B);
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
            bk_free_shard(r, G->master, bytes);
            bk_free_shard(r, G->grad, bytes);
            bk_free_shard(r, G->m, bytes);
            bk_free_shard(r, G->v, bytes);
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
    eval_free(r);
    free(r->trace);
    r->trace = NULL;
    ckpt_free(r);
    if (r->log)
        fclose(r->log);
    r->log = NULL;
}

/* Whether the log is a regular file: one to cut. A device or pipe (--log
 * /dev/stdout) is written as it is, with nothing to cut. */
static bool log_is_file(FsdRun *r)
{
    struct stat st;
    return fstat(fileno(r->log), &st) == 0 && S_ISREG(st.st_mode);
}

/* --log on --resume: the file keeps its lines of the steps before the one
 * resumed from, up to the first line of a later step, or a line a killed
 * run left unfinished (no newline), where it is cut; this run's lines
 * follow. So a run resumed from an older checkpoint than its last logs each
 * step once. Rank 0, which alone has the log open. */
static void log_resume(FsdRun *r)
{
    if (!log_is_file(r))
        return;
    if (fseek(r->log, 0, SEEK_SET) != 0) {
        rt_fail(r, "cannot read --log file %s: %s", r->log_path, strerror(errno));
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long keep = 0;
    while ((n = getline(&line, &cap, r->log)) > 0) {
        long long step;
        if (line[n - 1] != '\n' || (sscanf(line, "{\"step\": %lld", &step) == 1 && step >= r->step))
            break;
        keep += (long)n;
    }
    free(line);
    if (ferror(r->log) || fflush(r->log) != 0 || ftruncate(fileno(r->log), keep) != 0)
        rt_fail(r, "cannot append to --log file %s: %s", r->log_path, strerror(errno));
    clearerr(r->log);
}

/* After --resume has set the step: a run asked to stop at or before it has
 * nothing to train. --steps equal to the checkpoint's step is a finished
 * run started again (a job script's retry, or --export of a checkpoint's
 * weights): said, and the run goes on to its end, exit 0. --steps below it
 * cannot be honoured (the weights have trained past it): refused. */
static void resumed_at(FsdRun *r)
{
    const bool training = !r->grad_check && !r->err[0];
    if (training && r->cfg.steps < r->step)
        rt_fail(r, "--steps %lld is below the step of the checkpoint resumed from (%lld): its "
                   "weights have trained past it; pass --steps above %lld to train on, or "
                   "--steps %lld to only --export them",
                (long long)r->cfg.steps, (long long)r->step, (long long)r->step,
                (long long)r->step);
    else if (training && r->cfg.steps == r->step && r->rank == 0)
        fprintf(stderr, "train: note: the checkpoint resumed from is at step %lld and --steps is "
                        "%lld: nothing left to train (pass a larger --steps to train on)\n",
                (long long)r->step, (long long)r->cfg.steps);
    /* a refused run leaves its log as it was */
    if (r->log && !r->err[0])
        log_resume(r);
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
    r->grad_check_eps = GRAD_CHECK_EPS;
    r->collective_timeout_s = -1;   /* the backend's default until the flags are read */
    r->max_skips = 10;
    if (!bk_start(r, &argc, &argv)) {
        /* no communication: this process reports for itself */
        fprintf(stderr, "train: %s\n", r->err);
        bk_stop(r);
        free(r);
        exit(1);
    }
    agree_or_exit(r);

    bool help = parse_flags(r, argc, argv);
    if (!r->err[0] && r->on_nonfinite) {
        if (strcmp(r->on_nonfinite, "skip") == 0)
            r->skip_nonfinite = true;
        else if (strcmp(r->on_nonfinite, "stop") != 0)
            rt_fail(r, "--on-nonfinite: '%s' is neither stop nor skip", r->on_nonfinite);
    }
    r->resume_auto = r->resume && strcmp(r->resume, "auto") == 0;
    agree_or_exit(r);
    if (help) {
        if (r->rank == 0)
            usage(r, stdout);
        finish(r, 0);
    }
    check_model(r);
    /* the mesh's sub-communicators, once (HSDP), on every rank alike */
    if (!r->err[0])
        bk_mesh(r);
    /* --hf-names is held against the model now, not when --export runs */
    WLayout hf;
    if (!r->err[0] && r->hf_names && hf_layout(r, r->hf_names, &hf))
        hf_layout_free(&hf);
    agree_or_exit(r);

    /* --grad-check's bound is float64's: fp32 rounding alone exceeds it */
    if (r->grad_check && sizeof(real) != sizeof(double))
        rt_fail(r, "--grad-check needs the float64 build (make trainer BACKEND=cpu64): in fp32 "
                   "the central difference's rounding error alone is above its bound of %g",
                GRAD_CHECK_BOUND);
    else if (r->grad_check_eps <= 0 || r->grad_check_eps > 1)
        rt_fail(r, "--grad-check-eps: %g is not a step above 0 and at most 1", r->grad_check_eps);
    /* data: needed only to train (or check a step); --steps 0 --export
     * writes initial weights */
    else if ((r->cfg.steps > 0 || r->grad_check) && !r->cfg.data)
        rt_fail(r, "no training data: pass --data FILE (model %s's train section names none)",
                m->name);
    else if (r->cfg.data)
        data_open(r, &r->data, "--data", r->cfg.data);
    if (r->cfg.val_data)
        data_open(r, &r->val, "--val-data", r->cfg.val_data);
    eval_open(r);
    /* a resumed run appends to its log (log_resume cuts the lines of the
     * steps it will run again); a fresh one starts it anew */
    if (r->rank == 0 && r->log_path && !(r->log = fopen(r->log_path, r->resume ? "a+" : "w")))
        rt_fail(r, "cannot write --log file %s: %s", r->log_path, strerror(errno));
    /* refused now, not after the last step */
    weights_export_check(r);
    ckpt_check(r);
    agree_or_exit(r);
    /* before the first collective whose count or size depends on them */
    ranks_check_config(r);
    agree_or_exit(r);
    /* the plan's peak at this world, and its memory_budget, before allocating */
    mem_plan_run(r);
    agree_or_exit(r);

    allocate(r);
    agree_or_exit(r);
    bk_ready(r);   /* the backend's start-up work for this size: CUDA's pools */
    agree_or_exit(r);
    /* from here a signal stops the run at a step boundary, with a checkpoint
     * (--grad-check keeps the default: it has no steps to stop between) */
    if (!r->grad_check)
        stop_install(r);
    /* --resume auto: a requeued job's one command line; --init-from applies
     * only when there is no checkpoint to continue */
    if (r->resume_auto) {
        r->resume = ckpt_auto(r) ? "latest" : NULL;
        if (r->resume)
            r->init_from = NULL;
        else if (r->log && log_is_file(r) && ftruncate(fileno(r->log), 0) != 0)   /* a fresh start's log */
            rt_fail(r, "cannot write --log file %s: %s", r->log_path, strerror(errno));
    }
    if (r->resume)
        ckpt_resume(r);   /* weights, optimizer state and the step to run next */
    else if (r->init_from)
        weights_import(r, r->init_from);
    else
        weights_init(r);
    agree_or_exit(r);
    if (r->resume)
        resumed_at(r);
    agree_or_exit(r);

    bk_barrier(r);   /* one time origin for every rank's trace */
    r->t0 = rt_now();
    if (r->trace_path)
        bk_trace_start(r);
    if (r->rank == 0 && !r->quiet) {
        int64_t n = 0;
        for (int p = 0; p < m->nparams; p++)
            n += m->params[p].numel;
        int64_t G = r->cfg.micro_batch * r->cfg.grad_accum * r->world;
        char a[32], b[32];
        printf("model %s: %s parameters in %d shard groups | world %d | %lld x %lld tokens per "
               "micro-batch, %lld micro-batches | %s tokens per step | %lld steps%s\n",
               m->name, thousands(a, sizeof a, n), m->ngroups, r->world,
               (long long)r->cfg.micro_batch, (long long)m->seq, (long long)r->cfg.grad_accum,
               thousands(b, sizeof b, G * m->seq), (long long)r->cfg.steps,
               m->offload_cpu ? " | offload = cpu: shards and optimizer state in host memory, "
                                "not counted in mem"
                              : "");
        mem_report(r);
        fflush(stdout);
    }
    return r;
}

/* ── the trace ── */

void rt_trace(FsdRun *r, const char *name, const char *what, int tid, double begin, double end,
              const int *mark, int64_t bytes)
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
    r->trace[r->ntrace++] = (TraceEvent){name,
                                         what,
                                         tid,
                                         (begin - r->t0) * 1e6,
                                         (end - r->t0) * 1e6,
                                         {mark ? mark[0] : -1, mark ? mark[1] : -1},
                                         bytes};
}

void fsdrt_trace_begin(FsdRun *r, const char *name)
{
    if (!r->trace_path)
        return;
    if (r->nopen == (int)(sizeof r->open_t / sizeof *r->open_t))
        RT_BUG(r, "fsdrt_trace_begin(\"%s\") nested more than %d deep", name, r->nopen);
    r->open_name[r->nopen] = name;
    r->open_mark[r->nopen] = bk_trace_mark(r);
    r->open_t[r->nopen++] = rt_now();
}

void fsdrt_trace_end(FsdRun *r)
{
    if (!r->trace_path)
        return;
    if (r->nopen == 0)
        RT_BUG(r, "fsdrt_trace_end without fsdrt_trace_begin");
    r->nopen--;
    const int mark[2] = {r->open_mark[r->nopen], bk_trace_mark(r)};
    rt_trace(r, r->open_name[r->nopen], NULL, 0, r->open_t[r->nopen], rt_now(), mark, 0);
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
        /* under HSDP a fourth track: the replica all-reduce (the mesh's
         * replicate dimension, across nodes when a replica is one) */
        static const char *const threads[] = {"compute", "all-gather", "reduce-scatter",
                                              "all-reduce (replicate)"};
        fprintf(mem, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
                r->rank, r->rank);
        for (int t = 0; t < (r->replicas > 1 ? 4 : 3); t++)
            fprintf(mem, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                         "\"args\":{\"name\":\"%s\"}}",
                    r->rank, t, threads[t]);
        for (int i = 0; i < r->ntrace; i++) {
            TraceEvent *e = &r->trace[i];
            double b, d;   /* the device's times, where the backend marked them */
            if (bk_trace_us(r, e->mark[0], &b) && bk_trace_us(r, e->mark[1], &d))
                e->begin_us = b, e->end_us = d;
            fprintf(mem, ",\n{\"name\":\"");
            if (e->what)
                fprintf(mem, "%s ", e->what);
            json_put_chars(mem, e->name);
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
            errno = 0;
            if (ferror(f) | (fclose(f) != 0))
                rt_fail(r, "cannot write --trace-out file %s: %s", r->trace_path,
                        errno ? strerror(errno) : "a write failed");
        }
    }
    free(all);
}

int fsdrt_finalize(FsdRun *r)
{
    if (!r)
        return 1;
    ckpt_finish(r);   /* a save still in flight completes before exit */
    if (r->trace_path) {
        write_trace(r);
        agree_or_note(r);
    }
    errno = 0;
    if (r->log && (ferror(r->log) | (fclose(r->log) != 0)))
        rt_fail(r, "cannot write --log file %s: %s", r->log_path,
                errno ? strerror(errno) : "a write failed");
    r->log = NULL;
    agree_or_note(r);
    /* stopped by a signal: 128 + it, as a shell reports a process it killed
     * (a scheduler then knows the run did not end by itself) */
    int status = r->stop_signal ? 128 + r->stop_signal : r->status;
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

void *fsdrt_act_ptr(FsdRun *r, int i)
{
    if (i < 0 || i >= r->m->nacts)
        RT_BUG(r, "fsdrt_act(%d): the model has %d arena tensors", i, r->m->nacts);
    return r->arena + r->act_offset[i];
}

/* Parameter p's place in an unsharded buffer of its group: its offset, in
 * elements of act. */
static void *unsharded_at(FsdRun *r, int p, void *buf)
{
    return (char *)buf + r->m->params[p].offset * act_bytes(r);
}

void *fsdrt_param_ptr(FsdRun *r, int param)
{
    if (param < 0 || param >= r->m->nparams)
        RT_BUG(r, "fsdrt_param(%d): the model has %d parameters", param, r->m->nparams);
    const FsdParamInfo *P = &r->m->params[param];
    if (!r->groups[P->group].params)
        RT_BUG(r, "fsdrt_param(%s) while group %s is not gathered", P->name,
               r->m->groups[P->group].name);
    return unsharded_at(r, param, r->groups[P->group].params);
}

void *fsdrt_grad_ptr(FsdRun *r, int param)
{
    if (param < 0 || param >= r->m->nparams)
        RT_BUG(r, "fsdrt_grad(%d): the model has %d parameters", param, r->m->nparams);
    const FsdParamInfo *P = &r->m->params[param];
    if (!r->groups[P->group].grads)
        RT_BUG(r, "fsdrt_grad(%s) while group %s has no gradient buffer", P->name,
               r->m->groups[P->group].name);
    return unsharded_at(r, param, r->groups[P->group].grads);
}

/* fsdrt_idx, fsdrt_targets and fsdrt_positions are the backend's: the
 * kernels read them, so on CUDA they are device copies (bk_inputs). */

/* ── collectives: the schedule's rules ──
 *
 * The emitted program's collective calls are checked here, once for every
 * backend: a call the schedule could not have made (a wait without its
 * collective, a reshard of a group not gathered, ...) is a bug in the
 * program, reported with its call site. This file keeps the group's state
 * (params, grads, gathering, reducing), the byte counters and the trace's
 * slices; the bk_* hooks do only the backend's work, with the state already
 * checked. */

void fsdrt_all_gather(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups)
        RT_BUG(r, "fsdrt_all_gather: no group %d", g);
    Group *G = &r->groups[g];
    const FsdDtype dt = group_param_dtype(r, g);
    if (G->gathering)
        RT_BUG(r, "all-gather of group %s issued again before its wait", r->m->groups[g].name);
    /* a group gathered again without a reshard reuses its buffer */
    if (!G->params)
        G->params = bk_pool_get(r, unsharded_bytes(r, G), bk_unsharded_count(r, G->padded, dt));
    bk_all_gather(r, g);
    G->gathering = true;
    G->gather_t0 = rt_now();
    r->counters.gather_bytes += (G->padded - G->shard) * dtype_bytes(dt);
}

/* The bytes of a gather within the N ranks holding the copy: (N-1)/N of
 * the padded buffer in the group's gather dtype, as the plan counts them
 * (on the CPU build and on CUDA with a 16-bit act the wire carries that
 * dtype; docs/design.md#partial-resharding says where it does not). */
static int64_t partial_bytes(const FsdRun *r, int g)
{
    const Group *G = &r->groups[g];
    return (G->part_ranks - 1) * (G->padded / G->part_ranks) * dtype_bytes(group_param_dtype(r, g));
}

void fsdrt_keep_partial(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || r->groups[g].part < 0 || !r->groups[g].params ||
        r->groups[g].gathering || r->groups[g].kept)
        RT_BUG(r, "fsdrt_keep_partial(%d) of a group without reshard_after_forward = N, not "
                  "gathered, or already holding its copy", g);
    Group *G = &r->groups[g];
    const int64_t n = G->padded / G->part_ranks;
    G->kept = bk_pool_get(r, n * act_bytes(r), bk_unsharded_count(r, n, group_param_dtype(r, g)));
    bk_keep_partial(r, g);
}

void fsdrt_gather_partial(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || !r->groups[g].kept || r->groups[g].gathering ||
        r->groups[g].params)
        RT_BUG(r, "fsdrt_gather_partial(%d) without a kept copy, or of a group gathered or "
                  "gathering", g);
    Group *G = &r->groups[g];
    G->params = bk_pool_get(r, unsharded_bytes(r, G),
                            bk_unsharded_count(r, G->padded, group_param_dtype(r, g)));
    bk_gather_partial(r, g);
    G->gathering = G->gathering_partial = true;
    G->gather_t0 = rt_now();
    r->counters.reshard_bytes += partial_bytes(r, g);
}

void fsdrt_wait_gather(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || !r->groups[g].gathering)
        RT_BUG(r, "fsdrt_wait_gather(%d) without an all-gather in flight", g);
    Group *G = &r->groups[g];
    bk_wait_gather(r, g);
    G->gathering = false;
    /* host times: from the issue to the wait's return; on CUDA the trace
     * has the device's, from the backend's marks around the work */
    int mark[2];
    bk_trace_collective(r, g, 1, mark);
    if (G->gathering_partial) {
        /* the copy has been read: back to the pool */
        const int64_t n = G->padded / G->part_ranks;
        bk_pool_put(r, G->kept, bk_unsharded_count(r, n, group_param_dtype(r, g)));
        G->kept = NULL;
        G->gathering_partial = false;
        rt_trace(r, r->m->groups[g].name, "gather_partial", 1, G->gather_t0, rt_now(), mark,
                 partial_bytes(r, g));
        return;
    }
    rt_trace(r, r->m->groups[g].name, "all_gather", 1, G->gather_t0, rt_now(), mark,
             (G->padded - G->shard) * dtype_bytes(group_param_dtype(r, g)));
}

void fsdrt_reshard(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || !r->groups[g].params || r->groups[g].gathering)
        RT_BUG(r, "fsdrt_reshard(%d) of a group that is not gathered (or still gathering)", g);
    Group *G = &r->groups[g];
    bk_pool_put(r, G->params, bk_unsharded_count(r, G->padded, group_param_dtype(r, g)));
    G->params = NULL;
}

void fsdrt_alloc_grads(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || r->groups[g].grads)
        RT_BUG(r, "fsdrt_alloc_grads(%d) of a group whose gradients are already allocated", g);
    Group *G = &r->groups[g];
    G->grads = bk_pool_get(r, unsharded_bytes(r, G),
                           bk_unsharded_count(r, G->padded, grads_dtype(r, g)));
    bk_alloc_grads(r, g);
}

void fsdrt_reduce_scatter(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || !r->groups[g].grads || r->groups[g].reducing)
        RT_BUG(r, "fsdrt_reduce_scatter(%d) without gradients, or with one in flight", g);
    Group *G = &r->groups[g];
    rt_count(r, reduce_buffer_bytes(r, g, G->padded));
    bk_reduce_scatter(r, g);
    G->reducing = true;
    G->reduce_t0 = rt_now();
    r->counters.reduce_bytes += (G->padded - G->shard) * dtype_bytes(group_reduce_dtype(r, g));
}

void fsdrt_all_reduce(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || !r->groups[g].reducing || r->groups[g].all_reducing ||
        r->replicas <= 1)
        RT_BUG(r, "fsdrt_all_reduce(%d) without a reduce-scatter in flight, again, or without "
                  "replicate",
               g);
    Group *G = &r->groups[g];
    bk_all_reduce(r, g);
    G->all_reducing = true;
    r->counters.replicate_bytes += replicate_bytes(r, g, G->shard);
}

void fsdrt_wait_reduce(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || !r->groups[g].reducing ||
        (r->replicas > 1 && !r->groups[g].all_reducing))
        RT_BUG(r, "fsdrt_wait_reduce(%d) without a reduce-scatter (and, under replicate, its "
                  "all-reduce) in flight",
               g);
    Group *G = &r->groups[g];
    bk_wait_reduce(r, g);
    rt_count(r, -reduce_buffer_bytes(r, g, G->padded));
    G->reducing = false;
    int mark[2];
    bk_trace_collective(r, g, 2, mark);
    rt_trace(r, r->m->groups[g].name, "reduce_scatter", 2, G->reduce_t0, rt_now(), mark,
             (G->padded - G->shard) * dtype_bytes(group_reduce_dtype(r, g)));
    if (G->all_reducing)   /* one slice for both: they share the reduce stream and its wait */
        rt_trace(r, r->m->groups[g].name, "all_reduce", 3, G->reduce_t0, rt_now(), mark,
                 replicate_bytes(r, g, G->shard));
    G->all_reducing = false;
}

void fsdrt_free_grads(FsdRun *r, int g)
{
    if (g < 0 || g >= r->m->ngroups || !r->groups[g].grads || r->groups[g].reducing)
        RT_BUG(r, "fsdrt_free_grads(%d) of gradients not allocated, or still reducing", g);
    Group *G = &r->groups[g];
    bk_pool_put(r, G->grads, bk_unsharded_count(r, G->padded, grads_dtype(r, g)));
    G->grads = NULL;
}

/* Collective state left over at the end of a step is a schedule bug. */
static void check_idle(FsdRun *r)
{
    for (int g = 0; g < r->m->ngroups; g++) {
        const Group *G = &r->groups[g];
        const char *what = G->gathering  ? "an all-gather in flight"
                           : G->kept     ? "its partial copy (reshard_after_forward = N) held"
                           : G->reducing ? "a reduce-scatter in flight"
                           : G->grads    ? "unsharded gradients allocated"
                           : G->params   ? "unsharded parameters gathered"
                                         : NULL;
        if (what)
            RT_BUG(r, "fsdrt_end_step: group %s still has %s; the optimizer would update "
                      "shards the step has not finished with",
                   r->m->groups[g].name, what);
    }
}

/* ── --grad-check ── */

/* Forward and backward of step r->step's batch with the master shards as
 * they are: the gradient of the step's mean loss lands in the grad shards
 * (reduce-scattered, averaged over ranks, summed over micro-batches), and
 * the mean loss is returned. No optimizer, no log line, no step counted. */
static double check_step(FsdRun *r, FsdStepFn step)
{
    r->in_step = true;
    r->loss_sum = 0;
    step(r);
    check_idle(r);
    r->in_step = false;
    double loss = r->loss_sum;
    bk_allreduce_sum(r, &loss, 1);
    r->loss_sum = 0;
    return loss / ((double)r->world * (double)r->cfg.grad_accum);
}

/* Sets every master shard to saved + a·d (d: NULL for saved itself) and
 * zeroes the grad shards. Shards are host memory in the float64 build, the
 * only one the check runs in. */
static void check_set(FsdRun *r, real *const *saved, double a, real *const *d)
{
    for (int g = 0; g < r->m->ngroups; g++) {
        Group *G = &r->groups[g];
        for (int64_t i = 0; i < G->shard; i++)
            G->master[i] = d ? saved[g][i] + (real)a * d[g][i] : saved[g][i];
        memset(G->grad, 0, (size_t)G->shard * sizeof(real));
    }
}

/* --grad-check N: the gradient of the next step's mean loss L (step 0's,
 * or that of the step --resume continues from) against central differences
 * along N random directions d (weights_direction: normal(0, 1) on every
 * parameter element, none on padding), each
 *   Σ g·d  vs  (L(θ + εd) − L(θ − εd)) / 2ε,
 * relative error |a − b| / max(|a|, |b|). Every rank gets the same figures
 * (both sides are all-reduced) and so the same verdict: r->status is 1 if
 * any direction is above GRAD_CHECK_BOUND. The run is left as it was: the
 * master shards, zero gradients, the same step next, the byte counters
 * (the memory peak keeps what the check used). */
static void grad_check(FsdRun *r, FsdStepFn step)
{
    const FsdModel *m = r->m;
    const int ng = m->ngroups;
    const double eps = r->grad_check_eps;
    const FsdCounters counters = r->counters;
    real **saved = calloc((size_t)ng + 1, sizeof *saved);
    real **grad = calloc((size_t)ng + 1, sizeof *grad);
    real **dir = calloc((size_t)ng + 1, sizeof *dir);
    bool ok = saved && grad && dir;
    for (int g = 0; ok && g < ng; g++) {
        int64_t bytes = r->groups[g].shard * (int64_t)sizeof(real);
        ok = (saved[g] = bk_alloc(r, bytes)) && (grad[g] = bk_alloc(r, bytes)) &&
             (dir[g] = bk_alloc(r, bytes));
    }
    if (!ok)
        rt_fail(r, "out of memory for --grad-check's copies of the shards");
    agree_or_note(r);

    if (r->status == 0) {
        double loss = check_step(r, step);
        for (int g = 0; g < ng; g++) {
            size_t bytes = (size_t)r->groups[g].shard * sizeof(real);
            memcpy(saved[g], r->groups[g].master, bytes);
            memcpy(grad[g], r->groups[g].grad, bytes);
        }
        if (r->rank == 0)
            printf("grad check: model %s, step %lld's batch (%lld sequences), loss %.12f, %lld "
                   "directions, eps %g, bound %g\n",
                   m->name, (long long)r->step,
                   (long long)(r->cfg.micro_batch * r->cfg.grad_accum * r->world), loss,
                   (long long)r->grad_check, eps, GRAD_CHECK_BOUND);
        double worst = 0;
        int64_t failed = 0;
        for (int64_t k = 0; k < r->grad_check; k++) {
            weights_direction(r, (uint64_t)k, dir);
            double dot = 0;
            for (int g = 0; g < ng; g++)
                for (int64_t i = 0; i < r->groups[g].shard; i++)
                    dot += (double)grad[g][i] * (double)dir[g][i];
            if (r->replica > 0)   /* HSDP: the replicas hold the same shards; count one */
                dot = 0;
            bk_allreduce_sum(r, &dot, 1);
            check_set(r, saved, eps, dir);
            double plus = check_step(r, step);
            check_set(r, saved, -eps, dir);
            double minus = check_step(r, step);
            double fd = (plus - minus) / (2 * eps);
            double scale = fmax(fabs(fd), fabs(dot));
            double rel = scale > 0 ? fabs(fd - dot) / scale : 0;
            if (!(rel <= GRAD_CHECK_BOUND))   /* NaN fails too */
                failed++;
            if (!(rel <= worst))
                worst = rel;
            if (r->rank == 0)
                printf("grad check %lld: gradient %.12e, central difference %.12e, relative "
                       "error %.3e%s\n",
                       (long long)k, dot, fd, rel, rel <= GRAD_CHECK_BOUND ? "" : "  FAIL");
        }
        check_set(r, saved, 0, NULL);
        if (r->rank == 0) {
            if (failed)
                printf("grad check FAILED: %lld of %lld directions above %g (largest %.3e)\n",
                       (long long)failed, (long long)r->grad_check, GRAD_CHECK_BOUND, worst);
            else
                printf("grad check passed: %lld directions within %g (largest %.3e)\n",
                       (long long)r->grad_check, GRAD_CHECK_BOUND, worst);
            fflush(stdout);
        }
        if (failed)
            r->status = 1;
    }
    for (int g = 0; g < ng; g++) {
        int64_t bytes = r->groups[g].shard * (int64_t)sizeof(real);
        bk_free(r, saved ? saved[g] : NULL, bytes);
        bk_free(r, grad ? grad[g] : NULL, bytes);
        bk_free(r, dir ? dir[g] : NULL, bytes);
    }
    free(saved), free(grad), free(dir);
    r->counters.gather_bytes = counters.gather_bytes;
    r->counters.reduce_bytes = counters.reduce_bytes;
    r->counters.replicate_bytes = counters.replicate_bytes;
    r->counters.reshard_bytes = counters.reshard_bytes;
}

/* ── the step ── */

int fsdrt_train(FsdRun *r, FsdStepFn step)
{
    if (r->grad_check) {   /* instead of training */
        grad_check(r, step);
        return fsdrt_finalize(r);
    }
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
    if (r->done)
        return false;
    /* a signal caught on any rank stops every rank here, at the same step,
     * with a checkpoint of the state after the step that just ran (stop.c);
     * a run stopped on a non-finite step (r->stopped) or by saves that keep
     * failing (r->saves_failed), the same on every rank, saves nothing more */
    const int sig = r->stopped || r->saves_failed ? 0 : stop_agree(r);
    if (sig)
        stop_run(r, sig);
    if (r->step >= r->cfg.steps || sig || r->stopped || r->saves_failed) {
        r->done = true;
        ckpt_finish(r);   /* the last checkpoint is complete before the run ends */
        /* a stopped run has no final weights to export */
        if (r->export_path && r->step >= r->cfg.steps && !r->stopped) {
            weights_export(r, r->export_path);
            agree_or_note(r);
        }
        return false;
    }
    r->in_step = true;
    r->loss_sum = 0;
    r->step_t0 = rt_now();
    r->gather_at_step = r->counters.gather_bytes;
    r->reduce_at_step = r->counters.reduce_bytes;
    r->replicate_at_step = r->counters.replicate_bytes;
    r->reshard_at_step = r->counters.reshard_bytes;
    stop_test_pause(r);
    return true;
}

void fsdrt_load_micro_batch(FsdRun *r, int micro)
{
    if (!r->in_step || micro < 0 || micro >= r->cfg.grad_accum)
        RT_BUG(r, "fsdrt_load_micro_batch(%d) outside a step of %lld micro-batches", micro,
               (long long)r->cfg.grad_accum);
    data_load(r, micro);
    bk_inputs(r, micro);
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

/* nan, inf or -inf, without the sign printf gives a NaN */
static const char *nonfinite_name(double x)
{
    return isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
}

/* Why the run stops at this step, and what to try (rank 0, standard
 * error): the loss and the norm are global, so one line says it for every
 * rank. The status is NONFINITE_STATUS. */
static void stop_message(FsdRun *r, double loss, double norm, double lr)
{
    const bool bad_loss = !isfinite(loss);
    char ls[32], ns[32];
    snprintf(ls, sizeof ls, "%g", loss);
    snprintf(ns, sizeof ns, "%g", norm);
    char why[96] = "";
    if (r->skip_nonfinite)
        snprintf(why, sizeof why, " after %lld skipped steps in a row (--max-skips %lld)",
                 (long long)(r->skipped - 1), (long long)r->max_skips);
    fprintf(stderr,
            "train: step %lld: the %s is %s (loss %s, gradient norm %s); stopping before its "
            "update%s; the weights and checkpoints are those from before it. Try a lower "
            "--lr (this step's was %g), a grad_clip in the train section, or %s\n",
            (long long)r->step, bad_loss ? "loss" : "gradient norm",
            nonfinite_name(bad_loss ? loss : norm), isfinite(loss) ? ls : nonfinite_name(loss),
            isfinite(norm) ? ns : nonfinite_name(norm), why, lr,
            r->skip_nonfinite ? "a larger --max-skips" : "--on-nonfinite skip to skip such steps");
    fflush(stderr);
}

void fsdrt_end_step(FsdRun *r)
{
    if (!r->in_step)
        RT_BUG(r, "fsdrt_end_step outside a step");
    check_idle(r);
    const FsdTrainConfig *c = &r->cfg;

    /* the step's loss (mean over every micro-batch of every rank) and the
     * global gradient norm, in one all-reduce; clipping (clip_coef) and the
     * optimizer: on CUDA all on the device, read back only after it */
    double lr = lr_at(c, r->step), v[2];
    bk_update(r, lr, r->step + 1, v);
    double loss = v[0] / ((double)r->world * (double)c->grad_accum);
    double norm = sqrt(v[1]);
    /* a non-finite step was not applied (update_coef): every rank has the
     * same sums, so every rank takes the same turn here */
    const bool skipped = update_coef(c->grad_clip, v[0], v[1]) == UPDATE_SKIP;
    r->skipped = skipped ? r->skipped + 1 : 0;
    r->stopped = skipped && (!r->skip_nonfinite || r->skipped > r->max_skips);
    /* the state after this update is the checkpoint of step + 1; the time
     * training waits for it counts in the step's. A stopped run saves
     * nothing more (nor prunes): its last checkpoint stays the latest */
    bool ckpt_worked = false;
    double ckpt_ms = r->stopped ? 0 : ckpt_after_step(r, &ckpt_worked);

    double secs = rt_now() - r->step_t0;
    const int64_t G = c->micro_batch * c->grad_accum * r->world;   /* this step's sequences */
    int64_t tokens = G * r->m->seq;
    double tok_s = secs > 0 ? (double)tokens / secs : 0;
    int64_t gathered = r->counters.gather_bytes - r->gather_at_step;
    int64_t reduced = r->counters.reduce_bytes - r->reduce_at_step;
    int64_t replicated = r->counters.replicate_bytes - r->replicate_at_step;
    int64_t partial = r->counters.reshard_bytes - r->reshard_at_step;
    /* evaluation after this update, when due: outside the step's time and
     * bytes, so step_ms, tokens/s and the step's gather_bytes are
     * training's alone; not after a step that stopped the run, whose
     * update was not applied */
    double val_loss = 0, eval_ms = 0;
    const bool evaluated = !r->stopped && eval_after_step(r, &val_loss, &eval_ms);
    if (r->rank == 0) {
        if (!r->quiet) {
            char a[32], b[32], ck[96] = "", sk[96] = "";
            if (ckpt_worked)
                snprintf(ck, sizeof ck, " | ckpt %.1f ms", ckpt_ms);
            if (evaluated)
                eval_describe(ck + strlen(ck), sizeof ck - strlen(ck), false, val_loss, eval_ms);
            if (r->stopped)
                snprintf(sk, sizeof sk, " | not finite: stopped");
            else if (skipped)
                snprintf(sk, sizeof sk, " | not finite: skipped (%lld in a row, --max-skips %lld)",
                         (long long)r->skipped, (long long)r->max_skips);
            printf("step %4lld/%lld | loss %.6f | lr %.2e | norm %.4f | %s tok/s | %.1f ms | mem %s%s%s\n",
                   (long long)r->step, (long long)c->steps, loss, lr, norm,
                   thousands(a, sizeof a, (int64_t)tok_s), secs * 1e3,
                   mem_str(b, sizeof b, r->counters.peak_alloc_bytes), ck, sk);
            fflush(stdout);
        }
        if (r->log) {
            char ls[32], ns[32], ck[256] = "";
            /* with checkpoints on: how long this step waited for them */
            if (c->ckpt_every > 0)
                snprintf(ck, sizeof ck, ", \"ckpt_block_ms\": %.3f", ckpt_ms);
            /* a step whose update was not applied (skipped, or the one that
             * stopped the run) says so; the others' lines are as before */
            if (skipped)
                snprintf(ck + strlen(ck), sizeof ck - strlen(ck), ", \"skipped\": true");
            if (evaluated)
                eval_describe(ck + strlen(ck), sizeof ck - strlen(ck), true, val_loss, eval_ms);
            /* HSDP: the replicate dimension's bytes (in comm_bytes too);
             * other runs' lines are as before */
            if (r->replicas > 1)
                snprintf(ck + strlen(ck), sizeof ck - strlen(ck), ", \"replicate_bytes\": %lld",
                         (long long)replicated);
            /* partial resharding: the gathers within N ranks (in comm_bytes too) */
            if (r->npartial > 0)
                snprintf(ck + strlen(ck), sizeof ck - strlen(ck), ", \"reshard_bytes\": %lld",
                         (long long)partial);
            /* JSON has no NaN: a diverged run logs null */
            json_number(ls, sizeof ls, loss);
            json_number(ns, sizeof ns, norm);
            fprintf(r->log,
                    "{\"step\": %lld, \"loss\": %s, \"lr\": %.17g, \"grad_norm\": %s, "
                    "\"tokens_per_s\": %.1f, \"step_ms\": %.3f, \"mem_peak_bytes\": %lld, "
                    "\"mem_plan_bytes\": %lld, "
                    "\"comm_bytes\": %lld, \"gather_bytes\": %lld, \"reduce_bytes\": %lld, "
                    "\"first_seq\": %lld%s}\n",
                    (long long)r->step, ls, lr, ns, tok_s, secs * 1e3,
                    (long long)r->counters.peak_alloc_bytes, (long long)r->mem.peak,
                    (long long)(gathered + reduced + replicated + partial),
                    (long long)gathered, (long long)reduced, (long long)r->seq, ck);
            fflush(r->log);
        }
        if (r->stopped)
            stop_message(r, loss, norm, lr);
    }
    if (r->stopped)
        r->status = NONFINITE_STATUS;
    r->step++;
    r->seq += G;   /* a skipped step's sequences are consumed all the same */
    r->in_step = false;
}
