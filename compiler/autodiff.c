/*
 * autodiff.c — reverse-mode differentiation of the forward ops.
 *
 * Forward ops are visited last to first; each op's rule (named in ops.def)
 * appends the backward ops that turn its output gradients into input
 * gradients. A value read by several ops receives several contributions: the
 * first writes its gradient, later ones accumulate (+=). Parameter gradients
 * always accumulate, into buffers the step zeroes when it allocates them, so
 * tied weights (an Embedding and the Linear that shares it) and gradient
 * accumulation over micro-batches need no special case. Forward values that
 * backward ops read are marked saved: they are the activations the memory
 * plan must keep alive.
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

static void backward_of(AD *a, OpNode *f)
{
    Tensor *dy = a->grad[f->out[0]->id];
    if (!dy)
        return;   /* nothing downstream needs this op's output */
    OpNode *op;
    switch (f->kind) {
    case OP_EMBED:
        op = bwd_op(a, OP_EMBED_BWD, f);
        in(op, dy);
        in(op, f->in[1]);
        grad_out(a, op, f->in[0]);
        break;
    case OP_MATMUL:
    case OP_MATMUL_BIAS:   /* the bias's gradient: dy summed over rows */
        if (f->kind == OP_MATMUL_BIAS) {
            op = bwd_op(a, OP_BIAS_BWD, f);
            in(op, dy);
            grad_out(a, op, f->in[2]);
        }
        if (needs_grad(f->in[0])) {
            op = bwd_op(a, OP_MATMUL_DX, f);
            in(op, dy);
            in(op, f->in[1]);
            grad_out(a, op, f->in[0]);
        }
        op = bwd_op(a, OP_MATMUL_DW, f);
        in(op, dy);
        in(op, f->in[0]);
        grad_out(a, op, f->in[1]);
        break;
    case OP_LAYERNORM:
        op = bwd_op(a, OP_LAYERNORM_BWD, f);
        in(op, dy);
        in(op, f->in[0]);
        in(op, f->in[1]);
        in(op, f->out[1]);
        in(op, f->out[2]);
        grad_out(a, op, f->in[0]);
        grad_out(a, op, f->in[1]);
        grad_out(a, op, f->in[2]);
        break;
    case OP_RMSNORM:
        op = bwd_op(a, OP_RMSNORM_BWD, f);
        in(op, dy);
        in(op, f->in[0]);
        in(op, f->in[1]);
        in(op, f->out[1]);
        grad_out(a, op, f->in[0]);
        grad_out(a, op, f->in[1]);
        break;
    case OP_ROPE:
        op = bwd_op(a, OP_ROPE_BWD, f);
        in(op, dy);
        grad_out(a, op, f->in[0]);
        break;
    case OP_ATTENTION:
        op = bwd_op(a, OP_ATTENTION_BWD, f);
        in(op, dy);
        in(op, f->in[0]);
        in(op, f->in[1]);
        in(op, f->in[2]);
        in(op, f->out[0]);
        in(op, f->out[1]);
        grad_out(a, op, f->in[0]);
        grad_out(a, op, f->in[1]);
        grad_out(a, op, f->in[2]);
        break;
    case OP_GELU:
    case OP_RELU:
    case OP_SILU:
        op = bwd_op(a, f->kind == OP_GELU ? OP_GELU_BWD : f->kind == OP_RELU ? OP_RELU_BWD
                                                                             : OP_SILU_BWD, f);
        in(op, dy);
        in(op, f->in[0]);
        grad_out(a, op, f->in[0]);
        break;
    case OP_SWIGLU:
        op = bwd_op(a, OP_SWIGLU_BWD, f);
        in(op, dy);
        in(op, f->in[0]);
        in(op, f->in[1]);
        grad_out(a, op, f->in[0]);
        grad_out(a, op, f->in[1]);
        break;
    case OP_ADD:
        /* in[1] may broadcast over in[0]'s leading dimensions */
        if (f->in[1]->rank < f->in[0]->rank) {
            if (needs_grad(f->in[1])) {
                op = bwd_op(a, OP_REDUCE_TO, f);
                in(op, dy);
                grad_out(a, op, f->in[1]);
            }
        } else {
            route(a, f, f->in[1], dy);
        }
        route(a, f, f->in[0], dy);
        break;
    case OP_MUL:
        op = bwd_op(a, OP_MUL_BWD, f);
        in(op, dy);
        in(op, f->in[0]);
        in(op, f->in[1]);
        grad_out(a, op, f->in[0]);
        grad_out(a, op, f->in[1]);
        break;
    case OP_CROSS_ENTROPY:
        fsd_unreachable();   /* the loss is seeded in autodiff() */
    default:
        fsd_unreachable();
    }
}

void autodiff(Graph *g)
{
    /* Tensors created below get ids past ntensors; each forward op's rule
     * creates at most three gradients and two copies, the loss one. */
    size_t cap = (size_t)g->ntensors + 5 * (size_t)g->nfwd + 8;
    AD a = {g, arena_alloc(sizeof(Tensor *) * cap), arena_alloc(sizeof(Tensor *) * cap)};

    /* the loss: d loss / d logits directly, fused with the softmax */
    OpNode *ce = g->loss->producer;
    if (!ce || ce->kind != OP_CROSS_ENTROPY)
        fsd_unreachable();   /* sema ensures the loss comes from cross_entropy */
    OpNode *op = bwd_op(&a, OP_CROSS_ENTROPY_BWD, ce);
    in(op, ce->in[0]);
    in(op, ce->in[1]);
    in(op, ce->out[1]);
    grad_out(&a, op, ce->in[0]);

    for (int i = g->nfwd - 1; i >= 0; i--)
        if (g->ops[i] != ce)
            backward_of(&a, g->ops[i]);
}
