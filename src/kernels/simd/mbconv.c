/*
 * mbconv.c - the fast kernel of KilnMBConv (opt/opt.h): compile checks the
 * node, packs its six weights and biases once per model into one block of
 * the weight cache (zero-padded to channel blocks of 16), and splits the
 * batch's output rows into one contiguous range per thread; the arithmetic
 * is in mbconv_avx512.c (mbconv.h).
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
#include "kernels/fast.h"
#include "kernels/simd/mbconv.h"

static int64_t blocks16(int64_t c) { return (c + 15) / 16; }

/* Offsets (in floats) of the parts of a packed block. */
struct mb_layout {
    int64_t cin, ce, cout;
    int k;
    size_t we, be, wd, bd, wp, bp, total;
};

/* has_e: whether the block has its expand convolution (else it takes no room). */
static void mb_layout_init(struct mb_layout *l, int64_t cin, int64_t ce, int64_t cout, int k,
                           int has_e)
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
    l->total = l->bp + (size_t)cop;
}

struct mb_pack_arg {
    struct mb_layout l;
    const kiln_tensor *we, *be, *wd, *bd, *wp, *bp;
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
    *packed = p;
    *bytes = size;
    *free_fn = free;
    return KILN_OK;
}

struct mb_state {
    struct kiln_mbconv m;
    int units;            /* ranges of the batch's output rows, one scratch area each */
    size_t unit_floats;   /* scratch floats per range, a multiple of 16 */
    int has_sum;
};

struct mb_job {
    const struct mb_state *s;
    const float *x, *res;
    float *y, *scratch;
};

static void mb_job_run(void *ctx, int64_t begin, int64_t end)
{
    const struct mb_job *j = ctx;
    const struct mb_state *s = j->s;
    const struct kiln_mbconv *m = &s->m;
    int64_t rows = m->n * m->ho;
    for (int64_t u = begin; u < end; u++)
        kiln_mbconv_rows(m, j->x, j->res, j->y, u * rows / s->units, (u + 1) * rows / s->units,
                         j->scratch + (size_t)u * s->unit_floats);
}

static kiln_status mb_run(void *state, struct kiln_run_ctx *ctx)
{
    const struct mb_state *s = state;
    struct mb_job j = {s, ctx->in[0]->data, s->has_sum ? ctx->in[7]->data : NULL,
                       ctx->out[0]->data, ctx->scratch};
    kiln_parallel_for(ctx->threads, s->units, 1, mb_job_run, &j);
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

static kiln_status mb_compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    if (!kiln_mbconv_cpu_ok() || cc->n_in < 6 || !cc->out[0]) return KILN_OK;
    const struct kiln_type *x = cc->in[0], *y = cc->out[0];
    int has_e = cc->in[1] != NULL;
    int has_sum = cc->n_in > 7 && cc->in[7];
    if (!x || x->dtype != KILN_DTYPE_F32 || x->rank != 4 || y->rank != 4 ||
        cc->in_layout[0] != 16 || cc->out_layout[0] != 16 ||
        (has_sum && (cc->in_layout[7] != 16 || cc->in[7]->dtype != KILN_DTYPE_F32 ||
                     !kiln_type_is_concrete(cc->in[7]) || cc->in[7]->rank != 4 ||
                     memcmp(cc->in[7]->dims, y->dims, sizeof y->dims[0] * 4) != 0)))
        return KILN_OK;
    /* weights and biases: float32 constants where present (Wd and Wp always are) */
    for (int i = 1; i <= 6; i++)
        if ((i == 3 || i == 5 || (i < cc->n_in && cc->in[i])) && !mb_f32(cc, i)) return KILN_OK;
    if (!has_e && cc->in[2]) return KILN_OK;
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
    int64_t pad = k / 2, h = x->dims[2], w = x->dims[3];
    int64_t ho = (h + 2 * pad - k) / s + 1, wo = (w + 2 * pad - k) / s + 1;
    if (y->dims[0] != x->dims[0] || y->dims[1] != cout || y->dims[2] != ho || y->dims[3] != wo ||
        x->dims[0] < 1 || h < 1 || w < 1)
        return KILN_OK;

    struct mb_state *st = calloc(1, sizeof *st);
    if (!st) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling KilnMBConv");
    struct kiln_mbconv *m = &st->m;
    for (int i = 0; i < 3; i++) {
        static const char *const prefixes[3] = {"expand_", "dw_", ""};
        if (!mb_act(n, prefixes[i], &m->act[i], &m->lo[i], &m->hi[i])) {
            kiln_error_clear();
            free(st);
            return KILN_OK;
        }
    }
    struct mb_pack_arg pa = {.we = we, .be = be, .wd = wd, .bd = bd, .wp = wp, .bp = bp};
    mb_layout_init(&pa.l, cin, ce, cout, (int)k, has_e);
    /* the key is the first weight; the tag names the other inputs, so two
     * blocks sharing one weight never share a packed block */
    char tag[200];
    snprintf(tag, sizeof tag, "mbconv16:%d:%lld:%lld:%lld:%lld:%p:%p:%p:%p:%p", has_e,
             (long long)k, (long long)cin, (long long)ce, (long long)cout, (const void *)be,
             (const void *)wd, (const void *)bd, (const void *)wp, (const void *)bp);
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
    /* one contiguous range of output rows per thread (a range's first band
     * expands the input rows above it again) */
    int64_t rows = m->n * ho;
    st->units = cc->threads > 1 ? cc->threads : 1;
    if (st->units > rows) st->units = (int)rows;
    m->band = kiln_mbconv_band(m);
    st->unit_floats = (kiln_mbconv_scratch_floats(m) + 15) / 16 * 16;
    st->has_sum = has_sum;
    inst->name = "avx512_mbconv";
    inst->state = st;
    inst->run = mb_run;
    inst->destroy = free;
    inst->scratch_bytes = (size_t)st->units * st->unit_floats * sizeof(float);
    /* Y never shares the residual's memory: the residual is usually X, and
     * the row range of one thread reads X rows next to another's */
    for (int i = 1; i <= 6; i++)
        if (i < cc->n_in && cc->in[i]) inst->packed |= 1u << i;
    return KILN_OK;
}

static int mb_accepts(const struct kiln_node *n, int i, int block)
{
    (void)n;
    return block == 16 && (i == -1 || i == 0 || i == 7);
}

KILN_FAST_OP_PACKING(KilnMBConv, mb_compile, mb_accepts);
