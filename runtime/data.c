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
 *
 * Files are mapped, not read: ranks on one node share the pages, and a
 * large file costs no memory up front. Every token is checked against the
 * vocabulary at start-up, each rank scanning its own 1/world of the file,
 * so a bad token stops the run before the first step, not in step 40,000.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
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

void data_open(FsdRun *r, TokenFile *f, const char *path)
{
    const int64_t T = r->m->seq, V = r->m->vocab;
    memset(f, 0, sizeof *f);
    f->path = path;
    int fd = open(path, O_RDONLY);
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
        rt_fail(r, "data file %s is not a regular file", path);
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
    int mmap_errno = errno;
    close(fd);   /* the mapping keeps the file */
    if (map == MAP_FAILED) {
        rt_fail(r, "cannot map data file %s: %s", path, strerror(mmap_errno));
        return;
    }
    f->map = map;
    f->map_bytes = (size_t)size;
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
    if (f->map)
        munmap(f->map, f->map_bytes);
    memset(f, 0, sizeof *f);
}

void data_load(FsdRun *r, int micro)
{
    const TokenFile *f = &r->data;
    const int64_t B = r->cfg.micro_batch, T = r->m->seq, W = r->world;
    const int64_t first = r->seq + ((int64_t)micro * W + r->rank) * B;
    for (int64_t b = 0; b < B; b++) {
        int64_t at = (first + b) % f->nseq * T;
        int32_t *x = r->idx + b * T, *y = r->targets + b * T;
        for (int64_t t = 0; t < T; t++) {
            x[t] = (int32_t)token(f, at + t);
            y[t] = (int32_t)token(f, at + t + 1);
        }
    }
}
