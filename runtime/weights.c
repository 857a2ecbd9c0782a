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
 * safetensors (safetensors.c has the format, and the model directories
 * transformers writes): export gathers one group at a time to rank 0,
 * which writes it, converted to --export-dtype, into one file or into
 * shards of at most --export-shard-size with their index, so no rank ever
 * holds more than one group unsharded. Import goes group by group too: each
 * rank reads only its own shard's elements of the group's parameters, by
 * offset, from whichever file holds each (F32, BF16 or F16, widened to
 * fp32 exactly), into a host image of that one shard, copied in before the
 * next group. Where a parameter lies in the files is a WLayout (hfnames.c):
 * one tensor a parameter under fsdpc's names, or Hugging Face's GPT-2 and
 * Llama tensors (--hf-names), where a parameter may be a transposed slice
 * of a tensor (GPT-2's c_attn holds q, k and v, each transposed).
 */
#include "internal.h"

#include <dirent.h>
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
 * where element 0 of P falls in its group's shard, `shard` (outside it
 * when this rank holds none of P's start). */
static real *param_in_shard(const FsdRun *r, real *shard, const FsdParamInfo *P, int64_t *a,
                            int64_t *b)
{
    const Group *G = &r->groups[P->group];
    *a = G->lo - P->offset, *b = G->lo + G->shard - P->offset;
    if (*a < 0)
        *a = 0;
    if (*b > P->numel)
        *b = P->numel;
    return shard + (P->offset - G->lo);
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
        real *dst = param_in_shard(r, img[P->group], P, &a, &b);
        if (P->init != FSD_INIT_NORMAL) {
            for (int64_t i = a; i < b; i++)
                dst[i] = P->init == FSD_INIT_ONES ? 1 : 0;
            continue;
        }
        const uint64_t key = fnv1a64(P->name) ^ seed_mix;
#pragma omp parallel for schedule(static) if (b - a >= FSD_PAR_MIN_ELEMS)
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
        real *d = param_in_shard(r, dst[P->group], P, &a, &b);
        const uint64_t key = fnv1a64(P->name) ^ mix;
        for (int64_t i = a; i < b; i++)
            d[i] = (real)normal_at(key, i, 1);
    }
}

/* ── safetensors import ── */

/* This rank's elements [a, b) of parameter P, placed at `pl` in tensor T
 * (found as t), into dst (P's element 0 at dst[0]). */
static bool import_param(FsdRun *r, const StTensor *t, const WTensor *T, const FsdParamInfo *P,
                         WPlace pl, int64_t a, int64_t b, real *dst)
{
    enum { CHUNK = 4096 };
    if (!pl.transposed) {
        float chunk[CHUNK];
        for (int64_t i = a; i < b;) {
            const int64_t n = b - i < CHUNK ? b - i : CHUNK;
            if (!st_read(r, t, T->name, pl.at + i, n, chunk))
                return false;
            for (int64_t k = 0; k < n; k++)
                dst[i + k] = chunk[k];
            i += n;
        }
        return true;
    }
    /* P [R, K] is the tensor's columns [at, at + R): element (i, j) at
     * [j, at + i]; rows i0 … i1 of P hold this rank's elements, so each of
     * the tensor's K rows gives one run of i1 − i0 + 1 */
    const int64_t K = P->rank == 2 ? P->shape[1] : 1, ld = T->shape[1];
    const int64_t i0 = a / K, i1 = (b - 1) / K;
    float *col = malloc(sizeof *col * (size_t)(i1 - i0 + 1));
    if (!col) {
        rt_fail(r, "out of memory reading tensor `%s` from %s", T->name, t->file->path);
        return false;
    }
    bool ok = true;
    for (int64_t j = 0; ok && j < K; j++) {
        ok = st_read(r, t, T->name, j * ld + pl.at + i0, i1 - i0 + 1, col);
        for (int64_t i = i0; ok && i <= i1; i++) {
            const int64_t e = i * K + j;
            if (e >= a && e < b)
                dst[e] = col[i - i0];
        }
    }
    free(col);
    return ok;
}

void weights_import(FsdRun *r, const char *path)
{
    const FsdModel *m = r->m;
    WLayout L;
    if (!hf_layout(r, r->hf_names, &L))
        return;
    StSource src;
    StTensor *found = NULL;
    real *img = NULL;
    if (!st_open(r, path, &src))
        goto done;
    /* every tensor checked before any is read */
    if (!(found = malloc(sizeof *found * (size_t)(L.ntensors + 1)))) {
        rt_fail(r, "out of memory");
        goto done;
    }
    for (int t = 0; t < L.ntensors; t++)
        if (!st_find(r, &src, &L, &L.tensors[t], &found[t]))
            goto done;
    /* one group at a time: a host image of this rank's shard of it (zero in
     * gaps and padding), filled, copied in, and the next */
    for (int g = 0; g < m->ngroups; g++) {
        const Group *G = &r->groups[g];
        if (!(img = calloc((size_t)G->shard + 1, sizeof *img))) {
            rt_fail(r, "out of memory for a host copy of group %s's shard (%lld elements)",
                    m->groups[g].name, (long long)G->shard);
            goto done;
        }
        for (int p = 0; p < m->nparams; p++) {
            const FsdParamInfo *P = &m->params[p];
            if (P->group != g)
                continue;
            int64_t a, b;
            real *dst = param_in_shard(r, img, P, &a, &b);
            if (a >= b)
                continue;   /* none of it is this rank's */
            const WPlace pl = L.place[p];
            if (!import_param(r, &found[pl.tensor], &L.tensors[pl.tensor], P, pl, a, b, dst))
                goto done;
        }
        bk_from_host(r, G->master, img, G->shard * (int64_t)sizeof(real));
        free(img);
        img = NULL;
    }
done:
    free(img);
    free(found);
    st_close(&src);
    hf_layout_free(&L);
}

/* ── safetensors export ── */

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", dir, name);
    return s;
}

/* n values from src (stride `stride`) encoded as the plan's dtype at byte
 * `at` of fd. */
static bool write_values(int fd, StDtype dt, int64_t at, const real *src, int64_t n, int64_t stride)
{
    enum { CHUNK = 4096 };
    unsigned char buf[CHUNK * 4];
    const int elem = st_dtype_bytes(dt);
    for (int64_t i = 0; i < n; i += CHUNK) {
        const int64_t k = n - i < CHUNK ? n - i : CHUNK;
        st_encode(dt, src + i * stride, k, stride, buf);
        for (size_t done = 0; done < (size_t)(k * elem);) {
            ssize_t w = pwrite(fd, buf + done, (size_t)(k * elem) - done,
                               (off_t)(at + i * elem + (int64_t)done));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return false;
            done += (size_t)w;
        }
    }
    return true;
}

/* A file of a directory export: a shard model-NNNNN-of-NNNNN.safetensors,
 * or model.safetensors, or the index. */
static bool shard_like(const char *name)
{
    int a, b, n = 0;
    return strcmp(name, "model.safetensors") == 0 ||
           strcmp(name, "model.safetensors.index.json") == 0 ||
           (strlen(name) == 32 && sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &n) == 2 &&
            n == 32);
}

/* After a directory export: the files of an earlier export into DIR that
 * this one did not write (stale shards of another count; model.safetensors
 * beside an index, which from_pretrained would load first; an index beside
 * one file) are removed. Other files (config.json) stay. */
static void remove_stale(FsdRun *r, const char *dir, const StPlan *p)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!shard_like(e->d_name))
            continue;
        bool ours = p->nfiles > 1 && strcmp(e->d_name, "model.safetensors.index.json") == 0;
        for (int f = 0; f < p->nfiles && !ours; f++)
            ours = strcmp(e->d_name, p->names[f]) == 0;
        char *full = ours ? NULL : path_join(dir, e->d_name);
        if (full && unlink(full) != 0 && r->rank == 0)
            fprintf(stderr, "train: warning: cannot remove %s, left by an earlier export: %s\n",
                    full, strerror(errno));
        free(full);
    }
    closedir(d);
}

/* rank 0: whether --export may write `path`; create: make the directory of
 * a sharded export when missing. */
static bool export_path_ok(FsdRun *r, const char *path, bool create)
{
    struct stat st;
    const bool exists = stat(path, &st) == 0;
    if (r->export_shard_bytes > 0) {
        if (exists && S_ISDIR(st.st_mode))
            return true;
        if (!exists && (!create || mkdir(path, 0777) == 0 || errno == EEXIST))
            return true;
        if (!exists)
            rt_fail(r, "cannot create --export directory %s: %s", path, strerror(errno));
        else
            rt_fail(r, "--export %s with --export-shard-size names a directory (the shards and "
                       "their index go in it), but %s is not one",
                    path, path);
        return false;
    }
    /* the file is written under a temporary name and renamed over `path`,
     * which would replace a device or FIFO with a file (as root,
     * /dev/null): only a regular file, or a new one, is taken */
    if (!exists || S_ISREG(st.st_mode))
        return true;
    rt_fail(r, "--export %s is not a regular file (%s); the weights are written beside it and "
               "renamed over it, which would replace it: name a file%s",
            path, S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                                                  : "a device or socket",
            S_ISDIR(st.st_mode) ? " (or add --export-shard-size to write a model directory)" : "");
    return false;
}

bool weights_export_check(FsdRun *r)
{
    static const char *const names[ST_NDTYPES] = {[ST_F32] = "fp32", [ST_BF16] = "bf16",
                                                   [ST_F16] = "fp16"};
    r->export_dtype = ST_F32;
    if (r->export_dtype_flag) {
        int d = 0;
        while (d < ST_NDTYPES && strcmp(r->export_dtype_flag, names[d]) != 0)
            d++;
        if (d == ST_NDTYPES) {
            rt_fail(r, "--export-dtype: '%s' is not one of fp32, bf16, fp16", r->export_dtype_flag);
            return false;
        }
        r->export_dtype = (StDtype)d;
    }
    r->export_shard_bytes = 0;
    if (r->export_shard_flag && !st_parse_size(r->export_shard_flag, &r->export_shard_bytes)) {
        rt_fail(r, "--export-shard-size: '%s' is not a size of at least one byte (5GB, 500MB, "
                   "2GiB, or a number of bytes)",
                r->export_shard_flag);
        return false;
    }
    if ((r->export_dtype_flag || r->export_shard_flag) && !r->export_path) {
        rt_fail(r, "--export-%s says how --export writes the weights, but there is no --export",
                r->export_dtype_flag ? "dtype" : "shard-size");
        return false;
    }
    r->export_config = false;
    if (r->rank != 0 || !r->export_path)
        return true;
    if (!export_path_ok(r, r->export_path, true))
        return false;
    /* a model directory under HF's names gets its config.json, or a
     * warning now saying why not (a single file has nowhere to put one) */
    if (r->export_shard_bytes > 0 && r->hf_names)
        hf_config_check(r);
    return true;
}

/* What a directory export's JSON files are written from */
typedef struct ExportFiles {
    FsdRun *r;
    const WLayout *L;
    const StPlan *plan;
} ExportFiles;

static bool put_config(FILE *f, const void *x)
{
    const ExportFiles *e = x;
    return hf_config_put(f, e->r, e->L);
}

static bool put_index(FILE *f, const void *x)
{
    const ExportFiles *e = x;
    return st_write_index(f, e->L, e->plan);
}

/* DIR/name as put writes it, under .name.tmp beside it and renamed when
 * complete, so a failure never leaves a partial file under the name;
 * false with rt_fail. */
static bool write_dir_file(FsdRun *r, const char *dir, const char *name,
                           bool (*put)(FILE *, const void *), const void *x)
{
    char tmpname[128];
    snprintf(tmpname, sizeof tmpname, ".%s.tmp", name);
    char *final = path_join(dir, name), *tmp = path_join(dir, tmpname);
    FILE *f = final && tmp ? fopen(tmp, "w") : NULL;
    bool ok = f && put(f, x);
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok || rename(tmp, final) != 0) {
        rt_fail(r, "cannot write %s: %s", final ? final : dir, strerror(errno));
        if (tmp)
            remove(tmp);
        ok = false;
    }
    free(final);
    free(tmp);
    return ok;
}

void weights_export(FsdRun *r, const char *path)
{
    const FsdModel *m = r->m;
    const bool sharded = r->export_shard_bytes > 0;
    StPlan plan;
    memset(&plan, 0, sizeof plan);
    WLayout L;
    int *fds = NULL;
    char **tmp = NULL, **final = NULL;
    /* every rank builds the layout, so a model the format cannot hold is
     * refused on all of them before any gathers */
    if (!hf_layout(r, r->hf_names, &L))
        return;
    bool writing = r->rank == 0;   /* rank 0 stops writing at its first error, not gathering */
    if (writing && !export_path_ok(r, path, true))   /* checked at start-up, and again now */
        writing = false;
    if (writing && (!st_plan(&L, r->export_dtype, r->export_shard_bytes, &plan) ||
                    !(fds = malloc(sizeof *fds * (size_t)plan.nfiles)) ||
                    !(tmp = calloc((size_t)plan.nfiles, sizeof *tmp)) ||
                    !(final = calloc((size_t)plan.nfiles, sizeof *final)))) {
        rt_fail(r, "out of memory planning --export %s", path);
        writing = false;
    }
    /* each file under a temporary name beside its own, renamed into place
     * when every file is complete */
    for (int f = 0; writing && f < plan.nfiles; f++)
        fds[f] = -1;
    for (int f = 0; writing && f < plan.nfiles; f++) {
        char name[128];
        snprintf(name, sizeof name, ".%s.tmp.%ld", plan.names[f], (long)getpid());
        final[f] = sharded ? path_join(path, plan.names[f]) : strdup(path);
        if (sharded)
            tmp[f] = path_join(path, name);
        else if ((tmp[f] = malloc(strlen(path) + 32)))
            sprintf(tmp[f], "%s.tmp.%ld", path, (long)getpid());
        if (!final[f] || !tmp[f]) {
            rt_fail(r, "out of memory");
            writing = false;
        } else if ((fds[f] = open(tmp[f], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0) {
            rt_fail(r, "cannot write --export file %s: %s", tmp[f], strerror(errno));
            writing = false;
        } else if (pwrite(fds[f], plan.header[f], plan.header_bytes[f], 0) !=
                   (ssize_t)plan.header_bytes[f]) {
            rt_fail(r, "cannot write %s: %s", tmp[f], strerror(errno));
            writing = false;
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
    const int elem = st_dtype_bytes(r->export_dtype);
    for (int g = 0; g < m->ngroups; g++) {
        bk_gather_shards(r, g, flat);
        for (int p = 0; writing && p < m->nparams; p++) {
            const FsdParamInfo *P = &m->params[p];
            if (P->group != g)
                continue;
            const WPlace pl = L.place[p];
            const WTensor *T = &L.tensors[pl.tensor];
            const int fd = fds[plan.file_of[pl.tensor]];
            const int64_t base = plan.at[pl.tensor];
            const real *src = flat + P->offset;
            if (!pl.transposed)
                writing = write_values(fd, r->export_dtype, base + elem * pl.at, src, P->numel, 1);
            else {
                /* P [R, K]: its column j is row j of the tensor, from column `at` */
                const int64_t R = P->shape[0], K = P->rank == 2 ? P->shape[1] : 1;
                for (int64_t j = 0; writing && j < K; j++)
                    writing = write_values(fd, r->export_dtype, base + elem * (j * T->shape[1] + pl.at),
                                           src + j, R, K);
            }
            if (!writing)
                rt_fail(r, "cannot write %s: %s", tmp[plan.file_of[pl.tensor]], strerror(errno));
        }
    }
    if (flat)
        rt_count(r, -most * (int64_t)sizeof(real));
    free(flat);
    for (int f = 0; fds && f < plan.nfiles; f++)
        if (fds[f] >= 0 && close(fds[f]) != 0 && writing) {
            rt_fail(r, "cannot write %s: %s", tmp[f], strerror(errno));
            writing = false;
        }
    /* the temporary names keep a failed export from leaving partial files
     * under the names asked for; config.json (hfconfig.c) and the index go
     * last */
    for (int f = 0; writing && f < plan.nfiles; f++)
        if (rename(tmp[f], final[f]) != 0) {
            rt_fail(r, "cannot rename %s to %s: %s", tmp[f], final[f], strerror(errno));
            writing = false;
        } else {
            free(tmp[f]);
            tmp[f] = NULL;
        }
    const ExportFiles x = {r, &L, &plan};
    if (writing && sharded && r->export_config)
        writing = write_dir_file(r, path, "config.json", put_config, &x);
    if (writing && sharded && plan.nfiles > 1)
        writing = write_dir_file(r, path, "model.safetensors.index.json", put_index, &x);
    if (writing && sharded)
        remove_stale(r, path, &plan);
    for (int f = 0; tmp && f < plan.nfiles; f++) {
        if (tmp[f])
            remove(tmp[f]);
        free(tmp[f]);
        free(final[f]);
    }
    free(tmp);
    free(final);
    free(fds);
    st_plan_free(&plan);
    hf_layout_free(&L);
}
