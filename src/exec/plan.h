/*
 * plan.h - plans: a graph compiled for one set of concrete input shapes.
 *
 * Compiling a plan walks the (optimized) graph once with the concrete
 * input types: every node's output shape is inferred, nodes whose inputs
 * are all known at compile time (shape computations, Shape of a value of
 * known shape) are evaluated then and become constants of the plan, every
 * other node gets its fast kernel compiled (kernels/fast.h) or falls back
 * to its reference kernel, and every intermediate value gets an offset in
 * one arena, assigned from value lifetimes so that values whose lifetimes
 * do not overlap share memory (elementwise kernels may also write over
 * their input, and a Concat's producers may write straight into their
 * slices of its output, which removes the Concat's copies). Running a plan allocates nothing but the outputs it hands
 * to the caller (an arena instance is reused from a free list; one is
 * added only when more runs than ever before run at once); oneDNN's execute
 * call makes a few small allocations of its own. tests/c/unit_opt.c counts.
 *
 * Loop, If and Scan nodes are steps that run plans of their bodies, compiled for
 * the bodies' concrete input types (plan_control.c): one per
 * distinct set of loop-carried types, captured values as constants or extra
 * inputs. Graphs a plan cannot express (strings, sequences, outputs
 * whose shape depends on data, a loop whose output shapes do) make compile
 * return KILN_ERR_UNSUPPORTED; the caller then runs the reference executor.
 *
 * A plan cache (per model signature) keeps the most recently used plans,
 * keyed by the input shapes, bounded in count.
 */
#ifndef KILN_EXEC_PLAN_H
#define KILN_EXEC_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "ir/graph.h"
#include "kernels/fast.h"
#include "kiln/kiln.h"
#include "kiln/kiln_util.h"

struct kiln_plan;

/* Compile g for these inputs (one per graph input, in order; only their
 * types are read). */
kiln_status kiln_plan_compile(const struct kiln_graph *g, const kiln_tensor *const *inputs,
                              struct kiln_weight_cache *weights, int threads,
                              struct kiln_plan **out);
/* The same, asking the fast kernels for a kiln_precision (0 = fp32). */
kiln_status kiln_plan_compile_precision(const struct kiln_graph *g,
                                        const kiln_tensor *const *inputs,
                                        struct kiln_weight_cache *weights, int threads,
                                        int precision, struct kiln_plan **out);
void kiln_plan_free(struct kiln_plan *p);

/* Run: inputs as for compile (same shapes); outputs[i] receives an owned
 * tensor per graph output. */
kiln_status kiln_plan_run(struct kiln_plan *p, kiln_tensor *const *inputs, kiln_tensor **outputs,
                          int threads, const kiln_run_options *ro);
/* kiln_plan_run that also times every step when `profile` is non-zero (as well as when
 * profiling is on for the whole process). */
kiln_status kiln_plan_run_profiled(struct kiln_plan *p, kiln_tensor *const *inputs,
                                   kiln_tensor **outputs, int threads,
                                   const kiln_run_options *ro, int profile);

size_t kiln_plan_arena_bytes(const struct kiln_plan *p);
/* Largest single value (intermediate or output) a run makes. */
size_t kiln_plan_max_value_bytes(const struct kiln_plan *p);
int kiln_plan_fast_steps(const struct kiln_plan *p);
int kiln_plan_steps(const struct kiln_plan *p);
/* Steps that run side by side in lanes (independent chains, one thread each; plan.c). */
int kiln_plan_lane_steps(const struct kiln_plan *p);
/* Concat steps removed because every input is in place (Concat in place), and Concat
 * steps folded into their per-channel reader (which reads the inputs instead; plan.c). */
int kiln_plan_concat_removed(const struct kiln_plan *p);
int kiln_plan_concat_folded(const struct kiln_plan *p);

/* Profiling: when enabled (KILN_PROFILE=1 in the environment or
 * kiln_plan_profile_enable), each plan accumulates the time of every
 * step; kiln_plan_profile_print writes the per-op totals, slowest first,
 * with the work and rate of the ops made of products. Its first call per
 * thread count measures the FMA peak (about 0.1 s of every thread of the
 * pool, outside any run's lease: print when no run is going on). */
/* kiln_plan_profile_enable(on): include/kiln/kiln_util.h. */
void kiln_plan_profile_print(const struct kiln_plan *p, FILE *f);

/* ---- cache ---- */
struct kiln_plan_cache;
kiln_status kiln_plan_cache_new(int capacity, struct kiln_plan_cache **out);
void kiln_plan_cache_free(struct kiln_plan_cache *c);
/* The kiln_precision this cache's plans are compiled for (set once, before use). */
void kiln_plan_cache_set_precision(struct kiln_plan_cache *c, int precision);
/* Per-node exceptions to that precision (kiln_session_set_node_precision): a node
 * of the graph whose name is listed is compiled in the listed kiln_precision.
 * Copied; set once, before use. */
#define KILN_NODE_PRECISION_ATTR "_kiln_precision" /* INT kiln_precision on a graph node */
struct kiln_plan_node_prec {
    char *node;       /* node name in the graph the cache's plans are compiled from */
    int precision;    /* kiln_precision */
};
kiln_status kiln_plan_cache_set_node_precisions(struct kiln_plan_cache *c,
                                                const struct kiln_plan_node_prec *ov, int n);
/* The plan for these inputs' shapes, compiled on a miss. The plan stays
 * valid until kiln_plan_cache_release; *out may be NULL with KILN_OK never.
 * KILN_ERR_UNSUPPORTED means the graph cannot be planned (cached too, so
 * the next call fails fast). max_value_bytes > 0 bounds a compile on a miss:
 * a step whose output would need more bytes fails with KILN_ERR_OUT_OF_MEMORY
 * (not cached) before any kernel is built for it, so a hostile batch size
 * cannot make oneDNN build primitives for terabytes. */
kiln_status kiln_plan_cache_get(struct kiln_plan_cache *c, const struct kiln_graph *g,
                                const kiln_tensor *const *inputs, struct kiln_weight_cache *w,
                                int threads, int64_t max_value_bytes, struct kiln_plan **out);
void kiln_plan_cache_release(struct kiln_plan_cache *c, struct kiln_plan *p);
/* Print the profile of every cached plan. */
void kiln_plan_cache_profile_print(struct kiln_plan_cache *c, FILE *f);
/* The timed steps (calls > 0) of the cached plans, read with atomic loads, so runs may go
 * on meanwhile (each step's ns and calls are each consistent; a run in flight may have
 * counted some of its steps and not yet others). Strings are borrowed: copy them. */
struct kiln_plan_step_profile {
    int plan, step;      /* index of the plan among the cached ones, and of the step */
    const char *node;    /* "" when the node has no name */
    const char *op, *kernel; /* kernel: the fast kernel's name, or "reference" */
    int64_t ns, calls;
    double flops;        /* per call; 0 where not counted */
};
void kiln_plan_cache_profile_steps(struct kiln_plan_cache *c,
                                   void (*fn)(void *ctx, const struct kiln_plan_step_profile *s),
                                   void *ctx);
/* Zero the time and call counts of every cached plan's steps. */
void kiln_plan_cache_profile_reset(struct kiln_plan_cache *c);
/* The cached plans: how many, and the steps, fast steps and arena bytes of the
 * one with the largest arena. */
void kiln_plan_cache_summary(struct kiln_plan_cache *c, int *plans, int *steps, int *fast,
                             size_t *arena);
/* Why the most recently asked-for inputs that could not be planned could not (the
 * compile's message), or "" when every cached entry has a plan. */
void kiln_plan_cache_why_none(struct kiln_plan_cache *c, char *buf, size_t n);
/* The share of the profiled time (kiln_plan_profile_enable) that the cached plans spent on
 * reference code: Kiln's reference kernels, and fast kernels whose oneDNN primitive runs
 * oneDNN's reference implementation ("ref:..."). -1 when nothing was profiled. */
double kiln_plan_cache_reference_share(struct kiln_plan_cache *c);
/* One line per step of the cached plans whose oneDNN primitive is a reference or generic
 * fallback (its implementation, node, op and shapes), as checked when the plan compiled. */
void kiln_plan_cache_fallbacks(struct kiln_plan_cache *c, void (*line)(void *ctx, const char *s),
                               void *ctx);

/* One line per cached plan that has Concats: how many of their inputs the plan has
 * their producers write straight into the output (copies avoided), how many
 * Concat steps were removed for it (every input in place), and how many were folded
 * into their per-channel reader (the Concat's output never stored). */
void kiln_plan_cache_concat_lines(struct kiln_plan_cache *c,
                                  void (*line)(void *ctx, const char *s), void *ctx);

#endif
