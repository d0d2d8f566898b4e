/*
 * plan_internal.h - what plan.c and plan_control.c (control flow on plans) share:
 * the plan's structures and the few functions each calls in the other. Not part of
 * the runtime's interface (plan.h is).
 */
#ifndef KILN_EXEC_PLAN_INTERNAL_H
#define KILN_EXEC_PLAN_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "exec/exec.h"
#include "exec/plan.h"

enum slot_kind { SLOT_NONE = 0, SLOT_CONST, SLOT_INPUT, SLOT_OUTPUT, SLOT_ARENA, SLOT_ALIAS };

struct slot {
    enum slot_kind kind;
    struct kiln_type type;
    int layout;
    size_t bytes;
    const kiln_tensor *konst; /* CONST */
    int input_index;          /* INPUT */
    int alias_of;             /* ALIAS: the root slot (never itself an alias) */
    size_t alias_off;         /* ALIAS: byte offset into the root (a Concat input's slice) */
    int64_t host_c;           /* ALIAS: > 0 when a strided channel slice of the root (batch
                                 > 1): the root's stored channels, one image's row apart */
    int buf;                  /* ARENA: buffer index */
    int def_step;             /* step that writes it (-1: before the run) */
    int last_use;             /* last step that reads it (INT32_MAX: a graph output) */
};

struct buffer {
    size_t bytes, off;
    int first, last;
};

struct step {
    const struct kiln_node *node;
    const struct kiln_op_impl *ref;
    struct kiln_kernel_inst inst;
    int n_in, n_out;
    int *in;   /* slot ids (-1 absent) */
    int *out;  /* slot ids */
    int scratch_buf; /* buffer index or -1 */
    unsigned char *elided; /* per input: 1 = already in place (a Concat's input written
                              into its slice of the output): the kernel gets NULL */
    int lane;          /* in a lanes segment: the lane (thread) that runs it; else -1 */
    int reads_concat;  /* 1: a Concat's reader that reads the Concat's inputs instead
                          (Concat folded into its reader): in[] are those inputs */
    _Atomic int64_t ns;
    _Atomic int64_t calls;
};

/* Steps [begin, end) that run as `lanes` independent chains side by side, one thread
 * each (plan_lanes); a segment with lanes == 1 runs in order on every granted thread. */
struct lane_seg {
    int begin, end, lanes;
};

struct arena_inst {
    struct arena_inst *next;     /* free list */
    struct arena_inst *all_next; /* every instance, for kiln_plan_free */
    void *mem;
    kiln_tensor *t;      /* one header per slot */
    kiln_tensor **tp;    /* the tensor each slot reads */
};

struct kiln_plan {
    const struct kiln_graph *g;
    int n_slots, cap_slots;
    struct slot *slots;
    int n_steps;
    struct step *steps;
    int n_bufs, cap_bufs;
    struct buffer *bufs;
    size_t arena_bytes;
    size_t max_value_bytes;
    kiln_tensor **folded;
    int n_folded, cap_folded;
    int n_fast;
    int concat_removed;       /* Concat steps with every input written in place */
    int concat_inputs_elided; /* Concat inputs written in place (copies avoided) */
    int concat_inputs;        /* Concat inputs in all (present ones) */
    int concat_inputs_strided; /* of the elided: strided channel slices (batch > 1) */
    int concat_folded;        /* Concat steps folded into their per-channel reader */
    char *fallbacks;          /* lines naming steps on oneDNN's reference or generic code */
    size_t fallbacks_len;
    _Atomic int prof_threads; /* most threads a profiled run was granted */
    struct lane_seg *segs;    /* NULL: every step in order (no lanes) */
    int n_segs;
    int lane_steps;           /* steps that run in lanes */
    pthread_mutex_t mu;
    struct arena_inst *free_list;
    struct arena_inst *all;
    /* cache key */
    int n_in;
    struct kiln_type *in_types;
    /* a body's plan (control flow, below): the values of the enclosing graph it reads
     * at run time, as inputs n_in.. of its runs (parent value ids) */
    int n_caps;
    int *cap_outer;
    int depth; /* subgraph nesting: 0 for a graph's own plan */
    unsigned char *donate; /* per graph input, or NULL: 1 = the caller hands the tensor over
                              (a Loop's carried values): steps may write over it, and an
                              output on its memory is handed back as that same tensor */
    /* body plans the compile of the top plan may still make (nested loops whose carried
     * shapes change would otherwise compile up to 32^depth): the top plan's
     * bodies_left_own, which every body plan compiled under it points at while compiling */
    int *bodies_left;
    int bodies_left_own;
};

/* Body plans one top-level compile may make, all bodies and nesting levels together;
 * beyond, the compile is unsupported and the graph runs on the reference executor. */
#define PLAN_MAX_BODY_PLANS 256


/* What compiling a step again needs (plan_compile's arguments). */
struct recompile_env {
    struct kiln_weight_cache *weights;
    int threads, precision;
    const struct kiln_plan_node_prec *ov;
    int n_ov;
};


/* The root slot of s (following aliases). */
int kiln_plan_root_of(const struct kiln_plan *p, int s);
/* KILN_ERR_UNSUPPORTED naming node n (or the graph) and why it cannot be planned. */
kiln_status kiln_plan_unsupported(const struct kiln_node *n, const char *why);
/* Compile g for these input types. donate: per input, 1 = the runs' caller hands the
 * tensor over (a Loop's carried values), or NULL; parent: the plan being compiled whose
 * node has g as a body (its values are g's captures), or NULL; depth: body nesting. */
kiln_status kiln_plan_compile_typed(const struct kiln_graph *g, const struct kiln_type *in_types,
                                    const unsigned char *donate, const struct kiln_plan *parent,
                                    int depth, struct kiln_weight_cache *weights, int threads,
                                    int precision, const struct kiln_plan_node_prec *ov, int n_ov,
                                    struct kiln_plan **out);
/* Run on `granted` threads already leased. inputs: the graph's, then a body's captures;
 * parent: the enclosing run's frame (NULL at the top); preset: per graph output, a tensor
 * of its type to write it into (handed back as the output), or NULL. */
kiln_status kiln_plan_run_in(struct kiln_plan *p, kiln_tensor *const *inputs,
                             kiln_tensor **outputs, int granted, const kiln_run_options *ro,
                             int prof, struct kiln_exec_frame *parent, kiln_tensor *const *preset);

/* plan_control.c: compile control-flow node n (Loop, If, Scan) of plan p into a kernel
 * instance whose run runs its bodies' plans; outtype receives its output types. */
kiln_status kiln_plan_control_compile(struct kiln_plan *p, const struct kiln_node *n,
                                      const struct kiln_type *const *inp, kiln_tensor *const *inv,
                                      const struct recompile_env *env, struct kiln_type *outtype,
                                      struct kiln_kernel_inst *inst);
/* The body plans of a control step's instance (0 for any other instance), and each. */
int kiln_plan_control_bodies(const struct kiln_kernel_inst *inst);
struct kiln_plan *kiln_plan_control_body(const struct kiln_kernel_inst *inst, int i);

#endif
