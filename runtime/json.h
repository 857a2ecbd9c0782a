/*
 * json.h — reading JSON text: the one JSON reader of fsdpc, the runtime's
 * (safetensors headers, a model directory's index, checkpoint metadata) and
 * the compiler's (`fsdpc --from-hf config.json`, compiler/hfconfig.c). Like
 * jsonout.h it needs only libc, so the compiler links runtime/json.c as the
 * runtime does. A parsed text is a tree of JVal, malloc'ed and freed with
 * json_free.
 */
#ifndef FSD_JSON_H
#define FSD_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } JType;

typedef struct JVal {
    JType type;
    double num;              /* J_NUM; J_BOOL: 1 or 0 */
    char *str;               /* J_STR: decoded, NUL-terminated */
    size_t len;
    int n;                   /* J_ARR, J_OBJ: members */
    struct JVal *items;
    char **keys;             /* J_OBJ */
    size_t *key_len;
} JVal;

/* The whole text must be one value (whitespace around it allowed); on
 * failure *err_at is the byte offset and *err why. */
bool json_parse(const char *s, size_t n, JVal *out, size_t *err_at, const char **err);
const JVal *json_get(const JVal *obj, const char *key);   /* NULL when absent */
bool json_count(const JVal *v, int64_t *out);   /* an exact integer in [0, 2^53] */
void json_free(JVal *v);

#endif
