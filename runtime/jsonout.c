/*
 * jsonout.c — the JSON string escaper (jsonout.h). Libc only: the runtime
 * and the compiler both link it.
 */
#include "jsonout.h"

void json_put_chars(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
}
