/*
 * families.c - the kernel table generated from the family lists
 * (family.h), the choice of a kernel, and the fast-kernel entries of the
 * ops that have a family (fast.c asks kiln_kernel_fast_op first).
 *
 * A family is added here (both includes) and in tests/c/unit_kernels.c,
 * which checks that it pairs a case generator with every kernel listed here.
 */
#include "kernels/family.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>

#include "core/threadpool.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/dnnl/conv.def"
#include "kernels/dnnl/deconv.def"
#include "kernels/dnnl/matmul.def"
#include "kernels/dnnl/pool.def"
#include "kernels/dnnl/qlinear.def"
#include "kernels/simd/attention.def"
#include "kernels/simd/copy.def"
#include "kernels/simd/elementwise.def"
#include "kernels/simd/norm.def"
#include "kernels/simd/quant8.def"
#include "kernels/simd/reduce.def"
#include "kernels/trees.def"
#undef KILN_KERNEL

#define KILN_KERNEL(op, name, isa, prio, covers, compile, accepts, packs, cases) \
    {#name, FAMILY, KILN_OP_##op, KILN_KISA_##isa, prio, covers, compile, accepts, packs},

static const struct kiln_kernel_def all_kernels[] = {
#define FAMILY "conv"
#include "kernels/dnnl/conv.def"
#undef FAMILY
#define FAMILY "deconv"
#include "kernels/dnnl/deconv.def"
#undef FAMILY
#define FAMILY "matmul"
#include "kernels/dnnl/matmul.def"
#undef FAMILY
#define FAMILY "pool"
#include "kernels/dnnl/pool.def"
#undef FAMILY
#define FAMILY "quant"
#include "kernels/dnnl/qlinear.def"
#undef FAMILY
#define FAMILY "attention"
#include "kernels/simd/attention.def"
#undef FAMILY
#define FAMILY "copy"
#include "kernels/simd/copy.def"
#undef FAMILY
#define FAMILY "elementwise"
#include "kernels/simd/elementwise.def"
#undef FAMILY
#define FAMILY "norm"
#include "kernels/simd/norm.def"
#undef FAMILY
#define FAMILY "quant8"
#include "kernels/simd/quant8.def"
#undef FAMILY
#define FAMILY "reduce"
#include "kernels/simd/reduce.def"
#undef FAMILY
#define FAMILY "trees"
#include "kernels/trees.def"
#undef FAMILY
};
#undef KILN_KERNEL

#define N_KERNELS (int)(sizeof all_kernels / sizeof all_kernels[0])

/* Per op: its kernels by descending priority (list order among equals). */
static const struct kiln_kernel_def *by_op[N_KERNELS];
static int op_first[KILN_OP_COUNT], op_count[KILN_OP_COUNT];
static struct kiln_fast_op family_ops[KILN_OP_COUNT];
static pthread_once_t index_once = PTHREAD_ONCE_INIT;

static void build_index(void)
{
    int at = 0;
    for (int op = 0; op < KILN_OP_COUNT; op++) {
        op_first[op] = at;
        for (int i = 0; i < N_KERNELS; i++) {
            const struct kiln_kernel_def *k = &all_kernels[i];
            if ((int)k->op != op) continue;
            int j = at++; /* insertion: stable, highest priority first */
            while (j > op_first[op] && by_op[j - 1]->priority < k->priority) {
                by_op[j] = by_op[j - 1];
                j--;
            }
            by_op[j] = k;
            family_ops[op].packs |= k->packs;
        }
        op_count[op] = at - op_first[op];
        if (op_count[op]) {
            family_ops[op].compile = kiln_kernel_choose;
            family_ops[op].accepts_blocked = kiln_kernel_accepts_blocked;
        }
    }
}

static void index_ready(void)
{
    pthread_once(&index_once, build_index);
}

const struct kiln_kernel_def *kiln_kernels(int *n)
{
    *n = N_KERNELS;
    return all_kernels;
}

int kiln_kernels_of_op(enum kiln_op op)
{
    if ((unsigned)op >= KILN_OP_COUNT) return 0;
    index_ready();
    return op_count[op];
}

const struct kiln_fast_op *kiln_kernel_fast_op(enum kiln_op op)
{
    return kiln_kernels_of_op(op) ? &family_ops[op] : NULL;
}

/* AVX-512 VNNI, AVX-VNNI or AMX-INT8 (CPUID leaf 7). */
static bool cpu_int8_dot(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if ((c >> 11) & 1 || (d >> 25) & 1) return true; /* avx512_vnni, amx_int8 */
    unsigned max_sub = a;
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) return (a >> 4) & 1; /* avx_vnni */
    return false;
}

bool kiln_kernel_isa_ok(enum kiln_kernel_isa isa)
{
    enum kiln_isa cpu = kiln_cpu_isa();
    switch (isa) {
    case KILN_KISA_SCALAR: return true;
    case KILN_KISA_AVX2: return cpu >= KILN_ISA_AVX2;
    case KILN_KISA_AVX512: return cpu >= KILN_ISA_AVX512;
    case KILN_KISA_AVX512_BF16:
        return cpu >= KILN_ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
    case KILN_KISA_VNNI: return cpu >= KILN_ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
    case KILN_KISA_INT8_DOT: return cpu_int8_dot();
    }
    return false;
}

const char *kiln_kernel_isa_name(enum kiln_kernel_isa isa)
{
    switch (isa) {
    case KILN_KISA_SCALAR: return "scalar";
    case KILN_KISA_AVX2: return "avx2";
    case KILN_KISA_AVX512: return "avx512";
    case KILN_KISA_AVX512_BF16: return "avx512_bf16";
    case KILN_KISA_VNNI: return "vnni";
    case KILN_KISA_INT8_DOT: return "int8_dot";
    }
    return "?";
}

bool kiln_k_covers_all(const struct kiln_compile_ctx *cc)
{
    (void)cc;
    return true;
}

int kiln_k_accepts_none(const struct kiln_node *n, int i, int block)
{
    (void)n, (void)i, (void)block;
    return 0;
}

kiln_status kiln_kernel_compile(const struct kiln_kernel_def *k, const struct kiln_compile_ctx *cc,
                                struct kiln_kernel_inst *inst)
{
    if (k->op != cc->node->op || !kiln_kernel_isa_ok(k->isa) || !k->covers(cc)) return KILN_OK;
    kiln_status st = k->compile(cc, inst);
    if (st == KILN_OK && !inst->run) kiln_kernel_inst_destroy(inst); /* declined: nothing kept */
    return st;
}

kiln_status kiln_kernel_choose(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *inst)
{
    enum kiln_op op = cc->node->op;
    int n = kiln_kernels_of_op(op);
    for (int i = 0; i < n; i++) {
        kiln_status st = kiln_kernel_compile(by_op[op_first[op] + i], cc, inst);
        if (st != KILN_OK || inst->run) return st;
    }
    return KILN_OK;
}

int kiln_kernel_accepts_blocked(const struct kiln_node *n, int i, int block)
{
    int cnt = kiln_kernels_of_op(n->op);
    for (int k = 0; k < cnt; k++) {
        const struct kiln_kernel_def *d = by_op[op_first[n->op] + k];
        if (kiln_kernel_isa_ok(d->isa) && d->accepts(n, i, block)) return 1;
    }
    return 0;
}
