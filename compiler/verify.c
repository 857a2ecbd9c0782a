/*
 * verify.c — fsdpc --verify: the program's kernels through NVRTC, for each
 * target architecture, without a GPU and without nvcc.
 *
 * Each template file the graph uses (emit_template_of) is compiled as one
 * NVRTC program: portable.h, then the family (attention.h after mma.h and
 * its backends, emit_template_parts, as emit.c pastes them), each under a
 * #line directive so that NVRTC's messages name the template file and
 * line. What emitted code takes from the C library and the runtime header is supplied as tiny
 * in-memory headers (the prelude below); -default-device makes the host-side
 * launchers device functions that are compiled and never called, and
 * portable.h's __CUDACC_RTC__ block keeps them from launching. NVRTC runs
 * ptxas in-process for a real architecture (sm_XX), and ptxas's verbose
 * report (--ptxas-options=-v, in the program log) gives each kernel's
 * registers, static shared memory, stack frame and spills: the toolkit's
 * own figures, with no device and no driver needed.
 *
 * A failure is reported against its template file and line, followed by
 * the .fsd lines of the ops whose launchers are in that file. Kernels are
 * tied to ops through the templates' text: a LAUNCHER named after an op
 * (X_fwd for a forward op X, the op's name for a backward one) starts the
 * kernels named in its FSD_RUN_* calls, and those of the launchers and
 * RUNNERs (a column reduction's NAME_sums) it calls; fsd_col_finish starts
 * the column sums' second pass, fsd_col_parts_kernel.
 *
 * NVRTC is loaded with dlopen at run time, so fsdpc builds and runs without
 * the CUDA toolkit unless --verify is asked for; FSDPC_NVRTC names the
 * library when it is not on the loader's path.
 */
#include "fsdpc.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* ── NVRTC, loaded at run time ── */

/* nvrtc.h's types, declared here so that fsdpc builds without the toolkit:
 * nvrtcResult is an enum whose NVRTC_SUCCESS is 0. */
typedef int NvrtcResult;
typedef struct NvrtcProgramImpl *NvrtcProgram;

typedef struct Nvrtc {
    void *lib;
    const char *path;
    const char *(*error_string)(NvrtcResult);
    NvrtcResult (*version)(int *, int *);
    NvrtcResult (*num_archs)(int *);
    NvrtcResult (*archs)(int *);
    NvrtcResult (*create)(NvrtcProgram *, const char *, const char *, int, const char *const *,
                          const char *const *);
    NvrtcResult (*destroy)(NvrtcProgram *);
    NvrtcResult (*compile)(NvrtcProgram, int, const char *const *);
    NvrtcResult (*log_size)(NvrtcProgram, size_t *);
    NvrtcResult (*log)(NvrtcProgram, char *);
    NvrtcResult (*cubin_size)(NvrtcProgram, size_t *);
} Nvrtc;

/* Loads NVRTC; on failure returns false with why in *err. */
static bool nvrtc_load(Nvrtc *n, const char **err)
{
    const char *env = getenv("FSDPC_NVRTC");
    const char *names[] = {env && *env ? env : NULL, "libnvrtc.so", "libnvrtc.so.13",
                           "libnvrtc.so.12", "libnvrtc.so.11.2", "/usr/local/cuda/lib64/libnvrtc.so"};
    const char *why = "not found";
    for (size_t i = 0; i < sizeof names / sizeof *names && !n->lib; i++) {
        if (!names[i])
            continue;
        n->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (n->lib)
            n->path = names[i];
        else if (i == 0 || !strchr(why, '/'))
            why = arena_printf("%s", dlerror());
        if (i == 0 && !n->lib)
            break;   /* FSDPC_NVRTC named one: that one, or none */
    }
    if (!n->lib) {
        *err = arena_printf("--verify compiles the kernels with NVRTC, the CUDA toolkit's runtime "
                            "compiler, and %s could not be loaded (%s): install the toolkit, or "
                            "set FSDPC_NVRTC to the path of libnvrtc.so",
                            env && *env ? env : "libnvrtc.so", why);
        return false;
    }
    struct {
        void **fn;
        const char *name;
    } syms[] = {
        {(void **)&n->error_string, "nvrtcGetErrorString"},
        {(void **)&n->version, "nvrtcVersion"},
        {(void **)&n->num_archs, "nvrtcGetNumSupportedArchs"},
        {(void **)&n->archs, "nvrtcGetSupportedArchs"},
        {(void **)&n->create, "nvrtcCreateProgram"},
        {(void **)&n->destroy, "nvrtcDestroyProgram"},
        {(void **)&n->compile, "nvrtcCompileProgram"},
        {(void **)&n->log_size, "nvrtcGetProgramLogSize"},
        {(void **)&n->log, "nvrtcGetProgramLog"},
        {(void **)&n->cubin_size, "nvrtcGetCUBINSize"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
        if (!(*syms[i].fn = dlsym(n->lib, syms[i].name))) {
            *err = arena_printf("%s has no %s: NVRTC 11.2 or later is needed", n->path, syms[i].name);
            return false;
        }
    return true;
}

/* ── what the templates take from outside ── */

/* In-memory headers for portable.h's includes: `real` is float, as in the
 * CUDA build, and `act` as runtime/fsdrt.h defines it (bf16 when the
 * program defines FSD_ACT_BF16, which verify passes for a bf16 model); the
 * C library's declarations only make the (never called) launchers
 * compile. */
static const char *const header_names[] = {"fsdrt.h", "math.h", "stdbool.h", "stdint.h",
                                           "stdio.h", "stdlib.h"};
static const char *const header_texts[] = {
    "#define FSDRT_H\ntypedef float real;\n"
    "#ifdef FSD_ACT_BF16\ntypedef struct fsd_bf16 { unsigned short bits; } fsd_bf16;\n"
    "typedef fsd_bf16 act;\n#define FSD_ACT_IS_BF16 1\n#else\ntypedef real act;\n#endif\n"
    "cudaError_t cudaGetLastError(void);\nconst char *cudaGetErrorString(cudaError_t);\n",
    "#define INFINITY __int_as_float(0x7f800000)\n#define NAN __int_as_float(0x7fffffff)\n",
    "",
    "typedef signed char int8_t;\ntypedef short int16_t;\ntypedef int int32_t;\n"
    "typedef long long int64_t;\ntypedef unsigned char uint8_t;\ntypedef unsigned short uint16_t;\n"
    "typedef unsigned uint32_t;\ntypedef unsigned long long uint64_t;\n"
    "typedef unsigned long uintptr_t;\n"
    "#define INT32_MAX 2147483647\n#define INT64_MAX 9223372036854775807LL\n",
    "typedef struct FILE FILE;\n#define stderr ((FILE *)0)\n#define stdout ((FILE *)0)\n"
    "int fprintf(FILE *, const char *, ...);\nint fflush(FILE *);\n"
    "int snprintf(char *, unsigned long, const char *, ...);\n",
    "void abort(void);\n",
};

/* ── kernels and the ops that use them ── */

typedef struct Kernel {
    const char *name;        /* embed_fwd_kernel */
    int regs, smem, stack, spill_st, spill_ld;   /* smem: static __shared__ bytes */
    bool seen;               /* ptxas reported it */
} Kernel;

/* The launchers of a template's text, and the helpers that start kernels
 * for them (RUNNER, portable.h), with the kernels each starts. */
typedef struct Launcher {
    const char *name;
    const char *body;        /* its braces and what they hold */
    int len;
} Launcher;

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* Adds to out[n..max) the functions of text declared `KEY NAME(...) {`
 * at the start of a line; returns the new count. */
static int find_marked(const char *text, const char *key, Launcher *out, int n, int max)
{
    for (const char *p = strstr(text, key); p && n < max; p = strstr(p + 1, key)) {
        /* the macro's definition in portable.h is not a launcher */
        if (p > text && p[-1] != '\n')
            continue;
        const char *s = p + strlen(key), *e = s;
        while (ident_char(*e))
            e++;
        /* the body: from its first brace to the matching one */
        const char *open = strchr(e, '{'), *close = open;
        for (int depth = 0; close && *close; close++) {
            depth += (*close == '{') - (*close == '}');
            if (depth == 0)
                break;
        }
        if (!open || !close || !*close)
            continue;
        out[n].name = arena_printf("%.*s", (int)(e - s), s);
        out[n].body = open;
        out[n].len = (int)(close - open + 1);
        n++;
    }
    return n;
}

static int find_launchers(const char *text, Launcher *out, int max)
{
    int n = find_marked(text, "LAUNCHER void ", out, 0, max);
    return find_marked(text, "RUNNER void ", out, n, max);
}

/* Kernels started by a call to portable.h besides FSD_RUN_*: the column
 * sums' second pass (fsd_col_finish, fsd_col_parts), compiled with
 * portable.h into every template file's program. */
static const struct {
    const char *macro, *kernel;
} hidden_kernels[] = {{"fsd_col_finish(", "fsd_col_parts_kernel"}};

/* Whether launcher l (or one it calls, transitively) starts kernel k. */
static bool starts(const Launcher *ls, int n, int l, const char *kernel, int depth)
{
    if (depth > 4)
        return false;
    const char *b = ls[l].body;
    const int len = ls[l].len;
    for (const char *p = b; p < b + len; p++) {
        for (size_t h = 0; h < sizeof hidden_kernels / sizeof *hidden_kernels; h++)
            if (strncmp(p, hidden_kernels[h].macro, strlen(hidden_kernels[h].macro)) == 0 &&
                strcmp(kernel, hidden_kernels[h].kernel) == 0)
                return true;
        if (strncmp(p, "FSD_RUN_", 8) == 0) {
            const char *q = strchr(p, '(');
            if (!q || q >= b + len)
                continue;
            q++;
            while (*q == ' ')
                q++;
            size_t kl = strlen(kernel) - strlen("_kernel");
            if (strncmp(q, kernel, kl) == 0 && !ident_char(q[kl]))
                return true;
        }
        for (int o = 0; o < n; o++) {
            size_t nl = strlen(ls[o].name);
            if (o != l && strncmp(p, ls[o].name, nl) == 0 && p[nl] == '(' &&
                (p == b || !ident_char(p[-1])) && starts(ls, n, o, kernel, depth + 1))
                return true;
        }
    }
    return false;
}

/* The op kind whose launcher this is: X_fwd for forward op X, else the
 * backward op's own name; OP_COUNT for none. */
static OpKind op_of_launcher(const char *name)
{
    for (int k = 0; k < OP_COUNT; k++) {
        const char *on = op_name((OpKind)k);
        size_t n = strlen(on);
        if (strcmp(name, on) == 0 || (strncmp(name, on, n) == 0 && strcmp(name + n, "_fwd") == 0))
            return (OpKind)k;
    }
    return OP_COUNT;
}

/* Marks in kinds the ops that launcher l stands for: its own op, the
 * bias-free LayerNorm's, which call LayerNorm's launchers with NULL for the
 * bias, and a fused op whose emitted code calls it where the runtime does
 * not do its part (matmul_bias_gelu runs gelu_fwd after a product without
 * the GELU epilogue: the CPU backend's, emit.c). */
static void mark_kinds(const char *launcher, bool *kinds)
{
    OpKind k = op_of_launcher(launcher);
    if (k == OP_COUNT)
        return;
    kinds[k] = true;
    if (k == OP_GELU)
        kinds[OP_MATMUL_BIAS_GELU] = true;
    if (k == OP_LAYERNORM)
        kinds[OP_LAYERNORM_NOBIAS] = true;
    if (k == OP_LAYERNORM_BWD)
        kinds[OP_LAYERNORM_NOBIAS_BWD] = true;
    if (k == OP_ADD_LAYERNORM)
        kinds[OP_ADD_LAYERNORM_NOBIAS] = true;
}

static const char *where(Model *m, const OpNode *op)
{
    int line, col;
    loc_line_col(m->prog->src, op->loc.begin, &line, &col);
    const char *layer = op->layer && op->layer->path[0] ? op->layer->path : m->name;
    return arena_printf("%s:%d (%s %s)", m->prog->src->name, line, op_name(op->kind), layer);
}

/* "used by ..." for the ops of kinds marked in `kinds`. */
static const char *users(Model *m, Graph *g, const bool *kinds)
{
    const char *first = NULL;
    int n = 0;
    for (int i = 0; i < g->nops; i++)
        if (kinds[g->ops[i]->kind]) {
            if (!first)
                first = where(m, g->ops[i]);
            n++;
        }
    if (!n)
        return "not used by this program";
    return n == 1 ? arena_printf("used by %s", first)
                  : arena_printf("used by %s and %d more op%s", first, n - 1, n == 2 ? "" : "s");
}

/* _Z16embed_fwd_kernelxPf... (or _ZL16..., static) → embed_fwd_kernel */
static const char *demangle(const char *sym)
{
    const char *p = sym;
    if (strncmp(p, "_Z", 2) != 0)
        return sym;
    p += 2;
    if (*p == 'L')
        p++;
    int len = 0;
    while (isdigit((unsigned char)*p))
        len = len * 10 + (*p++ - '0');
    if (len <= 0 || (int)strlen(p) < len)
        return sym;
    return arena_printf("%.*s", len, p);
}

/* Reads ptxas's -v report out of the log: for each entry function, its
 * stack frame and spills, then its registers. */
static int parse_ptxas(const char *log, Kernel *ks, int max)
{
    int n = 0;
    Kernel *cur = NULL;
    for (const char *line = log; line && *line;) {
        const char *end = strchr(line, '\n');
        int len = end ? (int)(end - line) : (int)strlen(line);
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", len < 1023 ? len : 1023, line);
        const char *f = strstr(buf, "Compiling entry function '");
        if (f && n < max) {
            f += strlen("Compiling entry function '");
            const char *q = strchr(f, '\'');
            cur = &ks[n++];
            *cur = (Kernel){demangle(arena_printf("%.*s", q ? (int)(q - f) : (int)strlen(f), f)),
                            -1, 0, 0, 0, 0, true};
        }
        const char *s = strstr(buf, "bytes stack frame");
        if (cur && s) {
            int st = 0, ss = 0, sl = 0;
            const char *d = s;
            while (d > buf && (isdigit((unsigned char)d[-1]) || d[-1] == ' '))
                d--;
            if (sscanf(d, "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &st,
                       &ss, &sl) == 3) {
                cur->stack = st;
                cur->spill_st = ss;
                cur->spill_ld = sl;
            }
        }
        const char *u = strstr(buf, "Used ");
        if (cur && u && strstr(buf, "registers")) {
            sscanf(u, "Used %d registers", &cur->regs);
            /* "Used 96 registers, used 1 barriers, 37248 bytes smem, ..." */
            const char *sm = strstr(u, " bytes smem");
            while (sm && sm > u && isdigit((unsigned char)sm[-1]))
                sm--;
            if (sm)
                sscanf(sm, "%d", &cur->smem);
        }
        line = end ? end + 1 : NULL;
    }
    return n;
}

/* ── the report ── */

static bool valid_arch(const char *a, int *num)
{
    if (strncmp(a, "sm_", 3) != 0 || !isdigit((unsigned char)a[3]))
        return false;
    char *end;
    long v = strtol(a + 3, &end, 10);
    if (*end && !(isalpha((unsigned char)end[0]) && !end[1]))
        return false;   /* sm_90a is fine, sm_9x is not */
    *num = (int)v;
    return v > 0 && v < 1000;
}

/* Rewrites NVRTC's "file(line): error: ..." as gcc's "file:line: error: ...". */
static void print_message(FILE *out, const char *line, int len)
{
    const char *paren = memchr(line, '(', (size_t)len);
    const char *close = paren ? memchr(paren, ')', (size_t)(len - (paren - line))) : NULL;
    if (paren && close && close[1] == ':' && paren > line) {
        bool digits = close > paren + 1;
        for (const char *d = paren + 1; d < close; d++)
            digits = digits && isdigit((unsigned char)*d);
        if (digits) {
            fprintf(out, "    %.*s:%.*s%.*s\n", (int)(paren - line), line, (int)(close - paren - 1),
                    paren + 1, (int)(len - (close + 1 - line)), close + 1);
            return;
        }
    }
    fprintf(out, "    %.*s\n", len, line);
}

/* What the report counts over every file and architecture. */
typedef struct Tally {
    int failures, kernels_used, spilling;
} Tally;

/* NVRTC's result for one template file on one architecture. */
typedef struct Compiled {
    NvrtcResult rc;
    const char *log;         /* the program log: messages, then ptxas's figures */
    size_t cubin;            /* bytes of code; 0: none */
} Compiled;

/* The architectures of arch_list ("sm_80,sm_90"), each checked against what
 * this NVRTC compiles for. Returns how many; -1, said on stderr, when one
 * is malformed or unknown, or none is given. */
static int parse_archs(Nvrtc *nv, int major, int minor, const char *arch_list,
                       const char **archs, int max)
{
    int nsup = 0;
    nv->num_archs(&nsup);
    int *sup = arena_alloc(sizeof(int) * (size_t)(nsup + 1));
    nv->archs(sup);
    int narch = 0;
    for (const char *p = arch_list; *p && narch < max;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *a = arena_printf("%.*s", (int)len, p);
        int num;
        if (!valid_arch(a, &num)) {
            fprintf(stderr, "fsdpc: --arch: '%s' is not an architecture (sm_80, sm_90, sm_90a, ...)\n", a);
            return -1;
        }
        bool known = false;
        for (int i = 0; i < nsup; i++)
            known = known || sup[i] == num;
        if (!known) {
            fprintf(stderr, "fsdpc: --arch: NVRTC %d.%d (%s) does not compile for %s; it knows sm_%d "
                         "to sm_%d\n",
                    major, minor, nv->path, a, nsup ? sup[0] : 0, nsup ? sup[nsup - 1] : 0);
            return -1;
        }
        archs[narch++] = a;
        p = e ? e + 1 : p + len;
    }
    if (!narch) {
        fprintf(stderr, "fsdpc: --arch: no architecture given\n");
        return -1;
    }
    return narch;
}

/* The template files g's ops use, in the order emit pastes them. */
static int template_files(Graph *g, const char **files, int max)
{
    int nfiles = 0;
    for (int i = 0; i < g->nops; i++) {
        const char *f = emit_template_of(g->ops[i]->kind);
        bool have = !f;
        for (int k = 0; k < nfiles && !have; k++)
            have = strcmp(files[k], f) == 0;
        if (!have && nfiles < max)
            files[nfiles++] = f;
    }
    return nfiles;
}

/* One NVRTC program: portable.h, then the family's parts and the file
 * (attention.h after mma.h and its backends, as the emitter pastes them:
 * emit_template_parts), each under a #line directive. */
static const char *program_source(const char *portable, const char *file, const char *text)
{
    const char *pre = "";
    for (const char *const *part = emit_template_parts(file); *part; part++) {
        const char *pt = template_text(*part);
        if (!pt)
            fsd_panic(__FILE__, __LINE__, arena_printf("template %s is not built in", *part));
        pre = arena_printf("%s#line 1 \"templates/%s\"\n%s\n", pre, *part, pt);
    }
    return arena_printf("#line 1 \"templates/portable.h\"\n%s\n%s"
                        "#line 1 \"templates/%s\"\n%s\n",
                        portable, pre, file, text);
}

/* Compiles one program for arch, with the defines the emitter writes for
 * this model. False when NVRTC could not create the program (c->rc says
 * why); otherwise c holds the result, the log and the code's size. */
static bool compile_program(Nvrtc *nv, Model *m, Graph *g, const char *arch, const char *file,
                            const char *src, Compiled *c)
{
    NvrtcProgram prog;
    c->rc = nv->create(&prog, src, arena_printf("templates/%s", file), 6, header_texts,
                       header_names);
    if (c->rc != 0)
        return false;
    const char *opts[] = {arena_printf("--gpu-architecture=%s", arch), "-default-device",
                          "--ptxas-options=-v", "-diag-suppress=177", "--std=c++17",
                          "-DFSD_ATTN_HD_MAX=64", "-DFSD_ACT_BF16"};
    /* the last two only as the emitter writes them (emit.c) */
    const int64_t hd = widest_head(g);
    int nopts = (int)(sizeof opts / sizeof *opts) - 2;
    if (hd > 0 && hd <= 64)
        opts[nopts++] = "-DFSD_ATTN_HD_MAX=64";
    if (compute_dtype(m) == DTYPE_BF16)
        opts[nopts++] = "-DFSD_ACT_BF16";
    c->rc = nv->compile(prog, nopts, opts);
    size_t ln = 0;
    nv->log_size(prog, &ln);
    char *log = arena_alloc(ln + 1);
    if (ln)
        nv->log(prog, log);
    c->log = log;
    c->cubin = 0;
    if (c->rc == 0)
        nv->cubin_size(prog, &c->cubin);
    nv->destroy(&prog);
    return true;
}

/* The log's error lines (errors), or its compiler warnings but not ptxas's
 * figures, each as a file:line message. */
static void print_log(FILE *out, const char *log, bool errors)
{
    for (const char *line = log; *line;) {
        const char *end = strchr(line, '\n');
        int len = end ? (int)(end - line) : (int)strlen(line);
        const char *one = arena_printf("%.*s", len, line);
        bool show = errors ? strstr(one, "error") && !strstr(one, "detected in the compilation")
                           : strstr(one, ": warning") && strncmp(one, "ptxas", 5) != 0;
        if (show)
            print_message(out, line, len);
        line = end ? end + 1 : line + len;
    }
}

/* A line for each kernel ptxas reported that an op of g uses: registers,
 * shared memory, stack and spills, and the .fsd lines of those ops.
 * Returns how many were used; *compiled is how many ptxas reported. */
static int report_kernels(FILE *out, Model *m, Graph *g, const char *log, const Launcher *ls,
                          int nl, Tally *t, int *compiled)
{
    Kernel ks[64];
    int nk = parse_ptxas(log, ks, 64);
    int used_here = 0;
    for (int k = 0; k < nk; k++) {
        bool *kinds = arena_alloc(sizeof(bool) * OP_COUNT);
        for (int l = 0; l < nl; l++)
            if (starts(ls, nl, l, ks[k].name, 0))
                mark_kinds(ls[l].name, kinds);
        bool used = false;
        for (int i = 0; i < g->nops && !used; i++)
            used = kinds[g->ops[i]->kind];
        if (!used)
            continue;
        used_here++;
        t->kernels_used++;
        bool spills = ks[k].spill_st || ks[k].spill_ld;
        t->spilling += spills;
        fprintf(out, "  %-30s %3d registers, %5d B smem, %4d B stack, %s   %s\n",
                ks[k].name, ks[k].regs, ks[k].smem, ks[k].stack,
                spills ? arena_printf("spills %d B stored, %d B loaded", ks[k].spill_st,
                                      ks[k].spill_ld)
                       : "no spills",
                users(m, g, kinds));
    }
    *compiled = nk;
    return used_here;
}

/* One template file on one architecture: compiled, then its failure (the
 * errors and the ops whose kernels it holds) or its kernels reported. */
static void verify_file(FILE *out, Nvrtc *nv, Model *m, Graph *g, const char *arch,
                        const char *portable, const char *file, Tally *t)
{
    const char *text = template_text(file);
    if (!text)
        fsd_panic(__FILE__, __LINE__, arena_printf("template %s is not built in", file));
    Compiled c;
    if (!compile_program(nv, m, g, arch, file, program_source(portable, file, text), &c)) {
        fprintf(out, "  templates/%-16s NVRTC could not start: %s\n", file,
                nv->error_string(c.rc));
        t->failures++;
        return;
    }
    /* this file's launchers, and the op kinds they stand for */
    Launcher ls[64];
    int nl = find_launchers(text, ls, 64);
    if (c.rc != 0 || c.cubin == 0) {
        bool *file_kinds = arena_alloc(sizeof(bool) * OP_COUNT);
        for (int l = 0; l < nl; l++)
            mark_kinds(ls[l].name, file_kinds);
        t->failures++;
        fprintf(out, "  templates/%-16s FAILED (%s)\n", file,
                c.rc ? nv->error_string(c.rc) : "no code");
        print_log(out, c.log, true);
        fprintf(out, "      kernels of templates/%s are %s\n", file, users(m, g, file_kinds));
        return;
    }
    print_log(out, c.log, false);   /* warnings are shown, not failed */
    int nk;
    int used_here = report_kernels(out, m, g, c.log, ls, nl, t, &nk);
    fprintf(out, "  templates/%-16s ok: %d kernel%s used of %d compiled (%zu-byte cubin)\n",
            file, used_here, used_here == 1 ? "" : "s", nk, c.cubin);
}

int verify_kernels(FILE *out, Model *m, Graph *g, const char *arch_list)
{
    Nvrtc nv = {0};
    const char *err;
    if (!nvrtc_load(&nv, &err)) {
        fprintf(stderr, "fsdpc: %s\n", err);
        return -1;
    }
    int major = 0, minor = 0;
    nv.version(&major, &minor);
    const char *archs[64];
    int narch = parse_archs(&nv, major, minor, arch_list, archs, 64);
    if (narch < 0)
        return -1;
    const char *files[32];
    int nfiles = template_files(g, files, 32);
    const char *portable = template_text("portable.h");
    if (!portable)
        fsd_panic(__FILE__, __LINE__, "template portable.h is not built in");

    fprintf(out, "verify %s: %d template file%s through NVRTC %d.%d (%s) for", m->prog->src->name,
            nfiles, nfiles == 1 ? "" : "s", major, minor, nv.path);
    for (int a = 0; a < narch; a++)
        fprintf(out, "%s %s", a ? "," : "", archs[a]);
    fprintf(out, "\n  registers, shared memory, stack and spills are ptxas's (--ptxas-options=-v, "
                 "in-process); no device is needed\n");

    Tally t = {0};
    for (int a = 0; a < narch; a++) {
        fprintf(out, "%s\n", archs[a]);
        for (int f = 0; f < nfiles; f++)
            verify_file(out, &nv, m, g, archs[a], portable, files[f], &t);
    }
    fprintf(out, "verify: %d template file%s x %d architecture%s: %d failed; %d kernel build%s "
                 "(kernel x architecture) used by the program, %d spilling\n",
            nfiles, nfiles == 1 ? "" : "s", narch, narch == 1 ? "" : "s", t.failures,
            t.kernels_used, t.kernels_used == 1 ? "" : "s", t.spilling);
    return t.failures;
}
