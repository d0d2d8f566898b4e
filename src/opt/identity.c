/*
 * identity.c - remove nodes that pass their input through unchanged:
 * Identity, Dropout at inference (no mask wanted, training_mode absent or
 * false, or a ratio of 0), Reshape and Expand whose output shape provably equals their
 * input's, Cast to the input's own dtype, and Pad whose pads are all zero (PyTorch
 * exports one before each of DenseNet's transition AveragePools).
 */
#include "kernels/kernel.h"
#include "opt/opt.h"

/* Dropout is a no-op: the mask output is unused and training_mode is absent or false, or
 * the ratio is a constant 0 (nothing dropped, scale 1/(1-0): as torchvision's Swin exports
 * its attention dropout, with training_mode true). */
static bool dropout_noop(const struct kiln_graph *g, const struct kiln_node *n)
{
    if (n->n_out > 1 && n->out[1] >= 0 && g->values[n->out[1]].uses > 0) return false;
    if (n->n_in > 2 && n->in[2] >= 0) {
        const kiln_tensor *t = kiln_opt_const(g, n->in[2]);
        if (!t || kiln_tensor_count(t) != 1) return false;
        if (kiln_get_f64(t->dtype, t->data, 0) != 0.0) {
            const kiln_tensor *r = n->n_in > 1 && n->in[1] >= 0 ? kiln_opt_const(g, n->in[1]) : NULL;
            if (!r || kiln_tensor_count(r) != 1 || kiln_get_f64(r->dtype, r->data, 0) != 0.0)
                return false;
        }
    }
    return true;
}

/* Pad adds nothing: its pads (input 1 from opset 11, else the attribute) are all zero,
 * whatever the mode, value and axes. */
static bool pad_noop(const struct kiln_graph *g, const struct kiln_node *n)
{
    if (n->opset >= 11) {
        if (n->n_in < 2 || n->in[1] < 0) return false;
        const kiln_tensor *t = kiln_opt_const(g, n->in[1]);
        if (!t || (t->dtype != KILN_DTYPE_I64 && t->dtype != KILN_DTYPE_I32)) return false;
        int64_t c = kiln_tensor_count(t);
        for (int64_t k = 0; k < c; k++)
            if (kiln_get_f64(t->dtype, t->data, k) != 0.0) return false;
        return true;
    }
    const int64_t *v;
    int m = kiln_attr_ints(n, "pads", &v);
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    if (m < 0) return false;
    for (int k = 0; k < m; k++)
        if (v[k] != 0) return false;
    return true;
}

kiln_status kiln_opt_identity(struct kiln_graph *g, struct kiln_opt_pass_log *pl)
{
    for (int i = 0; i < g->n_nodes; i++) {
        struct kiln_node *n = &g->nodes[i];
        if (kiln_opt_node_dead(n) || n->n_in < 1 || n->n_out < 1) continue;
        int in = n->in[0], out = n->out[0];
        if (in < 0 || out < 0) continue;
        const struct kiln_type *ti = &g->values[in].type, *to = &g->values[out].type;
        const char *kind = NULL;
        switch (n->op) {
        case KILN_OP_Identity:
            kind = "Identity";
            break;
        case KILN_OP_Dropout:
            if (dropout_noop(g, n)) kind = "Dropout";
            break;
        case KILN_OP_Reshape:
            if (ti->dtype != KILN_DTYPE_UNDEFINED && kiln_opt_same_shape(ti, to)) kind = "Reshape";
            break;
        case KILN_OP_Expand:
            if (ti->dtype != KILN_DTYPE_UNDEFINED && kiln_opt_same_shape(ti, to)) kind = "Expand";
            break;
        case KILN_OP_Pad:
            if (ti->dtype != KILN_DTYPE_UNDEFINED && kiln_opt_same_shape(ti, to) && pad_noop(g, n))
                kind = "Pad";
            break;
        case KILN_OP_Cast: {
            const struct kiln_attr *a = kiln_node_attr(n, "to");
            if (a && a->type == KILN_ATTR_INT && ti->dtype != KILN_DTYPE_UNDEFINED &&
                kiln_onnx_dtype(a->i) == ti->dtype && ti->dtype != KILN_DTYPE_STRING)
                kind = "Cast";
            break;
        }
        default:
            break;
        }
        if (!kind) continue;
        if (kiln_opt_bypass(g, i, in, out)) kiln_opt_count(pl, kind);
    }
    return KILN_OK;
}
