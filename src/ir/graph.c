/*
 * graph.c - building and verifying IR graphs.
 */
#include "ir/graph.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernel.h"

/* ---- arena ---- */

struct kiln_arena_chunk {
    struct kiln_arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define ARENA_CHUNK (64 * 1024)

void *kiln_arena_alloc(struct kiln_arena *a, size_t size)
{
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    struct kiln_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > ARENA_CHUNK ? size : ARENA_CHUNK;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

char *kiln_arena_strndup(struct kiln_arena *a, const char *s, size_t n)
{
    char *p = kiln_arena_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *kiln_arena_strdup(struct kiln_arena *a, const char *s)
{
    return kiln_arena_strndup(a, s, strlen(s));
}

void kiln_arena_free(struct kiln_arena *a)
{
    struct kiln_arena_chunk *c = a->head;
    while (c) {
        struct kiln_arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
}

/* ---- types ---- */

void kiln_type_unknown(struct kiln_type *t)
{
    memset(t, 0, sizeof *t);
    t->rank = -1;
}

void kiln_type_from_tensor(struct kiln_type *t, const kiln_tensor *x)
{
    memset(t, 0, sizeof *t);
    t->dtype = x->dtype;
    t->rank = x->rank;
    for (int i = 0; i < x->rank; i++) t->dims[i] = x->dims[i];
}

bool kiln_type_is_concrete(const struct kiln_type *t)
{
    if (t->rank < 0 || t->dtype == KILN_DTYPE_UNDEFINED) return false;
    for (int i = 0; i < t->rank; i++)
        if (t->dims[i] < 0) return false;
    return true;
}

/* ---- graphs ---- */

kiln_status kiln_graph_new(struct kiln_graph **out)
{
    struct kiln_graph *g = calloc(1, sizeof *g);
    if (!g) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory creating a graph");
    g->mem = &g->arena;
    g->name = "";
    *out = g;
    return KILN_OK;
}

kiln_status kiln_graph_new_sub(struct kiln_graph *parent, struct kiln_graph **out)
{
    struct kiln_graph *g = kiln_arena_alloc(parent->mem, sizeof *g);
    if (!g) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory creating a subgraph");
    g->mem = parent->mem;
    g->parent = parent;
    g->name = "";
    *out = g;
    return KILN_OK;
}

static void graph_free_contents(struct kiln_graph *g)
{
    /* subgraphs' growable arrays first: they hang off this graph's nodes */
    for (int i = 0; i < g->n_nodes && !g->borrows_subgraphs; i++) {
        struct kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_attr; k++)
            if (n->attr[k].type == KILN_ATTR_GRAPH && n->attr[k].g)
                graph_free_contents(n->attr[k].g);
    }
    for (int i = 0; i < g->n_owned; i++) kiln_tensor_free(g->owned[i]);
    free(g->owned);
    free(g->values);
    free(g->nodes);
    free(g->order);
}

void kiln_graph_free_sub(struct kiln_graph *g)
{
    if (!g || !g->parent) return;
    graph_free_contents(g);
    g->owned = NULL;
    g->values = NULL;
    g->nodes = NULL;
    g->order = NULL;
    g->n_owned = g->cap_owned = g->n_values = g->cap_values = g->n_nodes = g->cap_nodes = 0;
}

void kiln_graph_free(struct kiln_graph *g)
{
    if (!g) return;
    graph_free_contents(g);
    kiln_arena_free(&g->arena);
    free(g);
}

kiln_status kiln_graph_clone(const struct kiln_graph *g, struct kiln_graph **out)
{
    struct kiln_graph *c = NULL; /* (set by kiln_graph_new; gcc cannot see that once inlined) */
    kiln_status st = kiln_graph_new(&c);
    if (st != KILN_OK) return st;
    c->borrows_subgraphs = 1;
    c->name = g->name;
    c->values = malloc(((size_t)g->n_values + 1) * sizeof *c->values);
    c->nodes = malloc(((size_t)g->n_nodes + 1) * sizeof *c->nodes);
    c->inputs = kiln_arena_alloc(c->mem, sizeof(int) * ((size_t)g->n_inputs + 1));
    c->outputs = kiln_arena_alloc(c->mem, sizeof(int) * ((size_t)g->n_outputs + 1));
    if (!c->values || !c->nodes || !c->inputs || !c->outputs) goto oom;
    /* (an empty graph has NULL arrays: memcpy must not see them) */
    if (g->n_values) memcpy(c->values, g->values, (size_t)g->n_values * sizeof *c->values);
    c->n_values = c->cap_values = g->n_values;
    if (g->n_inputs) memcpy(c->inputs, g->inputs, (size_t)g->n_inputs * sizeof(int));
    if (g->n_outputs) memcpy(c->outputs, g->outputs, (size_t)g->n_outputs * sizeof(int));
    c->n_inputs = g->n_inputs;
    c->n_outputs = g->n_outputs;
    c->cap_nodes = g->n_nodes + 1;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        struct kiln_node *m = &c->nodes[i];
        *m = *n;
        m->in = kiln_arena_alloc(c->mem, sizeof(int) * (size_t)(n->n_in ? n->n_in : 1));
        m->out = kiln_arena_alloc(c->mem, sizeof(int) * (size_t)(n->n_out ? n->n_out : 1));
        m->attr = kiln_arena_alloc(c->mem, sizeof(struct kiln_attr) * (size_t)(n->n_attr ? n->n_attr : 1));
        m->implicit = kiln_arena_alloc(c->mem, sizeof(int) * (size_t)(n->n_implicit ? n->n_implicit : 1));
        if (!m->in || !m->out || !m->attr || !m->implicit) goto oom;
        if (n->n_in) memcpy(m->in, n->in, sizeof(int) * (size_t)n->n_in);
        if (n->n_out) memcpy(m->out, n->out, sizeof(int) * (size_t)n->n_out);
        if (n->n_attr) memcpy(m->attr, n->attr, sizeof(struct kiln_attr) * (size_t)n->n_attr);
        if (n->n_implicit) memcpy(m->implicit, n->implicit, sizeof(int) * (size_t)n->n_implicit);
        c->n_nodes++;
    }
    if (g->order) {
        c->order = malloc(((size_t)g->n_nodes + 1) * sizeof *c->order);
        if (!c->order) goto oom;
        if (g->n_nodes) memcpy(c->order, g->order, (size_t)g->n_nodes * sizeof *c->order);
    }
    *out = c;
    return KILN_OK;
oom:
    kiln_graph_free(c);
    return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory copying a graph for the optimizer");
}

kiln_status kiln_graph_value_add(struct kiln_graph *g, const char *name, enum kiln_value_kind kind,
                                 int *id)
{
    if (g->n_values == g->cap_values) {
        int cap = g->cap_values ? g->cap_values * 2 : 16;
        struct kiln_value *v = realloc(g->values, (size_t)cap * sizeof *v);
        if (!v) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory adding a value");
        g->values = v;
        g->cap_values = cap;
    }
    struct kiln_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof *v);
    v->name = kiln_arena_strdup(g->mem, name ? name : "");
    if (!v->name) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory adding a value");
    v->kind = kind;
    v->producer = -1;
    v->outer = -1;
    kiln_type_unknown(&v->type);
    *id = g->n_values++;
    return KILN_OK;
}

int kiln_graph_value_find(const struct kiln_graph *g, const char *name)
{
    for (int i = 0; i < g->n_values; i++)
        if (strcmp(g->values[i].name, name) == 0) return i;
    return -1;
}

kiln_status kiln_graph_node_add(struct kiln_graph *g, enum kiln_op op, const char *name, int n_in,
                                int n_out, int n_attr, struct kiln_node **out)
{
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
        struct kiln_node *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory adding a node");
        g->nodes = nn;
        g->cap_nodes = cap;
    }
    struct kiln_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->op_type = kiln_op_name(op);
    n->name = kiln_arena_strdup(g->mem, name ? name : "");
    n->n_in = n_in;
    n->n_out = n_out;
    n->n_attr = n_attr;
    n->in = kiln_arena_alloc(g->mem, sizeof(int) * (size_t)(n_in ? n_in : 1));
    n->out = kiln_arena_alloc(g->mem, sizeof(int) * (size_t)(n_out ? n_out : 1));
    n->attr = kiln_arena_alloc(g->mem, sizeof(struct kiln_attr) * (size_t)(n_attr ? n_attr : 1));
    if (!n->name || !n->in || !n->out || !n->attr)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory adding a node");
    for (int i = 0; i < n_in; i++) n->in[i] = -1;
    for (int i = 0; i < n_out; i++) n->out[i] = -1;
    g->n_nodes++;
    *out = n;
    return KILN_OK;
}

kiln_status kiln_graph_own_tensor(struct kiln_graph *g, kiln_tensor *t)
{
    if (g->n_owned == g->cap_owned) {
        int cap = g->cap_owned ? g->cap_owned * 2 : 16;
        kiln_tensor **o = realloc(g->owned, (size_t)cap * sizeof *o);
        if (!o) {
            kiln_tensor_free(t);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
        g->owned = o;
        g->cap_owned = cap;
    }
    g->owned[g->n_owned++] = t;
    return KILN_OK;
}

const struct kiln_attr *kiln_node_attr(const struct kiln_node *n, const char *name)
{
    for (int i = 0; i < n->n_attr; i++)
        if (n->attr[i].name && strcmp(n->attr[i].name, name) == 0) return &n->attr[i];
    return NULL;
}

kiln_status kiln_node_error(const struct kiln_node *n, kiln_status st, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(st, "%s node '%s': %s", n->op_type ? n->op_type : kiln_op_name(n->op),
                      n->name ? n->name : "", msg);
}

/* ---- verifier ---- */

kiln_status kiln_graph_verify(struct kiln_graph *g)
{
    kiln_status st = KILN_OK;
    int nn = g->n_nodes;
    int *indeg = calloc((size_t)nn + 1, sizeof *indeg);
    int *queue = malloc(((size_t)nn + 1) * sizeof *queue);
    int *order = malloc(((size_t)nn + 1) * sizeof *order);
    /* consumers as CSR: for each value, the nodes reading it */
    int *cnt = calloc((size_t)g->n_values + 1, sizeof *cnt);
    if (!indeg || !queue || !order || !cnt) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory verifying the graph");
        goto out;
    }
    for (int v = 0; v < g->n_values; v++) g->values[v].uses = 0;
    for (int i = 0; i < nn; i++) {
        struct kiln_node *n = &g->nodes[i];
        const struct kiln_op_info *info = kiln_op_info(n->op);
        if (n->n_in > KILN_MAX_IO || n->n_out > KILN_MAX_IO) {
            st = kiln_node_error(n, KILN_ERR_UNSUPPORTED,
                                 "has %d inputs and %d outputs; Kiln allows at most %d of each",
                                 n->n_in, n->n_out, KILN_MAX_IO);
            goto out;
        }
        if (n->n_in < info->min_inputs || n->n_in > info->max_inputs) {
            st = kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                 "has %d inputs, expected %d to %d", n->n_in, info->min_inputs,
                                 info->max_inputs);
            goto out;
        }
        if (n->n_out < info->min_outputs || n->n_out > info->max_outputs) {
            st = kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                 "has %d outputs, expected %d to %d", n->n_out,
                                 info->min_outputs, info->max_outputs);
            goto out;
        }
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v < -1 || v >= g->n_values) {
                st = kiln_node_error(n, KILN_ERR_INVALID_MODEL, "input %d is not a value", k);
                goto out;
            }
            if (v < 0) {
                /* absent: only optional inputs, the ones past min_inputs (and Loop's trip
                 * count and condition and opset-8 Scan's sequence_lens, optional by the spec
                 * though listed first) */
                if (k < info->min_inputs && n->op != KILN_OP_Loop && n->op != KILN_OP_Scan) {
                    st = kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                         "input %d is required but given no value", k);
                    goto out;
                }
                continue;
            }
            g->values[v].uses++;
            if (g->values[v].kind == KILN_VALUE_NODE) {
                if (g->values[v].producer < 0) {
                    st = kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                         "input '%s' is not produced by any node, graph input "
                                         "or initializer",
                                         g->values[v].name);
                    goto out;
                }
                indeg[i]++;
            }
        }
        n->n_implicit = 0;
        n->implicit = NULL;
        int cap_implicit = 0;
        for (int k = 0; k < n->n_attr; k++) {
            struct kiln_graph *sub = n->attr[k].type == KILN_ATTR_GRAPH ? n->attr[k].g : NULL;
            if (!sub) continue;
            st = kiln_graph_verify(sub);
            if (st != KILN_OK) {
                kiln_error_wrap(st, "%s node '%s' attribute '%s'", n->op_type, n->name,
                                n->attr[k].name);
                goto out;
            }
            /* what the subgraph captures is an implicit input of this node */
            for (int v = 0; v < sub->n_values; v++) {
                if (sub->values[v].kind != KILN_VALUE_OUTER) continue;
                int pv = sub->values[v].outer;
                if (pv < 0 || pv >= g->n_values) {
                    st = kiln_node_error(n, KILN_ERR_INTERNAL, "bad outer reference");
                    goto out;
                }
                bool seen = false;
                for (int j = 0; j < n->n_implicit; j++) seen |= n->implicit[j] == pv;
                if (seen) continue;
                if (n->n_implicit == cap_implicit) {
                    int cap = cap_implicit ? cap_implicit * 2 : 8;
                    int *p = kiln_arena_alloc(g->mem, sizeof(int) * (size_t)cap);
                    if (!p) {
                        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory verifying the graph");
                        goto out;
                    }
                    if (n->n_implicit) memcpy(p, n->implicit, sizeof(int) * (size_t)n->n_implicit);
                    n->implicit = p;
                    cap_implicit = cap;
                }
                n->implicit[n->n_implicit++] = pv;
                g->values[pv].uses++;
                if (g->values[pv].kind == KILN_VALUE_NODE) indeg[i]++;
            }
        }
    }
    for (int k = 0; k < g->n_outputs; k++) {
        int v = g->outputs[k];
        if (v < 0 || v >= g->n_values) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "graph output %d is not a value", k);
            goto out;
        }
        struct kiln_value *val = &g->values[v];
        if (val->kind == KILN_VALUE_NODE && val->producer < 0) {
            st = kiln_error(KILN_ERR_INVALID_MODEL,
                            "graph output '%s' is not produced by any node", val->name);
            goto out;
        }
        val->uses++;
    }
    /* Kahn's algorithm: consumers found by scanning; O(nodes * inputs) with a
     * per-value consumer list */
    int *start = calloc((size_t)g->n_values + 1, sizeof *start);
    if (!start) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory verifying the graph");
        goto out;
    }
    for (int i = 0; i < nn; i++) {
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0) cnt[g->nodes[i].in[k]]++;
        for (int k = 0; k < g->nodes[i].n_implicit; k++) cnt[g->nodes[i].implicit[k]]++;
    }
    for (int v = 0; v < g->n_values; v++) start[v + 1] = start[v] + cnt[v];
    int *cons = malloc(((size_t)start[g->n_values] + 1) * sizeof *cons);
    if (!cons) {
        free(start);
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory verifying the graph");
        goto out;
    }
    memset(cnt, 0, ((size_t)g->n_values + 1) * sizeof *cnt);
    for (int i = 0; i < nn; i++) {
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int v = g->nodes[i].in[k];
            if (v >= 0) cons[start[v] + cnt[v]++] = i;
        }
        for (int k = 0; k < g->nodes[i].n_implicit; k++) {
            int v = g->nodes[i].implicit[k];
            cons[start[v] + cnt[v]++] = i;
        }
    }
    int qh = 0, qt = 0, done = 0;
    for (int i = 0; i < nn; i++)
        if (indeg[i] == 0) queue[qt++] = i;
    while (qh < qt) {
        int i = queue[qh++];
        order[done++] = i;
        struct kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_out; k++) {
            int v = n->out[k];
            if (v < 0) continue;
            for (int c = start[v]; c < start[v + 1]; c++)
                if (--indeg[cons[c]] == 0) queue[qt++] = cons[c];
        }
    }
    free(start);
    free(cons);
    if (done != nn) {
        const struct kiln_node *n = NULL;
        for (int i = 0; i < nn; i++)
            if (indeg[i] > 0) {
                n = &g->nodes[i];
                break;
            }
        st = kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                             "is part of a cycle (%d of %d nodes cannot be ordered)", nn - done,
                             nn);
        goto out;
    }
    free(g->order);
    g->order = order;
    order = NULL;
out:
    free(indeg);
    free(queue);
    free(order);
    free(cnt);
    return st;
}

void kiln_graph_mark_reads(const struct kiln_graph *g, uint8_t *read)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *nd = &g->nodes[i];
        for (int k = 0; k < nd->n_in; k++)
            if (nd->in[k] >= 0 && nd->in[k] < g->n_values) read[nd->in[k]] = 1;
        for (int k = 0; k < nd->n_implicit; k++)
            if (nd->implicit[k] >= 0 && nd->implicit[k] < g->n_values) read[nd->implicit[k]] = 1;
        for (int a = 0; a < nd->n_attr; a++) { /* captures of subgraphs, conservatively */
            const struct kiln_graph *sg = nd->attr[a].type == KILN_ATTR_GRAPH ? nd->attr[a].g : NULL;
            for (int v = 0; sg && v < sg->n_values; v++)
                if (sg->values[v].kind == KILN_VALUE_OUTER && sg->values[v].outer >= 0 &&
                    sg->values[v].outer < g->n_values)
                    read[sg->values[v].outer] = 1;
        }
    }
    for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k] >= 0 && g->outputs[k] < g->n_values) read[g->outputs[k]] = 1;
}
