/*
 * data.c — the trainer's token files and the order it reads them in.
 *
 * The format is llm.c's token shard: a header of 256 little-endian int32
 * (header[0] = 20240520, the magic; header[1] = the version; header[2] =
 * the number of tokens), then the tokens. Version 1 is llm.c's own, uint16
 * tokens; version 2 is fsdpc's extension for vocabularies over 65,535:
 * the same header, uint32 tokens. `fsdata` (tools/fsdata.c) writes both.
 *
 * The data order (docs/design.md#data-order), which makes a run's data independent
 * of its world size:
 *
 *   sequence j     tokens [j·T, j·T + T]: T + 1 tokens, the first T the
 *                  inputs and the last T the targets (sequences overlap by
 *                  one token: the last target of j is the first input of
 *                  j + 1);
 *   position       the data is read in sequence order, each step taking
 *                  the next G = B × grad_accum × world: step s consumes
 *                  sequences p_s … p_s + G − 1, where p_s (r->seq) is the
 *                  number consumed before it. A run of one G has
 *                  p_s = s·G; a checkpoint records p of its step (meta.json's
 *                  next_seq), and a run resumed from it at step k takes
 *                  p_k from there and then adds its own G a step, so a
 *                  different G neither skips nor repeats a sequence;
 *   micro-batch m  of step s, on rank r, is the B sequences
 *                  p_s + (m·world + r)·B + b, for b = 0 … B − 1;
 *   wrap-around    every sequence index is taken modulo the number of whole
 *                  sequences in the file, ⌊(tokens − 1) / T⌋.
 *
 * So the step's G sequences are the same for every world size with the
 * same G, and the logged loss (the mean over all of them) is too.
 * Evaluation reads the validation file's sequences 0 … K − 1 the same way,
 * B at a time (data_load_val; eval.c decides which B).
 *
 * Files are mapped, not read: ranks on one node share the pages, and a
 * large file costs no memory up front. Every token is checked against the
 * vocabulary at start-up, each rank scanning its own 1/world of the file,
 * so a bad token stops the run before the first step, not in step 40,000.
 *
 * A mapped file must not change while the run reads it: a truncated one
 * makes a read of the lost pages raise SIGBUS, which would kill the job
 * with no word of why, and one rewritten in place feeds the run other
 * tokens than those checked. So only regular files are taken (a FIFO
 * would block every rank in open, a device cannot be mapped), the file is
 * checked (fstat: size and modification time) before every micro-batch is
 * loaded, and a SIGBUS inside a mapping — a change between two checks, or
 * during the start-up scan — ends the process with a message naming the
 * file (docs/runtime.md, "Files").
 */
#define _XOPEN_SOURCE 700   /* SA_SIGINFO, st_mtim */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * 4)
#define MAGIC 20240520

static int32_t le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/* Token i of a mapped file (little-endian, as llm.c writes them). */
static inline uint32_t token(const TokenFile *f, int64_t i)
{
    const unsigned char *p = f->tokens + i * (f->version == 1 ? 2 : 4);
    if (f->version == 1)
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ── SIGBUS in a mapping ── */

/* The mapped files, each with the message its SIGBUS prints, made when it
 * is mapped: the handler may only write(2) and _exit. */
enum { NMAPPED = 2, BUS_MSG_BYTES = 4608 };
static struct {
    const unsigned char *volatile begin, *volatile end;
    char msg[BUS_MSG_BYTES];
    size_t msg_bytes;
} mapped[NMAPPED];
static struct sigaction bus_before;   /* the handler this one replaced */
static bool bus_installed;

static void on_bus(int sig, siginfo_t *si, void *ctx)
{
    const unsigned char *at = si->si_addr;
    for (int k = 0; k < NMAPPED; k++)
        if (mapped[k].begin && at >= mapped[k].begin && at < mapped[k].end) {
            ssize_t n = write(STDERR_FILENO, mapped[k].msg, mapped[k].msg_bytes);
            (void)n;
            _exit(1);
        }
    /* not a token file's: the previous handler (MPI's, or the default)
     * takes the fault when the instruction runs again; one sent by kill
     * does not run again, so it is raised anew */
    sigaction(SIGBUS, &bus_before, NULL);
    if (si->si_code <= 0)
        raise(sig);
}

/* Enters f's mapping in the table (and installs the handler, once). */
static void watch_bus(FsdRun *r, TokenFile *f)
{
    f->bus_slot = -1;
    for (int k = 0; k < NMAPPED && f->bus_slot < 0; k++)
        if (!mapped[k].begin)
            f->bus_slot = k;
    if (f->bus_slot < 0)
        return;   /* data and val are all there are */
    int n = snprintf(mapped[f->bus_slot].msg, BUS_MSG_BYTES,
                     "train: rank %d: data file %s changed under the run: part of its mapping is "
                     "gone (SIGBUS reading it; truncated?). A token file must stay as it is until "
                     "the run ends: write a new one under another name\n",
                     r->rank, f->path);
    mapped[f->bus_slot].msg_bytes = n < 0 ? 0 : n >= BUS_MSG_BYTES ? BUS_MSG_BYTES - 1 : (size_t)n;
    mapped[f->bus_slot].end = (const unsigned char *)f->map + f->map_bytes;
    mapped[f->bus_slot].begin = f->map;
    if (!bus_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_bus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &bus_before) == 0)
            bus_installed = true;
        else
            rt_fail(r, "cannot install the SIGBUS handler for data file %s: %s", f->path,
                    strerror(errno));
    }
}

static int64_t mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

void data_open(FsdRun *r, TokenFile *f, const char *path)
{
    const int64_t T = r->m->seq, V = r->m->vocab;
    memset(f, 0, sizeof *f);
    f->path = path;
    f->fd = -1;
    f->bus_slot = -1;
    /* O_NONBLOCK: a FIFO opens at once (to be refused below) instead of
     * waiting for a writer; it changes nothing for a regular file */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        rt_fail(r, "cannot open data file %s: %s", path, strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rt_fail(r, "cannot stat data file %s: %s", path, strerror(errno));
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        rt_fail(r, "data file %s is not a regular file (%s); token files are mapped: copy the "
                   "tokens into a file (fsdata) and name it",
                path, S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                                                      : "a device or socket");
        close(fd);
        return;
    }
    int64_t size = st.st_size;
    if (size < HEADER_BYTES) {
        rt_fail(r, "data file %s: %lld bytes, too short for the %d-byte header of a token file",
                path, (long long)size, HEADER_BYTES);
        close(fd);
        return;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rt_fail(r, "cannot map data file %s: %s", path, strerror(errno));
        close(fd);
        return;
    }
    f->fd = fd;
    f->size = size;
    f->mtime_ns = mtime_ns(&st);
    f->map = map;
    f->map_bytes = (size_t)size;
    watch_bus(r, f);
    const unsigned char *h = map;
    int32_t magic = le32(h), version = le32(h + 4), ntok = le32(h + 8);
    if (magic != MAGIC) {
        rt_fail(r, "data file %s: wrong magic number %d (a token file starts with %d, as llm.c's)",
                path, magic, MAGIC);
        return;
    }
    if (version != 1 && version != 2) {
        rt_fail(r, "data file %s: unknown version %d (1: uint16 tokens, 2: uint32 tokens)", path,
                version);
        return;
    }
    if (ntok < 0) {
        rt_fail(r, "data file %s: the header's token count %d is negative", path, ntok);
        return;
    }
    int64_t width = version == 1 ? 2 : 4, held = (size - HEADER_BYTES) / width;
    if (held < ntok) {
        rt_fail(r, "data file %s is truncated: its header says %d tokens, but it holds %lld",
                path, ntok, (long long)held);
        return;
    }
    if (size != HEADER_BYTES + ntok * width) {
        rt_fail(r, "data file %s: %lld bytes after the header's %d tokens (a damaged or "
                   "concatenated file?)",
                path, (long long)(size - HEADER_BYTES - ntok * width), ntok);
        return;
    }
    if (ntok < T + 1) {
        rt_fail(r, "data file %s: %d tokens is too short for one sequence of %lld (it needs %lld "
                   "tokens: inputs and shifted targets)",
                path, ntok, (long long)T, (long long)(T + 1));
        return;
    }
    f->version = version;
    f->ntok = ntok;
    f->nseq = (ntok - 1) / T;
    f->tokens = h + HEADER_BYTES;

    /* this rank's share of the scan; the lowest rank to find a bad token
     * also has the first one, and the agreement reports the lowest rank's */
    int64_t lo = f->ntok * r->rank / r->world, hi = f->ntok * (r->rank + 1) / r->world;
    for (int64_t i = lo; i < hi; i++) {
        uint32_t t = token(f, i);
        if (t >= (uint64_t)V) {
            rt_fail(r, "data file %s: token %u at position %lld is not below the model's vocabulary "
                       "size %lld",
                    path, t, (long long)i, (long long)V);
            return;
        }
    }
}

void data_close(TokenFile *f)
{
    if (f->map) {   /* else never mapped: fd and bus_slot mean nothing */
        if (f->bus_slot >= 0)
            mapped[f->bus_slot].begin = NULL;
        munmap(f->map, f->map_bytes);
        close(f->fd);
    }
    memset(f, 0, sizeof *f);
}

/* The file as mapped, or the job ends: in the middle of a step the ranks
 * cannot agree on an error (the others wait in the step's collectives), so
 * this rank says why and aborts the job, as an internal error does. One
 * fstat per micro-batch; FSD_TEST_DATA_NO_RECHECK (tests only) skips it,
 * so a test reaches the SIGBUS handler. */
static void check_unchanged(FsdRun *r, const TokenFile *f)
{
    static int skip = -1;
    if (skip < 0)
        skip = getenv("FSD_TEST_DATA_NO_RECHECK") != NULL;
    struct stat st;
    if (skip)
        return;
    if (fstat(f->fd, &st) != 0) {
        fprintf(stderr, "train: rank %d: cannot stat data file %s: %s\n", r->rank, f->path,
                strerror(errno));
        bk_abort(r);
    }
    if (st.st_size != f->size || mtime_ns(&st) != f->mtime_ns) {
        char what[96];
        if (st.st_size != f->size)
            snprintf(what, sizeof what, "size %lld -> %lld bytes", (long long)f->size,
                     (long long)st.st_size);
        else
            snprintf(what, sizeof what, "same size, %lld bytes, but modified", (long long)f->size);
        fprintf(stderr, "train: rank %d: data file %s changed under the run (%s) %s step %lld; "
                        "a token file must stay as it is until the run ends: write a new one "
                        "under another name\n",
                r->rank, f->path, what, r->evaluating ? "in the evaluation after" : "before",
                (long long)r->step);
        bk_abort(r);
    }
}

/* B sequences of f from sequence `first` on, wrapped around the file, into
 * r->idx and r->targets. */
static void load_sequences(FsdRun *r, const TokenFile *f, int64_t first)
{
    check_unchanged(r, f);
    const int64_t B = r->cfg.micro_batch, T = r->m->seq;
    for (int64_t b = 0; b < B; b++) {
        int64_t at = (first + b) % f->nseq * T;
        int32_t *x = r->idx + b * T, *y = r->targets + b * T;
        for (int64_t t = 0; t < T; t++) {
            x[t] = (int32_t)token(f, at + t);
            y[t] = (int32_t)token(f, at + t + 1);
        }
    }
}

void data_load(FsdRun *r, int micro)
{
    const int64_t B = r->cfg.micro_batch, W = r->world;
    load_sequences(r, &r->data, r->seq + ((int64_t)micro * W + r->rank) * B);
}

void data_load_val(FsdRun *r, int64_t first) { load_sequences(r, &r->val, first); }
