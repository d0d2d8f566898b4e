/*
 * tflite.h - the TFLite importer's two halves and what passes between them.
 *
 * tflite.c reads a .tflite FlatBuffer (through the checked reader in
 * flatbuf.h) into the plain structs below: operator codes, buffers,
 * subgraphs with their tensors (shape, type, buffer, quantization) and
 * operators (inputs, outputs, builtin options as a checked table), and the
 * SignatureDefs. Every index in them has been checked against the arrays it
 * points into. tflite_lower.c turns one subgraph into a Kiln IR graph, one
 * TFLite operator at a time; float ops become Kiln's ONNX-semantics ops,
 * quantized ones the Tfl* ops of ops.def, computed with TFLite's integer
 * arithmetic (src/kernels/ref/tflite_q.c).
 */
#ifndef KILN_IMPORT_TFLITE_H
#define KILN_IMPORT_TFLITE_H

#include "import/flatbuf.h"
#include "import/model.h"

/* BuiltinOperator codes Kiln reads (schema.fbs; facts of the format). */
enum tfl_builtin {
    TFL_ADD = 0, TFL_AVERAGE_POOL_2D = 1, TFL_CONCATENATION = 2, TFL_CONV_2D = 3,
    TFL_DEPTHWISE_CONV_2D = 4, TFL_DEQUANTIZE = 6, TFL_FLOOR = 8, TFL_FULLY_CONNECTED = 9,
    TFL_LOGISTIC = 14, TFL_LSTM = 16, TFL_MAX_POOL_2D = 17, TFL_MUL = 18, TFL_RELU = 19,
    TFL_RELU_N1_TO_1 = 20, TFL_RELU6 = 21, TFL_RESHAPE = 22, TFL_SOFTMAX = 25, TFL_SVDF = 27,
    TFL_TANH = 28, TFL_CUSTOM = 32, TFL_PAD = 34, TFL_TRANSPOSE = 39, TFL_MEAN = 40,
    TFL_SUB = 41, TFL_DIV = 42, TFL_SQUEEZE = 43, TFL_UNIDIRECTIONAL_SEQUENCE_LSTM = 44,
    TFL_STRIDED_SLICE = 45, TFL_EXP = 47, TFL_CAST = 53, TFL_MAXIMUM = 55, TFL_MINIMUM = 57,
    TFL_QUANTIZE = 114,
};

/* TensorType codes (schema.fbs). */
enum tfl_type {
    TFL_T_FLOAT32 = 0, TFL_T_FLOAT16 = 1, TFL_T_INT32 = 2, TFL_T_UINT8 = 3, TFL_T_INT64 = 4,
    TFL_T_STRING = 5, TFL_T_BOOL = 6, TFL_T_INT16 = 7, TFL_T_INT8 = 9, TFL_T_FLOAT64 = 10,
};

struct tfl_tensor {
    const char *name;
    int type;               /* TensorType */
    kiln_dtype dtype;       /* KILN_DTYPE_UNDEFINED when Kiln has none */
    int rank;
    int64_t shape[KILN_MAX_RANK];
    bool has_signature;     /* shape_signature given: -1 marks a free dim */
    int64_t signature[KILN_MAX_RANK];
    uint32_t buffer;        /* index into the model's buffers (checked) */
    int n_q;                /* quantization scales / zero points (0 = not quantized) */
    float *scale;
    int64_t *zero_point;
    int q_dim;              /* quantized_dimension */
    bool is_variable;
};

struct tfl_op {
    uint32_t opcode;        /* index into the model's operator codes (checked) */
    int n_in, n_out;
    int32_t *in, *out;      /* tensor indices (checked); -1 = absent optional input */
    int n_inter;            /* intermediates: tensors internal to the op (the integer */
    int32_t *inter;         /* LSTM's gate scales), indices checked */
    uint8_t opt_type;       /* BuiltinOptions union type, 0 = none */
    bool has_opts;
    struct kiln_fb_table opts;
};

struct tfl_subgraph {
    const char *name;
    int n_tensors;
    struct tfl_tensor *tensors;
    int n_in, n_out, n_ops;
    int32_t *in, *out;
    struct tfl_op *ops;
};

struct tfl_opcode {
    int32_t builtin;
    const char *custom;     /* custom_code, NUL-terminated, or NULL */
    int32_t version;
};

struct tfl_buffer {
    const uint8_t *data;    /* inside the file bytes */
    size_t size;
};

struct tfl_sigdef {
    const char *key;
    uint32_t subgraph;
    int n_in, n_out;
    const char **in_names, **out_names;
    uint32_t *in_idx, *out_idx;   /* tensor indices in the subgraph (checked) */
};

struct tfl_model {
    struct kiln_fb fb;
    uint32_t version;
    const char *description;
    int n_codes, n_buffers, n_subgraphs, n_sigs;
    struct tfl_opcode *codes;
    struct tfl_buffer *buffers;
    struct tfl_subgraph *subgraphs;
    struct tfl_sigdef *sigs;
};

/* Read a TFLite model from bytes (which must outlive *out's use); the
 * structs live in arena a. */
kiln_status tfl_read(const void *data, size_t size, struct kiln_arena *a, struct tfl_model *out);

/* The name of a builtin operator code, or NULL for one Kiln does not name. */
const char *tfl_builtin_name(int32_t code);

/* Lower subgraph sg of tm into the empty graph g; its inputs and outputs
 * become g's in the subgraph's order. */
kiln_status tfl_lower_subgraph(const struct tfl_model *tm, int sg, struct kiln_graph *g);

/* Whether bytes look like a TFLite model ('TFL3' at bytes 4..8). */
bool kiln_tflite_detect(const void *data, size_t size);
/* Import a TFLite model (the bytes are copied where kept). */
kiln_status kiln_tflite_load(const void *data, size_t size, struct kiln_model *m);

#endif
