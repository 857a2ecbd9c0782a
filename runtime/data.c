/*
 * data.c — the trainer's token files and the order it reads them in.
 *
 * The format is llm.c's token shard: a header of 256 little-endian int32
 * (header[0] = 20240520, the magic; header[1] = the version; header[2] =
 * the number of tokens), then the tokens. Version 1 is llm.c's own, uint16
 * tokens; version 2 is fsdpc's extension for vocabularies over 65,535:
 * the same header, uint32 tokens. `fsdata` (tools/fsdata.c) and
 * tools/tokenize.py write both.
 *
 * --data and --val-data name one file, or a glob pattern
 * (`--data 'dir/train_*.bin'`) whose matches are read in sorted order, as
 * llm.c's loader reads its shards. The files are one sequence of
 * sequences: file k's whole sequences follow file k − 1's (a sequence never
 * spans two files, as in llm.c), so one file is the one-shard case.
 *
 * The data order (docs/design.md#data-order), which makes a run's data independent
 * of its world size:
 *
 *   sequence j     of a file, tokens [j·T, j·T + T]: T + 1 tokens, the first
 *                  T the inputs and the last T the targets (sequences overlap
 *                  by one token: the last target of j is the first input of
 *                  j + 1); the data's sequence j is file k's sequence
 *                  j − first[k], first[k] the whole sequences of the files
 *                  before k;
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
 *   wrap-around    position p reads the data's sequence p mod N, N the
 *                  whole sequences of all the files; p div N is its epoch;
 *   --shuffle      position p reads sequence π_e(p mod N) instead, π_e a
 *                  permutation of 0 … N − 1 drawn from (seed, epoch e): each
 *                  epoch sees every sequence once, in a new order.
 *
 * So the step's G sequences are the same for every world size with the
 * same G, shuffled or not (the permutation is a function of the position,
 * not of the rank), and the logged loss (the mean over all of them) is
 * too; a resumed run goes on in the same order, since the checkpoint keeps
 * the position and the seed. Evaluation reads the validation data's
 * sequences 0 … K − 1 the same way, B at a time, never shuffled
 * (data_load_val; eval.c decides which B).
 *
 * The permutation is a keyed Feistel network on the smallest power of 4
 * at or above N, walked until it lands below N (format-preserving
 * encryption's cycle walking: Black and Rogaway, "Ciphers with Arbitrary
 * Finite Domains", 2002): a bijection computed per sequence in O(1)
 * memory, so a corpus of a billion sequences needs no table.
 *
 * Files are mapped, not read: ranks on one node share the pages, and a
 * large file costs no memory up front. Every token is checked against the
 * vocabulary at start-up, each rank scanning its own 1/world of each file,
 * so a bad token stops the run before the first step, not in step 40,000.
 *
 * A mapped file must not change while the run reads it: a truncated one
 * makes a read of the lost pages raise SIGBUS, which would kill the job
 * with no word of why, and one rewritten in place feeds the run other
 * tokens than those checked. So only regular files are taken (a FIFO
 * would block every rank in open, a device cannot be mapped), the file is
 * checked (fstat: size and modification time) before every micro-batch is
 * loaded from it, and a SIGBUS inside a mapping — a change between two
 * checks, or during the start-up scan — ends the process with a message
 * naming the file (docs/runtime.md, "Files").
 */
#define _XOPEN_SOURCE 700   /* SA_SIGINFO, st_mtim */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
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
 * is mapped: the handler may only walk the list, write(2) and _exit. The
 * list changes only on the main thread, outside any read of a mapping, and
 * a SIGBUS of a mapping is raised by the very read, so the handler never
 * meets it half changed. */
static TokenFile *volatile bus_list;
static struct sigaction bus_before;   /* the handler this one replaced */
static bool bus_installed;

static void on_bus(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    const unsigned char *at = si->si_addr;
    for (TokenFile *f = bus_list; f; f = f->bus_next) {
        const unsigned char *begin = f->map;
        if (begin && at >= begin && at < begin + f->map_bytes) {
            ssize_t n = write(STDERR_FILENO, f->bus_msg, f->bus_msg_bytes);
            (void)n;
            _exit(1);
        }
    }
    /* not a token file's: the previous handler (MPI's, or the default)
     * takes the fault when the instruction runs again; one sent by kill
     * does not run again, so it is raised anew */
    sigaction(SIGBUS, &bus_before, NULL);
    if (si->si_code <= 0)
        raise(sig);
}

/* Enters f's mapping in the list (and installs the handler, once). */
static void watch_bus(FsdRun *r, TokenFile *f)
{
#define BUS_MSG                                                                            \
    "train: rank %d: data file %s changed under the run: part of its mapping is gone (SIGBUS " \
    "reading it; truncated?). A token file must stay as it is until the run ends: write a "   \
    "new one under another name\n"
    int n = snprintf(NULL, 0, BUS_MSG, r->rank, f->path);
    if (n < 0 || !(f->bus_msg = malloc((size_t)n + 1))) {
        rt_fail(r, "out of memory for data file %s's SIGBUS message", f->path);
        return;
    }
    snprintf(f->bus_msg, (size_t)n + 1, BUS_MSG, r->rank, f->path);
#undef BUS_MSG
    f->bus_msg_bytes = (size_t)n;
    f->bus_next = bus_list;
    bus_list = f;
    f->bus_listed = true;
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

static void unwatch_bus(TokenFile *f)
{
    if (!f->bus_listed)
        return;
    for (TokenFile *volatile *p = &bus_list; *p; p = &(*p)->bus_next)
        if (*p == f) {
            *p = f->bus_next;
            break;
        }
    f->bus_listed = false;
    free(f->bus_msg);
    f->bus_msg = NULL;
}

static int64_t mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* Maps and checks one token file. A shard of a pattern (`shard`) may hold
 * less than one sequence: it then adds none (the last shard a tokenizer
 * writes is as long as the corpus makes it); a file named alone may not. */
static void file_open(FsdRun *r, TokenFile *f, const char *path, bool shard)
{
    const int64_t T = r->m->seq, V = r->m->vocab;
    memset(f, 0, sizeof *f);
    f->path = path;
    f->fd = -1;
    /* O_NONBLOCK: a FIFO opens at once (to be refused below) instead of
     * waiting for a writer; it changes nothing for a regular file */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        rt_fail(r, "cannot open data file %s: %s%s", path, strerror(errno),
                errno == EMFILE ? " (every shard stays open while the run reads it: raise the "
                                  "limit, ulimit -n, or write fewer, larger shards)"
                                : "");
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
    if (ntok < T + 1 && !shard) {
        rt_fail(r, "data file %s: %d tokens is too short for one sequence of %lld (it needs %lld "
                   "tokens: inputs and shifted targets)",
                path, ntok, (long long)T, (long long)(T + 1));
        return;
    }
    f->version = version;
    f->ntok = ntok;
    f->nseq = ntok > 0 ? (ntok - 1) / T : 0;
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

static void file_close(TokenFile *f)
{
    unwatch_bus(f);
    if (f->map) {   /* else never mapped: fd means nothing */
        munmap(f->map, f->map_bytes);
        close(f->fd);
    }
    memset(f, 0, sizeof *f);
}

/* ── the data: one file or the shards of a pattern ── */

static bool has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

static int glob_error(const char *path, int err)
{
    (void)path;
    (void)err;
    return 0;   /* an unreadable directory is skipped: what it hides is not there */
}

/* splitmix64's output function (Steele, Lea and Flood, 2014), the
 * runtime's hash of a counter (weights.c has its own for the
 * initialisation's draws). */
static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Epoch e's permutation key under `seed`: a stream of its own (the
 * constant is "shuffle" in ASCII), so the order is not tied to the
 * initialisation's draws, and a new key every epoch. */
static uint64_t shuffle_key(uint64_t seed, int64_t epoch)
{
    return splitmix64(splitmix64(seed ^ 0x73687566666c65ull) ^ (uint64_t)epoch);
}

void data_open(FsdRun *r, TokenData *d, const char *flag, const char *pattern)
{
    memset(d, 0, sizeof *d);
    d->pattern = pattern;
    glob_t g;
    memset(&g, 0, sizeof g);
    const char *const *paths = &pattern;
    size_t npaths = 1;
    /* a name without *, ? or [ is the file itself (its own errors name
     * it); a pattern matching nothing is refused here */
    bool globbed = false;
    if (has_glob_chars(pattern)) {
        int st = glob(pattern, 0, glob_error, &g);
        if (st == GLOB_NOMATCH) {
            rt_fail(r, "%s %s: the pattern matches no file", flag, pattern);
            return;
        }
        if (st != 0) {
            rt_fail(r, "%s %s: cannot expand the pattern (%s)", flag, pattern,
                    st == GLOB_NOSPACE ? "out of memory" : "a read error");
            globfree(&g);
            return;
        }
        globbed = true;
        paths = (const char *const *)g.gl_pathv;
        npaths = g.gl_pathc;
    }
    if (npaths > (size_t)INT32_MAX / 2) {
        rt_fail(r, "%s %s: %zu files is too many", flag, pattern, npaths);
        globfree(&g);
        return;
    }
    /* glob sorts its matches (strcoll, as ls does; byte order in the C
     * locale the trainer runs in), so every rank reads the same order */
    d->files = calloc(npaths, sizeof *d->files);
    d->first = calloc(npaths + 1, sizeof *d->first);
    char **names = calloc(npaths, sizeof *names);
    if (!d->files || !d->first || !names) {
        rt_fail(r, "%s %s: out of memory for %zu files", flag, pattern, npaths);
        free(names);
        if (globbed)
            globfree(&g);
        return;
    }
    for (size_t k = 0; k < npaths && !r->err[0]; k++) {
        /* the paths outlive glob's list: TokenFile keeps its own */
        if (!(names[k] = strdup(paths[k]))) {
            rt_fail(r, "%s %s: out of memory", flag, pattern);
            break;
        }
        file_open(r, &d->files[k], names[k], globbed);
        if (!r->err[0] && d->files[k].nseq == 0 && r->rank == 0)
            fprintf(stderr, "train: note: %s %s: shard %s holds %lld tokens, less than one "
                            "sequence of %lld + 1: it adds nothing\n",
                    flag, pattern, names[k], (long long)d->files[k].ntok, (long long)r->m->seq);
        d->nfiles = (int)k + 1;
        d->first[k + 1] = d->first[k] + d->files[k].nseq;
        d->ntok += d->files[k].ntok;
    }
    free(names);   /* each name is now its file's path, freed by data_close */
    if (globbed)
        globfree(&g);
    d->nseq = d->first[d->nfiles];
    if (!r->err[0] && d->nseq == 0)
        rt_fail(r, "%s %s: its %d files hold no whole sequence of %lld tokens (%lld + 1 for the "
                   "shifted targets): %lld tokens in all",
                flag, pattern, d->nfiles, (long long)r->m->seq + 1, (long long)r->m->seq,
                (long long)d->ntok);
    d->ready = !r->err[0] && d->nfiles == (int)npaths;
}

void data_close(TokenData *d)
{
    for (int k = 0; k < d->nfiles; k++) {
        char *path = (char *)d->files[k].path;
        file_close(&d->files[k]);
        free(path);
    }
    free(d->files);
    free(d->first);
    memset(d, 0, sizeof *d);
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

/* π_e(i): the Feistel permutation of 0 … n − 1 under `key` (the epoch's).
 * Four rounds on two halves of h bits, 4^h the smallest power of 4 at or
 * above n; a result at or above n is permuted again until it is below n
 * (cycle walking: a bijection of 0 … n − 1 because the network is one of
 * 0 … 4^h − 1; 4^h < 4n, so under 4 rounds of walking on average). */
static uint64_t permute(uint64_t i, uint64_t n, uint64_t key)
{
    int h = 1;
    while (h < 32 && ((uint64_t)1 << (2 * h)) < n)
        h++;
    const uint64_t mask = ((uint64_t)1 << h) - 1;
    do {
        uint64_t L = i >> h, R = i & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t F = splitmix64(key ^ (R + (round << 40))) & mask;
            uint64_t next = L ^ F;
            L = R;
            R = next;
        }
        i = L << h | R;
    } while (i >= n);
    return i;
}

/* The data's sequence read at position p (not wrapped): its file and the
 * sequence in it. */
int64_t data_shuffled(int64_t p, int64_t n, uint64_t seed)
{
    return (int64_t)permute((uint64_t)(p % n), (uint64_t)n, shuffle_key(seed, p / n));
}

static const TokenFile *locate(const TokenData *d, int64_t p, bool shuffle, uint64_t seed,
                               int64_t *in_file)
{
    int64_t j = shuffle ? data_shuffled(p, d->nseq, seed) : p % d->nseq;
    /* the last file whose first sequence is at or below j */
    int lo = 0, hi = d->nfiles - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->first[mid] <= j)
            lo = mid;
        else
            hi = mid - 1;
    }
    *in_file = j - d->first[lo];
    return &d->files[lo];
}

/* B sequences of d from position `first` on into r->idx and r->targets. */
static void load_sequences(FsdRun *r, const TokenData *d, int64_t first, bool shuffle)
{
    const int64_t B = r->cfg.micro_batch, T = r->m->seq;
    const TokenFile *checked = NULL;
    for (int64_t b = 0; b < B; b++) {
        int64_t j;
        const TokenFile *f = locate(d, first + b, shuffle, (uint64_t)r->cfg.seed, &j);
        if (f != checked)
            check_unchanged(r, f);
        checked = f;
        int64_t at = j * T;
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
    load_sequences(r, &r->data, r->seq + ((int64_t)micro * W + r->rank) * B, r->shuffle);
}

void data_load_val(FsdRun *r, int64_t first) { load_sequences(r, &r->val, first, false); }
