/*
 * test_device.cc — unit test of cudasim's device (device.cc): the CUDA
 * runtime's streams, events, copies and launches on the host.
 *
 *   make build/cudasim/test_device && build/cudasim/test_device
 *   (or under mpirun -np 1; one process, no collectives)
 *
 * Checks, each named in its line of output:
 *   - lazy streams (the default; this test sets FSD_CUDASIM=lazy): an op on
 *     a side stream runs only when waited for; a stream waiting on an
 *     event runs the recording stream up to the record and not beyond, and
 *     a re-record after the wait does not move what it waits for (CUDA
 *     captures at the call); the host waits (event, stream, device
 *     synchronize, cudaFree) drain; cudaEventQuery answers NotReady once,
 *     then runs the work and answers Success; elapsed times;
 *   - eager streams (FSD_CUDASIM=eager, in a child forked before any
 *     stream exists, since device.cc reads the mode once): ops run at once;
 *   - copies: pageable sources staged at the call, pageable destinations
 *     filled before the call returns, pinned memory read and written when
 *     the copy runs, 2D pitches, fresh memory 0xff;
 *   - launches: grid-stride kernels cover each element once; a kernel in
 *     device.cc's team_kernels (this file's static sumsq_partial_kernel and
 *     sumsq_finish_kernel borrow the names) reduces through __shared__
 *     memory at __syncthreads;
 *   - FSD_CUDASIM_DROP_WAITS=1 makes a wait order nothing;
 *   - refusals: each in a forked child that must exit 3 with the expected
 *     "cudasim: rank R: ..." message (wrong copy kinds, copies past an
 *     allocation, frees of what was not allocated, __syncthreads outside a
 *     team kernel, threads that return before a barrier others wait at, a
 *     stream that waits on its own later work).
 * Prints one line per check and "test_device: ok (0 failed checks)" or
 * "test_device: FAILED (N of M checks failed)" last; exits 1 on failure.
 */
#include "kernel.h"
#include "check.h"
#include "sim.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

/* ── helpers ── */

#define CUDA(call)                                                         \
    do {                                                                   \
        cudaError_t e_ = (call);                                           \
        if (e_ != cudaSuccess) {                                           \
            printf("FAIL: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,     \
                   cudaGetErrorString(e_));                                \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

/* The compute stream: device.cc runs its ops as they are queued, as it
 * does cuda_boot.c's (fsdrt_cuda_stream is a weak symbol there). */
static cudaStream_t compute;
extern "C" cudaStream_t fsdrt_cuda_stream(void) { return compute; }

static cudaStream_t new_stream(void)
{
    cudaStream_t s;
    CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0));
    return s;
}

static cudaEvent_t new_event(unsigned flags)
{
    cudaEvent_t e;
    CUDA(cudaEventCreateWithFlags(&e, flags));
    return e;
}

static void *dev(size_t bytes)
{
    void *p;
    CUDA(cudaMalloc(&p, bytes));
    return p;
}

/* What ran: marks append their number when their stream runs them. */
static std::vector<int> ran;

static void mark(cudaStream_t s, int n)
{
    sim_enqueue(s, "mark", [n] { ran.push_back(n); });
}

static std::string ran_str(void)
{
    std::string r = "{";
    for (size_t i = 0; i < ran.size(); i++)
        r += (i ? "," : "") + std::to_string(ran[i]);
    return r + "}";
}

static bool ran_is(std::vector<int> want) { return ran == want; }


/* Runs f in a forked child, after setting the environment variable
 * name=value; the child's exit status is the number of its failed checks
 * (its lines go to stdout as the parent's do). */
static void in_child(const char *name, const char *value, const std::function<void()> &f)
{
    CUDA(cudaDeviceSynchronize());
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv(name, value, 1);
        failures = 0;
        f();
        fflush(stdout);
        _exit(failures > 100 ? 100 : failures);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s=%s: the child's checks passed "
          "(exit %d)", name, value, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* ── eager streams (a child: run before any stream exists) ── */

static void eager_checks(void)
{
    compute = new_stream();
    cudaStream_t side = new_stream();
    ran.clear();
    mark(side, 1);
    check(ran_is({1}), "eager: an op on a side stream runs as it is queued: %s", ran_str().c_str());
    cudaEvent_t e = new_event(cudaEventDisableTiming);
    mark(side, 2);
    CUDA(cudaEventRecord(e, side));
    check(cudaEventQuery(e) == cudaSuccess, "eager: an event on a side stream is complete at once");
    int *d = (int *)dev(64);
    int h[16];
    for (int i = 0; i < 16; i++)
        h[i] = i;
    CUDA(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, side));
    check(d[5] == 5, "eager: a copy to the device on a side stream lands at once");
    CUDA(cudaFree(d));
}

/* ── lazy streams ── */

static void lazy_order(cudaStream_t b, cudaStream_t c)
{
    ran.clear();
    mark(b, 1);
    check(ran.empty(), "lazy: an op on a side stream does not run when queued: %s",
          ran_str().c_str());
    CUDA(cudaStreamSynchronize(b));
    check(ran_is({1}), "lazy: cudaStreamSynchronize runs it: %s", ran_str().c_str());

    /* the compute stream waits: B runs up to the record, not beyond */
    ran.clear();
    cudaEvent_t e = new_event(cudaEventDisableTiming);
    mark(b, 1);
    CUDA(cudaEventRecord(e, b));
    mark(b, 2);
    CUDA(cudaStreamWaitEvent(compute, e, 0));
    check(ran_is({1}), "lazy: the compute stream waiting on B's event runs B up to the record "
          "and not beyond: %s", ran_str().c_str());
    mark(compute, 3);
    check(ran_is({1, 3}), "lazy: the compute stream runs its own op at once: %s",
          ran_str().c_str());
    CUDA(cudaStreamSynchronize(b));
    check(ran_is({1, 3, 2}), "lazy: B's later op runs at its synchronize: %s", ran_str().c_str());

    /* a side stream waits; the event is then re-recorded later on B: the
     * wait still means the first record (CUDA captures at the call) */
    ran.clear();
    mark(b, 1);
    CUDA(cudaEventRecord(e, b));
    CUDA(cudaStreamWaitEvent(c, e, 0));
    mark(b, 2);
    CUDA(cudaEventRecord(e, b));
    mark(c, 3);
    check(ran.empty(), "lazy: a wait between side streams runs nothing yet: %s",
          ran_str().c_str());
    CUDA(cudaStreamSynchronize(c));
    check(ran_is({1, 3}), "lazy: C's wait, made before the event was re-recorded, runs B up to "
          "the first record only: %s", ran_str().c_str());
    CUDA(cudaStreamSynchronize(b));
    check(ran_is({1, 3, 2}), "lazy: B's op after the first record runs at B's synchronize: %s",
          ran_str().c_str());

    /* a wait on an event never recorded waits for nothing */
    ran.clear();
    cudaEvent_t never = new_event(cudaEventDisableTiming);
    mark(b, 1);
    CUDA(cudaStreamWaitEvent(compute, never, 0));
    check(ran.empty(), "lazy: a wait on a never-recorded event runs nothing: %s",
          ran_str().c_str());
    CUDA(cudaStreamSynchronize(b));
    CUDA(cudaEventDestroy(never));
    CUDA(cudaEventDestroy(e));
}

static void lazy_host_waits(cudaStream_t b, cudaStream_t c)
{
    cudaEvent_t e = new_event(cudaEventDisableTiming);

    ran.clear();
    mark(b, 1);
    CUDA(cudaEventRecord(e, b));
    mark(b, 2);
    CUDA(cudaEventSynchronize(e));
    check(ran_is({1}), "lazy: cudaEventSynchronize runs the stream up to the record only: %s",
          ran_str().c_str());
    CUDA(cudaStreamSynchronize(b));

    ran.clear();
    mark(b, 1);
    mark(c, 2);
    CUDA(cudaDeviceSynchronize());
    check(ran.size() == 2, "lazy: cudaDeviceSynchronize runs every stream: %s",
          ran_str().c_str());

    ran.clear();
    void *p = dev(16);
    mark(b, 1);
    mark(c, 2);
    CUDA(cudaFree(p));
    check(ran.size() == 2, "lazy: cudaFree synchronises the device: %s", ran_str().c_str());

    /* cudaEventQuery: NotReady once (nothing run), then it runs the work */
    ran.clear();
    mark(b, 1);
    CUDA(cudaEventRecord(e, b));
    mark(b, 2);
    cudaError_t q1 = cudaEventQuery(e);
    const bool none = ran.empty();
    cudaError_t q2 = cudaEventQuery(e);
    check(q1 == cudaErrorNotReady && none && q2 == cudaSuccess && ran_is({1}),
          "lazy: cudaEventQuery answers NotReady (%d, nothing run: %d), then runs up to the "
          "record and answers Success (%d): %s", (int)q1, none, (int)q2, ran_str().c_str());
    check(cudaEventQuery(e) == cudaSuccess, "lazy: a completed event stays complete");
    CUDA(cudaEventRecord(e, b));
    check(cudaEventQuery(e) == cudaErrorNotReady, "lazy: a re-recorded event is pending again");
    cudaError_t q3 = cudaEventQuery(e);
    check(q3 == cudaSuccess && ran_is({1, 2}),
          "lazy: ... and its second query runs B to the new record: %s", ran_str().c_str());

    cudaEvent_t never = new_event(cudaEventDefault);
    check(cudaEventQuery(never) == cudaSuccess, "a never-recorded event is complete");
    CUDA(cudaEventSynchronize(never));
    CUDA(cudaEventDestroy(never));
    CUDA(cudaEventDestroy(e));
}

static void elapsed_times(cudaStream_t b)
{
    cudaEvent_t t0 = new_event(cudaEventDefault), t1 = new_event(cudaEventDefault);
    float ms = -1;
    cudaError_t r = cudaEventElapsedTime(&ms, t0, t1);
    check(r == cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of never-recorded events: "
          "InvalidResourceHandle, as CUDA documents (got %d)", (int)r);

    ran.clear();
    CUDA(cudaEventRecord(t0, b));
    sim_enqueue(b, "sleep", [] { usleep(3000); });
    CUDA(cudaEventRecord(t1, b));
    r = cudaEventElapsedTime(&ms, t0, t1);
    check(r == cudaErrorNotReady, "lazy: elapsed time before the records ran: NotReady (%d)",
          (int)r);
    CUDA(cudaStreamSynchronize(b));
    r = cudaEventElapsedTime(&ms, t0, t1);
    check(r == cudaSuccess && ms >= 2.5f && ms < 1000, "elapsed time across a 3 ms op: %d, %.3f ms",
          (int)r, ms);
    r = cudaEventElapsedTime(&ms, t1, t0);
    check(r == cudaSuccess && ms <= 0, "elapsed time backwards is negative: %.3f ms", ms);

    /* on the compute stream: records run at once */
    CUDA(cudaEventRecord(t0, compute));
    CUDA(cudaEventRecord(t1, compute));
    r = cudaEventElapsedTime(&ms, t0, t1);
    check(r == cudaSuccess && ms >= 0, "elapsed time between two compute-stream records: %d, "
          "%.4f ms", (int)r, ms);

    /* re-recording the start: NotReady until the new record has run */
    CUDA(cudaEventRecord(t0, b));
    r = cudaEventElapsedTime(&ms, t0, t1);
    check(r == cudaErrorNotReady, "elapsed time with a pending re-record: NotReady (%d)", (int)r);
    CUDA(cudaStreamSynchronize(b));

    cudaEvent_t n0 = new_event(cudaEventDisableTiming), n1 = new_event(cudaEventDisableTiming);
    CUDA(cudaEventRecord(n0, compute));
    CUDA(cudaEventRecord(n1, compute));
    check(cudaEventElapsedTime(&ms, n0, n1) == cudaErrorInvalidResourceHandle &&
              cudaEventElapsedTime(&ms, t0, n1) == cudaErrorInvalidResourceHandle,
          "cudaEventDisableTiming events: InvalidResourceHandle in cudaEventElapsedTime");
    for (cudaEvent_t e : {t0, t1, n0, n1})
        CUDA(cudaEventDestroy(e));
}

/* ── copies ── */

static void copies(cudaStream_t b)
{
    const int n = 64;
    unsigned char *d = (unsigned char *)dev(n);
    bool all_ff = true;
    for (int i = 0; i < n; i++)
        all_ff &= d[i] == 0xff;
    void *pin;
    CUDA(cudaMallocHost(&pin, n));
    bool pin_ff = true;
    for (int i = 0; i < n; i++)
        pin_ff &= ((unsigned char *)pin)[i] == 0xff;
    check(all_ff && pin_ff, "fresh cudaMalloc and cudaMallocHost memory is 0xff bytes (%d, %d)",
          all_ff, pin_ff);

    /* from pageable memory: staged at the call */
    std::vector<unsigned char> h(n, 1);
    CUDA(cudaMemcpyAsync(d, h.data(), n, cudaMemcpyHostToDevice, b));
    const bool not_yet = d[0] == 0xff;
    std::fill(h.begin(), h.end(), 2);
    CUDA(cudaStreamSynchronize(b));
    check(not_yet && d[0] == 1 && d[n - 1] == 1, "lazy: a copy from pageable memory is pending "
          "(%d) and lands what the source held at the call (%d, not 2)", not_yet, d[0]);

    /* into pageable memory: done before the call returns, with B's earlier work */
    CUDA(cudaMemsetAsync(d, 7, n, b));
    std::fill(h.begin(), h.end(), 0);
    CUDA(cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, b));
    check(h[0] == 7 && h[n - 1] == 7, "lazy: a copy into pageable memory is done when the call "
          "returns, after the stream's earlier memset (%d)", h[0]);

    /* from pinned memory: read when the copy runs */
    memset(pin, 3, n);
    CUDA(cudaMemcpyAsync(d, pin, n, cudaMemcpyHostToDevice, b));
    memset(pin, 4, n);
    CUDA(cudaStreamSynchronize(b));
    check(d[0] == 4 && d[n - 1] == 4, "lazy: a copy from pinned memory reads it when it runs "
          "(%d, not 3)", d[0]);

    /* into pinned memory: written when the copy runs */
    CUDA(cudaMemsetAsync(d, 5, n, b));
    memset(pin, 0, n);
    CUDA(cudaMemcpyAsync(pin, d, n, cudaMemcpyDeviceToHost, b));
    const unsigned char before = ((unsigned char *)pin)[0];
    CUDA(cudaStreamSynchronize(b));
    check(before == 0 && ((unsigned char *)pin)[0] == 5, "lazy: a copy into pinned memory lands "
          "when the stream runs (%d before, %d after)", before, ((unsigned char *)pin)[0]);

    /* device to device, cudaMemcpyDefault */
    unsigned char *d2 = (unsigned char *)dev(n);
    CUDA(cudaMemcpyAsync(d2, d, n, cudaMemcpyDeviceToDevice, b));
    CUDA(cudaMemsetAsync(d, 9, n, b));
    CUDA(cudaMemcpyAsync(h.data(), d2, n, cudaMemcpyDefault, b));
    check(h[0] == 5 && d[0] == 9, "device to device in stream order, then cudaMemcpyDefault to "
          "pageable memory (%d, %d)", h[0], d[0]);

    /* 2D: 3 rows of 5 bytes, source pitch 7, destination pitch 8 */
    unsigned char *d3 = (unsigned char *)dev(3 * 8);
    unsigned char src[3 * 7];
    for (int i = 0; i < 21; i++)
        src[i] = (unsigned char)(10 + i);
    CUDA(cudaMemcpy2DAsync(d3, 8, src, 7, 5, 3, cudaMemcpyHostToDevice, b));
    CUDA(cudaStreamSynchronize(b));
    bool ok2d = true;
    for (int r = 0; r < 3; r++)
        for (int x = 0; x < 8; x++)
            ok2d &= d3[r * 8 + x] == (x < 5 ? src[r * 7 + x] : 0xff);
    unsigned char back[3 * 6];
    memset(back, 0, sizeof back);
    CUDA(cudaMemcpy2DAsync(back, 6, d3, 8, 5, 3, cudaMemcpyDeviceToHost, b));
    for (int r = 0; r < 3; r++)
        for (int x = 0; x < 6; x++)
            ok2d &= back[r * 6 + x] == (x < 5 ? src[r * 7 + x] : 0);
    check(ok2d, "cudaMemcpy2DAsync keeps both pitches and leaves the gaps alone");
    check(cudaMemcpy2DAsync(d3, 4, src, 7, 5, 3, cudaMemcpyHostToDevice, b) ==
              cudaErrorInvalidValue,
          "cudaMemcpy2DAsync with a width past the pitch: InvalidValue");

    cudaPointerAttributes a;
    CUDA(cudaPointerGetAttributes(&a, d + 3));
    cudaMemoryType td = a.type;
    CUDA(cudaPointerGetAttributes(&a, pin));
    cudaMemoryType tp = a.type;
    CUDA(cudaPointerGetAttributes(&a, h.data()));
    check(td == cudaMemoryTypeDevice && tp == cudaMemoryTypeHost &&
              a.type == cudaMemoryTypeUnregistered,
          "cudaPointerGetAttributes: device, pinned, pageable (%d %d %d)", td, tp, a.type);

    CUDA(cudaFree(d));
    CUDA(cudaFree(d2));
    CUDA(cudaFree(d3));
    CUDA(cudaFreeHost(pin));
}

static void copy_refusals(cudaStream_t b)
{
    expect_fail("HostToDevice from device memory", "device memory where host memory is needed",
                [b] {
                    void *x = dev(16), *y = dev(16);
                    cudaMemcpyAsync(x, y, 16, cudaMemcpyHostToDevice, b);
                });
    expect_fail("DeviceToHost into device memory", "device memory where host memory is needed",
                [b] {
                    void *x = dev(16), *y = dev(16);
                    cudaMemcpyAsync(x, y, 16, cudaMemcpyDeviceToHost, b);
                });
    expect_fail("HostToDevice into pinned host memory", "is not device memory", [b] {
        void *pin, *h = malloc(16);
        cudaMallocHost(&pin, 16);
        cudaMemcpyAsync(pin, h, 16, cudaMemcpyHostToDevice, b);
    });
    expect_fail("DeviceToHost from pageable memory", "is not device memory", [b] {
        char h[16] = {0}, g[16] = {0};
        cudaMemcpyAsync(h, g, 16, cudaMemcpyDeviceToHost, b);
    });
    expect_fail("a copy 4 bytes past an allocation's end", "run 4 bytes past the end", [b] {
        char h[16] = {0};
        char *x = (char *)dev(16);
        cudaMemcpyAsync(x + 4, h, 16, cudaMemcpyHostToDevice, b);
    });
    expect_fail("a 2D copy whose last row runs past the end", "past the end", [b] {
        char h[64] = {0};
        char *x = (char *)dev(20);   /* 3 rows at pitch 8 need 8·2 + 5 = 21 */
        cudaMemcpy2DAsync(x, 8, h, 8, 5, 3, cudaMemcpyHostToDevice, b);
    });
    expect_fail("a DeviceToDevice copy from a freed block", "is not device memory", [b] {
        void *x = dev(16), *y = dev(16);
        cudaFree(y);
        cudaMemcpyAsync(x, y, 16, cudaMemcpyDeviceToDevice, b);
    });
    expect_fail("a memset past an allocation's end", "past the end", [b] {
        char *x = (char *)dev(16);
        cudaMemsetAsync(x + 8, 0, 16, b);
    });
    expect_fail("cudaFree of pageable memory", "not the start of a live device allocation", [] {
        cudaFree(malloc(16));
    });
    expect_fail("cudaFree inside an allocation", "not the start of a live device allocation", [] {
        cudaFree((char *)dev(16) + 4);
    });
    expect_fail("cudaFree twice", "not the start of a live device allocation", [] {
        void *x = dev(16);
        cudaFree(x);
        cudaFree(x);
    });
    expect_fail("cudaFreeHost of device memory", "not the start of a live pinned host allocation",
                [] { cudaFreeHost(dev(16)); });
    expect_fail("nothing wrong (control: exits 3 on purpose)", "control", [b] {
        char h[16] = {0};
        char *x = (char *)dev(16);
        cudaMemcpyAsync(x, h, 16, cudaMemcpyHostToDevice, b);
        cudaStreamSynchronize(b);
        sim_fail("control");
    });
}

/* ── a stream waiting on its own later work ──
 *
 * Not constructible through the CUDA calls: cudaStreamWaitEvent captures
 * the event's last record at the call, so every wait is on work already
 * queued, and waits follow call order (no cycle). It is through sim.h: an
 * op (the simulator's, like a host callback) that synchronises its own
 * stream while a later op is queued there. */
static void hang(cudaStream_t b)
{
    expect_fail("an op that synchronises its own stream (via sim_enqueue)", "would hang", [b] {
        sim_enqueue(b, "self-sync", [b] { cudaStreamSynchronize(b); });
        mark(b, 2);
        cudaStreamSynchronize(b);
    });
}

/* An op that cannot finish (sim_enqueue_until, the NCCL fake's hung
 * collective): its stream stops there, events behind it stay not ready, a
 * stream waiting on one stops too, and a host call that would block on it
 * stops the run. */
static void stuck(void)
{
    in_child("FSD_CUDASIM", "lazy", [] {
        cudaStream_t s = new_stream();
        bool release = false;
        ran.clear();
        sim_enqueue_until(s, "stuck", [&release] { return release; });
        mark(s, 1);
        cudaEvent_t e = new_event(cudaEventDisableTiming);
        CUDA(cudaEventRecord(e, s));
        cudaError_t q1 = cudaEventQuery(e), q2 = cudaEventQuery(e);
        check(q1 == cudaErrorNotReady && q2 == cudaErrorNotReady && ran.empty(),
              "a stuck op: an event behind it stays not ready (%d, %d), nothing after it runs: %s",
              (int)q1, (int)q2, ran_str().c_str());
        CUDA(cudaStreamWaitEvent(compute, e, 0));
        mark(compute, 2);
        check(ran.empty(), "a stuck op: the compute stream waiting on it stops too: %s",
              ran_str().c_str());
        release = true;
        CUDA(cudaStreamSynchronize(compute));
        check(ran_is({1, 2}), "a stuck op, once it can finish: both streams run on: %s",
              ran_str().c_str());
    });
    expect_fail("a host synchronize on a stuck stream", "waits forever", [] {
        cudaStream_t s = new_stream();
        sim_enqueue_until(s, "stuck", [] { return false; });
        cudaStreamSynchronize(s);
    });
}

/* sim_need_after_compute: a stream is ordered after the compute stream's
 * ops through events recorded there (or on a stream ordered so), as of
 * the wait's issue. */
static void ordering(cudaStream_t b, cudaStream_t c)
{
    mark(compute, 1);
    cudaEvent_t e = new_event(cudaEventDisableTiming);
    CUDA(cudaEventRecord(e, compute));
    CUDA(cudaStreamWaitEvent(b, e, 0));
    /* in a child, which exits 3 if either is refused */
    in_child("FSD_CUDASIM", "lazy", [b, c, e] {
        sim_need_after_compute(b, "a collective after a fence");
        CUDA(cudaEventRecord(e, b));
        CUDA(cudaStreamWaitEvent(c, e, 0));
        sim_need_after_compute(c, "a collective after a fence through another stream");
    });
    expect_fail("work on the legacy stream once the compute stream exists", "legacy stream",
                [] { cudaMemset(dev(16), 0, 16); });
    expect_fail("a collective queued after more compute work than its fence covers",
                "is ordered after only", [b] {
                    mark(compute, 2);
                    sim_need_after_compute(b, "a collective");
                });
    CUDA(cudaDeviceSynchronize());
}

/* ── launches ── */

static void count_kernel(int *count, int n)   /* grid-stride: one increment per element */
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        count[i]++;
}

/* These borrow the names device.cc's team_kernels lists, so their threads
 * meet at __syncthreads: a block tree reduction through __shared__ memory
 * of sum x² over a grid stride (partial), then of the partials (finish). */
static void sumsq_partial_kernel(const float *x, int n, float *partial)
{
    __shared__ float acc[256];
    const unsigned t = threadIdx.x;
    float s = 0;
    for (int i = blockIdx.x * blockDim.x + t; i < n; i += blockDim.x * gridDim.x)
        s += x[i] * x[i];
    acc[t] = s;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half)
            acc[t] += acc[t + half];
        __syncthreads();
    }
    if (t == 0)
        partial[blockIdx.x] = acc[0];
}

static void sumsq_finish_kernel(const float *partial, int n, float *out)
{
    __shared__ float acc[256];
    const unsigned t = threadIdx.x;
    acc[t] = t < (unsigned)n ? partial[t] : 0;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half)
            acc[t] += acc[t + half];
        __syncthreads();
    }
    if (t == 0)
        *out = acc[0];
}

static void stray_sync_kernel(int *x)   /* not in team_kernels */
{
    x[threadIdx.x] = 1;
    __syncthreads();
}

static void launches(cudaStream_t b)
{
    const int n = 1000;
    int *count = (int *)dev(n * sizeof(int));
    CUDA(cudaMemsetAsync(count, 0, n * sizeof(int), compute));
    LAUNCH(count_kernel, 3, 128, compute, count, n);
    bool once = true;
    for (int i = 0; i < n; i++)
        once &= count[i] == 1;
    check(once, "a grid-stride kernel of 3 blocks × 128 threads on the compute stream covers "
          "each of %d elements once, at the launch", n);

    LAUNCH(count_kernel, 7, 32, b, count, n);
    const bool pending = count[0] == 1;
    CUDA(cudaStreamSynchronize(b));
    bool twice = true;
    for (int i = 0; i < n; i++)
        twice &= count[i] == 2;
    check(pending && twice, "lazy: a launch on a side stream runs at its synchronize (%d), "
          "7 × 32 threads covering each element once more", pending);

    CUDA(cudaGetLastError());
    LAUNCH(count_kernel, 1, 1025, compute, count, n);
    cudaError_t e1 = cudaGetLastError(), e2 = cudaGetLastError();
    check(e1 != cudaSuccess && e2 == cudaSuccess && count[0] == 2,
          "a launch of 1025 threads a block fails in cudaGetLastError (%d), once, running nothing",
          (int)e1);

    /* team kernels: sum of squares of 0..n-1 (exact in fp32 while < 2^24) */
    const int m = 300;
    float *x = (float *)dev(m * sizeof(float)), *partial = (float *)dev(4 * sizeof(float));
    float *out = (float *)dev(sizeof(float));
    for (int i = 0; i < m; i++)
        x[i] = (float)i;
    double want = 0;
    for (int i = 0; i < m; i++)
        want += (double)i * i;
    LAUNCH(sumsq_partial_kernel, 4, 64, b, x, m, partial);
    LAUNCH(sumsq_finish_kernel, 1, 256, b, partial, 4, out);
    float got = 0;
    CUDA(cudaMemcpyAsync(&got, out, sizeof got, cudaMemcpyDeviceToHost, b));
    check(got == (float)want, "team kernels: a block tree reduction through __shared__ memory "
          "and __syncthreads sums 0²..%d² = %.0f (got %.0f)", m - 1, want, got);

    expect_fail("__syncthreads in a kernel not in team_kernels", "team_kernels", [count] {
        LAUNCH(stray_sync_kernel, 1, 4, compute, count);
    });
    expect_fail("a team kernel whose odd threads return before a barrier",
                "returned without reaching", [] {
        cudasim_launch(compute, "sumsq_finish_kernel", 1, 8, [] {
            if (threadIdx.x % 2)
                return;
            __syncthreads();
        });
    });
    expect_fail("a team kernel whose thread 0 meets a second barrier the others skip",
                "returned without reaching", [] {
        cudasim_launch(compute, "sumsq_partial_kernel", 2, 4, [] {
            __syncthreads();
            if (threadIdx.x == 0)
                __syncthreads();
        });
    });
    for (void *p : {(void *)count, (void *)x, (void *)partial, (void *)out})
        CUDA(cudaFree(p));
}

/* ── FSD_CUDASIM_DROP_WAITS ── */

static void drop_waits(cudaStream_t b)
{
    in_child("FSD_CUDASIM_DROP_WAITS", "1", [b] {
        cudaEvent_t e = new_event(cudaEventDisableTiming);
        ran.clear();
        mark(b, 1);
        CUDA(cudaEventRecord(e, b));
        CUDA(cudaStreamWaitEvent(compute, e, 0));
        check(ran.empty(), "FSD_CUDASIM_DROP_WAITS=1: a compute stream's wait on B's event no "
              "longer runs B: %s", ran_str().c_str());
    });
}

int main()
{
    setenv("FSD_CUDASIM", "lazy", 1);
    unsetenv("FSD_CUDASIM_DROP_WAITS");
    /* first, before any stream exists here: device.cc reads the mode once */
    in_child("FSD_CUDASIM", "eager", eager_checks);
    expect_fail("FSD_CUDASIM=sloth", "FSD_CUDASIM=sloth: use eager or lazy", [] {
        setenv("FSD_CUDASIM", "sloth", 1);
        mark(new_stream(), 1);
    });

    compute = new_stream();
    cudaStream_t b = new_stream(), c = new_stream();
    lazy_order(b, c);
    lazy_host_waits(b, c);
    elapsed_times(b);
    copies(b);
    copy_refusals(b);
    hang(b);
    stuck();
    ordering(b, c);
    launches(b);
    drop_waits(b);

    CUDA(cudaStreamDestroy(b));
    CUDA(cudaStreamDestroy(c));
    if (failures)
        printf("test_device: FAILED (%d of %d checks failed)\n", failures, checks);
    else
        printf("test_device: ok (0 failed checks, %d checks)\n", checks);
    return failures ? 1 : 0;
}
