/*
 * ir.c — the training graph: tensors and ops, the op table (ops.def), FLOP
 * and byte counts, the graph verifier, and `--dump-ir`.
 *
 * A Graph holds one micro-batch's step in execution order: the forward ops
 * lowered from the model, then the backward ops autodiff derives. Shapes keep
 * the micro-batch symbolic (DIM_BATCH) so one graph serves any batch size.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <string.h>

static const struct {
    const char *name;
    int nin, nout;
} op_table[] = {
#define OP(e, name, nin, nout, flops, backward) {name, nin, nout},
#include "ops.def"
};

const char *op_name(OpKind k) { return op_table[k].name; }
int op_arity(OpKind k) { return op_table[k].nin; }
int op_outputs(OpKind k) { return op_table[k].nout; }

static void *grow(void *old, int n, int *cap, size_t elem)
{
    if (n < *cap)
        return old;
    int ncap = *cap ? *cap * 2 : 64;
    void *p = arena_alloc(elem * (size_t)ncap);
    if (n)
        memcpy(p, old, elem * (size_t)n);
    *cap = ncap;
    return p;
}

OpNode *ir_op(Graph *g, OpKind kind, Layer *layer, Loc loc)
{
    g->ops = grow(g->ops, g->nops, &g->ops_cap, sizeof(OpNode *));
    OpNode *op = arena_alloc(sizeof *op);
    op->kind = kind;
    op->index = g->nops;
    op->layer = layer;
    op->loc = loc;
    op->group = -1;
    g->ops[g->nops++] = op;
    return op;
}

Tensor *ir_tensor(Graph *g, TensorKind kind, const char *name, ValueDtype dt, int rank,
                  const int64_t *dim)
{
    g->tensors = grow(g->tensors, g->ntensors, &g->tensors_cap, sizeof(Tensor *));
    Tensor *t = arena_alloc(sizeof *t);
    t->id = g->ntensors;
    t->kind = kind;
    t->name = name;
    t->dtype = dt;
    t->store = compute_dtype(g->m);
    t->rank = rank;
    for (int i = 0; i < rank; i++)
        t->dim[i] = dim[i];
    g->tensors[g->ntensors++] = t;
    return t;
}

void ir_in(OpNode *op, Tensor *t)
{
    if (op->nin >= 6)
        fsd_unreachable();
    op->in[op->nin++] = t;
}

void ir_out(OpNode *op, Tensor *t, bool acc)
{
    if (op->nout >= 4)
        fsd_unreachable();
    op->acc[op->nout] = acc;
    op->out[op->nout++] = t;
    if (!t->producer)
        t->producer = op;
}

int64_t tensor_numel(const Tensor *t, int64_t batch)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->dim[i] == DIM_BATCH ? batch : t->dim[i];
    return n;
}

int64_t tensor_bytes(const Tensor *t, int64_t batch)
{
    return tensor_numel(t, batch) * (t->dtype == DT_I32 ? 4 : dtype_bytes(t->store));
}

DType compute_dtype(const Model *m)
{
    return m->shard.param_dtype == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_FP32;
}

Tensor *ir_stat(Tensor *t)
{
    t->store = DTYPE_FP32;
    t->stat = true;
    return t;
}

int64_t widest_head(const Graph *g)
{
    int64_t hd = 0;
    for (int i = 0; i < g->nops; i++)
        if (g->ops[i]->kind == OP_ATTENTION && g->ops[i]->head_dim > hd)
            hd = g->ops[i]->head_dim;
    return hd;
}

const char *tensor_type(const Tensor *t)
{
    Type ty = {t->dtype, t->rank, {0}};
    memcpy(ty.dim, t->dim, sizeof ty.dim);
    const char *s = eval_type_name(&ty);   /* "f32[...]" or "i32[...]" */
    return t->dtype == DT_F32 && t->store != DTYPE_FP32
               ? arena_printf("%s%s", dtype_name(t->store), s + 3)
               : s;
}

int64_t op_norm_width(const OpNode *op)
{
    int w;   /* the input holding the norm's weight */
    switch (op->kind) {
    case OP_LAYERNORM:
    case OP_LAYERNORM_NOBIAS:
    case OP_RMSNORM: w = 1; break;
    case OP_LAYERNORM_BWD:
    case OP_LAYERNORM_NOBIAS_BWD:
    case OP_RMSNORM_BWD:
    case OP_ADD_LAYERNORM:
    case OP_ADD_LAYERNORM_NOBIAS:
    case OP_ADD_RMSNORM: w = 2; break;
    default: return 0;
    }
    return w < op->nin ? op->in[w]->dim[0] : 0;
}

/* The variables ops.def's FLOP formulas are written in. */
double op_flops(const OpNode *op, int64_t batch)
{
    double OUT = op->nout ? (double)tensor_numel(op->out[0], batch) : 0;
    double IN = op->nin ? (double)tensor_numel(op->in[0], batch) : 0;
    double K = 0, B = (double)batch, T = 0, H = (double)op->heads, HD = (double)op->head_dim;
    double MASK = op->causal ? 0.5 : 1.0;
    const Tensor *x = op->nin ? op->in[0] : NULL;
    double ROWS = x && x->rank ? IN / (double)(x->dim[x->rank - 1] == DIM_BATCH ? batch
                                                                                : x->dim[x->rank - 1])
                               : 0;
    switch (op->kind) {
    case OP_MATMUL:      /* x [.., K] · W [N, K]ᵀ (+ b [N]) */
    case OP_MATMUL_BIAS:
    case OP_MATMUL_BIAS_GELU:
        K = (double)op->in[1]->dim[1];
        break;
    case OP_MATMUL_DX:   /* dy [.., N] · W [N, K]: contracts N */
        K = (double)op->in[1]->dim[0];
        break;
    case OP_MATMUL_DW:   /* dyᵀ [N, rows] · x [rows, K]: contracts the rows */
        K = ROWS;
        break;
    case OP_ATTENTION:
    case OP_ATTENTION_BWD:
        T = (double)op->in[op->kind == OP_ATTENTION ? 0 : 1]->dim[1];
        break;
    default:
        break;
    }
    (void)ROWS, (void)MASK;
    switch (op->kind) {
#define OP(e, name, nin, nout, flops, backward) \
    case e:                                     \
        return (flops);
#include "ops.def"
    case OP_COUNT:
        break;
    }
    fsd_unreachable();
}

double op_bytes(const OpNode *op, int64_t batch)
{
    /* a lookup touches only the rows it reads (or accumulates into), not the
     * whole table: output-sized traffic on the table plus the indices */
    if (op->kind == OP_EMBED || op->kind == OP_EMBED_BWD) {
        const Tensor *rows = op->kind == OP_EMBED ? op->out[0] : op->in[0];
        const Tensor *idx = op->in[1];
        return (double)tensor_bytes(rows, batch) * (op->kind == OP_EMBED ? 2 : 3) +
               (double)tensor_bytes(idx, batch);
    }
    double b = 0;
    for (int i = 0; i < op->nin; i++)
        b += (double)tensor_bytes(op->in[i], batch);
    for (int i = 0; i < op->nout; i++)
        b += (double)tensor_bytes(op->out[i], batch) * (op->acc[i] ? 2 : 1);
    return b;
}

/* ── verifier ──
 * Every op has its table's arity; no tensor is read before it is written
 * (inputs and parameters excepted); a non-accumulating write never
 * overwrites a value another op wrote; every backward op's forward reads
 * are marked saved. A recompute op (recompute.c) lies in backward, reads
 * forward values, parameters and inputs only, and writes new values, each
 * shaped as the forward value it computes again. */
int ir_verify(Graph *g, FILE *err)
{
    int bad = 0;
    bool *written = arena_alloc(sizeof(bool) * (size_t)g->ntensors);
    for (int i = 0; i < g->ntensors; i++) {
        TensorKind k = g->tensors[i]->kind;
        written[i] = k == TK_INPUT || k == TK_PARAM || k == TK_PGRAD;
    }
#define FAIL(...)                                      \
    do {                                               \
        bad++;                                         \
        if (err) {                                     \
            fprintf(err, "ir verify: op %d (%s): ", op->index, op_name(op->kind)); \
            fprintf(err, __VA_ARGS__);                 \
            fputc('\n', err);                          \
        }                                              \
    } while (0)
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        if (op->index != i)
            FAIL("stored at %d", i);
        if (op->nin != op_arity(op->kind) || op->nout != op_outputs(op->kind))
            FAIL("has %d inputs and %d outputs; ops.def says %d and %d", op->nin, op->nout,
                 op_arity(op->kind), op_outputs(op->kind));
        if (op->backward != (i >= g->nfwd))
            FAIL("is in the wrong phase");
        /* fuse.c's rules: an add fuses with operands of one shape, its sum's */
        if ((op->kind == OP_ADD_LAYERNORM || op->kind == OP_ADD_LAYERNORM_NOBIAS ||
             op->kind == OP_ADD_RMSNORM) &&
            op->nin == op_arity(op->kind) && op->nout == op_outputs(op->kind) &&
            (op->in[0]->rank != op->in[1]->rank || op->in[0]->rank != op->out[0]->rank ||
             memcmp(op->in[0]->dim, op->in[1]->dim, sizeof op->in[0]->dim) != 0 ||
             memcmp(op->in[0]->dim, op->out[0]->dim, sizeof op->in[0]->dim) != 0))
            FAIL("adds %s and %s of different shapes", op->in[0]->name, op->in[1]->name);
        /* a norm normalises runs of its weight's length: x's rows, or a
         * whole number of them per row (qk_norm's heads) */
        int64_t C = op_norm_width(op);
        if (C && op->nin == op_arity(op->kind) &&
            (C < 1 || op->in[0]->dim[op->in[0]->rank - 1] % C != 0))
            FAIL("normalises runs of %lld elements, which %s's rows are not made of",
                 (long long)C, op->in[0]->name);
        for (int j = 0; j < op->nin; j++) {
            Tensor *t = op->in[j];
            if (!written[t->id])
                FAIL("reads %s before any op writes it", t->name);
            if (op->backward && t->kind == TK_ACT && !t->saved && !t->recompute_of)
                FAIL("reads forward value %s, which is not marked saved", t->name);
            if (op->recompute && (t->kind == TK_AGRAD || t->kind == TK_PGRAD))
                FAIL("is a recompute op but reads the gradient %s", t->name);
        }
        if (op->recompute && !op->backward)
            FAIL("is a recompute op in forward");
        for (int j = 0; j < op->nout && op->recompute; j++) {
            const Tensor *t = op->out[j], *o = t->recompute_of;
            if (!o || t->kind != TK_ACT || o->kind != TK_ACT || !o->producer ||
                o->producer->backward || o->rank != t->rank ||
                memcmp(o->dim, t->dim, sizeof t->dim) != 0 || o->store != t->store)
                FAIL("writes %s, which is not a new value shaped as a forward one", t->name);
        }
        for (int j = 0; j < op->nout; j++) {
            Tensor *t = op->out[j];
            if (t->kind == TK_PARAM || t->kind == TK_INPUT)
                FAIL("writes %s, which is read-only", t->name);
            if (written[t->id] && !op->acc[j] && t->kind != TK_PGRAD)
                FAIL("overwrites %s without accumulating", t->name);
            if (!written[t->id] && op->acc[j] && t->kind != TK_PGRAD)
                FAIL("accumulates into %s before it is written", t->name);
            written[t->id] = true;
        }
    }
#undef FAIL
    return bad;
}

double graph_flops(const Graph *g, int from, int to, int64_t batch)
{
    double f = 0;
    for (int i = from; i < to; i++)
        f += op_flops(g->ops[i], batch);
    return f;
}

double graph_model_flops(const Graph *g, int64_t batch)
{
    double f = 0;
    for (int i = 0; i < g->nops; i++)
        if (!g->ops[i]->recompute)
            f += op_flops(g->ops[i], batch);
    return f;
}

/* ── --dump-ir ── */

static void dump_tensor(FILE *out, Tensor *t)
{
    fprintf(out, "%%%d:%s", t->id, tensor_type(t));
}

void ir_dump(FILE *out, Graph *g)
{
    Model *m = g->m;
    fprintf(out, "graph %s: %d ops (%d forward, %d backward), %d tensors\n", m->name, g->nops,
            g->nfwd, g->nops - g->nfwd, g->ntensors);
    fputs("\ntensors\n", out);
    static const char *const kinds[] = {"input", "act", "param", "pgrad", "agrad"};
    for (int i = 0; i < g->ntensors; i++) {
        Tensor *t = g->tensors[i];
        fprintf(out, "  ");
        dump_tensor(out, t);
        fprintf(out, "  %-5s %s%s", kinds[t->kind], t->name, t->saved ? "  (saved)" : "");
        if (t->recompute_of)
            fprintf(out, "  (recomputes %%%d)", t->recompute_of->id);
        fputc('\n', out);
    }
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        if (i == 0)
            fputs("\nforward\n", out);
        if (i == g->nfwd)
            fputs("\nbackward\n", out);
        fprintf(out, "  %4d ", i);
        for (int j = 0; j < op->nout; j++) {
            fprintf(out, "%s%%%d", j ? ", " : "", op->out[j]->id);
            if (op->acc[j])
                fputs("+", out);
        }
        fprintf(out, " = %s(", op_name(op->kind));
        for (int j = 0; j < op->nin; j++)
            fprintf(out, "%s%%%d", j ? ", " : "", op->in[j]->id);
        fputc(')', out);
        if (op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_BWD)
            fprintf(out, " heads=%" PRId64 " kv_heads=%" PRId64 " head_dim=%" PRId64 "%s",
                    op->heads, op->kv_heads, op->head_dim, op->causal ? " causal" : "");
        if (op->kind == OP_ROPE || op->kind == OP_ROPE_BWD)
            fprintf(out, " heads=%" PRId64 " head_dim=%" PRId64 " theta=%g", op->heads,
                    op->head_dim, op->theta);
        if (op->kind == OP_LAYERNORM || op->kind == OP_LAYERNORM_NOBIAS ||
            op->kind == OP_RMSNORM || op->kind == OP_ADD_LAYERNORM ||
            op->kind == OP_ADD_LAYERNORM_NOBIAS || op->kind == OP_ADD_RMSNORM)
            fprintf(out, " eps=%g", op->eps);
        if (op_norm_width(op) && op_norm_width(op) != op->in[0]->dim[op->in[0]->rank - 1])
            fprintf(out, " width=%" PRId64, op_norm_width(op));
        if (op->group >= 0)
            fprintf(out, "  [group %s]", m->groups[op->group]->name);
        if (op->recompute)
            fprintf(out, "  recompute");
        int line, col;
        loc_line_col(m->prog->src, op->loc.begin, &line, &col);
        fprintf(out, "  ; %s line %d\n", op->layer && op->layer->path[0] ? op->layer->path : m->name,
                line);
    }
    double model = graph_model_flops(g, 1), all = graph_flops(g, 0, g->nops, 1);
    fprintf(out, "\nflops per sample: forward %.6g, backward %.6g", graph_flops(g, 0, g->nfwd, 1),
            graph_flops(g, g->nfwd, g->nops, 1));
    if (all > model)
        fprintf(out, " (of which recompute ops %.6g)", all - model);
    fputc('\n', out);
}
