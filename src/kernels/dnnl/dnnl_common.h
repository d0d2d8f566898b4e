/*
 * dnnl_common.h - what the oneDNN fast kernels (kernels/dnnl/) share.
 *
 * One process-wide CPU engine. A compiled node is a kd_exec: one or two
 * variants of a oneDNN primitive (variant 0 made for the plan's thread
 * count, variant 1 for a single thread, used when a run is granted one
 * thread: oneDNN's OpenMP kernels fix their team size when the primitive
 * is made), each with the list of arguments it is executed with and where
 * each argument's memory comes from (a node input or output, packed
 * weights, the plan's scratch). Runs borrow a kd_binding (a stream and one
 * dnnl_memory_t per argument, pointed at the run's buffers with
 * dnnl_memory_set_data_handle) from a free list, so concurrent runs of one
 * plan never share oneDNN memory objects and steady-state runs do not
 * allocate.
 *
 * Constant weights are reordered into the format the primitive prefers
 * once per model through the weight cache (kd_pack_weights); the cache tag
 * spells out the packed format so plans that want another format get
 * their own copy.
 */
#ifndef KILN_KERNELS_DNNL_COMMON_H
#define KILN_KERNELS_DNNL_COMMON_H

#include <math.h>
#include <pthread.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/fast.h"

#define KD_MAX_ARGS 8

enum kd_src {
    KD_SRC_IN = 1,   /* ctx->in[index]->data */
    KD_SRC_OUT,      /* ctx->out[index]->data */
    KD_SRC_PACKED,   /* the variant's packed weights */
    KD_SRC_SCRATCH,  /* the run's scratch memory */
    KD_SRC_SCRATCH_AT, /* the run's scratch memory + index bytes (a kernel's own buffers
                          placed after the primitive's scratchpad) */
};

struct kd_arg {
    int arg;                /* DNNL_ARG_* */
    enum kd_src src;
    int index;              /* input / output index */
    size_t offset;          /* bytes into that input or output (kd_variant_arg_at) */
    dnnl_memory_desc_t md;
};

struct kd_variant {
    dnnl_primitive_t prim;
    int nargs;
    struct kd_arg args[KD_MAX_ARGS];
    void *packed;           /* packed weights (owned by the weight cache) */
    size_t scratch;         /* scratchpad bytes */
    char impl[48];          /* oneDNN's name of the implementation it chose */
};

struct kd_binding {
    struct kd_binding *next;
    dnnl_stream_t stream;
    dnnl_memory_t mem[2][KD_MAX_ARGS];
};

struct kd_exec {
    int nv;                 /* variants made (1 or 2) */
    struct kd_variant v[2];
    int threads;            /* threads variant 0 was made for */
    pthread_mutex_t mu;
    struct kd_binding *free_list;
};

/* The engine (made on first use); NULL if oneDNN cannot make one. */
dnnl_engine_t kd_engine(void);

/* Map a failed oneDNN call to a Kiln error naming the node and the call. */
kiln_status kd_error(const struct kiln_node *n, dnnl_status_t s, const char *what);

/* Plain memory descriptor (dense row-major) of an f32 tensor of rank r. */
dnnl_status_t kd_md_plain(dnnl_memory_desc_t *md, int rank, const int64_t *dims);
/* f32 activation md of rank r: plain, or channels blocked by layout (8/16, rank 4 only).
 * Returns dnnl_unimplemented for a layout it cannot express. */
dnnl_status_t kd_md_act(dnnl_memory_desc_t *md, int rank, const int64_t *dims, int layout);

/* The fused activation of node n as post-ops appended to po. Returns 0 when
 * the activation is not one oneDNN can do (the node then stays on the
 * reference path), 1 on success. */
int kd_append_activation(const struct kiln_node *n, dnnl_post_ops_t po);

/* The fused activation of n where oneDNN's post-op is slow on this CPU and Kiln's SIMD
 * table applies it to the output instead (enum simd_unary + 1), or 0. */
int kd_deferred_activation(const struct kiln_node *n);
/* y[i] = act(y[i]) for i < count, act a kd_deferred_activation value, on up to
 * `threads` threads. */
void kd_apply_activation(int act, float *y, size_t count, int threads);

/* Pack constant weights: reorder data (described by src_md) into dst_md
 * through the weight cache (key = the constant tensor, tag from `what`,
 * the scale and dst_md). scale != 1 multiplies the weights. */
kiln_status kd_pack_weights(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                            const char *what, const dnnl_memory_desc_t *src_md,
                            const dnnl_memory_desc_t *dst_md, float scale, void **packed);
/* kd_pack_weights from data (f32, described by src_md) derived from the constant w, which
 * stays the cache key: `what` must name the derivation (a packing made on a cache miss
 * reads data, so it must live until this returns). data NULL: w's own data, read when the
 * cache packs, after it brought back a weight that an earlier plan released (another
 * kernel's pack of the same weight may have let it go). */
kiln_status kd_pack_weights_from(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                                 const void *data, const char *what,
                                 const dnnl_memory_desc_t *src_md,
                                 const dnnl_memory_desc_t *dst_md, float scale, void **packed);

/* A plain row-major md ([..., K, N], N contiguous) whose rows are a multiple of 4 KB apart
 * gets *out: the same with rows padded by 16 floats, so that the rows a GEMM reads
 * together no longer fall into the same cache sets (KILN_MATMUL_PAD=0 turns it off).
 * Returns 0 (out untouched) for any other md. */
int kd_md_pad_rows(const dnnl_memory_desc_t *md, dnnl_memory_desc_t *out);

/* Pack constant weights as symmetric s8 with one scale per output channel
 * (scale = max |w| / 127 over the channel, 1 for an all-zero channel;
 * q = nearbyint(w / scale) clamped to [-127, 127]): src_md describes the f32
 * data (blocked, any strides), `axis` its output-channel dim, dst_md the s8
 * format the primitive wants. *packed receives one buffer from the weight
 * cache: the channel scales (floats, padded to 64 bytes: *scales_bytes),
 * then the packed s8 weights. */
/* The per-channel s8 scales kd_pack_weights_s8 uses, computed alone (for primitive
 * attributes made before the packing): scales has md->dims[axis] floats. */
void kd_channel_scales_s8(const float *w, const dnnl_memory_desc_t *md, int axis, float *scales);
kiln_status kd_pack_weights_s8(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                               const char *what, const dnnl_memory_desc_t *src_md, int axis,
                               const dnnl_memory_desc_t *dst_md, void **packed,
                               size_t *scales_bytes);

/* Dynamic quantization of an activation (docs/COMPRESSION.md): measure
 * lo = min(0, min a), hi = max(0, max a) over the finite values, then
 * scale = (hi - lo) / 255 (1 for an empty range), zp = clamp(nearbyint(-lo /
 * scale), 0, 255), and with inv = 1 / scale,
 * q = clamp(nearbyint(a * inv) + zp, 0, 255), NaN -> zp; on up to `threads`
 * threads of Kiln's pool. */
void kd_quantize_u8(const float *a, int64_t count, uint8_t *q, int threads, float *scale_out,
                    int32_t *zp_out);
/* a rounded to bfloat16 (kd_f32_to_bf16) into h, on up to `threads` threads. */
void kd_to_bf16(const float *a, int64_t count, uint16_t *h, int threads);

/* f32 -> bfloat16, round to nearest even, NaN kept quiet (kiln_f32_to_bf16, inlined
 * for the per-run conversion loops). */
static inline uint16_t kd_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Whether oneDNN picked one of its reference implementations for pd ("ref:any",
 * "ref_int8:any"): correct but far slower than Kiln's fp32 path, so a
 * low-precision variant declines it and the node runs in fp32. */
int kd_pd_is_ref(const_dnnl_primitive_desc_t pd);
/* dnnl_primitive_desc_create on Kiln's engine, skipping the implementations Kiln does not
 * run (kd_pd_denied): the next one oneDNN offers for the descriptor is taken instead. */
dnnl_status_t kd_pd_create(dnnl_primitive_desc_t *pd, const_dnnl_op_desc_t d,
                           const_dnnl_primitive_attr_t attr);
/* An implementation known to compute wrong results or write out of bounds in the oneDNN
 * Kiln links (the list and why: dnnl_common.c). */
int kd_pd_denied(const_dnnl_primitive_desc_t pd);
/* Whether this CPU has AMX tiles with bfloat16 products (and Kiln's ISA, KILN_ISA,
 * is AVX-512; KILN_AMX=0 in the environment says no): where oneDNN's AMX
 * convolutions, which read channels-last data, are worth a reorder. */
int kd_cpu_amx_bf16(void);
/* Whether pd runs on AMX tiles (its implementation's name says "amx"). */
int kd_pd_is_amx(const_dnnl_primitive_desc_t pd);
/* Whether an int8 pd runs on VNNI or AMX dot products. Without them oneDNN's
 * int8 kernels pair u8 x s8 products in 16-bit sums (vpmaddubsw) that
 * saturate at full 8-bit range (the accuracy loss ONNX Runtime's reduce_range
 * works around), so int8 variants decline anything else and run fp32. */
int kd_pd_int8_exact(const_dnnl_primitive_desc_t pd);

/* Create the primitive of pd as variant v of e, recording its scratchpad size.
 * Takes ownership of nothing; pd may be destroyed afterwards. */
kiln_status kd_variant_init(const struct kiln_node *n, dnnl_primitive_desc_t pd,
                            struct kd_variant *v);
/* Add an argument to a variant. */
void kd_variant_arg(struct kd_variant *v, int arg, enum kd_src src, int index,
                    const dnnl_memory_desc_t *md);
/* The same for part of an input or output (KD_SRC_IN / KD_SRC_OUT), `offset` bytes in. */
void kd_variant_arg_at(struct kd_variant *v, int arg, enum kd_src src, int index, size_t offset,
                       const dnnl_memory_desc_t *md);

/*
 * Make e's variants by calling make(arg, v, threads) with the OpenMP
 * thread count set to `threads` (variant 0) and 1 (variant 1, only when
 * threads > 1). make returns KILN_OK with v->prim NULL to decline.
 * *handled is 0 when variant 0 declined or on error; e is then left
 * empty (not to be destroyed).
 */
typedef kiln_status (*kd_make_fn)(void *arg, struct kd_variant *v, int threads);
kiln_status kd_exec_build(struct kd_exec *e, int threads, kd_make_fn make, void *arg,
                          int *handled);
void kd_exec_destroy(struct kd_exec *e);
/* Record e's implementation (variant 0's, as oneDNN names it) in inst->impl. */
void kd_inst_impl(struct kiln_kernel_inst *inst, const struct kd_exec *e);
/* Largest scratch of e's variants. */
size_t kd_exec_scratch(const struct kd_exec *e);
/* Execute e for ctx (picks the variant by ctx->threads). */
kiln_status kd_exec_run(struct kd_exec *e, struct kiln_run_ctx *ctx);

/* A oneDNN reorder from src (living at `from`, index from_index) to dst (at `to`,
 * to_index) as an exec of its own, for kernels that reorder at their edges
 * (reorder.c). *handled as for kd_exec_build. */
kiln_status kd_reorder_exec_build(const struct kiln_compile_ctx *cc, const dnnl_memory_desc_t *src,
                                  enum kd_src from, int from_index, const dnnl_memory_desc_t *dst,
                                  enum kd_src to, int to_index, struct kd_exec *e, int *handled);

/* Zero what a reorder into the interior of buf does not write: buf holds a float32
 * tensor of layout md (dims [N, C, S...], 1 to 3 spatial dims, dense, offset 0) whose
 * interior [lo[i], S[i] - hi[i]) along each spatial dim i is written by a reorder into
 * a submemory (an explicitly padded input: conv.c). Zeroes the border rows and columns
 * only; the whole buffer where md is not blocked as [outer dims][C block] or pads C to
 * its block (the padding lanes would be left unwritten). */
void kd_zero_border(void *buf, const dnnl_memory_desc_t *md, const int64_t *lo,
                    const int64_t *hi);

/* Add base to the scratch offsets (KD_SRC_SCRATCH_AT) of e's kernel-owned buffers: they
 * were laid out from 0 before e's oneDNN scratchpad size was known. */
void kd_exec_shift_scratch(struct kd_exec *e, size_t base);

/* The threads a compile context allows (>= 1). */
int kd_compile_threads(const struct kiln_compile_ctx *cc);
/* Threads for a primitive doing about `work` flops (or element moves): below
 * KD_MIN_PARALLEL_WORK one thread, since waking and joining a second costs
 * more than it saves (small Gemms of tabular and recommender models). */
#define KD_MIN_PARALLEL_WORK 2e6
int kd_work_threads(const struct kiln_compile_ctx *cc, double work);

#endif
