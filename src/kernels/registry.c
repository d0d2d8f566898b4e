/*
 * registry.c - the kernel table, one entry per op in ops.def.
 *
 * Each op family's file defines kiln_impl_<Op> with KILN_REF_OP. The
 * references here are weak so that an op listed in ops.def whose kernel
 * is not written yet links as NULL and is reported as unsupported at load
 * ("no kernel for op X") instead of breaking the build.
 */
#include "kernels/kernel.h"

#define KILN_OP(name, mi, ma, mo, mao, fl) \
    extern const struct kiln_op_impl kiln_impl_##name __attribute__((weak));
#include "ir/ops.def"
#undef KILN_OP

static const struct kiln_op_impl *const impl_table[] = {
#define KILN_OP(name, mi, ma, mo, mao, fl) &kiln_impl_##name,
#include "ir/ops.def"
#undef KILN_OP
};

_Static_assert(sizeof impl_table / sizeof impl_table[0] == KILN_OP_COUNT,
               "impl_table must have one entry per op");

const struct kiln_op_impl *kiln_op_impl(enum kiln_op op)
{
    if ((unsigned)op >= KILN_OP_COUNT) return NULL;
    const struct kiln_op_impl *impl = impl_table[op];
    if (!impl || !impl->run) return NULL;
    return impl;
}
