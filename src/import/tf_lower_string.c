/*
 * tf_lower_string.c - tf.Example parsing and TensorFlow string ops to Kiln IR:
 * ParseExample(V2), StringJoin, ReduceJoin and StringSplit.
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

/* ---- tf.Example and strings ---- */

/* ParseExample (V1: serialized, names, sparse_keys[Ns], dense_keys[Nd],
 * dense_defaults[Nd]) and ParseExampleV2 (serialized, names, sparse_keys,
 * dense_keys, ragged_keys, dense_defaults...): dense features only. */
kiln_status tfo_lw_parse_example(L_t *L, const struct tf_op *e)
{
    bool v2 = e->arg == TFV_V2;
    kiln_status st;
    const KilnSm__AttrValue *td = tfo_attr(L, "Tdense");
    const KilnSm__AttrValue *ds = tfo_attr(L, "dense_shapes");
    int nd = td && td->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST ? (int)td->list->n_type : 0;
    int64_t nsparse = v2 ? tfo_attr_int(L, "num_sparse", 0) : tfo_attr_int(L, "Nsparse", 0);
    if (nsparse != 0)
        return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "sparse features (%lld) are not supported",
                    (long long)nsparse);
    if (v2) {
        const KilnSm__AttrValue *rv = tfo_attr(L, "ragged_value_types");
        if (rv && rv->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST && rv->list->n_type)
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "ragged features are not supported");
    }
    if (!ds || ds->value_case != KILN_SM__ATTR_VALUE__VALUE_LIST || (int)ds->list->n_shape != nd)
        return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "dense_shapes does not match Tdense");
    if (nd + 1 > KILN_MAX_IO) return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "has %d dense features", nd);
    int n_keys_at = v2 ? 3 : 2;
    int defaults_at = v2 ? 5 : 2 + nd;
    if (L->n_in != defaults_at + nd)
        return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs, expected %d", L->n_in, defaults_at + nd);
    /* keys: V1 one scalar string per feature; V2 one string vector */
    kiln_string *keys = kiln_arena_alloc(L->g->mem, sizeof *keys * ((size_t)nd + 1));
    if (!keys) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int k = 0; k < nd; k++) {
        int kv = -1;
        if ((st = tfo_in_value(L, v2 ? n_keys_at : n_keys_at + k, &kv)) != KILN_OK) return st;
        const kiln_tensor *t = tfo_vconst(L, kv);
        if (!t || t->dtype != KILN_DTYPE_STRING || kiln_tensor_count(t) != (v2 ? nd : 1))
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "dense_keys must be constant strings");
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
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "dense feature %d has dtype %s", k,
                        tf_dtype_name(td->list->type[k]));
        types[k] = dt;
        const KilnSm__TensorShapeProto *sp = ds->list->shape[k];
        if (sp->unknown_rank || sp->n_dim > KILN_MAX_RANK - 1)
            return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "dense feature %d has an unknown or too large shape", k);
        ranks[k] = (int64_t)sp->n_dim;
        for (size_t j = 0; j < sp->n_dim; j++) {
            if (sp->dim[j]->size < 0)
                return tfo_lerr(L, KILN_ERR_UNSUPPORTED, "dense feature %d has an unknown dim "
                            "(variable-length features are not supported)", k);
            shapes[n_shapes++] = sp->dim[j]->size;
        }
    }
    int in[KILN_MAX_IO];
    if ((st = tfo_in_value(L, 0, &in[0])) != KILN_OK) return st;
    for (int k = 0; k < nd; k++)
        if ((st = tfo_in_value(L, defaults_at + k, &in[1 + k])) != KILN_OK) return st;
    struct emit em;
    int outs[KILN_MAX_IO];
    if ((st = tfo_node_begin(L, KILN_OP_TfParseExample, 1 + nd, in, nd, 4, &em)) != KILN_OK) return st;
    struct kiln_attr *a = tfo_a_new(&em, "dense_keys", KILN_ATTR_STRINGS);
    a->n = nd;
    a->strings = keys;
    if ((st = tfo_a_ints(&em, "dense_types", nd, types)) != KILN_OK) return st;
    if ((st = tfo_a_ints(&em, "dense_shapes", n_shapes, shapes)) != KILN_OK) return st;
    if ((st = tfo_a_ints(&em, "dense_ranks", nd, ranks)) != KILN_OK) return st;
    if ((st = tfo_node_end(&em, outs)) != KILN_OK) return st;
    /* V1 outputs: sparse (none), dense; V2: sparse (none), dense, ragged (none) */
    if ((st = tfo_set_outputs(L, nd)) != KILN_OK) return st;
    for (int k = 0; k < nd; k++) L->out[k].v = outs[k];
    return KILN_OK;
}

kiln_status tfo_lw_string_join(L_t *L, const struct tf_op *e)
{
    (void)e;
    if (L->n_in < 1 || L->n_in > KILN_MAX_IO) return tfo_lerr(L, KILN_ERR_INVALID_MODEL, "has %d inputs", L->n_in);
    int in[KILN_MAX_IO], y;
    kiln_status st;
    for (int k = 0; k < L->n_in; k++)
        if ((st = tfo_in_value(L, k, &in[k])) != KILN_OK) return st;
    const char *sep = tfo_attr_str(L, "separator", "");
    struct emit em;
    if ((st = tfo_node_begin(L, KILN_OP_TfStringJoin, L->n_in, in, 1, 1, &em)) != KILN_OK) return st;
    if ((st = tfo_a_str(&em, "separator", sep, strlen(sep))) != KILN_OK) return st;
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_reduce_join(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, a = -1, y = -1;
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &a);
    if (st != KILN_OK) return st;
    const char *sep = tfo_attr_str(L, "separator", "");
    struct emit em;
    int in[2] = {x, a};
    if ((st = tfo_node_begin(L, KILN_OP_TfReduceJoin, 2, in, 1, 2, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "keep_dims", tfo_attr_bool(L, "keep_dims", false));
    if ((st = tfo_a_str(&em, "separator", sep, strlen(sep))) != KILN_OK) return st;
    if ((st = tfo_node_end(&em, &y)) != KILN_OK) return st;
    return tfo_out1(L, y);
}

kiln_status tfo_lw_string_split(L_t *L, const struct tf_op *e)
{
    (void)e;
    int x = -1, d = -1, outs[3];
    kiln_status st = tfo_in_value(L, 0, &x);
    if (st == KILN_OK) st = tfo_in_value(L, 1, &d);
    if (st != KILN_OK) return st;
    struct emit em;
    int in[2] = {x, d};
    if ((st = tfo_node_begin(L, KILN_OP_TfStringSplit, 2, in, 3, 1, &em)) != KILN_OK) return st;
    tfo_a_int(&em, "skip_empty", tfo_attr_bool(L, "skip_empty", true));
    if ((st = tfo_node_end(&em, outs)) != KILN_OK) return st;
    if ((st = tfo_set_outputs(L, 3)) != KILN_OK) return st;
    for (int k = 0; k < 3; k++) L->out[k].v = outs[k];
    return KILN_OK;
}
