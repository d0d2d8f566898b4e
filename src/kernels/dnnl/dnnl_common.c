/*
 * dnnl_common.c - the engine, memory descriptors, fused activations as
 * post-ops, weight packing through the weight cache, and the compiled-node
 * executor (kd_exec) shared by the oneDNN fast kernels. See dnnl_common.h.
 */
#include "kernels/dnnl/dnnl_common.h"

#include "core/threadpool.h"
#include "kernels/simd/simd.h"

#include <cpuid.h>
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- engine ---- */

static dnnl_engine_t g_engine;
static pthread_once_t g_engine_once = PTHREAD_ONCE_INIT;

static void engine_make(void)
{
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) g_engine = NULL;
}

dnnl_engine_t kd_engine(void)
{
    pthread_once(&g_engine_once, engine_make);
    return g_engine;
}

kiln_status kd_error(const struct kiln_node *n, dnnl_status_t s, const char *what)
{
    kiln_status st = s == dnnl_out_of_memory ? KILN_ERR_OUT_OF_MEMORY : KILN_ERR_RUNTIME;
    if (n) return kiln_node_error(n, st, "oneDNN %s failed (status %d)", what, (int)s);
    return kiln_error(st, "oneDNN %s failed (status %d)", what, (int)s);
}

int kd_compile_threads(const struct kiln_compile_ctx *cc)
{
    return cc->threads >= 1 ? cc->threads : omp_get_max_threads();
}

int kd_work_threads(const struct kiln_compile_ctx *cc, double work)
{
    return work < KD_MIN_PARALLEL_WORK ? 1 : kd_compile_threads(cc);
}

/* ---- memory descriptors ---- */

dnnl_status_t kd_md_plain(dnnl_memory_desc_t *md, int rank, const int64_t *dims)
{
    static const dnnl_format_tag_t tags[] = {dnnl_a, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd,
                                             dnnl_abcde, dnnl_abcdef};
    if (rank < 1 || rank > 6) return dnnl_unimplemented;
    dnnl_dims_t d;
    for (int i = 0; i < rank; i++) d[i] = dims[i];
    return dnnl_memory_desc_init_by_tag(md, rank, d, dnnl_f32, tags[rank]);
}

dnnl_status_t kd_md_act(dnnl_memory_desc_t *md, int rank, const int64_t *dims, int layout)
{
    if (layout == 0) return kd_md_plain(md, rank, dims);
    if (rank != 4 || (layout != 8 && layout != 16)) return dnnl_unimplemented;
    dnnl_dims_t d = {dims[0], dims[1], dims[2], dims[3]};
    return dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32,
                                        layout == 16 ? dnnl_nChw16c : dnnl_nChw8c);
}

/* ---- activations ---- */

int kd_append_activation(const struct kiln_node *n, dnnl_post_ops_t po)
{
    const char *s = kiln_attr_str(n, "activation", "");
    if (!s[0]) return 1;
    dnnl_status_t r;
    if (!strcmp(s, "Relu")) {
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    } else if (!strcmp(s, "LeakyRelu")) {
        float a = kiln_attr_float(n, "act_alpha", 0.01f);
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, a, 0.0f);
    } else if (!strcmp(s, "Clip")) {
        float lo = kiln_attr_float(n, "act_alpha", -FLT_MAX);
        float hi = kiln_attr_float(n, "act_beta", FLT_MAX);
        if (!(lo <= hi)) return 0; /* the reference clamps in its own order */
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip, lo, hi);
    } else if (!strcmp(s, "HardSwish")) {
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_hardswish, 0.0f, 0.0f);
    } else if (!strcmp(s, "HardSigmoid")) {
        /* max(0, min(1, a x + b)): linear, then clip to [0, 1] */
        float a = kiln_attr_float(n, "act_alpha", 0.2f);
        float b = kiln_attr_float(n, "act_beta", 0.5f);
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_linear, a, b);
        if (r == dnnl_success)
            r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_clip, 0.0f, 1.0f);
    } else if (!strcmp(s, "Sigmoid")) {
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_logistic, 0.0f, 0.0f);
    } else if (!strcmp(s, "SiLU")) {
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_swish, 1.0f, 0.0f);
    } else if (!strcmp(s, "Tanh")) {
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_tanh, 0.0f, 0.0f);
    } else if (!strcmp(s, "Gelu")) {
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_erf, 0.0f, 0.0f);
    } else if (!strcmp(s, "GeluTanh")) {
        r = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_tanh, 0.0f, 0.0f);
    } else {
        return 0;
    }
    return r == dnnl_success;
}

/* Below AVX-512, oneDNN's tanh (and the Gelu built on it) looks its polynomial's
 * coefficients up with gathers, slow on AMD: on a Zen 2 a fused Tanh cost 4.5 ns an
 * element, tripling a 5x5 convolution of one channel to 64 (0.32 -> 3.0 ms), where
 * Kiln's SIMD tanh over the finished output costs about 1.2 ns. oneDNN's AVX-512 tanh
 * permutes its table within registers instead, and stays fused. */
int kd_deferred_activation(const struct kiln_node *n)
{
    if (kiln_cpu_isa() >= KILN_ISA_AVX512) return 0;
    const char *s = kiln_attr_str(n, "activation", "");
    if (!strcmp(s, "Tanh")) return SIMD_TANH + 1;
    if (!strcmp(s, "GeluTanh")) return SIMD_GELU_TANH + 1;
    return 0;
}

struct act_job {
    const struct simd_kernels *k;
    enum simd_unary op;
    float *y;
};

static void act_range(void *arg, int64_t begin, int64_t end)
{
    const struct act_job *j = arg;
    j->k->unary(j->op, 0.0f, 0.0f, j->y + begin, j->y + begin, end - begin);
}

void kd_apply_activation(int act, float *y, size_t count, int threads)
{
    struct act_job j = {simd_kernels_for(), (enum simd_unary)(act - 1), y};
    kiln_parallel_for(threads, (int64_t)count, 16384, act_range, &j);
}

/* ---- weight packing ---- */

struct pack_arg {
    const struct kiln_node *node;
    const void *data; /* the f32 source, described by src; NULL: w's data, read when the
                         cache packs (after it brought a released weight back) */
    const kiln_tensor *w;
    dnnl_memory_desc_t src, dst;
    float scale;
};

static void pack_free(void *p) { free(p); }

/* kiln_pack_fn: reorder the constant into a fresh 64-aligned buffer. */
static kiln_status pack_run(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    struct pack_arg *p = arg;
    const void *src = p->data ? p->data : p->w->data;
    if (!src) return kiln_node_error(p->node, KILN_ERR_INTERNAL, "a weight to pack has no data");
    dnnl_engine_t eng = kd_engine();
    size_t sz = dnnl_memory_desc_get_size(&p->dst);
    void *buf = aligned_alloc(64, (sz + 63) / 64 * 64 + 64);
    if (!buf) return kiln_node_error(p->node, KILN_ERR_OUT_OF_MEMORY, "out of memory packing weights");
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_stream_t stream = NULL;
    const char *what = "weight reorder";
    dnnl_status_t r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success && p->scale != 1.0f)
        r = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &p->scale);
    if (r == dnnl_success)
        r = dnnl_reorder_primitive_desc_create(&pd, &p->src, eng, &p->dst, eng, attr);
    if (r == dnnl_success) r = dnnl_primitive_create(&prim, pd);
    if (r == dnnl_success) r = dnnl_memory_create(&ms, &p->src, eng, (void *)src);
    if (r == dnnl_success) r = dnnl_memory_create(&md, &p->dst, eng, buf);
    if (r == dnnl_success) r = dnnl_stream_create(&stream, eng, dnnl_stream_default_flags);
    if (r == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
        r = dnnl_primitive_execute(prim, stream, 2, args);
        if (r == dnnl_success) r = dnnl_stream_wait(stream);
    }
    if (stream) dnnl_stream_destroy(stream);
    if (md) dnnl_memory_destroy(md);
    if (ms) dnnl_memory_destroy(ms);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (r != dnnl_success) {
        free(buf);
        return kd_error(p->node, r, what);
    }
    *packed = buf;
    *bytes = sz;
    *free_fn = pack_free;
    return KILN_OK;
}

/* Append "x,y,z" of n values to buf at *len. */
static void tag_ints(char *buf, size_t cap, size_t *len, const char *name, int n,
                     const int64_t *v)
{
    int w = snprintf(buf + *len, *len < cap ? cap - *len : 0, "%s", name);
    if (w > 0) *len += (size_t)w;
    for (int i = 0; i < n; i++) {
        w = snprintf(buf + *len, *len < cap ? cap - *len : 0, "%s%lld", i ? "," : "",
                     (long long)v[i]);
        if (w > 0) *len += (size_t)w;
    }
}

/* A cache tag spelling out the packed format: what, scale, dims, blocking. */
static int md_tag(const char *what, float scale, const dnnl_memory_desc_t *src,
                  const dnnl_memory_desc_t *md, char *buf, size_t cap)
{
    if (src->format_kind != dnnl_blocked) return 0;
    if (md->format_kind != dnnl_blocked && md->format_kind != dnnl_format_kind_wino) return 0;
    size_t len = 0;
    int w = snprintf(buf, cap, "dnnl_%s:s%a:", what, (double)scale);
    if (w < 0) return 0;
    len = (size_t)w;
    int64_t v[DNNL_MAX_NDIMS];
    const dnnl_blocking_desc_t *sb = &src->format_desc.blocking;
    for (int i = 0; i < src->ndims; i++) v[i] = sb->strides[i];
    tag_ints(buf, cap, &len, "src", src->ndims, v);
    for (int i = 0; i < md->ndims; i++) v[i] = md->dims[i];
    tag_ints(buf, cap, &len, ";d", md->ndims, v);
    if (md->format_kind == dnnl_format_kind_wino) { /* Winograd-transformed weights */
        const dnnl_wino_desc_t *wd = &md->format_desc.wino_desc;
        int64_t f[11] = {wd->wino_format, wd->r,         wd->alpha,     wd->ic,
                         wd->oc,          wd->ic_block,  wd->oc_block,  wd->ic2_block,
                         wd->oc2_block,   (int64_t)wd->size, 0};
        memcpy(&f[10], &wd->adj_scale, sizeof wd->adj_scale);
        tag_ints(buf, cap, &len, ";wino", 11, f);
        return len < cap;
    }
    for (int i = 0; i < md->ndims; i++) v[i] = md->padded_dims[i];
    tag_ints(buf, cap, &len, ";p", md->ndims, v);
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    for (int i = 0; i < md->ndims; i++) v[i] = b->strides[i];
    tag_ints(buf, cap, &len, ";s", md->ndims, v);
    for (int i = 0; i < b->inner_nblks; i++) v[i] = b->inner_blks[i];
    tag_ints(buf, cap, &len, ";ib", b->inner_nblks, v);
    for (int i = 0; i < b->inner_nblks; i++) v[i] = b->inner_idxs[i];
    tag_ints(buf, cap, &len, ";ii", b->inner_nblks, v);
    int64_t ex[2] = {(int64_t)md->extra.flags, md->offset0};
    tag_ints(buf, cap, &len, ";x", 2, ex);
    return len < cap;
}

kiln_status kd_pack_weights(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                            const char *what, const dnnl_memory_desc_t *src_md,
                            const dnnl_memory_desc_t *dst_md, float scale, void **packed)
{
    /* the data is read when the cache packs: a weight another kernel's pack let the plan
     * release is brought back first (kiln_weight_cache_get) */
    return kd_pack_weights_from(cc, w, NULL, what, src_md, dst_md, scale, packed);
}

kiln_status kd_pack_weights_from(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                                 const void *data, const char *what,
                                 const dnnl_memory_desc_t *src_md,
                                 const dnnl_memory_desc_t *dst_md, float scale, void **packed)
{
    char tag[1024];
    *packed = NULL;
    if (!md_tag(what, scale, src_md, dst_md, tag, sizeof tag))
        return KILN_OK; /* a format the tag cannot spell: leave the node to the reference */
    struct pack_arg arg = {cc->node, data, w, *src_md, *dst_md, scale};
    if (!cc->weights) /* no cache (a caller without one): not expected from plans */
        return kiln_node_error(cc->node, KILN_ERR_INTERNAL, "no weight cache to pack into");
    kiln_status st = kiln_weight_cache_get(cc->weights, w, tag, pack_run, &arg, packed);
    /* an entry preloaded from a .kiln file must be the size this format has */
    size_t want = dnnl_memory_desc_get_size(dst_md);
    if (st == KILN_OK && kiln_weight_cache_entry_bytes(cc->weights, w, tag) != want) {
        *packed = NULL;
        return kiln_node_error(cc->node, KILN_ERR_INVALID_MODEL,
                               "packed weight of %zu bytes, its format needs %zu",
                               kiln_weight_cache_entry_bytes(cc->weights, w, tag), want);
    }
    return st;
}

int kd_md_pad_rows(const dnnl_memory_desc_t *md, dnnl_memory_desc_t *out)
{
    const char *env = getenv("KILN_MATMUL_PAD");
    if (env && !strcmp(env, "0")) return 0;
    if (md->format_kind != dnnl_blocked || md->ndims < 2 || md->offset0 != 0 ||
        md->data_type != dnnl_f32)
        return 0;
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    const int nd = md->ndims;
    const int64_t n = md->dims[nd - 1];
    if (b->inner_nblks != 0 || b->strides[nd - 1] != 1 || b->strides[nd - 2] != n ||
        n * (int64_t)sizeof(float) % 4096 != 0)
        return 0;
    for (int i = 0; i < nd - 2; i++) /* outer dims dense too */
        if (b->strides[i] != md->dims[i + 1] * b->strides[i + 1]) return 0;
    dnnl_dims_t st;
    st[nd - 1] = 1;
    st[nd - 2] = n + 16;
    for (int i = nd - 3; i >= 0; i--) st[i] = st[i + 1] * md->dims[i + 1];
    return dnnl_memory_desc_init_by_strides(out, nd, md->dims, dnnl_f32, st) == dnnl_success;
}

void kiln_weight_cache_pack_env(char *buf, size_t n)
{
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, n, "onednn %d.%d.%d %s isa %d", v->major, v->minor, v->patch,
             v->hash ? v->hash : "", (int)dnnl_get_effective_cpu_isa());
}

/* ---- int8 weights ---- */

struct pack_s8_arg {
    const struct kiln_node *node;
    const kiln_tensor *w;
    dnnl_memory_desc_t src, dst;
    int axis;
};

/* Walk the f32 weights w (described by sm) by logical index, channel = index[ax]: with
 * plain NULL, set scales[c] = max |w| over channel c; else quantize into plain (same strides). */
static void s8_walk(const float *w, const dnnl_memory_desc_t *sm, int ax, float *scales,
                    int8_t *plain)
{
    int nd = sm->ndims;
    int64_t total = 1;
    for (int i = 0; i < nd; i++) total *= sm->dims[i];
    const dnnl_dims_t *st = &sm->format_desc.blocking.strides;
    int64_t idx[DNNL_MAX_NDIMS] = {0};
    for (int64_t e = 0; e < total; e++) {
        int64_t off = 0;
        for (int i = 0; i < nd; i++) off += idx[i] * (*st)[i];
        float v = w[off];
        int64_t c = idx[ax];
        if (!plain) {
            float a = fabsf(v);
            if (a > scales[c]) scales[c] = a; /* NaN is skipped */
        } else {
            float q = nearbyintf(v / scales[c]);
            if (!(q >= -127.0f)) q = -127.0f; /* NaN too */
            if (q > 127.0f) q = 127.0f;
            plain[off] = (int8_t)q;
        }
        for (int i = nd - 1; i >= 0; i--) {
            if (++idx[i] < sm->dims[i]) break;
            idx[i] = 0;
        }
    }
}

void kd_channel_scales_s8(const float *w, const dnnl_memory_desc_t *md, int axis, float *scales)
{
    int64_t nch = md->dims[axis];
    for (int64_t c = 0; c < nch; c++) scales[c] = 0.0f;
    s8_walk(w, md, axis, scales, NULL);
    for (int64_t c = 0; c < nch; c++)
        scales[c] = scales[c] > 0.0f && isfinite(scales[c]) ? scales[c] / 127.0f : 1.0f;
}

/* kiln_pack_fn: per-channel symmetric s8 quantization, then a reorder into dst. */
static kiln_status pack_s8_run(void *arg, void **packed, size_t *bytes,
                               void (**free_fn)(void *))
{
    struct pack_s8_arg *p = arg;
    const dnnl_memory_desc_t *sm = &p->src;
    int ax = p->axis;
    int64_t nch = sm->dims[ax];
    size_t sc_bytes = ((size_t)nch * sizeof(float) + 63) / 64 * 64;
    size_t sz = dnnl_memory_desc_get_size(&p->dst);
    size_t plain_sz = dnnl_memory_desc_get_size(sm) / sizeof(float);
    char *buf = aligned_alloc(64, sc_bytes + (sz + 63) / 64 * 64 + 64);
    int8_t *plain = malloc(plain_sz ? plain_sz : 1);
    float *scales = (float *)buf;
    if (!buf || !plain) {
        free(buf);
        free(plain);
        return kiln_node_error(p->node, KILN_ERR_OUT_OF_MEMORY, "out of memory packing weights");
    }
    memset(plain, 0, plain_sz ? plain_sz : 1);
    kd_channel_scales_s8(p->w->data, sm, ax, scales);
    s8_walk(p->w->data, sm, ax, scales, plain);
    dnnl_engine_t eng = kd_engine();
    dnnl_memory_desc_t s8md = *sm;
    s8md.data_type = dnnl_s8;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_status_t r = dnnl_reorder_primitive_desc_create(&pd, &s8md, eng, &p->dst, eng, NULL);
    if (r == dnnl_success) r = dnnl_primitive_create(&prim, pd);
    if (r == dnnl_success) r = dnnl_memory_create(&ms, &s8md, eng, plain);
    if (r == dnnl_success) r = dnnl_memory_create(&md, &p->dst, eng, buf + sc_bytes);
    if (r == dnnl_success) r = dnnl_stream_create(&stream, eng, dnnl_stream_default_flags);
    if (r == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
        r = dnnl_primitive_execute(prim, stream, 2, args);
        if (r == dnnl_success) r = dnnl_stream_wait(stream);
    }
    if (stream) dnnl_stream_destroy(stream);
    if (md) dnnl_memory_destroy(md);
    if (ms) dnnl_memory_destroy(ms);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    free(plain);
    if (r != dnnl_success) {
        free(buf);
        return kd_error(p->node, r, "s8 weight reorder");
    }
    *packed = buf;
    *bytes = sc_bytes + sz;
    *free_fn = pack_free;
    return KILN_OK;
}

kiln_status kd_pack_weights_s8(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                               const char *what, const dnnl_memory_desc_t *src_md, int axis,
                               const dnnl_memory_desc_t *dst_md, void **packed,
                               size_t *scales_bytes)
{
    char tag[1024], what_ax[96];
    *packed = NULL;
    *scales_bytes = ((size_t)src_md->dims[axis] * sizeof(float) + 63) / 64 * 64;
    snprintf(what_ax, sizeof what_ax, "%s_s8_axis%d", what, axis);
    if (src_md->data_type != dnnl_f32 || !md_tag(what_ax, 1.0f, src_md, dst_md, tag, sizeof tag))
        return KILN_OK;
    struct pack_s8_arg arg = {cc->node, w, *src_md, *dst_md, axis};
    if (!cc->weights)
        return kiln_node_error(cc->node, KILN_ERR_INTERNAL, "no weight cache to pack into");
    return kiln_weight_cache_get(cc->weights, w, tag, pack_s8_run, &arg, packed);
}

#if defined(__GNUC__) && !defined(__clang__)
#define KD_VECTORIZE __attribute__((optimize("tree-vectorize"))) /* -O2 builds too */
#else
#define KD_VECTORIZE
#endif

/* The per-run activation passes, split over the run's threads (kiln_parallel_for: chunks
 * of at least `grain`, so chunk k starts in [k * grain, (k + 1) * grain) and owns slot k). */
#define KD_MAX_CHUNKS 64

struct kd_act_job {
    const float *a;
    uint8_t *q;
    uint16_t *h;
    int64_t grain;
    int avx512; /* the chunks run the AVX-512 forms below (decided once, by the caller) */
    float inv, zf;
    float lo[KD_MAX_CHUNKS], hi[KD_MAX_CHUNKS];
};

static int64_t act_grain(int64_t count, int threads)
{
    if (threads > KD_MAX_CHUNKS) threads = KD_MAX_CHUNKS;
    if (threads < 1) threads = 1;
    int64_t g = (count + threads - 1) / threads;
    return g < 16384 ? 16384 : g;
}

/* AVX-512 forms of range_chunk and quant_chunk (the library is built for any x86-64, so
 * the loops below are SSE at best; a BERT-base int8 run spent a fifth of its time in them).
 * Bit for bit the same results: the same finite-only minimum and maximum from 0 (a -0.0 the
 * lanes may give for +0.0 changes neither the scale nor the zero point), the same products,
 * clamps and rounding to nearest even. */
#define KD_AVX512 __attribute__((target("avx512f")))

/* The mask of the 16 lanes from i on that lie below n. */
#define KD_LANES(i, n) ((n) - (i) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << ((n) - (i))) - 1u))

KD_AVX512 static void range_avx512(const float *a, int64_t n, float *lo_out, float *hi_out)
{
    __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = KD_LANES(i, n);
        __m512 v = _mm512_maskz_loadu_ps(m, a + i);
        /* finite: v - v is 0 (NaN for NaN and infinities) */
        __mmask16 fin = m & _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_EQ_OQ);
        lo = _mm512_mask_min_ps(lo, fin, v, lo);
        hi = _mm512_mask_max_ps(hi, fin, v, hi);
    }
    *lo_out = _mm512_reduce_min_ps(lo);
    *hi_out = _mm512_reduce_max_ps(hi);
}

KD_AVX512 static void quant_avx512(const float *a, int64_t n, uint8_t *q, float inv, float zf)
{
    const __m512 vinv = _mm512_set1_ps(inv), vzf = _mm512_set1_ps(zf);
    const __m512 lo = _mm512_set1_ps(-512.0f), hi = _mm512_set1_ps(512.0f);
    const __m512 zero = _mm512_setzero_ps(), top = _mm512_set1_ps(255.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = KD_LANES(i, n);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), vinv);
        v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_EQ_OQ), v); /* NaN -> 0 */
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        v = _mm512_add_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                          vzf);
        v = _mm512_min_ps(_mm512_max_ps(v, zero), top);
        _mm512_mask_cvtepi32_storeu_epi8(q + i, m, _mm512_cvttps_epi32(v));
    }
}


static void range_chunk(void *ctx, int64_t begin, int64_t end)
{
    struct kd_act_job *j = ctx;
    float lo = 0.0f, hi = 0.0f;
    if (j->avx512) {
        range_avx512(j->a + begin, end - begin, &lo, &hi);
        j->lo[begin / j->grain] = lo;
        j->hi[begin / j->grain] = hi;
        return;
    }
    for (int64_t i = begin; i < end; i++) {
        float v = j->a[i];
        if (!isfinite(v)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    j->lo[begin / j->grain] = lo;
    j->hi[begin / j->grain] = hi;
}

KD_VECTORIZE static void quant_chunk(void *ctx, int64_t begin, int64_t end)
{
    struct kd_act_job *j = ctx;
    const float inv = j->inv, zf = j->zf;
    if (j->avx512) {
        quant_avx512(j->a + begin, end - begin, j->q + begin, inv, zf);
        return;
    }
    /* branch-free so that it vectorizes: NaN -> 0 (then zp); clamping to +-512 first changes
     * nothing after the final clamp and keeps |v| < 2^22, where adding and subtracting
     * 1.5 * 2^23 rounds to nearest even exactly as nearbyintf does */
    for (int64_t i = begin; i < end; i++) {
        float v = j->a[i] * inv;
        v = v == v ? v : 0.0f;
        v = v < -512.0f ? -512.0f : v;
        v = v > 512.0f ? 512.0f : v;
        v = (v + 12582912.0f) - 12582912.0f + zf;
        v = v < 0.0f ? 0.0f : v;
        v = v > 255.0f ? 255.0f : v;
        j->q[i] = (uint8_t)(int32_t)v;
    }
}

void kd_quantize_u8(const float *a, int64_t count, uint8_t *q, int threads, float *scale_out,
                    int32_t *zp_out)
{
    struct kd_act_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.q = q;
    j.grain = act_grain(count, threads);
    j.avx512 = kiln_cpu_isa() >= KILN_ISA_AVX512;
    kiln_parallel_for(threads, count, j.grain, range_chunk, &j);
    float lo = 0.0f, hi = 0.0f;
    for (int k = 0; k < KD_MAX_CHUNKS; k++) {
        if (j.lo[k] < lo) lo = j.lo[k];
        if (j.hi[k] > hi) hi = j.hi[k];
    }
    float scale = (hi - lo) / 255.0f;
    if (!(scale > 0.0f) || !isfinite(scale)) scale = 1.0f;
    float zf = nearbyintf(-lo / scale);
    int32_t zp = zf < 0.0f ? 0 : zf > 255.0f ? 255 : (int32_t)zf;
    j.inv = 1.0f / scale;
    j.zf = (float)zp;
    kiln_parallel_for(threads, count, j.grain, quant_chunk, &j);
    *scale_out = scale;
    *zp_out = zp;
}

/* kd_f32_to_bf16 on 16 floats at a time: the same integer rounding (to nearest even; a NaN
 * keeps its top bits, made quiet) */
KD_AVX512 static void bf16_avx512(const float *a, int64_t n, uint16_t *h)
{
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = KD_LANES(i, n);
        __m512i x = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, a + i));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
        __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(_mm512_add_epi32(x, bias),
                             _mm512_and_si512(_mm512_srli_epi32(x, 16), one)), 16);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(x, 16), quiet));
        _mm512_mask_cvtepi32_storeu_epi16(h + i, m, r);
    }
}

static void bf16_chunk(void *ctx, int64_t begin, int64_t end)
{
    struct kd_act_job *j = ctx;
    if (j->avx512) {
        bf16_avx512(j->a + begin, end - begin, j->h + begin);
        return;
    }
    for (int64_t i = begin; i < end; i++) j->h[i] = kd_f32_to_bf16(j->a[i]);
}

void kd_to_bf16(const float *a, int64_t count, uint16_t *h, int threads)
{
    struct kd_act_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.h = h;
    j.grain = act_grain(count, threads);
    j.avx512 = kiln_cpu_isa() >= KILN_ISA_AVX512;
    kiln_parallel_for(threads, count, j.grain, bf16_chunk, &j);
}

int kd_pd_is_ref(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
        return 0;
    return strncmp(impl, "ref", 3) == 0;
}

/* oneDNN 2.6's AMX 1x1 convolution (jit_1x1:avx512_core_amx, int8 and bf16) gets output
 * channels past the last whole block of 16 wrong on the last image, and writes past its
 * destination: a 1x1 int8 convolution of 96 to 40 channels on 6 x 6 pixels corrupted the heap
 * (MobileNetV3's projections under static int8 on a Sapphire Rapids CPU). Its brgemm
 * sibling and the VNNI kernels are right on the same shapes (the QLinearConv kernel cases
 * on 6 x 6 images in tests/c/kernel_cases.h abort with a corrupted heap without this). */
int kd_pd_denied(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
        return 0;
    return strncmp(impl, "jit_1x1:avx512_core_amx", 23) == 0;
}

dnnl_status_t kd_pd_create(dnnl_primitive_desc_t *pd, const_dnnl_op_desc_t d,
                           const_dnnl_primitive_attr_t attr)
{
    *pd = NULL;
    dnnl_primitive_desc_iterator_t it = NULL;
    dnnl_status_t r = dnnl_primitive_desc_iterator_create(&it, d, attr, kd_engine(), NULL);
    if (r != dnnl_success) return r;
    for (;;) {
        dnnl_primitive_desc_t p = dnnl_primitive_desc_iterator_fetch(it);
        if (!p) {
            r = dnnl_unimplemented;
            break;
        }
        if (!kd_pd_denied(p)) {
            *pd = p;
            break;
        }
        dnnl_primitive_desc_destroy(p);
        if (dnnl_primitive_desc_iterator_next(it) != dnnl_success) {
            r = dnnl_unimplemented;
            break;
        }
    }
    dnnl_primitive_desc_iterator_destroy(it);
    return r;
}

int kd_cpu_amx_bf16(void)
{
    const char *env = getenv("KILN_AMX");
    if ((env && !strcmp(env, "0")) || kiln_cpu_isa() < KILN_ISA_AVX512) return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (d >> 22 & 1) && (d >> 24 & 1); /* AMX-BF16 and AMX-TILE */
}

int kd_pd_is_amx(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
        return 0;
    return strstr(impl, "amx") != NULL;
}

int kd_pd_int8_exact(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
        return 0;
    return strstr(impl, "vnni") != NULL || strstr(impl, "amx") != NULL;
}

/* ---- variants and the executor ---- */

kiln_status kd_variant_init(const struct kiln_node *n, dnnl_primitive_desc_t pd,
                            struct kd_variant *v)
{
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    v->scratch = sp ? dnnl_memory_desc_get_size(sp) : 0;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
        impl = "unknown";
    snprintf(v->impl, sizeof v->impl, "%s", impl);
    dnnl_status_t r = dnnl_primitive_create(&v->prim, pd);
    if (r != dnnl_success) {
        v->prim = NULL;
        return kd_error(n, r, "primitive creation");
    }
    if (v->scratch) {
        kd_variant_arg(v, DNNL_ARG_SCRATCHPAD, KD_SRC_SCRATCH, 0, sp);
    }
    return KILN_OK;
}

void kd_variant_arg(struct kd_variant *v, int arg, enum kd_src src, int index,
                    const dnnl_memory_desc_t *md)
{
    KILN_ASSERT(v->nargs < KD_MAX_ARGS);
    struct kd_arg *a = &v->args[v->nargs++];
    a->arg = arg;
    a->src = src;
    a->index = index;
    a->offset = 0;
    a->md = *md;
}

void kd_variant_arg_at(struct kd_variant *v, int arg, enum kd_src src, int index, size_t offset,
                       const dnnl_memory_desc_t *md)
{
    kd_variant_arg(v, arg, src, index, md);
    v->args[v->nargs - 1].offset = offset;
}

static void variant_clear(struct kd_variant *v)
{
    if (v->prim) dnnl_primitive_destroy(v->prim);
    memset(v, 0, sizeof *v);
}

kiln_status kd_exec_build(struct kd_exec *e, int threads, kd_make_fn make, void *arg,
                          int *handled)
{
    memset(e, 0, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    *handled = 0;
    if (!kd_engine()) return KILN_OK;
    if (threads < 1) threads = 1;
    e->threads = threads;
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    kiln_status st = make(arg, &e->v[0], threads);
    if (st == KILN_OK && e->v[0].prim) {
        e->nv = 1;
        if (threads > 1) {
            omp_set_num_threads(1);
            st = make(arg, &e->v[1], 1);
            if (st == KILN_OK && e->v[1].prim) e->nv = 2;
            else variant_clear(&e->v[1]);
        }
    }
    omp_set_num_threads(saved);
    if (st != KILN_OK || !e->nv) {
        kd_exec_destroy(e); /* e is left empty: callers do not destroy it again */
        return st;
    }
    *handled = 1;
    return KILN_OK;
}

void kd_exec_destroy(struct kd_exec *e)
{
    for (int i = 0; i < 2; i++) variant_clear(&e->v[i]);
    for (struct kd_binding *b = e->free_list, *next; b; b = next) {
        next = b->next;
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < KD_MAX_ARGS; k++)
                if (b->mem[i][k]) dnnl_memory_destroy(b->mem[i][k]);
        if (b->stream) dnnl_stream_destroy(b->stream);
        free(b);
    }
    pthread_mutex_destroy(&e->mu);
    memset(e, 0, sizeof *e);
}

void kd_inst_impl(struct kiln_kernel_inst *inst, const struct kd_exec *e)
{
    snprintf(inst->impl, sizeof inst->impl, "%s", e->nv ? e->v[0].impl : "");
}

size_t kd_exec_scratch(const struct kd_exec *e)
{
    size_t s = 0;
    for (int i = 0; i < e->nv; i++)
        if (e->v[i].scratch > s) s = e->v[i].scratch;
    return (s + 63) / 64 * 64;
}

/* A binding for one run: from the free list, or made (first runs only). */
static struct kd_binding *binding_get(struct kd_exec *e)
{
    pthread_mutex_lock(&e->mu);
    struct kd_binding *b = e->free_list;
    if (b) e->free_list = b->next;
    pthread_mutex_unlock(&e->mu);
    if (b) return b;
    b = calloc(1, sizeof *b);
    if (!b) return NULL;
    dnnl_engine_t eng = kd_engine();
    dnnl_status_t r = dnnl_stream_create(&b->stream, eng, dnnl_stream_default_flags);
    for (int i = 0; i < e->nv && r == dnnl_success; i++)
        for (int k = 0; k < e->v[i].nargs && r == dnnl_success; k++)
            r = dnnl_memory_create(&b->mem[i][k], &e->v[i].args[k].md, eng, DNNL_MEMORY_NONE);
    if (r != dnnl_success) {
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < KD_MAX_ARGS; k++)
                if (b->mem[i][k]) dnnl_memory_destroy(b->mem[i][k]);
        if (b->stream) dnnl_stream_destroy(b->stream);
        free(b);
        return NULL;
    }
    return b;
}

static void binding_put(struct kd_exec *e, struct kd_binding *b)
{
    pthread_mutex_lock(&e->mu);
    b->next = e->free_list;
    e->free_list = b;
    pthread_mutex_unlock(&e->mu);
}

kiln_status kd_exec_run(struct kd_exec *e, struct kiln_run_ctx *ctx)
{
    int vi = e->nv > 1 && ctx->threads <= 1 ? 1 : 0;
    int want = vi ? 1 : e->threads;
    if (ctx->threads >= 1 && ctx->threads < want) want = ctx->threads;
    if (omp_get_max_threads() != want) omp_set_num_threads(want);
    const struct kd_variant *v = &e->v[vi];
    void *heap_scratch = NULL, *scratch = ctx->scratch;
    if (v->scratch && !scratch) { /* callers without a plan arena */
        heap_scratch = scratch = aligned_alloc(64, (v->scratch + 63) / 64 * 64);
        if (!scratch)
            return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory for scratch");
    }
    struct kd_binding *b = binding_get(e);
    if (!b) {
        free(heap_scratch);
        return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY,
                               "out of memory for oneDNN run state");
    }
    dnnl_exec_arg_t args[KD_MAX_ARGS];
    dnnl_status_t r = dnnl_success;
    for (int k = 0; k < v->nargs && r == dnnl_success; k++) {
        const struct kd_arg *a = &v->args[k];
        void *p = NULL;
        switch (a->src) {
        case KD_SRC_IN: p = (char *)ctx->in[a->index]->data + a->offset; break;
        case KD_SRC_OUT: p = (char *)ctx->out[a->index]->data + a->offset; break;
        case KD_SRC_PACKED: p = v->packed; break;
        case KD_SRC_SCRATCH: p = scratch; break;
        case KD_SRC_SCRATCH_AT: p = (char *)scratch + a->index; break;
        }
        r = dnnl_memory_set_data_handle(b->mem[vi][k], p);
        args[k].arg = a->arg;
        args[k].memory = b->mem[vi][k];
    }
    if (r == dnnl_success) r = dnnl_primitive_execute(v->prim, b->stream, v->nargs, args);
    if (r == dnnl_success) r = dnnl_stream_wait(b->stream);
    binding_put(e, b);
    free(heap_scratch);
    if (r != dnnl_success) return kd_error(ctx->node, r, "execution");
    return KILN_OK;
}

void kd_exec_shift_scratch(struct kd_exec *e, size_t base)
{
    for (int vi = 0; vi < e->nv; vi++)
        for (int k = 0; k < e->v[vi].nargs; k++)
            if (e->v[vi].args[k].src == KD_SRC_SCRATCH_AT) e->v[vi].args[k].index += (int)base;
}

/* ---- explicit padding (kd_zero_border) ---- */

void kd_zero_border(void *buf, const dnnl_memory_desc_t *md, const int64_t *lo,
                    const int64_t *hi)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    int ns = md->ndims - 2;
    if (md->format_kind != dnnl_blocked || ns < 1 || ns > 3 || md->offset0 != 0 ||
        bd->inner_nblks > 1 || (bd->inner_nblks == 1 && bd->inner_idxs[0] != 1) ||
        md->padded_dims[1] != md->dims[1]) {
        memset(buf, 0, dnnl_memory_desc_get_size(md));
        return;
    }
    /* a pixel's channels: one block of ib floats at each (n, channel block, position);
     * channels-last is one block of all C */
    int64_t ib = bd->inner_nblks ? bd->inner_blks[0] : 1, cb = md->dims[1] / ib;
    if (ib == 1 && bd->strides[1] == 1) {
        ib = md->dims[1];
        cb = 1;
    }
    float *f = buf;
    int64_t last = md->dims[md->ndims - 1], sw = bd->strides[md->ndims - 1];
    int64_t l0 = lo[ns - 1], l1 = last - hi[ns - 1];
    /* outer positions: n, channel block, each spatial dim but the last */
    int64_t dims[4], idx[4] = {0}, total = 1;
    int nd = 1 + ns;
    dims[0] = md->dims[0];
    dims[1] = cb;
    for (int i = 0; i < ns - 1; i++) dims[2 + i] = md->dims[2 + i];
    for (int i = 0; i < nd; i++) total *= dims[i];
    for (int64_t p = 0; p < total; p++) {
        int64_t off = idx[0] * bd->strides[0] + idx[1] * bd->strides[1];
        int border = 0;
        for (int i = 0; i < ns - 1; i++) {
            off += idx[2 + i] * bd->strides[2 + i];
            if (idx[2 + i] < lo[i] || idx[2 + i] >= md->dims[2 + i] - hi[i]) border = 1;
        }
        int64_t seg[2][2] = {{0, border ? last : l0}, {border ? last : l1, last}};
        for (int k = 0; k < 2; k++) {
            if (sw == ib) {
                if (seg[k][1] > seg[k][0])
                    memset(f + off + seg[k][0] * sw, 0,
                           (size_t)((seg[k][1] - seg[k][0]) * ib) * sizeof(float));
            } else {
                for (int64_t x = seg[k][0]; x < seg[k][1]; x++)
                    memset(f + off + x * sw, 0, (size_t)ib * sizeof(float));
            }
        }
        for (int i = nd - 1; i >= 0 && ++idx[i] == dims[i]; i--) idx[i] = 0;
    }
}
