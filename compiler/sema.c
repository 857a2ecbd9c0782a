/*
 * sema.c — semantic analysis: the AST becomes a checked model.
 *
 * In order:
 *   1. sections: one model, at most one shard and one train section;
 *   2. declarations: names resolved per scope (a block sees its own members,
 *      the model's constants and the block types), constants folded,
 *      layer arguments bound and checked, block types checked for cycles;
 *   3. forward bodies: every value gets a shape and dtype, from the model's
 *      forward(idx, targets) down through each block type it calls.
 * Names, constants and arguments are evaluated by eval.c. The layer tree,
 * the shard groups and the settings are the next pass's (model_build in
 * model.c), which main runs on the Model this returns.
 * Errors are collected; sema goes on after each one where it can, so a run
 * reports several, and returns NULL if there were any.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep a hostile input from exhausting memory. */
enum { MAX_LAYER_INSTANCES = 200000, MAX_ARRAY = 100000 };
#define MAX_NUMEL ((int64_t)1 << 53)

/* The checker's state: the sections found, the module types made, and the
 * cross_entropy that fixed the vocabulary. */
typedef struct Sema {
    Diag *d;
    Program *prog;
    Model *m;
    Section *model_sec, *shard_sec, *train_sec;
    ModuleType *root_type;
    Loc vocab_loc;        /* the cross_entropy that set Model.vocab */
} Sema;

/* ── small helpers ── */

static const char *const layer_names[] = {
#define LAYER(e, name) name,
#include "layers.def"
    "block", "array",
};

const char *layer_kind_name(LayerKind k) { return layer_names[k]; }

static const struct {
    const char *name;
    int arity;
} builtin_fns[] = {
#define FUNC(e, name, arity) {name, arity},
#include "layers.def"
};

const char *builtin_fn_name(BuiltinFn f) { return builtin_fns[f].name; }

static const char *const dtype_names[] = {
#define X(e, name, bytes) name,
    DTYPE_LIST(X)
#undef X
};
static const int dtype_sizes[] = {
#define X(e, name, bytes) bytes,
    DTYPE_LIST(X)
#undef X
};

const char *dtype_name(DType t) { return dtype_names[t]; }
int dtype_bytes(DType t) { return dtype_sizes[t]; }

/* ── built-in layer signatures ──
 * Each built-in layer's arguments, with their types and which are required;
 * eval_bind_args matches a declaration's call against them. */

static const char *const act_choices[] = {"gelu", "relu", "swiglu", NULL};

static const Signature layer_sigs[] = {
    [LK_LINEAR] = {"Linear", {{"in", A_INT, true}, {"out", A_INT, true}, {"bias", A_BOOL},
                              {"tie", A_LAYER}, {"init", A_INIT}}},
    [LK_EMBEDDING] = {"Embedding", {{"n", A_INT, true}, {"dim", A_INT, true}, {"init", A_INIT}}},
    [LK_LAYERNORM] = {"LayerNorm", {{"dim", A_INT, true}, {"eps", A_FLOAT}, {"bias", A_BOOL}}},
    [LK_RMSNORM] = {"RMSNorm", {{"dim", A_INT, true}, {"eps", A_FLOAT}}},
    [LK_ATTENTION] = {"Attention", {{"dim", A_INT, true}, {"heads", A_INT, true},
                                    {"kv_heads", A_INT}, {"causal", A_BOOL}, {"rope", A_ROPE},
                                    {"bias", A_BIAS}, {"qk_norm", A_QK_NORM}, {"init", A_INIT},
                                    {"out_init", A_INIT}}},
    [LK_MLP] = {"MLP", {{"dim", A_INT, true}, {"hidden", A_INT, true},
                        {"act", A_ENUM, false, act_choices}, {"bias", A_BOOL}, {"init", A_INIT},
                        {"out_init", A_INIT}}},
};

static const Signature sig_rope = {"rope", {{"theta", A_FLOAT}}};
static const Signature sig_normal = {"normal", {{"std", A_FLOAT, true}}};
static const Signature sig_rms = {"rms", {{"eps", A_FLOAT}}};

/* ── declarations ── */

static ModuleType *new_type(Sema *s, const char *name, Loc loc, Decl *decl, Decl *members)
{
    ModuleType *t = arena_alloc(sizeof *t);
    t->name = name;
    t->loc = loc;
    t->decl = decl;
    t->members = members;
    Model *m = s->m;
    ModuleType **types = arena_alloc(sizeof(ModuleType *) * (size_t)(m->ntypes + 1));
    if (m->ntypes)
        memcpy(types, m->types, sizeof(ModuleType *) * (size_t)m->ntypes);
    types[m->ntypes++] = t;
    m->types = types;
    return t;
}

/* Each name once per scope; one forward per module. Builds the type's
 * member index, where the first declaration of a name is the one found. */
static void check_duplicates(Sema *s, Decl *decls, ModuleType *t)
{
    uint32_t n = 0, cap = 16;
    for (Decl *d = decls; d; d = d->next)
        n++;
    while (cap < 2 * n)
        cap *= 2;
    t->index = arena_alloc(sizeof(Decl *) * cap);
    t->index_mask = cap - 1;
    for (Decl *d = decls; d; d = d->next) {
        if (d->kind == DECL_FORWARD) {
            if (t->forward)
                diag_error(s->d, d->loc, "`%s` already has a forward at %s", t->name,
                           diag_where(s->d, t->forward->loc));
            else
                t->forward = d;
            continue;
        }
        Decl **slot = eval_index_slot(t, d->name);
        if (*slot)
            diag_error(s->d, d->name_loc, "`%s` is already defined at %s", d->name,
                       diag_where(s->d, (*slot)->name_loc));
        else
            *slot = d;
    }
}

static int64_t positive_arg(Sema *s, Scope *sc, Arg *a, const Signature *sig, int i, bool *ok)
{
    int64_t v = 0;
    if (a && !eval_int(s->d, sc, a->value, arena_printf("`%s` argument `%s`", sig->name,
                                                        sig->args[i].name), 1, &v))
        *ok = false;
    if (v > MAX_NUMEL) {
        diag_error(s->d, a->value->loc, "`%s` argument `%s` is too large (%" PRId64 ")",
                   sig->name, sig->args[i].name, v);
        *ok = false;
    }
    return v;
}

/* tie = NAME: the Embedding declared beside this Linear whose weight it
 * shares; its kind and shape are checked once every layer is (check_ties). */
static bool check_tie_arg(Sema *s, Scope *sc, DeclInfo *di, Expr *t)
{
    Diag *D = s->d;
    bool outer;
    Decl *td = t->kind == EX_IDENT ? eval_lookup(sc, t->str, &outer) : NULL;
    if (t->kind != EX_IDENT) {
        diag_error(D, t->loc, "`tie` names an Embedding layer declared beside this one");
        return false;
    }
    if (!td && sc->self && strcmp(t->str, sc->self->name) == 0) {
        diag_error(D, t->loc, "`%s` cannot tie its weight to itself; `tie` names an Embedding "
                              "declared beside it",
                   t->str);
        return false;
    }
    if (!td || (td->kind == DECL_LAYER && outer)) {
        diag_error(D, t->loc, "`tie = %s`: no layer `%s` in this %s%s", t->str, t->str,
                   sc->mt->decl ? "block" : "model",
                   diag_suggest(t->str, eval_scope_names(sc)));
        return false;
    }
    if (td->kind != DECL_LAYER) {
        diag_error(D, t->loc, "`tie = %s`: `%s` is %s (declared at %s), not an "
                              "Embedding layer",
                   t->str, t->str, eval_decl_what(td), diag_where(D, td->name_loc));
        return false;
    }
    di->tie_decl = td;
    di->tie_loc = t->loc;
    return true;
}

/* init = normal(std = X), argument i of sig: the weights' initial values
 * are normal(0, X) (docs/design.md#initialisation); X is a constant
 * expression, as 0.02 / sqrt(2 * layers). Clears *ok on an error. */
static void check_init_arg(Sema *s, Scope *sc, const Signature *sig, int i, Arg *a, double *std,
                           bool *ok)
{
    Diag *D = s->d;
    Expr *e = a->value;
    Arg *nb[MAX_ARGS];
    if (e->kind != EX_CALL || e->lhs->kind != EX_IDENT || strcmp(e->lhs->str, "normal") != 0) {
        diag_error(D, e->loc, "`%s` argument `%s` must be `normal(std = ...)`", sig->name,
                   sig->args[i].name);
        *ok = false;
    } else if (!eval_bind_args(D, &sig_normal, e->loc, e->args, nb) ||
               !eval_float(D, sc, nb[0]->value, "`normal` argument `std`", std)) {
        *ok = false;
    } else if (!(*std > 0)) {
        diag_error(D, nb[0]->value->loc, "`normal` argument `std` must be positive, got %g", *std);
        *ok = false;
    }
}

/* NAME = Linear(in, out, bias = true, tie = EMBEDDING, init = normal(std = 0.02)) */
static bool check_linear(Sema *s, Scope *sc, DeclInfo *di, const Signature *sig, Arg **b)
{
    Layer *L = &di->tpl;
    bool ok = true;
    L->in = positive_arg(s, sc, b[0], sig, 0, &ok);
    L->out = positive_arg(s, sc, b[1], sig, 1, &ok);
    if (b[2])
        ok &= eval_bool(s->d, sc, b[2]->value, "`Linear` argument `bias`", &L->bias);
    if (b[3])
        ok &= check_tie_arg(s, sc, di, b[3]->value);
    if (b[4] && b[3]) {
        diag_error(s->d, b[4]->loc, "a tied Linear has no weight of its own to initialise; "
                                    "`init` goes on the Embedding (`%s`)",
                   b[3]->value->kind == EX_IDENT ? b[3]->value->str : "tie");
        ok = false;
    } else if (b[4]) {
        check_init_arg(s, sc, sig, 4, b[4], &L->init_std, &ok);
    }
    return ok;
}

/* NAME = Embedding(n, dim, init = normal(std = 0.02)) */
static bool check_embedding(Sema *s, Scope *sc, Layer *L, const Signature *sig, Arg **b)
{
    bool ok = true;
    L->n = positive_arg(s, sc, b[0], sig, 0, &ok);
    L->dim = positive_arg(s, sc, b[1], sig, 1, &ok);
    if (b[2])
        check_init_arg(s, sc, sig, 2, b[2], &L->init_std, &ok);
    return ok;
}

/* NAME = LayerNorm(dim, eps = 1e-5, bias = true) | RMSNorm(dim, eps = 1e-6) */
static bool check_norm(Sema *s, Scope *sc, Layer *L, const Signature *sig, Arg **b)
{
    bool ok = true;
    L->dim = positive_arg(s, sc, b[0], sig, 0, &ok);
    L->eps = L->kind == LK_LAYERNORM ? 1e-5 : 1e-6;
    if (b[1]) {
        ok &= eval_float(s->d, sc, b[1]->value, arena_printf("`%s` argument `eps`", sig->name),
                         &L->eps);
        if (ok && !(L->eps > 0)) {
            diag_error(s->d, b[1]->value->loc, "`%s` argument `eps` must be positive, got %g",
                       sig->name, L->eps);
            ok = false;
        }
    }
    if (L->kind == LK_LAYERNORM && b[2])
        ok &= eval_bool(s->d, sc, b[2]->value, "`LayerNorm` argument `bias`", &L->bias);
    return ok;
}

/* rope = none | rope(theta = 10000). Like positive_arg, it clears *ok on
 * an error, and checks theta's sign only while *ok holds. */
static void check_rope_arg(Sema *s, Scope *sc, Layer *L, Expr *r, bool *ok)
{
    if (r->kind == EX_IDENT && strcmp(r->str, "none") == 0) {
        L->rope_theta = 0;
    } else if (r->kind == EX_CALL && r->lhs->kind == EX_IDENT &&
               strcmp(r->lhs->str, "rope") == 0) {
        Arg *rb[MAX_ARGS];
        L->rope_theta = 10000;
        if (!eval_bind_args(s->d, &sig_rope, r->loc, r->args, rb))
            *ok = false;
        else if (rb[0]) {
            *ok &= eval_float(s->d, sc, rb[0]->value, "`rope` argument `theta`",
                              &L->rope_theta);
            if (*ok && !(L->rope_theta > 0)) {
                diag_error(s->d, rb[0]->value->loc, "rope `theta` must be positive");
                *ok = false;
            }
        }
    } else {
        diag_error(s->d, r->loc, "`rope` must be `none` or `rope(theta = ...)`");
        *ok = false;
    }
}

/* Heads split dim evenly, kv_heads split heads, and rope turns pairs of a
 * head's dimensions. */
static bool check_heads(Sema *s, Layer *L, Expr *call, Arg *rope)
{
    Diag *D = s->d;
    if (L->dim % L->heads) {
        diag_error(D, call->loc, "dim %" PRId64 " is not divisible by heads %" PRId64,
                   L->dim, L->heads);
        return false;
    }
    if (L->heads % L->kv_heads) {
        diag_error(D, call->loc, "heads %" PRId64 " is not divisible by kv_heads %" PRId64,
                   L->heads, L->kv_heads);
        return false;
    }
    if (L->rope_theta > 0 && (L->dim / L->heads) % 2) {
        diag_error(D, rope->value->loc,
                   "rope needs an even head dim; dim %" PRId64 " / heads %" PRId64
                   " = %" PRId64,
                   L->dim, L->heads, L->dim / L->heads);
        return false;
    }
    return true;
}

/* init = ..., out_init = ... of an Attention or an MLP: out_init is init's
 * unless given */
static void check_inits(Sema *s, Scope *sc, Layer *L, const Signature *sig, Arg *init, int i,
                        Arg *out_init, bool *ok)
{
    if (init)
        check_init_arg(s, sc, sig, i, init, &L->init_std, ok);
    L->out_init_std = L->init_std;
    if (out_init)
        check_init_arg(s, sc, sig, i + 1, out_init, &L->out_init_std, ok);
}

/* Attention's bias = true | false | qkv: every Linear has a bias, none
 * does, or q, k and v do and o does not (Qwen2's). Clears *ok on an error. */
static void check_attention_bias(Sema *s, Scope *sc, Layer *L, Expr *e, bool *ok)
{
    static const char *const names[] = {"true", "false", "qkv", NULL};
    bool outer;
    if (e->kind == EX_IDENT && strcmp(e->str, "qkv") == 0 && !eval_lookup(sc, e->str, &outer)) {
        L->bias = true;
        L->out_bias = false;
        return;
    }
    if (e->kind == EX_IDENT && !eval_lookup(sc, e->str, &outer)) {
        diag_error(s->d, e->loc, "`Attention` argument `bias` must be `true`, `false` or `qkv` "
                                 "(q, k and v only), not `%s`%s",
                   e->str, diag_suggest(e->str, names));
        *ok = false;
        return;
    }
    Value v;
    if (!eval_fold(s->d, sc, e, &v)) {
        *ok = false;
    } else if (v.kind != V_BOOL) {
        diag_error(s->d, e->loc, "`Attention` argument `bias` must be `true`, `false` or `qkv` "
                                 "(q, k and v only), got %s",
                   eval_value_desc(&v));
        *ok = false;
    } else {
        L->bias = L->out_bias = v.i != 0;
    }
}

/* qk_norm = none | rms | rms(eps = 1e-6): an RMSNorm of each head of q and
 * of k, after their Linears and before rope, with one weight of head_dim
 * shared by the heads (q_norm, k_norm: Qwen3's per-head form; OLMo 2
 * normalises the whole projection instead). Clears *ok on an error. */
static void check_qk_norm_arg(Sema *s, Scope *sc, Layer *L, Expr *e, bool *ok)
{
    static const char *const names[] = {"none", "rms", NULL};
    L->eps = 1e-6;   /* RMSNorm's default, and Qwen3's rms_norm_eps */
    if (e->kind == EX_IDENT && strcmp(e->str, "none") == 0) {
        L->qk_norm = false;
    } else if (e->kind == EX_IDENT && strcmp(e->str, "rms") == 0) {
        L->qk_norm = true;
    } else if (e->kind == EX_CALL && e->lhs->kind == EX_IDENT && strcmp(e->lhs->str, "rms") == 0) {
        Arg *rb[MAX_ARGS];
        L->qk_norm = true;
        if (!eval_bind_args(s->d, &sig_rms, e->loc, e->args, rb)) {
            *ok = false;
        } else if (rb[0]) {
            *ok &= eval_float(s->d, sc, rb[0]->value, "`rms` argument `eps`", &L->eps);
            if (*ok && !(L->eps > 0)) {
                diag_error(s->d, rb[0]->value->loc, "`rms` argument `eps` must be positive, "
                                                    "got %g",
                           L->eps);
                *ok = false;
            }
        }
    } else {
        Expr *id = e->kind == EX_CALL ? e->lhs : e;
        if (id->kind == EX_IDENT)
            diag_error(s->d, e->loc, "`Attention` argument `qk_norm` must be `none`, `rms` or "
                                     "`rms(eps = ...)`, not `%s`%s",
                       id->str, diag_suggest(id->str, names));
        else
            diag_error(s->d, e->loc, "`Attention` argument `qk_norm` must be `none`, `rms` or "
                                     "`rms(eps = ...)`");
        *ok = false;
    }
}

/* NAME = Attention(dim, heads, kv_heads = heads, causal = true,
 *                  rope = none | rope(theta = ...), bias = true | false | qkv,
 *                  qk_norm = none | rms | rms(eps = ...),
 *                  init = normal(std = 0.02), out_init = init) */
static bool check_attention(Sema *s, Scope *sc, Layer *L, const Signature *sig, Arg **b,
                            Expr *call)
{
    bool ok = true;
    L->dim = positive_arg(s, sc, b[0], sig, 0, &ok);
    L->heads = positive_arg(s, sc, b[1], sig, 1, &ok);
    L->kv_heads = b[2] ? positive_arg(s, sc, b[2], sig, 2, &ok) : L->heads;
    if (b[3])
        ok &= eval_bool(s->d, sc, b[3]->value, "`Attention` argument `causal`", &L->causal);
    if (b[4])
        check_rope_arg(s, sc, L, b[4]->value, &ok);
    if (b[5])
        check_attention_bias(s, sc, L, b[5]->value, &ok);
    if (b[6])
        check_qk_norm_arg(s, sc, L, b[6]->value, &ok);
    check_inits(s, sc, L, sig, b[7], 7, b[8], &ok);
    return ok && check_heads(s, L, call, b[4]);
}

/* NAME = MLP(dim, hidden, act = gelu | relu | swiglu, bias = true,
 *            init = normal(std = 0.02), out_init = init) */
static bool check_mlp(Sema *s, Scope *sc, Layer *L, const Signature *sig, Arg **b)
{
    bool ok = true;
    L->dim = positive_arg(s, sc, b[0], sig, 0, &ok);
    L->hidden = positive_arg(s, sc, b[1], sig, 1, &ok);
    int act = ACT_GELU;
    if (b[2])
        ok &= eval_enum(s->d, b[2]->value, "`MLP` argument `act`", act_choices, &act);
    L->act = (Activation)act;
    if (b[3])
        ok &= eval_bool(s->d, sc, b[3]->value, "`MLP` argument `bias`", &L->bias);
    check_inits(s, sc, L, sig, b[4], 4, b[5], &ok);
    return ok;
}

/* A built-in layer declaration:
 *   NAME = Linear(...) | Embedding(...) | LayerNorm(...) | RMSNorm(...)
 *        | Attention(...) | MLP(...)
 * The arguments are bound to the layer's signature, then checked by kind. */
static void check_builtin_layer(Sema *s, Scope *sc, Decl *d, LayerKind kind, Expr *call)
{
    DeclInfo *di = eval_info(d);
    const Signature *sig = &layer_sigs[kind];
    Arg *b[MAX_ARGS];
    Layer *L = &di->tpl;
    L->kind = kind;
    L->bias = L->out_bias = true;
    L->causal = true;
    L->init_std = L->out_init_std = INIT_STD_DEFAULT;
    if (!eval_bind_args(s->d, sig, call->loc, call->args, b))
        return;
    bool ok;
    switch (kind) {
    case LK_LINEAR: ok = check_linear(s, sc, di, sig, b); break;
    case LK_EMBEDDING: ok = check_embedding(s, sc, L, sig, b); break;
    case LK_LAYERNORM:
    case LK_RMSNORM: ok = check_norm(s, sc, L, sig, b); break;
    case LK_ATTENTION: ok = check_attention(s, sc, L, sig, b, call); break;
    case LK_MLP: ok = check_mlp(s, sc, L, sig, b); break;
    default: fsd_unreachable();
    }
    di->ok = ok;
    di->instances = 1;
}

static LayerKind builtin_layer_kind(const char *name)
{
    for (int k = 0; k < LK_BLOCK; k++)
        if (strcmp(layer_names[k], name) == 0)
            return (LayerKind)k;
    return LK_BLOCK;
}

static const char **layer_type_names(Sema *s)
{
    const char **names = arena_alloc(sizeof(char *) * (size_t)(LK_BLOCK + s->m->ntypes + 1));
    int n = 0;
    for (int k = 0; k < LK_BLOCK; k++)
        names[n++] = layer_names[k];
    for (int i = 0; i < s->m->ntypes; i++)
        if (s->m->types[i]->decl)
            names[n++] = s->m->types[i]->name;
    return names;
}

/* NAME = Linear(...) | Block() | Block[n]
 * The arguments are read in the scope as it was before the declaration
 * (eval_decl_scope): NAME itself there is the enclosing scope's. */
static void check_layer_decl(Sema *s, Scope *outer_sc, Decl *d)
{
    Diag *D = s->d;
    Scope own = eval_decl_scope(outer_sc, d), *sc = &own;
    DeclInfo *di = eval_info(d);
    di->owner = sc->mt;
    Expr *v = d->value;
    Expr *callee = v->kind == EX_CALL || v->kind == EX_INDEX ? v->lhs : v;
    if (callee->kind != EX_IDENT) {
        diag_error(D, v->loc, "a layer is a built-in layer (`Linear(...)`), a block instance "
                              "(`Block()`) or a block array (`Block[n]`)");
        return;
    }
    LayerKind k = builtin_layer_kind(callee->str);
    bool outer;
    Decl *bt = k == LK_BLOCK ? eval_lookup(sc, callee->str, &outer) : NULL;
    if (k == LK_BLOCK && (!bt || bt->kind != DECL_BLOCK)) {
        if (bt && bt->kind == DECL_CONST && v->kind != EX_CALL && v->kind != EX_INDEX)
            diag_error(D, d->name_loc, "`%s` is a layer name; constants are declared with "
                                       "`const %s = ...`", d->name, d->name);
        else if (bt)
            diag_error(D, callee->loc, "`%s` is %s (declared at %s), not a layer type",
                       callee->str, eval_decl_what(bt), diag_where(D, bt->name_loc));
        else if (v->kind != EX_CALL && v->kind != EX_INDEX && callee->kind == EX_IDENT)
            diag_error(D, callee->loc, "undefined name `%s`; a layer is a built-in layer "
                                       "(`Linear(...)`) or a block type%s", callee->str,
                       diag_suggest(callee->str, layer_type_names(s)));
        else
            diag_error(D, callee->loc, "unknown layer type `%s`%s", callee->str,
                       diag_suggest(callee->str, layer_type_names(s)));
        return;
    }
    if (k != LK_BLOCK) {
        if (v->kind != EX_CALL) {
            diag_error(D, v->loc, v->kind == EX_INDEX
                                      ? "only block types make arrays; `%s` is a built-in layer"
                                      : "`%s` is a layer type; call it with its arguments",
                       callee->str);
            return;
        }
        check_builtin_layer(s, sc, d, k, v);
        return;
    }
    /* a block type */
    ModuleType *mt = bt->mtype;
    di->tpl.mtype = mt;
    if (v->kind == EX_CALL) {
        if (v->args) {
            diag_error(D, v->args->loc, "block `%s` takes no arguments", callee->str);
            return;
        }
        di->tpl.kind = LK_BLOCK;
        di->tpl.count = 1;
    } else if (v->kind == EX_INDEX) {
        if (v->rhs->kind == EX_STAR) {
            diag_error(D, v->rhs->loc, "an array declaration needs a count, not `*`");
            return;
        }
        int64_t n;
        if (!eval_int(s->d, sc, v->rhs, "the array size", 1, &n))
            return;
        if (n > MAX_ARRAY) {
            diag_error(D, v->rhs->loc, "array of %" PRId64 " blocks; the limit is %d", n,
                       MAX_ARRAY);
            return;
        }
        di->tpl.kind = LK_ARRAY;
        di->tpl.count = n;
    } else {
        diag_error(D, v->loc, "`%s` is a block type: write `%s()` for one instance or `%s[n]` "
                              "for n of them",
                   callee->str, callee->str, callee->str);
        return;
    }
    di->ok = true;
}

/* Block types must not contain themselves; computes instance counts. */
static int64_t type_instances(Sema *s, ModuleType *t, Decl *via, const char *chain)
{
    if (t->state == 2)
        return t->ninstances;
    if (t->state == 1) {
        diag_error(s->d, via->value->loc, "block `%s` contains itself: %s -> %s", t->name,
                   chain, t->name);
        return -1;
    }
    t->state = 1;
    int64_t total = 1;
    const char *here = chain[0] ? arena_printf("%s -> %s", chain, t->name) : t->name;
    for (Decl *d = t->members; d; d = d->next) {
        if (d->kind != DECL_LAYER || !eval_info(d)->ok)
            continue;
        DeclInfo *di = eval_info(d);
        int64_t n = 1;
        if (di->tpl.mtype) {
            int64_t per = type_instances(s, di->tpl.mtype, d, here);
            if (per < 0) {
                di->ok = false;
                total = -1;
                break;
            }
            if (__builtin_mul_overflow(per, di->tpl.kind == LK_ARRAY ? di->tpl.count : 1, &n) ||
                n > MAX_LAYER_INSTANCES) {
                n = MAX_LAYER_INSTANCES + 1;
            }
            n += di->tpl.kind == LK_ARRAY;
        }
        di->instances = n;
        total += n;
        if (total > MAX_LAYER_INSTANCES) {
            total = MAX_LAYER_INSTANCES + 1;
        }
    }
    t->state = 2;
    t->ninstances = total;
    return total;
}

/* ── forward bodies: shapes and dtypes ── */

typedef struct Local {
    const char *name;
    Type *ty;
    Loc loc;
    struct Local *next;
} Local;

typedef struct Fwd {
    Sema *s;
    ModuleType *mt;
    Scope *sc;
    Local *locals;
    Stmt *cur;           /* statement being checked */
} Fwd;

static Type *new_ty(ValueDtype dt, int rank, const int64_t *dims)
{
    Type *t = arena_alloc(sizeof *t);
    t->dtype = dt;
    t->rank = rank;
    for (int i = 0; i < rank; i++)
        t->dim[i] = dims[i];
    return t;
}

static bool ty_equal(const Type *a, const Type *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dim[i] != b->dim[i])
            return false;
    return true;
}

static Type *check_forward(Sema *s, ModuleType *mt, Type **args, int nargs, Loc call_loc);
static Type *type_expr(Fwd *f, Expr *e);

static Local *find_value(Fwd *f, const char *name)
{
    for (Local *l = f->locals; l; l = l->next)
        if (strcmp(l->name, name) == 0)
            return l;
    return NULL;
}

/* A later assignment to a name that is used before it. */
static Stmt *assigned_later(Fwd *f, const char *name)
{
    for (Stmt *st = f->cur ? f->cur->next : NULL; st; st = st->next)
        if (st->kind == ST_ASSIGN && strcmp(st->name, name) == 0)
            return st;
    return NULL;
}

static Type *expect_float(Fwd *f, Expr *arg, Type *t, const char *who)
{
    if (t && t->dtype != DT_F32) {
        diag_error(f->s->d, arg->loc, "%s takes a float tensor; this is token ids %s", who,
                   eval_type_name(t));
        return NULL;
    }
    if (t && t->rank == 0) {
        diag_error(f->s->d, arg->loc, "%s takes a tensor; this is a scalar", who);
        return NULL;
    }
    return t;
}

static Type *check_last_dim(Fwd *f, Expr *arg, Type *t, int64_t want, const char *who)
{
    if (t && t->dim[t->rank - 1] != want) {
        diag_error(f->s->d, arg->loc, "%s expects last dimension %" PRId64 ", got %s", who, want,
                   eval_type_name(t));
        return NULL;
    }
    return t;
}

/* layer(x): the output type of applying a declared layer. */
static Type *apply_layer(Fwd *f, Expr *call, Decl *ld, Type **in, int nin)
{
    Sema *s = f->s;
    Diag *D = s->d;
    DeclInfo *di = eval_info(ld);
    Layer *L = &di->tpl;
    const char *who = arena_printf("`%s` (%s at %s)", ld->name,
                                   L->kind == LK_ARRAY ? "block array"
                                   : L->kind == LK_BLOCK ? "block"
                                                         : layer_kind_name(L->kind),
                                   diag_where(D, ld->name_loc));
    Decl *fw = L->mtype ? L->mtype->forward : NULL;
    int nparams = 0;
    for (Name *p = fw ? fw->params : NULL; p; p = p->next)
        nparams++;
    if (L->kind == LK_ARRAY && nparams > 1) {
        diag_error(D, call->loc, "%s applies its blocks in sequence, so `%s`'s forward (at %s) "
                                 "must take one input; it takes %d",
                   who, L->mtype->name, diag_where(D, fw->loc), nparams);
        return NULL;
    }
    if (L->kind != LK_BLOCK && nin != 1) {
        diag_error(D, call->loc, "%s takes 1 input, got %d", who, nin);
        return NULL;
    }
    Expr *arg0 = call->args ? call->args->value : call;
    Type *x = nin ? in[0] : NULL;
    if (!x)
        return NULL;
    switch (L->kind) {
    case LK_LINEAR: {
        if (!check_last_dim(f, arg0, expect_float(f, arg0, x, who), L->in, who))
            return NULL;
        Type *y = new_ty(DT_F32, x->rank, x->dim);
        y->dim[y->rank - 1] = L->out;
        return y;
    }
    case LK_EMBEDDING: {
        if (x->dtype != DT_I32) {
            diag_error(D, arg0->loc, "%s looks up token ids; this is a float tensor %s", who,
                       eval_type_name(x));
            return NULL;
        }
        if (x->rank >= MAX_RANK) {
            diag_error(D, arg0->loc, "%s: input has too many dimensions", who);
            return NULL;
        }
        Type *y = new_ty(DT_F32, x->rank + 1, x->dim);
        y->dim[x->rank] = L->dim;
        return y;
    }
    case LK_LAYERNORM:
    case LK_RMSNORM:
    case LK_MLP:
        if (!check_last_dim(f, arg0, expect_float(f, arg0, x, who), L->dim, who))
            return NULL;
        return x;
    case LK_ATTENTION:
        if (!check_last_dim(f, arg0, expect_float(f, arg0, x, who), L->dim, who))
            return NULL;
        if (x->rank != 3 || x->dim[0] != DIM_BATCH) {
            diag_error(D, arg0->loc, "%s attends over a sequence: it takes [B, T, %" PRId64
                                     "], got %s", who, L->dim, eval_type_name(x));
            return NULL;
        }
        return x;
    case LK_BLOCK:
        return check_forward(s, L->mtype, in, nin, call->loc);
    case LK_ARRAY: {
        ModuleType *mt = L->mtype;
        Type *y = check_forward(s, mt, in, nin, call->loc);
        if (y && !ty_equal(y, x)) {
            diag_error(D, call->loc, "%s applies its blocks in sequence, so `%s`'s forward "
                                     "(at %s) must return what it takes; it takes %s and "
                                     "returns %s",
                       who, mt->name, diag_where(D, fw->loc), eval_type_name(x), eval_type_name(y));
            return NULL;
        }
        return y;
    }
    }
    fsd_unreachable();
}

static Type *apply_builtin(Fwd *f, Expr *call, BuiltinFn fn, Type **in, int nin)
{
    Diag *D = f->s->d;
    const char *who = arena_printf("`%s`", builtin_fns[fn].name);
    if (nin != builtin_fns[fn].arity) {
        diag_error(D, call->loc, "%s takes %d argument%s, got %d", who, builtin_fns[fn].arity,
                   builtin_fns[fn].arity == 1 ? "" : "s", nin);
        return NULL;
    }
    for (int i = 0; i < nin; i++)
        if (!in[i])
            return NULL;
    switch (fn) {
    case FN_GELU:
    case FN_RELU:
    case FN_SILU:
        return expect_float(f, call->args->value, in[0], who);
    case FN_CROSS_ENTROPY: {
        Type *lg = in[0], *tg = in[1];
        Expr *a0 = call->args->value, *a1 = call->args->next->value;
        if (!expect_float(f, a0, lg, "`cross_entropy` logits"))
            return NULL;
        if (tg->dtype != DT_I32) {
            diag_error(D, a1->loc, "`cross_entropy` targets must be token ids; got %s",
                       eval_type_name(tg));
            return NULL;
        }
        bool fit = lg->rank == tg->rank + 1;
        for (int i = 0; fit && i < tg->rank; i++)
            fit = lg->dim[i] == tg->dim[i];
        if (!fit) {
            diag_error(D, call->loc, "`cross_entropy` logits %s do not fit targets %s: logits "
                                     "need the targets' shape plus a vocabulary dimension",
                       eval_type_name(lg), eval_type_name(tg));
            return NULL;
        }
        Model *m = f->s->m;
        int64_t v = lg->dim[lg->rank - 1];
        if (m->vocab && m->vocab != v) {
            diag_error(D, call->loc, "`cross_entropy` over %" PRId64 " classes here, but "
                                     "over %" PRId64 " at %s; a model has one vocabulary",
                       v, m->vocab, diag_where(D, f->s->vocab_loc));
            return NULL;
        }
        m->vocab = v;
        f->s->vocab_loc = call->loc;
        return new_ty(DT_F32, 0, NULL);
    }
    default:
        fsd_unreachable();
    }
}

static int builtin_fn(const char *name)
{
    for (int i = 0; i < FN_COUNT; i++)
        if (strcmp(builtin_fns[i].name, name) == 0)
            return i;
    return -1;
}

static const char **value_names(Fwd *f)
{
    int n = 0;
    for (Local *l = f->locals; l; l = l->next)
        n++;
    for (Decl *d = f->sc->decls; d; d = d->next)
        n += d->kind == DECL_LAYER;
    /* room for the built-in functions, which type_call appends */
    const char **names = arena_alloc(sizeof(char *) * (size_t)(n + FN_COUNT + 1));
    n = 0;
    for (Local *l = f->locals; l; l = l->next)
        names[n++] = l->name;
    for (Decl *d = f->sc->decls; d; d = d->next)
        if (d->kind == DECL_LAYER)
            names[n++] = d->name;
    return names;
}

static Type *type_call(Fwd *f, Expr *e)
{
    Sema *s = f->s;
    Diag *D = s->d;
    Expr *callee = e->lhs;
    Type *in[8];
    int nin = 0;
    bool ok = true;
    for (Arg *a = e->args; a; a = a->next) {
        if (a->name) {
            diag_error(D, a->name_loc, "calls in a forward take tensors, not keyword arguments");
            ok = false;
            continue;
        }
        Type *t = type_expr(f, a->value);
        if (nin < 8)
            in[nin++] = t;
        else
            ok = false;
        ok &= t != NULL;
    }
    if (callee->kind != EX_IDENT) {
        diag_error(D, callee->loc, "only layers and functions can be called");
        return NULL;
    }
    const char *name = callee->str;
    if (find_value(f, name)) {
        diag_error(D, callee->loc, "`%s` is a value, not a layer or function", name);
        return NULL;
    }
    bool outer;
    Decl *d = eval_lookup(f->sc, name, &outer);
    if (d && d->kind == DECL_LAYER && !outer) {
        d->used = true;
        e->ref_decl = d;
        if (!ok || !eval_info(d)->ok)
            return NULL;
        return apply_layer(f, e, d, in, nin);
    }
    int fn = builtin_fn(name);
    if (fn >= 0 && !d) {
        e->builtin = fn + 1;
        return ok ? apply_builtin(f, e, (BuiltinFn)fn, in, nin) : NULL;
    }
    if (d && d->kind == DECL_LAYER)
        diag_error(D, callee->loc, "`%s` is a layer of the model (%s); a block's forward "
                                   "can only call the block's own layers",
                   name, diag_where(D, d->name_loc));
    else if (d && d->kind == DECL_BLOCK)
        diag_error(D, callee->loc, "`%s` is a block type; declare an instance (`b = %s()`) "
                                   "and call that",
                   name, name);
    else if (d)
        diag_error(D, callee->loc, "`%s` is %s (declared at %s), not a layer or function", name,
                   eval_decl_what(d), diag_where(D, d->name_loc));
    else if (builtin_layer_kind(name) != LK_BLOCK)
        diag_error(D, callee->loc, "`%s` is a layer type; declare a layer (`l = %s(...)`) and "
                                   "call that",
                   name, name);
    else {
        const char **names = value_names(f);
        int n = 0;
        while (names[n])
            n++;
        for (int i = 0; i < FN_COUNT; i++)
            names[n++] = builtin_fns[i].name;
        diag_error(D, callee->loc, "undefined layer or function `%s`%s", name,
                   diag_suggest(name, names));
    }
    return NULL;
}

/* Broadcasting for + and *: the smaller shape must equal the trailing
 * dimensions of the larger (tok(idx) [B, T, C] + pos(positions) [T, C]). */
static Type *type_binop(Fwd *f, Expr *e)
{
    Diag *D = f->s->d;
    Type *a = type_expr(f, e->lhs), *b = type_expr(f, e->rhs);
    if (e->op != '+' && e->op != '*') {
        diag_error(D, e->loc, "a forward adds (`+`) and multiplies (`*`) tensors; `%s` is not "
                              "supported there",
                   ast_op_name(e->op));
        return NULL;
    }
    if (!a || !b)
        return NULL;
    if (a->dtype != DT_F32 || b->dtype != DT_F32) {
        diag_error(D, e->loc, "`%s` of token ids %s; embed them first",
                   ast_op_name(e->op), eval_type_name(a->dtype == DT_I32 ? a : b));
        return NULL;
    }
    if (a->rank == 0 || b->rank == 0) {
        diag_error(D, e->loc, "`%s` of %s and %s: a forward adds and multiplies tensors; a "
                              "scalar loss can only be returned",
                   ast_op_name(e->op), eval_type_name(a), eval_type_name(b));
        return NULL;
    }
    Type *big = a->rank >= b->rank ? a : b, *small = big == a ? b : a;
    bool fit = true;
    for (int i = 0; fit && i < small->rank; i++)
        fit = small->dim[small->rank - 1 - i] == big->dim[big->rank - 1 - i];
    if (!fit) {
        diag_error(D, e->loc, "shape mismatch in `%s`: %s and %s", ast_op_name(e->op),
                   eval_type_name(a), eval_type_name(b));
        return NULL;
    }
    return big;
}

static Type *type_expr(Fwd *f, Expr *e)
{
    Sema *s = f->s;
    Diag *D = s->d;
    Type *t = NULL;
    switch (e->kind) {
    case EX_IDENT: {
        Local *l = find_value(f, e->str);
        if (l) {
            t = l->ty;
            break;
        }
        if (strcmp(e->str, "positions") == 0) {
            int64_t dims[1] = {s->m->seq};
            t = new_ty(DT_I32, 1, dims);
            break;
        }
        bool outer;
        Decl *d = eval_lookup(f->sc, e->str, &outer);
        Stmt *later = assigned_later(f, e->str);
        if (later)
            diag_error(D, e->loc, "`%s` is used before it is assigned at %s", e->str,
                       diag_where(D, later->name_loc));
        else if (d && d->kind == DECL_LAYER && !outer)
            diag_error(D, e->loc, "`%s` is a layer; apply it to a value: `%s(x)`", e->str,
                       e->str);
        else if (d)
            diag_error(D, e->loc, "`%s` is %s (declared at %s); a forward computes with "
                                  "tensors",
                       e->str, eval_decl_what(d), diag_where(D, d->name_loc));
        else if (builtin_fn(e->str) >= 0)
            diag_error(D, e->loc, "`%s` is a function; call it: `%s(x)`", e->str, e->str);
        else
            diag_error(D, e->loc, "undefined name `%s`%s", e->str,
                       diag_suggest(e->str, value_names(f)));
        return NULL;
    }
    case EX_CALL:
        t = type_call(f, e);
        break;
    case EX_BINOP:
        t = type_binop(f, e);
        break;
    case EX_INT:
    case EX_FLOAT:
        diag_error(D, e->loc, "a forward computes with tensors; numbers are not supported "
                              "there");
        return NULL;
    default:
        diag_error(D, e->loc, "this expression is not allowed in a forward body");
        return NULL;
    }
    e->ty = t;
    return t;
}

/* Checks a module type's forward for the given input types (once per type:
 * every call must pass the same types). */
static Type *check_forward(Sema *s, ModuleType *mt, Type **args, int nargs, Loc call_loc)
{
    Diag *D = s->d;
    Decl *fw = mt->forward;
    if (!fw)
        return NULL;   /* reported with the type */
    int nparams = 0;
    for (Name *n = fw->params; n; n = n->next)
        nparams++;
    if (nargs != nparams) {
        diag_error(D, call_loc, "`%s`'s forward (at %s) takes %d input%s, got %d", mt->name,
                   diag_where(D, fw->loc), nparams, nparams == 1 ? "" : "s", nargs);
        return NULL;
    }
    for (int i = 0; i < nargs; i++)
        if (!args[i])
            return NULL;
    if (mt->checked) {
        for (int i = 0; i < nargs; i++)
            if (!ty_equal(&mt->in_ty[i], args[i])) {
                diag_error(D, call_loc, "`%s` is called with %s here but with %s at %s; a block "
                                        "type has one signature",
                           mt->name, eval_type_name(args[i]), eval_type_name(&mt->in_ty[i]),
                           diag_where(D, mt->first_call));
                return NULL;
            }
        return mt->out_ok ? &mt->out_ty : NULL;
    }
    if (mt->checking) {
        diag_error(D, call_loc, "`%s`'s forward calls itself", mt->name);
        return NULL;
    }
    mt->checking = true;
    mt->first_call = call_loc;
    mt->nin = nargs;
    for (int i = 0; i < nargs && i < 8; i++)
        mt->in_ty[i] = *args[i];

    Scope outer = {s->model_sec->decls, NULL, s->root_type};
    Scope sc = {mt->members, mt->decl ? &outer : NULL, mt};
    Fwd f = {.s = s, .mt = mt, .sc = &sc};
    int i = 0;
    for (Name *n = fw->params; n; n = n->next, i++) {
        for (Name *p = fw->params; p != n; p = p->next)
            if (strcmp(p->name, n->name) == 0)
                diag_error(D, n->loc, "parameter `%s` is already declared at %s", n->name,
                           diag_where(D, p->loc));
        Local *l = arena_alloc(sizeof *l);
        *l = (Local){n->name, args[i], n->loc, f.locals};
        f.locals = l;
    }
    Type *ret = NULL;
    bool returned = false;
    for (Stmt *st = fw->body; st; st = st->next) {
        f.cur = st;
        if (returned) {
            diag_error(D, st->loc, "statement after `return` is never run");
            break;
        }
        Type *t = type_expr(&f, st->value);
        if (st->kind == ST_RETURN) {
            returned = true;
            ret = t;
            continue;
        }
        /* A value whose expression failed (reported) is still defined, with
         * no type, so its later uses add no "undefined name" errors. */
        Local *l = find_value(&f, st->name);
        if (!l) {
            bool o;
            Decl *d = eval_lookup(f.sc, st->name, &o);
            if (d && !o)
                diag_error(D, st->name_loc, "`%s` is already %s of `%s` (at %s); pick another "
                                            "name for the value",
                           st->name, eval_decl_what(d), mt->name, diag_where(D, d->name_loc));
            l = arena_alloc(sizeof *l);
            *l = (Local){st->name, t, st->name_loc, f.locals};
            f.locals = l;
        } else {
            l->ty = t;
        }
    }
    if (!returned)
        diag_error(D, fw->loc, "`%s`'s forward has no `return`", mt->name);
    mt->checking = false;
    mt->checked = true;
    if (ret) {
        mt->out_ty = *ret;
        mt->out_ok = true;
    }
    return ret;
}

/* Ties are checked once per declaration: target kind and shape. */
static void check_ties(Sema *s, Decl *members)
{
    Diag *D = s->d;
    for (Decl *d = members; d; d = d->next) {
        if (d->kind != DECL_LAYER || !eval_info(d)->ok || !eval_info(d)->tie_decl)
            continue;
        DeclInfo *di = eval_info(d);
        Decl *e = di->tie_decl;
        DeclInfo *ei = eval_info(e);
        if (!ei->ok) {
            di->ok = false;
            continue;
        }
        if (ei->tpl.kind != LK_EMBEDDING) {
            diag_error(D, di->tie_loc, "`tie = %s`: `%s` (at %s) is %s, not an Embedding",
                       e->name, e->name, diag_where(D, e->name_loc),
                       ei->tpl.kind == LK_ARRAY || ei->tpl.kind == LK_BLOCK
                           ? "a block"
                           : arena_printf("a %s", layer_kind_name(ei->tpl.kind)));
            di->ok = false;
        } else if (ei->tpl.n != di->tpl.out || ei->tpl.dim != di->tpl.in) {
            diag_error(D, di->tie_loc,
                       "`%s` ties its weight to `%s.weight`, but `%s` needs [%" PRId64
                       ", %" PRId64 "] and `%s` (at %s) has [%" PRId64 ", %" PRId64 "]",
                       d->name, e->name, d->name, di->tpl.out, di->tpl.in, e->name,
                       diag_where(D, e->name_loc), ei->tpl.n, ei->tpl.dim);
            di->ok = false;
        } else {
            e->used = true;
        }
    }
}

static void warn_unused(Sema *s, ModuleType *mt)
{
    for (Decl *d = mt->members; d; d = d->next)
        if (d->kind == DECL_LAYER && !d->used && eval_info(d)->ok)
            diag_warning(s->d, d->name_loc, "layer `%s` is never used in `%s`'s forward",
                         d->name, mt->name);
}

/* ── the pass ── */

static bool find_sections(Sema *s)
{
    Diag *D = s->d;
    for (Section *sec = s->prog->sections; sec; sec = sec->next) {
        Section **slot = sec->kind == SEC_MODEL   ? &s->model_sec
                         : sec->kind == SEC_SHARD ? &s->shard_sec
                                                  : &s->train_sec;
        const char *what = sec->kind == SEC_MODEL ? "model" : sec->kind == SEC_SHARD ? "shard"
                                                                                     : "train";
        if (*slot)
            diag_error(D, sec->kw_loc, "a second `%s` section; the first is at %s; one file "
                                       "describes one model",
                       what, diag_where(D, (*slot)->kw_loc));
        else
            *slot = sec;
    }
    if (!s->model_sec && !D->errors) {
        size_t i = 0;
        const char *t = s->prog->src->text;
        while (i < s->prog->src->len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' ||
                                         t[i] == '\r'))
            i++;
        diag_error(D, (Loc){0, 0}, "%s; a .fsd file describes a model: `model NAME { ... }`",
                   s->prog->src->len == 0 ? "the file is empty"
                   : i == s->prog->src->len ? "the file holds only blank lines"
                                            : "no `model` section");
    }
    return s->model_sec != NULL;
}

/* Declarations of one module type (the model or a block). */
static void check_decls(Sema *s, ModuleType *mt, Scope *sc)
{
    check_duplicates(s, mt->members, mt);
    for (Decl *d = mt->members; d; d = d->next) {
        switch (d->kind) {
        case DECL_CONST:
            eval_fold_const(s->d, sc, d);
            break;
        case DECL_LAYER:
            check_layer_decl(s, sc, d);
            break;
        case DECL_BLOCK:
        case DECL_FORWARD:
            break;
        }
    }
    check_ties(s, mt->members);
    if (!mt->forward)
        diag_error(s->d, mt->decl ? mt->decl->name_loc : s->model_sec->name_loc,
                   "`%s` has no forward; add `forward(x) { ... return x }`", mt->name);
}

Model *sema_check(Program *p, Diag *d)
{
    Sema S = {.d = d, .prog = p}, *s = &S;
    Model *m = arena_alloc(sizeof *m);
    s->m = m;
    m->prog = p;
    if (!find_sections(s))
        return NULL;
    m->name = s->model_sec->name;
    m->loc = s->model_sec->kw_loc;

    /* module types: the model and every block, declared before anything is
     * resolved so blocks may be used before their declaration */
    ModuleType *root = new_type(s, m->name, s->model_sec->name_loc, NULL, s->model_sec->decls);
    s->root_type = m->root_type = root;
    for (Decl *dd = s->model_sec->decls; dd; dd = dd->next)
        if (dd->kind == DECL_BLOCK)
            dd->mtype = new_type(s, dd->name, dd->name_loc, dd, dd->members);

    Scope model_scope = {s->model_sec->decls, NULL, root};
    check_decls(s, root, &model_scope);
    for (int i = 1; i < m->ntypes; i++) {
        Scope sc = {m->types[i]->members, &model_scope, m->types[i]};
        check_decls(s, m->types[i], &sc);
    }
    bool outer;
    Decl *seq = eval_lookup(&model_scope, "seq", &outer);
    if (!seq || seq->kind != DECL_CONST) {
        diag_error(d, s->model_sec->name_loc, "model `%s` has no `const seq = ...`: the "
                                               "sequence length of its token inputs",
                   m->name);
    } else if (eval_info(seq)->ok) {
        Value v = eval_info(seq)->value;
        if (v.kind != V_INT || v.i < 1 || v.i > (1 << 24))
            diag_error(d, seq->value->loc, "`seq` must be an integer from 1 to %d, got %s",
                       1 << 24, eval_value_desc(&v));
        else
            m->seq = v.i;
    }
    if (d->errors)
        return NULL;

    int64_t n = type_instances(s, root, NULL, "");
    if (n > MAX_LAYER_INSTANCES)
        diag_error(d, s->model_sec->name_loc, "model `%s` has more than %d layer instances",
                   m->name, MAX_LAYER_INSTANCES);
    if (d->errors)
        return NULL;

    /* forward: the model takes token ids and targets, returns the loss */
    Decl *fw = root->forward;
    int nparams = 0;
    for (Name *nm = fw->params; nm; nm = nm->next)
        nparams++;
    if (nparams != 2) {
        diag_error(d, fw->loc, "the model's forward takes (idx, targets): token ids and "
                               "next-token targets; this one takes %d parameter%s",
                   nparams, nparams == 1 ? "" : "s");
        return NULL;
    }
    int64_t tokens[2] = {DIM_BATCH, m->seq};
    Type *in[2] = {new_ty(DT_I32, 2, tokens), new_ty(DT_I32, 2, tokens)};
    Type *loss = check_forward(s, root, in, 2, fw->loc);
    if (loss && loss->rank != 0) {
        Stmt *ret = fw->body;
        while (ret && ret->kind != ST_RETURN)
            ret = ret->next;
        diag_error(d, ret ? ret->value->loc : fw->loc, "the model's forward must return a "
                                                       "scalar loss (from cross_entropy); "
                                                       "this returns %s",
                   eval_type_name(loss));
    }
    if (d->errors)
        return NULL;
    for (int i = 0; i < m->ntypes; i++) {
        if (m->types[i]->checked)
            warn_unused(s, m->types[i]);
        else if (m->types[i]->decl)
            diag_warning(d, m->types[i]->loc, "block type `%s` is never used", m->types[i]->name);
    }

    /* what model_build reads next: the declarations and the settings */
    m->model_sec = s->model_sec;
    m->shard_sec = s->shard_sec;
    m->train_sec = s->train_sec;
    return m;
}
