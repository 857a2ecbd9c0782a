/*
 * ast.c — syntax tree constructors (called from the bison actions) and the
 * `--dump-ast` printer.
 *
 * The parser builds lists left-recursively, which prepends; the constructor
 * that receives a finished list reverses it once, so lists are in source
 * order everywhere after parsing.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <string.h>

#define REVERSE(T, list)                        \
    do {                                        \
        T *prev_ = NULL, *cur_ = (list);        \
        while (cur_) {                          \
            T *next_ = cur_->next;              \
            cur_->next = prev_;                 \
            prev_ = cur_;                       \
            cur_ = next_;                       \
        }                                       \
        (list) = prev_;                         \
    } while (0)

static Expr *new_expr(ExprKind kind, Loc loc)
{
    Expr *e = arena_alloc(sizeof *e);
    e->kind = kind;
    e->loc = loc;
    e->depth = 1;
    return e;
}

Expr *ast_int(Loc loc, int64_t v, bool is_size)
{
    Expr *e = new_expr(EX_INT, loc);
    e->ival = v;
    e->is_size = is_size;
    return e;
}

Expr *ast_float(Loc loc, double v)
{
    Expr *e = new_expr(EX_FLOAT, loc);
    e->fval = v;
    return e;
}

Expr *ast_string(Loc loc, const char *s)
{
    Expr *e = new_expr(EX_STRING, loc);
    e->str = s;
    return e;
}

Expr *ast_bool(Loc loc, bool v)
{
    Expr *e = new_expr(EX_BOOL, loc);
    e->ival = v;
    return e;
}

Expr *ast_ident(Loc loc, const char *name)
{
    Expr *e = new_expr(EX_IDENT, loc);
    e->str = name;
    return e;
}

Expr *ast_star(Loc loc) { return new_expr(EX_STAR, loc); }

/* loc is the operator's; the node spans both operands so messages can
 * underline the whole expression. */
Expr *ast_binop(Loc loc, int op, Expr *lhs, Expr *rhs)
{
    Expr *e = new_expr(EX_BINOP, (Loc){lhs->loc.begin, rhs->loc.end});
    (void)loc;
    e->op = op;
    e->lhs = lhs;
    e->rhs = rhs;
    e->depth = 1 + (lhs->depth > rhs->depth ? lhs->depth : rhs->depth);
    return e;
}

Expr *ast_neg(Loc loc, Expr *x)
{
    Expr *e = new_expr(EX_NEG, loc);
    e->lhs = x;
    e->depth = x->depth + 1;
    return e;
}

Expr *ast_call(Loc loc, Expr *callee, Arg *rev_args)
{
    Expr *e = new_expr(EX_CALL, loc);
    e->lhs = callee;
    REVERSE(Arg, rev_args);
    e->args = rev_args;
    e->depth = callee->depth + 1;
    for (Arg *a = rev_args; a; a = a->next)
        if (a->value->depth + 1 > e->depth)
            e->depth = a->value->depth + 1;
    return e;
}

Expr *ast_index(Loc loc, Expr *base, Expr *index)
{
    Expr *e = new_expr(EX_INDEX, loc);
    e->lhs = base;
    e->rhs = index;
    e->depth = 1 + (base->depth > index->depth ? base->depth : index->depth);
    return e;
}

Expr *ast_member(Loc loc, Expr *base, const char *name)
{
    Expr *e = new_expr(EX_MEMBER, loc);
    e->lhs = base;
    e->str = name;
    e->depth = base->depth + 1;
    return e;
}

Expr *ast_tuple(Loc loc, Expr *first, Arg *rev_rest)
{
    Expr *e = new_expr(EX_TUPLE, loc);
    REVERSE(Arg, rev_rest);
    e->args = ast_arg(first->loc, NULL, first->loc, first, NULL);
    e->args->next = rev_rest;
    for (Arg *a = e->args; a; a = a->next)
        if (a->value->depth + 1 > e->depth)
            e->depth = a->value->depth + 1;
    return e;
}

Arg *ast_arg(Loc loc, const char *name, Loc name_loc, Expr *value, Arg *rev_list)
{
    Arg *a = arena_alloc(sizeof *a);
    a->loc = loc;
    a->name = name;
    a->name_loc = name_loc;
    a->value = value;
    a->next = rev_list;
    return a;
}

Name *ast_name(Loc loc, const char *name, Name *rev_list)
{
    Name *n = arena_alloc(sizeof *n);
    n->loc = loc;
    n->name = name;
    n->next = rev_list;
    return n;
}

Stmt *ast_assign(Loc loc, const char *name, Loc name_loc, Expr *value, Stmt *rev_list)
{
    Stmt *s = arena_alloc(sizeof *s);
    s->kind = ST_ASSIGN;
    s->loc = loc;
    s->name = name;
    s->name_loc = name_loc;
    s->value = value;
    s->next = rev_list;
    return s;
}

Stmt *ast_return(Loc loc, Expr *value, Stmt *rev_list)
{
    Stmt *s = arena_alloc(sizeof *s);
    s->kind = ST_RETURN;
    s->loc = loc;
    s->value = value;
    s->next = rev_list;
    return s;
}

static Decl *new_decl(DeclKind kind, Loc loc, const char *name, Loc name_loc, Decl *rev_list)
{
    Decl *d = arena_alloc(sizeof *d);
    d->kind = kind;
    d->loc = loc;
    d->name = name;
    d->name_loc = name_loc;
    d->next = rev_list;
    return d;
}

Decl *ast_const(Loc loc, const char *name, Loc name_loc, Expr *value, Decl *rev_list)
{
    Decl *d = new_decl(DECL_CONST, loc, name, name_loc, rev_list);
    d->value = value;
    return d;
}

Decl *ast_layer(Loc loc, const char *name, Loc name_loc, Expr *value, Decl *rev_list)
{
    Decl *d = new_decl(DECL_LAYER, loc, name, name_loc, rev_list);
    d->value = value;
    return d;
}

Decl *ast_block(Loc loc, const char *name, Loc name_loc, Decl *rev_members, Decl *rev_list)
{
    Decl *d = new_decl(DECL_BLOCK, loc, name, name_loc, rev_list);
    REVERSE(Decl, rev_members);
    d->members = rev_members;
    return d;
}

Decl *ast_forward(Loc loc, Name *rev_params, Stmt *rev_body, Decl *rev_list)
{
    Decl *d = new_decl(DECL_FORWARD, loc, NULL, loc, rev_list);
    REVERSE(Name, rev_params);
    REVERSE(Stmt, rev_body);
    d->params = rev_params;
    d->body = rev_body;
    return d;
}

/* `const a = 1, b = 2` yields a reversed list of its own; splice it in front
 * of the reversed member list so that the order stays reversed throughout. */
Decl *ast_decls_concat(Decl *rev_a, Decl *rev_b)
{
    if (!rev_b)
        return rev_a;
    Decl *last = rev_b;
    while (last->next)
        last = last->next;
    last->next = rev_a;
    return rev_b;
}

Setting *ast_setting(Loc loc, SettingKind kind, const char *name, Loc name_loc, Expr *value,
                     Arg *rev_args, Setting *rev_list)
{
    Setting *s = arena_alloc(sizeof *s);
    s->kind = kind;
    s->loc = loc;
    s->name = name;
    s->name_loc = name_loc;
    s->value = value;
    REVERSE(Arg, rev_args);
    s->args = rev_args;
    s->next = rev_list;
    return s;
}

Section *ast_model(Loc loc, Loc kw_loc, const char *name, Loc name_loc, Decl *rev_decls,
                   Section *rev_list)
{
    Section *s = arena_alloc(sizeof *s);
    s->kind = SEC_MODEL;
    s->loc = loc;
    s->kw_loc = kw_loc;
    s->name = name;
    s->name_loc = name_loc;
    REVERSE(Decl, rev_decls);
    s->decls = rev_decls;
    s->next = rev_list;
    return s;
}

Section *ast_settings_section(Loc loc, SectionKind kind, Setting *rev_settings, Section *rev_list)
{
    Section *s = arena_alloc(sizeof *s);
    s->kind = kind;
    s->loc = loc;
    s->kw_loc = loc;
    REVERSE(Setting, rev_settings);
    s->settings = rev_settings;
    s->next = rev_list;
    return s;
}

Program *ast_program(Source *src, Section *rev_sections)
{
    Program *p = arena_alloc(sizeof *p);
    p->src = src;
    REVERSE(Section, rev_sections);
    p->sections = rev_sections;
    return p;
}

/* ── --dump-ast ──
 * One node a line, indented by depth, each with its line:col; expressions
 * are printed fully parenthesised so precedence is visible. */

static const Source *dump_src;

static void where(FILE *out, Loc loc)
{
    int line, col;
    loc_line_col(dump_src, loc.begin, &line, &col);
    fprintf(out, "  @%d:%d", line, col);
}

const char *ast_op_name(int op)
{
    switch (op) {
    case '+': return "+";
    case '-': return "-";
    case '*': return "*";
    case '/': return "/";
    case '%': return "%";
    }
    fsd_unreachable();
}

static void dump_args(FILE *out, Arg *a)
{
    for (; a; a = a->next) {
        if (a->name)
            fprintf(out, "%s=", a->name);
        ast_dump_expr(out, a->value);
        if (a->next)
            fputs(", ", out);
    }
}

static void dump_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c < 32 || c > 126)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

void ast_dump_expr(FILE *out, Expr *e)
{
    switch (e->kind) {
    case EX_INT:
        fprintf(out, e->is_size ? "%" PRId64 "B" : "%" PRId64, e->ival);
        return;
    case EX_FLOAT: fprintf(out, "%.17g", e->fval); return;
    case EX_STRING: dump_string(out, e->str); return;
    case EX_BOOL: fputs(e->ival ? "true" : "false", out); return;
    case EX_IDENT: fputs(e->str, out); return;
    case EX_STAR: fputc('*', out); return;
    case EX_BINOP:
        fputc('(', out);
        ast_dump_expr(out, e->lhs);
        fprintf(out, " %s ", ast_op_name(e->op));
        ast_dump_expr(out, e->rhs);
        fputc(')', out);
        return;
    case EX_NEG:
        fputs("(-", out);
        ast_dump_expr(out, e->lhs);
        fputc(')', out);
        return;
    case EX_CALL:
        ast_dump_expr(out, e->lhs);
        fputc('(', out);
        dump_args(out, e->args);
        fputc(')', out);
        return;
    case EX_INDEX:
        ast_dump_expr(out, e->lhs);
        fputc('[', out);
        ast_dump_expr(out, e->rhs);
        fputc(']', out);
        return;
    case EX_MEMBER:
        ast_dump_expr(out, e->lhs);
        fprintf(out, ".%s", e->str);
        return;
    case EX_TUPLE:
        fputc('(', out);
        dump_args(out, e->args);
        fputc(')', out);
        return;
    }
    fsd_unreachable();
}

static void dump_decls(FILE *out, Decl *d, int depth)
{
    for (; d; d = d->next) {
        fprintf(out, "%*s", depth * 2, "");
        switch (d->kind) {
        case DECL_CONST:
            fprintf(out, "const %s = ", d->name);
            ast_dump_expr(out, d->value);
            where(out, d->loc);
            break;
        case DECL_LAYER:
            fprintf(out, "layer %s = ", d->name);
            ast_dump_expr(out, d->value);
            where(out, d->loc);
            break;
        case DECL_BLOCK:
            fprintf(out, "block %s", d->name);
            where(out, d->name_loc);
            fputc('\n', out);
            dump_decls(out, d->members, depth + 1);
            continue;
        case DECL_FORWARD:
            fputs("forward(", out);
            for (Name *n = d->params; n; n = n->next)
                fprintf(out, "%s%s", n->name, n->next ? ", " : "");
            fputc(')', out);
            where(out, d->loc);
            fputc('\n', out);
            for (Stmt *s = d->body; s; s = s->next) {
                fprintf(out, "%*s", depth * 2 + 2, "");
                if (s->kind == ST_ASSIGN)
                    fprintf(out, "%s = ", s->name);
                else
                    fputs("return ", out);
                ast_dump_expr(out, s->value);
                where(out, s->loc);
                fputc('\n', out);
            }
            continue;
        }
        fputc('\n', out);
    }
}

void ast_dump(FILE *out, Program *p)
{
    dump_src = p->src;
    for (Section *s = p->sections; s; s = s->next) {
        switch (s->kind) {
        case SEC_MODEL:
            fprintf(out, "model %s", s->name);
            where(out, s->kw_loc);
            fputc('\n', out);
            dump_decls(out, s->decls, 1);
            break;
        case SEC_SHARD:
        case SEC_TRAIN:
            fputs(s->kind == SEC_SHARD ? "shard" : "train", out);
            where(out, s->kw_loc);
            fputc('\n', out);
            for (Setting *st = s->settings; st; st = st->next) {
                fputs("  ", out);
                switch (st->kind) {
                case SET_ASSIGN:
                    fprintf(out, "%s = ", st->name);
                    ast_dump_expr(out, st->value);
                    break;
                case SET_CALL:
                    fprintf(out, "%s(", st->name);
                    dump_args(out, st->args);
                    fputc(')', out);
                    break;
                case SET_FULLY_SHARD:
                    fputs("fully_shard ", out);
                    ast_dump_expr(out, st->value);
                    break;
                }
                where(out, st->loc);
                fputc('\n', out);
            }
            break;
        }
    }
}
