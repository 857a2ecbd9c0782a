/*
 * trainer.c — a hand-written trainer on the runtime's public header, the
 * way an emitted train.cu uses it, for tests/runtime/run.sh.
 *
 * The model is softmax regression over token embeddings, small enough to
 * write its kernels inline and big enough to use every runtime call:
 *
 *   x      = tok.weight[idx] ⊙ scale.weight           [N, C]   group "tok", "root"
 *   logits = x · head.weightᵀ + head.bias             [N, V]   group "root"
 *   loss   = cross_entropy(logits, targets)
 *
 * with N = B·T rows. Group "tok" reshards after forward and is gathered
 * again for backward; "root" stays gathered, as FSDP2's root does. The
 * backward pass uses fsdrt_gemm with both transposes.
 *
 * Environment switches (the runtime refuses unknown flags, and these are
 * the test's, not the trainer's): FSD_TEST_BF16 (all-gather in bf16),
 * FSD_TEST_FP16 (all-gather in fp16), FSD_TEST_REDUCE_BF16 (reduce-scatter
 * in bf16), FSD_TEST_UNSHARDED (accumulate unsharded gradients), FSD_TEST_SGD (SGD
 * with Nesterov momentum), FSD_TEST_TINY (an extra two-element group, for
 * the world-size check), FSD_TEST_ORDER=DIR (each rank writes the
 * sequences it loads to DIR/order.RANK, to check the data order),
 * FSD_TEST_BUG=KIND (step 0 breaks one of the schedule's rules, break_rule:
 * the runtime must report it as a bug and abort).
 *
 * Built with -DFSD_ACT_BF16 (run.sh's trainer_bf16) it is the same model
 * computing in bf16, as an emitted program with param = bf16 does: arena
 * tensors, unsharded parameters and gradients bf16, loaded through wide()
 * and stored through narrow(), sums kept in real; its parameters are then
 * gathered in bf16 (FSD_TEST_FP16: in fp16, which the runtime refuses) and
 * FSD_TEST_REDUCE_BF16 picks the reduce dtype.
 *
 * Every rank checks its counters against the formulas at the end and the
 * arena placement on the first step; a mismatch exits 2.
 */
#include "fsdrt.h"
#include "half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { V = 64, T = 16, C = 8 };

static FsdParamInfo params[] = {
    {"tok.weight", 0, 0, 2, {V, C}, V * C, FSD_INIT_NORMAL, 0.02, true},
    {"head.weight", 1, 0, 2, {V, C}, V * C, FSD_INIT_NORMAL, 0.02, true},
    {"head.bias", 1, V * C, 1, {V, 1}, V, FSD_INIT_ZEROS, 0, false},
    {"scale.weight", 1, V * C + V, 1, {C, 1}, C, FSD_INIT_ONES, 0, false},
    {"tiny.weight", 2, 0, 1, {2, 1}, 2, FSD_INIT_ONES, 0, false},
};
enum { TOK, HEAD, BIAS, SCALE };

/* flat sizes rounded up to 16 elements, as the compiler lays groups out */
static FsdGroupInfo groups[] = {{"tok", V * C}, {"root", 592}, {"tiny", 2}};

/* ops: 0 embed, 1 logits, 2 cross-entropy, 3 head grads, 4 dx, 5 embed grads */
static const FsdActInfo acts[] = {
    {"x", T * C, 0, 0, 3},
    {"logits", T * V, 0, 1, 2},
    {"dlogits", T * V, 0, 2, 4},
    {"dx", T * C, 0, 4, 5},
};
enum { X, LOGITS, DLOGITS, DX, NACTS };

static bool env(const char *name) { return getenv(name) && *getenv(name) && strcmp(getenv(name), "0"); }

/* A stored value as real, a real rounded to what act holds (the templates'
 * fsd_wide and fsd_narrow, written with half.h's conversions). */
#ifdef FSD_ACT_IS_BF16
static real wide(act v) { return float_from_bf16(v.bits); }
static act narrow(real x) { return (act){bf16_from_float(x)}; }
#else
static real wide(act v) { return v; }
static act narrow(real x) { return x; }
#endif

/* ── kernels ── */

static void embed(act *x, const act *tok, const act *scale, const int32_t *idx, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < C; c++)
            x[i * C + c] = narrow(wide(tok[idx[i] * C + c]) * wide(scale[c]));
}

/* Mean loss of the rows; dlogits = (softmax − onehot) · scale. */
static double cross_entropy(act *dlogits, const act *logits, const int32_t *tgt, int64_t n,
                            real scale)
{
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        const act *l = logits + i * V;
        real mx = wide(l[0]);
        for (int v = 1; v < V; v++)
            mx = wide(l[v]) > mx ? wide(l[v]) : mx;
        double sum = 0;
        for (int v = 0; v < V; v++)
            sum += exp((double)(wide(l[v]) - mx));
        double lse = (double)mx + log(sum);
        total += lse - (double)wide(l[tgt[i]]);
        for (int v = 0; v < V; v++) {
            double p = exp((double)wide(l[v]) - lse);
            dlogits[i * V + v] = narrow((real)((p - (v == tgt[i])) * scale));
        }
    }
    return total / (double)n;
}

/* ── checks ── */

static int failures;

static void expect(FsdRun *r, const char *what, long long got, long long want)
{
    if (got != want) {
        fprintf(stderr, "rank %d: %s is %lld, expected %lld\n", fsdrt_rank(r), what, got, want);
        failures++;
    }
}

/* Tensors live at the same time never share bytes. */
static void check_arena(FsdRun *r, int64_t n)
{
    for (int a = 0; a < NACTS; a++)
        for (int b = a + 1; b < NACTS; b++) {
            if (acts[a].last < acts[b].first || acts[b].last < acts[a].first)
                continue;
            char *pa = (char *)fsdrt_act(r, a), *pb = (char *)fsdrt_act(r, b);
            int64_t na = (acts[a].per_sample * fsdrt_batch(r)) * (int64_t)sizeof(act);
            int64_t nb = (acts[b].per_sample * fsdrt_batch(r)) * (int64_t)sizeof(act);
            if (pa < pb + nb && pb < pa + na) {
                fprintf(stderr, "rank %d: arena tensors %s and %s overlap\n", fsdrt_rank(r),
                        acts[a].name, acts[b].name);
                failures++;
            }
            if ((uintptr_t)pa % FSDRT_ARENA_ALIGN || (uintptr_t)pb % FSDRT_ARENA_ALIGN)
                failures++;
        }
    (void)n;
}

/* FSD_TEST_BUG: the call sequences an emitted program must never make, each
 * ending in the call the runtime must refuse. */
static void break_rule(FsdRun *r, const char *kind)
{
    if (!strcmp(kind, "no_group"))
        fsdrt_all_gather(r, 7);
    else if (!strcmp(kind, "gather_twice")) {
        fsdrt_all_gather(r, 0);
        fsdrt_all_gather(r, 0);
    } else if (!strcmp(kind, "wait_gather"))
        fsdrt_wait_gather(r, 0);
    else if (!strcmp(kind, "reshard"))
        fsdrt_reshard(r, 0);
    else if (!strcmp(kind, "reshard_gathering")) {
        fsdrt_all_gather(r, 0);
        fsdrt_reshard(r, 0);
    } else if (!strcmp(kind, "alloc_twice")) {
        fsdrt_alloc_grads(r, 1);
        fsdrt_alloc_grads(r, 1);
    } else if (!strcmp(kind, "reduce_no_grads"))
        fsdrt_reduce_scatter(r, 1);
    else if (!strcmp(kind, "reduce_twice")) {
        fsdrt_alloc_grads(r, 1);
        fsdrt_reduce_scatter(r, 1);
        fsdrt_reduce_scatter(r, 1);
    } else if (!strcmp(kind, "wait_reduce"))
        fsdrt_wait_reduce(r, 1);
    else if (!strcmp(kind, "free_reducing")) {
        fsdrt_alloc_grads(r, 1);
        fsdrt_reduce_scatter(r, 1);
        fsdrt_free_grads(r, 1);
    } else if (!strcmp(kind, "free_none"))
        fsdrt_free_grads(r, 1);
    else if (!strcmp(kind, "end_gathering")) {
        fsdrt_all_gather(r, 0);
        fsdrt_end_step(r);
    } else if (!strcmp(kind, "end_reducing")) {
        fsdrt_alloc_grads(r, 1);
        fsdrt_reduce_scatter(r, 1);
        fsdrt_end_step(r);
    } else if (!strcmp(kind, "end_grads")) {
        fsdrt_alloc_grads(r, 1);
        fsdrt_end_step(r);
    } else if (!strcmp(kind, "end_params")) {
        fsdrt_all_gather(r, 0);
        fsdrt_wait_gather(r, 0);
        fsdrt_end_step(r);
    }
    fprintf(stderr, "FSD_TEST_BUG=%s: not a rule break_rule knows, or the runtime accepted it\n", kind);
    exit(3);
}

static int64_t padded(int g, int W) { return (groups[g].flat_numel + W - 1) / W * W; }

int main(int argc, char **argv)
{
    const bool act16 = FSD_ACT_DTYPE == FSD_BF16, fp16 = env("FSD_TEST_FP16");
    /* (bf16 act with FSD_TEST_FP16: a model the runtime must refuse) */
    const bool bf16 = (act16 && !fp16) || env("FSD_TEST_BF16");
    const bool reduce_bf16 = env("FSD_TEST_REDUCE_BF16"), unsharded = env("FSD_TEST_UNSHARDED");
    const bool sgd = env("FSD_TEST_SGD"), tiny = env("FSD_TEST_TINY");
    const char *order_dir = getenv("FSD_TEST_ORDER");
    const char *bug = getenv("FSD_TEST_BUG");
    FsdModel model = {
        .name = "softmax_regression",
        .source = "tests/runtime/trainer.c",
        .hash = 0x1234,
        .vocab = V,
        .seq = T,
        .nparams = tiny ? 5 : 4,
        .ngroups = tiny ? 3 : 2,
        .nacts = NACTS,
        .nops = 6,
        .params = params,
        .groups = groups,
        .acts = acts,
        .param_dtype = bf16 ? FSD_BF16 : fp16 ? FSD_FP16 : FSD_FP32,
        .act_dtype = FSD_ACT_DTYPE,
        .reduce_dtype = reduce_bf16 ? FSD_BF16 : FSD_FP32,
        .accumulate_unsharded = unsharded,
        .flops_per_sample = 6.0 * T * V * C,
        .train = {
            .micro_batch = 2, .grad_accum = 2, .steps = 10, .seed = 42,
            .optimizer = sgd ? FSD_SGD : FSD_ADAMW, .lr = sgd ? 0.5 : 1e-2,
            .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
            .momentum = sgd ? 0.9 : 0, .nesterov = sgd,
            .schedule = FSD_LR_COSINE, .warmup = 3, .min_lr = 1e-3, .grad_clip = 1.0,
        },
    };
    /* every group in the model's dtypes: no per-target mixed precision here */
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        groups[g].param_dtype = model.param_dtype;
        groups[g].reduce_dtype = model.reduce_dtype;
    }
    FsdRun *r = fsdrt_init(argc, argv, &model);
    const int W = fsdrt_world(r), k = fsdrt_micro_batches(r);
    const int64_t B = fsdrt_batch(r), n = B * T;
    FILE *order = NULL;
    if (order_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/order.%d", order_dir, fsdrt_rank(r));
        order = fopen(path, "w");
    }

    int64_t step = 0;
    while (fsdrt_begin_step(r)) {
        if (step == 0)
            check_arena(r, n);
        if (bug && *bug)
            break_rule(r, bug);
        for (int micro = 0; micro < k; micro++) {
            fsdrt_load_micro_batch(r, micro);
            const int32_t *idx = fsdrt_idx(r), *tgt = fsdrt_targets(r);
            if (order)
                for (int64_t b = 0; b < B; b++) {
                    fprintf(order, "%lld %d %d %lld:", (long long)step, micro, fsdrt_rank(r), (long long)b);
                    for (int t = 0; t < T; t++)
                        fprintf(order, " %d", idx[b * T + t]);
                    fprintf(order, " %d\n", tgt[b * T + T - 1]);
                }
            bool first = micro == 0, last = micro == k - 1;
            act *x = fsdrt_act(r, X), *logits = fsdrt_act(r, LOGITS);
            act *dlogits = fsdrt_act(r, DLOGITS), *dx = fsdrt_act(r, DX);

            fsdrt_all_gather(r, 0);
            fsdrt_all_gather(r, 1);
            fsdrt_wait_gather(r, 0);
            fsdrt_wait_gather(r, 1);
            fsdrt_trace_begin(r, "embed tok");
            embed(x, fsdrt_param(r, TOK), fsdrt_param(r, SCALE), idx, n);
            fsdrt_trace_end(r);
            fsdrt_reshard(r, 0);

            fsdrt_trace_begin(r, "matmul head");
            const act *head = fsdrt_param(r, HEAD), *bias = fsdrt_param(r, BIAS);
            fsdrt_gemm(r, false, true, n, V, C, 1, x, C, head, C, 0, logits, V);
            for (int64_t i = 0; i < n; i++)
                for (int v = 0; v < V; v++)
                    logits[i * V + v] = narrow(wide(logits[i * V + v]) + wide(bias[v]));
            fsdrt_trace_end(r);
            fsdrt_add_loss(r, (real)cross_entropy(dlogits, logits, tgt, n, fsdrt_loss_scale(r)));

            if (!unsharded || first)
                fsdrt_alloc_grads(r, 1);
            act *dhead = fsdrt_grad(r, HEAD), *dbias = fsdrt_grad(r, BIAS);
            fsdrt_gemm(r, true, false, V, C, n, 1, dlogits, V, x, C, 1, dhead, C);
            /* column sums in real, each gradient element stored once */
            for (int v = 0; v < V; v++) {
                real s = wide(dbias[v]);
                for (int64_t i = 0; i < n; i++)
                    s += wide(dlogits[i * V + v]);
                dbias[v] = narrow(s);
            }
            fsdrt_gemm(r, false, false, n, C, V, 1, dlogits, V, head, C, 0, dx, C);

            fsdrt_all_gather(r, 0);   /* backward needs tok again */
            fsdrt_wait_gather(r, 0);
            if (!unsharded || first)
                fsdrt_alloc_grads(r, 0);
            const act *tok = fsdrt_param(r, TOK), *scale = fsdrt_param(r, SCALE);
            act *dtok = fsdrt_grad(r, TOK), *dscale = fsdrt_grad(r, SCALE);
            for (int c = 0; c < C; c++) {
                real s = wide(dscale[c]);
                for (int64_t i = 0; i < n; i++) {
                    s += wide(dx[i * C + c]) * wide(tok[idx[i] * C + c]);
                    act *d = &dtok[idx[i] * C + c];
                    *d = narrow(wide(*d) + wide(dx[i * C + c]) * wide(scale[c]));
                }
                dscale[c] = narrow(s);
            }
            fsdrt_reshard(r, 0);
            fsdrt_reshard(r, 1);
            if (!unsharded || last) {
                fsdrt_reduce_scatter(r, 1);
                fsdrt_reduce_scatter(r, 0);
                fsdrt_wait_reduce(r, 1);
                fsdrt_free_grads(r, 1);
                fsdrt_wait_reduce(r, 0);
                fsdrt_free_grads(r, 0);
            }
        }
        fsdrt_end_step(r);
        step++;
    }
    if (order)
        fclose(order);

    /* counters against their formulas: per micro-batch tok is gathered
     * twice and root once; each group is reduce-scattered every
     * micro-batch, or once per step when accumulating unsharded. With bf16
     * act the gradients are bf16 whatever the reduce dtype, and an fp32
     * reduce adds a 4-byte reduce buffer per group while it runs (both run
     * at once, after the parameters are resharded). */
    const int64_t pb = bf16 || fp16 ? 2 : (int64_t)sizeof(real);
    const int64_t rb = reduce_bf16 ? 2 : (int64_t)sizeof(real);
    const int64_t gb = act16 ? 2 : rb, reduce_buf = act16 && !reduce_bf16 ? 4 : 0;
    int64_t shard_elems = 0, wire_g = 0, wire_r = 0;
    for (int g = 0; g < model.ngroups; g++)
        shard_elems += padded(g, W) / W;
    for (int g = 0; g < 2; g++) {
        int64_t recv = padded(g, W) - padded(g, W) / W;
        wire_g += (g == 0 ? 2 : 1) * recv * pb;
        wire_r += recv * rb;
    }
    const int64_t resident = shard_elems * (int64_t)sizeof(real) * (sgd ? 3 : 4);
    /* the placement puts logits at 0, dlogits above it, x above both, and dx
     * (live with none of logits, x) at 0 again */
    const int64_t L = (n * V * (int64_t)sizeof(act) + 255) / 256 * 256;
    const int64_t Xb = (n * C * (int64_t)sizeof(act) + 255) / 256 * 256;
    const int64_t arena = 2 * L + Xb;
    const int64_t both = padded(0, W) + padded(1, W);
    const int64_t live = both * (pb + gb > gb + reduce_buf ? pb + gb : gb + reduce_buf);
    FsdCounters c = fsdrt_counters(r);
    const int64_t steps = step;
    expect(r, "gather_bytes", c.gather_bytes, steps * k * wire_g);
    expect(r, "reduce_bytes", c.reduce_bytes, steps * (unsharded ? 1 : k) * wire_r);
    expect(r, "alloc_bytes", c.alloc_bytes, resident + arena);
    if (steps > 0)
        expect(r, "peak_alloc_bytes", c.peak_alloc_bytes, resident + arena + live);
    if (fsdrt_rank(r) == 0)
        printf("counters gather %lld reduce %lld alloc %lld peak %lld\n", (long long)c.gather_bytes,
               (long long)c.reduce_bytes, (long long)c.alloc_bytes, (long long)c.peak_alloc_bytes);
    int status = fsdrt_finalize(r);
    return failures ? 2 : status;
}
