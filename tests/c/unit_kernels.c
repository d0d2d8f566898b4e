/*
 * unit_kernels.c - every kernel of every kernel family (src/kernels/family.h)
 * against the reference kernels, from the families' own lists.
 *
 * The lists (dnnl/conv.def, deconv.def, matmul.def, pool.def, qlinear.def,
 * simd/attention.def, copy.def, elementwise.def, norm.def, quant8.def, reduce.def, trees.def) are
 * included here as in
 * src/kernels/families.c: each kernel is paired with the generator its
 * `cases` column names (kcase_<cases>, kernel_cases.h), so a kernel listed
 * without one does not build; the pairs must match the library's table
 * (kiln_kernels) one for one, so a family left out here fails.
 *
 * Each generator runs once. Every case runs through the reference kernel,
 * the op's choice on every ISA this CPU has, and then every kernel of the
 * op forced (kiln_kernel_compile), whatever the choice would be, so a kernel
 * never chosen on this CPU is tested too; on one thread, two, and in place
 * (kernel_case.h). A kernel that took none of its own generator's cases
 * fails: it would be tested by nothing. A kernel whose ISA this CPU (or
 * KILN_ISA=scalar|avx2 given to the test) lacks is listed as skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_case.h"
#include "kernel_cases.h"

struct kernel_test {
    const char *name;
    const char *cases;
    void (*gen)(void);
};

#define KILN_KERNEL(op, name, isa, prio, covers, compile, accepts, packs, cases) \
    {#name, #cases, kcase_##cases},
static const struct kernel_test tests[] = {
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
};
#undef KILN_KERNEL
#define N_TESTS (int)(sizeof tests / sizeof tests[0])

static const struct kiln_kernel_def *kernels;
static int n_kernels;
static int *took_own, *took_any; /* per kernel: cases it took from its generator, from any */
static void (*running)(void);    /* the generator running now */
static char isa_cap[16];         /* KILN_ISA given to the test: kernels above it are skipped */

/* Whether the forced kernels of isa run (this CPU, lowered by the test's KILN_ISA; the
 * chosen-kernel runs set and clear KILN_ISA themselves). */
static bool isa_ok(enum kiln_kernel_isa isa)
{
    if (isa_cap[0]) setenv("KILN_ISA", isa_cap, 1);
    bool ok = kiln_kernel_isa_ok(isa);
    unsetenv("KILN_ISA");
    return ok;
}

/* check_case_hook: every kernel of the case's op, forced. */
static void each_kernel(struct case_node *c, const char *label, kiln_tensor **want, double rtol,
                        double atol)
{
    for (int k = 0; k < n_kernels; k++) {
        const struct kiln_kernel_def *d = &kernels[k];
        if (d->op != c->node->op || !isa_ok(d->isa)) continue;
        if (case_kernel_prefix && strncmp(d->name, case_kernel_prefix, strlen(case_kernel_prefix)))
            continue;
        forced_kernel = d;
        char what[192];
        snprintf(what, sizeof what, "%s (forced %s)", label, d->name);
        bool took = check_run(c, d->name, what, want, rtol, atol, -1);
        forced_kernel = NULL;
        if (!took) continue;
        took_any[k]++;
        if (tests[k].gen == running) took_own[k]++;
    }
}

int main(void)
{
    int g = kiln_threads_acquire(1);
    const char *cap = getenv("KILN_ISA");
    snprintf(isa_cap, sizeof isa_cap, "%s", cap ? cap : "");
    unsetenv("KILN_ISA");
    kernels = kiln_kernels(&n_kernels);
    printf("cpus %d, isa %s, %d kernels in %d list entries\n", kiln_cpu_count(),
           isa_names[isa_levels() - 1], n_kernels, N_TESTS);
    CHECK(n_kernels == N_TESTS, "the library lists %d kernels, this test %d: include every family",
          n_kernels, N_TESTS);
    if (n_kernels != N_TESTS) {
        kiln_threads_release(g);
        return CHECK_DONE();
    }
    for (int k = 0; k < n_kernels; k++) {
        CHECK(strcmp(kernels[k].name, tests[k].name) == 0, "kernel %d is %s here, %s in the library",
              k, tests[k].name, kernels[k].name);
        for (int j = 0; j < k; j++)
            CHECK(strcmp(kernels[k].name, kernels[j].name) != 0, "kernel %s listed twice",
                  kernels[k].name);
        CHECK(kiln_kernels_of_op(kernels[k].op) > 0 && kiln_fast_op(kernels[k].op) &&
                  kiln_fast_op(kernels[k].op)->compile == kiln_kernel_choose,
              "op %s of kernel %s does not choose among its family", kiln_op_name(kernels[k].op),
              kernels[k].name);
    }
    took_own = calloc((size_t)n_kernels, sizeof *took_own);
    took_any = calloc((size_t)n_kernels, sizeof *took_any);
    if (!took_own || !took_any) abort();
    check_case_hook = each_kernel;
    case_weight_cache = true;
    for (int k = 0; k < N_TESTS; k++) {
        bool ran = false;
        for (int j = 0; j < k && !ran; j++) ran = tests[j].gen == tests[k].gen;
        if (ran) continue;
        printf("cases %s\n", tests[k].cases);
        running = tests[k].gen;
        tests[k].gen();
    }
    running = NULL;
    check_case_hook = NULL;
    int skipped = 0;
    for (int k = 0; k < n_kernels; k++) {
        const struct kiln_kernel_def *d = &kernels[k];
        if (!isa_ok(d->isa)) {
            printf("SKIP (ISA): %s/%s needs %s: not on this CPU, or above KILN_ISA\n", d->family, d->name,
                   kiln_kernel_isa_name(d->isa));
            skipped++;
            continue;
        }
        printf("%-12s %-28s %-7s %5d cases of %s (%d in all)\n", d->family, d->name,
               kiln_kernel_isa_name(d->isa), took_own[k], tests[k].cases, took_any[k]);
        CHECK(took_own[k] > 0, "kernel %s took none of the cases of its generator kcase_%s",
              d->name, tests[k].cases);
    }
    printf("%d kernels tested, %d skipped for their ISA\n", n_kernels - skipped, skipped);
    printf("%d fast-kernel runs in place\n", inplace_runs);
    CHECK(inplace_runs > 100, "only %d in-place runs", inplace_runs);
    free(took_own);
    free(took_any);
    kiln_threads_release(g);
    return CHECK_DONE();
}
