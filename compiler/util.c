/*
 * util.c — the compile's arena, source files and diagnostics.
 *
 * Every pass allocates from one arena that is released at exit (or between
 * fuzz inputs). Diagnostics print in the style of gcc and clang:
 *
 *   model.fsd:7:5: error: `attn` is already defined at model.fsd:5:5
 *       7 |     attn = Linear(dim, dim)
 *         |     ^~~~
 *
 * Locations are byte ranges; line and column are found only when printing.
 */
#include "fsdpc.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

_Noreturn void fsd_panic(const char *file, int line, const char *what)
{
    fprintf(stderr, "%s:%d: internal compiler error: %s\n", file, line, what);
    abort();
}

/* ── arena ── */

typedef struct Chunk {
    struct Chunk *next;
    size_t used, cap;
    max_align_t data[];
} Chunk;

static Chunk *chunks;

void *arena_alloc(size_t bytes)
{
    size_t align = sizeof(max_align_t);
    bytes = (bytes + align - 1) / align * align;
    if (!chunks || chunks->cap - chunks->used < bytes) {
        size_t cap = bytes > (1u << 20) ? bytes : (1u << 20);
        Chunk *c = malloc(sizeof(Chunk) + cap);
        if (!c) {
            fprintf(stderr, "fsdpc: out of memory (%zu bytes)\n", bytes);
            exit(1);
        }
        c->next = chunks;
        c->used = 0;
        c->cap = cap;
        chunks = c;
    }
    void *p = (char *)chunks->data + chunks->used;
    chunks->used += bytes;
    memset(p, 0, bytes);
    return p;
}

void arena_reset(void)
{
    while (chunks) {
        Chunk *next = chunks->next;
        free(chunks);
        chunks = next;
    }
}

char *arena_strndup(const char *s, size_t n)
{
    char *p = arena_alloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *arena_strdup(const char *s) { return arena_strndup(s, strlen(s)); }

char *arena_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = arena_alloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

/* ── sources ── */

Source *source_from_memory(const char *name, const char *data, size_t len)
{
    Source *s = arena_alloc(sizeof *s);
    s->name = arena_strdup(name);
    s->text = arena_strndup(data, len);
    s->len = len;
    /* Line starts, so that finding a message's line is a binary search and
     * not a scan from the top: a file can draw a message per line. */
    uint32_t n = 1;
    for (const char *p = s->text; (p = memchr(p, '\n', len - (size_t)(p - s->text))); p++)
        n++;
    s->line_starts = arena_alloc(sizeof(uint32_t) * n);
    s->nlines = 1;
    for (size_t i = 0; i < len; i++)
        if (s->text[i] == '\n')
            s->line_starts[s->nlines++] = (uint32_t)(i + 1);
    return s;
}

Source *source_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    Source *s = source_from_memory(path, buf, len);
    free(buf);
    return s;
}

/* ── diagnostics ── */

void diag_init(Diag *d, Source *src, FILE *out)
{
    memset(d, 0, sizeof *d);
    d->src = src;
    d->out = out;
    d->max_errors = 20;
}

void loc_line_col(const Source *src, uint32_t off, int *line, int *col)
{
    if (off > src->len)
        off = (uint32_t)src->len;
    /* the last line that starts at or before off */
    uint32_t lo = 0, hi = src->nlines;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (src->line_starts[mid] <= off)
            lo = mid;
        else
            hi = mid;
    }
    *line = (int)lo + 1;
    *col = (int)(off - src->line_starts[lo]) + 1;
}

const char *diag_where(Diag *d, Loc loc)
{
    int line, col;
    loc_line_col(d->src, loc.begin, &line, &col);
    return arena_printf("%s:%d:%d", d->src->name, line, col);
}

/* The quoted source line, with the caret under loc. Long lines are shown as
 * a window around the column so a 10 MB line does not flood the terminal;
 * bytes that are not printable ASCII are shown as '?'. */
static void print_excerpt(Diag *d, Loc loc)
{
    const Source *src = d->src;
    uint32_t off = loc.begin > src->len ? (uint32_t)src->len : loc.begin;
    int line, col;
    loc_line_col(src, off, &line, &col);
    size_t bol = off - (uint32_t)(col - 1);
    size_t eol = (uint32_t)line < src->nlines ? src->line_starts[line] - 1 : src->len;

    enum { WINDOW = 120 };
    size_t from = bol, to = eol;
    bool cut_left = false, cut_right = false;
    if (to - from > WINDOW) {
        if (off - from > WINDOW / 2) {
            from = off - WINDOW / 2;
            cut_left = true;
        }
        if (to - from > WINDOW) {
            to = from + WINDOW;
            cut_right = true;
        }
    }
    uint32_t end = loc.end > loc.begin ? loc.end : loc.begin + 1;
    if (end > to)
        end = (uint32_t)(to > off ? to : off + 1);

    /* Both lines are built in a buffer and written at once: stderr is
     * unbuffered, and a file can draw a warning per line. Each part is at
     * most WINDOW bytes, so the buffer cannot overflow. */
    char buf[4 * WINDOW + 64];
    int gutter = snprintf(NULL, 0, "%d", line);   /* wider past line 99,999 */
    if (gutter < 5)
        gutter = 5;
    size_t k = (size_t)snprintf(buf, 32, "%*d | %s", gutter, line, cut_left ? "..." : "");
    for (size_t i = from; i < to; i++) {
        unsigned char c = (unsigned char)src->text[i];
        buf[k++] = c == '\t' || (c >= 32 && c < 127) ? (char)c : '?';
    }
    k += (size_t)snprintf(buf + k, 32, "%s\n%*s | %s", cut_right ? "..." : "", gutter, "",
                          cut_left ? "   " : "");
    for (size_t i = from; i < off; i++)
        buf[k++] = src->text[i] == '\t' ? '\t' : ' ';
    buf[k++] = '^';
    for (uint32_t i = off + 1; i < end; i++)
        buf[k++] = '~';
    buf[k++] = '\n';
    fwrite(buf, 1, k, d->out);
}

static void report(Diag *d, const char *kind, Loc loc, const char *fmt, va_list ap)
{
    if (!d->out)
        return;
    int line, col;
    loc_line_col(d->src, loc.begin, &line, &col);
    fprintf(d->out, "%s:%d:%d: %s: ", d->src->name, line, col, kind);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    print_excerpt(d, loc);
}

void diag_error(Diag *d, Loc loc, const char *fmt, ...)
{
    if (d->fatal)
        return;
    va_list ap;
    va_start(ap, fmt);
    report(d, "error", loc, fmt, ap);
    va_end(ap);
    if (++d->errors >= d->max_errors) {
        d->fatal = true;
        if (d->out)
            fprintf(d->out, "%s: too many errors (%d); stopping\n", d->src->name, d->errors);
    }
}

void diag_warning(Diag *d, Loc loc, const char *fmt, ...)
{
    if (d->fatal)
        return;
    va_list ap;
    va_start(ap, fmt);
    report(d, "warning", loc, fmt, ap);
    va_end(ap);
    d->warnings++;
}

/* ── message helpers ── */

static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return 99;
    int row[41];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int prev = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cur = row[j];
            int sub = prev + (a[i - 1] != b[j - 1]);
            int del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    return row[lb];
}

/* "; did you mean `x`?" for the closest of names (NULL-terminated), or "". */
const char *diag_suggest(const char *name, const char *const *names)
{
    const char *best = NULL;
    int best_d = 3;
    for (; *names; names++) {
        int d = edit_distance(name, *names);
        if (d < best_d && d <= (int)strlen(name) / 2) {
            best_d = d;
            best = *names;
        }
    }
    return best ? arena_printf("; did you mean `%s`?", best) : "";
}

const char *fmt_size(int64_t bytes)
{
    if (bytes >= (int64_t)1 << 30)
        return arena_printf("%.2f GiB", (double)bytes / (1 << 30));
    if (bytes >= 1 << 20)
        return arena_printf("%.2f MiB", (double)bytes / (1 << 20));
    if (bytes >= 1 << 10)
        return arena_printf("%.2f KiB", (double)bytes / (1 << 10));
    return arena_printf("%" PRId64 " B", bytes);
}

const char *fmt_count(int64_t v)
{
    char digits[32], out[48];
    int n = snprintf(digits, sizeof digits, "%" PRId64, v < 0 ? -v : v), k = 0;
    if (v < 0)
        out[k++] = '-';
    for (int i = 0; i < n; i++) {
        out[k++] = digits[i];
        if ((n - i - 1) % 3 == 0 && i != n - 1)
            out[k++] = ',';
    }
    out[k] = 0;
    return arena_strdup(out);
}

