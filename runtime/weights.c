/*
 * weights.c — where a run's weights come from and where they go: the
 * initialisation formula, and full weights in safetensors (--init-from,
 * --export), so they move between fsdpc and the Python ecosystem.
 *
 * Initialisation is a function of (seed, parameter name, element index)
 * alone (docs/design.md#initialisation), so it does not depend on the world size or the
 * shard layout and each rank computes its own shard's elements only:
 *
 *   key  = FNV-1a-64(name) XOR (seed × 0x9E3779B97F4A7C15)        (mod 2^64)
 *   u_k  = ((splitmix64(key + 2i + k) >> 11) + 1) · 2^-53,  k = 0, 1  (in (0, 1])
 *   w[i] = σ · √(−2 ln u_0) · cos(2π u_1)        for normal(0, σ)
 *
 * with splitmix64(x) = mix(x + 0x9E3779B97F4A7C15), mix being Steele,
 * Lea and Flood's finaliser, σ the parameter's std (0.02 unless its layer's
 * init says); zeros and ones are what they say. i is the
 * element's row-major index within its parameter. docs/runtime.md gives the
 * same in Python.
 *
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}), then the data. Export gathers one group at a
 * time to rank 0, which writes it, so no rank ever holds more than one
 * group unsharded. Import has every rank read only its own shards'
 * elements, seeking to each parameter's slice. Both speak fp32 (F32) only.
 * Where a parameter lies in the file is a WLayout (hfnames.c): one tensor a
 * parameter under fsdpc's names, or Hugging Face's GPT-2 and Llama tensors
 * (--hf-names), where a parameter may be a transposed slice of a tensor
 * (GPT-2's c_attn holds q, k and v, each transposed).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ── initialisation ── */

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double unit(uint64_t x) { return (double)((x >> 11) + 1) * 0x1p-53; }

#define TWO_PI 6.283185307179586476925286766559

/* Shards are backend memory (device memory on CUDA): initial values are
 * written into host images of the master shards, one per group, and copied
 * in when complete. */
static real **host_images(FsdRun *r)
{
    real **img = calloc((size_t)r->m->ngroups + 1, sizeof *img);
    for (int g = 0; img && g < r->m->ngroups; g++)
        if (!(img[g] = calloc((size_t)r->groups[g].shard + 1, sizeof(real)))) {
            while (g--)
                free(img[g]);
            free(img);
            img = NULL;
        }
    if (!img)
        rt_fail(r, "out of memory for host copies of the shards");
    return img;
}

/* Copies the images into the master shards (unless an error is pending) and frees them. */
static void copy_in(FsdRun *r, real **img)
{
    for (int g = 0; g < r->m->ngroups; g++) {
        if (!r->err[0])
            bk_from_host(r, r->groups[g].master, img[g], r->groups[g].shard * (int64_t)sizeof(real));
        free(img[g]);
    }
    free(img);
}

/* This rank's elements of parameter P, [*a, *b) in parameter indices, and
 * where element 0 of P falls in its group's shard (outside it when this
 * rank holds none of P's start). */
static real *param_in_shard(const FsdRun *r, real *const *shards, const FsdParamInfo *P,
                            int64_t *a, int64_t *b)
{
    const Group *G = &r->groups[P->group];
    *a = G->lo - P->offset, *b = G->lo + G->shard - P->offset;
    if (*a < 0)
        *a = 0;
    if (*b > P->numel)
        *b = P->numel;
    return shards[P->group] + (P->offset - G->lo);
}

/* scale times a standard normal for element i of the stream `key`
 * (Box-Muller over two counter-based uniforms): the same value whatever the
 * rank or thread. */
static double normal_at(uint64_t key, int64_t i, double scale)
{
    double u1 = unit(splitmix64(key + 2 * (uint64_t)i));
    double u2 = unit(splitmix64(key + 2 * (uint64_t)i + 1));
    return scale * sqrt(-2 * log(u1)) * cos(TWO_PI * u2);
}

void weights_init(FsdRun *r)
{
    const FsdModel *m = r->m;
    const uint64_t seed_mix = (uint64_t)r->cfg.seed * 0x9e3779b97f4a7c15ull;
    real **img = host_images(r);
    if (!img)
        return;
    for (int p = 0; p < m->nparams; p++) {
        const FsdParamInfo *P = &m->params[p];
        int64_t a, b;
        real *dst = param_in_shard(r, img, P, &a, &b);
        if (P->init != FSD_INIT_NORMAL) {
            for (int64_t i = a; i < b; i++)
                dst[i] = P->init == FSD_INIT_ONES ? 1 : 0;
            continue;
        }
        const uint64_t key = fnv1a64(P->name) ^ seed_mix;
#pragma omp parallel for schedule(static)
        for (int64_t i = a; i < b; i++)
            dst[i] = (real)normal_at(key, i, P->std);
    }
    copy_in(r, img);
}

void weights_direction(FsdRun *r, uint64_t stream, real *const *dst)
{
    const FsdModel *m = r->m;
    /* a key apart from the initialisation's for every stream */
    const uint64_t mix = (uint64_t)r->cfg.seed * 0x9e3779b97f4a7c15ull ^ splitmix64(~stream);
    for (int g = 0; g < m->ngroups; g++)
        memset(dst[g], 0, (size_t)r->groups[g].shard * sizeof(real));
    for (int p = 0; p < m->nparams; p++) {
        const FsdParamInfo *P = &m->params[p];
        int64_t a, b;
        real *d = param_in_shard(r, dst, P, &a, &b);
        const uint64_t key = fnv1a64(P->name) ^ mix;
        for (int64_t i = a; i < b; i++)
            d[i] = (real)normal_at(key, i, 1);
    }
}

/* ── safetensors import ── */

static const char *shape_str(char *buf, size_t n, const int64_t *shape, int rank)
{
    if (rank == 1)
        snprintf(buf, n, "[%lld]", (long long)shape[0]);
    else
        snprintf(buf, n, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    return buf;
}

/* Checks tensor T's entry in the header; on success *begin is where its
 * data starts, relative to the data section. `also` names the layout for
 * messages ("" for fsdpc's own names). */
static bool check_entry(FsdRun *r, const char *path, const JVal *root, const WLayout *L,
                        const WTensor *T, int64_t data_bytes, int64_t *begin)
{
    const char *name = T->name;
    const JVal *t = json_get(root, name);
    /* the Hub's own GPT-2 files name the base model's tensors without the
     * `transformer.` prefix GPT2LMHeadModel adds; transformers takes both */
    if (!t && L->names && strcmp(L->names, "gpt2") == 0 &&
        strncmp(name, "transformer.", 12) == 0 && (t = json_get(root, name + 12)))
        name += 12;
    if (!t) {
        if (L->names)
            rt_fail(r, "%s: no tensor `%s` (--hf-names %s: model %s needs it)", path, name,
                    L->names, r->m->name);
        else
            rt_fail(r, "%s: no tensor `%s`, a parameter of model %s", path, name, r->m->name);
        return false;
    }
    if (t->type != J_OBJ) {
        rt_fail(r, "%s: tensor `%s`'s entry is not a JSON object", path, name);
        return false;
    }
    const JVal *dtype = json_get(t, "dtype"), *shape = json_get(t, "shape"),
               *offs = json_get(t, "data_offsets");
    if (!dtype || dtype->type != J_STR) {
        rt_fail(r, "%s: tensor `%s` has no `dtype` string", path, name);
        return false;
    }
    if (strcmp(dtype->str, "F32") != 0) {
        rt_fail(r, "%s: tensor `%s` has dtype %s; only F32 is accepted (convert the file's "
                   "tensors to float32 first)",
                path, name, dtype->str);
        return false;
    }
    if (!shape || shape->type != J_ARR) {
        rt_fail(r, "%s: tensor `%s` has no `shape` array", path, name);
        return false;
    }
    bool same = shape->n == T->rank;
    for (int i = 0; same && i < shape->n; i++) {
        int64_t d;
        same = json_count(&shape->items[i], &d) && d == T->shape[i];
    }
    if (!same) {
        char want[64], got[256];
        size_t k = (size_t)snprintf(got, sizeof got, "[");
        for (int i = 0; i < shape->n && k < sizeof got - 32; i++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%.17g", i ? ", " : "",
                                  shape->items[i].type == J_NUM ? shape->items[i].num : NAN);
        snprintf(got + k, sizeof got - k, "]");
        rt_fail(r, "%s: tensor `%s` has shape %s; the model's is %s%s%s", path, name, got,
                shape_str(want, sizeof want, T->shape, T->rank),
                L->names ? " under --hf-names " : "", L->names ? L->names : "");
        return false;
    }
    int64_t b, e;
    if (!offs || offs->type != J_ARR || offs->n != 2 || !json_count(&offs->items[0], &b) ||
        !json_count(&offs->items[1], &e) || e < b) {
        rt_fail(r, "%s: tensor `%s` has no valid `data_offsets` [begin, end]", path, name);
        return false;
    }
    if (e - b != T->numel * 4) {
        rt_fail(r, "%s: tensor `%s`'s data_offsets [%lld, %lld] hold %lld bytes; its shape needs "
                   "%lld",
                path, name, (long long)b, (long long)e, (long long)(e - b),
                (long long)(T->numel * 4));
        return false;
    }
    if (e > data_bytes) {
        rt_fail(r, "%s is truncated: tensor `%s` ends at byte %lld of the data, which has %lld",
                path, name, (long long)e, (long long)data_bytes);
        return false;
    }
    *begin = b;
    return true;
}

/* n floats from byte `at` of f into buf. */
static bool read_floats(FsdRun *r, FILE *f, const char *path, const char *what, int64_t at,
                        float *buf, size_t n)
{
    if (fseeko(f, at, SEEK_SET) != 0) {
        rt_fail(r, "cannot seek in %s: %s", path, strerror(errno));
        return false;
    }
    if (fread(buf, 4, n, f) != n) {   /* little-endian, as the format and x86 */
        rt_fail(r, "cannot read tensor `%s` from %s: %s", what, path,
                ferror(f) ? strerror(errno) : "end of file");
        return false;
    }
    return true;
}

/* This rank's elements [a, b) of parameter P, placed at `pl` in the tensor
 * whose data starts at byte `base` of the file. */
static bool import_param(FsdRun *r, FILE *f, const char *path, const FsdParamInfo *P,
                         const WTensor *T, WPlace pl, int64_t base, int64_t a, int64_t b,
                         real *dst)
{
    enum { CHUNK = 4096 };
    if (!pl.transposed) {
        float chunk[CHUNK];
        for (int64_t i = a; i < b;) {
            size_t n = (size_t)(b - i < CHUNK ? b - i : CHUNK);
            if (!read_floats(r, f, path, T->name, base + 4 * (pl.at + i), chunk, n))
                return false;
            for (size_t k = 0; k < n; k++)
                dst[i + (int64_t)k] = chunk[k];
            i += (int64_t)n;
        }
        return true;
    }
    /* P [R, K] is the tensor's columns [at, at + R): element (i, j) at
     * [j, at + i]; rows i0 … i1 of P hold this rank's elements */
    const int64_t K = P->rank == 2 ? P->shape[1] : 1, ld = T->shape[1];
    const int64_t i0 = a / K, i1 = (b - 1) / K;
    float *col = malloc(sizeof *col * (size_t)(i1 - i0 + 1));
    if (!col) {
        rt_fail(r, "out of memory reading tensor `%s` from %s", T->name, path);
        return false;
    }
    bool ok = true;
    for (int64_t j = 0; ok && j < K; j++) {
        ok = read_floats(r, f, path, T->name, base + 4 * (j * ld + pl.at + i0), col,
                         (size_t)(i1 - i0 + 1));
        for (int64_t i = i0; ok && i <= i1; i++) {
            int64_t e = i * K + j;
            if (e >= a && e < b)
                dst[e] = col[i - i0];
        }
    }
    free(col);
    return ok;
}

void weights_import(FsdRun *r, const char *path)
{
    WLayout L;
    if (!hf_layout(r, r->hf_names, &L))
        return;
    /* O_NONBLOCK: a FIFO opens at once, to be refused, instead of waiting
     * for a writer on every rank; the file is read by seeking */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    FILE *f = NULL;
    if (fd < 0 || fstat(fd, &st) != 0)
        rt_fail(r, "cannot open --init-from file %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rt_fail(r, "--init-from file %s is not a regular file (%s); safetensors are read by "
                   "seeking: name a file",
                path, S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                                                      : "a device or socket");
    else if (!(f = fdopen(fd, "rb")))
        rt_fail(r, "cannot open --init-from file %s: %s", path, strerror(errno));
    if (!f) {
        if (fd >= 0)
            close(fd);
        hf_layout_free(&L);
        return;
    }
    real **img = NULL;   /* host images of the master shards (host_images) */
    char *hdr = NULL;
    int64_t *begin = NULL;
    JVal root = {0};
    unsigned char len8[8];
    int64_t size = -1;
    if (fseeko(f, 0, SEEK_END) == 0)
        size = ftello(f);
    if (size < 0 || fseeko(f, 0, SEEK_SET) != 0) {
        rt_fail(r, "cannot seek in %s: %s", path, strerror(errno));
        goto done;
    }
    if (size < 8 || fread(len8, 1, 8, f) != 8) {
        rt_fail(r, "%s: %lld bytes, too short for a safetensors file (it starts with an 8-byte "
                   "header length)",
                path, (long long)size);
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    /* safetensors itself refuses headers over 100 MB */
    if (hlen > (uint64_t)size - 8 || hlen > 100000000) {
        rt_fail(r, "%s: bad header length %llu (the file has %lld bytes after the length): not a "
                   "safetensors file, or a truncated one",
                path, (unsigned long long)hlen, (long long)(size - 8));
        goto done;
    }
    hdr = malloc(hlen + 1);
    begin = malloc(sizeof *begin * (size_t)(L.ntensors + 1));
    if (!hdr || !begin) {
        rt_fail(r, "%s: out of memory reading a %llu-byte header", path, (unsigned long long)hlen);
        goto done;
    }
    if (fread(hdr, 1, hlen, f) != hlen) {
        rt_fail(r, "cannot read %s's header: %s", path, ferror(f) ? strerror(errno) : "end of file");
        goto done;
    }
    size_t err_at;
    const char *why;
    if (!json_parse(hdr, hlen, &root, &err_at, &why)) {
        rt_fail(r, "%s: bad JSON in the header at byte %zu: %s", path, err_at, why);
        goto done;
    }
    if (root.type != J_OBJ) {
        rt_fail(r, "%s: the header is not a JSON object", path);
        goto done;
    }
    const int64_t data_start = 8 + (int64_t)hlen, data_bytes = size - data_start;
    /* every tensor checked before any is read, in the file's order */
    for (int t = 0; t < L.ntensors; t++)
        if (!check_entry(r, path, &root, &L, &L.tensors[t], data_bytes, &begin[t]))
            goto done;
    if (!(img = host_images(r)))
        goto done;
    for (int p = 0; p < r->m->nparams; p++) {
        const FsdParamInfo *P = &r->m->params[p];
        int64_t a, b;
        real *dst = param_in_shard(r, img, P, &a, &b);
        if (a >= b)
            continue;   /* none of it is this rank's */
        const WPlace pl = L.place[p];
        if (!import_param(r, f, path, P, &L.tensors[pl.tensor], pl, data_start + begin[pl.tensor],
                          a, b, dst))
            goto done;
    }
done:
    if (img)
        copy_in(r, img);
    json_free(&root);
    free(hdr);
    free(begin);
    fclose(f);
    hf_layout_free(&L);
}

/* ── safetensors export ── */

/* The header, into a buffer open_memstream grows (*hdr, *n bytes): the
 * layout's tensors end to end, in its order. */
static bool export_header(const WLayout *L, char **hdr, size_t *n)
{
    FILE *t = open_memstream(hdr, n);
    if (!t)
        return false;
    int64_t at = 0;
    fputs("{\"__metadata__\":{\"format\":\"pt\"}", t);
    for (int i = 0; i < L->ntensors; i++) {
        const WTensor *T = &L->tensors[i];
        fputs(",\"", t);
        json_put_chars(t, T->name);
        fprintf(t, "\":{\"dtype\":\"F32\",\"shape\":[%lld", (long long)T->shape[0]);
        if (T->rank == 2)
            fprintf(t, ",%lld", (long long)T->shape[1]);
        fprintf(t, "],\"data_offsets\":[%lld,%lld]}", (long long)at, (long long)(at + 4 * T->numel));
        at += 4 * T->numel;
    }
    fputc('}', t);
    /* pad with spaces so the data starts 8-byte aligned, as the Rust
     * implementation writes it */
    for (long len = ftell(t); len >= 0 && (8 + len) % 8 != 0; len++)
        fputc(' ', t);
    bool ok = !ferror(t);
    return fclose(t) == 0 && ok;
}

static bool write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }

/* n values from src (stride `stride`) as F32 at byte `at` of f. */
static bool write_floats(FILE *f, int64_t at, const real *src, int64_t n, int64_t stride)
{
    float chunk[4096];
    if (fseeko(f, at, SEEK_SET) != 0)
        return false;
    for (int64_t i = 0; i < n; i += 4096) {
        int64_t k = n - i < 4096 ? n - i : 4096;
        for (int64_t j = 0; j < k; j++)
            chunk[j] = (float)src[(i + j) * stride];
        if (!write_all(f, chunk, (size_t)k * 4))
            return false;
    }
    return true;
}

bool weights_export_path_ok(FsdRun *r, const char *path)
{
    /* the file is written under a temporary name and renamed over `path`,
     * which would replace a device or FIFO with a file (as root,
     * /dev/null): only a regular file, or a new one, is taken */
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode))
        return true;
    rt_fail(r, "--export %s is not a regular file (%s); the weights are written beside it and "
               "renamed over it, which would replace it: name a file",
            path, S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                                                  : "a device or socket");
    return false;
}

void weights_export(FsdRun *r, const char *path)
{
    const FsdModel *m = r->m;
    FILE *f = NULL;
    char tmp[4096] = "";
    char *hdr = NULL;
    size_t hdr_n = 0;
    WLayout L;
    int64_t *begin = NULL;
    /* every rank builds the layout, so a model the format cannot hold is
     * refused on all of them before any gathers */
    if (!hf_layout(r, r->hf_names, &L))
        return;
    bool writing = r->rank == 0;   /* rank 0 stops writing at its first error, not gathering */
    if (writing && !weights_export_path_ok(r, path))   /* checked at start-up, and again now */
        writing = false;
    if (writing) {
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
        if (!export_header(&L, &hdr, &hdr_n) || !(begin = malloc(sizeof *begin * (size_t)(L.ntensors + 1)))) {
            rt_fail(r, "out of memory writing %s's header", path);
            writing = false;
        } else if (!(f = fopen(tmp, "wb"))) {
            rt_fail(r, "cannot write --export file %s: %s", tmp, strerror(errno));
            writing = false;
        } else {
            unsigned char len8[8];
            for (int i = 0; i < 8; i++)
                len8[i] = (unsigned char)((uint64_t)hdr_n >> (8 * i));
            if (!write_all(f, len8, 8) || !write_all(f, hdr, hdr_n)) {
                rt_fail(r, "cannot write %s: %s", tmp, strerror(errno));
                writing = false;
            }
            int64_t at = 8 + (int64_t)hdr_n;
            for (int t = 0; t < L.ntensors; t++) {
                begin[t] = at;
                at += 4 * L.tensors[t].numel;
            }
        }
    }
    /* one group at a time: rank 0 holds one flat buffer, the largest group's */
    int64_t most = 0;
    for (int g = 0; g < m->ngroups; g++)
        if (r->groups[g].padded > most)
            most = r->groups[g].padded;
    real *flat = NULL;
    if (r->rank == 0)
        flat = malloc((size_t)most * sizeof(real));   /* host memory, counted as the CPU's was */
    if (r->rank == 0 && !flat) {   /* as an unsharded buffer short of memory: the run ends */
        fprintf(stderr, "train: rank 0: out of memory for --export's buffer of %lld bytes\n",
                (long long)(most * (int64_t)sizeof(real)));
        bk_abort(r);
    }
    if (flat)
        rt_count(r, most * (int64_t)sizeof(real));
    for (int g = 0; g < m->ngroups; g++) {
        bk_gather_shards(r, g, flat);
        for (int p = 0; writing && p < m->nparams; p++) {
            const FsdParamInfo *P = &m->params[p];
            if (P->group != g)
                continue;
            const WPlace pl = L.place[p];
            const WTensor *T = &L.tensors[pl.tensor];
            const real *src = flat + P->offset;
            if (!pl.transposed)
                writing = write_floats(f, begin[pl.tensor] + 4 * pl.at, src, P->numel, 1);
            else {
                /* P [R, K]: its column j is row j of the tensor, from column `at` */
                const int64_t R = P->shape[0], K = P->rank == 2 ? P->shape[1] : 1;
                for (int64_t j = 0; writing && j < K; j++)
                    writing = write_floats(f, begin[pl.tensor] + 4 * (j * T->shape[1] + pl.at),
                                           src + j, R, K);
            }
            if (!writing)
                rt_fail(r, "cannot write %s: %s", tmp, strerror(errno));
        }
    }
    if (flat)
        rt_count(r, -most * (int64_t)sizeof(real));
    free(flat);
    if (f) {
        if (fclose(f) != 0 && writing) {
            rt_fail(r, "cannot write %s: %s", tmp, strerror(errno));
            writing = false;
        }
        /* the temporary name keeps a failed export from leaving a partial
         * file under the name asked for */
        if (writing && rename(tmp, path) != 0)
            rt_fail(r, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        else if (!writing)
            remove(tmp);
    }
    free(hdr);
    free(begin);
    hf_layout_free(&L);
}
