/*
 * tflite_lower.c - TFLite operators to Kiln IR (see tflite.h).
 *
 * TFLite tensors are NHWC; Kiln's float Conv and pooling are ONNX's NCHW.
 * A float CONV_2D therefore becomes Transpose(NHWC->NCHW), Conv with its
 * weights permuted once at import (OHWI -> OIHW, depthwise 1HWC -> C1HW),
 * the fused activation, and Transpose back; the optimizer's transpose pass
 * cancels the pairs between consecutive convolutions. TFLite's SAME padding
 * (the odd pixel after) is ONNX's auto_pad SAME_UPPER. Quantized operators
 * (int8 and uint8 tensors with scale and zero point) stay NHWC and become
 * the Tfl* ops of ops.def, whose reference kernels (kernels/ref/tflite_q.c)
 * compute with TFLite's integer arithmetic; the fixed-point multipliers and
 * shifts they need are worked out here exactly as TFLite's kernels prepare
 * them (tfl_quantize_multiplier, in double).
 *
 * Types are not inferred while lowering: decisions use the shapes and types
 * the file declares, and the graph is verified and its types inferred once
 * at the end.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tflite.h"
#include "kernels/kernel.h"
#include "kernels/ref/tflite_lstm.h"
#include "kernels/ref/tflite_q.h"

#define TFL_OPSET 21 /* ONNX semantics of the float nodes created here */

/* BuiltinOptions union types Kiln checks (schema.fbs order, NONE = 0). */
enum {
    OPT_CONV2D = 1, OPT_DEPTHWISE = 2, OPT_POOL2D = 5, OPT_SVDF = 6, OPT_FC = 8, OPT_SOFTMAX = 9,
    OPT_CONCAT = 10, OPT_ADD = 11, OPT_LSTM = 14, OPT_RESHAPE = 17, OPT_MUL = 21, OPT_PAD = 22,
    OPT_TRANSPOSE = 26, OPT_REDUCER = 27, OPT_SUB = 28, OPT_DIV = 29, OPT_SQUEEZE = 30,
    OPT_STRIDED_SLICE = 32, OPT_SEQ_LSTM = 71,
};
/* ActivationFunctionType */
enum { ACT_NONE = 0, ACT_RELU = 1, ACT_RELU_N1_TO_1 = 2, ACT_RELU6 = 3, ACT_TANH = 4 };

static const struct { int32_t code; const char *name; } builtin_names[] = {
    {0, "ADD"}, {1, "AVERAGE_POOL_2D"}, {2, "CONCATENATION"}, {3, "CONV_2D"},
    {4, "DEPTHWISE_CONV_2D"}, {5, "DEPTH_TO_SPACE"}, {6, "DEQUANTIZE"},
    {7, "EMBEDDING_LOOKUP"}, {8, "FLOOR"}, {9, "FULLY_CONNECTED"}, {10, "HASHTABLE_LOOKUP"},
    {11, "L2_NORMALIZATION"}, {12, "L2_POOL_2D"}, {13, "LOCAL_RESPONSE_NORMALIZATION"},
    {14, "LOGISTIC"}, {15, "LSH_PROJECTION"}, {16, "LSTM"}, {17, "MAX_POOL_2D"}, {18, "MUL"},
    {19, "RELU"}, {20, "RELU_N1_TO_1"}, {21, "RELU6"}, {22, "RESHAPE"},
    {23, "RESIZE_BILINEAR"}, {24, "RNN"}, {25, "SOFTMAX"}, {26, "SPACE_TO_DEPTH"},
    {27, "SVDF"}, {28, "TANH"}, {29, "CONCAT_EMBEDDINGS"}, {30, "SKIP_GRAM"}, {31, "CALL"},
    {32, "CUSTOM"}, {33, "EMBEDDING_LOOKUP_SPARSE"}, {34, "PAD"},
    {35, "UNIDIRECTIONAL_SEQUENCE_RNN"}, {36, "GATHER"}, {37, "BATCH_TO_SPACE_ND"},
    {38, "SPACE_TO_BATCH_ND"}, {39, "TRANSPOSE"}, {40, "MEAN"}, {41, "SUB"}, {42, "DIV"},
    {43, "SQUEEZE"}, {44, "UNIDIRECTIONAL_SEQUENCE_LSTM"}, {45, "STRIDED_SLICE"},
    {46, "BIDIRECTIONAL_SEQUENCE_RNN"}, {47, "EXP"}, {48, "TOPK_V2"}, {49, "SPLIT"},
    {50, "LOG_SOFTMAX"}, {51, "DELEGATE"}, {52, "BIDIRECTIONAL_SEQUENCE_LSTM"}, {53, "CAST"},
    {54, "PRELU"}, {55, "MAXIMUM"}, {56, "ARG_MAX"}, {57, "MINIMUM"}, {58, "LESS"},
    {59, "NEG"}, {60, "PADV2"}, {61, "GREATER"}, {62, "GREATER_EQUAL"}, {63, "LESS_EQUAL"},
    {64, "SELECT"}, {65, "SLICE"}, {66, "SIN"}, {67, "TRANSPOSE_CONV"}, {69, "TILE"},
    {70, "EXPAND_DIMS"}, {71, "EQUAL"}, {72, "NOT_EQUAL"}, {73, "LOG"}, {74, "SUM"},
    {75, "SQRT"}, {76, "RSQRT"}, {77, "SHAPE"}, {78, "POW"}, {79, "ARG_MIN"},
    {80, "FAKE_QUANT"}, {81, "REDUCE_PROD"}, {82, "REDUCE_MAX"}, {83, "PACK"},
    {88, "UNPACK"}, {89, "REDUCE_MIN"}, {97, "RESIZE_NEAREST_NEIGHBOR"}, {98, "LEAKY_RELU"},
    {101, "ABS"}, {114, "QUANTIZE"}, {117, "HARD_SWISH"}, {118, "IF"}, {119, "WHILE"},
    {126, "BATCH_MATMUL"}, {150, "GELU"},
};

const char *tfl_builtin_name(int32_t code)
{
    for (size_t i = 0; i < sizeof builtin_names / sizeof builtin_names[0]; i++)
        if (builtin_names[i].code == code) return builtin_names[i].name;
    return NULL;
}

/* Lowering state for one subgraph. */
struct lw {
    const struct tfl_model *tm;
    const struct tfl_subgraph *sg;
    int sgi;
    struct kiln_graph *g;
    int *val;                   /* tensor index -> IR value id, -1 = not yet */
    const struct tfl_op *op;    /* the operator being lowered */
    int opi;
    const char *opname;
    const char *name;           /* name for the IR nodes: the op's first output tensor */
};

static kiln_status oom(void) { return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory"); }

static kiln_status lerr(struct lw *L, kiln_status st, const char *fmt, ...) KILN_PRINTF(3, 4);
static kiln_status lerr(struct lw *L, kiln_status st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(st, "TFLite operator %d (%s) of subgraph %d, output '%s': %s", L->opi,
                      L->opname, L->sgi, L->name, msg);
}

#define TRY(x)                                  \
    do {                                        \
        kiln_status st_ = (x);                  \
        if (st_ != KILN_OK) return st_;         \
    } while (0)

static const struct tfl_tensor *tin(struct lw *L, int k)
{
    return k < L->op->n_in && L->op->in[k] >= 0 ? &L->sg->tensors[L->op->in[k]] : NULL;
}
static const struct tfl_tensor *tout(struct lw *L, int k) { return &L->sg->tensors[L->op->out[k]]; }

/* The constant bytes of tensor t, or NULL when it has none. */
static const struct tfl_buffer *tbuf(struct lw *L, const struct tfl_tensor *t)
{
    if (!t || t->buffer == 0 || t->buffer >= (uint32_t)L->tm->n_buffers) return NULL;
    const struct tfl_buffer *b = &L->tm->buffers[t->buffer];
    return b->data && b->size ? b : NULL;
}

/* Element count of t's shape; -1 when it overflows. */
static int64_t elems(const struct tfl_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] > 0 && n > INT64_MAX / t->shape[i]) return -1;
        n *= t->shape[i];
    }
    return n;
}

static kiln_status add_const(struct lw *L, const char *name, kiln_tensor *t, int *id)
{
    kiln_status st = kiln_graph_own_tensor(L->g, t);
    if (st != KILN_OK) {
        kiln_tensor_free(t);
        return st;
    }
    TRY(kiln_graph_value_add(L->g, name, KILN_VALUE_CONST, id));
    L->g->values[*id].konst = t;
    kiln_type_from_tensor(&L->g->values[*id].type, t);
    return KILN_OK;
}

/* Tensor t's constant data as a new owned tensor (checked against its shape). */
static kiln_status tensor_data(struct lw *L, const struct tfl_tensor *t, kiln_tensor **out)
{
    const struct tfl_buffer *b = tbuf(L, t);
    if (t->dtype == KILN_DTYPE_UNDEFINED || t->dtype == KILN_DTYPE_STRING)
        return lerr(L, KILN_ERR_UNSUPPORTED, "constant tensor '%s' has TFLite type %d, which "
                    "Kiln cannot hold as a constant", t->name, t->type);
    int64_t n = elems(t);
    size_t es = kiln_dtype_size(t->dtype);
    if (!b || n < 0 || (uint64_t)n > b->size / es || (size_t)n * es != b->size)
        return lerr(L, KILN_ERR_INVALID_MODEL, "constant tensor '%s' of %lld elements of %s has "
                    "a buffer of %zu bytes", t->name, (long long)n, kiln_dtype_name(t->dtype),
                    b ? b->size : (size_t)0);
    TRY(kiln_tensor_new_uninit(t->dtype, t->rank, t->shape, out));
    memcpy((*out)->data, b->data, b->size);
    return KILN_OK;
}

/* The IR value of input k of the op (-1 for an absent optional input). */
static kiln_status in_val(struct lw *L, int k, int *id)
{
    *id = -1;
    if (k >= L->op->n_in || L->op->in[k] < 0) return KILN_OK;
    int ti = L->op->in[k];
    if (L->val[ti] >= 0) {
        *id = L->val[ti];
        return KILN_OK;
    }
    const struct tfl_tensor *t = &L->sg->tensors[ti];
    if (!tbuf(L, t))
        return lerr(L, KILN_ERR_INVALID_MODEL, "input %d, tensor '%s', is read before any "
                    "operator writes it and holds no data", k, t->name);
    kiln_tensor *x;
    TRY(tensor_data(L, t, &x));
    TRY(add_const(L, t->name, x, id));
    L->val[ti] = *id;
    return KILN_OK;
}

/* Input k must be present. */
static kiln_status need_in(struct lw *L, int k, int *id)
{
    TRY(in_val(L, k, id));
    if (*id < 0) return lerr(L, KILN_ERR_INVALID_MODEL, "input %d is missing", k);
    return KILN_OK;
}

/* A node with n_in inputs, one output, room for n_attr attributes. */
static kiln_status node(struct lw *L, enum kiln_op op, int n_in, const int *in, int n_attr,
                        struct kiln_node **out, int *out_id)
{
    struct kiln_node *n;
    TRY(kiln_graph_node_add(L->g, op, L->name, n_in, 1, n_attr, &n));
    n->opset = TFL_OPSET;
    n->op_type = kiln_op_name(op);
    n->n_attr = 0;
    for (int k = 0; k < n_in; k++) n->in[k] = in[k];
    int id;
    TRY(kiln_graph_value_add(L->g, L->name, KILN_VALUE_NODE, &id));
    n = &L->g->nodes[L->g->n_nodes - 1];
    n->out[0] = id;
    L->g->values[id].producer = L->g->n_nodes - 1;
    *out = n;
    *out_id = id;
    return KILN_OK;
}

static struct kiln_attr *attr(struct kiln_node *n, const char *name, enum kiln_attr_type type)
{
    struct kiln_attr *a = &n->attr[n->n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = type;
    return a;
}
static void a_int(struct kiln_node *n, const char *name, int64_t v)
{
    attr(n, name, KILN_ATTR_INT)->i = v;
}
static void a_float(struct kiln_node *n, const char *name, float v)
{
    attr(n, name, KILN_ATTR_FLOAT)->f = v;
}
static kiln_status a_ints(struct lw *L, struct kiln_node *n, const char *name, int cnt,
                          const int64_t *v)
{
    struct kiln_attr *a = attr(n, name, KILN_ATTR_INTS);
    a->n = cnt;
    a->ints = kiln_arena_alloc(L->g->mem, sizeof(int64_t) * ((size_t)cnt + 1));
    if (!a->ints) return oom();
    if (cnt) memcpy(a->ints, v, sizeof(int64_t) * (size_t)cnt);
    return KILN_OK;
}
static kiln_status a_floats(struct lw *L, struct kiln_node *n, const char *name, int cnt,
                            const float *v)
{
    struct kiln_attr *a = attr(n, name, KILN_ATTR_FLOATS);
    a->n = cnt;
    a->floats = kiln_arena_alloc(L->g->mem, sizeof(float) * ((size_t)cnt + 1));
    if (!a->floats) return oom();
    if (cnt) memcpy(a->floats, v, sizeof(float) * (size_t)cnt);
    return KILN_OK;
}
static kiln_status a_str(struct lw *L, struct kiln_node *n, const char *name, const char *s)
{
    struct kiln_attr *a = attr(n, name, KILN_ATTR_STRING);
    a->s.len = strlen(s);
    a->s.data = kiln_arena_strdup(L->g->mem, s);
    return a->s.data ? KILN_OK : oom();
}

static kiln_status op1(struct lw *L, enum kiln_op op, int n_in, const int *in, int *out)
{
    struct kiln_node *n;
    return node(L, op, n_in, in, 0, &n, out);
}

static kiln_status const_f32(struct lw *L, float v, int *id)
{
    kiln_tensor *t;
    TRY(kiln_tensor_new(KILN_DTYPE_F32, 0, NULL, &t));
    *(float *)t->data = v;
    return add_const(L, L->name, t, id);
}

static kiln_status const_i64(struct lw *L, int n, const int64_t *v, int *id)
{
    kiln_tensor *t;
    int64_t d = n;
    TRY(kiln_tensor_new(KILN_DTYPE_I64, 1, &d, &t));
    if (n) memcpy(t->data, v, sizeof(int64_t) * (size_t)n);
    return add_const(L, L->name, t, id);
}

static kiln_status transpose(struct lw *L, int x, const int64_t *perm, int *out)
{
    struct kiln_node *n;
    TRY(node(L, KILN_OP_Transpose, 1, &x, 1, &n, out));
    return a_ints(L, n, "perm", 4, perm);
}

static const int64_t to_nchw[4] = {0, 3, 1, 2}, to_nhwc[4] = {0, 2, 3, 1};

/* A constant int vector input (int32 or int64) into vals; *n its length. */
static kiln_status const_ints(struct lw *L, int k, int64_t *vals, int max, int *n,
                              const char *what)
{
    const struct tfl_tensor *t = tin(L, k);
    if (!t || !tbuf(L, t))
        return lerr(L, KILN_ERR_UNSUPPORTED, "%s (input %d) must be a constant", what, k);
    if (t->dtype != KILN_DTYPE_I32 && t->dtype != KILN_DTYPE_I64)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s has type %s, expected int32 or int64", what,
                    kiln_dtype_name(t->dtype));
    int64_t cnt = elems(t);
    const struct tfl_buffer *b = tbuf(L, t);
    size_t es = kiln_dtype_size(t->dtype);
    if (cnt > max || (size_t)cnt * es != b->size)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s has %lld elements in %zu bytes (at most %d "
                    "allowed)", what, (long long)cnt, b->size, max);
    for (int64_t i = 0; i < cnt; i++) {
        if (es == 4) {
            int32_t v;
            memcpy(&v, b->data + 4 * i, 4);
            vals[i] = v;
        } else {
            memcpy(&vals[i], b->data + 8 * i, 8);
        }
    }
    *n = (int)cnt;
    return KILN_OK;
}

/* Options table of the op, checking its union type (absent: defaults). */
static kiln_status options(struct lw *L, int type, const struct kiln_fb_table **out)
{
    *out = NULL;
    if (!L->op->has_opts) return KILN_OK;
    if (L->op->opt_type != type)
        return lerr(L, KILN_ERR_INVALID_MODEL, "builtin_options has union type %u, expected %d",
                    L->op->opt_type, type);
    *out = &L->op->opts;
    return KILN_OK;
}

static kiln_status opt_i8(const struct kiln_fb_table *o, int id, const char *name, int8_t d,
                          int8_t *v)
{
    if (!o) {
        *v = d;
        return KILN_OK;
    }
    return kiln_fb_i8(o, id, name, d, v);
}
static kiln_status opt_i32(const struct kiln_fb_table *o, int id, const char *name, int32_t d,
                           int32_t *v)
{
    if (!o) {
        *v = d;
        return KILN_OK;
    }
    return kiln_fb_i32(o, id, name, d, v);
}

/* Apply a float fused activation to x. */
static kiln_status activation(struct lw *L, int act, int x, int *out)
{
    int lo = -1, hi = -1;
    switch (act) {
    case ACT_NONE: *out = x; return KILN_OK;
    case ACT_RELU: return op1(L, KILN_OP_Relu, 1, &x, out);
    case ACT_TANH: return op1(L, KILN_OP_Tanh, 1, &x, out);
    case ACT_RELU6:
        TRY(const_f32(L, 0.0f, &lo));
        TRY(const_f32(L, 6.0f, &hi));
        break;
    case ACT_RELU_N1_TO_1:
        TRY(const_f32(L, -1.0f, &lo));
        TRY(const_f32(L, 1.0f, &hi));
        break;
    default:
        return lerr(L, KILN_ERR_UNSUPPORTED, "fused activation %d is not supported", act);
    }
    int in[3] = {x, lo, hi};
    return op1(L, KILN_OP_Clip, 3, in, out);
}

/* Bind the op's output k to IR value v. */
static kiln_status bind(struct lw *L, int k, int v)
{
    int ti = L->op->out[k];
    if (L->val[ti] >= 0)
        return lerr(L, KILN_ERR_INVALID_MODEL, "output tensor '%s' is written twice",
                    L->sg->tensors[ti].name);
    L->val[ti] = v;
    return KILN_OK;
}

/* Permute a 4-D constant's elements (any dtype) by perm into a new tensor. */
static kiln_status permute4(const kiln_tensor *x, const int64_t *perm, kiln_tensor **out)
{
    int64_t od[4];
    for (int i = 0; i < 4; i++) od[i] = x->dims[perm[i]];
    TRY(kiln_tensor_new_uninit(x->dtype, 4, od, out));
    size_t es = kiln_dtype_size(x->dtype);
    int64_t xs[4] = {x->dims[1] * x->dims[2] * x->dims[3], x->dims[2] * x->dims[3], x->dims[3], 1};
    const char *src = x->data;
    char *dst = (*out)->data;
    int64_t o = 0;
    for (int64_t a = 0; a < od[0]; a++)
        for (int64_t b = 0; b < od[1]; b++)
            for (int64_t c = 0; c < od[2]; c++)
                for (int64_t d = 0; d < od[3]; d++, o++) {
                    int64_t off = a * xs[perm[0]] + b * xs[perm[1]] + c * xs[perm[2]] +
                                  d * xs[perm[3]];
                    memcpy(dst + (size_t)o * es, src + (size_t)off * es, es);
                }
    return KILN_OK;
}

static bool is_quant(const struct tfl_tensor *t)
{
    return t && t->n_q > 0 &&
           (t->dtype == KILN_DTYPE_I8 || t->dtype == KILN_DTYPE_U8 || t->dtype == KILN_DTYPE_I16);
}

static kiln_status need_rank(struct lw *L, const struct tfl_tensor *t, int rank, const char *what)
{
    if (!t || t->rank != rank)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s has rank %d, expected %d", what,
                    t ? t->rank : -1, rank);
    return KILN_OK;
}

/* ---- quantized parameters (TFLite's own preparation) ---- */

/* The activation clamp of a quantized output (CalculateActivationRangeQuantized). */
static kiln_status q_act_range(struct lw *L, int act, const struct tfl_tensor *o, int64_t *lo,
                               int64_t *hi)
{
    int32_t qmin = o->dtype == KILN_DTYPE_I8 ? -128 : o->dtype == KILN_DTYPE_U8 ? 0 : -32768;
    int32_t qmax = o->dtype == KILN_DTYPE_I8 ? 127 : o->dtype == KILN_DTYPE_U8 ? 255 : 32767;
    float scale = o->scale[0];
    int32_t zp = (int32_t)o->zero_point[0];
    /* zp + round(f / scale) in float as TFLite, clamped before it becomes an int */
#define QV(f) ((int32_t)fmax(-1e6, fmin(1e6, (double)zp + (double)roundf((f) / scale))))
    switch (act) {
    case ACT_NONE: *lo = qmin, *hi = qmax; break;
    case ACT_RELU: *lo = zp > qmin ? zp : qmin, *hi = qmax; break;
    case ACT_RELU6:
        *lo = zp > qmin ? zp : qmin;
        *hi = QV(6.0f) < qmax ? QV(6.0f) : qmax;
        break;
    case ACT_RELU_N1_TO_1:
        *lo = QV(-1.0f) > qmin ? QV(-1.0f) : qmin;
        *hi = QV(1.0f) < qmax ? QV(1.0f) : qmax;
        break;
    default:
        return lerr(L, KILN_ERR_UNSUPPORTED, "fused activation %d on a quantized output", act);
    }
#undef QV
    return KILN_OK;
}

static kiln_status need_qparams(struct lw *L, const struct tfl_tensor *t, const char *what,
                                bool per_channel_ok)
{
    if (!t || t->n_q < 1)
        return lerr(L, KILN_ERR_INVALID_MODEL, "quantized %s has no scale", what);
    if (t->n_q > 1 && !per_channel_ok)
        return lerr(L, KILN_ERR_UNSUPPORTED, "%s is quantized per channel (%d scales); Kiln "
                    "supports one scale here", what, t->n_q);
    int32_t lo = -65536, hi = 65535;
    if (t->dtype == KILN_DTYPE_I8) lo = -128, hi = 127;
    if (t->dtype == KILN_DTYPE_U8) lo = 0, hi = 255;
    if (t->dtype == KILN_DTYPE_I16) lo = -32768, hi = 32767;
    for (int i = 0; i < t->n_q; i++) {
        if (!(t->scale[i] > 0) || !isfinite(t->scale[i]))
            return lerr(L, KILN_ERR_INVALID_MODEL, "%s '%s' has scale %g", what, t->name,
                        (double)t->scale[i]);
        if (t->zero_point[i] < lo || t->zero_point[i] > hi)
            return lerr(L, KILN_ERR_INVALID_MODEL, "%s '%s' has zero point %lld, outside "
                        "[%d, %d]", what, t->name, (long long)t->zero_point[i], (int)lo, (int)hi);
    }
    return KILN_OK;
}

/* int16 tensors are quantized symmetrically in TFLite (zero point 0), and so
 * are the int8 weights they meet; any of a, b, c may be NULL. */
static kiln_status need_symmetric(struct lw *L, const struct tfl_tensor *a,
                                  const struct tfl_tensor *b, const struct tfl_tensor *c)
{
    const struct tfl_tensor *t[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        for (int k = 0; t[i] && k < t[i]->n_q; k++)
            if (t[i]->zero_point[k] != 0)
                return lerr(L, KILN_ERR_UNSUPPORTED, "int16 quantization of '%s' with zero "
                            "point %lld (TFLite's int16 kernels need 0)", t[i]->name,
                            (long long)t[i]->zero_point[k]);
    return KILN_OK;
}

/* The checks of a quantized product x * w (+ b) -> o: int8 or uint8 input, output
 * of the input's type, int8 or uint8 weights (per channel allowed), int32 bias,
 * and valid quantization parameters on each. */
static kiln_status need_q_product(struct lw *L, const struct tfl_tensor *tx,
                                  const struct tfl_tensor *tw, const struct tfl_tensor *tb,
                                  const struct tfl_tensor *to, const char *op, const char *wname)
{
    bool x16 = tx->dtype == KILN_DTYPE_I16; /* "16x8": int16 activations, int8 weights */
    if ((tx->dtype != KILN_DTYPE_I8 && tx->dtype != KILN_DTYPE_U8 && !x16) ||
        to->dtype != tx->dtype || (tw->dtype != KILN_DTYPE_I8 && (x16 || tw->dtype != KILN_DTYPE_U8)))
        return lerr(L, KILN_ERR_UNSUPPORTED, "quantized %s of %s by %s into %s "
                    "(Kiln supports int8 and uint8, and int16 by int8)", op,
                    kiln_dtype_name(tx->dtype), kiln_dtype_name(tw->dtype),
                    kiln_dtype_name(to->dtype));
    if (tb && tb->dtype != (x16 ? KILN_DTYPE_I64 : KILN_DTYPE_I32))
        return lerr(L, KILN_ERR_UNSUPPORTED, "bias of type %s (%s expected)",
                    kiln_dtype_name(tb->dtype), x16 ? "int64" : "int32");
    kiln_status st = need_qparams(L, tx, "input", false);
    if (st == KILN_OK) st = need_qparams(L, tw, wname, true);
    if (st == KILN_OK) st = need_qparams(L, to, "output", false);
    if (st == KILN_OK && x16) st = need_symmetric(L, tx, tw, to);
    return st;
}

/* Multipliers and shifts for out = acc * in_scale * w_scale[c] / out_scale. */
static kiln_status q_channel_mults(struct lw *L, struct kiln_node *n, const struct tfl_tensor *x,
                                   const struct tfl_tensor *w, const struct tfl_tensor *o,
                                   int channels)
{
    if (w->n_q != 1 && w->n_q != channels)
        return lerr(L, KILN_ERR_INVALID_MODEL, "weights '%s' have %d scales for %d channels",
                    w->name, w->n_q, channels);
    int cnt = w->n_q;
    int64_t *mult = malloc(sizeof(int64_t) * (size_t)cnt * 2);
    if (!mult) return oom();
    for (int c = 0; c < cnt; c++) {
        double real = (double)x->scale[0] * (double)w->scale[c] / (double)o->scale[0];
        int32_t q;
        int shift;
        tfl_quantize_multiplier(real, &q, &shift);
        mult[c] = q;
        mult[cnt + c] = shift;
    }
    kiln_status st = a_ints(L, n, "multipliers", cnt, mult);
    if (st == KILN_OK) st = a_ints(L, n, "shifts", cnt, mult + cnt);
    free(mult);
    return st;
}

/* ---- operators ---- */

static kiln_status lower_binary(struct lw *L, enum kiln_op kop, int opt_type)
{
    const struct kiln_fb_table *o;
    TRY(options(L, opt_type, &o));
    int8_t act;
    TRY(opt_i8(o, 0, "fused_activation_function", 0, &act));
    int a, b, y;
    TRY(need_in(L, 0, &a));
    TRY(need_in(L, 1, &b));
    const struct tfl_tensor *ta = tin(L, 0), *tb = tin(L, 1), *to = tout(L, 0);
    if (is_quant(ta) || is_quant(to)) {
        if (kop != KILN_OP_Add && kop != KILN_OP_Sub && kop != KILN_OP_Mul)
            return lerr(L, KILN_ERR_UNSUPPORTED, "quantized %s is not supported (quantized ADD, "
                        "SUB and MUL are)", L->opname);
        if (!ta || !tb || !to)
            return lerr(L, KILN_ERR_INVALID_MODEL, "%s lacks an operand tensor", L->opname);
        if (ta->dtype != to->dtype || tb->dtype != to->dtype ||
            (to->dtype != KILN_DTYPE_I8 && to->dtype != KILN_DTYPE_U8 &&
             to->dtype != KILN_DTYPE_I16))
            return lerr(L, KILN_ERR_UNSUPPORTED, "quantized %s of %s and %s into %s (Kiln "
                        "supports int8, uint8 and int16)", L->opname, kiln_dtype_name(ta->dtype),
                        kiln_dtype_name(tb->dtype), kiln_dtype_name(to->dtype));
        TRY(need_qparams(L, ta, "input 0", false));
        TRY(need_qparams(L, tb, "input 1", false));
        TRY(need_qparams(L, to, "output", false));
        bool q16 = to->dtype == KILN_DTYPE_I16;
        if (q16) TRY(need_symmetric(L, ta, tb, to));
        if (q16 && kop != KILN_OP_Mul) {
            /* add.cc / sub.cc: pot_scale_int16 (default true) with power-of-two scales
             * selects an older shift-only kernel; Kiln computes the general one */
            int8_t pot = 1;
            int l2;
            TRY(opt_i8(o, 1, "pot_scale_int16", 1, &pot));
            if (pot && tfl_checked_log2(ta->scale[0], &l2) && tfl_checked_log2(tb->scale[0], &l2) &&
                tfl_checked_log2(to->scale[0], &l2))
                return lerr(L, KILN_ERR_UNSUPPORTED, "int16 %s with power-of-two scales and "
                            "pot_scale_int16 (TFLite's shift-only kernel) is not supported",
                            L->opname);
        }
        int64_t lo, hi;
        TRY(q_act_range(L, act, to, &lo, &hi));
        struct kiln_node *n;
        int in[2] = {a, b};
        if (kop == KILN_OP_Mul) { /* mul.cc: one multiplier s1 * s2 / so, in float */
            TRY(node(L, KILN_OP_TflMul, 2, in, 7, &n, &y));
            float real = ta->scale[0] * tb->scale[0] / to->scale[0];
            int32_t q;
            int shift;
            tfl_quantize_multiplier((double)real, &q, &shift);
            a_int(n, "input1_offset", -ta->zero_point[0]);
            a_int(n, "input2_offset", -tb->zero_point[0]);
            a_int(n, "output_offset", to->zero_point[0]);
            a_int(n, "output_multiplier", q);
            a_int(n, "output_shift", shift);
            a_int(n, "act_min", lo);
            a_int(n, "act_max", hi);
            return bind(L, 0, y);
        }
        TRY(node(L, KILN_OP_TflAdd, 2, in, 12, &n, &y));
        struct tfl_add_params p;
        tfl_add_prepare(ta->scale[0], (int32_t)ta->zero_point[0], tb->scale[0],
                        (int32_t)tb->zero_point[0], to->scale[0], (int32_t)to->zero_point[0],
                        q16 ? 15 : 20, &p);
        if (kop == KILN_OP_Sub) /* sub.cc: ADD's parameters, input 2's multiplier negated */
            p.input2_multiplier = -p.input2_multiplier;
        a_int(n, "input1_offset", p.input1_offset);
        a_int(n, "input2_offset", p.input2_offset);
        a_int(n, "left_shift", p.left_shift);
        a_int(n, "input1_multiplier", p.input1_multiplier);
        a_int(n, "input1_shift", p.input1_shift);
        a_int(n, "input2_multiplier", p.input2_multiplier);
        a_int(n, "input2_shift", p.input2_shift);
        a_int(n, "output_multiplier", p.output_multiplier);
        a_int(n, "output_shift", p.output_shift);
        a_int(n, "output_offset", p.output_offset);
        a_int(n, "act_min", lo);
        a_int(n, "act_max", hi);
        return bind(L, 0, y);
    }
    int in[2] = {a, b};
    TRY(op1(L, kop, 2, in, &y));
    TRY(activation(L, act, y, &y));
    return bind(L, 0, y);
}

/* Quantized LOGISTIC and TANH (int8, uint8) by TFLite's lookup table
 * (LUTPopulate): each input value dequantized, transformed and requantized
 * in float. */
static kiln_status lower_q_lut(struct lw *L, int x, bool tanh_)
{
    const struct tfl_tensor *tx = tin(L, 0), *to = tout(L, 0);
    if (!to || to->dtype != tx->dtype || (tx->dtype != KILN_DTYPE_I8 && tx->dtype != KILN_DTYPE_U8))
        return lerr(L, KILN_ERR_UNSUPPORTED, "quantized %s of %s into %s (Kiln supports int8 "
                    "and uint8)", L->opname, kiln_dtype_name(tx->dtype),
                    to ? kiln_dtype_name(to->dtype) : "nothing");
    TRY(need_qparams(L, tx, "input", false));
    TRY(need_qparams(L, to, "output", false));
    int32_t lo = tx->dtype == KILN_DTYPE_I8 ? -128 : 0, hi = lo + 255;
    float in_scale = tx->scale[0], inv = 1.0f / to->scale[0]; /* as TFLite's LUTPopulate */
    if (!isfinite(inv)) /* a denormal scale: tanh(0) * inf would be NaN, cast to int */
        return lerr(L, KILN_ERR_INVALID_MODEL, "output '%s' has scale %g, whose reciprocal "
                    "overflows", to->name, (double)to->scale[0]);
    int32_t in_zp = (int32_t)tx->zero_point[0], out_zp = (int32_t)to->zero_point[0];
    int64_t table[256];
    for (int32_t v = lo; v <= hi; v++) {
        float d = in_scale * (float)(v - in_zp);
        float t = tanh_ ? tanhf(d) : 1.0f / (1.0f + expf(-d));
        float r = roundf(t * inv) + (float)out_zp;
        int32_t q = r < (float)lo ? lo : r > (float)hi ? hi : (int32_t)r;
        table[(uint8_t)v] = q;
    }
    struct kiln_node *n;
    int y;
    TRY(node(L, KILN_OP_TflLut, 1, &x, 1, &n, &y));
    TRY(a_ints(L, n, "table", 256, table));
    return bind(L, 0, y);
}

/* int16 LOGISTIC and TANH: TFLite's interpolated table (activations.cc with
 * reference_integer_ops::Logistic / Tanh); output scale 2^-15, zero points 0. */
static kiln_status lower_act16(struct lw *L, int x, bool tanh_)
{
    const struct tfl_tensor *tx = tin(L, 0), *to = tout(L, 0);
    int l2;
    if (!to || to->dtype != KILN_DTYPE_I16)
        return lerr(L, KILN_ERR_UNSUPPORTED, "int16 %s into %s", L->opname,
                    to ? kiln_dtype_name(to->dtype) : "nothing");
    TRY(need_qparams(L, tx, "input", false));
    TRY(need_qparams(L, to, "output", false));
    TRY(need_symmetric(L, tx, to, NULL));
    if (!tfl_checked_log2(to->scale[0], &l2) || l2 != -15)
        return lerr(L, KILN_ERR_INVALID_MODEL, "int16 %s output scale %g (TFLite requires "
                    "2^-15)", L->opname, (double)to->scale[0]);
    int shift;
    int32_t mult = tfl_act16_prepare(tx->scale[0], tanh_, &shift);
    if (mult > 32767 || (mult == 0 && (shift < 0 || shift > 12)))
        return lerr(L, KILN_ERR_UNSUPPORTED, "int16 %s of input scale %g", L->opname,
                    (double)tx->scale[0]);
    struct kiln_node *n;
    int y;
    TRY(node(L, KILN_OP_TflAct16, 1, &x, 3, &n, &y));
    a_int(n, "input_multiplier", mult);
    a_int(n, "input_left_shift", shift);
    a_int(n, "tanh", tanh_);
    return bind(L, 0, y);
}

static kiln_status lower_unary(struct lw *L, int which)
{
    int x, y;
    TRY(need_in(L, 0, &x));
    if (is_quant(tin(L, 0)) && tin(L, 0)->dtype == KILN_DTYPE_I16 &&
        (which == TFL_LOGISTIC || which == TFL_TANH))
        return lower_act16(L, x, which == TFL_TANH);
    if (is_quant(tin(L, 0)) && (which == TFL_LOGISTIC || which == TFL_TANH))
        return lower_q_lut(L, x, which == TFL_TANH);
    if (is_quant(tin(L, 0)))
        return lerr(L, KILN_ERR_UNSUPPORTED, "quantized %s is not supported", L->opname);
    switch (which) {
    case TFL_LOGISTIC: TRY(op1(L, KILN_OP_Sigmoid, 1, &x, &y)); break;
    case TFL_TANH: TRY(activation(L, ACT_TANH, x, &y)); break;
    case TFL_RELU: TRY(activation(L, ACT_RELU, x, &y)); break;
    case TFL_RELU6: TRY(activation(L, ACT_RELU6, x, &y)); break;
    case TFL_RELU_N1_TO_1: TRY(activation(L, ACT_RELU_N1_TO_1, x, &y)); break;
    case TFL_EXP: TRY(op1(L, KILN_OP_Exp, 1, &x, &y)); break;
    default: TRY(op1(L, KILN_OP_Floor, 1, &x, &y)); break;
    }
    return bind(L, 0, y);
}

/* CONV_2D and DEPTHWISE_CONV_2D. */
static kiln_status lower_conv(struct lw *L, bool depthwise)
{
    const struct kiln_fb_table *o;
    TRY(options(L, depthwise ? OPT_DEPTHWISE : OPT_CONV2D, &o));
    int8_t pad, act;
    int32_t sw, sh, dw, dh, mult = 1;
    TRY(opt_i8(o, 0, "padding", 0, &pad));
    TRY(opt_i32(o, 1, "stride_w", 1, &sw));
    TRY(opt_i32(o, 2, "stride_h", 1, &sh));
    if (depthwise) {
        TRY(opt_i32(o, 3, "depth_multiplier", 1, &mult));
        TRY(opt_i8(o, 4, "fused_activation_function", 0, &act));
        TRY(opt_i32(o, 5, "dilation_w_factor", 1, &dw));
        TRY(opt_i32(o, 6, "dilation_h_factor", 1, &dh));
    } else {
        TRY(opt_i8(o, 3, "fused_activation_function", 0, &act));
        TRY(opt_i32(o, 4, "dilation_w_factor", 1, &dw));
        TRY(opt_i32(o, 5, "dilation_h_factor", 1, &dh));
    }
    if (sw < 1 || sh < 1 || dw < 1 || dh < 1 || sw > 1 << 16 || sh > 1 << 16 || dw > 1 << 16 ||
        dh > 1 << 16)
        return lerr(L, KILN_ERR_INVALID_MODEL, "strides %dx%d and dilations %dx%d must be "
                    "positive", (int)sh, (int)sw, (int)dh, (int)dw);
    if (pad != 0 && pad != 1)
        return lerr(L, KILN_ERR_INVALID_MODEL, "padding %d is neither SAME nor VALID", pad);
    const struct tfl_tensor *tx = tin(L, 0), *tw = tin(L, 1), *tb = tin(L, 2), *to = tout(L, 0);
    TRY(need_rank(L, tx, 4, "input"));
    TRY(need_rank(L, tw, 4, "filter"));
    int64_t cin = tx->shape[3];
    int64_t cout = depthwise ? tw->shape[3] : tw->shape[0];
    if (cin < 1 || cout < 1 || (depthwise ? tw->shape[0] != 1 || cout % cin
                                          : tw->shape[3] < 1 || cin % tw->shape[3]))
        return lerr(L, KILN_ERR_INVALID_MODEL, "filter shape [%lld,%lld,%lld,%lld] does not fit "
                    "an input of %lld channels", (long long)tw->shape[0],
                    (long long)tw->shape[1], (long long)tw->shape[2], (long long)tw->shape[3],
                    (long long)cin);
    if (tb && (tb->rank != 1 || tb->shape[0] != cout))
        return lerr(L, KILN_ERR_INVALID_MODEL, "bias has %lld elements for %lld output channels",
                    tb->rank == 1 ? (long long)tb->shape[0] : -1LL, (long long)cout);
    int x, w, b, y;
    TRY(need_in(L, 0, &x));
    TRY(in_val(L, 2, &b));
    if (is_quant(tx)) {
        TRY(need_q_product(L, tx, tw, tb, to, "convolution", "filter"));
        if (!tbuf(L, tw))
            return lerr(L, KILN_ERR_UNSUPPORTED, "the quantized filter must be a constant");
        if (tw->dtype == KILN_DTYPE_I8)
            for (int c = 0; c < tw->n_q; c++)
                if (tw->zero_point[c] != 0)
                    return lerr(L, KILN_ERR_UNSUPPORTED, "int8 filter with zero point %lld",
                                (long long)tw->zero_point[c]);
        TRY(need_in(L, 1, &w));
        struct kiln_node *n;
        int in[3] = {x, w, b};
        TRY(node(L, KILN_OP_TflConv, tb ? 3 : 2, in, 12, &n, &y));
        int64_t strides[2] = {sh, sw}, dil[2] = {dh, dw};
        TRY(a_ints(L, n, "strides", 2, strides));
        TRY(a_ints(L, n, "dilations", 2, dil));
        a_int(n, "same", pad == 0);
        a_int(n, "depthwise", depthwise);
        a_int(n, "input_offset", -tx->zero_point[0]);
        a_int(n, "weights_offset", -tw->zero_point[0]);
        a_int(n, "output_offset", to->zero_point[0]);
        int64_t lo, hi;
        TRY(q_act_range(L, act, to, &lo, &hi));
        a_int(n, "act_min", lo);
        a_int(n, "act_max", hi);
        TRY(q_channel_mults(L, n, tx, tw, to, (int)cout));
        return bind(L, 0, y);
    }
    if (tx->dtype != KILN_DTYPE_F32 || tw->dtype != KILN_DTYPE_F32)
        return lerr(L, KILN_ERR_UNSUPPORTED, "convolution of %s by %s (float32 or quantized "
                    "int8/uint8 expected)", kiln_dtype_name(tx->dtype),
                    kiln_dtype_name(tw->dtype));
    static const int64_t ohwi_to_oihw[4] = {0, 3, 1, 2}, ihwo_to_oihw[4] = {3, 0, 1, 2};
    if (tbuf(L, tw)) { /* permuted once, here */
        kiln_tensor *wt, *wp;
        TRY(tensor_data(L, tw, &wt));
        kiln_status st = permute4(wt, depthwise ? ihwo_to_oihw : ohwi_to_oihw, &wp);
        kiln_tensor_free(wt);
        if (st != KILN_OK) return st;
        TRY(add_const(L, tw->name, wp, &w));
    } else { /* computed weights (DEQUANTIZE of float16 weights): the optimizer folds this */
        int wv;
        TRY(need_in(L, 1, &wv));
        TRY(transpose(L, wv, depthwise ? ihwo_to_oihw : ohwi_to_oihw, &w));
    }
    int xn;
    TRY(transpose(L, x, to_nchw, &xn));
    struct kiln_node *n;
    int in[3] = {xn, w, b};
    TRY(node(L, KILN_OP_Conv, tb ? 3 : 2, in, 5, &n, &y));
    int64_t strides[2] = {sh, sw}, dil[2] = {dh, dw}, ks[2] = {tw->shape[1], tw->shape[2]};
    TRY(a_ints(L, n, "strides", 2, strides));
    TRY(a_ints(L, n, "dilations", 2, dil));
    TRY(a_ints(L, n, "kernel_shape", 2, ks));
    TRY(a_str(L, n, "auto_pad", pad == 0 ? "SAME_UPPER" : "VALID"));
    a_int(n, "group", depthwise ? cin : cin / tw->shape[3]);
    TRY(activation(L, act, y, &y));
    TRY(transpose(L, y, to_nhwc, &y));
    return bind(L, 0, y);
}

static kiln_status lower_pool(struct lw *L, bool max)
{
    const struct kiln_fb_table *o;
    TRY(options(L, OPT_POOL2D, &o));
    int8_t pad, act;
    int32_t sw, sh, fw, fh;
    TRY(opt_i8(o, 0, "padding", 0, &pad));
    TRY(opt_i32(o, 1, "stride_w", 1, &sw));
    TRY(opt_i32(o, 2, "stride_h", 1, &sh));
    TRY(opt_i32(o, 3, "filter_width", 1, &fw));
    TRY(opt_i32(o, 4, "filter_height", 1, &fh));
    TRY(opt_i8(o, 5, "fused_activation_function", 0, &act));
    if (sw < 1 || sh < 1 || fw < 1 || fh < 1 || sw > 1 << 16 || sh > 1 << 16 || fw > 1 << 16 ||
        fh > 1 << 16 || (pad != 0 && pad != 1))
        return lerr(L, KILN_ERR_INVALID_MODEL, "filter %dx%d, strides %dx%d, padding %d",
                    (int)fh, (int)fw, (int)sh, (int)sw, pad);
    const struct tfl_tensor *tx = tin(L, 0), *to = tout(L, 0);
    TRY(need_rank(L, tx, 4, "input"));
    int x, y;
    TRY(need_in(L, 0, &x));
    int64_t ks[2] = {fh, fw}, strides[2] = {sh, sw};
    struct kiln_node *n;
    if (is_quant(tx)) {
        if ((tx->dtype != KILN_DTYPE_I8 && tx->dtype != KILN_DTYPE_U8 &&
             tx->dtype != KILN_DTYPE_I16) || to->dtype != tx->dtype)
            return lerr(L, KILN_ERR_UNSUPPORTED, "quantized pooling of %s into %s",
                        kiln_dtype_name(tx->dtype), kiln_dtype_name(to->dtype));
        TRY(need_qparams(L, to, "output", false));
        if (tx->dtype == KILN_DTYPE_I16) TRY(need_symmetric(L, tx, to, NULL));
        TRY(node(L, KILN_OP_TflPool, 1, &x, 6, &n, &y));
        TRY(a_ints(L, n, "kernel", 2, ks));
        TRY(a_ints(L, n, "strides", 2, strides));
        a_int(n, "same", pad == 0);
        a_int(n, "max", max);
        int64_t lo, hi;
        TRY(q_act_range(L, act, to, &lo, &hi));
        a_int(n, "act_min", lo);
        a_int(n, "act_max", hi);
        return bind(L, 0, y);
    }
    int xn;
    TRY(transpose(L, x, to_nchw, &xn));
    TRY(node(L, max ? KILN_OP_MaxPool : KILN_OP_AveragePool, 1, &xn, 3, &n, &y));
    TRY(a_ints(L, n, "kernel_shape", 2, ks));
    TRY(a_ints(L, n, "strides", 2, strides));
    TRY(a_str(L, n, "auto_pad", pad == 0 ? "SAME_UPPER" : "VALID"));
    TRY(activation(L, act, y, &y));
    TRY(transpose(L, y, to_nhwc, &y));
    return bind(L, 0, y);
}

static kiln_status lower_fc(struct lw *L)
{
    const struct kiln_fb_table *o;
    TRY(options(L, OPT_FC, &o));
    int8_t act, wfmt, keep;
    TRY(opt_i8(o, 0, "fused_activation_function", 0, &act));
    TRY(opt_i8(o, 1, "weights_format", 0, &wfmt));
    TRY(opt_i8(o, 2, "keep_num_dims", 0, &keep));
    if (wfmt != 0)
        return lerr(L, KILN_ERR_UNSUPPORTED, "weights_format %d (shuffled weights)", wfmt);
    const struct tfl_tensor *tx = tin(L, 0), *tw = tin(L, 1), *tb = tin(L, 2), *to = tout(L, 0);
    TRY(need_rank(L, tw, 2, "weights"));
    if (!tx || tx->rank < 1)
        return lerr(L, KILN_ERR_INVALID_MODEL, "input has rank %d", tx ? tx->rank : -1);
    int64_t k = tw->shape[1], nout = tw->shape[0];
    if (k < 1 || nout < 1 || (tx->shape[tx->rank - 1] != k && !keep && elems(tx) % k))
        return lerr(L, KILN_ERR_INVALID_MODEL, "weights [%lld,%lld] do not fit the input",
                    (long long)nout, (long long)k);
    if (tb && (tb->rank != 1 || tb->shape[0] != nout))
        return lerr(L, KILN_ERR_INVALID_MODEL, "bias does not have %lld elements",
                    (long long)nout);
    if (keep && tx->shape[tx->rank - 1] != k)
        return lerr(L, KILN_ERR_INVALID_MODEL, "keep_num_dims with an input whose last dim is "
                    "%lld, not %lld", (long long)tx->shape[tx->rank - 1], (long long)k);
    int x, w, b, y;
    TRY(need_in(L, 0, &x));
    TRY(need_in(L, 1, &w));
    TRY(in_val(L, 2, &b));
    if (is_quant(tx)) {
        TRY(need_q_product(L, tx, tw, tb, to, "FULLY_CONNECTED", "weights"));
        struct kiln_node *n;
        int in[3] = {x, w, b};
        TRY(node(L, KILN_OP_TflFullyConnected, tb ? 3 : 2, in, 8, &n, &y));
        a_int(n, "input_offset", -tx->zero_point[0]);
        a_int(n, "weights_offset", -tw->zero_point[0]);
        a_int(n, "output_offset", to->zero_point[0]);
        a_int(n, "keep_num_dims", keep != 0);
        int64_t lo, hi;
        TRY(q_act_range(L, act, to, &lo, &hi));
        a_int(n, "act_min", lo);
        a_int(n, "act_max", hi);
        TRY(q_channel_mults(L, n, tx, tw, to, (int)nout));
        return bind(L, 0, y);
    }
    if (tx->dtype != KILN_DTYPE_F32 || tw->dtype != KILN_DTYPE_F32)
        return lerr(L, KILN_ERR_UNSUPPORTED, "FULLY_CONNECTED of %s by %s (hybrid quantization "
                    "is not supported)", kiln_dtype_name(tx->dtype), kiln_dtype_name(tw->dtype));
    int x2 = x;
    if (tx->rank != 2) {
        int64_t shape[2] = {-1, k};
        int s;
        TRY(const_i64(L, 2, shape, &s));
        int in[2] = {x, s};
        TRY(op1(L, KILN_OP_Reshape, 2, in, &x2));
    }
    struct kiln_node *n;
    int in[3] = {x2, w, b};
    TRY(node(L, KILN_OP_Gemm, tb ? 3 : 2, in, 1, &n, &y));
    a_int(n, "transB", 1);
    TRY(activation(L, act, y, &y));
    if (keep && tx->rank != 2) {
        int64_t shape[KILN_MAX_RANK];
        for (int i = 0; i < tx->rank - 1; i++) shape[i] = i == 0 ? -1 : tx->shape[i];
        shape[tx->rank - 1] = nout;
        int s;
        TRY(const_i64(L, tx->rank, shape, &s));
        int in2[2] = {y, s};
        TRY(op1(L, KILN_OP_Reshape, 2, in2, &y));
    }
    return bind(L, 0, y);
}

static kiln_status lower_reshape(struct lw *L)
{
    int64_t shape[KILN_MAX_RANK];
    int n = -1;
    int x, y, s;
    TRY(need_in(L, 0, &x));
    if (tin(L, 1) && tbuf(L, tin(L, 1))) {
        TRY(const_ints(L, 1, shape, KILN_MAX_RANK, &n, "new shape"));
    } else if (!tin(L, 1)) {
        const struct kiln_fb_table *o;
        TRY(options(L, OPT_RESHAPE, &o));
        struct kiln_fb_vec v = {0};
        if (o) TRY(kiln_fb_vec_field(o, 0, "new_shape", 4, &v));
        if (o && v.n <= KILN_MAX_RANK && kiln_fb_has(o, 0)) {
            n = (int)v.n;
            for (uint32_t i = 0; i < v.n; i++) shape[i] = kiln_fb_vec_i32(&v, i);
        } else {
            const struct tfl_tensor *to = tout(L, 0);
            n = to->rank;
            for (int i = 0; i < n; i++) shape[i] = to->shape[i];
        }
    }
    if (n >= 0) {
        TRY(const_i64(L, n, shape, &s));
    } else {
        /* a computed shape: cast to int64 */
        int sv;
        TRY(need_in(L, 1, &sv));
        struct kiln_node *c;
        TRY(node(L, KILN_OP_Cast, 1, &sv, 1, &c, &s));
        a_int(c, "to", kiln_onnx_dtype_code(KILN_DTYPE_I64));
    }
    int in[2] = {x, s};
    struct kiln_node *nd;
    TRY(node(L, KILN_OP_Reshape, 2, in, 1, &nd, &y));
    a_int(nd, "allowzero", 1); /* TFLite has no "copy this dim" 0 */
    return bind(L, 0, y);
}

static kiln_status lower_softmax(struct lw *L)
{
    const struct kiln_fb_table *o;
    TRY(options(L, OPT_SOFTMAX, &o));
    float beta = 0.0f; /* the schema's default */
    if (o) TRY(kiln_fb_f32(o, 0, "beta", 0.0f, &beta));
    int x, y;
    TRY(need_in(L, 0, &x));
    const struct tfl_tensor *tx = tin(L, 0), *to = tout(L, 0);
    if (is_quant(tx)) {
        if ((tx->dtype != KILN_DTYPE_I8 && tx->dtype != KILN_DTYPE_U8) ||
            (to->dtype != KILN_DTYPE_I8 && to->dtype != KILN_DTYPE_U8 &&
             (to->dtype != KILN_DTYPE_I16 || tx->dtype != KILN_DTYPE_I8)))
            return lerr(L, KILN_ERR_UNSUPPORTED, "quantized SOFTMAX of %s into %s",
                        kiln_dtype_name(tx->dtype), kiln_dtype_name(to->dtype));
        TRY(need_qparams(L, tx, "input", false));
        struct tfl_softmax_params p;
        tfl_softmax_prepare(beta, tx->scale[0], &p);
        struct kiln_node *n;
        TRY(node(L, KILN_OP_TflSoftmax, 1, &x, 4, &n, &y));
        a_int(n, "input_multiplier", p.input_multiplier);
        a_int(n, "input_left_shift", p.input_left_shift);
        a_int(n, "diff_min", p.diff_min);
        a_int(n, "to", to->dtype);
        return bind(L, 0, y);
    }
    if (beta != 1.0f) {
        int bv;
        TRY(const_f32(L, beta, &bv));
        int in[2] = {x, bv};
        TRY(op1(L, KILN_OP_Mul, 2, in, &x));
    }
    struct kiln_node *n;
    TRY(node(L, KILN_OP_Softmax, 1, &x, 1, &n, &y));
    a_int(n, "axis", -1);
    return bind(L, 0, y);
}

static kiln_status lower_concat(struct lw *L)
{
    const struct kiln_fb_table *o;
    TRY(options(L, OPT_CONCAT, &o));
    int32_t axis;
    int8_t act;
    TRY(opt_i32(o, 0, "axis", 0, &axis));
    TRY(opt_i8(o, 1, "fused_activation_function", 0, &act));
    int n_in = L->op->n_in;
    if (n_in < 1 || n_in > KILN_MAX_IO)
        return lerr(L, KILN_ERR_UNSUPPORTED, "%d inputs", n_in);
    int rank = tout(L, 0)->rank;
    if (axis < -rank || axis >= rank)
        return lerr(L, KILN_ERR_INVALID_MODEL, "axis %d for rank %d", (int)axis, rank);
    int in[KILN_MAX_IO];
    for (int k = 0; k < n_in; k++) {
        TRY(need_in(L, k, &in[k]));
        const struct tfl_tensor *t = tin(L, k);
        if (is_quant(t) && (t->scale[0] != tout(L, 0)->scale[0] ||
                            t->zero_point[0] != tout(L, 0)->zero_point[0]))
            return lerr(L, KILN_ERR_UNSUPPORTED, "quantized CONCATENATION with rescaling");
    }
    struct kiln_node *n;
    int y;
    TRY(node(L, KILN_OP_Concat, n_in, in, 1, &n, &y));
    a_int(n, "axis", axis < 0 ? axis + rank : axis);
    if (is_quant(tout(L, 0)) && act != ACT_NONE)
        return lerr(L, KILN_ERR_UNSUPPORTED, "quantized CONCATENATION with an activation");
    TRY(activation(L, act, y, &y));
    return bind(L, 0, y);
}

static kiln_status lower_mean(struct lw *L)
{
    const struct kiln_fb_table *o;
    TRY(options(L, OPT_REDUCER, &o));
    int8_t keep;
    TRY(opt_i8(o, 0, "keep_dims", 0, &keep));
    int64_t axes[KILN_MAX_RANK];
    int n;
    TRY(const_ints(L, 1, axes, KILN_MAX_RANK, &n, "axes"));
    int x, a, y;
    TRY(need_in(L, 0, &x));
    const struct tfl_tensor *tx = tin(L, 0), *to = tout(L, 0);
    if (is_quant(tx)) { /* reduce.cc: QuantizedMeanOrSum, multiplier s_in / s_out */
        if (to->dtype != tx->dtype)
            return lerr(L, KILN_ERR_UNSUPPORTED, "quantized MEAN of %s into %s",
                        kiln_dtype_name(tx->dtype), kiln_dtype_name(to->dtype));
        TRY(need_qparams(L, tx, "input", false));
        TRY(need_qparams(L, to, "output", false));
        if (tx->dtype == KILN_DTYPE_I16) TRY(need_symmetric(L, tx, to, NULL));
        for (int i = 0; i < n; i++)
            if (axes[i] < -tx->rank || axes[i] >= tx->rank)
                return lerr(L, KILN_ERR_INVALID_MODEL, "axis %lld for rank %d",
                            (long long)axes[i], tx->rank);
        int32_t q;
        int shift;
        tfl_quantize_multiplier((double)tx->scale[0] / (double)to->scale[0], &q, &shift);
        struct kiln_node *nd;
        TRY(node(L, KILN_OP_TflMean, 1, &x, 6, &nd, &y));
        TRY(a_ints(L, nd, "axes", n, axes));
        a_int(nd, "keepdims", keep != 0);
        a_int(nd, "input_zero_point", tx->zero_point[0]);
        a_int(nd, "output_zero_point", to->zero_point[0]);
        a_int(nd, "multiplier", q);
        a_int(nd, "shift", shift);
        return bind(L, 0, y);
    }
    TRY(const_i64(L, n, axes, &a));
    struct kiln_node *nd;
    int in[2] = {x, a};
    TRY(node(L, KILN_OP_ReduceMean, 2, in, 1, &nd, &y));
    a_int(nd, "keepdims", keep != 0);
    return bind(L, 0, y);
}

static kiln_status lower_pad(struct lw *L)
{
    const struct tfl_tensor *tx = tin(L, 0);
    int64_t p[2 * KILN_MAX_RANK], pads[2 * KILN_MAX_RANK];
    int n;
    TRY(const_ints(L, 1, p, 2 * KILN_MAX_RANK, &n, "paddings"));
    if (!tx || n != 2 * tx->rank)
        return lerr(L, KILN_ERR_INVALID_MODEL, "paddings of %d values for rank %d", n,
                    tx ? tx->rank : -1);
    int r = tx->rank;
    for (int i = 0; i < r; i++) {
        if (p[2 * i] < 0 || p[2 * i + 1] < 0)
            return lerr(L, KILN_ERR_INVALID_MODEL, "negative padding on dim %d", i);
        pads[i] = p[2 * i];
        pads[r + i] = p[2 * i + 1];
    }
    int x, pv, cv = -1, y;
    TRY(need_in(L, 0, &x));
    TRY(const_i64(L, 2 * r, pads, &pv));
    if (is_quant(tx)) { /* quantized zero is the zero point */
        kiln_tensor *c;
        TRY(kiln_tensor_new(tx->dtype, 0, NULL, &c));
        kiln_set_i64(tx->dtype, c->data, 0, tx->zero_point[0]);
        TRY(add_const(L, L->name, c, &cv));
    }
    int in[3] = {x, pv, cv};
    TRY(op1(L, KILN_OP_Pad, cv >= 0 ? 3 : 2, in, &y));
    return bind(L, 0, y);
}

static kiln_status lower_transpose(struct lw *L)
{
    int64_t perm[KILN_MAX_RANK];
    int n;
    TRY(const_ints(L, 1, perm, KILN_MAX_RANK, &n, "perm"));
    const struct tfl_tensor *tx = tin(L, 0);
    if (!tx || n != tx->rank)
        return lerr(L, KILN_ERR_INVALID_MODEL, "perm of %d values for rank %d", n,
                    tx ? tx->rank : -1);
    int x, y;
    TRY(need_in(L, 0, &x));
    struct kiln_node *nd;
    TRY(node(L, KILN_OP_Transpose, 1, &x, 1, &nd, &y));
    TRY(a_ints(L, nd, "perm", n, perm));
    return bind(L, 0, y);
}

static kiln_status lower_squeeze(struct lw *L)
{
    const struct kiln_fb_table *o;
    TRY(options(L, OPT_SQUEEZE, &o));
    struct kiln_fb_vec v = {0};
    if (o) TRY(kiln_fb_vec_field(o, 0, "squeeze_dims", 4, &v));
    if (v.n > KILN_MAX_RANK) return lerr(L, KILN_ERR_INVALID_MODEL, "%u squeeze_dims", v.n);
    int x, y;
    TRY(need_in(L, 0, &x));
    int in[2] = {x, -1};
    if (v.n) {
        int64_t axes[KILN_MAX_RANK];
        for (uint32_t i = 0; i < v.n; i++) axes[i] = kiln_fb_vec_i32(&v, i);
        TRY(const_i64(L, (int)v.n, axes, &in[1]));
    }
    TRY(op1(L, KILN_OP_Squeeze, v.n ? 2 : 1, in, &y));
    return bind(L, 0, y);
}

static kiln_status lower_strided_slice(struct lw *L)
{
    const struct kiln_fb_table *o;
    TRY(options(L, OPT_STRIDED_SLICE, &o));
    int32_t bm, em, elm, nam, sam;
    int8_t offset = 0;
    TRY(opt_i32(o, 0, "begin_mask", 0, &bm));
    TRY(opt_i32(o, 1, "end_mask", 0, &em));
    TRY(opt_i32(o, 2, "ellipsis_mask", 0, &elm));
    TRY(opt_i32(o, 3, "new_axis_mask", 0, &nam));
    TRY(opt_i32(o, 4, "shrink_axis_mask", 0, &sam));
    if (o) TRY(kiln_fb_i8(o, 5, "offset", 0, &offset));
    if (elm || nam || offset)
        return lerr(L, KILN_ERR_UNSUPPORTED, "ellipsis_mask %d, new_axis_mask %d, offset %d are "
                    "not supported", (int)elm, (int)nam, offset);
    int64_t b[KILN_MAX_RANK], e[KILN_MAX_RANK], s[KILN_MAX_RANK], axes[KILN_MAX_RANK];
    int nb, ne, ns;
    TRY(const_ints(L, 1, b, KILN_MAX_RANK, &nb, "begin"));
    TRY(const_ints(L, 2, e, KILN_MAX_RANK, &ne, "end"));
    TRY(const_ints(L, 3, s, KILN_MAX_RANK, &ns, "strides"));
    const struct tfl_tensor *tx = tin(L, 0);
    if (nb != ne || nb != ns || !tx || nb > tx->rank)
        return lerr(L, KILN_ERR_INVALID_MODEL, "begin, end and strides have %d, %d and %d "
                    "values for rank %d", nb, ne, ns, tx ? tx->rank : -1);
    int n_sq = 0;
    int64_t sq[KILN_MAX_RANK];
    for (int i = 0; i < nb; i++) {
        axes[i] = i;
        if (s[i] == 0) return lerr(L, KILN_ERR_INVALID_MODEL, "stride 0 on dim %d", i);
        if (bm & (1 << i)) b[i] = s[i] > 0 ? 0 : INT64_MAX;
        if (em & (1 << i)) e[i] = s[i] > 0 ? INT64_MAX : INT64_MIN;
        if (sam & (1 << i)) {
            e[i] = b[i] == -1 ? INT64_MAX : b[i] + 1;
            s[i] = 1;
            sq[n_sq++] = i;
        }
    }
    int x, vb, ve, va, vs, y;
    TRY(need_in(L, 0, &x));
    TRY(const_i64(L, nb, b, &vb));
    TRY(const_i64(L, nb, e, &ve));
    TRY(const_i64(L, nb, axes, &va));
    TRY(const_i64(L, nb, s, &vs));
    int in[5] = {x, vb, ve, va, vs};
    TRY(op1(L, KILN_OP_Slice, 5, in, &y));
    if (n_sq) {
        int a;
        TRY(const_i64(L, n_sq, sq, &a));
        int in2[2] = {y, a};
        TRY(op1(L, KILN_OP_Squeeze, 2, in2, &y));
    }
    return bind(L, 0, y);
}

static kiln_status lower_quantize(struct lw *L)
{
    const struct tfl_tensor *tx = tin(L, 0), *to = tout(L, 0);
    int x, y;
    TRY(need_in(L, 0, &x));
    /* int32 only from an integer input: quantize.cc's int16 -> int32 Requantize */
    if (!tx || (to->dtype != KILN_DTYPE_I8 && to->dtype != KILN_DTYPE_U8 &&
                to->dtype != KILN_DTYPE_I16 &&
                (to->dtype != KILN_DTYPE_I32 || tx->dtype != KILN_DTYPE_I16)))
        return lerr(L, KILN_ERR_UNSUPPORTED, "QUANTIZE of %s into %s (int8, uint8 or int16 "
                    "expected, or int32 from int16)", tx ? kiln_dtype_name(tx->dtype) : "nothing",
                    kiln_dtype_name(to->dtype));
    TRY(need_qparams(L, to, "output", false));
    struct kiln_node *n;
    TRY(node(L, KILN_OP_TflQuantize, 1, &x, 6, &n, &y));
    a_int(n, "to", to->dtype);
    a_int(n, "zero_point", to->zero_point[0]);
    if (tx->dtype == KILN_DTYPE_F32) {
        a_float(n, "scale", to->scale[0]);
    } else if (is_quant(tx)) {
        TRY(need_qparams(L, tx, "input", false));
        int32_t q;
        int shift;
        tfl_quantize_multiplier((double)tx->scale[0] / (double)to->scale[0], &q, &shift);
        a_int(n, "in_zero_point", tx->zero_point[0]);
        a_int(n, "multiplier", q);
        a_int(n, "shift", shift);
    } else {
        return lerr(L, KILN_ERR_UNSUPPORTED, "QUANTIZE of %s", kiln_dtype_name(tx->dtype));
    }
    return bind(L, 0, y);
}

static kiln_status lower_dequantize(struct lw *L)
{
    const struct tfl_tensor *tx = tin(L, 0);
    int x, y;
    TRY(need_in(L, 0, &x));
    if (tx && tx->dtype == KILN_DTYPE_F16) {
        struct kiln_node *n;
        TRY(node(L, KILN_OP_Cast, 1, &x, 1, &n, &y));
        a_int(n, "to", kiln_onnx_dtype_code(KILN_DTYPE_F32));
        return bind(L, 0, y);
    }
    if (!is_quant(tx))
        return lerr(L, KILN_ERR_UNSUPPORTED, "DEQUANTIZE of an unquantized %s",
                    tx ? kiln_dtype_name(tx->dtype) : "input");
    TRY(need_qparams(L, tx, "input", true));
    int nq = tx->n_q;
    if (nq > 1 && (tx->q_dim < 0 || tx->q_dim >= tx->rank || tx->shape[tx->q_dim] != nq))
        return lerr(L, KILN_ERR_INVALID_MODEL, "%d scales along dim %d of '%s'", nq,
                    (int)tx->q_dim, tx->name);
    kiln_tensor *sc, *zp;
    int64_t d = nq;
    TRY(kiln_tensor_new(KILN_DTYPE_F32, nq > 1 ? 1 : 0, &d, &sc));
    kiln_status st = kiln_tensor_new(tx->dtype, nq > 1 ? 1 : 0, &d, &zp);
    if (st != KILN_OK) {
        kiln_tensor_free(sc);
        return st;
    }
    for (int i = 0; i < nq; i++) {
        ((float *)sc->data)[i] = tx->scale[i];
        kiln_set_i64(tx->dtype, zp->data, i, tx->zero_point[i]);
    }
    int vs, vz;
    if ((st = add_const(L, L->name, sc, &vs)) != KILN_OK) {
        kiln_tensor_free(zp);
        return st;
    }
    TRY(add_const(L, L->name, zp, &vz));
    struct kiln_node *n;
    int in[3] = {x, vs, vz};
    TRY(node(L, KILN_OP_DequantizeLinear, 3, in, 1, &n, &y));
    if (nq > 1) a_int(n, "axis", tx->q_dim);
    return bind(L, 0, y);
}

/* Concatenate the 2-D (or 1-D) float constants of inputs idx[0..3] along
 * dim 0 into one tensor with a leading 1: ONNX's [1, 4 * hidden, ...]. */
static kiln_status concat_gates(struct lw *L, const int *idx, int64_t rows, int64_t cols,
                                const char *what, int *out)
{
    /* every gate's constant is checked (shape and bytes) before anything is allocated */
    if (rows < 1 || rows > INT32_MAX || cols < 0 || cols > INT32_MAX)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s: %lld x %lld is not a valid LSTM weight "
                    "shape", what, (long long)rows, (long long)cols);
    int64_t want = rows * (cols ? cols : 1);
    for (int g = 0; g < 4; g++) {
        const struct tfl_tensor *tt = tin(L, idx[g]);
        const struct tfl_buffer *bf = tt ? tbuf(L, tt) : NULL;
        if (!tt || tt->dtype != KILN_DTYPE_F32 || !bf || tt->rank != (cols ? 2 : 1) ||
            tt->shape[0] != rows || (cols && tt->shape[1] != cols) ||
            bf->size != sizeof(float) * (size_t)want)
            return lerr(L, KILN_ERR_UNSUPPORTED, "%s (input %d) must be a float32 constant of "
                        "%lld x %lld", what, idx[g], (long long)rows, (long long)(cols ? cols : 1));
    }
    int64_t dims[3] = {1, 4 * rows, cols};
    kiln_tensor *t;
    TRY(kiln_tensor_new(KILN_DTYPE_F32, cols ? 3 : 2, dims, &t));
    float *dst = t->data;
    for (int g = 0; g < 4; g++)
        memcpy(dst + g * want, tbuf(L, tin(L, idx[g]))->data, sizeof(float) * (size_t)want);
    return add_const(L, L->name, t, out);
}

/* Float constant input k of an LSTM as an IR constant, checked against the
 * expected shape: rank 2 [rows, cols] (transposed to [cols, rows] for
 * x . W^T when transpose) or rank 1 [rows] when cols is 0. *id is -1 when the
 * optional input is absent; a required one that is absent is an error. */
static kiln_status lstm_const(struct lw *L, int k, int64_t rows, int64_t cols, bool transpose,
                              bool required, const char *what, int *id)
{
    *id = -1;
    const struct tfl_tensor *tt = tin(L, k);
    if (!tt) {
        if (required) return lerr(L, KILN_ERR_INVALID_MODEL, "%s (input %d) is missing", what, k);
        return KILN_OK;
    }
    const struct tfl_buffer *bf = tbuf(L, tt);
    if (rows < 1 || rows > INT32_MAX || cols < 0 || cols > INT32_MAX) /* no overflow below */
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s (input %d, tensor '%s'): %lld x %lld is not "
                    "a valid LSTM weight shape", what, k, tt->name, (long long)rows,
                    (long long)cols);
    int64_t want = rows * (cols ? cols : 1);
    if (tt->dtype != KILN_DTYPE_F32 || !bf || tt->rank != (cols ? 2 : 1) ||
        tt->shape[0] != rows || (cols && tt->shape[1] != cols) ||
        bf->size != sizeof(float) * (size_t)want) {
        if (cols)
            return lerr(L, KILN_ERR_INVALID_MODEL, "%s (input %d, tensor '%s') must be a "
                        "float32 constant of %lld x %lld", what, k, tt->name, (long long)rows,
                        (long long)cols);
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s (input %d, tensor '%s') must be a float32 "
                    "constant of %lld elements", what, k, tt->name, (long long)rows);
    }
    int64_t dims[2] = {transpose ? cols : rows, transpose ? rows : cols};
    kiln_tensor *t;
    TRY(kiln_tensor_new(KILN_DTYPE_F32, cols ? 2 : 1, dims, &t));
    float *dst = t->data;
    const float *src = (const float *)bf->data;
    if (!transpose) {
        memcpy(dst, src, sizeof(float) * (size_t)want);
    } else {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
    }
    return add_const(L, tt->name, t, id);
}

static kiln_status bin_op(struct lw *L, enum kiln_op op, int a, int b, int *out)
{
    int in[2] = {a, b};
    return op1(L, op, 2, in, out);
}

/* TFLite's MeanStddevNormalization over the last axis (portable_tensor_utils:
 * (x - mean) / sqrt(variance + 1e-8)), then * coefficients. */
static kiln_status lstm_layer_norm(struct lw *L, int z, int coef, int *out)
{
    int64_t last = -1;
    int ax, mean, d, dd, var, eps, s;
    TRY(const_i64(L, 1, &last, &ax));
    struct kiln_node *n;
    int in[2] = {z, ax};
    TRY(node(L, KILN_OP_ReduceMean, 2, in, 1, &n, &mean));
    a_int(n, "keepdims", 1);
    TRY(bin_op(L, KILN_OP_Sub, z, mean, &d));
    TRY(bin_op(L, KILN_OP_Mul, d, d, &dd));
    in[0] = dd;
    TRY(node(L, KILN_OP_ReduceMean, 2, in, 1, &n, &var));
    a_int(n, "keepdims", 1);
    TRY(const_f32(L, 1e-8f, &eps));
    TRY(bin_op(L, KILN_OP_Add, var, eps, &var));
    TRY(op1(L, KILN_OP_Sqrt, 1, &var, &s));
    TRY(bin_op(L, KILN_OP_Div, d, s, &d));
    return bin_op(L, KILN_OP_Mul, d, coef, out);
}

/* The full float LSTM of lstm_eval.cc (EvalFloat / LstmStepFloat), unrolled
 * over the static time steps into primitive ops: per gate
 * z = x.W^T + h.R^T (+ peephole * c), layer-normalized and scaled when
 * coefficients are given, + bias, then sigmoid (i, f, o) or the fused
 * activation (cell gate); CIFG takes i = 1 - f; c = f * c + i * g clipped to
 * +-cell_clip; h = o * act(c), projected (+ bias) and clipped to
 * +-proj_clip. The peephole of o reads the new c. State starts at zero. */
static kiln_status lower_lstm_unrolled(struct lw *L, bool sequence, bool time_major, int act,
                                       float cell_clip, float proj_clip)
{
    const struct tfl_tensor *tx = tin(L, 0);
    const struct tfl_tensor *wf = tin(L, 2), *rf = tin(L, 6), *pw = tin(L, 16);
    if (!wf || wf->rank != 2 || !rf || rf->rank != 2)
        return lerr(L, KILN_ERR_INVALID_MODEL, "input_to_forget_weights (input 2) and "
                    "recurrent_to_forget_weights (input 6) must be 2-D");
    int64_t n_cell = wf->shape[0], n_in = wf->shape[1], n_out = rf->shape[1];
    int64_t steps = sequence ? tx->shape[time_major ? 0 : 1] : 1;
    if (n_cell < 1 || n_out < 1 || n_in != tx->shape[tx->rank - 1] || tx->shape[0] < 1 ||
        steps < 1 || steps > 4096 || (!pw && n_out != n_cell))
        return lerr(L, KILN_ERR_INVALID_MODEL, "LSTM weights of %lld cells, %lld outputs and "
                    "%lld inputs for an input of %lld features and %lld steps (1 to 4096)",
                    (long long)n_cell, (long long)n_out, (long long)n_in,
                    (long long)tx->shape[tx->rank - 1], (long long)steps);
    static const char *const gname[4] = {"input", "forget", "cell", "output"};
    bool cifg = !tin(L, 1);
    bool ln = L->op->n_in > 21 && tin(L, 21);
    int W[4], R[4], P[4] = {-1, -1, -1, -1}, B[4], N[4] = {-1, -1, -1, -1};
    char what[64];
    for (int g = cifg ? 1 : 0; g < 4; g++) {
        snprintf(what, sizeof what, "input_to_%s_weights", gname[g]);
        TRY(lstm_const(L, 1 + g, n_cell, n_in, true, true, what, &W[g]));
        snprintf(what, sizeof what, "recurrent_to_%s_weights", gname[g]);
        TRY(lstm_const(L, 5 + g, n_cell, n_out, true, true, what, &R[g]));
        snprintf(what, sizeof what, "%s_gate_bias", gname[g]);
        TRY(lstm_const(L, 12 + g, n_cell, 0, false, true, what, &B[g]));
        if (ln) {
            snprintf(what, sizeof what, "%s_layer_norm_coefficients", gname[g]);
            TRY(lstm_const(L, 20 + g, n_cell, 0, false, true, what, &N[g]));
        }
    }
    if (cifg && (tin(L, 5) || tin(L, 9) || (L->op->n_in > 20 && tin(L, 20))))
        return lerr(L, KILN_ERR_INVALID_MODEL, "CIFG (no input_to_input_weights) with an input "
                    "gate's recurrent, peephole or layer norm weights");
    if (!ln)
        for (int k = 20; k < L->op->n_in; k++)
            if (tin(L, k))
                return lerr(L, KILN_ERR_INVALID_MODEL, "layer norm coefficient input %d without "
                            "forget_layer_norm_coefficients (input 21)", k);
    static const int pg[3] = {0, 1, 3}; /* inputs 9, 10, 11: i, f, o */
    bool peep = tin(L, 10) || tin(L, 11);
    if (tin(L, 9) && !peep)
        return lerr(L, KILN_ERR_INVALID_MODEL, "cell_to_input_weights (input 9) without the "
                    "forget and output peepholes");
    for (int j = cifg ? 1 : 0; j < 3 && peep; j++) {
        snprintf(what, sizeof what, "cell_to_%s_weights", gname[pg[j]]);
        TRY(lstm_const(L, 9 + j, n_cell, 0, false, true, what, &P[pg[j]]));
    }
    int PW = -1, PB = -1;
    TRY(lstm_const(L, 16, n_out, n_cell, true, false, "projection_weights", &PW));
    TRY(lstm_const(L, 17, n_out, 0, false, false, "projection_bias", &PB));
    if (PW < 0 && PB >= 0)
        return lerr(L, KILN_ERR_INVALID_MODEL, "projection_bias (input 17) without "
                    "projection_weights (input 16)");
    int x, one = -1, cc_lo = -1, cc_hi = -1, pc_lo = -1, pc_hi = -1, tax = -1;
    TRY(need_in(L, 0, &x));
    if (cifg) TRY(const_f32(L, 1.0f, &one));
    if (cell_clip > 0) {
        TRY(const_f32(L, -cell_clip, &cc_lo));
        TRY(const_f32(L, cell_clip, &cc_hi));
    }
    if (proj_clip > 0 && PW >= 0) {
        TRY(const_f32(L, -proj_clip, &pc_lo));
        TRY(const_f32(L, proj_clip, &pc_hi));
    }
    int64_t axis = time_major ? 0 : 1;
    if (sequence) TRY(const_i64(L, 1, &axis, &tax));
    /* x . W^T for every step at once: [.., n_in] -> [.., n_cell] */
    int XW[4] = {-1, -1, -1, -1};
    for (int g = cifg ? 1 : 0; g < 4; g++) TRY(bin_op(L, KILN_OP_MatMul, x, W[g], &XW[g]));
    int h = -1, c = -1, ys[4096];
    for (int64_t t = 0; t < steps; t++) {
        int z[4] = {-1, -1, -1, -1}, gate[4] = {-1, -1, -1, -1}, iv = -1;
        if (sequence) { /* a scalar index: Gather drops the time axis */
            kiln_tensor *it;
            TRY(kiln_tensor_new(KILN_DTYPE_I64, 0, NULL, &it));
            *(int64_t *)it->data = t;
            TRY(add_const(L, L->name, it, &iv));
        }
        for (int g = cifg ? 1 : 0; g < 4; g++) {
            z[g] = XW[g];
            if (sequence) {
                struct kiln_node *n;
                int in[2] = {XW[g], iv};
                TRY(node(L, KILN_OP_Gather, 2, in, 1, &n, &z[g]));
                a_int(n, "axis", axis);
            }
            if (h >= 0) {
                int r;
                TRY(bin_op(L, KILN_OP_MatMul, h, R[g], &r));
                TRY(bin_op(L, KILN_OP_Add, z[g], r, &z[g]));
            }
        }
        /* i, f and the cell gate; their peepholes read the previous c */
        for (int g = cifg ? 1 : 0; g < 3; g++) {
            int v = z[g];
            if (P[g] >= 0 && c >= 0) {
                int pm;
                TRY(bin_op(L, KILN_OP_Mul, c, P[g], &pm));
                TRY(bin_op(L, KILN_OP_Add, v, pm, &v));
            }
            if (ln) TRY(lstm_layer_norm(L, v, N[g], &v));
            TRY(bin_op(L, KILN_OP_Add, v, B[g], &v));
            if (g == 2) TRY(activation(L, act, v, &gate[g]));
            else TRY(op1(L, KILN_OP_Sigmoid, 1, &v, &gate[g]));
        }
        if (cifg) TRY(bin_op(L, KILN_OP_Sub, one, gate[1], &gate[0]));
        int nc;
        TRY(bin_op(L, KILN_OP_Mul, gate[0], gate[2], &nc));
        if (c >= 0) {
            int fc;
            TRY(bin_op(L, KILN_OP_Mul, gate[1], c, &fc));
            TRY(bin_op(L, KILN_OP_Add, fc, nc, &nc));
        }
        if (cc_lo >= 0) {
            int in[3] = {nc, cc_lo, cc_hi};
            TRY(op1(L, KILN_OP_Clip, 3, in, &nc));
        }
        c = nc;
        int v = z[3];
        if (P[3] >= 0) {
            int pm;
            TRY(bin_op(L, KILN_OP_Mul, c, P[3], &pm));
            TRY(bin_op(L, KILN_OP_Add, v, pm, &v));
        }
        if (ln) TRY(lstm_layer_norm(L, v, N[3], &v));
        TRY(bin_op(L, KILN_OP_Add, v, B[3], &v));
        TRY(op1(L, KILN_OP_Sigmoid, 1, &v, &gate[3]));
        int ac;
        TRY(activation(L, act, c, &ac));
        TRY(bin_op(L, KILN_OP_Mul, gate[3], ac, &h));
        if (PW >= 0) {
            TRY(bin_op(L, KILN_OP_MatMul, h, PW, &h));
            if (PB >= 0) TRY(bin_op(L, KILN_OP_Add, h, PB, &h));
            if (pc_lo >= 0) {
                int in[3] = {h, pc_lo, pc_hi};
                TRY(op1(L, KILN_OP_Clip, 3, in, &h));
            }
        }
        if (sequence) TRY(bin_op(L, KILN_OP_Unsqueeze, h, tax, &ys[t]));
    }
    if (!sequence) return bind(L, 0, h);
    /* Concat in groups of at most 64 inputs (KILN_MAX_IO), then the groups */
    int n_ys = (int)steps;
    while (n_ys > 1) {
        int m = 0;
        for (int s = 0; s < n_ys; s += 64) {
            int cnt = n_ys - s < 64 ? n_ys - s : 64;
            struct kiln_node *n;
            TRY(node(L, KILN_OP_Concat, cnt, ys + s, 1, &n, &ys[m]));
            a_int(n, "axis", axis);
            m++;
        }
        n_ys = m;
    }
    return bind(L, 0, ys[0]);
}

/* The BASIC LSTM kernel (lstm.cc kernel_type BASIC, reference_ops::LstmCell),
 * float: inputs x [batch, in], prev_activ [batch, out], weights
 * [4 * out, in + out], bias [4 * out], prev_state [batch, out]; activ_temp =
 * [x, prev_activ] . W^T + bias holds the gates i, g, f, o in that order;
 * state = sigmoid(i) * tanh(g) + sigmoid(f) * prev_state, activ =
 * sigmoid(o) * tanh(state). Outputs activ, state, concat_temp, activ_temp. */
static kiln_status lower_lstm_basic(struct lw *L, int act, float cell_clip, float proj_clip)
{
    if (act != ACT_TANH || cell_clip != 0 || proj_clip != 0)
        return lerr(L, KILN_ERR_UNSUPPORTED, "the BASIC LSTM kernel with activation %d, "
                    "cell_clip %g, proj_clip %g (TFLite requires TANH and no clipping)", act,
                    (double)cell_clip, (double)proj_clip);
    const struct tfl_tensor *tx = tin(L, 0), *th = tin(L, 1), *ts = tin(L, 4);
    if (L->op->n_in != 5 || L->op->n_out < 2 || L->op->n_out > 4 || !tx || !th || !ts)
        return lerr(L, KILN_ERR_INVALID_MODEL, "the BASIC LSTM kernel takes 5 inputs and 2 to "
                    "4 outputs, not %d and %d", L->op->n_in, L->op->n_out);
    if (tx->dtype != KILN_DTYPE_F32 || th->dtype != KILN_DTYPE_F32 || ts->dtype != KILN_DTYPE_F32)
        return lerr(L, KILN_ERR_UNSUPPORTED, "the BASIC LSTM kernel on %s (Kiln supports "
                    "float32; the quantized kernel is not implemented)",
                    kiln_dtype_name(tx->dtype));
    if (tx->rank != 2 || th->rank != 2 || ts->rank != 2)
        return lerr(L, KILN_ERR_UNSUPPORTED, "the BASIC LSTM kernel with inputs of rank %d, "
                    "%d and %d (2 expected)", tx->rank, th->rank, ts->rank);
    int64_t n_in = tx->shape[1], n_out = th->shape[1];
    if (n_in < 1 || n_out < 1 || ts->shape[1] != n_out || n_in > INT32_MAX / 2 ||
        n_out > INT32_MAX / 8)
        return lerr(L, KILN_ERR_INVALID_MODEL, "the BASIC LSTM kernel with an input of %lld "
                    "features, prev_activ of %lld and prev_state of %lld", (long long)n_in,
                    (long long)n_out, (long long)ts->shape[1]);
    int W, B, x, h, c, cat, full;
    TRY(lstm_const(L, 2, 4 * n_out, n_in + n_out, true, true, "weights", &W));
    TRY(lstm_const(L, 3, 4 * n_out, 0, false, true, "biases", &B));
    TRY(need_in(L, 0, &x));
    TRY(need_in(L, 1, &h));
    TRY(need_in(L, 4, &c));
    struct kiln_node *n;
    int in2[2] = {x, h};
    TRY(node(L, KILN_OP_Concat, 2, in2, 1, &n, &cat));
    a_int(n, "axis", 1);
    TRY(bin_op(L, KILN_OP_MatMul, cat, W, &full));
    TRY(bin_op(L, KILN_OP_Add, full, B, &full));
    int gate[4];
    int64_t ax = 1;
    int va;
    TRY(const_i64(L, 1, &ax, &va));
    for (int g = 0; g < 4; g++) {
        int64_t b0 = g * n_out, e0 = (g + 1) * n_out;
        int vb, ve, z;
        TRY(const_i64(L, 1, &b0, &vb));
        TRY(const_i64(L, 1, &e0, &ve));
        int in[4] = {full, vb, ve, va};
        TRY(op1(L, KILN_OP_Slice, 4, in, &z));
        TRY(op1(L, g == 1 ? KILN_OP_Tanh : KILN_OP_Sigmoid, 1, &z, &gate[g]));
    }
    int ig, fc, st, ts_, y;
    TRY(bin_op(L, KILN_OP_Mul, gate[0], gate[1], &ig));
    TRY(bin_op(L, KILN_OP_Mul, gate[2], c, &fc));
    TRY(bin_op(L, KILN_OP_Add, ig, fc, &st));
    TRY(op1(L, KILN_OP_Tanh, 1, &st, &ts_));
    TRY(bin_op(L, KILN_OP_Mul, gate[3], ts_, &y));
    TRY(bind(L, 0, y));
    TRY(bind(L, 1, st));
    if (L->op->n_out > 2 && L->op->out[2] >= 0) TRY(bind(L, 2, cat));
    if (L->op->n_out > 3 && L->op->out[3] >= 0) TRY(bind(L, 3, full));
    return KILN_OK;
}

/* TFLite's names of the LSTM inputs, by index. */
static const char *const lstm_input_names[24] = {
    "input", "input_to_input_weights", "input_to_forget_weights", "input_to_cell_weights",
    "input_to_output_weights", "recurrent_to_input_weights", "recurrent_to_forget_weights",
    "recurrent_to_cell_weights", "recurrent_to_output_weights", "cell_to_input_weights",
    "cell_to_forget_weights", "cell_to_output_weights", "input_gate_bias", "forget_gate_bias",
    "cell_gate_bias", "output_gate_bias", "projection_weights", "projection_bias",
    "output_state", "cell_state", "input_layer_norm_coefficients",
    "forget_layer_norm_coefficients", "cell_layer_norm_coefficients",
    "output_layer_norm_coefficients",
};

/* Input k of a hybrid or integer LSTM (lstm names it in messages: "TFLite's
 * hybrid LSTM"): absent (an error when required), or a constant of dtype dt
 * and shape [rows, cols] ([rows] when cols is 0). With scale not NULL, an
 * integer one needs exactly one finite positive scale and zero point 0
 * (*scale gets it); float inputs and integer biases (scale NULL) are read
 * as they are. */
static kiln_status lstm_const_input(struct lw *L, const char *lstm, int k, kiln_dtype dt,
                                    int64_t rows, int64_t cols, bool required, float *scale)
{
    const struct tfl_tensor *t = tin(L, k);
    const char *what = lstm_input_names[k];
    if (!t) {
        if (required)
            return lerr(L, KILN_ERR_INVALID_MODEL, "%s (input %d) is missing", what, k);
        return KILN_OK;
    }
    if (t->dtype != dt)
        return lerr(L, KILN_ERR_UNSUPPORTED, "%s (input %d, tensor '%s') is %s; %s takes %s here",
                    what, k, t->name, kiln_dtype_name(t->dtype), lstm, kiln_dtype_name(dt));
    if (!tbuf(L, t))
        return lerr(L, KILN_ERR_UNSUPPORTED, "%s (input %d, tensor '%s') must be a constant",
                    what, k, t->name);
    if (t->rank != (cols ? 2 : 1) || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        if (cols)
            return lerr(L, KILN_ERR_INVALID_MODEL, "%s (input %d, tensor '%s') must have shape "
                        "[%lld, %lld]", what, k, t->name, (long long)rows, (long long)cols);
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s (input %d, tensor '%s') must have shape "
                    "[%lld]", what, k, t->name, (long long)rows);
    }
    if (!scale || dt == KILN_DTYPE_F32) return KILN_OK;
    if (t->n_q < 1)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s %s (input %d, tensor '%s') has no "
                    "quantization scale", kiln_dtype_name(dt), what, k, t->name);
    if (t->n_q > 1)
        return lerr(L, KILN_ERR_UNSUPPORTED, "%s %s (input %d, tensor '%s') has %d scales; "
                    "%s reads one scale per tensor", kiln_dtype_name(dt), what, k, t->name,
                    t->n_q, lstm);
    if (!(t->scale[0] > 0) || !isfinite(t->scale[0]))
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s %s (input %d, tensor '%s') has scale %g",
                    kiln_dtype_name(dt), what, k, t->name, (double)t->scale[0]);
    if (t->zero_point[0] != 0)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s %s (input %d, tensor '%s') has zero point "
                    "%lld (the weights of %s are symmetric: 0)", kiln_dtype_name(dt), what, k,
                    t->name, (long long)t->zero_point[0], lstm);
    *scale = t->scale[0];
    return KILN_OK;
}

#define LSTM_HYB "TFLite's hybrid LSTM"
#define LSTM_INT "TFLite's integer LSTM"

/* The hybrid LSTM (float32 input and output, int8 weights): TflLstmHybrid,
 * TFLite's EvalHybrid (src/kernels/ref/tflite_lstm.c). */
static kiln_status lower_lstm_hybrid(struct lw *L, bool sequence, bool time_major, int act,
                                     float cell_clip, float proj_clip, bool asym)
{
    const struct tfl_tensor *tx = tin(L, 0), *wf = tin(L, 2), *rf = tin(L, 6), *to = tout(L, 0);
    if (act != ACT_TANH && act != ACT_RELU && act != ACT_RELU6 && act != ACT_RELU_N1_TO_1)
        return lerr(L, KILN_ERR_UNSUPPORTED, "hybrid LSTM with fused activation %d (TANH, "
                    "RELU, RELU6 or RELU_N1_TO_1 expected)", act);
    if (!(cell_clip >= 0) || !(proj_clip >= 0) || !isfinite(cell_clip) || !isfinite(proj_clip))
        return lerr(L, KILN_ERR_INVALID_MODEL, "cell_clip %g and proj_clip %g",
                    (double)cell_clip, (double)proj_clip);
    if (to->dtype != KILN_DTYPE_F32)
        return lerr(L, KILN_ERR_UNSUPPORTED, "hybrid LSTM output '%s' is %s (float32 expected)",
                    to->name, kiln_dtype_name(to->dtype));
    if (!wf || wf->rank != 2 || !rf || rf->rank != 2)
        return lerr(L, KILN_ERR_INVALID_MODEL, "input_to_forget_weights (input 2) and "
                    "recurrent_to_forget_weights (input 6) must be 2-D");
    int64_t C = wf->shape[0], I = wf->shape[1], O = rf->shape[1];
    if (C < 1 || I < 1 || O < 1 || C > INT32_MAX || I > INT32_MAX || O > INT32_MAX ||
        I != tx->shape[tx->rank - 1])
        return lerr(L, KILN_ERR_INVALID_MODEL, "LSTM weights of %lld cells, %lld inputs and "
                    "%lld outputs for an input of %lld features", (long long)C, (long long)I,
                    (long long)O, (long long)tx->shape[tx->rank - 1]);
    if (L->op->n_in > 24)
        return lerr(L, KILN_ERR_UNSUPPORTED, "auxiliary LSTM inputs (inputs 24 on)");
    float scales[24] = {0};
    bool cifg = !tin(L, 1);
    bool peep = tin(L, 10) || tin(L, 11);
    bool ln = L->op->n_in > 21 && tin(L, 21);
    bool proj = tin(L, 16) != NULL;
    if (!proj && O != C)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%lld outputs for %lld cells without "
                    "projection_weights", (long long)O, (long long)C);
    for (int g = 0; g < 4; g++) {
        bool need = !cifg || g > 0;
        TRY(lstm_const_input(L, LSTM_HYB, 1 + g, KILN_DTYPE_I8, C, I, need, &scales[1 + g]));
        TRY(lstm_const_input(L, LSTM_HYB, 5 + g, KILN_DTYPE_I8, C, O, need, &scales[5 + g]));
        TRY(lstm_const_input(L, LSTM_HYB, 12 + g, KILN_DTYPE_F32, C, 0, need, &scales[12 + g]));
        if (L->op->n_in > 20 + g)
            TRY(lstm_const_input(L, LSTM_HYB, 20 + g, KILN_DTYPE_F32, C, 0, need && ln,
                                 &scales[20 + g]));
        if (g != 2)
            TRY(lstm_const_input(L, LSTM_HYB, 9 + (g == 3 ? 2 : g), KILN_DTYPE_I8, C, 0,
                                 need && peep, &scales[9 + (g == 3 ? 2 : g)]));
    }
    if (cifg && (tin(L, 5) || tin(L, 9) || tin(L, 12) || (L->op->n_in > 20 && tin(L, 20))))
        return lerr(L, KILN_ERR_INVALID_MODEL, "CIFG (no input_to_input_weights) with an input "
                    "gate's recurrent, peephole, bias or layer norm input");
    if (!ln)
        for (int k = 20; k < L->op->n_in; k++)
            if (tin(L, k))
                return lerr(L, KILN_ERR_INVALID_MODEL, "layer norm coefficient input %d without "
                            "forget_layer_norm_coefficients (input 21)", k);
    TRY(lstm_const_input(L, LSTM_HYB, 16, KILN_DTYPE_I8, O, C, false, &scales[16]));
    TRY(lstm_const_input(L, LSTM_HYB, 17, KILN_DTYPE_F32, O, 0, false, &scales[17]));
    if (!proj && tin(L, 17))
        return lerr(L, KILN_ERR_INVALID_MODEL, "projection_bias (input 17) without "
                    "projection_weights (input 16)");
    int in[24];
    for (int k = 0; k < 24; k++) {
        in[k] = -1;
        if (k != 18 && k != 19) TRY(in_val(L, k, &in[k]));
    }
    struct kiln_node *n;
    int y;
    TRY(node(L, KILN_OP_TflLstmHybrid, 24, in, 7, &n, &y));
    TRY(a_floats(L, n, "scales", 24, scales));
    a_int(n, "act", act);
    a_float(n, "cell_clip", cell_clip);
    a_float(n, "proj_clip", proj_clip);
    a_int(n, "asymmetric", asym);
    a_int(n, "sequence", sequence);
    a_int(n, "time_major", time_major);
    return bind(L, 0, y);
}

/* A quantized activation tensor of the integer LSTM (the input, a state, the
 * output, an intermediate): one finite positive scale, its zero point. */
static kiln_status int_act(struct lw *L, const struct tfl_tensor *t, const char *what,
                           kiln_dtype dt, float *scale, int64_t *zp)
{
    if (dt != KILN_DTYPE_UNDEFINED && t->dtype != dt)
        return lerr(L, KILN_ERR_UNSUPPORTED, "%s '%s' is %s; TFLite's integer LSTM takes %s",
                    what, t->name, kiln_dtype_name(t->dtype), kiln_dtype_name(dt));
    if (t->n_q < 1)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s '%s' has no quantization scale", what,
                    t->name);
    if (!(t->scale[0] > 0) || !isfinite(t->scale[0]))
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s '%s' has scale %g", what, t->name,
                    (double)t->scale[0]);
    int64_t lo = dt == KILN_DTYPE_I8 ? -128 : INT32_MIN, hi = dt == KILN_DTYPE_I8 ? 127 : INT32_MAX;
    if (t->zero_point[0] < lo || t->zero_point[0] > hi)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%s '%s' has zero point %lld", what, t->name,
                    (long long)t->zero_point[0]);
    *scale = t->scale[0];
    *zp = t->zero_point[0];
    return KILN_OK;
}

static void put_mult(int64_t *q, int at, double real)
{
    int32_t m;
    int s;
    tfl_quantize_multiplier(real, &m, &s);
    q[at] = m;
    q[at + 1] = s;
}

/* The fully integer LSTM (int8 input, weights and output state, int16 cell
 * state; TFLite's "8x8_16" kernel, 5 intermediates): TflLstmInt
 * (src/kernels/ref/tflite_lstm_int.c), with the multipliers, zero points
 * and clips prepared as lstm.cc's PopulateQuantizedLstmParams8x8_16 does,
 * in single precision where it computes in float. TFLite's integer kernel
 * uses tanh whatever the fused activation says, and so does Kiln. */
static kiln_status lower_lstm_integer(struct lw *L, bool sequence, bool time_major,
                                      float cell_clip, float proj_clip)
{
    const struct tfl_tensor *tx = tin(L, 0), *wf = tin(L, 2), *rf = tin(L, 6), *to = tout(L, 0);
    if (L->op->n_in < 20 || L->op->n_in > 24)
        return lerr(L, KILN_ERR_INVALID_MODEL, "the integer LSTM takes 20 or 24 inputs, not %d",
                    L->op->n_in);
    if (tx->rank != (sequence ? 3 : 2))
        return lerr(L, KILN_ERR_UNSUPPORTED, "an int8 input of rank %d is expected, not %d",
                    sequence ? 3 : 2, tx->rank);
    if (!(cell_clip >= 0) || !(proj_clip >= 0) || !isfinite(cell_clip) || !isfinite(proj_clip))
        return lerr(L, KILN_ERR_INVALID_MODEL, "cell_clip %g and proj_clip %g",
                    (double)cell_clip, (double)proj_clip);
    if (L->op->n_inter == 12)
        return lerr(L, KILN_ERR_UNSUPPORTED, "the integer LSTM with 12 intermediates (TFLite's "
                    "8x8_8 kernel) is not implemented; the 8x8_16 kernel (5 intermediates) is");
    if (L->op->n_inter != 5)
        return lerr(L, KILN_ERR_INVALID_MODEL, "the integer LSTM has %d intermediate tensors "
                    "(TFLite's 8x8_16 kernel reads 5: the gate and hidden scales)",
                    L->op->n_inter);
    for (int k = 18; k < 20; k++) {
        const struct tfl_tensor *st = tin(L, k);
        if (!st || tbuf(L, st) || L->val[L->op->in[k]] >= 0)
            return lerr(L, KILN_ERR_UNSUPPORTED, "state input %d must be a variable tensor", k);
    }
    if (!wf || wf->rank != 2 || !rf || rf->rank != 2)
        return lerr(L, KILN_ERR_INVALID_MODEL, "input_to_forget_weights (input 2) and "
                    "recurrent_to_forget_weights (input 6) must be 2-D");
    int64_t C = wf->shape[0], I = wf->shape[1], O = rf->shape[1];
    if (C < 1 || I < 1 || O < 1 || C > INT32_MAX || I > INT32_MAX || O > INT32_MAX ||
        I != tx->shape[tx->rank - 1])
        return lerr(L, KILN_ERR_INVALID_MODEL, "LSTM weights of %lld cells, %lld inputs and "
                    "%lld outputs for an input of %lld features", (long long)C, (long long)I,
                    (long long)O, (long long)tx->shape[tx->rank - 1]);
    bool cifg = !tin(L, 1);
    bool peep = tin(L, 10) || tin(L, 11) || tin(L, 9);
    bool ln = L->op->n_in == 24 && tin(L, 21);
    bool proj = tin(L, 16) != NULL;
    if (!proj && O != C)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%lld outputs for %lld cells without "
                    "projection_weights", (long long)O, (long long)C);
    if (peep && O != C)
        return lerr(L, KILN_ERR_UNSUPPORTED, "the integer LSTM with peepholes and a projection "
                    "to %lld outputs from %lld cells is not implemented (TFLite's integer kernel "
                    "indexes the peepholes by the output size)", (long long)O, (long long)C);
    /* scales of the weights by input index (1 for absent ones, as TFLite) */
    float sc[24];
    for (int k = 0; k < 24; k++) sc[k] = 1.0f;
    for (int g = 0; g < 4; g++) {
        bool need = !cifg || g > 0;
        TRY(lstm_const_input(L, LSTM_INT, 1 + g, KILN_DTYPE_I8, C, I, need, &sc[1 + g]));
        TRY(lstm_const_input(L, LSTM_INT, 5 + g, KILN_DTYPE_I8, C, O, need, &sc[5 + g]));
        TRY(lstm_const_input(L, LSTM_INT, 12 + g, KILN_DTYPE_I32, C, 0, need, NULL));
        if (L->op->n_in > 20 + g)
            TRY(lstm_const_input(L, LSTM_INT, 20 + g, KILN_DTYPE_I16, C, 0, need && ln,
                                 &sc[20 + g]));
        if (g != 2)
            TRY(lstm_const_input(L, LSTM_INT, 9 + (g == 3 ? 2 : g), KILN_DTYPE_I16, C, 0,
                                 need && peep, &sc[9 + (g == 3 ? 2 : g)]));
    }
    if (cifg && (tin(L, 5) || tin(L, 9) || tin(L, 12) || (L->op->n_in > 20 && tin(L, 20))))
        return lerr(L, KILN_ERR_INVALID_MODEL, "CIFG (no input_to_input_weights) with an input "
                    "gate's recurrent, peephole, bias or layer norm input");
    if (!ln)
        for (int k = 20; k < L->op->n_in; k++)
            if (tin(L, k))
                return lerr(L, KILN_ERR_INVALID_MODEL, "layer norm coefficient input %d without "
                            "forget_layer_norm_coefficients (input 21)", k);
    TRY(lstm_const_input(L, LSTM_INT, 16, KILN_DTYPE_I8, O, C, false, &sc[16]));
    TRY(lstm_const_input(L, LSTM_INT, 17, KILN_DTYPE_I32, O, 0, false, NULL));
    if (!proj && tin(L, 17))
        return lerr(L, KILN_ERR_INVALID_MODEL, "projection_bias (input 17) without "
                    "projection_weights (input 16)");
    float s_in, s_state, s_cell, s_out, s_inter[5];
    int64_t zp_in, zp_state, zp_cell, zp_out, zp_inter[5];
    TRY(int_act(L, tx, "input", KILN_DTYPE_I8, &s_in, &zp_in));
    TRY(int_act(L, tin(L, 18), "output_state (input 18)", KILN_DTYPE_I8, &s_state, &zp_state));
    TRY(int_act(L, tin(L, 19), "cell_state (input 19)", KILN_DTYPE_I16, &s_cell, &zp_cell));
    TRY(int_act(L, to, "output", KILN_DTYPE_I8, &s_out, &zp_out));
    for (int i = 0; i < 5; i++) {
        s_inter[i] = 0x1p-12f; /* Q3.12 for the activations, without layer norm */
        zp_inter[i] = 0;
        if (i == 4 || ln) {
            char what[48];
            snprintf(what, sizeof what, "intermediate %d", i);
            TRY(int_act(L, &L->sg->tensors[L->op->inter[i]], what, KILN_DTYPE_UNDEFINED,
                        &s_inter[i], &zp_inter[i]));
        }
    }
    int cell_scale;
    if (!tfl_checked_log2(s_cell, &cell_scale))
        return lerr(L, KILN_ERR_UNSUPPORTED, "cell_state (input 19) has scale %g, not a power of "
                    "two (TFLite's integer LSTM requires one)", (double)s_cell);
    if (cell_scale < -15 || cell_scale > -9)
        return lerr(L, KILN_ERR_UNSUPPORTED, "cell_state (input 19) has scale 2^%d; TFLite's "
                    "integer LSTM supports 2^-15 to 2^-9", cell_scale);
    if (zp_cell != 0)
        return lerr(L, KILN_ERR_INVALID_MODEL, "cell_state (input 19) has zero point %lld "
                    "(int16 state is symmetric: 0)", (long long)zp_cell);
    int64_t q[TLI_COUNT] = {0};
    for (int g = 0; g < 4; g++) {
        /* products of floats in float, as lstm.cc; the peephole's in double */
        float ex = sc[1 + g] * s_in / s_inter[g];
        float eh = sc[5 + g] * s_state / s_inter[g];
        int pk = g == 3 ? 11 : 9 + g;
        float ec = (float)(ldexp(1.0, cell_scale) * (double)sc[pk] / (double)s_inter[g]);
        put_mult(q, TLI_X + 2 * g, (double)ex);
        put_mult(q, TLI_H + 2 * g, (double)eh);
        put_mult(q, TLI_C + 2 * g, g == 2 ? 1.0 : (double)ec);
        put_mult(q, TLI_LN + 2 * g, (double)sc[20 + g]);
        float guard = 10000.0f * sc[20 + g];
        q[TLI_GUARD + g] = guard >= 1.0f && guard < 2147483520.0f ? (int32_t)guard : 1;
        if (ln && (!cifg || g > 0) && q[TLI_LN + 2 * g + 1] > 18)
            return lerr(L, KILN_ERR_UNSUPPORTED, "%s (input %d) has scale %g, too large for "
                        "TFLite's integer layer norm", lstm_input_names[20 + g], 20 + g,
                        (double)sc[20 + g]);
    }
    float eh = (float)(0x1p-15 / (double)s_inter[4] * 0x1p-15);
    float ep = sc[16] * s_inter[4] / s_state;
    put_mult(q, TLI_HIDDEN, (double)eh);
    put_mult(q, TLI_PROJ, (double)ep);
    q[TLI_INPUT_ZP] = zp_in;
    q[TLI_STATE_ZP] = zp_state;
    q[TLI_HIDDEN_ZP] = zp_inter[4];
    q[TLI_CELL_SCALE] = cell_scale;
    if (cell_clip > 0)
        q[TLI_CELL_CLIP] = (int16_t)fminf(fmaxf(cell_clip / s_cell, -32768.0f), 32767.0f);
    if (proj_clip > 0)
        q[TLI_PROJ_CLIP] = (int8_t)fminf(fmaxf(proj_clip / s_out, -128.0f), 127.0f);
    int in[24];
    for (int k = 0; k < 24; k++) {
        in[k] = -1;
        if (k != 18 && k != 19) TRY(in_val(L, k, &in[k]));
    }
    struct kiln_node *n;
    int y;
    TRY(node(L, KILN_OP_TflLstmInt, 24, in, 3, &n, &y));
    TRY(a_ints(L, n, "params", TLI_COUNT, q));
    a_int(n, "sequence", sequence);
    a_int(n, "time_major", time_major);
    return bind(L, 0, y);
}

/* LSTM (one step) and UNIDIRECTIONAL_SEQUENCE_LSTM. Without CIFG,
 * projection, layer normalization, clipping and with TANH: Kiln's LSTM op
 * (ONNX's), gates reordered from TFLite's i, f, c, o inputs to ONNX's
 * i, o, f, c. Otherwise lower_lstm_unrolled above. The state tensors start
 * at zero on every run (TFLite keeps them between invocations). */
static kiln_status lower_lstm(struct lw *L, bool sequence)
{
    const struct kiln_fb_table *o;
    TRY(options(L, sequence ? OPT_SEQ_LSTM : 14, &o));
    int8_t act;
    float cell_clip = 0, proj_clip = 0;
    TRY(opt_i8(o, 0, "fused_activation_function", ACT_NONE, &act));
    if (o) TRY(kiln_fb_f32(o, 1, "cell_clip", 0, &cell_clip));
    if (o) TRY(kiln_fb_f32(o, 2, "proj_clip", 0, &proj_clip));
    int8_t time_major = 0, kernel_type = 0;
    if (sequence) TRY(opt_i8(o, 3, "time_major", 0, &time_major));
    else TRY(opt_i8(o, 3, "kernel_type", 0, &kernel_type));
    const struct tfl_tensor *tx = tin(L, 0);
    if (kernel_type == 1) return lower_lstm_basic(L, act, cell_clip, proj_clip);
    if (kernel_type != 0)
        return lerr(L, KILN_ERR_INVALID_MODEL, "LSTM kernel_type %d (0 FULL or 1 BASIC)",
                    kernel_type);
    if (L->op->n_out != 1)
        return lerr(L, KILN_ERR_INVALID_MODEL, "%d outputs (the FULL LSTM kernel has 1)",
                    L->op->n_out);
    if (tx && tx->dtype == KILN_DTYPE_I8 && is_quant(tx))
        return lower_lstm_integer(L, sequence, time_major != 0, cell_clip, proj_clip);
    if (L->op->n_in < 20 || L->op->n_in > 24 || !tx || tx->dtype != KILN_DTYPE_F32 ||
        tx->rank != (sequence ? 3 : 2))
        return lerr(L, KILN_ERR_UNSUPPORTED, "a float32 LSTM with 20 to 24 inputs and an input "
                    "of rank %d is expected", sequence ? 3 : 2);
    for (int k = 18; k < 20; k++) {
        const struct tfl_tensor *st = tin(L, k);
        if (!st || tbuf(L, st) || L->val[L->op->in[k]] >= 0)
            return lerr(L, KILN_ERR_UNSUPPORTED, "state input %d must be a variable tensor", k);
    }
    int8_t asym = 0, diag = 0;
    TRY(opt_i8(o, 4, "asymmetric_quantize_inputs", 0, &asym));
    if (sequence) TRY(opt_i8(o, 5, "diagonal_recurrent_tensors", 0, &diag));
    if (diag)
        return lerr(L, KILN_ERR_UNSUPPORTED, "diagonal_recurrent_tensors is not supported");
    const struct tfl_tensor *w4 = tin(L, 4);
    if (w4 && w4->dtype == KILN_DTYPE_I8)
        return lower_lstm_hybrid(L, sequence, time_major != 0, act, cell_clip, proj_clip,
                                 asym != 0);
    bool general = act != ACT_TANH || cell_clip != 0 || proj_clip != 0 || !tin(L, 1) ||
                   !tin(L, 5) || tin(L, 16) || tin(L, 17);
    for (int k = 20; k < L->op->n_in; k++) general = general || tin(L, k);
    if (general)
        return lower_lstm_unrolled(L, sequence, time_major != 0, act, cell_clip, proj_clip);
    const struct tfl_tensor *w0 = tin(L, 2);
    if (!w0 || w0->rank != 2)
        return lerr(L, KILN_ERR_INVALID_MODEL, "input_to_forget_weights must be 2-D");
    int64_t hidden = w0->shape[0], nin = w0->shape[1];
    if (hidden < 1 || nin != tx->shape[tx->rank - 1])
        return lerr(L, KILN_ERR_INVALID_MODEL, "weights [%lld, %lld] for an input of %lld "
                    "features", (long long)hidden, (long long)nin,
                    (long long)tx->shape[tx->rank - 1]);
    static const int wi[4] = {1, 4, 2, 3}, ri[4] = {5, 8, 6, 7}, bi[4] = {12, 15, 13, 14};
    int w, r, bvals;
    TRY(concat_gates(L, wi, hidden, nin, "input weights", &w));
    TRY(concat_gates(L, ri, hidden, hidden, "recurrent weights", &r));
    TRY(concat_gates(L, bi, hidden, 0, "gate biases", &bvals));
    /* ONNX B is [1, 8 * hidden]: Wb then Rb (zero) */
    kiln_tensor *bt;
    int64_t bd[2] = {1, 8 * hidden};
    TRY(kiln_tensor_new(KILN_DTYPE_F32, 2, bd, &bt));
    memcpy(bt->data, L->g->values[bvals].konst->data, sizeof(float) * 4 * (size_t)hidden);
    int b;
    TRY(add_const(L, L->name, bt, &b));
    int p = -1;
    if (tin(L, 9) || tin(L, 10) || tin(L, 11)) {
        if (!tin(L, 9) || !tin(L, 10) || !tin(L, 11))
            return lerr(L, KILN_ERR_UNSUPPORTED, "partial peephole weights");
        kiln_tensor *pt;
        int64_t pd[2] = {1, 3 * hidden};
        TRY(kiln_tensor_new(KILN_DTYPE_F32, 2, pd, &pt));
        static const int pi[3] = {9, 11, 10}; /* ONNX P: i, o, f */
        for (int g = 0; g < 3; g++) {
            const struct tfl_tensor *tt = tin(L, pi[g]);
            if (tt->dtype != KILN_DTYPE_F32 || !tbuf(L, tt) || elems(tt) != hidden) {
                kiln_tensor_free(pt);
                return lerr(L, KILN_ERR_UNSUPPORTED, "peephole weights must be float32 "
                            "constants of %lld elements", (long long)hidden);
            }
            memcpy((float *)pt->data + g * hidden, tbuf(L, tt)->data, sizeof(float) * (size_t)hidden);
        }
        TRY(add_const(L, L->name, pt, &p));
    }
    int x, y;
    TRY(need_in(L, 0, &x));
    if (!sequence) { /* one step: [batch, in] -> [batch, 1, in] */
        int64_t ax = 1;
        int a;
        TRY(const_i64(L, 1, &ax, &a));
        int in[2] = {x, a};
        TRY(op1(L, KILN_OP_Unsqueeze, 2, in, &x));
    }
    struct kiln_node *n;
    int in[8] = {x, w, r, b, -1, -1, -1, p};
    TRY(node(L, KILN_OP_LSTM, p >= 0 ? 8 : 4, in, 2, &n, &y));
    a_int(n, "hidden_size", hidden);
    a_int(n, "layout", sequence && time_major ? 0 : 1);
    /* Y is [seq, 1, batch, hidden] (layout 0) or [batch, seq, 1, hidden] */
    int64_t ax = sequence && time_major ? 1 : 2;
    int a;
    TRY(const_i64(L, 1, &ax, &a));
    int sq[2] = {y, a};
    TRY(op1(L, KILN_OP_Squeeze, 2, sq, &y));
    if (!sequence) {
        int64_t one = 1;
        int a1;
        TRY(const_i64(L, 1, &one, &a1));
        int sq1[2] = {y, a1};
        TRY(op1(L, KILN_OP_Squeeze, 2, sq1, &y));
    }
    return bind(L, 0, y);
}

/* Integer SVDF (svdf.cc, EvalIntegerSVDF): int8 input and feature weights,
 * int16 time weights and state (symmetric), int32 bias, int8 output; the
 * two rescalings prepared in float as svdf.cc does. One invocation from the
 * zero state, as for float SVDF below. */
static kiln_status lower_svdf_int(struct lw *L, int32_t rank)
{
    const struct tfl_tensor *tx = tin(L, 0), *tf = tin(L, 1), *tt = tin(L, 2), *tb = tin(L, 3);
    const struct tfl_tensor *ts = tin(L, 4), *to = tout(L, 0);
    if (tf->dtype != KILN_DTYPE_I8 || tt->dtype != KILN_DTYPE_I16 || !ts ||
        ts->dtype != KILN_DTYPE_I16 || (tb && tb->dtype != KILN_DTYPE_I32) ||
        to->dtype != KILN_DTYPE_I8)
        return lerr(L, KILN_ERR_UNSUPPORTED, "integer SVDF of %s by %s and %s with state %s "
                    "into %s (int8 by int8 and int16 with int16 state into int8 expected)",
                    kiln_dtype_name(tx->dtype), kiln_dtype_name(tf->dtype),
                    kiln_dtype_name(tt->dtype), ts ? kiln_dtype_name(ts->dtype) : "none",
                    kiln_dtype_name(to->dtype));
    TRY(need_qparams(L, tx, "input", false));
    TRY(need_qparams(L, tf, "weights_feature", false));
    TRY(need_qparams(L, tt, "weights_time", false));
    TRY(need_qparams(L, ts, "state", false));
    TRY(need_qparams(L, to, "output", false));
    TRY(need_symmetric(L, ts, NULL, NULL));
    if (!tbuf(L, tf) || !tbuf(L, tt))
        return lerr(L, KILN_ERR_UNSUPPORTED, "the SVDF weights must be constants");
    int x, wf, wt, b, y;
    TRY(need_in(L, 0, &x));
    TRY(need_in(L, 1, &wf));
    TRY(need_in(L, 2, &wt));
    TRY(in_val(L, 3, &b));
    float e1 = tx->scale[0] * tf->scale[0] / ts->scale[0];
    float e2 = ts->scale[0] * tt->scale[0] / to->scale[0];
    int32_t q1, q2;
    int s1, s2;
    tfl_quantize_multiplier((double)e1, &q1, &s1);
    tfl_quantize_multiplier((double)e2, &q2, &s2);
    struct kiln_node *n;
    int in[4] = {x, wf, wt, b};
    TRY(node(L, KILN_OP_TflSvdf, b >= 0 ? 4 : 3, in, 7, &n, &y));
    a_int(n, "rank", rank);
    a_int(n, "input_zero_point", tx->zero_point[0]);
    a_int(n, "output_zero_point", to->zero_point[0]);
    a_int(n, "multiplier1", q1);
    a_int(n, "shift1", s1);
    a_int(n, "multiplier2", q2);
    a_int(n, "shift2", s2);
    return bind(L, 0, y);
}

/* SVDF (float): TFLite keeps the last memory_size feature activations of
 * each filter in a variable state tensor, shifted left one frame per
 * invocation, and computes out[b, u] = sum over the rank r filters
 * f = u * rank + r of sum_m weights_time[f, m] * state[b, f, m], + bias,
 * activation. The state is zero at the start of every Kiln run (TFLite
 * resets variable tensors to zero), so after the shift it holds only this
 * run's frame in column memory_size - 1: out = ReduceSum over rank of
 * (x . weights_feature^T) * weights_time[:, M - 1]. That is TFLite's first
 * invocation; streaming across requests is not modelled. */
static kiln_status lower_svdf(struct lw *L)
{
    const struct kiln_fb_table *o;
    TRY(options(L, OPT_SVDF, &o));
    int32_t rank;
    int8_t act;
    TRY(opt_i32(o, 0, "rank", 1, &rank));
    TRY(opt_i8(o, 1, "fused_activation_function", 0, &act));
    const struct tfl_tensor *tx = tin(L, 0), *tf = tin(L, 1), *tt = tin(L, 2), *tb = tin(L, 3);
    TRY(need_rank(L, tx, 2, "input"));
    TRY(need_rank(L, tf, 2, "weights_feature"));
    TRY(need_rank(L, tt, 2, "weights_time"));
    if (tx->dtype == KILN_DTYPE_I8 && is_quant(tx)) return lower_svdf_int(L, rank);
    if (tx->dtype != KILN_DTYPE_F32 || tf->dtype != KILN_DTYPE_F32 || tt->dtype != KILN_DTYPE_F32 ||
        (tb && tb->dtype != KILN_DTYPE_F32) || tout(L, 0)->dtype != KILN_DTYPE_F32)
        return lerr(L, KILN_ERR_UNSUPPORTED, "SVDF of %s by %s and %s (Kiln supports float32 "
                    "and int8 SVDF; hybrid SVDF is not implemented)",
                    kiln_dtype_name(tx->dtype), kiln_dtype_name(tf->dtype),
                    kiln_dtype_name(tt->dtype));
    int64_t nf = tf->shape[0], nin = tf->shape[1], mem = tt->shape[1];
    if (rank < 1 || nf < 1 || nf % rank || tt->shape[0] != nf || mem < 1 ||
        tx->shape[1] != nin || (tb && (tb->rank != 1 || tb->shape[0] != nf / rank)))
        return lerr(L, KILN_ERR_INVALID_MODEL, "rank %d, weights_feature [%lld,%lld], "
                    "weights_time [%lld,%lld] and the input [%lld,%lld] do not fit", (int)rank,
                    (long long)nf, (long long)nin, (long long)tt->shape[0], (long long)mem,
                    (long long)tx->shape[0], (long long)tx->shape[1]);
    if (!tbuf(L, tt))
        return lerr(L, KILN_ERR_UNSUPPORTED, "weights_time must be a constant");
    kiln_tensor *wt, *last;
    TRY(tensor_data(L, tt, &wt));
    kiln_status st = kiln_tensor_new(KILN_DTYPE_F32, 1, &nf, &last);
    if (st != KILN_OK) {
        kiln_tensor_free(wt);
        return st;
    }
    for (int64_t f = 0; f < nf; f++)
        ((float *)last->data)[f] = ((const float *)wt->data)[f * mem + mem - 1];
    kiln_tensor_free(wt);
    int x, w, b, y, vl;
    TRY(add_const(L, tt->name, last, &vl));
    TRY(need_in(L, 0, &x));
    TRY(need_in(L, 1, &w));
    TRY(in_val(L, 3, &b));
    struct kiln_node *n;
    int in[2] = {x, w};
    TRY(node(L, KILN_OP_Gemm, 2, in, 1, &n, &y));
    a_int(n, "transB", 1);
    int in2[2] = {y, vl};
    TRY(op1(L, KILN_OP_Mul, 2, in2, &y));
    int64_t shape[3] = {-1, nf / rank, rank}, ax = 2;
    int sv, av;
    TRY(const_i64(L, 3, shape, &sv));
    int in3[2] = {y, sv};
    TRY(op1(L, KILN_OP_Reshape, 2, in3, &y));
    TRY(const_i64(L, 1, &ax, &av));
    int in4[2] = {y, av};
    TRY(node(L, KILN_OP_ReduceSum, 2, in4, 1, &n, &y));
    a_int(n, "keepdims", 0);
    if (b >= 0) {
        int in5[2] = {y, b};
        TRY(op1(L, KILN_OP_Add, 2, in5, &y));
    }
    TRY(activation(L, act, y, &y));
    return bind(L, 0, y);
}

static kiln_status lower_op(struct lw *L, int32_t code)
{
    switch (code) {
    case TFL_ADD: return lower_binary(L, KILN_OP_Add, OPT_ADD);
    case TFL_SUB: return lower_binary(L, KILN_OP_Sub, OPT_SUB);
    case TFL_MUL: return lower_binary(L, KILN_OP_Mul, OPT_MUL);
    case TFL_DIV: return lower_binary(L, KILN_OP_Div, OPT_DIV);
    case TFL_LOGISTIC: case TFL_TANH: case TFL_RELU: case TFL_RELU6: case TFL_RELU_N1_TO_1:
    case TFL_EXP: case TFL_FLOOR:
        return lower_unary(L, code);
    case TFL_CONV_2D: return lower_conv(L, false);
    case TFL_DEPTHWISE_CONV_2D: return lower_conv(L, true);
    case TFL_AVERAGE_POOL_2D: return lower_pool(L, false);
    case TFL_MAX_POOL_2D: return lower_pool(L, true);
    case TFL_FULLY_CONNECTED: return lower_fc(L);
    case TFL_RESHAPE: return lower_reshape(L);
    case TFL_SOFTMAX: return lower_softmax(L);
    case TFL_CONCATENATION: return lower_concat(L);
    case TFL_MEAN: return lower_mean(L);
    case TFL_PAD: return lower_pad(L);
    case TFL_TRANSPOSE: return lower_transpose(L);
    case TFL_SQUEEZE: return lower_squeeze(L);
    case TFL_STRIDED_SLICE: return lower_strided_slice(L);
    case TFL_QUANTIZE: return lower_quantize(L);
    case TFL_DEQUANTIZE: return lower_dequantize(L);
    case TFL_LSTM: return lower_lstm(L, false);
    case TFL_SVDF: return lower_svdf(L);
    case TFL_UNIDIRECTIONAL_SEQUENCE_LSTM: return lower_lstm(L, true);
    default:
        return lerr(L, KILN_ERR_UNSUPPORTED, "the builtin operator %s (code %d) is not supported "
                    "by Kiln", L->opname, (int)code);
    }
}

/* The type a graph input declares: shape_signature's free dims stay -1. */
static kiln_status input_value(struct lw *L, int ti, int *id)
{
    const struct tfl_tensor *t = &L->sg->tensors[ti];
    if (t->dtype == KILN_DTYPE_UNDEFINED)
        return kiln_error(KILN_ERR_UNSUPPORTED, "TFLite subgraph %d: input '%s' has type %d, "
                          "which Kiln does not support", L->sgi, t->name, t->type);
    TRY(kiln_graph_value_add(L->g, t->name, KILN_VALUE_INPUT, id));
    struct kiln_type *ty = &L->g->values[*id].type;
    kiln_type_unknown(ty);
    ty->dtype = t->dtype;
    ty->rank = t->rank;
    for (int i = 0; i < t->rank; i++)
        ty->dims[i] = t->has_signature ? t->signature[i] : t->shape[i];
    return KILN_OK;
}

kiln_status tfl_lower_subgraph(const struct tfl_model *tm, int sgi, struct kiln_graph *g)
{
    const struct tfl_subgraph *sg = &tm->subgraphs[sgi];
    struct lw L = {.tm = tm, .sg = sg, .sgi = sgi, .g = g};
    kiln_status st = KILN_OK;
    g->name = sg->name;
    L.val = malloc(sizeof(int) * ((size_t)sg->n_tensors + 1));
    g->inputs = kiln_arena_alloc(g->mem, sizeof(int) * ((size_t)sg->n_in + 1));
    g->outputs = kiln_arena_alloc(g->mem, sizeof(int) * ((size_t)sg->n_out + 1));
    if (!L.val || !g->inputs || !g->outputs) {
        free(L.val);
        return oom();
    }
    for (int i = 0; i < sg->n_tensors; i++) L.val[i] = -1;
    for (int i = 0; i < sg->n_in && st == KILN_OK; i++) {
        int ti = sg->in[i], id;
        if (L.val[ti] >= 0) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "TFLite subgraph %d: tensor '%s' is listed "
                            "twice among the inputs", sgi, sg->tensors[ti].name);
            break;
        }
        if ((st = input_value(&L, ti, &id)) != KILN_OK) break;
        L.val[ti] = id;
        g->inputs[g->n_inputs++] = id;
    }
    for (int i = 0; i < sg->n_ops && st == KILN_OK; i++) {
        const struct tfl_op *op = &sg->ops[i];
        const struct tfl_opcode *oc = &tm->codes[op->opcode];
        L.op = op;
        L.opi = i;
        L.opname = tfl_builtin_name(oc->builtin);
        if (!L.opname) L.opname = "unnamed builtin";
        L.name = op->n_out ? sg->tensors[op->out[0]].name : "";
        if (oc->builtin == TFL_CUSTOM) {
            st = kiln_error(KILN_ERR_UNSUPPORTED,
                            "TFLite operator %d of subgraph %d is the custom op '%s', which Kiln "
                            "does not implement", i, sgi, oc->custom ? oc->custom : "(unnamed)");
            break;
        }
        /* LSTM's BASIC kernel has 2 to 4 outputs (checked in lower_lstm_basic) */
        if (op->n_out != 1 && !(oc->builtin == TFL_LSTM && op->n_out >= 1 && op->n_out <= 4)) {
            st = lerr(&L, KILN_ERR_INVALID_MODEL, "%d outputs, expected 1", op->n_out);
            break;
        }
        for (int k = 0; k < op->n_out && st == KILN_OK; k++)
            if (sg->tensors[op->out[k]].dtype == KILN_DTYPE_UNDEFINED)
                st = lerr(&L, KILN_ERR_UNSUPPORTED, "output tensor '%s' has TFLite type %d",
                          sg->tensors[op->out[k]].name, sg->tensors[op->out[k]].type);
        if (st == KILN_OK) st = lower_op(&L, oc->builtin);
    }
    for (int i = 0; i < sg->n_out && st == KILN_OK; i++) {
        int ti = sg->out[i];
        if (L.val[ti] < 0) {
            const struct tfl_tensor *t = &sg->tensors[ti];
            if (tbuf(&L, t)) {
                kiln_tensor *x;
                L.name = t->name;
                L.opname = "output";
                L.opi = -1;
                if ((st = tensor_data(&L, t, &x)) != KILN_OK) break;
                if ((st = add_const(&L, t->name, x, &L.val[ti])) != KILN_OK) break;
            } else {
                st = kiln_error(KILN_ERR_INVALID_MODEL, "TFLite subgraph %d: output '%s' is not "
                                "written by any operator", sgi, t->name);
                break;
            }
        }
        g->outputs[g->n_outputs++] = L.val[ti];
    }
    free(L.val);
    if (st != KILN_OK) return st;
    /* name the output values after their tensors */
    for (int i = 0; i < sg->n_out; i++) {
        struct kiln_value *v = &g->values[g->outputs[i]];
        if (v->kind == KILN_VALUE_NODE) v->name = sg->tensors[sg->out[i]].name;
    }
    if ((st = kiln_graph_verify(g)) != KILN_OK) return st;
    return kiln_graph_infer(g);
}
