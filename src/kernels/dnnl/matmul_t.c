/*
 * matmul_t.c - oneDNN fast kernel for KilnMatMulT (opt/opt.h): the product
 * of transposed views, Y = alpha * (Transpose(A, permA) @ Transpose(B,
 * permB)), read in place. Each operand's memory descriptor has the logical
 * (transposed) dims and the stored value's strides taken in the perm's
 * order, so no transposed copy is ever written: an unfused attention's Q
 * [B,S,H,D] read as [B,H,S,D], its K as [B,H,D,S], its V as [B,H,S,D].
 * oneDNN 2.6 runs these on its brgemm matmul (batch dims of any stride; one
 * of the last two dims of unit stride). alpha is an output scale. float32,
 * equal ranks, batch dims equal or 1 (oneDNN broadcasts them); anything else,
 * and any layout other than plain, stays on the reference kernel. A oneDNN
 * reference implementation is refused (the reference kernel is no slower).
 * Declared in the matmul family's list (matmul.def, family.h).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/dnnl/dnnl_common.h"
#include "kernels/family.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/matmul.def"
#undef KILN_KERNEL

struct mmt_build {
    const struct kiln_node *node;
    dnnl_memory_desc_t a, b, y;
    float alpha;
};

static kiln_status mmt_make(void *arg, struct kd_variant *v, int threads)
{
    struct mmt_build *b = arg;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    kiln_status st = KILN_OK;
    dnnl_matmul_desc_t d;
    (void)threads;
    dnnl_status_t r = dnnl_matmul_desc_init(&d, &b->a, &b->b, NULL, &b->y);
    if (r == dnnl_success) r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success) r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (r == dnnl_success && b->alpha != 1.0f)
        r = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &b->alpha);
    if (r == dnnl_success) r = kd_pd_create(&pd, &d, attr);
    if (r == dnnl_success && !kd_pd_is_ref(pd)) {
        st = kd_variant_init(b->node, pd, v);
        if (st == KILN_OK) {
            kd_variant_arg(v, DNNL_ARG_SRC, KD_SRC_IN, 0, &b->a);
            kd_variant_arg(v, DNNL_ARG_WEIGHTS, KD_SRC_IN, 1, &b->b);
            kd_variant_arg(v, DNNL_ARG_DST, KD_SRC_OUT, 0, &b->y);
        }
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return st;
}

static kiln_status mmt_run(void *state, struct kiln_run_ctx *ctx)
{
    return kd_exec_run(state, ctx);
}

static void mmt_destroy(void *state)
{
    kd_exec_destroy(state);
    free(state);
}

/* The md of x (plain, rank r) seen through perm attribute `name` (absent: as stored);
 * false when the attribute is not a permutation of r dims. */
static bool mmt_md(const struct kiln_node *n, const char *name, const struct kiln_type *x,
                   dnnl_memory_desc_t *md)
{
    int r = x->rank;
    int64_t p[KILN_MAX_RANK], st[KILN_MAX_RANK];
    const int64_t *v;
    int k = kiln_attr_ints(n, name, &v);
    bool seen[KILN_MAX_RANK] = {false};
    if (k >= 0 && k != r) return false;
    for (int i = 0; i < r; i++) {
        p[i] = k < 0 ? i : v[i];
        if (p[i] < 0 || p[i] >= r || seen[p[i]]) return false;
        seen[p[i]] = true;
    }
    int64_t acc = 1;
    for (int d = r - 1; d >= 0; d--) {
        st[d] = acc;
        acc *= x->dims[d];
    }
    dnnl_dims_t dd, ds;
    for (int d = 0; d < r; d++) {
        dd[d] = x->dims[p[d]];
        ds[d] = st[p[d]];
    }
    return dnnl_memory_desc_init_by_strides(md, r, dd, dnnl_f32, ds) == dnnl_success;
}

kiln_status kiln_k_dnnl_matmul_t_compile(const struct kiln_compile_ctx *cc,
                                         struct kiln_kernel_inst *inst)
{
    const struct kiln_node *n = cc->node;
    if (cc->n_in < 2 || cc->n_out < 1) return KILN_OK;
    const struct kiln_type *a = cc->in[0], *b = cc->in[1], *y = cc->out[0];
    if (!a || !b || !y || a->dtype != KILN_DTYPE_F32 || b->dtype != KILN_DTYPE_F32 ||
        y->dtype != KILN_DTYPE_F32 || a->rank < 2 || a->rank != b->rank || y->rank != a->rank ||
        a->rank > 12 || !kiln_type_is_concrete(a) || !kiln_type_is_concrete(b) ||
        !kiln_type_is_concrete(y) || kiln_shape_count(y->rank, y->dims) <= 0 ||
        kiln_shape_count(a->rank, a->dims) <= 0 || kiln_shape_count(b->rank, b->dims) <= 0)
        return KILN_OK;
    for (int i = 0; i < 2; i++)
        if (cc->in_layout && cc->in_layout[i]) return KILN_OK;
    if (cc->out_layout && cc->out_layout[0]) return KILN_OK;
    struct mmt_build bd = {.node = n, .alpha = kiln_attr_float(n, "alpha", 1.0f)};
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return KILN_OK;
    }
    if (!mmt_md(n, "permA", a, &bd.a) || !mmt_md(n, "permB", b, &bd.b)) return KILN_OK;
    int r = y->rank;
    for (int d = 0; d < r - 2; d++) { /* batch dims: equal, or 1 on one side */
        int64_t da = bd.a.dims[d], db = bd.b.dims[d];
        if (da != db && da != 1 && db != 1) return KILN_OK;
        if (y->dims[d] != (da > db ? da : db)) return KILN_OK;
    }
    if (bd.a.dims[r - 1] != bd.b.dims[r - 2] || y->dims[r - 2] != bd.a.dims[r - 2] ||
        y->dims[r - 1] != bd.b.dims[r - 1])
        return KILN_OK;
    dnnl_dims_t yd;
    for (int d = 0; d < r; d++) yd[d] = y->dims[d];
    if (dnnl_memory_desc_init_by_tag(&bd.y, r, yd, dnnl_f32,
                                     r == 2 ? dnnl_ab : r == 3 ? dnnl_abc
                                     : r == 4 ? dnnl_abcd : r == 5 ? dnnl_abcde
                                                                 : dnnl_format_tag_undef) !=
        dnnl_success) {
        dnnl_dims_t ys;
        int64_t acc = 1;
        for (int d = r - 1; d >= 0; d--) {
            ys[d] = acc;
            acc *= y->dims[d];
        }
        if (dnnl_memory_desc_init_by_strides(&bd.y, r, yd, dnnl_f32, ys) != dnnl_success)
            return KILN_OK;
    }
    struct kd_exec *e = calloc(1, sizeof *e);
    if (!e) return kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY, "out of memory compiling");
    int handled = 0;
    double work = 2.0 * (double)kiln_shape_count(r, y->dims) * (double)bd.a.dims[r - 1];
    kiln_status st = kd_exec_build(e, kd_work_threads(cc, work), mmt_make, &bd, &handled);
    if (st != KILN_OK || !handled) {
        free(e);
        return st;
    }
    inst->name = "dnnl_matmul_strided";
    kd_inst_impl(inst, e);
    inst->state = e;
    inst->run = mmt_run;
    inst->destroy = mmt_destroy;
    inst->scratch_bytes = kd_exec_scratch(e);
    return KILN_OK;
}
