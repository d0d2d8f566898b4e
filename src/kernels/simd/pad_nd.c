/*
 * pad_nd.c - the general fast Pad kernel of the copy family (copy.def,
 * family.h): any rank, any axes (the axes input too), pads of either sign
 * (negative crops), modes constant, edge, reflect and wrap, elements of any
 * fixed byte size, plain layouts. It runs after pad4 (pad.c, 4-D H and W in
 * constant mode, blocked layouts too), so it takes what that one declines:
 * the NHWC Pad of a windowed-attention model (Swin's H and W before its
 * windows), pads on N or C, 1-D, 3-D and 5-D tensors, the other modes.
 *
 * Pads, axes and the constant must be known when the plan is compiled
 * (initializers or folded constants); otherwise the reference runs the node.
 * The dims after the last padded one are one block of bytes, so a row of
 * the output (every dim but the others fixed) is: blocks mapped outside the
 * input (fill, or the mapped block), one memcpy of the input's blocks in
 * range, blocks mapped outside again. Rows are split over the run's threads.
 * The mapping of a coordinate outside the input is the reference kernel's
 * (src/kernels/ref/shape_ops.c, pad_map).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/ref/pad.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/copy.def"
#undef KILN_KERNEL


struct padnd_state {
    enum pad_mode mode;
    int rank;                        /* dims up to and including the last padded one */
    int64_t in[KILN_MAX_RANK], out[KILN_MAX_RANK], begin[KILN_MAX_RANK];
    int64_t istride[KILN_MAX_RANK];  /* in blocks */
    size_t block;                    /* bytes of the dims after the last padded one */
    size_t esize;                    /* bytes of one element */
    unsigned char fill[16];          /* the constant, one element */
    bool fill_zero;
    int64_t rows;                    /* product of out[0 .. rank - 1) */
    char name[24];
};

struct padnd_job {
    const struct padnd_state *s;
    const unsigned char *x;
    unsigned char *y;
};

/* Write count blocks of the constant at d. */
static void padnd_fill(const struct padnd_state *s, unsigned char *d, int64_t count)
{
    size_t bytes = (size_t)count * s->block;
    if (s->fill_zero) {
        memset(d, 0, bytes);
        return;
    }
    if (s->esize == 4) {
        uint32_t v;
        memcpy(&v, s->fill, 4);
        for (size_t i = 0; i < bytes / 4; i++) memcpy(d + 4 * i, &v, 4);
        return;
    }
    for (size_t i = 0; i < bytes; i += s->esize) memcpy(d + i, s->fill, s->esize);
}

static void padnd_range(void *arg, int64_t begin, int64_t end)
{
    const struct padnd_job *j = arg;
    const struct padnd_state *s = j->s;
    int r = s->rank - 1;
    int64_t ow = s->out[r], iw = s->in[r], b = s->begin[r];
    size_t blk = s->block;
    for (int64_t row = begin; row < end; row++) {
        unsigned char *d = j->y + (size_t)(row * ow) * blk;
        int64_t off = 0, rem = row;
        bool inside = true;
        for (int k = r - 1; k >= 0; k--) {
            int64_t o = rem % s->out[k], c = 0;
            rem /= s->out[k];
            if (!pad_map(o - s->begin[k], s->in[k], s->mode, &c)) inside = false;
            off += c * s->istride[k];
        }
        if (!inside) {
            padnd_fill(s, d, ow);
            continue;
        }
        const unsigned char *src = j->x + (size_t)off * blk;
        int64_t lo = b > 0 ? b : 0, hi = b + iw < ow ? b + iw : ow;
        if (hi < lo) hi = lo;
        if (hi > lo) memcpy(d + (size_t)lo * blk, src + (size_t)(lo - b) * blk, (size_t)(hi - lo) * blk);
        for (int64_t q = 0; q < ow; q++) {
            if (q == lo) q = hi; /* the copied run */
            if (q >= ow) break;
            int64_t c = 0;
            if (pad_map(q - b, iw, s->mode, &c))
                memcpy(d + (size_t)q * blk, src + (size_t)c * blk, blk);
            else
                padnd_fill(s, d + (size_t)q * blk, 1);
        }
    }
}

static kiln_status padnd_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct padnd_state *s = state;
    struct padnd_job j = {s, ctx->in[0]->data, ctx->out[0]->data};
    if (s->rank == 0) { /* nothing padded: a copy */
        memcpy(j.y, j.x, ctx->out[0]->nbytes);
        return KILN_OK;
    }
    /* chunks of at least 256 KiB: below that a copy costs less than waking a worker (and,
     * on a loaded host, than waiting at the join for a preempted one) */
    int64_t row = s->out[s->rank - 1] * (int64_t)s->block;
    int64_t grain = row >= 262144 ? 1 : 262144 / (row > 0 ? row : 1);
    kiln_parallel_for(ctx->threads, s->rows, grain, padnd_range, &j);
    return KILN_OK;
}

static size_t padnd_esize(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_F32: case KILN_DTYPE_I32: case KILN_DTYPE_U32: return 4;
    case KILN_DTYPE_F16: case KILN_DTYPE_BF16: case KILN_DTYPE_I16: case KILN_DTYPE_U16: return 2;
    case KILN_DTYPE_F64: case KILN_DTYPE_I64: case KILN_DTYPE_U64: return 8;
    case KILN_DTYPE_I8: case KILN_DTYPE_U8: case KILN_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

bool kiln_k_pad_nd_covers(const struct kiln_compile_ctx *cc)
{
    return cc->n_in >= 1 && cc->in[0] && padnd_esize(cc->in[0]->dtype) &&
           kiln_type_is_concrete(cc->in[0]) && cc->n_out > 0 && cc->out[0] &&
           kiln_type_is_concrete(cc->out[0]) && cc->out[0]->dtype == cc->in[0]->dtype;
}

/* Read a constant 1-D int32 / int64 tensor into v (at most max entries); -1 if not one. */
static int padnd_ints(const kiln_tensor *t, int64_t *v, int max)
{
    if (!t || t->rank != 1 || t->dims[0] > max) return -1;
    int n = (int)t->dims[0];
    for (int i = 0; i < n; i++) {
        if (t->dtype == KILN_DTYPE_I64) v[i] = ((const int64_t *)t->data)[i];
        else if (t->dtype == KILN_DTYPE_I32) v[i] = ((const int32_t *)t->data)[i];
        else return -1;
    }
    return n;
}

kiln_status kiln_k_pad_nd_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *node = cc->node;
    const struct kiln_type *x = cc->in[0], *y = cc->out[0];
    int rank = x->rank;
    if ((cc->in_layout && cc->in_layout[0]) || (cc->out_layout && cc->out_layout[0])) return KILN_OK;
    if (rank < 1 || rank > KILN_MAX_RANK || y->rank != rank) return KILN_OK;
    if (kiln_shape_count(rank, x->dims) <= 0) return KILN_OK; /* the reference's errors */
    size_t es = padnd_esize(x->dtype);
    enum pad_mode mode;
    const char *m = kiln_attr_str(node, "mode", "constant");
    if (!pad_mode_parse(m, &mode)) return KILN_OK;
    /* the pads for every dim, and the constant */
    int64_t pads[2 * KILN_MAX_RANK], axes[KILN_MAX_RANK], pb[KILN_MAX_RANK] = {0};
    int n, n_axes = rank;
    unsigned char fill[16] = {0};
    if (node->opset < 11) {
        const int64_t *a;
        n = kiln_attr_ints(node, "pads", &a);
        if (n < 0 || n > 2 * KILN_MAX_RANK) return KILN_OK;
        memcpy(pads, a, sizeof(int64_t) * (size_t)n);
        float v = kiln_attr_float(node, "value", 0.0f);
        if (v != 0.0f && x->dtype != KILN_DTYPE_F32) return KILN_OK;
        memcpy(fill, &v, sizeof v);
    } else {
        const kiln_tensor *pv = cc->n_in > 1 && cc->in_value ? cc->in_value[1] : NULL;
        n = padnd_ints(pv, pads, 2 * KILN_MAX_RANK);
        if (n < 0) return KILN_OK;
        if (cc->n_in > 3 && cc->in[3]) {
            const kiln_tensor *av = cc->in_value ? cc->in_value[3] : NULL;
            n_axes = padnd_ints(av, axes, KILN_MAX_RANK);
            if (n_axes < 0) return KILN_OK;
        }
        if (mode == PAD_CONSTANT && cc->n_in > 2 && cc->in[2]) {
            const kiln_tensor *v = cc->in_value ? cc->in_value[2] : NULL;
            if (!v || v->dtype != x->dtype || kiln_tensor_count(v) != 1 || v->nbytes != es)
                return KILN_OK;
            memcpy(fill, v->data, es);
        }
    }
    if (n != 2 * n_axes) return KILN_OK;
    int64_t pe[KILN_MAX_RANK] = {0};
    bool seen[KILN_MAX_RANK] = {false};
    for (int i = 0; i < n_axes; i++) {
        int64_t a = node->opset < 11 || !(cc->n_in > 3 && cc->in[3]) ? i : axes[i];
        if (a < 0) a += rank;
        if (a < 0 || a >= rank || seen[a]) return KILN_OK;
        seen[a] = true;
        pb[a] = pads[i];
        pe[a] = pads[n_axes + i];
    }
    int last = -1;
    for (int d = 0; d < rank; d++) {
        if (y->dims[d] != x->dims[d] + pb[d] + pe[d]) return KILN_OK; /* the reference reports */
        if (pb[d] || pe[d]) last = d;
    }
    struct padnd_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling Pad");
    s->mode = mode;
    s->rank = last + 1;
    s->esize = es;
    s->block = es;
    for (int d = last + 1; d < rank; d++) s->block *= (size_t)x->dims[d];
    s->rows = 1;
    for (int d = 0; d <= last; d++) {
        s->in[d] = x->dims[d];
        s->out[d] = y->dims[d];
        s->begin[d] = pb[d];
        if (d < last) s->rows *= y->dims[d];
    }
    int64_t step = 1;
    for (int d = last; d >= 0; d--) {
        s->istride[d] = step;
        step *= x->dims[d];
    }
    memcpy(s->fill, fill, sizeof fill);
    s->fill_zero = true;
    for (size_t i = 0; i < es; i++) s->fill_zero = s->fill_zero && !fill[i];
    snprintf(s->name, sizeof s->name, "pad_nd_%s", m);
    inst->name = s->name;
    inst->state = s;
    inst->destroy = free;
    inst->run = padnd_run;
    return KILN_OK;
}
