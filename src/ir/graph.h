/*
 * graph.h - Kiln's IR: a graph of nodes over values, with typed attributes.
 *
 * A graph owns an arena; every name, attribute and array of the graph and
 * its subgraphs lives there and is freed with kiln_graph_free. Values are
 * numbered 0..n_values-1; a node names its inputs and outputs by value id
 * (-1 for an absent optional input). A value is a graph input, a constant
 * (initializer or folded), a node output, or an outer-scope capture (a
 * subgraph's reference to a value of an enclosing graph).
 */
#ifndef KILN_IR_GRAPH_H
#define KILN_IR_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "ir/ops.h"

/* Bump allocator for graph-lifetime data. */
struct kiln_arena_chunk;
struct kiln_arena {
    struct kiln_arena_chunk *head;
};
void *kiln_arena_alloc(struct kiln_arena *a, size_t size); /* zeroed, 16-aligned; NULL on OOM */
char *kiln_arena_strdup(struct kiln_arena *a, const char *s);
char *kiln_arena_strndup(struct kiln_arena *a, const char *s, size_t n);
void kiln_arena_free(struct kiln_arena *a);

/* A value's static type; rank -1 = unknown rank, dims[i] -1 = unknown. */
struct kiln_type {
    kiln_dtype dtype;
    int rank;
    int64_t dims[KILN_MAX_RANK];
    const char *sym[KILN_MAX_RANK]; /* symbolic dim name or NULL */
};
void kiln_type_unknown(struct kiln_type *t);
void kiln_type_from_tensor(struct kiln_type *t, const kiln_tensor *x);
bool kiln_type_is_concrete(const struct kiln_type *t);

enum kiln_attr_type {
    KILN_ATTR_FLOAT = 1,
    KILN_ATTR_INT,
    KILN_ATTR_STRING,
    KILN_ATTR_TENSOR,
    KILN_ATTR_GRAPH,
    KILN_ATTR_FLOATS,
    KILN_ATTR_INTS,
    KILN_ATTR_STRINGS,
};

struct kiln_graph;

struct kiln_attr {
    const char *name;
    enum kiln_attr_type type;
    float f;
    int64_t i;
    kiln_string s;          /* STRING */
    kiln_tensor *t;         /* TENSOR (owned by the graph) */
    struct kiln_graph *g;   /* GRAPH */
    int n;                  /* element count of FLOATS / INTS / STRINGS */
    float *floats;
    int64_t *ints;
    kiln_string *strings;
};

enum kiln_value_kind {
    KILN_VALUE_NODE = 0,  /* produced by a node */
    KILN_VALUE_INPUT,     /* a graph input */
    KILN_VALUE_CONST,     /* an initializer or folded constant */
    KILN_VALUE_OUTER,     /* captured from the enclosing graph */
};

struct kiln_value {
    const char *name;
    enum kiln_value_kind kind;
    struct kiln_type type;
    kiln_tensor *konst;  /* CONST: the value (graph-owned unless borrowed) */
    int producer;        /* NODE: node index */
    int outer;           /* OUTER: value id in the parent graph */
    int uses;            /* node inputs, subgraph captures and graph outputs reading it */
    int layout;          /* storage of a 4-D f32 NCHW value: 0 = plain, 8 or 16 = channels
                            blocked by that many ([N][ceil(C/b)][H][W][b], zero-padded);
                            KILN_LAYOUT_NHWC (1) = channels last ([N][H][W][C], int8
                            convolution chains: 8-bit values and the float ones between
                            their Q/DQ); set only by the optimizer's layout pass, read by
                            the plan */
};

/* kiln_value.layout of a channels-last value: for storage sizes and the elementwise
 * kernels it is "one block of all C channels" (no padding). */
#define KILN_LAYOUT_NHWC 1

/* Channels a value with c channels stores in layout `layout` (0 = plain: c; 8 or 16: c
 * rounded up to the block, the padding lanes zero). */
static inline int64_t kiln_layout_channels(int64_t c, int layout)
{
    return layout > 0 ? (c + layout - 1) / layout * layout : c;
}

struct kiln_node {
    enum kiln_op op;
    const char *name;     /* may be "" */
    const char *op_type;  /* as written in the model, for messages */
    int opset;            /* opset version of the op's domain */
    int n_in;
    int *in;              /* value ids, -1 = absent */
    int n_out;
    int *out;             /* value ids, -1 = absent */
    int n_attr;
    struct kiln_attr *attr;
    int n_implicit;       /* values of this graph its subgraphs capture (set by the verifier) */
    int *implicit;
};

struct kiln_graph {
    struct kiln_arena arena;     /* used only by the root graph */
    struct kiln_arena *mem;      /* the root's arena, for every allocation */
    struct kiln_graph *parent;   /* enclosing graph of a subgraph */
    const char *name;
    int n_values, cap_values;
    struct kiln_value *values;
    int n_nodes, cap_nodes;
    struct kiln_node *nodes;
    int n_inputs;
    int *inputs;                 /* value ids of graph inputs */
    int n_outputs;
    int *outputs;                /* value ids of graph outputs */
    int *order;                  /* topological order of nodes (set by the verifier) */
    kiln_tensor **owned;         /* tensors freed with the graph */
    int n_owned, cap_owned;
    int borrows_subgraphs;       /* a clone: subgraphs belong to the original */
};

kiln_status kiln_graph_new(struct kiln_graph **out);
/* A subgraph sharing the root's arena; freed with the root. */
kiln_status kiln_graph_new_sub(struct kiln_graph *parent, struct kiln_graph **out);
void kiln_graph_free(struct kiln_graph *g);
/* Free what a subgraph holds outside the arena when no node attribute holds
 * it (one abandoned on an error path); it is left empty. */
void kiln_graph_free_sub(struct kiln_graph *g);
/* A new root graph with the same values (same ids), nodes and inputs and
 * outputs as root graph g, for the optimizer to rewrite. Node arrays and
 * attribute arrays are copied; names, attribute data, constants and
 * subgraphs are borrowed from g, which must outlive the clone. */
kiln_status kiln_graph_clone(const struct kiln_graph *g, struct kiln_graph **out);
/* Set read[v] = 1 for every value v of g that a node reads (inputs, implicit inputs, the
 * outer values its subgraphs capture) or that is a graph output; read has n_values bytes. */
void kiln_graph_mark_reads(const struct kiln_graph *g, uint8_t *read);

/* Add a value; returns its id in *id. The name is copied. */
kiln_status kiln_graph_value_add(struct kiln_graph *g, const char *name, enum kiln_value_kind kind,
                                 int *id);
/* Find a value by name in this graph only; -1 if absent. Linear; for import use a map. */
int kiln_graph_value_find(const struct kiln_graph *g, const char *name);
/* Add a node; the node's arrays are allocated with the given sizes, ids -1. */
kiln_status kiln_graph_node_add(struct kiln_graph *g, enum kiln_op op, const char *name, int n_in,
                                int n_out, int n_attr, struct kiln_node **out);
/* Take ownership of a tensor (freed with the graph). */
kiln_status kiln_graph_own_tensor(struct kiln_graph *g, kiln_tensor *t);

/* Attribute lookup on a node: NULL if absent. */
const struct kiln_attr *kiln_node_attr(const struct kiln_node *n, const char *name);

/* Verify: every input defined, no cycle, arity matches the op table; sets
 * g->order and value use counts. Recurses into subgraphs. */
kiln_status kiln_graph_verify(struct kiln_graph *g);

/* Node error with the standard prefix "<op> node '<name>': ". */
kiln_status kiln_node_error(const struct kiln_node *n, kiln_status st, const char *fmt, ...)
    KILN_PRINTF(3, 4);

#endif
