/*
 * model.c - model bookkeeping shared by every importer: kept mappings,
 * signature descriptions, stats and the op histogram.
 */
#include "import/model.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"

kiln_status kiln_model_keep_map(struct kiln_model *m, const struct kiln_file_map *map)
{
    if (m->n_maps == m->cap_maps) {
        int cap = m->cap_maps ? m->cap_maps * 2 : 4;
        struct kiln_file_map *p = realloc(m->maps, (size_t)cap * sizeof *p);
        if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        m->maps = p;
        m->cap_maps = cap;
    }
    m->maps[m->n_maps++] = *map;
    return KILN_OK;
}

kiln_status kiln_model_note_copy(struct kiln_model *m, kiln_tensor *t, const void *src)
{
    if (m->n_copies == m->cap_copies) {
        int cap = m->cap_copies ? m->cap_copies * 2 : 64;
        struct kiln_weight_copy *c = realloc(m->copies, (size_t)cap * sizeof *c);
        if (!c) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        m->copies = c;
        m->cap_copies = cap;
    }
    m->copies[m->n_copies++] = (struct kiln_weight_copy){t, src};
    return KILN_OK;
}

static void describe_value(const struct kiln_graph *g, int v, kiln_value_info *vi)
{
    const struct kiln_value *val = &g->values[v];
    memset(vi, 0, sizeof *vi);
    vi->name = val->name;
    vi->dtype = val->type.dtype;
    vi->rank = val->type.rank;
    for (int i = 0; i < val->type.rank && i < KILN_MAX_RANK; i++) {
        vi->dims[i] = val->type.dims[i];
        vi->dim_names[i] = val->type.sym[i];
    }
}

kiln_status kiln_signature_describe(struct kiln_model *m, struct kiln_signature *sig)
{
    struct kiln_arena *a = m->graph->mem;
    sig->inputs = kiln_arena_alloc(a, sizeof(kiln_value_info) * ((size_t)sig->n_inputs + 1));
    sig->outputs = kiln_arena_alloc(a, sizeof(kiln_value_info) * ((size_t)sig->n_outputs + 1));
    if (!sig->inputs || !sig->outputs) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < sig->n_inputs; i++)
        describe_value(sig->graph, sig->input_values[i], &sig->inputs[i]);
    for (int i = 0; i < sig->n_outputs; i++)
        describe_value(sig->graph, sig->output_values[i], &sig->outputs[i]);
    return KILN_OK;
}

/* Count ops in g and its subgraphs into counts[op]. */
static void count_ops(const struct kiln_graph *g, int *counts, int depth)
{
    if (depth > 512) return;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        counts[n->op]++;
        for (int k = 0; k < n->n_attr; k++)
            if (n->attr[k].type == KILN_ATTR_GRAPH && n->attr[k].g)
                count_ops(n->attr[k].g, counts, depth + 1);
    }
}

kiln_status kiln_model_finish(struct kiln_model *m)
{
    struct kiln_graph *g = m->graph;
    int counts[KILN_OP_COUNT] = {0};
    count_ops(g, counts, 0);
    int kinds = 0;
    for (int i = 0; i < KILN_OP_COUNT; i++) kinds += counts[i] > 0;
    m->op_kind_name = kiln_arena_alloc(g->mem, sizeof(char *) * ((size_t)kinds + 1));
    m->op_kind_count = kiln_arena_alloc(g->mem, sizeof(int) * ((size_t)kinds + 1));
    if (!m->op_kind_name || !m->op_kind_count)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    m->n_op_kinds = 0;
    for (int i = 0; i < KILN_OP_COUNT; i++) {
        if (!counts[i]) continue;
        /* insertion sort by name */
        const char *name = kiln_op_name((enum kiln_op)i);
        int j = m->n_op_kinds++;
        while (j > 0 && strcmp(m->op_kind_name[j - 1], name) > 0) {
            m->op_kind_name[j] = m->op_kind_name[j - 1];
            m->op_kind_count[j] = m->op_kind_count[j - 1];
            j--;
        }
        m->op_kind_name[j] = name;
        m->op_kind_count[j] = counts[i];
    }
    m->stats.node_count = g->n_nodes;
    m->stats.param_count = 0;
    m->stats.param_bytes = 0;
    for (int v = 0; v < g->n_values; v++) {
        const struct kiln_value *val = &g->values[v];
        if (val->kind != KILN_VALUE_CONST || !val->konst) continue;
        m->stats.param_count += kiln_tensor_count(val->konst);
        m->stats.param_bytes += (int64_t)val->konst->nbytes;
    }
    return KILN_OK;
}
