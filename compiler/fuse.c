/*
 * fuse.c — peephole fusion of forward ops, where the schedule makes it free.
 *
 * Runs after autodiff and before planning (main.c). It looks at each pair of
 * consecutive forward ops and merges two patterns into one op (issue #5:
 * "fused where the schedule makes it free"):
 *
 *   add(a, b) → s;  layernorm(s, w, bias) → y, mean, rstd
 *       ⇒  add_layernorm(a, b, w, bias) → s, y, mean, rstd
 *       (layernorm_nobias(s, w): add_layernorm_nobias(a, b, w), alike)
 *   add(a, b) → s;  rmsnorm(s, w) → y, rstd
 *       ⇒  add_rmsnorm(a, b, w) → s, y, rstd
 *   matmul_bias(x, W, b) → p;  gelu(p) → y
 *       ⇒  matmul_bias_gelu(x, W, b) → p, y
 *
 * The rules: the second op comes immediately after the first in forward
 * order and reads the first's output as its input 0; an add fuses only with
 * operands of the same shape (a broadcast add, the position embedding's, has
 * a row kernel of its own to keep). Nothing else moves: every tensor stays,
 * the residual sum s and the pre-activation p are still written (the
 * residual stream and gelu's backward read them), and backward ops are not
 * touched, so autodiff's graph, the saved set and the memory plan are those
 * of the unfused graph. What a fusion saves is a kernel launch and one read
 * of s (the norm normalises the sum it has just formed) or of p (cuBLASLt's
 * GELU epilogue applies gelu to the product before storing it).
 *
 * The fused op is the second op rewritten in place: it keeps the norm's (or
 * the product's) layer, .fsd location and shard group, and takes over the
 * first op's inputs and output; the first op leaves the graph and the ops
 * after it move up by one. `fsdpc --no-fuse` skips the pass.
 *
 * Recompute ops (recompute.c, which runs before this pass) are forward ops
 * run again in backward, a unit's in forward order: the same pairs among
 * consecutive recompute ops fuse the same way, so the recomputation
 * launches what forward launched.
 */
#include "fsdpc.h"

#include <string.h>

static bool same_shape(const Tensor *a, const Tensor *b)
{
    return a->rank == b->rank && memcmp(a->dim, b->dim, sizeof(a->dim[0]) * (size_t)a->rank) == 0;
}

/* The fused kind of first followed by second, or OP_COUNT for none. */
static OpKind fused_kind(const OpNode *first, const OpNode *second)
{
    if (second->nin == 0 || second->in[0] != first->out[0])
        return OP_COUNT;
    if (first->kind == OP_ADD && same_shape(first->in[0], first->in[1])) {
        if (second->kind == OP_LAYERNORM)
            return OP_ADD_LAYERNORM;
        if (second->kind == OP_LAYERNORM_NOBIAS)
            return OP_ADD_LAYERNORM_NOBIAS;
        if (second->kind == OP_RMSNORM)
            return OP_ADD_RMSNORM;
    }
    if (first->kind == OP_MATMUL_BIAS && second->kind == OP_GELU)
        return OP_MATMUL_BIAS_GELU;
    return OP_COUNT;
}

/* first's inputs then the norm's parameters; first's output then the norm's. */
static void fuse_add_norm(OpNode *add, OpNode *norm, OpKind kind)
{
    Tensor *in[6], *out[4];
    int nin = 0, nout = 0;
    in[nin++] = add->in[0];
    in[nin++] = add->in[1];
    for (int i = 1; i < norm->nin; i++)
        in[nin++] = norm->in[i];
    out[nout++] = add->out[0];
    for (int i = 0; i < norm->nout; i++)
        out[nout++] = norm->out[i];
    norm->kind = kind;
    norm->nin = norm->nout = 0;
    for (int i = 0; i < nin; i++)
        ir_in(norm, in[i]);
    for (int i = 0; i < nout; i++)
        ir_out(norm, out[i], false);
    add->out[0]->producer = norm;
}

/* The product keeps its inputs and output (the pre-activation) and takes
 * gelu's output as its second. */
static void fuse_bias_gelu(OpNode *mm, OpNode *gelu)
{
    mm->kind = OP_MATMUL_BIAS_GELU;
    ir_out(mm, gelu->out[0], false);
    gelu->out[0]->producer = mm;
}

/* Whether ops i and i + 1 may fuse: both forward ops, or both recompute ops. */
static bool neighbours(const Graph *g, int i)
{
    if (i + 1 >= g->nops)
        return false;
    return i + 1 < g->nfwd || (g->ops[i]->recompute && g->ops[i + 1]->recompute);
}

void fuse(Graph *g)
{
    int kept = 0, nfwd = g->nfwd;
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        OpKind kind = neighbours(g, i) ? fused_kind(op, g->ops[i + 1]) : OP_COUNT;
        bool fwd = i < g->nfwd;
        if (kind == OP_MATMUL_BIAS_GELU) {
            fuse_bias_gelu(op, g->ops[++i]);   /* gelu leaves the graph */
            nfwd -= fwd;
        } else if (kind != OP_COUNT) {
            op = g->ops[++i];                   /* the add leaves the graph */
            fuse_add_norm(g->ops[i - 1], op, kind);
            nfwd -= fwd;
        }
        op->index = kept;
        g->ops[kept++] = op;
    }
    g->nops = kept;
    g->nfwd = nfwd;
    g->fused = true;
}
