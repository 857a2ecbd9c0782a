/*
 * device.cc — cudasim's device: the CUDA runtime calls of runtime/cuda_*.c on
 * host memory, with streams and events that keep CUDA's ordering rules and
 * check them (README.md).
 *
 * Memory. cudaMalloc and cudaMallocHost return host memory, recorded as
 * device or pinned, filled with 0xff bytes (a NaN in fp32, bf16 and fp64),
 * as the device's fresh memory holds garbage. Copies, sets and the fakes'
 * operands must lie inside one live block of the kind their direction
 * names; cudaFree of anything else fails.
 *
 * Streams. Each stream is a queue of ops. The compute stream
 * (fsdrt_cuda_stream()) and the legacy stream run an op as it is queued:
 * the trainer's own kernels run on the host when launched, so the compute
 * stream must be up to date at every launch. The other streams (gather,
 * reduce, the offload copies) run theirs
 *   - lazily (FSD_CUDASIM=lazy, the default): only when something waits —
 *     a stream waiting on an event recorded after them, a host wait on
 *     such an event, cudaStreamSynchronize, cudaDeviceSynchronize, cudaFree
 *     (which synchronises the device). A read of a collective's result
 *     that no event orders after it then sees the buffer before the
 *     collective (the 0xff garbage, or the last step's values);
 *   - eagerly (FSD_CUDASIM=eager): as they are queued, as if every
 *     collective finished at once. A collective that overwrites a buffer
 *     the compute stream has not finished reading then does so before
 *     that read.
 * A correct program gets the same results both ways; a missing event wait
 * changes them in one of the two, which the tests compare with the CPU
 * build's. cudaStreamWaitEvent captures the event's last record at the
 * call, as CUDA does; a wait that needs a stream already running (a cycle)
 * stops the run, where the device would hang. FSD_CUDASIM_DROP_WAITS=1
 * ignores every cudaStreamWaitEvent: the tests' proof that a missing wait
 * shows.
 *
 * An op that cannot finish (sim.h's sim_enqueue_until: the NCCL fake's
 * hung collective) stops its stream there: events behind it stay not
 * ready, a stream waiting on one stops too, and a host call that would
 * block on it (a synchronize, cudaFree, a copy into pageable memory) stops
 * the run saying it would wait forever; cudaEventQuery keeps answering not
 * ready, so host waits that poll can time out.
 *
 * Once the compute stream exists, work on the legacy stream stops the run:
 * the runtime's streams are non-blocking, so nothing orders it against
 * them.
 *
 * Copies with pageable host memory keep CUDA's rules: a copy from pageable
 * memory reads it when called (staged), one into pageable memory returns
 * when done; pinned memory is read and written when the copy runs.
 *
 * Events time their records with the host's clock when the record runs;
 * cudaEventQuery of a pending event answers cudaErrorNotReady once and
 * runs what it waits for, so host waits take their polling path.
 *
 * Launches (kernel.h) run each block's threads one after another, or, for
 * the kernels in team_kernels, as coroutines meeting at __syncthreads.
 *
 * One process per rank, one device each (FSD_CUDASIM_DEVICES, default 8,
 * compute capability 9.0). Device memory is capped at
 * FSD_CUDASIM_MEM_MB (default 8192) per process, which cudaMemGetInfo
 * reports as the device's size.
 */
#include "kernel.h"
#include "sim.h"

#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <vector>

extern "C" cudaStream_t fsdrt_cuda_stream(void) __attribute__((weak));

/* ── failures ── */

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static int my_rank(void)
{
    const char *v = getenv("OMPI_COMM_WORLD_RANK");
    return v ? atoi(v) : 0;
}

void sim_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cudasim: rank %d: %s\n", my_rank(), msg);
    fflush(stderr);
    _exit(3);
}

/* ── memory ── */

struct Block {
    size_t bytes;
    SimMem kind;
};
static std::map<uintptr_t, Block> blocks;   /* by start address */
static size_t device_bytes;
static std::recursive_mutex lock;           /* cuda_boot.c's watchdog thread may call in */

static const Block *block_of(const void *p, uintptr_t *start)
{
    uintptr_t a = (uintptr_t)p;
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin())
        return NULL;
    --it;
    if (a >= it->first + it->second.bytes)
        return NULL;
    *start = it->first;
    return &it->second;
}

SimMem sim_kind(const void *p)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    uintptr_t start;
    const Block *b = block_of(p, &start);
    return b ? b->kind : SIM_HOST;
}

void sim_need_device(const void *p, size_t bytes, const char *what)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    uintptr_t start;
    const Block *b = block_of(p, &start);
    if (!b || b->kind != SIM_DEVICE)
        sim_fail("%s: %p is not device memory", what, p);
    if ((uintptr_t)p + bytes > start + b->bytes)
        sim_fail("%s: %zu bytes at %p run %zu bytes past the end of its %zu-byte allocation", what,
                 bytes, p, (size_t)((uintptr_t)p + bytes - start - b->bytes), b->bytes);
}

/* p is host memory, pageable or pinned: not inside a device block. */
static void need_host(const void *p, const char *what)
{
    if (sim_kind(p) == SIM_DEVICE)
        sim_fail("%s: %p is device memory where host memory is needed", what, p);
}

static cudaError_t alloc(void **p, size_t bytes, SimMem kind)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!p)
        return cudaErrorInvalidValue;
    size_t cap = (size_t)env_int("FSD_CUDASIM_MEM_MB", 8192) << 20;
    if (kind == SIM_DEVICE && device_bytes + bytes > cap)
        return cudaErrorMemoryAllocation;
    /* 256-byte aligned as cudaMalloc's, and exactly `bytes` long, so that
     * AddressSanitizer (CUDASIM_SAN=1) reports an access past the end */
    size_t n = bytes ? bytes : 1;
    void *q = NULL;
    if (posix_memalign(&q, 256, n) != 0)
        return cudaErrorMemoryAllocation;
    memset(q, 0xff, n);
    blocks[(uintptr_t)q] = Block{n, kind};
    if (kind == SIM_DEVICE)
        device_bytes += n;
    *p = q;
    return cudaSuccess;
}

static cudaError_t release(void *p, SimMem kind, const char *call)
{
    if (!p)
        return cudaSuccess;
    cudaDeviceSynchronize();   /* both frees synchronise the device */
    std::lock_guard<std::recursive_mutex> g(lock);
    auto it = blocks.find((uintptr_t)p);
    if (it == blocks.end() || it->second.kind != kind)
        sim_fail("%s(%p): not the start of a live %s allocation", call, p,
                 kind == SIM_DEVICE ? "device" : "pinned host");
    if (kind == SIM_DEVICE)
        device_bytes -= it->second.bytes;
    blocks.erase(it);
    free(p);
    return cudaSuccess;
}

/* ── streams and events ── */

struct Op {
    std::string what;
    std::function<bool()> run;   /* false: cannot finish (yet) */
};

struct CUstream_st {
    int id = 0;
    std::deque<Op> queue;   /* ops not yet run; the first has number `done` */
    uint64_t queued = 0;    /* ops ever queued */
    uint64_t done = 0;      /* ops run */
    bool running = false;   /* op number `done` of this stream is running now */
    uint64_t after_compute = 0;   /* compute-stream ops its next op is ordered after */
    std::string running_what;
    bool destroyed = false;
};

struct CUevent_st {
    bool timing;
    bool destroyed = false;
    CUstream_st *stream = NULL;   /* its last record's stream, op number */
    uint64_t op = 0;
    uint64_t after_compute = 0;   /* compute-stream ops its last record is ordered after */
    uint64_t records = 0;         /* records made; the one that ran last: */
    uint64_t ran = 0;
    double us = 0;                /* when that record ran */
    bool polled = false;          /* cudaEventQuery answered not-ready once */
};

static CUstream_st legacy_stream;   /* id 0 */
static std::vector<CUstream_st *> streams = {&legacy_stream};

static bool eager(void)
{
    static int mode = -1;
    if (mode < 0) {
        const char *v = getenv("FSD_CUDASIM");
        if (v && *v && strcmp(v, "eager") && strcmp(v, "lazy"))
            sim_fail("FSD_CUDASIM=%s: use eager or lazy", v);
        mode = v && !strcmp(v, "eager");
    }
    return mode;
}

static CUstream_st *stream_of(cudaStream_t s) { return s ? s : &legacy_stream; }

static CUstream_st *compute_stream(void)
{
    return fsdrt_cuda_stream ? (CUstream_st *)fsdrt_cuda_stream() : NULL;
}

static bool runs_at_once(CUstream_st *s)
{
    return s == &legacy_stream || eager() || s == compute_stream();
}

/* How many compute-stream ops work queued on s now is ordered after: all
 * of them on the compute stream itself, else what s's event waits gave it
 * (at issue, as CUDA orders them). */
static uint64_t after_compute(CUstream_st *s)
{
    return s == compute_stream() ? s->queued : s->after_compute;
}

void sim_need_after_compute(cudaStream_t stream, const char *what)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    CUstream_st *s = stream_of(stream), *c = compute_stream();
    if (!c || s == c || s == &legacy_stream || s->after_compute >= c->queued)
        return;
    sim_fail("%s on stream %d is ordered after only %llu of the %llu ops queued on the compute "
             "stream before it: on the device it may run before the others (no fence: an event "
             "recorded on the compute stream and waited for on this one)",
             what, s->id, (unsigned long long)s->after_compute, (unsigned long long)c->queued);
}

/* Runs s's ops up to and including op number `upto`; false if one of
 * them cannot finish (sim_enqueue_until), which stays first in line. */
static bool drain(CUstream_st *s, uint64_t upto)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (s->running && upto >= s->done)
        sim_fail("stream %d: %s waits on itself or on later work of its stream: on the device "
                 "this would hang", s->id, s->running_what.c_str());
    while (s->done <= upto && !s->queue.empty()) {
        Op &op = s->queue.front();
        s->running = true;
        s->running_what = op.what;
        bool finished = op.run();
        s->running = false;
        if (!finished)
            return false;
        s->queue.pop_front();
        s->done++;
    }
    return true;
}

static bool drain_all(CUstream_st *s) { return !s->queued || drain(s, s->queued - 1); }

/* A host call that blocks until stream s has run through op `upto`. */
static void block_on(CUstream_st *s, uint64_t upto, const char *call)
{
    if (!drain(s, upto))
        sim_fail("%s waits forever: stream %d is stuck at %s, which never completes (on the "
                 "device this host thread would hang)",
                 call, s->id, s->queue.front().what.c_str());
}

static void block_on_all(CUstream_st *s, const char *call)
{
    if (s->queued)
        block_on(s, s->queued - 1, call);
}

void sim_enqueue_until(cudaStream_t stream, const char *what, std::function<bool()> op)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    CUstream_st *s = stream_of(stream);
    if (s->destroyed)
        sim_fail("%s queued on a destroyed stream", what);
    if (s == &legacy_stream && compute_stream())
        sim_fail("%s on the legacy stream (0), which the runtime's non-blocking streams neither "
                 "wait for nor are waited for by: queue it on the compute stream", what);
    s->queue.push_back(Op{what, std::move(op)});
    s->queued++;
    if (runs_at_once(s))
        drain_all(s);
}

void sim_enqueue(cudaStream_t stream, const char *what, std::function<void()> op)
{
    sim_enqueue_until(stream, what, [op] {
        op();
        return true;
    });
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static bool complete(const CUevent_st *e) { return !e->stream || e->stream->done > e->op; }

static void need_event(cudaEvent_t e, const char *call)
{
    if (!e)
        sim_fail("%s: a null event", call);
    if (e->destroyed)
        sim_fail("%s: an event already destroyed", call);
}

extern "C" {

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!s || flags > cudaStreamNonBlocking)
        return cudaErrorInvalidValue;   /* a priority out of range is clamped, as CUDA does */
    CUstream_st *n = new CUstream_st;
    n->id = (int)streams.size();
    streams.push_back(n);
    *s = n;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!s || s->destroyed)
        sim_fail("cudaStreamDestroy: %s stream", s ? "a destroyed" : "the legacy");
    block_on_all(s, "cudaStreamDestroy");   /* the device finishes its work first */
    s->destroyed = true;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    block_on_all(stream_of(s), "cudaStreamSynchronize");
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    for (bool more = true; more;) {
        more = false;
        for (CUstream_st *s : streams)
            if (!s->queue.empty()) {
                block_on_all(s, "cudaDeviceSynchronize (or cudaFree, which synchronises)");
                more = true;
            }
    }
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned flags)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    need_event(e, "cudaStreamWaitEvent");
    if (flags)
        return cudaErrorInvalidValue;
    if (!e->stream || env_int("FSD_CUDASIM_DROP_WAITS", 0))
        return cudaSuccess;   /* never recorded: nothing to wait for */
    CUstream_st *on = e->stream, *s = stream_of(stream);
    uint64_t upto = e->op;
    if (e->after_compute > s->after_compute)
        s->after_compute = e->after_compute;
    sim_enqueue_until(stream, "cudaStreamWaitEvent", [on, upto] { return drain(on, upto); });
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    if (!e || flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming))
        return cudaErrorInvalidValue;
    *e = new CUevent_st;
    (*e)->timing = !(flags & cudaEventDisableTiming);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    need_event(e, "cudaEventDestroy");
    e->destroyed = true;   /* kept: a queued record may still run */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    need_event(e, "cudaEventRecord");
    CUstream_st *s = stream_of(stream);
    e->stream = s;
    e->op = s->queued;
    e->polled = false;
    uint64_t n = ++e->records;
    sim_enqueue(stream, "cudaEventRecord", [e, n] {
        if (n > e->ran) {
            e->ran = n;
            e->us = now_us();
        }
    });
    e->after_compute = after_compute(s);   /* the record itself counted */
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    need_event(e, "cudaEventSynchronize");
    if (e->stream)
        block_on(e->stream, e->op, "cudaEventSynchronize");
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    need_event(e, "cudaEventQuery");
    if (complete(e))
        return cudaSuccess;
    if (!e->polled) {
        e->polled = true;
        return cudaErrorNotReady;
    }
    return drain(e->stream, e->op) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    need_event(a, "cudaEventElapsedTime");
    need_event(b, "cudaEventElapsedTime");
    if (!a->timing || !b->timing)
        return cudaErrorInvalidResourceHandle;
    if (!a->stream || !b->stream)
        return cudaErrorInvalidResourceHandle;   /* never recorded */
    if (!complete(a) || !complete(b) || a->ran != a->records || b->ran != b->records)
        return cudaErrorNotReady;
    *ms = (float)((b->us - a->us) / 1000);
    return cudaSuccess;
}

/* ── memory calls ── */

cudaError_t cudaMalloc(void **p, size_t bytes) { return alloc(p, bytes, SIM_DEVICE); }
cudaError_t cudaMallocHost(void **p, size_t bytes) { return alloc(p, bytes, SIM_PINNED); }
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    return flags ? cudaErrorInvalidValue : alloc(p, bytes, SIM_PINNED);
}
cudaError_t cudaFree(void *p) { return release(p, SIM_DEVICE, "cudaFree"); }
cudaError_t cudaFreeHost(void *p) { return release(p, SIM_PINNED, "cudaFreeHost"); }

/* The device is this process's cap (FSD_CUDASIM_MEM_MB), and nothing but
 * its own cudaMalloc uses it: no context, no other process, no library
 * allocating behind the runtime's back (the fakes keep their state in host
 * memory). So the runtime's account of its device memory must add up to
 * the bytes in use exactly (tests/cudasim/run.sh checks it). */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!free_bytes || !total_bytes)
        return cudaErrorInvalidValue;
    size_t cap = (size_t)env_int("FSD_CUDASIM_MEM_MB", 8192) << 20;
    *total_bytes = cap;
    *free_bytes = cap - device_bytes;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    if (!a)
        return cudaErrorInvalidValue;
    SimMem k = sim_kind(p);
    a->type = k == SIM_DEVICE ? cudaMemoryTypeDevice
              : k == SIM_PINNED ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
    a->device = 0;
    a->devicePointer = k == SIM_HOST ? NULL : (void *)p;
    a->hostPointer = k == SIM_DEVICE ? NULL : (void *)p;
    return cudaSuccess;
}

/* A copy of `rows` rows of `width` bytes, pitches apart, checked against
 * its kind and queued with CUDA's rules for pageable memory. */
static cudaError_t copy(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows, enum cudaMemcpyKind kind, cudaStream_t stream,
                        const char *call)
{
    std::lock_guard<std::recursive_mutex> g(lock);
    if (!rows || !width)
        return cudaSuccess;
    if (!dst || !src || width > dpitch || width > spitch)
        return cudaErrorInvalidValue;
    SimMem dk = sim_kind(dst), sk = sim_kind(src);
    switch (kind) {
    case cudaMemcpyHostToDevice: need_host(src, call), dk = SIM_DEVICE; break;
    case cudaMemcpyDeviceToHost: sk = SIM_DEVICE, need_host(dst, call); break;
    case cudaMemcpyDeviceToDevice: sk = dk = SIM_DEVICE; break;
    case cudaMemcpyHostToHost:
        need_host(src, call), need_host(dst, call);
        break;
    case cudaMemcpyDefault: break;
    default: return cudaErrorInvalidValue;
    }
    size_t dspan = dpitch * (rows - 1) + width, sspan = spitch * (rows - 1) + width;
    if (dk == SIM_DEVICE)
        sim_need_device(dst, dspan, call);
    if (sk == SIM_DEVICE)
        sim_need_device(src, sspan, call);
    char *d = (char *)dst;
    const char *from = (const char *)src;
    std::vector<char> staged;
    if (sk == SIM_HOST) {   /* pageable: read now */
        staged.assign(from, from + sspan);
        from = NULL;
    }
    sim_enqueue(stream, call, [=] {
        const char *s = from ? from : staged.data();
        for (size_t r = 0; r < rows; r++)
            memmove(d + r * dpitch, s + r * spitch, width);
    });
    if (dk == SIM_HOST)   /* pageable: done before the call returns */
        block_on_all(stream_of(stream), call);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    return copy(dst, bytes, src, bytes, bytes, 1, kind, s, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s)
{
    return copy(dst, dpitch, src, spitch, width, height, kind, s, "cudaMemcpy2DAsync");
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s)
{
    if (!bytes)
        return cudaSuccess;
    sim_need_device(p, bytes, "cudaMemsetAsync");
    sim_enqueue(s, "cudaMemsetAsync", [=] { memset(p, value, bytes); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes, 0); }

/* ── the device ── */

static int current_device;
static cudaError_t last_error;

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = env_int("FSD_CUDASIM_DEVICES", 8);
    return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int device)
{
    int n;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return cudaErrorNoDevice;
    if (device < 0 || device >= n)
        return cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    int n;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n)
        return cudaErrorInvalidDevice;
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    }
    return cudaErrorInvalidValue;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return cudaSuccess;
}

} /* extern "C" */

/* ── launches ── */

dim3 threadIdx, blockIdx, blockDim, gridDim;

/* Kernels whose threads meet at __syncthreads (runtime/cuda_kernels.cu). */
static const std::set<std::string> team_kernels = {"sumsq_partial_kernel", "sumsq_finish_kernel"};

static const char *running_kernel;
static bool in_team;
static std::vector<std::vector<char>> team_stack;
static std::vector<int> team_state;   /* 0 runnable, 1 at the barrier, 2 returned */
static unsigned team_tid;
static std::function<void()> *team_body;

/* Coroutines for a block's threads: team_ctx[t] and team_main are where
 * each side resumes. On x86-64 a switch is six callee-saved registers and
 * the stack pointer (switch_to, below); elsewhere ucontext, whose switches
 * also save the signal mask, a system call each (a tiny step ~7x slower). */
#if defined(__x86_64__)
extern "C" void cudasim_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl cudasim_switch\n"
        ".type cudasim_switch, @function\n"
        "cudasim_switch:\n"
        "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n"
        "    pushq %r13\n    pushq %r14\n    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n    popq %r14\n    popq %r13\n"
        "    popq %r12\n    popq %rbx\n    popq %rbp\n"
        "    ret\n"
        ".size cudasim_switch, .-cudasim_switch\n");
typedef void *Context;
static Context team_main;
static std::vector<Context> team_ctx;
static void switch_to(Context *save, Context *load) { cudasim_switch(save, *load); }
/* A fresh stack whose first switch "returns" into entry: six zero
 * registers, entry's address, and a null return address for entry, so
 * entry starts with the stack aligned as after a call. */
static void make_context(Context *c, std::vector<char> &stack, void (*entry)(void))
{
    uintptr_t top = ((uintptr_t)stack.data() + stack.size()) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    for (int i = 0; i < 6; i++)
        sp[i] = NULL;
    sp[6] = (void *)entry;
    sp[7] = NULL;
    *c = sp;
}
#else
typedef ucontext_t Context;
static Context team_main;
static std::vector<Context> team_ctx;
static void switch_to(Context *save, Context *load) { swapcontext(save, load); }
static void make_context(Context *c, std::vector<char> &stack, void (*entry)(void))
{
    getcontext(c);
    c->uc_stack.ss_sp = stack.data();
    c->uc_stack.ss_size = stack.size();
    c->uc_link = NULL;
    makecontext(c, entry, 0);
}
#endif

void __syncthreads(void)
{
    if (!in_team)
        sim_fail("kernel %s calls __syncthreads: name it in tests/cudasim/device.cc's "
                 "team_kernels", running_kernel ? running_kernel : "?");
    team_state[team_tid] = 1;
    switch_to(&team_ctx[team_tid], &team_main);
}

/* A thread's whole run; it never returns, it hands back for good. */
static void team_entry(void)
{
    (*team_body)();
    team_state[team_tid] = 2;
    switch_to(&team_ctx[team_tid], &team_main);
    abort();   /* not resumed once returned */
}

/* One block of a team kernel: its threads take turns up to each barrier. */
static void run_team_block(unsigned block, std::function<void()> &body)
{
    team_body = &body;
    team_ctx.resize(block);
    team_state.assign(block, 0);
    if (team_stack.size() < block)
        team_stack.resize(block);
    for (unsigned t = 0; t < block; t++) {
        team_stack[t].resize(64 << 10);
        make_context(&team_ctx[t], team_stack[t], team_entry);
    }
    for (;;) {
        for (unsigned t = 0; t < block; t++) {
            team_tid = t;
            threadIdx = dim3{t, 0, 0};
            switch_to(&team_main, &team_ctx[t]);
        }
        int at_barrier = 0, returned = 0;
        for (unsigned t = 0; t < block; t++) {
            at_barrier += team_state[t] == 1;
            returned += team_state[t] == 2;
        }
        if (returned == (int)block)
            return;
        if (returned)
            sim_fail("kernel %s: %d threads of a block wait at __syncthreads that %d others "
                     "returned without reaching", running_kernel, at_barrier, returned);
        for (unsigned t = 0; t < block; t++)
            team_state[t] = 0;
    }
}

void cudasim_launch(cudaStream_t s, const char *kernel, unsigned grid, unsigned block,
                    std::function<void()> body)
{
    if (grid < 1 || grid > 2147483647u || block < 1 || block > 1024) {
        last_error = cudaErrorInvalidValue;
        return;
    }
    bool team = team_kernels.count(kernel) > 0;
    sim_enqueue(s, kernel, [=]() mutable {
        running_kernel = kernel;
        blockDim = dim3{block, 1, 1};
        gridDim = dim3{grid, 1, 1};
        for (unsigned b = 0; b < grid; b++) {
            blockIdx = dim3{b, 0, 0};
            if (team) {
                in_team = true;
                run_team_block(block, body);
                in_team = false;
            } else {
                for (unsigned t = 0; t < block; t++) {
                    threadIdx = dim3{t, 0, 0};
                    body();
                }
            }
        }
        running_kernel = NULL;
    });
}
