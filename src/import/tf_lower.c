/*
 * tf_lower.c - TensorFlow ops to Kiln IR: the table and what every lowering
 * shares.
 *
 * tf_ops.def names every TF op Kiln lowers, with its handler, the Kiln op
 * it becomes, a variant argument and an attribute mapping; tf_lower_node
 * finds the node's row and calls the handler. The simple ops are all
 * table-driven: elementwise unary and binary ops, activations, ops that are
 * one Kiln op with attributes renamed or fixed (tfo_lw_mapped), reductions
 * (keep_dims), Identity-likes. Ops that need code live in one file per
 * family (tf_lower.h lists them); this file keeps TensorProto decoding, the
 * attribute and emitting helpers, constants, variables and state writes.
 * Control flow and TensorLists are lowered by tf_control.c, TF1
 * TensorArrays by tf_v1_control.c. A lowering reads the node's attrs, emits
 * IR nodes with ONNX semantics (opset TF_OPSET) into the signature's graph
 * and reports the node's outputs.
 *
 * An IR node whose inputs are all constants (and small) is evaluated here
 * with its reference kernel and replaced by its result, so shape arithmetic
 * on known shapes and transposed weights cost nothing at run time.
 *
 * Identity, Snapshot, StopGradient, PreventGradient, CheckNumerics and
 * IdentityN pass their inputs through; NoOp has no outputs.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tf_lower.h"
#include "kernels/kernel.h"

#define FOLD_MAX_ELEMS 65536 /* constant folding: largest input or output folded */
/* A TensorProto with fewer values than elements repeats its last value (or
 * is zeros): a few bytes can ask for a huge tensor, so expansion is bounded. */
#define EXPAND_MAX_BYTES ((int64_t)1 << 28)
#define EXPAND_MAX_STRINGS ((int64_t)1 << 20) /* strings one value may be repeated into */


/* ---- TensorProto ---- */

/* Decode TF's tensor_content encoding of strings: all lengths as varint32,
 * then all bytes. */
static kiln_status strings_from_content(const KilnSm__TensorProto *tp, const char *what,
                                        kiln_tensor *t, int64_t n)
{
    const uint8_t *p = tp->tensor_content.data;
    size_t len = tp->tensor_content.len, pos = 0;
    uint64_t *lens = malloc(sizeof *lens * ((size_t)n + 1));
    if (!lens) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_status st = KILN_OK;
    for (int64_t i = 0; i < n; i++) {
        uint64_t v = 0;
        int shift = 0;
        for (;;) {
            if (pos >= len || shift > 28) {
                st = kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s': malformed string content",
                                what);
                goto out;
            }
            uint8_t byte = p[pos++];
            v |= (uint64_t)(byte & 0x7f) << shift;
            shift += 7;
            if (!(byte & 0x80)) break;
        }
        lens[i] = v;
    }
    for (int64_t i = 0; i < n; i++) {
        if (lens[i] > len - pos) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s': string %lld runs past the "
                            "content", what, (long long)i);
            goto out;
        }
        if ((st = kiln_tensor_set_string(t, (size_t)i, (const char *)p + pos, lens[i])) != KILN_OK)
            goto out;
        pos += lens[i];
    }
out:
    free(lens);
    return st;
}

kiln_status kiln_tf_tensor_from_proto(const KilnSm__TensorProto *tp, const char *what,
                                      kiln_tensor **out)
{
    int code = tp->has_dtype ? tp->dtype : 0;
    kiln_dtype dt = tf_dtype(code);
    if (dt == KILN_DTYPE_UNDEFINED)
        return kiln_error(code ? KILN_ERR_UNSUPPORTED : KILN_ERR_INVALID_MODEL,
                          "tensor '%s' has dtype %s, which Kiln does not support", what,
                          code ? tf_dtype_name(code) : "(none)");
    int64_t dims[KILN_MAX_RANK];
    int rank = 0;
    if (tp->tensor_shape) {
        if (tp->tensor_shape->unknown_rank)
            return kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s' has unknown rank", what);
        if (tp->tensor_shape->n_dim > KILN_MAX_RANK)
            return kiln_error(KILN_ERR_UNSUPPORTED, "tensor '%s': rank %zu exceeds Kiln's "
                              "maximum %d", what, tp->tensor_shape->n_dim, KILN_MAX_RANK);
        rank = (int)tp->tensor_shape->n_dim;
        for (int i = 0; i < rank; i++) {
            dims[i] = tp->tensor_shape->dim[i]->size;
            if (dims[i] < 0)
                return kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s': dim %d is %lld", what, i,
                                  (long long)dims[i]);
        }
    }
    int64_t n = kiln_shape_count(rank, dims);
    char sbuf[160];
    size_t es = kiln_dtype_size(dt);
    if (n < 0 || n * (int64_t)es > KILN_TENSOR_MAX_BYTES)
        return kiln_error(KILN_ERR_INVALID_MODEL, "tensor '%s': shape %s is too large", what,
                          kiln_shape_str(rank, dims, sbuf, sizeof sbuf));
    /* check the stored count before allocating what the shape asks for */
    size_t have = 0;
    if (tp->tensor_content.len) {
        /* each string takes at least its one-byte length prefix: the shape may
         * not claim more strings than the bytes can hold */
        if (dt == KILN_DTYPE_STRING && (uint64_t)n > tp->tensor_content.len)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s': tensor_content has %zu bytes, too few for the %lld "
                              "strings of shape %s",
                              what, tp->tensor_content.len, (long long)n,
                              kiln_shape_str(rank, dims, sbuf, sizeof sbuf));
        if (dt != KILN_DTYPE_STRING && tp->tensor_content.len != (size_t)n * es)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s': tensor_content has %zu bytes but shape %s of %s "
                              "needs %lld",
                              what, tp->tensor_content.len,
                              kiln_shape_str(rank, dims, sbuf, sizeof sbuf), kiln_dtype_name(dt),
                              (long long)(n * (int64_t)es));
    } else {
        switch (dt) {
        case KILN_DTYPE_F32: have = tp->n_float_val; break;
        case KILN_DTYPE_F64: have = tp->n_double_val; break;
        case KILN_DTYPE_I32: case KILN_DTYPE_I16: case KILN_DTYPE_I8: case KILN_DTYPE_U8:
        case KILN_DTYPE_U16: have = tp->n_int_val; break;
        case KILN_DTYPE_I64: have = tp->n_int64_val; break;
        case KILN_DTYPE_U32: have = tp->n_uint32_val; break;
        case KILN_DTYPE_U64: have = tp->n_uint64_val; break;
        case KILN_DTYPE_BOOL: have = tp->n_bool_val; break;
        case KILN_DTYPE_F16: case KILN_DTYPE_BF16: have = tp->n_half_val; break;
        case KILN_DTYPE_STRING: have = tp->n_string_val; break;
        default: break;
        }
        if (have > (uint64_t)n)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "tensor '%s' holds %zu values but shape %s has %lld elements",
                              what, have, kiln_shape_str(rank, dims, sbuf, sizeof sbuf),
                              (long long)n);
        /* repeated strings are each a copy: count their bytes, and their number */
        if (dt == KILN_DTYPE_STRING && have > 0 && have < (uint64_t)n &&
            (n > EXPAND_MAX_STRINGS ||
             (uint64_t)n * (es + tp->string_val[have - 1].len) > (uint64_t)EXPAND_MAX_BYTES))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "tensor '%s': shape %s would repeat a %zu-byte string %lld times; "
                              "Kiln expands at most %lld strings and %lld bytes",
                              what, kiln_shape_str(rank, dims, sbuf, sizeof sbuf),
                              tp->string_val[have - 1].len, (long long)(n - (int64_t)have),
                              (long long)EXPAND_MAX_STRINGS, (long long)EXPAND_MAX_BYTES);
        if (have < (uint64_t)n && n * (int64_t)es > EXPAND_MAX_BYTES)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "tensor '%s': shape %s (%lld bytes) would be filled from %zu "
                              "stored values; Kiln expands at most %lld bytes",
                              what, kiln_shape_str(rank, dims, sbuf, sizeof sbuf),
                              (long long)(n * (int64_t)es), have, (long long)EXPAND_MAX_BYTES);
    }
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(dt, rank, dims, &t);
    if (st != KILN_OK) return kiln_error_wrap(st, "tensor '%s'", what);
    if (tp->tensor_content.len) {
        if (dt == KILN_DTYPE_STRING) {
            st = strings_from_content(tp, what, t, n);
        } else {
            memcpy(t->data, tp->tensor_content.data, tp->tensor_content.len);
            if (dt == KILN_DTYPE_BOOL)
                for (int64_t i = 0; i < n; i++) ((uint8_t *)t->data)[i] = ((uint8_t *)t->data)[i] != 0;
        }
    } else if (have > 0) {
        /* fewer values than elements: the last one repeats (TensorFlow's rule) */
        for (int64_t i = 0; i < n && st == KILN_OK; i++) {
            size_t j = (size_t)i < have ? (size_t)i : have - 1;
            switch (dt) {
            case KILN_DTYPE_F32: ((float *)t->data)[i] = tp->float_val[j]; break;
            case KILN_DTYPE_F64: ((double *)t->data)[i] = tp->double_val[j]; break;
            case KILN_DTYPE_I32: case KILN_DTYPE_I16: case KILN_DTYPE_I8: case KILN_DTYPE_U8:
            case KILN_DTYPE_U16: kiln_set_i64(dt, t->data, i, tp->int_val[j]); break;
            case KILN_DTYPE_I64: ((int64_t *)t->data)[i] = tp->int64_val[j]; break;
            case KILN_DTYPE_U32: ((uint32_t *)t->data)[i] = tp->uint32_val[j]; break;
            case KILN_DTYPE_U64: ((uint64_t *)t->data)[i] = tp->uint64_val[j]; break;
            case KILN_DTYPE_BOOL: ((uint8_t *)t->data)[i] = tp->bool_val[j] != 0; break;
            case KILN_DTYPE_F16: case KILN_DTYPE_BF16:
                ((uint16_t *)t->data)[i] = (uint16_t)tp->half_val[j];
                break;
            case KILN_DTYPE_STRING:
                st = kiln_tensor_set_string(t, (size_t)i, (const char *)tp->string_val[j].data,
                                            tp->string_val[j].len);
                break;
            default: break;
            }
        }
    }
    if (st != KILN_OK) {
        kiln_tensor_free(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}

/* ---- attributes ---- */

const KilnSm__AttrValue *tfo_attr(L_t *L, const char *key) { return tf_attr(L->nd, L->inst, key); }

int64_t tfo_attr_int(L_t *L, const char *key, int64_t dflt)
{
    const KilnSm__AttrValue *v = tfo_attr(L, key);
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_I) return v->i;
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_B) return v->b;
    return dflt;
}

bool tfo_attr_bool(L_t *L, const char *key, bool dflt)
{
    const KilnSm__AttrValue *v = tfo_attr(L, key);
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_B) return v->b != 0;
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_I) return v->i != 0;
    return dflt;
}

float tfo_attr_float(L_t *L, const char *key, float dflt)
{
    const KilnSm__AttrValue *v = tfo_attr(L, key);
    return v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_F ? v->f : dflt;
}

/* A string attr (bytes) as a NUL-terminated copy in the graph arena, or dflt. */
const char *tfo_attr_str(L_t *L, const char *key, const char *dflt)
{
    const KilnSm__AttrValue *v = tfo_attr(L, key);
    if (!v || v->value_case != KILN_SM__ATTR_VALUE__VALUE_S) return dflt;
    char *s = kiln_arena_strndup(L->g->mem, (const char *)v->s.data, v->s.len);
    return s ? s : dflt;
}

kiln_dtype tfo_attr_dtype(L_t *L, const char *key)
{
    const KilnSm__AttrValue *v = tfo_attr(L, key);
    return v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype(v->type)
                                                                 : KILN_DTYPE_UNDEFINED;
}

/* list(int) attr: count (-1 if absent). */
int tfo_attr_ints(L_t *L, const char *key, const int64_t **vals)
{
    const KilnSm__AttrValue *v = tfo_attr(L, key);
    if (!v || v->value_case != KILN_SM__ATTR_VALUE__VALUE_LIST) return -1;
    *vals = v->list->i;
    return (int)v->list->n_i;
}

/* ---- errors ---- */

static kiln_status node_verr(const L_t *L, kiln_status st, const char *fmt, va_list ap)
{
    char msg[600];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return kiln_error(st, "%s: node '%s' (op %s): %s", L->where, L->nd->name, L->nd->op, msg);
}

kiln_status tfo_lerr(L_t *L, kiln_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kiln_status r = node_verr(L, st, fmt, ap);
    va_end(ap);
    return r;
}

/* ---- emitting IR ---- */

kiln_status tfo_set_outputs(L_t *L, int n)
{
    L->n_out = n;
    L->out = kiln_arena_alloc(L->g->mem, sizeof *L->out * ((size_t)n + 1));
    if (!L->out) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) L->out[i] = (struct tf_sym){.v = -1, .var = -1};
    return KILN_OK;
}

kiln_status tfo_out1(L_t *L, int v)
{
    kiln_status st = tfo_set_outputs(L, 1);
    if (st == KILN_OK) L->out[0].v = v;
    return st;
}

kiln_status tfo_in_value(L_t *L, int k, int *v)
{
    if (k >= L->n_in)
        return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs, needs at least %d", L->n_in, k + 1);
    if (L->in[k].rnd)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED,
                    "input %d is random (from RandomUniform node '%s'); Kiln does not evaluate "
                    "random ops, and accepts them only where the result does not depend on "
                    "the values drawn (dropout with keep probability 1)",
                    k, L->in[k].rnd_node);
    if (L->in[k].v < 0 && L->in[k].var >= 0 && !tf_var_is_resource(L->b, L->in[k].var)) {
        /* a TF1 variable: its endpoint is its value */
        kiln_status st = tf_var_value(L->b, L->in[k].var, v);
        return st == KILN_OK ? st : kiln_error_wrap(st, "%s", L->where);
    }
    if (L->in[k].v < 0)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "input %d is a resource handle, not a tensor", k);
    *v = L->in[k].v;
    return KILN_OK;
}

const struct kiln_type *tfo_vtype(L_t *L, int v) { return &L->g->values[v].type; }

const kiln_tensor *tfo_vconst(L_t *L, int v)
{
    return v >= 0 && L->g->values[v].kind == KILN_VALUE_CONST ? L->g->values[v].konst : NULL;
}

static kiln_status const_tensor(L_t *L, kiln_tensor *t, int *id)
{
    kiln_status st = kiln_graph_own_tensor(L->g, t);
    if (st != KILN_OK) return st;
    if ((st = kiln_graph_value_add(L->g, L->name, KILN_VALUE_CONST, id)) != KILN_OK) return st;
    L->g->values[*id].konst = t;
    kiln_type_from_tensor(&L->g->values[*id].type, t);
    return KILN_OK;
}

/* A 1-D (rank 1) or scalar (rank 0) int64 constant. */
kiln_status tfo_const_i64(L_t *L, int rank, int n, const int64_t *vals, int *id)
{
    int64_t d = n;
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, rank, &d, &t);
    if (st != KILN_OK) return st;
    if (n) memcpy(t->data, vals, sizeof(int64_t) * (size_t)n);
    return const_tensor(L, t, id);
}

/* A scalar of dtype dt holding v. */
kiln_status tfo_const_scalar(L_t *L, kiln_dtype dt, double v, int *id)
{
    if (dt == KILN_DTYPE_UNDEFINED || dt == KILN_DTYPE_STRING)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "needs a numeric input type, got %s",
                    kiln_dtype_name(dt));
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(dt, 0, NULL, &t);
    if (st != KILN_OK) return st;
    if (kiln_dtype_is_float(dt)) kiln_set_f64(dt, t->data, 0, v);
    else kiln_set_i64(dt, t->data, 0, (int64_t)v);
    return const_tensor(L, t, id);
}

/* Run node n (the graph's last) on its constant inputs and turn its outputs
 * into constants. *folded is false when it could not be evaluated. */
static kiln_status try_fold(L_t *L, struct kiln_node *n, bool *folded)
{
    struct kiln_graph *g = L->g;
    *folded = false;
    const struct kiln_op_impl *impl = kiln_op_impl(n->op);
    unsigned flags = kiln_op_info(n->op)->flags;
    if (!impl || !impl->infer || !impl->run || (flags & (KILN_OPF_DYNOUT | KILN_OPF_SUBGRAPH)))
        return KILN_OK;
    if (n->n_in > KILN_MAX_IO || n->n_out > KILN_MAX_IO || n->n_out < 1) return KILN_OK;
    kiln_tensor *in[KILN_MAX_IO];
    struct kiln_type intype[KILN_MAX_IO];
    const struct kiln_type *inp[KILN_MAX_IO];
    for (int k = 0; k < n->n_in; k++) {
        in[k] = NULL;
        inp[k] = NULL;
        if (n->in[k] < 0) continue;
        kiln_tensor *t = (kiln_tensor *)tfo_vconst(L, n->in[k]);
        if (!t || kiln_tensor_count(t) > FOLD_MAX_ELEMS) return KILN_OK;
        in[k] = t;
        kiln_type_from_tensor(&intype[k], t);
        inp[k] = &intype[k];
    }
    struct kiln_type outtype[KILN_MAX_IO];
    struct kiln_type *outp[KILN_MAX_IO];
    kiln_tensor *out[KILN_MAX_IO] = {0};
    for (int k = 0; k < n->n_out; k++) {
        kiln_type_unknown(&outtype[k]);
        outp[k] = &outtype[k];
    }
    struct kiln_infer_ctx ictx = {n, n->n_in, inp, (const kiln_tensor *const *)in, n->n_out, outp};
    kiln_status st = impl->infer(&ictx);
    if (kiln_attr_check(n) != KILN_OK) st = KILN_ERR_INVALID_MODEL;
    if (st != KILN_OK) goto fail;
    for (int k = 0; k < n->n_out; k++) {
        int64_t cnt = kiln_type_is_concrete(&outtype[k])
                          ? kiln_shape_count(outtype[k].rank, outtype[k].dims)
                          : -1;
        if (cnt < 0 || cnt > FOLD_MAX_ELEMS) goto fail;
        st = kiln_tensor_new(outtype[k].dtype, outtype[k].rank, outtype[k].dims, &out[k]);
        if (st != KILN_OK) goto fail;
    }
    struct kiln_run_ctx rctx = {n, n->n_in, in, n->n_out, out, NULL, NULL, 1};
    st = impl->run(&rctx);
    if (kiln_attr_check(n) != KILN_OK) st = KILN_ERR_INVALID_MODEL;
    if (st != KILN_OK) goto fail;
    int outs[KILN_MAX_IO];
    for (int k = 0; k < n->n_out; k++) outs[k] = n->out[k];
    g->n_nodes--; /* n was the last node; it is replaced by its results */
    for (int k = 0; k < n->n_out; k++) {
        if (outs[k] < 0) {
            kiln_tensor_free(out[k]);
            continue;
        }
        if ((st = kiln_graph_own_tensor(g, out[k])) != KILN_OK) {
            for (int j = k + 1; j < n->n_out; j++) kiln_tensor_free(out[j]);
            return st;
        }
        struct kiln_value *v = &g->values[outs[k]];
        v->kind = KILN_VALUE_CONST;
        v->producer = -1;
        v->konst = out[k];
        kiln_type_from_tensor(&v->type, out[k]);
    }
    *folded = true;
    return KILN_OK;
fail:
    for (int k = 0; k < n->n_out; k++) kiln_tensor_free(out[k]);
    kiln_error_clear();
    return KILN_OK;
}

/* Static types of n's outputs from its inputs (lenient: unknown stays unknown). */
static void infer_static(L_t *L, struct kiln_node *n)
{
    const struct kiln_op_impl *impl = kiln_op_impl(n->op);
    if (!impl || !impl->infer || n->n_in > KILN_MAX_IO || n->n_out > KILN_MAX_IO) return;
    const struct kiln_type *in[KILN_MAX_IO];
    const kiln_tensor *inv[KILN_MAX_IO];
    struct kiln_type outtype[KILN_MAX_IO];
    struct kiln_type *outp[KILN_MAX_IO];
    for (int k = 0; k < n->n_in; k++) {
        in[k] = n->in[k] >= 0 ? tfo_vtype(L, n->in[k]) : NULL;
        inv[k] = n->in[k] >= 0 ? tfo_vconst(L, n->in[k]) : NULL;
    }
    for (int k = 0; k < n->n_out; k++) {
        kiln_type_unknown(&outtype[k]);
        outp[k] = n->out[k] >= 0 ? &outtype[k] : NULL;
    }
    struct kiln_infer_ctx ctx = {n, n->n_in, in, inv, n->n_out, outp};
    kiln_status st = impl->infer(&ctx);
    if (kiln_attr_check(n) != KILN_OK) st = KILN_ERR_INVALID_MODEL;
    if (st != KILN_OK) {
        kiln_error_clear();
        return;
    }
    for (int k = 0; k < n->n_out; k++)
        if (n->out[k] >= 0) L->g->values[n->out[k]].type = outtype[k];
}

static struct kiln_node *enode(struct emit *e) { return &e->L->g->nodes[e->node]; }

kiln_status tfo_node_begin(L_t *L, enum kiln_op op, int n_in, const int *in, int n_out,
                              int cap_attr, struct emit *e)
{
    if (n_in > KILN_MAX_IO || n_out > KILN_MAX_IO)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "needs a %s node with %d inputs and %d outputs, "
                    "more than Kiln's limit of %d", kiln_op_name(op), n_in, n_out, KILN_MAX_IO);
    for (int k = 0; k < n_in; k++)
        if (in[k] < -1 || in[k] >= L->g->n_values)
            return tfo_lerr(L, KILN_ERR_INTERNAL, "bad IR input %d", k);
    struct kiln_node *n;
    kiln_status st = kiln_graph_node_add(L->g, op, L->name, n_in, n_out, cap_attr, &n);
    if (st != KILN_OK) return st;
    n->opset = TF_OPSET;
    n->op_type = kiln_op_name(op);
    n->n_attr = 0;
    for (int k = 0; k < n_in; k++) n->in[k] = in[k];
    e->L = L;
    e->node = L->g->n_nodes - 1;
    e->cap_attr = cap_attr;
    for (int k = 0; k < n_out; k++) {
        int id = -1;
        if ((st = kiln_graph_value_add(L->g, L->name, KILN_VALUE_NODE, &id)) != KILN_OK) return st;
        enode(e)->out[k] = id;
        L->g->values[id].producer = e->node;
    }
    return KILN_OK;
}

struct kiln_attr *tfo_a_new(struct emit *e, const char *name, enum kiln_attr_type type)
{
    struct kiln_node *n = enode(e);
    KILN_ASSERT(n->n_attr < e->cap_attr);
    struct kiln_attr *a = &n->attr[n->n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = type;
    return a;
}

void tfo_a_int(struct emit *e, const char *name, int64_t v) { tfo_a_new(e, name, KILN_ATTR_INT)->i = v; }
void tfo_a_float(struct emit *e, const char *name, float v) { tfo_a_new(e, name, KILN_ATTR_FLOAT)->f = v; }

kiln_status tfo_a_str(struct emit *e, const char *name, const char *s, size_t len)
{
    struct kiln_attr *a = tfo_a_new(e, name, KILN_ATTR_STRING);
    a->s.data = kiln_arena_strndup(e->L->g->mem, s, len);
    a->s.len = len;
    return a->s.data ? KILN_OK : kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
}

kiln_status tfo_a_ints(struct emit *e, const char *name, int n, const int64_t *v)
{
    struct kiln_attr *a = tfo_a_new(e, name, KILN_ATTR_INTS);
    a->n = n;
    a->ints = kiln_arena_alloc(e->L->g->mem, sizeof(int64_t) * ((size_t)n + 1));
    if (!a->ints) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (n) memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
    return KILN_OK;
}

/* Finish the open node: fold it if its inputs are constants, else infer
 * its static types. outs (may be NULL) receives its output value ids. */
kiln_status tfo_node_end(struct emit *e, int *outs)
{
    L_t *L = e->L;
    struct kiln_node *n = enode(e);
    int n_out = n->n_out;
    int ids[KILN_MAX_IO];
    for (int k = 0; k < n_out && k < KILN_MAX_IO; k++) ids[k] = n->out[k];
    bool all_const = n->n_in > 0 && !(kiln_op_info(n->op)->flags & KILN_OPF_STATEFUL);
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] >= 0 && !tfo_vconst(L, n->in[k])) all_const = false;
    bool folded = false;
    if (all_const && e->node == L->g->n_nodes - 1) {
        kiln_status st = try_fold(L, n, &folded);
        if (st != KILN_OK) return st;
    }
    if (!folded) infer_static(L, n);
    if (outs)
        for (int k = 0; k < n_out && k < KILN_MAX_IO; k++) outs[k] = ids[k];
    return KILN_OK;
}

/* One-output node with no attributes. */
kiln_status tfo_op1(L_t *L, enum kiln_op op, int n_in, const int *in, int *out)
{
    struct emit e;
    kiln_status st = tfo_node_begin(L, op, n_in, in, 1, 0, &e);
    if (st == KILN_OK) st = tfo_node_end(&e, out);
    return st;
}

kiln_status tfo_un(L_t *L, enum kiln_op op, int x, int *out) { return tfo_op1(L, op, 1, &x, out); }

kiln_status tfo_bin(L_t *L, enum kiln_op op, int a, int b, int *out)
{
    int in[2] = {a, b};
    return tfo_op1(L, op, 2, in, out);
}

kiln_status tfo_cast_to(L_t *L, int x, kiln_dtype dt, int *out)
{
    if (tfo_vtype(L, x)->dtype == dt) {
        *out = x;
        return KILN_OK;
    }
    int code = kiln_onnx_dtype_code(dt);
    if (!code) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "cannot cast to %s", kiln_dtype_name(dt));
    struct emit e;
    kiln_status st = tfo_node_begin(L, KILN_OP_Cast, 1, &x, 1, 1, &e);
    if (st != KILN_OK) return st;
    tfo_a_int(&e, "to", code);
    return tfo_node_end(&e, out);
}

kiln_status tfo_transpose(L_t *L, int x, int rank, const int64_t *perm, int *out)
{
    struct emit e;
    kiln_status st = tfo_node_begin(L, KILN_OP_Transpose, 1, &x, 1, 1, &e);
    if (st != KILN_OK) return st;
    if ((st = tfo_a_ints(&e, "perm", rank, perm)) != KILN_OK) return st;
    return tfo_node_end(&e, out);
}

/* Reshape x to shape (given as values). */
kiln_status tfo_reshape_to(L_t *L, int x, int n, const int64_t *shape, int *out)
{
    int s = -1;
    kiln_status st = tfo_const_i64(L, 1, n, shape, &s);
    if (st != KILN_OK) return st;
    struct emit e;
    int in[2] = {x, s};
    if ((st = tfo_node_begin(L, KILN_OP_Reshape, 2, in, 1, 1, &e)) != KILN_OK) return st;
    tfo_a_int(&e, "allowzero", 1);
    return tfo_node_end(&e, out);
}

/* An int64 vector from an int tensor of rank 0 or 1 (axes, shapes). */
kiln_status tfo_i64_vector(L_t *L, int x, int *out)
{
    kiln_status st = tfo_cast_to(L, x, KILN_DTYPE_I64, &x);
    if (st != KILN_OK) return st;
    if (tfo_vtype(L, x)->rank == 1) {
        *out = x;
        return KILN_OK;
    }
    int64_t m1 = -1;
    return tfo_reshape_to(L, x, 1, &m1, out);
}

kiln_status tfo_axes_node(L_t *L, enum kiln_op op, int x, int n_axes, const int64_t *axes,
                             int *out)
{
    int a = -1;
    kiln_status st = tfo_const_i64(L, 1, n_axes, axes, &a);
    if (st != KILN_OK) return st;
    return tfo_bin(L, op, x, a, out);
}

/* The values of a constant integer input (NULL if not constant). */
static kiln_status const_ints(L_t *L, int v, int64_t *vals, int max, int *n)
{
    const kiln_tensor *t = tfo_vconst(L, v);
    *n = -1;
    if (!t) return KILN_OK;
    if (!kiln_dtype_is_int(t->dtype) || t->rank > 1)
        return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "expects an integer scalar or vector, got %s rank %d",
                    kiln_dtype_name(t->dtype), t->rank);
    int64_t c = kiln_tensor_count(t);
    if (c > max) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "has %lld values, more than %d", (long long)c, max);
    for (int64_t i = 0; i < c; i++) vals[i] = kiln_tensor_i64(t, i);
    *n = (int)c;
    return KILN_OK;
}

kiln_status tfo_need_const_ints(L_t *L, int k, int64_t *vals, int max, int *n, const char *what)
{
    int v = -1;
    kiln_status st = tfo_in_value(L, k, &v);
    if (st == KILN_OK) st = const_ints(L, v, vals, max, n);
    if (st != KILN_OK) return st;
    if (*n < 0)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "%s (input %d) must be a constant", what, k);
    return KILN_OK;
}

/* The element dtype of the node: attr T (or dtype), else input 0's type. */
kiln_dtype tfo_node_dtype(L_t *L)
{
    kiln_dtype dt = tfo_attr_dtype(L, "T");
    if (dt == KILN_DTYPE_UNDEFINED) dt = tfo_attr_dtype(L, "dtype");
    if (dt == KILN_DTYPE_UNDEFINED && L->n_in > 0 && L->in[0].v >= 0) dt = tfo_vtype(L, L->in[0].v)->dtype;
    return dt;
}
kiln_status tfo_lw_pass(L_t *L, const struct tf_op *e)
{
    (void)e;
    if (L->n_in < 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has no input");
    kiln_status st = tfo_set_outputs(L, 1);
    if (st == KILN_OK) L->out[0] = L->in[0];
    return st;
}

kiln_status tfo_lw_identity_n(L_t *L, const struct tf_op *e)
{
    (void)e;
    kiln_status st = tfo_set_outputs(L, L->n_in);
    for (int k = 0; st == KILN_OK && k < L->n_in; k++) L->out[k] = L->in[k];
    return st;
}

kiln_status tfo_lw_noop(L_t *L, const struct tf_op *e)
{
    (void)e;
    return tfo_set_outputs(L, 0);
}

kiln_status tfo_lw_const(L_t *L, const struct tf_op *e)
{
    (void)e;
    const KilnSm__AttrValue *v = tfo_attr(L, "value");
    if (!v || v->value_case != KILN_SM__ATTR_VALUE__VALUE_TENSOR)
        return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has no 'value' tensor");
    kiln_tensor *t;
    kiln_status st = kiln_tf_tensor_from_proto(v->tensor, L->name, &t);
    if (st != KILN_OK) return kiln_error_wrap(st, "%s", L->where);
    int id = -1;
    if ((st = const_tensor(L, t, &id)) != KILN_OK) return st;
    return tfo_out1(L, id);
}

kiln_status tfo_lw_placeholder_default(L_t *L, const struct tf_op *e)
{
    return tfo_lw_pass(L, e);
}

kiln_status tfo_lw_read_variable(L_t *L, const struct tf_op *e)
{
    (void)e;
    if (L->n_in < 1 || L->in[0].var < 0)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED,
                    "reads a resource that is not a variable of the SavedModel");
    int v = -1;
    kiln_status st = tf_var_value(L->b, L->in[0].var, &v);
    if (st != KILN_OK) return kiln_error_wrap(st, "%s", L->where);
    return tfo_out1(L, v);
}

kiln_status tfo_lw_var_initialized(L_t *L, const struct tf_op *e)
{
    (void)e;
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_BOOL, 0, NULL, &t);
    if (st != KILN_OK) return st;
    ((uint8_t *)t->data)[0] = 1;
    int id = -1;
    if ((st = const_tensor(L, t, &id)) != KILN_OK) return st;
    return tfo_out1(L, id);
}

kiln_status tfo_lw_resource_gather(L_t *L, const struct tf_op *e)
{
    (void)e;
    if (L->n_in < 2 || L->in[0].var < 0)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "gathers from a resource that is not a variable");
    if (tfo_attr_int(L, "batch_dims", 0) != 0)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "batch_dims other than 0 is not supported");
    int v = -1, idx = -1, y = -1;
    kiln_status st = tf_var_value(L->b, L->in[0].var, &v);
    if (st != KILN_OK) return kiln_error_wrap(st, "%s", L->where);
    if ((st = tfo_in_value(L, 1, &idx)) != KILN_OK) return st;
    struct emit em;
    int in[2] = {v, idx};
    if ((st = tfo_node_begin(L, KILN_OP_Gather, 2, in, 1, 1, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "axis", 0);
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_state_write(L_t *L, const struct tf_op *e)
{
    (void)e;
    const char *op = L->nd->op ? L->nd->op : "";
    const char *mode = strcmp(op, "Assign") == 0      ? "assign"
                       : strcmp(op, "AssignAdd") == 0 ? "add"
                       : strcmp(op, "AssignSub") == 0 ? "sub"
                                                      : NULL;
    if (mode && L->n_in >= 2 && L->in[0].var >= 0 && tf_var_written(L->b, L->in[0].var)) {
        int cur = -1, x = -1, y = -1;
        kiln_status st = tf_var_value(L->b, L->in[0].var, &cur); /* restores the value */
        if (st != KILN_OK) return kiln_error_wrap(st, "%s", L->where);
        const kiln_tensor *var = L->g->values[cur].kind == KILN_VALUE_NODE
                                     ? kiln_attr_tensor(&L->g->nodes[L->g->values[cur].producer], "var")
                                     : NULL;
        if (!var) return tfo_lerr(L, KILN_ERR_INTERNAL, "variable has no state");
        if ((st = tfo_in_value(L, 1, &x)) != KILN_OK) return st;
        struct emit em;
        if ((st = tfo_node_begin(L, KILN_OP_TfAssign, 1, &x, 1, 2, &em)) != KILN_OK) return st;
        tfo_a_new(&em, "var", KILN_ATTR_TENSOR)->t = (kiln_tensor *)var;
        if ((st = tfo_a_str(&em, "mode", mode, strlen(mode))) != KILN_OK) return st;
        if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
        return tfo_out1(L, y);
    }
    const char *var = L->n_in > 0 && L->in[0].var >= 0 ? tf_var_name(L->b, L->in[0].var) : NULL;
    return tfo_lerr(L, KILN_ERR_UNSUPPORTED,
                "writes %s%s%s; Kiln models are immutable, so signatures that change variables "
                "are not supported",
                var ? "variable '" : "state", var ? var : "", var ? "'" : "");
}
/* ---- the table: tf_ops.def ---- */

#define KILN_OP_none 0
#define NO_ATTRS {{NULL, 0, NULL, 0}}
#define A_FLOAT(kiln, tf, dflt) {{kiln, KILN_ATTR_FLOAT, tf, dflt}}
#define A_INT(kiln, tf, dflt) {{kiln, KILN_ATTR_INT, tf, dflt}}

static const struct tf_op LOWER[] = {
#define TF_OP(tf, lowering, kop, arg, attrs) \
    {#tf, tfo_lw_##lowering, (enum kiln_op)KILN_OP_##kop, arg, attrs},
#include "import/tf_ops.def"
#undef TF_OP
};

static const char *const STATE_WRITERS[] = {
    "Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp", "ScatterUpdate", "ScatterAdd", "ScatterSub", "ScatterMul",
    "ScatterDiv", "ScatterNdUpdate", "ScatterNdAdd", "ResourceScatterUpdate",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterNdUpdate",
    "ResourceScatterNdAdd", "CountUpTo", "ResourceCountUpTo", "DestroyResourceOp",
};

bool tf_op_writes_state(const char *op)
{
    for (size_t i = 0; i < sizeof STATE_WRITERS / sizeof *STATE_WRITERS; i++)
        if (strcmp(op, STATE_WRITERS[i]) == 0) return true;
    return strncmp(op, "Apply", 5) == 0 || strncmp(op, "ResourceApply", 13) == 0 ||
           strncmp(op, "ResourceSparseApply", 19) == 0 || strncmp(op, "SparseApply", 11) == 0;
}

/* ---- the emitting helpers, for the op-family files (tf_import.h) ---- */

kiln_status tf_emit(struct tf_node_ctx *L, enum kiln_op op, int n_in, const int *in, int n_out,
                    const struct kiln_attr *attrs, int n_attrs, int *outs)
{
    struct emit e;
    kiln_status st = tfo_node_begin(L, op, n_in, in, n_out, n_attrs, &e);
    if (st != KILN_OK) return st;
    for (int i = 0; i < n_attrs; i++) *tfo_a_new(&e, attrs[i].name, attrs[i].type) = attrs[i];
    return tfo_node_end(&e, outs);
}

kiln_status tf_const(struct tf_node_ctx *L, kiln_tensor *t, int *id) { return const_tensor(L, t, id); }

kiln_status tf_const_i64(struct tf_node_ctx *L, int rank, int n, const int64_t *vals, int *id)
{
    return tfo_const_i64(L, rank, n, vals, id);
}

kiln_status tf_cast_to(struct tf_node_ctx *L, int x, kiln_dtype dt, int *out)
{
    return tfo_cast_to(L, x, dt, out);
}

kiln_status tf_in_value(struct tf_node_ctx *L, int k, int *v) { return tfo_in_value(L, k, v); }

kiln_status tf_node_err(const struct tf_node_ctx *L, kiln_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kiln_status r = node_verr(L, st, fmt, ap);
    va_end(ap);
    return r;
}

kiln_status tf_lower_node(struct tf_node_ctx *L)
{
    const char *op = L->nd->op ? L->nd->op : "";
    if (tf_control_handles(op)) {
        kiln_status st = tf_control_lower(L);
        if (st == KILN_OK && !L->out) st = tfo_set_outputs(L, 0);
        return st;
    }
    if (tf_v1_control_handles(op)) {
        kiln_status st = tf_v1_control_lower(L);
        if (st == KILN_OK && !L->out) st = tfo_set_outputs(L, 0);
        return st;
    }
    for (size_t i = 0; i < sizeof LOWER / sizeof *LOWER; i++)
        if (strcmp(op, LOWER[i].tf) == 0) {
            kiln_status st = LOWER[i].fn(L, &LOWER[i]);
            if (st == KILN_OK && !L->out) st = tfo_set_outputs(L, 0);
            return st;
        }
    if (tf_op_writes_state(op)) return tfo_lw_state_write(L, NULL);
    return kiln_error(KILN_ERR_UNSUPPORTED, "%s: node '%s' uses op '%s', which Kiln does not support",
                      L->where, L->nd->name, op);
}

/* ---- output arguments of multi-output ops ---- */

struct out_arg {
    const char *name;
    char kind;          /* '1' one tensor, 'n' count from int attr, 'l' length of list attr */
    const char *attr;
};

struct out_args {
    const char *op;
    struct out_arg args[6];
};

static const struct out_args OUT_ARGS[] = {
    {"FusedBatchNorm", {{"y", '1', 0}, {"batch_mean", '1', 0}, {"batch_variance", '1', 0},
                        {"reserve_space_1", '1', 0}, {"reserve_space_2", '1', 0}}},
    {"FusedBatchNormV2", {{"y", '1', 0}, {"batch_mean", '1', 0}, {"batch_variance", '1', 0},
                          {"reserve_space_1", '1', 0}, {"reserve_space_2", '1', 0}}},
    {"FusedBatchNormV3", {{"y", '1', 0}, {"batch_mean", '1', 0}, {"batch_variance", '1', 0},
                          {"reserve_space_1", '1', 0}, {"reserve_space_2", '1', 0},
                          {"reserve_space_3", '1', 0}}},
    {"TopKV2", {{"values", '1', 0}, {"indices", '1', 0}}},
    {"Unique", {{"y", '1', 0}, {"idx", '1', 0}}},
    {"StringSplit", {{"indices", '1', 0}, {"values", '1', 0}, {"shape", '1', 0}}},
    {"StringSplitV2", {{"indices", '1', 0}, {"values", '1', 0}, {"shape", '1', 0}}},
    {"ParseExample", {{"sparse_indices", 'n', "Nsparse"}, {"sparse_values", 'l', "sparse_types"},
                      {"sparse_shapes", 'n', "Nsparse"}, {"dense_values", 'l', "Tdense"}}},
    {"ParseExampleV2", {{"sparse_indices", 'n', "num_sparse"}, {"sparse_values", 'l', "sparse_types"},
                        {"sparse_shapes", 'n', "num_sparse"}, {"dense_values", 'l', "Tdense"},
                        {"ragged_values", 'l', "ragged_value_types"},
                        {"ragged_row_splits", 'l', "ragged_split_types"}}},
};

kiln_status tf_output_index(const KilnSm__NodeDef *nd, const KilnSm__NameAttrList *inst,
                            const char *arg, int idx, int *flat)
{
    const char *op = nd->op ? nd->op : "";
    for (size_t i = 0; i < sizeof OUT_ARGS / sizeof *OUT_ARGS; i++) {
        if (strcmp(op, OUT_ARGS[i].op) != 0) continue;
        int off = 0;
        for (int k = 0; k < 6 && OUT_ARGS[i].args[k].name; k++) {
            const struct out_arg *oa = &OUT_ARGS[i].args[k];
            int n = 1;
            if (oa->kind != '1') {
                const KilnSm__AttrValue *v = tf_attr(nd, inst, oa->attr);
                n = 0;
                if (v && oa->kind == 'n' && v->value_case == KILN_SM__ATTR_VALUE__VALUE_I &&
                    v->i >= 0 && v->i < 4096)
                    n = (int)v->i;
                if (v && oa->kind == 'l' && v->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST)
                    n = (int)v->list->n_type;
            }
            if (strcmp(arg, oa->name) == 0) {
                if (idx >= n)
                    return kiln_error(KILN_ERR_INVALID_MODEL,
                                      "output '%s:%d' is out of range (%d tensors)", arg, idx, n);
                *flat = off + idx;
                return KILN_OK;
            }
            off += n;
        }
        return kiln_error(KILN_ERR_INVALID_MODEL, "op %s has no output named '%s'", op, arg);
    }
    /* every other op has one output argument (possibly a list) */
    *flat = idx;
    return KILN_OK;
}
