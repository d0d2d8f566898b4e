/*
 * exec.c - the reference executor.
 */
#include "exec/exec.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KILN_MAX_SUBGRAPH_DEPTH 64

kiln_tensor *kiln_exec_value(struct kiln_exec_frame *f, int id)
{
    while (f && id >= 0 && f->g->values[id].kind == KILN_VALUE_OUTER) {
        id = f->g->values[id].outer;
        f = f->parent;
    }
    if (!f || id < 0) return NULL;
    return f->vals[id];
}

static void frame_release(struct kiln_exec_frame *f, int v)
{
    if (v < 0 || f->g->values[v].kind != KILN_VALUE_NODE) return;
    if (--f->remaining[v] > 0) return;
    if (f->owned[v]) kiln_tensor_free(f->vals[v]);
    f->vals[v] = NULL;
    f->owned[v] = 0;
}

/* Sequence and optional values (containers, docs/SEQUENCES.md) go only to the ops made
 * for them (SEQ), to If and Loop as carried values, and to Identity, which copies one
 * into out[0]; any other op given one is an error naming it. */
static kiln_status container_inputs(const struct kiln_node *n, kiln_tensor *const *in,
                                    kiln_tensor **out, bool *copied)
{
    unsigned flags = kiln_op_info(n->op)->flags;
    if (flags & KILN_OPF_SEQ) return KILN_OK;
    int first = n->n_in; /* inputs before this one must be tensors */
    if (n->op == KILN_OP_If) first = 1;
    else if (n->op == KILN_OP_Loop) first = 2;
    for (int k = 0; k < first && k < n->n_in; k++) {
        if (!in[k] || !kiln_dtype_is_container(in[k]->dtype)) continue;
        if (n->op == KILN_OP_Identity && k == 0 && n->n_out == 1) {
            *copied = true;
            return kiln_tensor_clone(in[0], &out[0]);
        }
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED,
                               "input %d is a %s value; this op takes tensors", k,
                               kiln_dtype_name(in[k]->dtype));
    }
    return KILN_OK;
}

kiln_status kiln_exec_node(const struct kiln_node *n, kiln_tensor *const *in, kiln_tensor **out,
                           struct kiln_exec_frame *f, int64_t max_tensor_bytes)
{
    const struct kiln_op_impl *impl = kiln_op_impl(n->op);
    for (int k = 0; k < n->n_out; k++) out[k] = NULL;
    if (!impl) return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "no kernel for this op");
    if (n->n_in > KILN_MAX_IO || n->n_out > KILN_MAX_IO)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "more than %d inputs or outputs",
                               KILN_MAX_IO);
    {
        bool copied = false;
        kiln_status cst = container_inputs(n, in, out, &copied);
        if (cst != KILN_OK || copied) return cst;
    }
    struct kiln_type intype[KILN_MAX_IO];
    const struct kiln_type *inp[KILN_MAX_IO];
    struct kiln_type outtype[KILN_MAX_IO];
    struct kiln_type *outp[KILN_MAX_IO];
    kiln_status st = KILN_OK;
    for (int k = 0; k < n->n_in; k++) {
        inp[k] = NULL;
        if (!in[k]) continue;
        kiln_type_from_tensor(&intype[k], in[k]);
        inp[k] = &intype[k];
    }
    for (int k = 0; k < n->n_out; k++) {
        kiln_type_unknown(&outtype[k]);
        outp[k] = &outtype[k]; /* every output is computed, wanted or not */
    }
    unsigned flags = kiln_op_info(n->op)->flags;
    if (!(flags & KILN_OPF_DYNOUT)) {
        struct kiln_infer_ctx ictx = {n, n->n_in, inp, (const kiln_tensor *const *)in, n->n_out,
                                      outp};
        st = impl->infer(&ictx);
        {
            kiln_status ast = kiln_attr_check(n); /* a mistyped attribute is the root cause */
            if (ast != KILN_OK) st = ast;
        }
        if (st != KILN_OK) return st;
        for (int k = 0; k < n->n_out; k++) {
            if (!kiln_type_is_concrete(&outtype[k])) {
                st = kiln_node_error(n, KILN_ERR_INTERNAL,
                                     "could not determine the shape of output %d", k);
                goto fail;
            }
            int64_t count = kiln_shape_count(outtype[k].rank, outtype[k].dims);
            int64_t bytes = count < 0 ? -1 : count * (int64_t)kiln_dtype_size(outtype[k].dtype);
            if (bytes < 0 || bytes > max_tensor_bytes) {
                char sbuf[160];
                st = kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY,
                                     "output %d of shape %s would need more than the run's limit "
                                     "of %lld bytes per tensor",
                                     k, kiln_shape_str(outtype[k].rank, outtype[k].dims, sbuf, sizeof sbuf),
                                     (long long)max_tensor_bytes);
                goto fail;
            }
            st = kiln_tensor_new(outtype[k].dtype, outtype[k].rank, outtype[k].dims, &out[k]);
            if (st != KILN_OK) {
                kiln_error_wrap(st, "%s node '%s' output %d", n->op_type, n->name, k);
                goto fail;
            }
        }
    }
    struct kiln_run_ctx rctx = {n, n->n_in, in, n->n_out, out, f, NULL, 1};
    st = impl->run(&rctx);
    {
        kiln_status ast = kiln_attr_check(n); /* a mistyped attribute is the root cause */
        if (ast != KILN_OK) st = ast;
    }
    if (st != KILN_OK) goto fail;
    for (int k = 0; k < n->n_out; k++) {
        if (!out[k]) {
            st = kiln_node_error(n, KILN_ERR_INTERNAL, "kernel produced no output %d", k);
            goto fail;
        }
        if ((int64_t)out[k]->nbytes > max_tensor_bytes) { /* DYNOUT kernels sized it */
            st = kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY,
                                 "output %d has %zu bytes, above the run's limit of %lld", k,
                                 out[k]->nbytes, (long long)max_tensor_bytes);
            goto fail;
        }
    }
    return KILN_OK;
fail:
    for (int k = 0; k < n->n_out; k++) {
        kiln_tensor_free(out[k]);
        out[k] = NULL;
    }
    return st;
}

static kiln_status run_node(struct kiln_exec_frame *f, const struct kiln_node *n)
{
    kiln_tensor *in[KILN_MAX_IO];
    kiln_tensor *out[KILN_MAX_IO];
    if (n->n_in > KILN_MAX_IO || n->n_out > KILN_MAX_IO)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "more than %d inputs or outputs",
                               KILN_MAX_IO);
    for (int k = 0; k < n->n_in; k++) {
        in[k] = NULL;
        if (n->in[k] < 0) continue;
        in[k] = kiln_exec_value(f, n->in[k]);
        if (!in[k])
            return kiln_node_error(n, KILN_ERR_INTERNAL, "input '%s' has no value",
                                   f->g->values[n->in[k]].name);
    }
    kiln_status st = kiln_exec_node(n, in, out, f, f->max_tensor_bytes);
    if (st != KILN_OK) return st;
    for (int k = 0; k < n->n_out; k++) {
        int v = n->out[k];
        if (v < 0) {
            kiln_tensor_free(out[k]);
            continue;
        }
        f->vals[v] = out[k];
        f->owned[v] = 1;
    }
    return KILN_OK;
}

int64_t kiln_monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

kiln_status kiln_exec_check_deadline(const struct kiln_run_options *ro)
{
    if (!ro) return KILN_OK;
    if (ro->cancel && *ro->cancel) return kiln_error(KILN_ERR_DEADLINE, "the run was cancelled");
    if (ro->deadline_ms > 0 && kiln_monotonic_ms() >= ro->deadline_ms)
        return kiln_error(KILN_ERR_DEADLINE, "the run passed its deadline");
    return KILN_OK;
}

static kiln_status exec_run(const struct kiln_graph *g, struct kiln_exec_frame *parent,
                            kiln_tensor *const *inputs, kiln_tensor **outputs, int64_t max_bytes,
                            const struct kiln_run_options *ro)
{
    struct kiln_exec_frame f = {.g = g, .parent = parent, .ro = ro};
    f.depth = parent ? parent->depth + 1 : 0;
    f.max_tensor_bytes = max_bytes;
    if (f.depth > KILN_MAX_SUBGRAPH_DEPTH)
        return kiln_error(KILN_ERR_UNSUPPORTED, "subgraphs nest deeper than %d levels",
                          KILN_MAX_SUBGRAPH_DEPTH);
    size_t nv = (size_t)g->n_values + 1;
    f.vals = calloc(nv, sizeof *f.vals);
    f.owned = calloc(nv, 1);
    f.remaining = calloc(nv, sizeof *f.remaining);
    kiln_status st = KILN_OK;
    for (int i = 0; i < g->n_outputs; i++) outputs[i] = NULL;
    if (!f.vals || !f.owned || !f.remaining) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory starting a run");
        goto out;
    }
    for (int v = 0; v < g->n_values; v++) {
        const struct kiln_value *val = &g->values[v];
        f.remaining[v] = val->uses;
        if (val->kind == KILN_VALUE_CONST) f.vals[v] = val->konst;
    }
    for (int i = 0; i < g->n_inputs; i++) f.vals[g->inputs[i]] = inputs[i];
    for (int oi = 0; oi < g->n_nodes; oi++) {
        const struct kiln_node *n = &g->nodes[g->order[oi]];
        if (ro && (st = kiln_exec_check_deadline(ro)) != KILN_OK) goto out;
        st = run_node(&f, n);
        if (st != KILN_OK) goto out;
        for (int k = 0; k < n->n_in; k++) frame_release(&f, n->in[k]);
        for (int k = 0; k < n->n_implicit; k++) frame_release(&f, n->implicit[k]);
    }
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        kiln_tensor *t = kiln_exec_value(&f, v);
        if (!t) {
            st = kiln_error(KILN_ERR_INTERNAL, "graph output '%s' has no value", g->values[v].name);
            goto out;
        }
        /* hand over owned tensors once; clone the rest (inputs, constants, repeats) */
        bool repeat = false;
        for (int j = 0; j < i; j++) repeat |= g->outputs[j] == v;
        if (f.owned[v] && !repeat) {
            outputs[i] = t;
            f.owned[v] = 0;
        } else {
            st = kiln_tensor_clone(t, &outputs[i]);
            if (st != KILN_OK) goto out;
        }
    }
out:
    if (st != KILN_OK && outputs)
        for (int i = 0; i < g->n_outputs; i++) {
            kiln_tensor_free(outputs[i]);
            outputs[i] = NULL;
        }
    if (f.vals)
        for (int v = 0; v < g->n_values; v++)
            if (f.owned[v]) kiln_tensor_free(f.vals[v]);
    free(f.vals);
    free(f.owned);
    free(f.remaining);
    return st;
}

kiln_status kiln_exec_run(const struct kiln_graph *g, struct kiln_exec_frame *parent,
                          kiln_tensor *const *inputs, kiln_tensor **outputs)
{
    int64_t max = parent ? parent->max_tensor_bytes : KILN_EXEC_DEFAULT_MAX_TENSOR_BYTES;
    return exec_run(g, parent, inputs, outputs, max, parent ? parent->ro : NULL);
}

kiln_status kiln_exec_run_limited(const struct kiln_graph *g, kiln_tensor *const *inputs,
                                  kiln_tensor **outputs, int64_t max_tensor_bytes,
                                  const struct kiln_run_options *ro)
{
    if (max_tensor_bytes <= 0) max_tensor_bytes = KILN_EXEC_DEFAULT_MAX_TENSOR_BYTES;
    return exec_run(g, NULL, inputs, outputs, max_tensor_bytes, ro);
}
