/*
 * artifact.c - kiln_session_save: the writer of compiled artifacts (.kiln
 * files, docs/KILN_FORMAT.md; the reader is src/import/kiln_artifact.c).
 *
 * It writes the graph a session runs (the optimized graph, as the optimizer
 * left it, blocked layouts included), the session's signature, precision and
 * the CPU features its kernels need, the batch sizes to precompile at load,
 * the compile report verbatim, and every constant tensor once (shared
 * tensors are written once) at a 64-byte aligned offset of the weight
 * section, so that the reader can use them in place from the mapped file.
 * In bf16 and int8 files the weights those kernels compress are stored
 * bf16, resp. s8 with per-channel scales (mark_lowp_weights), and not also
 * as packs; the sparse kernels' timed choices go to SPRS (format version 2).
 * Each section is built in memory, then the file is written to a temporary
 * name beside the target and renamed over it, so a reader never sees half
 * a file.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "api/internal.h"
#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "import/kiln_artifact.h"
#include "import/model.h"
#include "exec/plan.h"
#include "kernels/fast.h"

#define ALIGN64(x) (((x) + 63) / 64 * 64)

struct wbuf {
    uint8_t *p;
    size_t n, cap;
    int oom;
};

static void put(struct wbuf *b, const void *src, size_t k)
{
    if (b->oom) return;
    if (b->n + k > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + k) cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    if (k) memcpy(b->p + b->n, src, k);
    b->n += k;
}

static void put_u8(struct wbuf *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(struct wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_i32(struct wbuf *b, int32_t v) { put(b, &v, 4); }
static void put_i64(struct wbuf *b, int64_t v) { put(b, &v, 8); }
static void put_f32(struct wbuf *b, float v) { put(b, &v, 4); }

static void put_str(struct wbuf *b, const char *s)
{
    if (!s) {
        put_u32(b, KILN_ART_NULL_STR);
        return;
    }
    size_t n = strlen(s);
    put_u32(b, (uint32_t)n);
    put(b, s, n);
}

static void put_bytes(struct wbuf *b, const kiln_string *s)
{
    put_u32(b, (uint32_t)s->len);
    put(b, s->data, s->len);
}

/* How a weight is stored: as it is, as bfloat16, or as s8 with per-channel scales. */
enum { STORE_PLAIN = 0, STORE_BF16 = 1, STORE_S8 = 2 };

/* Tensors already in the weight section (one entry per distinct tensor and storage). */
struct wlist {
    const kiln_tensor **t;
    int64_t *off;
    uint8_t *mode;         /* STORE_* */
    int n, cap;
};

struct writer {
    struct wbuf meta, sign, grph, wght, pack, sprs;
    int n_packs, n_sprs;
    struct wlist w;
    kiln_status st;
    const struct kiln_graph *root;
    uint8_t *as_bf16;      /* per root value: a weight the bf16 session rounds to bfloat16 */
    int8_t *s8_axis;       /* per root value: the output-channel axis of a weight stored s8, or -1 */
    uint8_t *unread;       /* per root value: a constant nothing reads (mark_unread) */
    kiln_tensor empty;     /* what such a constant is written as: its dtype, shape [0] */
};

/* f32 -> bf16, rounding to nearest even (what the bf16 kernels do when they
 * pack a weight: rounding a bf16 value again gives the same bits). */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static int is_bf16_product(const struct kiln_node *n)
{
    switch (n->op) {
    case KILN_OP_MatMul:
    case KILN_OP_Conv:
    case KILN_OP_KilnFusedConv:
        return 1;
    case KILN_OP_Gemm:
    case KILN_OP_KilnFusedMatMul: {
        const struct kiln_attr *a = kiln_node_attr(n, "alpha");
        return !a || (a->type == KILN_ATTR_FLOAT && a->f == 1.0f); /* alpha is folded into B */
    }
    default:
        return 0;
    }
}

/* The output-channel axis along which the int8 kernels quantize the weight
 * (input 1) of node n: the N of a 2-D MatMul / Gemm B (per output column),
 * the M of a convolution's [M, C, k...]; -1 for any other reader. */
static int int8_weight_axis(const struct kiln_node *n, const kiln_tensor *t)
{
    switch (n->op) {
    case KILN_OP_MatMul:
        return t->rank == 2 ? 1 : -1;
    case KILN_OP_Gemm:
    case KILN_OP_KilnFusedMatMul: {
        if (t->rank != 2) return -1;
        const struct kiln_attr *a = kiln_node_attr(n, "transB");
        if (!a) return 1;
        return a->type == KILN_ATTR_INT && (a->i == 0 || a->i == 1) ? (int)(1 - a->i) : -1;
    }
    case KILN_OP_Conv:
    case KILN_OP_KilnFusedConv:
        return t->rank >= 3 ? 0 : -1;
    default:
        return -1;
    }
}

/* Symmetric s8 per output channel, exactly as the int8 kernels quantize a
 * weight (kd_pack_weights_s8, kiln_sparse_pack): scale = max |w| / 127 over
 * the channel (1 for an all-zero channel), q = clamp(nearbyint(w / scale),
 * -127, 127). Returns 1 when storing (q, scale) loses nothing the int8
 * kernels see: every weight is finite, and quantizing the dequantized
 * weights q * scale again gives the same scales and the same q bit for bit,
 * so a loaded file's int8 kernels compute exactly what the source session's
 * did. q (count bytes) and scale (dims[axis] floats) receive the result. */
static int s8_quantize_exact(const kiln_tensor *t, int axis, int8_t *q, float *scale)
{
    const float *w = t->data;
    int64_t count = kiln_tensor_count(t), nch = t->dims[axis], inner = 1;
    for (int i = axis + 1; i < t->rank; i++) inner *= t->dims[i];
    if (nch <= 0 || inner <= 0) return 0;
    float *mx = calloc((size_t)nch, sizeof *mx);
    if (!mx) return 0;
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: the weights; pass 1: q * scale, what the reader rebuilds */
        for (int64_t c = 0; c < nch; c++) mx[c] = 0.0f;
        for (int64_t i = 0; i < count; i++) {
            float v = pass ? (float)q[i] * scale[(i / inner) % nch] : w[i];
            if (!isfinite(v)) {
                free(mx);
                return 0;
            }
            float a = fabsf(v);
            if (a > mx[(i / inner) % nch]) mx[(i / inner) % nch] = a;
        }
        for (int64_t c = 0; c < nch; c++) {
            float sc = mx[c] > 0.0f && isfinite(mx[c]) ? mx[c] / 127.0f : 1.0f;
            if (pass && memcmp(&sc, &scale[c], sizeof sc)) {
                free(mx);
                return 0;
            }
            scale[c] = sc;
        }
        for (int64_t i = 0; i < count; i++) {
            float v = pass ? (float)q[i] * scale[(i / inner) % nch] : w[i];
            float r = nearbyintf(v / scale[(i / inner) % nch]);
            if (!(r >= -127.0f)) r = -127.0f;
            if (r > 127.0f) r = 127.0f;
            if (pass && (int8_t)r != q[i]) {
                free(mx);
                return 0;
            }
            q[i] = (int8_t)r;
        }
    }
    free(mx);
    return 1;
}

/* Whether the f32 weight t is exactly (float)q * scale[c] for some s8 q in
 * [-127, 127] and one positive scale per channel c along axis, bit for bit
 * (-0.0 and NaN never are): the weights of a product a static int8 graph left
 * in float after DequantizeLinear(s8) was folded into it, for example. Such a
 * weight is stored s8 with its scales at no cost in accuracy: the reader's
 * q * scale gives back the very floats, and quantizing those again gives the
 * int8 kernels the same q. For each channel the scale is tried at
 * max |w| / 127 and its neighbours up to 3 ulps away (127 * s rounded, then
 * divided by 127, may land an ulp off s). q and scale receive the result. */
static int s8_lossless(const kiln_tensor *t, int axis, int8_t *q, float *scale)
{
    const float *w = t->data;
    int64_t nch = t->dims[axis], inner = 1, outer = 1;
    for (int i = axis + 1; i < t->rank; i++) inner *= t->dims[i];
    for (int i = 0; i < axis; i++) outer *= t->dims[i];
    if (nch <= 0 || inner <= 0 || outer <= 0) return 0;
    for (int64_t c = 0; c < nch; c++) {
        float mx = 0.0f;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                float v = w[(o * nch + c) * inner + j];
                if (!isfinite(v)) return 0;
                if (fabsf(v) > mx) mx = fabsf(v);
            }
        float base = mx > 0.0f ? mx / 127.0f : 1.0f;
        int found = 0;
        for (int step = 0; step < 7 && !found; step++) {
            /* base, +1 ulp, -1 ulp, +2, -2, +3, -3 */
            float s = base;
            for (int k = 0; k < (step + 1) / 2; k++) s = nextafterf(s, step % 2 ? INFINITY : 0.0f);
            if (!(s > 0.0f) || !isfinite(s)) continue;
            found = 1;
            for (int64_t o = 0; o < outer && found; o++)
                for (int64_t j = 0; j < inner && found; j++) {
                    int64_t i = (o * nch + c) * inner + j;
                    float r = nearbyintf(w[i] / s);
                    if (!(r >= -127.0f && r <= 127.0f)) { /* (int8_t)r would be undefined */
                        found = 0;
                        break;
                    }
                    float back = (float)(int8_t)r * s; /* the reader's arithmetic */
                    found = !memcmp(&back, &w[i], sizeof back);
                    q[i] = (int8_t)r;
                }
            if (found) scale[c] = s;
        }
        if (!found) return 0;
    }
    return 1;
}

/* Weights the int8 kernels quantized: keys of the weight cache's s8 packs
 * (oneDNN's "dnnl_..._s8_..." and the sparse kernel's "sparse_s8_..."). */
struct keyset {
    const void **k;
    int n, cap, oom;
};

static void keyset_add(struct keyset *ks, const void *key);

static void collect_s8(void *ctx, const void *key, const char *tag, const void *packed, size_t bytes)
{
    (void)packed;
    (void)bytes;
    if (!((!strncmp(tag, "dnnl_", 5) && strstr(tag, "_s8_")) || !strncmp(tag, "sparse_s8_", 10)))
        return;
    keyset_add(ctx, key);
}

/* Weights the bf16 kernels packed: keys of "dnnl_conv_bf16:..." / "dnnl_matmul_bf16:...".
 * A bf16 session on a CPU without AVX-512 runs its products in fp32 and packs none. */
static void collect_bf16(void *ctx, const void *key, const char *tag, const void *packed,
                         size_t bytes)
{
    (void)packed;
    (void)bytes;
    if (!strncmp(tag, "dnnl_", 5) && strstr(tag, "_bf16:")) keyset_add(ctx, key);
}

static int keyset_has(const struct keyset *ks, const void *key)
{
    for (int i = 0; i < ks->n; i++)
        if (ks->k[i] == key) return 1;
    return 0;
}

static void keyset_add(struct keyset *ks, const void *key)
{
    if (ks->n == ks->cap) {
        int cap = ks->cap ? ks->cap * 2 : 64;
        const void **nk = realloc(ks->k, (size_t)cap * sizeof *nk);
        if (!nk) {
            ks->oom = 1;
            return;
        }
        ks->k = nk;
        ks->cap = cap;
    }
    ks->k[ks->n++] = key;
}

/* The weights a file stores compressed (root graph f32 constants read only
 * as the weight, input 1, of products that run in a lower precision, the
 * session's or a node's own; any other reader keeps a weight f32):
 * - bf16: those the bf16 kernels pack as bfloat16 (MatMul, Gemm or
 *   convolution with alpha 1), so that widening the stored bf16 and packing
 *   it again gives the kernels the same bits;
 * - int8: those the int8 kernels of the compiled plans quantized (an s8 pack
 *   in the weight cache) and for which s8_quantize_exact holds, stored s8
 *   with their channel scales. */
static kiln_status mark_lowp_weights(struct writer *w, const struct kiln_graph *g, int precision,
                                     struct kiln_weight_cache *wc)
{
    int n = g->n_values + 1;
    w->as_bf16 = calloc((size_t)n, 1);
    w->s8_axis = malloc((size_t)n);
    uint8_t *other = calloc((size_t)n, 1);
    int8_t *axis = malloc((size_t)n);
    struct keyset ks = {0}, kb = {0};
    kiln_status st = KILN_OK;
    if (!w->as_bf16 || !w->s8_axis || !other || !axis) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    memset(w->s8_axis, -1, (size_t)n);
    memset(axis, -1, (size_t)n);
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *nd = &g->nodes[i];
        /* the node's precision: its per-node exception (kiln_session_set_node_precision,
         * recorded by kiln_session_artifact_view), else the session's */
        const struct kiln_attr *pa = kiln_node_attr(nd, KILN_NODE_PRECISION_ATTR);
        int np = pa && pa->type == KILN_ATTR_INT && pa->i >= KILN_PRECISION_FP32 &&
                         pa->i <= KILN_PRECISION_INT8 ? (int)pa->i : precision;
        for (int k = 0; k < nd->n_in; k++) {
            int v = nd->in[k];
            if (v < 0) continue;
            const kiln_tensor *t = g->values[v].kind == KILN_VALUE_CONST ? g->values[v].konst : NULL;
            int ax = k == 1 && t && np == KILN_PRECISION_INT8 ? int8_weight_axis(nd, t) : -1;
            if (k == 1 && np == KILN_PRECISION_BF16 && is_bf16_product(nd)) {
                w->as_bf16[v] = 1;
            } else if (ax >= 0 && (axis[v] < 0 || axis[v] == ax)) {
                axis[v] = (int8_t)ax;
            } else {
                other[v] = 1;
            }
        }
        for (int k = 0; k < nd->n_implicit; k++) other[nd->implicit[k]] = 1;
    }
    for (int k = 0; k < g->n_outputs; k++) other[g->outputs[k]] = 1;
    for (int v = 0; v < g->n_values; v++)
        if (w->as_bf16[v] && axis[v] >= 0) other[v] = 1; /* read by a bf16 and an int8 node */
    if (wc) {
        kiln_weight_cache_each(wc, collect_s8, &ks);
        kiln_weight_cache_each(wc, collect_bf16, &kb);
        if (ks.oom || kb.oom) {
            st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
            goto out;
        }
    }
    for (int v = 0; v < g->n_values; v++) {
        const struct kiln_value *val = &g->values[v];
        if (other[v] || val->kind != KILN_VALUE_CONST || !val->konst ||
            val->konst->dtype != KILN_DTYPE_F32 || !val->konst->data) {
            w->as_bf16[v] = 0;
            continue;
        }
        /* stored bf16 only where a bf16 kernel packed it: else the file would round a
         * weight the session multiplied in fp32 (a bf16 session without AVX-512) */
        if (wc && !keyset_has(&kb, val->konst)) w->as_bf16[v] = 0;
        if (axis[v] < 0) continue;
        if (!keyset_has(&ks, val->konst)) continue;
        const kiln_tensor *t = val->konst;
        int8_t *q = malloc((size_t)kiln_tensor_count(t) + 1);
        float *sc = malloc(sizeof(float) * (size_t)(t->dims[axis[v]] + 1));
        if (q && sc && s8_quantize_exact(t, axis[v], q, sc)) w->s8_axis[v] = axis[v];
        free(q);
        free(sc);
    }
    /* any precision: f32 weights of products that are exactly s8 times a channel scale, and
     * embedding tables (a Gather's constant matrix on axis 0) that are exactly s8 times a
     * row scale (kiln_model_quantize_tables) */
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *nd = &g->nodes[i];
        int table = nd->op == KILN_OP_Gather && kiln_attr_int(nd, "axis", 0) == 0;
        int v = table ? nd->in[0] : nd->n_in > 1 ? nd->in[1] : -1;
        if (v < 0 || v >= g->n_values || w->s8_axis[v] >= 0) continue;
        const struct kiln_value *val = &g->values[v];
        const kiln_tensor *t = val->kind == KILN_VALUE_CONST ? val->konst : NULL;
        if (!t || t->dtype != KILN_DTYPE_F32 || !t->data || kiln_tensor_count(t) < 64) continue;
        if (table && (t->rank != 2 || w->as_bf16[v])) continue;
        int ax = table ? 0 : int8_weight_axis(nd, t);
        if (ax < 0) continue;
        int8_t *q = malloc((size_t)kiln_tensor_count(t) + 1);
        float *sc = malloc(sizeof(float) * (size_t)(t->dims[ax] + 1));
        if (q && sc && s8_lossless(t, ax, q, sc)) w->s8_axis[v] = (int8_t)ax;
        free(q);
        free(sc);
    }
out:
    free(ks.k);
    free(kb.k);
    free(other);
    free(axis);
    return st;
}

/* Root constants that no node, subgraph or graph output reads: the optimizer
 * leaves the values of what it rewrote in the graph (the f32 weights a static
 * int8 graph quantized, for example). They are written empty (their dtype,
 * shape [0]) and their packs are not written: a statically quantized resnet18
 * was 395 MB, its f32 weights and their fp32 packs stored beside the s8 ones. */
static kiln_status mark_unread(struct writer *w, const struct kiln_graph *g)
{
    w->unread = calloc((size_t)g->n_values + 1, 1);
    uint8_t *read = calloc((size_t)g->n_values + 1, 1);
    if (!w->unread || !read) {
        free(read);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    kiln_graph_mark_reads(g, read);
    for (int v = 0; v < g->n_values; v++)
        w->unread[v] = g->values[v].kind == KILN_VALUE_CONST && !read[v];
    free(read);
    return KILN_OK;
}

static void wfail(struct writer *w, kiln_status st, const char *msg)
{
    if (w->st == KILN_OK) w->st = kiln_error(st, "kiln_session_save: %s", msg);
}

static void put_zeros_to64(struct wbuf *b)
{
    static const uint8_t zeros[64];
    put(b, zeros, ALIGN64(b->n) - b->n);
}

/* A tensor record. mode STORE_S8 is given with the output-channel axis. */
static void put_tensor(struct writer *w, struct wbuf *b, const kiln_tensor *t, int mode, int axis)
{
    put_i32(b, (int32_t)t->dtype);
    put_i32(b, t->rank);
    for (int i = 0; i < t->rank; i++) put_i64(b, t->dims[i]);
    if (t->dtype == KILN_DTYPE_STRING) {
        int64_t n = kiln_tensor_count(t);
        const kiln_string *s = t->data;
        for (int64_t i = 0; i < n; i++) put_bytes(b, &s[i]);
        return;
    }
    if (t->nbytes && !t->data) {
        wfail(w, KILN_ERR_INTERNAL, "a constant's data is not resident");
        return;
    }
    int64_t count = kiln_tensor_count(t), nch = mode == STORE_S8 ? t->dims[axis] : 0;
    int64_t off = -1;
    for (int i = 0; i < w->w.n && off < 0; i++)
        if (w->w.t[i] == t && w->w.mode[i] == mode) off = w->w.off[i];
    if (off < 0) {
        if (w->w.n == w->w.cap) {
            int cap = w->w.cap ? w->w.cap * 2 : 256;
            const kiln_tensor **nt = realloc(w->w.t, (size_t)cap * sizeof *nt);
            if (nt) w->w.t = nt;
            int64_t *no = realloc(w->w.off, (size_t)cap * sizeof *no);
            if (no) w->w.off = no;
            uint8_t *nb = realloc(w->w.mode, (size_t)cap);
            if (nb) w->w.mode = nb;
            if (!nt || !no || !nb) {
                wfail(w, KILN_ERR_OUT_OF_MEMORY, "out of memory");
                return;
            }
            w->w.cap = cap;
        }
        put_zeros_to64(&w->wght);
        off = (int64_t)w->wght.n;
        if (mode == STORE_BF16) {
            const float *f = t->data;
            for (int64_t i = 0; i < count; i++) {
                uint16_t h = f32_to_bf16(f[i]);
                put(&w->wght, &h, 2);
            }
        } else if (mode == STORE_S8) {
            /* the s8 weights, then (64-aligned) the channel scales */
            int8_t *q = malloc((size_t)count + 1);
            float *sc = malloc(sizeof(float) * (size_t)(nch + 1));
            if (!q || !sc || (!s8_lossless(t, axis, q, sc) && !s8_quantize_exact(t, axis, q, sc))) {
                free(q);
                free(sc);
                wfail(w, q && sc ? KILN_ERR_INTERNAL : KILN_ERR_OUT_OF_MEMORY,
                      q && sc ? "an s8 weight no longer quantizes exactly" : "out of memory");
                return;
            }
            put(&w->wght, q, (size_t)count);
            put_zeros_to64(&w->wght);
            put(&w->wght, sc, sizeof(float) * (size_t)nch);
            free(q);
            free(sc);
        } else {
            put(&w->wght, t->data, t->nbytes);
        }
        w->w.t[w->w.n] = t;
        w->w.mode[w->w.n] = (uint8_t)mode;
        w->w.off[w->w.n++] = off;
    }
    static const int32_t stored[3] = {0, KILN_DTYPE_BF16, KILN_DTYPE_I8};
    put_i32(b, mode == STORE_PLAIN ? (int32_t)t->dtype : stored[mode]);
    put_i64(b, off);
    put_i64(b, mode == STORE_BF16 ? count * 2 : mode == STORE_S8 ? count : (int64_t)t->nbytes);
    if (mode == STORE_S8) { /* format version 2: the channel axis and the scales */
        put_i32(b, axis);
        put_i64(b, (int64_t)ALIGN64((uint64_t)off + (uint64_t)count));
        put_i64(b, nch * 4);
    }
}

static void put_type(struct wbuf *b, const struct kiln_type *t)
{
    put_i32(b, (int32_t)t->dtype);
    put_i32(b, t->rank);
    for (int i = 0; i < t->rank && i < KILN_MAX_RANK; i++) {
        put_i64(b, t->dims[i]);
        put_str(b, t->sym[i]);
    }
}

static void put_graph(struct writer *w, struct wbuf *b, const struct kiln_graph *g);

static int attr_valid(const struct kiln_attr *a)
{
    return a->type >= KILN_ATTR_FLOAT && a->type <= KILN_ATTR_STRINGS &&
           (a->type != KILN_ATTR_TENSOR || a->t) && (a->type != KILN_ATTR_GRAPH || a->g);
}

static void put_attr(struct writer *w, struct wbuf *b, const struct kiln_attr *a)
{
    put_str(b, a->name ? a->name : "");
    put_u8(b, (uint8_t)a->type);
    switch (a->type) {
    case KILN_ATTR_FLOAT: put_f32(b, a->f); break;
    case KILN_ATTR_INT: put_i64(b, a->i); break;
    case KILN_ATTR_STRING: put_bytes(b, &a->s); break;
    case KILN_ATTR_TENSOR: put_tensor(w, b, a->t, STORE_PLAIN, -1); break;
    case KILN_ATTR_GRAPH: put_graph(w, b, a->g); break;
    case KILN_ATTR_FLOATS:
        put_u32(b, (uint32_t)a->n);
        for (int i = 0; i < a->n; i++) put_f32(b, a->floats[i]);
        break;
    case KILN_ATTR_INTS:
        put_u32(b, (uint32_t)a->n);
        for (int i = 0; i < a->n; i++) put_i64(b, a->ints[i]);
        break;
    case KILN_ATTR_STRINGS:
        put_u32(b, (uint32_t)a->n);
        for (int i = 0; i < a->n; i++) put_bytes(b, &a->strings[i]);
        break;
    }
}

static void put_graph(struct writer *w, struct wbuf *b, const struct kiln_graph *g)
{
    put_str(b, g->name ? g->name : "");
    put_u32(b, (uint32_t)g->n_values);
    for (int v = 0; v < g->n_values; v++) {
        const struct kiln_value *val = &g->values[v];
        put_str(b, val->name ? val->name : "");
        put_u8(b, (uint8_t)val->kind);
        put_type(b, &val->type);
        put_i32(b, val->kind == KILN_VALUE_OUTER ? val->outer : -1);
        put_i32(b, val->layout);
        if (val->kind == KILN_VALUE_CONST) {
            if (!val->konst) {
                wfail(w, KILN_ERR_INTERNAL, "a constant value has no tensor");
                return;
            }
            int root = g == w->root;
            if (root && w->unread && w->unread[v]) { /* nothing reads it: written empty */
                w->empty = *val->konst;
                w->empty.rank = 1;
                w->empty.dims[0] = 0;
                w->empty.nbytes = 0;
                put_tensor(w, b, &w->empty, STORE_PLAIN, -1);
                continue;
            }
            int s8 = root && w->s8_axis && w->s8_axis[v] >= 0;
            int bf = root && w->as_bf16 && w->as_bf16[v];
            put_tensor(w, b, val->konst, s8 ? STORE_S8 : bf ? STORE_BF16 : STORE_PLAIN,
                       s8 ? w->s8_axis[v] : -1);
        }
    }
    put_u32(b, (uint32_t)g->n_nodes);
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        put_str(b, kiln_op_name(n->op));
        put_str(b, n->op_type ? n->op_type : kiln_op_name(n->op));
        put_str(b, n->name ? n->name : "");
        put_i32(b, n->opset);
        put_u32(b, (uint32_t)n->n_in);
        for (int k = 0; k < n->n_in; k++) put_i32(b, n->in[k]);
        put_u32(b, (uint32_t)n->n_out);
        for (int k = 0; k < n->n_out; k++) put_i32(b, n->out[k]);
        int na = 0;
        for (int k = 0; k < n->n_attr; k++) na += attr_valid(&n->attr[k]);
        put_u32(b, (uint32_t)na);
        for (int k = 0; k < n->n_attr; k++)
            if (attr_valid(&n->attr[k])) put_attr(w, b, &n->attr[k]);
    }
    put_u32(b, (uint32_t)g->n_inputs);
    for (int i = 0; i < g->n_inputs; i++) put_i32(b, g->inputs[i]);
    put_u32(b, (uint32_t)g->n_outputs);
    for (int i = 0; i < g->n_outputs; i++) put_i32(b, g->outputs[i]);
}

/* Whether a oneDNN pack's tag ("dnnl_conv:s...:src...;d16,8,3,3;p...") names as many
 * dims and elements as t, the constant whose address is its key (the order may differ: a
 * Gemm's transposed B is described as [K, N]). The weight cache keys packs by tensor
 * address, and an entry can outlive its tensor (a transient graph's copy of a weight,
 * freed with that graph) while a new constant takes the same address: a statically
 * quantized model whose weights came through Identity nodes stored 11 such packs, 98 KB
 * beside 10 KB of weights, under scalar zero points and s8 weights of the same shape. A
 * tag without dims is taken as it is. */
static int tag_dims_match(const char *tag, const kiln_tensor *t)
{
    const char *d = strstr(tag, ";d");
    if (!d || !t) return 1;
    d += 2;
    int r = 0;
    long long count = 1;
    while (*d >= '0' && *d <= '9') {
        char *end;
        long long v = strtoll(d, &end, 10);
        if (v < 0 || v > (1LL << 40) || (v && count > (1LL << 50) / v)) return 0;
        count *= v;
        r++;
        d = end;
        if (*d != ',') break;
        d++;
    }
    return r == t->rank && count == (long long)kiln_tensor_count(t);
}

/* One entry of the weight cache. A packed weight is kept when it packs a
 * constant of the saved graph by a plain oneDNN reorder (tags "dnnl_..."; int8
 * packs carry their scales in the buffer and are made again at load) and the
 * constant is stored in its own precision: a weight stored bf16 or s8 is
 * packed again at load rather than stored twice. A decided sparse-or-dense
 * choice (kiln_artifact_sparse_choice_tag, an int) goes to SPRS. */
static void put_pack(void *ctx, const void *key, const char *tag, const void *packed, size_t bytes)
{
    struct writer *w = ctx;
    const struct kiln_graph *g = w->root;
    int v = -1;
    for (int i = 0; i < g->n_values && v < 0; i++)
        if (g->values[i].kind == KILN_VALUE_CONST && g->values[i].konst == key) v = i;
    if (v < 0 || (w->unread && w->unread[v])) return;
    if (kiln_artifact_sparse_choice_tag(tag)) {
        int choice = *(const int *)packed;
        if (choice != 0 && choice != 1 && choice != 4) return; /* not decided */
        put_i32(&w->sprs, v);
        put_str(&w->sprs, tag);
        put_i32(&w->sprs, choice);
        w->n_sprs++;
        return;
    }
    if (strncmp(tag, "dnnl_", 5) || strstr(tag, "_s8_") || !bytes) return;
    /* the model's cache packs f32 weights (a static int8 graph's s8 ones are its session's) */
    if (g->values[v].konst->dtype != KILN_DTYPE_F32 || !tag_dims_match(tag, g->values[v].konst))
        return;
    if ((w->as_bf16 && w->as_bf16[v]) || (w->s8_axis && w->s8_axis[v] >= 0)) return;
    put_zeros_to64(&w->wght);
    int64_t off = (int64_t)w->wght.n;
    put(&w->wght, packed, bytes);
    put_i32(&w->pack, v);
    put_str(&w->pack, tag);
    put_i64(&w->pack, off);
    put_i64(&w->pack, (int64_t)bytes);
    w->n_packs++;
}

static void put_value_info(struct wbuf *b, const kiln_value_info *vi, int id)
{
    put_str(b, vi->name ? vi->name : "");
    put_i32(b, (int32_t)vi->dtype);
    put_i32(b, vi->rank);
    for (int i = 0; i < vi->rank && i < KILN_MAX_RANK; i++) {
        put_i64(b, vi->dims[i]);
        put_str(b, vi->dim_names[i]);
    }
    put_i32(b, id);
}

/* Write the sections as one file: header, table, sections at 64-byte offsets. */
static kiln_status write_file(const char *path, struct wbuf **secs, const uint32_t *kinds, int n)
{
    uint8_t table[KILN_ART_MAX_SECTIONS * 32];
    uint64_t offs[KILN_ART_MAX_SECTIONS];
    uint64_t off = ALIGN64(KILN_ART_HEADER_BYTES + 32 * (uint64_t)n);
    memset(table, 0, sizeof table);
    for (int i = 0; i < n; i++) {
        uint32_t crc = kiln_crc32c(secs[i]->p ? secs[i]->p : (const uint8_t *)"", secs[i]->n);
        uint64_t len = secs[i]->n;
        offs[i] = off;
        memcpy(table + 32 * i, &kinds[i], 4);
        memcpy(table + 32 * i + 4, &crc, 4);
        memcpy(table + 32 * i + 8, &off, 8);
        memcpy(table + 32 * i + 16, &len, 8);
        off = ALIGN64(off + len);
    }
    uint64_t fsize = n ? offs[n - 1] + secs[n - 1]->n : off;
    uint8_t head[KILN_ART_HEADER_BYTES];
    memset(head, 0, sizeof head);
    memcpy(head, KILN_ART_MAGIC, KILN_ART_MAGIC_LEN);
    uint32_t version = KILN_ART_FORMAT_VERSION, hbytes = KILN_ART_HEADER_BYTES, nsec = (uint32_t)n;
    uint32_t tcrc = kiln_crc32c(table, 32 * (size_t)n);
    memcpy(head + 8, &version, 4);
    memcpy(head + 12, &hbytes, 4);
    memcpy(head + 16, &fsize, 8);
    memcpy(head + 24, &nsec, 4);
    memcpy(head + 28, &tcrc, 4);
    strncpy((char *)head + 32, KILN_VERSION_STRING, 16);
    uint32_t hcrc = kiln_crc32c(head, 60);
    memcpy(head + 60, &hcrc, 4);

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        kiln_status st = kiln_error(KILN_ERR_IO, "cannot write '%s'", tmp);
        free(tmp);
        return st;
    }
    static const uint8_t zeros[64];
    int ok = fwrite(head, 1, sizeof head, f) == sizeof head &&
             fwrite(table, 1, 32 * (size_t)n, f) == 32 * (size_t)n;
    uint64_t at = KILN_ART_HEADER_BYTES + 32 * (uint64_t)n;
    for (int i = 0; i < n && ok; i++) {
        size_t pad = (size_t)(offs[i] - at);
        ok = fwrite(zeros, 1, pad, f) == pad &&
             (secs[i]->n == 0 || fwrite(secs[i]->p, 1, secs[i]->n, f) == secs[i]->n);
        at = offs[i] + secs[i]->n;
    }
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        free(tmp);
        return kiln_error(KILN_ERR_IO, "cannot write '%s'", path);
    }
    free(tmp);
    return KILN_OK;
}

kiln_status kiln_session_save(kiln_session *s, const char *path, const kiln_save_options *opts)
{
    if (!s || !path) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_save: NULL argument");
    const struct kiln_model *m;
    const struct kiln_signature *sig;
    const struct kiln_graph *g;
    int precision;
    int nb = opts && opts->batch_sizes ? opts->n_batch_sizes : 0;
    if (nb < 0 || nb > 1024)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_save: %d batch sizes (0..1024)",
                          nb);
    for (int i = 0; i < nb; i++)
        if (opts->batch_sizes[i] < 1 || opts->batch_sizes[i] > (1 << 24))
            return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                              "kiln_session_save: batch size %lld is not 1..%d",
                              (long long)opts->batch_sizes[i], 1 << 24);
    /* the plans of the saved batch sizes pack the weights PACK keeps */
    kiln_status st = nb ? kiln_session_precompile(s, opts->batch_sizes, nb) : KILN_OK;
    if (st != KILN_OK) return st;
    st = kiln_session_artifact_view(s, &m, &sig, &g, &precision); /* pins every weight */
    if (st != KILN_OK) return st;
    int any_lowp = precision != KILN_PRECISION_FP32;
    for (int i = 0; i < g->n_nodes && !any_lowp; i++) {
        const struct kiln_attr *pa = kiln_node_attr(&g->nodes[i], KILN_NODE_PRECISION_ATTR);
        any_lowp = pa && pa->type == KILN_ATTR_INT && pa->i != KILN_PRECISION_FP32;
    }
    if (any_lowp && nb == 0) {
        /* which weights the int8 kernels quantize, and which the bf16 kernels pack as
         * bfloat16 (mark_lowp_weights), is known once a plan is compiled */
        const int64_t one = 1;
        if (kiln_session_precompile(s, &one, 1) != KILN_OK) kiln_error_clear();
    }
    struct writer w = {0};
    char cpu[128];
    kiln_artifact_cpu_features(g, precision, cpu, sizeof cpu);
    /* META */
    put_u32(&w.meta, (uint32_t)precision);
    put_str(&w.meta, cpu);
    const struct kiln_artifact_info *src_art = m->artifact;
    put_str(&w.meta, src_art ? src_art->source_format : m->format ? m->format : "");
    put_str(&w.meta, m->stats.producer ? m->stats.producer : "");
    put_i64(&w.meta, m->stats.ir_version);
    put_u32(&w.meta, (uint32_t)nb);
    for (int i = 0; i < nb; i++) put_i64(&w.meta, opts->batch_sizes[i]);
    put_u32(&w.meta, (uint32_t)m->n_opsets);
    for (int i = 0; i < m->n_opsets; i++) {
        put_str(&w.meta, m->opset_domain[i] ? m->opset_domain[i] : "");
        put_i64(&w.meta, m->opset_version[i]);
    }
    /* SIGN */
    put_str(&w.sign, sig->name);
    put_str(&w.sign, sig->method ? sig->method : "");
    put_u32(&w.sign, (uint32_t)sig->n_inputs);
    for (int i = 0; i < sig->n_inputs; i++)
        put_value_info(&w.sign, &sig->inputs[i], sig->input_values[i]);
    put_u32(&w.sign, (uint32_t)sig->n_outputs);
    for (int i = 0; i < sig->n_outputs; i++)
        put_value_info(&w.sign, &sig->outputs[i], sig->output_values[i]);
    /* GRPH and WGHT */
    w.root = g;
    w.st = mark_lowp_weights(&w, g, precision, m->weights); /* per-node precisions too */
    if (w.st == KILN_OK) w.st = mark_unread(&w, g);
    if (w.st == KILN_OK) put_graph(&w, &w.grph, g);
    /* PACK: the weights as the plans of the saved batch sizes packed them */
    struct wbuf packs = {0};
    if (w.st == KILN_OK && nb > 0) {
        char env[128];
        kiln_weight_cache_pack_env(env, sizeof env);
        put_str(&packs, env);
        kiln_weight_cache_each(m->weights, put_pack, &w);
        put_u32(&packs, (uint32_t)w.n_packs);
        put(&packs, w.pack.p, w.pack.n);
    }
    /* SPRS: the sparse kernels' decisions, when any was timed */
    struct wbuf sprs = {0};
    if (w.st == KILN_OK && nb > 0 && w.n_sprs) {
        put_u32(&sprs, (uint32_t)w.n_sprs);
        put(&sprs, w.sprs.p, w.sprs.n);
    }
    struct wbuf rept = {0};
    if (opts && opts->report_json) put(&rept, opts->report_json, strlen(opts->report_json));
    if (w.st == KILN_OK && (w.meta.oom || w.sign.oom || w.grph.oom || w.wght.oom || rept.oom ||
                            w.pack.oom || packs.oom || w.sprs.oom || sprs.oom))
        wfail(&w, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    /* GRPZ (format version 3): the graph deflated, its names and attributes being most of a
     * small int8 file beside the weights (efficientnet_b0: 227 KB of 5.8 MB) */
    struct wbuf grpz = {0};
    if (w.st == KILN_OK) {
        uLongf zn = compressBound((uLong)w.grph.n);
        Bytef *z = malloc((size_t)zn);
        if (!z || compress2(z, &zn, w.grph.p ? w.grph.p : (const Bytef *)"", (uLong)w.grph.n,
                            Z_BEST_COMPRESSION) != Z_OK) {
            wfail(&w, KILN_ERR_OUT_OF_MEMORY, "out of memory (deflating the graph)");
        } else {
            put_i64(&grpz, (int64_t)w.grph.n);
            put(&grpz, z, (size_t)zn);
            if (grpz.oom) wfail(&w, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
        free(z);
    }
    if (w.st == KILN_OK) {
        struct wbuf *secs[7] = {&w.meta, &w.sign, &grpz, &w.wght};
        uint32_t kinds[7] = {KILN_ART_SEC_META, KILN_ART_SEC_SIGN, KILN_ART_SEC_GRPZ,
                             KILN_ART_SEC_WGHT};
        int n = 4;
        if (packs.n) secs[n] = &packs, kinds[n] = KILN_ART_SEC_PACK, n++;
        if (sprs.n) secs[n] = &sprs, kinds[n] = KILN_ART_SEC_SPRS, n++;
        if (opts && opts->report_json) secs[n] = &rept, kinds[n] = KILN_ART_SEC_REPT, n++;
        w.st = write_file(path, secs, kinds, n);
    }
    free(w.meta.p);
    free(w.sign.p);
    free(w.grph.p);
    free(grpz.p);
    free(w.wght.p);
    free(rept.p);
    free(packs.p);
    free(sprs.p);
    free(w.pack.p);
    free(w.sprs.p);
    free(w.w.t);
    free(w.w.off);
    free(w.w.mode);
    free(w.as_bf16);
    free(w.s8_axis);
    free(w.unread);
    return w.st;
}

/* ---- kiln inspect ---- */

static const char *section_title(uint32_t kind)
{
    switch (kind) {
    case KILN_ART_SEC_META: return "META (versions, precision, CPU features, batch sizes)";
    case KILN_ART_SEC_SIGN: return "SIGN (signature)";
    case KILN_ART_SEC_GRPH: return "GRPH (optimized graph)";
    case KILN_ART_SEC_GRPZ: return "GRPZ (optimized graph, deflated)";
    case KILN_ART_SEC_WGHT: return "WGHT (weights)";
    case KILN_ART_SEC_REPT: return "REPT (compile report)";
    case KILN_ART_SEC_PACK: return "PACK (index of packed weights, bytes in WGHT)";
    case KILN_ART_SEC_SPRS: return "SPRS (sparse or dense kernel, as timed)";
    }
    return "(unknown, skipped)";
}

/* The precision a kernel computes in, from its name ("dnnl_gemm_bf16"). */
static const char *kernel_precision(const char *kernel)
{
    size_t n = strlen(kernel);
    if (n >= 5 && !strcmp(kernel + n - 5, "_bf16")) return "bf16";
    if (n >= 5 && !strcmp(kernel + n - 5, "_int8")) return "int8";
    /* statically quantized graphs: their quantized ops run on int8 kernels
     * in an fp32 session ("dnnl_qlinear_conv", "dnnl_matmul_integer") */
    if (strstr(kernel, "qlinear") || strstr(kernel, "integer")) return "int8";
    return "fp32";
}

/* Run the model once on zero inputs (batch 1) with the profile on, and list
 * each step's node, op, kernel and the precision that kernel computes in. */
static void print_node_precisions(const kiln_model *cm, FILE *f)
{
    kiln_model *m = (kiln_model *)cm;
    kiln_session_options so;
    kiln_session_options_init(&so);
    so.profile = 1;
    kiln_session *s = NULL;
    kiln_tensor *in[64] = {0};
    kiln_named_tensor named[64];
    kiln_outputs *out = NULL;
    kiln_profile *prof = NULL;
    const char *why = NULL;
    if (kiln_session_create(m, NULL, &so, &s) != KILN_OK) {
        why = kiln_last_error();
        goto done;
    }
    const kiln_signature *sig = kiln_session_signature(s);
    int n = kiln_signature_input_count(sig);
    if (n > 64) {
        why = "more than 64 inputs";
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        int64_t dims[KILN_MAX_RANK];
        for (int d = 0; d < vi->rank; d++) dims[d] = vi->dims[d] >= 0 ? vi->dims[d] : 1;
        if (vi->rank < 0 || vi->dtype == KILN_DTYPE_UNDEFINED ||
            kiln_tensor_create(vi->dtype, vi->rank, dims, &in[i]) != KILN_OK) {
            why = "an input has no known type";
            goto done;
        }
        named[i].name = vi->name;
        named[i].tensor = in[i];
    }
    if (kiln_session_run(s, named, n, &out) != KILN_OK ||
        kiln_session_profile_get(s, &prof) != KILN_OK) {
        why = kiln_last_error();
        goto done;
    }
    int steps = kiln_profile_step_count(prof), by[3] = {0};
    int plan = steps ? kiln_profile_step(prof, 0)->plan : 0; /* the one plan that ran */
    fprintf(f, "precision per node (kernels of a batch-1 plan, in graph order):\n");
    for (int k = 0; k < steps; k++) /* steps are sorted slowest first: print in step order */
        for (int i = 0; i < steps; i++) {
            const kiln_profile_entry *e = kiln_profile_step(prof, i);
            if (e->plan != plan || e->step != k) continue;
            const char *p = kernel_precision(e->kernel);
            by[p[0] == 'b' ? 1 : p[0] == 'i' ? 2 : 0]++;
            fprintf(f, "  %-5s %-22s %-28s %s\n", p, e->op, e->kernel, e->node);
        }
    fprintf(f, "nodes by precision: fp32 %d, bf16 %d, int8 %d\n", by[0], by[1], by[2]);
done:
    if (why) fprintf(f, "precision per node: not measured (%s)\n", why);
    kiln_profile_free(prof);
    kiln_outputs_free(out);
    for (int i = 0; i < 64; i++) kiln_tensor_free(in[i]);
    kiln_session_free(s);
}

int kiln_model_artifact_print(const kiln_model *m, FILE *f)
{
    const struct kiln_artifact_info *a = m->artifact;
    if (!a) return 0;
    fprintf(f, "compiled artifact: .kiln format version %u, written by Kiln %s\n",
            a->format_version, a->kiln_version);
    fprintf(f, "source format: %s\n", a->source_format);
    /* a statically quantized graph runs its int8 ops in a session of precision fp32 (the
     * float ops it kept stay fp32): say so rather than "fp32" */
    int q8 = 0;
    for (int i = 0; m->graph && i < m->graph->n_nodes; i++) {
        enum kiln_op op = m->graph->nodes[i].op;
        q8 += op == KILN_OP_QLinearConv || op == KILN_OP_QLinearMatMul ||
              op == KILN_OP_KilnQLinearMatMul || op == KILN_OP_KilnQLinearConvAdd ||
              op == KILN_OP_MatMulInteger || op == KILN_OP_ConvInteger;
    }
    if (q8 && a->precision == KILN_PRECISION_FP32)
        fprintf(f, "precision: int8 (static: %d quantized product%s with fixed activation scales; "
                "the other nodes fp32)\n", q8, q8 == 1 ? "" : "s");
    else
        fprintf(f, "precision: %s\n", kiln_precision_name(a->precision));
    fprintf(f, "CPU features needed: %s\n", a->cpu_features[0] ? a->cpu_features : "(none)");
    fprintf(f, "batch sizes precompiled at load:");
    for (int i = 0; i < a->n_batch_sizes; i++) fprintf(f, "%s%lld", i ? "," : " ",
                                                       (long long)a->batch_sizes[i]);
    fprintf(f, "%s\n", a->n_batch_sizes ? "" : " (none)");
    fprintf(f, "file: %llu bytes; sections:\n", (unsigned long long)a->file_size);
    for (int i = 0; i < a->n_sections; i++)
        fprintf(f, "  %-56s %12llu bytes at %llu\n", section_title(a->sections[i].kind),
                (unsigned long long)a->sections[i].size,
                (unsigned long long)a->sections[i].offset);
    print_node_precisions(m, f);
    if (a->report) fprintf(f, "compile report:\n%s\n", a->report);
    else fprintf(f, "compile report: (none)\n");
    return 1;
}
