/*
 * parser.y — the .fsd grammar: tokens to AST, a pure reentrant LALR(1)
 * parser with byte-range locations and no conflicts.
 *
 * Newlines carry no meaning: statements need no terminator because no
 * statement can continue with the token that starts the next one. Each
 * action is one constructor call from ast.c. Lists are built left-recursive
 * (prepending) and put in order by the constructor that receives them.
 * `error` productions at item level let one run report several mistakes.
 */
%define api.pure full
%define api.location.type {Loc}
%define parse.error detailed
%locations
%expect 0
%param {yyscan_t scanner}
%parse-param {ParseCtx *ctx}

%code requires {
#include "fsdpc.h"
typedef void *yyscan_t;
}

%code {
#include <string.h>
int yylex(YYSTYPE *lval, Loc *lloc, yyscan_t scanner);
static void yyerror(Loc *loc, yyscan_t scanner, ParseCtx *ctx, const char *msg);
static Expr *bounded(ParseCtx *ctx, Expr *e);

#define YYLLOC_DEFAULT(Cur, Rhs, N)                                   \
    do {                                                              \
        if (N) {                                                      \
            (Cur).begin = YYRHSLOC(Rhs, 1).begin;                     \
            (Cur).end = YYRHSLOC(Rhs, N).end;                         \
        } else {                                                      \
            (Cur).begin = (Cur).end = YYRHSLOC(Rhs, 0).end;           \
        }                                                             \
    } while (0)
}

%union {
    int64_t ival;
    double fval;
    const char *str;
    Expr *expr;
    Arg *arg;
    Name *name;
    Stmt *stmt;
    Decl *decl;
    Setting *setting;
    Section *section;
}

%token MODEL "`model`" BLOCK "`block`" CONST "`const`" FORWARD "`forward`"
%token RETURN "`return`" SHARD "`shard`" TRAIN "`train`" FULLY_SHARD "`fully_shard`"
%token TRUE "`true`" FALSE "`false`"
%token <str> IDENT "identifier" STRING "string"
%token <ival> INT "integer" SIZE "size"
%token <fval> FLOAT "number"

%type <expr> expr postfix primary index
%type <arg> args_opt args tuple_rest
%type <name> params_opt params
%type <stmt> stmts
%type <decl> model_items block_items const_list
%type <setting> settings
%type <section> sections
%type <str> arg_name

%left '+' '-'
%left '*' '/' '%'
%precedence NEG

%%

file
    : sections                      { ctx->prog = ast_program(ctx->src, $1); }
    ;

sections
    : %empty                        { $$ = NULL; }
    | sections MODEL IDENT '{' model_items '}'
                                    { $$ = ast_model(@$, @2, $3, @3, $5, $1); }
    | sections SHARD '{' settings '}'
                                    { $$ = ast_settings_section(@2, SEC_SHARD, $4, $1); }
    | sections TRAIN '{' settings '}'
                                    { $$ = ast_settings_section(@2, SEC_TRAIN, $4, $1); }
    | sections error '}'            { $$ = $1; }
    ;

/* Members of the model: constants, layers, block types, forward. */
model_items
    : %empty                        { $$ = NULL; }
    | model_items CONST const_list  { $$ = ast_decls_concat($1, $3); }
    | model_items IDENT '=' expr    { $$ = ast_layer(@2, $2, @2, $4, $1); }
    | model_items error '}'         { $$ = $1; }
    | model_items BLOCK IDENT '{' block_items '}'
                                    { $$ = ast_block(@2, $3, @3, $5, $1); }
    | model_items FORWARD '(' params_opt ')' '{' stmts '}'
                                    { $$ = ast_forward(@2, $4, $7, $1); }
    ;

/* Members of a block type: like the model's, but blocks do not nest. */
block_items
    : %empty                        { $$ = NULL; }
    | block_items CONST const_list  { $$ = ast_decls_concat($1, $3); }
    | block_items IDENT '=' expr    { $$ = ast_layer(@2, $2, @2, $4, $1); }
    | block_items FORWARD '(' params_opt ')' '{' stmts '}'
                                    { $$ = ast_forward(@2, $4, $7, $1); }
    | block_items error '}'         { $$ = $1; }
    ;

const_list
    : IDENT '=' expr                { $$ = ast_const(@1, $1, @1, $3, NULL); }
    | const_list ',' IDENT '=' expr { $$ = ast_const(@3, $3, @3, $5, $1); }
    ;

params_opt
    : %empty                        { $$ = NULL; }
    | params                        { $$ = $1; }
    ;

params
    : IDENT                         { $$ = ast_name(@1, $1, NULL); }
    | params ',' IDENT              { $$ = ast_name(@3, $3, $1); }
    ;

stmts
    : %empty                        { $$ = NULL; }
    | stmts IDENT '=' expr          { $$ = ast_assign(@2, $2, @2, $4, $1); }
    | stmts RETURN expr             { $$ = ast_return(@2, $3, $1); }
    | stmts error                   { $$ = $1; }
    ;

/* Lines of `shard` and `train`: name = value | name(args) | fully_shard x */
settings
    : %empty                        { $$ = NULL; }
    | settings IDENT '=' expr       { $$ = ast_setting(@2, SET_ASSIGN, $2, @2, $4, NULL, $1); }
    | settings IDENT '(' args_opt ')'
                                    { $$ = ast_setting(@2, SET_CALL, $2, @2, NULL, $4, $1); }
    | settings FULLY_SHARD expr     { $$ = ast_setting(@2, SET_FULLY_SHARD, "fully_shard", @2, $3, NULL, $1); }
    | settings IDENT '(' error ')'  { $$ = $1; }
    | settings error                { $$ = $1; }
    ;

expr
    : expr '+' expr                 { $$ = bounded(ctx, ast_binop(@2, '+', $1, $3)); }
    | expr '-' expr                 { $$ = bounded(ctx, ast_binop(@2, '-', $1, $3)); }
    | expr '*' expr                 { $$ = bounded(ctx, ast_binop(@2, '*', $1, $3)); }
    | expr '/' expr                 { $$ = bounded(ctx, ast_binop(@2, '/', $1, $3)); }
    | expr '%' expr                 { $$ = bounded(ctx, ast_binop(@2, '%', $1, $3)); }
    | '-' expr %prec NEG            { $$ = bounded(ctx, ast_neg(@$, $2)); }
    | postfix                       { $$ = $1; }
    ;

postfix
    : primary                       { $$ = $1; }
    | postfix '(' args_opt ')'      { $$ = bounded(ctx, ast_call(@$, $1, $3)); }
    | postfix '(' error ')'         { $$ = $1; }
    | postfix '[' index ']'         { $$ = bounded(ctx, ast_index(@$, $1, $3)); }
    | postfix '.' IDENT             { $$ = bounded(ctx, ast_member(@$, $1, $3)); }
    ;

index
    : expr                          { $$ = $1; }
    | '*'                           { $$ = ast_star(@1); }
    ;

primary
    : INT                           { $$ = ast_int(@1, $1, false); }
    | SIZE                          { $$ = ast_int(@1, $1, true); }
    | FLOAT                         { $$ = ast_float(@1, $1); }
    | STRING                        { $$ = ast_string(@1, $1); }
    | TRUE                          { $$ = ast_bool(@1, true); }
    | FALSE                         { $$ = ast_bool(@1, false); }
    | IDENT                         { $$ = ast_ident(@1, $1); }
    | '(' expr ')'                  { $$ = $2; }
    | '(' expr ',' tuple_rest ')'   { $$ = ast_tuple(@$, $2, $4); }
    ;

tuple_rest
    : expr                          { $$ = ast_arg(@1, NULL, @1, $1, NULL); }
    | tuple_rest ',' expr           { $$ = ast_arg(@3, NULL, @3, $3, $1); }
    ;

args_opt
    : %empty                        { $$ = NULL; }
    | args                          { $$ = $1; }
    ;

args
    : expr                          { $$ = ast_arg(@1, NULL, @1, $1, NULL); }
    | arg_name '=' expr             { $$ = ast_arg(@$, $1, @1, $3, NULL); }
    | args ',' expr                 { $$ = ast_arg(@3, NULL, @3, $3, $1); }
    | args ',' arg_name '=' expr    { $$ = ast_arg(@3, $3, @3, $5, $1); }
    ;

/* Keyword argument names; `forward` is a keyword but also prefetch's
 * argument name. */
arg_name
    : IDENT                         { $$ = $1; }
    | FORWARD                       { $$ = "forward"; }
    ;

%%

/* A missing bracket involves two places; this names the open one, as clang
 * does: "expecting `)` to match the `(` at m.fsd:3:19" where the parser
 * wanted the innermost open bracket's closer, or "the `{` at m.fsd:9:7 is
 * never closed" at the end of the file. Returns msg, amended. */
static const char *unclosed(ParseCtx *ctx, Loc loc, const char *msg)
{
    if (ctx->depth <= 0 || ctx->depth > ctx->max_depth)
        return msg;
    Loc open = ctx->opens[ctx->depth - 1];
    char o = ctx->src->text[open.begin];
    const char *where = diag_where(ctx->diag, open);
    if (strstr(msg, "unexpected end of file"))
        return arena_printf("%s; the `%c` at %s is never closed", msg, o, where);
    /* a bracket as lookahead has already moved the scanner's count */
    if (strchr("()[]{}", ctx->src->text[loc.begin]))
        return msg;
    char want[] = {'`', o == '(' ? ')' : o == '[' ? ']' : '}', '`', 0};
    const char *expecting = strstr(msg, "expecting");
    const char *at = expecting ? strstr(expecting, want) : NULL;
    if (!at)
        return msg;
    at += 3;
    return arena_printf("%.*s to match the `%c` at %s%s", (int)(at - msg), msg, o, where, at);
}

static void yyerror(Loc *loc, yyscan_t scanner, ParseCtx *ctx, const char *msg)
{
    (void)scanner;
    if (strncmp(msg, "syntax error, ", 14) == 0)
        msg += 14;
    if (strcmp(msg, "memory exhausted") == 0)
        msg = "input nested too deeply";
    /* bison quotes character tokens as ')'; messages quote code as `)` */
    char *m = arena_strdup(msg);
    for (char *p = m; *p; p++)
        if (p[0] == '\'' && p[1] && p[2] == '\'')
            p[0] = p[2] = '`';
    diag_error(ctx->diag, *loc, "%s", unclosed(ctx, *loc, m));
}

/* Operator chains (1+1+...+1) build deep trees without deep brackets; every
 * pass after the parser recurses on expressions, so depth is bounded here. */
static Expr *bounded(ParseCtx *ctx, Expr *e)
{
    if (e->depth > ctx->max_depth) {
        diag_error(ctx->diag, e->loc, "expression nested more than %d deep", ctx->max_depth);
        ctx->diag->fatal = true;
    }
    return e;
}
