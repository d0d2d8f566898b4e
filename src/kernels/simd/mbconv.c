/*
 * mbconv.c - the fast kernel of KilnMBConv (opt/opt.h): compile checks the
 * node, packs its six weights and biases once per model into one block of
 * the weight cache (zero-padded to channel blocks of 16), and splits the
 * batch's output rows into one contiguous range per thread, or on small
 * planes its images, run in groups (mb_group_size); the arithmetic is in
 * mbconv_avx512.c (mbconv.h).
 *
 * The node exists only where the layout pass blocked its values by 16 and
 * the CPU runs this kernel (kiln_mbconv_cpu_ok); the kernel declines
 * anything else (the plan then falls back as for any blocked value without
 * a fast kernel). Without the expand
 * (We absent) X must have the depthwise's channels.
 */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "core/threadpool.h"
#include "kernels/family.h"
#include "kernels/simd/mbconv.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/norm.def"
#undef KILN_KERNEL

static int64_t blocks16(int64_t c) { return (c + 15) / 16; }

/* Offsets (in floats) of the parts of a packed block. */
struct mb_layout {
    int64_t cin, ce, cout, cse;
    int k;
    size_t we, be, wd, bd, wp, bp, w1, b1, w2, b2, total;
};

/* has_e: whether the block has its expand convolution (else it takes no
 * room); cse: the squeeze-excitation's channels (0 = none). */
static void mb_layout_init(struct mb_layout *l, int64_t cin, int64_t ce, int64_t cout, int k,
                           int has_e, int64_t cse)
{
    int64_t cip = blocks16(cin) * 16, cep = blocks16(ce) * 16, cop = blocks16(cout) * 16;
    l->cin = cin;
    l->ce = ce;
    l->cout = cout;
    l->k = k;
    l->we = 0;
    l->be = l->we + (has_e ? (size_t)(cip * cep) : 0);
    l->wd = l->be + (has_e ? (size_t)cep : 0);
    l->bd = l->wd + (size_t)(cep * k * k);
    l->wp = l->bd + (size_t)cep;
    l->bp = l->wp + (size_t)(cep * cop);
    l->cse = cse;
    l->w1 = l->bp + (size_t)cop;
    l->b1 = l->w1 + (size_t)((cse + 3) / 4 * 4 * cep); /* rows past cse zero (kiln_mbconv.w1) */
    l->w2 = l->b1 + (size_t)(blocks16(cse) * 16);
    l->b2 = l->w2 + (size_t)(cse * cep);
    l->total = l->b2 + (cse ? (size_t)cep : 0);
}

struct mb_pack_arg {
    struct mb_layout l;
    const kiln_tensor *we, *be, *wd, *bd, *wp, *bp, *w1, *b1, *w2, *b2;
};

static kiln_status mb_pack(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    const struct mb_pack_arg *a = arg;
    const struct mb_layout *l = &a->l;
    size_t size = (l->total * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, size);
    if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory packing KilnMBConv weights");
    memset(p, 0, size);
    const int64_t cep = blocks16(l->ce) * 16, cop = blocks16(l->cout) * 16, kk = l->k * l->k;
    const float *we = a->we ? a->we->data : NULL, *wd = a->wd->data;
    const float *wp = a->wp->data;
    for (int64_t c = 0; c < l->ce; c++) {
        for (int64_t q = 0; we && q < l->cin; q++)
            p[l->we + (size_t)(q * cep + c)] = we[c * l->cin + q];
        if (we && a->be) p[l->be + (size_t)c] = ((const float *)a->be->data)[c];
        for (int64_t t = 0; t < kk; t++)
            p[l->wd + (size_t)(((c / 16) * kk + t) * 16 + c % 16)] = wd[c * kk + t];
        if (a->bd) p[l->bd + (size_t)c] = ((const float *)a->bd->data)[c];
    }
    for (int64_t o = 0; o < l->cout; o++) {
        for (int64_t q = 0; q < l->ce; q++) p[l->wp + (size_t)(q * cop + o)] = wp[o * l->ce + q];
        if (a->bp) p[l->bp + (size_t)o] = ((const float *)a->bp->data)[o];
    }
    for (int64_t j = 0; j < l->cse; j++) { /* W1 [cse][ce] as is, W2 [ce][cse] transposed */
        for (int64_t c = 0; c < l->ce; c++) {
            p[l->w1 + (size_t)(j * cep + c)] = ((const float *)a->w1->data)[j * l->ce + c];
            p[l->w2 + (size_t)(j * cep + c)] = ((const float *)a->w2->data)[c * l->cse + j];
        }
        if (a->b1) p[l->b1 + (size_t)j] = ((const float *)a->b1->data)[j];
    }
    for (int64_t c = 0; a->b2 && c < l->ce; c++) p[l->b2 + (size_t)c] = ((const float *)a->b2->data)[c];
    *packed = p;
    *bytes = size;
    *free_fn = free;
    return KILN_OK;
}

struct mb_state {
    struct kiln_mbconv m;
    /* Without a squeeze-excitation: ranges of the batch's output rows. With
     * one: whole images each where the batch has at least as many images as
     * threads, else per image one step split by channel blocks, then one
     * split by pixels or output channel blocks (image_split). One scratch
     * area per unit (image_split: one D and its sums shared, first). */
    int units;
    int image_split;
    int64_t group;        /* > 0: whole images per unit, this many at a time (kiln_mbconv_group) */
    size_t unit_floats;   /* scratch floats per unit, a multiple of 16 */
    size_t band_floats;   /* with a squeeze-excitation: the parts of a unit's area */
    size_t dimg_floats, vec_floats;
    int has_sum;
};

struct mb_job {
    const struct mb_state *s;
    const float *x, *res;
    float *y, *scratch;
    int64_t image;        /* image_split: the image */
};

/* A unit's scratch with a squeeze-excitation: band, dimg, sums, gate, hidden,
 * work (kiln_mbconv_se_project's). */
struct mb_area {
    float *band, *dimg, *sums, *gate, *hidden, *work;
};

static struct mb_area mb_area(const struct mb_job *j, int64_t u)
{
    const struct mb_state *s = j->s;
    /* image_split: one dimg and sums for all units, first */
    size_t shared = s->image_split ? s->dimg_floats + s->vec_floats : 0;
    struct mb_area a;
    a.band = j->scratch + shared + (size_t)u * s->unit_floats;
    float *next = a.band + s->band_floats;
    if (s->image_split) {
        a.dimg = j->scratch;
    } else {
        a.dimg = next;
        next += s->dimg_floats + s->vec_floats;
    }
    a.sums = a.dimg + s->dimg_floats;
    a.gate = next;
    a.hidden = a.gate + s->vec_floats;
    a.work = a.hidden + s->vec_floats;
    return a;
}

static void mb_job_run(void *ctx, int64_t begin, int64_t end)
{
    const struct mb_job *j = ctx;
    const struct mb_state *s = j->s;
    const struct kiln_mbconv *m = &s->m;
    int64_t rows = m->n * m->ho;
    for (int64_t u = begin; u < end; u++) {
        if (s->group) {
            int64_t n1 = (u + 1) * m->n / s->units;
            for (int64_t n = u * m->n / s->units; n < n1; n += s->group)
                kiln_mbconv_group(m, j->x, j->res, j->y, n, n1 - n < s->group ? n1 - n : s->group,
                                  j->scratch + (size_t)u * s->unit_floats);
            continue;
        }
        if (!m->cse) {
            kiln_mbconv_rows(m, j->x, j->res, j->y, u * rows / s->units,
                             (u + 1) * rows / s->units, j->scratch + (size_t)u * s->unit_floats);
            continue;
        }
        struct mb_area a = mb_area(j, u);
        for (int64_t n = u * m->n / s->units; n < (u + 1) * m->n / s->units; n++) {
            kiln_mbconv_se_dw(m, j->x, n, 0, m->ce_b, a.band, a.dimg, a.sums);
            kiln_mbconv_se_gate(m, a.sums, a.gate, a.hidden);
            kiln_mbconv_se_project(m, a.dimg, a.gate, n, 0, m->ho * m->wo, 0, m->cout_b,
                                   j->res, j->y, a.work);
        }
    }
}

/* image_split, first step: unit u's channel blocks of the image into the shared dimg */
static void mb_split_dw(void *ctx, int64_t begin, int64_t end)
{
    const struct mb_job *j = ctx;
    const struct kiln_mbconv *m = &j->s->m;
    struct mb_area a0 = mb_area(j, 0);
    for (int64_t u = begin; u < end; u++) {
        int cb0 = (int)(u * m->ce_b / j->s->units), cb1 = (int)((u + 1) * m->ce_b / j->s->units);
        if (cb0 < cb1)
            kiln_mbconv_se_dw(m, j->x, j->image, cb0, cb1, mb_area(j, u).band, a0.dimg, a0.sums);
    }
}

/* image_split, second step: each unit makes the gate and projects its
 * pixels (all output blocks), or its output blocks (all pixels) */
static void mb_split_project(void *ctx, int64_t begin, int64_t end)
{
    const struct mb_job *j = ctx;
    const struct kiln_mbconv *m = &j->s->m;
    struct mb_area a0 = mb_area(j, 0);
    int64_t pix = m->ho * m->wo, units = j->s->units;
    for (int64_t u = begin; u < end; u++) {
        struct mb_area a = mb_area(j, u);
        int64_t p0 = 0, p1 = pix;
        int ob0 = 0, ob1 = m->cout_b;
        if (m->se_scale == KILN_MB_SE_COPY_D) {
            ob0 = (int)(u * m->cout_b / units);
            ob1 = (int)((u + 1) * m->cout_b / units);
        } else {
            p0 = u * pix / units;
            p1 = (u + 1) * pix / units;
        }
        if (p0 == p1 || ob0 == ob1) continue;
        kiln_mbconv_se_gate(m, a0.sums, a.gate, a.hidden);
        kiln_mbconv_se_project(m, a0.dimg, a.gate, j->image, p0, p1, ob0, ob1, j->res, j->y,
                               a.work);
    }
}

static kiln_status mb_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct mb_state *s = state;
    struct mb_job j = {s, ctx->in[0]->data, s->has_sum ? ctx->in[7]->data : NULL,
                       ctx->out[0]->data, ctx->scratch, 0};
    if (!s->image_split) {
        kiln_parallel_for(ctx->threads, s->units, 1, mb_job_run, &j);
        return KILN_OK;
    }
    for (j.image = 0; j.image < s->m.n; j.image++) {
        kiln_parallel_for(ctx->threads, s->units, 1, mb_split_dw, &j);
        kiln_parallel_for(ctx->threads, s->units, 1, mb_split_project, &j);
    }
    return KILN_OK;
}

/* An activation of the node: none, Relu, Clip (lo <= hi) or SiLU. */
static int mb_act(const struct kiln_node *n, const char *prefix, int *act, float *lo, float *hi)
{
    char an[40], aa[40], ab[40];
    snprintf(an, sizeof an, "%sactivation", prefix);
    snprintf(aa, sizeof aa, "%sact_alpha", prefix);
    snprintf(ab, sizeof ab, "%sact_beta", prefix);
    const char *s = kiln_attr_str(n, an, "");
    *act = KILN_MB_CLAMP;
    *lo = -__builtin_inff();
    *hi = __builtin_inff();
    if (!strcmp(s, "") || !strcmp(s, "SiLU")) {
        *act = s[0] ? KILN_MB_SILU : KILN_MB_NONE;
    } else if (!strcmp(s, "Relu")) {
        *lo = 0.0f;
    } else if (!strcmp(s, "Clip")) {
        *lo = kiln_attr_float(n, aa, -FLT_MAX);
        *hi = kiln_attr_float(n, ab, FLT_MAX);
        if (!(*lo <= *hi)) return 0;
    } else {
        return 0;
    }
    return 1;
}

/* Images per group where a block runs whole images together
 * (kiln_mbconv_group), or 0. Grouping pays where the weights outweigh an
 * image's activations (small planes: a per-image pass would read every
 * weight again for a few pixels) and every thread has two images or more;
 * a group's expanded rows and depthwise output stay within about 1 MiB. */
static int64_t mb_group_size(const struct kiln_mbconv *m, int threads)
{
    const char *env = getenv("KILN_MBCONV_GROUP");
    int64_t per_unit = m->n / threads, pix = m->ho * m->wo;
    int64_t weights = (int64_t)(m->we ? m->cin_b : 0) + m->cout_b; /* times ce_b * 256 floats */
    if (env && env[0] == '0') return 0;
    if (per_unit < 2 || (!(env && env[0] == '1') && pix * 4 > weights * 16)) return 0;
    size_t one = kiln_mbconv_group_floats(m, 1) - kiln_mbconv_group_floats(m, 0);
    int64_t g = (int64_t)((1u << 20) / sizeof(float) / (one ? one : 1));
    return g < 1 ? 1 : g > per_unit ? per_unit : g;
}

static const float *mb_f32(const struct kiln_compile_ctx *cc, int i)
{
    if (i >= cc->n_in || !cc->in[i]) return NULL;
    const kiln_tensor *t = cc->in_value[i];
    return t && t->dtype == KILN_DTYPE_F32 ? t->data : NULL;
}

int kiln_mbconv_cpu_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
}

kiln_status kiln_k_mbconv_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    if (!kiln_mbconv_cpu_ok() || cc->n_in < 6 || !cc->out[0]) return KILN_OK;
    const struct kiln_type *x = cc->in[0], *y = cc->out[0];
    int has_e = cc->in[1] != NULL;
    int has_se = cc->n_in > 8 && cc->in[8];
    int has_sum = cc->n_in > 7 && cc->in[7];
    if (!x || x->dtype != KILN_DTYPE_F32 || x->rank != 4 || y->rank != 4 ||
        cc->in_layout[0] != 16 || cc->out_layout[0] != 16 ||
        (has_sum && (cc->in_layout[7] != 16 || cc->in[7]->dtype != KILN_DTYPE_F32 ||
                     !kiln_type_is_concrete(cc->in[7]) || cc->in[7]->rank != 4 ||
                     memcmp(cc->in[7]->dims, y->dims, sizeof y->dims[0] * 4) != 0)))
        return KILN_OK;
    /* weights and biases: float32 constants where present (Wd and Wp always are) */
    for (int i = 1; i < cc->n_in; i++)
        if (i != 7 && (i == 3 || i == 5 || cc->in[i]) && !mb_f32(cc, i)) return KILN_OK;
    /* shape inference (before compile) has refused B1 / B2 without W1, and W1 without W2 */
    if ((!has_e && cc->in[2]) || (has_se && (cc->n_in < 11 || !cc->in[10]))) return KILN_OK;
    const kiln_tensor *we = has_e ? cc->in_value[1] : NULL, *wd = cc->in_value[3];
    const kiln_tensor *wp = cc->in_value[5];
    int64_t k = kiln_attr_int(n, "dw_kernel", 3), s = kiln_attr_int(n, "dw_stride", 1);
    int64_t cin = x->dims[1], ce = wd->dims[0], cout = wp->dims[0];
    const kiln_tensor *be = mb_f32(cc, 2) ? cc->in_value[2] : NULL;
    const kiln_tensor *bd = mb_f32(cc, 4) ? cc->in_value[4] : NULL;
    const kiln_tensor *bp = mb_f32(cc, 6) ? cc->in_value[6] : NULL;
    if (k < 1 || k > 15 || k % 2 == 0 || s < 1 || s > 8 || wd->rank != 4 || wd->dims[1] != 1 ||
        wd->dims[2] != k || wd->dims[3] != k || (be && kiln_tensor_count(be) != ce) ||
        (bd && kiln_tensor_count(bd) != ce) || (bp && kiln_tensor_count(bp) != cout))
        return KILN_OK;
    if (we ? we->rank != 4 || we->dims[0] != ce || we->dims[1] != cin || we->dims[2] != 1 ||
                 we->dims[3] != 1
           : cin != ce)
        return KILN_OK;
    if (wp->rank != 4 || wp->dims[1] != ce || wp->dims[2] != 1 || wp->dims[3] != 1)
        return KILN_OK;
    const kiln_tensor *w1 = has_se ? cc->in_value[8] : NULL, *w2 = has_se ? cc->in_value[10] : NULL;
    const kiln_tensor *b1 = has_se && mb_f32(cc, 9) ? cc->in_value[9] : NULL;
    const kiln_tensor *b2 = has_se && cc->n_in > 11 && mb_f32(cc, 11) ? cc->in_value[11] : NULL;
    int64_t cse = has_se ? w1->dims[0] : 0;
    if (has_se && (w1->rank != 4 || w1->dims[1] != ce || w1->dims[2] != 1 || w1->dims[3] != 1 ||
                   cse < 1 || cse > 1 << 20 || w2->rank != 4 || w2->dims[0] != ce ||
                   w2->dims[1] != cse || w2->dims[2] != 1 || w2->dims[3] != 1 ||
                   (b1 && kiln_tensor_count(b1) != cse) || (b2 && kiln_tensor_count(b2) != ce)))
        return KILN_OK;
    int64_t pad = k / 2, h = x->dims[2], w = x->dims[3];
    int64_t ho = (h + 2 * pad - k) / s + 1, wo = (w + 2 * pad - k) / s + 1;
    if (y->dims[0] != x->dims[0] || y->dims[1] != cout || y->dims[2] != ho || y->dims[3] != wo ||
        x->dims[0] < 1 || h < 1 || w < 1)
        return KILN_OK;

    struct mb_state *st = calloc(1, sizeof *st);
    if (!st) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling KilnMBConv");
    struct kiln_mbconv *m = &st->m;
    for (int i = 0; i < 4; i++) {
        static const char *const prefixes[4] = {"expand_", "dw_", "", "se_"};
        if (!mb_act(n, prefixes[i], &m->act[i], &m->lo[i], &m->hi[i])) {
            kiln_error_clear();
            free(st);
            return KILN_OK;
        }
    }
    struct mb_pack_arg pa = {.we = we, .be = be, .wd = wd, .bd = bd, .wp = wp, .bp = bp,
                             .w1 = w1, .b1 = b1, .w2 = w2, .b2 = b2};
    mb_layout_init(&pa.l, cin, ce, cout, (int)k, has_e, cse);
    /* the key is the first weight; the tag names the other inputs, so two
     * blocks sharing one weight never share a packed block */
    char tag[300];
    snprintf(tag, sizeof tag, "mbconv16:%d:%lld:%lld:%lld:%lld:%lld:%p:%p:%p:%p:%p:%p:%p:%p:%p",
             has_e, (long long)k, (long long)cin, (long long)ce, (long long)cout,
             (long long)cse, (const void *)be, (const void *)wd, (const void *)bd,
             (const void *)wp, (const void *)bp, (const void *)w1, (const void *)b1,
             (const void *)w2, (const void *)b2);
    void *packed = NULL;
    kiln_status r =
        kiln_weight_cache_get(cc->weights, we ? we : wd, tag, mb_pack, &pa, &packed);
    if (r != KILN_OK) {
        free(st);
        return r;
    }
    const float *pk = packed;
    m->n = x->dims[0];
    m->cin_b = (int)blocks16(cin);
    m->ce_b = (int)blocks16(ce);
    m->cout_b = (int)blocks16(cout);
    m->cout = (int)cout;
    m->h = h;
    m->w = w;
    m->ho = ho;
    m->wo = wo;
    m->k = (int)k;
    m->stride = (int)s;
    m->pad = (int)pad;
    m->we = has_e ? pk + pa.l.we : NULL;
    m->be = pk + pa.l.be;
    m->wd = pk + pa.l.wd;
    m->bd = pk + pa.l.bd;
    m->wp = pk + pa.l.wp;
    m->bp = pk + pa.l.bp;
    m->cse = (int)cse;
    m->w1 = pk + pa.l.w1;
    m->b1 = pk + pa.l.b1;
    m->w2 = pk + pa.l.w2;
    m->b2 = pk + pa.l.b2;
    int threads = cc->threads > 1 ? cc->threads : 1;
    m->band = kiln_mbconv_band(m);
    st->band_floats = (kiln_mbconv_scratch_floats(m) + 15) / 16 * 16;
    st->unit_floats = st->band_floats;
    if (!has_se) {
        /* one contiguous range of output rows per thread (a range's first
         * band expands the input rows above it again) */
        int64_t rows = m->n * ho;
        st->units = threads > rows ? (int)rows : threads;
    } else {
        /* one unit per thread: whole images, or (fewer images than
         * threads) parts of each image */
        st->image_split = m->n < threads;
        st->units = threads;
        /* The project reads D and the weights: where the weights are the
         * larger (small planes), one image's threads split the output
         * channels, each scaling all of D into its work area; else they split
         * the pixels and scale the smaller of their D and the weights. */
        int64_t pix = ho * wo, cop = (int64_t)m->cout_b * 16;
        if (st->image_split && cop > pix && m->cout_b >= st->units)
            m->se_scale = KILN_MB_SE_COPY_D;
        else if ((st->image_split ? (pix + st->units - 1) / st->units : pix) > cop)
            m->se_scale = KILN_MB_SE_SCALE_W;
        else
            m->se_scale = KILN_MB_SE_SCALE_D;
        st->dimg_floats = (size_t)m->ce_b * (size_t)pix * 16;
        st->vec_floats = (size_t)(m->ce_b > blocks16(cse) ? m->ce_b : blocks16(cse)) * 16;
        size_t work = m->se_scale == KILN_MB_SE_SCALE_W ? (size_t)m->ce_b * 16 * (size_t)cop
                      : m->se_scale == KILN_MB_SE_COPY_D ? st->dimg_floats
                                                        : 0;
        st->unit_floats += (st->image_split ? 0 : st->dimg_floats + st->vec_floats) +
                           2 * st->vec_floats + work;
    }
    int64_t group = mb_group_size(m, threads);
    if (group > 0) {
        st->group = group;
        st->image_split = 0;
        st->units = threads;
        st->unit_floats = (kiln_mbconv_group_floats(m, group) + 15) / 16 * 16;
    }
    st->has_sum = has_sum;
    inst->name = st->group ? "avx512_mbconv_group" : "avx512_mbconv";
    inst->state = st;
    inst->run = mb_run;
    inst->destroy = free;
    inst->scratch_bytes =
        ((st->image_split ? st->dimg_floats + st->vec_floats : 0) +
         (size_t)st->units * st->unit_floats) * sizeof(float);
    /* Y never shares the residual's memory: the residual is usually X, and
     * the row range of one thread reads X rows next to another's */
    for (int i = 1; i < cc->n_in; i++)
        if (i != 7 && cc->in[i]) inst->packed |= 1u << i;
    return KILN_OK;
}

int kiln_k_mbconv_accepts(const struct kiln_node *n, int i, int block)
{
    (void)n;
    return block == 16 && (i == -1 || i == 0 || i == 7);
}

