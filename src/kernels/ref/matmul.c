/*
 * matmul.c - reference kernels for matrix products: MatMul, Gemm,
 * MatMulInteger and QLinearMatMul, and kiln_f32_gemm_ref, the float32 GEMM
 * that MatMul, Gemm, Conv and ConvTranspose share.
 *
 * The GEMM packs a KC x NC block of op(B) into NR-wide column panels and an
 * MC x KC block of op(A) into MR-tall row panels, then runs a fixed-size
 * MR x NR tile whose inner loop has a constant trip count, so gcc
 * vectorizes it at -O2 without target flags. Other dtypes take plain loops
 * that accumulate in double (floats) or in wrapping 64-bit integers (ints).
 *
 * MatMul follows numpy.matmul: 1-D operands are promoted to a row (A) or a
 * column (B) and the added dim dropped again; leading dims broadcast.
 */
#include <stdlib.h>

#include "kernels/kernel.h"
#include "kernels/ref/gemm.h"

/* ---- float32 GEMM ---- */

enum {
    GEMM_MR = 4,   /* rows of the register tile */
    GEMM_NR = 16,  /* columns of the register tile */
    GEMM_KC = 256, /* depth of a packed block */
    GEMM_MC = 64,  /* rows of a packed A block */
    GEMM_NC = 512, /* columns of a packed B block */
};

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

/* Pack rows [0, mc) x depth [0, kc) of op(A) into MR-tall panels, zero-padded. */
static void pack_a(bool trans, const float *a, int64_t lda, int64_t mc, int64_t kc, float *ap)
{
    for (int64_t i0 = 0; i0 < mc; i0 += GEMM_MR) {
        int64_t mr = min64(GEMM_MR, mc - i0);
        for (int64_t p = 0; p < kc; p++) {
            for (int64_t i = 0; i < mr; i++)
                ap[i] = trans ? a[p * lda + i0 + i] : a[(i0 + i) * lda + p];
            for (int64_t i = mr; i < GEMM_MR; i++) ap[i] = 0.0f;
            ap += GEMM_MR;
        }
    }
}

/* Pack depth [0, kc) x columns [0, nc) of op(B) into NR-wide panels, zero-padded. */
static void pack_b(bool trans, const float *b, int64_t ldb, int64_t kc, int64_t nc, float *bp)
{
    for (int64_t j0 = 0; j0 < nc; j0 += GEMM_NR) {
        int64_t nr = min64(GEMM_NR, nc - j0);
        for (int64_t p = 0; p < kc; p++) {
            if (!trans && nr == GEMM_NR) {
                memcpy(bp, b + p * ldb + j0, sizeof(float) * GEMM_NR);
            } else {
                for (int64_t j = 0; j < nr; j++)
                    bp[j] = trans ? b[(j0 + j) * ldb + p] : b[p * ldb + j0 + j];
                for (int64_t j = nr; j < GEMM_NR; j++) bp[j] = 0.0f;
            }
            bp += GEMM_NR;
        }
    }
}

/*
 * acc += Ap * Bp over kc for one MR x NR tile. This loop only reads the
 * packing buffers (filled by instrumented code), so it opts out of the
 * sanitizers: their per-element checks keep gcc from vectorizing it and
 * make sanitized whole-model runs over ten times slower.
 */
#if defined(__GNUC__)
__attribute__((no_sanitize("address", "undefined")))
#endif
static void gemm_tile_acc(int64_t kc, const float *restrict ap, const float *restrict bp,
                          float acc[GEMM_MR][GEMM_NR])
{
    for (int64_t p = 0; p < kc; p++) {
        for (int i = 0; i < GEMM_MR; i++) {
            float av = ap[p * GEMM_MR + i];
            for (int j = 0; j < GEMM_NR; j++) acc[i][j] += av * bp[p * GEMM_NR + j];
        }
    }
}

/* One MR x NR tile: acc = Ap * Bp over kc, then merge the valid mr x nr part into C. */
static void gemm_tile(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                      int64_t mr, int64_t nr, float alpha, float beta, bool first)
{
    float acc[GEMM_MR][GEMM_NR] = {{0}};
    gemm_tile_acc(kc, ap, bp, acc);
    for (int64_t i = 0; i < mr; i++) {
        float *row = c + i * ldc;
        if (!first)
            for (int64_t j = 0; j < nr; j++) row[j] += alpha * acc[i][j];
        else if (beta == 0.0f)
            for (int64_t j = 0; j < nr; j++) row[j] = alpha * acc[i][j];
        else
            for (int64_t j = 0; j < nr; j++) row[j] = alpha * acc[i][j] + beta * row[j];
    }
}

kiln_status kiln_f32_gemm_ref(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const float *a, int64_t lda, const float *b,
                              int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return KILN_OK;
    if (k <= 0) { /* empty sum: C = beta * C */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return KILN_OK;
    }
    int64_t kc_max = min64(k, GEMM_KC);
    size_t a_len = (size_t)(min64(round_up(m, GEMM_MR), GEMM_MC) * kc_max);
    size_t b_len = (size_t)(min64(round_up(n, GEMM_NR), GEMM_NC) * kc_max);
    float *ap = malloc(sizeof(float) * (a_len + b_len));
    if (!ap) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "gemm: out of memory for packing buffers");
    float *bp = ap + a_len;

    for (int64_t jc = 0; jc < n; jc += GEMM_NC) {
        int64_t nc = min64(GEMM_NC, n - jc);
        for (int64_t pc = 0; pc < k; pc += GEMM_KC) {
            int64_t kc = min64(GEMM_KC, k - pc);
            const float *bsrc = trans_b ? b + jc * ldb + pc : b + pc * ldb + jc;
            pack_b(trans_b, bsrc, ldb, kc, nc, bp);
            for (int64_t ic = 0; ic < m; ic += GEMM_MC) {
                int64_t mc = min64(GEMM_MC, m - ic);
                const float *asrc = trans_a ? a + pc * lda + ic : a + ic * lda + pc;
                pack_a(trans_a, asrc, lda, mc, kc, ap);
                for (int64_t jr = 0; jr < nc; jr += GEMM_NR) {
                    const float *bpanel = bp + (jr / GEMM_NR) * GEMM_NR * kc;
                    for (int64_t ir = 0; ir < mc; ir += GEMM_MR) {
                        const float *apanel = ap + (ir / GEMM_MR) * GEMM_MR * kc;
                        gemm_tile(kc, apanel, bpanel, c + (ic + ir) * ldc + jc + jr, ldc,
                                  min64(GEMM_MR, mc - ir), min64(GEMM_NR, nc - jr), alpha, beta,
                                  pc == 0);
                    }
                }
            }
        }
    }
    free(ap);
    return KILN_OK;
}

/* ---- batched matrix layout shared by MatMul, MatMulInteger, QLinearMatMul ---- */

/* How a (possibly batched, possibly 1-D) A x B product maps onto 2-D products. */
struct mm_plan {
    int64_t m, k, n;               /* each product is m x k times k x n */
    int batch_rank;                /* rank of the broadcast batch dims */
    int64_t batch[KILN_MAX_RANK];  /* broadcast batch dims */
    int64_t a_bstride[KILN_MAX_RANK]; /* A's stride (in matrices) per batch dim; 0 = broadcast */
    int64_t b_bstride[KILN_MAX_RANK];
    int64_t count;                 /* number of products */
};

/* Batch dims of a rank-r operand: all but the last two (none for rank <= 2). */
static int batch_rank_of(int rank) { return rank > 2 ? rank - 2 : 0; }

/* Shape rule of numpy.matmul on types; unknown parts stay unknown. */
static kiln_status matmul_infer_types(const struct kiln_node *node, const struct kiln_type *a,
                                      const struct kiln_type *b, kiln_dtype dt,
                                      struct kiln_type *out)
{
    kiln_type_unknown(out);
    out->dtype = dt;
    if (!a || !b || a->rank < 0 || b->rank < 0) return KILN_OK;
    if (a->rank == 0 || b->rank == 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "inputs must have rank >= 1, got ranks %d and %d", a->rank,
                               b->rank);
    int64_t ka = a->dims[a->rank - 1];
    int64_t kb = b->rank == 1 ? b->dims[0] : b->dims[b->rank - 2];
    if (ka >= 0 && kb >= 0 && ka != kb)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "inner dims differ: A has %lld columns, B has %lld rows",
                               (long long)ka, (long long)kb);
    struct kiln_type ab, bb;
    kiln_type_unknown(&ab);
    kiln_type_unknown(&bb);
    ab.rank = batch_rank_of(a->rank);
    bb.rank = batch_rank_of(b->rank);
    for (int i = 0; i < ab.rank; i++) {
        ab.dims[i] = a->dims[i];
        ab.sym[i] = a->sym[i];
    }
    for (int i = 0; i < bb.rank; i++) {
        bb.dims[i] = b->dims[i];
        bb.sym[i] = b->sym[i];
    }
    const struct kiln_type *parts[2] = {&ab, &bb};
    struct kiln_type batch;
    kiln_type_unknown(&batch);
    kiln_status st = kiln_infer_broadcast_types(node, 2, parts, &batch);
    if (st != KILN_OK) return st;
    int r = batch.rank;
    for (int i = 0; i < r; i++) {
        out->dims[i] = batch.dims[i];
        out->sym[i] = batch.sym[i];
    }
    if (a->rank >= 2) {
        out->dims[r] = a->dims[a->rank - 2];
        out->sym[r] = a->sym[a->rank - 2];
        r++;
    }
    if (b->rank >= 2) {
        out->dims[r] = b->dims[b->rank - 1];
        out->sym[r] = b->sym[b->rank - 1];
        r++;
    }
    out->rank = r;
    return KILN_OK;
}

/* Plan the products for concrete A and B (shapes already checked by infer). */
static kiln_status mm_plan_init(const struct kiln_node *node, const kiln_tensor *a,
                                const kiln_tensor *b, struct mm_plan *p)
{
    memset(p, 0, sizeof *p);
    if (a->rank == 0 || b->rank == 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "inputs must have rank >= 1, got ranks %d and %d", a->rank,
                               b->rank);
    p->m = a->rank >= 2 ? a->dims[a->rank - 2] : 1;
    p->k = a->dims[a->rank - 1];
    p->n = b->rank >= 2 ? b->dims[b->rank - 1] : 1;
    int64_t kb = b->rank >= 2 ? b->dims[b->rank - 2] : b->dims[0];
    if (kb != p->k)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "inner dims differ: A has %lld columns, B has %lld rows",
                               (long long)p->k, (long long)kb);
    int ra = batch_rank_of(a->rank), rb = batch_rank_of(b->rank);
    if (!kiln_shape_broadcast(ra, a->dims, rb, b->dims, &p->batch_rank, p->batch))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "batch dims of A and B cannot be broadcast");
    kiln_broadcast_strides(ra, a->dims, p->batch_rank, p->batch, p->a_bstride);
    kiln_broadcast_strides(rb, b->dims, p->batch_rank, p->batch, p->b_bstride);
    p->count = kiln_shape_count(p->batch_rank, p->batch);
    return KILN_OK;
}

/* Matrix offsets (in whole matrices) of A and B for product number idx. */
static void mm_plan_offsets(const struct mm_plan *p, int64_t idx, int64_t *a_mat, int64_t *b_mat)
{
    int64_t oa = 0, ob = 0;
    for (int d = p->batch_rank - 1; d >= 0; d--) {
        int64_t i = idx % p->batch[d];
        idx /= p->batch[d];
        oa += i * p->a_bstride[d];
        ob += i * p->b_bstride[d];
    }
    *a_mat = oa;
    *b_mat = ob;
}

/* True when every product reads the same B and A's matrices are consecutive, so the
 * batch folds into the rows of a single product. */
static bool mm_plan_foldable(const struct mm_plan *p)
{
    int64_t expect = 1;
    for (int d = p->batch_rank - 1; d >= 0; d--) {
        if (p->batch[d] == 1) continue;
        if (p->b_bstride[d] != 0 || p->a_bstride[d] != expect) return false;
        expect *= p->batch[d];
    }
    return true;
}

/* ---- MatMul ---- */

static kiln_status matmul_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    kiln_dtype dt = ctx->in[0] ? ctx->in[0]->dtype : KILN_DTYPE_UNDEFINED;
    return matmul_infer_types(ctx->node, ctx->in[0], ctx->in[1], dt, ctx->out[0]);
}

/* One m x k by k x n product in any float dtype, accumulating in double. */
static void matmul_f64_one(kiln_dtype dt, const void *a, int64_t ao, const void *b, int64_t bo,
                           void *y, int64_t yo, int64_t m, int64_t k, int64_t n)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++)
                s += kiln_get_f64(dt, a, ao + i * k + p) * kiln_get_f64(dt, b, bo + p * n + j);
            kiln_set_f64(dt, y, yo + i * n + j, s);
        }
}

/* One product in any integer dtype with wrapping (two's complement) arithmetic. */
static void matmul_int_one(kiln_dtype dt, const void *a, int64_t ao, const void *b, int64_t bo,
                           void *y, int64_t yo, int64_t m, int64_t k, int64_t n)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            uint64_t s = 0;
            for (int64_t p = 0; p < k; p++)
                s += (uint64_t)kiln_get_i64(dt, a, ao + i * k + p) *
                     (uint64_t)kiln_get_i64(dt, b, bo + p * n + j);
            kiln_set_i64(dt, y, yo + i * n + j, (int64_t)s);
        }
}

static kiln_status matmul_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *a = ctx->in[0], *b = ctx->in[1];
    kiln_tensor *y = ctx->out[0];
    if (a->dtype != b->dtype)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "A is %s but B is %s",
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype));
    kiln_dtype dt = a->dtype;
    bool is_float = kiln_dtype_is_float(dt);
    if (!is_float && !kiln_dtype_is_int(dt))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(dt));
    struct mm_plan p;
    kiln_status st = mm_plan_init(ctx->node, a, b, &p);
    if (st != KILN_OK) return st;
    int64_t a_sz = p.m * p.k, b_sz = p.k * p.n, y_sz = p.m * p.n;

    if (dt == KILN_DTYPE_F32) {
        const float *ad = a->data, *bd = b->data;
        float *yd = y->data;
        if (mm_plan_foldable(&p))
            return kiln_f32_gemm_ref(false, false, p.m * p.count, p.n, p.k, 1.0f, ad, p.k, bd,
                                     p.n, 0.0f, yd, p.n);
        for (int64_t i = 0; i < p.count; i++) {
            int64_t am, bm;
            mm_plan_offsets(&p, i, &am, &bm);
            st = kiln_f32_gemm_ref(false, false, p.m, p.n, p.k, 1.0f, ad + am * a_sz, p.k,
                                   bd + bm * b_sz, p.n, 0.0f, yd + i * y_sz, p.n);
            if (st != KILN_OK) return st;
        }
        return KILN_OK;
    }
    for (int64_t i = 0; i < p.count; i++) {
        int64_t am, bm;
        mm_plan_offsets(&p, i, &am, &bm);
        if (is_float)
            matmul_f64_one(dt, a->data, am * a_sz, b->data, bm * b_sz, y->data, i * y_sz, p.m,
                           p.k, p.n);
        else
            matmul_int_one(dt, a->data, am * a_sz, b->data, bm * b_sz, y->data, i * y_sz, p.m,
                           p.k, p.n);
    }
    return KILN_OK;
}

KILN_REF_OP(MatMul, matmul_infer, matmul_run);

/* ---- Gemm ---- */

static kiln_status gemm_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    const struct kiln_type *a = ctx->in[0], *b = ctx->in[1];
    struct kiln_type *out = ctx->out[0];
    kiln_type_unknown(out);
    out->dtype = a ? a->dtype : KILN_DTYPE_UNDEFINED;
    bool ta = kiln_attr_int(ctx->node, "transA", 0) != 0;
    bool tb = kiln_attr_int(ctx->node, "transB", 0) != 0;
    if ((a && a->rank >= 0 && a->rank != 2) || (b && b->rank >= 0 && b->rank != 2))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "A and B must be 2-D, got ranks %d and %d", a ? a->rank : -1,
                               b ? b->rank : -1);
    out->rank = 2;
    out->dims[0] = out->dims[1] = -1;
    if (a && a->rank == 2) {
        out->dims[0] = a->dims[ta ? 1 : 0];
        out->sym[0] = a->sym[ta ? 1 : 0];
    }
    if (b && b->rank == 2) {
        out->dims[1] = b->dims[tb ? 0 : 1];
        out->sym[1] = b->sym[tb ? 0 : 1];
    }
    if (a && b && a->rank == 2 && b->rank == 2) {
        int64_t ka = a->dims[ta ? 0 : 1], kb = b->dims[tb ? 1 : 0];
        if (ka >= 0 && kb >= 0 && ka != kb)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "inner dims differ: op(A) has %lld columns, op(B) has %lld "
                                   "rows",
                                   (long long)ka, (long long)kb);
    }
    return KILN_OK;
}

static kiln_status gemm_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *a = ctx->in[0], *b = ctx->in[1];
    const kiln_tensor *c = ctx->n_in > 2 ? ctx->in[2] : NULL;
    kiln_tensor *y = ctx->out[0];
    bool ta = kiln_attr_int(node, "transA", 0) != 0;
    bool tb = kiln_attr_int(node, "transB", 0) != 0;
    float alpha = kiln_attr_float(node, "alpha", 1.0f);
    float beta = kiln_attr_float(node, "beta", 1.0f);
    kiln_dtype dt = a->dtype;
    if (b->dtype != dt || (c && c->dtype != dt))
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "inputs differ in dtype");
    if (!kiln_dtype_is_float(dt) && !kiln_dtype_is_int(dt))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "dtype %s is not supported",
                               kiln_dtype_name(dt));
    if (a->rank != 2 || b->rank != 2)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "A and B must be 2-D, got ranks %d and %d", a->rank, b->rank);
    int64_t m = a->dims[ta ? 1 : 0], k = a->dims[ta ? 0 : 1];
    int64_t n = b->dims[tb ? 0 : 1];
    if (b->dims[tb ? 1 : 0] != k)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "inner dims differ: op(A) has %lld columns, op(B) has %lld rows",
                               (long long)k, (long long)b->dims[tb ? 1 : 0]);
    /* C broadcasts one way to [m, n] */
    int64_t c_rs = 0, c_cs = 0; /* C's row and column strides after broadcasting */
    if (c) {
        int64_t cm = c->rank == 2 ? c->dims[0] : 1;
        int64_t cn = c->rank >= 1 ? c->dims[c->rank - 1] : 1;
        if (c->rank > 2 || (cm != 1 && cm != m) || (cn != 1 && cn != n))
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "C (rank %d) cannot be broadcast to [%lld, %lld]", c->rank,
                                   (long long)m, (long long)n);
        c_cs = cn == 1 ? 0 : 1;
        c_rs = cm == 1 ? 0 : cn;
    }
    bool use_c = c && beta != 0.0f;

    if (dt == KILN_DTYPE_F32) {
        float *yd = y->data;
        if (use_c) {
            const float *cd = c->data;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < n; j++) yd[i * n + j] = beta * cd[i * c_rs + j * c_cs];
        }
        return kiln_f32_gemm_ref(ta, tb, m, n, k, alpha, a->data, ta ? m : k, b->data,
                                 tb ? k : n, use_c ? 1.0f : 0.0f, yd, n);
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++)
                s += kiln_get_f64(dt, a->data, ta ? p * m + i : i * k + p) *
                     kiln_get_f64(dt, b->data, tb ? j * k + p : p * n + j);
            s *= alpha;
            if (use_c) s += beta * kiln_get_f64(dt, c->data, i * c_rs + j * c_cs);
            kiln_set_f64(dt, y->data, i * n + j, s);
        }
    return KILN_OK;
}

KILN_REF_OP(Gemm, gemm_infer, gemm_run);

/* ---- MatMulInteger and QLinearMatMul ---- */

/* True for the 8-bit integer dtypes the quantized products take. */
static bool is_q8(kiln_dtype dt) { return dt == KILN_DTYPE_I8 || dt == KILN_DTYPE_U8; }

/*
 * x minus its zero point, as int32, for one operand of an integer product.
 * zp may be NULL (0), hold one value (per tensor), or hold one value per
 * row of A / column of B: a 1-D tensor of length rows (A) or cols (B), or
 * an N-D tensor broadcastable to x.
 */
static kiln_status sub_zero_point(const struct kiln_node *node, const char *what,
                                  const kiln_tensor *x, const kiln_tensor *zp, bool per_row,
                                  int32_t *out)
{
    int64_t count = kiln_tensor_count(x);
    if (!zp || kiln_tensor_count(zp) == 1) {
        int32_t z = zp ? (int32_t)kiln_get_i64(zp->dtype, zp->data, 0) : 0;
        for (int64_t i = 0; i < count; i++)
            out[i] = (int32_t)kiln_get_i64(x->dtype, x->data, i) - z;
        return KILN_OK;
    }
    if (zp->dtype != x->dtype)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s zero point is %s but %s is %s",
                               what, kiln_dtype_name(zp->dtype), what, kiln_dtype_name(x->dtype));
    /* a 1-D per-row zero point of A lines up with A's rows: view it as [rows, 1] */
    kiln_tensor view = *zp;
    if (per_row && zp->rank == 1) {
        view.rank = 2;
        view.dims[1] = 1;
    }
    int rout;
    int64_t dout[KILN_MAX_RANK];
    if (view.rank > x->rank ||
        !kiln_shape_broadcast(x->rank, x->dims, view.rank, view.dims, &rout, dout) ||
        rout != x->rank || memcmp(dout, x->dims, sizeof(int64_t) * (size_t)rout) != 0) {
        char buf[96];
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "%s zero point of shape %s does not fit the input", what,
                               kiln_shape_str(zp->rank, zp->dims, buf, sizeof buf));
    }
    const kiln_tensor *ins[2] = {x, &view};
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, x, 2, ins);
    for (int64_t i = 0; i < count; i++) {
        out[i] = (int32_t)(kiln_get_i64(x->dtype, x->data, it.off[0]) -
                           kiln_get_i64(zp->dtype, zp->data, it.off[1]));
        if (i + 1 < count) kiln_bcast_iter_next(&it);
    }
    return KILN_OK;
}

/* Batched integer product of zero-point-adjusted operands into int32 (wrapping). */
static void int_matmul(const struct mm_plan *p, const int32_t *a, const int32_t *b, int32_t *y)
{
    int64_t a_sz = p->m * p->k, b_sz = p->k * p->n, y_sz = p->m * p->n;
    for (int64_t bi = 0; bi < p->count; bi++) {
        int64_t am, bm;
        mm_plan_offsets(p, bi, &am, &bm);
        const int32_t *ab = a + am * a_sz, *bb = b + bm * b_sz;
        int32_t *yb = y + bi * y_sz;
        for (int64_t i = 0; i < p->m; i++) {
            int32_t *row = yb + i * p->n;
            for (int64_t j = 0; j < p->n; j++) row[j] = 0;
            for (int64_t q = 0; q < p->k; q++) {
                int64_t av = ab[i * p->k + q];
                const int32_t *brow = bb + q * p->n;
                for (int64_t j = 0; j < p->n; j++)
                    row[j] = (int32_t)(uint32_t)((uint32_t)row[j] + (uint32_t)(av * brow[j]));
            }
        }
    }
}

static kiln_status matmul_integer_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    return matmul_infer_types(ctx->node, ctx->in[0], ctx->in[1], KILN_DTYPE_I32, ctx->out[0]);
}

/* Zero-point-adjusted int32 copies of A and B (caller frees *a32; *b32 shares the block). */
static kiln_status int_operands(const struct kiln_node *node, const kiln_tensor *a,
                                const kiln_tensor *azp, const kiln_tensor *b,
                                const kiln_tensor *bzp, int32_t **a32, int32_t **b32)
{
    if (!is_q8(a->dtype) || !is_q8(b->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                               "A and B must be int8 or uint8, got %s and %s",
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype));
    int64_t na = kiln_tensor_count(a), nb = kiln_tensor_count(b);
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(na + nb + 1));
    if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_status st = sub_zero_point(node, "A", a, azp, true, buf);
    if (st == KILN_OK) st = sub_zero_point(node, "B", b, bzp, false, buf + na);
    if (st != KILN_OK) {
        free(buf);
        return st;
    }
    *a32 = buf;
    *b32 = buf + na;
    return KILN_OK;
}

static kiln_status matmul_integer_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *a = ctx->in[0], *b = ctx->in[1];
    const kiln_tensor *azp = ctx->n_in > 2 ? ctx->in[2] : NULL;
    const kiln_tensor *bzp = ctx->n_in > 3 ? ctx->in[3] : NULL;
    struct mm_plan p;
    kiln_status st = mm_plan_init(ctx->node, a, b, &p);
    if (st != KILN_OK) return st;
    int32_t *a32, *b32;
    st = int_operands(ctx->node, a, azp, b, bzp, &a32, &b32);
    if (st != KILN_OK) return st;
    int_matmul(&p, a32, b32, ctx->out[0]->data);
    free(a32);
    return KILN_OK;
}

KILN_REF_OP(MatMulInteger, matmul_integer_infer, matmul_integer_run);

static kiln_status qlinear_matmul_infer(struct kiln_infer_ctx *ctx)
{
    if (!ctx->out[0]) return KILN_OK;
    kiln_dtype dt = ctx->in[7] ? ctx->in[7]->dtype
                    : ctx->in[0] ? ctx->in[0]->dtype
                                 : KILN_DTYPE_UNDEFINED;
    return matmul_infer_types(ctx->node, ctx->in[0], ctx->in[3], dt, ctx->out[0]);
}

/* Round a float to the precision of a float dtype, as numpy arithmetic in that dtype does. */
static float round_to_dtype(kiln_dtype dt, float v)
{
    if (dt == KILN_DTYPE_F16) return kiln_f16_to_f32(kiln_f32_to_f16(v));
    if (dt == KILN_DTYPE_BF16) return kiln_bf16_to_f32(kiln_f32_to_bf16(v));
    return v;
}

/* Element i of a scale holding one value (per tensor) or one per row / column. */
static double per_index(const kiln_tensor *t, int64_t i)
{
    return kiln_get_f64(t->dtype, t->data, kiln_tensor_count(t) == 1 ? 0 : i);
}

static kiln_status qlinear_matmul_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *a = ctx->in[0], *a_scale = ctx->in[1], *azp = ctx->in[2];
    const kiln_tensor *b = ctx->in[3], *b_scale = ctx->in[4], *bzp = ctx->in[5];
    const kiln_tensor *y_scale = ctx->in[6], *yzp = ctx->in[7];
    kiln_tensor *y = ctx->out[0];
    if (!a_scale || !b_scale || !y_scale)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "scales are required");
    struct mm_plan p;
    kiln_status st = mm_plan_init(node, a, b, &p);
    if (st != KILN_OK) return st;
    int64_t nas = kiln_tensor_count(a_scale), nbs = kiln_tensor_count(b_scale);
    if ((nas != 1 && nas != p.m) || (nbs != 1 && nbs != p.n) ||
        kiln_tensor_count(y_scale) != 1 || (yzp && kiln_tensor_count(yzp) != 1))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                               "scales must be per tensor, or per row of A / column of B");
    if (!is_q8(y->dtype))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "output dtype %s is not supported",
                               kiln_dtype_name(y->dtype));
    int32_t *a32, *b32;
    st = int_operands(node, a, azp, b, bzp, &a32, &b32);
    if (st != KILN_OK) return st;
    int64_t y_count = kiln_tensor_count(y);
    int32_t *acc = malloc(sizeof(int32_t) * (size_t)(y_count + 1));
    if (!acc) {
        free(a32);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    int_matmul(&p, a32, b32, acc);
    /* y = saturate(rint(acc * (a_scale * b_scale / y_scale)) + y_zero_point); the
     * multiplier is computed in the scales' dtype, the rest in double */
    kiln_dtype sdt = a_scale->dtype;
    float ys = (float)kiln_get_f64(y_scale->dtype, y_scale->data, 0);
    double zp = yzp ? kiln_get_f64(yzp->dtype, yzp->data, 0) : 0.0;
    double lo = y->dtype == KILN_DTYPE_I8 ? -128 : 0, hi = y->dtype == KILN_DTYPE_I8 ? 127 : 255;
    for (int64_t idx = 0; idx < y_count; idx++) {
        int64_t j = idx % p.n, i = (idx / p.n) % p.m;
        float as = (float)per_index(a_scale, i), bs = (float)per_index(b_scale, j);
        float mult = round_to_dtype(sdt, round_to_dtype(sdt, as * bs) / ys);
        double v = rint((double)acc[idx] * (double)mult) + zp;
        v = v < lo ? lo : v > hi ? hi : v;
        kiln_set_f64(y->dtype, y->data, idx, v);
    }
    free(acc);
    free(a32);
    return KILN_OK;
}

KILN_REF_OP(QLinearMatMul, qlinear_matmul_infer, qlinear_matmul_run);
