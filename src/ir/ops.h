/*
 * ops.h - the op enum and its facts, generated from ops.def.
 */
#ifndef KILN_IR_OPS_H
#define KILN_IR_OPS_H

#include <stdint.h>

#define KILN_VARIADIC 0x7fff

enum kiln_op_flags {
    KILN_OPF_ELEM = 1 << 0,     /* elementwise, numpy broadcasting */
    KILN_OPF_SHAPE = 1 << 1,    /* output shape depends on input values */
    KILN_OPF_DYNOUT = 1 << 2,   /* kernel allocates its own outputs */
    KILN_OPF_SUBGRAPH = 1 << 3, /* carries graph attributes */
    KILN_OPF_INTERNAL = 1 << 4, /* Kiln-only op: never matched by an ONNX op_type */
    KILN_OPF_STATEFUL = 1 << 5, /* reads or writes model state: never folded, merged or
                                   evaluated ahead of the run */
    KILN_OPF_ONNXML = 1 << 8,   /* an op of the ai.onnx.ml domain (docs/TABULAR.md) */
    KILN_OPF_SEQ = 1 << 12,     /* takes or makes sequence / optional values (docs/SEQUENCES.md) */
};

enum kiln_op {
#define KILN_OP(name, mi, ma, mo, mao, fl) KILN_OP_##name,
#include "ir/ops.def"
#undef KILN_OP
    KILN_OP_COUNT
};

struct kiln_op_info {
    const char *name;
    int min_inputs, max_inputs;
    int min_outputs, max_outputs;
    unsigned flags;
};

const struct kiln_op_info *kiln_op_info(enum kiln_op op);
const char *kiln_op_name(enum kiln_op op);
/* Look up an op by name; returns KILN_OP_COUNT if unknown. */
enum kiln_op kiln_op_find(const char *name);

#endif
