/*
 * fsdata.c — makes and inspects the trainer's token files.
 *
 *   fsdata text IN.txt OUT.bin                       bytes as tokens (vocab 256)
 *   fsdata synth OUT.bin --tokens N [--seed S] [--vocab V]
 *   fsdata info FILE
 *
 * The format is llm.c's token shard (runtime/data.c reads it): 256
 * little-endian int32 of header — header[0] = 20240520, header[1] = the
 * version, header[2] = the number of tokens — then the tokens: uint16 in
 * version 1 (llm.c's), uint32 in version 2 (fsdpc's extension for
 * vocabularies over 65,535). fsdata writes version 1 whenever the
 * vocabulary allows, so llm.c reads what it writes.
 *
 * `synth` writes a corpus with structure a small model can learn, so the
 * demo's loss visibly falls; deterministic for a seed. It interleaves two
 * sources:
 *   - a fixed random sparse Markov chain: every token has 4 successors,
 *     drawn from the vocabulary, taken with probabilities 1/2, 1/4, 1/8,
 *     1/8 (1.21 nats per token: what a bigram model can reach);
 *   - 32 fixed random phrases of 8 to 32 tokens: at each step, with
 *     probability 1/16, one of them is copied out whole (after its first
 *     token a model with context predicts the rest exactly).
 * A uniform guess costs ln V nats per token; a good model approaches about
 * 1.2 nats.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC 20240520
#define HEADER_INTS 256

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fsdata: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: fsdata text IN.txt OUT.bin                  each byte one token (vocab 256)\n"
            "       fsdata synth OUT.bin --tokens N [--seed S] [--vocab V]\n"
            "                                                   a learnable synthetic corpus\n"
            "       fsdata info FILE                            header, token count, max token id\n");
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t x = (*state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint32_t below(uint64_t *state, uint32_t n) { return (uint32_t)(splitmix64(state) % n); }

/* Writes a token file: header, then the tokens in `version`'s width. */
typedef struct Writer {
    FILE *f;
    const char *path;
    int version;
    int64_t n;
    bool bad;
} Writer;

static bool put_le(Writer *w, uint32_t v, int bytes)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    if (!w->bad && fwrite(b, 1, (size_t)bytes, w->f) != (size_t)bytes)
        w->bad = true;
    return !w->bad;
}

static int open_writer(Writer *w, const char *path, int version)
{
    memset(w, 0, sizeof *w);
    w->path = path;
    w->version = version;
    if (!(w->f = fopen(path, "wb")))
        return fail("cannot write %s: %s", path, strerror(errno));
    for (int i = 0; i < HEADER_INTS; i++)   /* the count is filled in at the end */
        put_le(w, i == 0 ? MAGIC : i == 1 ? (uint32_t)version : 0, 4);
    return 0;
}

static void put_token(Writer *w, uint32_t t)
{
    put_le(w, t, w->version == 1 ? 2 : 4);
    w->n++;
}

static int close_writer(Writer *w)
{
    if (w->n > INT32_MAX) {
        fclose(w->f);
        remove(w->path);
        return fail("%s: more tokens than a token file's int32 count holds", w->path);
    }
    if (!w->bad && fseek(w->f, 8, SEEK_SET) != 0)
        w->bad = true;
    put_le(w, (uint32_t)w->n, 4);
    int err = errno;
    if ((fclose(w->f) != 0) | w->bad) {
        remove(w->path);
        return fail("cannot write %s: %s", w->path, strerror(err ? err : EIO));
    }
    return 0;
}

static bool parse_count(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s || *s == '-' || *s == '+')
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static int cmd_text(const char *in, const char *out)
{
    FILE *f = fopen(in, "rb");
    if (!f)
        return fail("cannot read %s: %s", in, strerror(errno));
    Writer w;
    if (open_writer(&w, out, 1)) {
        fclose(f);
        return 1;
    }
    int c;
    while ((c = getc(f)) != EOF)
        put_token(&w, (uint32_t)c);
    bool read_error = ferror(f);
    fclose(f);
    if (read_error) {
        fclose(w.f);
        remove(out);
        return fail("cannot read %s: %s", in, strerror(errno));
    }
    int st = close_writer(&w);
    if (!st)
        printf("%s: %lld tokens (bytes of %s), vocab 256\n", out, (long long)w.n, in);
    return st;
}

enum { SUCCESSORS = 4, PHRASES = 32, PHRASE_MIN = 8, PHRASE_MAX = 32 };

static int cmd_synth(const char *out, long long ntok, long long seed, long long vocab)
{
    uint64_t st = (uint64_t)seed * 0x9e3779b97f4a7c15ull ^ 0x5eed5eed5eed5eedull;
    uint32_t V = (uint32_t)vocab;
    uint32_t *next = malloc(sizeof *next * (size_t)V * SUCCESSORS);
    uint32_t phrase[PHRASES][PHRASE_MAX];
    int plen[PHRASES];
    if (!next)
        return fail("out of memory for a vocabulary of %lld", vocab);
    for (size_t i = 0; i < (size_t)V * SUCCESSORS; i++)
        next[i] = below(&st, V);
    for (int p = 0; p < PHRASES; p++) {
        plen[p] = PHRASE_MIN + (int)below(&st, PHRASE_MAX - PHRASE_MIN + 1);
        for (int k = 0; k < plen[p]; k++)
            phrase[p][k] = below(&st, V);
    }
    Writer w;
    if (open_writer(&w, out, V <= 65536 ? 1 : 2)) {
        free(next);
        return 1;
    }
    uint32_t cur = below(&st, V);
    while (w.n < ntok && !w.bad) {
        if (below(&st, 16) == 0) {
            int p = (int)below(&st, PHRASES);
            for (int k = 0; k < plen[p] && w.n < ntok; k++)
                put_token(&w, cur = phrase[p][k]);
            continue;
        }
        /* successor 0 with 1/2, 1 with 1/4, 2 and 3 with 1/8 each */
        uint32_t u = below(&st, 8), k = u < 4 ? 0 : u < 6 ? 1 : u < 7 ? 2 : 3;
        put_token(&w, cur = next[(size_t)cur * SUCCESSORS + k]);
    }
    free(next);
    int rc = close_writer(&w);
    if (!rc)
        printf("%s: %lld synthetic tokens, vocab %lld, seed %lld\n", out, ntok, vocab, seed);
    return rc;
}

static int cmd_info(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail("cannot read %s: %s", path, strerror(errno));
    unsigned char h[HEADER_INTS * 4];
    size_t got = fread(h, 1, sizeof h, f);
    if (got < sizeof h) {
        fclose(f);
        return fail("%s: too short for the 1024-byte header of a token file", path);
    }
#define LE32(p) ((int32_t)((uint32_t)(p)[0] | (uint32_t)(p)[1] << 8 | (uint32_t)(p)[2] << 16 | (uint32_t)(p)[3] << 24))
    int32_t magic = LE32(h), version = LE32(h + 4), ntok = LE32(h + 8);
    if (magic != MAGIC) {
        fclose(f);
        return fail("%s: wrong magic number %d (a token file starts with 20240520)", path, magic);
    }
    if (version != 1 && version != 2) {
        fclose(f);
        return fail("%s: unknown version %d (1: uint16 tokens, 2: uint32 tokens)", path, version);
    }
    int width = version == 1 ? 2 : 4;
    uint32_t max = 0;
    int64_t n = 0;
    unsigned char buf[1 << 16];
    size_t k;
    while (n < ntok && (k = fread(buf, (size_t)width, sizeof buf / (size_t)width, f)) > 0) {
        for (size_t i = 0; i < k && n < ntok; i++, n++) {
            const unsigned char *p = buf + i * (size_t)width;
            uint32_t t = width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : (uint32_t)LE32(p);
            if (t > max)
                max = t;
        }
    }
    bool read_error = ferror(f);
    fclose(f);
    if (read_error)
        return fail("cannot read %s: %s", path, strerror(errno));
    if (n < ntok) {
        return fail("%s is truncated: its header says %d tokens, but it holds %lld", path, ntok,
                    (long long)n);
    }
    printf("%s\n  magic    %d\n  version  %d (%s tokens)\n  tokens   %d\n  max id   %u\n", path,
           magic, version, version == 1 ? "uint16" : "uint32", ntok, max);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "text") == 0) {
        if (argc != 4) {
            usage(stderr);
            return 1;
        }
        return cmd_text(argv[2], argv[3]);
    }
    if (strcmp(cmd, "info") == 0) {
        if (argc != 3) {
            usage(stderr);
            return 1;
        }
        return cmd_info(argv[2]);
    }
    if (strcmp(cmd, "synth") == 0) {
        const char *out = NULL;
        long long ntok = -1, seed = 1, vocab = 256;
        for (int i = 2; i < argc; i++) {
            const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
            if (strcmp(a, "--tokens") == 0) {
                if (!parse_count(v, 1, INT32_MAX, &ntok))
                    return fail("--tokens: '%s' is not a whole number from 1 to 2147483647",
                                v ? v : "");
                i++;
            } else if (strcmp(a, "--seed") == 0) {
                if (!parse_count(v, 0, LLONG_MAX, &seed))
                    return fail("--seed: '%s' is not a whole number of 0 or more", v ? v : "");
                i++;
            } else if (strcmp(a, "--vocab") == 0) {
                if (!parse_count(v, 2, (long long)1 << 31, &vocab))
                    return fail("--vocab: '%s' is not a whole number from 2 to 2147483648",
                                v ? v : "");
                i++;
            } else if (a[0] == '-' && a[1]) {
                return fail("unknown option %s for synth", a);
            } else if (out) {
                return fail("synth writes one file; got %s and %s", out, a);
            } else {
                out = a;
            }
        }
        if (!out)
            return fail("synth needs an output file");
        if (ntok < 0)
            return fail("synth needs --tokens N");
        return cmd_synth(out, ntok, seed, vocab);
    }
    fprintf(stderr, "fsdata: unknown command '%s'\n", cmd);
    usage(stderr);
    return 1;
}
