/*
 * fast.h - the contract between the plan compiler and the fast kernels.
 *
 * A plan (src/exec/plan.c) is compiled for one set of concrete input
 * shapes. For every node it asks the node's fast kernel, if the op has one,
 * to compile itself for the node's concrete input and output types:
 *
 *     static kiln_status relu_compile(const struct kiln_compile_ctx *cc,
 *                                     struct kiln_kernel_inst *inst);
 *     KILN_FAST_OP(Relu, relu_compile);
 *
 * compile returns KILN_OK and sets inst->run when it handles the node, or
 * KILN_OK with inst->run left NULL when it does not (dtype, attribute or
 * shape it has no code for): the plan then uses the reference kernel.
 * Other statuses are real errors (out of memory, a library failure).
 *
 * An op has either one KILN_FAST_OP, or several kernels declared in a
 * kernel family's list (family.h), among which kiln_kernel_choose picks;
 * kiln_fast_op returns the family's entry then. Weights are packed once per model through the weight
 * cache and shared by every plan of that model. run must not allocate on
 * the heap where it can be avoided: the plan passes preallocated outputs
 * (whose memory is NOT zeroed: every element must be written), scratch
 * memory of the size the kernel asked for, and the number of threads the
 * run may use (kiln_parallel_for in core/threadpool.h).
 *
 * Layouts: a value whose kiln_value.layout is 8 or 16 is stored with its
 * channels blocked (graph.h). Only kernels that read the node's input and
 * output values' layouts (cc->in_layout / cc->out_layout) and handle them
 * may accept such a node; the layout pass only blocks values between nodes
 * whose kernels say so (kiln_fast_accepts_blocked).
 */
#ifndef KILN_KERNELS_FAST_H
#define KILN_KERNELS_FAST_H

#include <stddef.h>

#include "kernels/kernel.h"

/* Packed weights shared by every plan of one model (thread-safe). */
struct kiln_weight_cache;
kiln_status kiln_weight_cache_new(struct kiln_weight_cache **out);
void kiln_weight_cache_free(struct kiln_weight_cache *wc);
/* The packed form of the constant `key` (a weight tensor) under `tag` (which
 * describes the packing, e.g. "dnnl_conv:OIhw16i16o"): made once by
 * pack(arg, &packed, &free_fn) on first use, then returned from the cache.
 * Bytes packed are counted for the optimization log. */
typedef kiln_status (*kiln_pack_fn)(void *arg, void **packed, size_t *bytes,
                                    void (**free_fn)(void *packed));
kiln_status kiln_weight_cache_get(struct kiln_weight_cache *wc, const void *key, const char *tag,
                                  kiln_pack_fn pack, void *arg, void **out);
size_t kiln_weight_cache_bytes(const struct kiln_weight_cache *wc);
/* Read-only file mappings the model's weights live in. Once a weight lying
 * inside one has been packed, its whole pages are given back to the kernel
 * (madvise DONTNEED): the packed copy is what runs, and a reader of the
 * original (the reference path) faults the pages back in from the file. So a
 * model's resident memory holds one copy of each packed weight, not two. */
kiln_status kiln_weight_cache_add_mapping(struct kiln_weight_cache *wc, const void *data,
                                          size_t size);

/* Reloadable weights: constants the importer had to copy out of a mapped file
 * (raw_data not aligned for its dtype) and can copy again from `src`, which
 * lives as long as the model. Once every use of such a weight in a plan reads
 * only its packed form, the plan releases the copy (its data becomes NULL and
 * its memory is freed); anything that reads it later acquires it first, which
 * copies it back. So a packed weight costs one resident copy, not two.
 *
 * The rules that make this safe (src/exec/plan.c, src/api/kiln.c):
 * - plans compile one at a time per model (compile_lock), and only a compile
 *   releases;
 * - a compile acquires every constant it reads (shape inference, folding,
 *   kernel compile) except the inputs a fast op may pack, which the cache
 *   acquires itself before packing;
 * - a plan step that reads a constant at run time pins it (acquired and never
 *   released again), and a graph that runs on the reference executor pins all.
 * add_reloadable is called while the model loads, before any plan exists. */
kiln_status kiln_weight_cache_add_reloadable(struct kiln_weight_cache *wc, kiln_tensor *t,
                                             const void *src);
/* Make t's data resident (a no-op unless it was released); pin = never release
 * it again. Tensors that are not reloadable are left alone. */
kiln_status kiln_weight_cache_acquire(struct kiln_weight_cache *wc, const kiln_tensor *t, int pin);
kiln_status kiln_weight_cache_pin_all(struct kiln_weight_cache *wc);
/* Free t's copy if it is reloadable and not pinned; call only while holding
 * the compile lock, with no step of any plan reading t's data at run time. */
void kiln_weight_cache_release(struct kiln_weight_cache *wc, const kiln_tensor *t);
void kiln_weight_cache_compile_lock(struct kiln_weight_cache *wc);
void kiln_weight_cache_compile_unlock(struct kiln_weight_cache *wc);
/* Compiled artifacts (.kiln, docs/KILN_FORMAT.md) keep the packed weights:
 * kiln_weight_cache_each lists every entry (under the cache's lock; fn must
 * not call back into the cache), and kiln_weight_cache_preload adds one
 * packed elsewhere (bytes in a mapped file that outlives the cache; not
 * freed), so that a plan asking for (key, tag) finds it packed already.
 * kiln_weight_cache_pack_env names what packed bytes depend on (oneDNN's
 * version and the ISA it runs on): preloaded bytes are only valid for the
 * same string. */
void kiln_weight_cache_each(struct kiln_weight_cache *wc,
                            void (*fn)(void *ctx, const void *key, const char *tag,
                                       const void *packed, size_t bytes),
                            void *ctx);
kiln_status kiln_weight_cache_preload(struct kiln_weight_cache *wc, const void *key,
                                      const char *tag, const void *packed, size_t bytes);
void kiln_weight_cache_pack_env(char *buf, size_t n);
/* Bytes of the entry (key, tag), 0 when there is none. */
size_t kiln_weight_cache_entry_bytes(struct kiln_weight_cache *wc, const void *key, const char *tag);
/* Bytes of reloadable weights currently released. */
size_t kiln_weight_cache_released_bytes(struct kiln_weight_cache *wc);

struct kiln_compile_ctx {
    const struct kiln_node *node;
    int n_in;
    const struct kiln_type *const *in;       /* concrete types; NULL = absent */
    const kiln_tensor *const *in_value;      /* values known at compile time (weights), else NULL */
    const int *in_layout;                    /* layout of each input value (0, 8, 16) */
    int n_out;
    const struct kiln_type *const *out;      /* concrete output types; NULL = not wanted */
    const int *out_layout;
    struct kiln_weight_cache *weights;
    int threads;                             /* most threads a run of this plan may use */
    int precision;                           /* kiln_precision the plan asks for (0 = fp32);
                                                a kernel may ignore it and run fp32 */
    int64_t out_host_channels;               /* > 0: output 0 (rank 4, batch N > 1) is a
                                                channel slice of a [N, out_host_channels, H, W]
                                                tensor in the same layout (channels as stored,
                                                blocks padded), which the plan passes at the
                                                slice's first channel of image 0: image n starts
                                                n * out_host_channels * H * W elements later
                                                (Concat in place, src/exec/plan.c). A kernel
                                                that writes that way sets inst->out_strided;
                                                one that ignores the field is never placed. */
};

struct kiln_kernel_inst {
    const char *name;     /* shown by the profiler and the log: "dnnl_conv", "avx512_relu" */
    void *state;          /* owned by the instance */
    kiln_status (*run)(void *state, struct kiln_run_ctx *ctx);
    void (*destroy)(void *state); /* may be NULL */
    size_t scratch_bytes; /* arena scratch each run needs (ctx->scratch), 64-aligned */
    int inplace;          /* 1 = output 0 may share input `inplace_input`'s memory (same
                             size and layout) when nothing reads that input later */
    int inplace_input;    /* which input (default 0; KilnFusedConv's residual Sum is 3) */
    unsigned packed;      /* bit i: constant input i is held packed (from the weight cache)
                             and run never reads its data (lets the plan release it) */
    int can_out_strided;  /* compiled dense, but would honor cc->out_host_channels if compiled
                             again with it (the plan only asks kernels that say so) */
    int out_strided;      /* compiled for cc->out_host_channels: output 0 is written into
                             its strided channel slice of the host (plan.c) */
    char impl[48];        /* the library implementation run makes (oneDNN's impl_info_str:
                             "jit:avx512_core", "ref:any", ...); empty for Kiln's own code.
                             The plan names reference and generic fallbacks in the log. */
};

typedef kiln_status (*kiln_fast_compile_fn)(const struct kiln_compile_ctx *cc,
                                            struct kiln_kernel_inst *inst);

struct kiln_fast_op {
    kiln_fast_compile_fn compile;
    /* For the layout pass: may this node's input i (or, with i = -1, its
     * output 0) be stored blocked by `block`? NULL = never. */
    int (*accepts_blocked)(const struct kiln_node *n, int i, int block);
    /* Bit i: compile may pack constant input i through the weight cache, and
     * reads its data only there (the plan then leaves acquiring it to the
     * cache). Compile reads every other constant input freely. */
    unsigned packs;
};

#define KILN_FAST_OP(name, compile_fn, accepts_fn) \
    const struct kiln_fast_op kiln_fast_##name = {compile_fn, accepts_fn, 0}
/* An op whose compile packs constant input 1 (its weights). */
#define KILN_FAST_OP_PACKING(name, compile_fn, accepts_fn) \
    const struct kiln_fast_op kiln_fast_##name = {compile_fn, accepts_fn, 1u << 1}

/* The fast kernel of an op, or NULL. Honors KILN_FAST=0 in the environment
 * (reference kernels only, for debugging and differential tests). */
const struct kiln_fast_op *kiln_fast_op(enum kiln_op op);
int kiln_fast_accepts_blocked(const struct kiln_node *n, int i, int block);

/* Release every instance's state. */
void kiln_kernel_inst_destroy(struct kiln_kernel_inst *inst);

#endif
