/*
 * main.c — the fsdpc command line, and the pipeline as one list of calls:
 *
 *   source_read → parse_program → sema_check → (dumps)
 *
 * Output (a dump or, later, train.cu) goes to -o FILE or stdout. A file
 * named by -o is written under a temporary name and renamed only when the
 * whole compile succeeded, so an error never leaves a partial or stale
 * output behind.
 */
#include "fsdpc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Larger sources are refused before scanning: locations are 32-bit
 * offsets, and no model description comes near this. */
#define MAX_SOURCE_BYTES (256u << 20)

typedef struct Options {
    const char *input, *output;
    bool check, dump_ast, dump_model;
} Options;

static void usage(FILE *out)
{
    fputs("usage: fsdpc FILE.fsd [options]\n"
          "\n"
          "Compiles a model, sharding policy and training setup (.fsd) into a\n"
          "sharded training program.\n"
          "\n"
          "options:\n"
          "  --check          check the file (front end only) and exit\n"
          "  --dump-ast       print the syntax tree\n"
          "  --dump-model     print the typed model: layers, parameters, shapes,\n"
          "                   parameter count, shard groups and settings\n"
          "  -o FILE          write the output to FILE instead of standard output\n"
          "  --help           print this help\n"
          "  --version        print the version\n",
          out);
}

static int parse_options(int argc, char **argv, Options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            printf("fsdpc %s\n", FSDPC_VERSION);
            exit(0);
        } else if (strcmp(a, "--check") == 0) {
            o->check = true;
        } else if (strcmp(a, "--dump-ast") == 0) {
            o->dump_ast = true;
        } else if (strcmp(a, "--dump-model") == 0) {
            o->dump_model = true;
        } else if (strcmp(a, "-o") == 0) {
            if (++i == argc) {
                fprintf(stderr, "fsdpc: -o needs a file name\n");
                return 1;
            }
            o->output = argv[i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "fsdpc: unknown option %s (see fsdpc --help)\n", a);
            return 1;
        } else if (o->input) {
            fprintf(stderr, "fsdpc: more than one input file (%s and %s)\n", o->input, a);
            return 1;
        } else {
            o->input = a;
        }
    }
    if (!o->input) {
        fprintf(stderr, "fsdpc: no input file (see fsdpc --help)\n");
        return 1;
    }
    return 0;
}

/* Output goes to a temporary file beside -o, renamed at the end. */
static FILE *open_output(const Options *o, char **tmp)
{
    *tmp = NULL;
    if (!o->output)
        return stdout;
    *tmp = arena_printf("%s.tmp.%ld", o->output, (long)getpid());
    FILE *f = fopen(*tmp, "wb");
    if (!f)
        fprintf(stderr, "fsdpc: cannot write %s: %s\n", *tmp, strerror(errno));
    return f;
}

static int close_output(const Options *o, FILE *f, char *tmp, bool ok)
{
    if (!tmp)
        return fflush(f) == 0 ? 0 : 1;
    bool wrote = fclose(f) == 0;
    if (!ok || !wrote) {
        if (!wrote)
            fprintf(stderr, "fsdpc: cannot write %s: %s\n", tmp, strerror(errno));
        remove(tmp);
        return 1;
    }
    if (rename(tmp, o->output) != 0) {
        fprintf(stderr, "fsdpc: cannot rename %s to %s: %s\n", tmp, o->output, strerror(errno));
        remove(tmp);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    Options o = {0};
    if (parse_options(argc, argv, &o))
        return 1;

    Source *src = source_read(o.input);
    if (!src) {
        fprintf(stderr, "fsdpc: cannot read %s: %s\n", o.input, strerror(errno));
        return 1;
    }
    if (src->len > MAX_SOURCE_BYTES) {
        fprintf(stderr, "fsdpc: %s is %zu bytes; .fsd files are limited to %u MiB\n", o.input,
                src->len, MAX_SOURCE_BYTES >> 20);
        return 1;
    }
    Diag diag;
    diag_init(&diag, src, stderr);

    Program *prog = parse_program(src, &diag);
    if (diag.errors)
        return 1;

    char *tmp;
    FILE *out = NULL;
    if (o.dump_ast) {
        out = open_output(&o, &tmp);
        if (!out)
            return 1;
        ast_dump(out, prog);
        if (!o.dump_model && !o.check)
            return close_output(&o, out, tmp, true);
    }

    Model *model = sema_check(prog, &diag);
    if (!model) {
        if (out)
            close_output(&o, out, tmp, false);
        return 1;
    }
    if (o.dump_model) {
        if (!out && !(out = open_output(&o, &tmp)))
            return 1;
        model_dump(out, model);
    }
    if (out)
        return close_output(&o, out, tmp, true);
    if (o.check)
        return 0;

    fprintf(stderr, "fsdpc: %s checks out, but this fsdpc does not write train.cu yet "
                    "(planning and code generation are not built); use --check or a --dump "
                    "option\n",
            o.input);
    return 1;
}
