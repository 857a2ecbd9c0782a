/*
 * safetensors.c — the safetensors format as fsdpc reads and writes it, and
 * the Hugging Face model directory around it (docs/checkpoint.md#safetensors-files-and-model-directories).
 * weights.c moves the parameters; this file knows the bytes.
 *
 * A file: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}), then the data, offsets relative to its start.
 * A directory as `transformers`' save_pretrained writes it holds either
 * model.safetensors, or shards model-00001-of-0000N.safetensors and
 * model.safetensors.index.json, whose weight_map names each tensor's shard.
 *
 * Reading (--init-from): st_open opens the file, or the directory's index
 * and every shard it names, parses each header and checks every entry's
 * data_offsets (inside the file, no two overlapping) before anything is
 * read; st_find checks one tensor (dtype, shape, size) against what the
 * model needs; st_read reads a run of its elements with pread, converting
 * F32, BF16 or F16 to fp32 (each exactly: bf16 and fp16 values are all
 * floats). Nothing is read but the headers and the byte ranges asked for.
 *
 * Writing (--export): st_plan decides which file holds each tensor and
 * where, and composes the headers; the split into shards is
 * huggingface_hub's (split_state_dict_into_shards_factory, which
 * save_pretrained calls): tensors in order, a new shard when the next would
 * take the current one past the size, a tensor larger than the size alone
 * in a shard of its own, shard files named model-%05d-of-%05d.safetensors,
 * and one shard written as model.safetensors without an index. st_encode
 * narrows fp32 to BF16 or F16 rounding to nearest even; st_write_index
 * writes the index as transformers does (json.dumps(indent=2,
 * sort_keys=True)).
 */
#include "internal.h"
#include "half.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
/* safetensors itself refuses headers over 100 MB; an index is of that order */
#define HEADER_MAX 100000000

static const struct {
    const char *name;
    int bytes;
} dtypes[ST_NDTYPES] = {[ST_F32] = {"F32", 4}, [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2}};

const char *st_dtype_name(StDtype t) { return dtypes[t].name; }
int st_dtype_bytes(StDtype t) { return dtypes[t].bytes; }

/* ── reading ── */

/* n bytes at byte `at` of fd, all of them (pread may return fewer). */
static bool read_at(int fd, void *buf, size_t n, int64_t at)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = 0;   /* end of file: the caller says "truncated" */
            return false;
        }
        p += k, n -= (size_t)k, at += k;
    }
    return true;
}

/* Opens `path` for reading by offset: a regular file only (a FIFO opens at
 * once with O_NONBLOCK, to be refused, instead of waiting for a writer).
 * `what` says who named it, for messages. */
static int open_regular(FsdRun *r, const char *path, const char *what, int64_t *size)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        rt_fail(r, "cannot open %s %s: %s", what, path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        rt_fail(r, "%s %s is not a regular file (%s); safetensors are read by offset: name a "
                   "file, or a directory holding %s or %s",
                what, path, S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket", INDEX_NAME,
                SINGLE_NAME);
        close(fd);
        return -1;
    }
    *size = (int64_t)st.st_size;
    return fd;
}

/* Entry i of a header, checked as far as it can be without knowing what the
 * model wants: an object with data_offsets [begin, end], begin ≤ end, inside
 * the data. */
static bool entry_range(FsdRun *r, const StFile *f, int i, int64_t *b, int64_t *e)
{
    const char *name = f->header.keys[i];
    const JVal *t = &f->header.items[i];
    if (t->type != J_OBJ) {
        rt_fail(r, "%s: tensor `%s`'s entry is not a JSON object", f->path, name);
        return false;
    }
    const JVal *offs = json_get(t, "data_offsets");
    if (!offs || offs->type != J_ARR || offs->n != 2 || !json_count(&offs->items[0], b) ||
        !json_count(&offs->items[1], e) || *e < *b) {
        rt_fail(r, "%s: tensor `%s` has no valid `data_offsets` [begin, end] (two whole "
                   "numbers, begin ≤ end)",
                f->path, name);
        return false;
    }
    if (*e > f->data_bytes) {
        rt_fail(r, "%s is truncated, or tensor `%s`'s data_offsets are out of range: [%lld, %lld] "
                   "ends past the data's %lld bytes",
                f->path, name, (long long)*b, (long long)*e, (long long)f->data_bytes);
        return false;
    }
    return true;
}

typedef struct Range {
    int64_t b, e;
    int entry;
} Range;

static int by_begin(const void *a, const void *b)
{
    const Range *x = a, *y = b;
    return (x->b > y->b) - (x->b < y->b);
}

/* Every entry's data inside the file, and no two sharing a byte. */
static bool check_ranges(FsdRun *r, const StFile *f)
{
    Range *rg = malloc(sizeof *rg * (size_t)(f->header.n + 1));
    if (!rg) {
        rt_fail(r, "%s: out of memory checking the header", f->path);
        return false;
    }
    int n = 0;
    bool ok = true;
    for (int i = 0; ok && i < f->header.n; i++) {
        if (strcmp(f->header.keys[i], "__metadata__") == 0)
            continue;
        ok = entry_range(r, f, i, &rg[n].b, &rg[n].e);
        rg[n].entry = i;
        if (rg[n].e > rg[n].b)   /* an empty tensor overlaps nothing */
            n++;
    }
    qsort(rg, (size_t)n, sizeof *rg, by_begin);
    for (int i = 1; ok && i < n; i++)
        if (rg[i].b < rg[i - 1].e) {
            rt_fail(r, "%s: tensors `%s` (data_offsets [%lld, %lld]) and `%s` ([%lld, %lld]) "
                       "overlap: the file is corrupt",
                    f->path, f->header.keys[rg[i - 1].entry], (long long)rg[i - 1].b,
                    (long long)rg[i - 1].e, f->header.keys[rg[i].entry], (long long)rg[i].b,
                    (long long)rg[i].e);
            ok = false;
        }
    free(rg);
    return ok;
}

/* Opens one safetensors file and reads, parses and checks its header. */
static bool open_file(FsdRun *r, StFile *f, const char *what)
{
    int64_t size;
    if ((f->fd = open_regular(r, f->path, what, &size)) < 0)
        return false;
    unsigned char len8[8];
    if (size < 8 || !read_at(f->fd, len8, 8, 0)) {
        rt_fail(r, "%s: %lld bytes, too short for a safetensors file (it starts with an 8-byte "
                   "header length)",
                f->path, (long long)size);
        return false;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    if (hlen > (uint64_t)size - 8 || hlen > HEADER_MAX) {
        rt_fail(r, "%s: bad header length %llu (the file has %lld bytes after the length): not a "
                   "safetensors file, or a truncated one",
                f->path, (unsigned long long)hlen, (long long)(size - 8));
        return false;
    }
    char *hdr = malloc(hlen + 1);
    if (!hdr) {
        rt_fail(r, "%s: out of memory reading a %llu-byte header", f->path,
                (unsigned long long)hlen);
        return false;
    }
    bool ok = read_at(f->fd, hdr, hlen, 8);
    if (!ok)
        rt_fail(r, "cannot read %s's header: %s", f->path, errno ? strerror(errno) : "end of file");
    size_t err_at;
    const char *why;
    if (ok && !(ok = json_parse(hdr, hlen, &f->header, &err_at, &why)))
        rt_fail(r, "%s: the header is not valid JSON: byte %zu of it: %s", f->path, err_at, why);
    free(hdr);
    if (ok && f->header.type != J_OBJ) {
        rt_fail(r, "%s: the header is not a JSON object", f->path);
        ok = false;
    }
    f->data_start = 8 + (int64_t)hlen;
    f->data_bytes = size - f->data_start;
    return ok && check_ranges(r, f);
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", dir, name);
    return s;
}

static StFile *add_file(FsdRun *r, StSource *s, char *path)
{
    StFile *nf = path ? realloc(s->files, sizeof *nf * (size_t)(s->nfiles + 1)) : NULL;
    if (!nf) {
        free(path);
        rt_fail(r, "out of memory opening --init-from's files");
        return NULL;
    }
    s->files = nf;
    StFile *f = &s->files[s->nfiles++];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = path;
    return f;
}

/* A whole small file (the index) into memory. */
static char *slurp_index(FsdRun *r, const char *path, int64_t *n)
{
    int fd = open_regular(r, path, "--init-from index", n);
    if (fd < 0)
        return NULL;
    char *text = *n <= HEADER_MAX ? malloc((size_t)*n + 1) : NULL;
    if (!text)
        rt_fail(r, "%s: %lld bytes, too large for an index (or out of memory)", path,
                (long long)*n);
    else if (!read_at(fd, text, (size_t)*n, 0)) {
        rt_fail(r, "cannot read %s: %s", path, errno ? strerror(errno) : "end of file");
        free(text);
        text = NULL;
    }
    close(fd);
    return text;
}

/* The index's weight_map, and every shard file it names opened. */
static bool open_index(FsdRun *r, const char *dir, StSource *s)
{
    int64_t n;
    char *text = slurp_index(r, s->index_path, &n);
    if (!text)
        return false;
    size_t err_at;
    const char *why;
    bool ok = json_parse(text, (size_t)n, &s->index, &err_at, &why);
    free(text);
    if (!ok) {
        rt_fail(r, "%s is not valid JSON: byte %zu: %s", s->index_path, err_at, why);
        return false;
    }
    s->weight_map = json_get(&s->index, "weight_map");
    if (!s->weight_map || s->weight_map->type != J_OBJ) {
        rt_fail(r, "%s has no `weight_map` object (tensor name → shard file): not a "
                   "transformers index",
                s->index_path);
        return false;
    }
    for (int i = 0; i < s->weight_map->n; i++) {
        const char *tensor = s->weight_map->keys[i];
        const JVal *v = &s->weight_map->items[i];
        if (v->type != J_STR || !v->str[0] || strchr(v->str, '/') || strcmp(v->str, ".") == 0 ||
            strcmp(v->str, "..") == 0) {
            rt_fail(r, "%s: weight_map's entry for `%s` is not a file name in the directory",
                    s->index_path, tensor);
            return false;
        }
        bool seen = false;
        for (int k = 0; k < s->nfiles && !seen; k++)
            seen = strcmp(strrchr(s->files[k].path, '/') + 1, v->str) == 0;
        if (seen)
            continue;
        StFile *f = add_file(r, s, join(dir, v->str));
        if (!f)
            return false;
        if (access(f->path, F_OK) != 0) {
            rt_fail(r, "%s: weight_map names shard file %s (for tensor `%s`), which is missing: %s",
                    s->index_path, v->str, tensor, strerror(errno));
            return false;
        }
        if (!open_file(r, f, "--init-from shard"))
            return false;
    }
    return true;
}

bool st_open(FsdRun *r, const char *path, StSource *s)
{
    memset(s, 0, sizeof *s);
    struct stat st;
    if (stat(path, &st) != 0) {
        rt_fail(r, "cannot open --init-from %s: %s", path, strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        StFile *f = add_file(r, s, strdup(path));
        return f && open_file(r, f, "--init-from file");
    }
    /* a directory: sharded with an index, else one model.safetensors */
    s->index_path = join(path, INDEX_NAME);
    if (!s->index_path) {
        rt_fail(r, "out of memory");
        return false;
    }
    if (access(s->index_path, F_OK) == 0)
        return open_index(r, path, s);
    free(s->index_path);
    s->index_path = NULL;
    StFile *f = add_file(r, s, join(path, SINGLE_NAME));
    if (f && access(f->path, F_OK) != 0) {
        rt_fail(r, "--init-from directory %s holds neither %s (sharded weights) nor %s", path,
                INDEX_NAME, SINGLE_NAME);
        return false;
    }
    return f && open_file(r, f, "--init-from file");
}

void st_close(StSource *s)
{
    for (int i = 0; i < s->nfiles; i++) {
        if (s->files[i].fd >= 0)
            close(s->files[i].fd);
        json_free(&s->files[i].header);
        free(s->files[i].path);
    }
    free(s->files);
    json_free(&s->index);
    free(s->index_path);
    memset(s, 0, sizeof *s);
}

/* The file holding tensor `name`, and its entry there; false when absent. */
static bool locate(const StSource *s, const char *name, const StFile **file, const JVal **entry)
{
    if (!s->index_path) {
        *file = &s->files[0];
        *entry = json_get(&s->files[0].header, name);
        return *entry != NULL;
    }
    const JVal *v = json_get(s->weight_map, name);
    if (!v)
        return false;
    for (int k = 0; k < s->nfiles; k++)
        if (strcmp(strrchr(s->files[k].path, '/') + 1, v->str) == 0) {
            *file = &s->files[k];
            *entry = json_get(&s->files[k].header, name);
            return true;   /* the entry may still be missing: the caller says where */
        }
    return false;
}

static void shape_text(char *buf, size_t n, const int64_t *shape, int rank)
{
    if (rank == 1)
        snprintf(buf, n, "[%lld]", (long long)shape[0]);
    else
        snprintf(buf, n, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
}

bool st_find(FsdRun *r, const StSource *s, const WLayout *L, const WTensor *T, StTensor *out)
{
    const char *name = T->name;
    const StFile *f = NULL;
    const JVal *t = NULL;
    bool found = locate(s, name, &f, &t);
    /* the Hub's own GPT-2 files name the base model's tensors without the
     * `transformer.` prefix GPT2LMHeadModel adds; transformers takes both */
    if (!found && L->names && strcmp(L->names, "gpt2") == 0 &&
        strncmp(name, "transformer.", 12) == 0 && locate(s, name + 12, &f, &t)) {
        found = true;
        name += 12;
    }
    const char *where = s->index_path ? s->index_path : s->files[0].path;
    if (!found) {
        const char *in = s->index_path ? " in weight_map" : "";
        if (L->names)
            rt_fail(r, "%s: no tensor `%s`%s (--hf-names %s: model %s needs it)", where, name, in,
                    L->names, r->m->name);
        else
            rt_fail(r, "%s: no tensor `%s`%s, a parameter of model %s", where, name, in,
                    r->m->name);
        return false;
    }
    if (!t) {
        rt_fail(r, "%s: no tensor `%s`, which %s's weight_map places in this file", f->path, name,
                s->index_path);
        return false;
    }
    const JVal *dtype = json_get(t, "dtype"), *shape = json_get(t, "shape");
    if (!dtype || dtype->type != J_STR) {
        rt_fail(r, "%s: tensor `%s` has no `dtype` string", f->path, name);
        return false;
    }
    int d = 0;
    while (d < ST_NDTYPES && strcmp(dtype->str, dtypes[d].name) != 0)
        d++;
    if (d == ST_NDTYPES) {
        rt_fail(r, "%s: tensor `%s` has dtype %s; the dtypes accepted are F32, BF16 and F16 "
                   "(converted to fp32)",
                f->path, name, dtype->str);
        return false;
    }
    if (!shape || shape->type != J_ARR) {
        rt_fail(r, "%s: tensor `%s` has no `shape` array", f->path, name);
        return false;
    }
    bool same = shape->n == T->rank;
    for (int i = 0; same && i < shape->n; i++) {
        int64_t n;
        same = json_count(&shape->items[i], &n) && n == T->shape[i];
    }
    if (!same) {
        char want[64], got[256];
        size_t k = (size_t)snprintf(got, sizeof got, "[");
        for (int i = 0; i < shape->n && k < sizeof got - 32; i++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%.17g", i ? ", " : "",
                                  shape->items[i].type == J_NUM ? shape->items[i].num : NAN);
        snprintf(got + k, sizeof got - k, "]");
        shape_text(want, sizeof want, T->shape, T->rank);
        rt_fail(r, "%s: tensor `%s` has shape %s; the model's is %s%s%s", f->path, name, got, want,
                L->names ? " under --hf-names " : "", L->names ? L->names : "");
        return false;
    }
    /* data_offsets were checked when the file was opened */
    const JVal *offs = json_get(t, "data_offsets");
    int64_t b = (int64_t)offs->items[0].num, e = (int64_t)offs->items[1].num;
    if (e - b != T->numel * dtypes[d].bytes) {
        rt_fail(r, "%s: tensor `%s`'s data_offsets [%lld, %lld] hold %lld bytes; its shape needs "
                   "%lld in %s",
                f->path, name, (long long)b, (long long)e, (long long)(e - b),
                (long long)(T->numel * dtypes[d].bytes), dtypes[d].name);
        return false;
    }
    *out = (StTensor){f, (StDtype)d, f->data_start + b};
    return true;
}

bool st_read(FsdRun *r, const StTensor *t, const char *name, int64_t first, int64_t n, float *dst)
{
    enum { CHUNK = 4096 };
    unsigned char raw[CHUNK * 4];
    const int elem = dtypes[t->dtype].bytes;
    for (int64_t i = 0; i < n;) {
        const int64_t k = n - i < CHUNK ? n - i : CHUNK;
        if (!read_at(t->file->fd, raw, (size_t)(k * elem), t->begin + (first + i) * elem)) {
            rt_fail(r, "cannot read tensor `%s` from %s: %s", name, t->file->path,
                    errno ? strerror(errno) : "end of file (was it cut short while read?)");
            return false;
        }
        /* little-endian, as the format and the hosts fsdpc runs on */
        for (int64_t j = 0; j < k; j++) {
            uint16_t h;
            switch (t->dtype) {
            case ST_F32: memcpy(&dst[i + j], raw + 4 * j, 4); break;
            case ST_BF16: memcpy(&h, raw + 2 * j, 2); dst[i + j] = float_from_bf16(h); break;
            case ST_F16: memcpy(&h, raw + 2 * j, 2); dst[i + j] = float_from_fp16(h); break;
            case ST_NDTYPES: break;
            }
        }
        i += k;
    }
    return true;
}

/* ── writing ── */

void st_encode(StDtype dt, const real *src, int64_t n, int64_t stride, void *out)
{
    unsigned char *o = out;
    for (int64_t i = 0; i < n; i++) {
        /* the float64 build rounds to float first: the file's widest type */
        const float x = (float)src[i * stride];
        uint16_t h;
        switch (dt) {
        case ST_F32: memcpy(o + 4 * i, &x, 4); break;
        case ST_BF16: h = bf16_from_float(x); memcpy(o + 2 * i, &h, 2); break;
        case ST_F16: h = fp16_from_float(x); memcpy(o + 2 * i, &h, 2); break;
        case ST_NDTYPES: break;
        }
    }
}

bool st_parse_size(const char *s, int64_t *bytes)
{
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},          {"B", 1},           {"KB", 1e3},         {"MB", 1e6},
                 {"GB", 1e9},      {"TB", 1e12},       {"KiB", 1024.0},     {"MiB", 1048576.0},
                 {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end;
    if (!(*s >= '0' && *s <= '9'))
        return false;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s)
        return false;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].unit) == 0) {
            double b = v * units[i].mult;   /* as huggingface_hub: int(value * multiplier) */
            if (!(b >= 1) || b > 9e18)
                return false;
            *bytes = (int64_t)b;
            return true;
        }
    return false;
}

/* File i's header: the length prefix, then its tensors' JSON in layout
 * order, padded with spaces so the data starts 8-byte aligned (as the Rust
 * implementation writes it). */
static bool compose_header(const WLayout *L, StPlan *p, int file)
{
    char *json = NULL;
    size_t n = 0;
    FILE *t = open_memstream(&json, &n);
    if (!t)
        return false;
    fputs("{\"__metadata__\":{\"format\":\"pt\"}", t);
    for (int i = 0; i < L->ntensors; i++) {
        if (p->file_of[i] != file)
            continue;
        const WTensor *T = &L->tensors[i];
        fputs(",\"", t);
        json_put_chars(t, T->name);
        fprintf(t, "\":{\"dtype\":\"%s\",\"shape\":[%lld", dtypes[p->dtype].name,
                (long long)T->shape[0]);
        if (T->rank == 2)
            fprintf(t, ",%lld", (long long)T->shape[1]);
        fprintf(t, "],\"data_offsets\":[%lld,%lld]}", (long long)p->at[i],
                (long long)(p->at[i] + T->numel * dtypes[p->dtype].bytes));
    }
    fputc('}', t);
    for (long len = ftell(t); len >= 0 && (8 + len) % 8 != 0; len++)
        fputc(' ', t);
    bool ok = !ferror(t);
    if (fclose(t) != 0 || !ok) {
        free(json);
        return false;
    }
    p->header[file] = malloc(n + 8);
    if (!p->header[file]) {
        free(json);
        return false;
    }
    for (int i = 0; i < 8; i++)
        p->header[file][i] = (char)((uint64_t)n >> (8 * i));
    memcpy(p->header[file] + 8, json, n);
    p->header_bytes[file] = n + 8;
    free(json);
    /* from here on `at` is where each tensor's data starts in the file */
    for (int i = 0; i < L->ntensors; i++)
        if (p->file_of[i] == file)
            p->at[i] += (int64_t)n + 8;
    return true;
}

bool st_plan(const WLayout *L, StDtype dt, int64_t shard_bytes, StPlan *p)
{
    memset(p, 0, sizeof *p);
    p->dtype = dt;
    const int nt = L->ntensors;
    p->file_of = calloc((size_t)nt + 1, sizeof *p->file_of);
    p->at = calloc((size_t)nt + 1, sizeof *p->at);
    /* shards are made as tokens and numbered when closed, in the order
     * huggingface_hub appends them to its list: a tensor larger than the
     * size is a shard closed at once, so it comes before the shard being
     * filled around it */
    int *token = calloc((size_t)nt + 1, sizeof *token), *number = calloc((size_t)nt + 1, sizeof *number);
    int64_t *used = calloc((size_t)nt + 1, sizeof *used);
    bool ok = p->file_of && p->at && token && number && used;
    int ntokens = 0, cur = -1;
    for (int i = 0; ok && i < nt; i++) {
        const int64_t bytes = L->tensors[i].numel * dtypes[dt].bytes;
        p->total_size += bytes;
        if (shard_bytes > 0 && bytes > shard_bytes) {
            token[i] = ntokens;
            number[ntokens++] = p->nfiles++;
            continue;
        }
        if (cur >= 0 && shard_bytes > 0 && used[cur] + bytes > shard_bytes) {
            number[cur] = p->nfiles++;
            cur = -1;
        }
        if (cur < 0)
            cur = ntokens++;
        token[i] = cur;
        p->at[i] = used[cur];
        used[cur] += bytes;
    }
    if (cur >= 0)
        number[cur] = p->nfiles++;
    for (int i = 0; ok && i < nt; i++)
        p->file_of[i] = number[token[i]];
    free(token), free(number), free(used);
    if (!ok)
        return false;
    p->names = calloc((size_t)p->nfiles, sizeof *p->names);
    p->header = calloc((size_t)p->nfiles, sizeof *p->header);
    p->header_bytes = calloc((size_t)p->nfiles, sizeof *p->header_bytes);
    if (!p->names || !p->header || !p->header_bytes)
        return false;
    for (int f = 0; f < p->nfiles; f++) {
        if (p->nfiles == 1)
            snprintf(p->names[f], sizeof p->names[f], "%s", SINGLE_NAME);
        else
            snprintf(p->names[f], sizeof p->names[f], "model-%05d-of-%05d.safetensors", f + 1,
                     p->nfiles);
        if (!compose_header(L, p, f))
            return false;
    }
    return true;
}

void st_plan_free(StPlan *p)
{
    for (int f = 0; p->header && f < p->nfiles; f++)
        free(p->header[f]);
    free(p->header);
    free(p->header_bytes);
    free(p->names);
    free(p->file_of);
    free(p->at);
    memset(p, 0, sizeof *p);
}

typedef struct Named {
    const char *name;
    int file;
} Named;

static int by_name(const void *a, const void *b)
{
    return strcmp(((const Named *)a)->name, ((const Named *)b)->name);
}

bool st_write_index(FILE *f, const WLayout *L, const StPlan *p)
{
    /* sort_keys: Python orders str keys by code point, as strcmp does UTF-8 */
    Named *ix = malloc(sizeof *ix * (size_t)(L->ntensors + 1));
    if (!ix)
        return false;
    for (int i = 0; i < L->ntensors; i++)
        ix[i] = (Named){L->tensors[i].name, p->file_of[i]};
    qsort(ix, (size_t)L->ntensors, sizeof *ix, by_name);
    fprintf(f, "{\n  \"metadata\": {\n    \"total_size\": %lld\n  },\n  \"weight_map\": {\n",
            (long long)p->total_size);
    for (int k = 0; k < L->ntensors; k++) {
        fputs("    \"", f);
        json_put_chars(f, ix[k].name);
        fprintf(f, "\": \"%s\"%s\n", p->names[ix[k].file], k + 1 < L->ntensors ? "," : "");
    }
    fputs("  }\n}\n", f);
    free(ix);
    return !ferror(f);
}
