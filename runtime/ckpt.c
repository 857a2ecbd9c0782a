/*
 * ckpt.c — sharded checkpoints (docs/design.md#checkpoints; docs/checkpoint.md is
 * the format's reference and tests/ckpt/read_ckpt.py reads it in Python):
 * saving every --ckpt-every steps, on the main thread or a background one,
 * the protocol that makes a checkpoint appear whole or not at all, and
 * --resume on any world size.
 *
 * A checkpoint is a directory DIR/step_NNNNNN: one rank_RRRRR.bin per rank
 * (a 64-byte header, then for each shard group its parameter shard and
 * optimizer state) and meta.json, which rank 0 writes last: the model and
 * its hash, the step, the world, each group's flat range per rank, each
 * file's size and CRC32C. Saving after step k − 1 (the checkpoint holds
 * step k, docs/design.md#step-numbering):
 *
 *   1. rank 0 makes DIR/.tmp-step_k; the ranks agree that it exists;
 *   2. every rank writes its own file there and fsyncs it — sync: straight
 *      from its shards; async: from a snapshot of them in host memory, on a
 *      pthread that makes no MPI call (MPI is initialised
 *      MPI_THREAD_FUNNELED: only the main thread may call it);
 *   3. completion, on the main thread and collective: every rank's result,
 *      size and checksum go to rank 0, which writes meta.json, fsyncs it
 *      and the directory, renames the directory to DIR/step_k and fsyncs
 *      DIR, then points DIR/latest at it (temporary file, fsync, rename,
 *      fsync) and only then removes checkpoints past `keep`.
 *
 * A crash before the rename leaves a .tmp- directory nothing reads (every
 * save sweeps such leftovers first) and `latest` on the previous
 * checkpoint; after it, a complete checkpoint. A checkpoint of the same
 * step is replaced by an atomic swap where Linux allows, else by two
 * renames whose interrupted state start-up repairs (recover). A save that
 * fails (a full disk) is a warning: its files are removed and training goes
 * on, until --ckpt-max-failures in a row stop the run. meta.json ends with
 * the CRC32C of the rest of it (meta_crc32c).
 *
 * The run that saves holds DIR/.lock (flock) for its life, and every
 * checkpoint carries its run's lineage, random at a fresh start and kept
 * by --resume: a second run in the directory, or a fresh run into
 * another's checkpoints, is refused at start-up. An async save completes at
 * the first step boundary where every rank's writer has finished (one
 * all-reduce of a flag per step while a save is in flight), or when the
 * next save or the end of the run waits for it: at most one is in flight.
 *
 * Resume reads meta.json on every rank and checks everything before it
 * loads anything: format version, model hash, groups, optimizer state,
 * every rank file's size, and every file's checksum (file q verified by
 * rank q mod W'). Then each rank reads, per group, only the byte ranges of
 * the old rank files that overlap its new slice, so a checkpoint written by
 * W ranks loads on any W', whatever the padding of either.
 *
 * Shards are backend memory (device memory on CUDA) and reached only
 * through bk_to_host / bk_from_host: a sync save streams each section
 * through a bounded host buffer, an async one copies them all into its
 * snapshot, and a load converts into a host buffer and copies in.
 */
#define _GNU_SOURCE   /* renameat2 (RENAME_EXCHANGE), open_memstream */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CKPT_VERSION 1
#define HEADER_BYTES 64
#define PATH_BYTES 4096
#define MAX_FAILURES 3   /* --ckpt-max-failures' default */
static const char MAGIC[8] = {'F', 'S', 'D', 'P', 'C', 'K', 'P', 'T'};

/* ── CRC32C (Castagnoli, reflected polynomial 0x82F63B78), slicing by 8 ── */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* CRC32C of n more bytes after a running value crc (0 to start):
 * crc32c("123456789") = 0xE3069283. */
static uint32_t crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);   /* little-endian, as x86 and the byte order CRC32C reads */
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][w >> 8 & 0xff] ^ crc_table[5][w >> 16 & 0xff] ^
              crc_table[4][w >> 24 & 0xff] ^ crc_table[3][w >> 32 & 0xff] ^
              crc_table[2][w >> 40 & 0xff] ^ crc_table[1][w >> 48 & 0xff] ^ crc_table[0][w >> 56];
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

/* ── little-endian fields ── */

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> 8 * i);
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> 8 * i);
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* ── what a rank file holds ── */

/* Sections per group: the parameter shard, then the optimizer's state. */
static int nsections(const FsdRun *r)
{
    return 1 + (r->cfg.optimizer == FSD_ADAMW ? 2 : r->cfg.momentum != 0 ? 1 : 0);
}

static const char *section_name(const FsdRun *r, int s)
{
    if (s == 0)
        return "params";
    if (r->cfg.optimizer == FSD_ADAMW)
        return s == 1 ? "adamw.m" : "adamw.v";
    return "sgd.momentum";
}

static real *section(Group *G, int s) { return s == 0 ? G->master : s == 1 ? G->m : G->v; }

static const char *root_dir(const FsdRun *r)
{
    return r->cfg.ckpt_dir && r->cfg.ckpt_dir[0] ? r->cfg.ckpt_dir : "ckpt";
}

/* ── the writer: one rank file, on the main thread or its own ── */

typedef struct Job {
    char path[PATH_BYTES];
    unsigned char header[HEADER_BYTES];
    const void **data;       /* the sections in file order */
    int64_t *bytes;
    int n;
    /* non-NULL: data are backend memory, staged through `stage` with
     * bk_to_host (on the main thread only); NULL: host memory */
    FsdRun *backend;
    unsigned char *stage;
    int64_t stage_bytes;
    int sleep_ms;            /* FSD_CKPT_TEST_SLEEP_MS: tests only */
    bool test_fail;          /* FSD_CKPT_TEST_FAIL_STEPS: fail after the header, as a full disk */
    /* results, read once the writer is joined (or done, on this thread) */
    bool ok;
    const char *failed;      /* the call that failed */
    int errnum;
    uint32_t crc;
    int64_t total;
    atomic_int done;
} Job;

struct Ckpt {
    bool pending;            /* a save started and not yet completed */
    bool threaded;           /* a writer thread to join */
    pthread_t thread;
    int64_t step;            /* the step the save in flight holds */
    int64_t seq;             /* and its data position: the next sequence (meta.json's next_seq) */
    char tmp[PATH_BYTES / 2], dir[PATH_BYTES / 2];   /* room for a file name after them */
    Job job;
    const void **data;
    int64_t *bytes;
    unsigned char *snap;     /* the async snapshot: host memory, not counted */
    int64_t snap_bytes;
    unsigned char *stage;    /* a sync save's bounded host buffer */
    int64_t saved;           /* the step of the last checkpoint this run completed, -1: none */
    int failures;            /* saves that failed in a row */
    bool end_noted;          /* ckpt_finish reported a failed last save */
    /* rank 0 of a run that saves */
    bool locked;
    int lock_fd;             /* DIR/.lock, flock'ed for the run's life */
    char lineage[24];        /* this run's lineage id: 16 hex digits */
};

static const JVal *member(const JVal *o, const char *key, JType type);

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static bool write_span(Job *j, int fd, const void *p, int64_t n)
{
    const unsigned char *b = p;
    j->crc = crc32c(j->crc, b, (size_t)n);
    while (n > 0) {
        ssize_t k = write(fd, b, (size_t)(n < (1 << 30) ? n : 1 << 30));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            j->failed = "write";
            j->errnum = k < 0 ? errno : ENOSPC;
            return false;
        }
        b += k;
        n -= k;
        j->total += k;
    }
    return true;
}

/* Writes, checksums and fsyncs one rank file. No MPI, and no FsdRun unless
 * it stages backend memory on the main thread: it may run on its own
 * thread while training goes on. */
static void *write_job(void *arg)
{
    Job *j = arg;
    j->ok = false;
    j->crc = 0;
    j->total = 0;
    int fd = open(j->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        j->failed = "open";
        j->errnum = errno;
    } else {
        bool ok = write_span(j, fd, j->header, HEADER_BYTES);
        if (ok && j->test_fail) {
            j->failed = "write";
            j->errnum = ENOSPC;
            ok = false;
        }
        for (int i = 0; ok && i < j->n; i++) {
            if (j->sleep_ms > 0)   /* a window for the crash test to kill us in */
                pause_ms(j->sleep_ms);
            if (!j->backend)
                ok = write_span(j, fd, j->data[i], j->bytes[i]);
            for (int64_t at = 0; j->backend && ok && at < j->bytes[i]; at += j->stage_bytes) {
                int64_t n = j->bytes[i] - at < j->stage_bytes ? j->bytes[i] - at : j->stage_bytes;
                bk_to_host(j->backend, j->stage, (const unsigned char *)j->data[i] + at, n);
                ok = write_span(j, fd, j->stage, n);
            }
        }
        if (ok && fsync(fd) != 0) {
            j->failed = "fsync";
            j->errnum = errno;
            ok = false;
        }
        if (close(fd) != 0 && ok) {
            j->failed = "close";
            j->errnum = errno;
            ok = false;
        }
        j->ok = ok;
    }
    atomic_store(&j->done, 1);
    return NULL;
}

/* ── files and directories (rank 0) ── */

static bool fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return false;
    int e = fsync(fd);
    /* some file systems cannot fsync a directory; the rename is then as
     * durable as they make it */
    bool ok = e == 0 || errno == EINVAL || errno == ENOTSUP;
    close(fd);
    return ok;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static bool mkdir_p(const char *path)
{
    char buf[PATH_BYTES];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return false;
    }
    for (char *s = buf + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return false;
            *s = '/';
        }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return false;
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

/* Says why the checkpoint directory `root` could not be made: most often
 * a file (or device) of that name, which is never written over. */
static void root_failed(FsdRun *r, const char *root, int err)
{
    struct stat st;
    if (stat(root, &st) == 0 && !S_ISDIR(st.st_mode))
        rt_fail(r, "--ckpt-dir %s is not a directory (a %s); checkpoints are directories inside "
                   "it: name a directory, or move the file away",
                root, S_ISREG(st.st_mode) ? "file" : S_ISFIFO(st.st_mode) ? "FIFO" : "device or socket");
    else
        rt_fail(r, "cannot create checkpoint directory %s: %s", root, strerror(err));
}

/* Removes a checkpoint directory: plain files only, so a wrong path can
 * never take more than one directory of files with it. */
static bool remove_dir(const char *path)
{
    char f[PATH_BYTES];
    /* meta.json first: a directory half removed never looks complete (and
     * recover() never restores one) */
    snprintf(f, sizeof f, "%s/meta.json", path);
    if (unlink(f) != 0 && errno != ENOENT && errno != ENOTDIR)
        return false;
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT;
    struct dirent *e;
    bool ok = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(f, sizeof f, "%s/%s", path, e->d_name);
            ok &= unlink(f) == 0;
        }
    closedir(d);
    return ok && rmdir(path) == 0;
}

/* "step_000123" → 123; -1 for any other name */
static int64_t step_of(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || !name[5])
        return -1;
    int64_t v = 0;
    for (const char *s = name + 5; *s; s++) {
        if (*s < '0' || *s > '9' || v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

/* Leftovers of saves that failed or were interrupted, and of removals
 * (.tmp-*, .trash-*, .latest.tmp): every save removes them first, so one
 * that failed for want of space does not take the space of the next. The
 * directory's lock makes them this run's or a dead run's. Not removing one
 * is a warning: the save that needs the room finds out. */
static void sweep(const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return;
    struct dirent *e;
    char p[PATH_BYTES];
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, ".tmp-", 5) != 0 && strncmp(n, ".trash-", 7) != 0 && strcmp(n, ".latest.tmp") != 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", root, n);
        struct stat st;
        bool ok = lstat(p, &st) == 0 && (S_ISDIR(st.st_mode) ? remove_dir(p) : unlink(p) == 0);
        if (!ok && errno != ENOENT)
            fprintf(stderr, "train: warning: cannot remove the stale checkpoint leftover %s: %s\n", p,
                    strerror(errno));
    }
    closedir(d);
}

static int by_step_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* keep = N: the checkpoint just completed and the newest N − 1 complete
 * ones before it stay; older complete ones go (renamed out of the way
 * first, so a crash mid-removal never leaves a step_ directory that looks
 * whole). Steps after `step` (another run's) are left alone. */
static void prune(FsdRun *r, const char *root, int64_t step)
{
    int64_t keep = r->cfg.ckpt_keep;
    if (keep <= 0)
        return;
    DIR *d = opendir(root);
    if (!d)
        return;
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    char p[PATH_BYTES], q[PATH_BYTES];
    while ((e = readdir(d))) {
        int64_t s = step_of(e->d_name);
        snprintf(p, sizeof p, "%s/%s/meta.json", root, e->d_name);
        if (s < 0 || s >= step || !exists(p))
            continue;
        if (n == cap) {
            int64_t *ns = realloc(steps, sizeof *ns * (size_t)(cap = cap ? 2 * cap : 16));
            if (!ns)
                break;
            steps = ns;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (n > 1)
        qsort(steps, (size_t)n, sizeof *steps, by_step_desc);
    for (int i = (int)(keep - 1 < n ? keep - 1 : n); i < n; i++) {
        snprintf(p, sizeof p, "%s/step_%06lld", root, (long long)steps[i]);
        snprintf(q, sizeof q, "%s/.trash-step_%06lld", root, (long long)steps[i]);
        /* a warning: the checkpoint just saved is complete */
        if (rename(p, q) != 0 || !remove_dir(q))
            fprintf(stderr, "train: warning: cannot remove old checkpoint %s (keep = %lld): %s\n", p,
                    (long long)keep, strerror(errno));
    }
    free(steps);
}

/* DIR/latest ← name, atomically: a temporary file, fsynced, renamed. */
static void write_latest(FsdRun *r, const char *root, const char *name)
{
    char tmp[PATH_BYTES], dst[PATH_BYTES];
    snprintf(tmp, sizeof tmp, "%s/.latest.tmp", root);
    snprintf(dst, sizeof dst, "%s/latest", root);
    FILE *f = fopen(tmp, "w");
    bool ok = f && fprintf(f, "%s\n", name) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok || rename(tmp, dst) != 0 || !fsync_dir(root))
        rt_fail(r, "cannot update %s: %s", dst, strerror(errno));
}

/* s as a JSON string, quoted */
static void json_text(FILE *f, const char *s)
{
    fputc('"', f);
    json_put_chars(f, s);
    fputc('"', f);
}

/* Byte offset of group g's first section in every rank file. */
static int64_t group_offset(const FsdRun *r, int g, int64_t elem)
{
    int64_t at = HEADER_BYTES;
    for (int i = 0; i < g; i++)
        at += nsections(r) * r->groups[i].shard * elem;
    return at;
}

static bool write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = ENOSPC;
            return false;
        }
        p += k;
        n -= (size_t)k;
    }
    return true;
}

/* meta.json ends with this line, 30 bytes: the CRC32C of every byte before
 * it, so an edited field (an offset, a shape) is refused on load. */
#define META_TAIL "  \"meta_crc32c\": \"%08x\"\n}\n"
#define META_TAIL_BYTES 30

/* meta.json: everything a reader needs besides the rank files (records:
 * each rank's size and CRC32C, 16 bytes a rank), composed in memory and
 * sealed with its checksum. */
static bool write_meta(FsdRun *r, const char *path, const unsigned char *records)
{
    const FsdModel *m = r->m;
    const int64_t elem = (int64_t)sizeof(real);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return false;
    fprintf(f, "{\n  \"format\": \"fsdpc-checkpoint\",\n  \"version\": %d,\n  \"model\": ", CKPT_VERSION);
    json_text(f, m->name);
    fprintf(f, ",\n  \"source\": ");
    json_text(f, m->source ? m->source : "");
    fprintf(f, ",\n  \"model_hash\": \"%016llx\",\n", (unsigned long long)m->hash);
    fprintf(f, "  \"lineage\": \"%s\",\n", r->ckpt->lineage);
    /* under HSDP replica 0's shard group writes: the checkpoint is that of
     * a world of S ranks, which loads on any world like every other */
    fprintf(f, "  \"step\": %lld,\n  \"world\": %d,\n", (long long)r->ckpt->step, r->shard_world);
    fprintf(f, "  \"dtype\": \"%s\",\n  \"header_bytes\": %d,\n  \"sections\": [",
            elem == 8 ? "F64" : "F32", HEADER_BYTES);
    for (int s = 0; s < nsections(r); s++)
        fprintf(f, "%s\"%s\"", s ? ", " : "", section_name(r, s));
    fprintf(f, "],\n  \"optimizer\": {\"name\": \"%s\", \"t\": %lld},\n",
            r->cfg.optimizer == FSD_ADAMW ? "adamw" : "sgd", (long long)r->ckpt->step);
    /* next_seq is where the data goes on; sequences_per_step is only this
     * run's G (a resumed run may take another) */
    fprintf(f, "  \"data\": {\"next_step\": %lld, \"next_seq\": %lld, \"sequences_per_step\": %lld, "
               "\"micro_batch\": %lld, \"grad_accum\": %lld, \"seq\": %lld, \"shuffle\": %s},\n",
            (long long)r->ckpt->step, (long long)r->ckpt->seq,
            (long long)(r->cfg.micro_batch * r->cfg.grad_accum * r->world),
            (long long)r->cfg.micro_batch, (long long)r->cfg.grad_accum, (long long)m->seq,
            r->shuffle ? "true" : "false");
    fprintf(f, "  \"rng\": {\"seed\": %lld},\n", (long long)r->cfg.seed);
    fprintf(f, "  \"groups\": [\n");
    for (int g = 0; g < m->ngroups; g++) {
        const Group *G = &r->groups[g];
        fprintf(f, "    {\"name\": ");
        json_text(f, m->groups[g].name);
        fprintf(f, ", \"flat\": %lld, \"padded\": %lld, \"shard\": %lld, \"offset\": %lld, \"ranges\": [",
                (long long)G->flat, (long long)G->padded, (long long)G->shard,
                (long long)group_offset(r, g, elem));
        for (int q = 0; q < r->shard_world; q++)
            fprintf(f, "%s[%lld, %lld]", q ? ", " : "", (long long)(q * G->shard),
                    (long long)((q + 1) * G->shard));
        fprintf(f, "]}%s\n", g + 1 < m->ngroups ? "," : "");
    }
    fprintf(f, "  ],\n  \"tensors\": [\n");
    for (int p = 0; p < m->nparams; p++) {
        const FsdParamInfo *P = &m->params[p];
        fprintf(f, "    {\"name\": ");
        json_text(f, P->name);
        fprintf(f, ", \"group\": %d, \"offset\": %lld, \"shape\": [%lld", P->group,
                (long long)P->offset, (long long)P->shape[0]);
        if (P->rank == 2)
            fprintf(f, ", %lld", (long long)P->shape[1]);
        fprintf(f, "], \"dtype\": \"%s\"}%s\n", elem == 8 ? "F64" : "F32",
                p + 1 < m->nparams ? "," : "");
    }
    fprintf(f, "  ],\n  \"files\": [\n");
    for (int q = 0; q < r->shard_world; q++)
        fprintf(f, "    {\"rank\": %d, \"name\": \"rank_%05d.bin\", \"bytes\": %lld, \"crc32c\": \"%08x\"}%s\n",
                q, q, (long long)get_u64(records + 16 * q), get_u32(records + 16 * q + 8),
                q + 1 < r->shard_world ? "," : "");
    fprintf(f, "  ],\n");
    bool ok = !ferror(f);
    if ((fclose(f) != 0) | !ok) {
        free(text);
        return false;
    }
    char tail[META_TAIL_BYTES + 1];
    snprintf(tail, sizeof tail, META_TAIL, crc32c(0, text, len));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ok = fd >= 0 && write_all(fd, text, len) && write_all(fd, tail, META_TAIL_BYTES) && fsync(fd) == 0;
    if (fd >= 0 && close(fd) != 0)
        ok = false;
    free(text);
    return ok;
}

/* ── the run's directory: its lock, its lineage, recovery (rank 0) ── */

/* A run that saves holds DIR/.lock (flock) for its life: two runs saving
 * into one directory would mix their checkpoints and sweep each other's
 * saves. The file says who holds it; the kernel drops the lock when the
 * holder exits, however it exits. */
static bool lock_dir(FsdRun *r, Ckpt *c, const char *root)
{
    char p[PATH_BYTES];
    snprintf(p, sizeof p, "%s/.lock", root);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        rt_fail(r, "cannot open the lock file %s of checkpoint directory %s: %s", p, root,
                strerror(errno));
        return false;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char who[256];
        ssize_t k = pread(fd, who, sizeof who - 1, 0);
        who[k > 0 ? k : 0] = 0;
        who[strcspn(who, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK)
            rt_fail(r, "checkpoint directory %s is in use by another run (%s, holding %s): two "
                       "runs saving into one directory would mix their checkpoints; wait for it "
                       "to end, or pass another --ckpt-dir",
                    root, who[0] ? who : "pid and host unknown", p);
        else
            rt_fail(r, "cannot lock checkpoint directory %s (flock on %s): %s", root, p, strerror(e));
        return false;
    }
    char host[256] = "", who[320];
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "?");
    int n = snprintf(who, sizeof who, "pid %ld on %s\n", (long)getpid(), host);
    /* who holds it is for the message above only: a lock file that cannot
     * be written (a full disk) still locks */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, who, (size_t)n, 0) != n)
        errno = 0;
    c->lock_fd = fd;
    c->locked = true;
    return true;
}

/* 64 random bits as 16 hex digits: a fresh run's lineage id. */
static void new_lineage(char out[24])
{
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v)
        v = ((uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)getpid() << 32) ^
            (uint64_t)(rt_now() * 1e9);
    if (fd >= 0)
        close(fd);
    snprintf(out, 24, "%016llx", (unsigned long long)v);
}

/* A whole small file, NUL-terminated (malloc'ed); NULL if it cannot be read. */
static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *text = size >= 0 && size < (1L << 30) && fseek(f, 0, SEEK_SET) == 0
                     ? malloc((size_t)size + 1) : NULL;
    if (text && (*n = fread(text, 1, (size_t)size, f)) == (size_t)size)
        text[*n] = 0;
    else {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

/* A run saves only into a directory whose checkpoints are of its lineage:
 * its own and those of the runs it resumed from. A fresh run has a new
 * lineage, so it is refused a directory holding any checkpoint, unless
 * --ckpt-overwrite says to save over them. */
static void check_lineage(FsdRun *r, const char *root, const char *mine, bool fresh)
{
    if (r->ckpt_overwrite)
        return;
    DIR *d = opendir(root);
    if (!d)
        return;
    struct dirent *e;
    char p[PATH_BYTES];
    while ((e = readdir(d))) {
        if (step_of(e->d_name) < 0)
            continue;
        snprintf(p, sizeof p, "%s/%s/meta.json", root, e->d_name);
        size_t n;
        char *text = slurp(p, &n);
        if (!text)
            continue;   /* not a complete checkpoint: nothing reads it */
        JVal v = {0};
        size_t at;
        const char *why;
        const JVal *l = json_parse(text, n, &v, &at, &why) ? member(&v, "lineage", J_STR) : NULL;
        char theirs[32];
        snprintf(theirs, sizeof theirs, "%s", l ? l->str : "none");
        json_free(&v);
        free(text);
        if (strcmp(theirs, mine) != 0) {
            rt_fail(r, "checkpoint directory %s holds checkpoints of another run (%s has lineage "
                       "%s; this %s run's is %s): saving there would mix the two runs' "
                       "checkpoints. Resume that run (--resume), pass another --ckpt-dir, or pass "
                       "--ckpt-overwrite to save over them",
                    root, e->d_name, theirs, fresh ? "fresh" : "resumed", mine);
            break;
        }
    }
    closedir(d);
}

/* `latest` names step_k, which is missing: a crash between the two renames
 * that replace a checkpoint where RENAME_EXCHANGE is not available. The
 * copy it named, in .trash-step_k (or else the complete new one in
 * .tmp-step_k), goes back in its place before anything sweeps it. */
static void recover(FsdRun *r, const char *root)
{
    char p[PATH_BYTES + 300], name[256] = "", dir[PATH_BYTES], from[PATH_BYTES];
    snprintf(p, sizeof p, "%s/latest", root);
    FILE *f = fopen(p, "r");
    if (!f)
        return;
    bool ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
    if (!ok || step_of(name) < 0)
        return;
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    if (exists(dir))
        return;
    static const char *const prefix[] = {".trash-", ".tmp-"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s%s", root, prefix[i], name);
        snprintf(p, sizeof p, "%s/meta.json", from);
        if (!exists(p))
            continue;
        if (rename(from, dir) != 0 || !fsync_dir(root))
            rt_fail(r, "cannot restore checkpoint %s from %s: %s", dir, from, strerror(errno));
        else
            fprintf(stderr, "train: note: %s/latest named %s, which was missing (a crash while it "
                            "was replaced); restored it from %s\n",
                    root, name, from);
        return;
    }
}

/* ── saving ── */

/* An agreement point of a save; true when it failed on some rank. A
 * failure (a full disk, say) is a warning on every rank: rank 0 removes
 * what the save wrote, training goes on, and the next save starts afresh;
 * --ckpt-max-failures saves failing in a row stop the run after this step,
 * with exit status 1. */
static bool save_failed(FsdRun *r)
{
    if (!bk_agree(r))
        return false;
    Ckpt *c = r->ckpt;
    const int64_t max = r->ckpt_max_failures > 0 ? r->ckpt_max_failures : MAX_FAILURES;
    int failures = c ? ++c->failures : (int)max;
    fprintf(stderr, "train: warning: checkpoint save failed: %s; training goes on (%d of %lld failures in a row before the run stops: --ckpt-max-failures)\n",
            r->err, failures, (long long)max);
    r->err[0] = 0;
    if (c) {
        c->pending = false;
        if (r->rank == 0 && c->tmp[0] && !remove_dir(c->tmp) && errno != ENOENT)
            fprintf(stderr, "train: warning: cannot remove %s: %s\n", c->tmp, strerror(errno));
    }
    if (failures >= max) {
        fprintf(stderr, "train: %d checkpoint saves in a row failed: stopping the run after step %lld; %s/latest names the last complete checkpoint\n",
                failures, (long long)r->step, root_dir(r));
        r->saves_failed = true;
        r->status = 1;
    }
    return true;
}

/* Moves the complete c->tmp to c->dir, which exists: a checkpoint of the
 * same step from an earlier run (of this lineage: one resumed before it).
 * Linux's RENAME_EXCHANGE swaps the two at once, so step_k never goes
 * missing and the old copy ends up in c->tmp; where the file system cannot
 * (EINVAL), the old one is renamed to .trash- first, and a crash between
 * the two renames leaves `latest` naming a missing step_k, which the next
 * run's start-up restores from .trash- (recover). */
static bool replace(FsdRun *r, Ckpt *c, const char *root, const char *trash)
{
    const char *old = c->tmp;
    /* FSD_CKPT_TEST_NO_EXCHANGE (tests only) takes the other way */
    int swapped = getenv("FSD_CKPT_TEST_NO_EXCHANGE")
                      ? (errno = EINVAL, -1)
                      : renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->dir, RENAME_EXCHANGE);
    if (swapped != 0) {
        if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
            rt_fail(r, "cannot replace %s with %s: %s", c->dir, c->tmp, strerror(errno));
            return false;
        }
        if (rename(c->dir, trash) != 0 || rename(c->tmp, c->dir) != 0) {
            rt_fail(r, "cannot replace %s with %s: %s", c->dir, c->tmp, strerror(errno));
            return false;
        }
        old = trash;
    }
    if (!fsync_dir(root)) {
        rt_fail(r, "cannot rename %s to %s: %s", c->tmp, c->dir, strerror(errno));
        return false;
    }
    if (!remove_dir(old))   /* the next save's sweep tries again */
        fprintf(stderr, "train: warning: cannot remove the replaced checkpoint (now %s): %s\n", old,
                strerror(errno));
    return true;
}

/* Rank 0: meta.json, the rename, `latest`, then keep. */
static void publish(FsdRun *r, Ckpt *c, const unsigned char *records)
{
    const char *root = root_dir(r);
    char meta[PATH_BYTES], trash[PATH_BYTES], name[64];
    snprintf(meta, sizeof meta, "%s/meta.json", c->tmp);
    snprintf(name, sizeof name, "step_%06lld", (long long)c->step);
    snprintf(trash, sizeof trash, "%s/.trash-%s", root, name);
    if (!c->lineage[0])   /* ckpt_check gives one to every run that saves */
        new_lineage(c->lineage);
    if (!write_meta(r, meta, records) || !fsync_dir(c->tmp)) {
        rt_fail(r, "cannot write checkpoint metadata %s: %s", meta, strerror(errno));
        return;
    }
    if (exists(c->dir)) {
        if (!replace(r, c, root, trash))
            return;
    } else if (rename(c->tmp, c->dir) != 0 || !fsync_dir(root)) {
        rt_fail(r, "cannot rename %s to %s: %s", c->tmp, c->dir, strerror(errno));
        return;
    }
    write_latest(r, root, name);
    if (!r->err[0])
        prune(r, root, c->step);
    if (!r->quiet) {
        int64_t bytes = 0;
        for (int q = 0; q < r->shard_world; q++)
            bytes += (int64_t)get_u64(records + 16 * q);
        printf("checkpoint %s: step %lld, %d ranks, %.2f MiB\n", c->dir, (long long)c->step,
               r->shard_world, (double)bytes / (1 << 20));
        fflush(stdout);
    }
}

/* Collective: joins this rank's writer, agrees every rank wrote its file,
 * and has rank 0 publish the checkpoint. */
static void complete(FsdRun *r)
{
    Ckpt *c = r->ckpt;
    if (c->threaded) {
        pthread_join(c->thread, NULL);
        c->threaded = false;
    }
    c->pending = false;
    Job *j = &c->job;
    if (!j->ok)
        rt_fail(r, "cannot write checkpoint file %s (%s): %s", j->path, j->failed,
                strerror(j->errnum));
    if (save_failed(r))
        return;
    unsigned char rec[16];
    put_u64(rec, (uint64_t)j->total);
    put_u32(rec + 8, j->crc);
    put_u32(rec + 12, 0);
    char *all = NULL;
    int64_t alln = 0;
    if (!bk_gather_bytes(r, (const char *)rec, sizeof rec, &all, &alln))
        rt_fail(r, "out of memory completing checkpoint %s", c->dir);
    else if (r->rank == 0)
        publish(r, c, (const unsigned char *)all);
    free(all);
    if (!save_failed(r)) {
        c->failures = 0;
        c->saved = c->step;
    }
}

/* Collective: a save in flight completes once every rank's writer is done. */
static void poll_save(FsdRun *r)
{
    double done = atomic_load(&r->ckpt->job.done);
    bk_allreduce_sum(r, &done, 1);
    if (done == r->world)
        complete(r);
}

static Ckpt *state(FsdRun *r)
{
    if (!r->ckpt) {
        int n = r->m->ngroups * nsections(r) + 1;
        Ckpt *c = calloc(1, sizeof *c);
        if (c && (!(c->data = calloc((size_t)n, sizeof *c->data)) ||
                  !(c->bytes = calloc((size_t)n, sizeof *c->bytes)))) {
            free(c->data);
            free(c);
            c = NULL;
        }
        if (c)
            c->saved = -1;
        r->ckpt = c;
    }
    return r->ckpt;
}

/* FSD_CKPT_TEST_FAIL_STEPS=K1,K2,... (tests only): the last rank's file of
 * the checkpoint of step K1, K2, ... fails after its header with ENOSPC,
 * as on a full disk. */
static bool test_fails(int64_t step)
{
    const char *s = getenv("FSD_CKPT_TEST_FAIL_STEPS");
    while (s && *s) {
        char *end;
        long long k = strtoll(s, &end, 10);
        if (end == s)
            break;
        if (k == step)
            return true;
        s = *end == ',' ? end + 1 : end;
    }
    return false;
}

/* Collective: starts the save of the state after step − 1's update, whose
 * next sequence in the data order is seq. */
static void save(FsdRun *r, int64_t step, int64_t seq)
{
    enum { STAGE = 16 << 20 };
    const FsdModel *m = r->m;
    const char *root = root_dir(r);
    const int ns = nsections(r);
    int64_t total = 0;
    for (int g = 0; g < m->ngroups; g++)
        total += ns * r->groups[g].shard * (int64_t)sizeof(real);
    Ckpt *c = state(r);
    if (c) {
        /* async: a snapshot of every section; sync (and async short of
         * memory): a bounded buffer the sections stream through */
        if (r->cfg.ckpt_async && c->snap_bytes < total) {
            free(c->snap);
            c->snap = malloc((size_t)total);
            c->snap_bytes = c->snap ? total : 0;
        }
        if (!c->stage)
            c->stage = malloc(STAGE);
    }
    if (!c || !c->stage)
        rt_fail(r, "out of memory starting checkpoint %lld", (long long)step);
    else if (strlen(root) + 32 > sizeof c->tmp)
        rt_fail(r, "checkpoint directory name %.64s… is too long", root);
    else {
        snprintf(c->tmp, sizeof c->tmp, "%s/.tmp-step_%06lld", root, (long long)step);
        snprintf(c->dir, sizeof c->dir, "%s/step_%06lld", root, (long long)step);
        if (r->rank == 0) {
            if (!mkdir_p(root))
                root_failed(r, root, errno);
            else {
                sweep(root);
                if (!remove_dir(c->tmp) || mkdir(c->tmp, 0755) != 0)
                    rt_fail(r, "cannot create %s: %s", c->tmp, strerror(errno));
            }
        }
    }
    if (save_failed(r))
        return;

    const bool async = r->cfg.ckpt_async && c->snap;
    int64_t at = 0;
    for (int g = 0; g < m->ngroups; g++)
        for (int s = 0; s < ns; s++) {
            int k = g * ns + s;
            c->bytes[k] = r->groups[g].shard * (int64_t)sizeof(real);
            c->data[k] = section(&r->groups[g], s);
            if (async) {   /* the shards may change while a thread writes */
                bk_to_host(r, c->snap + at, c->data[k], c->bytes[k]);
                c->data[k] = c->snap + at;
            }
            at += c->bytes[k];
        }

    Job *j = &c->job;
    snprintf(j->path, sizeof j->path, "%s/rank_%05d.bin", c->tmp, r->rank);
    unsigned char *h = j->header;
    memset(h, 0, HEADER_BYTES);
    memcpy(h, MAGIC, 8);
    put_u32(h + 8, CKPT_VERSION);
    put_u32(h + 12, (uint32_t)r->rank);
    put_u32(h + 16, (uint32_t)r->shard_world);
    put_u32(h + 20, (uint32_t)m->ngroups);
    put_u32(h + 24, (uint32_t)ns);
    put_u32(h + 28, (uint32_t)sizeof(real));
    put_u64(h + 32, (uint64_t)step);
    put_u64(h + 40, (uint64_t)step);   /* optimizer steps taken: t of the next is step + 1 */
    put_u64(h + 48, (uint64_t)r->cfg.seed);
    put_u64(h + 56, m->hash);
    j->data = c->data;
    j->bytes = c->bytes;
    j->n = m->ngroups * ns;
    j->backend = async ? NULL : r;
    j->stage = c->stage;
    j->stage_bytes = STAGE;
    const char *sl = getenv("FSD_CKPT_TEST_SLEEP_MS");
    j->sleep_ms = sl ? atoi(sl) : 0;
    j->test_fail = r->rank == r->shard_world - 1 && test_fails(step);
    atomic_store(&j->done, 0);
    c->pending = true;
    c->step = step;
    c->seq = seq;
    /* HSDP: the other replicas hold the same shards and write nothing; they
     * take part in the completion (records after replica 0's are unread) */
    if (r->replica > 0) {
        j->ok = true;
        j->total = 0;
        j->crc = 0;
        atomic_store(&j->done, 1);
        if (!r->cfg.ckpt_async)
            complete(r);
        return;
    }
    if (r->cfg.ckpt_async) {
        /* completed at a later step boundary, on every rank alike; a rank
         * that could not snapshot or start a thread writes its file now */
        if (async && pthread_create(&c->thread, NULL, write_job, j) == 0)
            c->threaded = true;
        else {
            j->backend = async ? NULL : r;
            write_job(j);
        }
    } else {
        write_job(j);
        complete(r);
    }
}

void ckpt_check(FsdRun *r)
{
    if (r->rank != 0)
        return;
    const char *root = root_dir(r);
    struct stat st;
    /* a --ckpt-dir named (or a train section's) that is no directory is
     * refused at start-up with checkpoints off too: a signal's stop saves
     * there, and --resume reads there (the default, ckpt, only when used) */
    if (r->cfg.ckpt_dir && r->cfg.ckpt_dir[0] && stat(root, &st) == 0 && !S_ISDIR(st.st_mode)) {
        root_failed(r, root, ENOTDIR);
        return;
    }
    if (r->cfg.ckpt_every <= 0)
        return;
    Ckpt *c = state(r);
    if (!mkdir_p(root))
        root_failed(r, root, errno);
    else if (!c)
        rt_fail(r, "out of memory");
    else if (lock_dir(r, c, root)) {
        recover(r, root);
        if (!r->resume) {   /* a resumed run takes its checkpoint's (ckpt_resume) */
            new_lineage(c->lineage);
            check_lineage(r, root, c->lineage, true);
        }
    }
}

double ckpt_after_step(FsdRun *r, bool *worked)
{
    const int64_t every = r->cfg.ckpt_every, next = r->step + 1;
    const bool due = every > 0 && (next % every == 0 || next == r->cfg.steps);
    Ckpt *c = r->ckpt;
    *worked = false;
    if (!due && !(c && c->pending))
        return 0;
    double t0 = rt_now();
    if (c && c->pending) {
        if (due)
            complete(r);   /* at most one save in flight: wait for it */
        else
            poll_save(r);
        *worked = !c->pending;
    }
    if (due && !r->saves_failed) {   /* not once failures stop the run */
        /* step r->step is done but not yet counted: its G sequences are */
        save(r, next, r->seq + r->cfg.micro_batch * r->cfg.grad_accum * r->world);
        *worked = true;
    }
    return (rt_now() - t0) * 1e3;
}

void ckpt_finish(FsdRun *r)
{
    Ckpt *c = r->ckpt;
    if (c && c->pending)
        complete(r);
    /* the run goes on past a failed save, but one whose last save failed
     * ends without its state saved */
    if (c && c->failures > 0 && !c->end_noted && !r->saves_failed) {
        c->end_noted = true;
        r->status = 1;
        if (r->rank == 0)
            fprintf(stderr, "train: the last checkpoint save failed: %s/latest names the last "
                            "complete checkpoint; exit status 1\n",
                    root_dir(r));
    }
}

const char *ckpt_save_now(FsdRun *r)
{
    ckpt_finish(r);
    Ckpt *c = r->ckpt;
    if (!c || c->saved != r->step) {
        save(r, r->step, r->seq);
        c = r->ckpt;
        if (c && c->pending)   /* an async save: the run ends only once it is complete */
            complete(r);
    }
    return c && c->saved == r->step ? c->dir : NULL;
}

void ckpt_free(FsdRun *r)
{
    Ckpt *c = r->ckpt;
    if (!c)
        return;
    if (c->threaded)
        pthread_join(c->thread, NULL);
    if (c->locked)
        close(c->lock_fd);   /* the lock goes with it */
    free(c->snap);
    free(c->stage);
    free(c->data);
    free(c->bytes);
    free(c);
    r->ckpt = NULL;
}

/* ── resuming ── */

typedef struct MetaGroup {
    int64_t shard, offset;
} MetaGroup;

typedef struct MetaFile {
    char name[256];
    int64_t bytes;
    uint32_t crc;
} MetaFile;

typedef struct Meta {
    int64_t step, world, seed, G, elem, nsec;
    int64_t next_seq;        /* the data position; -1: not recorded (an older checkpoint) */
    int shuffle;             /* data.shuffle: 1, 0; -1: not recorded (an older checkpoint) */
    char lineage[24];
    MetaGroup *groups;
    MetaFile *files;
} Meta;

/* Resolves --resume to a checkpoint directory. */
static bool locate(FsdRun *r, char dir[PATH_BYTES])
{
    const char *which = r->resume, *root = root_dir(r);
    char p[PATH_BYTES];
    if (strcmp(which, "latest") != 0) {
        /* a checkpoint, or a checkpoint directory holding `latest` */
        snprintf(dir, PATH_BYTES, "%s", which);
        snprintf(p, PATH_BYTES, "%s/meta.json", which);
        if (exists(p))
            return true;
        snprintf(p, PATH_BYTES, "%s/latest", which);
        if (!exists(p))
            return true;   /* read_meta says what is missing */
        root = which;
    }
    snprintf(p, PATH_BYTES, "%s/latest", root);
    FILE *f = fopen(p, "r");
    if (!f) {
        rt_fail(r, "cannot resume: %s does not exist (no complete checkpoint in %s; --resume DIR "
                   "names one)",
                p, root);
        return false;
    }
    char name[256] = "";
    bool ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
    if (!ok || !name[0] || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
        rt_fail(r, "cannot resume: %s holds '%s', not a checkpoint's name", p, name);
        return false;
    }
    snprintf(dir, PATH_BYTES, "%s/%s", root, name);
    return true;
}

static const JVal *member(const JVal *o, const char *key, JType type)
{
    const JVal *v = json_get(o, key);
    return v && v->type == type ? v : NULL;
}

static bool count_of(const JVal *o, const char *key, int64_t *out)
{
    return json_count(json_get(o, key), out);
}

/* meta.json's bytes (slurp): false, the failure recorded, when there is no
 * file to read; else *text holds its *n bytes, or is NULL when they could
 * not all be read, which the parse that follows reports. */
static bool meta_text(FsdRun *r, const char *dir, char **text, size_t *n)
{
    char path[PATH_BYTES + 300];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    *n = 0;
    if ((*text = slurp(path, n)) || access(path, R_OK) == 0)
        return true;
    rt_fail(r, "cannot resume from %s: it has no meta.json (%s), so it is not a complete "
               "checkpoint",
            dir, strerror(errno));
    return false;
}

/* meta.json's last line holds the CRC32C of every byte before it (META_TAIL). */
static bool meta_checksum(FsdRun *r, const char *dir, const char *text, size_t n)
{
    char want[META_TAIL_BYTES + 1];
    const char *t = n > META_TAIL_BYTES ? text + n - META_TAIL_BYTES : NULL;
    if (!t || t[-1] != '\n' || memcmp(t, "  \"meta_crc32c\": \"", 18) != 0 ||
        strspn(t + 18, "0123456789abcdef") < 8 || memcmp(t + 26, "\"\n}\n", 4) != 0) {
        rt_fail(r, "checkpoint %s: %s/meta.json does not end with its checksum field meta_crc32c "
                   "(the CRC32C of the bytes before it): it was edited, or written by an older "
                   "fsdpc",
                dir, dir);
        return false;
    }
    uint32_t crc = crc32c(0, text, n - META_TAIL_BYTES);
    snprintf(want, sizeof want, META_TAIL, crc);
    if (memcmp(want, t, META_TAIL_BYTES) != 0) {
        rt_fail(r, "checkpoint %s: %s/meta.json fails its checksum: field meta_crc32c says %.8s, "
                   "the bytes before it give %08x: the file was changed after it was written",
                dir, dir, t + 18, crc);
        return false;
    }
    return true;
}

/* The checkpoint is one of fsdpc's, of the format version this trainer
 * reads, unchanged since it was written, and written for this program's
 * model. */
static bool meta_identity(FsdRun *r, const char *dir, const JVal *root, const char *text,
                          size_t n)
{
    const FsdModel *m = r->m;
    const JVal *fmt = member(root, "format", J_STR);
    int64_t version;
    if (!fmt || strcmp(fmt->str, "fsdpc-checkpoint") != 0) {
        rt_fail(r, "checkpoint %s: meta.json is not an fsdpc checkpoint's (no \"format\": "
                   "\"fsdpc-checkpoint\")",
                dir);
        return false;
    }
    if (!count_of(root, "version", &version) || version != CKPT_VERSION) {
        const JVal *v = json_get(root, "version");
        rt_fail(r, "checkpoint %s has format version %.17g; this trainer reads version %d",
                dir, v && v->type == J_NUM ? v->num : -1.0, CKPT_VERSION);
        return false;
    }
    if (!meta_checksum(r, dir, text, n))
        return false;
    const JVal *hash = member(root, "model_hash", J_STR), *model = member(root, "model", J_STR);
    unsigned long long h = hash ? strtoull(hash->str, NULL, 16) : 0;
    if (!hash || h != m->hash) {
        rt_fail(r, "checkpoint %s was written for model hash %s (model %s); this program's is "
                   "%016llx (model %s)",
                dir, hash ? hash->str : "?", model ? model->str : "?", (unsigned long long)m->hash,
                m->name);
        return false;
    }
    return true;
}

/* The optimizer state the checkpoint holds (its sections, by name) must be
 * this run's. */
static bool meta_sections(FsdRun *r, const char *dir, const JVal *secs)
{
    bool same = secs->n == nsections(r);
    for (int s = 0; same && s < secs->n; s++)
        same = secs->items[s].type == J_STR && strcmp(secs->items[s].str, section_name(r, s)) == 0;
    if (same)
        return true;
    char have[256] = "", want[256] = "";
    for (int s = 0; s < secs->n; s++)
        if (secs->items[s].type == J_STR)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", s ? ", " : "",
                     secs->items[s].str);
    for (int s = 0; s < nsections(r); s++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", s ? ", " : "",
                 section_name(r, s));
    rt_fail(r, "checkpoint %s holds [%s]; this run's optimizer keeps [%s]: resume with the "
               "optimizer the checkpoint was written with",
            dir, have, want);
    return false;
}

/* M->groups from meta.json's groups: this program's, laid out as version 1
 * lays them out. *file_bytes is then what each rank file must hold. */
static bool meta_groups(FsdRun *r, const char *dir, const JVal *groups, Meta *M,
                        int64_t *file_bytes)
{
    const FsdModel *m = r->m;
    int64_t at = HEADER_BYTES;
    for (int g = 0; g < m->ngroups; g++) {
        const JVal *G = &groups->items[g], *name = member(G, "name", J_STR),
                   *ranges = member(G, "ranges", J_ARR);
        int64_t flat, padded, shard, offset;
        if (!name || !ranges || !count_of(G, "flat", &flat) || !count_of(G, "padded", &padded) ||
            !count_of(G, "shard", &shard) || !count_of(G, "offset", &offset) ||
            strcmp(name->str, m->groups[g].name) != 0 || flat != m->groups[g].flat_numel) {
            rt_fail(r, "checkpoint %s: shard group %d is not this program's %s of %lld parameters",
                    dir, g, m->groups[g].name, (long long)m->groups[g].flat_numel);
            return false;
        }
        bool fits = padded == shard * M->world && padded >= flat && offset == at &&
                    ranges->n == M->world;
        for (int q = 0; fits && q < ranges->n; q++) {
            const JVal *rg = &ranges->items[q];
            int64_t b, e;
            fits = rg->type == J_ARR && rg->n == 2 && json_count(&rg->items[0], &b) &&
                   json_count(&rg->items[1], &e) && b == q * shard && e == b + shard;
        }
        if (!fits) {
            rt_fail(r, "checkpoint %s: group %s's layout (padded %lld, shard %lld, offset %lld, "
                       "ranges) is not format version %d's",
                    dir, name->str, (long long)padded, (long long)shard, (long long)offset,
                    CKPT_VERSION);
            return false;
        }
        M->groups[g] = (MetaGroup){shard, offset};
        at += M->nsec * shard * M->elem;
    }
    *file_bytes = at;
    return true;
}

/* M->files from meta.json's files: one a rank, in rank order, each
 * file_bytes long, with its name and checksum. */
static bool meta_files(FsdRun *r, const char *dir, const JVal *files, Meta *M, int64_t file_bytes)
{
    for (int q = 0; q < M->world; q++) {
        const JVal *F = &files->items[q], *name = member(F, "name", J_STR),
                   *crc = member(F, "crc32c", J_STR);
        int64_t rank;
        if (!name || !crc || !count_of(F, "rank", &rank) || rank != q ||
            !count_of(F, "bytes", &M->files[q].bytes) || M->files[q].bytes != file_bytes ||
            strchr(name->str, '/') || name->len == 0 || name->len >= sizeof M->files[q].name) {
            rt_fail(r, "checkpoint %s: meta.json's entry for rank file %d is malformed", dir, q);
            return false;
        }
        memcpy(M->files[q].name, name->str, name->len + 1);
        M->files[q].crc = (uint32_t)strtoul(crc->str, NULL, 16);
    }
    return true;
}

/* The tensors as a reader cuts them out must be this program's parameters
 * (the model hash covers them: a difference is an edit). */
static bool meta_tensors(FsdRun *r, const char *dir, const JVal *tensors)
{
    const FsdModel *m = r->m;
    if (!tensors || tensors->n != m->nparams) {
        rt_fail(r, "checkpoint %s: %s/meta.json's field tensors lists %d parameters; this "
                   "program has %d",
                dir, dir, tensors ? tensors->n : 0, m->nparams);
        return false;
    }
    for (int p = 0; p < m->nparams; p++) {
        const FsdParamInfo *P = &m->params[p];
        const JVal *T = &tensors->items[p], *name = member(T, "name", J_STR),
                   *shape = member(T, "shape", J_ARR);
        int64_t group, offset, d;
        const char *field = NULL;
        if (!name || strcmp(name->str, P->name) != 0)
            field = "name";
        else if (!count_of(T, "group", &group) || group != P->group)
            field = "group";
        else if (!count_of(T, "offset", &offset) || offset != P->offset)
            field = "offset";
        else if (!shape || shape->n != P->rank)
            field = "shape";
        for (int k = 0; !field && k < P->rank; k++)
            if (!json_count(&shape->items[k], &d) || d != P->shape[k])
                field = "shape";
        if (field) {
            rt_fail(r, "checkpoint %s: %s/meta.json's field tensors[%d].%s does not match this "
                       "program's parameter %s (group %d, offset %lld): the file was edited",
                    dir, dir, p, field, P->name, P->group, (long long)P->offset);
            return false;
        }
    }
    return true;
}

/* Reads and checks meta.json against this program and run: whose
 * checkpoint it is, its top-level fields, the optimizer's sections, the
 * groups' layout and the rank files. */
static bool read_meta(FsdRun *r, const char *dir, Meta *M)
{
    const FsdModel *m = r->m;
    char *text;
    size_t n;
    if (!meta_text(r, dir, &text, &n))
        return false;
    JVal root = {0};
    size_t err_at = 0;
    const char *why = "empty";
    bool ok = false;
    if (!text || n == 0 || !json_parse(text, n, &root, &err_at, &why)) {
        rt_fail(r, "checkpoint %s: meta.json is not valid JSON (byte %zu: %s)", dir, err_at, why);
        goto done;
    }
    if (!meta_identity(r, dir, &root, text, n))
        goto done;
    const JVal *dtype = member(&root, "dtype", J_STR), *secs = member(&root, "sections", J_ARR);
    const JVal *opt = member(&root, "optimizer", J_OBJ), *data = member(&root, "data", J_OBJ);
    const JVal *rng = member(&root, "rng", J_OBJ), *groups = member(&root, "groups", J_ARR);
    const JVal *files = member(&root, "files", J_ARR), *lineage = member(&root, "lineage", J_STR);
    int64_t hb, file_bytes;
    if (!dtype || (strcmp(dtype->str, "F32") != 0 && strcmp(dtype->str, "F64") != 0) || !secs ||
        !opt || !data || !rng || !groups || !files || !count_of(&root, "step", &M->step) ||
        !count_of(&root, "world", &M->world) || M->world < 1 || M->world > (1 << 24) ||
        !count_of(&root, "header_bytes", &hb) || hb != HEADER_BYTES ||
        !count_of(rng, "seed", &M->seed) || !count_of(data, "sequences_per_step", &M->G) ||
        !lineage || lineage->len != 16 || strspn(lineage->str, "0123456789abcdef") != 16) {
        rt_fail(r, "checkpoint %s: meta.json lacks a field of format version %d (or holds a bad "
                   "value): dtype, sections, optimizer, data, rng, groups, files, step, world, "
                   "header_bytes, lineage",
                dir, CKPT_VERSION);
        goto done;
    }
    memcpy(M->lineage, lineage->str, 17);
    /* next_seq came after sequences_per_step: without it, the position is
     * the one the writer's data order gave step `step`, step × its G */
    M->next_seq = -1;
    if (json_get(data, "next_seq") &&
        (!count_of(data, "next_seq", &M->next_seq) || M->next_seq < 0)) {
        rt_fail(r, "checkpoint %s: meta.json's field data.next_seq is not a count of sequences", dir);
        goto done;
    }
    /* shuffle came later still: without it, the order is not known */
    const JVal *shuffle = json_get(data, "shuffle");
    M->shuffle = shuffle && shuffle->type == J_BOOL ? shuffle->num != 0 : -1;
    if (shuffle && shuffle->type != J_BOOL) {
        rt_fail(r, "checkpoint %s: meta.json's field data.shuffle is not true or false", dir);
        goto done;
    }
    M->elem = strcmp(dtype->str, "F64") == 0 ? 8 : 4;
    M->nsec = secs->n;
    if (!meta_sections(r, dir, secs))
        goto done;
    if (groups->n != m->ngroups || files->n != M->world) {
        rt_fail(r, "checkpoint %s: meta.json lists %d shard groups and %d files; this program has "
                   "%d groups and the checkpoint's world is %lld",
                dir, groups->n, files->n, m->ngroups, (long long)M->world);
        goto done;
    }
    M->groups = calloc((size_t)m->ngroups + 1, sizeof *M->groups);
    M->files = calloc((size_t)M->world, sizeof *M->files);
    if (!M->groups || !M->files) {
        rt_fail(r, "out of memory reading %s/meta.json", dir);
        goto done;
    }
    ok = meta_groups(r, dir, groups, M, &file_bytes) && meta_files(r, dir, files, M, file_bytes) &&
         meta_tensors(r, dir, member(&root, "tensors", J_ARR));
done:
    json_free(&root);
    free(text);
    return ok;
}

/* Every file there and whole; this rank's share checksummed. */
static void check_files(FsdRun *r, const char *dir, const Meta *M)
{
    char path[PATH_BYTES + 300];
    for (int q = 0; q < M->world; q++) {
        snprintf(path, sizeof path, "%s/%s", dir, M->files[q].name);
        struct stat st;
        if (stat(path, &st) != 0) {
            rt_fail(r, "checkpoint %s: rank file %s is missing (%s); the checkpoint was written by "
                       "%lld ranks",
                    dir, M->files[q].name, strerror(errno), (long long)M->world);
            return;
        }
        if ((int64_t)st.st_size != M->files[q].bytes) {
            rt_fail(r, "checkpoint %s: rank file %s is %s: %lld bytes, meta.json says %lld", dir,
                    M->files[q].name, (int64_t)st.st_size < M->files[q].bytes ? "truncated" : "too long",
                    (long long)st.st_size, (long long)M->files[q].bytes);
            return;
        }
    }
    enum { BUF = 1 << 20 };
    unsigned char *buf = malloc(BUF);
    if (!buf) {
        rt_fail(r, "out of memory checking checkpoint %s", dir);
        return;
    }
    for (int q = r->rank; q < M->world; q += r->world) {
        snprintf(path, sizeof path, "%s/%s", dir, M->files[q].name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        uint32_t crc = 0;
        unsigned char hdr[HEADER_BYTES];
        int64_t got = 0;
        ssize_t k = 0;
        while (fd >= 0 && (k = read(fd, buf, BUF)) != 0) {
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0)
                break;
            if (got < HEADER_BYTES)
                memcpy(hdr + got, buf, (size_t)(HEADER_BYTES - got < k ? HEADER_BYTES - got : k));
            crc = crc32c(crc, buf, (size_t)k);
            got += k;
        }
        if (fd < 0 || k < 0 || got != M->files[q].bytes) {
            rt_fail(r, "cannot read checkpoint file %s: %s", path,
                    fd < 0 || k < 0 ? strerror(errno) : "it changed while being read");
            if (fd >= 0)
                close(fd);
            break;
        }
        close(fd);
        if (crc != M->files[q].crc) {
            rt_fail(r, "checkpoint %s: rank file %s fails its checksum (CRC32C %08x; meta.json says "
                       "%08x): the file is corrupt",
                    dir, M->files[q].name, crc, M->files[q].crc);
            break;
        }
        /* a file whose checksum holds but whose header disagrees came from
         * another checkpoint */
        if (memcmp(hdr, MAGIC, 8) != 0 || get_u32(hdr + 8) != CKPT_VERSION ||
            get_u32(hdr + 12) != (uint32_t)q || get_u32(hdr + 16) != (uint32_t)M->world ||
            get_u32(hdr + 20) != (uint32_t)r->m->ngroups || get_u32(hdr + 24) != (uint32_t)M->nsec ||
            get_u32(hdr + 28) != (uint32_t)M->elem || get_u64(hdr + 32) != (uint64_t)M->step ||
            get_u64(hdr + 56) != r->m->hash) {
            rt_fail(r, "checkpoint %s: rank file %s's header does not match meta.json (rank %u of "
                       "%u, step %llu): it belongs to another checkpoint",
                    dir, M->files[q].name, get_u32(hdr + 12), get_u32(hdr + 16),
                    (unsigned long long)get_u64(hdr + 32));
            break;
        }
    }
    free(buf);
}

/* This rank's new slices, from whichever old rank files hold them. */
static void load(FsdRun *r, const char *dir, const Meta *M)
{
    const FsdModel *m = r->m;
    int *fds = malloc(sizeof *fds * (size_t)M->world);
    enum { BUF = 1 << 16 };
    unsigned char *buf = malloc(BUF * 8);
    real *host = malloc(BUF * sizeof(real));
    if (!fds || !buf || !host) {
        free(fds);
        free(buf);
        free(host);
        rt_fail(r, "out of memory loading checkpoint %s", dir);
        return;
    }
    for (int q = 0; q < M->world; q++)
        fds[q] = -1;
    char path[PATH_BYTES + 300];
    for (int g = 0; g < m->ngroups && !r->err[0]; g++) {
        Group *G = &r->groups[g];
        const int64_t old = M->groups[g].shard;
        /* padding is zero in both layouts: only [0, flat) moves */
        const int64_t lo = G->lo, hi = G->lo + G->shard < G->flat ? G->lo + G->shard : G->flat;
        for (int s = 0; s < M->nsec && !r->err[0]; s++) {
            real *dst = section(G, s);
            for (int64_t q = lo / old; q < M->world && q * old < hi && !r->err[0]; q++) {
                int64_t x = lo > q * old ? lo : q * old, y = hi < (q + 1) * old ? hi : (q + 1) * old;
                if (x >= y)
                    continue;
                snprintf(path, sizeof path, "%s/%s", dir, M->files[q].name);
                if (fds[q] < 0 && (fds[q] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
                    rt_fail(r, "cannot open checkpoint file %s: %s", path, strerror(errno));
                    break;
                }
                int64_t off = M->groups[g].offset + (s * old + (x - q * old)) * M->elem;
                for (int64_t i = x; i < y;) {
                    int64_t n = y - i < BUF ? y - i : BUF;
                    ssize_t k = pread(fds[q], buf, (size_t)(n * M->elem), (off_t)off);
                    if (k != (ssize_t)(n * M->elem)) {
                        rt_fail(r, "cannot read checkpoint file %s: %s", path,
                                k < 0 ? strerror(errno) : "end of file");
                        break;
                    }
                    /* a checkpoint of the other build (F32 ↔ F64) converts */
                    if (M->elem == (int64_t)sizeof(real))
                        memcpy(host, buf, (size_t)(n * M->elem));
                    else if (M->elem == 4)
                        for (int64_t e = 0; e < n; e++) {
                            float v;
                            memcpy(&v, buf + 4 * e, 4);
                            host[e] = (real)v;
                        }
                    else
                        for (int64_t e = 0; e < n; e++) {
                            double v;
                            memcpy(&v, buf + 8 * e, 8);
                            host[e] = (real)v;
                        }
                    bk_from_host(r, dst + (i - G->lo), host, n * (int64_t)sizeof(real));
                    i += n;
                    off += n * M->elem;
                }
            }
        }
    }
    for (int q = 0; q < M->world; q++)
        if (fds[q] >= 0)
            close(fds[q]);
    free(fds);
    free(buf);
    free(host);
}

bool ckpt_auto(FsdRun *r)
{
    char p[PATH_BYTES];
    snprintf(p, sizeof p, "%s/latest", root_dir(r));
    double found = r->rank == 0 && exists(p);
    bk_allreduce_sum(r, &found, 1);   /* rank 0's answer, for every rank */
    if (!found && r->rank == 0 && !r->quiet) {
        if (r->init_from)
            printf("--resume auto: no checkpoint in %s yet: starting fresh from %s\n", root_dir(r),
                   r->init_from);
        else
            printf("--resume auto: no checkpoint in %s yet: starting fresh (seed %lld)\n",
                   root_dir(r), (long long)r->cfg.seed);
        fflush(stdout);
    }
    return found > 0;
}

void ckpt_resume(FsdRun *r)
{
    char dir[PATH_BYTES] = "";
    Meta M = {0};
    if (r->init_from)
        rt_fail(r, "--resume and --init-from both set the weights: pass one of them (or --resume "
                   "auto: the checkpoint if there is one, else the file)");
    else if (locate(r, dir) && read_meta(r, dir, &M)) {
        /* the run carries on the checkpoint's lineage, into a directory of it */
        if (r->ckpt && r->ckpt->locked) {
            memcpy(r->ckpt->lineage, M.lineage, sizeof M.lineage);
            check_lineage(r, root_dir(r), M.lineage, false);
        }
        if (!r->err[0])
            check_files(r, dir, &M);
    }
    /* nothing is loaded unless every rank found the checkpoint whole */
    if (!bk_agree(r)) {
        load(r, dir, &M);
        r->step = M.step;
        r->cfg.seed = M.seed;   /* the initialisation it came from, for the next checkpoint */
        /* the data goes on at the next sequence not yet trained on, whatever
         * this run's G; a checkpoint from before next_seq was recorded gives
         * the position its writer's order had, step × its G */
        r->seq = M.next_seq >= 0 ? M.next_seq : M.step * M.G;
        const int64_t G = r->cfg.micro_batch * r->cfg.grad_accum * r->world;
        if (r->rank == 0 && !r->err[0]) {
            if (M.next_seq < 0)
                fprintf(stderr, "train: note: checkpoint %s does not record its data position "
                                "(data.next_seq: written by an older fsdpc); going on from "
                                "sequence %lld, step %lld x the %lld sequences a step it was "
                                "written with\n",
                        dir, (long long)r->seq, (long long)M.step, (long long)M.G);
            if (G != M.G)
                fprintf(stderr, "train: note: checkpoint %s was written taking %lld sequences a "
                                "step; this run takes %lld (micro-batch x grad-accum x world), "
                                "going on where the data stopped: step %lld reads sequences "
                                "%lld to %lld\n",
                        dir, (long long)M.G, (long long)G, (long long)M.step, (long long)r->seq,
                        (long long)(r->seq + G - 1));
            /* allowed (a run may change its data), but never silently:
             * the sequences after the position are not those the
             * checkpoint's run would have read */
            if (M.shuffle >= 0 && M.shuffle != r->shuffle)
                fprintf(stderr, "train: note: checkpoint %s was written by a run %s --shuffle; this "
                                "run reads %s, so from sequence %lld on it trains on another "
                                "order than the run that wrote it%s\n",
                        dir, M.shuffle ? "with" : "without",
                        r->shuffle ? "in a shuffled order" : "in file order", (long long)r->seq,
                        M.shuffle ? " (pass --shuffle to go on in its order)" : "");
            if (!r->quiet)
                printf("resumed from %s: step %lld, sequence %lld, written by %lld ranks\n", dir,
                       (long long)M.step, (long long)r->seq, (long long)M.world);
        }
    }
    free(M.groups);
    free(M.files);
}
