/*
 * fsdpc.h — the compiler's one internal header.
 *
 * The pipeline is  source ─parse─▶ AST ─sema─▶ checked model ─model_build─▶
 * typed model ─▶ (later passes).
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
    uint32_t *line_starts; /* offset of each line's first byte, for messages */
    uint32_t nlines;
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
/* 1610612736 → "1.50 GiB", 12582912 → "12.00 MiB": sizes for messages and
 * dumps, where bytes with commas read badly */
const char *fmt_size(int64_t bytes);
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
    Loc *opens;          /* where each open ( [ { began, max_depth of them */
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

/* `mixed_precision(param, reduce, output)` as written on a fully_shard
 * line: each dtype only where set[i] (MP_PARAM, MP_REDUCE, MP_OUTPUT), at
 * loc[i]; the rest are the shard section's
 * (docs/design.md#per-target-mixed-precision). */
enum { MP_PARAM, MP_REDUCE, MP_OUTPUT, MP_NDTYPES };
typedef struct MixedSpec {
    bool set[MP_NDTYPES];
    DType dtype[MP_NDTYPES];
    Loc loc[MP_NDTYPES];
    Loc at;                  /* the mixed_precision(...) call */
} MixedSpec;

/* `recompute = none | full | selective | every(k) | auto`, in the shard
 * section or on a fully_shard line (docs/design.md#activation-recomputation).
 * As a unit's mode (RecomputeUnit.mode) only RC_NONE, RC_FULL and
 * RC_SELECTIVE remain once the planner has chosen. */
typedef enum { RC_NONE, RC_FULL, RC_SELECTIVE, RC_EVERY, RC_AUTO } RecomputeKind;

typedef struct RecomputeSpec {
    RecomputeKind kind;
    int64_t every;           /* RC_EVERY: k */
    bool written;            /* set in the .fsd, not the default none */
    bool per_target;         /* on a fully_shard line, not the shard section */
    Loc loc;                 /* the value as written */
} RecomputeSpec;
/* `reshard_after_forward = true | false | N`, in the shard section or on a
 * fully_shard line (docs/design.md#partial-resharding): FSDP2's bool or
 * int. N = 1 is false; N >= 2 frees the unsharded parameters after forward
 * but keeps a copy sharded over N ranks of the shard group, which backward
 * all-gathers within those N (ranks 0 for true and false). */
typedef struct ReshardSpec {
    bool reshard;            /* free the unsharded parameters after forward */
    int64_t ranks;           /* N >= 2: the partial copy's ranks; else 0 */
    int64_t written;         /* the integer as written; 0 for a bool */
    Loc loc;                 /* the value as written */
} ReshardSpec;

typedef enum { INIT_NORMAL, INIT_ZEROS, INIT_ONES } InitKind;
/* normal(0, 0.02): matrices and embeddings unless a layer's init says
 * otherwise (docs/design.md#initialisation) */
#define INIT_STD_DEFAULT 0.02

typedef struct Param {
    const char *name;       /* full path: blocks.3.attn.q.weight */
    const char *local;      /* weight, bias */
    int rank;
    int64_t shape[2];
    int64_t numel;
    InitKind init;
    double std;             /* INIT_NORMAL: its standard deviation */
    struct Layer *owner;
    int group;              /* shard group index */
    int index;              /* position in Model.params */
    int64_t offset;         /* plan: element offset in its group's flat buffer */
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
    double eps, rope_theta;  /* rope_theta 0: no rope; Attention: eps is qk_norm's */
    bool qk_norm;            /* Attention: RMSNorm of each head of q and k (Qwen3's) */
    bool out_bias;           /* Attention: o has a bias (bias = true; not qkv) */
    double init_std;         /* init: the normal std of a Linear's or an
                                Embedding's weight, of every matrix of an
                                Attention or MLP but ... */
    double out_init_std;     /* ... its output projection's (o; proj or
                                down): out_init, by default init's */
    Activation act;
    struct Layer *tie;       /* Linear tied to an Embedding */
    struct ModuleType *mtype; /* LK_BLOCK, LK_ARRAY: the module type */
    struct Layer **children;
    int nchildren;
    Param *weight, *bias_p;  /* leaves */
    int group;               /* shard group claiming this layer, -1 none */
    /* a unit of activation recomputation (an instance of a non-root
     * fully_shard target, or under fully_shard auto an element of a layer
     * array): the setting that governs it, its fully_shard line's or the
     * shard section's; NULL when it is not a unit */
    const RecomputeSpec *recompute;
    /* the mixed_precision(...) of the fully_shard line that targets this
     * layer, as written; NULL when that line has none */
    const struct MixedSpec *mixed;
    /* its fully_shard line's reshard_after_forward, as written; NULL when
     * that line has none */
    const ReshardSpec *reshard;
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
    Decl **index;            /* members by name, a hash table (sema.c) */
    uint32_t index_mask;
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
    /* plan.c */
    int64_t flat_numel;      /* params laid end to end, each start aligned */
    int fwd_order;           /* position among groups in forward use order */
    bool reshard;            /* free the unsharded params after forward */
    /* reshard_after_forward = N (docs/design.md#partial-resharding): N >= 2
     * keeps a copy sharded over N ranks after forward, which backward
     * gathers from; 0 when the group reshards fully or not at all */
    int64_t reshard_ranks;
    /* its fully_shard line's reshard_after_forward, NULL when it has none:
     * it wins over the shard section's and the planner's policies, and is
     * the only way the root reshards after forward */
    const ReshardSpec *reshard_own;
    /* model.c: the group's all-gather and reduce-scatter dtypes, its
     * fully_shard line's mixed_precision(...) over the shard section's
     * (docs/design.md#per-target-mixed-precision); mixed is that line's
     * setting as written, NULL when it has none */
    DType param_dtype, reduce_dtype, output_dtype;
    const struct MixedSpec *mixed;
    int64_t replicate;       /* the shard section's replicate = R: the group is
                                sharded over world / R ranks (plan_padded_numel) */
} ShardGroup;

/* lr_schedule's forms (docs/design.md#learning-rate-schedule) */
typedef enum { SCHED_CONSTANT, SCHED_COSINE, SCHED_LINEAR, SCHED_WSD } LrSchedule;
typedef enum { OPT_ADAMW, OPT_SGD } OptimizerKind;

typedef struct ShardConfig {
    int reshard_after_forward;   /* -1: FSDP2 default (true but root) */
    Loc reshard_after_forward_loc;   /* where it was written, when it was */
    int64_t reshard_ranks;       /* reshard_after_forward = N >= 2: N; else 0 */
    Loc reshard_ranks_loc;       /* N as written, for main.c's check against --world */
    DType param_dtype, reduce_dtype, output_dtype;
    Loc mixed_loc;               /* the mixed_precision(...) setting, when written */
    int prefetch_forward, prefetch_backward;
    /* prefetch's arguments as written: memory_budget's search varies only
     * those left out (and reshard_after_forward when it is -1) */
    bool prefetch_forward_set, prefetch_backward_set;
    Loc prefetch_forward_loc, prefetch_backward_loc;
    bool offload_cpu;
    bool accumulate_unsharded;   /* accumulate = unsharded */
    bool reshard_after_backward; /* false: keep gathered until the step's last backward */
    int64_t auto_bucket_bytes;   /* fully_shard auto(bucket = N); 0: explicit groups */
    int64_t memory_budget_bytes; /* 0: none */
    Loc memory_budget_loc;       /* the setting, for plan_choose's error */
    RecomputeSpec recompute;     /* the shard-wide setting: what a unit without
                                    one on its fully_shard line inherits */
    int64_t replicate;           /* replicate = R (HSDP): R replicas of W/R ranks; 1: plain FSDP */
    Loc replicate_loc;           /* its value, for main.c's check against --world */
    bool replicate_auto;         /* replicate = auto: plan_choose sets replicate from the
                                    mesh's candidates (docs/design.md#replicate-auto) */
} ShardConfig;

typedef struct TrainConfig {
    int64_t micro_batch, grad_accum, steps, seed;
    OptimizerKind optimizer;
    double lr, beta1, beta2, eps, weight_decay, momentum;
    bool nesterov;
    LrSchedule schedule;
    int64_t warmup;              /* every schedule's; `constant` too */
    double min_lr;               /* cosine, linear and wsd */
    double decay;                /* wsd: the fraction of the steps that decays */
    double grad_clip;            /* 0: none */
    int64_t ckpt_every;          /* 0: no checkpoints */
    const char *ckpt_dir;
    bool ckpt_async;
    int64_t ckpt_keep;           /* 0: keep all */
    const char *data, *val_data;
    int64_t eval_every;          /* eval(every = N): 0, none */
    int64_t eval_sequences;      /* eval(..., sequences = K): 0, every whole one in the file */
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
    bool groups_auto;            /* planner.c replaced them: fully_shard auto(...) */
    ShardConfig shard;
    TrainConfig train;
    /* sema: the sections model_build reads (shard and train may be NULL) */
    Section *model_sec, *shard_sec, *train_sec;
} Model;

/* Checks the program: its sections, declarations and forward bodies (every
 * value's shape). Returns the model with its name, sequence length,
 * vocabulary, module types and sections, for model_build; NULL when there
 * were errors (all reported through d). */
Model *sema_check(Program *p, Diag *d);
const char *layer_kind_name(LayerKind k);
const char *builtin_fn_name(BuiltinFn f);

/* ───────────────────────── eval.c: names, constants, arguments ────────── */

/* A folded constant. */
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
    int child_index;      /* DECL_LAYER: position among its module's layers */
} DeclInfo;

/* The names in reach: decls (mt's members, when mt is set), then outer's.
 * self is the declaration whose value is being read, or NULL: its own name
 * there, and in constant expressions the names declared after it in decls,
 * are not in reach yet, so they mean what they mean in outer
 * (docs/design.md#the-language, "Names"). */
typedef struct Scope {
    Decl *decls;
    struct Scope *outer;
    ModuleType *mt;
    Decl *self;
} Scope;

/* The arguments a built-in layer or a settings function takes. */
typedef enum {
    A_INT, A_FLOAT, A_BOOL, A_STRING, A_SIZE, A_ENUM, A_LAYER, A_PAIR,
    A_ROPE,     /* none | rope(theta = ...) */
    A_INIT,     /* normal(std = ...) */
    A_QK_NORM,  /* none | rms | rms(eps = ...) */
    A_BIAS,     /* true | false | qkv */
} ArgType;

typedef struct ArgSpec {
    const char *name;
    ArgType type;
    bool required;
    const char *const *choices;   /* A_ENUM */
} ArgSpec;

enum { MAX_ARGS = 10 };

typedef struct Signature {
    const char *name;
    ArgSpec args[MAX_ARGS];
} Signature;

/* What sema learned about d (made on first use). */
DeclInfo *eval_info(Decl *d);
/* Looks a name up through sc and its enclosing scopes; *outer is set when
 * it was found in an enclosing one. NULL when it is not declared. A scope's
 * self is passed over: in its own value a declaration's name is the
 * enclosing scope's. */
Decl *eval_lookup(Scope *sc, const char *name, bool *outer);
/* sc with self set to d: the scope d's own value is read in. */
Scope eval_decl_scope(Scope *sc, Decl *d);
/* The slot of name in t's member index: where it is, or the empty slot
 * where it would go (sema.c fills the index). */
Decl **eval_index_slot(ModuleType *t, const char *name);
/* Every name sc sees, NULL-terminated, for diag_suggest. */
const char **eval_scope_names(Scope *sc);
/* "a constant", "a layer", "a block type", "a forward". */
const char *eval_decl_what(Decl *d);
/* A folded value as a message shows it: "12", "0.5", "true", "a string". */
const char *eval_value_desc(const Value *v);
/* "f32[B, 64, 768]". */
const char *eval_type_name(const Type *t);
/* Folds a constant expression; false (reported) when it is not one. */
bool eval_fold(Diag *d, Scope *sc, Expr *e, Value *out);
/* Folds a constant declaration once, in the scope it is declared in. */
bool eval_fold_const(Diag *d, Scope *sc, Decl *decl);
/* Matches call arguments to sig: positional first, then keywords; bound[i]
 * receives argument i, or NULL. False (reported) on a mismatch. */
bool eval_bind_args(Diag *d, const Signature *sig, Loc call_loc, Arg *args, Arg *bound[]);
/* A bound argument evaluated as the type it must be, `what` naming it in
 * messages; false (reported) when it is not. */
bool eval_int(Diag *d, Scope *sc, Expr *e, const char *what, int64_t lo, int64_t *out);
bool eval_float(Diag *d, Scope *sc, Expr *e, const char *what, double *out);
bool eval_bool(Diag *d, Scope *sc, Expr *e, const char *what, bool *out);
bool eval_string(Diag *d, Expr *e, const char *what, const char **out);
bool eval_enum(Diag *d, Expr *e, const char *what, const char *const *choices, int *out);

/* ───────────────────────── model.c: layer tree, groups, settings ──────── */

/* Builds what sema_check checked: the layer tree with every parameter, the
 * shard groups and the shard and train settings. Returns m, or NULL when
 * there were errors (all reported through d). */
Model *model_build(Model *m, Diag *d);
void model_dump(FILE *out, Model *m);
/* A recompute setting as written: "full", "every(2)". */
const char *model_recompute_name(const RecomputeSpec *s);
/* A fully_shard line's mixed precision as written: "mixed_precision(reduce = fp32)". */
const char *model_mixed_name(const MixedSpec *s);
/* A reshard_after_forward as written: "true", "false", "8". */
const char *model_reshard_name(const ReshardSpec *s);

/* ───────────────────────── ir.c: the op graph ───────────────────────── */

typedef enum {
#define OP(e, name, nin, nout, flops, backward) e,
#include "ops.def"
    OP_COUNT
} OpKind;

const char *op_name(OpKind k);
int op_arity(OpKind k);
int op_outputs(OpKind k);

typedef enum {
    TK_INPUT,   /* token ids, targets, positions */
    TK_ACT,     /* forward activation or statistic */
    TK_PARAM,   /* an unsharded parameter (a view into its group's buffer) */
    TK_PGRAD,   /* a parameter's gradient (a view into the group's grad buffer) */
    TK_AGRAD,   /* an activation's gradient */
} TensorKind;

typedef struct OpNode OpNode;

/* A value of the training graph. Shapes follow Type: dim[0] may be the
 * symbolic micro-batch DIM_BATCH. */
typedef struct Tensor {
    int id;
    TensorKind kind;
    const char *name;
    ValueDtype dtype;
    DType store;            /* how f32 values sit in memory: the compute dtype
                               (bf16 under a bf16 param policy, else fp32), or
                               fp32 for a statistic; i32 as is */
    bool stat;              /* a statistic (ir_stat): fp32 whatever the
                               compute dtype, `real` in the emitted code */
    int rank;
    int64_t dim[MAX_RANK];
    Param *param;           /* TK_PARAM, TK_PGRAD */
    OpNode *producer;       /* first op writing it (NULL: inputs, params) */
    bool saved;             /* forward tensor that backward reads */
    struct Tensor *recompute_of;  /* written by a recompute op: the forward
                                     value it is computed again as */
} Tensor;

struct OpNode {
    OpKind kind;
    int index;              /* position in Graph.ops */
    bool backward;
    Tensor *in[6], *out[4];
    int nin, nout;
    bool acc[4];            /* output i accumulates (+=) instead of writing */
    int64_t heads, kv_heads, head_dim;   /* attention, rope */
    double eps, theta;      /* norms; rope */
    bool causal;
    Layer *layer;           /* the layer instance it comes from, or NULL */
    Layer *scope;           /* the layer instance whose forward made it: its
                               layer, or for a function or operator of a
                               block's forward that block instance (the
                               model's root for the model's own forward);
                               a backward op has its forward op's */
    Loc loc;                /* the .fsd source it comes from */
    int group;              /* shard group whose params it reads or whose
                               grads it writes; -1 for none */
    bool recompute;         /* recompute.c: a forward op run again in backward */
    struct RecomputeUnit *unit;   /* recompute.c: the recomputation unit whose
                                     forward it belongs to (by its scope, so a
                                     backward op has its forward op's), or NULL */
};

/* The training step of one micro-batch: forward ops, then backward ops. */
typedef struct Graph {
    Model *m;
    OpNode **ops;
    int nops, nfwd;
    Tensor **tensors;
    int ntensors;
    Tensor *idx, *targets, *positions, *loss;
    Tensor **param_t;       /* by Param.index */
    Tensor **pgrad_t;       /* by Param.index; NULL for unused params */
    int ops_cap, tensors_cap;
    /* recompute.c: the units and their modes this graph was made with, and
     * the graph before recomputation (left as autodiff wrote it, so the
     * planner can make the graph again for other modes) */
    struct Recompute *rc;
    const struct Graph *base;
    bool fused;             /* fuse() ran on it */
} Graph;

OpNode *ir_op(Graph *g, OpKind kind, Layer *layer, Loc loc);
Tensor *ir_tensor(Graph *g, TensorKind kind, const char *name, ValueDtype dt, int rank,
                  const int64_t *dim);
void ir_in(OpNode *op, Tensor *t);
void ir_out(OpNode *op, Tensor *t, bool acc);
int64_t tensor_numel(const Tensor *t, int64_t batch);
int64_t tensor_bytes(const Tensor *t, int64_t batch);
/* The dtype the step computes in: bf16 when parameters are gathered in
 * bf16, else fp32 (fp16 gathers widen to fp32: docs/compiler.md). */
DType compute_dtype(const Model *m);
/* Marks t a statistic (norm mean/rstd, log-sum-exps, the loss): fp32 in
 * memory whatever the compute dtype. Returns t. */
Tensor *ir_stat(Tensor *t);
/* "bf16[B, 64, 64]": the tensor's shape with its dtype in memory. */
const char *tensor_type(const Tensor *t);
/* The run a norm op normalises: its weight's length, which divides x's
 * last dimension (qk_norm: one head). 0 for other ops. */
int64_t op_norm_width(const OpNode *op);
/* The widest attention head of the graph (0: no attention). */
int64_t widest_head(const Graph *g);
/* FLOPs and bytes touched by one op at micro-batch size `batch`. */
double op_flops(const OpNode *op, int64_t batch);
double op_bytes(const OpNode *op, int64_t batch);
double graph_flops(const Graph *g, int from, int to, int64_t batch);
/* The model's FLOPs of one micro-batch: every op but the recompute ops
 * (MFU's numerator; graph_flops over all ops is the hardware's, HFU's). */
double graph_model_flops(const Graph *g, int64_t batch);
/* Checks the graph's invariants (shapes of every op, single producer of
 * non-accumulated values, reads after writes); 0 when it holds. */
int ir_verify(Graph *g, FILE *err);
void ir_dump(FILE *out, Graph *g);

/* ───────────────────────── lower.c: typed model → forward ops ────────── */

Graph *lower_model(Model *m);

/* ───────────────────────── autodiff.c: forward → backward ops ────────── */

/* Appends the backward ops of g's forward, marks saved activations. */
void autodiff(Graph *g);

/* ───────────────────────── recompute.c: activation recomputation ──────── */

/* One unit of recomputation: an instance of a non-root fully_shard target
 * (blocks.3), or under fully_shard auto an element of a layer array. Its
 * forward ops are those whose scope lies in its subtree and in no deeper
 * unit's. */
typedef struct RecomputeUnit {
    Layer *layer;
    const RecomputeSpec *spec;   /* what the .fsd asks of it */
    int index;                   /* position among the units, in forward order */
    int nth;                     /* position among the units its spec covers */
    /* The mode the graph is transformed with: RC_NONE, RC_FULL or
     * RC_SELECTIVE; RC_AUTO until the planner chooses (plan_recompute). */
    RecomputeKind mode;
    bool auto_chosen;            /* mode chosen by the planner for `auto` */
    bool auto_unit;              /* asked `auto` (plan_recompute_search marks it) */
    /* filled in by recompute_apply: the forward values of the unit that
     * backward still reads (saved), and those it reads recomputed instead
     * (dropped after forward) */
    Tensor **saved, **dropped;
    int nsaved, ndropped;
} RecomputeUnit;

/* One assignment of the `auto` units' modes that the budget search
 * (plan_recompute_search) planned, with what it was predicted to cost. */
typedef struct RecomputeTry {
    const char *what;            /* "full on every 2nd, none on the rest" */
    bool fits, chosen;
    double step_s;               /* the simulated step, when it fits */
    int64_t peak;                /* bytes per rank, when it fits */
} RecomputeTry;

typedef struct Recompute {
    RecomputeUnit *units;
    int nunits;
    bool asked;                  /* the .fsd sets `recompute` somewhere */
    RecomputeTry *tries;         /* the budget search's, in the order weighed */
    int ntries;
} Recompute;

/* The units of g's forward (built from the model's Layer.recompute), in
 * forward order, each with the mode its setting asks for: every(k) is full
 * on the units it covers numbered 0, k, 2k, ..., none on the others; auto
 * stays RC_AUTO for the planner. */
Recompute *recompute_units(Model *m, const Graph *g);
/* A new graph: g with each full or selective unit's forward ops that its
 * backward needs cloned into backward (recompute ops, writing new tensors)
 * just before the first backward op that reads what they write, and those
 * readers reading the clones. g itself is not changed. Every unit's mode
 * must be chosen (no RC_AUTO). */
Graph *recompute_apply(const Graph *g, Recompute *rc);
/* The units with their modes (--dump-plan) or with the activations saved
 * and recomputed at micro-batch `batch` (--dump-memory); nothing when the
 * .fsd sets no `recompute`. */
void recompute_dump_plan(FILE *out, const Graph *g, int64_t batch);
void recompute_dump_memory(FILE *out, const Graph *g, int64_t batch);
const char *recompute_mode_name(RecomputeKind k);

/* ───────────────────────── fuse.c: fused forward ops ─────────────────── */

/* Merges add + layernorm/rmsnorm and matmul_bias + gelu pairs of
 * consecutive forward ops into one op each (add_layernorm, add_rmsnorm,
 * matmul_bias_gelu), and the same pairs of consecutive recompute ops;
 * tensors and backward ops are left as they are. */
void fuse(Graph *g);

/* ───────────────────────── plan.c: layout and policies ──────────────── */

/* Elements a group's parameters start at a multiple of (64 bytes in fp32):
 * aligned for 16-byte vector loads in every dtype. */
#define PARAM_ALIGN_ELEMS 16

typedef enum { ACCUM_SHARDED, ACCUM_UNSHARDED } AccumMode;

/* One alternative plan_choose weighed, with what it was predicted to
 * cost: the dumps list them. */
typedef enum { TRY_BUCKET, TRY_POLICY } PlanTryKind;
typedef struct PlanTry {
    PlanTryKind kind;
    bool chosen;
    /* TRY_BUCKET: fully_shard auto's bucket size, the groups it made and the
     * simulated step */
    int64_t bucket;
    int ngroups;
    double step_s;
    /* TRY_POLICY: a memory_budget candidate and its peak bytes per rank;
     * the parts the shard section wrote are fixed in every candidate */
    bool reshard;                /* non-root groups reshard after forward */
    /* N >= 2: they keep a copy sharded over N ranks after forward
     * (docs/design.md#partial-resharding), the planner's N or the shard
     * section's as written; 0: they reshard fully, or keep everything */
    int64_t reshard_ranks;
    int prefetch_fwd, prefetch_bwd;
    bool fixed_reshard, fixed_fwd, fixed_bwd;
    int64_t peak;
} PlanTry;

typedef struct Plan {
    Model *m;
    Graph *g;
    int prefetch_fwd, prefetch_bwd;
    AccumMode accum;
    int micro_batches;         /* grad_accum */
    int64_t micro_batch;       /* B */
    ShardGroup **fwd_order;    /* groups in order of first forward use */
    int nused;                 /* fwd_order[0..nused) are used in forward */
    /* set by plan_choose: the step's schedule and its memory plan for the
     * world planned for, and every alternative weighed */
    struct Schedule *sched;
    struct MemPlan *mem;
    PlanTry *tries;
    int ntries, cap_tries;
    /* replicate = auto: each R weighed (NULL otherwise) */
    struct MeshChoice *mesh;
} Plan;

/* One replicate = R that `replicate = auto` weighed: the plan made with it
 * (every other search run as for a written R), its predicted step and
 * exposed communication on the cluster, and its peak per rank. */
typedef struct MeshTry {
    int64_t replicate, shard;    /* R and S = W / R */
    bool planned;                /* false: no policy fit memory_budget under it */
    double step_s, exposed_s, tokens_per_s_gpu;
    int64_t peak;
    bool fits;                   /* planned, and its peak within the limit */
    bool chosen;
} MeshTry;

/* What replicate = auto weighed, for --dump-plan (planner.c). */
typedef struct MeshChoice {
    MeshTry *tries;
    int ntries;
    int64_t world, nodes, gpus_per_node;
    const char *gpu;             /* the cluster's GPU, "H100 SXM 80GB" */
    int64_t limit;               /* the memory a candidate must fit: memory_budget, else
                                    the GPU's HBM */
    bool limit_is_budget;
    bool none_fits;              /* no candidate fit: the leanest was taken */
    bool world_assumed;          /* no --world or --sim: the default world (main.c sets it) */
} MeshChoice;

/* Lays out the model's groups as they stand (offsets, padding, forward
 * order) with the shard section's policies; chooses nothing. */
Plan *plan_build(Model *m, Graph *g);
/* The ranks one group is sharded over at world w: w / replicate. */
int64_t plan_shard_world(const Model *m, int64_t world);
/* Sets every group's reshard and reshard_ranks: its fully_shard line's
 * setting where it has one, else `reshard` (the shard section's, or a
 * memory_budget policy's) for every group but the root, with the shard
 * section's N (docs/design.md#partial-resharding). */
void plan_apply_reshard(Model *m, bool reshard);
/* A group's padded flat size and per-rank shard for world size w: padded
 * to, and sharded over, the shard group of w / R ranks under replicate = R
 * (docs/design.md#hsdp). */
int64_t plan_padded_numel(const ShardGroup *sg, int64_t world);
int64_t plan_shard_numel(const ShardGroup *sg, int64_t world);
void plan_dump(FILE *out, Plan *p, int64_t world);

/* ───────────────────────── schedule.c: one step's events ───────────── */

typedef enum { STREAM_COMPUTE, STREAM_GATHER, STREAM_REDUCE, STREAM_COUNT } StreamId;
typedef enum { PH_FORWARD, PH_BACKWARD, PH_OPTIMIZER } Phase;

/* EV(enum, name, stream) */
#define EVENT_LIST(EV) \
    EV(EV_ALL_GATHER,     "all_gather",     STREAM_GATHER)  \
    EV(EV_WAIT_GATHER,    "wait_gather",    STREAM_COMPUTE) \
    EV(EV_COMPUTE,        "compute",        STREAM_COMPUTE) \
    EV(EV_RESHARD,        "reshard",        STREAM_COMPUTE) \
    EV(EV_KEEP_PARTIAL,   "keep_partial",   STREAM_COMPUTE) \
    EV(EV_GATHER_PARTIAL, "gather_partial", STREAM_GATHER)  \
    EV(EV_ALLOC_GRADS,    "alloc_grads",    STREAM_COMPUTE) \
    EV(EV_REDUCE_SCATTER, "reduce_scatter", STREAM_REDUCE)  \
    EV(EV_ALL_REDUCE,     "all_reduce",     STREAM_REDUCE)  \
    EV(EV_WAIT_REDUCE,    "wait_reduce",    STREAM_COMPUTE) \
    EV(EV_FREE_GRADS,     "free_grads",     STREAM_COMPUTE) \
    EV(EV_GRAD_NORM,      "grad_norm",      STREAM_COMPUTE) \
    EV(EV_OPTIMIZER,      "optimizer",      STREAM_COMPUTE)

typedef enum {
#define EV(e, name, stream) e,
    EVENT_LIST(EV)
#undef EV
    EV_COUNT
} EventKind;

typedef struct Event {
    EventKind kind;
    Phase phase;
    int micro;              /* micro-batch index, -1 for the optimizer phase; in a
                               pattern, 1 stands for micro-batches 1 .. n-2 */
    int group;              /* -1 for compute and grad_norm */
    OpNode *op;             /* EV_COMPUTE */
} Event;

/* One step of n micro-batches, written as a pattern
 * (docs/compiler.md#the-micro-batch-pattern): its first micro-batch
 * (micro 0), the middle one (micro 1) once, standing for micro-batches
 * 1 .. n-2, which all run the same events, and its last (micro n-1),
 * then the optimizer phase. For n <= 3 that is every
 * micro-batch and repeat is 1; a full expansion (schedule_build_full)
 * writes all n with repeat 1. A consumer counts an event schedule_runs
 * times per step (bytes, time, FLOPs), may take a maximum over the events
 * as the step's (the verifier checks that the middle micro-batch leaves the
 * state it found, so every repetition replays alike), and must not assume
 * that nev grows with n or that micro indices are consecutive. */
typedef struct Schedule {
    Plan *plan;
    int micro_batches;      /* n, the step this schedule is: plan->micro_batches when built */
    int repeat;             /* times micro-batch 1's events run per step: n - 2 for a
                               pattern of n >= 4 micro-batches, else 1 */
    bool forward_only;      /* schedule_build_eval's: one micro-batch's forward, nothing else */
    Event *ev;
    int nev, cap;
} Schedule;

const char *event_name(EventKind k);
bool op_reads_params(const OpNode *op);
bool op_writes_grads(const OpNode *op);
StreamId event_stream(EventKind k);
/* One step of `micro_batches` micro-batches under the plan's groups and
 * policies, as a pattern of at most three micro-batches (above). */
Schedule *schedule_build(Plan *p, int micro_batches);
/* The same step with every micro-batch written out (repeat 1): what the
 * tests hold the pattern's consumers to. Its size grows with the step. */
Schedule *schedule_build_full(Plan *p, int micro_batches);
/* Times event e runs in one step of s: s->repeat for micro-batch 1's
 * events, 1 for the others. */
static inline int64_t schedule_runs(const Schedule *s, const Event *e)
{
    return e->micro == 1 ? s->repeat : 1;
}
/* The forward of one micro-batch alone, for evaluation: the step's forward
 * events, then every group still gathered resharded; no gradient, no
 * optimizer (docs/compiler.md#the-schedule). */
Schedule *schedule_build_eval(Plan *p);
/* Replays the schedule against the plan's rules; prints each violation to
 * err (when not NULL) and returns how many there were. */
int schedule_verify(Schedule *s, FILE *err);

/* Text (one event a line) and JSON listings of the schedule for world w;
 * live memory per event is printed when mp is given. */
struct MemPlan;
void schedule_dump(FILE *out, Schedule *s, int64_t world, struct MemPlan *mp);
void schedule_dump_json(FILE *out, Schedule *s, int64_t world, struct MemPlan *mp);
/* Bytes one rank sends and receives for a collective event at world w:
 * all-gathers and reduce-scatters within the shard group, the replica
 * all-reduce across replicas (docs/design.md#hsdp). */
int64_t event_comm_bytes(const Schedule *s, const Event *e, int64_t world);
/* The mesh dimension a collective event runs over, for the dumps and the
 * trace: "shard" or "replicate"; NULL for other events. */
const char *event_mesh_dim(const Schedule *s, const Event *e);
/* An all-gather of either kind: from the shards, or (partial resharding)
 * from the copy kept over N ranks. */
static inline bool event_is_gather(EventKind k)
{
    return k == EV_ALL_GATHER || k == EV_GATHER_PARTIAL;
}

/* ───────────────────────── memplan.c: memory per rank ───────────────── */

typedef struct MemPlan {
    Schedule *sched;
    int64_t world, batch;
    /* resident for the whole run, bytes per rank */
    int64_t param_shards;        /* fp32 master shards */
    int64_t grad_shards;         /* fp32 sharded gradients */
    int64_t optim_state;         /* AdamW moments / SGD momentum */
    /* transient */
    int64_t act_arena;           /* activations and their gradients, placed by liveness;
                                    the runtime allocates it once and holds it whole */
    int64_t workspace;           /* the largest temporary any op needs */
    int64_t *act_offset;         /* by tensor id: offset in the arena, -1 if not there */
    int64_t *live_after;         /* by event: bytes live on the rank after it, as the
                                    trainer counts them: resident + unsharded buffers +
                                    the whole arena + the op's workspace */
    /* the peak: max of live_after, what the trainer allocates at most (its
     * mem_peak_bytes); the one figure the planner, the dumps, --sim and
     * --trace use (docs/design.md#memory-plan) */
    int peak_event;
    int64_t peak;
    int64_t peak_unsharded_params, peak_unsharded_grads;   /* at peak_event */
    int64_t peak_partial_copies; /* of peak_unsharded_params: reshard_after_forward = N's copies */
    int64_t peak_workspace;      /* 0 unless the peak is a compute event */
    /* the lower peak with activations freed as they die: those live at each
     * op instead of the whole arena; reached only by an allocator that
     * frees them into one pool with the unsharded buffers */
    int freed_peak_event;
    int64_t freed_peak;
    int64_t freed_peak_acts;   /* activation bytes live at freed_peak_event */
    /* resident detail */
    int64_t shard_numel;         /* Σ over groups of the per-rank shard */
    bool offload;                /* offload = cpu: the resident state is on the host */
    int64_t resident;            /* device bytes of the three above (0 with offload) */
    /* activations: live ranges by op, placement (memplan.c's ActRange) */
    struct ActRange *act;
    int nact;
    int64_t *act_live_at;        /* by op: activation bytes live while it runs */
    int64_t act_lower_bound;     /* max of act_live_at: no placement needs less */
    int act_lower_bound_op, workspace_op;
    /* over the whole step, each at its own event */
    int64_t max_unsharded_params, max_unsharded_grads;
    int max_params_event, max_grads_event;
    int64_t max_unsharded;       /* max over events of params + grads together */
} MemPlan;

MemPlan *memplan_build(Schedule *s, int64_t world);
/* Checks the activation placement (no two tensors live together share a
 * byte) and the replay's totals; prints each violation to err (when not
 * NULL) and returns how many there were. */
int memplan_verify(MemPlan *mp, FILE *err);
void memplan_dump(FILE *out, MemPlan *mp);

/* ───────────────────────── sim.c: cost model and replay ───────────── */

/* One GPU type of a preset and how its nodes are wired; rates per GPU.
 * Each figure's source is next to it in sim.c. */
typedef struct SimGpu {
    const char *key;             /* the --sim name: a100, h100, h200, b200 */
    const char *name;            /* "H100 SXM 80GB" */
    double bf16_flops;           /* dense tensor-core peak, FLOP/s (fp16 alike) */
    double tf32_flops;           /* dense TF32 tensor-core peak */
    double fp32_flops;           /* fp32 on the CUDA cores */
    double attention_eff;        /* eff = ideal: FlashAttention-2's fraction of peak */
    double hbm_bytes_per_s;
    int64_t hbm_bytes;           /* capacity */
    double nvlink_bytes_per_s;   /* one direction */
    double nvlink_alpha_s;       /* latency of one ring step over NVLink */
    int nics;                    /* NICs per node of the generation's DGX system */
    double nic_bytes_per_s;      /* each NIC, one direction */
    double ib_alpha_s;           /* latency of one ring step across nodes */
} SimGpu;

/* How compute ops are costed: `ideal`, fractions of peak (sim.c's named
 * efficiencies), or `measured`, per op kind and shape class from a
 * calibration file (docs/simulator.md#calibration-files). */
typedef enum { SIM_EFF_IDEAL, SIM_EFF_MEASURED } SimEff;
typedef struct SimCalib SimCalib;   /* a parsed calibration file (sim.c) */

typedef struct SimCluster {
    const SimGpu *gpu;
    int64_t nodes, gpus_per_node;
    int64_t world;               /* ranks; at most nodes x gpus_per_node */
    int64_t nics;                /* NICs per node (nics=), the preset's unless told */
    double nic_bytes_per_s;      /* each NIC, one direction (nic_gbps=) */
    /* the GPU's memory and NVLink: the preset's, or the hbm_gbs=, hbm_gib=
     * and nvlink_gbs= settings for a variant of it (an H800's NVLink, a
     * 96 GB part); `variant` lists those settings ("" when none) */
    double hbm_bytes_per_s;
    int64_t hbm_bytes;
    double nvlink_bytes_per_s;   /* one direction */
    const char *variant;
    SimEff eff;
    const SimCalib *calib;       /* eff = measured: the figures (NULL otherwise) */
} SimCluster;

/* Parses a --sim spec: "h100", "h100:nodes=16", "a100:gpus=4,nodes=2",
 * "h100:nodes=8,nics=4,nic_gbps=200", "h200:gpus=1,eff=measured",
 * "h200:calib=FILE", "h100:hbm_gbs=2400,hbm_gib=96,nvlink_gbs=400" (one
 * node of 8 GPUs unless told). On error returns
 * false with a message for the user in msg naming the key and value. */
bool sim_parse_cluster(const char *spec, SimCluster *c, char *msg, size_t msgsize);
/* "H100 SXM 80GB", or with the variant's settings "H100 SXM 80GB (hbm_gib=96)" */
const char *sim_gpu_label(const SimCluster *c);
/* What --trace assumes without --sim: h100 nodes of 8, ceil(world/8) nodes. */
SimCluster sim_default_cluster(int64_t world);
const char *sim_preset_list(void);        /* "a100, h100, h200, b200" */

typedef enum { COLL_ALL_GATHER, COLL_REDUCE_SCATTER, COLL_ALL_REDUCE } CollKind;
/* Seconds one collective takes when each of `ranks` ranks contributes `bytes`
 * (all-gather: its shard; reduce-scatter and all-reduce: its whole buffer),
 * the group's members `stride` ranks apart (consecutive ranks: stride 1; one
 * rank per node in a replica group: stride = ranks per shard group). */
double sim_group_collective_seconds(const SimCluster *c, CollKind kind, int64_t bytes,
                                    int64_t ranks, int64_t stride);
/* NCCL's algorithms as the simulator models them; SIM_ALGO_NONE for a
 * group of one rank, which moves nothing. */
typedef enum { SIM_ALGO_NONE, SIM_ALGO_RING, SIM_ALGO_TREE } SimAlgo;
/* The same collective with the algorithm chosen (the faster by NCCL's
 * model) and its bus bandwidth in nccl-tests' convention (bytes/s: algbw x
 * (n-1)/n for all-gather and reduce-scatter, x 2(n-1)/n for all-reduce). */
double sim_collective_detail(const SimCluster *c, CollKind kind, int64_t bytes, int64_t ranks,
                             int64_t stride, SimAlgo *algo, double *busbw);
const char *sim_algo_name(SimAlgo a);     /* "ring", "tree", "none" */
const char *sim_coll_name(CollKind k);    /* "all-gather", ... */
/* Seconds a ring all-gather or reduce-scatter over the whole world takes
 * when each rank receives `bytes` (the bus bytes: (W-1)/W of the buffer). */
double sim_collective_seconds(const SimCluster *c, int64_t bytes);

/* One step replayed on the cluster; times in seconds from the step's start. */
typedef struct Sim {
    Schedule *sched;
    SimCluster cluster;
    double *start_s, *end_s;     /* by event; a wait's span is the time it held compute;
                                    a pattern's micro-batch 1: its first run */
    double elided_from_s, elided_to_s; /* a pattern's runs of micro-batch 1 after the first:
                                    from the first's end to the last micro-batch's start */
    int replayed_runs;           /* runs of micro-batch 1 replayed before the steady
                                    state added the rest at once (sim.c's replay_middle) */
    bool *mem_bound;             /* by event: a compute event limited by HBM */
    double step_s;               /* when the last stream finishes */
    double compute_s;            /* compute-stream work (ops, grad norm, optimizer) */
    double cat_s[4];             /* of which matmul, attention, memory-bound ops, optimizer */
    double exposed_s;            /* compute stream waiting on collectives */
    double exposed_gather_s, exposed_reduce_s;
    double busy_s[STREAM_COUNT]; /* each stream's busy time */
    int64_t algo_runs[STREAM_COUNT][3]; /* collectives of each stream by SimAlgo */
    int64_t calib_ops, ideal_ops; /* eff = measured: op events costed from the
                                    calibration, and by the ideal fractions for
                                    want of an entry */
    const char *uncalibrated;    /* those ops' kinds, "a, b" ("" when none) */
    int64_t bytes[STREAM_COUNT]; /* per rank per step, by stream */
    double model_flops;          /* counted FLOPs per rank per step, recompute ops left out */
    double hw_flops;             /* the same with the recompute ops: what the GPU runs */
    double peak_flops;           /* the matmul peak MFU is measured against */
    double mfu, hfu;             /* model and hardware FLOPs utilisation */
    double tokens_per_step;      /* per rank: micro_batch x seq x micro-batches */
    double tokens_per_s_gpu, tokens_per_s;
} Sim;

Sim *sim_run(Schedule *s, const SimCluster *c);
/* The --sim summary; memory is included when mp is given. */
void sim_dump(FILE *out, const Sim *sim, const MemPlan *mp);
/* The replay as a Chrome trace (Trace Event Format JSON), with the memory
 * plan's bytes held as a counter track and its peak. */
void sim_trace(FILE *out, const Sim *sim, const MemPlan *mp);

/* ───────────────────────── planner.c: every choice, in one place ──────── */

/* Chooses what the .fsd leaves open and plans the step for c->world ranks:
 * under replicate = auto the mesh (each candidate R planned as below and
 * simulated; p->mesh lists them), fully_shard auto's groups (bucket sizes searched through the simulator
 * on c), then under memory_budget the fastest reshard policy and prefetch
 * depth that fit (searched through the memory planner), then the step's
 * schedule and memory plan (p->sched, p->mem; not verified yet). Every
 * alternative weighed is in p->tries. NULL, with the error reported, when
 * nothing fits the budget. */
Plan *plan_choose(Model *m, Graph *g, const SimCluster *c, Diag *d);
/* Under memory_budget, chooses the modes of the units that ask `auto`:
 * each of a ladder of assignments (none, selective, full on every 4th or
 * 2nd unit, full) is transformed from base, fused when fuse_ops, planned
 * by plan_choose and simulated on c, and the fastest whose plan fits the
 * budget wins (the leanest when none fits, so that plan_choose reports
 * it). Every assignment is in rc->tries. False, choosing nothing, without
 * a budget or an auto unit. */
bool plan_recompute_search(Model *m, const Graph *base, Recompute *rc, bool fuse_ops,
                           const SimCluster *c);
/* Chooses each recomputation unit's mode before the graph is transformed
 * (recompute_apply): what the .fsd asks; `auto` units the search did not
 * choose recompute nothing. */
void plan_recompute(Recompute *rc);
/* The alternatives weighed, as --dump-plan (bucket sizes) and
 * --dump-memory (policies) list them. */
void plan_dump_buckets(FILE *out, const Plan *p);
void plan_dump_policies(FILE *out, const Plan *p);
/* Whether the budget search tried partial resharding's N itself (the dump
 * says where those candidates stand in its order). */
bool plan_tried_partial(const Plan *p);
/* replicate = auto's table for --dump-plan: each R, its step, exposed
 * communication, tokens/s per GPU and peak, and why the chosen one won. */
void plan_dump_mesh(FILE *out, const Plan *p);

/* ───────────────────────── emit.c: the training program ─────────────── */

/* Writes train.cu for the chosen plan. It walks schedules of one and of
 * three micro-batches (every distinct micro-batch of any step appears in
 * one of them), which it builds and verifies itself; returns the verifier's
 * count of violations (printed to err), and writes nothing unless 0. */
int emit_program(FILE *out, Plan *p, FILE *err);
/* A template's text, built into fsdpc from templates/ (NULL if absent). */
const char *template_text(const char *name);
/* The template file holding an op's kernels ("norm.h"); NULL for the
 * matrix products, which go through fsdrt_gemm. */
const char *emit_template_of(OpKind k);
/* The files pasted before a family's own, in order, NULL-terminated
 * (attention.h's: mma.h and its backends). */
const char *const *emit_template_parts(const char *family);

/* ───────────── hfconfig.c: a Hugging Face config.json → .fsd ───────────── */

/* fsdpc --from-hf: the .fsd text (arena) of the GPT-2 or Llama model the
 * config.json at `path` describes, with training sequence length seq (0:
 * the model's positions); NULL when the file cannot be read or describes
 * what fsdpc cannot express, each reason printed to err naming the file
 * and the key. */
char *hfconfig_fsd(const char *path, int64_t seq, FILE *err);

/* ─────────────── verify.c: the program's kernels through NVRTC ─────────────── */

/* fsdpc --verify: compiles the kernel templates the graph uses with NVRTC
 * for each architecture in `archs` (comma-separated: "sm_80,sm_90"), one
 * program per template so every message names its file. NVRTC is loaded at
 * run time (dlopen), so fsdpc needs the CUDA toolkit only when asked to
 * verify. Writes a report to out: each kernel's registers, stack and
 * spills (ptxas's own figures), each error against its template line and
 * the .fsd lines of the ops using that template. Returns the number of
 * failed compiles, or -1 when NVRTC cannot be loaded or an architecture is
 * malformed (the report says why). */
int verify_kernels(FILE *out, Model *m, Graph *g, const char *archs);

#endif
