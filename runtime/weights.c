/*
 * weights.c — where a run's weights come from and where they go: the
 * initialisation formula, and full weights in safetensors (--init-from,
 * --export), so they move between fsdpc and the Python ecosystem.
 *
 * Initialisation is a function of (seed, parameter name, element index)
 * alone (design section 9), so it does not depend on the world size or the
 * shard layout and each rank computes its own shard's elements only:
 *
 *   key  = FNV-1a-64(name) XOR (seed × 0x9E3779B97F4A7C15)        (mod 2^64)
 *   u_k  = ((splitmix64(key + 2i + k) >> 11) + 1) · 2^-53,  k = 0, 1  (in (0, 1])
 *   w[i] = 0.02 · √(−2 ln u_0) · cos(2π u_1)     for normal(0, 0.02)
 *
 * with splitmix64(x) = mix(x + 0x9E3779B97F4A7C15), mix being Steele,
 * Lea and Flood's finaliser; zeros and ones are what they say. i is the
 * element's row-major index within its parameter. docs/runtime.md gives the
 * same in Python.
 *
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}), then the data. Export gathers one group at a
 * time to rank 0, which writes it, so no rank ever holds more than one
 * group unsharded. Import has every rank read only its own shards'
 * elements, seeking to each parameter's slice. Both speak fp32 (F32) only.
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
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

void weights_init(FsdRun *r)
{
    const FsdModel *m = r->m;
    const uint64_t seed_mix = (uint64_t)r->cfg.seed * 0x9e3779b97f4a7c15ull;
    for (int p = 0; p < m->nparams; p++) {
        const FsdParamInfo *P = &m->params[p];
        Group *G = &r->groups[P->group];
        /* this rank's elements of the parameter, in parameter indices */
        int64_t a = G->lo - P->offset, b = G->lo + G->shard - P->offset;
        if (a < 0)
            a = 0;
        if (b > P->numel)
            b = P->numel;
        real *dst = G->master + (P->offset - G->lo);
        if (P->init != FSD_INIT_NORMAL) {
            for (int64_t i = a; i < b; i++)
                dst[i] = P->init == FSD_INIT_ONES ? 1 : 0;
            continue;
        }
        const uint64_t key = fnv1a64(P->name) ^ seed_mix;
#pragma omp parallel for schedule(static)
        for (int64_t i = a; i < b; i++) {
            double u1 = unit(splitmix64(key + 2 * (uint64_t)i));
            double u2 = unit(splitmix64(key + 2 * (uint64_t)i + 1));
            dst[i] = (real)(0.02 * sqrt(-2 * log(u1)) * cos(TWO_PI * u2));
        }
    }
}

/* ── a small JSON reader, enough for safetensors headers ── */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } JType;

typedef struct JVal {
    JType type;
    double num;
    char *str;               /* J_STR: decoded, NUL-terminated */
    size_t len;
    int n;                   /* J_ARR, J_OBJ: members */
    struct JVal *items;
    char **keys;             /* J_OBJ */
    size_t *key_len;
} JVal;

typedef struct JParser {
    const char *s;
    size_t n, at;
    int depth;
    const char *err;
} JParser;

#define JSON_MAX_DEPTH 32

static void json_free(JVal *v)
{
    if (v->type == J_ARR || v->type == J_OBJ) {
        for (int i = 0; i < v->n; i++) {
            json_free(&v->items[i]);
            if (v->keys)
                free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
        free(v->key_len);
    }
    free(v->str);
    memset(v, 0, sizeof *v);
}

static bool jfail(JParser *p, const char *what)
{
    if (!p->err)
        p->err = what;
    return false;
}

static void skip_ws(JParser *p)
{
    while (p->at < p->n && (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n' ||
                            p->s[p->at] == '\r'))
        p->at++;
}

static int hex4(JParser *p)
{
    if (p->n - p->at < 4)
        return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->at++];
        v = v * 16 + (c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -4096);
    }
    return v < 0 ? -1 : v;
}

static size_t put_utf8(char *o, uint32_t c)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xc0 | c >> 6);
        o[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | c >> 12);
        o[1] = (char)(0x80 | (c >> 6 & 0x3f));
        o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | c >> 18);
    o[1] = (char)(0x80 | (c >> 12 & 0x3f));
    o[2] = (char)(0x80 | (c >> 6 & 0x3f));
    o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* string = '"' ( char | '\' escape )* '"' ; the opening quote is next */
static bool parse_string(JParser *p, char **out, size_t *out_len)
{
    p->at++;
    /* decoded text is never longer than its source */
    size_t start = p->at, cap = 1;
    while (start + cap - 1 < p->n && p->s[start + cap - 1] != '"')
        cap += p->s[start + cap - 1] == '\\' ? 2 : 1;
    char *o = malloc(cap + 4);
    if (!o)
        return jfail(p, "out of memory");
    size_t k = 0;
    for (;;) {
        if (p->at >= p->n) {
            free(o);
            return jfail(p, "unterminated string");
        }
        unsigned char c = (unsigned char)p->s[p->at++];
        if (c == '"')
            break;
        if (c < 0x20) {
            free(o);
            return jfail(p, "control character in a string");
        }
        if (c != '\\') {
            o[k++] = (char)c;
            continue;
        }
        if (p->at >= p->n) {
            free(o);
            return jfail(p, "unterminated string");
        }
        char e = p->s[p->at++];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            o[k++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        if (e != 'u') {
            free(o);
            return jfail(p, "bad escape in a string");
        }
        int u = hex4(p);
        if (u < 0) {
            free(o);
            return jfail(p, "bad \\u escape");
        }
        uint32_t cp = (uint32_t)u;
        if (u >= 0xd800 && u < 0xdc00) {   /* a surrogate pair */
            int lo = -1;
            if (p->n - p->at >= 2 && p->s[p->at] == '\\' && p->s[p->at + 1] == 'u') {
                p->at += 2;
                lo = hex4(p);
            }
            if (lo < 0xdc00 || lo >= 0xe000) {
                free(o);
                return jfail(p, "unpaired surrogate in a \\u escape");
            }
            cp = 0x10000 + (((uint32_t)u - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
        } else if (u >= 0xdc00 && u < 0xe000) {
            free(o);
            return jfail(p, "unpaired surrogate in a \\u escape");
        }
        k += put_utf8(o + k, cp);   /* ≤ 4 bytes for ≥ 6 source bytes */
    }
    o[k] = 0;
    *out = o;
    *out_len = k;
    return true;
}

/* number = '-'? ('0' | [1-9][0-9]*) ('.' [0-9]+)? ([eE] [+-]? [0-9]+)? */
static bool parse_number(JParser *p, JVal *v)
{
    size_t b = p->at;
    const char *s = p->s;
#define DIGIT(i) ((i) < p->n && s[i] >= '0' && s[i] <= '9')
    if (p->at < p->n && s[p->at] == '-')
        p->at++;
    if (!DIGIT(p->at))
        return jfail(p, "bad number");
    if (s[p->at] == '0')
        p->at++;
    else
        while (DIGIT(p->at))
            p->at++;
    if (p->at < p->n && s[p->at] == '.') {
        p->at++;
        if (!DIGIT(p->at))
            return jfail(p, "bad number");
        while (DIGIT(p->at))
            p->at++;
    }
    if (p->at < p->n && (s[p->at] == 'e' || s[p->at] == 'E')) {
        p->at++;
        if (p->at < p->n && (s[p->at] == '+' || s[p->at] == '-'))
            p->at++;
        if (!DIGIT(p->at))
            return jfail(p, "bad number");
        while (DIGIT(p->at))
            p->at++;
    }
#undef DIGIT
    char buf[64];
    size_t len = p->at - b;
    if (len >= sizeof buf)
        return jfail(p, "number too long");
    memcpy(buf, s + b, len);
    buf[len] = 0;
    v->type = J_NUM;
    v->num = strtod(buf, NULL);
    return true;
}

static bool parse_value(JParser *p, JVal *v);

/* array = '[' ( value ( ',' value )* )? ']'
 * object = '{' ( string ':' value ( ',' string ':' value )* )? '}' */
static bool parse_container(JParser *p, JVal *v, bool object)
{
    if (++p->depth > JSON_MAX_DEPTH)
        return jfail(p, "nested too deeply");
    v->type = object ? J_OBJ : J_ARR;
    p->at++;
    skip_ws(p);
    char close = object ? '}' : ']';
    if (p->at < p->n && p->s[p->at] == close) {
        p->at++;
        p->depth--;
        return true;
    }
    int cap = 0;
    for (;;) {
        if (v->n == cap) {
            cap = cap ? 2 * cap : 8;
            JVal *ni = realloc(v->items, sizeof *ni * (size_t)cap);
            if (ni)
                v->items = ni;
            char **nk = object ? realloc(v->keys, sizeof *nk * (size_t)cap) : NULL;
            if (nk)
                v->keys = nk;
            size_t *nl = object ? realloc(v->key_len, sizeof *nl * (size_t)cap) : NULL;
            if (nl)
                v->key_len = nl;
            if (!ni || (object && (!nk || !nl)))
                return jfail(p, "out of memory");
        }
        memset(&v->items[v->n], 0, sizeof *v->items);
        if (object) {
            skip_ws(p);
            if (p->at >= p->n || p->s[p->at] != '"')
                return jfail(p, "expected a string key");
            v->keys[v->n] = NULL;
            if (!parse_string(p, &v->keys[v->n], &v->key_len[v->n])) {
                v->n++;   /* so json_free sees the slot */
                return false;
            }
            skip_ws(p);
            if (p->at >= p->n || p->s[p->at] != ':') {
                v->n++;
                return jfail(p, "expected ':' after a key");
            }
            p->at++;
        }
        bool ok = parse_value(p, &v->items[v->n]);
        v->n++;
        if (!ok)
            return false;
        skip_ws(p);
        if (p->at < p->n && p->s[p->at] == ',') {
            p->at++;
            continue;
        }
        if (p->at < p->n && p->s[p->at] == close) {
            p->at++;
            p->depth--;
            return true;
        }
        return jfail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static bool literal(JParser *p, const char *word)
{
    size_t n = strlen(word);
    if (p->n - p->at < n || memcmp(p->s + p->at, word, n) != 0)
        return jfail(p, "unexpected character");
    p->at += n;
    return true;
}

/* value = object | array | string | number | true | false | null */
static bool parse_value(JParser *p, JVal *v)
{
    skip_ws(p);
    if (p->at >= p->n)
        return jfail(p, "unexpected end");
    switch (p->s[p->at]) {
    case '{': return parse_container(p, v, true);
    case '[': return parse_container(p, v, false);
    case '"': v->type = J_STR; return parse_string(p, &v->str, &v->len);
    case 't': v->type = J_BOOL; v->num = 1; return literal(p, "true");
    case 'f': v->type = J_BOOL; return literal(p, "false");
    case 'n': v->type = J_NULL; return literal(p, "null");
    default: return parse_number(p, v);
    }
}

/* The whole text must be one value (whitespace around it allowed). */
static bool json_parse(const char *s, size_t n, JVal *out, size_t *err_at, const char **err)
{
    JParser p = {s, n, 0, 0, NULL};
    memset(out, 0, sizeof *out);
    bool ok = parse_value(&p, out);
    if (ok) {
        skip_ws(&p);
        if (p.at != n)
            ok = jfail(&p, "text after the JSON value");
    }
    if (!ok) {
        json_free(out);
        *err_at = p.at;
        *err = p.err ? p.err : "syntax error";
    }
    return ok;
}

static const JVal *json_get(const JVal *obj, const char *key)
{
    if (obj->type != J_OBJ)
        return NULL;
    size_t n = strlen(key);
    for (int i = 0; i < obj->n; i++)
        if (obj->key_len[i] == n && memcmp(obj->keys[i], key, n) == 0)
            return &obj->items[i];
    return NULL;
}

/* A JSON number that is an exact integer in [0, 2^53]. */
static bool json_count(const JVal *v, int64_t *out)
{
    if (!v || v->type != J_NUM || !(v->num >= 0) || v->num > 0x1p53 || v->num != floor(v->num))
        return false;
    *out = (int64_t)v->num;
    return true;
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

/* Checks one tensor's entry against the model's parameter; on success
 * *begin is where its data starts, relative to the data section. */
static bool check_entry(FsdRun *r, const char *path, const JVal *root, const FsdParamInfo *P,
                        int64_t data_bytes, int64_t *begin)
{
    const JVal *t = json_get(root, P->name);
    if (!t) {
        rt_fail(r, "%s: no tensor `%s`, a parameter of model %s", path, P->name, r->m->name);
        return false;
    }
    if (t->type != J_OBJ) {
        rt_fail(r, "%s: tensor `%s`'s entry is not a JSON object", path, P->name);
        return false;
    }
    const JVal *dtype = json_get(t, "dtype"), *shape = json_get(t, "shape"),
               *offs = json_get(t, "data_offsets");
    if (!dtype || dtype->type != J_STR) {
        rt_fail(r, "%s: tensor `%s` has no `dtype` string", path, P->name);
        return false;
    }
    if (strcmp(dtype->str, "F32") != 0) {
        rt_fail(r, "%s: tensor `%s` has dtype %s; only F32 is accepted (convert the file's "
                   "tensors to float32 first)",
                path, P->name, dtype->str);
        return false;
    }
    if (!shape || shape->type != J_ARR) {
        rt_fail(r, "%s: tensor `%s` has no `shape` array", path, P->name);
        return false;
    }
    bool same = shape->n == P->rank;
    for (int i = 0; same && i < shape->n; i++) {
        int64_t d;
        same = json_count(&shape->items[i], &d) && d == P->shape[i];
    }
    if (!same) {
        char want[64], got[256];
        size_t k = (size_t)snprintf(got, sizeof got, "[");
        for (int i = 0; i < shape->n && k < sizeof got - 32; i++)
            k += (size_t)snprintf(got + k, sizeof got - k, "%s%.17g", i ? ", " : "",
                                  shape->items[i].type == J_NUM ? shape->items[i].num : NAN);
        snprintf(got + k, sizeof got - k, "]");
        rt_fail(r, "%s: tensor `%s` has shape %s; the model's is %s", path, P->name, got,
                shape_str(want, sizeof want, P->shape, P->rank));
        return false;
    }
    int64_t b, e;
    if (!offs || offs->type != J_ARR || offs->n != 2 || !json_count(&offs->items[0], &b) ||
        !json_count(&offs->items[1], &e) || e < b) {
        rt_fail(r, "%s: tensor `%s` has no valid `data_offsets` [begin, end]", path, P->name);
        return false;
    }
    if (e - b != P->numel * 4) {
        rt_fail(r, "%s: tensor `%s`'s data_offsets [%lld, %lld] hold %lld bytes; its shape needs "
                   "%lld",
                path, P->name, (long long)b, (long long)e, (long long)(e - b),
                (long long)(P->numel * 4));
        return false;
    }
    if (e > data_bytes) {
        rt_fail(r, "%s is truncated: tensor `%s` ends at byte %lld of the data, which has %lld",
                path, P->name, (long long)e, (long long)data_bytes);
        return false;
    }
    *begin = b;
    return true;
}

void weights_import(FsdRun *r, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        rt_fail(r, "cannot open --init-from file %s: %s", path, strerror(errno));
        return;
    }
    char *hdr = NULL;
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
    if (!hdr) {
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
    float chunk[4096];
    for (int p = 0; p < r->m->nparams; p++) {
        const FsdParamInfo *P = &r->m->params[p];
        int64_t begin;
        if (!check_entry(r, path, &root, P, data_bytes, &begin))
            goto done;
        Group *G = &r->groups[P->group];
        int64_t a = G->lo - P->offset, b = G->lo + G->shard - P->offset;
        if (a < 0)
            a = 0;
        if (b > P->numel)
            b = P->numel;
        if (a >= b)
            continue;   /* none of it is this rank's */
        if (fseeko(f, data_start + begin + 4 * a, SEEK_SET) != 0) {
            rt_fail(r, "cannot seek in %s: %s", path, strerror(errno));
            goto done;
        }
        real *dst = G->master + (P->offset - G->lo);
        for (int64_t i = a; i < b;) {
            size_t n = (size_t)(b - i < 4096 ? b - i : 4096);
            if (fread(chunk, 4, n, f) != n) {
                rt_fail(r, "cannot read tensor `%s` from %s: %s", P->name, path,
                        ferror(f) ? strerror(errno) : "end of file");
                goto done;
            }
            for (size_t k = 0; k < n; k++)   /* little-endian, as the format and x86 */
                dst[i + (int64_t)k] = chunk[k];
            i += (int64_t)n;
        }
    }
done:
    json_free(&root);
    free(hdr);
    fclose(f);
}

/* ── safetensors export ── */

typedef struct Text {
    char *s;
    size_t n, cap;
    bool oom;
} Text;

static void text_add(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(Text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || t->oom)
        return;
    if (t->n + (size_t)n + 1 > t->cap) {
        size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->oom = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    t->n += (size_t)n;
}

/* A JSON string literal. */
static void text_str(Text *t, const char *s)
{
    text_add(t, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            text_add(t, "\\%c", c);
        else if (c < 0x20)
            text_add(t, "\\u%04x", c);
        else
            text_add(t, "%c", c);
    }
    text_add(t, "\"");
}

/* The header: tensors in the order the data is written, group by group. */
static bool export_header(FsdRun *r, Text *t)
{
    const FsdModel *m = r->m;
    int64_t at = 0;
    text_add(t, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int g = 0; g < m->ngroups; g++)
        for (int p = 0; p < m->nparams; p++) {
            const FsdParamInfo *P = &m->params[p];
            if (P->group != g)
                continue;
            text_add(t, ",");
            text_str(t, P->name);
            text_add(t, ":{\"dtype\":\"F32\",\"shape\":[%lld", (long long)P->shape[0]);
            if (P->rank == 2)
                text_add(t, ",%lld", (long long)P->shape[1]);
            text_add(t, "],\"data_offsets\":[%lld,%lld]}", (long long)at,
                     (long long)(at + 4 * P->numel));
            at += 4 * P->numel;
        }
    text_add(t, "}");
    /* pad with spaces so the data starts 8-byte aligned, as the Rust
     * implementation writes it */
    while (!t->oom && (8 + t->n) % 8 != 0)
        text_add(t, " ");
    return !t->oom;
}

static bool write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }

void weights_export(FsdRun *r, const char *path)
{
    const FsdModel *m = r->m;
    FILE *f = NULL;
    char tmp[4096] = "";
    Text hdr = {0};
    bool writing = r->rank == 0;   /* rank 0 stops writing at its first error, not gathering */
    if (writing) {
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
        if (!export_header(r, &hdr)) {
            rt_fail(r, "out of memory writing %s's header", path);
            writing = false;
        } else if (!(f = fopen(tmp, "wb"))) {
            rt_fail(r, "cannot write --export file %s: %s", tmp, strerror(errno));
            writing = false;
        } else {
            unsigned char len8[8];
            for (int i = 0; i < 8; i++)
                len8[i] = (unsigned char)((uint64_t)hdr.n >> (8 * i));
            if (!write_all(f, len8, 8) || !write_all(f, hdr.s, hdr.n)) {
                rt_fail(r, "cannot write %s: %s", tmp, strerror(errno));
                writing = false;
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
        flat = bk_pool_get(r, most * (int64_t)sizeof(real), most * (int64_t)sizeof(real));
    float chunk[4096];
    for (int g = 0; g < m->ngroups; g++) {
        bk_gather_shards(r, g, flat);
        for (int p = 0; writing && p < m->nparams; p++) {
            const FsdParamInfo *P = &m->params[p];
            if (P->group != g)
                continue;
            for (int64_t i = 0; writing && i < P->numel; i += 4096) {
                int64_t n = P->numel - i < 4096 ? P->numel - i : 4096;
                for (int64_t k = 0; k < n; k++)
                    chunk[k] = (float)flat[P->offset + i + k];
                if (!write_all(f, chunk, (size_t)n * 4)) {
                    rt_fail(r, "cannot write %s: %s", tmp, strerror(errno));
                    writing = false;
                }
            }
        }
    }
    if (flat)
        bk_pool_put(r, flat, most * (int64_t)sizeof(real));
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
    free(hdr.s);
}
