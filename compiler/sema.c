/*
 * sema.c — semantic analysis: the AST becomes a typed model.
 *
 * In order:
 *   1. sections: one model, at most one shard and one train section;
 *   2. declarations: names resolved per scope (a block sees its own members,
 *      the model's constants and the block types), constants folded,
 *      layer arguments bound and checked, block types checked for cycles;
 *   3. forward bodies: every value gets a shape and dtype, from the model's
 *      forward(idx, targets) down through each block type it calls;
 *   4. instantiation: the layer tree with every parameter (PyTorch names and
 *      layouts, docs/design.md#parameter-names-and-layouts);
 *   5. the shard section: fully_shard targets become shard groups, applied
 *      bottom-up as FSDP2 does (deeper targets first, the root takes the
 *      rest), and the shard and train settings, with their defaults.
 * Errors are collected; sema goes on after each one where it can, so a run
 * reports several, and returns NULL if there were any.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep a hostile input from exhausting memory. */
enum { MAX_LAYER_INSTANCES = 200000, MAX_ARRAY = 100000, MAX_PREFETCH = 16 };
#define MAX_NUMEL ((int64_t)1 << 53)


DeclInfo *sema_info(Decl *d)
{
    if (!d->info)
        d->info = arena_alloc(sizeof(DeclInfo));
    return d->info;
}

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

void type_str(char *buf, size_t n, const Type *t)
{
    size_t k = (size_t)snprintf(buf, n, "%s[", t->dtype == DT_I32 ? "i32" : "f32");
    for (int i = 0; i < t->rank && k < n; i++) {
        if (t->dim[i] == DIM_BATCH)
            k += (size_t)snprintf(buf + k, n - k, "%sB", i ? ", " : "");
        else
            k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", t->dim[i]);
    }
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

const char *type_name(const Type *t)
{
    char buf[128];
    type_str(buf, sizeof buf, t);
    return arena_strdup(buf);
}

const char *sema_value_desc(const Value *v)
{
    switch (v->kind) {
    case V_INT: return arena_printf("%" PRId64, v->i);
    case V_FLOAT: return arena_printf("%g", v->f);
    case V_BOOL: return v->i ? "true" : "false";
    case V_STRING: return "a string";
    case V_NONE: return "nothing";
    }
    fsd_unreachable();
}

/* ── scopes ──
 * The model's scope holds its members; a block's scope holds the block's
 * members and sees the model's constants and block types. */

static Decl *find_local(Decl *decls, const char *name)
{
    for (Decl *d = decls; d; d = d->next)
        if (d->name && strcmp(d->name, name) == 0)
            return d;
    return NULL;
}

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u;   /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The slot of name in a module type's member index: where it is, or the
 * empty slot where it would go. */
static Decl **index_slot(ModuleType *t, const char *name)
{
    uint32_t i = name_hash(name) & t->index_mask;
    while (t->index[i] && strcmp(t->index[i]->name, name) != 0)
        i = (i + 1) & t->index_mask;
    return &t->index[i];
}

/* Looks a name up; *outer is set when it was found in an enclosing scope.
 * A scope over a module type's members uses the type's index (a file may
 * declare half a million constants); others are searched in order. */
Decl *sema_lookup(Scope *sc, const char *name, bool *outer)
{
    *outer = false;
    for (; sc; sc = sc->outer) {
        Decl *d = sc->mt && sc->mt->index && sc->decls == sc->mt->members
                      ? *index_slot(sc->mt, name)
                      : find_local(sc->decls, name);
        if (d)
            return d;
        *outer = true;
    }
    return NULL;
}

const char **sema_scope_names(Scope *sc)
{
    int n = 0;
    for (Scope *s = sc; s; s = s->outer)
        for (Decl *d = s->decls; d; d = d->next)
            n++;
    const char **names = arena_alloc(sizeof(char *) * (size_t)(n + 1));
    n = 0;
    for (Scope *s = sc; s; s = s->outer)
        for (Decl *d = s->decls; d; d = d->next)
            if (d->name)
                names[n++] = d->name;
    return names;
}

const char *sema_decl_what(Decl *d)
{
    switch (d->kind) {
    case DECL_CONST: return "a constant";
    case DECL_LAYER: return "a layer";
    case DECL_BLOCK: return "a block type";
    case DECL_FORWARD: return "a forward";
    }
    fsd_unreachable();
}

/* ── constant folding ── */

static bool fold_const_decl(Sema *s, Scope *sc, Decl *d);

/* A divisor that folded to zero; a constant's name says where it is set. */
static void zero_divisor(Sema *s, Scope *sc, Expr *rhs)
{
    bool outer;
    Decl *d = rhs->kind == EX_IDENT ? sema_lookup(sc, rhs->str, &outer) : NULL;
    if (d)
        diag_error(s->d, rhs->loc, "division by zero in constant expression: `%s` is 0 (at %s)",
                   rhs->str, diag_where(s->d, d->value->loc));
    else
        diag_error(s->d, rhs->loc, "division by zero in constant expression");
}

bool sema_fold(Sema *s, Scope *sc, Expr *e, Value *out)
{
    Diag *D = s->d;
    memset(out, 0, sizeof *out);
    switch (e->kind) {
    case EX_INT:
        out->kind = V_INT;
        out->i = e->ival;
        return true;
    case EX_FLOAT:
        out->kind = V_FLOAT;
        out->f = e->fval;
        return true;
    case EX_BOOL:
        out->kind = V_BOOL;
        out->i = e->ival;
        return true;
    case EX_STRING:
        out->kind = V_STRING;
        out->s = e->str;
        return true;
    case EX_IDENT: {
        bool outer;
        Decl *d = sema_lookup(sc, e->str, &outer);
        if (!d) {
            diag_error(D, e->loc, "undefined name `%s`%s", e->str,
                       diag_suggest(e->str, sema_scope_names(sc)));
            return false;
        }
        if (d->kind != DECL_CONST) {
            diag_error(D, e->loc, "`%s` is %s (declared at %s), not a constant", e->str,
                       sema_decl_what(d), diag_where(D, d->name_loc));
            return false;
        }
        DeclInfo *di = sema_info(d);
        if (di->state == 0 && !outer) {
            diag_error(D, e->loc, "constant `%s` is used before its definition at %s", e->str,
                       diag_where(D, d->name_loc));
            return false;
        }
        if (di->state == 0 && !fold_const_decl(s, sc->outer, d))
            return false;
        if (di->state == 1) {
            diag_error(D, e->loc, "constant `%s` is defined in terms of itself", e->str);
            return false;
        }
        if (!di->ok)
            return false;
        *out = di->value;
        return true;
    }
    case EX_NEG: {
        if (!sema_fold(s, sc, e->lhs, out))
            return false;
        if (out->kind == V_INT) {
            if (out->i == INT64_MIN) {
                diag_error(D, e->loc, "integer overflow in constant expression");
                return false;
            }
            out->i = -out->i;
            return true;
        }
        if (out->kind == V_FLOAT) {
            out->f = -out->f;
            return true;
        }
        diag_error(D, e->loc, "`-` needs a number, not %s", sema_value_desc(out));
        return false;
    }
    case EX_BINOP: {
        Value a, b;
        if (!sema_fold(s, sc, e->lhs, &a) | !sema_fold(s, sc, e->rhs, &b))
            return false;
        if ((a.kind != V_INT && a.kind != V_FLOAT) || (b.kind != V_INT && b.kind != V_FLOAT)) {
            diag_error(D, e->loc, "`%s` needs two numbers, got %s and %s", ast_op_name(e->op),
                       sema_value_desc(&a), sema_value_desc(&b));
            return false;
        }
        if (a.kind == V_INT && b.kind == V_INT) {
            int64_t r = 0;
            bool ovf = false;
            switch (e->op) {
            case '+': ovf = __builtin_add_overflow(a.i, b.i, &r); break;
            case '-': ovf = __builtin_sub_overflow(a.i, b.i, &r); break;
            case '*': ovf = __builtin_mul_overflow(a.i, b.i, &r); break;
            case '/':
            case '%':
                if (b.i == 0) {
                    zero_divisor(s, sc, e->rhs);
                    return false;
                }
                if (a.i == INT64_MIN && b.i == -1)
                    ovf = true;
                else
                    r = e->op == '/' ? a.i / b.i : a.i % b.i;
                break;
            }
            if (ovf) {
                diag_error(D, e->loc, "integer overflow in constant expression");
                return false;
            }
            out->kind = V_INT;
            out->i = r;
            return true;
        }
        double x = a.kind == V_INT ? (double)a.i : a.f, y = b.kind == V_INT ? (double)b.i : b.f;
        double r = 0;
        switch (e->op) {
        case '+': r = x + y; break;
        case '-': r = x - y; break;
        case '*': r = x * y; break;
        case '/':
            if (y == 0) {
                zero_divisor(s, sc, e->rhs);
                return false;
            }
            r = x / y;
            break;
        case '%':
            diag_error(D, e->loc, "`%%` needs integers");
            return false;
        }
        if (!isfinite(r)) {
            diag_error(D, e->loc, "constant expression is out of range");
            return false;
        }
        out->kind = V_FLOAT;
        out->f = r;
        return true;
    }
    case EX_CALL:
    case EX_INDEX:
    case EX_MEMBER:
    case EX_TUPLE:
    case EX_STAR:
        diag_error(D, e->loc, "expected a constant expression");
        return false;
    }
    fsd_unreachable();
}

static bool fold_const_decl(Sema *s, Scope *sc, Decl *d)
{
    DeclInfo *di = sema_info(d);
    if (di->state == 2)
        return di->ok;
    di->state = 1;
    di->ok = sema_fold(s, sc, d->value, &di->value);
    if (di->ok && di->value.kind == V_STRING) {
        diag_error(s->d, d->value->loc, "constant `%s` must be a number or a boolean", d->name);
        di->ok = false;
    }
    di->state = 2;
    return di->ok;
}

/* ── argument binding ──
 * Built-in layers, functions of the settings (adamw, cosine, ...) and
 * their arguments, with types, defaults and required ones. */

static const char *const act_choices[] = {"gelu", "relu", "swiglu", NULL};

static const Signature layer_sigs[] = {
    [LK_LINEAR] = {"Linear", {{"in", A_INT, true}, {"out", A_INT, true}, {"bias", A_BOOL},
                              {"tie", A_LAYER}}},
    [LK_EMBEDDING] = {"Embedding", {{"n", A_INT, true}, {"dim", A_INT, true}}},
    [LK_LAYERNORM] = {"LayerNorm", {{"dim", A_INT, true}, {"eps", A_FLOAT}}},
    [LK_RMSNORM] = {"RMSNorm", {{"dim", A_INT, true}, {"eps", A_FLOAT}}},
    [LK_ATTENTION] = {"Attention", {{"dim", A_INT, true}, {"heads", A_INT, true},
                                    {"kv_heads", A_INT}, {"causal", A_BOOL}, {"rope", A_ROPE},
                                    {"bias", A_BOOL}}},
    [LK_MLP] = {"MLP", {{"dim", A_INT, true}, {"hidden", A_INT, true},
                        {"act", A_ENUM, false, act_choices}, {"bias", A_BOOL}}},
};

static const Signature sig_rope = {"rope", {{"theta", A_FLOAT}}};

static int sig_nargs(const Signature *sig)
{
    int n = 0;
    while (n < MAX_ARGS && sig->args[n].name)
        n++;
    return n;
}

static const char *sig_arg_list(const Signature *sig)
{
    const char *s = "";
    for (int i = 0; i < sig_nargs(sig); i++)
        s = arena_printf("%s%s%s", s, i ? ", " : "", sig->args[i].name);
    return s;
}

/* Matches call arguments to a signature: positional first, then keywords.
 * bound[i] receives the expression for argument i, or NULL. */
bool sema_bind_args(Sema *s, const Signature *sig, Loc call_loc, Arg *args, Arg *bound[])
{
    Diag *D = s->d;
    int n = sig_nargs(sig), pos = 0;
    bool ok = true, seen_kw = false;
    memset(bound, 0, sizeof(Arg *) * MAX_ARGS);
    for (Arg *a = args; a; a = a->next) {
        int slot = -1;
        if (!a->name) {
            if (seen_kw) {
                diag_error(D, a->loc, "positional argument after a keyword argument");
                ok = false;
                continue;
            }
            if (pos >= n) {
                int given = 0;
                for (Arg *b = args; b; b = b->next)
                    given += !b->name;
                diag_error(D, a->loc, "`%s` takes at most %d argument%s (%s); %d given",
                           sig->name, n, n == 1 ? "" : "s", sig_arg_list(sig), given);
                ok = false;
                break;
            }
            slot = pos++;
        } else {
            seen_kw = true;
            for (int i = 0; i < n; i++)
                if (strcmp(sig->args[i].name, a->name) == 0)
                    slot = i;
            if (slot < 0) {
                const char *names[MAX_ARGS + 1] = {0};
                for (int i = 0; i < n; i++)
                    names[i] = sig->args[i].name;
                diag_error(D, a->name_loc, "`%s` has no argument `%s` (its arguments are %s)%s",
                           sig->name, a->name, sig_arg_list(sig), diag_suggest(a->name, names));
                ok = false;
                continue;
            }
        }
        if (bound[slot]) {
            diag_error(D, a->loc, "argument `%s` of `%s` is given twice; first at %s",
                       sig->args[slot].name, sig->name, diag_where(D, bound[slot]->loc));
            ok = false;
            continue;
        }
        bound[slot] = a;
    }
    for (int i = 0; i < n; i++)
        if (sig->args[i].required && !bound[i] && ok) {
            diag_error(D, call_loc, "`%s` needs argument `%s`", sig->name, sig->args[i].name);
            ok = false;
        }
    return ok;
}

/* Evaluates a bound argument of a known type. */
bool sema_eval_int(Sema *s, Scope *sc, Expr *e, const char *what, int64_t lo, int64_t *out)
{
    Value v;
    if (!sema_fold(s, sc, e, &v))
        return false;
    if (v.kind != V_INT) {
        diag_error(s->d, e->loc, "%s must be an integer, got %s", what, sema_value_desc(&v));
        return false;
    }
    if (v.i < lo) {
        diag_error(s->d, e->loc, "%s must be %s, got %" PRId64, what,
                   lo == 1 ? "positive" : lo == 0 ? "zero or more" : "larger", v.i);
        return false;
    }
    *out = v.i;
    return true;
}

bool sema_eval_float(Sema *s, Scope *sc, Expr *e, const char *what, double *out)
{
    Value v;
    if (!sema_fold(s, sc, e, &v))
        return false;
    if (v.kind != V_INT && v.kind != V_FLOAT) {
        diag_error(s->d, e->loc, "%s must be a number, got %s", what, sema_value_desc(&v));
        return false;
    }
    *out = v.kind == V_INT ? (double)v.i : v.f;
    return true;
}

bool sema_eval_bool(Sema *s, Scope *sc, Expr *e, const char *what, bool *out)
{
    Value v;
    if (!sema_fold(s, sc, e, &v))
        return false;
    if (v.kind != V_BOOL) {
        diag_error(s->d, e->loc, "%s must be `true` or `false`, got %s", what, sema_value_desc(&v));
        return false;
    }
    *out = v.i != 0;
    return true;
}

bool sema_eval_string(Sema *s, Expr *e, const char *what, const char **out)
{
    if (e->kind != EX_STRING) {
        diag_error(s->d, e->loc, "%s must be a string in double quotes", what);
        return false;
    }
    if (!e->str[0]) {
        diag_error(s->d, e->loc, "%s must not be empty", what);
        return false;
    }
    *out = e->str;
    return true;
}

static const char *choice_list(const char *const *choices)
{
    const char *s = "";
    for (int i = 0; choices[i]; i++)
        s = arena_printf("%s%s`%s`", s, i ? (choices[i + 1] ? ", " : " or ") : "", choices[i]);
    return s;
}

bool sema_eval_enum(Sema *s, Expr *e, const char *what, const char *const *choices, int *out)
{
    if (e->kind == EX_IDENT)
        for (int i = 0; choices[i]; i++)
            if (strcmp(choices[i], e->str) == 0) {
                *out = i;
                return true;
            }
    if (e->kind == EX_IDENT)
        diag_error(s->d, e->loc, "%s must be %s, not `%s`%s", what, choice_list(choices), e->str,
                   diag_suggest(e->str, choices));
    else
        diag_error(s->d, e->loc, "%s must be %s", what, choice_list(choices));
    return false;
}

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
        Decl **slot = index_slot(t, d->name);
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
    if (a && !sema_eval_int(s, sc, a->value, arena_printf("`%s` argument `%s`", sig->name,
                                                      sig->args[i].name), 1, &v))
        *ok = false;
    if (v > MAX_NUMEL) {
        diag_error(s->d, a->value->loc, "`%s` argument `%s` is too large (%" PRId64 ")",
                   sig->name, sig->args[i].name, v);
        *ok = false;
    }
    return v;
}

/* A built-in layer declaration: NAME = Linear(...) etc. */
static void check_builtin_layer(Sema *s, Scope *sc, Decl *d, LayerKind kind, Expr *call)
{
    Diag *D = s->d;
    DeclInfo *di = sema_info(d);
    const Signature *sig = &layer_sigs[kind];
    Arg *b[MAX_ARGS];
    Layer *L = &di->tpl;
    L->kind = kind;
    L->bias = true;
    L->causal = true;
    if (!sema_bind_args(s, sig, call->loc, call->args, b))
        return;
    bool ok = true;
    switch (kind) {
    case LK_LINEAR:
        L->in = positive_arg(s, sc, b[0], sig, 0, &ok);
        L->out = positive_arg(s, sc, b[1], sig, 1, &ok);
        if (b[2])
            ok &= sema_eval_bool(s, sc, b[2]->value, "`Linear` argument `bias`", &L->bias);
        if (b[3]) {
            Expr *t = b[3]->value;
            bool outer;
            Decl *td = t->kind == EX_IDENT ? sema_lookup(sc, t->str, &outer) : NULL;
            if (t->kind != EX_IDENT) {
                diag_error(D, t->loc, "`tie` names an Embedding layer declared beside this one");
                ok = false;
            } else if (!td || (td->kind == DECL_LAYER && outer)) {
                diag_error(D, t->loc, "`tie = %s`: no layer `%s` in this %s%s", t->str, t->str,
                           sc->mt->decl ? "block" : "model", diag_suggest(t->str, sema_scope_names(sc)));
                ok = false;
            } else if (td->kind != DECL_LAYER) {
                diag_error(D, t->loc, "`tie = %s`: `%s` is %s (declared at %s), not an "
                                      "Embedding layer",
                           t->str, t->str, sema_decl_what(td), diag_where(D, td->name_loc));
                ok = false;
            } else {
                di->tie_decl = td;
                di->tie_loc = t->loc;
            }
        }
        break;
    case LK_EMBEDDING:
        L->n = positive_arg(s, sc, b[0], sig, 0, &ok);
        L->dim = positive_arg(s, sc, b[1], sig, 1, &ok);
        break;
    case LK_LAYERNORM:
    case LK_RMSNORM:
        L->dim = positive_arg(s, sc, b[0], sig, 0, &ok);
        L->eps = kind == LK_LAYERNORM ? 1e-5 : 1e-6;
        if (b[1]) {
            ok &= sema_eval_float(s, sc, b[1]->value, arena_printf("`%s` argument `eps`", sig->name),
                             &L->eps);
            if (ok && !(L->eps > 0)) {
                diag_error(D, b[1]->value->loc, "`%s` argument `eps` must be positive, got %g",
                           sig->name, L->eps);
                ok = false;
            }
        }
        break;
    case LK_ATTENTION:
        L->dim = positive_arg(s, sc, b[0], sig, 0, &ok);
        L->heads = positive_arg(s, sc, b[1], sig, 1, &ok);
        L->kv_heads = b[2] ? positive_arg(s, sc, b[2], sig, 2, &ok) : L->heads;
        if (b[3])
            ok &= sema_eval_bool(s, sc, b[3]->value, "`Attention` argument `causal`", &L->causal);
        if (b[4]) {
            Expr *r = b[4]->value;
            if (r->kind == EX_IDENT && strcmp(r->str, "none") == 0) {
                L->rope_theta = 0;
            } else if (r->kind == EX_CALL && r->lhs->kind == EX_IDENT &&
                       strcmp(r->lhs->str, "rope") == 0) {
                Arg *rb[MAX_ARGS];
                L->rope_theta = 10000;
                if (!sema_bind_args(s, &sig_rope, r->loc, r->args, rb))
                    ok = false;
                else if (rb[0]) {
                    ok &= sema_eval_float(s, sc, rb[0]->value, "`rope` argument `theta`",
                                     &L->rope_theta);
                    if (ok && !(L->rope_theta > 0)) {
                        diag_error(D, rb[0]->value->loc, "rope `theta` must be positive");
                        ok = false;
                    }
                }
            } else {
                diag_error(D, r->loc, "`rope` must be `none` or `rope(theta = ...)`");
                ok = false;
            }
        }
        if (b[5])
            ok &= sema_eval_bool(s, sc, b[5]->value, "`Attention` argument `bias`", &L->bias);
        if (!ok)
            break;
        if (L->dim % L->heads) {
            diag_error(D, call->loc, "dim %" PRId64 " is not divisible by heads %" PRId64,
                       L->dim, L->heads);
            ok = false;
        } else if (L->heads % L->kv_heads) {
            diag_error(D, call->loc, "heads %" PRId64 " is not divisible by kv_heads %" PRId64,
                       L->heads, L->kv_heads);
            ok = false;
        } else if (L->rope_theta > 0 && (L->dim / L->heads) % 2) {
            diag_error(D, b[4]->value->loc,
                       "rope needs an even head dim; dim %" PRId64 " / heads %" PRId64
                       " = %" PRId64,
                       L->dim, L->heads, L->dim / L->heads);
            ok = false;
        }
        break;
    case LK_MLP: {
        L->dim = positive_arg(s, sc, b[0], sig, 0, &ok);
        L->hidden = positive_arg(s, sc, b[1], sig, 1, &ok);
        int act = ACT_GELU;
        if (b[2])
            ok &= sema_eval_enum(s, b[2]->value, "`MLP` argument `act`", act_choices, &act);
        L->act = (Activation)act;
        if (b[3])
            ok &= sema_eval_bool(s, sc, b[3]->value, "`MLP` argument `bias`", &L->bias);
        break;
    }
    default:
        fsd_unreachable();
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

/* NAME = Linear(...) | Block() | Block[n] */
static void check_layer_decl(Sema *s, Scope *sc, Decl *d)
{
    Diag *D = s->d;
    DeclInfo *di = sema_info(d);
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
    Decl *bt = k == LK_BLOCK ? sema_lookup(sc, callee->str, &outer) : NULL;
    if (k == LK_BLOCK && (!bt || bt->kind != DECL_BLOCK)) {
        if (bt && bt->kind == DECL_CONST && v->kind != EX_CALL && v->kind != EX_INDEX)
            diag_error(D, d->name_loc, "`%s` is a layer name; constants are declared with "
                                       "`const %s = ...`", d->name, d->name);
        else if (bt)
            diag_error(D, callee->loc, "`%s` is %s (declared at %s), not a layer type",
                       callee->str, sema_decl_what(bt), diag_where(D, bt->name_loc));
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
        if (!sema_eval_int(s, sc, v->rhs, "the array size", 1, &n))
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
        if (d->kind != DECL_LAYER || !sema_info(d)->ok)
            continue;
        DeclInfo *di = sema_info(d);
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
                   type_name(t));
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
                   type_name(t));
        return NULL;
    }
    return t;
}

/* layer(x): the output type of applying a declared layer. */
static Type *apply_layer(Fwd *f, Expr *call, Decl *ld, Type **in, int nin)
{
    Sema *s = f->s;
    Diag *D = s->d;
    DeclInfo *di = sema_info(ld);
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
                       type_name(x));
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
                                     "], got %s", who, L->dim, type_name(x));
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
                       who, mt->name, diag_where(D, fw->loc), type_name(x), type_name(y));
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
            diag_error(D, a1->loc, "`cross_entropy` targets must be token ids; got %s", type_name(tg));
            return NULL;
        }
        bool fit = lg->rank == tg->rank + 1;
        for (int i = 0; fit && i < tg->rank; i++)
            fit = lg->dim[i] == tg->dim[i];
        if (!fit) {
            diag_error(D, call->loc, "`cross_entropy` logits %s do not fit targets %s: logits "
                                     "need the targets' shape plus a vocabulary dimension",
                       type_name(lg), type_name(tg));
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
    Decl *d = sema_lookup(f->sc, name, &outer);
    if (d && d->kind == DECL_LAYER && !outer) {
        d->used = true;
        e->ref_decl = d;
        if (!ok || !sema_info(d)->ok)
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
                   sema_decl_what(d), diag_where(D, d->name_loc));
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
                   ast_op_name(e->op), type_name(a->dtype == DT_I32 ? a : b));
        return NULL;
    }
    if (a->rank == 0 || b->rank == 0) {
        diag_error(D, e->loc, "`%s` of %s and %s: a forward adds and multiplies tensors; a "
                              "scalar loss can only be returned",
                   ast_op_name(e->op), type_name(a), type_name(b));
        return NULL;
    }
    Type *big = a->rank >= b->rank ? a : b, *small = big == a ? b : a;
    bool fit = true;
    for (int i = 0; fit && i < small->rank; i++)
        fit = small->dim[small->rank - 1 - i] == big->dim[big->rank - 1 - i];
    if (!fit) {
        diag_error(D, e->loc, "shape mismatch in `%s`: %s and %s", ast_op_name(e->op), type_name(a),
                   type_name(b));
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
        Decl *d = sema_lookup(f->sc, e->str, &outer);
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
                       e->str, sema_decl_what(d), diag_where(D, d->name_loc));
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
                           mt->name, type_name(args[i]), type_name(&mt->in_ty[i]),
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
            Decl *d = sema_lookup(f.sc, st->name, &o);
            if (d && !o)
                diag_error(D, st->name_loc, "`%s` is already %s of `%s` (at %s); pick another "
                                            "name for the value",
                           st->name, sema_decl_what(d), mt->name, diag_where(D, d->name_loc));
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
        if (d->kind != DECL_LAYER || !sema_info(d)->ok || !sema_info(d)->tie_decl)
            continue;
        DeclInfo *di = sema_info(d);
        Decl *e = di->tie_decl;
        DeclInfo *ei = sema_info(e);
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
        if (d->kind == DECL_LAYER && !d->used && sema_info(d)->ok)
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
            fold_const_decl(s, sc, d);
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
    Decl *seq = find_local(s->model_sec->decls, "seq");
    if (!seq || seq->kind != DECL_CONST) {
        diag_error(d, s->model_sec->name_loc, "model `%s` has no `const seq = ...`: the "
                                               "sequence length of its token inputs",
                   m->name);
    } else if (sema_info(seq)->ok) {
        Value v = sema_info(seq)->value;
        if (v.kind != V_INT || v.i < 1 || v.i > (1 << 24))
            diag_error(d, seq->value->loc, "`seq` must be an integer from 1 to %d, got %s",
                       1 << 24, sema_value_desc(&v));
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
                   type_name(loss));
    }
    if (d->errors)
        return NULL;
    for (int i = 0; i < m->ntypes; i++) {
        if (m->types[i]->checked)
            warn_unused(s, m->types[i]);
        else if (m->types[i]->decl)
            diag_warning(d, m->types[i]->loc, "block type `%s` is never used", m->types[i]->name);
    }

    model_build(s);
    return d->errors ? NULL : m;
}
