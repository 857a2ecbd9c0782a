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

#define T 1e12
#define G 1e9
static const SimGpu presets[] = {
    {
        /* NVIDIA A100 Tensor Core GPU datasheet, "A100 80GB SXM" column:
         * BF16 Tensor Core 312 TFLOPS (624 with sparsity), TF32 Tensor Core
         * 156 TFLOPS (312 with sparsity), FP32 19.5 TFLOPS, 80GB HBM2e at
         * 2,039 GB/s, NVLink 600 GB/s. DGX A100 datasheet: 8x single-port
         * ConnectX-6 VPI 200 Gb/s HDR InfiniBand = 25 GB/s per GPU. */
        .key = "a100", .name = "A100 SXM 80GB",
        .bf16_flops = 312 * T, .tf32_flops = 156 * T, .fp32_flops = 19.5 * T,
        .hbm_bytes_per_s = 2039 * G, .hbm_bytes = (int64_t)80 << 30,
        .nvlink_bytes_per_s = 600 * G / 2, .nvlink_alpha_s = NCCL_NVLINK_LAT_S,
        .ib_bytes_per_s = 200 * G / 8, .ib_alpha_s = NCCL_NET_LAT_S,
    },
    {
        /* NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM" column: BF16
         * Tensor Core 1,979 TFLOPS with sparsity (989.5 dense), TF32 Tensor
         * Core 989 TFLOPS with sparsity (494.5 dense), FP32 67 TFLOPS, 80GB
         * HBM3 at 3.35 TB/s, NVLink 900 GB/s. DGX H100: eight single-port
         * ConnectX-7 VPI, 400 Gb/s NDR InfiniBand = 50 GB/s per GPU. */
        .key = "h100", .name = "H100 SXM 80GB",
        .bf16_flops = 1979 * T / 2, .tf32_flops = 989 * T / 2, .fp32_flops = 67 * T,
        .hbm_bytes_per_s = 3350 * G, .hbm_bytes = (int64_t)80 << 30,
        .nvlink_bytes_per_s = 900 * G / 2, .nvlink_alpha_s = NCCL_NVLINK_LAT_S,
        .ib_bytes_per_s = 400 * G / 8, .ib_alpha_s = NCCL_NET_LAT_S,
    },
    {
        /* NVIDIA H200 Tensor Core GPU datasheet, "H200 SXM" column: the
         * H100's compute (BF16 1,979 and TF32 989 TFLOPS with sparsity, FP32
         * 67 TFLOPS) with 141GB HBM3e at 4.8 TB/s, NVLink 900 GB/s. DGX
         * H200: eight single-port ConnectX-7 VPI, 400 Gb/s InfiniBand. */
        .key = "h200", .name = "H200 SXM 141GB",
        .bf16_flops = 1979 * T / 2, .tf32_flops = 989 * T / 2, .fp32_flops = 67 * T,
        .hbm_bytes_per_s = 4800 * G, .hbm_bytes = (int64_t)141 << 30,
        .nvlink_bytes_per_s = 900 * G / 2, .nvlink_alpha_s = NCCL_NVLINK_LAT_S,
        .ib_bytes_per_s = 400 * G / 8, .ib_alpha_s = NCCL_NET_LAT_S,
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
        .hbm_bytes_per_s = 7700 * G, .hbm_bytes = (int64_t)180 << 30,
        .nvlink_bytes_per_s = 1800 * G / 2, .nvlink_alpha_s = NCCL_NVLINK_LAT_S,
        .ib_bytes_per_s = 400 * G / 8, .ib_alpha_s = NCCL_NET_LAT_S,
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

/* Large bf16 GEMMs under cuBLAS reach roughly 70–80% of the dense tensor
 * peak on A100 and H100; the graph's GEMMs (thousands of rows, hundreds to
 * thousands wide) are in that regime. Small ones are slower; see limits. */
#define MATMUL_EFFICIENCY 0.75
/* FlashAttention-2 reaches 50–73% of A100's peak forward and less in
 * backward (Dao, "FlashAttention-2", 2023); FlashAttention-3 reaches 75% on
 * H100, FlashAttention-2 only 35% there (Shah et al., 2024). Half of peak
 * sits between the kernels the emitter might use. */
#define ATTENTION_EFFICIENCY 0.50
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
/* Across nodes: assumed equal to NVLink's fraction; not calibrated. */
#define IB_EFFICIENCY 0.80
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
/* Across nodes with one NIC per GPU, 16: "If you are on DGX with 8 NICs
 * ... then it would use 16 SMs" (NCCL's maintainer, quoted in
 * NVIDIA/nccl#689); rings "Channel 00/16" on 3 nodes of 8 H100s
 * (NVIDIA/nccl#1453). */
#define NCCL_NET_CHANNELS 16
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

SimCluster sim_default_cluster(int64_t world)
{
    SimCluster c = {&presets[1], (world + NODE_MAX_GPUS - 1) / NODE_MAX_GPUS,
                    world < NODE_MAX_GPUS ? world : NODE_MAX_GPUS, world};
    return c;
}

/*   spec := preset [ ':' setting { ',' setting } ]
 *   setting := ( 'nodes' | 'gpus' ) '=' integer */
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
    int64_t nodes = 1, gpus = NODE_MAX_GPUS;
    const char *p = colon ? colon + 1 : NULL;
    while (p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        int64_t *dst = NULL, max = 0;
        if (eq && eq - p == 5 && strncmp(p, "nodes", 5) == 0)
            dst = &nodes, max = (int64_t)1 << 24;
        else if (eq && eq - p == 4 && strncmp(p, "gpus", 4) == 0)
            dst = &gpus, max = NODE_MAX_GPUS;
        if (!dst) {
            snprintf(msg, msgsize, "--sim %s: unknown setting `%.*s`; use nodes=N and gpus=N "
                                   "(GPUs per node), e.g. --sim %s:nodes=16",
                     spec, (int)len, p, gpu->key);
            return false;
        }
        char num[32] = "";
        size_t nl = len - (size_t)(eq + 1 - p);
        if (nl < sizeof num)
            memcpy(num, eq + 1, nl), num[nl] = 0;
        char *e;
        errno = 0;
        long long v = strtoll(num, &e, 10);
        if (nl == 0 || nl >= sizeof num || *e || errno || !isdigit((unsigned char)num[0]) ||
            v < 1 || v > max) {
            snprintf(msg, msgsize, "--sim %s: `%.*s` must be a whole number from 1 to %" PRId64
                                   "%s",
                     spec, (int)(eq - p), p, max,
                     dst == &gpus ? " (a node has 8 GPUs on one NVLink switch)" : "");
            return false;
        }
        *dst = v;
        p = end ? end + 1 : NULL;
    }
    if (nodes * gpus > (int64_t)1 << 24) {
        snprintf(msg, msgsize, "--sim %s: %" PRId64 " ranks is more than fsdpc sizes (%d)", spec,
                 nodes * gpus, 1 << 24);
        return false;
    }
    *c = (SimCluster){gpu, nodes, gpus, nodes * gpus};
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
    return sim->cluster.gpu->hbm_bytes_per_s * HBM_EFFICIENCY;
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
        rate = matmul_peak(sim) * ATTENTION_EFFICIENCY;
        break;
    default:
        *cat = CAT_MEMORY;
        rate = sim->cluster.gpu->fp32_flops * VECTOR_EFFICIENCY;
        break;
    }
    return (Work){op_flops(op, B) / rate, op_bytes(op, B) / hbm_rate(sim)};
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

/* The bus bandwidth that bounds a ring over the whole world: NVLink within
 * one node; across nodes the ring's inter-node hops go through each GPU's
 * own NIC, so InfiniBand bounds the whole ring. */
static double ring_bytes_per_s(const SimCluster *c)
{
    return c->world > c->gpus_per_node ? c->gpu->ib_bytes_per_s * IB_EFFICIENCY
                                       : c->gpu->nvlink_bytes_per_s * NVLINK_EFFICIENCY;
}

/* A ring all-gather or reduce-scatter over the whole world, NCCL's model
 * (src/graph/tuning.cc): a fixed launch latency, one latency per ring step
 * (W-1 steps, N-1 of which cross nodes), and the bytes each rank receives
 * at the ring's bus bandwidth. A hierarchical model (reduce-scatter within
 * nodes over NVLink, then across nodes over all 8 rails) is a possible
 * refinement; NCCL's ring is what FSDP runs today. */
double sim_collective_seconds(const SimCluster *c, int64_t bytes)
{
    if (c->world <= 1)
        return 0;
    int64_t nodes = c->world > c->gpus_per_node ? c->nodes : 1;
    int64_t steps = c->world - 1, inter = nodes - 1;
    double alpha = NCCL_BASE_LAT_S + (double)(steps - inter) * c->gpu->nvlink_alpha_s +
                   (double)inter * c->gpu->ib_alpha_s;
    return alpha + (double)bytes / ring_bytes_per_s(c);
}

/* A latency-bound all-reduce of one float (the global gradient norm): a
 * tree's way up and down, one NCCL launch each way. */
static double scalar_allreduce_seconds(const SimCluster *c)
{
    if (c->world <= 1)
        return 0;
    double hops = ceil(log2((double)c->world));
    double hop = c->world > c->gpus_per_node ? c->gpu->ib_alpha_s : c->gpu->nvlink_alpha_s;
    return 2 * (NCCL_BASE_LAT_S + hops * hop);
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

/* A collective event's time on its sub-group of the mesh: plain FSDP's
 * collectives span the world (sim_collective_seconds, as before); under
 * replicate = R (docs/design.md#hsdp) all-gathers and reduce-scatters run
 * over the S = W/R consecutive ranks of a replica, the all-reduce over the
 * R ranks S apart. `moved` is what event_comm_bytes counts; the group
 * model takes what each rank contributes. */
static double mesh_collective_seconds(const Sim *sim, const Event *e, int64_t moved)
{
    const Model *m = sim->sched->plan->m;
    const SimCluster *c = &sim->cluster;
    int64_t R = m->shard.replicate;
    if (R <= 1 && e->kind != EV_ALL_REDUCE)
        return sim_collective_seconds(c, moved);
    int64_t S = plan_shard_world(m, c->world);
    const ShardGroup *sg = m->groups[e->group];
    int64_t shard = plan_shard_numel(sg, c->world), padded = plan_padded_numel(sg, c->world);
    if (moved == 0)
        return 0;
    switch (e->kind) {
    case EV_ALL_GATHER:
        return sim_group_collective_seconds(c, COLL_ALL_GATHER,
                                            shard * dtype_bytes(m->shard.param_dtype), S, 1);
    case EV_REDUCE_SCATTER:
        return sim_group_collective_seconds(c, COLL_REDUCE_SCATTER,
                                            padded * dtype_bytes(m->shard.reduce_dtype), S, 1);
    case EV_ALL_REDUCE:
        return sim_group_collective_seconds(c, COLL_ALL_REDUCE,
                                            shard * dtype_bytes(m->shard.reduce_dtype), R, S);
    default:
        fsd_unreachable();
    }
}

/* ── contention ──
 * A collective in flight on its stream, and what it takes from the compute
 * beside it while it runs: its channels' SMs, and its HBM traffic's share
 * of the achievable bandwidth. */
typedef struct {
    double start_s, end_s;
    double sm_share, hbm_share;
} Flight;

/* One collective stream's flights in order. `first` is the earliest that
 * may still be running at the compute stream's time, which only moves
 * forward, so the flights before it need no second look (and a pattern's
 * replay drops them between micro-batches: see forget_flights). */
typedef struct {
    Flight *f;
    int n, first, cap;
} Flights;

static void push_flight(Flights *q, Flight f)
{
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 64;
        Flight *n = arena_alloc(sizeof(Flight) * (size_t)cap);
        if (q->n)
            memcpy(n, q->f, sizeof(Flight) * (size_t)q->n);
        q->f = n;
        q->cap = cap;
    }
    q->f[q->n++] = f;
}

/* The channels, so the SMs, NCCL gives a ring over the whole world. */
static int nccl_channels(const SimCluster *c)
{
    return c->world > c->gpus_per_node ? NCCL_NET_CHANNELS : NCCL_NVLINK_CHANNELS;
}

static Flight flight(const Sim *sim, double start_s, double dur_s, int64_t bytes)
{
    const SimCluster *c = &sim->cluster;
    return (Flight){start_s, start_s + dur_s, (double)nccl_channels(c) / gpu_sms(c->gpu),
                    NCCL_HBM_BYTES_PER_LINK_BYTE * (double)bytes / dur_s / hbm_rate(sim)};
}

/* Seconds work w takes from `start` on the compute stream, slowed while
 * collectives run beside it: piece by piece between the moments one starts
 * or ends, each piece at the roofline of what they leave (work_seconds).
 * An all-gather and a reduce-scatter running together both hold their
 * SMs, so those shares add; their HBM traffic is bounded by the bytes the
 * links bring in, one ring's worth (together they would share the links,
 * though the collective model lets each run at full speed). Alone, or with
 * nothing in flight, it is exactly the plain roofline. */
static double contended_seconds(const Sim *sim, Flights flights[STREAM_COUNT], double start, Work w)
{
    double hbm_max = NCCL_HBM_BYTES_PER_LINK_BYTE * ring_bytes_per_s(&sim->cluster) / hbm_rate(sim);
    double t = start, spent = 0, left = 1;   /* left: the fraction of w still to do */
    for (;;) {
        double sm = 0, hbm = 0, next = INFINITY;   /* next: when what runs beside changes */
        for (int st = STREAM_GATHER; st < STREAM_COUNT; st++) {
            Flights *q = &flights[st];
            while (q->first < q->n && q->f[q->first].end_s <= t)
                q->first++;
            if (q->first == q->n)
                continue;
            const Flight *f = &q->f[q->first];
            if (f->start_s <= t) {
                sm += f->sm_share;
                hbm += f->hbm_share;
                next = fmin(next, f->end_s);
            } else {
                next = fmin(next, f->start_s);
            }
        }
        double whole = work_seconds(w, sm, fmin(hbm, hbm_max));
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
 * completes when the work before it has) and starts when its stream has
 * finished the previous collective; it does not depend on the compute
 * beside it, but slows it (contended_seconds). A wait holds the compute
 * stream until that group's latest collective of its kind has finished;
 * the time it holds is exposed communication. Reshard, allocation and free
 * events are bookkeeping and take no time. */

/* What the replay carries from one event to the next: each stream's
 * clock, when each group's latest all-gather and reduce-scatter finish,
 * and the collectives in flight. */
typedef struct {
    double now[STREAM_COUNT];
    double *gather_done, *reduce_done;   /* by group */
    Flights flights[STREAM_COUNT];       /* by stream; the compute stream's stays empty */
} Replay;

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
        dur = contended_seconds(sim, r->flights, start, w) + latency;
        mem_bound = w.memory_s > w.compute_s;
        break;
    }
    case EV_ALL_GATHER:
    case EV_REDUCE_SCATTER:
    case EV_ALL_REDUCE: {
        StreamId st = event_stream(e->kind);
        int64_t bytes = event_comm_bytes(s, e, sim->cluster.world);
        if (r->now[st] > start)
            start = r->now[st];
        dur = mesh_collective_seconds(sim, e, bytes);
        if (dur > 0)
            push_flight(&r->flights[st], flight(sim, start, dur, bytes));
        r->now[st] = start + dur;
        /* a replica all-reduce follows its reduce-scatter on the reduce
         * stream: the wait is for both */
        (e->kind == EV_ALL_GATHER ? r->gather_done : r->reduce_done)[e->group] = r->now[st];
        sim->busy_s[st] += dur;
        sim->bytes[st] += bytes;
        break;
    }
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
    if (event_stream(e->kind) == STREAM_COMPUTE)
        r->now[STREAM_COMPUTE] = start + dur;
    if (cat != CAT_COUNT) {
        sim->compute_s += dur;
        sim->busy_s[STREAM_COMPUTE] += dur;
        sim->cat_s[cat] += dur;
    }
}

/* Drops the flights that ended by the compute stream's time: nothing
 * later runs beside them (flights on a stream end in order). */
static void forget_flights(Replay *r)
{
    for (int st = STREAM_GATHER; st < STREAM_COUNT; st++) {
        Flights *q = &r->flights[st];
        int k = 0;
        while (k < q->n && q->f[k].end_s <= r->now[STREAM_COMPUTE])
            k++;
        if (k > 0)
            memmove(q->f, q->f + k, sizeof(Flight) * (size_t)(q->n - k));
        q->n -= k;
        q->first = 0;
    }
}

/* The state as the rest of a replay sees it, relative to the compute
 * stream's time t: a stream clock, or a collective's end, at or before t
 * delays nothing (whatever comes next starts at t or later), so each is
 * max(0, x - t); and the flights still running, relative to t. Two states
 * with the same key replay the same events alike, shifted by the
 * difference of their t (the replay depends on time differences only).
 * Written into k, which grows as needed; call after forget_flights. */
typedef struct {
    double *v;
    int n, cap;
} StateKey;

static void state_key(const Replay *r, int ngroups, StateKey *k)
{
    double t = r->now[STREAM_COMPUTE];
    int n = 2 + 2 * ngroups + 2;
    for (int st = STREAM_GATHER; st < STREAM_COUNT; st++)
        n += 4 * r->flights[st].n;
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
        const Flights *q = &r->flights[st];
        v[j++] = q->n;
        for (int f = 0; f < q->n; f++) {
            v[j++] = q->f[f].start_s - t;
            v[j++] = q->f[f].end_s - t;
            v[j++] = q->f[f].sm_share;
            v[j++] = q->f[f].hbm_share;
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
        for (int f = 0; f < r->flights[st].n; f++) {
            r->flights[st].f[f].start_s += dt;
            r->flights[st].f[f].end_s += dt;
        }
    }
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
    forget_flights(r);
    state_key(r, G, key);
    for (int run = 1; run <= sim->sched->repeat; run++) {
        Sim before = *sim;
        double t0 = r->now[STREAM_COMPUTE];
        for (int i = from; i < to; i++)
            replay_event(sim, r, i, run == 1);
        sim->replayed_runs = run;
        if (run == 1)
            sim->elided_from_s = r->now[STREAM_COMPUTE];
        forget_flights(r);
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

void sim_dump(FILE *out, const Sim *sim, const MemPlan *mp)
{
    const SimCluster *c = &sim->cluster;
    const SimGpu *gpu = c->gpu;
    Plan *p = sim->sched->plan;
    Model *m = p->m;
    bool multi = c->world > c->gpus_per_node;
    fprintf(out, "simulation %s on %" PRId64 " node%s x %" PRId64 " %s (world %" PRId64 ")\n",
            m->name, c->nodes, c->nodes == 1 ? "" : "s", c->gpus_per_node, gpu->name, c->world);
    fprintf(out, "  per GPU: matmul peak %s (%s), HBM %s; %s %s per direction\n",
            human_rate(sim->peak_flops, "FLOP/s"),
            compute_dtype(m) == DTYPE_BF16 ? "bf16" : FP32_MATMUL_USES_TF32 ? "tf32" : "fp32",
            human_rate(gpu->hbm_bytes_per_s, "B/s"), multi ? "InfiniBand" : "NVLink",
            human_rate(multi ? gpu->ib_bytes_per_s : gpu->nvlink_bytes_per_s, "B/s"));
    fprintf(out, "  assumed: matmul %.0f%%, attention %.0f%% of peak; HBM %.0f%%, %s %.0f%% of "
                 "link bandwidth\n",
            MATMUL_EFFICIENCY * 100, ATTENTION_EFFICIENCY * 100, HBM_EFFICIENCY * 100,
            multi ? "InfiniBand" : "NVLink", (multi ? IB_EFFICIENCY : NVLINK_EFFICIENCY) * 100);
    fprintf(out, "  %-16s %s  (%d micro-batch%s of %" PRId64 " x %" PRId64 " tokens)\n", "step",
            ms(sim->step_s), sim->sched->micro_batches, sim->sched->micro_batches == 1 ? "" : "es",
            p->micro_batch,
            m->seq);
    fprintf(out, "  %-16s %s  (matmul %.3f, attention %.3f, memory-bound ops %.3f, "
                 "optimizer %.3f ms)\n",
            "compute", ms(sim->compute_s), sim->cat_s[CAT_MATMUL] * 1e3,
            sim->cat_s[CAT_ATTENTION] * 1e3, sim->cat_s[CAT_MEMORY] * 1e3,
            sim->cat_s[CAT_OPTIMIZER] * 1e3);
    fprintf(out, "  %-16s %s  (of compute: the collectives beside it hold %d of %d SMs each and "
                 "move %.0f HBM bytes per byte received)\n",
            "contention", ms(contention_seconds(sim)), nccl_channels(c), gpu_sms(gpu),
            NCCL_HBM_BYTES_PER_LINK_BYTE);
    fprintf(out, "  %-16s %s  (waiting on all-gather %.3f, reduce-scatter %.3f ms; %.1f%% of "
                 "the step)\n",
            "exposed comm", ms(sim->exposed_s), sim->exposed_gather_s * 1e3,
            sim->exposed_reduce_s * 1e3,
            sim->step_s > 0 ? 100 * sim->exposed_s / sim->step_s : 0.0);
    fprintf(out, "  %-16s %s busy  %s bytes per rank\n", "all-gather",
            ms(sim->busy_s[STREAM_GATHER]), fmt_count(sim->bytes[STREAM_GATHER]));
    fprintf(out, "  %-16s %s busy  %s bytes per rank\n", "reduce-scatter",
            ms(sim->busy_s[STREAM_REDUCE]), fmt_count(sim->bytes[STREAM_REDUCE]));
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
                gib((double)gpu->hbm_bytes),
                mp->peak > gpu->hbm_bytes ? "  -- DOES NOT FIT" : "");
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

static const char *const track_names[STREAM_COUNT] = {"compute", "all-gather", "reduce-scatter"};
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
                               m->name, c->nodes, c->gpus_per_node, c->gpu->name, c->world));
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
        if (e->kind == EV_ALL_GATHER || e->kind == EV_REDUCE_SCATTER || e->kind == EV_ALL_REDUCE)
            fprintf(out, ", \"bytes\": %" PRId64, event_comm_bytes(s, e, c->world));
        if (hsdp && event_mesh_dim(s, e))
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
    json_str(out, c->gpu->name);
    fprintf(out, ", \"world\": %" PRId64 ", \"step_ms\": %.6f, \"exposed_comm_ms\": %.6f, "
                 "\"mfu\": %.6f, \"hfu\": %.6f, \"mem_peak_bytes\": %" PRId64 "}\n}\n",
            c->world, sim->step_s * 1e3, sim->exposed_s * 1e3, sim->mfu, sim->hfu, mp->peak);
}

/* ── sim_group_collective_seconds: collectives on sub-groups of the world ──
 *
 * A simple stand-in, kept apart so that a fuller network model can replace
 * it whole: an alpha-beta ring over NVLink when the group's members all sit
 * in one node (they are `stride` ranks apart, starting at a node's first
 * GPU, as HSDP's shard groups and replica groups do), else over each GPU's
 * NIC. `bytes` is what each rank contributes: its shard for an all-gather
 * (it receives ranks-1 of them), the whole buffer for a reduce-scatter
 * ((ranks-1)/ranks of it crosses each link), the buffer for an all-reduce
 * (2(ranks-1)/ranks, reduce-scatter then all-gather: NCCL's ring, and
 * nccl-tests' bus-bandwidth convention, PERFORMANCE.md there). */
double sim_group_collective_seconds(const SimCluster *c, CollKind kind, int64_t bytes,
                                    int64_t ranks, int64_t stride)
{
    if (ranks <= 1 || bytes <= 0)
        return 0;
    bool intra = (ranks - 1) * stride < c->gpus_per_node;
    double bw = intra ? c->gpu->nvlink_bytes_per_s * NVLINK_EFFICIENCY
                      : c->gpu->ib_bytes_per_s * IB_EFFICIENCY;
    double hop = intra ? c->gpu->nvlink_alpha_s : c->gpu->ib_alpha_s;
    double n = (double)ranks, b = (double)bytes, moved, steps;
    switch (kind) {
    case COLL_ALL_GATHER: moved = (n - 1) * b; steps = n - 1; break;
    case COLL_REDUCE_SCATTER: moved = (n - 1) / n * b; steps = n - 1; break;
    case COLL_ALL_REDUCE: moved = 2 * (n - 1) / n * b; steps = 2 * (n - 1); break;
    default: fsd_unreachable();
    }
    return NCCL_BASE_LAT_S + steps * hop + moved / bw;
}
