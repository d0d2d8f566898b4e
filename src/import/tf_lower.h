/*
 * tf_lower.h - what the TensorFlow op lowering files share (internal to
 * src/import/): tf_lower.c (the table-driven dispatch, TensorProto
 * decoding, the emitting helpers, Identity-likes, constants and
 * variables), tf_lower_elementwise.c (elementwise ops, Cast, random
 * values), tf_lower_nn.c (bias, convolution, pooling, batch norm),
 * tf_lower_math.c (matrix products, reductions, scans, top-k),
 * tf_lower_array.c (shapes, concat/split, slicing, gathers, padding) and
 * tf_lower_string.c (tf.Example parsing, string ops).
 *
 * Every TF op the table tf_ops.def names is lowered by the handler
 * tfo_lw_<lowering> of its row, given the row (its Kiln op, its variant
 * argument and its attribute mapping).
 */
#ifndef KILN_IMPORT_TF_LOWER_H
#define KILN_IMPORT_TF_LOWER_H

#include "import/tf_import.h"

typedef struct tf_node_ctx L_t;

/* An attribute of a one-to-one mapping (tfo_lw_mapped): the Kiln attribute
 * `name` takes the node's TF attribute `tf`, or `dflt` when the node has
 * none (or tf is NULL). */
struct amap {
    const char *name;
    enum kiln_attr_type type; /* KILN_ATTR_INT or KILN_ATTR_FLOAT */
    const char *tf;
    double dflt;
};

#define LOWER_MAX_ATTRS 2

/* A row of tf_ops.def. */
struct tf_op;
typedef kiln_status (*lower_fn)(L_t *L, const struct tf_op *e);
struct tf_op {
    const char *tf;    /* TF op name */
    lower_fn fn;       /* its lowering */
    enum kiln_op op;   /* the Kiln op, for the table-driven lowerings */
    int arg;           /* lowering-specific variant */
    struct amap attrs[LOWER_MAX_ATTRS]; /* tfo_lw_mapped: name NULL ends the list */
};

/* Variants: the arg column of tf_ops.def, for handlers that lower several
 * ops (0 is each handler's first or plain form). */
enum {
    /* special_unary */
    TFV_RSQRT = 0, TFV_SQUARE = 1, TFV_RELU6 = 2, TFV_LOG1P = 3, TFV_EXPM1 = 4, TFV_IS_FINITE = 5,
    TFV_ZEROS_LIKE = 9, TFV_ONES_LIKE = 10,
    /* special_binary */
    TFV_NOT_EQUAL = 0, TFV_SQUARED_DIFFERENCE = 1, TFV_FLOOR_DIV = 2, TFV_DIV_NO_NAN = 3,
    TFV_FLOOR_MOD = 4,
    /* shape */
    TFV_SHAPE_N = 1, TFV_SIZE = 2, TFV_RANK = 3,
    /* pad */
    TFV_PAD_V2 = 1, TFV_MIRROR_PAD = 2,
    /* gather */
    TFV_GATHER_V2 = 1, TFV_GATHER_ND = 2,
    /* one alternative form */
    TFV_SELECT_V1 = 1,    /* select: Select (TF1 broadcasting) rather than SelectV2 */
    TFV_BATCH = 1,        /* matmul: BatchMatMul (adj_x / adj_y) rather than MatMul */
    TFV_DEPTHWISE = 1,    /* conv */
    TFV_LOGICAL = 1,      /* reduce: All / Any over bools */
    TFV_CONCAT_V1 = 1,    /* concat: Concat (axis first) rather than ConcatV2 */
    TFV_SPLIT_V = 1,      /* split */
    TFV_BROADCAST_TO = 1, /* fill: BroadcastTo(input, shape) rather than Fill(dims, value) */
    TFV_V2 = 1,           /* parse_example: ParseExampleV2 */
};

/* The lowerings the table names. */
#define TF_OP(tf, lowering, kop, arg, attrs) kiln_status tfo_lw_##lowering(L_t *L, const struct tf_op *e);
#include "import/tf_ops.def"
#undef TF_OP

/* An IR node under construction: attributes are appended with the tfo_a_*
 * helpers, then tfo_node_end finishes it. Only one node is open at a time. */
struct emit {
    L_t *L;
    int node;           /* index in g->nodes (the array may move while open) */
    int cap_attr;
};

/* Helpers of tf_lower.c: the node's attributes, its inputs and outputs,
 * constants, and emitting IR nodes (folded when their inputs are constant). */
const KilnSm__AttrValue *tfo_attr(L_t *L, const char *key);
int64_t tfo_attr_int(L_t *L, const char *key, int64_t dflt);
bool tfo_attr_bool(L_t *L, const char *key, bool dflt);
float tfo_attr_float(L_t *L, const char *key, float dflt);
const char *tfo_attr_str(L_t *L, const char *key, const char *dflt);
kiln_dtype tfo_attr_dtype(L_t *L, const char *key);
int tfo_attr_ints(L_t *L, const char *key, const int64_t **vals);
/* An error "<where>: node '<name>' (op <op>): <message>". */
kiln_status tfo_lerr(L_t *L, kiln_status st, const char *fmt, ...) KILN_PRINTF(3, 4);
kiln_status tfo_set_outputs(L_t *L, int n);
kiln_status tfo_out1(L_t *L, int v);
kiln_status tfo_in_value(L_t *L, int k, int *v);
const struct kiln_type *tfo_vtype(L_t *L, int v);
const kiln_tensor *tfo_vconst(L_t *L, int v);
kiln_status tfo_const_i64(L_t *L, int rank, int n, const int64_t *vals, int *id);
kiln_status tfo_const_scalar(L_t *L, kiln_dtype dt, double v, int *id);
kiln_status tfo_node_begin(L_t *L, enum kiln_op op, int n_in, const int *in, int n_out,
                              int cap_attr, struct emit *e);
struct kiln_attr *tfo_a_new(struct emit *e, const char *name, enum kiln_attr_type type);
void tfo_a_int(struct emit *e, const char *name, int64_t v);
void tfo_a_float(struct emit *e, const char *name, float v);
kiln_status tfo_a_str(struct emit *e, const char *name, const char *s, size_t len);
kiln_status tfo_a_ints(struct emit *e, const char *name, int n, const int64_t *v);
kiln_status tfo_node_end(struct emit *e, int *outs);
kiln_status tfo_op1(L_t *L, enum kiln_op op, int n_in, const int *in, int *out);
kiln_status tfo_un(L_t *L, enum kiln_op op, int x, int *out);
kiln_status tfo_bin(L_t *L, enum kiln_op op, int a, int b, int *out);
kiln_status tfo_cast_to(L_t *L, int x, kiln_dtype dt, int *out);
kiln_status tfo_transpose(L_t *L, int x, int rank, const int64_t *perm, int *out);
kiln_status tfo_reshape_to(L_t *L, int x, int n, const int64_t *shape, int *out);
kiln_status tfo_i64_vector(L_t *L, int x, int *out);
kiln_status tfo_axes_node(L_t *L, enum kiln_op op, int x, int n_axes, const int64_t *axes,
                             int *out);
kiln_status tfo_need_const_ints(L_t *L, int k, int64_t *vals, int max, int *n, const char *what);
kiln_dtype tfo_node_dtype(L_t *L);

#endif
