/*
 * tf_lower.c - TensorFlow ops to Kiln IR.
 *
 * One lowering function per TF op (or family), chosen from a table by op
 * name; ops that are one Kiln op with attributes renamed or fixed share
 * lw_mapped and a table of attribute mappings (MAPPED). Control flow and
 * TensorLists are lowered by tf_control.c. A lowering reads the node's attrs, emits IR nodes with ONNX
 * semantics (opset TF_OPSET) into the signature's graph and reports the
 * node's outputs. TF's NHWC convolutions and pools become Transpose + NCHW
 * op + Transpose; MatMul's transpose flags become Transposes; BiasAdd is
 * an Add; FusedBatchNorm in inference mode is a per-channel multiply-add;
 * StridedSlice's masks become Slice + Squeeze + Unsqueeze. Inputs that
 * TensorFlow passes as tensors but ONNX wants as attributes (Transpose's
 * perm, ConcatV2's axis, ...) must be constants.
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
#include "import/tf_import.h"
#include "kernels/kernel.h"

#define FOLD_MAX_ELEMS 65536 /* constant folding: largest input or output folded */
/* A TensorProto with fewer values than elements repeats its last value (or
 * is zeros): a few bytes can ask for a huge tensor, so expansion is bounded. */
#define EXPAND_MAX_BYTES ((int64_t)1 << 28)
#define EXPAND_MAX_STRINGS ((int64_t)1 << 20) /* strings one value may be repeated into */

typedef struct tf_node_ctx L_t;

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

static const KilnSm__AttrValue *attr(L_t *L, const char *key) { return tf_attr(L->nd, L->inst, key); }

static int64_t attr_int(L_t *L, const char *key, int64_t dflt)
{
    const KilnSm__AttrValue *v = attr(L, key);
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_I) return v->i;
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_B) return v->b;
    return dflt;
}

static bool attr_bool(L_t *L, const char *key, bool dflt)
{
    const KilnSm__AttrValue *v = attr(L, key);
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_B) return v->b != 0;
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_I) return v->i != 0;
    return dflt;
}

static float attr_float(L_t *L, const char *key, float dflt)
{
    const KilnSm__AttrValue *v = attr(L, key);
    return v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_F ? v->f : dflt;
}

/* A string attr (bytes) as a NUL-terminated copy in the graph arena, or dflt. */
static const char *attr_str(L_t *L, const char *key, const char *dflt)
{
    const KilnSm__AttrValue *v = attr(L, key);
    if (!v || v->value_case != KILN_SM__ATTR_VALUE__VALUE_S) return dflt;
    char *s = kiln_arena_strndup(L->g->mem, (const char *)v->s.data, v->s.len);
    return s ? s : dflt;
}

static kiln_dtype attr_dtype(L_t *L, const char *key)
{
    const KilnSm__AttrValue *v = attr(L, key);
    return v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype(v->type)
                                                                 : KILN_DTYPE_UNDEFINED;
}

/* list(int) attr: count (-1 if absent). */
static int attr_ints(L_t *L, const char *key, const int64_t **vals)
{
    const KilnSm__AttrValue *v = attr(L, key);
    if (!v || v->value_case != KILN_SM__ATTR_VALUE__VALUE_LIST) return -1;
    *vals = v->list->i;
    return (int)v->list->n_i;
}

/* ---- errors ---- */

static kiln_status lerr(L_t *L, kiln_status st, const char *fmt, ...) KILN_PRINTF(3, 4);
static kiln_status lerr(L_t *L, kiln_status st, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(st, "%s: node '%s' (op %s): %s", L->where, L->nd->name, L->nd->op, msg);
}

/* ---- emitting IR ---- */

static kiln_status set_outputs(L_t *L, int n)
{
    L->n_out = n;
    L->out = kiln_arena_alloc(L->g->mem, sizeof *L->out * ((size_t)n + 1));
    if (!L->out) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) L->out[i] = (struct tf_sym){.v = -1, .var = -1};
    return KILN_OK;
}

static kiln_status out1(L_t *L, int v)
{
    kiln_status st = set_outputs(L, 1);
    if (st == KILN_OK) L->out[0].v = v;
    return st;
}

static kiln_status in_value(L_t *L, int k, int *v)
{
    if (k >= L->n_in)
        return lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs, needs at least %d", L->n_in, k + 1);
    if (L->in[k].rnd)
        return lerr(L, KILN_ERR_UNSUPPORTED,
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
        return lerr(L, KILN_ERR_UNSUPPORTED, "input %d is a resource handle, not a tensor", k);
    *v = L->in[k].v;
    return KILN_OK;
}

static const struct kiln_type *vtype(L_t *L, int v) { return &L->g->values[v].type; }

static const kiln_tensor *vconst(L_t *L, int v)
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
static kiln_status const_i64(L_t *L, int rank, int n, const int64_t *vals, int *id)
{
    int64_t d = n;
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, rank, &d, &t);
    if (st != KILN_OK) return st;
    if (n) memcpy(t->data, vals, sizeof(int64_t) * (size_t)n);
    return const_tensor(L, t, id);
}

/* A scalar of dtype dt holding v. */
static kiln_status const_scalar(L_t *L, kiln_dtype dt, double v, int *id)
{
    if (dt == KILN_DTYPE_UNDEFINED || dt == KILN_DTYPE_STRING)
        return lerr(L, KILN_ERR_UNSUPPORTED, "needs a numeric input type, got %s",
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
        kiln_tensor *t = (kiln_tensor *)vconst(L, n->in[k]);
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
        in[k] = n->in[k] >= 0 ? vtype(L, n->in[k]) : NULL;
        inv[k] = n->in[k] >= 0 ? vconst(L, n->in[k]) : NULL;
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

/* An IR node under construction: attributes are appended with the a_*
 * helpers, then node_end finishes it. Only one node is open at a time. */
struct emit {
    L_t *L;
    int node;           /* index in g->nodes (the array may move while open) */
    int cap_attr;
};

static struct kiln_node *enode(struct emit *e) { return &e->L->g->nodes[e->node]; }

static kiln_status node_begin(L_t *L, enum kiln_op op, int n_in, const int *in, int n_out,
                              int cap_attr, struct emit *e)
{
    if (n_in > KILN_MAX_IO || n_out > KILN_MAX_IO)
        return lerr(L, KILN_ERR_UNSUPPORTED, "needs a %s node with %d inputs and %d outputs, "
                    "more than Kiln's limit of %d", kiln_op_name(op), n_in, n_out, KILN_MAX_IO);
    for (int k = 0; k < n_in; k++)
        if (in[k] < -1 || in[k] >= L->g->n_values)
            return lerr(L, KILN_ERR_INTERNAL, "bad IR input %d", k);
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

static struct kiln_attr *a_new(struct emit *e, const char *name, enum kiln_attr_type type)
{
    struct kiln_node *n = enode(e);
    KILN_ASSERT(n->n_attr < e->cap_attr);
    struct kiln_attr *a = &n->attr[n->n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = type;
    return a;
}

static void a_int(struct emit *e, const char *name, int64_t v) { a_new(e, name, KILN_ATTR_INT)->i = v; }
static void a_float(struct emit *e, const char *name, float v) { a_new(e, name, KILN_ATTR_FLOAT)->f = v; }

static kiln_status a_str(struct emit *e, const char *name, const char *s, size_t len)
{
    struct kiln_attr *a = a_new(e, name, KILN_ATTR_STRING);
    a->s.data = kiln_arena_strndup(e->L->g->mem, s, len);
    a->s.len = len;
    return a->s.data ? KILN_OK : kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
}

static kiln_status a_ints(struct emit *e, const char *name, int n, const int64_t *v)
{
    struct kiln_attr *a = a_new(e, name, KILN_ATTR_INTS);
    a->n = n;
    a->ints = kiln_arena_alloc(e->L->g->mem, sizeof(int64_t) * ((size_t)n + 1));
    if (!a->ints) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (n) memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
    return KILN_OK;
}

/* Finish the open node: fold it if its inputs are constants, else infer
 * its static types. outs (may be NULL) receives its output value ids. */
static kiln_status node_end(struct emit *e, int *outs)
{
    L_t *L = e->L;
    struct kiln_node *n = enode(e);
    int n_out = n->n_out;
    int ids[KILN_MAX_IO];
    for (int k = 0; k < n_out && k < KILN_MAX_IO; k++) ids[k] = n->out[k];
    bool all_const = n->n_in > 0 && !(kiln_op_info(n->op)->flags & KILN_OPF_STATEFUL);
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] >= 0 && !vconst(L, n->in[k])) all_const = false;
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
static kiln_status op1(L_t *L, enum kiln_op op, int n_in, const int *in, int *out)
{
    struct emit e;
    kiln_status st = node_begin(L, op, n_in, in, 1, 0, &e);
    if (st == KILN_OK) st = node_end(&e, out);
    return st;
}

static kiln_status un(L_t *L, enum kiln_op op, int x, int *out) { return op1(L, op, 1, &x, out); }

static kiln_status bin(L_t *L, enum kiln_op op, int a, int b, int *out)
{
    int in[2] = {a, b};
    return op1(L, op, 2, in, out);
}

static kiln_status cast_to(L_t *L, int x, kiln_dtype dt, int *out)
{
    if (vtype(L, x)->dtype == dt) {
        *out = x;
        return KILN_OK;
    }
    int code = kiln_onnx_dtype_code(dt);
    if (!code) return lerr(L, KILN_ERR_UNSUPPORTED, "cannot cast to %s", kiln_dtype_name(dt));
    struct emit e;
    kiln_status st = node_begin(L, KILN_OP_Cast, 1, &x, 1, 1, &e);
    if (st != KILN_OK) return st;
    a_int(&e, "to", code);
    return node_end(&e, out);
}

static kiln_status transpose(L_t *L, int x, int rank, const int64_t *perm, int *out)
{
    struct emit e;
    kiln_status st = node_begin(L, KILN_OP_Transpose, 1, &x, 1, 1, &e);
    if (st != KILN_OK) return st;
    if ((st = a_ints(&e, "perm", rank, perm)) != KILN_OK) return st;
    return node_end(&e, out);
}

/* Reshape x to shape (given as values). */
static kiln_status reshape_to(L_t *L, int x, int n, const int64_t *shape, int *out)
{
    int s = -1;
    kiln_status st = const_i64(L, 1, n, shape, &s);
    if (st != KILN_OK) return st;
    struct emit e;
    int in[2] = {x, s};
    if ((st = node_begin(L, KILN_OP_Reshape, 2, in, 1, 1, &e)) != KILN_OK) return st;
    a_int(&e, "allowzero", 1);
    return node_end(&e, out);
}

/* An int64 vector from an int tensor of rank 0 or 1 (axes, shapes). */
static kiln_status i64_vector(L_t *L, int x, int *out)
{
    kiln_status st = cast_to(L, x, KILN_DTYPE_I64, &x);
    if (st != KILN_OK) return st;
    if (vtype(L, x)->rank == 1) {
        *out = x;
        return KILN_OK;
    }
    int64_t m1 = -1;
    return reshape_to(L, x, 1, &m1, out);
}

static kiln_status axes_node(L_t *L, enum kiln_op op, int x, int n_axes, const int64_t *axes,
                             int *out)
{
    int a = -1;
    kiln_status st = const_i64(L, 1, n_axes, axes, &a);
    if (st != KILN_OK) return st;
    return bin(L, op, x, a, out);
}

/* The values of a constant integer input (NULL if not constant). */
static kiln_status const_ints(L_t *L, int v, int64_t *vals, int max, int *n)
{
    const kiln_tensor *t = vconst(L, v);
    *n = -1;
    if (!t) return KILN_OK;
    if (!kiln_dtype_is_int(t->dtype) || t->rank > 1)
        return lerr(L, KILN_ERR_INVALID_MODEL, "expects an integer scalar or vector, got %s rank %d",
                    kiln_dtype_name(t->dtype), t->rank);
    int64_t c = kiln_tensor_count(t);
    if (c > max) return lerr(L, KILN_ERR_UNSUPPORTED, "has %lld values, more than %d", (long long)c, max);
    for (int64_t i = 0; i < c; i++) vals[i] = kiln_tensor_i64(t, i);
    *n = (int)c;
    return KILN_OK;
}

static kiln_status need_const_ints(L_t *L, int k, int64_t *vals, int max, int *n, const char *what)
{
    int v = -1;
    kiln_status st = in_value(L, k, &v);
    if (st == KILN_OK) st = const_ints(L, v, vals, max, n);
    if (st != KILN_OK) return st;
    if (*n < 0)
        return lerr(L, KILN_ERR_UNSUPPORTED, "%s (input %d) must be a constant", what, k);
    return KILN_OK;
}

/* The element dtype of the node: attr T (or dtype), else input 0's type. */
static kiln_dtype node_dtype(L_t *L)
{
    kiln_dtype dt = attr_dtype(L, "T");
    if (dt == KILN_DTYPE_UNDEFINED) dt = attr_dtype(L, "dtype");
    if (dt == KILN_DTYPE_UNDEFINED && L->n_in > 0 && L->in[0].v >= 0) dt = vtype(L, L->in[0].v)->dtype;
    return dt;
}

/* ---- lowerings ---- */

struct lower;
typedef kiln_status (*lower_fn)(L_t *L, const struct lower *e);
/* An attribute of a one-to-one mapping (lw_mapped): the Kiln attribute
 * `name` takes the node's TF attribute `tf`, or `dflt` when the node has
 * none (or tf is NULL). */
struct amap {
    const char *name;
    enum kiln_attr_type type; /* KILN_ATTR_INT or KILN_ATTR_FLOAT */
    const char *tf;
    double dflt;
};

#define LOWER_MAX_ATTRS 2

struct lower {
    const char *tf;
    lower_fn fn;
    enum kiln_op op;   /* for the generic mappings */
    int arg;           /* lowering-specific */
};

/* TF ops that are one Kiln op on the same inputs, with attributes mapped. */
struct mapped {
    const char *tf;
    struct amap attrs[LOWER_MAX_ATTRS]; /* name NULL ends the list */
};

static const struct mapped MAPPED[] = {
    {"LeakyRelu", {{"alpha", KILN_ATTR_FLOAT, "alpha", 0.2}, {NULL, 0, NULL, 0}}},
    {"Softmax", {{"axis", KILN_ATTR_INT, NULL, -1}, {NULL, 0, NULL, 0}}},
    {"LogSoftmax", {{"axis", KILN_ATTR_INT, NULL, -1}, {NULL, 0, NULL, 0}}},
};

static kiln_status lw_pass(L_t *L, const struct lower *e)
{
    (void)e;
    if (L->n_in < 1) return lerr(L, KILN_ERR_INVALID_MODEL, "has no input");
    kiln_status st = set_outputs(L, 1);
    if (st == KILN_OK) L->out[0] = L->in[0];
    return st;
}

static kiln_status lw_identity_n(L_t *L, const struct lower *e)
{
    (void)e;
    kiln_status st = set_outputs(L, L->n_in);
    for (int k = 0; st == KILN_OK && k < L->n_in; k++) L->out[k] = L->in[k];
    return st;
}

static kiln_status lw_noop(L_t *L, const struct lower *e)
{
    (void)e;
    return set_outputs(L, 0);
}

static kiln_status lw_const(L_t *L, const struct lower *e)
{
    (void)e;
    const KilnSm__AttrValue *v = attr(L, "value");
    if (!v || v->value_case != KILN_SM__ATTR_VALUE__VALUE_TENSOR)
        return lerr(L, KILN_ERR_INVALID_MODEL, "has no 'value' tensor");
    kiln_tensor *t;
    kiln_status st = kiln_tf_tensor_from_proto(v->tensor, L->name, &t);
    if (st != KILN_OK) return kiln_error_wrap(st, "%s", L->where);
    int id = -1;
    if ((st = const_tensor(L, t, &id)) != KILN_OK) return st;
    return out1(L, id);
}

static kiln_status lw_placeholder_default(L_t *L, const struct lower *e)
{
    return lw_pass(L, e);
}

static kiln_status lw_read_variable(L_t *L, const struct lower *e)
{
    (void)e;
    if (L->n_in < 1 || L->in[0].var < 0)
        return lerr(L, KILN_ERR_UNSUPPORTED,
                    "reads a resource that is not a variable of the SavedModel");
    int v = -1;
    kiln_status st = tf_var_value(L->b, L->in[0].var, &v);
    if (st != KILN_OK) return kiln_error_wrap(st, "%s", L->where);
    return out1(L, v);
}

static kiln_status lw_var_initialized(L_t *L, const struct lower *e)
{
    (void)e;
    kiln_tensor *t;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_BOOL, 0, NULL, &t);
    if (st != KILN_OK) return st;
    ((uint8_t *)t->data)[0] = 1;
    int id = -1;
    if ((st = const_tensor(L, t, &id)) != KILN_OK) return st;
    return out1(L, id);
}

static kiln_status lw_resource_gather(L_t *L, const struct lower *e)
{
    (void)e;
    if (L->n_in < 2 || L->in[0].var < 0)
        return lerr(L, KILN_ERR_UNSUPPORTED, "gathers from a resource that is not a variable");
    if (attr_int(L, "batch_dims", 0) != 0)
        return lerr(L, KILN_ERR_UNSUPPORTED, "batch_dims other than 0 is not supported");
    int v = -1, idx = -1, y = -1;
    kiln_status st = tf_var_value(L->b, L->in[0].var, &v);
    if (st != KILN_OK) return kiln_error_wrap(st, "%s", L->where);
    if ((st = in_value(L, 1, &idx)) != KILN_OK) return st;
    struct emit em;
    int in[2] = {v, idx};
    if ((st = node_begin(L, KILN_OP_Gather, 2, in, 1, 1, &em)) != KILN_OK) return st;
    a_int(&em, "axis", 0);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_state_write(L_t *L, const struct lower *e)
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
        if (!var) return lerr(L, KILN_ERR_INTERNAL, "variable has no state");
        if ((st = in_value(L, 1, &x)) != KILN_OK) return st;
        struct emit em;
        if ((st = node_begin(L, KILN_OP_TfAssign, 1, &x, 1, 2, &em)) != KILN_OK) return st;
        a_new(&em, "var", KILN_ATTR_TENSOR)->t = (kiln_tensor *)var;
        if ((st = a_str(&em, "mode", mode, strlen(mode))) != KILN_OK) return st;
        if ((st = node_end(&em, &y)) != KILN_OK) return st;
        return out1(L, y);
    }
    const char *var = L->n_in > 0 && L->in[0].var >= 0 ? tf_var_name(L->b, L->in[0].var) : NULL;
    return lerr(L, KILN_ERR_UNSUPPORTED,
                "writes %s%s%s; Kiln models are immutable, so signatures that change variables "
                "are not supported",
                var ? "variable '" : "state", var ? var : "", var ? "'" : "");
}

static kiln_status rnd_binary(L_t *L, enum kiln_op op, bool *handled);
static kiln_status rnd_floor(L_t *L, bool *handled);

static kiln_status lw_unary(L_t *L, const struct lower *e)
{
    int x = -1, y = -1;
    bool handled = false;
    kiln_status st = e->op == KILN_OP_Floor ? rnd_floor(L, &handled) : KILN_OK;
    if (handled) return st;
    st = in_value(L, 0, &x);
    if (st == KILN_OK) st = un(L, e->op, x, &y);
    if (st == KILN_OK) st = out1(L, y);
    return st;
}

static kiln_status lw_binary(L_t *L, const struct lower *e)
{
    int a = -1, b = -1, y = -1;
    bool handled;
    kiln_status st = rnd_binary(L, e->op, &handled);
    if (handled) return st;
    st = in_value(L, 0, &a);
    if (st == KILN_OK) st = in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    if (vtype(L, a)->dtype == KILN_DTYPE_STRING && e->op == KILN_OP_Add) {
        /* string + string: concatenation */
        struct emit em;
        int in[2] = {a, b};
        if ((st = node_begin(L, KILN_OP_TfStringJoin, 2, in, 1, 1, &em)) != KILN_OK) return st;
        if ((st = a_str(&em, "separator", "", 0)) != KILN_OK) return st;
        if ((st = node_end(&em, &y)) != KILN_OK) return st;
        return out1(L, y);
    }
    if ((st = bin(L, e->op, a, b, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* A TF op that is Kiln op e->op on the same inputs, attributes from MAPPED. */
static kiln_status lw_mapped(L_t *L, const struct lower *e)
{
    int in[KILN_MAX_IO], y = -1, n_attr = 0;
    kiln_status st;
    const struct mapped *m = NULL;
    for (size_t i = 0; i < sizeof MAPPED / sizeof *MAPPED && !m; i++)
        if (strcmp(MAPPED[i].tf, e->tf) == 0) m = &MAPPED[i];
    if (!m) return lerr(L, KILN_ERR_INTERNAL, "no attribute mapping");
    if (L->n_in > KILN_MAX_IO) return lerr(L, KILN_ERR_UNSUPPORTED, "has %d inputs", L->n_in);
    for (int k = 0; k < L->n_in; k++)
        if ((st = in_value(L, k, &in[k])) != KILN_OK) return st;
    while (n_attr < LOWER_MAX_ATTRS && m->attrs[n_attr].name) n_attr++;
    struct emit em;
    if ((st = node_begin(L, e->op, L->n_in, in, 1, n_attr, &em)) != KILN_OK) return st;
    for (int i = 0; i < n_attr; i++) {
        const struct amap *a = &m->attrs[i];
        if (a->type == KILN_ATTR_FLOAT)
            a_float(&em, a->name, a->tf ? attr_float(L, a->tf, (float)a->dflt) : (float)a->dflt);
        else
            a_int(&em, a->name, a->tf ? attr_int(L, a->tf, (int64_t)a->dflt) : (int64_t)a->dflt);
    }
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_bias_add(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, b = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    const char *fmt = attr_str(L, "data_format", "NHWC");
    if (strcmp(fmt, "NCHW") == 0 || strcmp(fmt, "NCDHW") == 0) {
        int r = vtype(L, x)->rank;
        if (r < 2) return lerr(L, KILN_ERR_UNSUPPORTED, "NCHW BiasAdd needs an input of known rank");
        int64_t axes[KILN_MAX_RANK];
        for (int i = 0; i < r - 2; i++) axes[i] = i + 1;
        if (r > 2 && (st = axes_node(L, KILN_OP_Unsqueeze, b, r - 2, axes, &b)) != KILN_OK) return st;
    }
    if ((st = bin(L, KILN_OP_Add, x, b, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* op(x, typed scalar c) or op(c, x) */
static kiln_status with_scalar(L_t *L, enum kiln_op op, int x, double c, bool c_first, int *out)
{
    int k = -1;
    kiln_status st = const_scalar(L, vtype(L, x)->dtype != KILN_DTYPE_UNDEFINED
                                         ? vtype(L, x)->dtype
                                         : node_dtype(L),
                                  c, &k);
    if (st != KILN_OK) return st;
    return c_first ? bin(L, op, k, x, out) : bin(L, op, x, k, out);
}

static kiln_status lw_special_unary(L_t *L, const struct lower *e)
{
    int x = -1, y = -1, t = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    switch (e->arg) {
    case 0: /* Rsqrt */
        if ((st = un(L, KILN_OP_Sqrt, x, &t)) == KILN_OK) st = un(L, KILN_OP_Reciprocal, t, &y);
        break;
    case 1: /* Square */ st = bin(L, KILN_OP_Mul, x, x, &y); break;
    case 2: /* Relu6 */ {
        int lo = -1, hi = -1;
        kiln_dtype dt = vtype(L, x)->dtype != KILN_DTYPE_UNDEFINED ? vtype(L, x)->dtype : node_dtype(L);
        if ((st = const_scalar(L, dt, 0, &lo)) != KILN_OK) return st;
        if ((st = const_scalar(L, dt, 6, &hi)) != KILN_OK) return st;
        int in[3] = {x, lo, hi};
        st = op1(L, KILN_OP_Clip, 3, in, &y);
        break;
    }
    case 3: /* Log1p */
        if ((st = with_scalar(L, KILN_OP_Add, x, 1, false, &t)) == KILN_OK) st = un(L, KILN_OP_Log, t, &y);
        break;
    case 4: /* Expm1 */
        if ((st = un(L, KILN_OP_Exp, x, &t)) == KILN_OK) st = with_scalar(L, KILN_OP_Sub, t, 1, false, &y);
        break;
    case 5: /* IsFinite */ {
        int a = -1, b2 = -1, c = -1;
        if ((st = un(L, KILN_OP_IsNaN, x, &a)) != KILN_OK) return st;
        if ((st = un(L, KILN_OP_IsInf, x, &b2)) != KILN_OK) return st;
        if ((st = bin(L, KILN_OP_Or, a, b2, &c)) != KILN_OK) return st;
        st = un(L, KILN_OP_Not, c, &y);
        break;
    }
    case 9: /* ZerosLike */
    case 10: /* OnesLike */ {
        int z = -1, s = -1;
        if ((st = const_scalar(L, node_dtype(L), e->arg == 9 ? 0 : 1, &z)) != KILN_OK) return st;
        if ((st = un(L, KILN_OP_Shape, x, &s)) != KILN_OK) return st;
        st = bin(L, KILN_OP_Expand, z, s, &y);
        break;
    }
    default: return lerr(L, KILN_ERR_INTERNAL, "bad lowering");
    }
    if (st != KILN_OK) return st;
    return out1(L, y);
}

/* fix = r != 0 and (r < 0) != (b < 0): where a truncating division or
 * remainder must be corrected to TF's floor semantics. */
static kiln_status floor_fix(L_t *L, int r, int b, kiln_dtype dt, int *fix)
{
    int zero = -1, rz = -1, nrz = -1, rneg = -1, bneg = -1, diff = -1;
    kiln_status st = const_scalar(L, dt, 0, &zero);
    if (st == KILN_OK) st = bin(L, KILN_OP_Equal, r, zero, &rz);
    if (st == KILN_OK) st = un(L, KILN_OP_Not, rz, &nrz);
    if (st == KILN_OK) st = bin(L, KILN_OP_Less, r, zero, &rneg);
    if (st == KILN_OK) st = bin(L, KILN_OP_Less, b, zero, &bneg);
    if (st == KILN_OK) st = bin(L, KILN_OP_Xor, rneg, bneg, &diff);
    if (st == KILN_OK) st = bin(L, KILN_OP_And, nrz, diff, fix);
    return st;
}

static kiln_status lw_special_binary(L_t *L, const struct lower *e)
{
    int a = -1, b = -1, y = -1, t = -1;
    kiln_status st = in_value(L, 0, &a);
    if (st == KILN_OK) st = in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    kiln_dtype dt = vtype(L, a)->dtype != KILN_DTYPE_UNDEFINED ? vtype(L, a)->dtype : node_dtype(L);
    switch (e->arg) {
    case 0: /* NotEqual */
        if ((st = bin(L, KILN_OP_Equal, a, b, &t)) == KILN_OK) st = un(L, KILN_OP_Not, t, &y);
        break;
    case 1: /* SquaredDifference */
        if ((st = bin(L, KILN_OP_Sub, a, b, &t)) == KILN_OK) st = bin(L, KILN_OP_Mul, t, t, &y);
        break;
    case 2: /* FloorDiv */
        if (kiln_dtype_is_float(dt)) {
            if ((st = bin(L, KILN_OP_Div, a, b, &t)) == KILN_OK) st = un(L, KILN_OP_Floor, t, &y);
        } else {
            /* q = trunc(a/b); q - 1 where the remainder is nonzero and its sign differs from b's */
            int q = -1, qb = -1, r = -1, one = -1, fix = -1, qm1 = -1;
            if ((st = bin(L, KILN_OP_Div, a, b, &q)) != KILN_OK) return st;
            if ((st = bin(L, KILN_OP_Mul, q, b, &qb)) != KILN_OK) return st;
            if ((st = bin(L, KILN_OP_Sub, a, qb, &r)) != KILN_OK) return st;
            if ((st = const_scalar(L, dt, 1, &one)) != KILN_OK) return st;
            if ((st = floor_fix(L, r, b, dt, &fix)) != KILN_OK) return st;
            if ((st = bin(L, KILN_OP_Sub, q, one, &qm1)) != KILN_OK) return st;
            int in[3] = {fix, qm1, q};
            st = op1(L, KILN_OP_Where, 3, in, &y);
        }
        break;
    case 3: /* DivNoNan */ {
        int zero = -1, isz = -1, d = -1;
        if ((st = const_scalar(L, dt, 0, &zero)) != KILN_OK) return st;
        if ((st = bin(L, KILN_OP_Equal, b, zero, &isz)) != KILN_OK) return st;
        if ((st = bin(L, KILN_OP_Div, a, b, &d)) != KILN_OK) return st;
        int in[3] = {isz, zero, d};
        st = op1(L, KILN_OP_Where, 3, in, &y);
        break;
    }
    case 4: /* FloorMod */ {
        struct emit em;
        int in[2] = {a, b};
        if ((st = node_begin(L, KILN_OP_Mod, 2, in, 1, 1, &em)) != KILN_OK) return st;
        a_int(&em, "fmod", kiln_dtype_is_float(dt) ? 1 : 0);
        if ((st = node_end(&em, &y)) != KILN_OK) return st;
        if (kiln_dtype_is_float(dt)) {
            /* fmod, then shift by b where the signs differ (floor semantics) */
            int fix = -1, rb = -1, y2 = -1;
            if ((st = floor_fix(L, y, b, dt, &fix)) != KILN_OK) return st;
            if ((st = bin(L, KILN_OP_Add, y, b, &rb)) != KILN_OK) return st;
            int in3[3] = {fix, rb, y};
            if ((st = op1(L, KILN_OP_Where, 3, in3, &y2)) != KILN_OK) return st;
            y = y2;
        }
        break;
    }
    default: return lerr(L, KILN_ERR_INTERNAL, "bad lowering");
    }
    if (st != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_add_n(L_t *L, const struct lower *e)
{
    (void)e;
    if (L->n_in < 1) return lerr(L, KILN_ERR_INVALID_MODEL, "has no inputs");
    int *in = kiln_arena_alloc(L->g->mem, sizeof(int) * (size_t)L->n_in);
    if (!in) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_status st;
    for (int k = 0; k < L->n_in; k++)
        if ((st = in_value(L, k, &in[k])) != KILN_OK) return st;
    if (L->n_in == 1) return out1(L, in[0]);
    int y = -1;
    if ((st = op1(L, KILN_OP_Sum, L->n_in, in, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_clip_by_value(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, lo = -1, hi = -1, t = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &lo);
    if (st == KILN_OK) st = in_value(L, 2, &hi);
    if (st == KILN_OK) st = bin(L, KILN_OP_Min, x, hi, &t);
    if (st == KILN_OK) st = bin(L, KILN_OP_Max, t, lo, &y);
    if (st == KILN_OK) st = out1(L, y);
    return st;
}

static kiln_status lw_select(L_t *L, const struct lower *e)
{
    int c = -1, a = -1, b = -1, y = -1;
    kiln_status st = in_value(L, 0, &c);
    if (st == KILN_OK) st = in_value(L, 1, &a);
    if (st == KILN_OK) st = in_value(L, 2, &b);
    if (st != KILN_OK) return st;
    if (e->arg == 1) {
        /* TF1 Select: a vector condition picks rows of higher-rank x and y */
        int rc = vtype(L, c)->rank, rx = vtype(L, a)->rank;
        if (rc == 1 && rx > 1) {
            int64_t axes[KILN_MAX_RANK];
            for (int i = 0; i < rx - 1; i++) axes[i] = i + 1;
            if ((st = axes_node(L, KILN_OP_Unsqueeze, c, rx - 1, axes, &c)) != KILN_OK) return st;
        } else if (rc < 0 || (rc == 1 && rx < 0)) {
            return lerr(L, KILN_ERR_UNSUPPORTED, "needs inputs of known rank");
        }
    }
    int in[3] = {c, a, b};
    if ((st = op1(L, KILN_OP_Where, 3, in, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_cast(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    const KilnSm__AttrValue *a = attr(L, "DstT");
    kiln_dtype dt = a && a->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype(a->type)
                                                                          : KILN_DTYPE_UNDEFINED;
    if (dt == KILN_DTYPE_UNDEFINED)
        return lerr(L, KILN_ERR_UNSUPPORTED, "casts to %s, which Kiln does not support",
                    a && a->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype_name(a->type)
                                                                          : "(none)");
    if ((st = cast_to(L, x, dt, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* MatMul and BatchMatMul: transpose flags become Transposes of the last two dims. */
static kiln_status lw_matmul(L_t *L, const struct lower *e)
{
    int a = -1, b = -1, y = -1;
    kiln_status st = in_value(L, 0, &a);
    if (st == KILN_OK) st = in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    bool batch = e->arg == 1;
    bool ta = batch ? attr_bool(L, "adj_x", false) : attr_bool(L, "transpose_a", false);
    bool tb = batch ? attr_bool(L, "adj_y", false) : attr_bool(L, "transpose_b", false);
    for (int k = 0; k < 2; k++) {
        if (!(k == 0 ? ta : tb)) continue;
        int *v = k == 0 ? &a : &b;
        int r = batch ? vtype(L, *v)->rank : 2;
        if (r < 2) return lerr(L, KILN_ERR_UNSUPPORTED, "transposing an input of unknown rank");
        int64_t perm[KILN_MAX_RANK];
        for (int i = 0; i < r; i++) perm[i] = i;
        perm[r - 2] = r - 1;
        perm[r - 1] = r - 2;
        if ((st = transpose(L, *v, r, perm, v)) != KILN_OK) return st;
    }
    if ((st = bin(L, KILN_OP_MatMul, a, b, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* ---- convolution and pooling (NHWC <-> NCHW) ---- */

struct conv_geom {
    bool nchw;
    int64_t strides[2], dil[2], ksize[2];
    const char *auto_pad;     /* "SAME_UPPER", "VALID" or NULL (explicit pads) */
    int64_t pads[4];
};

static kiln_status conv_geom(L_t *L, bool pool, struct conv_geom *gm)
{
    const char *fmt = attr_str(L, "data_format", "NHWC");
    if (strcmp(fmt, "NHWC") != 0 && strcmp(fmt, "NCHW") != 0)
        return lerr(L, KILN_ERR_UNSUPPORTED, "data_format '%s' is not supported", fmt);
    gm->nchw = strcmp(fmt, "NCHW") == 0;
    int hi = gm->nchw ? 2 : 1, wi = gm->nchw ? 3 : 2;
    const int64_t *v;
    const char *names[3] = {"strides", "dilations", "ksize"};
    int64_t *dst[3] = {gm->strides, gm->dil, gm->ksize};
    for (int k = 0; k < 3; k++) {
        dst[k][0] = dst[k][1] = 1;
        if (k == 2 && !pool) continue;
        int n = attr_ints(L, names[k], &v);
        if (n < 0) continue;
        if (n != 4) return lerr(L, KILN_ERR_INVALID_MODEL, "%s has %d values, expected 4", names[k], n);
        if (v[0] != 1 || v[gm->nchw ? 1 : 3] != 1)
            return lerr(L, KILN_ERR_UNSUPPORTED, "%s over the batch or channel dim is not supported",
                        names[k]);
        dst[k][0] = v[hi];
        dst[k][1] = v[wi];
        if (v[hi] < 1 || v[wi] < 1)
            return lerr(L, KILN_ERR_INVALID_MODEL, "%s must be positive", names[k]);
    }
    const char *pad = attr_str(L, "padding", "VALID");
    gm->auto_pad = NULL;
    memset(gm->pads, 0, sizeof gm->pads);
    if (strcmp(pad, "SAME") == 0) gm->auto_pad = "SAME_UPPER";
    else if (strcmp(pad, "VALID") == 0) gm->auto_pad = "VALID";
    else if (strcmp(pad, "EXPLICIT") == 0 && !pool) {
        int n = attr_ints(L, "explicit_paddings", &v);
        if (n != 8) return lerr(L, KILN_ERR_INVALID_MODEL, "explicit_paddings has %d values, expected 8", n);
        gm->pads[0] = v[2 * hi];
        gm->pads[1] = v[2 * wi];
        gm->pads[2] = v[2 * hi + 1];
        gm->pads[3] = v[2 * wi + 1];
    } else {
        return lerr(L, KILN_ERR_UNSUPPORTED, "padding '%s' is not supported", pad);
    }
    return KILN_OK;
}

static const int64_t TO_NCHW[4] = {0, 3, 1, 2};
static const int64_t TO_NHWC[4] = {0, 2, 3, 1};

static kiln_status conv_attrs(struct emit *em, const struct conv_geom *gm, bool pool)
{
    kiln_status st = a_ints(em, "strides", 2, gm->strides);
    if (st == KILN_OK && !pool) st = a_ints(em, "dilations", 2, gm->dil);
    if (st == KILN_OK && pool) st = a_ints(em, "kernel_shape", 2, gm->ksize);
    if (st != KILN_OK) return st;
    if (gm->auto_pad) return a_str(em, "auto_pad", gm->auto_pad, strlen(gm->auto_pad));
    return a_ints(em, "pads", 4, gm->pads);
}

static kiln_status lw_conv(L_t *L, const struct lower *e)
{
    int x = -1, w = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &w);
    if (st != KILN_OK) return st;
    struct conv_geom gm;
    if ((st = conv_geom(L, false, &gm)) != KILN_OK) return st;
    bool depthwise = e->arg == 1;
    const struct kiln_type *wt = vtype(L, w);
    if (wt->rank != 4 && wt->rank != -1)
        return lerr(L, KILN_ERR_INVALID_MODEL, "filter has rank %d, expected 4", wt->rank);
    int64_t group = 1;
    if (depthwise) {
        /* [kh,kw,in,mult] -> [kh,kw,1,in*mult]: output channel i*mult+m */
        if (wt->rank != 4 || wt->dims[2] < 0 || wt->dims[3] < 0)
            return lerr(L, KILN_ERR_UNSUPPORTED, "needs a filter of known shape");
        group = wt->dims[2];
        int64_t shape[4] = {wt->dims[0], wt->dims[1], 1, wt->dims[2] * wt->dims[3]};
        if ((st = reshape_to(L, w, 4, shape, &w)) != KILN_OK) return st;
    } else if (wt->rank == 4 && wt->dims[2] > 0) {
        const struct kiln_type *xt = vtype(L, x);
        int64_t cin = xt->rank == 4 ? xt->dims[gm.nchw ? 1 : 3] : -1;
        if (cin > 0 && cin != wt->dims[2]) {
            if (cin % wt->dims[2] != 0)
                return lerr(L, KILN_ERR_INVALID_MODEL, "input has %lld channels, filter %lld",
                            (long long)cin, (long long)wt->dims[2]);
            group = cin / wt->dims[2];
        }
    }
    static const int64_t HWIO_TO_OIHW[4] = {3, 2, 0, 1};
    if ((st = transpose(L, w, 4, HWIO_TO_OIHW, &w)) != KILN_OK) return st;
    if (!gm.nchw && (st = transpose(L, x, 4, TO_NCHW, &x)) != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, w};
    if ((st = node_begin(L, KILN_OP_Conv, 2, in, 1, 5, &em)) != KILN_OK) return st;
    if ((st = conv_attrs(&em, &gm, false)) != KILN_OK) return st;
    a_int(&em, "group", group);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    if (!gm.nchw && (st = transpose(L, y, 4, TO_NHWC, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* Conv2DBackpropInput(input_sizes, filter, out_backprop): the gradient of a
 * Conv2D with respect to its input, as ConvTranspose. The transposed conv
 * crops the forward conv's begin padding; the end is whatever makes the
 * output input_sizes (negative: output_padding). */
static kiln_status lw_conv_backprop_input(L_t *L, const struct lower *e)
{
    (void)e;
    int w = -1, dy = -1, y = -1, n = -1;
    int64_t sizes[4];
    kiln_status st = need_const_ints(L, 0, sizes, 4, &n, "input_sizes");
    if (st == KILN_OK) st = in_value(L, 1, &w);
    if (st == KILN_OK) st = in_value(L, 2, &dy);
    if (st != KILN_OK) return st;
    if (n != 4) return lerr(L, KILN_ERR_INVALID_MODEL, "input_sizes has %d values, expected 4", n);
    struct conv_geom gm;
    if ((st = conv_geom(L, false, &gm)) != KILN_OK) return st;
    const struct kiln_type *wt = vtype(L, w);
    if (wt->rank != 4 || wt->dims[0] < 1 || wt->dims[1] < 1)
        return lerr(L, KILN_ERR_UNSUPPORTED, "needs a filter of known shape");
    int64_t in_sp[2] = {sizes[gm.nchw ? 2 : 1], sizes[gm.nchw ? 3 : 2]};
    int64_t pads[4], opad[2];
    for (int i = 0; i < 2; i++) {
        int64_t k = (wt->dims[i] - 1) * gm.dil[i] + 1, s = gm.strides[i], h = in_sp[i];
        if (h < 1) return lerr(L, KILN_ERR_INVALID_MODEL, "input_sizes has a dim of %lld", (long long)h);
        int64_t pb, oh;
        if (!gm.auto_pad) {
            pb = gm.pads[i];
            oh = (h + gm.pads[i] + gm.pads[2 + i] - k) / s + 1;
        } else if (strcmp(gm.auto_pad, "VALID") == 0) {
            pb = 0;
            oh = (h - k) / s + 1;
        } else {
            oh = (h + s - 1) / s;
            int64_t total = (oh - 1) * s + k - h;
            pb = total > 0 ? total / 2 : 0;
        }
        if (oh < 1) return lerr(L, KILN_ERR_INVALID_MODEL, "the filter is larger than the input");
        int64_t pe = s * (oh - 1) + k - h - pb;
        pads[i] = pb;
        pads[2 + i] = pe > 0 ? pe : 0;
        opad[i] = pe < 0 ? -pe : 0;
    }
    static const int64_t HWIO_TO_OIHW[4] = {3, 2, 0, 1};
    if ((st = transpose(L, w, 4, HWIO_TO_OIHW, &w)) != KILN_OK) return st;
    if (!gm.nchw && (st = transpose(L, dy, 4, TO_NCHW, &dy)) != KILN_OK) return st;
    struct emit em;
    int in[2] = {dy, w};
    if ((st = node_begin(L, KILN_OP_ConvTranspose, 2, in, 1, 4, &em)) != KILN_OK) return st;
    if ((st = a_ints(&em, "strides", 2, gm.strides)) != KILN_OK) return st;
    if ((st = a_ints(&em, "dilations", 2, gm.dil)) != KILN_OK) return st;
    if ((st = a_ints(&em, "pads", 4, pads)) != KILN_OK) return st;
    if ((st = a_ints(&em, "output_padding", 2, opad)) != KILN_OK) return st;
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    if (!gm.nchw && (st = transpose(L, y, 4, TO_NHWC, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_pool(L_t *L, const struct lower *e)
{
    int x = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    struct conv_geom gm;
    if ((st = conv_geom(L, true, &gm)) != KILN_OK) return st;
    if (!gm.nchw && (st = transpose(L, x, 4, TO_NCHW, &x)) != KILN_OK) return st;
    struct emit em;
    if ((st = node_begin(L, e->op, 1, &x, 1, 5, &em)) != KILN_OK) return st;
    if ((st = conv_attrs(&em, &gm, true)) != KILN_OK) return st;
    if (e->op == KILN_OP_AveragePool) a_int(&em, "count_include_pad", 0);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    if (!gm.nchw && (st = transpose(L, y, 4, TO_NHWC, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* FusedBatchNorm in inference mode: y = x * s + (offset - mean * s), s = scale / sqrt(var + eps). */
static kiln_status lw_fused_batch_norm(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, scale = -1, offset = -1, mean = -1, var = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &scale);
    if (st == KILN_OK) st = in_value(L, 2, &offset);
    if (st == KILN_OK) st = in_value(L, 3, &mean);
    if (st == KILN_OK) st = in_value(L, 4, &var);
    if (st != KILN_OK) return st;
    if (attr_bool(L, "is_training", true))
        return lerr(L, KILN_ERR_UNSUPPORTED, "training mode (is_training true) is not supported");
    const char *fmt = attr_str(L, "data_format", "NHWC");
    kiln_dtype dt = vtype(L, scale)->dtype != KILN_DTYPE_UNDEFINED ? vtype(L, scale)->dtype : KILN_DTYPE_F32;
    int eps = -1, t = -1, sq = -1, s = -1, ms = -1, b = -1, xs = -1, y = -1;
    if ((st = const_scalar(L, dt, attr_float(L, "epsilon", 1e-4f), &eps)) != KILN_OK) return st;
    if ((st = bin(L, KILN_OP_Add, var, eps, &t)) != KILN_OK) return st;
    if ((st = un(L, KILN_OP_Sqrt, t, &sq)) != KILN_OK) return st;
    if ((st = bin(L, KILN_OP_Div, scale, sq, &s)) != KILN_OK) return st;
    if ((st = bin(L, KILN_OP_Mul, mean, s, &ms)) != KILN_OK) return st;
    if ((st = bin(L, KILN_OP_Sub, offset, ms, &b)) != KILN_OK) return st;
    if (strcmp(fmt, "NCHW") == 0) {
        static const int64_t axes[2] = {1, 2};
        if ((st = axes_node(L, KILN_OP_Unsqueeze, s, 2, axes, &s)) != KILN_OK) return st;
        if ((st = axes_node(L, KILN_OP_Unsqueeze, b, 2, axes, &b)) != KILN_OK) return st;
    } else if (strcmp(fmt, "NHWC") != 0) {
        return lerr(L, KILN_ERR_UNSUPPORTED, "data_format '%s' is not supported", fmt);
    }
    if (vtype(L, x)->dtype != dt && vtype(L, x)->dtype != KILN_DTYPE_UNDEFINED) {
        /* half inputs with float statistics */
        if ((st = cast_to(L, s, vtype(L, x)->dtype, &s)) != KILN_OK) return st;
        if ((st = cast_to(L, b, vtype(L, x)->dtype, &b)) != KILN_OK) return st;
    }
    if ((st = bin(L, KILN_OP_Mul, x, s, &xs)) != KILN_OK) return st;
    if ((st = bin(L, KILN_OP_Add, xs, b, &y)) != KILN_OK) return st;
    if ((st = set_outputs(L, 6)) != KILN_OK) return st;
    L->out[0].v = y;
    L->out[1].v = mean;
    L->out[2].v = var;
    L->out[3].v = mean;
    L->out[4].v = var;
    L->out[5].v = mean;
    return KILN_OK;
}

/* ---- reductions ---- */

static kiln_status lw_reduce(L_t *L, const struct lower *e)
{
    int x = -1, axes = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &axes);
    if (st == KILN_OK) st = i64_vector(L, axes, &axes);
    if (st != KILN_OK) return st;
    bool keep = attr_bool(L, "keep_dims", false);
    bool logical = e->arg != 0; /* All / Any over bools: Min / Max over 0/1 */
    if (logical && (st = cast_to(L, x, KILN_DTYPE_I32, &x)) != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, axes};
    if ((st = node_begin(L, e->op, 2, in, 1, 2, &em)) != KILN_OK) return st;
    a_int(&em, "keepdims", keep);
    a_int(&em, "noop_with_empty_axes", 1);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    if (logical && (st = cast_to(L, y, KILN_DTYPE_BOOL, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_argmax(L_t *L, const struct lower *e)
{
    int x = -1, y = -1;
    int64_t axis = 0;
    int n = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = need_const_ints(L, 1, &axis, 1, &n, "dimension");
    if (st != KILN_OK) return st;
    if (n != 1) return lerr(L, KILN_ERR_INVALID_MODEL, "dimension must be a single value");
    struct emit em;
    if ((st = node_begin(L, e->op, 1, &x, 1, 2, &em)) != KILN_OK) return st;
    a_int(&em, "axis", axis);
    a_int(&em, "keepdims", 0);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    kiln_dtype ot = attr_dtype(L, "output_type");
    if (ot != KILN_DTYPE_UNDEFINED && (st = cast_to(L, y, ot, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* ---- shapes and layout ---- */

static kiln_status lw_concat(L_t *L, const struct lower *e)
{
    /* ConcatV2: values..., axis; Concat: axis, values... */
    bool v2 = e->arg == 0;
    if (L->n_in < 2) return lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs", L->n_in);
    int64_t axis;
    int n = -1;
    kiln_status st = need_const_ints(L, v2 ? L->n_in - 1 : 0, &axis, 1, &n, "axis");
    if (st != KILN_OK) return st;
    if (n != 1) return lerr(L, KILN_ERR_INVALID_MODEL, "axis must be a single value");
    int nv = L->n_in - 1;
    int *in = kiln_arena_alloc(L->g->mem, sizeof(int) * (size_t)(nv + 1));
    if (!in) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int k = 0; k < nv; k++)
        if ((st = in_value(L, v2 ? k : k + 1, &in[k])) != KILN_OK) return st;
    if (nv == 1) return out1(L, in[0]);
    struct emit em;
    int y = -1;
    if ((st = node_begin(L, KILN_OP_Concat, nv, in, 1, 1, &em)) != KILN_OK) return st;
    a_int(&em, "axis", axis);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_pack(L_t *L, const struct lower *e)
{
    (void)e;
    if (L->n_in < 1) return lerr(L, KILN_ERR_INVALID_MODEL, "has no inputs");
    int64_t axis = attr_int(L, "axis", 0);
    int *in = kiln_arena_alloc(L->g->mem, sizeof(int) * (size_t)(L->n_in + 1));
    if (!in) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_status st;
    for (int k = 0; k < L->n_in; k++) {
        int x = -1;
        if ((st = in_value(L, k, &x)) != KILN_OK) return st;
        if ((st = axes_node(L, KILN_OP_Unsqueeze, x, 1, &axis, &in[k])) != KILN_OK) return st;
    }
    if (L->n_in == 1) return out1(L, in[0]);
    struct emit em;
    int y = -1;
    if ((st = node_begin(L, KILN_OP_Concat, L->n_in, in, 1, 1, &em)) != KILN_OK) return st;
    a_int(&em, "axis", axis);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status split_equal(L_t *L, int x, int64_t axis, int num, int *outs)
{
    if (num < 1 || num > KILN_MAX_IO) return lerr(L, KILN_ERR_UNSUPPORTED, "splits into %d parts", num);
    struct emit em;
    kiln_status st = node_begin(L, KILN_OP_Split, 1, &x, num, 2, &em);
    if (st != KILN_OK) return st;
    a_int(&em, "axis", axis);
    a_int(&em, "num_outputs", num);
    return node_end(&em, outs);
}

static kiln_status lw_unpack(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    int64_t num = attr_int(L, "num", -1), axis = attr_int(L, "axis", 0);
    if (num < 1 || num > KILN_MAX_IO)
        return lerr(L, KILN_ERR_UNSUPPORTED, "num is %lld", (long long)num);
    int parts[KILN_MAX_IO];
    if (num == 1) parts[0] = x;
    else if ((st = split_equal(L, x, axis, (int)num, parts)) != KILN_OK) return st;
    if ((st = set_outputs(L, (int)num)) != KILN_OK) return st;
    for (int k = 0; k < num; k++)
        if ((st = axes_node(L, KILN_OP_Squeeze, parts[k], 1, &axis, &L->out[k].v)) != KILN_OK)
            return st;
    return KILN_OK;
}

static kiln_status lw_split(L_t *L, const struct lower *e)
{
    int x = -1, n = -1;
    int64_t axis = 0;
    bool v = e->arg == 1; /* SplitV(value, size_splits, axis) */
    kiln_status st = need_const_ints(L, v ? 2 : 0, &axis, 1, &n, "split_dim");
    if (st == KILN_OK) st = in_value(L, v ? 0 : 1, &x);
    if (st != KILN_OK) return st;
    if (n != 1) return lerr(L, KILN_ERR_INVALID_MODEL, "split_dim must be a single value");
    int64_t num = attr_int(L, v ? "num_split" : "num_split", -1);
    int parts[KILN_MAX_IO];
    if (!v) {
        if (num < 1 || num > KILN_MAX_IO) return lerr(L, KILN_ERR_UNSUPPORTED, "num_split is %lld", (long long)num);
        if (num == 1) parts[0] = x;
        else if ((st = split_equal(L, x, axis, (int)num, parts)) != KILN_OK) return st;
    } else {
        int64_t sizes[KILN_MAX_IO];
        int ns = -1;
        if ((st = need_const_ints(L, 1, sizes, KILN_MAX_IO, &ns, "size_splits")) != KILN_OK) return st;
        num = ns;
        int unknown = -1;
        int64_t known = 0;
        for (int i = 0; i < ns; i++) {
            if (sizes[i] == -1 && unknown < 0) unknown = i;
            else if (sizes[i] < 0) return lerr(L, KILN_ERR_INVALID_MODEL, "size_splits has %lld", (long long)sizes[i]);
            else known += sizes[i];
        }
        if (unknown >= 0) {
            const struct kiln_type *xt = vtype(L, x);
            int64_t ax = axis < 0 ? axis + xt->rank : axis;
            if (xt->rank < 0 || ax < 0 || ax >= xt->rank || xt->dims[ax] < 0)
                return lerr(L, KILN_ERR_UNSUPPORTED, "size_splits of -1 needs a known dim");
            sizes[unknown] = xt->dims[ax] - known;
        }
        if (ns == 1) {
            parts[0] = x;
        } else {
            int sv = -1;
            if ((st = const_i64(L, 1, ns, sizes, &sv)) != KILN_OK) return st;
            struct emit em;
            int in[2] = {x, sv};
            if ((st = node_begin(L, KILN_OP_Split, 2, in, ns, 1, &em)) != KILN_OK) return st;
            a_int(&em, "axis", axis);
            if ((st = node_end(&em, parts)) != KILN_OK) return st;
        }
    }
    if ((st = set_outputs(L, (int)num)) != KILN_OK) return st;
    for (int k = 0; k < num; k++) L->out[k].v = parts[k];
    return KILN_OK;
}

static kiln_status lw_reshape(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, s = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &s);
    if (st == KILN_OK) st = i64_vector(L, s, &s);
    if (st != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, s};
    if ((st = node_begin(L, KILN_OP_Reshape, 2, in, 1, 1, &em)) != KILN_OK) return st;
    a_int(&em, "allowzero", 1);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_squeeze(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    const int64_t *dims;
    int n = attr_ints(L, "squeeze_dims", &dims);
    if (n < 0) n = attr_ints(L, "axis", &dims);
    if (n > 0) st = axes_node(L, KILN_OP_Squeeze, x, n, dims, &y);
    else st = un(L, KILN_OP_Squeeze, x, &y);
    if (st != KILN_OK) return st;
    return out1(L, y);
}

/* ExpandDims(x, axis) and Tile(x, multiples): e->op with the second input
 * as an int64 vector (Unsqueeze axes, Tile repeats). */
static kiln_status lw_with_i64_vector(L_t *L, const struct lower *e)
{
    int x = -1, d = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &d);
    if (st == KILN_OK) st = i64_vector(L, d, &d);
    if (st == KILN_OK) st = bin(L, e->op, x, d, &y);
    if (st == KILN_OK) st = out1(L, y);
    return st;
}

static kiln_status lw_transpose(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, y = -1, n = -1;
    int64_t perm[KILN_MAX_RANK];
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = need_const_ints(L, 1, perm, KILN_MAX_RANK, &n, "perm");
    if (st == KILN_OK) st = transpose(L, x, n, perm, &y);
    if (st == KILN_OK) st = out1(L, y);
    return st;
}

static kiln_status lw_shape(L_t *L, const struct lower *e)
{
    kiln_dtype ot = attr_dtype(L, "out_type");
    if (ot == KILN_DTYPE_UNDEFINED) ot = KILN_DTYPE_I32;
    kiln_status st;
    int n = e->arg == 1 ? L->n_in : 1; /* ShapeN */
    if ((st = set_outputs(L, n)) != KILN_OK) return st;
    for (int k = 0; k < n; k++) {
        int x = -1, y = -1;
        if ((st = in_value(L, k, &x)) != KILN_OK) return st;
        const struct kiln_type *t = vtype(L, x);
        if (e->arg == 2) { /* Size */
            if ((st = un(L, KILN_OP_Size, x, &y)) != KILN_OK) return st;
        } else if (e->arg == 3) { /* Rank */
            if (t->rank >= 0) {
                int64_t r = t->rank;
                if ((st = const_i64(L, 0, 1, &r, &y)) != KILN_OK) return st;
            } else {
                int s = -1;
                if ((st = un(L, KILN_OP_Shape, x, &s)) != KILN_OK) return st;
                if ((st = un(L, KILN_OP_Size, s, &y)) != KILN_OK) return st;
            }
            ot = KILN_DTYPE_I32;
        } else if (kiln_type_is_concrete(t)) {
            if ((st = const_i64(L, 1, t->rank, t->dims, &y)) != KILN_OK) return st;
        } else {
            if ((st = un(L, KILN_OP_Shape, x, &y)) != KILN_OK) return st;
        }
        if ((st = cast_to(L, y, ot, &y)) != KILN_OK) return st;
        L->out[k].v = y;
    }
    return KILN_OK;
}

static kiln_status lw_fill(L_t *L, const struct lower *e)
{
    int a = -1, b = -1, y = -1;
    kiln_status st = in_value(L, 0, &a);
    if (st == KILN_OK) st = in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    /* Fill(dims, value) and BroadcastTo(input, shape) are both Expand */
    int x = e->arg == 0 ? b : a, s = e->arg == 0 ? a : b;
    if ((st = i64_vector(L, s, &s)) != KILN_OK) return st;
    if ((st = bin(L, KILN_OP_Expand, x, s, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* Pad, PadV2, MirrorPad: paddings [rank, 2] -> ONNX pads [begins..., ends...]. */
static kiln_status lw_pad(L_t *L, const struct lower *e)
{
    int x = -1, p = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &p);
    if (st == KILN_OK) st = cast_to(L, p, KILN_DTYPE_I64, &p);
    if (st != KILN_OK) return st;
    static const int64_t T10[2] = {1, 0};
    int64_t m1 = -1;
    if ((st = transpose(L, p, 2, T10, &p)) != KILN_OK) return st;
    if ((st = reshape_to(L, p, 1, &m1, &p)) != KILN_OK) return st;
    const char *mode = "constant";
    int nin = 2;
    int in[3] = {x, p, -1};
    if (e->arg == 1 && L->n_in > 2) { /* PadV2 */
        if ((st = in_value(L, 2, &in[2])) != KILN_OK) return st;
        nin = 3;
    } else if (e->arg == 2) { /* MirrorPad */
        const char *m = attr_str(L, "mode", "REFLECT");
        if (strcmp(m, "REFLECT") != 0)
            return lerr(L, KILN_ERR_UNSUPPORTED, "mode '%s' is not supported (only REFLECT)", m);
        mode = "reflect";
    }
    struct emit em;
    if ((st = node_begin(L, KILN_OP_Pad, nin, in, 1, 1, &em)) != KILN_OK) return st;
    if ((st = a_str(&em, "mode", mode, strlen(mode))) != KILN_OK) return st;
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_slice(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, b = -1, s = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &b);
    if (st == KILN_OK) st = in_value(L, 2, &s);
    if (st == KILN_OK) st = i64_vector(L, b, &b);
    if (st == KILN_OK) st = i64_vector(L, s, &s);
    if (st != KILN_OK) return st;
    /* ends = size == -1 ? INT64_MAX : begin + size */
    int m1 = -1, big = -1, isall = -1, sum = -1, ends = -1;
    const int64_t minus1 = -1, maxv = INT64_MAX;
    if ((st = const_i64(L, 0, 1, &minus1, &m1)) != KILN_OK) return st;
    if ((st = const_i64(L, 0, 1, &maxv, &big)) != KILN_OK) return st;
    if ((st = bin(L, KILN_OP_Equal, s, m1, &isall)) != KILN_OK) return st;
    if ((st = bin(L, KILN_OP_Add, b, s, &sum)) != KILN_OK) return st;
    int in3[3] = {isall, big, sum};
    if ((st = op1(L, KILN_OP_Where, 3, in3, &ends)) != KILN_OK) return st;
    int in[3] = {x, b, ends};
    if ((st = op1(L, KILN_OP_Slice, 3, in, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* ReverseV2(x, axes): Slice with step -1 over each (constant) axis, as Keras'
 * go_backwards and Bidirectional layers reverse their sequences. */
static kiln_status lw_reverse(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, y = -1, n = 0;
    int64_t axes[KILN_MAX_RANK];
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = need_const_ints(L, 1, axes, KILN_MAX_RANK, &n, "axis");
    if (st != KILN_OK) return st;
    if (n == 0) return out1(L, x);
    int64_t starts[KILN_MAX_RANK], ends[KILN_MAX_RANK], steps[KILN_MAX_RANK];
    for (int i = 0; i < n; i++) {
        starts[i] = -1;
        ends[i] = INT64_MIN;
        steps[i] = -1;
    }
    int in[5] = {x, -1, -1, -1, -1};
    if ((st = const_i64(L, 1, n, starts, &in[1])) != KILN_OK) return st;
    if ((st = const_i64(L, 1, n, ends, &in[2])) != KILN_OK) return st;
    if ((st = const_i64(L, 1, n, axes, &in[3])) != KILN_OK) return st;
    if ((st = const_i64(L, 1, n, steps, &in[4])) != KILN_OK) return st;
    if ((st = op1(L, KILN_OP_Slice, 5, in, &y)) != KILN_OK) return st;
    return out1(L, y);
}

/* StridedSlice with constant begin/end/strides: the sparse spec (with its
 * masks) expanded over the input's dims, then Slice + Squeeze (shrunk dims)
 * + Unsqueeze (new axes). */
static kiln_status lw_strided_slice(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, nb = -1, ne = -1, ns = -1;
    int64_t b[KILN_MAX_RANK * 2], en[KILN_MAX_RANK * 2], s[KILN_MAX_RANK * 2];
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = need_const_ints(L, 1, b, 2 * KILN_MAX_RANK, &nb, "begin");
    if (st == KILN_OK) st = need_const_ints(L, 2, en, 2 * KILN_MAX_RANK, &ne, "end");
    if (st == KILN_OK) st = need_const_ints(L, 3, s, 2 * KILN_MAX_RANK, &ns, "strides");
    if (st != KILN_OK) return st;
    if (nb != ne || nb != ns)
        return lerr(L, KILN_ERR_INVALID_MODEL, "begin, end and strides have %d, %d and %d values",
                    nb, ne, ns);
    int64_t bm = attr_int(L, "begin_mask", 0), em_ = attr_int(L, "end_mask", 0);
    int64_t ell = attr_int(L, "ellipsis_mask", 0), na = attr_int(L, "new_axis_mask", 0);
    int64_t sh = attr_int(L, "shrink_axis_mask", 0);
    int rank = vtype(L, x)->rank;
    int n_ell = 0, n_real = 0;
    for (int i = 0; i < nb; i++) {
        if (ell >> i & 1) n_ell++;
        else if (!(na >> i & 1)) n_real++;
    }
    if (n_ell > 1) return lerr(L, KILN_ERR_INVALID_MODEL, "has more than one ellipsis");
    if (n_ell && rank < 0) return lerr(L, KILN_ERR_UNSUPPORTED, "an ellipsis needs an input of known rank");
    /* dense spec over input dims: dims not mentioned are taken whole */
    int64_t starts[KILN_MAX_RANK], ends[KILN_MAX_RANK], steps[KILN_MAX_RANK], axes[KILN_MAX_RANK];
    int64_t squeeze[KILN_MAX_RANK], newax[KILN_MAX_RANK * 2];
    int n_sl = 0, n_sq = 0, n_new = 0;
    int d = 0;     /* input dim */
    int od = 0;    /* output dim after squeeze and unsqueeze */
    for (int i = 0; i < nb; i++) {
        if (ell >> i & 1) {
            int cover = rank - n_real;
            if (cover < 0) return lerr(L, KILN_ERR_INVALID_MODEL, "indexes more dims than the input has");
            d += cover;
            od += cover;
            continue;
        }
        if (na >> i & 1) {
            newax[n_new++] = od++;
            continue;
        }
        if (d >= KILN_MAX_RANK || (rank >= 0 && d >= rank))
            return lerr(L, KILN_ERR_INVALID_MODEL, "indexes more dims than the input has");
        if (s[i] == 0) return lerr(L, KILN_ERR_INVALID_MODEL, "stride %d is 0", i);
        bool shrink = sh >> i & 1;
        int64_t st0, en0, step = s[i];
        if (shrink) {
            st0 = b[i];
            en0 = b[i] == -1 ? INT64_MAX : b[i] + 1;
            step = 1;
            squeeze[n_sq++] = d;
        } else {
            st0 = (bm >> i & 1) ? (step > 0 ? 0 : INT64_MAX) : b[i];
            en0 = (em_ >> i & 1) ? (step > 0 ? INT64_MAX : INT64_MIN) : en[i];
            od++;
        }
        bool whole = !shrink && step == 1 && st0 == 0 && en0 == INT64_MAX;
        if (!whole) {
            starts[n_sl] = st0;
            ends[n_sl] = en0;
            steps[n_sl] = step;
            axes[n_sl] = d;
            n_sl++;
        }
        d++;
    }
    int y = x;
    if (n_sl > 0) {
        int cs = -1, ce = -1, ca = -1, cst = -1;
        if ((st = const_i64(L, 1, n_sl, starts, &cs)) != KILN_OK) return st;
        if ((st = const_i64(L, 1, n_sl, ends, &ce)) != KILN_OK) return st;
        if ((st = const_i64(L, 1, n_sl, axes, &ca)) != KILN_OK) return st;
        if ((st = const_i64(L, 1, n_sl, steps, &cst)) != KILN_OK) return st;
        int in[5] = {x, cs, ce, ca, cst};
        if ((st = op1(L, KILN_OP_Slice, 5, in, &y)) != KILN_OK) return st;
    }
    if (n_sq > 0 && (st = axes_node(L, KILN_OP_Squeeze, y, n_sq, squeeze, &y)) != KILN_OK) return st;
    if (n_new > 0 && (st = axes_node(L, KILN_OP_Unsqueeze, y, n_new, newax, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_gather(L_t *L, const struct lower *e)
{
    int p = -1, i = -1, y = -1, n = -1;
    int64_t axis = 0;
    kiln_status st = in_value(L, 0, &p);
    if (st == KILN_OK) st = in_value(L, 1, &i);
    if (st != KILN_OK) return st;
    if (e->arg == 1) { /* GatherV2 */
        if ((st = need_const_ints(L, 2, &axis, 1, &n, "axis")) != KILN_OK) return st;
        if (n != 1) return lerr(L, KILN_ERR_INVALID_MODEL, "axis must be a single value");
        if (attr_int(L, "batch_dims", 0) != 0)
            return lerr(L, KILN_ERR_UNSUPPORTED, "batch_dims other than 0 is not supported");
    }
    if (e->arg == 2) { /* GatherNd */
        st = bin(L, KILN_OP_GatherND, p, i, &y);
    } else {
        struct emit em;
        int in[2] = {p, i};
        if ((st = node_begin(L, KILN_OP_Gather, 2, in, 1, 1, &em)) != KILN_OK) return st;
        a_int(&em, "axis", axis);
        st = node_end(&em, &y);
    }
    if (st != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_range(L_t *L, const struct lower *e)
{
    (void)e;
    int a = -1, b = -1, c = -1, y = -1;
    kiln_status st = in_value(L, 0, &a);
    if (st == KILN_OK) st = in_value(L, 1, &b);
    if (st == KILN_OK) st = in_value(L, 2, &c);
    if (st != KILN_OK) return st;
    int in[3] = {a, b, c};
    if ((st = op1(L, KILN_OP_Range, 3, in, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_cumsum(L_t *L, const struct lower *e)
{
    int x = -1, a = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &a);
    if (st != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, a};
    if ((st = node_begin(L, e->op, 2, in, 1, 2, &em)) != KILN_OK) return st;
    a_int(&em, "exclusive", attr_bool(L, "exclusive", false));
    a_int(&em, "reverse", attr_bool(L, "reverse", false));
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_einsum(L_t *L, const struct lower *e)
{
    (void)e;
    if (L->n_in < 1 || L->n_in > KILN_MAX_IO) return lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs", L->n_in);
    int in[KILN_MAX_IO], y;
    kiln_status st;
    for (int k = 0; k < L->n_in; k++)
        if ((st = in_value(L, k, &in[k])) != KILN_OK) return st;
    const char *eq = attr_str(L, "equation", NULL);
    if (!eq) return lerr(L, KILN_ERR_INVALID_MODEL, "has no equation");
    struct emit em;
    if ((st = node_begin(L, KILN_OP_Einsum, L->n_in, in, 1, 1, &em)) != KILN_OK) return st;
    if ((st = a_str(&em, "equation", eq, strlen(eq))) != KILN_OK) return st;
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_topk(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, k = -1, outs[2];
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &k);
    if (st == KILN_OK) st = i64_vector(L, k, &k);
    if (st != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, k};
    if ((st = node_begin(L, KILN_OP_TopK, 2, in, 2, 3, &em)) != KILN_OK) return st;
    a_int(&em, "axis", -1);
    a_int(&em, "largest", 1);
    a_int(&em, "sorted", attr_bool(L, "sorted", true));
    if ((st = node_end(&em, outs)) != KILN_OK) return st;
    kiln_dtype it = attr_dtype(L, "index_type");
    if ((st = cast_to(L, outs[1], it != KILN_DTYPE_UNDEFINED ? it : KILN_DTYPE_I32, &outs[1])) != KILN_OK)
        return st;
    if ((st = set_outputs(L, 2)) != KILN_OK) return st;
    L->out[0].v = outs[0];
    L->out[1].v = outs[1];
    return KILN_OK;
}

/* OneHot: along the last axis as Equal(indices, range) (TF's rule that
 * out-of-range indices, -1 included, give an all-off row); other axes
 * through ONNX OneHot. */
static kiln_status lw_one_hot(L_t *L, const struct lower *e)
{
    (void)e;
    int idx = -1, depth = -1, on = -1, off = -1, y = -1;
    kiln_status st = in_value(L, 0, &idx);
    if (st == KILN_OK) st = in_value(L, 1, &depth);
    if (st == KILN_OK) st = in_value(L, 2, &on);
    if (st == KILN_OK) st = in_value(L, 3, &off);
    if (st != KILN_OK) return st;
    int64_t axis = attr_int(L, "axis", -1);
    int r = vtype(L, idx)->rank;
    if (axis == -1 || (r >= 0 && axis == r)) {
        int zero = -1, one = -1, rng = -1, ix = -1, eq = -1;
        kiln_dtype it = vtype(L, idx)->dtype != KILN_DTYPE_UNDEFINED ? vtype(L, idx)->dtype : KILN_DTYPE_I64;
        int64_t m1 = -1;
        if ((st = cast_to(L, depth, it, &depth)) != KILN_OK) return st;
        if ((st = const_scalar(L, it, 0, &zero)) != KILN_OK) return st;
        if ((st = const_scalar(L, it, 1, &one)) != KILN_OK) return st;
        int in3[3] = {zero, depth, one};
        if ((st = op1(L, KILN_OP_Range, 3, in3, &rng)) != KILN_OK) return st;
        if ((st = axes_node(L, KILN_OP_Unsqueeze, idx, 1, &m1, &ix)) != KILN_OK) return st;
        if ((st = bin(L, KILN_OP_Equal, ix, rng, &eq)) != KILN_OK) return st;
        int in[3] = {eq, on, off};
        if ((st = op1(L, KILN_OP_Where, 3, in, &y)) != KILN_OK) return st;
        return out1(L, y);
    }
    int64_t one = 1;
    int offv = -1, onv = -1, vals = -1;
    if ((st = reshape_to(L, off, 1, &one, &offv)) != KILN_OK) return st;
    if ((st = reshape_to(L, on, 1, &one, &onv)) != KILN_OK) return st;
    struct emit em;
    int cin[2] = {offv, onv};
    if ((st = node_begin(L, KILN_OP_Concat, 2, cin, 1, 1, &em)) != KILN_OK) return st;
    a_int(&em, "axis", 0);
    if ((st = node_end(&em, &vals)) != KILN_OK) return st;
    int in[3] = {idx, depth, vals};
    if ((st = node_begin(L, KILN_OP_OneHot, 3, in, 1, 1, &em)) != KILN_OK) return st;
    a_int(&em, "axis", axis);
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_where1(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, nz = -1, y = -1;
    if (L->n_in != 1) return lerr(L, KILN_ERR_UNSUPPORTED, "with %d inputs is not supported", L->n_in);
    static const int64_t T10[2] = {1, 0};
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = un(L, KILN_OP_NonZero, x, &nz);
    if (st == KILN_OK) st = transpose(L, nz, 2, T10, &y);
    if (st == KILN_OK) st = out1(L, y);
    return st;
}

/* ---- tf.Example and strings ---- */

/* ParseExample (V1: serialized, names, sparse_keys[Ns], dense_keys[Nd],
 * dense_defaults[Nd]) and ParseExampleV2 (serialized, names, sparse_keys,
 * dense_keys, ragged_keys, dense_defaults...): dense features only. */
static kiln_status lw_parse_example(L_t *L, const struct lower *e)
{
    bool v2 = e->arg == 1;
    kiln_status st;
    const KilnSm__AttrValue *td = attr(L, "Tdense");
    const KilnSm__AttrValue *ds = attr(L, "dense_shapes");
    int nd = td && td->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST ? (int)td->list->n_type : 0;
    int64_t nsparse = v2 ? attr_int(L, "num_sparse", 0) : attr_int(L, "Nsparse", 0);
    if (nsparse != 0)
        return lerr(L, KILN_ERR_UNSUPPORTED, "sparse features (%lld) are not supported",
                    (long long)nsparse);
    if (v2) {
        const KilnSm__AttrValue *rv = attr(L, "ragged_value_types");
        if (rv && rv->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST && rv->list->n_type)
            return lerr(L, KILN_ERR_UNSUPPORTED, "ragged features are not supported");
    }
    if (!ds || ds->value_case != KILN_SM__ATTR_VALUE__VALUE_LIST || (int)ds->list->n_shape != nd)
        return lerr(L, KILN_ERR_INVALID_MODEL, "dense_shapes does not match Tdense");
    if (nd + 1 > KILN_MAX_IO) return lerr(L, KILN_ERR_UNSUPPORTED, "has %d dense features", nd);
    int n_keys_at = v2 ? 3 : 2;
    int defaults_at = v2 ? 5 : 2 + nd;
    if (L->n_in != defaults_at + nd)
        return lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs, expected %d", L->n_in, defaults_at + nd);
    /* keys: V1 one scalar string per feature; V2 one string vector */
    kiln_string *keys = kiln_arena_alloc(L->g->mem, sizeof *keys * ((size_t)nd + 1));
    if (!keys) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int k = 0; k < nd; k++) {
        int kv = -1;
        if ((st = in_value(L, v2 ? n_keys_at : n_keys_at + k, &kv)) != KILN_OK) return st;
        const kiln_tensor *t = vconst(L, kv);
        if (!t || t->dtype != KILN_DTYPE_STRING || kiln_tensor_count(t) != (v2 ? nd : 1))
            return lerr(L, KILN_ERR_UNSUPPORTED, "dense_keys must be constant strings");
        const kiln_string *s = &((const kiln_string *)t->data)[v2 ? k : 0];
        keys[k].len = s->len;
        keys[k].data = kiln_arena_strndup(L->g->mem, s->data ? s->data : "", s->len);
        if (!keys[k].data) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    int64_t types[KILN_MAX_IO], ranks[KILN_MAX_IO], shapes[KILN_MAX_IO * KILN_MAX_RANK];
    int n_shapes = 0;
    for (int k = 0; k < nd; k++) {
        kiln_dtype dt = tf_dtype(td->list->type[k]);
        if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_I64 && dt != KILN_DTYPE_STRING)
            return lerr(L, KILN_ERR_UNSUPPORTED, "dense feature %d has dtype %s", k,
                        tf_dtype_name(td->list->type[k]));
        types[k] = dt;
        const KilnSm__TensorShapeProto *sp = ds->list->shape[k];
        if (sp->unknown_rank || sp->n_dim > KILN_MAX_RANK - 1)
            return lerr(L, KILN_ERR_UNSUPPORTED, "dense feature %d has an unknown or too large shape", k);
        ranks[k] = (int64_t)sp->n_dim;
        for (size_t j = 0; j < sp->n_dim; j++) {
            if (sp->dim[j]->size < 0)
                return lerr(L, KILN_ERR_UNSUPPORTED, "dense feature %d has an unknown dim "
                            "(variable-length features are not supported)", k);
            shapes[n_shapes++] = sp->dim[j]->size;
        }
    }
    int in[KILN_MAX_IO];
    if ((st = in_value(L, 0, &in[0])) != KILN_OK) return st;
    for (int k = 0; k < nd; k++)
        if ((st = in_value(L, defaults_at + k, &in[1 + k])) != KILN_OK) return st;
    struct emit em;
    int outs[KILN_MAX_IO];
    if ((st = node_begin(L, KILN_OP_TfParseExample, 1 + nd, in, nd, 4, &em)) != KILN_OK) return st;
    struct kiln_attr *a = a_new(&em, "dense_keys", KILN_ATTR_STRINGS);
    a->n = nd;
    a->strings = keys;
    if ((st = a_ints(&em, "dense_types", nd, types)) != KILN_OK) return st;
    if ((st = a_ints(&em, "dense_shapes", n_shapes, shapes)) != KILN_OK) return st;
    if ((st = a_ints(&em, "dense_ranks", nd, ranks)) != KILN_OK) return st;
    if ((st = node_end(&em, outs)) != KILN_OK) return st;
    /* V1 outputs: sparse (none), dense; V2: sparse (none), dense, ragged (none) */
    if ((st = set_outputs(L, nd)) != KILN_OK) return st;
    for (int k = 0; k < nd; k++) L->out[k].v = outs[k];
    return KILN_OK;
}

static kiln_status lw_string_join(L_t *L, const struct lower *e)
{
    (void)e;
    if (L->n_in < 1 || L->n_in > KILN_MAX_IO) return lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs", L->n_in);
    int in[KILN_MAX_IO], y;
    kiln_status st;
    for (int k = 0; k < L->n_in; k++)
        if ((st = in_value(L, k, &in[k])) != KILN_OK) return st;
    const char *sep = attr_str(L, "separator", "");
    struct emit em;
    if ((st = node_begin(L, KILN_OP_TfStringJoin, L->n_in, in, 1, 1, &em)) != KILN_OK) return st;
    if ((st = a_str(&em, "separator", sep, strlen(sep))) != KILN_OK) return st;
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_reduce_join(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, a = -1, y = -1;
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &a);
    if (st != KILN_OK) return st;
    const char *sep = attr_str(L, "separator", "");
    struct emit em;
    int in[2] = {x, a};
    if ((st = node_begin(L, KILN_OP_TfReduceJoin, 2, in, 1, 2, &em)) != KILN_OK) return st;
    a_int(&em, "keep_dims", attr_bool(L, "keep_dims", false));
    if ((st = a_str(&em, "separator", sep, strlen(sep))) != KILN_OK) return st;
    if ((st = node_end(&em, &y)) != KILN_OK) return st;
    return out1(L, y);
}

static kiln_status lw_string_split(L_t *L, const struct lower *e)
{
    (void)e;
    int x = -1, d = -1, outs[3];
    kiln_status st = in_value(L, 0, &x);
    if (st == KILN_OK) st = in_value(L, 1, &d);
    if (st != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, d};
    if ((st = node_begin(L, KILN_OP_TfStringSplit, 2, in, 3, 1, &em)) != KILN_OK) return st;
    a_int(&em, "skip_empty", attr_bool(L, "skip_empty", true));
    if ((st = node_end(&em, outs)) != KILN_OK) return st;
    if ((st = set_outputs(L, 3)) != KILN_OK) return st;
    for (int k = 0; k < 3; k++) L->out[k].v = outs[k];
    return KILN_OK;
}

/* ---- random values known only by their range ---- */

static kiln_status lw_random_uniform(L_t *L, const struct lower *e)
{
    (void)e;
    int shape = -1;
    kiln_dtype dt = attr_dtype(L, "dtype");
    if (!kiln_dtype_is_float(dt))
        return lerr(L, KILN_ERR_UNSUPPORTED, "random values of type %s are not supported",
                    kiln_dtype_name(dt));
    kiln_status st = in_value(L, 0, &shape);
    if (st == KILN_OK) st = i64_vector(L, shape, &shape);
    if (st == KILN_OK) st = set_outputs(L, 1);
    if (st != KILN_OK) return st;
    struct tf_sym *r = &L->out[0];
    r->v = -1;
    r->rnd = true;
    r->rnd_shape = shape;
    r->lo = 0;
    r->hi = 1;
    r->lo_open = false;
    r->hi_open = true;
    r->rnd_node = L->nd->name;
    return KILN_OK;
}

/* The single value of a constant with one element, if it is one. */
static bool const_scalar_value(L_t *L, const struct tf_sym *s, double *out)
{
    if (s->rnd || s->v < 0) return false;
    const kiln_tensor *t = vconst(L, s->v);
    if (!t || kiln_tensor_count(t) != 1 || t->rank > 0 || !kiln_dtype_is_numeric(t->dtype))
        return false;
    *out = kiln_get_f64(t->dtype, t->data, 0);
    return true;
}

/* A constant of value c, dtype dt, with the random value's shape. */
static kiln_status rnd_fill(L_t *L, const struct tf_sym *r, kiln_dtype dt, double c)
{
    int k = -1, y = -1;
    kiln_status st = const_scalar(L, dt, c, &k);
    if (st == KILN_OK) st = bin(L, KILN_OP_Expand, k, r->rnd_shape, &y);
    if (st == KILN_OK) st = out1(L, y);
    return st;
}

/* Arithmetic and comparisons with a random operand (e->arg: the TF op kind).
 * Returns *handled false when no input is random. */
static kiln_status rnd_binary(L_t *L, enum kiln_op op, bool *handled)
{
    *handled = L->n_in == 2 && (L->in[0].rnd || L->in[1].rnd);
    if (!*handled) return KILN_OK;
    bool first = L->in[0].rnd;
    const struct tf_sym *r = &L->in[first ? 0 : 1];
    double c;
    if (!const_scalar_value(L, &L->in[first ? 1 : 0], &c))
        return lerr(L, KILN_ERR_UNSUPPORTED,
                    "combines random values (from RandomUniform node '%s') with something other "
                    "than a constant scalar; Kiln does not evaluate random ops",
                    r->rnd_node);
    struct tf_sym o = *r;
    double lo = r->lo, hi = r->hi;
    bool lo_open = r->lo_open, hi_open = r->hi_open;
    switch (op) {
    case KILN_OP_Add: o.lo = lo + c; o.hi = hi + c; break;
    case KILN_OP_Sub:
        if (first) {
            o.lo = lo - c;
            o.hi = hi - c;
        } else { /* c - r */
            o.lo = c - hi;
            o.hi = c - lo;
            o.lo_open = hi_open;
            o.hi_open = lo_open;
        }
        break;
    case KILN_OP_Mul:
    case KILN_OP_Div:
        if (op == KILN_OP_Div && (!first || c == 0)) goto unsupported;
        if (op == KILN_OP_Div) c = 1 / c;
        if (c >= 0) {
            o.lo = lo * c;
            o.hi = hi * c;
        } else {
            o.lo = hi * c;
            o.hi = lo * c;
            o.lo_open = hi_open;
            o.hi_open = lo_open;
        }
        break;
    case KILN_OP_GreaterOrEqual: case KILN_OP_Greater: case KILN_OP_Less: case KILN_OP_LessOrEqual: {
        /* r OP c (or c OP r, flipped) is decided when the whole range is on one side */
        enum kiln_op k = op;
        if (!first) {
            k = op == KILN_OP_GreaterOrEqual ? KILN_OP_LessOrEqual
              : op == KILN_OP_Greater ? KILN_OP_Less
              : op == KILN_OP_Less ? KILN_OP_Greater : KILN_OP_GreaterOrEqual;
        }
        bool all_ge = lo > c || (lo == c && !lo_open);   /* every r >= c */
        bool all_gt = lo > c || (lo == c && lo_open);    /* every r > c */
        bool all_lt = hi < c || (hi == c && hi_open);    /* every r < c */
        bool all_le = hi < c || (hi == c);               /* every r <= c */
        int v = -1;
        if (k == KILN_OP_GreaterOrEqual) v = all_ge ? 1 : all_lt ? 0 : -1;
        if (k == KILN_OP_Greater) v = all_gt ? 1 : all_le ? 0 : -1;
        if (k == KILN_OP_Less) v = all_lt ? 1 : all_ge ? 0 : -1;
        if (k == KILN_OP_LessOrEqual) v = all_le ? 1 : all_gt ? 0 : -1;
        if (v < 0) goto unsupported;
        return rnd_fill(L, r, KILN_DTYPE_BOOL, v);
    }
    default: goto unsupported;
    }
    kiln_status st = set_outputs(L, 1);
    if (st == KILN_OK) L->out[0] = o;
    return st;
unsupported:
    return lerr(L, KILN_ERR_UNSUPPORTED,
                "its result depends on random values (from RandomUniform node '%s'); Kiln does "
                "not evaluate random ops",
                r->rnd_node);
}

/* Floor of a random range that lies within one integer step is a constant. */
static kiln_status rnd_floor(L_t *L, bool *handled)
{
    *handled = L->n_in == 1 && L->in[0].rnd;
    if (!*handled) return KILN_OK;
    const struct tf_sym *r = &L->in[0];
    double fl = floor(r->lo);
    double fh = r->hi_open && r->hi == floor(r->hi) ? r->hi - 1 : floor(r->hi);
    if (fl != fh)
        return lerr(L, KILN_ERR_UNSUPPORTED,
                    "its result depends on random values (from RandomUniform node '%s', range "
                    "[%g, %g)); Kiln does not evaluate random ops",
                    r->rnd_node, r->lo, r->hi);
    kiln_dtype dt = node_dtype(L);
    return rnd_fill(L, r, kiln_dtype_is_float(dt) ? dt : KILN_DTYPE_F32, fl);
}

/* ---- the table ---- */

static const struct lower LOWER[] = {
    /* pass-through and structure */
    {"Identity", lw_pass, 0, 0},
    {"Snapshot", lw_pass, 0, 0},
    {"StopGradient", lw_pass, 0, 0},
    {"PreventGradient", lw_pass, 0, 0},
    {"CheckNumerics", lw_pass, 0, 0},
    {"EnsureShape", lw_pass, 0, 0},
    {"IdentityN", lw_identity_n, 0, 0},
    {"NoOp", lw_noop, 0, 0},
    {"Const", lw_const, 0, 0},
    {"PlaceholderWithDefault", lw_placeholder_default, 0, 0},
    /* variables */
    {"ReadVariableOp", lw_read_variable, 0, 0},
    {"VarIsInitializedOp", lw_var_initialized, 0, 0},
    {"IsVariableInitialized", lw_var_initialized, 0, 0},
    {"ResourceGather", lw_resource_gather, 0, 0},
    /* elementwise */
    {"Abs", lw_unary, KILN_OP_Abs, 0},
    {"Neg", lw_unary, KILN_OP_Neg, 0},
    {"Reciprocal", lw_unary, KILN_OP_Reciprocal, 0},
    {"Inv", lw_unary, KILN_OP_Reciprocal, 0},
    {"Floor", lw_unary, KILN_OP_Floor, 0},
    {"Ceil", lw_unary, KILN_OP_Ceil, 0},
    {"Round", lw_unary, KILN_OP_Round, 0},
    {"Rint", lw_unary, KILN_OP_Round, 0},
    {"Sqrt", lw_unary, KILN_OP_Sqrt, 0},
    {"Exp", lw_unary, KILN_OP_Exp, 0},
    {"Log", lw_unary, KILN_OP_Log, 0},
    {"Sin", lw_unary, KILN_OP_Sin, 0},
    {"Cos", lw_unary, KILN_OP_Cos, 0},
    {"Tan", lw_unary, KILN_OP_Tan, 0},
    {"Asin", lw_unary, KILN_OP_Asin, 0},
    {"Acos", lw_unary, KILN_OP_Acos, 0},
    {"Atan", lw_unary, KILN_OP_Atan, 0},
    {"Sinh", lw_unary, KILN_OP_Sinh, 0},
    {"Cosh", lw_unary, KILN_OP_Cosh, 0},
    {"Asinh", lw_unary, KILN_OP_Asinh, 0},
    {"Acosh", lw_unary, KILN_OP_Acosh, 0},
    {"Atanh", lw_unary, KILN_OP_Atanh, 0},
    {"Erf", lw_unary, KILN_OP_Erf, 0},
    {"Sign", lw_unary, KILN_OP_Sign, 0},
    {"Sigmoid", lw_unary, KILN_OP_Sigmoid, 0},
    {"Tanh", lw_unary, KILN_OP_Tanh, 0},
    {"Relu", lw_unary, KILN_OP_Relu, 0},
    {"Elu", lw_unary, KILN_OP_Elu, 0},
    {"Selu", lw_unary, KILN_OP_Selu, 0},
    {"Softplus", lw_unary, KILN_OP_Softplus, 0},
    {"Softsign", lw_unary, KILN_OP_Softsign, 0},
    {"IsNan", lw_unary, KILN_OP_IsNaN, 0},
    {"IsInf", lw_unary, KILN_OP_IsInf, 0},
    {"LogicalNot", lw_unary, KILN_OP_Not, 0},
    {"Rsqrt", lw_special_unary, 0, 0},
    {"Square", lw_special_unary, 0, 1},
    {"Relu6", lw_special_unary, 0, 2},
    {"Log1p", lw_special_unary, 0, 3},
    {"Expm1", lw_special_unary, 0, 4},
    {"IsFinite", lw_special_unary, 0, 5},
    {"LeakyRelu", lw_mapped, KILN_OP_LeakyRelu, 0},
    {"Softmax", lw_mapped, KILN_OP_Softmax, 0},
    {"LogSoftmax", lw_mapped, KILN_OP_LogSoftmax, 0},
    {"ZerosLike", lw_special_unary, 0, 9},
    {"OnesLike", lw_special_unary, 0, 10},
    {"Add", lw_binary, KILN_OP_Add, 0},
    {"AddV2", lw_binary, KILN_OP_Add, 0},
    {"Sub", lw_binary, KILN_OP_Sub, 0},
    {"Mul", lw_binary, KILN_OP_Mul, 0},
    {"RealDiv", lw_binary, KILN_OP_Div, 0},
    {"Div", lw_binary, KILN_OP_Div, 0},
    {"TruncateDiv", lw_binary, KILN_OP_Div, 0},
    {"Maximum", lw_binary, KILN_OP_Max, 0},
    {"Minimum", lw_binary, KILN_OP_Min, 0},
    {"Pow", lw_binary, KILN_OP_Pow, 0},
    {"Equal", lw_binary, KILN_OP_Equal, 0},
    {"Less", lw_binary, KILN_OP_Less, 0},
    {"Greater", lw_binary, KILN_OP_Greater, 0},
    {"LessEqual", lw_binary, KILN_OP_LessOrEqual, 0},
    {"GreaterEqual", lw_binary, KILN_OP_GreaterOrEqual, 0},
    {"LogicalAnd", lw_binary, KILN_OP_And, 0},
    {"LogicalOr", lw_binary, KILN_OP_Or, 0},
    {"BitwiseAnd", lw_binary, KILN_OP_BitwiseAnd, 0},
    {"BitwiseOr", lw_binary, KILN_OP_BitwiseOr, 0},
    {"BitwiseXor", lw_binary, KILN_OP_BitwiseXor, 0},
    {"NotEqual", lw_special_binary, 0, 0},
    {"SquaredDifference", lw_special_binary, 0, 1},
    {"FloorDiv", lw_special_binary, 0, 2},
    {"DivNoNan", lw_special_binary, 0, 3},
    {"FloorMod", lw_special_binary, 0, 4},
    {"BiasAdd", lw_bias_add, 0, 0},
    {"BiasAddV1", lw_bias_add, 0, 0},
    {"AddN", lw_add_n, 0, 0},
    {"ClipByValue", lw_clip_by_value, 0, 0},
    {"Select", lw_select, 0, 1},
    {"SelectV2", lw_select, 0, 0},
    {"Cast", lw_cast, 0, 0},
    /* linear algebra, convolution, pooling, normalization */
    {"MatMul", lw_matmul, 0, 0},
    {"BatchMatMul", lw_matmul, 0, 1},
    {"BatchMatMulV2", lw_matmul, 0, 1},
    {"BatchMatMulV3", lw_matmul, 0, 1},
    {"Conv2D", lw_conv, 0, 0},
    {"DepthwiseConv2dNative", lw_conv, 0, 1},
    {"Conv2DBackpropInput", lw_conv_backprop_input, 0, 0},
    {"MaxPool", lw_pool, KILN_OP_MaxPool, 0},
    {"AvgPool", lw_pool, KILN_OP_AveragePool, 0},
    {"FusedBatchNorm", lw_fused_batch_norm, 0, 0},
    {"FusedBatchNormV2", lw_fused_batch_norm, 0, 0},
    {"FusedBatchNormV3", lw_fused_batch_norm, 0, 0},
    {"Einsum", lw_einsum, 0, 0},
    /* reductions */
    {"Sum", lw_reduce, KILN_OP_ReduceSum, 0},
    {"Mean", lw_reduce, KILN_OP_ReduceMean, 0},
    {"Max", lw_reduce, KILN_OP_ReduceMax, 0},
    {"Min", lw_reduce, KILN_OP_ReduceMin, 0},
    {"Prod", lw_reduce, KILN_OP_ReduceProd, 0},
    {"All", lw_reduce, KILN_OP_ReduceMin, 1},
    {"Any", lw_reduce, KILN_OP_ReduceMax, 1},
    {"ArgMax", lw_argmax, KILN_OP_ArgMax, 0},
    {"ArgMin", lw_argmax, KILN_OP_ArgMin, 0},
    {"Cumsum", lw_cumsum, KILN_OP_CumSum, 0},
    {"Cumprod", lw_cumsum, KILN_OP_CumProd, 0},
    {"TopKV2", lw_topk, 0, 0},
    /* shapes */
    {"ConcatV2", lw_concat, 0, 0},
    {"Concat", lw_concat, 0, 1},
    {"Pack", lw_pack, 0, 0},
    {"Unpack", lw_unpack, 0, 0},
    {"Split", lw_split, 0, 0},
    {"SplitV", lw_split, 0, 1},
    {"Reshape", lw_reshape, 0, 0},
    {"Squeeze", lw_squeeze, 0, 0},
    {"ExpandDims", lw_with_i64_vector, KILN_OP_Unsqueeze, 0},
    {"Transpose", lw_transpose, 0, 0},
    {"Shape", lw_shape, 0, 0},
    {"ShapeN", lw_shape, 0, 1},
    {"Size", lw_shape, 0, 2},
    {"Rank", lw_shape, 0, 3},
    {"Fill", lw_fill, 0, 0},
    {"BroadcastTo", lw_fill, 0, 1},
    {"Tile", lw_with_i64_vector, KILN_OP_Tile, 0},
    {"Pad", lw_pad, 0, 0},
    {"PadV2", lw_pad, 0, 1},
    {"MirrorPad", lw_pad, 0, 2},
    {"Slice", lw_slice, 0, 0},
    {"StridedSlice", lw_strided_slice, 0, 0},
    {"ReverseV2", lw_reverse, 0, 0},
    {"Gather", lw_gather, 0, 0},
    {"GatherV2", lw_gather, 0, 1},
    {"GatherNd", lw_gather, 0, 2},
    {"Range", lw_range, 0, 0},
    {"OneHot", lw_one_hot, 0, 0},
    {"Where", lw_where1, 0, 0},
    /* tf.Example and strings */
    {"RandomUniform", lw_random_uniform, 0, 0},
    {"ParseExample", lw_parse_example, 0, 0},
    {"ParseExampleV2", lw_parse_example, 0, 1},
    {"StringJoin", lw_string_join, 0, 0},
    {"ReduceJoin", lw_reduce_join, 0, 0},
    {"StringSplit", lw_string_split, 0, 0},
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
    kiln_status st = node_begin(L, op, n_in, in, n_out, n_attrs, &e);
    if (st != KILN_OK) return st;
    for (int i = 0; i < n_attrs; i++) *a_new(&e, attrs[i].name, attrs[i].type) = attrs[i];
    return node_end(&e, outs);
}

kiln_status tf_const(struct tf_node_ctx *L, kiln_tensor *t, int *id) { return const_tensor(L, t, id); }

kiln_status tf_const_i64(struct tf_node_ctx *L, int rank, int n, const int64_t *vals, int *id)
{
    return const_i64(L, rank, n, vals, id);
}

kiln_status tf_cast_to(struct tf_node_ctx *L, int x, kiln_dtype dt, int *out)
{
    return cast_to(L, x, dt, out);
}

kiln_status tf_in_value(struct tf_node_ctx *L, int k, int *v) { return in_value(L, k, v); }

kiln_status tf_node_err(const struct tf_node_ctx *L, kiln_status st, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(st, "%s: node '%s' (op %s): %s", L->where, L->nd->name, L->nd->op, msg);
}

kiln_status tf_lower_node(struct tf_node_ctx *L)
{
    const char *op = L->nd->op ? L->nd->op : "";
    if (tf_control_handles(op)) {
        kiln_status st = tf_control_lower(L);
        if (st == KILN_OK && !L->out) st = set_outputs(L, 0);
        return st;
    }
    if (tf_v1_control_handles(op)) {
        kiln_status st = tf_v1_control_lower(L);
        if (st == KILN_OK && !L->out) st = set_outputs(L, 0);
        return st;
    }
    for (size_t i = 0; i < sizeof LOWER / sizeof *LOWER; i++)
        if (strcmp(op, LOWER[i].tf) == 0) {
            kiln_status st = LOWER[i].fn(L, &LOWER[i]);
            if (st == KILN_OK && !L->out) st = set_outputs(L, 0);
            return st;
        }
    if (tf_op_writes_state(op)) return lw_state_write(L, NULL);
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
