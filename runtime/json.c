/*
 * json.c — a small JSON reader: enough for safetensors headers and a model
 * directory's index (safetensors.c), checkpoint metadata (ckpt.c) and a
 * Hugging Face config.json (the compiler's hfconfig.c). It needs only libc
 * (json.h), so the compiler links it as the runtime does. It parses a whole text into a tree of
 * JVal (RFC 8259: strings decoded to UTF-8, numbers as doubles), refuses
 * anything malformed with the byte offset and a reason, and never reads
 * outside the text it is given; nesting is limited so a hostile header
 * cannot exhaust the stack.
 */
#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct JParser {
    const char *s;
    size_t n, at;
    int depth;
    const char *err;
} JParser;

#define JSON_MAX_DEPTH 32

void json_free(JVal *v)
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
bool json_parse(const char *s, size_t n, JVal *out, size_t *err_at, const char **err)
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

const JVal *json_get(const JVal *obj, const char *key)
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
bool json_count(const JVal *v, int64_t *out)
{
    if (!v || v->type != J_NUM || !(v->num >= 0) || v->num > 0x1p53 || v->num != floor(v->num))
        return false;
    *out = (int64_t)v->num;
    return true;
}
