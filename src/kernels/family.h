/*
 * family.h - kernel families: several fast kernels per op, declared in one
 * list per family, from which the fast-kernel table, the choice of a
 * kernel and the differential test cases are all generated.
 *
 * A family's list is an X-macro file (src/kernels/simd/elementwise.def,
 * copy.def, norm.def): one line per kernel,
 *
 *     KILN_KERNEL(Op, name, ISA, priority, covers, compile, accepts, packs, cases)
 *
 *   Op        the ONNX / Kiln op (ir/ops.def) the kernel runs;
 *   name      the kernel's unique name (an identifier: f32_relu_avx512);
 *   ISA       what the CPU must have: SCALAR, AVX2, AVX512, AVX512_BF16, VNNI,
 *             INT8_DOT (int8 dot products of any width: AVX-512 VNNI, AVX-VNNI
 *             or AMX; for oneDNN's int8 kernels, which pick their own ISA and
 *             KILN_ISA does not lower);
 *   priority  the choice order among the op's kernels (higher first);
 *   covers    bool covers(cc): the cheap test of the node's types, shapes and
 *             attributes that the kernel handles (kiln_k_covers_all: any);
 *   compile   the kernel's kiln_fast_compile_fn (fast.h); it may still
 *             decline (run left NULL) what covers let through;
 *   accepts   the layout pass's question (kiln_fast_op.accepts_blocked;
 *             kiln_k_accepts_none: never);
 *   packs     bits of constant inputs compile packs through the weight cache;
 *   cases     the test case generator (tests/c/kernel_cases.h defines
 *             kcase_<cases>); several kernels may share one.
 *
 * KILN_KERNEL_SIMD(Op, stem, priority, covers, accepts, cases) declares the
 * three kernels of one op on the SIMD tables (simd.h): f32_<stem>_avx512,
 * _avx2 and _scalar, compiled by kiln_k_<stem>_avx512 / _avx2 / _scalar.
 *
 * The list is included three times: by src/kernels/families.c to build the
 * table, by the family's source files (KILN_KERNEL_DECLARE below) to
 * declare the functions they define, and by tests/c/unit_kernels.c to pair
 * every kernel with its case generator, so a kernel whose generator does
 * not exist does not build. unit_kernels then runs every generator's cases
 * on every kernel of the case's op, forced (not only the one the choice
 * picks), against the reference kernel, and fails a kernel that took none
 * of them; a kernel whose ISA this CPU lacks is reported as skipped.
 *
 * The choice (kiln_kernel_choose): among the op's kernels, by descending
 * priority, the first whose ISA this CPU has (kiln_cpu_isa, lowered by
 * KILN_ISA), whose covers holds and whose compile takes the node. Each
 * family's order is therefore read off its list, in one place.
 */
#ifndef KILN_KERNELS_FAMILY_H
#define KILN_KERNELS_FAMILY_H

#include <stdbool.h>

#include "kernels/fast.h"

enum kiln_kernel_isa {
    KILN_KISA_SCALAR = 0, /* plain C: every CPU */
    KILN_KISA_AVX2,
    KILN_KISA_AVX512,
    KILN_KISA_AVX512_BF16, /* AVX-512 with the bf16 dot products */
    KILN_KISA_VNNI,        /* AVX-512 with VNNI int8 dot products */
    KILN_KISA_INT8_DOT,    /* AVX-512 VNNI, AVX-VNNI or AMX-INT8 (whatever KILN_ISA says) */
};

typedef bool (*kiln_kernel_covers_fn)(const struct kiln_compile_ctx *cc);
typedef int (*kiln_kernel_accepts_fn)(const struct kiln_node *n, int i, int block);

struct kiln_kernel_def {
    const char *name;
    const char *family;
    enum kiln_op op;
    enum kiln_kernel_isa isa;
    int priority;
    kiln_kernel_covers_fn covers;
    kiln_fast_compile_fn compile;
    kiln_kernel_accepts_fn accepts;
    unsigned packs;
};

/* Every kernel of every family (the families of families.c, in list order). */
const struct kiln_kernel_def *kiln_kernels(int *n);
/* The number of kernels of op (0: the op has no family; fast.c's table then). */
int kiln_kernels_of_op(enum kiln_op op);
/* Whether this CPU runs kernels of isa (KILN_ISA lowers it, as kiln_cpu_isa). */
bool kiln_kernel_isa_ok(enum kiln_kernel_isa isa);
const char *kiln_kernel_isa_name(enum kiln_kernel_isa isa);

/* Compile exactly kernel k for the node (tests force each kernel this way):
 * declined (run NULL) when the CPU lacks its ISA or covers is false. */
kiln_status kiln_kernel_compile(const struct kiln_kernel_def *k, const struct kiln_compile_ctx *cc,
                                struct kiln_kernel_inst *inst);
/* The choice function: the op's kernels by priority (see above). */
kiln_status kiln_kernel_choose(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst);
/* The layout pass's question for an op with a family: whether any of its
 * kernels this CPU runs accepts the blocked input (or output, i = -1). */
int kiln_kernel_accepts_blocked(const struct kiln_node *n, int i, int block);

/* The fast-kernel entry (fast.h) of an op with a family: compile is
 * kiln_kernel_choose; NULL for an op without one. */
const struct kiln_fast_op *kiln_kernel_fast_op(enum kiln_op op);

/* Defaults for the covers and accepts columns. */
bool kiln_k_covers_all(const struct kiln_compile_ctx *cc);
int kiln_k_accepts_none(const struct kiln_node *n, int i, int block);

/* A family source file declares what it defines with
 *     #define KILN_KERNEL KILN_KERNEL_DECLARE
 *     #include "kernels/simd/<family>.def"
 *     #undef KILN_KERNEL
 * (signatures checked against the definitions). */
#define KILN_KERNEL_DECLARE(op, name, isa, prio, covers, compile, accepts, packs, cases)      \
    bool covers(const struct kiln_compile_ctx *cc);                                           \
    kiln_status compile(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst);    \
    int accepts(const struct kiln_node *n, int i, int block);

#define KILN_KERNEL_SIMD(op, stem, prio, covers, accepts, cases)                               \
    KILN_KERNEL(op, f32_##stem##_avx512, AVX512, (prio) + 2, covers, kiln_k_##stem##_avx512,  \
                accepts, 0, cases)                                                            \
    KILN_KERNEL(op, f32_##stem##_avx2, AVX2, (prio) + 1, covers, kiln_k_##stem##_avx2,        \
                accepts, 0, cases)                                                            \
    KILN_KERNEL(op, f32_##stem##_scalar, SCALAR, prio, covers, kiln_k_##stem##_scalar,        \
                accepts, 0, cases)

#endif
