/*
 * autodiff.c — reverse-mode differentiation of the forward ops.
 *
 * Forward ops are visited last to first; each op's rule (named in ops.def,
 * spelled as rows of the table `rules` below) appends the backward ops that
 * turn its output gradients into input gradients. A value read by several
 * ops receives several contributions: the first writes its gradient, later
 * ones accumulate (+=). Parameter gradients always accumulate, into buffers
 * the step zeroes when it allocates them, so tied weights (an Embedding and
 * the Linear that shares it) and gradient accumulation over micro-batches
 * need no special case. Forward values that backward ops read are marked
 * saved: they are the activations the memory plan must keep alive.
 *
 * Gradients flowing unchanged through an op (the residual add) are passed
 * on by reference instead of copied when the buffer's current holder is the
 * op's own output, whose gradient is dead once its producer's rule ran. A
 * buffer already handed to another live value (the residual add's other
 * operand) is copied instead: two live values sharing one gradient buffer
 * would see each other's accumulations.
 */
#include "fsdpc.h"

#include <string.h>

typedef struct AD {
    Graph *g;
    Tensor **grad;     /* by tensor id: its gradient, or NULL */
    Tensor **holder;   /* by gradient tensor id: the value whose gradient it is */
} AD;

static bool needs_grad(Tensor *t) { return t->kind == TK_ACT || t->kind == TK_PARAM; }

/* The tensor a contribution to x's gradient goes into, and whether that
 * contribution accumulates. */
static Tensor *grad_slot(AD *a, Tensor *x, bool *acc)
{
    Graph *g = a->g;
    if (x->kind == TK_PARAM) {
        Param *p = x->param;
        if (!g->pgrad_t[p->index]) {
            g->pgrad_t[p->index] = ir_tensor(g, TK_PGRAD, arena_printf("d.%s", p->name), DT_F32,
                                             x->rank, x->dim);
            g->pgrad_t[p->index]->param = p;
        }
        a->grad[x->id] = g->pgrad_t[p->index];
        *acc = true;
        return a->grad[x->id];
    }
    if (a->grad[x->id]) {
        *acc = true;
        return a->grad[x->id];
    }
    Tensor *d = ir_tensor(g, TK_AGRAD, arena_printf("d.%s", x->name), DT_F32, x->rank, x->dim);
    a->grad[x->id] = d;
    a->holder[d->id] = x;
    *acc = false;
    return d;
}

static OpNode *bwd_op(AD *a, OpKind k, OpNode *fwd)
{
    OpNode *op = ir_op(a->g, k, fwd->layer, fwd->loc);
    op->scope = fwd->scope;
    op->backward = true;
    op->group = fwd->group;
    op->heads = fwd->heads;
    op->kv_heads = fwd->kv_heads;
    op->head_dim = fwd->head_dim;
    op->eps = fwd->eps;
    op->theta = fwd->theta;
    op->causal = fwd->causal;
    return op;
}

/* An input of a backward op; forward activations it reads are saved. */
static void in(OpNode *op, Tensor *t)
{
    if (t->kind == TK_ACT)
        t->saved = true;
    ir_in(op, t);
}

/* Writes x's gradient as output of op; NULL x (no gradient needed) gets a
 * scratch tensor nobody reads, so the op's outputs keep their arity. */
static void grad_out(AD *a, OpNode *op, Tensor *x)
{
    bool acc;
    if (!needs_grad(x)) {
        Tensor *d = ir_tensor(a->g, TK_AGRAD, arena_printf("d.%s.unused", x->name), DT_F32,
                              x->rank, x->dim);
        ir_out(op, d, false);
        return;
    }
    Tensor *d = grad_slot(a, x, &acc);
    ir_out(op, d, acc);
}

/* x's gradient is dy itself (dy being the gradient of fwd's output): pass
 * it by reference when possible. */
static void route(AD *a, OpNode *fwd, Tensor *x, Tensor *dy)
{
    if (!needs_grad(x))
        return;
    if (x->kind == TK_ACT && !a->grad[x->id] && a->holder[dy->id] == fwd->out[0]) {
        a->grad[x->id] = dy;
        a->holder[dy->id] = x;
        return;
    }
    OpNode *op = bwd_op(a, OP_COPY, fwd);
    op->group = -1;
    in(op, dy);
    grad_out(a, op, x);
}

/* ── the rules ──
 * Each row is one backward op of a forward op's rule, in the order they are
 * appended: what it reads and whose gradients it writes. Operands name the
 * forward op's inputs (X0..X2), its outputs (Y0..Y2) and dy, the gradient of
 * its output 0. A row lists op_arity(bwd) reads and op_outputs(bwd) grads, as
 * ops.def counts them. Whether a gradient write accumulates is not the
 * table's to say: it depends on the writes before it (grad_slot). */
enum { DY = 1, X0, X1, X2, Y0, Y1, Y2 };

typedef struct Rule {
    OpKind fwd, bwd;
    unsigned char reads[6];
    unsigned char grads[3];   /* forward inputs whose gradients it writes */
    bool if_needed;           /* left out when grads[0] needs no gradient */
} Rule;

static const Rule rules[] = {
    /* forward          backward              reads                        grads */
    {OP_EMBED,          OP_EMBED_BWD,         {DY, X1},                    {X0}},
    {OP_MATMUL,         OP_MATMUL_DX,         {DY, X1},                    {X0}, true},
    {OP_MATMUL,         OP_MATMUL_DW,         {DY, X0},                    {X1}},
    /* the bias's gradient: dy summed over rows; then matmul's rule */
    {OP_MATMUL_BIAS,    OP_BIAS_BWD,          {DY},                        {X2}},
    {OP_MATMUL_BIAS,    OP_MATMUL_DX,         {DY, X1},                    {X0}, true},
    {OP_MATMUL_BIAS,    OP_MATMUL_DW,         {DY, X0},                    {X1}},
    {OP_LAYERNORM,      OP_LAYERNORM_BWD,     {DY, X0, X1, Y1, Y2},        {X0, X1, X2}},
    {OP_LAYERNORM_NOBIAS, OP_LAYERNORM_NOBIAS_BWD, {DY, X0, X1, Y1, Y2},       {X0, X1}},
    {OP_RMSNORM,        OP_RMSNORM_BWD,       {DY, X0, X1, Y1},            {X0, X1}},
    {OP_ROPE,           OP_ROPE_BWD,          {DY},                        {X0}},
    {OP_ATTENTION,      OP_ATTENTION_BWD,     {DY, X0, X1, X2, Y0, Y1},    {X0, X1, X2}},
    {OP_GELU,           OP_GELU_BWD,          {DY, X0},                    {X0}},
    {OP_RELU,           OP_RELU_BWD,          {DY, X0},                    {X0}},
    {OP_SILU,           OP_SILU_BWD,          {DY, X0},                    {X0}},
    {OP_SWIGLU,         OP_SWIGLU_BWD,        {DY, X0, X1},                {X0, X1}},
    {OP_MUL,            OP_MUL_BWD,           {DY, X0, X1},                {X0, X1}},
    /* the loss's seed, d loss / d logits directly, fused with the softmax:
     * applied by autodiff() with no dy */
    {OP_CROSS_ENTROPY,  OP_CROSS_ENTROPY_BWD, {X0, X1, Y1},                {X0}},
};

static Tensor *operand(OpNode *f, Tensor *dy, int ref)
{
    if (ref == DY && dy)
        return dy;
    if (ref >= X0 && ref <= X2 && ref - X0 < f->nin)
        return f->in[ref - X0];
    if (ref >= Y0 && ref <= Y2 && ref - Y0 < f->nout)
        return f->out[ref - Y0];
    fsd_unreachable();   /* a row reads what its forward op does not have */
}

/* Appends the backward ops of f's rows; dy is NULL for the loss only. */
static void apply_rule(AD *a, OpNode *f, Tensor *dy)
{
    bool found = false;
    for (size_t r = 0; r < sizeof rules / sizeof rules[0]; r++) {
        const Rule *ru = &rules[r];
        if (ru->fwd != f->kind)
            continue;
        found = true;
        if (ru->if_needed && !needs_grad(operand(f, dy, ru->grads[0])))
            continue;
        OpNode *op = bwd_op(a, ru->bwd, f);
        for (int i = 0; i < op_arity(ru->bwd); i++)
            in(op, operand(f, dy, ru->reads[i]));
        for (int i = 0; i < op_outputs(ru->bwd); i++)
            grad_out(a, op, operand(f, dy, ru->grads[i]));
    }
    if (!found)
        fsd_unreachable();   /* an op of ops.def with a rule but no rows */
}

static void backward_of(AD *a, OpNode *f)
{
    Tensor *dy = a->grad[f->out[0]->id];
    if (!dy)
        return;   /* nothing downstream needs this op's output */
    switch (f->kind) {
    case OP_ADD:
        /* Not a table rule: its gradient is dy itself, passed on by
         * reference or copied depending on who holds the buffer (route).
         * in[1] may broadcast over in[0]'s leading dimensions. */
        if (f->in[1]->rank < f->in[0]->rank) {
            if (needs_grad(f->in[1])) {
                OpNode *op = bwd_op(a, OP_REDUCE_TO, f);
                in(op, dy);
                grad_out(a, op, f->in[1]);
            }
        } else {
            route(a, f, f->in[1], dy);
        }
        route(a, f, f->in[0], dy);
        break;
    case OP_CROSS_ENTROPY:
        fsd_unreachable();   /* the loss is seeded in autodiff() */
    default:
        apply_rule(a, f, dy);
        break;
    }
}

void autodiff(Graph *g)
{
    /* Tensors created below get ids past ntensors; each forward op's rule
     * creates at most three gradients and two copies, the loss one. */
    size_t cap = (size_t)g->ntensors + 5 * (size_t)g->nfwd + 8;
    AD a = {g, arena_alloc(sizeof(Tensor *) * cap), arena_alloc(sizeof(Tensor *) * cap)};

    /* the loss: its gradient is seeded, not received, so its rule has no dy */
    OpNode *ce = g->loss->producer;
    if (!ce || ce->kind != OP_CROSS_ENTROPY)
        fsd_unreachable();   /* sema ensures the loss comes from cross_entropy */
    apply_rule(&a, ce, NULL);

    for (int i = g->nfwd - 1; i >= 0; i--)
        if (g->ops[i] != ce)
            backward_of(&a, g->ops[i]);
}
