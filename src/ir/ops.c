/*
 * ops.c - the op table built from ops.def.
 */
#include "ir/ops.h"

#include <string.h>

#define ELEM KILN_OPF_ELEM
#define SHAPE KILN_OPF_SHAPE
#define DYNOUT KILN_OPF_DYNOUT
#define SUBGRAPH KILN_OPF_SUBGRAPH
#define INTERNAL KILN_OPF_INTERNAL
#define STATEFUL KILN_OPF_STATEFUL
#define ONNXML KILN_OPF_ONNXML
#define SEQ KILN_OPF_SEQ

static const struct kiln_op_info op_table[] = {
#define KILN_OP(name, mi, ma, mo, mao, fl) {#name, mi, ma, mo, mao, (unsigned)(fl)},
#include "ir/ops.def"
#undef KILN_OP
};

_Static_assert(sizeof op_table / sizeof op_table[0] == KILN_OP_COUNT,
               "op_table must have one entry per op");

const struct kiln_op_info *kiln_op_info(enum kiln_op op)
{
    return (unsigned)op < KILN_OP_COUNT ? &op_table[op] : NULL;
}

const char *kiln_op_name(enum kiln_op op)
{
    return (unsigned)op < KILN_OP_COUNT ? op_table[op].name : "?";
}

enum kiln_op kiln_op_find(const char *name)
{
    /* linear scan is fine: called once per node at import */
    for (int i = 0; i < KILN_OP_COUNT; i++)
        if (strcmp(op_table[i].name, name) == 0) return (enum kiln_op)i;
    return KILN_OP_COUNT;
}
