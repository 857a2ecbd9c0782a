/*
 * jsonout.h — writing JSON text: the one string escaper of everything fsdpc
 * writes as JSON, the runtime's (safetensors headers, checkpoint metadata,
 * the trace) and the compiler's (`--trace`, compiler/sim.c). It needs only
 * libc, so the compiler links runtime/jsonout.c as the runtime does.
 */
#ifndef FSD_JSONOUT_H
#define FSD_JSONOUT_H

#include <stdio.h>

/* Writes s as the inside of a JSON string (no quotes): '"' and '\\'
 * escaped, control characters as \u00XX, every other byte as it is (UTF-8
 * passes through). A null s writes nothing. */
void json_put_chars(FILE *f, const char *s);

#endif
