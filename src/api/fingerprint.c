/*
 * fingerprint.c - the canonical form of a model's weights and structure,
 * from which `kiln fingerprint` computes a stable identity (api/internal.h,
 * docs/SECURITY.md).
 *
 * The form is written from the imported graph (before optimization), so it
 * depends on what the model computes and not on how the file spelled it:
 * an initializer stored as raw_data, as float_data or in an external data
 * file gives the same bytes (the importer has already decoded it), and no
 * name of a node, value, initializer or graph appears. It lists, in the
 * graph's topological order, each node's op type, its attributes (sorted
 * by attribute name; subgraphs in the same canonical form) and its inputs
 * as references: a graph input by position, another node's output by
 * (position in the order, output slot), a constant by the order of its
 * first use, written in full (dtype, shape, values) at that first use.
 * Then the graph outputs as references. Every integer is 8 bytes
 * little-endian; strings carry their length. The CLI hashes the stream
 * (BLAKE2b-256 over libsodium); libkiln itself stays free of crypto.
 */
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"
#include "import/model.h"
#include "ir/graph.h"

typedef struct fp_writer {
    void (*write)(void *ctx, const void *p, size_t n);
    void *ctx;
} fp_writer;

static void put_u64(const fp_writer *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    w->write(w->ctx, b, 8);
}

static void put_bytes(const fp_writer *w, const void *p, size_t n)
{
    put_u64(w, n);
    if (n) w->write(w->ctx, p, n);
}

static void put_str(const fp_writer *w, const char *s) { put_bytes(w, s, s ? strlen(s) : 0); }

static void put_tensor(const fp_writer *w, const kiln_tensor *t)
{
    put_u64(w, (uint64_t)t->dtype);
    put_u64(w, (uint64_t)t->rank);
    for (int d = 0; d < t->rank; d++) put_u64(w, (uint64_t)t->dims[d]);
    if (t->dtype == KILN_DTYPE_STRING) {
        int64_t n = kiln_tensor_count(t);
        const kiln_string *s = t->data;
        put_u64(w, (uint64_t)n);
        for (int64_t i = 0; i < n; i++) put_bytes(w, s[i].data, s[i].len);
    } else {
        put_bytes(w, t->data, t->nbytes);
    }
}

static kiln_status put_graph(const fp_writer *w, const struct kiln_graph *g, int depth);

static kiln_status put_attr(const fp_writer *w, const struct kiln_attr *a, int depth)
{
    put_str(w, a->name);
    put_u64(w, (uint64_t)a->type);
    switch (a->type) {
    case KILN_ATTR_FLOAT: w->write(w->ctx, &a->f, sizeof a->f); break;
    case KILN_ATTR_INT: put_u64(w, (uint64_t)a->i); break;
    case KILN_ATTR_STRING: put_bytes(w, a->s.data, a->s.len); break;
    case KILN_ATTR_TENSOR:
        if (a->t) put_tensor(w, a->t);
        break;
    case KILN_ATTR_GRAPH:
        if (a->g) return put_graph(w, a->g, depth + 1);
        break;
    case KILN_ATTR_FLOATS: put_bytes(w, a->floats, (size_t)a->n * sizeof(float)); break;
    case KILN_ATTR_INTS:
        put_u64(w, (uint64_t)a->n);
        for (int i = 0; i < a->n; i++) put_u64(w, (uint64_t)a->ints[i]);
        break;
    case KILN_ATTR_STRINGS:
        put_u64(w, (uint64_t)a->n);
        for (int i = 0; i < a->n; i++) put_bytes(w, a->strings[i].data, a->strings[i].len);
        break;
    }
    return KILN_OK;
}

/* A reference to value v: see the file's opening comment. */
static void put_ref(const fp_writer *w, const struct kiln_graph *g, int v, const int *pos,
                    int *const_id, int *n_consts)
{
    if (v < 0 || v >= g->n_values) {
        put_u64(w, 'A');
        return;
    }
    const struct kiln_value *x = &g->values[v];
    switch (x->kind) {
    case KILN_VALUE_INPUT:
        put_u64(w, 'I');
        for (int i = 0; i < g->n_inputs; i++)
            if (g->inputs[i] == v) put_u64(w, (uint64_t)i);
        break;
    case KILN_VALUE_NODE: {
        put_u64(w, 'N');
        const struct kiln_node *p = &g->nodes[x->producer];
        put_u64(w, (uint64_t)pos[x->producer]);
        for (int o = 0; o < p->n_out; o++)
            if (p->out[o] == v) put_u64(w, (uint64_t)o);
        break;
    }
    case KILN_VALUE_CONST:
        if (const_id[v] >= 0) {
            put_u64(w, 'K');
            put_u64(w, (uint64_t)const_id[v]);
        } else {
            const_id[v] = (*n_consts)++;
            put_u64(w, 'C');
            if (x->konst) put_tensor(w, x->konst);
        }
        break;
    case KILN_VALUE_OUTER:
        put_u64(w, 'O');
        break;
    }
}

static kiln_status put_graph(const fp_writer *w, const struct kiln_graph *g, int depth)
{
    if (depth > 64) return KILN_ERR_INVALID_MODEL;
    int *pos = malloc(((size_t)g->n_nodes + 1) * sizeof *pos);
    int *const_id = malloc(((size_t)g->n_values + 1) * sizeof *const_id);
    if (!pos || !const_id) {
        free(pos);
        free(const_id);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int k = 0; k < g->n_nodes; k++) pos[g->order ? g->order[k] : k] = k;
    for (int v = 0; v < g->n_values; v++) const_id[v] = -1;
    int n_consts = 0;
    kiln_status st = KILN_OK;
    put_u64(w, 'G');
    put_u64(w, (uint64_t)g->n_inputs);
    for (int i = 0; i < g->n_inputs; i++) {
        const struct kiln_type *t = &g->values[g->inputs[i]].type;
        put_u64(w, (uint64_t)t->dtype);
        put_u64(w, (uint64_t)t->rank);
    }
    put_u64(w, (uint64_t)g->n_nodes);
    for (int k = 0; k < g->n_nodes && st == KILN_OK; k++) {
        const struct kiln_node *n = &g->nodes[g->order ? g->order[k] : k];
        put_str(w, n->op_type);
        put_u64(w, (uint64_t)n->n_in);
        for (int i = 0; i < n->n_in; i++) put_ref(w, g, n->in[i], pos, const_id, &n_consts);
        put_u64(w, (uint64_t)n->n_out);
        /* attributes in name order (selection: nodes have few) */
        put_u64(w, (uint64_t)n->n_attr);
        const char *last = NULL;
        for (int done = 0; done < n->n_attr && st == KILN_OK; done++) {
            int best = -1;
            for (int a = 0; a < n->n_attr; a++) {
                const char *nm = n->attr[a].name ? n->attr[a].name : "";
                if (last && strcmp(nm, last) <= 0) continue;
                if (best < 0 || strcmp(nm, n->attr[best].name ? n->attr[best].name : "") < 0)
                    best = a;
            }
            if (best < 0) break; /* duplicate names: the rest are equal */
            last = n->attr[best].name ? n->attr[best].name : "";
            st = put_attr(w, &n->attr[best], depth);
        }
    }
    put_u64(w, (uint64_t)g->n_outputs);
    for (int i = 0; i < g->n_outputs; i++) put_ref(w, g, g->outputs[i], pos, const_id, &n_consts);
    free(pos);
    free(const_id);
    return st;
}

kiln_status kiln_model_canonical_write(const kiln_model *m,
                                       void (*write)(void *ctx, const void *p, size_t n),
                                       void *ctx)
{
    if (!m || !write || !m->graph) return KILN_ERR_INVALID_ARGUMENT;
    fp_writer w = {write, ctx};
    put_str(&w, "kiln-fingerprint-v1");
    return put_graph(&w, m->graph, 0);
}

/* The constants of the root graph (api: kiln_util.h): in the order the nodes,
 * in topological order, first read them, then those no node reads in value
 * order. The value id of the i-th, or -1. */
static int const_at(const struct kiln_graph *g, int i)
{
    if (i < 0) return -1;
    uint8_t *seen = calloc((size_t)g->n_values + 1, 1);
    if (!seen) return -1;
    int found = -1;
    for (int k = 0; k < g->n_nodes && found < 0; k++) {
        const struct kiln_node *n = &g->nodes[g->order ? g->order[k] : k];
        for (int j = 0; j < n->n_in && found < 0; j++) {
            int v = n->in[j];
            if (v < 0 || v >= g->n_values || seen[v]) continue;
            seen[v] = 1;
            if (g->values[v].kind == KILN_VALUE_CONST && g->values[v].konst && i-- == 0) found = v;
        }
    }
    for (int v = 0; v < g->n_values && found < 0; v++)
        if (!seen[v] && g->values[v].kind == KILN_VALUE_CONST && g->values[v].konst && i-- == 0)
            found = v;
    free(seen);
    return found;
}

int kiln_model_constant_count(const kiln_model *m)
{
    if (!m || !m->graph) return 0;
    int n = 0;
    for (int v = 0; v < m->graph->n_values; v++)
        if (m->graph->values[v].kind == KILN_VALUE_CONST && m->graph->values[v].konst) n++;
    return n;
}

const kiln_tensor *kiln_model_constant(const kiln_model *m, int i, const char **name)
{
    if (name) *name = NULL;
    if (!m || !m->graph) return NULL;
    int v = const_at(m->graph, i);
    if (v < 0) return NULL;
    if (name) *name = m->graph->values[v].name ? m->graph->values[v].name : "";
    return m->graph->values[v].konst;
}
