/*
 * tf_lower_elementwise.c - TensorFlow elementwise ops to Kiln IR: the
 * table-driven unary, binary and attribute-mapped ops (tf_ops.def), the ones
 * that take a few IR ops (Rsqrt, Square, Relu6, Log1p, Expm1, IsFinite,
 * ZerosLike/OnesLike, NotEqual, SquaredDifference, FloorDiv, DivNoNan,
 * FloorMod), AddN, ClipByValue, Select, Cast, and RandomUniform: a random
 * value is not computed but kept as a range, so that dropout with keep
 * probability 1 (floor(1 + U)) folds to a constant.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tf_lower.h"
#include "kernels/kernel.h"

static kiln_status rnd_binary(L_t *L, enum kiln_op op, bool *handled);
static kiln_status rnd_floor(L_t *L, bool *handled);

kiln_status tfo_lw_unary(L_t *L, const struct tf_op *e)
{
    int x = -1, y = -1;
    bool handled = false;
    kiln_status st = e->op == KILN_OP_Floor ? rnd_floor(L, &handled) : KILN_OK;
    if (handled) return st;
    st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_un(L, e->op, x, &y);
    if (st == KILN_OK) st = tfo_out1(L, y);
    return st;
}

kiln_status tfo_lw_binary(L_t *L, const struct tf_op *e)
{
    int a = -1, b = -1, y = -1;
    bool handled;
    kiln_status st = rnd_binary(L, e->op, &handled);
    if (handled) return st;
    st = tfo_in_value(L, 0, &a);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    if (tfo_vtype(L, a)->dtype == KILN_DTYPE_STRING && e->op == KILN_OP_Add) {
        /* string + string: concatenation */
        struct emit em;
        int in[2] = {a, b};
        if ((st = tfo_node_begin(L, KILN_OP_TfStringJoin, 2, in, 1, 1, &em)) != KILN_OK) return st;
        if ((st = tfo_a_str(&em, "separator", "", 0)) != KILN_OK) return st;
        if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
        return tfo_out1(L, y);
    }
    if ((st = tfo_bin(L, e->op, a, b, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

/* A TF op that is Kiln op e->op on the same inputs, attributes mapped by its
 * row of tf_ops.def (e->attrs). */
kiln_status tfo_lw_mapped(L_t *L, const struct tf_op *e)
{
    int in[KILN_MAX_IO], y = -1, n_attr = 0;
    kiln_status st;
    if (L->n_in > KILN_MAX_IO) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "has %d inputs", L->n_in);
    for (int k = 0; k < L->n_in; k++)
        if ((st = tfo_in_value(L, k, &in[k])) != KILN_OK) return st;
    while (n_attr < LOWER_MAX_ATTRS && e->attrs[n_attr].name) n_attr++;
    struct emit em;
    if ((st = tfo_node_begin(L, e->op, L->n_in, in, 1, n_attr, &em)) != KILN_OK) return st;
    for (int i = 0; i < n_attr; i++) {
        const struct amap *a = &e->attrs[i];
        if (a->type == KILN_ATTR_FLOAT)
            tfo_a_float(&em, a->name, a->tf ? tfo_attr_float(L, a->tf, (float)a->dflt) : (float)a->dflt);
        else
            tfo_a_int(&em, a->name, a->tf ? tfo_attr_int(L, a->tf, (int64_t)a->dflt) : (int64_t)a->dflt);
    }
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}
/* op(x, typed scalar c) or op(c, x) */
static kiln_status with_scalar(L_t *L, enum kiln_op op, int x, double c, bool c_first, int *out)
{
    int k = -1;
    kiln_status st = tfo_const_scalar(L, tfo_vtype(L, x)->dtype != KILN_DTYPE_UNDEFINED
                                         ? tfo_vtype(L, x)->dtype
                                         : tfo_node_dtype(L),
                                  c, &k);
    if (st != KILN_OK) return st;
    return c_first ? tfo_bin(L, op, k, x, out) : tfo_bin(L, op, x, k, out);
}

kiln_status tfo_lw_special_unary(L_t *L, const struct tf_op *e)
{
    int x = -1, y = -1, t = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    switch (e->arg) {
    case TFV_RSQRT:
        if ((st = tfo_un(L, KILN_OP_Sqrt, x, &t)) == KILN_OK) st = tfo_un(L, KILN_OP_Reciprocal, t, &y);
        break;
    case TFV_SQUARE: st = tfo_bin(L, KILN_OP_Mul, x, x, &y); break;
    case TFV_RELU6: {
        int lo = -1, hi = -1;
        kiln_dtype dt = tfo_vtype(L, x)->dtype != KILN_DTYPE_UNDEFINED ? tfo_vtype(L, x)->dtype : tfo_node_dtype(L);
        if ((st = tfo_const_scalar(L, dt, 0, &lo)) != KILN_OK) return st;
        if ((st = tfo_const_scalar(L, dt, 6, &hi)) != KILN_OK) return st;
        int in[3] = {x, lo, hi};
        st = tfo_op1(L, KILN_OP_Clip, 3, in, &y);
        break;
    }
    case TFV_LOG1P:
        if ((st = with_scalar(L, KILN_OP_Add, x, 1, false, &t)) == KILN_OK) st = tfo_un(L, KILN_OP_Log, t, &y);
        break;
    case TFV_EXPM1:
        if ((st = tfo_un(L, KILN_OP_Exp, x, &t)) == KILN_OK) st = with_scalar(L, KILN_OP_Sub, t, 1, false, &y);
        break;
    case TFV_IS_FINITE: {
        int a = -1, b2 = -1, c = -1;
        if ((st = tfo_un(L, KILN_OP_IsNaN, x, &a)) != KILN_OK) return st;
        if ((st = tfo_un(L, KILN_OP_IsInf, x, &b2)) != KILN_OK) return st;
        if ((st = tfo_bin(L, KILN_OP_Or, a, b2, &c)) != KILN_OK) return st;
        st = tfo_un(L, KILN_OP_Not, c, &y);
        break;
    }
    case TFV_ZEROS_LIKE:
    case TFV_ONES_LIKE: {
        int z = -1, s = -1;
        if ((st = tfo_const_scalar(L, tfo_node_dtype(L), e->arg == TFV_ZEROS_LIKE ? 0 : 1, &z)) != KILN_OK) return st;
        if ((st = tfo_un(L, KILN_OP_Shape, x, &s)) != KILN_OK) return st;
        st = tfo_bin(L, KILN_OP_Expand, z, s, &y);
        break;
    }
    default: return tfo_lerr(L, KILN_ERR_INTERNAL, "bad lowering");
    }
    if (st != KILN_OK) return st;
    return tfo_out1(L, y);
}

/* fix = r != 0 and (r < 0) != (b < 0): where a truncating division or
 * remainder must be corrected to TF's floor semantics. */
static kiln_status floor_fix(L_t *L, int r, int b, kiln_dtype dt, int *fix)
{
    int zero = -1, rz = -1, nrz = -1, rneg = -1, bneg = -1, diff = -1;
    kiln_status st = tfo_const_scalar(L, dt, 0, &zero);
    if (st == KILN_OK) st = tfo_bin(L, KILN_OP_Equal, r, zero, &rz);
    if (st == KILN_OK) st = tfo_un(L, KILN_OP_Not, rz, &nrz);
    if (st == KILN_OK) st = tfo_bin(L, KILN_OP_Less, r, zero, &rneg);
    if (st == KILN_OK) st = tfo_bin(L, KILN_OP_Less, b, zero, &bneg);
    if (st == KILN_OK) st = tfo_bin(L, KILN_OP_Xor, rneg, bneg, &diff);
    if (st == KILN_OK) st = tfo_bin(L, KILN_OP_And, nrz, diff, fix);
    return st;
}

kiln_status tfo_lw_special_binary(L_t *L, const struct tf_op *e)
{
    int a = -1, b = -1, y = -1, t = -1;
    kiln_status st = tfo_in_value(L, 0, &a);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &b);
    if (st != KILN_OK) return st;
    kiln_dtype dt = tfo_vtype(L, a)->dtype != KILN_DTYPE_UNDEFINED ? tfo_vtype(L, a)->dtype : tfo_node_dtype(L);
    switch (e->arg) {
    case TFV_NOT_EQUAL:
        if ((st = tfo_bin(L, KILN_OP_Equal, a, b, &t)) == KILN_OK) st = tfo_un(L, KILN_OP_Not, t, &y);
        break;
    case TFV_SQUARED_DIFFERENCE:
        if ((st = tfo_bin(L, KILN_OP_Sub, a, b, &t)) == KILN_OK) st = tfo_bin(L, KILN_OP_Mul, t, t, &y);
        break;
    case TFV_FLOOR_DIV:
        if (kiln_dtype_is_float(dt)) {
            if ((st = tfo_bin(L, KILN_OP_Div, a, b, &t)) == KILN_OK) st = tfo_un(L, KILN_OP_Floor, t, &y);
        } else {
            /* q = trunc(a/b); q - 1 where the remainder is nonzero and its sign differs from b's */
            int q = -1, qb = -1, r = -1, one = -1, fix = -1, qm1 = -1;
            if ((st = tfo_bin(L, KILN_OP_Div, a, b, &q)) != KILN_OK) return st;
            if ((st = tfo_bin(L, KILN_OP_Mul, q, b, &qb)) != KILN_OK) return st;
            if ((st = tfo_bin(L, KILN_OP_Sub, a, qb, &r)) != KILN_OK) return st;
            if ((st = tfo_const_scalar(L, dt, 1, &one)) != KILN_OK) return st;
            if ((st = floor_fix(L, r, b, dt, &fix)) != KILN_OK) return st;
            if ((st = tfo_bin(L, KILN_OP_Sub, q, one, &qm1)) != KILN_OK) return st;
            int in[3] = {fix, qm1, q};
            st = tfo_op1(L, KILN_OP_Where, 3, in, &y);
        }
        break;
    case TFV_DIV_NO_NAN: {
        int zero = -1, isz = -1, d = -1;
        if ((st = tfo_const_scalar(L, dt, 0, &zero)) != KILN_OK) return st;
        if ((st = tfo_bin(L, KILN_OP_Equal, b, zero, &isz)) != KILN_OK) return st;
        if ((st = tfo_bin(L, KILN_OP_Div, a, b, &d)) != KILN_OK) return st;
        int in[3] = {isz, zero, d};
        st = tfo_op1(L, KILN_OP_Where, 3, in, &y);
        break;
    }
    case TFV_FLOOR_MOD: {
        struct emit em;
        int in[2] = {a, b};
        if ((st = tfo_node_begin(L, KILN_OP_Mod, 2, in, 1, 1, &em)) != KILN_OK) return st;
        tfo_a_int(&em, "fmod", kiln_dtype_is_float(dt) ? 1 : 0);
        if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
        if (kiln_dtype_is_float(dt)) {
            /* fmod, then shift by b where the signs differ (floor semantics) */
            int fix = -1, rb = -1, y2 = -1;
            if ((st = floor_fix(L, y, b, dt, &fix)) != KILN_OK) return st;
            if ((st = tfo_bin(L, KILN_OP_Add, y, b, &rb)) != KILN_OK) return st;
            int in3[3] = {fix, rb, y};
            if ((st = tfo_op1(L, KILN_OP_Where, 3, in3, &y2)) != KILN_OK) return st;
            y = y2;
        }
        break;
    }
    default: return tfo_lerr(L, KILN_ERR_INTERNAL, "bad lowering");
    }
    if (st != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_add_n(L_t *L, const struct tf_op *e)
{
    (void)e;
    if (L->n_in < 1) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has no inputs");
    int *in = kiln_arena_alloc(L->g->mem, sizeof(int) * (size_t)L->n_in);
    if (!in) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_status st;
    for (int k = 0; k < L->n_in; k++)
        if ((st = tfo_in_value(L, k, &in[k])) != KILN_OK) return st;
    if (L->n_in == 1) return tfo_out1(L, in[0]);
    int y = -1;
    if ((st = tfo_op1(L, KILN_OP_Sum, L->n_in, in, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_clip_by_value(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, lo = -1, hi = -1, t = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &lo);
    if (st == KILN_OK) st = tfo_in_value(L, 2, &hi);
    if (st == KILN_OK) st = tfo_bin(L, KILN_OP_Min, x, hi, &t);
    if (st == KILN_OK) st = tfo_bin(L, KILN_OP_Max, t, lo, &y);
    if (st == KILN_OK) st = tfo_out1(L, y);
    return st;
}

kiln_status tfo_lw_select(L_t *L, const struct tf_op *e)
{
    int c = -1, a = -1, b = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &c);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &a);
    if (st == KILN_OK) st = tfo_in_value(L, 2, &b);
    if (st != KILN_OK) return st;
    if (e->arg == TFV_SELECT_V1) {
        /* TF1 Select: a vector condition picks rows of higher-rank x and y */
        int rc = tfo_vtype(L, c)->rank, rx = tfo_vtype(L, a)->rank;
        if (rc == 1 && rx > 1) {
            int64_t axes[KILN_MAX_RANK];
            for (int i = 0; i < rx - 1; i++) axes[i] = i + 1;
            if ((st = tfo_axes_node(L, KILN_OP_Unsqueeze, c, rx - 1, axes, &c)) != KILN_OK) return st;
        } else if (rc < 0 || (rc == 1 && rx < 0)) {
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "needs inputs of known rank");
        }
    }
    int in[3] = {c, a, b};
    if ((st = tfo_op1(L, KILN_OP_Where, 3, in, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_cast(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st != KILN_OK) return st;
    const KilnSm__AttrValue *a = tfo_attr(L, "DstT");
    kiln_dtype dt = a && a->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype(a->type)
                                                                          : KILN_DTYPE_UNDEFINED;
    if (dt == KILN_DTYPE_UNDEFINED)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "casts to %s, which Kiln does not support",
                    a && a->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype_name(a->type)
                                                                          : "(none)");
    if ((st = tfo_cast_to(L, x, dt, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}
/* ---- random values known only by their range ---- */

kiln_status tfo_lw_random_uniform(L_t *L, const struct tf_op *e)
{
    (void)e;
    int shape = -1;
    kiln_dtype dt = tfo_attr_dtype(L, "dtype");
    if (!kiln_dtype_is_float(dt))
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "random values of type %s are not supported",
                    kiln_dtype_name(dt));
    kiln_status st = tfo_in_value(L, 0, &shape);
    if (st == KILN_OK) st = tfo_i64_vector(L, shape, &shape);
    if (st == KILN_OK) st = tfo_set_outputs(L, 1);
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
    const kiln_tensor *t = tfo_vconst(L, s->v);
    if (!t || kiln_tensor_count(t) != 1 || t->rank > 0 || !kiln_dtype_is_numeric(t->dtype))
        return false;
    *out = kiln_get_f64(t->dtype, t->data, 0);
    return true;
}

/* A constant of value c, dtype dt, with the random value's shape. */
static kiln_status rnd_fill(L_t *L, const struct tf_sym *r, kiln_dtype dt, double c)
{
    int k = -1, y = -1;
    kiln_status st = tfo_const_scalar(L, dt, c, &k);
    if (st == KILN_OK) st = tfo_bin(L, KILN_OP_Expand, k, r->rnd_shape, &y);
    if (st == KILN_OK) st = tfo_out1(L, y);
    return st;
}

/* Arithmetic and comparisons (Kiln op `op`) with a random operand.
 * Returns *handled false when no input is random. */
static kiln_status rnd_binary(L_t *L, enum kiln_op op, bool *handled)
{
    *handled = L->n_in == 2 && (L->in[0].rnd || L->in[1].rnd);
    if (!*handled) return KILN_OK;
    bool first = L->in[0].rnd;
    const struct tf_sym *r = &L->in[first ? 0 : 1];
    double c;
    if (!const_scalar_value(L, &L->in[first ? 1 : 0], &c))
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED,
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
    kiln_status st = tfo_set_outputs(L, 1);
    if (st == KILN_OK) L->out[0] = o;
    return st;
unsupported:
    return tfo_lerr(L, KILN_ERR_UNSUPPORTED,
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
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED,
                    "its result depends on random values (from RandomUniform node '%s', range "
                    "[%g, %g)); Kiln does not evaluate random ops",
                    r->rnd_node, r->lo, r->hi);
    kiln_dtype dt = tfo_node_dtype(L);
    return rnd_fill(L, r, kiln_dtype_is_float(dt) ? dt : KILN_DTYPE_F32, fl);
}
