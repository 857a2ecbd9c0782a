/*
 * fsdrt.h — the fsdpc runtime: the one header an emitted train.cu includes.
 *
 * The emitted program describes its model in constant tables (parameters,
 * shard groups, arena tensors, the train section) and walks the compiler's
 * schedule as straight-line calls: all-gathers, waits, kernels, reshards,
 * reduce-scatters, the optimizer. Everything stateful lives behind FsdRun:
 * start-up from mpirun/srun/torchrun variables, the sharded master
 * parameters and optimizer state, pooled unsharded buffers, the activation
 * arena, the data loader, the learning-rate schedule, logging, counters of
 * bytes moved and memory allocated, weights export and import.
 *
 * Two backends implement this header: cpu (MPI, OpenBLAS, OpenMP; bf16
 * emulated by rounding) and cuda (NCCL, cuBLASLt, streams and events;
 * docs/cuda.md). Building with -DFSD_FLOAT64 makes `real` double
 * everywhere: the build the finite-difference gradient checks use (CPU
 * only). Pointers the runtime hands out (fsdrt_act, fsdrt_param,
 * fsdrt_grad, fsdrt_idx, ...) are device memory on CUDA: only kernels,
 * fsdrt_gemm and fsdrt_gemm_bias read them.
 */
#ifndef FSDRT_H
#define FSDRT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef FSD_FLOAT64
typedef double real;
#else
typedef float real;
#endif

/* `act`: how the step stores the tensors it computes with — activations,
 * their gradients, the unsharded parameters and the unsharded parameter
 * gradients. A program whose policy gathers parameters in bf16 defines
 * FSD_ACT_BF16 before this header (fsdpc writes it): its tensors are then
 * bf16 in memory (2 bytes, the GPU's __nv_bfloat16 layout) and kernels do
 * their arithmetic in float, widening on load and rounding to nearest even
 * on store (templates/portable.h: fsd_wide, fsd_narrow). Statistics stay
 * `real` whatever act is: the norms' mean and rstd, attention's and the
 * loss's log-sum-exp, the loss itself. The float64 build (gradient checks)
 * has no bf16: act is real there. A struct rather than a bare uint16_t, so
 * that a kernel using a stored value without widening it does not compile. */
#if defined(FSD_ACT_BF16) && !defined(FSD_FLOAT64)
typedef struct fsd_bf16 {
    uint16_t bits;
} fsd_bf16;
typedef fsd_bf16 act;
#define FSD_ACT_IS_BF16 1
#define FSD_ACT_DTYPE FSD_BF16
#else
typedef real act;
#define FSD_ACT_DTYPE FSD_FP32   /* act is real */
#endif

/* Small ops on one thread (the CPU backend): an OpenMP region costs a
 * wake-up of every thread and a wait for the slowest: ~60 us here when the
 * other thread slept or was descheduled (a 5 us op took 65 us at 2
 * threads), against ~0.9 ns an element for elementwise work on one thread,
 * so a loop with less work than this runs on the calling thread (`if`
 * clauses in templates/portable.h's FSD_RUN_* and the templates' and
 * runtime's own regions). ELEMS counts the elements a loop of elementwise
 * or row work reads or writes (rows × width); MACS the multiply-adds of
 * attention's regions and, as runtime/cpu.c's GEMM_SPLIT_MIN, of the
 * products split over the threads. The loops are static schedules over independent rows and
 * elements, so where they run changes no result bit (tests/e2e section 7).
 * 262144 was measured against 16K, 64K and 1M elements:
 * docs/performance.md#small-ops-on-one-thread. Defined before this header
 * (-D) they take other values, for such measurements; the runtime library
 * keeps the value it was compiled with. */
#ifndef FSD_PAR_MIN_ELEMS
#define FSD_PAR_MIN_ELEMS 262144
#endif
#ifndef FSD_PAR_MIN_MACS
#define FSD_PAR_MIN_MACS 4000000
#endif

/* The runtime is C; nvcc compiles train.cu as C++. */
#ifdef __cplusplus
extern "C" {
#endif

/* ── the model, as the emitted program describes it ── */

typedef enum { FSD_INIT_NORMAL, FSD_INIT_ZEROS, FSD_INIT_ONES } FsdInit;
typedef enum { FSD_FP32, FSD_BF16, FSD_FP16 } FsdDtype;
typedef enum { FSD_ADAMW, FSD_SGD } FsdOptimizer;
/* docs/design.md#learning-rate-schedule */
typedef enum { FSD_LR_CONSTANT, FSD_LR_COSINE, FSD_LR_LINEAR, FSD_LR_WSD } FsdSchedule;

typedef struct FsdParamInfo {
    const char *name;        /* blocks.3.attn.q.weight (docs/design.md#parameter-names-and-layouts) */
    int group;               /* shard group */
    int64_t offset;          /* elements into the group's flat buffer */
    int rank;                /* 1 or 2 */
    int64_t shape[2];
    int64_t numel;
    FsdInit init;            /* normal(0, std), zeros or ones */
    double std;              /* FSD_INIT_NORMAL's standard deviation (0.02 but
                                where the layer's init says) */
    bool decay;              /* weight decay applies: 2 or more dimensions */
} FsdParamInfo;

/* A layer whose settings its parameters' shapes do not show (heads, eps,
 * RoPE, the activation): what --export writes into a Hugging Face
 * config.json (docs/checkpoint.md#the-config). One entry per norm,
 * attention and MLP instance, in declaration order, depth first; each
 * field belongs to the kinds its comment names and is 0 for the others. */
typedef enum { FSD_LAYER_LAYERNORM, FSD_LAYER_RMSNORM, FSD_LAYER_ATTENTION, FSD_LAYER_MLP } FsdLayerKind;
typedef enum { FSD_MLP_GELU, FSD_MLP_RELU, FSD_MLP_SWIGLU } FsdMlpAct;
typedef struct FsdLayerInfo {
    const char *path;        /* blocks.3.attn: its parameters are blocks.3.attn.* */
    FsdLayerKind kind;
    int64_t heads, kv_heads; /* Attention */
    bool causal;             /* Attention */
    double rope_theta;       /* Attention: 0, no RoPE */
    double eps;              /* LayerNorm, RMSNorm; Attention: qk_norm's (0: no qk_norm) */
    FsdMlpAct mlp_act;       /* MLP: gelu (the tanh form), relu or swiglu */
} FsdLayerInfo;

typedef struct FsdGroupInfo {
    const char *name;
    int64_t flat_numel;      /* aligned parameters end to end, before padding */
    /* this group's all-gather and reduce-scatter dtypes: the shard
     * section's unless its fully_shard line sets its own
     * (docs/design.md#per-target-mixed-precision) */
    FsdDtype param_dtype, reduce_dtype;
    /* reshard_after_forward = N (docs/design.md#partial-resharding): after
     * forward the group keeps a copy sharded over the N consecutive ranks
     * of its shard group holding this rank, and backward gathers from it
     * within them; 0: none. */
    int64_t reshard_ranks;
} FsdGroupInfo;

/* A tensor of the activation arena: numel = per_sample * B + fixed, live
 * from op `first` to op `last` (inclusive) of one micro-batch. The runtime
 * places them at start-up, once B is known. */
typedef struct FsdActInfo {
    const char *name;
    int64_t per_sample, fixed;
    int first, last;
    bool stat;               /* a statistic: real, not act (see act above) */
} FsdActInfo;

typedef struct FsdTrainConfig {
    int64_t micro_batch, grad_accum, steps, seed;
    FsdOptimizer optimizer;
    double lr, beta1, beta2, eps, weight_decay, momentum;
    bool nesterov;
    FsdSchedule schedule;
    int64_t warmup;          /* steps; any schedule, constant too */
    double min_lr;           /* cosine, linear, wsd */
    double decay;            /* wsd: the fraction of the steps that decays */
    double grad_clip;        /* 0: none */
    int64_t ckpt_every;      /* 0: none */
    const char *ckpt_dir;
    bool ckpt_async;
    int64_t ckpt_keep;
    const char *data, *val_data;   /* NULL: must come from --data */
    int64_t eval_every;      /* evaluate after every N-th step and the last; 0: never */
    int64_t eval_sequences;  /* the first K sequences of val_data; 0: all of them */
} FsdTrainConfig;

/* One unsharded-buffer event of the schedule (FsdModel's buf_one, buf_three). */
typedef enum {
    FSD_BUF_GATHER, FSD_BUF_RESHARD, FSD_BUF_ALLOC_GRADS, FSD_BUF_FREE_GRADS,
    FSD_BUF_REDUCE, FSD_BUF_WAIT_REDUCE,
    /* partial resharding: the 1/N copy kept, the gather from it (it takes
     * the unsharded buffer as FSD_BUF_GATHER does), and that gather's wait,
     * which frees the copy */
    FSD_BUF_KEEP_PARTIAL, FSD_BUF_GATHER_PARTIAL, FSD_BUF_WAIT_PARTIAL
} FsdBufOp;
typedef struct FsdBufEvent {
    FsdBufOp op;             /* fsdrt_all_gather, _reshard, _alloc_grads, _free_grads,
                                _reduce_scatter (a reduce buffer with bf16 act and an
                                fp32 reduce), _wait_reduce, _keep_partial,
                                _gather_partial, and _wait_gather after it */
    int group;
    int micro;               /* the micro-batch of the step it belongs to */
} FsdBufEvent;

typedef struct FsdRun FsdRun;

/* One step's forward and backward over all its micro-batches (the emitted
 * program's schedule: load each micro-batch, run its events); or, as
 * FsdModel's eval, one micro-batch's forward alone. */
typedef void (*FsdStepFn)(FsdRun *r);

typedef struct FsdModel {
    const char *name;        /* model name */
    const char *source;      /* the .fsd file it was compiled from */
    uint64_t hash;           /* of the typed model: checkpoints refuse others */
    int64_t vocab, seq;
    int nparams, ngroups, nacts, nops;
    const FsdParamInfo *params;
    const FsdGroupInfo *groups;
    const FsdActInfo *acts;
    /* the shard section's mixed_precision: every group's but where its
     * FsdGroupInfo says otherwise, which is what the collectives use */
    FsdDtype param_dtype;    /* all-gather dtype */
    FsdDtype act_dtype;      /* FSD_ACT_DTYPE: FSD_BF16, or FSD_FP32 for `real` */
    FsdDtype reduce_dtype;   /* reduce-scatter dtype */
    bool accumulate_unsharded;
    double flops_per_sample; /* forward + backward of one sequence, for MFU */
    FsdTrainConfig train;    /* the .fsd train section; flags override it */
    bool offload_cpu;        /* offload = cpu: shard state in host memory (docs/cuda.md) */
    /* The unsharded-buffer events of a step of one micro-batch, and of a
     * step of three (first, middle, last: every distinct micro-batch), in
     * schedule order: the CUDA backend replays them at start-up to size its
     * buffer pools, so that no step allocates device memory, and every
     * backend to predict the memory peak at its world. */
    int nbuf_one, nbuf_three;
    const FsdBufEvent *buf_one, *buf_three;
    /* Evaluation's micro-batch (docs/runtime.md#evaluation): the forward
     * alone, with the step's gathers and kernels, every group resharded at
     * its end, each sequence's loss handed to fsdrt_eval_loss_tensor; the
     * runtime loads its inputs. NULL: the program cannot evaluate. */
    FsdStepFn eval;
    /* The plan fsdpc fitted (docs/runtime.md#memory-at-start-up): the world
     * it planned memory for (fsdpc --world), the memory plan's peak there at
     * the train section's micro_batch and grad_accum, and the shard
     * section's memory_budget (0: none), which the runtime holds the peak
     * at its own world to before it starts. */
    int64_t plan_world, plan_peak_bytes, memory_budget_bytes;
    /* replicate = R (docs/design.md#hsdp): the world is R replicas of W/R
     * consecutive ranks, each sharding every group over its own ranks, the
     * reduced gradient shards all-reduced across replicas; 0 or 1: plain
     * FSDP. */
    int64_t replicate;
    /* 1: replicate was chosen by `replicate = auto` for plan_world
     * (docs/design.md#replicate-auto): the trainer runs at any world it
     * divides, notes a world other than plan_world and names plan_world
     * when it refuses one; 0: written in the .fsd. */
    int64_t replicate_auto;
    /* The layer table above (FsdLayerInfo); 0 and NULL: the program has
     * none, and --export writes no config.json. */
    int nlayers;
    const FsdLayerInfo *layers;
} FsdModel;

/* ── lifecycle ── */

/* Parses the trainer's flags (they override m->train), starts MPI (or runs
 * as one process), places the arena, allocates and initialises the sharded
 * parameters (or loads --init-from), opens the data. On a user error it
 * prints `train: ...` on every rank and exits 1 on every rank. */
FsdRun *fsdrt_init(int argc, char **argv, const FsdModel *m);
/* Frees everything the runtime allocated; returns the process exit status. */
int fsdrt_finalize(FsdRun *r);

/* The effective settings, after flags. */
int64_t fsdrt_batch(const FsdRun *r);         /* micro-batch B */
int fsdrt_micro_batches(const FsdRun *r);     /* grad_accum */
int fsdrt_rank(const FsdRun *r);
int fsdrt_world(const FsdRun *r);

/* ── the training loop ── */

/* The whole run: every step (begin, step(r), end), then fsdrt_finalize.
 * Returns the process exit status. The emitted main is just
 * `return fsdrt_train(fsdrt_init(argc, argv, &model), step);`. */
int fsdrt_train(FsdRun *r, FsdStepFn step);

/* Starts the next step (loads nothing yet); false when all steps ran,
 * having then written --export. */
bool fsdrt_begin_step(FsdRun *r);
/* Loads micro-batch `micro` of the current step into the input buffers
 * (docs/design.md#data-order). */
void fsdrt_load_micro_batch(FsdRun *r, int micro);
const int32_t *fsdrt_idx(const FsdRun *r);        /* [B, T] */
const int32_t *fsdrt_targets(const FsdRun *r);    /* [B, T] */
const int32_t *fsdrt_positions(const FsdRun *r);  /* [T]: 0..T-1 */
/* Records this rank's mean loss of one micro-batch. */
void fsdrt_add_loss(FsdRun *r, real loss);
/* The same, from the one-element loss tensor the cross-entropy kernel wrote:
 * device memory on the GPU, added there without a host synchronisation and
 * read when the step ends. What emitted programs call. */
void fsdrt_add_loss_tensor(FsdRun *r, const real *loss);
/* In evaluation's micro-batch (FsdModel's eval): records the mean loss of
 * its sequence `seq` (0 … B−1) from the one-element loss tensor the
 * cross-entropy kernel wrote for that sequence's rows (device memory on the
 * GPU: read back here, outside the step's hot path). */
void fsdrt_eval_loss_tensor(FsdRun *r, int64_t seq, const real *loss);
/* Scale of d(loss)/d(logits) for one micro-batch: 1 / (B·T·grad_accum), so
 * that summing over micro-batches and averaging over ranks gives the
 * gradient of the step's mean loss. */
real fsdrt_loss_scale(const FsdRun *r);
/* Gradient norm, clipping, the optimizer on every group, the learning-rate
 * schedule, checkpoints, evaluation when due (FsdModel's eval), the log
 * line. Every group must be resharded, its gradients freed and no
 * collective in flight. */
void fsdrt_end_step(FsdRun *r);

/* ── tensors ── */

/* The runtime hands out untyped pointers (it is built once for every
 * model, whatever its act); the emitted program reads them through the
 * typed views below, which take the program's own act. */
void *fsdrt_act_ptr(FsdRun *r, int act);      /* arena tensor, by FsdActInfo index */
void *fsdrt_param_ptr(FsdRun *r, int param);  /* unsharded; valid while gathered */
void *fsdrt_grad_ptr(FsdRun *r, int param);   /* unsharded; valid while allocated */

static inline act *fsdrt_act(FsdRun *r, int i) { return (act *)fsdrt_act_ptr(r, i); }
static inline real *fsdrt_stat(FsdRun *r, int i) { return (real *)fsdrt_act_ptr(r, i); }
static inline act *fsdrt_param(FsdRun *r, int p) { return (act *)fsdrt_param_ptr(r, p); }
static inline act *fsdrt_grad(FsdRun *r, int p) { return (act *)fsdrt_grad_ptr(r, p); }

/* ── collectives, in the schedule's order ── */

void fsdrt_all_gather(FsdRun *r, int group);   /* async: cast shard, gather (again: same buffer) */
void fsdrt_wait_gather(FsdRun *r, int group);
void fsdrt_reshard(FsdRun *r, int group);      /* unsharded params back to the pool */
void fsdrt_alloc_grads(FsdRun *r, int group);  /* a zeroed unsharded grad buffer */
void fsdrt_reduce_scatter(FsdRun *r, int group);  /* async: average over ranks */
void fsdrt_all_reduce(FsdRun *r, int group);   /* HSDP: the shard across replicas, after it */
void fsdrt_wait_reduce(FsdRun *r, int group);  /* and accumulate into the grad shard */
void fsdrt_free_grads(FsdRun *r, int group);
/* reshard_after_forward = N (docs/design.md#partial-resharding): before
 * forward's reshard, copy this rank's 1/N of the gathered buffer aside;
 * backward's gather_partial all-gathers it within the N ranks (async, its
 * wait is fsdrt_wait_gather, which frees the copy). */
void fsdrt_keep_partial(FsdRun *r, int group);
void fsdrt_gather_partial(FsdRun *r, int group);

/* ── compute ── */

/* C[M,N] = alpha·op(A)·op(B) + beta·C, row-major; op(X) = Xᵀ when transX.
 * lda, ldb, ldc as BLAS (row-major leading dimensions). A, B and C are
 * act (the model's act_dtype): for bf16, products of bf16 values summed in
 * fp32 and C rounded to bf16 once (beta·C read in fp32 first). */
void fsdrt_gemm(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K, real alpha,
                const void *A, int64_t lda, const void *B, int64_t ldb, real beta, void *C,
                int64_t ldc);

/* The CPU backend's matrix-product library (runtime/blas.c, chosen when the
 * runtime is built): C[M,N] = alpha·op(A)·op(B) + beta·C on real, one call
 * on the calling thread (beta 0 never reads C); the emitted attention
 * kernel's blocks multiply through it. Not in the CUDA backend. */
void fsdrt_blas_gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, real alpha,
                     const real *A, int64_t lda, const real *B, int64_t ldb, real beta, real *C,
                     int64_t ldc);
const char *fsdrt_blas_name(void);       /* "OpenBLAS", "oneDNN", "MKL" */
void fsdrt_blas_single_thread(void);     /* before the first product */
bool fsdrt_blas_tune_core(void);         /* OpenBLAS's OPENBLAS_CORETYPE; true: restart */

/* C[M,N] = op(A)·op(B) + bias, bias [N] added to every row of C: a Linear
 * with a bias in one product (the CPU backend fills C with the bias and
 * multiplies with beta = 1; the CUDA backend adds it in cuBLASLt's
 * epilogue). C is overwritten, never read. */
void fsdrt_gemm_bias(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                     const void *A, int64_t lda, const void *B, int64_t ldb, const void *bias,
                     void *C, int64_t ldc);

/* pre[M,N] = op(A)·op(B) + bias as fsdrt_gemm_bias, and y = gelu(pre) (the
 * tanh approximation, templates/act.h's) when the backend can apply it in
 * the product: returns true when it wrote y too, false when it wrote pre
 * alone and the caller runs gelu_fwd(y, pre, M·N). The CUDA backend does it
 * in one cuBLASLt call (the GELU_AUX_BIAS epilogue: pre is its auxiliary
 * output, y is D); the CPU backend returns false, so the CPU build applies
 * the same gelu kernel as an unfused program. pre and y share ldc. */
bool fsdrt_gemm_bias_gelu(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                          const void *A, int64_t lda, const void *B, int64_t ldb,
                          const void *bias, void *pre, void *y, int64_t ldc);

/* ── observability ── */

/* Marks one op for --trace-out (name: op and layer; no cost when off). */
void fsdrt_trace_begin(FsdRun *r, const char *name);
void fsdrt_trace_end(FsdRun *r);

/* Collective bytes count what a rank receives in a ring: (S-1)/S of the
 * padded buffer in the collective's dtype over the S ranks of the shard
 * group (S = W, or W/R under replicate = R), and 2(R-1)/R of the shard for
 * the replica all-reduce, and (N-1)/N of the padded buffer for a gather
 * within N ranks (partial resharding): the planner's figures exactly, per
 * mesh dimension. */
typedef struct FsdCounters {
    int64_t gather_bytes;        /* all-gathers (shard dimension) */
    int64_t reduce_bytes;        /* reduce-scatters (shard dimension) */
    int64_t replicate_bytes;     /* replica all-reduces (replicate dimension) */
    int64_t reshard_bytes;       /* partial resharding's gathers, within N ranks:
                                    (N-1)/N of the padded buffer in the gather dtype */
    int64_t alloc_bytes;         /* runtime-owned memory now */
    int64_t peak_alloc_bytes;    /* its maximum */
} FsdCounters;
FsdCounters fsdrt_counters(const FsdRun *r);

/* ── the activation arena's placement ── */

/* Offsets into the arena are multiples of this (cudaMalloc's alignment, and
 * the compiler memory planner's). */
#define FSDRT_ARENA_ALIGN 256

/* Places n tensors of bytes[i] bytes, live over ops [first[i], last[i]],
 * in one buffer so that tensors whose live ranges overlap never overlap in
 * memory: greedy by size descending (ties: earlier first, then lower
 * index), each at the lowest fitting offset; sizes are rounded up to
 * `align`. Writes offset[i] and returns the buffer's size in bytes, or -1
 * when out of memory. Pure (runtime/arena.c needs only libc). The
 * compiler's planner (compiler/memplan.c, place) applies the same rule on
 * its own; tests/e2e holds the counted peaks to the plan. */
int64_t fsdrt_place_arena(int n, const int64_t *bytes, const int *first, const int *last,
                          int64_t align, int64_t *offset);

#if defined(__CUDACC__) && !defined(__CUDACC_RTC__)
/* The CUDA backend's compute stream: every kernel launcher and fsdrt_gemm
 * run on it (templates/portable.h launches on FSD_STREAM); collectives run
 * on their own streams, ordered against it by events. */
cudaStream_t fsdrt_cuda_stream(void);
#ifndef FSD_STREAM
#define FSD_STREAM fsdrt_cuda_stream()
#endif
#endif

#ifdef __cplusplus
}
#endif

#endif
