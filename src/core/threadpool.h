/*
 * threadpool.h - the process-wide intra-op thread pool and CPU facts.
 *
 * One pool, sized to the machine, is shared by every model and session.
 * oneDNN (built with the OpenMP runtime) uses the same OpenMP workers, so
 * Kiln's own kernels and oneDNN's never oversubscribe the cores; idle
 * workers sleep instead of spinning (see threadpool.c).
 *
 * A run leases threads for its duration: when another run holds the pool,
 * the run gets 1 thread (its own) so concurrent requests each use one core
 * instead of fighting over all of them.
 */
#ifndef KILN_CORE_THREADPOOL_H
#define KILN_CORE_THREADPOOL_H

#include <stdint.h>

#include "kiln/kiln_util.h"

enum kiln_isa { KILN_ISA_SCALAR = 0, KILN_ISA_AVX2 = 1, KILN_ISA_AVX512 = 2 };

/* kiln_cpu_count and kiln_threads_unpin_caller: include/kiln/kiln_util.h. */
/* Best instruction set of this CPU; KILN_ISA=scalar|avx2|avx512 in the
 * environment lowers it (for tests of every path). */
enum kiln_isa kiln_cpu_isa(void);

/* Lease up to `wanted` threads (0 = all) for one run; returns how many were
 * granted (>= 1). Also sets oneDNN's thread count for the calling thread. */
int kiln_threads_acquire(int wanted);
void kiln_threads_release(int granted);

/* Call fn(ctx, begin, end) over disjoint chunks covering [0, n), using up to
 * `threads` threads (the caller included); chunks are at least `grain`
 * long. threads <= 1 or small n runs inline with no synchronization. */
typedef void (*kiln_range_fn)(void *ctx, int64_t begin, int64_t end);
void kiln_parallel_for(int threads, int64_t n, int64_t grain, kiln_range_fn fn, void *ctx);

/* The grain of a memory-bound copy (gathers, slices, pads, concats, interleaves) whose
 * units move unit_bytes each: chunks of at least KILN_COPY_GRAIN_BYTES, so a copy of under
 * twice that runs on one thread. Forking and joining costs a few microseconds even with
 * the workers awake, and a second thread reads what the producer left in the other core's
 * cache: with 16 KB chunks, shufflenet_v2's channel gathers and slices (33 KB each at batch
 * 1) made the model slower on two threads than on one. Measured on a 2-core AVX2 VM
 * against 16 KB: batch 1 1.26 -> 1.14 ms, batch 8 (267 KB and up, still split) 7.61 ->
 * 7.53; 256 KB chunks lost at batch 8 (8.4 ms). */
#define KILN_COPY_GRAIN_BYTES (64 * 1024)
static inline int64_t kiln_copy_grain(int64_t unit_bytes)
{
    return unit_bytes >= KILN_COPY_GRAIN_BYTES ? 1
                                               : KILN_COPY_GRAIN_BYTES / (unit_bytes > 0 ? unit_bytes : 1);
}

/* Call fn(ctx, tid, nt) once on each of nt <= threads threads of one
 * parallel region (tid 0 is the caller); fn may call kiln_team_barrier to
 * wait for the team. For a loop of short dependent passes (a recurrent
 * layer's time steps): one region and a barrier per pass instead of a
 * region per pass. threads <= 1 (or inside a region) calls fn(ctx, 0, 1). */
typedef void (*kiln_team_fn)(void *ctx, int tid, int nt);
void kiln_parallel_team(int threads, kiln_team_fn fn, void *ctx);

/* Wait until every thread of the calling team (nt from fn's arguments)
 * arrives; nothing when nt <= 1, so that fn called inline inside another
 * region never waits on that region's team. */
void kiln_team_barrier(int nt);

#endif
