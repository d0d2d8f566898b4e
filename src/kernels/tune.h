/*
 * tune.h - choosing among a node's eligible kernels by timing them.
 *
 * Where more than one implementation can run a node and no rule can say
 * which is faster on every shape and CPU (oneDNN's Winograd or direct
 * convolution, the plan's activation layout or the one oneDNN prefers,
 * sparse or dense), a kernel compiles each candidate as a full
 * kiln_kernel_inst and times them here on the node's real shapes and
 * layouts, at plan compile time. The decision is kept in the weight cache
 * as an int slot bound to the node's constant weight and a tag naming the
 * shape (kiln_kernel_choice_slot), so every plan of a model decides once
 * per (weight, shape, layouts, threads); a saved .kiln carries the slots
 * (SPRS / TUNE sections), so loading it does not time again.
 */
#ifndef KILN_KERNELS_TUNE_H
#define KILN_KERNELS_TUNE_H

#include "kernels/fast.h"

/* Time the n instances (n <= KILN_TUNE_MAX) on cc's shapes and layouts:
 * random inputs in [-1, 1) for every non-constant input (stored in its
 * layout), constants as they are; one warm-up run of each, then `rounds`
 * interleaved timed runs (fewer when one warm-up run of instance 0 took
 * over 20 ms), best_s[i] = the fastest run of instance i in seconds. A run
 * counts as the smaller of its wall time and the process's CPU time over
 * cc->threads: on a machine shared with busy processes the wall time mostly
 * measures their time slices, the CPU time does not (threads waiting at a
 * barrier spin, so an unbalanced kernel still pays). A node whose constants total
 * 4 MiB or more has the caches flushed before each timed run and two rounds. */
#define KILN_TUNE_MAX 4
/* Most bytes written before each timed run of a node whose constants total 4 MiB or
 * more (4x their size, at least 16 MiB), so that its weights come from memory as they
 * do in a model. */
#define KILN_TUNE_FLUSH_BYTES ((size_t)64 << 20)
kiln_status kiln_kernel_time(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *const *insts,
                             int n, int rounds, double *best_s);

/* The decision slot (an int, -1 until decided) of constant w under tag in
 * cc's weight cache (which must exist): 0 bytes, so the cache's
 * packed-bytes count is unchanged. */
kiln_status kiln_kernel_choice_slot(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                                    const char *tag, int **slot);

#endif
