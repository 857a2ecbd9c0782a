/*
 * fuzz_frontend.c — libFuzzer entry point for the whole front end.
 *
 * Each input is one .fsd source: it is parsed, checked and, when that
 * succeeds, dumped (AST and model) into /dev/null, so the dumpers see every
 * tree the checker accepts. Diagnostics are counted but not printed. The
 * arena is released after every input, so a leak report means memory that
 * escaped the arena. Design §3: no input may crash, hang or read out of
 * bounds; `make fuzz` runs this with ASan and UBSan.
 */
#include "fsdpc.h"

#include <stdlib.h>

/* Far beyond any model description; larger inputs only slow the search. */
#define MAX_INPUT_BYTES (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (!devnull && !(devnull = fopen("/dev/null", "w")))
        fsd_panic(__FILE__, __LINE__, "cannot open /dev/null");
    if (size > MAX_INPUT_BYTES)
        return 0;

    Source *src = source_from_memory("fuzz.fsd", (const char *)data, size);
    Diag diag;
    diag_init(&diag, src, NULL);
    /* As in main: checking starts only on a tree that parsed cleanly. */
    Program *prog = parse_program(src, &diag);
    if (!diag.errors) {
        ast_dump(devnull, prog);
        Model *model = sema_check(prog, &diag);
        if (model)
            model_dump(devnull, model);
    }
    arena_reset();
    return 0;
}
