/*
 * sim.h — cudasim's own interface between its parts (device.cc: memory,
 * streams, events, launches; nccl.cc: NCCL over MPI; cublaslt.cc: cuBLASLt's
 * products on the host). C++, test-only; see README.md.
 */
#ifndef CUDASIM_SIM_H
#define CUDASIM_SIM_H

#include "cuda_runtime_api.h"

#include <functional>
#include <stddef.h>

/* Queues `op` on stream s: the device's work, run in stream order. The
 * compute stream (fsdrt_cuda_stream()) and the legacy stream 0 run it at
 * once, since the trainer's own kernels run on the host as they are
 * launched; other streams run it at once (FSD_CUDASIM=eager) or only when
 * something waits for it (lazy, the default). `what` names it in
 * messages. */
void sim_enqueue(cudaStream_t s, const char *what, std::function<void()> op);

/* The same for an op that may never finish (a collective a rank never
 * joins): it returns false while it cannot, and the stream stops there;
 * every later attempt to run the stream calls it again. Whatever waits on
 * the stream then waits too: events behind it stay not ready, a stream
 * waiting on one of them stops as well, and a host call that would block
 * on it (a synchronize, cudaFree, a copy into pageable memory) stops the
 * run, where the device would hang. */
void sim_enqueue_until(cudaStream_t s, const char *what, std::function<bool()> op);

/* Fails unless work queued on stream s now is ordered (through event
 * waits) after everything queued on the compute stream so far: what
 * runtime/cuda_comm.c's fence gives every collective, so that it sees the
 * gradients written and the shards updated. The compute stream runs its
 * ops at once here, so a missing fence would not change a result; this
 * catches it where it is made. */
void sim_need_after_compute(cudaStream_t s, const char *what);

/* Stops the process: "cudasim: rank R: <message>" on stderr, exit 3. For
 * a call the real library would reject or a use the device would fault
 * on. */
[[noreturn]] void sim_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* What memory p points into: SIM_DEVICE inside a cudaMalloc block,
 * SIM_PINNED inside a cudaMallocHost/cudaHostAlloc block, else SIM_HOST. */
enum SimMem { SIM_HOST, SIM_PINNED, SIM_DEVICE };
SimMem sim_kind(const void *p);

/* Fails (sim_fail, naming `what`) unless [p, p + bytes) lies inside one
 * device allocation that is still live. */
void sim_need_device(const void *p, size_t bytes, const char *what);

#endif
