/*
 * cse.c - common-subexpression elimination.
 *
 * Small constants with equal dtype, shape and bytes become one value; then
 * nodes (in topological order) with the same op, inputs and attributes as
 * an earlier node are removed and their outputs read from the earlier one.
 * Nodes with subgraphs or data-dependent outputs are left alone, as are
 * nodes writing a graph output.
 */
#include <stdlib.h>

#include "kernels/kernel.h"
#include "opt/opt.h"

#define CSE_CONST_MAX_BYTES 4096

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static bool tensor_equal(const kiln_tensor *a, const kiln_tensor *b)
{
    if (!a || !b) return a == b;
    if (a->dtype != b->dtype || a->rank != b->rank || a->dtype == KILN_DTYPE_STRING) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    size_t n = (size_t)kiln_tensor_count(a) * kiln_dtype_size(a->dtype);
    return n == (size_t)kiln_tensor_count(b) * kiln_dtype_size(b->dtype) &&
           (n == 0 || memcmp(a->data, b->data, n) == 0);
}

static bool attr_equal(const struct kiln_attr *a, const struct kiln_attr *b)
{
    if (a->type != b->type) return false;
    switch (a->type) {
    case KILN_ATTR_FLOAT: return memcmp(&a->f, &b->f, sizeof a->f) == 0;
    case KILN_ATTR_INT: return a->i == b->i;
    case KILN_ATTR_STRING:
        return a->s.len == b->s.len && (a->s.len == 0 || memcmp(a->s.data, b->s.data, a->s.len) == 0);
    case KILN_ATTR_TENSOR: return tensor_equal(a->t, b->t);
    case KILN_ATTR_FLOATS:
        return a->n == b->n && (a->n == 0 || memcmp(a->floats, b->floats, sizeof(float) * (size_t)a->n) == 0);
    case KILN_ATTR_INTS:
        return a->n == b->n && (a->n == 0 || memcmp(a->ints, b->ints, sizeof(int64_t) * (size_t)a->n) == 0);
    case KILN_ATTR_STRINGS:
        if (a->n != b->n) return false;
        for (int i = 0; i < a->n; i++)
            if (a->strings[i].len != b->strings[i].len ||
                (a->strings[i].len && memcmp(a->strings[i].data, b->strings[i].data, a->strings[i].len)))
                return false;
        return true;
    default: return false; /* graphs are never equal */
    }
}

static bool node_equal(const struct kiln_node *a, const struct kiln_node *b)
{
    if (a->op != b->op || a->opset != b->opset || a->n_in != b->n_in || a->n_out != b->n_out ||
        a->n_attr != b->n_attr)
        return false;
    for (int k = 0; k < a->n_in; k++)
        if (a->in[k] != b->in[k]) return false;
    for (int k = 0; k < a->n_out; k++)
        if ((a->out[k] < 0) != (b->out[k] < 0)) return false;
    for (int k = 0; k < a->n_attr; k++) {
        const struct kiln_attr *o = kiln_node_attr(b, a->attr[k].name);
        if (!o || !attr_equal(&a->attr[k], o)) return false;
    }
    return true;
}

static uint64_t node_hash(const struct kiln_node *n)
{
    uint64_t h = mix(1469598103934665603ull, (uint64_t)n->op);
    h = mix(h, (uint64_t)n->n_in);
    for (int k = 0; k < n->n_in; k++) h = mix(h, (uint64_t)(int64_t)n->in[k]);
    return h;
}

struct table {
    int cap;
    int *slot; /* -1 = empty, else an index (node or value) */
    uint64_t *hash;
};

static kiln_status table_init(struct table *t, int n)
{
    t->cap = 16;
    while (t->cap < 2 * n + 16) t->cap *= 2;
    t->slot = malloc(sizeof(int) * (size_t)t->cap);
    t->hash = malloc(sizeof(uint64_t) * (size_t)t->cap);
    if (!t->slot || !t->hash) {
        free(t->slot);
        free(t->hash);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "cse: out of memory");
    }
    for (int i = 0; i < t->cap; i++) t->slot[i] = -1;
    return KILN_OK;
}

/* Find an entry equal to `item` (by eq) or insert it; returns the existing entry or -1. */
static int table_find_or_add(struct table *t, uint64_t h, int item,
                             bool (*eq)(const struct kiln_graph *, int, int),
                             const struct kiln_graph *g)
{
    int i = (int)(h & (uint64_t)(t->cap - 1));
    while (t->slot[i] >= 0) {
        if (t->hash[i] == h && eq(g, t->slot[i], item)) return t->slot[i];
        i = (i + 1) & (t->cap - 1);
    }
    t->slot[i] = item;
    t->hash[i] = h;
    return -1;
}

static bool const_eq(const struct kiln_graph *g, int a, int b)
{
    return tensor_equal(g->values[a].konst, g->values[b].konst);
}

static bool node_eq(const struct kiln_graph *g, int a, int b)
{
    return node_equal(&g->nodes[a], &g->nodes[b]);
}

static kiln_status cse_consts(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    struct table t;
    kiln_status st = table_init(&t, g->n_values);
    if (st != KILN_OK) return st;
    for (int v = 0; v < g->n_values; v++) {
        const struct kiln_value *val = &g->values[v];
        if (val->kind != KILN_VALUE_CONST || !val->konst || val->uses == 0 ||
            val->konst->dtype == KILN_DTYPE_STRING || kiln_opt_is_graph_output(g, v))
            continue;
        const kiln_tensor *k = val->konst;
        size_t bytes = (size_t)kiln_tensor_count(k) * kiln_dtype_size(k->dtype);
        if (bytes > CSE_CONST_MAX_BYTES) continue;
        uint64_t h = mix(mix(1, (uint64_t)k->dtype), (uint64_t)k->rank);
        for (int i = 0; i < k->rank; i++) h = mix(h, (uint64_t)k->dims[i]);
        h = hash_bytes(h, k->data, bytes);
        int prev = table_find_or_add(&t, h, v, const_eq, g);
        if (prev < 0) continue;
        kiln_opt_replace_uses(g, v, prev);
        kiln_opt_count(pl, "constant");
    }
    free(t.slot);
    free(t.hash);
    return KILN_OK;
}

kiln_status kiln_opt_cse(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    kiln_status st = cse_consts(g, pl);
    if (st != KILN_OK) return st;
    struct table t;
    st = table_init(&t, g->n_nodes);
    if (st != KILN_OK) return st;
    for (int oi = 0; oi < g->n_nodes; oi++) {
        int ni = g->order ? g->order[oi] : oi;
        struct kiln_node *n = &g->nodes[ni];
        if (kiln_opt_node_dead(n)) continue;
        /* two reads of one variable may sit on either side of a write */
        if (kiln_op_info(n->op)->flags & (KILN_OPF_SUBGRAPH | KILN_OPF_DYNOUT | KILN_OPF_STATEFUL))
            continue;
        bool skip = false;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0 && kiln_opt_is_graph_output(g, n->out[k])) skip = true;
        if (skip) continue;
        int prev = table_find_or_add(&t, node_hash(n), ni, node_eq, g);
        if (prev < 0) continue;
        for (int k = 0; k < n->n_out; k++)
            if (n->out[k] >= 0) kiln_opt_replace_uses(g, n->out[k], g->nodes[prev].out[k]);
        kiln_opt_remove_node(g, ni);
        kiln_opt_count(pl, kiln_op_name(g->nodes[prev].op));
    }
    free(t.slot);
    free(t.hash);
    return KILN_OK;
}
