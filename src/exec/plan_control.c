/*
 * plan_control.c - Loop, If and Scan on plans (see the comment below, and plan.h).
 */
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "exec/plan.h"
#include "exec/plan_internal.h"

/* ---- control flow ----
 *
 * A Loop, If or Scan node is one step whose kernel runs plans of its bodies (sub-plans), so
 * the rest of the graph stays on plans and the bodies' nodes run on fast kernels too.
 * A body's plan is compiled like any graph's, for the concrete types of its inputs: a
 * Loop body's iteration number (i64 scalar), condition (bool scalar) and loop-carried
 * values; the values it captures from the enclosing graph are constants of the body's
 * plan where they are constants of the enclosing one (so weights are packed once, as
 * anywhere else), and extra inputs of its runs otherwise (the step reads them, which
 * keeps them alive until it ran).
 *
 * Loop: the carried values' types are followed from iteration to iteration, one body
 * plan per distinct set of types (a list that grows, a first iteration that fixes an
 * unknown dim), at most PLAN_LOOP_MAX_SHAPES of them (and PLAN_MAX_BODY_PLANS for all the
 * bodies of a graph, nested ones included), until the types stop changing or
 * the exact trip count is reached. The Loop's output types are then known when either
 * the trip count is exact at compile time (a constant M, the initial condition a
 * constant true or absent, and a body whose condition output is a constant true or its
 * condition input passed through, in every body plan compiled), or the types stop changing by an iteration the loop
 * is known to reach (the first, when the initial condition is a constant true: TF's
 * While lowered to Loop, whose condition is computed in the enclosing graph from folded
 * shapes). Scan outputs need the exact trip count. Anything else (a shape that depends
 * on the iteration number or on data, scan outputs of a loop that may stop early,
 * sequences, strings) makes the compile fail as before, and the graph runs on the
 * reference executor.
 *
 * A Loop's run owns the carried values it passes its body's plan, which is compiled with
 * them donated: a step may write over one (the in-place rule, extended to such inputs), and
 * an output left on its memory is handed back as the same tensor. Each carried value starts
 * on the Loop's planned output memory when the types agree (or a body output made anew is
 * written there, through `preset`), so a fixed-shape loop copies its state once per run.
 *
 * If: a constant condition compiles only the branch it takes; otherwise both, whose
 * outputs must have the same types. Scan (opset 9+) is a Loop over the scan inputs' length,
 * known at compile time: its states are followed like carried values, each iteration's
 * slices copied in and its scan outputs copied out along their axes and directions. The
 * profile shows a Loop or If step with its bodies' time included (kernel loop_plan or
 * if_plan); kiln_plan_profile_print (kiln bench --profile) then prints each body plan
 * that ran, step by step. The per-step API (kiln_session_profile_get) and the reference
 * share list the top-level steps only. */

#define PLAN_LOOP_MAX_SHAPES 32   /* body plans of one Loop (distinct carried types) */
#define PLAN_MAX_DEPTH 16         /* nested bodies planned */
#define PLAN_STR_(x) #x
#define PLAN_STR(x) PLAN_STR_(x)
#define PLAN_LOOP_MAX_ITERATIONS ((int64_t)1 << 24) /* as the reference executor's bound */

struct body_plan {
    struct kiln_plan *plan;
    int *cap_in; /* per capture of the plan: its index in the step's inputs */
};

struct control {
    enum kiln_op op;
    const struct kiln_node *node;
    int n_bodies;
    struct body_plan bodies[PLAN_LOOP_MAX_SHAPES];
    /* Loop */
    int n_carried, n_scan;
    int64_t exact;      /* iterations known at compile time, or -1 */
    /* If: bodies[0] then, bodies[1] else; const_branch 0/1 when the condition was a
     * constant (only that body), else -1 */
    int const_branch;
    /* Scan: states n_carried, scan inputs n_scan_in over len, outputs n_scan */
    int n_scan_in;
    int64_t len;
    int in_axis[KILN_MAX_IO], in_rev[KILN_MAX_IO], out_axis[KILN_MAX_IO], out_rev[KILN_MAX_IO];
    struct kiln_type *out_types;
};

static void control_free(void *state)
{
    struct control *c = state;
    if (!c) return;
    for (int i = 0; i < c->n_bodies; i++) {
        kiln_plan_free(c->bodies[i].plan);
        free(c->bodies[i].cap_in);
    }
    free(c->out_types);
    free(c);
}

static bool same_type(const struct kiln_type *a, const struct kiln_type *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

static const struct kiln_type *plan_output_type(const struct kiln_plan *p, int i)
{
    return &p->slots[p->g->outputs[i]].type;
}

/* Compile body g for in_types (g->n_inputs of them) inside the plan p being compiled,
 * for node n; *bp receives the plan and where its captures are among the step's
 * inputs (the node's inputs, then its implicit values). */
static kiln_status body_compile(struct kiln_plan *p, const struct kiln_node *n,
                                const struct kiln_graph *g, const struct kiln_type *in_types,
                                const unsigned char *donate, const struct recompile_env *env,
                                struct body_plan *bp)
{
    bp->plan = NULL;
    bp->cap_in = NULL;
    if (*p->bodies_left <= 0)
        return kiln_plan_unsupported(n, "its bodies need more than " PLAN_STR(PLAN_MAX_BODY_PLANS)
                                        " plans (nested loops whose values change shape)");
    (*p->bodies_left)--;
    kiln_status st = kiln_plan_compile_typed(g, in_types, donate, p, p->depth + 1, env->weights,
                                        env->threads,
                                        env->precision, env->ov, env->n_ov, &bp->plan);
    if (st != KILN_OK) return st;
    struct kiln_plan *b = bp->plan;
    /* the run-time per-tensor limit is checked on the top plan: it covers its bodies' values */
    if (b->max_value_bytes > p->max_value_bytes) p->max_value_bytes = b->max_value_bytes;
    bp->cap_in = calloc((size_t)b->n_caps + 1, sizeof *bp->cap_in);
    if (!bp->cap_in) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
    for (int j = 0; j < b->n_caps; j++) {
        int at = -1;
        for (int k = 0; k < n->n_implicit && at < 0; k++)
            if (n->implicit[k] == b->cap_outer[j]) at = n->n_in + k;
        if (at < 0)
            return kiln_plan_unsupported(n, "a body reads a value of the enclosing graph the node does "
                                  "not list");
        bp->cap_in[j] = at;
    }
    return KILN_OK;
}

static const struct kiln_graph *graph_attr_of(const struct kiln_node *n, const char *name)
{
    const struct kiln_attr *a = kiln_node_attr(n, name);
    return a && a->type == KILN_ATTR_GRAPH ? a->g : NULL;
}

/* Whether body plan b's output 0 (a Loop body's condition) is always true given a true
 * condition input: a nonzero constant, or input 1 passed through (views included). */
static bool cond_stays_true(const struct kiln_plan *b)
{
    const struct kiln_graph *g = b->g;
    int v = g->outputs[0];
    for (int hops = 0; hops < 64; hops++) { /* through Identity nodes */
        const struct slot *s = &b->slots[v];
        if (s->kind == SLOT_CONST)
            return kiln_tensor_count(s->konst) == 1 && kiln_tensor_f64(s->konst, 0) != 0;
        if (v == g->inputs[1]) return true;
        if (s->kind == SLOT_ALIAS && kiln_plan_root_of(b, v) == g->inputs[1]) return true;
        if (g->values[v].kind != KILN_VALUE_NODE) return false;
        const struct kiln_node *n = &g->nodes[g->values[v].producer];
        if (n->op != KILN_OP_Identity || n->n_in < 1 || n->in[0] < 0) return false;
        v = n->in[0];
    }
    return false;
}

static kiln_status loop_compile(struct kiln_plan *p, const struct kiln_node *n,
                                const struct kiln_type *const *inp, kiln_tensor *const *inv,
                                const struct recompile_env *env, struct control *c,
                                struct kiln_type *outtype)
{
    const struct kiln_graph *body = graph_attr_of(n, "body");
    int n_carried = n->n_in - 2;
    if (!body || n_carried < 0 || body->n_inputs != n_carried + 2 ||
        body->n_outputs < n_carried + 1 || n->n_out != body->n_outputs - 1)
        return kiln_plan_unsupported(n, "its body does not match its inputs and outputs");
    c->n_carried = n_carried;
    c->n_scan = body->n_outputs - 1 - n_carried;
    for (int k = 0; k < n_carried; k++)
        if (!inp[k + 2]) return kiln_plan_unsupported(n, "an optional loop-carried input is absent");
    int64_t m = -1; /* trip count at compile time, -1 unknown or absent */
    bool m_known = !inp[0], cond_known = !inp[1], cond0 = true;
    if (inv[0]) {
        if (kiln_tensor_count(inv[0]) != 1) return kiln_plan_unsupported(n, "its trip count is not a scalar");
        m = kiln_tensor_i64(inv[0], 0);
        if (m < 0) m = 0;
        m_known = true;
    }
    if (inv[1]) {
        if (kiln_tensor_count(inv[1]) != 1) return kiln_plan_unsupported(n, "its condition is not a scalar");
        cond0 = kiln_tensor_f64(inv[1], 0) != 0;
        cond_known = true;
    }
    int64_t n_min = 0; /* iterations the loop surely runs */
    c->exact = -1;
    if ((cond_known && !cond0) || (m_known && inp[0] && m == 0)) c->exact = 0;
    else if (cond_known && (!inp[0] || (m_known && m >= 1))) n_min = 1;
    struct kiln_type *types = calloc((size_t)n_carried + 3, sizeof *types);
    if (!types) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
    kiln_status st = KILN_OK;
    kiln_type_unknown(&types[0]);
    types[0].dtype = KILN_DTYPE_I64;
    types[0].rank = 0;
    kiln_type_unknown(&types[1]);
    types[1].dtype = KILN_DTYPE_BOOL;
    types[1].rank = 0;
    for (int k = 0; k < n_carried; k++) types[k + 2] = *inp[k + 2];
    /* the loop owns the carried values it passes in: a body step may write over one */
    unsigned char *donate = calloc((size_t)n_carried + 3, 1);
    if (!donate) {
        free(types);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
    }
    memset(donate + 2, 1, (size_t)n_carried);
    bool done = c->exact == 0;
    bool exact_by_cond = false; /* c->exact rests on every body plan's condition staying true */
    if (done && c->n_scan) { /* no iteration runs, but the scan outputs' element types */
        struct body_plan *bp = &c->bodies[c->n_bodies++];
        if ((st = body_compile(p, n, body, types, donate, env, bp)) != KILN_OK) goto out;
    }
    for (int64_t i = 0; !done; i++) {
        if (c->n_bodies == PLAN_LOOP_MAX_SHAPES) {
            st = kiln_plan_unsupported(n, "its loop-carried values change shape on too many iterations");
            goto out;
        }
        struct body_plan *bp = &c->bodies[c->n_bodies++];
        if ((st = body_compile(p, n, body, types, donate, env, bp)) != KILN_OK) goto out;
        const struct kiln_plan *b = bp->plan;
        if (i == 0 && m_known && inp[0] && cond_known && cond0 && cond_stays_true(b)) {
            c->exact = m;
            exact_by_cond = true;
        } else if (exact_by_cond && !cond_stays_true(b)) {
            /* this body plan's iterations may stop the loop early: the trip count is not
             * known after all (the checks on n_min and the scan outputs then apply) */
            c->exact = -1;
            exact_by_cond = false;
        }
        bool fixed = true;
        for (int k = 0; k < n_carried; k++) {
            const struct kiln_type *t = plan_output_type(b, k + 1);
            if (t->dtype != types[k + 2].dtype) {
                st = kiln_plan_unsupported(n, "a loop-carried value changes dtype");
                goto out;
            }
            if (!same_type(t, &types[k + 2])) fixed = false;
        }
        if (c->n_bodies > 1) { /* every body plan makes the same scan outputs */
            for (int s = 0; s < c->n_scan; s++)
                if (!same_type(plan_output_type(b, 1 + n_carried + s),
                               plan_output_type(c->bodies[0].plan, 1 + n_carried + s))) {
                    st = kiln_plan_unsupported(n, "a scan output changes shape between iterations");
                    goto out;
                }
        }
        if (fixed) {
            if (c->exact < 0 && n_min < i) {
                st = kiln_plan_unsupported(n, "its loop-carried values' shapes depend on how many "
                                    "iterations run");
                goto out;
            }
            done = true;
        } else {
            for (int k = 0; k < n_carried; k++) types[k + 2] = *plan_output_type(b, k + 1);
            if (c->exact >= 0 && i + 1 == c->exact) done = true;
        }
    }
    if (c->n_scan && c->exact < 0) {
        st = kiln_plan_unsupported(n, "its scan outputs' length depends on when the loop stops");
        goto out;
    }
    for (int k = 0; k < n_carried; k++) outtype[k] = types[k + 2];
    for (int s = 0; s < c->n_scan; s++) {
        struct kiln_type *o = &outtype[n_carried + s];
        const struct kiln_type *e = c->n_bodies
                                        ? plan_output_type(c->bodies[0].plan, 1 + n_carried + s)
                                        : &body->values[body->outputs[1 + n_carried + s]].type;
        kiln_type_unknown(o);
        int r = e->rank > 0 && e->rank < KILN_MAX_RANK ? e->rank : 0;
        if (e->rank + 1 > KILN_MAX_RANK) {
            st = kiln_plan_unsupported(n, "a scan output's rank is too large");
            goto out;
        }
        o->dtype = e->dtype ? e->dtype : KILN_DTYPE_F32;
        o->rank = r + 1;
        o->dims[0] = c->exact;
        for (int d = 0; d < r; d++) o->dims[d + 1] = e->dims[d] > 0 ? e->dims[d] : 0;
    }
out:
    free(types);
    free(donate);
    return st;
}

static kiln_status if_compile(struct kiln_plan *p, const struct kiln_node *n,
                              kiln_tensor *const *inv, const struct recompile_env *env,
                              struct control *c, struct kiln_type *outtype)
{
    const struct kiln_graph *br[2] = {graph_attr_of(n, "then_branch"),
                                      graph_attr_of(n, "else_branch")};
    for (int b = 0; b < 2; b++)
        if (!br[b] || br[b]->n_inputs || br[b]->n_outputs != n->n_out)
            return kiln_plan_unsupported(n, "its branches do not match its outputs");
    c->const_branch = -1;
    if (inv[0]) {
        if (kiln_tensor_count(inv[0]) != 1) return kiln_plan_unsupported(n, "its condition is not a scalar");
        c->const_branch = kiln_tensor_f64(inv[0], 0) != 0 ? 0 : 1;
    }
    for (int b = 0; b < 2; b++) {
        if (c->const_branch >= 0 && b != c->const_branch) {
            c->bodies[c->n_bodies++] = (struct body_plan){NULL, NULL};
            continue;
        }
        struct body_plan *bp = &c->bodies[c->n_bodies++];
        kiln_status st = body_compile(p, n, br[b], NULL, NULL, env, bp);
        if (st != KILN_OK) return st;
    }
    int first = c->const_branch >= 0 ? c->const_branch : 0;
    for (int k = 0; k < n->n_out; k++) {
        outtype[k] = *plan_output_type(c->bodies[first].plan, k);
        if (c->const_branch < 0 &&
            !same_type(&outtype[k], plan_output_type(c->bodies[1].plan, k)))
            return kiln_plan_unsupported(n, "its branches' outputs differ in type or shape");
    }
    return KILN_OK;
}

/* Scan (opset 9+): the states are followed like a Loop's carried values, over the scan
 * inputs' length, known at compile time. */
static kiln_status scan_compile(struct kiln_plan *p, const struct kiln_node *n,
                                const struct kiln_type *const *inp, const struct recompile_env *env,
                                struct control *c, struct kiln_type *outtype)
{
    const struct kiln_graph *body = graph_attr_of(n, "body");
    int64_t m = kiln_attr_int(n, "num_scan_inputs", 0);
    if (!body || n->opset < 9 || m <= 0 || m > n->n_in || body->n_inputs != n->n_in ||
        body->n_outputs != n->n_out || n->n_out < n->n_in - m)
        return kiln_plan_unsupported(n, "its body does not match its inputs and outputs");
    int ns = n->n_in - (int)m, k_out = n->n_out - ns;
    c->n_carried = ns;
    c->n_scan_in = (int)m;
    c->n_scan = k_out;
    const int64_t *ia = NULL, *id = NULL, *oa = NULL, *od = NULL;
    int nia = kiln_attr_ints(n, "scan_input_axes", &ia), nid = kiln_attr_ints(n, "scan_input_directions", &id);
    int noa = kiln_attr_ints(n, "scan_output_axes", &oa), nod = kiln_attr_ints(n, "scan_output_directions", &od);
    struct kiln_type *types = calloc((size_t)n->n_in + 1, sizeof *types);
    unsigned char *donate = calloc((size_t)n->n_in + 1, 1);
    kiln_status st = KILN_OK;
    if (!types || !donate) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
        goto out;
    }
    c->len = -1;
    for (int j = 0; j < m; j++) {
        const struct kiln_type *x = inp[ns + j];
        int64_t axis = j < nia ? ia[j] : 0;
        if (!x || x->rank < 1 || axis < -x->rank || axis >= x->rank) {
            st = kiln_plan_unsupported(n, "a scan input is absent, a scalar or has no such axis");
            goto out;
        }
        int a = (int)(axis < 0 ? axis + x->rank : axis);
        c->in_axis[j] = a;
        c->in_rev[j] = j < nid && id[j];
        if (c->len >= 0 && x->dims[a] != c->len) {
            st = kiln_plan_unsupported(n, "its scan inputs have different lengths");
            goto out;
        }
        c->len = x->dims[a];
        struct kiln_type *t = &types[ns + j];
        kiln_type_unknown(t);
        t->dtype = x->dtype;
        t->rank = x->rank - 1;
        for (int d = 0, r = 0; d < x->rank; d++)
            if (d != a) t->dims[r++] = x->dims[d];
    }
    for (int k = 0; k < ns; k++) {
        if (!inp[k]) {
            st = kiln_plan_unsupported(n, "a state input is absent");
            goto out;
        }
        types[k] = *inp[k];
        donate[k] = 1;
    }
    bool done = c->len == 0 && !k_out;
    if (c->len == 0 && k_out) { /* no iteration, but the scan outputs' element types */
        struct body_plan *bp = &c->bodies[c->n_bodies++];
        if ((st = body_compile(p, n, body, types, donate, env, bp)) != KILN_OK) goto out;
        done = true;
    }
    for (int64_t i = 0; !done; i++) {
        if (c->n_bodies == PLAN_LOOP_MAX_SHAPES) {
            st = kiln_plan_unsupported(n, "its states change shape on too many iterations");
            goto out;
        }
        struct body_plan *bp = &c->bodies[c->n_bodies++];
        if ((st = body_compile(p, n, body, types, donate, env, bp)) != KILN_OK) goto out;
        const struct kiln_plan *b = bp->plan;
        bool fixed = true;
        for (int k = 0; k < ns; k++) {
            const struct kiln_type *t = plan_output_type(b, k);
            if (t->dtype != types[k].dtype) {
                st = kiln_plan_unsupported(n, "a state changes dtype");
                goto out;
            }
            fixed &= same_type(t, &types[k]);
        }
        for (int s2 = 0; s2 < k_out && c->n_bodies > 1; s2++)
            if (!same_type(plan_output_type(b, ns + s2), plan_output_type(c->bodies[0].plan, ns + s2))) {
                st = kiln_plan_unsupported(n, "a scan output changes shape between iterations");
                goto out;
            }
        if (!fixed)
            for (int k = 0; k < ns; k++) types[k] = *plan_output_type(b, k);
        done = fixed || i + 1 == c->len;
    }
    for (int k = 0; k < ns; k++) outtype[k] = types[k];
    for (int s2 = 0; s2 < k_out; s2++) {
        const struct kiln_type *e = plan_output_type(c->bodies[0].plan, ns + s2);
        struct kiln_type *o = &outtype[ns + s2];
        int64_t axis = s2 < noa ? oa[s2] : 0;
        if (e->rank + 1 > KILN_MAX_RANK || axis < -(e->rank + 1) || axis > e->rank) {
            st = kiln_plan_unsupported(n, "a scan output's axis or rank does not fit");
            goto out;
        }
        int a = (int)(axis < 0 ? axis + e->rank + 1 : axis);
        c->out_axis[s2] = a;
        c->out_rev[s2] = s2 < nod && od[s2];
        kiln_type_unknown(o);
        o->dtype = e->dtype;
        o->rank = e->rank + 1;
        for (int d = 0, r = 0; d < o->rank; d++) o->dims[d] = d == a ? c->len : e->dims[r++];
    }
out:
    free(types);
    free(donate);
    return st;
}

static kiln_status control_run(void *state, struct kiln_run_ctx *ctx);

/* Compile control-flow node n (Loop, If, Scan) into *inst; outtype receives its output types. */
kiln_status kiln_plan_control_compile(struct kiln_plan *p, const struct kiln_node *n,
                                   const struct kiln_type *const *inp, kiln_tensor *const *inv,
                                   const struct recompile_env *env, struct kiln_type *outtype,
                                   struct kiln_kernel_inst *inst)
{
    memset(inst, 0, sizeof *inst);
    if (n->op != KILN_OP_Loop && n->op != KILN_OP_If && n->op != KILN_OP_Scan)
        return kiln_plan_unsupported(n, "this control-flow op runs in the reference executor");
    if (p->depth + 1 > PLAN_MAX_DEPTH) return kiln_plan_unsupported(n, "bodies nest too deep to plan");
    if (n->n_in + n->n_implicit > KILN_MAX_IO)
        return kiln_plan_unsupported(n, "its bodies capture too many values");
    for (int k = 0; k < n->n_implicit; k++)
        if (n->implicit[k] < 0 || p->slots[n->implicit[k]].kind == SLOT_NONE)
            return kiln_node_error(n, KILN_ERR_INTERNAL, "a captured value has no value");
    struct control *c = calloc(1, sizeof *c);
    if (!c) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
    c->op = n->op;
    c->node = n;
    c->const_branch = -1;
    kiln_status st = n->op == KILN_OP_Loop   ? loop_compile(p, n, inp, inv, env, c, outtype)
                     : n->op == KILN_OP_Scan ? scan_compile(p, n, inp, env, c, outtype)
                                             : if_compile(p, n, inv, env, c, outtype);
    if (st == KILN_OK) {
        c->out_types = calloc((size_t)n->n_out + 1, sizeof *c->out_types);
        if (!c->out_types) st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
    }
    for (int k = 0; k < n->n_out && st == KILN_OK; k++) {
        if (!kiln_type_is_concrete(&outtype[k])) st = kiln_plan_unsupported(n, "an output shape depends on data");
        else if (outtype[k].dtype == KILN_DTYPE_STRING || kiln_dtype_is_container(outtype[k].dtype))
            st = kiln_plan_unsupported(n, "it produces strings, sequences or optionals");
        else c->out_types[k] = outtype[k];
    }
    if (st != KILN_OK) {
        control_free(c);
        return st;
    }
    inst->name = n->op == KILN_OP_Loop ? "loop_plan" : n->op == KILN_OP_Scan ? "scan_plan" : "if_plan";
    inst->state = c;
    inst->run = control_run;
    inst->destroy = control_free;
    inst->inplace_input = -1;
    return KILN_OK;
}


/* Run body plan bp with inputs `in` (its graph's inputs) and its captures read from the
 * step's inputs; outputs receive owned tensors. */
static kiln_status body_run(struct body_plan *bp, kiln_tensor *const *in,
                            struct kiln_run_ctx *ctx, kiln_tensor **outputs,
                            kiln_tensor *const *preset)
{
    struct kiln_plan *b = bp->plan;
    kiln_tensor *all[KILN_MAX_IO * 2];
    kiln_tensor **args = all;
    int n = b->g->n_inputs + b->n_caps;
    if (n > KILN_MAX_IO * 2) {
        args = malloc(sizeof *args * (size_t)n);
        if (!args) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in a loop");
    }
    for (int i = 0; i < b->g->n_inputs; i++) args[i] = in[i];
    for (int j = 0; j < b->n_caps; j++) args[b->g->n_inputs + j] = ctx->in[bp->cap_in[j]];
    const kiln_run_options *ro = ctx->frame ? ctx->frame->ro : NULL;
    int prof = ctx->frame ? ctx->frame->profile : 0;
    kiln_status st = kiln_plan_run_in(b, args, outputs, ctx->threads, ro, prof, ctx->frame, preset);
    if (args != all) free(args);
    return st;
}

/* Copy t into the planned output o (same dtype and shape). */
static kiln_status put_output(const struct kiln_node *n, int k, kiln_tensor *o,
                              const kiln_tensor *t)
{
    if (t->dtype != o->dtype || t->rank != o->rank ||
        memcmp(t->dims, o->dims, sizeof(int64_t) * (size_t)t->rank) != 0) {
        char a[160], b[160];
        return kiln_node_error(n, KILN_ERR_INTERNAL,
                               "output %d came out %s %s; the plan expected %s %s", k,
                               kiln_dtype_name(t->dtype), kiln_shape_str(t->rank, t->dims, a, sizeof a),
                               kiln_dtype_name(o->dtype), kiln_shape_str(o->rank, o->dims, b, sizeof b));
    }
    if (o->nbytes && o->data != t->data) memcpy(o->data, t->data, o->nbytes);
    return KILN_OK;
}

static kiln_status if_run_plan(struct control *c, struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    int br = c->const_branch;
    if (br < 0) {
        if (kiln_tensor_count(ctx->in[0]) != 1)
            return kiln_node_error(n, KILN_ERR_RUNTIME, "condition must have one element, got %lld",
                                   (long long)kiln_tensor_count(ctx->in[0]));
        br = kiln_tensor_f64(ctx->in[0], 0) != 0 ? 0 : 1;
    }
    kiln_tensor *outs[KILN_MAX_IO];
    kiln_status st = body_run(&c->bodies[br], NULL, ctx, outs, NULL);
    if (st != KILN_OK) return st;
    for (int k = 0; k < ctx->n_out; k++) {
        if (st == KILN_OK) st = put_output(n, k, ctx->out[k], outs[k]);
        kiln_tensor_free(outs[k]);
    }
    return st;
}

static bool matches(const struct kiln_plan *b, kiln_tensor *const *carried, int n_carried,
                    int first)
{
    for (int k = 0; k < n_carried; k++) {
        const struct kiln_type *t = &b->in_types[k + first];
        const kiln_tensor *x = carried[k];
        if (x->dtype != t->dtype || x->rank != t->rank ||
            memcmp(x->dims, t->dims, sizeof(int64_t) * (size_t)x->rank) != 0)
            return false;
    }
    return true;
}

/* The loop's own copy of a carried value x before its first iteration: the planned
 * output o's memory (a header onto it) when it has x's type, so that a body that writes
 * the value in place leaves the result where it belongs with no copy and nothing
 * allocated; else a clone. */
static kiln_status own_carried(const kiln_tensor *x, kiln_tensor *o, kiln_tensor **out)
{
    if (x->dtype != o->dtype || x->rank != o->rank || x->nbytes != o->nbytes ||
        memcmp(x->dims, o->dims, sizeof(int64_t) * (size_t)x->rank) != 0 ||
        x->dtype == KILN_DTYPE_STRING)
        return kiln_tensor_clone(x, out);
    kiln_tensor *h = calloc(1, sizeof *h);
    if (!h) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Loop");
    *h = *o;
    h->owns_data = 0;
    if (o->nbytes && o->data != x->data) memcpy(o->data, x->data, o->nbytes);
    *out = h;
    return KILN_OK;
}

static kiln_status loop_run_plan(struct control *c, struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    int nc = c->n_carried, ns = c->n_scan;
    int64_t max_trip = PLAN_LOOP_MAX_ITERATIONS;
    bool bounded = false;
    bool cond;
    kiln_status lst = kiln_loop_inputs(n, ctx->in, &max_trip, &bounded, &cond);
    if (lst != KILN_OK) return lst;
    int nb = 2 + nc;
    int n_bout = 1 + nc + ns;
    kiln_tensor **mem = calloc((size_t)(nb + nc + 2 * n_bout) + 1, sizeof *mem);
    if (!mem) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Loop");
    kiln_tensor **bin = mem, **carried = mem + nb, **bout = mem + nb + nc;
    kiln_tensor **preset = bout + n_bout;
    unsigned char owned_small[64];
    unsigned char *owned = nc <= 64 ? owned_small : calloc((size_t)nc, 1);
    kiln_tensor iter_t, cond_t;
    int64_t iter_v = 0;
    uint8_t cond_v = 1;
    kiln_status st = KILN_OK;
    if (!owned) {
        free(mem);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Loop");
    }
    memset(owned, 0, (size_t)nc);
    memset(&iter_t, 0, sizeof iter_t);
    memset(&cond_t, 0, sizeof cond_t);
    iter_t.dtype = KILN_DTYPE_I64;
    iter_t.data = &iter_v;
    iter_t.nbytes = sizeof iter_v;
    cond_t.dtype = KILN_DTYPE_BOOL;
    cond_t.data = &cond_v;
    cond_t.nbytes = 1;
    /* the body's plans may write over the carried values (donated): the loop's own copies,
     * made when the first iteration runs */
    for (int k = 0; k < nc; k++) carried[k] = ctx->in[k + 2];
    int64_t it = 0;
    int bi = 0; /* body plan of this iteration: they follow the carried types */
    const kiln_run_options *ro = ctx->frame ? ctx->frame->ro : NULL;
    while (cond && it < max_trip) {
        if (ro && (st = kiln_exec_check_deadline(ro)) != KILN_OK) goto out;
        while (bi < c->n_bodies && !matches(c->bodies[bi].plan, carried, nc, 2)) bi++;
        if (bi == c->n_bodies) {
            st = kiln_node_error(n, KILN_ERR_INTERNAL,
                                 "iteration %lld: no body plan for the loop-carried values' shapes",
                                 (long long)it);
            goto out;
        }
        for (int k = 0; k < nc; k++)
            if (!owned[k]) {
                if ((st = own_carried(carried[k], ctx->out[k], &carried[k])) != KILN_OK) goto out;
                owned[k] = 1;
            }
        iter_v = it;
        cond_v = 1;
        bin[0] = &iter_t;
        bin[1] = &cond_t;
        for (int k = 0; k < nc; k++) bin[k + 2] = carried[k];
        /* a carried output the body makes anew is written straight into the loop's output
         * (a header onto it) while no carried value lives there */
        for (int k = 0; k < nc; k++) {
            preset[1 + k] = NULL;
            bool busy = false;
            for (int j = 0; j < nc; j++) busy |= carried[j]->data == ctx->out[k]->data;
            if (busy || ctx->out[k]->dtype == KILN_DTYPE_STRING) continue;
            if (!(preset[1 + k] = calloc(1, sizeof(kiln_tensor)))) {
                st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Loop");
                goto out;
            }
            *preset[1 + k] = *ctx->out[k];
            preset[1 + k]->owns_data = 0;
        }
        st = body_run(&c->bodies[bi], bin, ctx, bout, preset);
        for (int k = 0; k < nc; k++) { /* headers the run did not hand back */
            bool used = false;
            for (int j = 0; j < n_bout && st == KILN_OK; j++) used |= bout[j] == preset[1 + k];
            if (!used) free(preset[1 + k]);
            preset[1 + k] = NULL;
        }
        if (st != KILN_OK) {
            kiln_error_wrap(st, "Loop node '%s' iteration %lld", n->name, (long long)it);
            goto out;
        }
        /* an output may be a carried value handed back (written over in place): each
         * tensor is in bout once; free the old carried values no output took over */
        for (int k = 0; k < nc; k++) { /* against every output, before any moves */
            bool taken = false;
            for (int j = 0; j < n_bout && !taken; j++) taken = bout[j] == carried[k];
            if (!taken) kiln_tensor_free(carried[k]);
        }
        for (int k = 0; k < nc; k++) {
            carried[k] = bout[1 + k];
            bout[1 + k] = NULL;
        }
        cond = kiln_tensor_count(bout[0]) > 0 && kiln_tensor_f64(bout[0], 0) != 0;
        kiln_tensor_free(bout[0]);
        bout[0] = NULL;
        for (int s = 0; s < ns; s++) {
            kiln_tensor *y = bout[1 + nc + s], *o = ctx->out[nc + s];
            if (st == KILN_OK && (it >= o->dims[0] || (size_t)it * y->nbytes + y->nbytes > o->nbytes ||
                                  y->dtype != o->dtype))
                st = kiln_node_error(n, KILN_ERR_INTERNAL,
                                     "scan output %d does not fit the planned output", s);
            if (st == KILN_OK && y->nbytes)
                memcpy((char *)o->data + (size_t)it * y->nbytes, y->data, y->nbytes);
            kiln_tensor_free(y);
            bout[1 + nc + s] = NULL;
        }
        if (st != KILN_OK) goto out;
        it++;
        if (!bounded && it >= PLAN_LOOP_MAX_ITERATIONS) {
            st = kiln_node_error(n, KILN_ERR_RUNTIME,
                                 "ran %lld iterations without a trip count; stopping",
                                 (long long)it);
            goto out;
        }
    }
    if (c->exact >= 0 && it != c->exact) {
        st = kiln_node_error(n, KILN_ERR_INTERNAL, "ran %lld iterations; the plan expected %lld",
                             (long long)it, (long long)c->exact);
        goto out;
    }
    /* a carried value left on another output's memory (the body swapped two) is copied
     * out first, so that no put overwrites what a later one reads */
    for (int k = 0; k < nc && st == KILN_OK; k++) {
        bool other = false;
        for (int j = 0; j < nc; j++) other |= j != k && carried[k]->data == ctx->out[j]->data;
        if (other && owned[k]) {
            kiln_tensor *t;
            if ((st = kiln_tensor_clone(carried[k], &t)) != KILN_OK) goto out;
            kiln_tensor_free(carried[k]);
            carried[k] = t;
        }
    }
    for (int k = 0; k < nc && st == KILN_OK; k++) st = put_output(n, k, ctx->out[k], carried[k]);
out:
    for (int k = 0; k < nc; k++)
        if (owned[k]) kiln_tensor_free(carried[k]);
    for (int k = 0; k < n_bout; k++) {
        kiln_tensor_free(bout[k]);
        free(preset[k]); /* headers of an iteration that failed before its run */
    }
    if (owned != owned_small) free(owned);
    free(mem);
    return st;
}

static kiln_status scan_run_plan(struct control *c, struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    int ns = c->n_carried, m = c->n_scan_in, k_out = c->n_scan;
    int n_bout = ns + k_out;
    kiln_tensor **mem = calloc((size_t)(2 * ns + 2 * m + 2 * n_bout) + 1, sizeof *mem);
    unsigned char *owned = calloc((size_t)ns + 1, 1);
    kiln_status st = KILN_OK;
    if (!mem || !owned) {
        free(mem);
        free(owned);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Scan");
    }
    kiln_tensor **states = mem, **bin = mem + ns, **slices = bin + ns + m;
    kiln_tensor **bout = slices + m, **preset = bout + n_bout;
    for (int k = 0; k < ns; k++) states[k] = ctx->in[k];
    for (int j = 0; j < m; j++) {
        const kiln_tensor *x = ctx->in[ns + j];
        int64_t dims[KILN_MAX_RANK];
        for (int d = 0, r = 0; d < x->rank; d++)
            if (d != c->in_axis[j]) dims[r++] = x->dims[d];
        if ((st = kiln_tensor_new(x->dtype, x->rank - 1, dims, &slices[j])) != KILN_OK) goto out;
    }
    const kiln_run_options *ro = ctx->frame ? ctx->frame->ro : NULL;
    int bi = 0;
    for (int64_t t = 0; t < c->len; t++) {
        if (ro && (st = kiln_exec_check_deadline(ro)) != KILN_OK) goto out;
        for (int j = 0; j < m; j++) { /* slice t (or len-1-t) of scan input j */
            const kiln_tensor *x = ctx->in[ns + j];
            int a = c->in_axis[j];
            int64_t pos = c->in_rev[j] ? c->len - 1 - t : t, outer = 1, inner = 1;
            for (int d = 0; d < x->rank; d++) {
                if (d < a) outer *= x->dims[d];
                else if (d > a) inner *= x->dims[d];
            }
            size_t es = kiln_dtype_size(x->dtype), row = (size_t)inner * es;
            for (int64_t o = 0; o < outer; o++)
                memcpy((char *)slices[j]->data + (size_t)o * row,
                       (const char *)x->data + ((size_t)(o * c->len + pos)) * row, row);
        }
        for (int k = 0; k < ns; k++)
            if (!owned[k]) {
                if ((st = own_carried(states[k], ctx->out[k], &states[k])) != KILN_OK) goto out;
                owned[k] = 1;
            }
        while (bi < c->n_bodies && !matches(c->bodies[bi].plan, states, ns, 0)) bi++;
        if (bi == c->n_bodies) {
            st = kiln_node_error(n, KILN_ERR_INTERNAL,
                                 "iteration %lld: no body plan for the states' shapes", (long long)t);
            goto out;
        }
        for (int k = 0; k < ns; k++) {
            bin[k] = states[k];
            preset[k] = NULL;
            bool busy = false;
            for (int j = 0; j < ns; j++) busy |= states[j]->data == ctx->out[k]->data;
            if (busy) continue;
            if (!(preset[k] = calloc(1, sizeof(kiln_tensor)))) {
                st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Scan");
                goto out;
            }
            *preset[k] = *ctx->out[k];
            preset[k]->owns_data = 0;
        }
        for (int j = 0; j < m; j++) bin[ns + j] = slices[j];
        st = body_run(&c->bodies[bi], bin, ctx, bout, preset);
        for (int k = 0; k < ns; k++) {
            bool used = false;
            for (int j = 0; j < n_bout && st == KILN_OK; j++) used |= bout[j] == preset[k];
            if (!used) free(preset[k]);
            preset[k] = NULL;
        }
        if (st != KILN_OK) {
            kiln_error_wrap(st, "Scan node '%s' iteration %lld", n->name, (long long)t);
            goto out;
        }
        for (int k = 0; k < ns; k++) { /* against every output, before any moves */
            bool taken = false;
            for (int j = 0; j < n_bout && !taken; j++) taken = bout[j] == states[k];
            if (!taken) kiln_tensor_free(states[k]);
        }
        for (int k = 0; k < ns; k++) {
            states[k] = bout[k];
            bout[k] = NULL;
        }
        for (int s2 = 0; s2 < k_out; s2++) { /* element t of scan output s2 */
            kiln_tensor *y = bout[ns + s2], *o = ctx->out[ns + s2];
            int a = c->out_axis[s2];
            int64_t pos = c->out_rev[s2] ? c->len - 1 - t : t, outer = 1, inner = 1;
            bool fits = y->dtype == o->dtype && y->rank + 1 == o->rank;
            for (int d = 0, r = 0; fits && d < o->rank; d++)
                if (d != a) fits = o->dims[d] == y->dims[r++];
            if (!fits && st == KILN_OK)
                st = kiln_node_error(n, KILN_ERR_INTERNAL,
                                     "scan output %d does not fit the planned output", s2);
            for (int d = 0; fits && d < y->rank; d++) {
                if (d < a) outer *= y->dims[d];
                else inner *= y->dims[d];
            }
            size_t row = (size_t)inner * kiln_dtype_size(y->dtype);
            for (int64_t q = 0; fits && st == KILN_OK && q < outer; q++)
                memcpy((char *)o->data + ((size_t)(q * c->len + pos)) * row,
                       (const char *)y->data + (size_t)q * row, row);
            kiln_tensor_free(y);
            bout[ns + s2] = NULL;
        }
        if (st != KILN_OK) goto out;
    }
    for (int k = 0; k < ns && st == KILN_OK; k++) {
        bool other = false;
        for (int j = 0; j < ns; j++) other |= j != k && states[k]->data == ctx->out[j]->data;
        if (other && owned[k]) {
            kiln_tensor *t2;
            if ((st = kiln_tensor_clone(states[k], &t2)) != KILN_OK) goto out;
            kiln_tensor_free(states[k]);
            states[k] = t2;
        }
    }
    for (int k = 0; k < ns && st == KILN_OK; k++) st = put_output(n, k, ctx->out[k], states[k]);
out:
    for (int k = 0; k < ns; k++)
        if (owned[k]) kiln_tensor_free(states[k]);
    for (int j = 0; j < m; j++) kiln_tensor_free(slices[j]);
    for (int k = 0; k < n_bout; k++) {
        kiln_tensor_free(bout[k]);
        free(preset[k]);
    }
    free(owned);
    free(mem);
    return st;
}

static kiln_status control_run(void *state, struct kiln_run_ctx *ctx)
{
    struct control *c = state;
    return c->op == KILN_OP_Loop   ? loop_run_plan(c, ctx)
           : c->op == KILN_OP_Scan ? scan_run_plan(c, ctx)
                                   : if_run_plan(c, ctx);
}

int kiln_plan_control_bodies(const struct kiln_kernel_inst *inst)
{
    return inst->run == control_run && inst->state ? ((const struct control *)inst->state)->n_bodies
                                                    : 0;
}

struct kiln_plan *kiln_plan_control_body(const struct kiln_kernel_inst *inst, int i)
{
    const struct control *c = inst->run == control_run ? inst->state : NULL;
    return c && i >= 0 && i < c->n_bodies ? c->bodies[i].plan : NULL;
}
