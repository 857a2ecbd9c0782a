/*
 * fuzz_frontend.c — libFuzzer entry point for the whole compiler.
 *
 * Each input is one .fsd source: it is parsed, checked and, when that
 * succeeds, dumped (AST and model) into /dev/null, so the dumpers see every
 * tree the checker accepts. A model that checks out then goes through every
 * later pass — lowering, autodiff, recomputation, planning at a world of 3
 * (uneven shards), scheduling, the memory plan, emission — with each
 * verifier run, and a verifier's complaint aborts like a crash: it is a
 * compiler bug. Models
 * with more than MAX_PARAMS tensors stop after the front end, to keep each
 * input fast. Diagnostics are counted but not printed. The
 * arena is released after every input, so a leak report means memory that
 * escaped the arena. Design §3: no input may crash, hang or read out of
 * bounds; `make fuzz` runs this with ASan and UBSan.
 */
#include "fsdpc.h"

#include <stdlib.h>

/* Far beyond any model description; larger inputs only slow the search. */
#define MAX_INPUT_BYTES (1u << 20)
#define MAX_PARAMS 4096

static void must_verify(int violations, const char *what)
{
    if (violations)
        fsd_panic(__FILE__, __LINE__, what);
}

/* The passes after the front end, as main runs them. */
static void back_end(Model *m, Diag *diag, FILE *devnull)
{
    Graph *g = lower_model(m);
    must_verify(ir_verify(g, NULL), "ir verify after lowering");
    autodiff(g);
    must_verify(ir_verify(g, NULL), "ir verify after autodiff");
    Recompute *rc = recompute_units(m, g);
    plan_recompute(rc);
    g = recompute_apply(g, rc);
    must_verify(ir_verify(g, NULL), "ir verify after recomputation");
    SimCluster cluster = sim_default_cluster(3);
    Plan *plan = plan_choose(m, g, &cluster, diag);
    if (!plan)
        return;   /* memory_budget cannot be met: a user error */
    must_verify(schedule_verify(plan->sched, stderr), "schedule verify");
    must_verify(memplan_verify(plan->mem, NULL), "memory plan verify");
    schedule_dump(devnull, plan->sched, 3, plan->mem);
    must_verify(emit_program(devnull, plan, stderr), "schedule verify");
}

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
            model = model_build(model, &diag);
        if (model) {
            model_dump(devnull, model);
            if (model->nparams <= MAX_PARAMS)
                back_end(model, &diag, devnull);
        }
    }
    arena_reset();
    return 0;
}
