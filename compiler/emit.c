/*
 * emit.c — writes train.cu: the verified schedule as one readable program.
 *
 * The file has four parts:
 *   1. the kernels the model uses, copied from templates/ (embedded in fsdpc
 *      at build time), written once for both backends;
 *   2. constant tables: parameters (name, group, offset, shape, init),
 *      shard groups, arena tensors with their live ranges, the train
 *      section; fsdrt_init sizes everything from them at start-up, so the
 *      world size stays a run-time value;
 *   3. one function per distinct micro-batch of the schedule: its tensors
 *      declared by name with their shapes, then every event in schedule
 *      order, one line per op with the .fsd line it comes from; and
 *      eval_forward, evaluation's forward-only micro-batch, written the same
 *      way from schedule_build_eval's events;
 *   4. main: the step loop the runtime drives.
 *
 * Names: an arena tensor is a local named after the model (blocks.0.ln2.out
 * is `blocks_0_ln2_out`, its gradient `d_blocks_0_ln2_out`), a parameter an
 * enumerator (`fsdrt_param(r, P_blocks_0_ln2_weight)`). Both come from one
 * pass over the model, unique and deterministic (see c_names).
 *
 * Each pasted template opens with `#line 1 "templates/X.h"` so a compiler
 * error in it names the template's own line, and the code after it goes
 * back to train.cu's own numbering with `#line N "train.cu"` (the emitter
 * counts the lines it writes; it never learns -o's name, so it uses the
 * name the program calls itself in its first line).
 *
 * Micro-batches differ only when gradients accumulate unsharded (the first
 * allocates gradient buffers, the last reduce-scatters them) or parameters
 * stay gathered between them (reshard_after_backward = false), so the
 * emitter builds and verifies schedules of one and of three micro-batches
 * under the plan's chosen policy, and writes each distinct micro-batch
 * once: `only` (a step of one), `first`, `middle` and `last`. Nothing here
 * reorders the schedule.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

typedef struct Emit {
    FILE *out;
    Model *m;
    Graph *g;
    Plan *plan;
    int *act;          /* by tensor id: arena index, -1 for params, inputs */
    int nacts;
    int nbuf[2];       /* buffer events of the one- and three-micro-batch steps */
    int nlayers;       /* entries of layer_info[] (FsdLayerInfo) */
    const char **var;  /* by tensor id: the C local of an arena tensor */
    const char **pvar; /* by parameter index: its enumerator, P_... */
    const char **gvar; /* by group index: its enumerator, G_... */
    int lines;         /* newlines written so far: train.cu's line for #line */
    const RecomputeUnit *recomputing;   /* the unit of the last op written, if a recompute op */
    bool eval;         /* writing eval_forward: the loss is taken per sequence */
} Emit;

/* Everything goes out through put, which counts lines for #line. */
static void put(Emit *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Emit *e, const char *fmt, ...)
{
    char small[1024], *s = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        fsd_unreachable();
    if ((size_t)n >= sizeof small) {
        s = arena_alloc((size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(s, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    fputs(s, e->out);
    for (; *s; s++)
        e->lines += *s == '\n';
}

#define P(...) put(e, __VA_ARGS__)

/* ── names and shapes ── */

/* The product of t's first `ndims` dimensions, divided by `per`, as a C
 * expression in the micro-batch size B. */
static const char *count_expr(const Tensor *t, int ndims, int64_t per)
{
    int64_t n = 1;
    bool batch = false;
    for (int i = 0; i < ndims; i++) {
        if (t->dim[i] == DIM_BATCH)
            batch = true;
        else
            n *= t->dim[i];
    }
    n /= per;
    return batch ? arena_printf("B * %" PRId64, n) : arena_printf("%" PRId64, n);
}

/* An element count. */
static const char *numel_expr(const Tensor *t) { return count_expr(t, t->rank, 1); }

/* Rows of a tensor whose last dimension is C. */
static const char *rows_expr(const Tensor *t) { return count_expr(t, t->rank - 1, 1); }

static int64_t last_dim(const Tensor *t) { return t->dim[t->rank - 1]; }

/* Runs of C elements in t, C dividing its last dimension: a norm's rows,
 * or with qk_norm each head of each row (op_norm_width). */
static const char *runs_expr(const Tensor *t, int64_t C) { return count_expr(t, t->rank, C); }


/* Names a micro-batch function already uses, or that C, C++ or CUDA keep:
 * a tensor whose name is one of these gets a suffix instead. Global
 * variables are here too, since the trainer builds with -Wshadow. */
static const char *const reserved[] = {
    /* the micro-batch function's own names, and train.cu's globals */
    "r", "B", "k", "micro", "act", "real", "OP", "step", "main", "model", "params", "groups",
    "acts", "layer_info", "buf_one", "buf_three",
    /* C and C++ keywords and the like */
    "auto", "bool", "break", "case", "catch", "char", "class", "const", "constexpr",
    "continue", "default", "delete", "do", "double", "else", "enum", "explicit", "export",
    "extern", "false", "float", "for", "friend", "goto", "if", "inline", "int", "long",
    "mutable", "namespace", "new", "noexcept", "nullptr", "operator", "private", "protected",
    "public", "register", "restrict", "return", "short", "signed", "sizeof", "static",
    "struct", "switch", "template", "this", "throw", "true", "try", "typedef", "typeid",
    "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "while", "NULL",
    /* CUDA's built-in variables */
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize",
};

static bool is_reserved(const char *id)
{
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
        if (strcmp(id, reserved[i]) == 0)
            return true;
    /* the launchers (templates/README.md): a forward op X is X_fwd, a
     * backward op keeps its name (*_bwd, reduce_to, copy); a tensor may
     * still be called after a forward op ("add", "relu") */
    for (int k = 0; k < OP_COUNT; k++) {
        const char *n = op_name((OpKind)k);
        size_t len = strlen(n);
        if (strncmp(id, n, len) == 0 && strcmp(id + len, "_fwd") == 0)
            return true;
    }
    size_t len = strlen(id);
    if ((len > 4 && strcmp(id + len - 4, "_bwd") == 0) || strcmp(id, "reduce_to") == 0 ||
        strcmp(id, "copy") == 0)
        return true;
    /* the runtime's and the templates' prefixes */
    return strncmp(id, "fsd", 3) == 0 || strncmp(id, "FSD", 3) == 0;
}

/* A model name as a C identifier: every character that cannot be in one
 * becomes '_' ("blocks.0.ln2.out" -> "blocks_0_ln2_out", a gradient
 * "d.x" -> "d_x"); one that would start with a digit, or with '_' (names
 * C keeps for itself), gains "t_". */
static char *c_ident(const char *prefix, const char *name)
{
    size_t np = strlen(prefix), n = strlen(name);
    char *id = arena_alloc(np + n + 3);
    char *o = id;
    if (!np && (!n || (name[0] >= '0' && name[0] <= '9') || name[0] == '_')) {
        *o++ = 't';
        *o++ = '_';
    }
    memcpy(o, prefix, np);
    o += np;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_';
        *o++ = ok ? c : '_';
    }
    return id;
}

/* The first of base, base_2, base_3, ... not yet taken; takes it. */
static const char *unique(const char **taken, int *ntaken, const char *base)
{
    const char *id = base;
    for (int suffix = 2;; suffix++) {
        bool clash = is_reserved(id);
        for (int i = 0; i < *ntaken && !clash; i++)
            clash = strcmp(taken[i], id) == 0;
        if (!clash)
            break;
        id = arena_printf("%s_%d", base, suffix);
    }
    taken[(*ntaken)++] = id;
    return id;
}

/* C names for every group, parameter and arena tensor, from one set so
 * that no enumerator and local can meet: groups first, then parameters, in
 * index order, then tensors in id order; where two would share a name, the later one gets
 * the first free suffix _2, _3, ... (the model's second residual sum in a
 * block, both "blocks.0.add", becomes blocks_0_add_2). The same model
 * gives the same names on every run. */
static void c_names(Emit *e)
{
    Model *m = e->m;
    Graph *g = e->g;
    const char **taken =
        arena_alloc(sizeof(char *) * (size_t)(m->ngroups + m->nparams + g->ntensors));
    int ntaken = 0;
    e->gvar = arena_alloc(sizeof(char *) * (size_t)m->ngroups);
    for (int i = 0; i < m->ngroups; i++)
        e->gvar[i] = unique(taken, &ntaken, c_ident("G_", m->groups[i]->name));
    e->pvar = arena_alloc(sizeof(char *) * (size_t)(m->nparams ? m->nparams : 1));
    e->var = arena_alloc(sizeof(char *) * (size_t)(g->ntensors ? g->ntensors : 1));
    for (int i = 0; i < m->nparams; i++)
        e->pvar[i] = unique(taken, &ntaken, c_ident("P_", m->params[i]->name));
    /* autodiff names a gradient "d." and its tensor's name: d_blocks_0_add */
    for (int t = 0; t < g->ntensors; t++)
        if (e->act[t] >= 0)
            e->var[t] = unique(taken, &ntaken, c_ident("", g->tensors[t]->name));
}

/* The C expression naming a tensor's memory. */
static const char *ref(Emit *e, const Tensor *t)
{
    switch (t->kind) {
    case TK_PARAM: return arena_printf("fsdrt_param(r, %s)", e->pvar[t->param->index]);
    case TK_PGRAD: return arena_printf("fsdrt_grad(r, %s)", e->pvar[t->param->index]);
    case TK_INPUT:
        if (t == e->g->idx)
            return "fsdrt_idx(r)";
        if (t == e->g->targets)
            return "fsdrt_targets(r)";
        return "fsdrt_positions(r)";
    case TK_ACT:
    case TK_AGRAD: return e->var[t->id];
    }
    fsd_unreachable();
}

static const char *acc(const OpNode *op, int i) { return op->acc[i] ? "true" : "false"; }

/* A C string literal. */
static const char *cstr(const char *s)
{
    if (!s)
        return "NULL";
    const char *o = "\"";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            o = arena_printf("%s\\%c", o, c);
        else if (c < 32 || c > 126)
            o = arena_printf("%s\\%03o", o, c);
        else
            o = arena_printf("%s%c", o, c);
    }
    return arena_printf("%s\"", o);
}

/* ── one op ── */

static void emit_op(Emit *e, const OpNode *op)
{
    Model *m = e->m;
    int line, col;
    loc_line_col(m->prog->src, op->loc.begin, &line, &col);
    const char *where = op->layer && op->layer->path[0] ? op->layer->path : m->name;
    const char *call = NULL;   /* the op's statement, without its ';' */
    const Tensor *x = op->nin ? op->in[0] : NULL;
    const Tensor *y = op->nout ? op->out[0] : NULL;
#define R(t) ref(e, (t))
    switch (op->kind) {
    case OP_EMBED:
        call = arena_printf("embed_fwd(%s, %s, %s, %s, %" PRId64 ", %" PRId64 ")", R(y),
                            R(op->in[0]), R(op->in[1]), numel_expr(op->in[1]), last_dim(y),
                            op->in[0]->dim[0]);
        break;
    case OP_EMBED_BWD:
        call = arena_printf("embed_bwd(%s, %s, %s, %s, %" PRId64 ", %" PRId64 ")", R(y),
                            R(op->in[0]), R(op->in[1]), numel_expr(op->in[1]), last_dim(op->in[0]),
                            y->dim[0]);
        break;
    case OP_MATMUL: /* y[rows, N] = x[rows, K] · W[N, K]ᵀ */ {
        int64_t N = op->in[1]->dim[0], K = op->in[1]->dim[1];
        call = arena_printf("fsdrt_gemm(r, false, true, %s, %" PRId64 ", %" PRId64 ", 1, %s, %"
                            PRId64 ", %s, %" PRId64 ", 0, %s, %" PRId64 ")", rows_expr(x), N, K,
                            R(x), K, R(op->in[1]), K, R(y), N);
        break;
    }
    case OP_MATMUL_BIAS: /* y[rows, N] = x[rows, K] · W[N, K]ᵀ + b[N] */ {
        int64_t N = op->in[1]->dim[0], K = op->in[1]->dim[1];
        call = arena_printf("fsdrt_gemm_bias(r, false, true, %s, %" PRId64 ", %" PRId64 ", %s, %"
                            PRId64 ", %s, %" PRId64 ", %s, %s, %" PRId64 ")", rows_expr(x), N, K,
                            R(x), K, R(op->in[1]), K, R(op->in[2]), R(y), N);
        break;
    }
    case OP_MATMUL_BIAS_GELU: /* p[rows, N] = x · Wᵀ + b, y = gelu(p) */ {
        /* the CUDA backend applies gelu in the product's epilogue; the CPU
         * backend writes p alone and the template's gelu follows */
        int64_t N = op->in[1]->dim[0], K = op->in[1]->dim[1];
        call = arena_printf("if (!fsdrt_gemm_bias_gelu(r, false, true, %s, %" PRId64 ", %" PRId64
                            ", %s, %" PRId64 ", %s, %" PRId64 ", %s, %s, %s, %" PRId64
                            ")) gelu_fwd(%s, %s, %s)", rows_expr(x), N, K, R(x), K, R(op->in[1]), K,
                            R(op->in[2]), R(y), R(op->out[1]), N, R(op->out[1]), R(y),
                            numel_expr(y));
        break;
    }
    case OP_MATMUL_DX: /* dx[rows, K] (+)= dy[rows, N] · W[N, K] */ {
        int64_t N = op->in[1]->dim[0], K = op->in[1]->dim[1];
        call = arena_printf("fsdrt_gemm(r, false, false, %s, %" PRId64 ", %" PRId64 ", 1, %s, %"
                            PRId64 ", %s, %" PRId64 ", %d, %s, %" PRId64 ")", rows_expr(x), K, N,
                            R(x), N, R(op->in[1]), K, op->acc[0], R(y), K);
        break;
    }
    case OP_MATMUL_DW: /* dW[N, K] += dy[rows, N]ᵀ · x[rows, K] */ {
        int64_t N = y->dim[0], K = y->dim[1];
        call = arena_printf("fsdrt_gemm(r, true, false, %" PRId64 ", %" PRId64 ", %s, 1, %s, %"
                            PRId64 ", %s, %" PRId64 ", 1, %s, %" PRId64 ")", N, K, rows_expr(x),
                            R(x), N, R(op->in[1]), K, R(y), K);
        break;
    }
    case OP_BIAS_BWD:
        call = arena_printf("bias_bwd(%s, %s, %s, %" PRId64 ")", R(y), R(x), rows_expr(x),
                            last_dim(x));
        break;
    /* the norms run over rows of C = the weight's length (op_norm_width);
     * the bias-free LayerNorm passes NULL for its bias and db */
    case OP_LAYERNORM:
    case OP_LAYERNORM_NOBIAS: {
        int64_t C = op_norm_width(op);
        call = arena_printf("layernorm_fwd(%s, %s, %s, %s, %s, %s, %s, %" PRId64 ", %.9g)", R(y),
                            R(op->out[1]), R(op->out[2]), R(x), R(op->in[1]),
                            op->kind == OP_LAYERNORM ? R(op->in[2]) : "NULL", runs_expr(x, C), C,
                            op->eps);
        break;
    }
    case OP_LAYERNORM_BWD:        /* in: dy, x, w, mean, rstd; out: dx, dw, db */
    case OP_LAYERNORM_NOBIAS_BWD: /* in: dy, x, w, mean, rstd; out: dx, dw */ {
        int64_t C = op_norm_width(op);
        call = arena_printf("layernorm_bwd(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %" PRId64 ")",
                            R(y), acc(op, 0), R(op->out[1]),
                            op->kind == OP_LAYERNORM_BWD ? R(op->out[2]) : "NULL", R(x),
                            R(op->in[1]), R(op->in[2]), R(op->in[3]), R(op->in[4]),
                            runs_expr(x, C), C);
        break;
    }
    case OP_ADD_LAYERNORM:        /* in: a, b, w, bias; out: sum, y, mean, rstd */
    case OP_ADD_LAYERNORM_NOBIAS: /* in: a, b, w; out: sum, y, mean, rstd */ {
        int64_t C = op_norm_width(op);
        call = arena_printf("add_layernorm_fwd(%s, %s, %s, %s, %s, %s, %s, %s, %s, %" PRId64
                            ", %.9g)", R(y), R(op->out[1]), R(op->out[2]), R(op->out[3]), R(x),
                            R(op->in[1]), R(op->in[2]),
                            op->kind == OP_ADD_LAYERNORM ? R(op->in[3]) : "NULL",
                            runs_expr(x, C), C, op->eps);
        break;
    }
    case OP_ADD_RMSNORM: /* in: a, b, w; out: sum, y, rstd */ {
        int64_t C = op_norm_width(op);
        call = arena_printf("add_rmsnorm_fwd(%s, %s, %s, %s, %s, %s, %s, %" PRId64 ", %.9g)", R(y),
                            R(op->out[1]), R(op->out[2]), R(x), R(op->in[1]), R(op->in[2]),
                            runs_expr(x, C), C, op->eps);
        break;
    }
    case OP_RMSNORM: {
        int64_t C = op_norm_width(op);
        call = arena_printf("rmsnorm_fwd(%s, %s, %s, %s, %s, %" PRId64 ", %.9g)", R(y),
                            R(op->out[1]), R(x), R(op->in[1]), runs_expr(x, C), C, op->eps);
        break;
    }
    case OP_RMSNORM_BWD: /* in: dy, x, w, rstd; out: dx, dw */ {
        int64_t C = op_norm_width(op);
        call = arena_printf("rmsnorm_bwd(%s, %s, %s, %s, %s, %s, %s, %s, %" PRId64 ")", R(y),
                            acc(op, 0), R(op->out[1]), R(x), R(op->in[1]), R(op->in[2]),
                            R(op->in[3]), runs_expr(x, C), C);
        break;
    }
    case OP_ROPE:
        call = arena_printf("rope_fwd(%s, %s, B, %" PRId64 ", %" PRId64 ", %" PRId64 ", %.17g)",
                            R(y), R(x), x->dim[1], op->heads, op->head_dim, op->theta);
        break;
    case OP_ROPE_BWD:
        call = arena_printf("rope_bwd(%s, %s, %s, B, %" PRId64 ", %" PRId64 ", %" PRId64 ", %.17g)",
                            R(y), acc(op, 0), R(x), x->dim[1], op->heads, op->head_dim, op->theta);
        break;
    case OP_ATTENTION:
        call = arena_printf("attention_fwd(%s, %s, %s, %s, %s, B, %" PRId64 ", %" PRId64 ", %"
                            PRId64 ", %" PRId64 ", %s)", R(y), R(op->out[1]), R(op->in[0]),
                            R(op->in[1]), R(op->in[2]), x->dim[1], op->heads, op->kv_heads,
                            op->head_dim, op->causal ? "true" : "false");
        break;
    case OP_ATTENTION_BWD: /* in: do, q, k, v, out, lse; out: dq, dk, dv */
        call = arena_printf("attention_bwd(%s, %s, %s, %s, %s, %s, " "%s, %s, %s, %s, %s, %s, B, %"
                            PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %s)", R(op->out[0]),
                            acc(op, 0), R(op->out[1]), acc(op, 1), R(op->out[2]), acc(op, 2), R(x),
                            R(op->in[1]), R(op->in[2]), R(op->in[3]), R(op->in[4]), R(op->in[5]),
                            op->in[1]->dim[1], op->heads, op->kv_heads, op->head_dim,
                            op->causal ? "true" : "false");
        break;
    case OP_GELU:
    case OP_RELU:
    case OP_SILU:
        call = arena_printf("%s_fwd(%s, %s, %s)", op_name(op->kind), R(y), R(x), numel_expr(x));
        break;
    case OP_GELU_BWD:
    case OP_RELU_BWD:
    case OP_SILU_BWD: /* in: dy, x */
        call = arena_printf("%s(%s, %s, %s, %s, %s)", op_name(op->kind), R(y), acc(op, 0), R(x),
                            R(op->in[1]), numel_expr(x));
        break;
    case OP_SWIGLU:
        call = arena_printf("swiglu_fwd(%s, %s, %s, %s)", R(y), R(x), R(op->in[1]), numel_expr(y));
        break;
    case OP_SWIGLU_BWD: /* in: dy, g, u; out: dg, du */
        call = arena_printf("swiglu_bwd(%s, %s, %s, %s, %s, %s, %s, %s)", R(op->out[0]), acc(op, 0),
                            R(op->out[1]), acc(op, 1), R(x), R(op->in[1]), R(op->in[2]),
                            numel_expr(x));
        break;
    case OP_ADD:
    case OP_MUL:
        call = arena_printf("%s_fwd(%s, %s, %s, %s, %s)", op_name(op->kind), R(y), R(x),
                            R(op->in[1]), numel_expr(x), numel_expr(op->in[1]));
        break;
    case OP_MUL_BWD: /* in: dy, a, b; out: da, db */
        call = arena_printf("mul_bwd(%s, %s, %s, %s, %s, %s, %s, %s, %s)", R(op->out[0]),
                            acc(op, 0), R(op->out[1]), acc(op, 1), R(x), R(op->in[1]), R(op->in[2]),
                            numel_expr(op->in[1]), numel_expr(op->in[2]));
        break;
    case OP_REDUCE_TO:
        call = arena_printf("reduce_to(%s, %s, %s, %s, %s)", R(y), acc(op, 0), R(x), numel_expr(x),
                            numel_expr(y));
        break;
    case OP_COPY:
        call = arena_printf("copy(%s, %s, %s, %s)", R(y), acc(op, 0), R(x), numel_expr(x));
        break;
    case OP_CROSS_ENTROPY:
        if (e->eval && y == e->g->loss && x->dim[0] != DIM_BATCH) {
            /* a loss over no batch dimension is every sequence's */
            call = arena_printf("cross_entropy_fwd(%s, %s, %s, %s, %s, %" PRId64 "); for (int64_t "
                                "k = 0; k < B; k++) fsdrt_eval_loss_tensor(r, k, %s)", R(y),
                                R(op->out[1]), R(x), R(op->in[1]), rows_expr(x), last_dim(x), R(y));
            break;
        }
        if (e->eval && y == e->g->loss) {
            /* evaluation takes the loss of each sequence: the same kernel
             * on each sequence's rows (docs/runtime.md#evaluation); the
             * logits are [B, ..., V], the batch first (sema) */
            int64_t rows = 1, V = last_dim(x);
            for (int i = 1; i + 1 < x->rank; i++)
                rows *= x->dim[i];
            call = arena_printf("for (int64_t k = 0; k < B; k++) { cross_entropy_fwd(%s, %s + k * %"
                                PRId64 ", %s + k * %" PRId64 ", %s + k * %" PRId64 ", %" PRId64
                                ", %" PRId64 "); fsdrt_eval_loss_tensor(r, k, %s); }",
                                R(y), R(op->out[1]), rows, R(x), rows * V, R(op->in[1]), rows,
                                rows, V, R(y));
            break;
        }
        call = arena_printf("cross_entropy_fwd(%s, %s, %s, %s, %s, %" PRId64 ")", R(y),
                            R(op->out[1]), R(x), R(op->in[1]), rows_expr(x), last_dim(x));
        /* the model's loss is what the step logs; another cross_entropy
         * (a value the forward computes and never returns) only runs */
        if (y == e->g->loss && !e->eval)
            call = arena_printf("%s; fsdrt_add_loss_tensor(r, %s)", call, R(y));
        break;
    case OP_CROSS_ENTROPY_BWD: /* in: logits, targets, lse; out: dlogits */
        call = arena_printf("cross_entropy_bwd(%s, %s, %s, %s, %s, %s, %" PRId64
                            ", fsdrt_loss_scale(r))", R(y), acc(op, 0), R(x), R(op->in[1]),
                            R(op->in[2]), rows_expr(x), last_dim(x));
        break;
    case OP_COUNT:
        fsd_unreachable();
    }
#undef R
    /* one line: OP (defined above micro_*) wraps the call in its trace span */
    P("    OP(%s, %s);  /* %s:%d */\n",
      cstr(arena_printf("%s %s%s", op_name(op->kind), where, op->recompute ? " (recompute)" : "")),
      call, m->prog->src->name, line);
}

/* ── schedules ── */

static void emit_event(Emit *e, const Event *ev)
{
    static const char *const call[EV_COUNT] = {
        [EV_ALL_GATHER] = "fsdrt_all_gather",   [EV_WAIT_GATHER] = "fsdrt_wait_gather",
        [EV_RESHARD] = "fsdrt_reshard",         [EV_ALLOC_GRADS] = "fsdrt_alloc_grads",
        [EV_REDUCE_SCATTER] = "fsdrt_reduce_scatter", [EV_WAIT_REDUCE] = "fsdrt_wait_reduce",
        [EV_FREE_GRADS] = "fsdrt_free_grads",   [EV_ALL_REDUCE] = "fsdrt_all_reduce",
        [EV_KEEP_PARTIAL] = "fsdrt_keep_partial", [EV_GATHER_PARTIAL] = "fsdrt_gather_partial",
    };
    switch (ev->kind) {
    case EV_KEEP_PARTIAL:
    case EV_GATHER_PARTIAL:
    case EV_ALL_GATHER:
    case EV_WAIT_GATHER:
    case EV_RESHARD:
    case EV_ALLOC_GRADS:
    case EV_REDUCE_SCATTER:
    case EV_WAIT_REDUCE:
    case EV_ALL_REDUCE:
    case EV_FREE_GRADS: P("    %s(r, %s);\n", call[ev->kind], e->gvar[ev->group]); break;
    case EV_COMPUTE:
        /* a unit's recompute ops open with what they are for */
        if (ev->op->recompute && ev->op->unit && ev->op->unit != e->recomputing)
            P("    /* recompute %s (recompute = %s): its forward ops again, for the backward "
              "that reads what they write */\n",
              ev->op->unit->layer->path, recompute_mode_name(ev->op->unit->mode));
        e->recomputing = ev->op->recompute ? ev->op->unit : NULL;
        emit_op(e, ev->op);
        break;
    case EV_GRAD_NORM:
    case EV_OPTIMIZER: break;   /* fsdrt_end_step runs them, group by group */
    case EV_COUNT: fsd_unreachable();
    }
}

static bool same_micro(const Schedule *a, int ma, const Schedule *b, int mb)
{
    int i = 0, j = 0;
    for (;;) {
        while (i < a->nev && a->ev[i].micro != ma)
            i++;
        while (j < b->nev && b->ev[j].micro != mb)
            j++;
        if (i == a->nev || j == b->nev)
            return i == a->nev && j == b->nev;
        const Event *x = &a->ev[i++], *y = &b->ev[j++];
        if (x->kind != y->kind || x->group != y->group || x->op != y->op)
            return false;
    }
}

static void emit_micro(Emit *e, const Schedule *s, int micro, const char *name, const char *why)
{
    e->recomputing = NULL;
    P("/* micro-batch: %s */\n", why);
    P("static void %s(FsdRun *r)\n{\n", name);
    P("    const int64_t B = fsdrt_batch(r);\n");
    /* every arena tensor this function touches, with its shape */
    bool *used = arena_alloc(sizeof(bool) * (size_t)e->g->ntensors);
    for (int i = 0; i < s->nev; i++) {
        const Event *ev = &s->ev[i];
        if (ev->micro != micro || !ev->op)
            continue;
        for (int k = 0; k < ev->op->nin; k++)
            used[ev->op->in[k]->id] = true;
        for (int k = 0; k < ev->op->nout; k++)
            used[ev->op->out[k]->id] = true;
    }
    const char **decl = arena_alloc(sizeof(char *) * (size_t)e->g->ntensors);
    int width = 0;
    for (int t = 0; t < e->g->ntensors; t++)
        if (used[t] && e->act[t] >= 0) {
            const Tensor *tt = e->g->tensors[t];
            decl[t] = arena_printf("%s *%s = fsdrt_%s(r, %d);", tt->stat ? "real" : "act",
                                   e->var[t], tt->stat ? "stat" : "act", e->act[t]);
            int n = (int)strlen(decl[t]);
            width = n > width ? n : width;
        }
    for (int t = 0; t < e->g->ntensors; t++)
        if (decl[t])
            P("    %-*s  /* %s */\n", width, decl[t], tensor_type(e->g->tensors[t]));
    P("    (void)B;\n\n");
    for (int i = 0; i < s->nev; i++)
        if (s->ev[i].micro == micro)
            emit_event(e, &s->ev[i]);
    P("}\n\n");
}

/* Evaluation's micro-batch: the forward-only schedule (schedule_build_eval),
 * with the loss taken per sequence (emit_op); the runtime loads the
 * validation sequences and reads the losses (docs/runtime.md#evaluation). */
static void emit_eval(Emit *e, const Schedule *s)
{
    e->eval = true;
    emit_micro(e, s, 0, "eval_forward",
               "evaluation's: the forward alone, each sequence's loss kept");
    e->eval = false;
}

/* ── tables ── */

static void emit_tables(Emit *e)
{
    Model *m = e->m;
    Graph *g = e->g;
    P("/* shard groups by index into groups[]: fsdrt_all_gather(r, G_...), ... */\n");
    P("enum {\n");
    for (int i = 0; i < m->ngroups; i++)
        P("    %s,\n", e->gvar[i]);
    P("};\n\n");
    if (m->nparams) {
        P("/* parameters by index into params[]: fsdrt_param(r, P_...), fsdrt_grad */\n");
        P("enum {\n");
        for (int i = 0; i < m->nparams; i++)
            P("    %s,\n", e->pvar[i]);
        P("};\n\n");
    }
    P("static const FsdParamInfo params[%d] = {\n", m->nparams);
    for (int i = 0; i < m->nparams; i++) {
        Param *p = m->params[i];
        P("    {\"%s\", %s, %" PRId64 ", %d, {%" PRId64 ", %" PRId64 "}, %" PRId64 ", %s, %.17g, "
          "%s},\n",
          p->name, e->gvar[p->group], p->offset, p->rank, p->shape[0], p->rank > 1 ? p->shape[1] : 1,
          p->numel,
          p->init == INIT_NORMAL ? "FSD_INIT_NORMAL" : p->init == INIT_ZEROS ? "FSD_INIT_ZEROS"
                                                                            : "FSD_INIT_ONES",
          p->std, p->rank >= 2 ? "true" : "false");
    }
    P("};\n\n");
    /* each group's all-gather and reduce-scatter dtypes: the shard section's
     * unless its fully_shard line sets them (docs/design.md#per-target-mixed-precision) */
    static const char *const gdts[] = {"FSD_FP32", "FSD_BF16", "FSD_FP16"};
    P("static const FsdGroupInfo groups[%d] = {\n", m->ngroups);
    P("    /* name, flat_numel, param_dtype, reduce_dtype, reshard_ranks "
      "(docs/design.md#partial-resharding: 0, none) */\n");
    for (int i = 0; i < m->ngroups; i++) {
        const ShardGroup *sg = m->groups[i];
        P("    {\"%s\", %" PRId64 ", %s, %s, %" PRId64, sg->name, sg->flat_numel,
          gdts[sg->param_dtype], gdts[sg->reduce_dtype],
          sg->reshard_ranks >= 2 ? sg->reshard_ranks : 0);
        P("},\n");
    }
    P("};\n\n");

    /* arena tensors: live range over this micro-batch's op order */
    int *first = arena_alloc(sizeof(int) * (size_t)g->ntensors);
    int *last = arena_alloc(sizeof(int) * (size_t)g->ntensors);
    for (int t = 0; t < g->ntensors; t++)
        first[t] = last[t] = -1;
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        for (int k = 0; k < op->nin + op->nout; k++) {
            Tensor *t = k < op->nin ? op->in[k] : op->out[k - op->nin];
            if (first[t->id] < 0)
                first[t->id] = i;
            last[t->id] = i;
        }
    }
    P("/* arena tensors: numel = per_sample * B + fixed, live over ops [first, last] */\n");
    P("static const FsdActInfo acts[%d] = {\n", e->nacts ? e->nacts : 1);
    for (int t = 0; t < g->ntensors; t++) {
        if (e->act[t] < 0)
            continue;
        Tensor *tt = g->tensors[t];
        int64_t n = 1;
        bool batch = false;
        for (int k = 0; k < tt->rank; k++) {
            if (tt->dim[k] == DIM_BATCH)
                batch = true;
            else
                n *= tt->dim[k];
        }
        P("    {\"%s\", %" PRId64 ", %" PRId64 ", %d, %d, %s},\n", tt->name, batch ? n : 0,
          batch ? 0 : n, first[t], last[t], tt->stat ? "true" : "false");
    }
    if (!e->nacts)
        P("    {\"none\", 0, 0, 0, 0, false},\n");
    P("};\n\n");
}

/* The layers whose settings the parameter tables do not show (FsdLayerInfo:
 * docs/checkpoint.md#the-config), depth first in declaration order: norms,
 * attentions and MLPs; their own children (q, k, ..., q_norm) are theirs. */
static void emit_layer_info(Emit *e, const Layer *L)
{
    static const char *const mlp_acts[] = {[ACT_GELU] = "FSD_MLP_GELU",
                                           [ACT_RELU] = "FSD_MLP_RELU",
                                           [ACT_SWIGLU] = "FSD_MLP_SWIGLU"};
    switch (L->kind) {
    case LK_BLOCK:
    case LK_ARRAY:
        for (int i = 0; i < L->nchildren; i++)
            emit_layer_info(e, L->children[i]);
        return;
    case LK_LAYERNORM:
    case LK_RMSNORM:
        P("    {\"%s\", %s, 0, 0, false, 0, %.17g, FSD_MLP_GELU},\n", L->path,
          L->kind == LK_LAYERNORM ? "FSD_LAYER_LAYERNORM" : "FSD_LAYER_RMSNORM", L->eps);
        break;
    case LK_ATTENTION:
        P("    {\"%s\", FSD_LAYER_ATTENTION, %" PRId64 ", %" PRId64 ", %s, %.17g, %.17g, "
          "FSD_MLP_GELU},\n",
          L->path, L->heads, L->kv_heads, L->causal ? "true" : "false", L->rope_theta,
          L->qk_norm ? L->eps : 0.0);
        break;
    case LK_MLP:
        P("    {\"%s\", FSD_LAYER_MLP, 0, 0, false, 0, 0, %s},\n", L->path, mlp_acts[L->act]);
        break;
    default:
        return;   /* Linear, Embedding: their shapes say all */
    }
    e->nlayers++;
}

static void emit_layer_table(Emit *e)
{
    e->nlayers = 0;
    P("/* layers by what their shapes do not show, for --export's config.json "
      "(docs/checkpoint.md#the-config):\n"
      "   path, kind, heads, kv_heads, causal, rope_theta (0: none), eps (attention: "
      "qk_norm's, 0: none), MLP activation */\n");
    P("static const FsdLayerInfo layer_info[] = {\n");
    emit_layer_info(e, e->m->root);
    if (!e->nlayers)   /* an empty initializer is not C */
        P("    {\"none\", FSD_LAYER_LAYERNORM, 0, 0, false, 0, 0, FSD_MLP_GELU},\n");
    P("};\n\n");
}

/* The FsdModel initializer is positional, in FsdModel's field order, with
 * the field names in comments: designated initializers are C but not the
 * C++ nvcc compiles. */
static void emit_model(Emit *e, uint64_t hash)
{
    Model *m = e->m;
    TrainConfig *t = &m->train;
    ShardConfig *c = &m->shard;
    static const char *const dts[] = {"FSD_FP32", "FSD_BF16", "FSD_FP16"};
    P("static const FsdModel model = {\n");
    P("    \"%s\", %s,  /* name, source */\n", m->name, cstr(m->prog->src->name));
    P("    0x%016" PRIx64 "ull,  /* hash */\n", hash);
    P("    %" PRId64 ", %" PRId64 ",  /* vocab, seq */\n", m->vocab, m->seq);
    P("    %d, %d, %d, %d,  /* nparams, ngroups, nacts, nops */\n", m->nparams, m->ngroups,
      e->nacts, e->g->nops);
    P("    params, groups, acts,\n");
    P("    %s, FSD_ACT_DTYPE, %s,  /* param_dtype, act_dtype, reduce_dtype */\n",
      dts[c->param_dtype], dts[c->reduce_dtype]);
    P("    %s,  /* accumulate_unsharded */\n", c->accumulate_unsharded ? "true" : "false");
    /* the model's FLOPs: recompute ops left out, as MFU counts them */
    P("    %.17g,  /* flops_per_sample */\n", graph_model_flops(e->g, 1));
    P("    {   /* train */\n");
    P("        %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
      ",  /* micro_batch, grad_accum, steps, seed */\n",
      t->micro_batch, t->grad_accum, t->steps, t->seed);
    P("        %s, %.17g, %.17g, %.17g, %.17g,  /* optimizer, lr, beta1, beta2, eps */\n",
      t->optimizer == OPT_ADAMW ? "FSD_ADAMW" : "FSD_SGD", t->lr, t->beta1, t->beta2, t->eps);
    P("        %.17g, %.17g, %s,  /* weight_decay, momentum, nesterov */\n", t->weight_decay,
      t->momentum, t->nesterov ? "true" : "false");
    static const char *const schedules[] = {[SCHED_CONSTANT] = "FSD_LR_CONSTANT",
                                            [SCHED_COSINE] = "FSD_LR_COSINE",
                                            [SCHED_LINEAR] = "FSD_LR_LINEAR",
                                            [SCHED_WSD] = "FSD_LR_WSD"};
    P("        %s, %" PRId64 ", %.17g, %.17g, %.17g,  /* schedule, warmup, min_lr, decay, "
      "grad_clip */\n",
      schedules[t->schedule], t->warmup, t->min_lr, t->decay, t->grad_clip);
    P("        %" PRId64 ", %s, %s, %" PRId64 ",  /* ckpt_every, ckpt_dir, ckpt_async, ckpt_keep */\n",
      t->ckpt_every, cstr(t->ckpt_dir), t->ckpt_async ? "true" : "false", t->ckpt_keep);
    P("        %s, %s,  /* data, val_data */\n", cstr(t->data), cstr(t->val_data));
    P("        %" PRId64 ", %" PRId64 ",  /* eval_every, eval_sequences */\n", t->eval_every,
      t->eval_sequences);
    P("    },\n");
    P("    %s,  /* offload_cpu */\n", c->offload_cpu ? "true" : "false");
    P("    %d, %d, buf_one, buf_three,  /* nbuf_one, nbuf_three, buf_one, buf_three */\n",
      e->nbuf[0], e->nbuf[1]);
    P("    eval_forward,  /* eval */\n");
    P("    %" PRId64 ", %" PRId64 ", %" PRId64
      ",  /* plan_world, plan_peak_bytes, memory_budget_bytes */\n",
      e->plan->mem->world, e->plan->mem->peak, c->memory_budget_bytes);
    /* the mesh (docs/design.md#hsdp); replicate = auto's R is the
     * plan_world's (docs/design.md#replicate-auto): R = 1 runs at any world,
     * so only a chosen R > 1 is marked */
    P("    %" PRId64 ", %s,  /* replicate (replicas of world / replicate ranks), "
      "replicate_auto (chosen by the planner for plan_world) */\n",
      c->replicate > 1 ? c->replicate : 1,
      c->replicate > 1 && c->replicate_auto ? "1" : "0");
    P("    %d, layer_info,  /* nlayers, layers */\n", e->nlayers);
    P("};\n\n");
}

/* A step's unsharded-buffer events, in schedule order: the CUDA runtime
 * replays them at start-up to size its pools, and every runtime to predict
 * its memory peak (FsdModel's buf_one). */
/* A partial copy (keep_partial) is freed at the wait of the gather_partial
 * that reads it: that wait is a buffer event, other waits are not; so
 * `partial` tracks which groups' gathers in flight are partial. */
static int buffer_op(const Event *ev, bool *partial)
{
    const EventKind k = ev->kind;
    if (k == EV_WAIT_GATHER)
        return partial[ev->group] ? 8 : -1;
    return k == EV_ALL_GATHER       ? 0
           : k == EV_RESHARD        ? 1
           : k == EV_ALLOC_GRADS    ? 2
           : k == EV_FREE_GRADS     ? 3
           : k == EV_REDUCE_SCATTER ? 4
           : k == EV_WAIT_REDUCE    ? 5
           : k == EV_KEEP_PARTIAL   ? 6
           : k == EV_GATHER_PARTIAL ? 7
                                    : -1;
}

static void emit_buffers(Emit *e, const Schedule *s, const char *name, int which)
{
    static const char *const ops[] = {"FSD_BUF_GATHER", "FSD_BUF_RESHARD", "FSD_BUF_ALLOC_GRADS",
                                      "FSD_BUF_FREE_GRADS", "FSD_BUF_REDUCE", "FSD_BUF_WAIT_REDUCE",
                                      "FSD_BUF_KEEP_PARTIAL", "FSD_BUF_GATHER_PARTIAL",
                                      "FSD_BUF_WAIT_PARTIAL"};
    bool *partial = arena_alloc((size_t)e->m->ngroups + 1);
    int n = 0;
    for (int i = 0; i < s->nev; i++) {
        const Event *ev = &s->ev[i];
        n += buffer_op(ev, partial) >= 0;
        if (event_is_gather(ev->kind))
            partial[ev->group] = ev->kind == EV_GATHER_PARTIAL;
        else if (ev->kind == EV_WAIT_GATHER)
            partial[ev->group] = false;
    }
    e->nbuf[which] = n;
    P("static const FsdBufEvent %s[%d] = {", name, n ? n : 1);
    int col = 0;
    memset(partial, 0, (size_t)e->m->ngroups + 1);
    for (int i = 0; i < s->nev; i++) {
        const Event *ev = &s->ev[i];
        int op = buffer_op(ev, partial);
        if (event_is_gather(ev->kind))
            partial[ev->group] = ev->kind == EV_GATHER_PARTIAL;
        else if (ev->kind == EV_WAIT_GATHER)
            partial[ev->group] = false;
        if (op < 0)
            continue;
        P("%s{%s, %d, %d},", col++ % 4 ? " " : "\n    ", ops[op], ev->group, ev->micro);
    }
    if (!n)
        P("\n    {FSD_BUF_GATHER, -1, 0},");
    P("\n};\n\n");
}

/* ── templates ── */

/* Which template file holds the kernels of an op. */
static const char *template_of(OpKind k)
{
    switch (k) {
    case OP_EMBED:
    case OP_EMBED_BWD: return "embed.h";
    case OP_LAYERNORM:
    case OP_LAYERNORM_NOBIAS:
    case OP_LAYERNORM_BWD:
    case OP_LAYERNORM_NOBIAS_BWD:
    case OP_RMSNORM:
    case OP_RMSNORM_BWD:
    case OP_ADD_LAYERNORM:
    case OP_ADD_LAYERNORM_NOBIAS:
    case OP_ADD_RMSNORM: return "norm.h";
    case OP_ROPE:
    case OP_ROPE_BWD: return "rope.h";
    case OP_ATTENTION:
    case OP_ATTENTION_BWD: return "attention.h";
    case OP_GELU:
    case OP_GELU_BWD:
    case OP_RELU:
    case OP_RELU_BWD:
    case OP_SILU:
    case OP_SILU_BWD:
    case OP_SWIGLU:
    case OP_SWIGLU_BWD:
    case OP_MATMUL_BIAS_GELU: return "act.h";   /* gelu_fwd where the backend's product does not */
    case OP_CROSS_ENTROPY:
    case OP_CROSS_ENTROPY_BWD: return "cross_entropy.h";
    case OP_MATMUL:
    case OP_MATMUL_BIAS:
    case OP_MATMUL_DX:
    case OP_MATMUL_DW: return NULL;   /* fsdrt_gemm, fsdrt_gemm_bias */
    default: return "elementwise.h";
    }
}

const char *emit_template_of(OpKind k) { return template_of(k); }

/* attention.h launches kernels of files pasted before it: the tensor-core
 * primitives (mma.h, nothing unless the program stores bf16 and builds for
 * the GPU), the GPU's tiled and tensor-core kernels, the CPU's BLAS path.
 * Each is guarded, so attention.h included alone includes them itself. */
static const char *const attention_parts[] = {"mma.h", "attention_gpu.h", "attention_mma.h",
                                              "attention_cpu.h", NULL};
static const char *const no_parts[] = {NULL};

const char *const *emit_template_parts(const char *family)
{
    return strcmp(family, "attention.h") == 0 ? attention_parts : no_parts;
}

static void paste_template(Emit *e, const char *file)
{
    const char *text = template_text(file);
    if (!text)
        fsd_panic(__FILE__, __LINE__, arena_printf("template %s is not built in", file));
    /* a compiler error in the template names its own file and line; the
     * code after it is train.cu's again */
    P("/* ──── templates/%s ──── */\n#line 1 \"templates/%s\"\n%s", file, file, text);
    if (text[0] && text[strlen(text) - 1] != '\n')
        P("\n");
    P("#line %d \"train.cu\"\n\n", e->lines + 2);
}

static void emit_templates(Emit *e)
{
    const char *files[16] = {"portable.h"};
    int n = 1;
    for (int i = 0; i < e->g->nops; i++) {
        const char *f = template_of(e->g->ops[i]->kind);
        bool have = !f;
        for (int k = 0; k < n && !have; k++)
            have = strcmp(files[k], f) == 0;
        if (!have)
            files[n++] = f;
    }
    for (int k = 0; k < n; k++) {
        for (const char *const *part = emit_template_parts(files[k]); *part; part++)
            paste_template(e, *part);
        paste_template(e, files[k]);
    }
}

/* FNV-1a over the typed model's identity: names, shapes, groups, dtypes;
 * checkpoints carry it so a changed model is refused. */
static uint64_t model_hash(Model *m)
{
    uint64_t h = 0xcbf29ce484222325ull;
#define MIX(bytes, n)                                   \
    for (size_t i_ = 0; i_ < (n); i_++) {               \
        h ^= ((const unsigned char *)(bytes))[i_];      \
        h *= 0x100000001b3ull;                          \
    }
    for (int i = 0; i < m->nparams; i++) {
        Param *p = m->params[i];
        MIX(p->name, strlen(p->name) + 1);
        MIX(p->shape, sizeof p->shape);
        MIX(&p->group, sizeof p->group);
        MIX(&p->offset, sizeof p->offset);
    }
    MIX(&m->shard.param_dtype, sizeof m->shard.param_dtype);
    /* a group's own all-gather dtype, as the shard section's is, only where
     * it differs from that one: a model without per-target mixed precision
     * keeps the hash it had, and the same gathers written either way give
     * one hash. The reduce dtype is left out, per group as shard-wide: it
     * changes the communication, not what a checkpoint holds
     * (docs/design.md#per-target-mixed-precision). */
    for (int i = 0; i < m->ngroups; i++) {
        ShardGroup *sg = m->groups[i];
        if (sg->param_dtype == m->shard.param_dtype)
            continue;
        MIX(&i, sizeof i);
        MIX(&sg->param_dtype, sizeof sg->param_dtype);
    }
#undef MIX
    return h;
}

/* ── the file ── */

static void write_program(FILE *out, Schedule *one, Schedule *three, Schedule *eval)
{
    Plan *p = one->plan;
    Model *m = p->m;
    Graph *g = p->g;
    Emit E = {out, m, g, p, arena_alloc(sizeof(int) * (size_t)g->ntensors), 0}, *e = &E;
    for (int t = 0; t < g->ntensors; t++)
        e->act[t] = g->tensors[t]->kind == TK_ACT || g->tensors[t]->kind == TK_AGRAD ? e->nacts++
                                                                                     : -1;
    c_names(e);
    uint64_t hash = model_hash(m);

    P("/*\n * train.cu — generated by fsdpc %s from %s; do not edit.\n *\n", FSDPC_VERSION,
      m->prog->src->name);
    P(" * Model %s: %s parameters in %d shard groups; %d ops per micro-batch\n", m->name,
      fmt_count(m->numel), m->ngroups, g->nops);
    P(" * (%d forward, %d backward). The world size is a run-time value: group\n",
      g->nfwd, g->nops - g->nfwd);
    P(" * shards are sized at start-up from the tables below.\n *\n");
    P(" * CPU build:  mpicc -x c -O2 train.cu -x none $(pkg-config --cflags --libs fsdrt-cpu) \\\n");
    P(" *               -o train       (after make install; in the repository: make trainer FSD=...)\n");
    P(" * CUDA build: make trainer FSD=... BACKEND=cuda   (docs/cuda.md)\n");
    P(" * Run:        mpirun -np 2 ./train --data train.bin\n */\n");
    if (compute_dtype(m) == DTYPE_BF16)
        P("/* param = bf16: activations, gradients and unsharded parameters are bf16\n"
          " * in memory, arithmetic in float (runtime/fsdrt.h, `act`) */\n"
          "#define FSD_ACT_BF16 1\n");
    /* The GPU's tiled attention sizes its shared-memory tiles and registers
     * for the widest head it takes (templates/attention.h): half of them
     * for heads of 64 or less. Measured on an H200 (GPT-2 124M, bf16):
     * attention forward 67 -> 53 ms and backward 310 -> 262 ms a step. */
    const int64_t hd = widest_head(g);
    if (hd > 0 && hd <= 64)
        P("#define FSD_ATTN_HD_MAX 64   /* every head is %" PRId64 " wide or less */\n", hd);
    P("#include \"fsdrt.h\"\n\n");
    emit_templates(e);
    P("/* ──── the model ──── */\n\n");
    emit_tables(e);
    emit_layer_table(e);
    P("/* unsharded-buffer events of a step: the CUDA runtime sizes its pools by them,\n"
      " * and every runtime predicts its memory peak at its world */\n");
    emit_buffers(e, one, "buf_one", 0);
    emit_buffers(e, three, "buf_three", 1);
    P("/* evaluation's forward (below), which the model table names */\n");
    P("static void eval_forward(FsdRun *r);\n\n");
    emit_model(e, hash);

    /* micro-batch variants from the verified schedules */
    bool uniform = same_micro(three, 0, three, 1) && same_micro(three, 1, three, 2) &&
                   same_micro(three, 0, one, 0);
    P("/* ──── the schedule ──── */\n\n");
    P("/* One op of a micro-batch: its kernel call(s) inside the op's trace span\n"
      " * (fsdrt_trace_begin/end; --trace-out writes them). */\n"
      "#define OP(label, ...) \\\n"
      "    do { fsdrt_trace_begin(r, label); __VA_ARGS__; fsdrt_trace_end(r); } while (0)\n\n");
    if (uniform) {
        emit_micro(e, one, 0, "micro_any", "every micro-batch of a step runs the same events");
    } else {
        emit_micro(e, one, 0, "micro_only", "a step of one micro-batch");
        /* reshard_after_backward = false: the first gathers what the
         * others find gathered, the last reshards it */
        bool keep = !m->shard.reshard_after_backward;
        emit_micro(e, three, 0, "micro_first",
                   keep ? "the first of several: gathers parameters and keeps them gathered"
                        : "the first of several: allocates gradient buffers");
        emit_micro(e, three, 1, "micro_middle",
                   keep ? "neither first nor last: finds parameters gathered, keeps them"
                        : "neither first nor last: accumulates gradients");
        emit_micro(e, three, 2, "micro_last",
                   keep ? "the last of several: reshards every group after its last backward"
                        : "the last of several: reduce-scatters gradients");
    }

    emit_eval(e, eval);

    P("/* one step: every micro-batch of it, in order */\n");
    P("static void step(FsdRun *r)\n{\n");
    P("    const int k = fsdrt_micro_batches(r);\n");
    P("    for (int micro = 0; micro < k; micro++) {\n");
    P("        fsdrt_load_micro_batch(r, micro);\n");
    if (uniform) {
        P("        micro_any(r);\n");
    } else {
        P("        if (k == 1)\n            micro_only(r);\n");
        P("        else if (micro == 0)\n            micro_first(r);\n");
        P("        else if (micro == k - 1)\n            micro_last(r);\n");
        P("        else\n            micro_middle(r);\n");
    }
    P("    }\n}\n\n");
    P("/* fsdrt_train runs the steps; after each, fsdrt_end_step takes the gradient\n"
      " * norm, clips, runs the optimizer on every group's shard, evaluates when\n"
      " * --eval-every says so (eval_forward) and logs. */\n");
    P("int main(int argc, char **argv)\n{\n");
    P("    return fsdrt_train(fsdrt_init(argc, argv, &model), step);\n}\n");
}

int emit_program(FILE *out, Plan *p, FILE *err)
{
    Schedule *one = schedule_build(p, 1), *three = schedule_build(p, 3);
    Schedule *eval = schedule_build_eval(p);
    int bad = schedule_verify(one, err) + schedule_verify(three, err) + schedule_verify(eval, err);
    if (!bad)
        write_program(out, one, three, eval);
    return bad;
}
