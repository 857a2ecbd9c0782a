/*
 * fsdpc.h — the compiler's one internal header.
 *
 * The pipeline is  source ─parse─▶ AST ─sema─▶ typed model ─▶ (later passes).
 * This header is divided into one section per source file, in pipeline order,
 * so reading it top to bottom is reading the compiler's data flow.
 */
#ifndef FSDPC_H
#define FSDPC_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FSDPC_VERSION "0.1.0"

/* ───────────────────────── util.c: arena, sources, diagnostics ─────────── */

/* Internal bugs, not user errors: abort loudly with the call site. */
#define fsd_unreachable() fsd_panic(__FILE__, __LINE__, "unreachable")
_Noreturn void fsd_panic(const char *file, int line, const char *what);

/* One arena for the whole compile (chibicc/PostgreSQL style): every node is
 * allocated here and everything is released at once by arena_reset(). */
void *arena_alloc(size_t bytes);            /* zeroed */
char *arena_strndup(const char *s, size_t n);
char *arena_strdup(const char *s);
char *arena_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void arena_reset(void);

/* A source location: a byte range of the one source file being compiled.
 * Line and column are computed only when a message is printed. */
typedef struct Loc {
    uint32_t begin, end;
} Loc;

typedef struct Source {
    const char *name;  /* as given on the command line */
    const char *text;  /* len bytes, plus a terminating NUL */
    size_t len;
} Source;

/* Reads a whole file into the arena; NULL (and errno set) on failure. */
Source *source_read(const char *path);
Source *source_from_memory(const char *name, const char *data, size_t len);

/* Collected diagnostics. Errors are counted and compilation goes on until
 * a phase boundary; after max_errors the diagnostics become fatal. */
typedef struct Diag {
    Source *src;
    FILE *out;          /* NULL: count but do not print (the fuzzer) */
    int errors, warnings;
    int max_errors;
    bool fatal;         /* too many errors, or an error that stops the parse */
} Diag;

void diag_init(Diag *d, Source *src, FILE *out);
void diag_error(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void diag_warning(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "file:line:col" of a location, for messages that name a second place. */
const char *diag_where(Diag *d, Loc loc);
/* "; did you mean `x`?" for the name in names (NULL-terminated) closest to
 * name, or "" when none is close. */
const char *diag_suggest(const char *name, const char *const *names);
/* 124475904 → "124,475,904" */
const char *fmt_count(int64_t v);
void loc_line_col(const Source *src, uint32_t off, int *line, int *col);

/* ───────────────────────── ast.c: the syntax tree ──────────────────────── */

typedef enum {
    EX_INT,     /* ival; is_size when written with a unit (256MiB) */
    EX_FLOAT,   /* fval */
    EX_STRING,  /* str */
    EX_BOOL,    /* ival 0/1 */
    EX_IDENT,   /* str */
    EX_STAR,    /* the `*` in blocks[*] */
    EX_BINOP,   /* lhs op rhs; op is one of + - * / % */
    EX_NEG,     /* -lhs */
    EX_CALL,    /* lhs(args) */
    EX_INDEX,   /* lhs[rhs] */
    EX_MEMBER,  /* lhs.str */
    EX_TUPLE,   /* (args) with two or more positional elements */
} ExprKind;

typedef struct Expr Expr;
typedef struct Arg Arg;
struct Layer;
struct Type;

/* A call argument; name is NULL for a positional one. */
struct Arg {
    Loc loc;
    const char *name;
    Loc name_loc;
    Expr *value;
    Arg *next;
};

struct Expr {
    ExprKind kind;
    Loc loc;
    int op;
    bool is_size;
    int depth;          /* height of this subtree, bounded by the parser */
    int64_t ival;
    double fval;
    const char *str;
    Expr *lhs, *rhs;
    Arg *args;
    /* Filled in by sema for expressions inside forward bodies. */
    struct Type *ty;
    struct Decl *ref_decl;     /* layer member a call applies, or NULL */
    int builtin;               /* BuiltinFn + 1 when a built-in function */
};

typedef struct Name {
    const char *name;
    Loc loc;
    struct Name *next;
} Name;

typedef enum { ST_ASSIGN, ST_RETURN } StmtKind;

typedef struct Stmt {
    StmtKind kind;
    Loc loc;
    const char *name;   /* ST_ASSIGN target */
    Loc name_loc;
    Expr *value;
    struct Stmt *next;
} Stmt;

typedef enum { DECL_CONST, DECL_LAYER, DECL_BLOCK, DECL_FORWARD } DeclKind;

typedef struct Decl {
    DeclKind kind;
    Loc loc;
    const char *name;      /* NULL for DECL_FORWARD */
    Loc name_loc;
    Expr *value;           /* DECL_CONST, DECL_LAYER */
    struct Decl *members;  /* DECL_BLOCK */
    Name *params;          /* DECL_FORWARD */
    Stmt *body;            /* DECL_FORWARD */
    struct Decl *next;
    /* sema */
    bool used;                /* DECL_LAYER: called in a forward, or tied */
    struct ModuleType *mtype; /* DECL_BLOCK: its module type */
    struct DeclInfo *info;    /* sema's private facts (sema.c) */
} Decl;

typedef enum { SET_ASSIGN, SET_CALL, SET_FULLY_SHARD } SettingKind;

/* One line of a `shard` or `train` section:
 *   name = value  |  name(args)  |  fully_shard target */
typedef struct Setting {
    SettingKind kind;
    Loc loc;
    const char *name;
    Loc name_loc;
    Expr *value;
    Arg *args;
    struct Setting *next;
} Setting;

typedef enum { SEC_MODEL, SEC_SHARD, SEC_TRAIN } SectionKind;

typedef struct Section {
    SectionKind kind;
    Loc loc;
    Loc kw_loc;
    const char *name;     /* SEC_MODEL */
    Loc name_loc;
    Decl *decls;          /* SEC_MODEL */
    Setting *settings;    /* SEC_SHARD, SEC_TRAIN */
    struct Section *next;
} Section;

typedef struct Program {
    Source *src;
    Section *sections;
} Program;

/* Constructors: one per grammar construct, called from the bison actions.
 * List constructors take lists built in reverse (left recursion prepends)
 * and put them in source order. */
Expr *ast_int(Loc loc, int64_t v, bool is_size);
Expr *ast_float(Loc loc, double v);
Expr *ast_string(Loc loc, const char *s);
Expr *ast_bool(Loc loc, bool v);
Expr *ast_ident(Loc loc, const char *name);
Expr *ast_star(Loc loc);
Expr *ast_binop(Loc loc, int op, Expr *lhs, Expr *rhs);
Expr *ast_neg(Loc loc, Expr *e);
Expr *ast_call(Loc loc, Expr *callee, Arg *rev_args);
Expr *ast_index(Loc loc, Expr *base, Expr *index);
Expr *ast_member(Loc loc, Expr *base, const char *name);
Expr *ast_tuple(Loc loc, Expr *first, Arg *rev_rest);
Arg *ast_arg(Loc loc, const char *name, Loc name_loc, Expr *value, Arg *rev_list);
Name *ast_name(Loc loc, const char *name, Name *rev_list);
Stmt *ast_assign(Loc loc, const char *name, Loc name_loc, Expr *value, Stmt *rev_list);
Stmt *ast_return(Loc loc, Expr *value, Stmt *rev_list);
Decl *ast_const(Loc loc, const char *name, Loc name_loc, Expr *value, Decl *rev_list);
Decl *ast_layer(Loc loc, const char *name, Loc name_loc, Expr *value, Decl *rev_list);
Decl *ast_block(Loc loc, const char *name, Loc name_loc, Decl *rev_members, Decl *rev_list);
Decl *ast_forward(Loc loc, Name *rev_params, Stmt *rev_body, Decl *rev_list);
Decl *ast_decls_concat(Decl *rev_a, Decl *rev_b);
Setting *ast_setting(Loc loc, SettingKind kind, const char *name, Loc name_loc,
                     Expr *value, Arg *rev_args, Setting *rev_list);
Section *ast_model(Loc loc, Loc kw_loc, const char *name, Loc name_loc, Decl *rev_decls,
                   Section *rev_list);
Section *ast_settings_section(Loc loc, SectionKind kind, Setting *rev_settings,
                              Section *rev_list);
Program *ast_program(Source *src, Section *rev_sections);

const char *ast_op_name(int op);
void ast_dump(FILE *out, Program *p);
void ast_dump_expr(FILE *out, Expr *e);

/* ───────────────────────── parse.c (+ grammar/): source → AST ─────────── */

/* Returns the AST; syntax errors are reported through d (check d->errors). */
Program *parse_program(Source *src, Diag *d);

/* The parser's and scanner's shared state (reentrant: no globals). */
typedef struct ParseCtx {
    Source *src;
    Diag *diag;
    Program *prog;
    uint32_t off;        /* scanner position, bytes */
    int depth;           /* open ( [ { */
    int max_depth;
    Loc comment_loc;     /* where an open block comment began */
} ParseCtx;

/* ───────────────────────── sema.c: AST → typed model ──────────────────── */

/* A value's type inside a forward body. Shapes are known: the batch
 * dimension is the symbolic micro-batch size B (dim value DIM_BATCH); every
 * other dimension is a number. Scalars have rank 0. */
#define DIM_BATCH (-1)
#define MAX_RANK 4

typedef enum { DT_F32, DT_I32 } ValueDtype;

typedef struct Type {
    ValueDtype dtype;
    int rank;
    int64_t dim[MAX_RANK];
} Type;

/* Storage dtypes of the shard policy (fp32 master params are implied). */
#define DTYPE_LIST(X) \
    X(DTYPE_FP32, "fp32", 4) \
    X(DTYPE_BF16, "bf16", 2) \
    X(DTYPE_FP16, "fp16", 2)
typedef enum {
#define X(e, name, bytes) e,
    DTYPE_LIST(X)
#undef X
    DTYPE_COUNT
} DType;
const char *dtype_name(DType t);
int dtype_bytes(DType t);

/* Built-in layers and functions: defined once, in layers.def. */
typedef enum {
#define LAYER(e, name) e,
#include "layers.def"
    LK_BLOCK,       /* instance of a user `block` type */
    LK_ARRAY,       /* Block[n]: instances applied in sequence */
} LayerKind;

typedef enum {
#define FUNC(e, name, arity) e,
#include "layers.def"
    FN_COUNT
} BuiltinFn;

typedef enum { ACT_GELU, ACT_RELU, ACT_SWIGLU } Activation;
typedef enum { INIT_NORMAL, INIT_ZEROS, INIT_ONES } InitKind;

typedef struct Param {
    const char *name;       /* full path: blocks.3.attn.q.weight */
    const char *local;      /* weight, bias */
    int rank;
    int64_t shape[2];
    int64_t numel;
    InitKind init;
    struct Layer *owner;
    int group;              /* shard group index */
    int index;              /* position in Model.params */
} Param;

/* A layer instance. Attention and MLP have their Linears as children, so
 * every parameter belongs to a leaf (Linear, Embedding, LayerNorm, RMSNorm). */
typedef struct Layer {
    LayerKind kind;
    const char *name;       /* local name: attn, 3, q */
    const char *path;       /* blocks.3.attn */
    Loc loc;                /* the declaration it comes from */
    Decl *decl;
    struct Layer *parent;
    /* configuration, by kind */
    int64_t in, out, n, dim, heads, kv_heads, hidden, count;
    bool bias, causal;
    double eps, rope_theta;  /* rope_theta 0: no rope */
    Activation act;
    struct Layer *tie;       /* Linear tied to an Embedding */
    struct ModuleType *mtype; /* LK_BLOCK, LK_ARRAY: the module type */
    struct Layer **children;
    int nchildren;
    Param *weight, *bias_p;  /* leaves */
    int group;               /* shard group claiming this layer, -1 none */
} Layer;

/* A user `block` type (or the model itself) and its checked forward. */
typedef struct ModuleType {
    const char *name;
    Loc loc;
    Decl *decl;              /* DECL_BLOCK, or NULL for the model itself */
    Decl *members;
    Decl *forward;
    int state;               /* cycle check: 0 new, 1 on the stack, 2 done */
    int64_t ninstances;      /* layer instances in one instance of it */
    bool checking, checked;  /* forward being checked / checked */
    Loc first_call;          /* the call its signature was checked for */
    Type in_ty[8];           /* parameter types of the checked forward */
    int nin;
    Type out_ty;
    bool out_ok;
} ModuleType;

typedef struct ShardGroup {
    int index;
    const char *name;        /* the target's path, or "root" */
    Loc loc;                 /* the fully_shard line (or the shard section) */
    Layer *target;           /* NULL for the root */
    bool is_root;
    Param **params;
    int nparams;
    int64_t numel;
} ShardGroup;

typedef enum { SCHED_CONSTANT, SCHED_COSINE } LrSchedule;
typedef enum { OPT_ADAMW, OPT_SGD } OptimizerKind;

typedef struct ShardConfig {
    int reshard_after_forward;   /* -1: FSDP2 default (true but root) */
    DType param_dtype, reduce_dtype, output_dtype;
    int prefetch_forward, prefetch_backward;
    bool offload_cpu;
    int64_t memory_budget_bytes; /* 0: none */
} ShardConfig;

typedef struct TrainConfig {
    int64_t micro_batch, grad_accum, steps, seed;
    OptimizerKind optimizer;
    double lr, beta1, beta2, eps, weight_decay, momentum;
    bool nesterov;
    LrSchedule schedule;
    int64_t warmup;
    double min_lr;
    double grad_clip;            /* 0: none */
    int64_t ckpt_every;          /* 0: no checkpoints */
    const char *ckpt_dir;
    bool ckpt_async;
    int64_t ckpt_keep;           /* 0: keep all */
    const char *data, *val_data;
} TrainConfig;

typedef struct Model {
    const char *name;
    Loc loc;
    Program *prog;
    int64_t seq, vocab;          /* from the model's constants `seq` and the loss */
    Layer *root;                 /* kind LK_BLOCK with the model's members */
    ModuleType *root_type;
    ModuleType **types;
    int ntypes;
    Param **params;              /* in declaration order */
    int nparams;
    int64_t numel;
    ShardGroup **groups;         /* bottom-up: children first, root last */
    int ngroups;
    ShardConfig shard;
    TrainConfig train;
} Model;

/* Checks the program and builds the typed model; NULL when there were
 * errors (all reported through d). */
Model *sema_check(Program *p, Diag *d);
void model_dump(FILE *out, Model *m);
void type_str(char *buf, size_t n, const Type *t);
const char *layer_kind_name(LayerKind k);
const char *builtin_fn_name(BuiltinFn f);

/* ───────────── sema.c internals, shared with model.c ───────────── */

typedef enum { V_NONE, V_INT, V_FLOAT, V_BOOL, V_STRING } VKind;

typedef struct Value {
    VKind kind;
    int64_t i;
    double f;
    const char *s;
} Value;

/* What sema learns about one declaration. */
typedef struct DeclInfo {
    int state;            /* constants: 0 unseen, 1 folding, 2 done */
    bool ok;
    Value value;          /* DECL_CONST */
    Layer tpl;            /* DECL_LAYER: kind and configuration */
    Decl *tie_decl;       /* Linear: the Embedding it is tied to */
    Loc tie_loc;
    ModuleType *owner;    /* the type this declaration is a member of */
    int64_t instances;    /* layer instances one instance of this creates */
} DeclInfo;

typedef struct Sema {
    Diag *d;
    Program *prog;
    Model *m;
    Section *model_sec, *shard_sec, *train_sec;
    ModuleType *root_type;
    Param **params;
    int nparams, cap;
    int64_t ninstances;
} Sema;

typedef struct Scope {
    Decl *decls;
    struct Scope *outer;
    ModuleType *mt;
} Scope;

typedef enum { A_INT, A_FLOAT, A_BOOL, A_STRING, A_SIZE, A_ENUM, A_LAYER, A_ROPE, A_PAIR } ArgType;

typedef struct ArgSpec {
    const char *name;
    ArgType type;
    bool required;
    const char *const *choices;   /* A_ENUM */
} ArgSpec;

enum { MAX_ARGS = 8 };

typedef struct Signature {
    const char *name;
    ArgSpec args[MAX_ARGS];
} Signature;


DeclInfo *sema_info(Decl *d);
Decl *sema_lookup(Scope *sc, const char *name, bool *outer);
const char **sema_scope_names(Scope *sc);
const char *sema_decl_what(Decl *d);
const char *sema_value_desc(const Value *v);
const char *type_name(const Type *t);
bool sema_fold(Sema *s, Scope *sc, Expr *e, Value *out);
bool sema_bind_args(Sema *s, const Signature *sig, Loc call_loc, Arg *args, Arg *bound[]);
bool sema_eval_int(Sema *s, Scope *sc, Expr *e, const char *what, int64_t lo, int64_t *out);
bool sema_eval_float(Sema *s, Scope *sc, Expr *e, const char *what, double *out);
bool sema_eval_bool(Sema *s, Scope *sc, Expr *e, const char *what, bool *out);
bool sema_eval_string(Sema *s, Expr *e, const char *what, const char **out);
bool sema_eval_enum(Sema *s, Expr *e, const char *what, const char *const *choices, int *out);

/* ───────────────────────── model.c: layer tree, groups, settings ──────── */

void model_build(Sema *s);

#endif
