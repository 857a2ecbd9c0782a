/*
 * lower.c — the typed model becomes forward ops.
 *
 * The model's forward body is walked once per layer instance: a call of a
 * block runs the block type's forward with that instance's layers, an array
 * runs each element in sequence, and each built-in layer expands into the
 * primitive ops of ops.def (Attention: q, k, v matmuls, qk_norm's rmsnorm of
 * each head of q and k, rope, the attention core, the output matmul; MLP:
 * matmuls around gelu/relu, or swiglu). The
 * result is the forward half of the Graph, in execution order.
 */
#include "fsdpc.h"

#include <string.h>

typedef struct Env {
    const char *name;
    Tensor *t;
    struct Env *next;
} Env;

typedef struct Lower {
    Graph *g;
    Model *m;
    Layer *inst;    /* the instance whose forward is being lowered */
} Lower;

/* Every op lowering makes: its scope is its layer, or for a function or
 * an operator the instance whose forward it is written in (recompute.c
 * finds a unit's ops by it). */
static OpNode *new_op(Lower *L, OpKind k, Layer *ly, Loc loc)
{
    OpNode *op = ir_op(L->g, k, ly, loc);
    op->scope = ly ? ly : L->inst;
    return op;
}

static Tensor *act(Lower *L, const char *name, ValueDtype dt, int rank, const int64_t *dim)
{
    return ir_tensor(L->g, TK_ACT, name, dt, rank, dim);
}

/* A tensor shaped like x with its last dimension replaced by `last`
 * (`last` 0: dropped, for per-row statistics). */
static Tensor *act_like(Lower *L, const char *name, Tensor *x, int64_t last)
{
    int64_t dim[MAX_RANK];
    memcpy(dim, x->dim, sizeof dim);
    if (last)
        dim[x->rank - 1] = last;
    return act(L, name, DT_F32, last ? x->rank : x->rank - 1, dim);
}

static const char *tname(Layer *ly, const char *what)
{
    return ly && ly->path[0] ? arena_printf("%s.%s", ly->path, what) : what;
}

static Tensor *param(Lower *L, Param *p) { return L->g->param_t[p->index]; }

static OpNode *op_for(Lower *L, OpKind k, Layer *ly)
{
    return new_op(L, k, ly, ly ? ly->loc : (Loc){0, 0});
}

/* Linear: y = x·Wᵀ (+ b); a tied Linear reads its Embedding's weight. A
 * bias is added in the product itself (matmul_bias), so the unbiased x·Wᵀ
 * never exists as a tensor. The weight and bias share a group: explicit
 * groups keep a tied weight with its Linear (model.c), and auto buckets
 * keep every parameter one op reads together (plan.c). */
static Tensor *linear(Lower *L, Layer *ly, Tensor *x)
{
    Param *w = ly->tie ? ly->tie->weight : ly->weight;
    OpNode *op = op_for(L, ly->bias_p ? OP_MATMUL_BIAS : OP_MATMUL, ly);
    op->group = w->group;
    ir_in(op, x);
    ir_in(op, param(L, w));
    if (ly->bias_p)
        ir_in(op, param(L, ly->bias_p));
    Tensor *y = act_like(L, tname(ly, "out"), x, ly->out);
    ir_out(op, y, false);
    return y;
}

static Tensor *unary(Lower *L, OpKind k, Layer *ly, Loc loc, Tensor *x, const char *name)
{
    OpNode *op = new_op(L, k, ly, loc);
    ir_in(op, x);
    Tensor *y = act_like(L, name, x, x->dim[x->rank - 1]);
    ir_out(op, y, false);
    return y;
}

static Tensor *rope(Lower *L, Layer *ly, Tensor *x, int64_t heads, const char *name)
{
    OpNode *op = op_for(L, OP_ROPE, ly);
    op->heads = heads;
    op->head_dim = ly->dim / ly->heads;
    op->theta = ly->rope_theta;
    ir_in(op, x);
    Tensor *y = act_like(L, tname(ly, name), x, x->dim[x->rank - 1]);
    ir_out(op, y, false);
    return y;
}

/* LayerNorm (layernorm, or layernorm_nobias without a bias) or RMSNorm
 * over runs of the weight's length: x's rows, or each head of them for
 * qk_norm, whose statistics then have a last dimension of heads. */
static Tensor *norm(Lower *L, Layer *ly, Tensor *x)
{
    bool ln = ly->kind == LK_LAYERNORM;
    OpNode *op = op_for(L, !ln ? OP_RMSNORM : ly->bias_p ? OP_LAYERNORM : OP_LAYERNORM_NOBIAS, ly);
    op->eps = ly->eps;
    op->group = ly->weight->group;
    ir_in(op, x);
    ir_in(op, param(L, ly->weight));
    if (ly->bias_p)
        ir_in(op, param(L, ly->bias_p));
    int64_t last = x->dim[x->rank - 1], runs = last / ly->weight->shape[0];
    ir_out(op, act_like(L, tname(ly, "out"), x, last), false);
    if (ln)
        ir_out(op, ir_stat(act_like(L, tname(ly, "mean"), x, runs > 1 ? runs : 0)), false);
    ir_out(op, ir_stat(act_like(L, tname(ly, "rstd"), x, runs > 1 ? runs : 0)), false);
    return op->out[0];
}

static Tensor *attention(Lower *L, Layer *ly, Tensor *x)
{
    Layer *q = ly->children[0], *k = ly->children[1], *v = ly->children[2], *o = ly->children[3];
    Tensor *tq = linear(L, q, x), *tk = linear(L, k, x), *tv = linear(L, v, x);
    if (ly->qk_norm) {   /* each head of q and k, before rope (Qwen3) */
        tq = norm(L, ly->children[4], tq);
        tk = norm(L, ly->children[5], tk);
    }
    if (ly->rope_theta > 0) {
        tq = rope(L, ly, tq, ly->heads, "q_rope");
        tk = rope(L, ly, tk, ly->kv_heads, "k_rope");
    }
    OpNode *op = op_for(L, OP_ATTENTION, ly);
    op->heads = ly->heads;
    op->kv_heads = ly->kv_heads;
    op->head_dim = ly->dim / ly->heads;
    op->causal = ly->causal;
    ir_in(op, tq);
    ir_in(op, tk);
    ir_in(op, tv);
    ir_out(op, act_like(L, tname(ly, "attn"), tq, tq->dim[tq->rank - 1]), false);
    int64_t lse_dim[3] = {x->dim[0], ly->heads, x->dim[1]};   /* [B, H, T] */
    ir_out(op, ir_stat(act(L, tname(ly, "lse"), DT_F32, 3, lse_dim)), false);
    return linear(L, o, op->out[0]);
}

static Tensor *mlp(Lower *L, Layer *ly, Tensor *x)
{
    if (ly->act == ACT_SWIGLU) {
        Tensor *g = linear(L, ly->children[0], x), *u = linear(L, ly->children[1], x);
        OpNode *op = op_for(L, OP_SWIGLU, ly);
        ir_in(op, g);
        ir_in(op, u);
        Tensor *h = act_like(L, tname(ly, "swiglu"), g, g->dim[g->rank - 1]);
        ir_out(op, h, false);
        return linear(L, ly->children[2], h);
    }
    Tensor *h = linear(L, ly->children[0], x);
    h = unary(L, ly->act == ACT_GELU ? OP_GELU : OP_RELU, ly, ly->loc, h,
              tname(ly, ly->act == ACT_GELU ? "gelu" : "relu"));
    return linear(L, ly->children[1], h);
}

static Tensor *run_forward(Lower *L, Layer *inst, Tensor **args, int nargs);

static Layer *child_for(Layer *inst, Decl *d)
{
    for (int i = 0; i < inst->nchildren; i++)
        if (inst->children[i]->decl == d)
            return inst->children[i];
    fsd_unreachable();
}

static Tensor *apply(Lower *L, Layer *ly, Tensor **args, int nargs)
{
    switch (ly->kind) {
    case LK_LINEAR: return linear(L, ly, args[0]);
    case LK_EMBEDDING: {
        OpNode *op = op_for(L, OP_EMBED, ly);
        op->group = ly->weight->group;
        ir_in(op, param(L, ly->weight));
        ir_in(op, args[0]);
        int64_t dim[MAX_RANK];
        memcpy(dim, args[0]->dim, sizeof dim);
        dim[args[0]->rank] = ly->dim;
        Tensor *y = act(L, tname(ly, "out"), DT_F32, args[0]->rank + 1, dim);
        ir_out(op, y, false);
        return y;
    }
    case LK_LAYERNORM:
    case LK_RMSNORM: return norm(L, ly, args[0]);
    case LK_ATTENTION: return attention(L, ly, args[0]);
    case LK_MLP: return mlp(L, ly, args[0]);
    case LK_BLOCK: return run_forward(L, ly, args, nargs);
    case LK_ARRAY: {
        Tensor *x = args[0];
        for (int i = 0; i < ly->nchildren; i++)
            x = run_forward(L, ly->children[i], &x, 1);
        return x;
    }
    }
    fsd_unreachable();
}

static Tensor *lookup_env(Env *env, const char *name)
{
    for (; env; env = env->next)
        if (strcmp(env->name, name) == 0)
            return env->t;
    return NULL;
}

static Tensor *lower_expr(Lower *L, Layer *inst, Env *env, Expr *e)
{
    switch (e->kind) {
    case EX_IDENT: {
        Tensor *t = lookup_env(env, e->str);
        if (t)
            return t;
        if (strcmp(e->str, "positions") == 0)
            return L->g->positions;
        fsd_unreachable();   /* sema resolved every name */
    }
    case EX_CALL: {
        Tensor *args[8];
        int n = 0;
        for (Arg *a = e->args; a; a = a->next)
            args[n++] = lower_expr(L, inst, env, a->value);
        if (e->ref_decl)
            return apply(L, child_for(inst, e->ref_decl), args, n);
        switch ((BuiltinFn)(e->builtin - 1)) {
        case FN_GELU: return unary(L, OP_GELU, NULL, e->loc, args[0], tname(inst, "gelu"));
        case FN_RELU: return unary(L, OP_RELU, NULL, e->loc, args[0], tname(inst, "relu"));
        case FN_SILU: return unary(L, OP_SILU, NULL, e->loc, args[0], tname(inst, "silu"));
        case FN_CROSS_ENTROPY: {
            OpNode *op = new_op(L, OP_CROSS_ENTROPY, NULL, e->loc);
            ir_in(op, args[0]);
            ir_in(op, args[1]);
            ir_out(op, ir_stat(act(L, "loss", DT_F32, 0, NULL)), false);
            ir_out(op, ir_stat(act_like(L, "logits.lse", args[0], 0)), false);
            return op->out[0];
        }
        case FN_COUNT: break;
        }
        fsd_unreachable();
    }
    case EX_BINOP: {
        Tensor *a = lower_expr(L, inst, env, e->lhs), *b = lower_expr(L, inst, env, e->rhs);
        OpNode *op = new_op(L, e->op == '+' ? OP_ADD : OP_MUL, NULL, e->loc);
        /* the larger operand first: b broadcasts over a's leading dims */
        if (b->rank > a->rank) {
            Tensor *t = a;
            a = b;
            b = t;
        }
        ir_in(op, a);
        ir_in(op, b);
        ir_out(op, act_like(L, tname(inst, e->op == '+' ? "add" : "mul"), a,
                            a->dim[a->rank - 1]),
               false);
        return op->out[0];
    }
    default:
        fsd_unreachable();
    }
}

static Tensor *run_forward(Lower *L, Layer *inst, Tensor **args, int nargs)
{
    Decl *fw = inst->mtype->forward;
    Layer *outer = L->inst;
    L->inst = inst;
    Env *env = NULL;
    int i = 0;
    for (Name *n = fw->params; n && i < nargs; n = n->next, i++) {
        Env *e = arena_alloc(sizeof *e);
        *e = (Env){n->name, args[i], env};
        env = e;
    }
    for (Stmt *st = fw->body; st; st = st->next) {
        Tensor *t = lower_expr(L, inst, env, st->value);
        if (st->kind == ST_RETURN) {
            L->inst = outer;
            return t;
        }
        Env *e = arena_alloc(sizeof *e);
        *e = (Env){st->name, t, env};
        env = e;
    }
    fsd_unreachable();
}

Graph *lower_model(Model *m)
{
    Graph *g = arena_alloc(sizeof *g);
    g->m = m;
    Lower L = {g, m, m->root};
    g->param_t = arena_alloc(sizeof(Tensor *) * (size_t)(m->nparams + 1));
    g->pgrad_t = arena_alloc(sizeof(Tensor *) * (size_t)(m->nparams + 1));
    for (int i = 0; i < m->nparams; i++) {
        Param *p = m->params[i];
        g->param_t[i] = ir_tensor(g, TK_PARAM, p->name, DT_F32, p->rank, p->shape);
        g->param_t[i]->param = p;
    }
    int64_t tok[2] = {DIM_BATCH, m->seq};
    g->idx = ir_tensor(g, TK_INPUT, "idx", DT_I32, 2, tok);
    g->targets = ir_tensor(g, TK_INPUT, "targets", DT_I32, 2, tok);
    g->positions = ir_tensor(g, TK_INPUT, "positions", DT_I32, 1, &m->seq);
    Tensor *args[2] = {g->idx, g->targets};
    g->loss = run_forward(&L, m->root, args, 2);
    g->nfwd = g->nops;
    return g;
}
