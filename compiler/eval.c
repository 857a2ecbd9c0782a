/*
 * eval.c — names, constants and arguments: what sema.c and model.c both
 * need to read a declaration or a setting.
 *
 *   - scopes: a name looked up through the module type's members and the
 *     model's (eval_lookup), with the names in reach for "did you mean";
 *   - constant folding: integer, float and boolean expressions of literals
 *     and constants, and sqrt(x), with overflow, division by zero and
 *     cycles reported
 *     (eval_fold, eval_fold_const);
 *   - argument binding: a call's arguments matched to a Signature, then
 *     each evaluated as the type it should be (eval_bind_args, eval_int,
 *     eval_float, eval_bool, eval_string, eval_enum).
 * sema.c uses it to check declarations; model.c to resolve fully_shard
 * paths and the shard and train settings. It depends on neither, so the
 * front end reads as a line: sema_check, then model_build, over one
 * evaluator. Errors go to the Diag each function is given.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

DeclInfo *eval_info(Decl *d)
{
    if (!d->info)
        d->info = arena_alloc(sizeof(DeclInfo));
    return d->info;
}

/* ── printing values and types ── */

static void type_str(char *buf, size_t n, const Type *t)
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

const char *eval_type_name(const Type *t)
{
    char buf[128];
    type_str(buf, sizeof buf, t);
    return arena_strdup(buf);
}

const char *eval_value_desc(const Value *v)
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
 * members and sees the model's constants and block types. A declaration's
 * own value is read in a scope whose self is that declaration: there the
 * names are those in reach before it (docs/design.md#the-language,
 * "Names"), so `ffn = MLP(dim, hidden = ffn)` in a block reads the model's
 * constant `ffn`, as `x = x + f(x)` in a forward reads the x before it. */

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
Decl **eval_index_slot(ModuleType *t, const char *name)
{
    uint32_t i = name_hash(name) & t->index_mask;
    while (t->index[i] && strcmp(t->index[i]->name, name) != 0)
        i = (i + 1) & t->index_mask;
    return &t->index[i];
}

/* Looks a name up; *outer is set when it was found in an enclosing scope.
 * A scope over a module type's members uses the type's index (a file may
 * declare half a million constants); others are searched in order. */
Decl *eval_lookup(Scope *sc, const char *name, bool *outer)
{
    *outer = false;
    for (; sc; sc = sc->outer) {
        Decl *d = sc->mt && sc->mt->index && sc->decls == sc->mt->members
                      ? *eval_index_slot(sc->mt, name)
                      : find_local(sc->decls, name);
        if (d && d != sc->self)
            return d;
        *outer = true;
    }
    return NULL;
}

Scope eval_decl_scope(Scope *sc, Decl *d)
{
    Scope own = *sc;
    own.self = d;
    return own;
}

const char **eval_scope_names(Scope *sc)
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

const char *eval_decl_what(Decl *d)
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

/* A divisor that folded to zero; a constant's name says where it is set. */
static void zero_divisor(Diag *D, Scope *sc, Expr *rhs)
{
    bool outer;
    Decl *d = rhs->kind == EX_IDENT ? eval_lookup(sc, rhs->str, &outer) : NULL;
    if (d)
        diag_error(D, rhs->loc, "division by zero in constant expression: `%s` is 0 (at %s)",
                   rhs->str, diag_where(D, d->value->loc));
    else
        diag_error(D, rhs->loc, "division by zero in constant expression");
}

/* sqrt(x): the one function a constant expression may call, for scales
 * such as GPT-2's 0.02 / sqrt(2 * layers). A float; x must be a number of
 * zero or more. */
static bool fold_sqrt(Diag *D, Scope *sc, Expr *e, Value *out)
{
    if (!e->args || e->args->next || e->args->name) {
        diag_error(D, e->loc, "`sqrt` takes one number: `sqrt(x)`");
        return false;
    }
    Value x;
    if (!eval_fold(D, sc, e->args->value, &x))
        return false;
    if (x.kind != V_INT && x.kind != V_FLOAT) {
        diag_error(D, e->args->value->loc, "`sqrt` needs a number, not %s", eval_value_desc(&x));
        return false;
    }
    double v = x.kind == V_INT ? (double)x.i : x.f;
    if (v < 0) {
        diag_error(D, e->args->value->loc, "`sqrt` of a negative number, %g", v);
        return false;
    }
    memset(out, 0, sizeof *out);
    out->kind = V_FLOAT;
    out->f = sqrt(v);
    return true;
}

bool eval_fold(Diag *D, Scope *sc, Expr *e, Value *out)
{
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
        Decl *d = eval_lookup(sc, e->str, &outer);
        /* a declaration's value reads the names declared before it: one
         * declared after it in its own scope is not there yet, and the name
         * means what it means outside (the model's constant, say) */
        Decl *later = NULL;
        if (d && !outer && sc->self && d->name_loc.begin > sc->self->name_loc.begin) {
            later = d;
            d = sc->outer ? eval_lookup(sc->outer, e->str, &outer) : NULL;
            outer = true;
        }
        if (!d && later && later->kind == DECL_CONST) {
            diag_error(D, e->loc, "constant `%s` is used before its definition at %s", e->str,
                       diag_where(D, later->name_loc));
            return false;
        }
        if (!d && later) {
            diag_error(D, e->loc, "`%s` is %s (declared at %s), not a constant", e->str,
                       eval_decl_what(later), diag_where(D, later->name_loc));
            return false;
        }
        if (!d && sc->self && strcmp(sc->self->name, e->str) == 0) {
            diag_error(D, e->loc, "`%s` is used in its own declaration, and nothing declared "
                                  "before it is called `%s`",
                       e->str, e->str);
            return false;
        }
        if (!d) {
            diag_error(D, e->loc, "undefined name `%s`%s", e->str,
                       diag_suggest(e->str, eval_scope_names(sc)));
            return false;
        }
        if (d->kind != DECL_CONST) {
            diag_error(D, e->loc, "`%s` is %s (declared at %s), not a constant", e->str,
                       eval_decl_what(d), diag_where(D, d->name_loc));
            return false;
        }
        DeclInfo *di = eval_info(d);
        if (di->state == 0 && !outer) {
            diag_error(D, e->loc, "constant `%s` is used before its definition at %s", e->str,
                       diag_where(D, d->name_loc));
            return false;
        }
        if (di->state == 0 && !eval_fold_const(D, sc->outer, d))
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
        if (!eval_fold(D, sc, e->lhs, out))
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
        diag_error(D, e->loc, "`-` needs a number, not %s", eval_value_desc(out));
        return false;
    }
    case EX_BINOP: {
        Value a, b;
        if (!eval_fold(D, sc, e->lhs, &a) | !eval_fold(D, sc, e->rhs, &b))
            return false;
        if ((a.kind != V_INT && a.kind != V_FLOAT) || (b.kind != V_INT && b.kind != V_FLOAT)) {
            diag_error(D, e->loc, "`%s` needs two numbers, got %s and %s", ast_op_name(e->op),
                       eval_value_desc(&a), eval_value_desc(&b));
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
                    zero_divisor(D, sc, e->rhs);
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
                zero_divisor(D, sc, e->rhs);
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
        if (e->lhs->kind == EX_IDENT && strcmp(e->lhs->str, "sqrt") == 0)
            return fold_sqrt(D, sc, e, out);
        diag_error(D, e->loc, "expected a constant expression");
        return false;
    case EX_INDEX:
    case EX_MEMBER:
    case EX_TUPLE:
    case EX_STAR:
        diag_error(D, e->loc, "expected a constant expression");
        return false;
    }
    fsd_unreachable();
}

bool eval_fold_const(Diag *D, Scope *sc, Decl *d)
{
    DeclInfo *di = eval_info(d);
    if (di->state == 2)
        return di->ok;
    di->state = 1;
    Scope own = eval_decl_scope(sc, d);
    di->ok = eval_fold(D, &own, d->value, &di->value);
    if (di->ok && di->value.kind == V_STRING) {
        diag_error(D, d->value->loc, "constant `%s` must be a number or a boolean", d->name);
        di->ok = false;
    }
    di->state = 2;
    return di->ok;
}

/* ── argument binding ──
 * A call's arguments against a Signature: built-in layers (sema.c) and
 * the functions of the settings (adamw, cosine, ...: model.c). */

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
bool eval_bind_args(Diag *D, const Signature *sig, Loc call_loc, Arg *args, Arg *bound[])
{
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
bool eval_int(Diag *D, Scope *sc, Expr *e, const char *what, int64_t lo, int64_t *out)
{
    Value v;
    if (!eval_fold(D, sc, e, &v))
        return false;
    if (v.kind != V_INT) {
        diag_error(D, e->loc, "%s must be an integer, got %s", what, eval_value_desc(&v));
        return false;
    }
    if (v.i < lo) {
        diag_error(D, e->loc, "%s must be %s, got %" PRId64, what,
                   lo == 1 ? "positive" : lo == 0 ? "zero or more" : "larger", v.i);
        return false;
    }
    *out = v.i;
    return true;
}

bool eval_float(Diag *D, Scope *sc, Expr *e, const char *what, double *out)
{
    Value v;
    if (!eval_fold(D, sc, e, &v))
        return false;
    if (v.kind != V_INT && v.kind != V_FLOAT) {
        diag_error(D, e->loc, "%s must be a number, got %s", what, eval_value_desc(&v));
        return false;
    }
    *out = v.kind == V_INT ? (double)v.i : v.f;
    return true;
}

bool eval_bool(Diag *D, Scope *sc, Expr *e, const char *what, bool *out)
{
    Value v;
    if (!eval_fold(D, sc, e, &v))
        return false;
    if (v.kind != V_BOOL) {
        diag_error(D, e->loc, "%s must be `true` or `false`, got %s", what, eval_value_desc(&v));
        return false;
    }
    *out = v.i != 0;
    return true;
}

bool eval_string(Diag *D, Expr *e, const char *what, const char **out)
{
    if (e->kind != EX_STRING) {
        diag_error(D, e->loc, "%s must be a string in double quotes", what);
        return false;
    }
    if (!e->str[0]) {
        diag_error(D, e->loc, "%s must not be empty", what);
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

bool eval_enum(Diag *D, Expr *e, const char *what, const char *const *choices, int *out)
{
    if (e->kind == EX_IDENT)
        for (int i = 0; choices[i]; i++)
            if (strcmp(choices[i], e->str) == 0) {
                *out = i;
                return true;
            }
    if (e->kind == EX_IDENT)
        diag_error(D, e->loc, "%s must be %s, not `%s`%s", what, choice_list(choices), e->str,
                   diag_suggest(e->str, choices));
    else
        diag_error(D, e->loc, "%s must be %s", what, choice_list(choices));
    return false;
}
