/*
 * control.c - control-flow ops: If, Loop and Scan.
 *
 * These kernels run their graph attributes with kiln_exec_run in a child
 * frame of the node's frame, so the bodies can read captured values.
 * All three are DYNOUT: outputs take the shapes the bodies produce.
 */
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"

#define LOOP_MAX_ITERATIONS ((int64_t)1 << 24) /* bound for loops without a trip count */

static const struct kiln_graph *graph_attr(const struct kiln_node *n, const char *name)
{
    const struct kiln_attr *a = kiln_node_attr(n, name);
    return a && a->type == KILN_ATTR_GRAPH ? a->g : NULL;
}

/* ---- If ---- */

static kiln_status if_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_graph *tg = graph_attr(ctx->node, "then_branch");
    const struct kiln_graph *eg = graph_attr(ctx->node, "else_branch");
    if (!tg || !eg)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "needs graph attributes then_branch and else_branch");
    if (tg->n_outputs != ctx->n_out || eg->n_outputs != ctx->n_out)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "has %d outputs but then_branch has %d and else_branch %d",
                               ctx->n_out, tg->n_outputs, eg->n_outputs);
    if (tg->n_inputs || eg->n_inputs)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "then_branch has %d inputs and else_branch %d; If branches take none",
                               tg->n_inputs, eg->n_inputs);
    for (int k = 0; k < ctx->n_out; k++) {
        if (!ctx->out[k]) continue;
        const struct kiln_type *a = &tg->values[tg->outputs[k]].type;
        const struct kiln_type *b = &eg->values[eg->outputs[k]].type;
        kiln_type_unknown(ctx->out[k]);
        ctx->out[k]->dtype = a->dtype ? a->dtype : b->dtype;
        if (a->rank >= 0 && a->rank == b->rank) {
            ctx->out[k]->rank = a->rank;
            for (int i = 0; i < a->rank; i++)
                ctx->out[k]->dims[i] = a->dims[i] == b->dims[i] ? a->dims[i] : -1;
        }
    }
    return KILN_OK;
}

static kiln_status if_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *c = ctx->in[0];
    if (kiln_tensor_count(c) != 1)
        return kiln_node_error(ctx->node, KILN_ERR_RUNTIME,
                               "condition must have one element, got %lld",
                               (long long)kiln_tensor_count(c));
    bool cond = kiln_tensor_f64(c, 0) != 0;
    const struct kiln_graph *g = graph_attr(ctx->node, cond ? "then_branch" : "else_branch");
    if (!g || g->n_outputs != ctx->n_out || g->n_inputs != 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "%s has %d inputs and %d outputs; the node has %d outputs",
                               cond ? "then_branch" : "else_branch", g ? g->n_inputs : 0,
                               g ? g->n_outputs : 0, ctx->n_out);
    return kiln_exec_run(g, ctx->frame, NULL, ctx->out);
}

KILN_REF_OP(If, if_infer, if_run);

/* ---- Loop ---- */

kiln_status kiln_loop_inputs(const struct kiln_node *n, kiln_tensor *const *in, int64_t *max_trip,
                             bool *bounded, bool *cond)
{
    for (int k = 0; k < 2; k++)
        if (in[k] && kiln_tensor_count(in[k]) != 1)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "%s must have one element, got %lld",
                                   k ? "the condition" : "the trip count M",
                                   (long long)kiln_tensor_count(in[k]));
    if (in[0]) {
        *max_trip = kiln_tensor_i64(in[0], 0);
        *bounded = true;
        if (*max_trip < 0) *max_trip = 0;
    }
    *cond = in[1] ? kiln_tensor_f64(in[1], 0) != 0 : true;
    return KILN_OK;
}

/* The body and arity checks, run by both the shape function and the
 * kernel (a Loop inside a subgraph is only inferred leniently). */
static kiln_status loop_check(const struct kiln_node *n, int n_in, int n_out,
                              const struct kiln_graph **body_out)
{
    const struct kiln_graph *body = graph_attr(n, "body");
    if (!body) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "needs graph attribute body");
    int n_carried = n_in - 2;
    if (n_carried < 0 || body->n_inputs != n_carried + 2 || body->n_outputs < n_carried + 1 ||
        n_out != body->n_outputs - 1)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "body has %d inputs and %d outputs; with %d loop-carried values it "
                               "needs %d inputs and the node %d outputs",
                               body->n_inputs, body->n_outputs, n_carried, n_carried + 2,
                               body->n_outputs - 1);
    *body_out = body;
    return KILN_OK;
}

static kiln_status loop_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_graph *body;
    kiln_status cst = loop_check(ctx->node, ctx->n_in, ctx->n_out, &body);
    if (cst != KILN_OK) return cst;
    int n_carried = ctx->n_in - 2;
    for (int k = 0; k < ctx->n_out; k++) {
        if (!ctx->out[k]) continue;
        kiln_type_unknown(ctx->out[k]);
        const struct kiln_type *bt = &body->values[body->outputs[k + 1]].type;
        ctx->out[k]->dtype = bt->dtype;
        /* an optional carried in may come back as its value (ONNX's loop16_seq_none) */
        if (k < n_carried && ctx->in[k + 2] &&
            !(ctx->in[k + 2]->dtype == KILN_DTYPE_OPTIONAL && bt->dtype != KILN_DTYPE_UNDEFINED))
            ctx->out[k]->dtype = ctx->in[k + 2]->dtype;
    }
    return KILN_OK;
}

/* Stack per-iteration tensors along a new axis 0. */
static kiln_status stack(const struct kiln_node *n, kiln_tensor **items, int64_t count,
                         const struct kiln_type *declared, kiln_tensor **out)
{
    int64_t dims[KILN_MAX_RANK];
    if (count == 0) {
        /* no iterations: shape [0, ...] from the body's declared type */
        int r = declared->rank > 0 && declared->rank < KILN_MAX_RANK ? declared->rank : 0;
        dims[0] = 0;
        for (int i = 0; i < r; i++) dims[i + 1] = declared->dims[i] > 0 ? declared->dims[i] : 0;
        kiln_dtype dt = declared->dtype ? declared->dtype : KILN_DTYPE_F32;
        return kiln_tensor_new(dt, r + 1, dims, out);
    }
    const kiln_tensor *f = items[0];
    if (kiln_dtype_is_container(f->dtype))
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED,
                               "a scan output is a %s; scan outputs are tensors (carry the %s as "
                               "a loop-carried value instead)",
                               kiln_dtype_name(f->dtype), kiln_dtype_name(f->dtype));
    if (f->rank + 1 > KILN_MAX_RANK)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "scan output rank too large");
    for (int64_t i = 1; i < count; i++) {
        if (items[i]->dtype != f->dtype || items[i]->rank != f->rank ||
            memcmp(items[i]->dims, f->dims, sizeof(int64_t) * (size_t)f->rank) != 0)
            return kiln_node_error(n, KILN_ERR_RUNTIME,
                                   "scan output changes shape or type between iterations");
    }
    dims[0] = count;
    for (int i = 0; i < f->rank; i++) dims[i + 1] = f->dims[i];
    kiln_status st = kiln_tensor_new(f->dtype, f->rank + 1, dims, out);
    if (st != KILN_OK) return st;
    int64_t per = kiln_tensor_count(f);
    for (int64_t i = 0; i < count; i++) {
        if (f->dtype == KILN_DTYPE_STRING) {
            const kiln_string *s = items[i]->data;
            for (int64_t j = 0; j < per; j++) {
                st = kiln_tensor_set_string(*out, (size_t)(i * per + j), s[j].data ? s[j].data : "",
                                            s[j].len);
                if (st != KILN_OK) return st;
            }
        } else if (f->nbytes) {
            memcpy((char *)(*out)->data + (size_t)i * f->nbytes, items[i]->data, f->nbytes);
        }
    }
    return KILN_OK;
}

static kiln_status loop_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_graph *body;
    kiln_status cst = loop_check(n, ctx->n_in, ctx->n_out, &body);
    if (cst != KILN_OK) return cst;
    int n_carried = ctx->n_in - 2;
    int n_scan = body->n_outputs - 1 - n_carried;
    int64_t max_trip = LOOP_MAX_ITERATIONS;
    bool bounded = false;
    bool cond;
    kiln_status lst = kiln_loop_inputs(n, ctx->in, &max_trip, &bounded, &cond);
    if (lst != KILN_OK) return lst;
    kiln_status st = KILN_OK;
    kiln_tensor **carried = calloc((size_t)n_carried + 1, sizeof *carried);
    kiln_tensor **bin = calloc((size_t)n_carried + 3, sizeof *bin);
    kiln_tensor **bout = calloc((size_t)body->n_outputs + 1, sizeof *bout);
    kiln_tensor ***scans = calloc((size_t)n_scan + 1, sizeof *scans);
    int64_t iters = 0, cap = 0;
    kiln_tensor *iter_t = NULL, *cond_t = NULL;
    if (!carried || !bin || !bout || !scans) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Loop");
        goto out;
    }
    for (int k = 0; k < n_carried; k++) {
        if (!ctx->in[k + 2]) {
            st = kiln_node_error(n, KILN_ERR_UNSUPPORTED, "optional loop-carried inputs are not supported");
            goto out;
        }
        if ((st = kiln_tensor_clone(ctx->in[k + 2], &carried[k])) != KILN_OK) goto out;
    }
    if ((st = kiln_tensor_scalar_i64(KILN_DTYPE_I64, 0, &iter_t)) != KILN_OK) goto out;
    if ((st = kiln_tensor_scalar_i64(KILN_DTYPE_BOOL, cond, &cond_t)) != KILN_OK) goto out;
    while (cond && iters < max_trip) {
        ((int64_t *)iter_t->data)[0] = iters;
        ((uint8_t *)cond_t->data)[0] = cond;
        bin[0] = iter_t;
        bin[1] = cond_t;
        for (int k = 0; k < n_carried; k++) bin[k + 2] = carried[k];
        st = kiln_exec_run(body, ctx->frame, bin, bout);
        if (st != KILN_OK) {
            kiln_error_wrap(st, "Loop node '%s' iteration %lld", n->name, (long long)iters);
            goto out;
        }
        cond = kiln_tensor_count(bout[0]) > 0 && kiln_tensor_f64(bout[0], 0) != 0;
        kiln_tensor_free(bout[0]);
        for (int k = 0; k < n_carried; k++) {
            kiln_tensor_free(carried[k]);
            carried[k] = bout[k + 1];
        }
        if (iters == cap) {
            cap = cap ? cap * 2 : 8;
            for (int s = 0; s < n_scan; s++) {
                kiln_tensor **p = realloc(scans[s], (size_t)cap * sizeof *p);
                if (!p) {
                    for (int s2 = 0; s2 < n_scan; s2++) kiln_tensor_free(bout[1 + n_carried + s2]);
                    st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Loop");
                    goto out;
                }
                scans[s] = p;
            }
        }
        for (int s = 0; s < n_scan; s++) scans[s][iters] = bout[1 + n_carried + s];
        iters++;
        if (!bounded && iters >= LOOP_MAX_ITERATIONS) {
            st = kiln_node_error(n, KILN_ERR_RUNTIME,
                                 "ran %lld iterations without a trip count; stopping",
                                 (long long)iters);
            goto out;
        }
    }
    for (int k = 0; k < n_carried && k < ctx->n_out; k++) {
        ctx->out[k] = carried[k];
        carried[k] = NULL;
    }
    for (int s = 0; s < n_scan && n_carried + s < ctx->n_out; s++) {
        st = stack(n, scans[s], iters, &body->values[body->outputs[1 + n_carried + s]].type,
                   &ctx->out[n_carried + s]);
        if (st != KILN_OK) goto out;
    }
out:
    if (carried)
        for (int k = 0; k < n_carried; k++) kiln_tensor_free(carried[k]);
    if (scans)
        for (int s = 0; s < n_scan; s++) {
            for (int64_t i = 0; i < iters && scans[s]; i++) kiln_tensor_free(scans[s][i]);
            free(scans[s]);
        }
    if (st != KILN_OK)
        for (int k = 0; k < ctx->n_out; k++) {
            kiln_tensor_free(ctx->out[k]);
            ctx->out[k] = NULL;
        }
    kiln_tensor_free(iter_t);
    kiln_tensor_free(cond_t);
    free(carried);
    free(bin);
    free(bout);
    free(scans);
    return st;
}

KILN_REF_OP(Loop, loop_infer, loop_run);

/* ---- Scan (opset 9 and later) ---- */


/* Body and arity checks shared by the shape function and the kernel. */
static kiln_status scan_check(const struct kiln_node *n, int n_in, int n_out,
                              const struct kiln_graph **body_out)
{
    const struct kiln_graph *body = graph_attr(n, "body");
    if (!body) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "needs graph attribute body");
    if (n->opset < 9)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "Scan before opset 9 is not supported");
    int64_t m = kiln_attr_int(n, "num_scan_inputs", 0);
    if (m <= 0 || m > n_in || body->n_inputs != n_in || body->n_outputs != n_out ||
        n_out < n_in - m)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "num_scan_inputs %lld does not fit %d inputs and %d outputs, or the "
                               "body's %d inputs and %d outputs do not match the node's",
                               (long long)m, n_in, n_out, body->n_inputs, body->n_outputs);
    *body_out = body;
    return KILN_OK;
}

static kiln_status scan_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_graph *body;
    kiln_status cst = scan_check(ctx->node, ctx->n_in, ctx->n_out, &body);
    if (cst != KILN_OK) return cst;
    for (int k = 0; k < ctx->n_out; k++) {
        if (!ctx->out[k]) continue;
        kiln_type_unknown(ctx->out[k]);
        ctx->out[k]->dtype = body->values[body->outputs[k]].type.dtype;
    }
    return KILN_OK;
}

static kiln_status scan_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_graph *body;
    kiln_status cst = scan_check(n, ctx->n_in, ctx->n_out, &body);
    if (cst != KILN_OK) return cst;
    int m = (int)kiln_attr_int(n, "num_scan_inputs", 0);
    int n_state = ctx->n_in - m;
    int k_out = ctx->n_out - n_state;
    const int64_t *in_axes = NULL, *in_dirs = NULL, *out_axes = NULL, *out_dirs = NULL;
    int n_in_axes = kiln_attr_ints(n, "scan_input_axes", &in_axes);
    int n_in_dirs = kiln_attr_ints(n, "scan_input_directions", &in_dirs);
    int n_out_axes = kiln_attr_ints(n, "scan_output_axes", &out_axes);
    int n_out_dirs = kiln_attr_ints(n, "scan_output_directions", &out_dirs);
    kiln_status st = KILN_OK;
    int axis[KILN_MAX_IO];
    int64_t len = -1;
    for (int j = 0; j < m; j++) {
        const kiln_tensor *x = ctx->in[n_state + j];
        if (!x) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "scan input %d is absent", j);
        st = kiln_norm_axis(n, j < n_in_axes ? in_axes[j] : 0, x->rank, &axis[j]);
        if (st != KILN_OK) return st;
        if (x->rank == 0) return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "scan input %d is a scalar", j);
        int64_t l = x->dims[axis[j]];
        if (len >= 0 && l != len)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "scan inputs have different lengths (%lld and %lld)",
                                   (long long)len, (long long)l);
        len = l;
    }
    kiln_tensor **bin = calloc((size_t)ctx->n_in + 1, sizeof *bin);
    kiln_tensor **bout = calloc((size_t)ctx->n_out + 1, sizeof *bout);
    kiln_tensor **state = calloc((size_t)n_state + 1, sizeof *state);
    kiln_tensor **slices = calloc((size_t)m + 1, sizeof *slices);
    if (!bin || !bout || !state || !slices) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory in Scan");
        goto out;
    }
    for (int k = 0; k < n_state; k++) {
        if (!ctx->in[k]) {
            st = kiln_node_error(n, KILN_ERR_INVALID_MODEL, "state input %d is absent", k);
            goto out;
        }
        if ((st = kiln_tensor_clone(ctx->in[k], &state[k])) != KILN_OK) goto out;
    }
    for (int64_t t = 0; t < len; t++) {
        for (int j = 0; j < m; j++) {
            const kiln_tensor *x = ctx->in[n_state + j];
            int a = axis[j];
            int64_t p = (j < n_in_dirs && in_dirs[j]) ? len - 1 - t : t;
            int64_t dims[KILN_MAX_RANK], outer = 1, inner = 1;
            int r = 0;
            for (int d = 0; d < x->rank; d++) {
                if (d == a) continue;
                dims[r++] = x->dims[d];
                if (d < a) outer *= x->dims[d];
                else inner *= x->dims[d];
            }
            kiln_tensor_free(slices[j]);
            slices[j] = NULL;
            if ((st = kiln_tensor_new(x->dtype, r, dims, &slices[j])) != KILN_OK) goto out;
            for (int64_t o = 0; o < outer; o++)
                if ((st = kiln_tensor_copy_elems(slices[j], o * inner, x, (o * len + p) * inner, inner)) != KILN_OK)
                    goto out;
            bin[n_state + j] = slices[j];
        }
        for (int k = 0; k < n_state; k++) bin[k] = state[k];
        st = kiln_exec_run(body, ctx->frame, bin, bout);
        if (st != KILN_OK) {
            kiln_error_wrap(st, "Scan node '%s' iteration %lld", n->name, (long long)t);
            goto out;
        }
        for (int k = 0; k < n_state; k++) {
            kiln_tensor_free(state[k]);
            state[k] = bout[k];
            bout[k] = NULL;
        }
        for (int s = 0; s < k_out; s++) {
            kiln_tensor *y = bout[n_state + s];
            int a;
            if (y->rank + 1 > KILN_MAX_RANK) {
                st = kiln_node_error(n, KILN_ERR_UNSUPPORTED, "scan output rank too large");
                goto out;
            }
            st = kiln_norm_axis(n, s < n_out_axes ? out_axes[s] : 0, y->rank + 1, &a);
            if (st != KILN_OK) goto out;
            if (t == 0) {
                int64_t dims[KILN_MAX_RANK];
                for (int d = 0, r = 0; d <= y->rank; d++) dims[d] = d == a ? len : y->dims[r++];
                st = kiln_tensor_new(y->dtype, y->rank + 1, dims, &ctx->out[n_state + s]);
                if (st != KILN_OK) goto out;
            }
            kiln_tensor *o = ctx->out[n_state + s];
            int64_t outer = 1, inner = 1;
            for (int d = 0; d < y->rank; d++) {
                if (d < a) outer *= y->dims[d];
                else inner *= y->dims[d];
            }
            bool same = o->dtype == y->dtype && o->rank == y->rank + 1;
            for (int d = 0, r = 0; same && d < o->rank; d++)
                if (d != a) same = o->dims[d] == y->dims[r++];
            if (!same) {
                st = kiln_node_error(n, KILN_ERR_RUNTIME, "scan output %d changes shape between iterations", s);
                goto out;
            }
            int64_t p = (s < n_out_dirs && out_dirs[s]) ? len - 1 - t : t;
            for (int64_t q = 0; q < outer; q++)
                if ((st = kiln_tensor_copy_elems(o, (q * len + p) * inner, y, q * inner, inner)) != KILN_OK) goto out;
            kiln_tensor_free(y);
            bout[n_state + s] = NULL;
        }
    }
    for (int k = 0; k < n_state; k++) {
        ctx->out[k] = state[k];
        state[k] = NULL;
    }
    for (int s = 0; s < k_out; s++) {
        if (ctx->out[n_state + s]) continue;
        /* zero iterations: empty outputs of the body's declared type */
        const struct kiln_type *bt = &body->values[body->outputs[n_state + s]].type;
        st = stack(n, NULL, 0, bt, &ctx->out[n_state + s]);
        if (st != KILN_OK) goto out;
        /* the empty axis where scan_output_axes puts it (stack put it first) */
        kiln_tensor *o = ctx->out[n_state + s];
        int a;
        st = kiln_norm_axis(n, s < n_out_axes ? out_axes[s] : 0, o->rank, &a);
        if (st != KILN_OK) goto out;
        for (int d = 0; d < a; d++) o->dims[d] = o->dims[d + 1];
        o->dims[a] = 0;
    }
out:
    if (bout)
        for (int k = 0; k < ctx->n_out; k++) kiln_tensor_free(bout[k]);
    if (state)
        for (int k = 0; k < n_state; k++) kiln_tensor_free(state[k]);
    if (slices)
        for (int j = 0; j < m; j++) kiln_tensor_free(slices[j]);
    if (st != KILN_OK)
        for (int k = 0; k < ctx->n_out; k++) {
            kiln_tensor_free(ctx->out[k]);
            ctx->out[k] = NULL;
        }
    free(bin);
    free(bout);
    free(state);
    free(slices);
    return st;
}

KILN_REF_OP(Scan, scan_infer, scan_run);
