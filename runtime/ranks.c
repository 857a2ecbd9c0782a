/*
 * ranks.c — the start-up check that every rank runs the same configuration.
 *
 * Ranks started with different settings do not fail by themselves: a
 * different --steps or --grad-accum leaves one rank waiting in a collective
 * the others never issue, and a different --micro-batch, --lr, --seed or
 * data file trains, silently, a model no single configuration describes. So
 * once the flags are read and the data files opened, each rank writes what
 * must agree as text, one setting a line, and rank 0 gathers every rank's
 * text (bk_gather_bytes, which every backend has: MPI on the CPU, NCCL on
 * CUDA with or without MPI) and holds it against its own. The first
 * difference becomes rank 0's error, naming the setting and both values,
 * and the caller's agreement point reports it on every rank, which all
 * exit 1 before the first step.
 *
 * Files are compared by what they hold, not by name (a path may differ
 * from node to node): the size and an FNV-1a hash of the first and last
 * MiB, which tells apart any two token files a run could be handed by
 * mistake at the cost of reading 2 MiB.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A rank's settings: lines "name\tvalue\tnote\n", its own rank first. Names and values are
 * compared; the note (a file's path) only helps the message. */
typedef struct Text {
    char *s;
    size_t n, cap;
    bool full;               /* out of memory: the text is incomplete */
} Text;

static void put(Text *t, const char *name, const char *note, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void put(Text *t, const char *name, const char *note, const char *fmt, ...)
{
    char value[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    size_t need = strlen(name) + strlen(value) + strlen(note ? note : "") + 4;
    if (t->full)
        return;
    if (t->n + need + 1 > t->cap) {
        size_t cap = (t->cap + need + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->full = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    t->n += (size_t)sprintf(t->s + t->n, "%s\t%s\t%s\n", name, value, note ? note : "");
}

/* The shortest decimal that reads back as x, so that two values print
 * differently exactly when they differ. */
static const char *real_str(char *buf, size_t n, double x)
{
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    return buf;
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

#define ID_SPAN ((off_t)1 << 20)

/* A file's identity: its size and the hash of its first and last MiB;
 * false with `why` when it cannot be read whole. */
static bool identify(const char *path, int64_t *bytes, uint64_t *hash, char *why, size_t why_n)
{
    /* O_NONBLOCK: a FIFO opens at once instead of waiting for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    bool stated = fd >= 0 && fstat(fd, &st) == 0;
    if (!stated || !S_ISREG(st.st_mode)) {
        /* the file's own check reports it; here it is only a value */
        if (stated)
            snprintf(why, why_n, "not a regular file");
        else
            snprintf(why, why_n, "unreadable (%s)", strerror(errno));
        if (fd >= 0)
            close(fd);
        return false;
    }
    unsigned char *buf = malloc((size_t)ID_SPAN);
    uint64_t h = 0xCBF29CE484222325ull;
    bool ok = buf != NULL;
    const off_t at[2] = {0, st.st_size > ID_SPAN ? st.st_size - ID_SPAN : 0};
    for (int k = 0; ok && k < 2; k++) {
        ssize_t got = pread(fd, buf, (size_t)ID_SPAN, at[k]);
        ok = got >= 0;
        if (ok)
            h = fnv1a(h, buf, (size_t)got);
    }
    free(buf);
    close(fd);
    if (!ok)
        snprintf(why, why_n, "unreadable");
    *bytes = st.st_size;
    *hash = h;
    return ok;
}

static void put_file(Text *t, const char *name, const char *path)
{
    int64_t bytes;
    uint64_t h;
    char why[160];
    if (!path)
        put(t, name, NULL, "none");
    else if (identify(path, &bytes, &h, why, sizeof why))
        put(t, name, path, "%lld bytes, hash %016llx", (long long)bytes, (unsigned long long)h);
    else
        put(t, name, path, "%s", why);
}

/* --data or --val-data as a pattern: the files it matched on this rank,
 * in order, as one identity (a rank that sees another number of shards,
 * or other bytes in one, differs; the same shards under another directory
 * do not). One file is put_file's. */
static void put_data(Text *t, const char *name, const TokenData *d, const char *pattern)
{
    if (!pattern || !d->ready || d->nfiles == 1) {
        put_file(t, name, d->ready ? d->files[0].path : pattern);
        return;
    }
    uint64_t h = 0xCBF29CE484222325ull;
    int64_t total = 0;
    for (int k = 0; k < d->nfiles; k++) {
        int64_t bytes;
        uint64_t fh;
        char why[160];
        if (!identify(d->files[k].path, &bytes, &fh, why, sizeof why)) {
            put(t, name, pattern, "%s: %s", d->files[k].path, why);
            return;
        }
        /* contents, not names: the same shards under another path are
         * the same data, as one file is */
        h = fnv1a(h, (const unsigned char *)&fh, sizeof fh);
        h = fnv1a(h, (const unsigned char *)&bytes, sizeof bytes);
        total += bytes;
    }
    put(t, name, pattern, "%d files, %lld bytes, hash %016llx", d->nfiles, (long long)total,
        (unsigned long long)h);
}

/* Everything that must be the same on every rank, under the name a user
 * would change it by: the flag's, or the train section's setting. */
static void describe(const FsdRun *r, Text *t)
{
    const FsdModel *m = r->m;
    const FsdTrainConfig *c = &r->cfg;
    char x[32];
    put(t, "rank", NULL, "%d", r->rank);   /* first: where each rank's text starts */
    put(t, "model hash", m->name, "%016llx", (unsigned long long)m->hash);
    put(t, "build", NULL, "%s", sizeof(real) == sizeof(double) ? "float64" : "fp32");
    put(t, "--steps", NULL, "%lld", (long long)c->steps);
    put(t, "--micro-batch", NULL, "%lld", (long long)c->micro_batch);
    put(t, "--grad-accum", NULL, "%lld", (long long)c->grad_accum);
    put(t, "--lr", NULL, "%s", real_str(x, sizeof x, c->lr));
    put(t, "--seed", NULL, "%lld", (long long)c->seed);
    put(t, "optimizer", NULL, "%s", c->optimizer == FSD_ADAMW ? "adamw" : "sgd");
    put(t, "betas", NULL, "%.17g, %.17g", c->beta1, c->beta2);
    put(t, "eps", NULL, "%s", real_str(x, sizeof x, c->eps));
    put(t, "weight_decay", NULL, "%s", real_str(x, sizeof x, c->weight_decay));
    put(t, "momentum", NULL, "%s%s", real_str(x, sizeof x, c->momentum),
        c->nesterov ? " (nesterov)" : "");
    put(t, "schedule", NULL, "%s", lr_schedule_name(c->schedule));
    put(t, "warmup", NULL, "%lld", (long long)c->warmup);
    put(t, "min_lr", NULL, "%s", real_str(x, sizeof x, c->min_lr));
    put(t, "decay", NULL, "%s", real_str(x, sizeof x, c->decay));
    put(t, "grad_clip", NULL, "%s", real_str(x, sizeof x, c->grad_clip));
    put(t, "--ckpt-dir", NULL, "%s", c->ckpt_dir ? c->ckpt_dir : "(default)");
    put(t, "--ckpt-every", NULL, "%lld", (long long)c->ckpt_every);
    put(t, "--ckpt-keep", NULL, "%lld", (long long)c->ckpt_keep);
    put(t, "--ckpt-async", NULL, "%s", c->ckpt_async ? "on" : "off");
    put(t, "--resume", NULL, "%s", r->resume ? r->resume : "none");
    put(t, "--grad-check", NULL, "%lld", (long long)r->grad_check);
    put(t, "--grad-check-eps", NULL, "%s", real_str(x, sizeof x, r->grad_check_eps));
    put(t, "--hf-names", NULL, "%s", r->hf_names ? r->hf_names : "none");
    put(t, "--eval-every", NULL, "%lld", (long long)c->eval_every);
    put(t, "--eval-sequences", NULL, "%lld", (long long)c->eval_sequences);
    put(t, "--shuffle", NULL, "%s", r->shuffle ? "on" : "off");
    put_data(t, "--data", &r->data, c->data);
    put_data(t, "--val-data", &r->val, c->val_data);
    put_file(t, "--init-from", r->init_from);
}

/* Line `name` of a rank's text [s, end): its value and note, or false. */
static bool find(const char *s, const char *end, const char *name, size_t name_len,
                 const char **value, size_t *value_len, const char **note, size_t *note_len)
{
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        const char *t1 = memchr(s, '\t', (size_t)(e - s));
        const char *t2 = t1 ? memchr(t1 + 1, '\t', (size_t)(e - t1 - 1)) : NULL;
        if (t2 && (size_t)(t1 - s) == name_len && memcmp(s, name, name_len) == 0) {
            *value = t1 + 1;
            *value_len = (size_t)(t2 - t1 - 1);
            *note = t2 + 1;
            *note_len = (size_t)(e - t2 - 1);
            return true;
        }
        s = e + 1;
    }
    return false;
}

/* "value", or with a note (a file's path) "note (value)". */
static void shown(char *buf, size_t n, const char *v, size_t v_len, const char *note, size_t note_len)
{
    if (note_len)
        snprintf(buf, n, "%.*s (%.*s)", (int)note_len, note, (int)v_len, v);
    else
        snprintf(buf, n, "%.*s", (int)v_len, v);
}

/* Rank 0: the first setting in which rank k's text [s, end) differs from
 * its own, recorded as an error naming both values. */
static bool differs(FsdRun *r, const Text *own, int k, const char *s, const char *end)
{
    const char *line = own->s, *stop = own->s + own->n;
    for (const char *e; line < stop; line = e + 1) {
        e = memchr(line, '\n', (size_t)(stop - line));
        size_t name_len = (size_t)((const char *)memchr(line, '\t', (size_t)(e - line)) - line);
        if (name_len == 4 && memcmp(line, "rank", 4) == 0)
            continue;
        const char *v0, *n0, *vk = "none", *nk = "";
        size_t v0_len, n0_len, vk_len = 4, nk_len = 0;
        find(line, e + 1, line, name_len, &v0, &v0_len, &n0, &n0_len);
        find(s, end, line, name_len, &vk, &vk_len, &nk, &nk_len);
        if (vk_len == v0_len && memcmp(vk, v0, v0_len) == 0)
            continue;
        char mine[300], theirs[300];
        shown(theirs, sizeof theirs, vk, vk_len, nk, nk_len);
        shown(mine, sizeof mine, v0, v0_len, n0, n0_len);
        rt_fail(r, "rank %d runs with %.*s %s, rank 0 with %s: every rank must be started with the "
                   "same settings", k, (int)name_len, line, theirs, mine);
        return true;
    }
    return false;
}

void ranks_check_config(FsdRun *r)
{
    if (r->world == 1)
        return;
    Text own = {0};
    describe(r, &own);
    if (own.full) {
        rt_fail(r, "rank %d: out of memory describing its settings", r->rank);
        free(own.s);
        own = (Text){0};
    }
    char *all = NULL;
    int64_t alln = 0;
    if (!bk_gather_bytes(r, own.s ? own.s : "", (int64_t)own.n, &all, &alln)) {
        rt_fail(r, "out of memory comparing the ranks' settings");
    } else if (r->rank == 0 && own.s && all) {
        /* every rank's text starts with its line "rank\tK" */
        const char *p = all, *end = all + alln;
        while (p < end) {
            const char *next = end;
            for (const char *q = p + 1; q < end; q++)
                if (q[-1] == '\n' && strncmp(q, "rank\t", 5) == 0) {
                    next = q;
                    break;
                }
            int k = (int)strtol(p + 5, NULL, 10);
            if (k != 0 && differs(r, &own, k, p, next))
                break;
            p = next;
        }
    }
    free(all);
    free(own.s);
}
