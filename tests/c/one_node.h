/*
 * one_node.h - a graph of one node for kernel tests (unit_lowp.c, unit_sparse.c): the test
 * fills g->nodes[0] and adds its inputs (a graph input, or a constant the graph owns) and
 * attributes with these helpers; in[] keeps the input tensors for the test's reference.
 */
#ifndef KILN_TEST_ONE_NODE_H
#define KILN_TEST_ONE_NODE_H

#include <stdlib.h>

#include "kernels/kernel.h"
#include "kiln/kiln.h"

struct one_node {
    struct kiln_graph *g;
    kiln_tensor *in[4];
    int n_in;
};

/* Input i of the node: x (taken over by the graph), a constant when konst. */
static void add_in(struct one_node *t, int i, kiln_tensor *x, int konst)
{
    int id;
    if (kiln_graph_value_add(t->g, konst ? "w" : "x", konst ? KILN_VALUE_CONST : KILN_VALUE_INPUT,
                             &id) != KILN_OK)
        abort();
    kiln_graph_own_tensor(t->g, x);
    kiln_type_from_tensor(&t->g->values[id].type, x);
    if (konst) t->g->values[id].konst = x;
    t->g->nodes[0].in[i] = id;
    t->in[i] = x;
}

/* A new attribute of the node (the caller sets its value). */
static struct kiln_attr *add_attr(struct one_node *t, const char *name, enum kiln_attr_type type)
{
    struct kiln_node *n = &t->g->nodes[0];
    struct kiln_attr *a = &n->attr[n->n_attr++];
    a->name = kiln_arena_strdup(t->g->mem, name);
    a->type = type;
    return a;
}

#endif
