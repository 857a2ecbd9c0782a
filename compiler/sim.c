/*
 * sim.c — the cost model and the simulator: predicts one training step's
 * time on a cluster of GPUs by replaying the verified schedule (design
 * section 4, "Simulation"), and writes the replay as a Chrome trace.
 *
 * It runs after schedule_build and changes nothing: the schedule's events
 * are given durations (a roofline per compute op, slowed while collectives
 * run beside it; an alpha-beta ring model per collective) and replayed on
 * the three streams with the schedule's own ordering rules, so what it
 * predicts is what the emitted program does, under the assumptions named
 * below. docs/simulator.md explains the model, its sources and its known
 * limits at more length.
 *
 * Every hardware figure comes from a vendor datasheet, NCCL's own tuning
 * model or NCCL's maintainers, and says which; every modelling assumption
 * is a named constant with the reason for its value.
 */
#include "fsdpc.h"
#include "../runtime/jsonout.h"   /* json_put_chars: one escaper, the runtime's */

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ── presets ──
 * Rates are per GPU. Datasheets print tensor-core peaks "with sparsity"
 * (2:4 structured sparsity doubles them); training is dense, so every
 * tensor figure below is the datasheet's halved. NVLink is printed as the
 * total of both directions; a ring sends and receives at once, so the
 * figure that bounds it is one direction, half the printed total. Memory
 * capacities are the datasheets' GB read as GiB, which is what the parts
 * carry (HBM stacks come in binary sizes; an "80GB" A100 reports 81,920
 * MiB); a process gets a little less (the driver's reservations, the CUDA
 * context, NCCL's buffers). InfiniBand is the DGX system of each generation: one
 * NIC per GPU ("rail-optimized"), so each GPU has its own NIC's bandwidth.
 *
 * Latencies are NCCL's own, from its tuning model (src/graph/tuning.cc,
 * hwLat for the Ring algorithm with the Simple protocol, which NCCL uses
 * for the large messages FSDP sends): 3.4 us per NVLink ring step, 14 us
 * per network step, and a fixed 8.4 us per collective (baseLat). NCCL uses
 * the same figures for every GPU generation, and so do these presets. */
#define NCCL_BASE_LAT_S   8.4e-6   /* NCCL tuning.cc baseLat, Ring/Simple */
#define NCCL_NVLINK_LAT_S 3.4e-6   /* NCCL tuning.cc hwLat[NVLINK], Ring/Simple */
#define NCCL_NET_LAT_S    14.0e-6  /* NCCL tuning.cc hwLat[NET], Ring/Simple */

/* Tree (Simple protocol) latencies from the same table: 4.0 us per hop
 * over NVLink, 14 us per hop across the network, the same 8.4 us base. */
#define NCCL_TREE_NVLINK_LAT_S 4.0e-6   /* NCCL tuning.cc hwLat[NVLINK][TREE][SIMPLE] */
#define NCCL_TREE_NET_LAT_S    14.0e-6  /* NCCL tuning.cc hwLat[NET][TREE][SIMPLE] */

/* FlashAttention-2, the kernel PyTorch's SDPA runs, reaches 50–73% of
 * A100's peak forward and less in backward (Dao, "FlashAttention-2",
 * 2023): half of peak on A100. On H100 it reaches only 35% (Shah et al.,
 * "FlashAttention-3", 2024), and H200 is the same chip. B200: assumed as
 * A100, unmeasured. Each preset carries its figure (attention_eff). */
#define ATTENTION_EFFICIENCY_A100 0.50
#define ATTENTION_EFFICIENCY_H100 0.35

#define T 1e12
#define G 1e9
/* Every DGX generation has 8 single-port NICs, one per GPU on its PCIe
 * switch (the datasheets below): `gbps` Gb/s each, in bytes/s. */
#define DGX_NICS(gbps) .nics = 8, .nic_bytes_per_s = (gbps) * G / 8
static const SimGpu presets[] = {
    {
        /* NVIDIA A100 Tensor Core GPU datasheet, "A100 80GB SXM" column:
         * BF16 Tensor Core 312 TFLOPS (624 with sparsity), TF32 Tensor Core
         * 156 TFLOPS (312 with sparsity), FP32 19.5 TFLOPS, 80GB HBM2e at
         * 2,039 GB/s, NVLink 600 GB/s. DGX A100 datasheet: 8x single-port
         * ConnectX-6 VPI 200 Gb/s HDR InfiniBand = 25 GB/s per GPU. */
        .key = "a100", .name = "A100 SXM 80GB",
        .bf16_flops = 312 * T, .tf32_flops = 156 * T, .fp32_flops = 19.5 * T,
        .attention_eff = ATTENTION_EFFICIENCY_A100,
        .hbm_bytes_per_s = 2039 * G, .hbm_bytes = (int64_t)80 << 30,
        .nvlink_bytes_per_s = 600 * G / 2, .nvlink_alpha_s = NCCL_NVLINK_LAT_S,
        DGX_NICS(200),
        .ib_alpha_s = NCCL_NET_LAT_S,
    },
    {
        /* NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM" column: BF16
         * Tensor Core 1,979 TFLOPS with sparsity (989.5 dense), TF32 Tensor
         * Core 989 TFLOPS with sparsity (494.5 dense), FP32 67 TFLOPS, 80GB
         * HBM3 at 3.35 TB/s, NVLink 900 GB/s. DGX H100: eight single-port
         * ConnectX-7 VPI, 400 Gb/s NDR InfiniBand = 50 GB/s per GPU. */
        .key = "h100", .name = "H100 SXM 80GB",
        .bf16_flops = 1979 * T / 2, .tf32_flops = 989 * T / 2, .fp32_flops = 67 * T,
        .attention_eff = ATTENTION_EFFICIENCY_H100,
        .hbm_bytes_per_s = 3350 * G, .hbm_bytes = (int64_t)80 << 30,
        .nvlink_bytes_per_s = 900 * G / 2, .nvlink_alpha_s = NCCL_NVLINK_LAT_S,
        DGX_NICS(400),
        .ib_alpha_s = NCCL_NET_LAT_S,
    },
    {
        /* NVIDIA H200 Tensor Core GPU datasheet, "H200 SXM" column: the
         * H100's compute (BF16 1,979 and TF32 989 TFLOPS with sparsity, FP32
         * 67 TFLOPS) with 141GB HBM3e at 4.8 TB/s, NVLink 900 GB/s. DGX
         * H200: eight single-port ConnectX-7 VPI, 400 Gb/s InfiniBand. */
        .key = "h200", .name = "H200 SXM 141GB",
        .bf16_flops = 1979 * T / 2, .tf32_flops = 989 * T / 2, .fp32_flops = 67 * T,
        .attention_eff = ATTENTION_EFFICIENCY_H100,
        .hbm_bytes_per_s = 4800 * G, .hbm_bytes = (int64_t)141 << 30,
        .nvlink_bytes_per_s = 900 * G / 2, .nvlink_alpha_s = NCCL_NVLINK_LAT_S,
        DGX_NICS(400),
        .ib_alpha_s = NCCL_NET_LAT_S,
    },
    {
        /* NVIDIA Blackwell datasheet, "HGX B200" column, per GPU: FP16/BF16
         * Tensor Core 4.5 PFLOPS with sparsity (2.25 dense), TF32 Tensor
         * Core 2.2 PFLOPS with sparsity (1.1 dense), FP32 75 TFLOPS, 180GB
         * HBM3e at 7.7 TB/s, fifth-generation NVLink 1.8 TB/s. DGX B200
         * user guide: 8x ConnectX-7 single-port cards, InfiniBand up to
         * 400 Gb/s. */
        .key = "b200", .name = "B200 (HGX) 180GB",
        .bf16_flops = 4500 * T / 2, .tf32_flops = 2200 * T / 2, .fp32_flops = 75 * T,
        .attention_eff = ATTENTION_EFFICIENCY_A100,
        .hbm_bytes_per_s = 7700 * G, .hbm_bytes = (int64_t)180 << 30,
        .nvlink_bytes_per_s = 1800 * G / 2, .nvlink_alpha_s = NCCL_NVLINK_LAT_S,
        DGX_NICS(400),
        .ib_alpha_s = NCCL_NET_LAT_S,
    },
};
#undef T
#undef G
#define NPRESETS ((int)(sizeof presets / sizeof presets[0]))

/* Streaming multiprocessors of each preset's GPU, in presets[] order: the
 * units NCCL's kernels take from compute (below). NVIDIA A100 Tensor Core
 * GPU Architecture whitepaper: 108 SMs. NVIDIA H100 Tensor Core GPU
 * Architecture whitepaper: 132 SMs in H100 SXM5; H200 is the same GH100
 * part. B200: 148 SMs, 74 enabled on each of its two dies (Chips and
 * Cheese, "Nvidia's B200: Keeping the CUDA Juggernaut Rolling", 2025). */
static const int preset_sms[] = {108, 132, 132, 148};
_Static_assert(sizeof preset_sms / sizeof preset_sms[0] == sizeof presets / sizeof presets[0],
               "one SM count per preset");

static int gpu_sms(const SimGpu *gpu) { return preset_sms[gpu - presets]; }

/* GPUs per node in every preset: HGX/DGX baseboards of 8 GPUs on one
 * NVSwitch fabric. `gpus=N` may ask for fewer, not more. */
#define NODE_MAX_GPUS 8

/* ── modelling assumptions ── */

/* The fraction of the dense tensor peak a training step's products reach:
 * the one constant fitted on the calibration table
 * (docs/simulator.md#the-calibration-table): 0.65 puts the A100 rows (torchtitan's Llama 3 8B and
 * 70B, llm.c's GPT-2) within 0.96-1.18 of their measurements. It was 0.75,
 * "70-80% for large GEMMs", which is what one large GEMM alone reaches;
 * a whole step also runs smaller and oddly shaped ones. */
#define MATMUL_EFFICIENCY 0.65
/* Elementwise arithmetic runs on the CUDA cores in fp32; tanh and exp take
 * several instructions each, so half the FMA peak. It rarely matters: these
 * ops are memory-bound by far. */
#define VECTOR_EFFICIENCY 0.50
/* Streaming kernels reach about 80–90% of HBM peak; fused elementwise and
 * normalization kernels in training code sit near the lower end. */
#define HBM_EFFICIENCY 0.80
/* nccl-tests bus bandwidth on 8 A100s over NVLink is 230–250 GB/s of the
 * 300 GB/s per direction; the same fraction is assumed for ring all-gather
 * and reduce-scatter on every preset. (H100 all-reduce exceeds it through
 * NVLink SHARP, which ring all-gather and reduce-scatter do not use.) */
#define NVLINK_EFFICIENCY 0.80
/* Across nodes, of each NIC's line rate: NCCL's maintainers quote ~24
 * GB/s inter-node bus bandwidth for one 200 Gb/s HDR NIC (25 GB/s;
 * NVIDIA/nccl#412) and 192 GB/s all-reduce bus bandwidth across DGX-A100s
 * with 8 of them (200 GB/s; NVIDIA/nccl#812, quoted in #1576): 0.96. */
#define IB_EFFICIENCY 0.96
/* NCCL's tuning model charges its tree all-reduce 0.92 of the bus
 * bandwidth it gives a ring over the same links (tuning.cc: `busBw *
 * .92` for Tree/AllReduce), and converts a tree's bus bandwidth to
 * algorithm bandwidth at 0.5 (each byte goes up and down the tree). */
#define NCCL_TREE_BW_FACTOR 0.92
/* No kernel takes less than this: the gap between back-to-back kernels on
 * one stream plus the launch tail is a microsecond or two, even when the
 * host keeps ahead. It only shows for tiny models. */
#define KERNEL_MIN_S 2e-6
/* Matmuls with fp32 parameters run on TF32 tensor cores, as llm.c's fp32
 * build does (cuBLASLt with CUBLAS_COMPUTE_32F_FAST_TF32 on sm_80 and up)
 * and PyTorch does with allow_tf32. MFU is measured against the same peak. */
#define FP32_MATMUL_USES_TF32 1

/* ── what a collective takes from the compute beside it ──
 * NCCL runs each collective as a CUDA kernel of one thread block per
 * channel, and each block holds an SM of its own for the kernel's whole
 * life ("Reducing the number of channels also reduces the number of CUDA
 * blocks used for communication, hence the impact on GPU computing
 * resources": NCCL's documentation of NCCL_MAX_NCHANNELS; NCCL is
 * "optimized to use as little SMs as possible, but not to share SMs with
 * other kernels", its threads using many registers: NCCL's maintainer in
 * NVIDIA/nccl#181). While a collective runs, the compute beside it has the
 * other SMs, and the HBM bandwidth its traffic leaves: see
 * contended_seconds. The channel counts are what NCCL picks: */
/* On one NVSwitch node of 8 GPUs NCCL's ring search finds 12 channels and
 * doubles them: 24, on H100 (NVIDIA/nccl#1367, NCCL 2.19) as on A100
 * (NVIDIA/nccl-tests#100, "Channel 23/24"). Assumed the same on B200. */
#define NCCL_NVLINK_CHANNELS 24
/* Across nodes, two for each NIC a ring crosses: the search finds a ring
 * a rail and doubles them (NCCL's maintainer in NVIDIA/nccl#524). With a
 * node's eight NICs that is 16: "If you are on DGX with 8 NICs ... then it
 * would use 16 SMs" (NVIDIA/nccl#689); rings "Channel 00/16" on 3 nodes of
 * 8 H100s (NVIDIA/nccl#1453). Eight GPUs behind one NIC: "Channel 00/02"
 * (NVIDIA/nccl-tests#133). HSDP's replica groups, one rank a node on its
 * own rail, get 2 by this; one-GPU GH200 nodes on one NIC logged 4
 * (NVIDIA/nccl#1291), so the estimate may be low for them. */
#define NCCL_NIC_CHANNELS 2
/* Each byte a rank receives crosses its HBM about three times: stored on
 * arrival, read back to be forwarded or reduced, and the user's buffer
 * written (all-gather) or read (reduce-scatter's own contribution). "300GB/s
 * needs to be multiplied by at least 2x for memory bandwidth, as we need to
 * store to memory, then read back from it. If you add reading from or
 * writing to user data, it can be 3x" (NCCL's maintainer, NVIDIA/nccl#1428,
 * on kernels running 1.8x longer beside an all-gather on A100s). */
#define NCCL_HBM_BYTES_PER_LINK_BYTE 3.0

/* ── cluster specs ── */

const char *sim_preset_list(void)
{
    const char *s = "";
    for (int i = 0; i < NPRESETS; i++)
        s = arena_printf("%s%s%s", s, i ? ", " : "", presets[i].key);
    return s;
}

static const SimGpu *find_preset(const char *key, size_t n)
{
    for (int i = 0; i < NPRESETS; i++)
        if (strlen(presets[i].key) == n && strncasecmp(presets[i].key, key, n) == 0)
            return &presets[i];
    return NULL;
}

/* ── calibration files: measured kernel rates ──
 * docs/simulator.md#calibration-files. One line each, `#` to the end of a
 * line is a comment (the sources):
 *   fsdpc-calibration 1
 *   gpu KEY                      the preset it was measured on
 *   op KIND CLASS BY RATE        BY: flops or bytes; RATE per second;
 *                                CLASS: any, or 1eN for ops whose work per
 *                                call (FLOPs or bytes, as BY) is in
 *                                [1eN, 1eN+1)
 * tools/calibrate.py writes them from a trainer's --trace-out. */
#define CALIB_ANY INT_MIN

typedef struct {
    OpKind kind;
    int decade;          /* CALIB_ANY, or N of class 1eN */
    bool by_flops;       /* the rate is FLOP/s; else bytes/s */
    double rate;
} CalibEntry;

struct SimCalib {
    const char *source;  /* the file, or "the built-in h200 calibration" */
    const char *gpu_key;
    CalibEntry *e;
    int n;
};

/* An arena array of n elements of `size` bytes with room for one more:
 * `a` itself, or a copy twice as large when it is full. */
static void *room_for_one(void *a, int n, int *cap, size_t size)
{
    if (n < *cap)
        return a;
    *cap = *cap ? 2 * *cap : 16;
    void *b = arena_alloc(size * (size_t)*cap);
    if (n)
        memcpy(b, a, size * (size_t)n);
    return b;
}

const char *embedded_calib_text(const char *name);   /* gen/calib.c */

static bool op_kind_named(const char *name, OpKind *k)
{
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(op_name((OpKind)i), name) == 0) {
            *k = (OpKind)i;
            return true;
        }
    return false;
}

/* Parses calibration text; NULL with "SOURCE:LINE: what" in msg. */
static SimCalib *calib_parse(const char *text, const char *source, char *msg, size_t msgsize)
{
    SimCalib *c = arena_alloc(sizeof *c);
    c->source = source;
    int cap = 0, line = 0;
    bool header = false;
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        line++;
        char *buf = arena_printf("%.*s", (int)len, p);
        p = eol ? eol + 1 : p + len;
        char *hash = strchr(buf, '#');
        if (hash)
            *hash = 0;
        char *tok[8];
        int nt = 0;
        for (char *t = strtok(buf, " \t\r"); t && nt < 8; t = strtok(NULL, " \t\r"))
            tok[nt++] = t;
        if (nt == 0)
            continue;
#define BAD(...)                                                              \
    do {                                                                      \
        char what_[256];                                                      \
        snprintf(what_, sizeof what_, __VA_ARGS__);                           \
        snprintf(msg, msgsize, "%s:%d: %s", source, line, what_);             \
        return NULL;                                                          \
    } while (0)
        if (!header) {
            if (nt != 2 || strcmp(tok[0], "fsdpc-calibration") != 0 || strcmp(tok[1], "1") != 0)
                BAD("not a calibration file: the first line must be `fsdpc-calibration 1` "
                    "(docs/simulator.md#calibration-files)");
            header = true;
        } else if (strcmp(tok[0], "gpu") == 0) {
            if (nt != 2 || c->gpu_key)
                BAD("`gpu` takes one preset name, once (e.g. gpu h200)");
            if (!find_preset(tok[1], strlen(tok[1])))
                BAD("gpu `%s` is not a preset (%s)", tok[1], sim_preset_list());
            c->gpu_key = tok[1];
        } else if (strcmp(tok[0], "op") == 0) {
            CalibEntry e;
            char *end;
            if (nt != 5)
                BAD("`op` takes KIND CLASS BY RATE, e.g. op matmul_dw any flops 4.1e14");
            if (!op_kind_named(tok[1], &e.kind))
                BAD("`%s` is not an op kind of fsdpc's (ops.def)", tok[1]);
            if (strcmp(tok[2], "any") == 0)
                e.decade = CALIB_ANY;
            else if (tok[2][0] == '1' && tok[2][1] == 'e' &&
                     (e.decade = (int)strtol(tok[2] + 2, &end, 10), *end == 0) && tok[2][2] &&
                     e.decade >= 0 && e.decade <= 30)
                ;
            else
                BAD("class `%s` must be `any` or 1eN (work per call in [1eN, 1eN+1)), N 0 to 30",
                    tok[2]);
            if (strcmp(tok[3], "flops") == 0)
                e.by_flops = true;
            else if (strcmp(tok[3], "bytes") == 0)
                e.by_flops = false;
            else
                BAD("`%s`: the rate is by `flops` or `bytes`", tok[3]);
            errno = 0;
            e.rate = strtod(tok[4], &end);
            if (*end || errno || !(e.rate > 0) || !isfinite(e.rate))
                BAD("rate `%s` must be a positive number (per second)", tok[4]);
            for (int i = 0; i < c->n; i++)
                if (c->e[i].kind == e.kind && c->e[i].decade == e.decade)
                    BAD("a second entry for %s class %s", tok[1], tok[2]);
            c->e = room_for_one(c->e, c->n, &cap, sizeof *c->e);
            c->e[c->n++] = e;
        } else {
            BAD("unknown line `%s`; a calibration has `gpu` and `op` lines", tok[0]);
        }
#undef BAD
    }
    if (!header || !c->gpu_key || c->n == 0) {
        snprintf(msg, msgsize, "%s: %s", source,
                 !header ? "empty: a calibration starts with `fsdpc-calibration 1`"
                 : !c->gpu_key ? "no `gpu` line naming the preset it was measured on"
                               : "no `op` lines");
        return NULL;
    }
    return c;
}

static SimCalib *calib_load(const char *path, char *msg, size_t msgsize)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, msgsize, "cannot read calibration %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *text = malloc(cap);
    for (size_t r; text && (r = fread(text + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *t = cap < ((size_t)1 << 24) ? realloc(text, cap *= 2) : NULL;
            if (!t) {
                free(text);
                text = NULL;
            } else {
                text = t;
            }
        }
    }
    bool err = ferror(f);
    fclose(f);
    if (!text || err) {
        snprintf(msg, msgsize, "cannot read calibration %s: %s", path,
                 text ? "a read failed" : "larger than 16 MiB");
        free(text);
        return NULL;
    }
    text[n] = 0;
    SimCalib *c = calib_parse(text, path, msg, msgsize);
    free(text);
    return c;
}

/* The calibration fsdpc carries for a preset (compiler/calib/KEY.calib). */
static SimCalib *calib_builtin(const SimGpu *gpu, const char *spec, char *msg, size_t msgsize)
{
    const char *text = embedded_calib_text(arena_printf("%s.calib", gpu->key));
    if (!text) {
        snprintf(msg, msgsize, "--sim %s: eff=measured: fsdpc carries no calibration for %s "
                               "(only h200's); build one from a trainer's --trace-out with "
                               "tools/calibrate.py and pass it as calib=FILE",
                 spec, gpu->key);
        return NULL;
    }
    return calib_parse(text, arena_printf("the built-in %s calibration (compiler/calib/%s.calib)",
                                          gpu->key, gpu->key),
                       msg, msgsize);
}

/* The entry for an op of this kind doing `flops` and `bytes` a call: its
 * class's, else the kind's `any`, else the kind's nearest class; NULL when
 * the kind has none. */
static const CalibEntry *calib_find(const SimCalib *c, OpKind kind, double flops, double bytes)
{
    const CalibEntry *any = NULL, *near = NULL;
    double best = INFINITY;
    for (int i = 0; i < c->n; i++) {
        const CalibEntry *e = &c->e[i];
        if (e->kind != kind)
            continue;
        if (e->decade == CALIB_ANY) {
            any = e;
            continue;
        }
        double w = e->by_flops ? flops : bytes;
        double d = w > 0 ? log10(w) : 0;
        if (floor(d) == e->decade)
            return e;
        double dist = fabs(d - (e->decade + 0.5));
        if (dist < best)
            best = dist, near = e;
    }
    return any ? any : near;
}

const char *sim_gpu_label(const SimCluster *c)
{
    return *c->variant ? arena_printf("%s (%s)", c->gpu->name, c->variant) : c->gpu->name;
}

SimCluster sim_default_cluster(int64_t world)
{
    const SimGpu *gpu = &presets[1];
    SimCluster c = {gpu, (world + NODE_MAX_GPUS - 1) / NODE_MAX_GPUS,
                    world < NODE_MAX_GPUS ? world : NODE_MAX_GPUS, world,
                    gpu->nics, gpu->nic_bytes_per_s, gpu->hbm_bytes_per_s, gpu->hbm_bytes,
                    gpu->nvlink_bytes_per_s, "", SIM_EFF_IDEAL, NULL};
    return c;
}

/* A setting's value as a whole number from 1 to max, or a positive number
 * (max < 0: a real, e.g. nic_gbps=200 or 12.5). */
static bool setting_number(const char *v, size_t n, double max, double *out)
{
    char num[32] = "";
    if (n == 0 || n >= sizeof num)
        return false;
    memcpy(num, v, n);
    num[n] = 0;
    char *e;
    errno = 0;
    double d = strtod(num, &e);
    if (*e || errno || !isdigit((unsigned char)num[0]) || !(d > 0) || !isfinite(d))
        return false;
    if (max > 0 && (d != floor(d) || d < 1 || d > max))
        return false;
    *out = d;
    return true;
}

/*   spec := preset [ ':' setting { ',' setting } ]
 *   setting := 'nodes' '=' integer | 'gpus' '=' integer | 'nics' '=' integer
 *            | 'nic_gbps' '=' number | 'hbm_gbs' '=' number
 *            | 'hbm_gib' '=' integer | 'nvlink_gbs' '=' number
 *            | 'eff' '=' ( 'ideal' | 'measured' ) | 'calib' '=' path */
bool sim_parse_cluster(const char *spec, SimCluster *c, char *msg, size_t msgsize)
{
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    const SimGpu *gpu = find_preset(spec, n);
    if (!gpu) {
        snprintf(msg, msgsize, "--sim %s: unknown preset `%.*s`; the presets are %s "
                               "(e.g. --sim h100, --sim h100:nodes=16, --sim a100:gpus=4)",
                 spec, (int)n, spec, sim_preset_list());
        return false;
    }
    double nodes = 1, gpus = NODE_MAX_GPUS, nics = gpu->nics, gbps = gpu->nic_bytes_per_s * 8 / 1e9;
    double hbm_gbs = gpu->hbm_bytes_per_s / 1e9, hbm_gib = (double)(gpu->hbm_bytes >> 30),
           nvlink_gbs = gpu->nvlink_bytes_per_s * 2 / 1e9;
    const char *variant = "";
    SimEff eff = SIM_EFF_IDEAL;
    bool eff_set = false;
    const char *calib_path = NULL;
    const char *p = colon ? colon + 1 : NULL;
    while (p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        size_t klen = eq ? (size_t)(eq - p) : len;
        const char *v = eq ? eq + 1 : p + len;
        size_t vlen = len - (size_t)(v - p);
#define KEY(s) (klen == sizeof(s) - 1 && strncmp(p, s, klen) == 0)
        double *dst = NULL, max = 0;
        const char *what = "";
        if (eq && KEY("nodes"))
            dst = &nodes, max = (double)((int64_t)1 << 24), what = "";
        else if (eq && KEY("gpus"))
            dst = &gpus, max = NODE_MAX_GPUS,
            what = " (a node has 8 GPUs on one NVLink switch)";
        else if (eq && KEY("nics"))
            dst = &nics, max = 64, what = " (NICs per node)";
        else if (eq && KEY("nic_gbps"))
            dst = &gbps, max = -1, what = " (each NIC's line rate in Gb/s, e.g. 400)";
        else if (eq && KEY("hbm_gbs"))
            dst = &hbm_gbs, max = -1, what = " (the GPU's memory bandwidth in GB/s, e.g. 2400)";
        else if (eq && KEY("hbm_gib"))
            dst = &hbm_gib, max = 65536, what = " (the GPU's memory in GiB)";
        else if (eq && KEY("nvlink_gbs"))
            dst = &nvlink_gbs, max = -1,
            what = " (NVLink's bandwidth in GB/s, both directions as datasheets print it, "
                   "e.g. 400 for an H800)";
        if (dst && (dst == &hbm_gbs || dst == &hbm_gib || dst == &nvlink_gbs))
            variant = arena_printf("%s%s%.*s", variant, *variant ? ", " : "", (int)len, p);
        if (dst) {
            if (!setting_number(v, vlen, max, dst)) {
                if (max > 0)
                    snprintf(msg, msgsize, "--sim %s: %.*s=%.*s: `%.*s` must be a whole number "
                                           "from 1 to %.0f%s",
                             spec, (int)klen, p, (int)vlen, v, (int)klen, p, max, what);
                else
                    snprintf(msg, msgsize, "--sim %s: %.*s=%.*s: `%.*s` must be a positive "
                                           "number%s",
                             spec, (int)klen, p, (int)vlen, v, (int)klen, p, what);
                return false;
            }
        } else if (eq && KEY("eff")) {
            if (vlen == 5 && strncmp(v, "ideal", 5) == 0)
                eff = SIM_EFF_IDEAL;
            else if (vlen == 8 && strncmp(v, "measured", 8) == 0)
                eff = SIM_EFF_MEASURED;
            else {
                snprintf(msg, msgsize, "--sim %s: eff=%.*s: `eff` is `ideal` (fractions of peak) "
                                       "or `measured` (a calibration's figures)",
                         spec, (int)vlen, v);
                return false;
            }
            eff_set = true;
        } else if (eq && KEY("calib")) {
            if (vlen == 0) {
                snprintf(msg, msgsize, "--sim %s: calib=: `calib` needs a calibration file",
                         spec);
                return false;
            }
            calib_path = arena_printf("%.*s", (int)vlen, v);
        } else {
            snprintf(msg, msgsize, "--sim %s: unknown setting `%.*s`; the settings are nodes=N, "
                                   "gpus=N (per node), nics=N (per node), nic_gbps=G (per NIC), "
                                   "hbm_gbs=G, hbm_gib=N, nvlink_gbs=G (a variant of the GPU), "
                                   "eff=ideal|measured and calib=FILE, e.g. --sim %s:nodes=16",
                     spec, (int)len, p, gpu->key);
            return false;
        }
#undef KEY
        p = end ? end + 1 : NULL;
    }
    if (nodes * gpus > (double)((int64_t)1 << 24)) {
        snprintf(msg, msgsize, "--sim %s: %.0f ranks is more than fsdpc sizes (%d)", spec,
                 nodes * gpus, 1 << 24);
        return false;
    }
    if (eff_set && eff == SIM_EFF_IDEAL && calib_path) {
        snprintf(msg, msgsize, "--sim %s: calib=%s asks for measured efficiencies and eff=ideal "
                               "for none; drop one",
                 spec, calib_path);
        return false;
    }
    const SimCalib *calib = NULL;
    if (calib_path || eff == SIM_EFF_MEASURED) {
        calib = calib_path ? calib_load(calib_path, msg, msgsize)
                           : calib_builtin(gpu, spec, msg, msgsize);
        if (!calib)
            return false;
        if (strcasecmp(calib->gpu_key, gpu->key) != 0) {
            snprintf(msg, msgsize, "--sim %s: calibration %s was measured on `%s`, not `%s`; "
                                   "a calibration holds for the GPU it was measured on",
                     spec, calib->source, calib->gpu_key, gpu->key);
            return false;
        }
        eff = SIM_EFF_MEASURED;
    }
    *c = (SimCluster){gpu, (int64_t)nodes, (int64_t)gpus, (int64_t)nodes * (int64_t)gpus,
                      (int64_t)nics, gbps * 1e9 / 8, hbm_gbs * 1e9, (int64_t)hbm_gib << 30,
                      nvlink_gbs * 1e9 / 2, variant, eff, calib};
    return true;
}

/* ── costs ── */

typedef enum { CAT_MATMUL, CAT_ATTENTION, CAT_MEMORY, CAT_OPTIMIZER, CAT_COUNT } CostCat;
_Static_assert(CAT_COUNT == sizeof(((Sim *)0)->cat_s) / sizeof(double), "Sim.cat_s by CostCat");

/* The tensor-core peak the step's compute dtype runs matmuls at: bf16
 * under a bf16 param policy; fp32 otherwise (fp16 gathers widen to fp32). */
static double matmul_peak(const Sim *sim)
{
    const SimGpu *gpu = sim->cluster.gpu;
    if (compute_dtype(sim->sched->plan->m) == DTYPE_BF16)
        return gpu->bf16_flops;
    return FP32_MATMUL_USES_TF32 ? gpu->tf32_flops : gpu->fp32_flops;
}

static double hbm_rate(const Sim *sim)
{
    return sim->cluster.hbm_bytes_per_s * HBM_EFFICIENCY;
}

/* Work on the compute stream as the roofline's two sides: seconds of
 * arithmetic at its unit's achievable peak, and seconds of memory traffic
 * at achievable HBM bandwidth. */
typedef struct {
    double compute_s, memory_s;
} Work;

/* The roofline with what collectives running beside the work leave of the
 * GPU: its arithmetic on 1 - sm_share of the SMs, its traffic on
 * 1 - hbm_share of the bandwidth, the slower of the two, and never under
 * KERNEL_MIN_S. With nothing beside it (0, 0) it is the plain roofline. */
static double work_seconds(Work w, double sm_share, double hbm_share)
{
    double tc = w.compute_s / (1 - sm_share), tm = w.memory_s / (1 - hbm_share);
    double t = tc > tm ? tc : tm;
    return t > KERNEL_MIN_S ? t : KERNEL_MIN_S;
}

/* An op's calibration entry under eff = measured; NULL otherwise, or for
 * a kind the calibration has no entry for (costed ideal: counted and
 * named in the summary). */
static const CalibEntry *calibration_of(const Sim *sim, const OpNode *op)
{
    const SimCluster *c = &sim->cluster;
    if (c->eff != SIM_EFF_MEASURED || !c->calib)
        return NULL;
    int64_t B = sim->sched->plan->micro_batch;
    return calib_find(c->calib, op->kind, op_flops(op, B), op_bytes(op, B));
}

static Work op_work(const Sim *sim, const OpNode *op, CostCat *cat)
{
    int64_t B = sim->sched->plan->micro_batch;
    double rate;
    switch (op->kind) {
    case OP_MATMUL:
    case OP_MATMUL_BIAS:        /* the bias rides in the product's epilogue */
    case OP_MATMUL_BIAS_GELU:   /* and so does the fused gelu */
    case OP_MATMUL_DX:
    case OP_MATMUL_DW:
        *cat = CAT_MATMUL;
        rate = matmul_peak(sim) * MATMUL_EFFICIENCY;
        break;
    case OP_ATTENTION:
    case OP_ATTENTION_BWD:
        *cat = CAT_ATTENTION;
        rate = matmul_peak(sim) * sim->cluster.gpu->attention_eff;
        break;
    default:
        *cat = CAT_MEMORY;
        rate = sim->cluster.gpu->fp32_flops * VECTOR_EFFICIENCY;
        break;
    }
    Work w = {op_flops(op, B) / rate, op_bytes(op, B) / hbm_rate(sim)};
    /* measured: the calibration's rate sets the side it was measured by;
     * the other keeps its ideal cost, which a kernel cannot beat */
    const CalibEntry *e = calibration_of(sim, op);
    if (e) {
        if (e->by_flops)
            w.compute_s = op_flops(op, B) / e->rate;
        else
            w.memory_s = op_bytes(op, B) / e->rate;
    }
    return w;
}

/* Elements of every group's shard on one rank. */
static double shard_elems(const Sim *sim, int group)
{
    Model *m = sim->sched->plan->m;
    double n = 0;
    for (int i = 0; i < m->ngroups; i++)
        if (group < 0 || i == group)
            n += (double)plan_shard_numel(m->groups[i], sim->cluster.world);
    return n;
}

/* Bytes per shard element the optimizer step moves, all fp32: AdamW reads
 * the parameter, gradient and both moments and writes parameter and
 * moments (4 reads + 3 writes); SGD with momentum 3 + 2; plain SGD 2 + 1. */
static double optimizer_bytes_per_elem(const TrainConfig *t)
{
    if (t->optimizer == OPT_ADAMW)
        return 7 * 4;
    return t->momentum > 0 ? 5 * 4 : 3 * 4;
}

/* ── collectives, as NCCL runs them ──
 * A group of n ranks whose members are `stride` ranks apart sits on
 * `nnodes` nodes with `ppn` members each (ranks fill nodes in order). NCCL
 * builds several channels, each a ring (or a pair of trees) through every
 * member, and across nodes each channel leaves a node through a NIC of its
 * own ("one rail per channel"): the rings of all channels together use
 * every NIC the group's GPUs have. So what bounds a ring's bus bandwidth is
 * the slower of NVLink (each GPU's one direction) and the node's NICs
 * that serve this group: all of a node's NICs when the group holds all its
 * GPUs, its share of them when the node's other GPUs run groups of their
 * own at the same time (HSDP's replica groups: one rank per node, one NIC
 * each). DGX-A100s with 8 x 200 Gb/s NICs measure 192 GB/s all-reduce bus
 * bandwidth across nodes (NVIDIA/nccl#812, #1576), eight NICs' worth; one
 * NIC's 25 GB/s would be an eighth of it. */
typedef struct {
    int64_t n, ppn, nnodes;
} GroupShape;

static GroupShape group_shape(const SimCluster *c, int64_t ranks, int64_t stride)
{
    int64_t g = c->gpus_per_node < 1 ? 1 : c->gpus_per_node;
    if (stride < 1)
        stride = 1;
    int64_t ppn = stride >= g ? 1 : g / stride;
    if (ppn > ranks)
        ppn = ranks;
    if (ppn < 1)
        ppn = 1;
    return (GroupShape){ranks, ppn, (ranks + ppn - 1) / ppn};
}

static double nvlink_bw(const SimCluster *c)
{
    return c->nvlink_bytes_per_s * NVLINK_EFFICIENCY;
}

/* The node's network bandwidth that serves one group: its share of the
 * node's NICs (all of them when the group holds every GPU of the node). */
/* A rank's rail: its share of its node's NICs. */
static double rail_bw(const SimCluster *c)
{
    return (double)c->nics * c->nic_bytes_per_s * IB_EFFICIENCY /
           (double)(c->gpus_per_node < 1 ? 1 : c->gpus_per_node);
}

static double net_bw(const SimCluster *c, GroupShape gs)
{
    return (double)gs.ppn * rail_bw(c);
}

/* The bus bandwidth of a ring through the group (nccl-tests' convention:
 * each rank's link rate), every channel on its own rail. */
static double ring_bw(const SimCluster *c, GroupShape gs)
{
    return gs.nnodes == 1 ? nvlink_bw(c) : fmin(nvlink_bw(c), net_bw(c, gs));
}

/* NCCL's ring (tuning.cc, Simple protocol): a base latency, one hop
 * latency per step, nsteps = n - 1 (all-gather, reduce-scatter) or 2(n - 1)
 * (all-reduce), of which nnodes - 1 (twice that for all-reduce) cross the
 * network; then the bus bytes at the ring's bus bandwidth. */
static double ring_seconds(const SimCluster *c, CollKind k, double bus_bytes, GroupShape gs)
{
    int64_t steps = gs.n - 1, inter = gs.nnodes - 1;
    if (k == COLL_ALL_REDUCE)
        steps *= 2, inter *= 2;
    double lat = NCCL_BASE_LAT_S + (double)(steps - inter) * c->gpu->nvlink_alpha_s +
                 (double)inter * c->gpu->ib_alpha_s;
    return lat + bus_bytes / ring_bw(c, gs);
}

/* NCCL's tree all-reduce (tuning.cc, Simple): a chain within each node and
 * a double binary tree across nodes, latency 2 x ((ppn - 1) intra-node hops
 * + log2(nnodes) network hops); its algorithm bandwidth is half of 0.92 of
 * the links' (each byte goes up and down), the links being NVLink on one or
 * two nodes (NCCL takes the intra-node bandwidth there, which is why a
 * two-node tree's bus bandwidth can exceed the NICs': nccl-tests#196,
 * NVIDIA/nccl#812) and the network beyond. Returns seconds for a buffer of
 * `buffer` bytes. */
static double tree_seconds(const SimCluster *c, double buffer, GroupShape gs)
{
    /* with one rank a node there is no intra-node link: the NICs are it */
    double links = gs.nnodes <= 2 && gs.ppn > 1 ? nvlink_bw(c) : fmin(nvlink_bw(c), net_bw(c, gs));
    double lat = NCCL_BASE_LAT_S + 2 * ((double)(gs.ppn - 1) * NCCL_TREE_NVLINK_LAT_S +
                                        ceil(log2((double)gs.nnodes)) * NCCL_TREE_NET_LAT_S);
    return lat + buffer / (0.5 * NCCL_TREE_BW_FACTOR * links);
}

const char *sim_algo_name(SimAlgo a)
{
    static const char *const names[] = {"none", "ring", "tree"};
    return names[a];
}

const char *sim_coll_name(CollKind k)
{
    static const char *const names[] = {"all-gather", "reduce-scatter", "all-reduce"};
    return names[k];
}

/* The bus bytes of a collective (nccl-tests' convention): what crosses
 * each rank's link, from each rank's contribution. */
static double bus_bytes(CollKind kind, double bytes, int64_t n)
{
    double f = (double)(n - 1) / (double)n;
    switch (kind) {
    case COLL_ALL_GATHER:
        return bytes * (double)(n - 1);   /* its shard from every other rank */
    case COLL_REDUCE_SCATTER:
        return bytes * f;
    case COLL_ALL_REDUCE:
        return bytes * 2 * f;
    }
    fsd_unreachable();
}

/* Chooses as NCCL does (tuning.cc: the predicted time of every algorithm
 * and protocol, the least wins), with the Simple protocol only (LL and
 * LL128 win below a few hundred KiB, which FSDP's buckets are not) and no
 * NVLink SHARP, CollNet or PAT: ring for all-gather and reduce-scatter
 * (NCCL has no tree for them), ring or tree for all-reduce. */
double sim_collective_detail(const SimCluster *c, CollKind kind, int64_t bytes, int64_t ranks,
                             int64_t stride, SimAlgo *algo, double *busbw)
{
    *algo = SIM_ALGO_NONE;
    *busbw = 0;
    if (ranks <= 1 || bytes <= 0)
        return 0;
    GroupShape gs = group_shape(c, ranks, stride);
    double bus = bus_bytes(kind, (double)bytes, ranks);
    double t = ring_seconds(c, kind, bus, gs);
    *algo = SIM_ALGO_RING;
    if (kind == COLL_ALL_REDUCE) {
        double tt = tree_seconds(c, (double)bytes, gs);
        if (tt < t)
            t = tt, *algo = SIM_ALGO_TREE;
    }
    *busbw = bus / t;
    return t;
}

double sim_group_collective_seconds(const SimCluster *c, CollKind kind, int64_t bytes,
                                    int64_t ranks, int64_t stride)
{
    SimAlgo a;
    double bw;
    return sim_collective_detail(c, kind, bytes, ranks, stride, &a, &bw);
}

/* The step's all-gathers and reduce-scatters span the whole world, and
 * the schedule gives each one's bus bytes (event_comm_bytes: (W-1)/W of
 * the padded buffer); a ring's time depends on those alone. */
double sim_collective_seconds(const SimCluster *c, int64_t bytes)
{
    if (c->world <= 1)
        return 0;
    return ring_seconds(c, COLL_REDUCE_SCATTER, (double)bytes, group_shape(c, c->world, 1));
}

/* A latency-bound all-reduce of one float (the global gradient norm) over
 * the whole world, the algorithm NCCL's model picks (a tree across nodes). */
static double scalar_allreduce_seconds(const SimCluster *c)
{
    return sim_group_collective_seconds(c, COLL_ALL_REDUCE, 4, c->world, 1);
}

/* The work event e does on the compute stream and its cost category;
 * CAT_COUNT for events that do none there (collectives, waits,
 * bookkeeping). The gradient norm's scalar all-reduce is latency, not
 * work: it comes back in *latency_s. */
static CostCat event_work(const Sim *sim, const Event *e, Work *w, double *latency_s)
{
    CostCat cat = CAT_OPTIMIZER;
    *w = (Work){0, 0};
    *latency_s = 0;
    switch (e->kind) {
    case EV_COMPUTE:
        *w = op_work(sim, e->op, &cat);
        break;
    case EV_GRAD_NORM:   /* one pass over the fp32 gradient shards */
        w->memory_s = shard_elems(sim, -1) * 4 / hbm_rate(sim);
        *latency_s = scalar_allreduce_seconds(&sim->cluster);
        break;
    case EV_OPTIMIZER:
        w->memory_s = shard_elems(sim, e->group) *
                      optimizer_bytes_per_elem(&sim->sched->plan->m->train) / hbm_rate(sim);
        break;
    default:
        cat = CAT_COUNT;
        break;
    }
    return cat;
}

/* The ranks a collective event runs over, and the stride between them:
 * plain FSDP's collectives span the world; under replicate = R
 * (docs/design.md#hsdp) all-gathers and reduce-scatters run over the
 * S = W/R consecutive ranks of a replica, the all-reduce over the R ranks S
 * apart; a partial gather over the N consecutive ranks that hold the copy
 * (intra-node when N fits in a node: the point of it). */
typedef struct {
    int64_t ranks, stride;
} EventGroup;

static EventGroup event_group(const Sim *sim, const Event *e)
{
    const Model *m = sim->sched->plan->m;
    int64_t W = sim->cluster.world, S = plan_shard_world(m, W);
    switch (e->kind) {
    case EV_GATHER_PARTIAL:
        return (EventGroup){m->groups[e->group]->reshard_ranks, 1};
    case EV_ALL_REDUCE:
        return (EventGroup){m->shard.replicate, S};
    default:
        return (EventGroup){S, 1};
    }
}

/* A collective event's time on its group (event_group). `moved` is what
 * event_comm_bytes counts; the group model takes what each rank
 * contributes. */
static double mesh_collective_seconds(const Sim *sim, const Event *e, int64_t moved,
                                      SimAlgo *algo, double *busbw)
{
    const Model *m = sim->sched->plan->m;
    const SimCluster *c = &sim->cluster;
    *algo = SIM_ALGO_NONE;
    *busbw = 0;
    if (moved == 0)
        return 0;
    EventGroup g = event_group(sim, e);
    if (m->shard.replicate <= 1 && e->kind != EV_ALL_REDUCE && e->kind != EV_GATHER_PARTIAL) {
        *algo = SIM_ALGO_RING;   /* NCCL has no tree for these */
        double t = sim_collective_seconds(c, moved);
        *busbw = t > 0 ? (double)moved / t : 0;
        return t;
    }
    const ShardGroup *sg = m->groups[e->group];
    int64_t shard = plan_shard_numel(sg, c->world), padded = plan_padded_numel(sg, c->world);
    switch (e->kind) {
    case EV_GATHER_PARTIAL:
        return sim_collective_detail(c, COLL_ALL_GATHER,
                                     padded / g.ranks * dtype_bytes(sg->param_dtype), g.ranks,
                                     g.stride, algo, busbw);
    case EV_ALL_GATHER:
        return sim_collective_detail(c, COLL_ALL_GATHER, shard * dtype_bytes(sg->param_dtype),
                                     g.ranks, g.stride, algo, busbw);
    case EV_REDUCE_SCATTER:
        return sim_collective_detail(c, COLL_REDUCE_SCATTER,
                                     padded * dtype_bytes(sg->reduce_dtype), g.ranks, g.stride,
                                     algo, busbw);
    case EV_ALL_REDUCE:
        return sim_collective_detail(c, COLL_ALL_REDUCE, shard * dtype_bytes(sg->reduce_dtype),
                                     g.ranks, g.stride, algo, busbw);
    default:
        fsd_unreachable();
    }
}

/* ── the links: collectives in flight share them ──
 * Each collective stream runs one collective at a time, in issue order; a
 * collective starts when it is issued and the one before it on its stream
 * has finished, and, as the runtime issues them, when the one before it on
 * its communicator has: NCCL runs a communicator's collectives one after
 * another whatever streams they are on ("NCCL collective operations on a
 * given communicator are always serialized; NCCL adds CUDA events to
 * enforce that": NVIDIA/nccl#574). The step's all-gathers and
 * reduce-scatters share the shard group's communicator (runtime/cuda_comm.c),
 * so they take turns; HSDP's replica all-reduce and a partial gather have
 * communicators of their own, so they can run beside the other stream, and
 * two collectives in flight together share the links they both use. A rank's
 * links are two: its NVLink (nvlink_bw) and its rail, its share of the
 * node's NICs (nics / gpus per node of them). A ring of gs.ppn ranks a
 * node that crosses nodes sends 1/ppn of its bytes over the rail (one hop
 * in ppn leaves the node on each channel, channels spread over the rails)
 * and the rest over NVLink; within a node it sends all of them over
 * NVLink. Each collective alone runs at its own rate (the collective model
 * above: `alone_s`); two together each get a fraction of it, max-min fair
 * under both links' capacities (fair_rates), and a collective's time
 * stretches by what it loses. The bus-bandwidth model's constants stay as
 * they are: sharing only ever slows a collective that has company
 * (docs/simulator.md#the-links). */
typedef struct {
    int ev;                 /* the schedule's event */
    int comm;               /* its communicator (event_comm) */
    int64_t seq;            /* its place in issue order */
    bool record;            /* the event's start and end go to the dumps */
    double alone_s;         /* its time with the links to itself */
    double left;            /* the fraction of its work still to do, at Net.t */
    double start_s;         /* as the latest plan has it */
    double link[2];         /* bytes a second it puts on NVLink and on the rail, alone */
    double sm_share;        /* the SMs its channels hold */
    double hbm_share;       /* of the achievable HBM bandwidth, alone */
} Coll;

typedef struct {
    Coll *c;
    int n, cap;
} CollQueue;

/* A stretch of the timeline in which the same collectives run at the same
 * rates: what the compute beside them loses (contended_seconds). */
typedef struct {
    double t0, t1;
    double sm_share, hbm_share;
} Piece;

typedef struct {
    double t;                       /* the time the queues' `left` is at */
    int64_t seq;                    /* collectives issued so far */
    CollQueue q[STREAM_COUNT];      /* pending collectives by stream; compute's stays empty */
    Piece *p;                       /* the plan from t on, in time order */
    int np, pcap;
} Net;

static void push_coll(CollQueue *q, Coll c)
{
    q->c = room_for_one(q->c, q->n, &q->cap, sizeof(Coll));
    q->c[q->n++] = c;
}

static void push_piece(Net *n, Piece p)
{
    if (n->np > 0 && n->p[n->np - 1].t1 == p.t0 && n->p[n->np - 1].sm_share == p.sm_share &&
        n->p[n->np - 1].hbm_share == p.hbm_share) {
        n->p[n->np - 1].t1 = p.t1;   /* one collective after another alike */
        return;
    }
    n->p = room_for_one(n->p, n->np, &n->pcap, sizeof(Piece));
    n->p[n->np++] = p;
}

/* The channels, so the SMs, NCCL gives a collective over a group of the
 * mesh: within one node, its NVLink count; across nodes, NCCL_NIC_CHANNELS
 * for each NIC the group's ranks on a node use, at most NCCL's MAXCHANNELS
 * (32). */
static int nccl_channels(const SimCluster *c, GroupShape gs)
{
    if (gs.nnodes == 1)
        return NCCL_NVLINK_CHANNELS;
    double nics = (double)c->nics * (double)gs.ppn /
                  (double)(c->gpus_per_node < 1 ? 1 : c->gpus_per_node);
    double ch = NCCL_NIC_CHANNELS * fmax(1, round(nics));
    return ch < 32 ? (int)ch : 32;
}

/* The communicator a collective event runs on, as the runtime chooses it:
 * the shard group's (the world's under plain FSDP) for all-gathers and
 * reduce-scatters, the replica group's for HSDP's all-reduce, one for each
 * partial resharding N. */
static int event_comm(const Sim *sim, const Event *e)
{
    if (e->kind == EV_ALL_REDUCE)
        return 1;
    if (e->kind == EV_GATHER_PARTIAL)
        return 2 + (int)sim->sched->plan->m->groups[e->group]->reshard_ranks;
    return 0;
}

static GroupShape event_shape(const Sim *sim, const Event *e)
{
    EventGroup g = event_group(sim, e);
    return group_shape(&sim->cluster, g.ranks, g.stride);
}

/* The fraction of its own rate each collective running together gets:
 * the fractions grow together until a link they use is full (each stops
 * at 1, its rate alone), and the others go on growing (progressive
 * filling, max-min fair in fractions of each one's own rate). Alone, a
 * collective's own rate fits both links, so it gets 1. */
static void fair_rates(const SimCluster *c, Coll *const run[], int n, double frac[])
{
    const double cap[2] = {nvlink_bw(c), rail_bw(c)};
    bool active[STREAM_COUNT];
    for (int i = 0; i < n; i++)
        frac[i] = 0, active[i] = run[i]->link[0] > 0 || run[i]->link[1] > 0;
    for (;;) {
        double d = INFINITY;   /* how far the active fractions can grow together */
        for (int i = 0; i < n; i++)
            if (active[i])
                d = fmin(d, 1 - frac[i]);
        if (d == INFINITY)
            break;
        double used[2] = {0, 0};
        for (int l = 0; l < 2; l++) {
            double grow = 0;   /* bytes a second on link l per unit of d */
            for (int i = 0; i < n; i++) {
                used[l] += run[i]->link[l] * frac[i];
                grow += active[i] ? run[i]->link[l] : 0;
            }
            if (grow > 0)
                d = fmin(d, fmax(0, cap[l] - used[l]) / grow);
        }
        for (int l = 0; l < 2; l++)
            for (int i = 0; i < n; i++)
                used[l] += active[i] ? run[i]->link[l] * d : 0;
        for (int i = 0; i < n; i++) {
            if (!active[i])
                continue;
            frac[i] += d;
            active[i] = frac[i] < 1 - 1e-12;
            for (int l = 0; l < 2; l++)
                if (run[i]->link[l] > 0 && used[l] >= cap[l] * (1 - 1e-12))
                    active[i] = false;   /* a link it uses is full */
        }
    }
    for (int i = 0; i < n; i++)
        frac[i] = n == 1 || !(run[i]->link[0] > 0 || run[i]->link[1] > 0) ? 1 : fmin(1, frac[i]);
}

/* Seconds work w takes from `start` on the compute stream, slowed while
 * collectives run beside it: piece by piece along the plan of the links
 * (Net.p), each piece at the roofline of what its collectives leave
 * (work_seconds). An all-gather and a reduce-scatter running together
 * both hold their SMs, so those shares add, and each moves HBM bytes at
 * the rate the links give it. Alone, or with nothing in flight, it is
 * exactly the plain roofline. The plan holds until the next collective is
 * issued, which is after this work: the compute stream issues it. */
static double contended_seconds(const Net *n, double start, Work w)
{
    double t = start, spent = 0, left = 1;   /* left: the fraction of w still to do */
    int i = 0;
    for (;;) {
        while (i < n->np && n->p[i].t1 <= t)
            i++;
        double sm = 0, hbm = 0, next = INFINITY;   /* next: when what runs beside changes */
        if (i < n->np && n->p[i].t0 <= t)
            sm = n->p[i].sm_share, hbm = n->p[i].hbm_share, next = n->p[i].t1;
        else if (i < n->np)
            next = n->p[i].t0;
        double whole = work_seconds(w, sm, hbm);
        if (t + left * whole <= next)
            return spent + left * whole;
        spent += next - t;
        left -= (next - t) / whole;
        t = next;
    }
}

/* ── replay ──
 * Compute events run back to back on the compute stream. A collective is
 * issued when the compute stream reaches it (the event recorded there
 * completes when the work before it has) and runs on the links (Net); it
 * does not depend on the compute beside it, but slows it
 * (contended_seconds). A wait holds the compute stream until that group's
 * latest collective of its kind has finished; the time it holds is exposed
 * communication. Reshard, allocation and free events are bookkeeping and
 * take no time. */

/* What the replay carries from one event to the next: each stream's
 * clock, when each group's latest all-gather and reduce-scatter finish,
 * and the collectives on the links. */
typedef struct {
    double now[STREAM_COUNT];
    double *gather_done, *reduce_done;   /* by group */
    Net net;
} Replay;

/* Runs the links' queues from r->net.t to `until` (INFINITY: until every
 * collective has finished): the heads of both streams, a communicator's
 * one at a time in issue order, together at their fair rates, writing each
 * collective's start and end as it goes. To plan
 * (`plan`): the queues stay as they are; the pieces of the timeline are
 * written, and each collective's finish as the replay sees it until the
 * next issue (its stream's clock, its group's done time, the dumps'
 * start and end). Otherwise the queues move on to `until`: `left` drops,
 * the finished collectives leave, their busy time is counted. Both follow
 * the same steps, so what a plan says of the time before the next issue
 * is what happens. */
static void net_run(Sim *sim, Replay *r, double until, bool plan)
{
    const SimCluster *c = &sim->cluster;
    Net *n = &r->net;
    int head[STREAM_COUNT] = {0};
    double left[STREAM_COUNT] = {0};
    double t = n->t;
    if (plan)
        n->np = 0;
    for (int st = STREAM_GATHER; st < STREAM_COUNT; st++)
        if (n->q[st].n)
            left[st] = n->q[st].c[0].left;
    for (;;) {
        Coll *run[STREAM_COUNT];
        int sts[STREAM_COUNT], k = 0;
        for (int st = STREAM_GATHER; st < STREAM_COUNT; st++) {
            if (head[st] == n->q[st].n)
                continue;
            Coll *h = &n->q[st].c[head[st]];
            bool turn = true;   /* no earlier one on its communicator is waiting */
            for (int o = STREAM_GATHER; o < STREAM_COUNT; o++)
                if (o != st && head[o] < n->q[o].n && n->q[o].c[head[o]].comm == h->comm &&
                    n->q[o].c[head[o]].seq < h->seq)
                    turn = false;
            if (!turn)
                continue;
            if (left[st] == 1)
                h->start_s = t;   /* starts now (or, planned again, still at t) */
            sts[k] = st, run[k++] = h;
        }
        if (k == 0 || t >= until)
            break;
        double frac[STREAM_COUNT], next = until, fin[STREAM_COUNT];
        fair_rates(c, run, k, frac);
        for (int i = 0; i < k; i++) {
            fin[i] = t + left[sts[i]] * run[i]->alone_s / frac[i];
            next = fmin(next, fin[i]);
        }
        if (plan && next > t) {
            Piece p = {t, next, 0, 0};
            for (int i = 0; i < k; i++)
                p.sm_share += run[i]->sm_share, p.hbm_share += run[i]->hbm_share * frac[i];
            push_piece(n, p);
        }
        for (int i = 0; i < k; i++) {
            int st = sts[i];
            Coll *h = run[i];
            if (fin[i] > next) {
                left[st] -= (next - t) * frac[i] / h->alone_s;
                continue;
            }
            if (plan) {
                r->now[st] = next;
                const Event *e = &sim->sched->ev[h->ev];
                (event_is_gather(e->kind) ? r->gather_done : r->reduce_done)[e->group] = next;
                if (h->record) {
                    sim->start_s[h->ev] = h->start_s;
                    sim->end_s[h->ev] = next;
                }
            } else {
                sim->busy_s[st] += next - h->start_s;
            }
            head[st]++;
            left[st] = head[st] < n->q[st].n ? n->q[st].c[head[st]].left : 0;
        }
        t = next;
    }
    if (plan)
        return;
    for (int st = STREAM_GATHER; st < STREAM_COUNT; st++) {
        CollQueue *q = &n->q[st];
        if (head[st] < q->n)
            q->c[head[st]].left = left[st];
        if (head[st] > 0)
            memmove(q->c, q->c + head[st], sizeof(Coll) * (size_t)(q->n - head[st]));
        q->n -= head[st];
    }
    n->t = until;
}

/* The links moved on to the compute stream's time t, and planned from it. */
static void net_sync(Sim *sim, Replay *r, double t)
{
    net_run(sim, r, t, false);
    net_run(sim, r, INFINITY, true);
}

/* Issues collective event e at the compute stream's time `t`. */
static void issue(Sim *sim, Replay *r, int i, bool record, double t)
{
    const Event *e = &sim->sched->ev[i];
    const SimCluster *c = &sim->cluster;
    StreamId st = event_stream(e->kind);
    int64_t bytes = event_comm_bytes(sim->sched, e, c->world);
    SimAlgo algo;
    double busbw, dur = mesh_collective_seconds(sim, e, bytes, &algo, &busbw);
    sim->algo_runs[st][algo]++;
    sim->bytes[st] += bytes;
    GroupShape gs = event_shape(sim, e);
    double ppn = (double)gs.ppn, rate = dur > 0 ? busbw : 0;
    Coll k = {.ev = i, .comm = event_comm(sim, e), .seq = r->net.seq++, .record = record,
              .alone_s = dur, .left = 1,
              /* across nodes, one hop in ppn on the rail, the rest on NVLink */
              .link = {gs.nnodes == 1 ? rate : rate * (ppn - 1) / ppn,
                       gs.nnodes == 1 ? 0 : rate / ppn},
              .sm_share = (double)nccl_channels(c, gs) / gpu_sms(c->gpu),
              .hbm_share = dur > 0 ? NCCL_HBM_BYTES_PER_LINK_BYTE * (double)bytes / dur / hbm_rate(sim)
                                   : 0};
    net_run(sim, r, t, false);
    push_coll(&r->net.q[st], k);
    net_run(sim, r, INFINITY, true);
}

/* Replays event i of the schedule from state r, adding to the step's
 * totals; its start and end are recorded when `record` (the first time a
 * pattern's event runs). */
static void replay_event(Sim *sim, Replay *r, int i, bool record)
{
    Schedule *s = sim->sched;
    const Event *e = &s->ev[i];
    double start = r->now[STREAM_COMPUTE], dur = 0;
    CostCat cat = CAT_COUNT;
    bool mem_bound = false;
    switch (e->kind) {
    case EV_COMPUTE:
    case EV_GRAD_NORM:
    case EV_OPTIMIZER: {
        Work w;
        double latency;
        cat = event_work(sim, e, &w, &latency);
        dur = contended_seconds(&r->net, start, w) + latency;
        mem_bound = w.memory_s > w.compute_s;
        break;
    }
    case EV_ALL_GATHER:
    case EV_GATHER_PARTIAL:
    case EV_REDUCE_SCATTER:
    case EV_ALL_REDUCE:
        /* a replica all-reduce follows its reduce-scatter on the reduce
         * stream: the wait is for both */
        issue(sim, r, i, record, start);
        return;   /* its start and end are the links' (net_run) */
    case EV_WAIT_GATHER:
    case EV_WAIT_REDUCE: {
        double done = (e->kind == EV_WAIT_GATHER ? r->gather_done : r->reduce_done)[e->group];
        if (done > start) {
            dur = done - start;
            if (e->kind == EV_WAIT_GATHER)
                sim->exposed_gather_s += dur;
            else
                sim->exposed_reduce_s += dur;
        }
        break;
    }
    case EV_KEEP_PARTIAL: {
        /* a device copy of the rank's 1/N slice: read and written once */
        const ShardGroup *sg = s->plan->m->groups[e->group];
        dur = 2.0 * (double)(plan_padded_numel(sg, sim->cluster.world) / sg->reshard_ranks *
                             dtype_bytes(sg->param_dtype)) /
              hbm_rate(sim);
        break;
    }
    case EV_RESHARD:
    case EV_ALLOC_GRADS:
    case EV_FREE_GRADS:
        break;
    case EV_COUNT:
        fsd_unreachable();
    }
    if (record) {
        sim->start_s[i] = start;
        sim->end_s[i] = start + dur;
        sim->mem_bound[i] = mem_bound;
    }
    r->now[STREAM_COMPUTE] = start + dur;
    if (cat != CAT_COUNT) {
        sim->compute_s += dur;
        sim->busy_s[STREAM_COMPUTE] += dur;
        sim->cat_s[cat] += dur;
    }
}

/* The state as the rest of a replay sees it, relative to the compute
 * stream's time t: a stream clock, or a collective's end, at or before t
 * delays nothing (whatever comes next starts at t or later), so each is
 * max(0, x - t); and the collectives still on the links, relative to t.
 * Two states with the same key replay the same events alike, shifted by
 * the difference of their t (the replay depends on time differences only).
 * Written into k, which grows as needed; call after net_sync(t). */
typedef struct {
    double *v;
    int n, cap;
} StateKey;

static void state_key(const Replay *r, int ngroups, StateKey *k)
{
    double t = r->now[STREAM_COMPUTE];
    int n = 2 + 2 * ngroups + 2;
    for (int st = STREAM_GATHER; st < STREAM_COUNT; st++)
        n += 10 * r->net.q[st].n;
    if (n > k->cap) {
        k->cap = 2 * n;
        k->v = arena_alloc(sizeof(double) * (size_t)k->cap);
    }
    double *v = k->v;
    int j = 0;
    for (int st = STREAM_GATHER; st < STREAM_COUNT; st++)
        v[j++] = fmax(0, r->now[st] - t);
    for (int g = 0; g < ngroups; g++) {
        v[j++] = fmax(0, r->gather_done[g] - t);
        v[j++] = fmax(0, r->reduce_done[g] - t);
    }
    for (int st = STREAM_GATHER; st < STREAM_COUNT; st++) {
        const CollQueue *q = &r->net.q[st];
        v[j++] = q->n;
        for (int f = 0; f < q->n; f++) {
            const Coll *c = &q->c[f];
            v[j++] = c->ev;
            v[j++] = c->comm;
            v[j++] = (double)(r->net.seq - c->seq);
            v[j++] = c->left;
            v[j++] = c->left < 1 ? c->start_s - t : 0;
            v[j++] = c->alone_s;
            v[j++] = c->link[0];
            v[j++] = c->link[1];
            v[j++] = c->sm_share;
            v[j++] = c->hbm_share;
        }
    }
    k->n = j;
}

/* Whether two keys are the same state: equal up to the rounding of times
 * measured from different origins (a relative 1e-13 of the later one's
 * time t, far below anything the dumps print). */
static bool same_state(const StateKey *a, const StateKey *b, double t)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (fabs(a->v[i] - b->v[i]) > 1e-13 * t)
            return false;
    return true;
}

/* Moves every time of the state dt later. */
static void shift_state(Replay *r, int ngroups, double dt)
{
    for (int st = 0; st < STREAM_COUNT; st++) {
        r->now[st] += dt;
        for (int f = 0; f < r->net.q[st].n; f++) {
            r->net.q[st].c[f].start_s += dt;
        }
    }
    for (int i = 0; i < r->net.np; i++)
        r->net.p[i].t0 += dt, r->net.p[i].t1 += dt;
    r->net.t += dt;
    for (int g = 0; g < ngroups; g++) {
        r->gather_done[g] += dt;
        r->reduce_done[g] += dt;
    }
}

/* The step's totals grown by k times what they grew by from `before` to
 * `after` (one run of micro-batch 1). */
static void add_runs(Sim *sim, const Sim *before, const Sim *after, int64_t k)
{
    double kd = (double)k;
    sim->compute_s += kd * (after->compute_s - before->compute_s);
    for (int c = 0; c < CAT_COUNT; c++)
        sim->cat_s[c] += kd * (after->cat_s[c] - before->cat_s[c]);
    sim->exposed_gather_s += kd * (after->exposed_gather_s - before->exposed_gather_s);
    sim->exposed_reduce_s += kd * (after->exposed_reduce_s - before->exposed_reduce_s);
    for (int st = 0; st < STREAM_COUNT; st++) {
        sim->busy_s[st] += kd * (after->busy_s[st] - before->busy_s[st]);
        sim->bytes[st] += k * (after->bytes[st] - before->bytes[st]);
        for (int a = 0; a < 3; a++)
            sim->algo_runs[st][a] += k * (after->algo_runs[st][a] - before->algo_runs[st][a]);
    }
}

/* A pattern's micro-batch 1 (events [from, to)) runs s->repeat times. Its
 * timing may depend on what the one before left running (collectives
 * overlapping the next micro-batch's compute), so it is replayed run after
 * run until a run leaves the state it found, relative to the compute
 * stream's time (state_key); from then on every run is the same, shifted
 * by that run's duration, and the rest are added at once: the clocks move
 * by their number times the duration, the totals by their number times
 * the run's. Today every micro-batch ends with nothing in flight (every
 * all-gather is waited in its phase, the last reduce-scatter at the
 * micro-batch's end), so the first run already leaves the state it found;
 * a schedule that prefetched across micro-batches would take a few runs
 * more. The first run is the one recorded for the dumps and the trace. */
static void replay_middle(Sim *sim, Replay *r, int from, int to)
{
    int G = sim->sched->plan->m->ngroups;
    StateKey keys[2] = {{0}}, *key = &keys[0], *next = &keys[1];
    net_sync(sim, r, r->now[STREAM_COMPUTE]);
    state_key(r, G, key);
    for (int run = 1; run <= sim->sched->repeat; run++) {
        Sim before = *sim;
        double t0 = r->now[STREAM_COMPUTE];
        for (int i = from; i < to; i++)
            replay_event(sim, r, i, run == 1);
        sim->replayed_runs = run;
        if (run == 1)
            sim->elided_from_s = r->now[STREAM_COMPUTE];
        net_sync(sim, r, r->now[STREAM_COMPUTE]);
        state_key(r, G, next);
        int64_t left = sim->sched->repeat - run;
        if (left > 0 && same_state(key, next, r->now[STREAM_COMPUTE])) {
            Sim after = *sim;
            shift_state(r, G, (double)left * (r->now[STREAM_COMPUTE] - t0));
            add_runs(sim, &before, &after, left);
            break;
        }
        StateKey *t = key;
        key = next, next = t;
    }
}

Sim *sim_run(Schedule *s, const SimCluster *c)
{
    Sim *sim = arena_alloc(sizeof *sim);
    sim->sched = s;
    sim->cluster = *c;
    Plan *p = s->plan;
    Model *m = p->m;
    int64_t W = c->world;
    sim->start_s = arena_alloc(sizeof(double) * (size_t)(s->nev + 1));
    sim->end_s = arena_alloc(sizeof(double) * (size_t)(s->nev + 1));
    sim->mem_bound = arena_alloc(sizeof(bool) * (size_t)(s->nev + 1));
    Replay r = {.gather_done = arena_alloc(sizeof(double) * (size_t)m->ngroups),
                .reduce_done = arena_alloc(sizeof(double) * (size_t)m->ngroups)};

    for (int i = 0; i < s->nev;) {
        if (schedule_runs(s, &s->ev[i]) == 1) {
            replay_event(sim, &r, i++, true);
            continue;
        }
        int end = i;
        while (end < s->nev && s->ev[end].micro == s->ev[i].micro)
            end++;
        replay_middle(sim, &r, i, end);
        sim->elided_to_s = r.now[STREAM_COMPUTE];
        i = end;
    }
    /* which ops the calibration costed, and the kinds it could not */
    sim->uncalibrated = "";
    int seen[OP_COUNT] = {0};
    if (c->eff == SIM_EFF_MEASURED)
        for (int i = 0; i < s->nev; i++) {
            const Event *e = &s->ev[i];
            if (e->kind != EV_COMPUTE)
                continue;
            int64_t runs = schedule_runs(s, e);
            if (calibration_of(sim, e->op)) {
                sim->calib_ops += runs;
                continue;
            }
            sim->ideal_ops += runs;
            if (seen[e->op->kind]++)
                continue;
            const char *k = op_name(e->op->kind);
            sim->uncalibrated = sim->uncalibrated[0]
                                    ? arena_printf("%s, %s", sim->uncalibrated, k)
                                    : k;
        }
    net_run(sim, &r, INFINITY, false);   /* the busy time of the last collectives */
    double end = 0;
    for (int st = 0; st < STREAM_COUNT; st++)
        end = r.now[st] > end ? r.now[st] : end;
    sim->step_s = end;
    sim->exposed_s = sim->exposed_gather_s + sim->exposed_reduce_s;

    /* MFU counts the planner's FLOPs (ops.def: matmuls 2 per multiply-add,
     * causal attention only its unmasked half) for every op of every
     * micro-batch, over the peak matmuls run at: the same convention the
     * trainer logs (docs/design.md#flops-and-mfu). The optimizer counts
     * nothing, and neither do recompute ops: MFU counts the model's FLOPs,
     * as PaLM's definition (which torchtitan and MosaicML follow) does.
     * HFU, the hardware FLOPs utilisation, counts them: what the GPU ran. */
    Graph *g = p->g;
    sim->model_flops = graph_model_flops(g, p->micro_batch) * s->micro_batches;
    sim->hw_flops = graph_flops(g, 0, g->nops, p->micro_batch) * s->micro_batches;
    sim->peak_flops = matmul_peak(sim);
    sim->mfu = sim->step_s > 0 ? sim->model_flops / (sim->step_s * sim->peak_flops) : 0;
    sim->hfu = sim->step_s > 0 ? sim->hw_flops / (sim->step_s * sim->peak_flops) : 0;
    sim->tokens_per_step = (double)p->micro_batch * (double)m->seq * s->micro_batches;
    sim->tokens_per_s_gpu = sim->step_s > 0 ? sim->tokens_per_step / sim->step_s : 0;
    sim->tokens_per_s = sim->tokens_per_s_gpu * (double)W;
    return sim;
}

/* ── --sim: the summary ── */

static const char *ms(double s) { return arena_printf("%10.3f ms", s * 1e3); }

static const char *human_rate(double v, const char *unit)
{
    if (v >= 1e15)
        return arena_printf("%.3g P%s", v / 1e15, unit);
    if (v >= 1e12)
        return arena_printf("%.4g T%s", v / 1e12, unit);
    return arena_printf("%.4g G%s", v / 1e9, unit);
}

static const char *gib(double b) { return arena_printf("%.2f GiB", b / (double)(1 << 30)); }

/* Seconds the compute stream lost to the collectives beside it: its work's
 * time in the replay less the same work's time alone on the GPU. */
static double contention_seconds(const Sim *sim)
{
    double alone = 0;
    for (int i = 0; i < sim->sched->nev; i++) {
        Work w;
        double latency;
        const Event *e = &sim->sched->ev[i];
        if (event_work(sim, e, &w, &latency) != CAT_COUNT)
            alone += (double)schedule_runs(sim->sched, e) * (work_seconds(w, 0, 0) + latency);
    }
    return fmax(0, sim->compute_s - alone);   /* never below 0 by rounding */
}

/* The SMs each kind of collective the schedule runs holds: "24 of 132 SMs
 * each" when all hold the same, else "all-gather 24, all-reduce 2 of 132
 * SMs" */
static const char *channel_summary(const Sim *sim)
{
    static const EventKind kinds[] = {EV_ALL_GATHER, EV_GATHER_PARTIAL, EV_REDUCE_SCATTER,
                                      EV_ALL_REDUCE};
    static const char *const names[] = {"all-gather", "partial all-gather", "reduce-scatter",
                                        "all-reduce"};
    int ch[4] = {0}, first = 0;
    bool same = true;
    for (int i = 0; i < sim->sched->nev; i++)
        for (int k = 0; k < 4; k++)
            if (sim->sched->ev[i].kind == kinds[k] && !ch[k])
                ch[k] = nccl_channels(&sim->cluster, event_shape(sim, &sim->sched->ev[i]));
    for (int k = 0; k < 4; k++)
        if (ch[k]) {
            same = same && (!first || ch[k] == first);
            first = first ? first : ch[k];
        }
    if (same)
        return arena_printf("%d of %d SMs each",
                            first ? first
                                  : nccl_channels(&sim->cluster,
                                                  group_shape(&sim->cluster, sim->cluster.world, 1)),
                            gpu_sms(sim->cluster.gpu));
    const char *list = "";
    for (int k = 0; k < 4; k++)
        if (ch[k])
            list = arena_printf("%s%s%s %d", list, *list ? ", " : "", names[k], ch[k]);
    return arena_printf("%s of %d SMs", list, gpu_sms(sim->cluster.gpu));
}

static const char *const track_names[STREAM_COUNT] = {"compute", "all-gather", "reduce-scatter"};

/* "ring" or "ring 3, tree 1": the algorithms a stream's collectives ran */
static const char *algo_summary(const int64_t runs[3])
{
    const char *s = "";
    int kinds = (runs[SIM_ALGO_RING] > 0) + (runs[SIM_ALGO_TREE] > 0);
    for (int a = SIM_ALGO_RING; a <= SIM_ALGO_TREE; a++)
        if (runs[a])
            s = kinds == 1 ? sim_algo_name((SimAlgo)a)
                           : arena_printf("%s%s%s %" PRId64, s, s[0] ? ", " : "",
                                          sim_algo_name((SimAlgo)a), runs[a]);
    return s;
}

void sim_dump(FILE *out, const Sim *sim, const MemPlan *mp)
{
    const SimCluster *c = &sim->cluster;
    const SimGpu *gpu = c->gpu;
    Plan *p = sim->sched->plan;
    Model *m = p->m;
    bool multi = c->world > c->gpus_per_node;
    fprintf(out, "simulation %s on %" PRId64 " node%s x %" PRId64 " %s (world %" PRId64 ")\n",
            m->name, c->nodes, c->nodes == 1 ? "" : "s", c->gpus_per_node, sim_gpu_label(c),
            c->world);
    fprintf(out, "  per GPU: matmul peak %s (%s), HBM %s; NVLink %s per direction\n",
            human_rate(sim->peak_flops, "FLOP/s"),
            compute_dtype(m) == DTYPE_BF16 ? "bf16" : FP32_MATMUL_USES_TF32 ? "tf32" : "fp32",
            human_rate(c->hbm_bytes_per_s, "B/s"), human_rate(c->nvlink_bytes_per_s, "B/s"));
    if (multi)
        fprintf(out, "  per node: %" PRId64 " NIC%s of %s (%.0f Gb/s) each, one rail per ring "
                     "channel\n",
                c->nics, c->nics == 1 ? "" : "s", human_rate(c->nic_bytes_per_s, "B/s"),
                c->nic_bytes_per_s * 8 / 1e9);
    if (c->eff == SIM_EFF_MEASURED)
        fprintf(out, "  kernels: measured, from %s: %" PRId64 " of %" PRId64 " op runs%s%s%s\n",
                c->calib->source, sim->calib_ops, sim->calib_ops + sim->ideal_ops,
                sim->ideal_ops ? "; the others (" : "", sim->uncalibrated,
                sim->ideal_ops ? ") at the ideal fractions" : "");
    else
        fprintf(out, "  kernels: ideal: matmul %.0f%%, attention %.0f%% of peak; HBM %.0f%%\n",
                MATMUL_EFFICIENCY * 100, gpu->attention_eff * 100, HBM_EFFICIENCY * 100);
    fprintf(out, "  links: NVLink %.0f%%%s of line rate\n", NVLINK_EFFICIENCY * 100,
            multi ? arena_printf(", InfiniBand %.0f%%", IB_EFFICIENCY * 100) : "");
    fprintf(out, "  %-16s %s  (%d micro-batch%s of %" PRId64 " x %" PRId64 " tokens)\n", "step",
            ms(sim->step_s), sim->sched->micro_batches, sim->sched->micro_batches == 1 ? "" : "es",
            p->micro_batch,
            m->seq);
    fprintf(out, "  %-16s %s  (matmul %.3f, attention %.3f, memory-bound ops %.3f, "
                 "optimizer %.3f ms)\n",
            "compute", ms(sim->compute_s), sim->cat_s[CAT_MATMUL] * 1e3,
            sim->cat_s[CAT_ATTENTION] * 1e3, sim->cat_s[CAT_MEMORY] * 1e3,
            sim->cat_s[CAT_OPTIMIZER] * 1e3);
    fprintf(out, "  %-16s %s  (of compute: the collectives beside it hold %s and move "
                 "%.0f HBM bytes per byte received)\n",
            "contention", ms(contention_seconds(sim)), channel_summary(sim),
            NCCL_HBM_BYTES_PER_LINK_BYTE);
    fprintf(out, "  %-16s %s  (waiting on all-gather %.3f, reduce-scatter %.3f ms; %.1f%% of "
                 "the step)\n",
            "exposed comm", ms(sim->exposed_s), sim->exposed_gather_s * 1e3,
            sim->exposed_reduce_s * 1e3,
            sim->step_s > 0 ? 100 * sim->exposed_s / sim->step_s : 0.0);
    for (int st = STREAM_GATHER; st < STREAM_COUNT; st++) {
        fprintf(out, "  %-16s %s busy  %s bytes per rank\n", track_names[st], ms(sim->busy_s[st]),
                fmt_count(sim->bytes[st]));
        if (sim->busy_s[st] > 0)
            fprintf(out, "  %-16s %s, bus bandwidth %s (its bytes over its busy time: latency "
                         "and sharing the links included)\n",
                    "", algo_summary(sim->algo_runs[st]),
                    human_rate((double)sim->bytes[st] / sim->busy_s[st], "B/s"));
    }
    /* HSDP: the reduce stream's bytes include the replica all-reduces;
     * the mesh line splits them out, only then, so other dumps keep
     * their form */
    if (m->shard.replicate > 1) {
        int64_t R = m->shard.replicate, S = plan_shard_world(m, c->world), ar = 0;
        const Schedule *s = sim->sched;
        for (int i = 0; i < s->nev; i++)
            if (s->ev[i].kind == EV_ALL_REDUCE)
                ar += event_comm_bytes(s, &s->ev[i], c->world) * schedule_runs(s, &s->ev[i]);
        fprintf(out, "  %-16s replicate %" PRId64 " x shard %" PRId64 ": shard groups %s, "
                     "replica all-reduce %s bytes per rank (of the reduce stream's) %s\n",
                "mesh", R, S, S <= c->gpus_per_node ? "within a node" : "across nodes",
                fmt_count(ar), S >= c->gpus_per_node ? "across nodes" : "within a node");
    }
    /* partial resharding: the gather stream's bytes include the gathers
     * from the copies; split out only then, as the mesh line above */
    {
        const Schedule *s = sim->sched;
        int64_t pg = 0, most = 0;
        for (int i = 0; i < s->nev; i++)
            if (s->ev[i].kind == EV_GATHER_PARTIAL) {
                pg += event_comm_bytes(s, &s->ev[i], c->world) * schedule_runs(s, &s->ev[i]);
                if (m->groups[s->ev[i].group]->reshard_ranks > most)
                    most = m->groups[s->ev[i].group]->reshard_ranks;
            }
        if (pg > 0)
            fprintf(out, "  %-16s gather_partial %s bytes per rank (of the gather stream's) "
                         "within N ranks (N up to %" PRId64 ": %s), from the copies "
                         "reshard_after_forward = N keeps\n",
                    "reshard", fmt_count(pg), most,
                    most <= c->gpus_per_node ? "within a node" : "across nodes");
    }
    double n6 = 6.0 * (double)m->numel * sim->tokens_per_step;
    fprintf(out, "  %-16s %9.1f%%  (%s counted FLOPs per rank per step; by 6*N*tokens: %.1f%%)\n",
            "MFU", sim->mfu * 100, human_rate(sim->model_flops, "FLOP"),
            sim->step_s > 0 ? 100 * n6 / (sim->step_s * sim->peak_flops) : 0.0);
    fprintf(out, "  %-16s %9.1f%%  (%s FLOPs run per rank per step, recompute ops included)\n",
            "HFU", sim->hfu * 100, human_rate(sim->hw_flops, "FLOP"));
    fprintf(out, "  %-16s %10.0f per GPU, %.0f in total\n", "tokens/s", sim->tokens_per_s_gpu,
            sim->tokens_per_s);
    if (mp)
        fprintf(out, "  %-16s %10s peak of %s HBM per GPU%s\n", "memory", gib((double)mp->peak),
                gib((double)c->hbm_bytes),
                mp->peak > c->hbm_bytes ? "  -- DOES NOT FIT" : "");
}

/* ── --trace: Chrome trace (Trace Event Format) ──
 * One process, one thread per stream; complete events ("ph": "X") with
 * "ts" and "dur" in microseconds. Perfetto and chrome://tracing open it. */

/* s as a JSON string, quoted; escaped as the runtime's trace escapes its
 * names (runtime/jsonout.c, linked into fsdpc too) */
static void json_str(FILE *out, const char *s)
{
    fputc('"', out);
    json_put_chars(out, s);
    fputc('"', out);
}

static const char *const phase_names[] = {"forward", "backward", "optimizer"};

void sim_trace(FILE *out, const Sim *sim, const MemPlan *mp)
{
    Schedule *s = sim->sched;
    Model *m = s->plan->m;
    const SimCluster *c = &sim->cluster;
    fputs("{\"traceEvents\": [\n", out);
    fputs("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": ",
          out);
    json_str(out, arena_printf("fsdpc plan: %s on %" PRId64 " x %" PRId64 " %s (world %" PRId64 ")",
                               m->name, c->nodes, c->gpus_per_node, sim_gpu_label(c), c->world));
    fputs("}}", out);
    /* under HSDP the mesh's two dimensions get tracks of their own: the
     * shard group's collectives (intra-node when a replica fits in a node)
     * and the replica all-reduce (inter-node), drawn on a fourth track
     * though it runs on the reduce stream */
    int64_t R = m->shard.replicate, S = plan_shard_world(m, c->world);
    bool hsdp = R > 1;
    const char *names[STREAM_COUNT + 1] = {track_names[0], track_names[1], track_names[2], NULL};
    if (hsdp) {
        const char *span = S <= c->gpus_per_node ? "intra-node" : "inter-node";
        names[1] = arena_printf("all-gather (shard: %" PRId64 " ranks, %s)", S, span);
        names[2] = arena_printf("reduce-scatter (shard: %" PRId64 " ranks, %s)", S, span);
        names[3] = arena_printf("all-reduce (replicate: %" PRId64 " ranks %" PRId64 " apart, %s)",
                                R, S, S >= c->gpus_per_node ? "inter-node" : "intra-node");
    }
    for (int t = 0; t < STREAM_COUNT + hsdp; t++) {
        fprintf(out, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                     "\"args\": {\"name\": \"%s\"}}",
                t, names[t]);
        fprintf(out, ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
                     "\"args\": {\"sort_index\": %d}}",
                t, t);
    }
    int64_t B = s->plan->micro_batch;
    for (int i = 0; i < s->nev; i++) {
        Event *e = &s->ev[i];
        double dur = sim->end_s[i] - sim->start_s[i];
        const char *name;
        switch (e->kind) {
        case EV_COMPUTE:
            name = e->op->layer && e->op->layer->path[0]
                       ? arena_printf("%s %s", op_name(e->op->kind), e->op->layer->path)
                       : op_name(e->op->kind);
            if (e->op->recompute)   /* named as the trainer's trace names it (emit.c) */
                name = arena_printf("%s (recompute)", name);
            break;
        case EV_ALL_GATHER:
        case EV_GATHER_PARTIAL:
        case EV_KEEP_PARTIAL:
        case EV_REDUCE_SCATTER:
        case EV_ALL_REDUCE:
        case EV_OPTIMIZER:
            name = arena_printf("%s %s", event_name(e->kind), m->groups[e->group]->name);
            break;
        case EV_GRAD_NORM:
            name = event_name(e->kind);
            break;
        case EV_WAIT_GATHER:
        case EV_WAIT_REDUCE:
            /* only waits that hold the compute stream: exposed time */
            if (dur <= 0)
                continue;
            name = arena_printf("%s %s", event_name(e->kind), m->groups[e->group]->name);
            break;
        default:
            continue;
        }
        fputs(",\n{\"name\": ", out);
        json_str(out, name);
        fprintf(out, ", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, "
                     "\"dur\": %.3f, \"args\": {\"event\": %d, \"micro\": %d",
                e->kind == EV_WAIT_GATHER || e->kind == EV_WAIT_REDUCE ? "wait"
                                                                        : phase_names[e->phase],
                e->kind == EV_ALL_REDUCE ? STREAM_COUNT : (int)event_stream(e->kind),
                sim->start_s[i] * 1e6, dur * 1e6, i, e->micro);
        if (e->group >= 0) {
            fputs(", \"group\": ", out);
            json_str(out, m->groups[e->group]->name);
        }
        if (event_is_gather(e->kind) || e->kind == EV_REDUCE_SCATTER || e->kind == EV_ALL_REDUCE) {
            /* its time with the links to itself: dur beyond it is sharing's */
            int64_t moved = event_comm_bytes(s, e, c->world);
            SimAlgo algo;
            double busbw, alone = mesh_collective_seconds(sim, e, moved, &algo, &busbw);
            fprintf(out, ", \"bytes\": %" PRId64 ", \"alone_us\": %.3f", moved, alone * 1e6);
        }
        if ((hsdp || e->kind == EV_GATHER_PARTIAL) && event_mesh_dim(s, e))
            fprintf(out, ", \"mesh\": \"%s\"", event_mesh_dim(s, e));
        if (e->op)
            fprintf(out, ", \"op\": %d, \"flops\": %.0f, \"bytes\": %.0f, \"bound\": \"%s\"",
                    e->op->index, op_flops(e->op, B), op_bytes(e->op, B),
                    sim->mem_bound[i] ? "memory" : "compute");
        fputs("}}", out);
    }
    /* what the rank holds, as a counter track: the memory plan's bytes after
     * each event that changes them, at the event's start (its maximum is the
     * plan's peak, the trainer's mem_peak_bytes) */
    for (int i = 0, last = -1; i < s->nev; i++)
        if (last < 0 || mp->live_after[i] != mp->live_after[last]) {
            fprintf(out, ",\n{\"name\": \"memory\", \"ph\": \"C\", \"pid\": 0, \"ts\": %.3f, "
                         "\"args\": {\"bytes\": %" PRId64 "}}",
                    sim->start_s[i] * 1e6, mp->live_after[i]);
            last = i;
        }
    /* a pattern shows micro-batch 1's first run; the others are one slice */
    const char *note = NULL;
    if (s->repeat > 1) {
        int more = s->repeat - 1;
        note = arena_printf("micro-batches 1 to %d run the same events: the trace shows "
                            "micro-batch 1's first run, then one slice for the %d run%s after it",
                            s->micro_batches - 2, more, more == 1 ? "" : "s");
        fputs(",\n{\"name\": ", out);
        json_str(out, more == 1 ? "micro-batch 2, like micro-batch 1"
                                : arena_printf("micro-batches 2 to %d, like micro-batch 1",
                                               s->micro_batches - 2));
        fprintf(out, ", \"cat\": \"elided\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, "
                     "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"runs\": %d}}",
                (int)STREAM_COMPUTE, sim->elided_from_s * 1e6,
                (sim->elided_to_s - sim->elided_from_s) * 1e6, s->repeat - 1);
    }
    fprintf(out, "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {");
    if (note) {
        fputs("\"note\": ", out);
        json_str(out, note);
        fputs(", ", out);
    }
    fputs("\"model\": ", out);
    json_str(out, m->name);
    fprintf(out, ", \"gpu\": ");
    json_str(out, sim_gpu_label(c));
    fprintf(out, ", \"world\": %" PRId64 ", \"step_ms\": %.6f, \"exposed_comm_ms\": %.6f, "
                 "\"mfu\": %.6f, \"hfu\": %.6f, \"mem_peak_bytes\": %" PRId64 "}\n}\n",
            c->world, sim->step_s * 1e3, sim->exposed_s * 1e3, sim->mfu, sim->hfu, mp->peak);
}
