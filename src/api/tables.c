/*
 * tables.c - kiln_model_quantize_tables (kiln.h): the embedding tables of a
 * model rounded to symmetric s8 per row, for `kiln compile --precision int8`
 * (docs/COMPRESSION.md, "Embedding tables").
 *
 * A transformer's largest weight is often not a product's: BERT-base's word
 * embeddings ([30522, 768] f32, 94 MB) are the constant data of a Gather, and
 * left in float they kept an int8 .kiln at 0.41x the source model. ONNX
 * Runtime's dynamic quantization quantizes such Gathers too.
 *
 * The tables rounded are the constant input 0 of every Gather on axis 0 whose
 * data is an f32 matrix of at least KILN_TABLE_MIN_ELEMS elements, in each
 * signature's imported and optimized graphs. Each row r gets the scale
 * s = max |w[r, :]| / 127 (1 for an all-zero row) and every entry becomes
 * q * s with q = clamp(nearbyint(w / s), -127, 127) (+0 where q is 0): the values the graph then
 * computes with are exactly s8 times a row scale, so the compile's report
 * measures what the table costs, the .kiln writer stores it as s8 with its
 * row scales (src/api/artifact.c, s8_lossless) and the file's reader gives
 * back the very floats. A Gather of such a table copies rows as before.
 *
 * As in prune.c, a table is never changed in place: the rounded copy is a new
 * tensor owned by the graph, every value holding the old one in any graph of
 * the model is pointed at it, and it must run before any session of the
 * model compiles a plan.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"
#include "import/model.h"
#include "kernels/fast.h"
#include "kernels/kernel.h"

#define KILN_TABLE_MIN_ELEMS 16384

struct table_job {
    struct kiln_const_swaps swaps;
    kiln_table_stats *stats;
};

/* The per-row s8 rounding of t (2-D f32), as a new tensor; NULL with the error set. */
static kiln_tensor *round_rows(const kiln_tensor *t)
{
    kiln_tensor *c = NULL;
    if (kiln_tensor_new(KILN_DTYPE_F32, t->rank, t->dims, &c) != KILN_OK) return NULL;
    const float *w = t->data;
    float *o = c->data;
    int64_t rows = t->dims[0], cols = t->dims[1];
    for (int64_t r = 0; r < rows; r++) {
        const float *wr = w + r * cols;
        float *or = o + r * cols;
        float mx = 0.0f;
        for (int64_t j = 0; j < cols; j++)
            if (fabsf(wr[j]) > mx) mx = fabsf(wr[j]);
        if (!isfinite(mx)) { /* a NaN or infinite entry: the row stays as it is */
            memcpy(or, wr, sizeof(float) * (size_t)cols);
            continue;
        }
        float s = mx > 0.0f ? mx / 127.0f : 1.0f;
        for (int64_t j = 0; j < cols; j++) {
            float q = nearbyintf(wr[j] / s);
            if (q < -127.0f) q = -127.0f;
            if (q > 127.0f) q = 127.0f;
            or[j] = q == 0.0f ? 0.0f : q * s; /* +0, not -0: what the s8 reader gives back */
        }
    }
    return c;
}

static int is_table(const struct kiln_graph *g, const struct kiln_node *n)
{
    if (n->op != KILN_OP_Gather || n->n_in < 2 || n->in[0] < 0) return 0;
    if (kiln_attr_int(n, "axis", 0) != 0) return 0;
    const kiln_tensor *t = g->values[n->in[0]].konst;
    return t && t->dtype == KILN_DTYPE_F32 && t->data && t->rank == 2 &&
           kiln_tensor_count(t) >= KILN_TABLE_MIN_ELEMS;
}

static kiln_status tables_graph(struct table_job *j, struct kiln_graph *g)
{
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct kiln_node *n = &g->nodes[ni];
        if (!is_table(g, n)) continue;
        struct kiln_value *v = &g->values[n->in[0]];
        const kiln_tensor *t = v->konst;
        kiln_tensor *to = kiln_const_swaps_find(&j->swaps, t);
        if (!to) {
            if (!(to = round_rows(t)))
                return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory rounding %s",
                                  n->name ? n->name : "a Gather's table");
            kiln_status st = kiln_const_swaps_add(&j->swaps, g, t, to);
            if (st != KILN_OK) return st;
            j->stats->tables++;
            j->stats->elements += kiln_tensor_count(to);
        }
        v->konst = to;
    }
    return KILN_OK;
}

kiln_status kiln_model_quantize_tables(kiln_model *m, kiln_table_stats *out)
{
    kiln_table_stats dummy;
    if (!out) out = &dummy;
    memset(out, 0, sizeof *out);
    if (!m) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_model_quantize_tables: no model");
    if (m->weights && kiln_weight_cache_bytes(m->weights) > 0)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "kiln_model_quantize_tables: a session of the model has compiled plans "
                          "already; round the tables right after loading");
    struct table_job j = {{NULL, 0, 0}, out};
    kiln_status st = KILN_OK;
    for (int i = 0; i < m->n_signatures && st == KILN_OK; i++) {
        struct kiln_signature *sig = &m->signatures[i];
        st = tables_graph(&j, sig->graph);
        if (st == KILN_OK && sig->opt_graph && sig->shares_graph_of < 0)
            st = tables_graph(&j, sig->opt_graph);
    }
    free(j.swaps.v);
    return st;
}
