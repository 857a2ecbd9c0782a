/*
 * model.c — the pass after sema: the checked model becomes the typed model.
 *
 *   source_read → parse_program → sema_check → model_build → lower_model ...
 *
 * main runs model_build on the Model sema_check returns, once the
 * declarations and forward bodies check out. It makes the layer tree with
 * every parameter (PyTorch names and layouts, docs/design.md#parameter-names-and-layouts), shard
 * groups applied bottom-up as FSDP2 applies fully_shard (deeper targets
 * first; the root takes every parameter left), and the shard and train
 * settings with their defaults; it also holds the `--dump-model` printer.
 * It reads what sema recorded per declaration (DeclInfo) and evaluates the
 * settings with eval.c, as sema does; it calls nothing of sema.c's passes.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NUMEL ((int64_t)1 << 53)
enum { MAX_LAYER_INSTANCES = 200000, MAX_PREFETCH = 16 };

static const char *const dtype_choices[] = {
#define X(e, name, bytes) name,
    DTYPE_LIST(X)
#undef X
    NULL};
static const char *const offload_choices[] = {"none", "cpu", NULL};
static const char *const accumulate_choices[] = {"sharded", "unsharded", NULL};

static const Signature sig_mixed = {"mixed_precision",
                                    {{"param", A_ENUM, false, dtype_choices},
                                     {"reduce", A_ENUM, false, dtype_choices},
                                     {"output", A_ENUM, false, dtype_choices}}};
static const Signature sig_prefetch = {"prefetch", {{"forward", A_INT}, {"backward", A_INT}}};
static const Signature sig_adamw = {"adamw", {{"lr", A_FLOAT, true}, {"betas", A_PAIR},
                                              {"eps", A_FLOAT}, {"weight_decay", A_FLOAT}}};
static const Signature sig_sgd = {"sgd", {{"lr", A_FLOAT, true}, {"momentum", A_FLOAT},
                                          {"weight_decay", A_FLOAT}, {"nesterov", A_BOOL}}};
static const Signature sig_constant = {"constant", {{"warmup", A_INT}}};
static const Signature sig_cosine = {"cosine", {{"warmup", A_INT}, {"min_lr", A_FLOAT}}};
/* What a fully_shard line takes after its target, as FSDP2's fully_shard
 * takes per-module arguments: `fully_shard blocks[*] (recompute = full)`.
 * A new one is one more entry here and one more field beside
 * Layer.recompute. `mixed_precision(...)` is written as a call, as in the
 * shard section (FSDP2's mp_policy = MixedPrecisionPolicy(...)):
 * target_args binds it under its own name. */
static const Signature sig_target = {"fully_shard", {{"recompute", A_ENUM},
                                                    {"mixed_precision", A_ENUM},
                                                    {"reshard_after_forward", A_INT}}};
static const Signature sig_every = {"every", {{"k", A_INT, true}}};
static const Signature sig_linear = {"linear", {{"warmup", A_INT}, {"min_lr", A_FLOAT}}};
static const Signature sig_wsd = {"wsd", {{"warmup", A_INT}, {"decay", A_FLOAT, true},
                                          {"min_lr", A_FLOAT}}};
static const Signature sig_eval = {"eval", {{"every", A_INT, true}, {"sequences", A_INT}}};
static const Signature sig_checkpoint = {"checkpoint", {{"every", A_INT, true},
                                                        {"dir", A_STRING},
                                                        {"async", A_BOOL},
                                                        {"keep", A_INT}}};

/* The pass's state: the model being built, where messages go, the
 * sections it reads (from sema_check), and the parameters made so far. */
typedef struct Build {
    Model *m;
    Diag *d;
    Section *model_sec, *shard_sec, *train_sec;
    ModuleType *root_type;
    Param **params;
    int nparams, cap;
} Build;

/* ── instantiation: the layer tree and its parameters ── */

/* A parameter of owner; std is INIT_NORMAL's standard deviation. */
static Param *new_param(Build *mb, Layer *owner, const char *local, int rank, int64_t d0,
                        int64_t d1, InitKind init, double std)
{
    Param *p = arena_alloc(sizeof *p);
    p->name = arena_printf("%s.%s", owner->path, local);
    p->local = local;
    p->rank = rank;
    p->shape[0] = d0;
    p->shape[1] = rank > 1 ? d1 : 1;
    p->numel = d0 * (rank > 1 ? d1 : 1);
    p->init = init;
    p->std = init == INIT_NORMAL ? std : 0;
    p->owner = owner;
    p->group = -1;
    if (mb->nparams == mb->cap) {
        mb->cap = mb->cap ? mb->cap * 2 : 64;
        Param **np = arena_alloc(sizeof(Param *) * (size_t)mb->cap);
        if (mb->nparams)
            memcpy(np, mb->params, sizeof(Param *) * (size_t)mb->nparams);
        mb->params = np;
    }
    p->index = mb->nparams;
    mb->params[mb->nparams++] = p;
    return p;
}

static Layer *new_layer(Layer *parent, const char *name, Decl *decl, LayerKind kind)
{
    Layer *L = arena_alloc(sizeof *L);
    L->kind = kind;
    L->name = name;
    L->path = parent && parent->path[0] ? arena_printf("%s.%s", parent->path, name) : name;
    L->parent = parent;
    L->decl = decl;
    L->loc = decl ? decl->name_loc : (Loc){0, 0};
    L->group = -1;
    return L;
}

/* A Linear of an Attention or an MLP; its weight is normal(0, std). */
static Layer *linear(Build *mb, Layer *parent, const char *name, Decl *decl, int64_t in,
                     int64_t out, bool bias, double std)
{
    Layer *L = new_layer(parent, name, decl, LK_LINEAR);
    L->in = in;
    L->out = out;
    L->bias = bias;
    L->init_std = std;
    L->weight = new_param(mb, L, "weight", 2, out, in, INIT_NORMAL, std);
    if (bias)
        L->bias_p = new_param(mb, L, "bias", 1, out, 0, INIT_ZEROS, 0);
    return L;
}

/* qk_norm's RMSNorm of one attention head: weight [head_dim], ones */
static Layer *head_norm(Build *mb, Layer *parent, const char *name, Decl *decl, int64_t hd,
                        double eps)
{
    Layer *L = new_layer(parent, name, decl, LK_RMSNORM);
    L->dim = hd;
    L->eps = eps;
    L->weight = new_param(mb, L, "weight", 1, hd, 0, INIT_ONES, 0);
    return L;
}

static void set_children(Layer *L, Layer **kids, int n)
{
    L->children = arena_alloc(sizeof(Layer *) * (size_t)n);
    memcpy(L->children, kids, sizeof(Layer *) * (size_t)n);
    L->nchildren = n;
}

static void instantiate_members(Build *mb, Layer *L, ModuleType *mt);

static Layer *instantiate(Build *mb, Layer *parent, const char *name, Decl *d)
{
    DeclInfo *di = eval_info(d);
    Layer *t = &di->tpl;
    Layer *L = new_layer(parent, name, d, t->kind);
    L->in = t->in, L->out = t->out, L->n = t->n, L->dim = t->dim, L->heads = t->heads;
    L->kv_heads = t->kv_heads, L->hidden = t->hidden, L->count = t->count, L->bias = t->bias;
    L->causal = t->causal, L->eps = t->eps, L->rope_theta = t->rope_theta, L->act = t->act;
    L->init_std = t->init_std, L->out_init_std = t->out_init_std;
    L->qk_norm = t->qk_norm, L->out_bias = t->out_bias;
    L->mtype = t->mtype;
    double is = t->init_std, os = t->out_init_std;
    switch (t->kind) {
    case LK_LINEAR:
        if (!di->tie_decl)
            L->weight = new_param(mb, L, "weight", 2, t->out, t->in, INIT_NORMAL, is);
        if (t->bias)
            L->bias_p = new_param(mb, L, "bias", 1, t->out, 0, INIT_ZEROS, 0);
        break;
    case LK_EMBEDDING:
        L->weight = new_param(mb, L, "weight", 2, t->n, t->dim, INIT_NORMAL, is);
        break;
    case LK_LAYERNORM:
        L->weight = new_param(mb, L, "weight", 1, t->dim, 0, INIT_ONES, 0);
        if (t->bias)
            L->bias_p = new_param(mb, L, "bias", 1, t->dim, 0, INIT_ZEROS, 0);
        break;
    case LK_RMSNORM:
        L->weight = new_param(mb, L, "weight", 1, t->dim, 0, INIT_ONES, 0);
        break;
    case LK_ATTENTION: {
        /* q, k, v, o; then qk_norm's q_norm and k_norm, RMSNorms of one
         * head (Qwen3's module order, and so Hugging Face's names) */
        int64_t hd = t->dim / t->heads;
        Layer *kids[6] = {
            linear(mb, L, "q", d, t->dim, t->heads * hd, t->bias, is),
            linear(mb, L, "k", d, t->dim, t->kv_heads * hd, t->bias, is),
            linear(mb, L, "v", d, t->dim, t->kv_heads * hd, t->bias, is),
            linear(mb, L, "o", d, t->heads * hd, t->dim, t->out_bias, os),
            t->qk_norm ? head_norm(mb, L, "q_norm", d, hd, t->eps) : NULL,
            t->qk_norm ? head_norm(mb, L, "k_norm", d, hd, t->eps) : NULL,
        };
        set_children(L, kids, t->qk_norm ? 6 : 4);
        break;
    }
    case LK_MLP:
        if (t->act == ACT_SWIGLU) {
            Layer *kids[3] = {
                linear(mb, L, "gate", d, t->dim, t->hidden, t->bias, is),
                linear(mb, L, "up", d, t->dim, t->hidden, t->bias, is),
                linear(mb, L, "down", d, t->hidden, t->dim, t->bias, os),
            };
            set_children(L, kids, 3);
        } else {
            Layer *kids[2] = {
                linear(mb, L, "fc", d, t->dim, t->hidden, t->bias, is),
                linear(mb, L, "proj", d, t->hidden, t->dim, t->bias, os),
            };
            set_children(L, kids, 2);
        }
        break;
    case LK_BLOCK:
        instantiate_members(mb, L, t->mtype);
        break;
    case LK_ARRAY: {
        Layer **kids = arena_alloc(sizeof(Layer *) * (size_t)t->count);
        for (int64_t i = 0; i < t->count; i++) {
            kids[i] = new_layer(L, arena_printf("%" PRId64, i), d, LK_BLOCK);
            kids[i]->mtype = t->mtype;
            instantiate_members(mb, kids[i], t->mtype);
        }
        L->children = kids;
        L->nchildren = (int)t->count;
        break;
    }
    }
    return L;
}

static void instantiate_members(Build *mb, Layer *L, ModuleType *mt)
{
    int n = 0;
    for (Decl *d = mt->members; d; d = d->next)
        n += d->kind == DECL_LAYER;
    L->children = arena_alloc(sizeof(Layer *) * (size_t)(n ? n : 1));
    for (Decl *d = mt->members; d; d = d->next)
        if (d->kind == DECL_LAYER) {
            eval_info(d)->child_index = L->nchildren;
            L->children[L->nchildren++] = instantiate(mb, L, d->name, d);
        }
    /* ties resolve among siblings, by index: a model may tie thousands */
    for (int i = 0; i < L->nchildren; i++) {
        Layer *c = L->children[i];
        DeclInfo *di = eval_info(c->decl);
        if (c->kind != LK_LINEAR || !di->tie_decl)
            continue;
        c->tie = L->children[eval_info(di->tie_decl)->child_index];
        if (c->tie->decl != di->tie_decl)
            fsd_unreachable();
    }
}


/* ── shard groups ── */

typedef struct Target {
    Layer *layer;     /* NULL: root */
    Loc loc;
    int depth;
    int order;
} Target;

static int layer_depth(Layer *L)
{
    int d = 0;
    for (; L->parent; L = L->parent)
        d++;
    return d;
}

static Layer *child_named(Layer *L, const char *name)
{
    for (int i = 0; i < L->nchildren; i++)
        if (strcmp(L->children[i]->name, name) == 0)
            return L->children[i];
    return NULL;
}

static const char **child_names(Layer *L)
{
    const char **names = arena_alloc(sizeof(char *) * (size_t)(L->nchildren + 1));
    for (int i = 0; i < L->nchildren; i++)
        names[i] = L->children[i]->name;
    return names;
}

/* Resolves a fully_shard path to layers: tok, blocks, blocks[3],
 * blocks[*], blocks[*].mlp, root. Returns the count; -1 on error. */
static int resolve_path(Build *mb, Expr *e, Layer **out, int cap)
{
    Diag *D = mb->d;
    Model *m = mb->m;
    if (e->kind == EX_IDENT) {
        if (strcmp(e->str, "root") == 0) {
            out[0] = NULL;
            return 1;
        }
        Layer *L = child_named(m->root, e->str);
        if (!L) {
            bool o;
            Scope sc = {mb->model_sec->decls, NULL, mb->root_type};
            Decl *d = eval_lookup(&sc, e->str, &o);
            if (d)
                diag_error(D, e->loc, "`fully_shard %s`: `%s` is %s (declared at %s), not a "
                                      "layer",
                           e->str, e->str, eval_decl_what(d), diag_where(D, d->name_loc));
            else
                diag_error(D, e->loc, "`fully_shard %s`: the model has no layer `%s`%s", e->str,
                           e->str, diag_suggest(e->str, child_names(m->root)));
            return -1;
        }
        out[0] = L;
        return 1;
    }
    if (e->kind == EX_MEMBER || e->kind == EX_INDEX) {
        /* The bases are resolved into out and replaced in place, so a long
         * path costs no buffer per step (a cap-sized one each was 1.6 MB
         * per `.`); only [*], which fans out, copies its bases first. */
        int nb = resolve_path(mb, e->lhs, out, cap);
        if (nb < 0)
            return -1;
        Layer **base = out;
        if (e->kind == EX_INDEX && e->rhs->kind == EX_STAR) {
            base = arena_alloc(sizeof(Layer *) * (size_t)(nb ? nb : 1));
            memcpy(base, out, sizeof(Layer *) * (size_t)nb);
        }
        int n = 0;
        for (int i = 0; i < nb; i++) {
            Layer *b = base[i];
            if (!b) {
                diag_error(D, e->loc, "`root` is the whole model; name its layers directly");
                return -1;
            }
            if (e->kind == EX_MEMBER) {
                Layer *c = b->kind == LK_ARRAY ? NULL : child_named(b, e->str);
                if (!c) {
                    diag_error(D, e->loc, "`%s` has no layer `%s`%s", b->path, e->str,
                               b->kind == LK_ARRAY ? "; index the array first"
                                                   : diag_suggest(e->str, child_names(b)));
                    return -1;
                }
                out[n++] = c;
                continue;
            }
            if (b->kind != LK_ARRAY) {
                diag_error(D, e->loc, "`%s` is not an array; only block arrays are indexed",
                           b->path);
                return -1;
            }
            if (e->rhs->kind == EX_STAR) {
                for (int j = 0; j < b->nchildren && n < cap; j++)
                    out[n++] = b->children[j];
                continue;
            }
            Scope sc = {mb->model_sec->decls, NULL, mb->root_type};
            int64_t k;
            if (!eval_int(mb->d, &sc, e->rhs, "an array index", 0, &k))
                return -1;
            if (k >= b->nchildren) {
                diag_error(D, e->rhs->loc, "index %" PRId64 " is out of range: `%s` has %d "
                                           "blocks (0..%d)",
                           k, b->path, b->nchildren, b->nchildren - 1);
                return -1;
            }
            out[n++] = b->children[k];
        }
        return n;
    }
    diag_error(D, e->loc, "`fully_shard` takes a layer path: `blocks[*]`, `blocks[0].mlp`, "
                          "`tok` or `root`");
    return -1;
}

static void claim(Layer *L, int group)
{
    if (L->group >= 0)
        return;
    L->group = group;
    if (L->weight && L->weight->group < 0)
        L->weight->group = group;
    if (L->bias_p && L->bias_p->group < 0)
        L->bias_p->group = group;
    for (int i = 0; i < L->nchildren; i++)
        claim(L->children[i], group);
}

static int cmp_target(const void *a, const void *b)
{
    const Target *x = a, *y = b;
    if (x->depth != y->depth)
        return y->depth - x->depth;
    return x->order - y->order;
}

static void check_tie_groups(Build *mb, Layer *L)
{
    if (L->kind == LK_LINEAR && L->tie && L->group != L->tie->group) {
        Model *m = mb->m;
        DeclInfo *di = eval_info(L->decl);
        diag_error(mb->d, di->tie_loc, "`%s` ties `%s.weight`, but `%s` is in shard group `%s` "
                                      "(%s) and `%s` in `%s` (%s); a tied weight must stay in "
                                      "one group",
                   L->path, L->tie->path, L->path, m->groups[L->group]->name,
                   diag_where(mb->d, m->groups[L->group]->loc), L->tie->path,
                   m->groups[L->tie->group]->name,
                   diag_where(mb->d, m->groups[L->tie->group]->loc));
    }
    for (int i = 0; i < L->nchildren; i++)
        check_tie_groups(mb, L->children[i]);
}

static const Signature sig_auto = {"auto", {{"bucket", A_SIZE, true}}};

/* fully_shard auto(bucket = 256MiB): the planner makes the groups (plan.c);
 * sema only checks the line and keeps the size. */
static void auto_bucket(Build *mb, Setting *st)
{
    Arg *b[MAX_ARGS];
    Expr *call = st->value;
    if (!eval_bind_args(mb->d, &sig_auto, call->loc, call->args, b))
        return;
    Scope sc = {mb->model_sec->decls, NULL, mb->root_type};
    Value v;
    if (!eval_fold(mb->d, &sc, b[0]->value, &v))
        return;
    if (v.kind != V_INT || !b[0]->value->is_size || v.i <= 0)
        diag_error(mb->d, b[0]->value->loc, "`bucket` is a positive size with a unit, like "
                                           "256MiB");
    else
        mb->m->shard.auto_bucket_bytes = v.i;
}

/* recompute = none | full | selective | every(k) | auto
 * (docs/design.md#activation-recomputation) */
static bool parse_recompute(Build *mb, Expr *e, RecomputeSpec *out)
{
    static const char *const kinds[] = {"none", "full", "selective", "every", "auto", NULL};
    const char *choices = "`none`, `full`, `selective`, `every(k)` or `auto`";
    Diag *D = mb->d;
    *out = (RecomputeSpec){.written = true, .loc = e->loc};
    if (e->kind == EX_CALL && e->lhs->kind == EX_IDENT && strcmp(e->lhs->str, "every") == 0) {
        Arg *b[MAX_ARGS];
        Scope sc = {mb->model_sec->decls, NULL, mb->root_type};
        if (!eval_bind_args(D, &sig_every, e->loc, e->args, b) ||
            !eval_int(D, &sc, b[0]->value, "the interval of `every(k)`", 1, &out->every))
            return false;
        out->kind = RC_EVERY;
        return true;
    }
    if (e->kind == EX_IDENT) {
        for (int i = 0; kinds[i]; i++)
            if (strcmp(kinds[i], e->str) == 0) {
                if (i == RC_EVERY) {
                    diag_error(D, e->loc, "`every` takes the interval k: `every(2)` recomputes "
                                          "every second unit");
                    return false;
                }
                out->kind = (RecomputeKind)i;
                return true;
            }
        diag_error(D, e->loc, "`recompute` must be %s, not `%s`%s", choices, e->str,
                   diag_suggest(e->str, kinds));
        return false;
    }
    diag_error(D, e->loc, "`recompute` must be %s", choices);
    return false;
}

/* mixed_precision(param = DT, reduce = DT, output = DT), every argument
 * optional: the dtypes written, each with where (MixedSpec). The shard
 * section's and a fully_shard line's share it. */
static bool parse_mixed(Build *mb, Loc at, Arg *args, MixedSpec *out)
{
    Arg *b[MAX_ARGS];
    *out = (MixedSpec){.at = at};
    if (!eval_bind_args(mb->d, &sig_mixed, at, args, b))
        return false;
    if (!b[MP_PARAM] && !b[MP_REDUCE] && !b[MP_OUTPUT]) {
        diag_error(mb->d, at, "`mixed_precision()` sets nothing: give one or more of `param`, "
                              "`reduce`, `output` (e.g. `mixed_precision(param = bf16, reduce = "
                              "fp32)`)");
        return false;
    }
    bool ok = true;
    for (int i = 0; i < MP_NDTYPES; i++) {
        int v;
        if (!b[i])
            continue;
        if (!eval_enum(mb->d, b[i]->value,
                       arena_printf("`mixed_precision` argument `%s`", sig_mixed.args[i].name),
                       dtype_choices, &v)) {
            ok = false;
            continue;
        }
        out->set[i] = true;
        out->dtype[i] = (DType)v;
        out->loc[i] = b[i]->value->loc;
    }
    return ok;
}

/* What a fully_shard line's arguments set; NULL where not written. */
typedef struct TargetArgs {
    const RecomputeSpec *recompute;
    const MixedSpec *mixed;
    const ReshardSpec *reshard;
} TargetArgs;

/* reshard_after_forward = true | false | N (FSDP2's bool or int,
 * docs/design.md#partial-resharding): N = 1 keeps the parameters as false
 * does; N >= 2 keeps a copy sharded over N ranks. Whether N divides the
 * shard group is main.c's check (the world) and the trainer's. */
static bool parse_reshard(Build *mb, Expr *e, ReshardSpec *out)
{
    Scope sc = {mb->model_sec->decls, NULL, mb->root_type};
    Value v;
    if (!eval_fold(mb->d, &sc, e, &v))
        return false;
    *out = (ReshardSpec){.loc = e->loc};
    if (v.kind == V_BOOL) {
        out->reshard = v.i != 0;
        return true;
    }
    if (v.kind != V_INT) {
        diag_error(mb->d, e->loc, "`reshard_after_forward` must be `true`, `false` or a number "
                                  "of ranks to keep the parameters sharded over (`= 8`), got %s",
                   eval_value_desc(&v));
        return false;
    }
    if (v.i < 1) {
        diag_error(mb->d, e->loc, "`reshard_after_forward = %" PRId64 "`: a number of ranks "
                                  "must be at least 1 (1 keeps the parameters, as `false`; N "
                                  "keeps them sharded over N ranks)", v.i);
        return false;
    }
    out->written = v.i;
    out->reshard = v.i >= 2;
    out->ranks = v.i >= 2 ? v.i : 0;
    return true;
}

/* fully_shard PATH (name = value, ..., mixed_precision(...)): the
 * per-target arguments, by name only, so a new one never shifts another;
 * mixed_precision is a call named by its callee. Fields stay NULL when
 * not written (or wrong, reported). */
static TargetArgs target_args(Build *mb, Expr *call)
{
    TargetArgs ta = {0};
    for (Arg *a = call->args; a; a = a->next) {
        Expr *v = a->value;
        if (!a->name && v->kind == EX_CALL && v->lhs->kind == EX_IDENT &&
            strcmp(v->lhs->str, "mixed_precision") == 0) {
            a->name = "mixed_precision";
            a->name_loc = v->lhs->loc;
        }
        if (!a->name) {
            diag_error(mb->d, a->loc, "`fully_shard` takes its per-target arguments by name: "
                                      "`fully_shard blocks[*] (recompute = full)`, or "
                                      "`fully_shard blocks[*] (mixed_precision(reduce = fp32))`");
            return ta;
        }
    }
    Arg *b[MAX_ARGS];
    if (!eval_bind_args(mb->d, &sig_target, call->loc, call->args, b))
        return ta;
    if (b[0]) {
        RecomputeSpec *spec = arena_alloc(sizeof *spec);
        if (parse_recompute(mb, b[0]->value, spec)) {
            spec->per_target = true;
            ta.recompute = spec;
        }
    }
    if (b[1]) {
        Expr *v = b[1]->value;
        MixedSpec *mp = arena_alloc(sizeof *mp);
        if (v->kind != EX_CALL || v->lhs->kind != EX_IDENT ||
            strcmp(v->lhs->str, "mixed_precision") != 0)
            diag_error(mb->d, b[1]->loc, "a target's mixed precision is written as in the shard "
                                         "section, without `=`: `fully_shard blocks[*] "
                                         "(mixed_precision(reduce = fp32))`");
        else if (parse_mixed(mb, v->loc, v->args, mp))
            ta.mixed = mp;
    }
    if (b[2]) {
        ReshardSpec *rs = arena_alloc(sizeof *rs);
        if (parse_reshard(mb, b[2]->value, rs))
            ta.reshard = rs;
    }
    return ta;
}

static void plan_groups(Build *mb, Setting *settings)
{
    Diag *D = mb->d;
    Model *m = mb->m;
    int cap = 16, n = 0;
    Target *targets = arena_alloc(sizeof(Target) * (size_t)cap);
    Loc root_loc = mb->shard_sec ? mb->shard_sec->kw_loc : mb->model_sec->kw_loc;
    int maxk = MAX_LAYER_INSTANCES + 1;
    Layer **found = arena_alloc(sizeof(Layer *) * (size_t)maxk);
    Setting *auto_line = NULL, *first_target = NULL;
    const MixedSpec *root_mixed = NULL;
    const ReshardSpec *root_reshard = NULL;
    for (Setting *st = settings; st; st = st->next) {
        if (st->kind != SET_FULLY_SHARD)
            continue;
        Expr *v = st->value;
        if (v->kind == EX_CALL && v->lhs->kind == EX_IDENT && strcmp(v->lhs->str, "auto") == 0) {
            auto_bucket(mb, st);
            if (!auto_line)
                auto_line = st;
            continue;
        }
        /* auto's groups are the planner's, and so are its units: the
         * shard section's `recompute` covers them */
        if (v->kind == EX_CALL && v->lhs->kind == EX_CALL && v->lhs->lhs->kind == EX_IDENT &&
            strcmp(v->lhs->lhs->str, "auto") == 0) {
            diag_error(D, v->args ? v->args->loc : v->loc,
                       "`fully_shard auto(...)` takes no per-target arguments: the planner "
                       "makes its groups; set `recompute` in the shard section, which then "
                       "covers each element of the model's layer arrays (and "
                       "`mixed_precision`, which covers every group)");
            continue;
        }
        if (!first_target)
            first_target = st;
        /* fully_shard PATH (args): PATH's instances with the line's settings */
        TargetArgs ta = {0};
        if (v->kind == EX_CALL) {
            ta = target_args(mb, v);
            v = v->lhs;
        }
        const RecomputeSpec *spec = ta.recompute;
        int k = resolve_path(mb, v, found, maxk);
        for (int i = 0; i < k; i++) {
            if (!found[i]) {
                root_loc = st->loc;
                /* the root is the rest of the model, not an instance: the
                 * units are its non-root targets */
                if (spec && spec->kind != RC_NONE)
                    diag_error(D, spec->loc, "`root` cannot be recomputed: it holds what no "
                                             "other target claims, and recomputation works on "
                                             "the instances of the other `fully_shard` targets; "
                                             "set `recompute` on those (or in the shard "
                                             "section, for all of them)");
                /* the root group is made below, from no layer of its own */
                if (ta.mixed && root_mixed)
                    diag_error(D, ta.mixed->at, "the root's `mixed_precision` is already set "
                                                "at %s", diag_where(D, root_mixed->at));
                else if (ta.mixed)
                    root_mixed = ta.mixed;
                if (ta.reshard && root_reshard)
                    diag_error(D, ta.reshard->loc, "the root's `reshard_after_forward` is "
                                                   "already set at %s",
                               diag_where(D, root_reshard->loc));
                else if (ta.reshard)
                    root_reshard = ta.reshard;
                continue;
            }
            found[i]->recompute = spec;
            found[i]->mixed = ta.mixed;
            found[i]->reshard = ta.reshard;
            /* A target's group holds its index in targets until the groups
             * are made, so a second claim is found at once: searching the
             * list made `fully_shard blocks[*]` over 100,000 blocks take
             * seconds. */
            if (found[i]->group >= 0) {
                diag_error(D, v->loc, "`%s` is claimed by two fully_shard lines: "
                                      "here and at %s",
                           found[i]->path, diag_where(D, targets[found[i]->group].loc));
                break;
            }
            if (n == cap) {
                Target *nt = arena_alloc(sizeof(Target) * (size_t)cap * 2);
                memcpy(nt, targets, sizeof(Target) * (size_t)cap);
                targets = nt;
                cap *= 2;
            }
            targets[n] = (Target){found[i], st->loc, layer_depth(found[i]), n};
            found[i]->group = n++;
        }
    }
    if (auto_line && first_target)
        diag_error(D, first_target->loc, "`fully_shard auto(...)` at %s chooses every group; "
                                         "remove this line or the auto one",
                   diag_where(D, auto_line->loc));
    for (int j = 0; j < n; j++)
        targets[j].layer->group = -1;
    /* FSDP2 order: children before parents, so deeper targets claim first;
     * the root takes every parameter left. */
    qsort(targets, (size_t)n, sizeof(Target), cmp_target);
    m->groups = arena_alloc(sizeof(ShardGroup *) * (size_t)(n + 1));
    for (int i = 0; i <= n; i++) {
        ShardGroup *g = arena_alloc(sizeof *g);
        g->index = m->ngroups;
        g->is_root = i == n;
        g->target = g->is_root ? NULL : targets[i].layer;
        g->name = g->is_root ? "root" : targets[i].layer->path;
        g->loc = g->is_root ? root_loc : targets[i].loc;
        g->mixed = g->is_root ? root_mixed : targets[i].layer->mixed;
        g->reshard_own = g->is_root ? root_reshard : targets[i].layer->reshard;
        claim(g->is_root ? m->root : g->target, g->index);
        m->groups[m->ngroups++] = g;
    }
    for (int i = 0; i < m->nparams; i++) {
        Param *p = m->params[i];
        ShardGroup *g = m->groups[p->group];
        g->nparams++;
        g->numel += p->numel;
    }
    for (int gi = 0; gi < m->ngroups; gi++) {
        ShardGroup *g = m->groups[gi];
        g->params = arena_alloc(sizeof(Param *) * (size_t)(g->nparams ? g->nparams : 1));
        g->nparams = 0;
        if (g->numel == 0 && !g->is_root)
            diag_warning(D, g->loc, "shard group `%s` has no parameters left to shard", g->name);
    }
    for (int i = 0; i < m->nparams; i++) {
        ShardGroup *g = m->groups[m->params[i]->group];
        g->params[g->nparams++] = m->params[i];
    }
    check_tie_groups(mb, m->root);
}

/* ── shard and train settings ── */

typedef struct SettingSpec {
    const char *name;
    SettingKind form;     /* SET_ASSIGN or SET_CALL */
    const char *example;
} SettingSpec;

static const SettingSpec shard_settings[] = {
    {"reshard_after_forward", SET_ASSIGN, "reshard_after_forward = true"},
    {"mixed_precision", SET_CALL, "mixed_precision(param = bf16, reduce = fp32)"},
    {"prefetch", SET_CALL, "prefetch(forward = 1, backward = 1)"},
    {"offload", SET_ASSIGN, "offload = none"},
    {"memory_budget", SET_ASSIGN, "memory_budget = 70GiB"},
    {"accumulate", SET_ASSIGN, "accumulate = sharded"},
    {"reshard_after_backward", SET_ASSIGN, "reshard_after_backward = true"},
    {"recompute", SET_ASSIGN, "recompute = full"},
    {"replicate", SET_ASSIGN, "replicate = 2"},
    {NULL, 0, NULL},
};

static const SettingSpec train_settings[] = {
    {"micro_batch", SET_ASSIGN, "micro_batch = 8"},
    {"grad_accum", SET_ASSIGN, "grad_accum = 4"},
    {"steps", SET_ASSIGN, "steps = 1000"},
    {"seed", SET_ASSIGN, "seed = 1337"},
    {"optimizer", SET_ASSIGN, "optimizer = adamw(lr = 3e-4)"},
    {"lr_schedule", SET_ASSIGN, "lr_schedule = cosine(warmup = 100, min_lr = 3e-5)"},
    {"grad_clip", SET_ASSIGN, "grad_clip = 1.0"},
    {"checkpoint", SET_CALL, "checkpoint(every = 1000, dir = \"ckpt\")"},
    {"data", SET_ASSIGN, "data = \"train.bin\""},
    {"val_data", SET_ASSIGN, "val_data = \"val.bin\""},
    {"eval", SET_CALL, "eval(every = 100, sequences = 64)"},
    {NULL, 0, NULL},
};

/* Checks the form of each setting and that none repeats; returns the
 * settings indexed like specs. */
static void collect_settings(Build *mb, Section *sec, const SettingSpec *specs, Setting **by)
{
    Diag *D = mb->d;
    const char *names[32] = {0};
    int n = 0;
    while (specs[n].name) {
        names[n] = specs[n].name;
        by[n] = NULL;
        n++;
    }
    if (!sec)
        return;
    const char *sname = sec->kind == SEC_SHARD ? "shard" : "train";
    for (Setting *st = sec->settings; st; st = st->next) {
        if (st->kind == SET_FULLY_SHARD) {
            if (sec->kind != SEC_SHARD)
                diag_error(D, st->loc, "`fully_shard` belongs in the `shard` section");
            continue;
        }
        int i = 0;
        while (i < n && strcmp(specs[i].name, st->name) != 0)
            i++;
        if (i == n) {
            diag_error(D, st->name_loc, "unknown %s setting `%s`%s", sname, st->name,
                       diag_suggest(st->name, names));
            continue;
        }
        if (st->kind != specs[i].form) {
            diag_error(D, st->loc, "`%s` is written `%s`", st->name, specs[i].example);
            continue;
        }
        if (by[i]) {
            diag_error(D, st->name_loc, "`%s` is already set at %s", st->name,
                       diag_where(D, by[i]->name_loc));
            continue;
        }
        by[i] = st;
    }
}

static void check_shard(Build *mb)
{
    Model *m = mb->m;
    ShardConfig *c = &m->shard;
    Scope sc = {mb->model_sec->decls, NULL, mb->root_type};
    int64_t auto_bucket = c->auto_bucket_bytes;   /* set by plan_groups */
    *c = (ShardConfig){.reshard_after_forward = -1, .prefetch_forward = 1,
                       .prefetch_backward = 1, .reshard_after_backward = true, .replicate = 1};
    c->auto_bucket_bytes = auto_bucket;
    Setting *by[16];
    collect_settings(mb, mb->shard_sec, shard_settings, by);
    if (by[0]) {
        ReshardSpec rs;
        if (parse_reshard(mb, by[0]->value, &rs)) {
            c->reshard_after_forward = rs.reshard;
            c->reshard_ranks = rs.ranks;
            c->reshard_ranks_loc = rs.loc;
            c->reshard_after_forward_loc = by[0]->loc;
        }
    }
    if (by[1]) {
        MixedSpec ms;
        parse_mixed(mb, by[1]->loc, by[1]->args, &ms);
        DType *dst[MP_NDTYPES] = {&c->param_dtype, &c->reduce_dtype, &c->output_dtype};
        for (int i = 0; i < MP_NDTYPES; i++)
            if (ms.set[i])
                *dst[i] = ms.dtype[i];
        c->mixed_loc = by[1]->loc;
        /* bf16 parameters compute in bf16 and write bf16 gradients,
         * which are reduced in bf16 or widened to fp32: fp16 would
         * narrow them to a dtype with less range */
        if (c->param_dtype == DTYPE_BF16 && c->reduce_dtype == DTYPE_FP16)
            diag_error(mb->d, ms.loc[MP_REDUCE],
                       "`reduce = fp16` with `param = bf16`: bf16 gradients are reduced in "
                       "bf16 or fp32");
    }
    if (by[2]) {
        Arg *b[MAX_ARGS];
        if (eval_bind_args(mb->d, &sig_prefetch, by[2]->loc, by[2]->args, b)) {
            int64_t v;
            int *dst[2] = {&c->prefetch_forward, &c->prefetch_backward};
            bool *set[2] = {&c->prefetch_forward_set, &c->prefetch_backward_set};
            Loc *at[2] = {&c->prefetch_forward_loc, &c->prefetch_backward_loc};
            for (int i = 0; i < 2; i++)
                if (b[i] && eval_int(mb->d, &sc, b[i]->value,
                                     arena_printf("`prefetch` argument `%s`",
                                                  sig_prefetch.args[i].name),
                                     0, &v)) {
                    if (v > MAX_PREFETCH)
                        diag_error(mb->d, b[i]->value->loc, "prefetch depth %" PRId64
                                                           " is more than %d groups ahead",
                                   v, MAX_PREFETCH);
                    else {
                        *dst[i] = (int)v;
                        *set[i] = true;
                        *at[i] = b[i]->loc;
                    }
                }
        }
    }
    if (by[3]) {
        int v;
        if (eval_enum(mb->d, by[3]->value, "`offload`", offload_choices, &v))
            c->offload_cpu = v == 1;
    }
    if (by[4]) {
        Value v;
        if (eval_fold(mb->d, &sc, by[4]->value, &v)) {
            if (v.kind != V_INT || !by[4]->value->is_size)
                diag_error(mb->d, by[4]->value->loc, "`memory_budget` is a size with a unit, "
                                                    "like 70GiB");
            else if (v.i <= 0)
                diag_error(mb->d, by[4]->value->loc, "`memory_budget` must be positive");
            else
                c->memory_budget_bytes = v.i;
            c->memory_budget_loc = by[4]->loc;
        }
    }
    /* Gradient accumulation: `sharded` reduce-scatters every micro-batch and
     * accumulates shards (less memory); `unsharded` keeps full gradients and
     * reduce-scatters on the last micro-batch only (less traffic; FSDP2's
     * set_requires_gradient_sync(False) on the others). */
    if (by[5]) {
        int v;
        if (eval_enum(mb->d, by[5]->value, "`accumulate`", accumulate_choices, &v))
            c->accumulate_unsharded = v == 1;
    }
    /* FSDP2's set_reshard_after_backward(False): parameters gathered in a
     * micro-batch stay gathered until the step's last backward, trading
     * memory for the all-gathers of the later micro-batches. */
    if (by[6]) {
        bool v;
        if (eval_bool(mb->d, &sc, by[6]->value, "`reshard_after_backward`", &v))
            c->reshard_after_backward = v;
    }
    /* the default every unit without a per-target setting takes */
    if (by[7])
        parse_recompute(mb, by[7]->value, &c->recompute);
    /* replicate = R: FSDP2's 2-D DeviceMesh (HSDP, docs/design.md#hsdp): R
     * replicas of W/R consecutive ranks, each replica sharding every group
     * over its own ranks. Whether R divides the world is known only with
     * --world (main.c checks it) or when the trainer starts.
     * `replicate = auto` leaves R to the planner (plan_choose): 1 until it
     * has chosen (docs/design.md#replicate-auto). */
    if (by[8] && by[8]->value->kind == EX_IDENT && strcmp(by[8]->value->str, "auto") == 0) {
        c->replicate_auto = true;
        c->replicate_loc = by[8]->value->loc;
    } else if (by[8] && by[8]->value->kind == EX_IDENT &&
               !eval_lookup(&sc, by[8]->value->str, &(bool){false})) {
        diag_error(mb->d, by[8]->value->loc,
                   "`replicate` is a whole number of replicas or `auto`, and `%s` is "
                   "neither (nor a constant)",
                   by[8]->value->str);
    } else if (by[8]) {
        int64_t v;
        if (eval_int(mb->d, &sc, by[8]->value, "`replicate`", 1, &v)) {
            c->replicate = v;
            c->replicate_loc = by[8]->value->loc;
        }
    }
}

/* Each group's dtypes: its fully_shard line's mixed_precision(...) over
 * the shard section's (docs/design.md#per-target-mixed-precision). The
 * compute dtype is the program's (compute_dtype: bf16 when the shard
 * section gathers in bf16), and a group's unsharded parameters and
 * gradients are stored in it; so a group may gather in a dtype other than
 * the shard section's only where the program computes in fp32 (the gather
 * is widened to fp32, as `param = fp16` is), and may reduce in any dtype
 * the shard section could. */
static void group_dtypes(Build *mb)
{
    Model *m = mb->m;
    ShardConfig *c = &m->shard;
    bool bf16_program = compute_dtype(m) == DTYPE_BF16;
    /* the groups of one line (`blocks[*]`) share its spec: one error each */
    const MixedSpec **seen = arena_alloc(sizeof *seen * (size_t)(m->ngroups + 1));
    int nseen = 0;
    for (int gi = 0; gi < m->ngroups; gi++) {
        ShardGroup *g = m->groups[gi];
        const MixedSpec *s = g->mixed;
        g->param_dtype = s && s->set[MP_PARAM] ? s->dtype[MP_PARAM] : c->param_dtype;
        g->reduce_dtype = s && s->set[MP_REDUCE] ? s->dtype[MP_REDUCE] : c->reduce_dtype;
        g->output_dtype = s && s->set[MP_OUTPUT] ? s->dtype[MP_OUTPUT] : c->output_dtype;
        if (!s || !bf16_program)
            continue;
        bool again = false;
        for (int k = 0; k < nseen && !again; k++)
            again = seen[k] == s;
        if (again)
            continue;
        seen[nseen++] = s;
        int others = -1;
        for (int k = 0; k < m->ngroups; k++)
            others += m->groups[k]->mixed == s;
        const char *who = others ? arena_printf("`%s` (and the line's %d other target%s)",
                                                g->name, others, others == 1 ? "" : "s")
                                 : arena_printf("`%s`", g->name);
        if (g->param_dtype != DTYPE_BF16)
            diag_error(mb->d, s->loc[MP_PARAM],
                       "`param = %s` on %s: the program computes in bf16 (the shard "
                       "section's `param = bf16` at %s) and every group stores its unsharded "
                       "parameters in the compute dtype, so what it gathers in %s would be "
                       "rounded to bf16 after the gather (%s); leave `param` out on this line to gather in bf16, "
                       "or make the program fp32 with `param = fp32` in the shard section and "
                       "write `param = bf16` on the targets that should gather in bf16",
                       dtype_name(g->param_dtype), who, diag_where(mb->d, c->mixed_loc),
                       dtype_name(g->param_dtype),
                       g->param_dtype == DTYPE_FP32
                           ? "the same bits as a bf16 gather, at twice the bytes"
                           : "rounded twice, to fp16 and then to bf16");
        if (g->reduce_dtype == DTYPE_FP16)
            diag_error(mb->d, s->loc[MP_REDUCE],
                       "`reduce = fp16` on %s: the program computes in bf16 (the shard "
                       "section's `param = bf16` at %s), and bf16 gradients are reduced in "
                       "bf16 or fp32",
                       who, diag_where(mb->d, c->mixed_loc));
    }
}

/* Marks the elements of the layer arrays under L units, the outermost
 * arrays only (an array inside an element is part of that element);
 * returns how many. */
static int mark_array_elements(Layer *L, const RecomputeSpec *spec)
{
    if (L->kind == LK_ARRAY) {
        for (int i = 0; i < L->nchildren; i++)
            L->children[i]->recompute = spec;
        return L->nchildren;
    }
    int n = 0;
    for (int i = 0; i < L->nchildren; i++)
        n += mark_array_elements(L->children[i], spec);
    return n;
}

/* The units of recomputation and the setting each follows
 * (docs/design.md#activation-recomputation): every instance of a non-root
 * fully_shard target, its line's `(recompute = ...)` winning over the shard
 * section's `recompute`; under fully_shard auto, whose groups the planner
 * makes, each element of the model's layer arrays (each transformer block,
 * the unit torchtitan checkpoints). A shard-wide mode with nothing to apply
 * to is an error: it would change nothing. */
static void assign_recompute(Build *mb)
{
    Model *m = mb->m;
    const RecomputeSpec *wide = &m->shard.recompute;
    int n = 0;
    if (m->shard.auto_bucket_bytes) {
        n = mark_array_elements(m->root, wide);
    } else {
        for (int i = 0; i < m->ngroups; i++) {
            Layer *t = m->groups[i]->target;
            if (!t)
                continue;
            if (!t->recompute)
                t->recompute = wide;
            n++;
        }
    }
    if (n == 0 && wide->written && wide->kind != RC_NONE && wide->kind != RC_AUTO)
        diag_error(mb->d, wide->loc,
                   m->shard.auto_bucket_bytes
                       ? "`recompute = %s` has nothing to apply to: under `fully_shard "
                         "auto(...)` it covers the elements of the model's layer arrays, and "
                         "this model has none; name the layers to recompute with `fully_shard` "
                         "lines instead"
                       : "`recompute = %s` has nothing to apply to: it covers the instances of "
                         "the non-root `fully_shard` targets, and this shard section has none; "
                         "add `fully_shard` lines for the layers to recompute",
                   model_recompute_name(wide));
}

const char *model_recompute_name(const RecomputeSpec *s)
{
    static const char *const names[] = {"none", "full", "selective", "every", "auto"};
    if (s->kind == RC_EVERY)
        return arena_printf("every(%" PRId64 ")", s->every);
    return names[s->kind];
}

static void check_lr_positive(Build *mb, Arg *a, double lr)
{
    if (!(lr > 0))
        diag_error(mb->d, a->value->loc, "learning rate must be positive, got %g", lr);
}

static void check_optimizer(Build *mb, Scope *sc, Expr *e)
{
    TrainConfig *t = &mb->m->train;
    Diag *D = mb->d;
    const char *name = e->kind == EX_CALL && e->lhs->kind == EX_IDENT ? e->lhs->str : NULL;
    Arg *b[MAX_ARGS];
    if (name && strcmp(name, "adamw") == 0) {
        t->optimizer = OPT_ADAMW;
        if (!eval_bind_args(mb->d, &sig_adamw, e->loc, e->args, b))
            return;
        if (eval_float(mb->d, sc, b[0]->value, "`adamw` argument `lr`", &t->lr))
            check_lr_positive(mb, b[0], t->lr);
        if (b[1]) {
            Expr *p = b[1]->value;
            double v[2];
            if (p->kind != EX_TUPLE || !p->args->next || p->args->next->next) {
                diag_error(D, p->loc, "`betas` is a pair: `betas = (0.9, 0.95)`");
            } else if (eval_float(mb->d, sc, p->args->value, "beta1", &v[0]) &&
                       eval_float(mb->d, sc, p->args->next->value, "beta2", &v[1])) {
                for (int i = 0; i < 2; i++)
                    if (!(v[i] >= 0 && v[i] < 1))
                        diag_error(D, (i ? p->args->next : p->args)->value->loc,
                                   "beta%d must be in [0, 1), got %g", i + 1, v[i]);
                t->beta1 = v[0];
                t->beta2 = v[1];
            }
        }
        if (b[2] && eval_float(mb->d, sc, b[2]->value, "`adamw` argument `eps`", &t->eps) &&
            !(t->eps > 0))
            diag_error(D, b[2]->value->loc, "`eps` must be positive, got %g", t->eps);
        if (b[3] && eval_float(mb->d, sc, b[3]->value, "`adamw` argument `weight_decay`",
                               &t->weight_decay) &&
            !(t->weight_decay >= 0))
            diag_error(D, b[3]->value->loc, "`weight_decay` must be zero or more, got %g",
                       t->weight_decay);
        return;
    }
    if (name && strcmp(name, "sgd") == 0) {
        t->optimizer = OPT_SGD;
        t->weight_decay = 0;
        if (!eval_bind_args(mb->d, &sig_sgd, e->loc, e->args, b))
            return;
        if (eval_float(mb->d, sc, b[0]->value, "`sgd` argument `lr`", &t->lr))
            check_lr_positive(mb, b[0], t->lr);
        if (b[1] && eval_float(mb->d, sc, b[1]->value, "`sgd` argument `momentum`", &t->momentum) &&
            !(t->momentum >= 0 && t->momentum < 1))
            diag_error(D, b[1]->value->loc, "`momentum` must be in [0, 1), got %g", t->momentum);
        if (b[2] && eval_float(mb->d, sc, b[2]->value, "`sgd` argument `weight_decay`",
                               &t->weight_decay) &&
            !(t->weight_decay >= 0))
            diag_error(D, b[2]->value->loc, "`weight_decay` must be zero or more, got %g",
                       t->weight_decay);
        if (b[3])
            eval_bool(mb->d, sc, b[3]->value, "`sgd` argument `nesterov`", &t->nesterov);
        return;
    }
    static const char *const opts[] = {"adamw", "sgd", NULL};
    diag_error(D, e->loc, "`optimizer` must be `adamw(lr = ...)` or `sgd(lr = ...)`%s",
               name ? diag_suggest(name, opts)
               : e->kind == EX_IDENT ? diag_suggest(e->str, opts)
                                     : "");
}

/* wsd's decay steps: the fraction `decay` of `steps`, rounded to the
 * nearest, at least 1 and at most steps (runtime/lr.c takes the same). */
static int64_t lr_decay_steps(double decay, int64_t steps)
{
    double d = floor(decay * (double)steps + 0.5);
    return d < 1 ? 1 : d > (double)steps ? steps : (int64_t)d;
}

/* lr_schedule = constant | constant(warmup = W)
 *             | cosine(warmup = W, min_lr = m) | linear(warmup = W, min_lr = m)
 *             | wsd(warmup = W, decay = f, min_lr = m)
 * (docs/design.md#learning-rate-schedule). The warmup must fit in the
 * section's steps (`steps_set`, or the default), min_lr in [0, lr], wsd's
 * decay in (0, 1], and wsd's warmup and decay together in the steps; a
 * trainer's --steps may still shorten the run (the runtime's formulas say
 * what then happens). `opt` is the optimizer setting, for min_lr's message. */
static void check_schedule(Build *mb, Scope *sc, Expr *e, Setting *steps_set, Setting *opt)
{
    Diag *D = mb->d;
    TrainConfig *t = &mb->m->train;
    static const struct {
        const char *name;
        LrSchedule kind;
        const Signature *sig;
    } forms[] = {{"constant", SCHED_CONSTANT, &sig_constant},
                 {"cosine", SCHED_COSINE, &sig_cosine},
                 {"linear", SCHED_LINEAR, &sig_linear},
                 {"wsd", SCHED_WSD, &sig_wsd}};
    static const char *const names[] = {"constant", "cosine", "linear", "wsd", NULL};
    const char *name = e->kind == EX_IDENT                                ? e->str
                       : e->kind == EX_CALL && e->lhs->kind == EX_IDENT ? e->lhs->str
                                                                        : NULL;
    int f = 0;
    while (name && f < 4 && strcmp(forms[f].name, name) != 0)
        f++;
    if (e->kind == EX_IDENT && f > 0 && f < 4) {
        diag_error(D, e->loc, "`lr_schedule = %s` needs its parentheses: %s", name,
                   f == 3 ? "`wsd(warmup = ..., decay = ..., min_lr = ...)` (decay required)"
                          : arena_printf("`%s(warmup = ..., min_lr = ...)`, or `%s()` for "
                                         "no warmup and min_lr 0", name, name));
        return;
    }
    if (!name || f == 4) {
        diag_error(D, e->loc, "`lr_schedule` must be `constant`, `constant(warmup = ...)`, "
                              "`cosine(warmup = ..., min_lr = ...)`, `linear(warmup = ..., "
                              "min_lr = ...)` or `wsd(warmup = ..., decay = ..., min_lr = ...)`%s",
                   name && f == 4 ? diag_suggest(name, names) : "");
        return;
    }
    t->schedule = forms[f].kind;
    if (e->kind == EX_IDENT)
        return;
    Arg *b[MAX_ARGS];
    if (!eval_bind_args(D, forms[f].sig, e->loc, e->args, b))
        return;
    const char *what = forms[f].name;
    /* argument positions: warmup first; min_lr last (wsd: decay between) */
    Arg *warmup = b[0], *decay = t->schedule == SCHED_WSD ? b[1] : NULL;
    Arg *min_lr = t->schedule == SCHED_WSD ? b[2] : t->schedule == SCHED_CONSTANT ? NULL : b[1];
    const char *steps_from = steps_set
                                 ? arena_printf("`steps` at %s", diag_where(D, steps_set->value->loc))
                                 : "the default `steps`";
    if (warmup && eval_int(D, sc, warmup->value, arena_printf("`%s` argument `warmup`", what), 0,
                           &t->warmup) &&
        t->warmup > t->steps)
        diag_error(D, warmup->value->loc, "`warmup` is %" PRId64 " steps, more than the %" PRId64
                                          " the run has (%s)",
                   t->warmup, t->steps, steps_from);
    if (min_lr && eval_float(D, sc, min_lr->value, arena_printf("`%s` argument `min_lr`", what),
                             &t->min_lr)) {
        if (!(t->min_lr >= 0))
            diag_error(D, min_lr->value->loc, "`min_lr` must be zero or more");
        else if (t->lr > 0 && t->min_lr > t->lr)
            diag_error(D, min_lr->value->loc, "`min_lr` %g is larger than the optimizer's lr %g "
                                              "(at %s)",
                       t->min_lr, t->lr, diag_where(D, opt->value->loc));
    }
    if (decay && eval_float(D, sc, decay->value, "`wsd` argument `decay`", &t->decay)) {
        if (!(t->decay > 0 && t->decay <= 1))
            diag_error(D, decay->value->loc, "`decay` is the fraction of the steps that decays: "
                                             "more than 0 and at most 1, got %g",
                       t->decay);
        else if (t->warmup <= t->steps &&
                 t->warmup + lr_decay_steps(t->decay, t->steps) > t->steps)
            diag_error(D, e->loc, "`wsd` warms up for %" PRId64 " steps and decays over the last "
                                  "%" PRId64 " (%g of %" PRId64 ", %s): together more than the "
                                  "run's steps; lower `warmup` or `decay`",
                       t->warmup, lr_decay_steps(t->decay, t->steps), t->decay, t->steps,
                       steps_from);
    }
}

static void check_train(Build *mb)
{
    Model *m = mb->m;
    Diag *D = mb->d;
    TrainConfig *t = &m->train;
    Scope sc = {mb->model_sec->decls, NULL, mb->root_type};
    *t = (TrainConfig){.micro_batch = 1, .grad_accum = 1, .steps = 1000, .seed = 1337,
                       .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                       .schedule = SCHED_CONSTANT, .ckpt_dir = "ckpt"};
    Setting *by[16];
    collect_settings(mb, mb->train_sec, train_settings, by);
    /* Upper limits keep every size the planner multiplies (B·T·width) and
     * every step count well inside 64 bits. */
    int64_t *ints[4] = {&t->micro_batch, &t->grad_accum, &t->steps, &t->seed};
    static const int64_t most[4] = {1 << 20, 1 << 20, (int64_t)1 << 40, INT64_MAX};
    for (int i = 0; i < 4; i++) {
        int64_t v;
        if (!by[i] || !eval_int(mb->d, &sc, by[i]->value,
                                arena_printf("`%s`", train_settings[i].name), i == 3 ? 0 : 1,
                                &v))
            continue;
        if (v > most[i])
            diag_error(D, by[i]->value->loc, "`%s` is %" PRId64 "; the limit is %" PRId64,
                       train_settings[i].name, v, most[i]);
        else
            *ints[i] = v;
    }
    if (by[4])
        check_optimizer(mb, &sc, by[4]->value);
    else if (!D->errors)
        diag_error(D, mb->train_sec ? mb->train_sec->kw_loc : mb->model_sec->kw_loc,
                   "%s: `optimizer` has no default; add `optimizer = adamw(lr = 3e-4)` to "
                   "the `train` section",
                   mb->train_sec ? "the train section sets no optimizer" : "no `train` section");
    if (by[5])
        check_schedule(mb, &sc, by[5]->value, by[2], by[4]);
    if (by[6] && eval_float(mb->d, &sc, by[6]->value, "`grad_clip`", &t->grad_clip) &&
        !(t->grad_clip > 0))
        diag_error(D, by[6]->value->loc, "`grad_clip` must be positive, got %g", t->grad_clip);
    if (by[7]) {
        Arg *b[MAX_ARGS];
        if (eval_bind_args(mb->d, &sig_checkpoint, by[7]->loc, by[7]->args, b)) {
            eval_int(mb->d, &sc, b[0]->value, "`checkpoint` argument `every`", 1, &t->ckpt_every);
            if (b[1])
                eval_string(mb->d, b[1]->value, "`checkpoint` argument `dir`", &t->ckpt_dir);
            if (b[2])
                eval_bool(mb->d, &sc, b[2]->value, "`checkpoint` argument `async`", &t->ckpt_async);
            if (b[3])
                eval_int(mb->d, &sc, b[3]->value, "`checkpoint` argument `keep`", 0, &t->ckpt_keep);
        }
    }
    if (by[8])
        eval_string(mb->d, by[8]->value, "`data`", &t->data);
    if (by[9])
        eval_string(mb->d, by[9]->value, "`val_data`", &t->val_data);
    if (by[10]) {
        Arg *b[MAX_ARGS];
        if (eval_bind_args(mb->d, &sig_eval, by[10]->loc, by[10]->args, b)) {
            eval_int(mb->d, &sc, b[0]->value, "`eval` argument `every`", 1, &t->eval_every);
            if (b[1])
                eval_int(mb->d, &sc, b[1]->value, "`eval` argument `sequences`", 1,
                         &t->eval_sequences);
        }
    }
}

/* ── --dump-model ── */

/* ", init=normal(std=X)" when X is not the default, so dumps of models
 * that leave init alone keep their form; Linears inside an Attention or an
 * MLP show their own (the parent shows init and out_init) */
static void dump_init(FILE *out, const char *arg, double std)
{
    if (std != INIT_STD_DEFAULT)
        fprintf(out, ", %s=normal(std=%.9g)", arg, std);
}

static void dump_layer(FILE *out, Model *m, Layer *L, int depth)
{
    fprintf(out, "%*s%-*s ", depth * 2, "", 34 - depth * 2, L->path);
    switch (L->kind) {
    case LK_LINEAR:
        fprintf(out, "Linear(in=%" PRId64 ", out=%" PRId64 ", bias=%s", L->in, L->out,
                L->bias ? "true" : "false");
        if (L->tie)
            fprintf(out, ", tie=%s", L->tie->path);
        else
            dump_init(out, "init", L->init_std);
        fputc(')', out);
        break;
    case LK_EMBEDDING:
        fprintf(out, "Embedding(n=%" PRId64 ", dim=%" PRId64, L->n, L->dim);
        dump_init(out, "init", L->init_std);
        fputc(')', out);
        break;
    case LK_LAYERNORM:
    case LK_RMSNORM:
        fprintf(out, "%s(dim=%" PRId64 ", eps=%g", layer_kind_name(L->kind), L->dim, L->eps);
        if (L->kind == LK_LAYERNORM && !L->bias)
            fputs(", bias=false", out);   /* shown only when off, as dumps had it */
        fputc(')', out);
        break;
    case LK_ATTENTION:
        fprintf(out, "Attention(dim=%" PRId64 ", heads=%" PRId64 ", kv_heads=%" PRId64
                     ", head_dim=%" PRId64 ", causal=%s, rope=",
                L->dim, L->heads, L->kv_heads, L->dim / L->heads, L->causal ? "true" : "false");
        if (L->rope_theta > 0)
            fprintf(out, "rope(theta=%g)", L->rope_theta);
        else
            fputs("none", out);
        fprintf(out, ", bias=%s", !L->bias ? "false" : L->out_bias ? "true" : "qkv");
        if (L->qk_norm)   /* shown only when on, so other dumps keep their form */
            fprintf(out, ", qk_norm=rms(eps=%g)", L->eps);
        dump_init(out, "init", L->init_std);
        dump_init(out, "out_init", L->out_init_std);
        fputc(')', out);
        break;
    case LK_MLP:
        fprintf(out, "MLP(dim=%" PRId64 ", hidden=%" PRId64 ", act=%s, bias=%s", L->dim,
                L->hidden, L->act == ACT_GELU ? "gelu" : L->act == ACT_RELU ? "relu" : "swiglu",
                L->bias ? "true" : "false");
        dump_init(out, "init", L->init_std);
        dump_init(out, "out_init", L->out_init_std);
        fputc(')', out);
        break;
    case LK_BLOCK: fprintf(out, "%s", L->mtype->name); break;
    case LK_ARRAY: fprintf(out, "%s[%" PRId64 "]", L->mtype->name, L->count); break;
    }
    fputc('\n', out);
    Param *ps[2] = {L->weight, L->bias_p};
    for (int i = 0; i < 2; i++) {
        Param *p = ps[i];
        if (!p)
            continue;
        char shape[64];
        if (p->rank == 2)
            snprintf(shape, sizeof shape, "[%" PRId64 ", %" PRId64 "]", p->shape[0], p->shape[1]);
        else
            snprintf(shape, sizeof shape, "[%" PRId64 "]", p->shape[0]);
        const char *init = p->init == INIT_ZEROS  ? "zeros"
                           : p->init == INIT_ONES ? "ones"
                           : p->std == INIT_STD_DEFAULT
                               ? "normal"
                               : arena_printf("normal(std=%.9g)", p->std);
        fprintf(out, "%*s%-*s %-16s %14s  %-7s group %s\n", depth * 2 + 2, "", 32 - depth * 2,
                p->name, shape, fmt_count(p->numel), init, m->groups[p->group]->name);
    }
    for (int i = 0; i < L->nchildren; i++)
        dump_layer(out, m, L->children[i], depth + 1);
}

static void dump_signature(FILE *out, ModuleType *t)
{
    fprintf(out, "  %s.forward(", t->name);
    int i = 0;
    for (Name *n = t->forward->params; n; n = n->next, i++)
        fprintf(out, "%s%s: %s", i ? ", " : "", n->name, eval_type_name(&t->in_ty[i]));
    fprintf(out, ") -> %s\n", eval_type_name(&t->out_ty));
}

void model_dump(FILE *out, Model *m)
{
    fprintf(out, "model %s\n", m->name);
    fprintf(out, "  parameters %s (%" PRId64 ")\n", fmt_count(m->numel), m->numel);
    fprintf(out, "  tensors    %d\n", m->nparams);
    fprintf(out, "  seq        %" PRId64 "\n", m->seq);
    fprintf(out, "  vocab      %" PRId64 "\n", m->vocab);
    fputs("\nlayers\n", out);
    for (int i = 0; i < m->root->nchildren; i++)
        dump_layer(out, m, m->root->children[i], 1);
    fputs("\nforward (B is the micro-batch)\n", out);
    for (int i = 1; i < m->ntypes; i++)
        if (m->types[i]->checked)
            dump_signature(out, m->types[i]);
    dump_signature(out, m->types[0]);
    if (m->shard.auto_bucket_bytes) {
        fprintf(out, "\nshard groups: fully_shard auto(bucket = %" PRId64 " bytes) lets the "
                     "planner choose them (see --dump-plan)\n",
                m->shard.auto_bucket_bytes);
    } else {
        fputs("\nshard groups (bottom-up: children first, root last)\n", out);
        for (int i = 0; i < m->ngroups; i++) {
            ShardGroup *g = m->groups[i];
            fprintf(out, "  %3d %-24s %3d tensors %14s params", g->index, g->name,
                    g->nparams, fmt_count(g->numel));
            /* a per-target argument, when the line has one */
            if (g->target && g->target->recompute && g->target->recompute->per_target)
                fprintf(out, "  (recompute = %s)", model_recompute_name(g->target->recompute));
            if (g->mixed)
                fprintf(out, "  (%s)", model_mixed_name(g->mixed));
            if (g->reshard_own)
                fprintf(out, "  (reshard_after_forward = %s)", model_reshard_name(g->reshard_own));
            fputc('\n', out);
        }
    }
    ShardConfig *c = &m->shard;
    fputs("\nshard\n", out);
    if (c->reshard_after_forward < 0)
        fputs("  reshard_after_forward = default (true; false for the root)\n", out);
    else if (c->reshard_ranks)
        fprintf(out, "  reshard_after_forward = %" PRId64 "\n", c->reshard_ranks);
    else
        fprintf(out, "  reshard_after_forward = %s\n", c->reshard_after_forward ? "true" : "false");
    fprintf(out, "  mixed_precision(param = %s, reduce = %s, output = %s)\n",
            dtype_name(c->param_dtype), dtype_name(c->reduce_dtype), dtype_name(c->output_dtype));
    fprintf(out, "  prefetch(forward = %d, backward = %d)\n", c->prefetch_forward,
            c->prefetch_backward);
    fprintf(out, "  offload = %s\n", c->offload_cpu ? "cpu" : "none");
    fprintf(out, "  accumulate = %s\n", c->accumulate_unsharded ? "unsharded" : "sharded");
    /* shown only when set off its default, so dumps of other models keep their form */
    if (!c->reshard_after_backward)
        fputs("  reshard_after_backward = false\n", out);
    if (c->memory_budget_bytes)
        fprintf(out, "  memory_budget = %" PRId64 " bytes\n", c->memory_budget_bytes);
    if (c->recompute.written)
        fprintf(out, "  recompute = %s\n", model_recompute_name(&c->recompute));
    if (c->replicate_auto)
        fputs("  replicate = auto\n", out);
    else if (c->replicate > 1)
        fprintf(out, "  replicate = %" PRId64 "\n", c->replicate);
    TrainConfig *t = &m->train;
    fputs("\ntrain\n", out);
    fprintf(out, "  micro_batch = %" PRId64 "\n  grad_accum = %" PRId64 "\n  steps = %" PRId64
                 "\n  seed = %" PRId64 "\n",
            t->micro_batch, t->grad_accum, t->steps, t->seed);
    if (t->optimizer == OPT_ADAMW)
        fprintf(out, "  optimizer = adamw(lr = %g, betas = (%g, %g), eps = %g, weight_decay = %g)\n",
                t->lr, t->beta1, t->beta2, t->eps, t->weight_decay);
    else
        fprintf(out, "  optimizer = sgd(lr = %g, momentum = %g, weight_decay = %g, nesterov = %s)\n",
                t->lr, t->momentum, t->weight_decay, t->nesterov ? "true" : "false");
    switch (t->schedule) {
    case SCHED_CONSTANT:
        if (t->warmup)
            fprintf(out, "  lr_schedule = constant(warmup = %" PRId64 ")\n", t->warmup);
        else
            fputs("  lr_schedule = constant\n", out);
        break;
    case SCHED_COSINE:
    case SCHED_LINEAR:
        fprintf(out, "  lr_schedule = %s(warmup = %" PRId64 ", min_lr = %g)\n",
                t->schedule == SCHED_COSINE ? "cosine" : "linear", t->warmup, t->min_lr);
        break;
    case SCHED_WSD:
        fprintf(out, "  lr_schedule = wsd(warmup = %" PRId64 ", decay = %g, min_lr = %g)\n",
                t->warmup, t->decay, t->min_lr);
        break;
    }
    if (t->grad_clip > 0)
        fprintf(out, "  grad_clip = %g\n", t->grad_clip);
    else
        fputs("  grad_clip = none\n", out);
    if (t->ckpt_every)
        fprintf(out, "  checkpoint(every = %" PRId64 ", dir = \"%s\", async = %s, keep = %" PRId64
                     ")\n",
                t->ckpt_every, t->ckpt_dir, t->ckpt_async ? "true" : "false", t->ckpt_keep);
    else
        fputs("  checkpoint = none\n", out);
    if (t->data)
        fprintf(out, "  data = \"%s\"\n", t->data);
    if (t->val_data)
        fprintf(out, "  val_data = \"%s\"\n", t->val_data);
    /* shown only when set, so dumps of other models keep their form */
    if (t->eval_every && t->eval_sequences)
        fprintf(out, "  eval(every = %" PRId64 ", sequences = %" PRId64 ")\n", t->eval_every,
                t->eval_sequences);
    else if (t->eval_every)
        fprintf(out, "  eval(every = %" PRId64 ")\n", t->eval_every);
}

const char *model_mixed_name(const MixedSpec *s)
{
    const char *out = "";
    for (int i = 0; i < MP_NDTYPES; i++)
        if (s->set[i])
            out = arena_printf("%s%s%s = %s", out, out[0] ? ", " : "", sig_mixed.args[i].name,
                               dtype_name(s->dtype[i]));
    return arena_printf("mixed_precision(%s)", out);
}

const char *model_reshard_name(const ReshardSpec *s)
{
    return s->written ? arena_printf("%" PRId64, s->written) : s->reshard ? "true" : "false";
}

/* Builds the layer tree, its parameters and shard groups, and checks the
 * shard and train settings: everything after the forward bodies check. */
Model *model_build(Model *m, Diag *d)
{
    Build B = {.m = m, .d = d, .model_sec = m->model_sec, .shard_sec = m->shard_sec,
               .train_sec = m->train_sec, .root_type = m->root_type},
          *mb = &B;
    /* the layer tree and its parameters */
    m->root = new_layer(NULL, "", NULL, LK_BLOCK);
    m->root->mtype = mb->root_type;
    m->root->loc = mb->model_sec->name_loc;
    instantiate_members(mb, m->root, mb->root_type);
    m->params = mb->params;
    m->nparams = mb->nparams;
    for (int i = 0; i < m->nparams; i++) {
        if (__builtin_add_overflow(m->numel, m->params[i]->numel, &m->numel) ||
            m->numel > MAX_NUMEL) {
            diag_error(d, mb->model_sec->name_loc, "model `%s` has more than 2^53 parameters",
                       m->name);
            return NULL;
        }
    }

    plan_groups(mb, mb->shard_sec ? mb->shard_sec->settings : NULL);
    check_shard(mb);
    group_dtypes(mb);
    assign_recompute(mb);
    check_train(mb);
    return d->errors ? NULL : m;
}
