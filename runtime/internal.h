/*
 * internal.h — what the runtime's own files share, and nothing the emitted
 * program may see: the FsdRun behind the public header, and the handful of
 * calls common.c makes into its backend (cpu.c, or the cuda_*.c files
 * with cuda_kernels.cu).
 *
 * base.c holds what every one of these files may call: rt_fail, rt_bug,
 * rt_now, rt_count, rt_check_gemm.
 * common.c holds everything that is the same on every backend: flags,
 * start-up, the step, logging, the trace, and the collectives' entry points
 * (their checks against the schedule, the group's state); beside it, one job
 * a file, data.c the token files, lr.c the learning-rate schedules, eval.c
 * evaluation, weights.c and ckpt.c the weights and checkpoints. The backend owns
 * communication, the unsharded buffers and every loop over a shard's
 * elements (the optimizer, the gradient norm), because on the GPU those are
 * kernels; optim.c holds the host version both backends use when the
 * shards are host memory.
 * Shards are host memory on the CPU backend and device memory on CUDA
 * (pinned host memory with `offload = cpu`); code outside the backend
 * reaches them through bk_to_host and bk_from_host.
 */
#ifndef FSDRT_INTERNAL_H
#define FSDRT_INTERNAL_H

#include "fsdrt.h"
#include "json.h"      /* json_parse ...: the one JSON reader */
#include "jsonout.h"   /* json_put_chars: the writers' string escaping */

#include <math.h>
#include <stdio.h>

#define ERR_MAX 1024

/* A run of a shard's elements that all do, or all do not, take weight
 * decay; the segments of a group cover its shard end to end, so the
 * optimizer never looks up which parameter an element belongs to. */
typedef struct Segment {
    int64_t begin, end;      /* shard-relative elements */
    bool decay;
} Segment;

/* One shard group on this rank. */
/* distinct reshard_after_forward = N values a model may use */
#define FSD_MAX_PARTIAL 8

typedef struct Group {
    int64_t flat, padded, shard, lo;   /* elements; this rank owns [lo, lo + shard) */
    real *master;            /* fp32 master shard (double in the float64 build) */
    real *grad;              /* gradient shard, averaged over ranks */
    real *m, *v;             /* AdamW moments; SGD keeps its momentum in m */
    Segment *seg;
    int nseg;
    /* unsharded buffers, in the model's act dtype (act_bytes) */
    void *params;            /* unsharded parameters while gathered, else NULL */
    void *grads;             /* unsharded gradients while allocated, else NULL */
    /* a collective issued and not yet waited for, and when it was issued
     * (the trace's slice); common.c keeps them, the backend its handles */
    bool gathering, reducing;
    bool all_reducing;       /* HSDP: the replica all-reduce issued after the reduce-scatter */
    double gather_t0, reduce_t0;
    /* reshard_after_forward = N (docs/design.md#partial-resharding): N, the
     * sub-communicator it gathers over (FsdRun's partial_n index, -1 none),
     * the kept copy (padded / N elements of act, this rank's slice at
     * `part_lo`), and whether the gather in flight reads it */
    int64_t part_ranks, part_lo;
    int part;
    void *kept;
    bool gathering_partial;
} Group;

/* A token file (llm.c's format), mapped read-only. */
typedef struct TokenFile {
    const char *path;
    void *map;
    size_t map_bytes;
    const unsigned char *tokens;   /* after the 256-int32 header */
    int version;                   /* 1: uint16 tokens, 2: uint32 */
    int64_t ntok, nseq;            /* tokens; whole sequences of T + 1 */
    int fd;                        /* kept open to notice a change (data_load) */
    int64_t size, mtime_ns;        /* as mapped */
    /* data.c's SIGBUS list: what its handler prints for this mapping */
    char *bus_msg;
    size_t bus_msg_bytes;
    struct TokenFile *volatile bus_next;
    bool bus_listed;
} TokenFile;

/* --data or --val-data: one token file, or the shards a glob pattern
 * matches, in sorted order, read as one sequence of sequences
 * (docs/runtime.md#the-data-order). */
typedef struct TokenData {
    const char *pattern;           /* as given; NULL: none */
    TokenFile *files;              /* [nfiles], each mapped and checked */
    int nfiles;
    int64_t *first;                /* [nfiles + 1]: the data's first sequence in each file */
    int64_t ntok, nseq;            /* over every file */
    bool ready;                    /* every file opened and checked */
} TokenData;

/* One finished slice of the trace. */
typedef struct TraceEvent {
    const char *name;        /* static, the emitted program's or a group's */
    const char *what;        /* NULL, or the collective's kind */
    int tid;                 /* 0: compute, 1: all-gathers, 2: reduce-scatters */
    double begin_us, end_us; /* host times */
    int mark[2];             /* the backend's marks of its ends (bk_trace_mark), or -1 */
    int64_t bytes;
} TraceEvent;

typedef struct Backend Backend;
typedef struct Ckpt Ckpt;

/* The element types weights files are read in and written as
 * (safetensors.c). */
typedef enum { ST_F32, ST_BF16, ST_F16, ST_NDTYPES } StDtype;
/* The memory plan's peak at this run's world, micro-batch and grad_accum,
 * in bytes per rank, at this build's sizes. */
typedef struct MemPeak {
    int64_t resident;        /* master, gradient and optimizer-state shards (0: offload) */
    int64_t unsharded;       /* the most unsharded buffers the step holds at once */
    int64_t arena;           /* the activation arena, placed for this micro-batch */
    int64_t peak;            /* their sum: the plan's peak, what the CPU build counts */
    int64_t unsharded_counted;   /* unsharded, at the sizes this backend counts them */
    int64_t counted;         /* what this backend's counters reach: the peak, plus the
                                buffers it counts beyond the plan (CUDA's wire buffers,
                                offload's device accumulators, fp32 buffers of an fp16
                                gather: docs/cuda.md#memory-beyond-the-plan) */
} MemPeak;

struct FsdRun {
    const FsdModel *m;
    FsdTrainConfig cfg;      /* the train section after flags */
    int rank, world, local_rank, local_world;
    /* the mesh (docs/design.md#hsdp): R replicas of S = world / R
     * consecutive ranks; this rank is shard_rank of replica `replica`.
     * Plain FSDP: R = 1, S = world. Groups are padded and sharded over S. */
    int replicas, shard_world, shard_rank, replica;
    /* partial resharding's sub-groups: each distinct N of the model's
     * groups, split once at start-up into N consecutive ranks (bk_mesh) */
    int npartial;
    int64_t partial_n[FSD_MAX_PARTIAL];
    Backend *bk;

    /* flags that are not train settings */
    const char *log_path, *init_from, *export_path, *trace_path;
    bool quiet;
    int64_t grad_check;      /* --grad-check N: directions to check, 0: train */
    double grad_check_eps;   /* its central difference's step */
    const char *resume;      /* --resume: "latest" or a checkpoint directory; NULL: none */
    bool resume_auto;        /* --resume auto: resume is then "latest" or NULL (none yet) */
    const char *hf_names;    /* --hf-names gpt2|llama for --export/--init-from; NULL: fsdpc's */
    const char *export_dtype_flag;   /* --export-dtype fp32|bf16|fp16, as given (NULL: fp32) */
    const char *export_shard_flag;   /* --export-shard-size SIZE, as given (NULL: one file) */
    StDtype export_dtype;    /* what they say (weights_export_check) */
    int64_t export_shard_bytes;      /* 0: --export is one file; else a directory of shards */
    bool export_config;      /* the directory gets config.json (hf_config_check) */
    double collective_timeout_s;   /* --collective-timeout; < 0: not given (the backend's default) */
    const char *on_nonfinite;   /* --on-nonfinite stop|skip (NULL: stop) */
    bool skip_nonfinite;     /* it says skip */
    int64_t max_skips;       /* --max-skips: non-finite steps skipped in a row before stopping */
    bool ckpt_overwrite;     /* --ckpt-overwrite: write into a directory of another run's checkpoints */
    int64_t ckpt_max_failures;   /* --ckpt-max-failures: saves failing in a row that stop the run; 0: 3 */
    FILE *log;

    MemPeak mem;             /* memory.c's prediction for this run, made before allocating */
    Group *groups;
    int64_t *act_offset;     /* bytes into the arena, by FsdActInfo index */
    unsigned char *arena;
    int64_t arena_bytes;

    TokenData data, val;
    bool shuffle;            /* --shuffle: the training data's sequences in a seeded order */
    int32_t *idx, *targets, *positions;

    /* evaluation (eval.c) */
    int64_t eval_k;          /* sequences each evaluation takes (0: evaluation off) */
    double *eval_loss;       /* [eval_k]: the losses of this rank's sequences, 0 elsewhere */
    int64_t eval_first;      /* the sequence of the micro-batch being evaluated, -1: padding */
    bool evaluating;         /* inside eval_run: fsdrt_eval_loss_tensor records */

    /* the step */
    int64_t step;            /* the step running, or the next to run */
    /* the data position: the first sequence of step r->step in the data
     * order, not wrapped; it advances by the step's G after every step, so
     * a resumed run goes on from its checkpoint's whatever its own G */
    int64_t seq;
    bool in_step, done;
    bool stopped;            /* a non-finite step ended the run (NONFINITE_STATUS) */
    int64_t skipped;         /* non-finite steps skipped in a row, up to the last step */
    bool saves_failed;       /* end the run after this step: ckpt.c's saves keep failing */
    double step_t0, loss_sum;
    int64_t gather_at_step, reduce_at_step, replicate_at_step, reshard_at_step;   /* the counters when the step began */

    FsdCounters counters;

    TraceEvent *trace;
    int ntrace, trace_cap;
    double t0;               /* trace time origin (seconds, after a barrier) */
    double open_t[64];       /* fsdrt_trace_begin's stack */
    int open_mark[64];
    const char *open_name[64];
    int nopen;

    Ckpt *ckpt;              /* ckpt.c's state: the save in flight; NULL before the first */

    int stop_signal;         /* the signal the run stopped on (stop.c), 0: none */
    int test_step_sleep_ms;  /* FSD_TEST_STEP_SLEEP_MS: tests only */

    char err[ERR_MAX];       /* this rank's first error, "" if none */
    int status;              /* what fsdrt_finalize returns */
};

/* ── base.c: errors, the clock, the counters (every runtime file's) ── */

double rt_now(void);                           /* seconds, monotonic */
void rt_count(FsdRun *r, int64_t bytes);       /* + allocated, − freed */
/* Records this rank's first error (printf-style); the next agreement point
 * reports it on every rank. */
void rt_fail(FsdRun *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An emitted program broke the schedule's rules: not a user error, so it is
 * reported with the call site and the run aborted on every rank. */
_Noreturn void rt_bug(FsdRun *r, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define RT_BUG(r, ...) rt_bug((r), __FILE__, __LINE__, __VA_ARGS__)
/* What fsdrt_gemm and fsdrt_gemm_bias (`what`) accept on both backends:
 * sizes and leading dimensions that fit an int and describe the stored
 * matrices; anything else is an emitter bug (RT_BUG). */
void rt_check_gemm(FsdRun *r, const char *what, bool transA, bool transB, int64_t M, int64_t N,
                   int64_t K, int64_t lda, int64_t ldb, int64_t ldc);

/* ── common.c, for the backend ── */

/* A finished slice of the trace, from host time begin to end, or between
 * the backend's marks (mark NULL: none) */
void rt_trace(FsdRun *r, const char *name, const char *what, int tid, double begin,
              double end, const int *mark, int64_t bytes);

static inline int dtype_bytes(FsdDtype t) { return t == FSD_FP32 ? (int)sizeof(real) : 2; }

/* The ranks a group is sharded over at world W: W / replicate (HSDP), or
 * W itself when replicate does not divide it (the trainer refuses that
 * world at start-up; memory.c's searches only skip it). */
static inline int64_t shard_world_of(const FsdRun *r, int64_t W)
{
    const int64_t R = r->m->replicate > 1 ? r->m->replicate : 1;
    return W % R == 0 ? W / R : W;
}

/* The model's act dtype (fsdrt.h): what arena tensors other than
 * statistics, and the unsharded parameters and gradients, are stored as.
 * check_model accepts FSD_FP32 (act is real) and FSD_BF16 only. */
static inline bool act_bf16(const FsdRun *r) { return r->m->act_dtype == FSD_BF16; }
static inline int act_bytes(const FsdRun *r) { return dtype_bytes(r->m->act_dtype); }
/* An unsharded buffer of group G: padded elements of act. */
static inline int64_t unsharded_bytes(const FsdRun *r, const Group *G)
{
    return G->padded * (int64_t)act_bytes(r);
}
/* Group g's all-gather and reduce-scatter dtypes (FsdGroupInfo). */
static inline FsdDtype group_param_dtype(const FsdRun *r, int g) { return r->m->groups[g].param_dtype; }
static inline FsdDtype group_reduce_dtype(const FsdRun *r, int g) { return r->m->groups[g].reduce_dtype; }
/* Bytes one rank receives in group g's replica all-reduce: 2(R-1)/R of its
 * shard in the group's reduce dtype (0 without HSDP). */
static inline int64_t replicate_bytes(const FsdRun *r, int g, int64_t shard)
{
    const int64_t R = r->replicas;
    return R > 1 ? 2 * (R - 1) * shard / R * dtype_bytes(group_reduce_dtype(r, g)) : 0;
}
/* What the plan holds group g's unsharded gradients in: act when it is bf16
 * (FSDP2's gradients in the param dtype), else the group's reduce dtype. */
static inline FsdDtype grads_dtype(const FsdRun *r, int g)
{
    return act_bf16(r) ? FSD_BF16 : group_reduce_dtype(r, g);
}
/* bf16 gradients reduced in fp32 are widened into an fp32 buffer of group
 * g's padded size, which lives from fsdrt_reduce_scatter to
 * fsdrt_wait_reduce and is counted for that time, as the plan counts it:
 * its bytes for a group of `padded` elements (0 when there is none). */
static inline int64_t reduce_buffer_bytes(const FsdRun *r, int g, int64_t padded)
{
    return act_bf16(r) && group_reduce_dtype(r, g) == FSD_FP32 ? padded * 4 : 0;
}
/* Arena tensor i at micro-batch B: numel × bytes of act, or of real for a
 * statistic (fsdrt.h), as the plan sizes it. */
static inline int64_t act_tensor_bytes(const FsdRun *r, int i, int64_t B)
{
    const FsdActInfo *a = &r->m->acts[i];
    return (a->per_sample * B + a->fixed) * (a->stat ? (int64_t)sizeof(real) : act_bytes(r));
}

/* ── memory.c: the plan's peak for this run (docs/runtime.md#memory-at-start-up) ── */

/* The activation arena at micro-batch B, placed as allocate places it; -1
 * when out of memory. */
int64_t mem_arena_bytes(const FsdRun *r, int64_t B);
/* Computes r->mem; with a memory_budget the peak exceeds (and a step to
 * run), an rt_fail with the numbers and what would fit. Before anything is
 * allocated; the caller agrees on the error. */
void mem_plan_run(FsdRun *r);
/* Rank 0's start-up lines: the peak, and on a device what it holds beyond
 * it (after bk_ready). */
void mem_report(FsdRun *r);

/* ── data.c: token files and the data order ── */

/* Opens --data or --val-data (`flag`): the file `pattern` names, or every
 * file its glob matches, in sorted order; each is mapped and validated,
 * this rank checking its share of the tokens. Errors go to rt_fail (the
 * caller agrees on them), naming the file. */
void data_open(FsdRun *r, TokenData *d, const char *flag, const char *pattern);
void data_close(TokenData *d);
/* Fills r->idx and r->targets for micro-batch `micro` of step r->step,
 * whose first sequence is r->seq. A data file changed since it was mapped
 * ends the job with a message. */
void data_load(FsdRun *r, int micro);
/* --shuffle's order: the sequence (of n) read at position p (not wrapped)
 * under `seed`; positions e·n … e·n + n − 1 (epoch e) read each sequence
 * once. */
int64_t data_shuffled(int64_t p, int64_t n, uint64_t seed);
/* The same for evaluation: B sequences of the validation data from
 * sequence `first` on (wrapping around it, never shuffled). */
void data_load_val(FsdRun *r, int64_t first);

/* ── lr.c: the learning-rate schedules ── */

/* The learning rate of step s of a run of c->steps steps
 * (docs/design.md#learning-rate-schedule). */
double lr_at(const FsdTrainConfig *c, int64_t s);
/* "constant", "cosine", "linear", "wsd" */
const char *lr_schedule_name(FsdSchedule k);

/* ── eval.c: evaluation on the validation file (docs/runtime.md#evaluation) ── */

/* Start-up, after the data files are open: with --eval-every, checks that
 * there is validation data holding --eval-sequences whole sequences and a
 * program that can evaluate, and allocates what evaluation needs; errors go
 * to rt_fail (the caller agrees on them). */
void eval_open(FsdRun *r);
void eval_free(FsdRun *r);
/* After step r->step's update: when the schedule says so (every N-th step
 * and the last), evaluates (collective) and returns true with the mean loss
 * over the first eval_k validation sequences, the same on every rank and
 * at every world size, and the milliseconds it took. */
bool eval_after_step(FsdRun *r, double *loss, double *ms);
/* An evaluation's part of the step's line, written into buf: for people
 * (" | val_loss ...") or for the --log JSON (", \"val_loss\": ..."). */
void eval_describe(char *buf, size_t n, bool json, double loss, double ms);

/* ── weights.c: initialisation, safetensors ── */

void weights_init(FsdRun *r);                          /* this rank's shards */
/* --grad-check's direction `stream`: normal(0, 1) values keyed like the
 * initialisation's, by (seed, stream, parameter name, element index), so
 * they do not depend on the world size; this rank's elements of every
 * parameter into dst[g] (host, shard-sized), zero in gaps and padding. */
void weights_direction(FsdRun *r, uint64_t stream, real *const *dst);
/* --init-from PATH (a safetensors file, or a model directory: sharded with
 * model.safetensors.index.json, or model.safetensors): this rank's shards,
 * read group by group and only this rank's elements of each. */
void weights_import(FsdRun *r, const char *path);
void weights_export(FsdRun *r, const char *path);      /* collective */
/* Start-up, every rank: --export-dtype and --export-shard-size read into
 * export_dtype and export_shard_bytes; on rank 0, whether --export may
 * write its path (a regular file or none: never a device or FIFO, which its
 * rename would replace; with shards, a directory, made here). Else
 * rt_fail. */
bool weights_export_check(FsdRun *r);

/* json.c, the JSON reader (safetensors headers, checkpoint metadata), is
 * declared in json.h: the compiler reads config.json with it too. */

/* ── hfnames.c: where parameters lie in a weights file ── */
/* (its WLayout is what safetensors.c, below, reads and writes through) */

/* One tensor of the file. */
typedef struct WTensor {
    char name[256];
    int rank;                /* 1 or 2 */
    int64_t shape[2];        /* shape[1] is 1 for rank 1 */
    int64_t numel;
} WTensor;

/* Where one parameter lies: element i of a parameter placed plainly is
 * element at + i of its tensor (concatenations along the first dimension);
 * a transposed parameter [R, K] has element (i, j) at [j, at + i] of its
 * tensor, which is [K, ≥ R] (GPT-2's Conv1D holds weights [in, out]). */
typedef struct WPlace {
    int tensor;
    bool transposed;
    int64_t at;
} WPlace;

/* Which of the model's layers a Hugging Face layout took for what (the
 * config.json hfconfig.c writes describes them): block n's layers are
 * ARR.n.attn, ARR.n.mlp, ARR.n.norm[0] (before the attention) and
 * ARR.n.norm[1] (before the MLP). */
typedef struct WRoles {
    char arr[128];           /* the block array: blocks, layers */
    int nblocks;
    char attn[256], mlp[256], norm[2][256];   /* within a block */
    char final_norm[256];    /* at top level */
    int64_t dim, hidden;     /* the width; the MLP's (block 0's c_fc, gate) */
    int64_t positions;       /* GPT-2's wpe rows */
    bool untied_head;        /* Llama's lm_head is a parameter of its own */
} WRoles;

typedef struct WLayout {
    const char *names;       /* NULL: fsdpc's own; "gpt2", "llama" */
    WTensor *tensors;        /* in the order a file written with it lists them */
    int ntensors;
    WPlace *place;           /* by parameter */
    WRoles roles;            /* under --hf-names */
} WLayout;

/* The layout for --hf-names `names` (NULL: one tensor a parameter under its
 * own name); a model the format cannot hold is refused through rt_fail,
 * naming the parameter, and false returned. */
bool hf_layout(FsdRun *r, const char *names, WLayout *out);
void hf_layout_free(WLayout *l);

/* ── hfconfig.c: the config.json of an --hf-names directory export ── */

/* Rank 0, at start-up, for --export DIR --export-shard-size with
 * --hf-names: when one Hugging Face config cannot describe the model (its
 * blocks differ, or a layer has no place in it), a one-line warning naming
 * the layer and the field, and export_config false: the export then
 * writes the weights alone. */
void hf_config_check(FsdRun *r);
/* The config.json of r's model under L (hf_config_check found it
 * describable) into f: false when f fails. weights.c writes it, in a
 * directory export before the index. */
bool hf_config_put(FILE *f, FsdRun *r, const WLayout *L);

/* ── safetensors.c: the format, and a Hugging Face model directory ── */

const char *st_dtype_name(StDtype t);   /* "F32", "BF16", "F16" */
int st_dtype_bytes(StDtype t);

/* A safetensors file open for reading: its header parsed, and every
 * entry's data_offsets checked (inside the data, no two overlapping). */
typedef struct StFile {
    char *path;
    int fd;
    int64_t data_start, data_bytes;   /* where the data section starts; its length */
    JVal header;
} StFile;

/* What --init-from names: one file, or a directory's index and the shard
 * files its weight_map names (every one opened), or its model.safetensors. */
typedef struct StSource {
    char *index_path;        /* model.safetensors.index.json, or NULL */
    JVal index;
    const JVal *weight_map;  /* in index: tensor name → shard file name */
    StFile *files;
    int nfiles;
} StSource;

/* One tensor found and checked against the shape a layout wants. */
typedef struct StTensor {
    const StFile *file;
    StDtype dtype;
    int64_t begin;           /* byte offset of its first element in the file */
} StTensor;

/* Opens PATH (a file or a directory) and checks every header; rt_fail
 * naming the file and the field when anything is wrong. st_close frees
 * what it opened, also after a failure. */
bool st_open(FsdRun *r, const char *path, StSource *s);
void st_close(StSource *s);
/* Layout L's tensor T in s (the index's weight_map says which file): its
 * dtype accepted (F32, BF16, F16), its shape T's, its bytes the shape's. */
bool st_find(FsdRun *r, const StSource *s, const WLayout *L, const WTensor *T, StTensor *out);
/* n elements of t from element `first` (row-major) as fp32, exactly. */
bool st_read(FsdRun *r, const StTensor *t, const char *name, int64_t first, int64_t n,
             float *dst);

/* Where --export puts each of a layout's tensors: one file, or shards of
 * at most shard_bytes split as huggingface_hub splits a state dict. */
typedef struct StPlan {
    StDtype dtype;
    int nfiles;
    char (*names)[64];       /* model.safetensors, or model-00001-of-00003.safetensors ... */
    int *file_of;            /* by tensor */
    int64_t *at;             /* by tensor: byte offset of its data in its file */
    char **header;           /* by file: the length prefix and the JSON, padded */
    size_t *header_bytes;
    int64_t total_size;      /* bytes of tensor data, all files (the index's metadata) */
} StPlan;

/* shard_bytes 0: one file. False when out of memory. */
bool st_plan(const WLayout *L, StDtype dt, int64_t shard_bytes, StPlan *p);
void st_plan_free(StPlan *p);
/* model.safetensors.index.json's text, as save_pretrained writes it. */
bool st_write_index(FILE *f, const WLayout *L, const StPlan *p);
/* n values src[0], src[stride], ... as dt's little-endian bytes into out
 * (BF16 and F16 rounded to nearest even). */
void st_encode(StDtype dt, const real *src, int64_t n, int64_t stride, void *out);
/* "5GB", "500MB", "2GiB", "1000000" → bytes (KB, MB, GB, TB are powers of
 * 1000, as huggingface_hub reads them; KiB ... TiB of 1024). */
bool st_parse_size(const char *s, int64_t *bytes);

/* ── optim.c: the update as OpenMP loops over shards in host memory (the
 * CPU backend's, and the CUDA backend's with `offload = cpu`) ── */

/* Σ g² over every grad shard of this rank. */
double optim_grad_sumsq(FsdRun *r);
/* Scales the grad shards by coef, runs the optimizer with learning rate lr
 * for step t (from 1), then zeroes the grad shards; with coef UPDATE_SKIP
 * only zeroes them. */
void optim_step(FsdRun *r, double lr, double coef, int64_t t);

/* ── ckpt.c: sharded checkpoints (docs/checkpoint.md) ── */

/* --resume: finds the checkpoint, checks it whole (model hash, format,
 * every rank file's size and checksum) and loads this rank's shards and
 * optimizer state, resharded to this world, and the step to run next.
 * Collective; errors go to rt_fail on every rank and nothing is used until
 * the caller agrees on them. */
void ckpt_resume(FsdRun *r);
/* Start-up, rank 0: with checkpoints on, their directory can be made (so a
 * bad --ckpt-dir is refused before the first step, not after it). */
void ckpt_check(FsdRun *r);
/* After step r->step's update (collective): completes a finished
 * background save, starts the save due after this step (the checkpoint then
 * holds step r->step + 1 and next sequence r->seq + G). Returns the
 * milliseconds training was blocked, and whether a save started or
 * completed. */
double ckpt_after_step(FsdRun *r, bool *worked);
/* Waits for a save in flight and completes it (collective): before
 * --export at the end of the run, and at fsdrt_finalize. */
void ckpt_finish(FsdRun *r);
void ckpt_free(FsdRun *r);   /* joins a writer thread still running, frees the snapshot */
/* A stop (stop.c), collective: completes a save in flight, then saves the
 * state at r->step unless this run's last checkpoint holds it, waiting
 * until it is complete. Returns the checkpoint's directory, or NULL when
 * it could not be written (the failure is printed, r->status is 1). */
const char *ckpt_save_now(FsdRun *r);
/* --resume auto, collective: whether --ckpt-dir holds `latest` (rank 0
 * looks, every rank gets its answer). */
bool ckpt_auto(FsdRun *r);

/* ── stop.c: stopping on SIGTERM, SIGINT or SIGUSR1 ── */

/* Start-up: the handlers, which only record the first signal (a second
 * exits at once with 128 + it). */
void stop_install(FsdRun *r);
/* Collective, at a step boundary: the signal every rank stops on (if any
 * rank caught one), else 0. */
int stop_agree(FsdRun *r);
/* Saves the checkpoint (ckpt_save_now), records the signal for the exit
 * status (128 + it) and has rank 0 print how to resume. Collective. */
void stop_run(FsdRun *r, int sig);
/* FSD_TEST_STEP_SLEEP_MS: a slow step for tests, cut short by a signal. */
void stop_test_pause(FsdRun *r);

/* ── ranks.c: the ranks' configurations held against each other ── */

/* Collective, at start-up: every setting that must be the same on every
 * rank (the flags that shape the step, the schedule, checkpoints, the data
 * files' identity, the model hash) compared with rank 0's; the first
 * difference, naming the setting and both values, goes to rt_fail on rank
 * 0 (the caller agrees on it). */
void ranks_check_config(FsdRun *r);

/* ── the backend, for common.c ── */

/* Starts communication and fills rank, world, local_rank, local_world; on
 * failure writes why into r->err and returns false (world is then 1). */
bool bk_start(FsdRun *r, int *argc, char ***argv);
/* Frees the backend's buffers and stops communication. */
void bk_stop(FsdRun *r);
_Noreturn void bk_abort(FsdRun *r);
/* Collective: true when some rank has an error; every rank then holds the
 * message of the lowest such rank in r->err. */
bool bk_agree(FsdRun *r);
void bk_barrier(FsdRun *r);
/* Collective, once at start-up after r's mesh is set (common.c's
 * set_mesh): the sub-communicators of replicate = R, the shard group
 * (ranks of this replica) and the replica group (ranks with this
 * shard_rank); nothing without HSDP. Errors go to rt_fail. */
void bk_mesh(FsdRun *r);
/* Partial resharding: copy this rank's slice [part_lo, part_lo + padded/N)
 * of G->params into G->kept (ordered after the compute that last read the
 * buffer); then the all-gather of G->kept within the N ranks into
 * G->params, which bk_wait_gather waits for as for bk_all_gather. */
void bk_keep_partial(FsdRun *r, int g);
void bk_gather_partial(FsdRun *r, int g);
void bk_allreduce_sum(FsdRun *r, double *v, int n);
/* Collective over replica 0's shard group (every rank calls it; the
 * other replicas return at once): group g's full flat buffer (padded
 * elements) on rank 0. */
void bk_gather_shards(FsdRun *r, int g, real *dst);
/* Collective: every rank's n bytes, concatenated in rank order, on rank 0
 * (*out malloc'ed there, NULL elsewhere). */
bool bk_gather_bytes(FsdRun *r, const char *buf, int64_t n, char **out, int64_t *outn);

/* Shard-sized and unsharded buffers, counted. */
void *bk_alloc(FsdRun *r, int64_t bytes);      /* zeroed */
void bk_free(FsdRun *r, void *p, int64_t bytes);
/* Shard state (Group's master, grad, m, v), zeroed: bk_alloc's memory, or
 * with `offload = cpu` host memory that is not counted (the plan keeps it
 * off the device: on CUDA pinned host memory, on the CPU plain memory). */
void *bk_alloc_shard(FsdRun *r, int64_t bytes);
void bk_free_shard(FsdRun *r, void *p, int64_t bytes);
/* A pooled buffer of at least `bytes`, counted as `count` while out. */
void *bk_pool_get(FsdRun *r, int64_t bytes, int64_t count);
void bk_pool_put(FsdRun *r, void *p, int64_t count);

/* The collectives behind fsdrt_all_gather ... fsdrt_free_grads: common.c
 * checks each call against the schedule's rules, keeps the group's state,
 * the byte counters and the trace, and calls these for the backend's work
 * alone, the state already checked. */
/* What an unsharded buffer of n elements, which the plan holds in dtype dt
 * (the param dtype for parameters; for gradients the act dtype when act is
 * bf16, else the reduce dtype), counts while it is out of the pool
 * (bk_pool_get's count). */
int64_t bk_unsharded_count(FsdRun *r, int64_t n, FsdDtype dt);
/* G->params (unsharded_bytes, from the pool, or still gathered) is the
 * destination: start group g's all-gather of its master shards. */
void bk_all_gather(FsdRun *r, int g);
/* After it, compute may read G->params. */
void bk_wait_gather(FsdRun *r, int g);
/* G->grads is fresh from the pool: zero it. */
void bk_alloc_grads(FsdRun *r, int g);
/* Starts the reduce-scatter of G->grads. With bf16 act and an fp32 reduce
 * the gradients are widened into an fp32 reduce buffer first; common.c
 * counts that buffer (padded × 4 bytes, as the plan does) from this call
 * to bk_wait_reduce, so the backend's own allocation of it is not. */
void bk_reduce_scatter(FsdRun *r, int g);
/* HSDP: after bk_reduce_scatter, start the all-reduce of its shard across
 * the replicas (the ranks with this one's shard_rank), ordered after the
 * reduce-scatter; bk_wait_reduce then waits for both. */
void bk_all_reduce(FsdRun *r, int g);
/* After it, the result is averaged over all ranks (the reduce-scatter's
 * shard group and, under HSDP, the replicas) and added into the grad shard
 * (on CUDA: for what the compute stream runs next), and G->grads may go
 * back to the pool. */
void bk_wait_reduce(FsdRun *r, int g);

/* ── the backend, for common.c: the trace's clock ──
 *
 * --trace-out's slices are host times where the host does the work (the
 * CPU backend). Where it only queues the work (CUDA), the backend marks
 * each slice's ends on the stream that runs it, and the trace is written
 * with the device's times. */
/* At r->t0, outside any step, with the trace on: the device's clock set
 * against the host's. */
void bk_trace_start(FsdRun *r);
/* With the trace on, a mark on the compute stream: an index for
 * bk_trace_us, or -1 where host times are the trace's (the CPU). */
int bk_trace_mark(FsdRun *r);
/* The marks of group g's last all-gather (tid 1) or reduce-scatter (tid 2),
 * made by the backend around the work on its stream, or -1, -1. */
void bk_trace_collective(FsdRun *r, int g, int tid, int mark[2]);
/* After the run's last step: a mark's time, in µs since r->t0; false if the
 * backend has none. */
bool bk_trace_us(FsdRun *r, int mark, double *us);

/* ── the backend, for common.c: what a GPU needs besides ──
 *
 * Shard state (Group's master, grad, m, v), unsharded buffers and the
 * arena are backend memory: host memory on the CPU backend, device memory
 * on CUDA (shard state pinned host memory there with `offload = cpu`).
 * Code outside the backend never dereferences them: it copies through
 * bk_to_host / bk_from_host (weights.c writes host images of the master
 * shards and copies them in). */

/* Start-up work once the run is sized (after the shards and the arena are
 * allocated): on CUDA, the input buffers, the segment tables and the
 * unsharded-buffer pools, sized by replaying the model's buffer events.
 * Errors go to rt_fail; the caller agrees on them. */
void bk_ready(FsdRun *r);
/* Bytes the backend will allocate and count beyond the memory plan's
 * buffers at world W, before anything is allocated (memory.c adds them to
 * its prediction of the counters): CUDA's 16-bit wire buffers and
 * offload's device accumulators; 0 on the CPU. */
int64_t bk_counted_extra(FsdRun *r, int64_t world);
/* What a device holds besides the counted buffers, after bk_ready
 * (docs/cuda.md#memory-beyond-the-plan). */
typedef struct BkMemory {
    int device;
    int64_t total;           /* cudaMemGetInfo: the device's bytes */
    int64_t used_at_start;   /* in use when this process's context was made */
    int64_t used_now;        /* in use after start-up */
    int64_t ours;            /* the runtime's device buffers now, counted or not */
    int64_t outside;         /* of which not counted: the three below and the rest */
    int64_t pools;           /* the unsharded-buffer pools' capacity */
    int64_t workspace;       /* cuBLASLt's workspace */
    char extra_what[192];    /* what bk_counted_extra and the counted sizes add */
} BkMemory;
/* Fills d and returns true where there is a device to report (CUDA);
 * false on the CPU. */
bool bk_memory(FsdRun *r, BkMemory *d);
/* Outside a step: copies `bytes` between backend memory and the host. */
void bk_to_host(FsdRun *r, void *dst, const void *src, int64_t bytes);
void bk_from_host(FsdRun *r, void *dst, const void *src, int64_t bytes);
/* r->idx and r->targets hold micro-batch `micro`'s tokens: make them what
 * fsdrt_idx and fsdrt_targets return (CUDA: a copy on the compute stream). */
void bk_inputs(FsdRun *r, int micro);
/* The step's update, collective: this rank's loss sum (r->loss_sum, plus
 * what fsdrt_add_loss_tensor added) and Σ g² over its grad shards, summed
 * over ranks into v[0] and v[1]; clipping to cfg.grad_clip (clip_coef);
 * the optimizer with learning rate lr for step t (from 1); grad shards
 * zeroed. When v[0] or v[1] is not finite the optimizer does not run
 * (update_coef): every rank sees the same sums, so all skip together. On
 * CUDA nothing in it waits for the GPU but the read of v (with `offload =
 * cpu`: one wait for the step first, then the update on the host,
 * optim.c). */
void bk_update(FsdRun *r, double lr, int64_t t, double v[2]);

/* The exit status of a run stopped by a non-finite loss or gradient norm
 * (docs/runtime.md, "Non-finite steps"): not 1, so a job script can tell a
 * diverged run from a user's mistake or a failed write. */
#define NONFINITE_STATUS 4

/* The coefficient bk_update's optimizer takes: UPDATE_SKIP when the step's
 * summed loss or Σ g² is not finite (the update is skipped: the shards and
 * the optimizer state stay as they are, only the gradients are zeroed),
 * else clip_coef's. The CUDA backend computes the same on the device
 * (cuda_kernels.cu, clip_kernel), so no host wait comes before the
 * optimizer. */
#define UPDATE_SKIP (-1.0)

/* torch.nn.utils.clip_grad_norm_: gradients are scaled by clip / (‖g‖ +
 * 1e-6) when that is below 1 (clip 0: never). The CUDA backend computes the
 * same on the device (cuda_kernels.cu, clip_kernel). */
static inline double clip_coef(double clip, double norm)
{
    return clip > 0 && clip / (norm + 1e-6) < 1 ? clip / (norm + 1e-6) : 1;
}

static inline double update_coef(double clip, double loss_sum, double sumsq)
{
    return isfinite(loss_sum) && isfinite(sumsq) ? clip_coef(clip, sqrt(sumsq)) : UPDATE_SKIP;
}

#endif
