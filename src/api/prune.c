/*
 * prune.c - kiln_model_prune (kiln.h): one-shot magnitude pruning of a
 * loaded model's product weights, for `kiln compile --prune RATIO`
 * (docs/COMPRESSION.md, "Sparse weights").
 *
 * The weights pruned are the constant input 1 of every MatMul, Gemm and
 * KilnFusedMatMul whose weight is a 2-D f32 matrix, and of every Conv and
 * KilnFusedConv whose weight is [C_out, C_in / group, 1, 1] (a 1x1
 * convolution), in each signature's imported and optimized graphs. Each
 * layer separately (per-layer, not global, ratio): its `ratio` share of
 * entries with the smallest |w| become 0, or with block = 4 its `ratio`
 * share of 1x4 blocks (four consecutive entries along the reduction
 * dimension: K of a MatMul weight [K, N], the contiguous K of a transposed
 * Gemm weight [N, K], C_in of a 1x1 convolution) with the smallest sum of
 * |w|. Ties at the threshold are broken by position, so exactly
 * floor(ratio * count) entries or blocks are zeroed.
 *
 * A weight is never changed in place (it may lie in a read-only mapping
 * of the model file, or be a weight the cache may copy again from the
 * file): the pruned copy is a new tensor owned by the graph, and every
 * value holding the old one in any graph of the model is pointed at it.
 * So it must run before any session of the model compiles a plan.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"
#include "import/model.h"
#include "kernels/fast.h"
#include "kernels/kernel.h"

struct prune_job {
    double ratio;
    int block;
    struct kiln_const_swaps swaps;
    kiln_prune_stats *stats;
};

struct score {
    float s;
    int64_t i;
};

static int by_score(const void *a, const void *b)
{
    const struct score *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Zero the smallest ratio share of w's groups: group j of `count` holds the
 * `len` entries at base[j] + t * step, t < len. */
static kiln_status prune_groups(float *w, int64_t groups, const int64_t *base, int len,
                                int64_t step, double ratio, int64_t *zeroed)
{
    struct score *sc = malloc(sizeof *sc * (size_t)(groups > 0 ? groups : 1));
    if (!sc) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory pruning");
    for (int64_t j = 0; j < groups; j++) {
        float s = 0.0f;
        for (int t = 0; t < len; t++) s += fabsf(w[base[j] + t * step]);
        sc[j] = (struct score){isnan(s) ? INFINITY : s, j};
    }
    qsort(sc, (size_t)groups, sizeof *sc, by_score);
    int64_t cut = (int64_t)floor(ratio * (double)groups);
    for (int64_t j = 0; j < cut; j++)
        for (int t = 0; t < len; t++) w[base[sc[j].i] + t * step] = 0.0f;
    *zeroed += cut * len;
    free(sc);
    return KILN_OK;
}

/* The pruned copy of weight t, whose reduction dim has K entries at stride
 * kstep and whose R = count / K rows start at base[r] (filled here). */
static kiln_status prune_tensor(struct prune_job *j, const kiln_tensor *t, int64_t K, int64_t kstep,
                                int64_t rows, int64_t rstep_outer, int64_t rstep_inner,
                                int64_t inner, kiln_tensor **out)
{
    kiln_tensor *c = NULL;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, t->rank, t->dims, &c);
    if (st != KILN_OK) return st;
    memcpy(c->data, t->data, c->nbytes);
    int B = j->block == 4 && K >= 4 ? 4 : 1;
    int64_t kb = K / B; /* a tail of K % 4 entries stays as it is */
    int64_t groups = rows * kb;
    int64_t *base = malloc(sizeof *base * (size_t)(groups > 0 ? groups : 1));
    if (!base) {
        kiln_tensor_free(c);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory pruning");
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t r0 = (r / inner) * rstep_outer + (r % inner) * rstep_inner;
        for (int64_t b = 0; b < kb; b++) base[r * kb + b] = r0 + b * B * kstep;
    }
    st = prune_groups(c->data, groups, base, B, kstep, j->ratio, &j->stats->zeroed);
    free(base);
    if (st != KILN_OK) {
        kiln_tensor_free(c);
        return st;
    }
    j->stats->weights += kiln_tensor_count(c);
    j->stats->layers++;
    *out = c;
    return KILN_OK;
}

kiln_tensor *kiln_const_swaps_find(const struct kiln_const_swaps *s, const kiln_tensor *t)
{
    for (int k = 0; k < s->n; k++)
        if (s->v[k].from == t || s->v[k].to == t) return s->v[k].to;
    return NULL;
}

kiln_status kiln_const_swaps_add(struct kiln_const_swaps *s, struct kiln_graph *g,
                                 const kiln_tensor *from, kiln_tensor *to)
{
    kiln_status st = kiln_graph_own_tensor(g, to);
    if (st != KILN_OK) {
        kiln_tensor_free(to);
        return st;
    }
    if (s->n == s->cap) { /* (to is g's now: nothing leaks if this fails) */
        int cap = s->cap ? 2 * s->cap : 16;
        struct kiln_const_swap *v = realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory replacing a weight");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (struct kiln_const_swap){from, to};
    return KILN_OK;
}

static kiln_status prune_graph(struct prune_job *j, struct kiln_graph *g)
{
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct kiln_node *n = &g->nodes[ni];
        int conv = n->op == KILN_OP_Conv || n->op == KILN_OP_KilnFusedConv;
        int mm = n->op == KILN_OP_MatMul || n->op == KILN_OP_Gemm || n->op == KILN_OP_KilnFusedMatMul;
        if ((!conv && !mm) || n->n_in < 2 || n->in[1] < 0) continue;
        struct kiln_value *v = &g->values[n->in[1]];
        const kiln_tensor *t = v->konst;
        if (!t || t->dtype != KILN_DTYPE_F32 || !t->data) continue;
        kiln_tensor *to = kiln_const_swaps_find(&j->swaps, t);
        if (!to) {
            kiln_status st;
            if (mm && t->rank == 2) {
                int tb = n->op != KILN_OP_MatMul && kiln_attr_int(n, "transB", 0) == 1;
                int64_t K = tb ? t->dims[1] : t->dims[0], N = tb ? t->dims[0] : t->dims[1];
                /* rows = output columns: [K, N] -> row r at r, k stride N; [N, K] -> r * K, stride 1 */
                st = tb ? prune_tensor(j, t, K, 1, N, K, 0, 1, &to)
                        : prune_tensor(j, t, K, N, N, 1, 0, 1, &to);
            } else if (conv && t->rank == 4 && t->dims[2] == 1 && t->dims[3] == 1) {
                int64_t K = t->dims[1], Co = t->dims[0];
                st = prune_tensor(j, t, K, 1, Co, K, 0, 1, &to);
            } else {
                continue;
            }
            kiln_error_clear();
            if (st != KILN_OK) return st;
            if ((st = kiln_const_swaps_add(&j->swaps, g, t, to)) != KILN_OK) return st;
        }
        v->konst = to;
    }
    return KILN_OK;
}

kiln_status kiln_model_prune(kiln_model *m, double ratio, int block, kiln_prune_stats *out)
{
    kiln_prune_stats dummy;
    if (!out) out = &dummy;
    memset(out, 0, sizeof *out);
    if (!m) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_model_prune: no model");
    if (!(ratio > 0.0 && ratio < 1.0))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "prune ratio %g is not between 0 and 1 (exclusive)", ratio);
    if (block != 1 && block != 4)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "prune block %d is not 1 or 4", block);
    if (m->weights && kiln_weight_cache_bytes(m->weights) > 0)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "kiln_model_prune: a session of the model has compiled plans already; "
                          "prune right after loading");
    struct prune_job j = {ratio, block, {NULL, 0, 0}, out};
    kiln_status st = KILN_OK;
    for (int i = 0; i < m->n_signatures && st == KILN_OK; i++) {
        struct kiln_signature *sig = &m->signatures[i];
        st = prune_graph(&j, sig->graph);
        if (st == KILN_OK && sig->opt_graph && sig->shares_graph_of < 0)
            st = prune_graph(&j, sig->opt_graph);
    }
    free(j.swaps.v);
    return st;
}
