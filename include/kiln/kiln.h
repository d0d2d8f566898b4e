/*
 * kiln.h - the public C API of Kiln, a model runtime.
 *
 * A worked example: load a model, create a session, run it, free it.
 *
 *     kiln_model *model;
 *     if (kiln_model_load("model.onnx", NULL, &model) != KILN_OK) {
 *         fprintf(stderr, "kiln: %s\n", kiln_last_error());
 *         return 1;
 *     }
 *     kiln_session *session;
 *     kiln_session_create(model, NULL, NULL, &session);  // default signature
 *
 *     int64_t dims[2] = {1, 64};
 *     kiln_tensor *x;
 *     kiln_tensor_create(KILN_DTYPE_F32, 2, dims, &x);    // zero-filled
 *     ((float *)x->data)[0] = 1.0f;
 *
 *     kiln_named_tensor in = {"input", x};
 *     kiln_outputs *out;
 *     if (kiln_session_run(session, &in, 1, &out) == KILN_OK) {
 *         const kiln_tensor *y = kiln_outputs_get(out, 0);
 *         printf("%s: %g\n", kiln_outputs_name(out, 0), ((float *)y->data)[0]);
 *         kiln_outputs_free(out);
 *     }
 *     kiln_tensor_free(x);
 *     kiln_session_free(session);
 *     kiln_model_free(model);
 *
 * Errors are values: every fallible call returns a kiln_status and, when it
 * is not KILN_OK, kiln_last_error() returns a message naming the thing and
 * the bad value (thread-local, valid until the next failing call on the
 * same thread).
 *
 * Threads: a kiln_model and a kiln_session may be used from many threads at
 * once; kiln_session_run keeps its per-run state on the calling thread's
 * stack and heap, so concurrent runs share nothing mutable.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* KILN_API marks what libkiln exports. The library is built with hidden
 * visibility by default (-fvisibility=hidden), so a function without the
 * marker stays inside libkiln.so; tests/api/check_exports.py checks that
 * the exported symbols are exactly the functions include/kiln/ declares. */
#if defined(__GNUC__) || defined(__clang__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#define KILN_VERSION_STRING "0.1.0"
#define KILN_MAX_RANK 8

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_INVALID_ARGUMENT,  /* a caller's argument or input tensor is wrong */
    KILN_ERR_INVALID_MODEL,     /* the model file is malformed or inconsistent */
    KILN_ERR_UNSUPPORTED,       /* well-formed, but uses something Kiln lacks */
    KILN_ERR_NOT_FOUND,         /* a file, signature, input or output name */
    KILN_ERR_IO,                /* reading or writing a file failed */
    KILN_ERR_OUT_OF_MEMORY,     /* an allocation failed or a limit was hit */
    KILN_ERR_RUNTIME,           /* a kernel failed on these values */
    KILN_ERR_INTERNAL,          /* a bug in Kiln */
    KILN_ERR_DEADLINE,          /* the run passed its deadline or was cancelled */
} kiln_status;

typedef enum kiln_dtype {
    KILN_DTYPE_UNDEFINED = 0,
    KILN_DTYPE_F32,
    KILN_DTYPE_F16,
    KILN_DTYPE_BF16,
    KILN_DTYPE_F64,
    KILN_DTYPE_I8,
    KILN_DTYPE_U8,
    KILN_DTYPE_I16,
    KILN_DTYPE_U16,
    KILN_DTYPE_I32,
    KILN_DTYPE_U32,
    KILN_DTYPE_I64,
    KILN_DTYPE_U64,
    KILN_DTYPE_BOOL,   /* one byte per element, 0 or 1 */
    KILN_DTYPE_STRING, /* elements are kiln_string */
    /* Low-precision types, one element per byte in memory (4- and 2-bit
     * types are not packed: an int4 element is an int8 in -8..7). */
    KILN_DTYPE_F8E4M3FN,   /* float8: 4 exponent bits, 3 mantissa, NaN, no inf */
    KILN_DTYPE_F8E4M3FNUZ, /* float8 e4m3, bias 8, no -0, NaN is 0x80 */
    KILN_DTYPE_F8E5M2,     /* float8: 5 exponent bits, 2 mantissa, inf and NaN */
    KILN_DTYPE_F8E5M2FNUZ, /* float8 e5m2, bias 16, no -0, NaN is 0x80 */
    KILN_DTYPE_U4,         /* 0..15 */
    KILN_DTYPE_I4,         /* -8..7 */
    KILN_DTYPE_F4E2M1,     /* float4 in the low 4 bits: sign, 2 exponent, 1 mantissa */
    KILN_DTYPE_F8E8M0,     /* 2^(e-127), 0xff is NaN (an MX scale) */
    KILN_DTYPE_U2,         /* 0..3 */
    KILN_DTYPE_I2,         /* -2..1 */
    KILN_DTYPE_COUNT,
    /* Containers (ONNX sequence(T) and optional(T); docs/SEQUENCES.md), numbered past
     * KILN_DTYPE_COUNT so that nothing that handles element types takes them by accident.
     * A container kiln_tensor has rank 1, dims[0] items (an optional 0 or 1) and data
     * holding dims[0] kiln_tensor pointers that it owns; read and build it with
     * kiln_tensor_item / kiln_tensor_container_create / kiln_tensor_set_item. */
    KILN_DTYPE_SEQUENCE = 64,
    KILN_DTYPE_OPTIONAL = 65,
} kiln_dtype;

/* A byte string (not NUL-terminated in general; binary-safe). */
typedef struct kiln_string {
    size_t len;
    char *data;
} kiln_string;

/*
 * A dense tensor in C (row-major) order. Fields are public for reading and
 * for writing elements; create and free tensors with the functions below.
 */
typedef struct kiln_tensor {
    kiln_dtype dtype;
    int rank;
    int64_t dims[KILN_MAX_RANK];
    void *data;      /* element storage; kiln_string[] for strings */
    size_t nbytes;   /* bytes at data */
    int owns_data;   /* private: data (and string bytes) freed with the tensor */
} kiln_tensor;

KILN_API const char *kiln_status_name(kiln_status st);
KILN_API const char *kiln_last_error(void);
KILN_API const char *kiln_dtype_name(kiln_dtype dt);
KILN_API size_t kiln_dtype_size(kiln_dtype dt);
KILN_API const char *kiln_version(void);

/* Half-precision element conversions, the ones the runtime uses (KILN_DTYPE_F16
 * is IEEE binary16, KILN_DTYPE_BF16 the top half of a float32):
 * - to float32 is exact; a NaN keeps its sign and payload (shifted up).
 * - float32 to float16 rounds to nearest even, gives +-inf from 65520 up and
 *   subnormals below 2^-14; a NaN becomes the quiet NaN 0x7e00 with its sign.
 * - float32 to bfloat16 rounds to nearest even (overflow to +-inf); a NaN keeps
 *   its sign and top payload bits and is made quiet (bit 0x40 set). */
KILN_API float kiln_f16_to_f32(uint16_t h);
KILN_API uint16_t kiln_f32_to_f16(float f);
KILN_API float kiln_bf16_to_f32(uint16_t h);
KILN_API uint16_t kiln_f32_to_bf16(float f);

/* Tensors. kiln_tensor_create zero-fills; strings start empty. */
KILN_API kiln_status kiln_tensor_create(kiln_dtype dt, int rank, const int64_t *dims, kiln_tensor **out);
/* A tensor that borrows data (not freed with it); nbytes must match the shape. */
KILN_API kiln_status kiln_tensor_wrap(kiln_dtype dt, int rank, const int64_t *dims, void *data,
                             size_t nbytes, kiln_tensor **out);
/* Set element i of a string tensor to a copy of bytes. */
KILN_API kiln_status kiln_tensor_set_string(kiln_tensor *t, size_t i, const char *bytes, size_t len);
KILN_API int64_t kiln_tensor_count(const kiln_tensor *t);
KILN_API void kiln_tensor_free(kiln_tensor *t);
/* Containers: a sequence (kind KILN_DTYPE_SEQUENCE) or optional (KILN_DTYPE_OPTIONAL, n 0
 * for "no value" or 1) of n empty slots; fill every slot with kiln_tensor_set_item, which
 * takes ownership of item (a tensor, or for an optional also a sequence) and frees what
 * the slot held. kiln_tensor_item returns slot i, or NULL when t is not a container or i
 * is out of range. Freeing or running frees the items with the container. */
KILN_API kiln_status kiln_tensor_container_create(kiln_dtype kind, int64_t n, kiln_tensor **out);
KILN_API kiln_status kiln_tensor_set_item(kiln_tensor *t, int64_t i, kiln_tensor *item);
KILN_API const kiln_tensor *kiln_tensor_item(const kiln_tensor *t, int64_t i);
/* Copy rows [src_row, src_row + count) of src (rows: slices along dimension 0) to dst from
 * dst_row. Same element dtype (strings are copied), same elements per row, both ranges
 * inside their tensors (src and dst may be one tensor if the ranges do not overlap);
 * anything else is KILN_ERR_INVALID_ARGUMENT and nothing is copied. */
KILN_API kiln_status kiln_tensor_copy_rows(kiln_tensor *dst, int64_t dst_row,
                                           const kiln_tensor *src, int64_t src_row,
                                           int64_t count);

/* Models. */
typedef struct kiln_model kiln_model;

typedef enum kiln_format {
    KILN_FORMAT_AUTO = 0,
    KILN_FORMAT_ONNX,
    KILN_FORMAT_SAVEDMODEL,
    KILN_FORMAT_TFLITE,        /* a .tflite file, or a folder's model.tflite */
    KILN_FORMAT_KILN,          /* a compiled .kiln artifact (docs/KILN_FORMAT.md), or a
                                  folder's model.kiln */
} kiln_format;

typedef struct kiln_load_options {
    kiln_format format;        /* KILN_FORMAT_AUTO detects from the path */
    const char *tags;          /* SavedModel MetaGraph tags, comma-separated; NULL = "serve" */
    int64_t max_tensor_bytes;  /* bound on any one value of the plans a .kiln file asks to
                                  precompile at load (its batch sizes): a file asking for more
                                  is refused, naming the node; 0 = 16 GiB */
} kiln_load_options;

/* Load from a file or model folder. */
KILN_API kiln_status kiln_model_load(const char *path, const kiln_load_options *opts, kiln_model **out);
/* Load from bytes; the bytes are not retained. External data is not allowed. */
KILN_API kiln_status kiln_model_load_memory(const void *data, size_t size, const kiln_load_options *opts,
                                   kiln_model **out);

/* One file of a model folder held in memory (decrypted, say): its path
 * relative to the folder, '/'-separated ("saved_model.pb",
 * "variables/variables.index", "variables/variables.data-00000-of-00001",
 * "model.onnx"), and its bytes. */
typedef struct kiln_memory_file {
    const char *path;
    const void *data;
    size_t size;
} kiln_memory_file;

/* Load a model folder whose files are given in memory: a SavedModel
 * (saved_model.pb or .pbtxt, with its variables/ checkpoint) or model.onnx.
 * Nothing is read from the file system: a file the model needs that is not
 * among files[0..n) is not found. dir only names the folder in messages
 * (and in the paths of SavedModel assets). The bytes are not retained: the
 * model copies what it keeps, so files may be wiped and freed on return. */
KILN_API kiln_status kiln_model_load_files(const char *dir, const kiln_memory_file *files, int n,
                                  const kiln_load_options *opts, kiln_model **out);
KILN_API void kiln_model_free(kiln_model *m);
KILN_API const char *kiln_model_format(const kiln_model *m);

/* Signatures: a named entry point with named inputs and outputs. An ONNX
 * model has one, "serving_default". */
typedef struct kiln_value_info {
    const char *name;                 /* the name callers use */
    kiln_dtype dtype;                 /* KILN_DTYPE_UNDEFINED if unknown */
    int rank;                         /* -1 if unknown */
    int64_t dims[KILN_MAX_RANK];      /* -1 for a symbolic or unknown dim */
    const char *dim_names[KILN_MAX_RANK]; /* symbol of dims[i] or NULL */
} kiln_value_info;

typedef struct kiln_signature kiln_signature;
KILN_API int kiln_model_signature_count(const kiln_model *m);
KILN_API const kiln_signature *kiln_model_signature(const kiln_model *m, int i);
/* NULL name means the default signature. NULL if not found. */
KILN_API const kiln_signature *kiln_model_find_signature(const kiln_model *m, const char *name);
KILN_API const char *kiln_signature_name(const kiln_signature *s);
KILN_API const char *kiln_signature_method(const kiln_signature *s); /* e.g. "tensorflow/serving/predict" */
KILN_API int kiln_signature_input_count(const kiln_signature *s);
KILN_API int kiln_signature_output_count(const kiln_signature *s);
KILN_API const kiln_value_info *kiln_signature_input(const kiln_signature *s, int i);
KILN_API const kiln_value_info *kiln_signature_output(const kiln_signature *s, int i);

/* Model facts for inspection. Valid while the model lives. */
typedef struct kiln_model_stats {
    int64_t param_count;      /* elements in all initializers */
    int64_t param_bytes;      /* bytes in all initializers */
    int node_count;           /* nodes in the main graph (not subgraphs) */
    int64_t ir_version;
    const char *producer;     /* may be "" */
} kiln_model_stats;
KILN_API void kiln_model_get_stats(const kiln_model *m, kiln_model_stats *out);
/* Opset imports: domain ("" = ai.onnx) and version, i < count. */
KILN_API int kiln_model_opset_count(const kiln_model *m);
KILN_API void kiln_model_opset(const kiln_model *m, int i, const char **domain, int64_t *version);
/* Op histogram of the main graph and subgraphs, sorted by op name. */
KILN_API int kiln_model_op_kinds(const kiln_model *m);
KILN_API void kiln_model_op_kind(const kiln_model *m, int i, const char **op, int *count);

/* Sessions. */
typedef struct kiln_session kiln_session;
typedef struct kiln_session_options {
    int threads;         /* intra-op threads; 0 = the machine's cores */
    int optimize;        /* 1 = run the graph optimizer (default), 0 = run as imported */
    int64_t max_tensor_bytes; /* bound on any one tensor a run produces; 0 = 16 GiB */
    int reference;       /* 1 = the reference path: imported graph, reference kernels, no
                            plans (slow; for checking the fast path) */
    int precision;       /* kiln_precision: KILN_PRECISION_FP32 (default), BF16 or INT8 */
    int profile;         /* 1 = time every step of every run from the start
                            (kiln_session_profile_enable); default 0 */
} kiln_session_options;

/*
 * Compute precision of a session (docs/COMPRESSION.md). Opt-in and lossy:
 * - KILN_PRECISION_BF16: MatMul, Gemm, Conv and their fused forms with
 *   constant weights run on oneDNN with the weights stored bfloat16, the
 *   activations rounded to bfloat16 as they enter, fp32 accumulation and
 *   fp32 outputs.
 * - KILN_PRECISION_INT8: the same products (convolutions: groups of 1,
 *   without a fused residual) quantized dynamically: weights symmetric s8
 *   per output channel (packed once), the activation u8 with a scale and
 *   zero point measured on each run, s32 accumulation on oneDNN's int8
 *   kernels (VNNI), fp32 output with bias and activation fused.
 * Everything else (softmax, normalizations, reductions, elementwise ops,
 * products whose weights are computed at run time) stays fp32, as does a
 * product oneDNN has no fast kernel for in the precision. The profile
 * (`kiln bench --profile`) names the kernel each node ran on
 * ("dnnl_gemm_int8", "dnnl_fused_conv_bf16", ...). Sessions of one model
 * with different precisions share the model but not their plans.
 */
typedef enum kiln_precision {
    KILN_PRECISION_FP32 = 0,
    KILN_PRECISION_BF16 = 1,
    KILN_PRECISION_INT8 = 2,
} kiln_precision;
/* "fp32", "bf16", "int8"; "?" for a value out of range. */
KILN_API const char *kiln_precision_name(kiln_precision p);
/* Parse "fp32" / "bf16" / "int8" (case-sensitive); KILN_ERR_INVALID_ARGUMENT names the text. */
KILN_API kiln_status kiln_precision_parse(const char *text, kiln_precision *out);
KILN_API void kiln_session_options_init(kiln_session_options *o);

KILN_API kiln_status kiln_session_create(kiln_model *m, const char *signature,
                                const kiln_session_options *opts, kiln_session **out);
KILN_API void kiln_session_free(kiln_session *s);
KILN_API const kiln_signature *kiln_session_signature(const kiln_session *s);

typedef struct kiln_named_tensor {
    const char *name;
    const kiln_tensor *tensor;  /* borrowed for the duration of the call */
} kiln_named_tensor;

typedef struct kiln_outputs kiln_outputs;
/* Run with the named inputs (every signature input must be given once).
 * On success *out holds every signature output, owned by the caller. */
KILN_API kiln_status kiln_session_run(kiln_session *s, const kiln_named_tensor *inputs, int n_inputs,
                             kiln_outputs **out);
/* Per-run options. */
typedef struct kiln_run_options {
    int64_t deadline_ms;        /* CLOCK_MONOTONIC milliseconds after which the run stops
                                   between nodes with KILN_ERR_DEADLINE; 0 = none */
    const volatile int *cancel; /* when non-NULL and *cancel becomes non-zero, the run stops
                                   between nodes with KILN_ERR_DEADLINE */
} kiln_run_options;
KILN_API kiln_status kiln_session_run_opts(kiln_session *s, const kiln_named_tensor *inputs, int n_inputs,
                                  const kiln_run_options *ro, kiln_outputs **out);
/* Milliseconds of CLOCK_MONOTONIC, the clock deadline_ms is measured on. */
KILN_API int64_t kiln_monotonic_ms(void);

/* Compile (and cache) the session's plans for these batch sizes: dimension 0
 * of every input is set to each size, the other symbolic dimensions to 1
 * unless the signature fixes them. Returns the first failure; sizes whose
 * shapes cannot be planned are skipped. */
KILN_API kiln_status kiln_session_precompile(kiln_session *s, const int64_t *batch_sizes, int n);

/* The optimization log of the session's graph (one line per pass, then
 * totals), as a NUL-terminated string owned by the caller (free()). Sessions
 * created with optimize = 0 report "optimizer disabled". */
KILN_API kiln_status kiln_session_optimization_log(kiln_session *s, char **text);

/*
 * Compiled artifacts (`kiln compile`, docs/KILN_FORMAT.md). kiln_session_save
 * writes the session's optimized graph for its signature, with its weights
 * in the session's precision, the signature, the batch sizes to precompile
 * when the artifact is loaded, and an optional compile report (JSON text kept
 * verbatim), as one .kiln file. kiln_model_load reads it back
 * (KILN_FORMAT_KILN, detected by its magic): sessions of that model skip
 * import and optimization and run in the saved precision.
 */
typedef struct kiln_save_options {
    const int64_t *batch_sizes;   /* plans compiled at load; NULL/0 = none */
    int n_batch_sizes;
    const char *report_json;      /* stored verbatim; NULL = none */
} kiln_save_options;
KILN_API kiln_status kiln_session_save(kiln_session *s, const char *path, const kiln_save_options *opts);
/* The compile report stored in a .kiln model (valid while the model lives), or NULL. */
KILN_API const char *kiln_model_compile_report(const kiln_model *m);
/* The lowest precision a model's products run in, as a name ("fp32", "bf16", "int8"): a
 * .kiln file's compiled precision, lowered to that of any node given another one, and
 * "int8" for a graph holding quantized products (a statically quantized .kiln, or an ONNX
 * QDQ / QLinear model); "fp32" for other models. What `kiln serve` reports per version. */
KILN_API const char *kiln_model_precision(const kiln_model *m);

/*
 * Profile: per-step and per-op times of a session's runs, as data (`kiln
 * bench --profile` prints the same counters as a table).
 *
 * Turn it on with the session option `profile` or kiln_session_profile_enable
 * (the reference executor, reference = 1, keeps no profile: enabling it there,
 * or creating a session with both options, is KILN_ERR_UNSUPPORTED). While it is on, each run adds the time and a call
 * to every step it runs; the counters are atomic, so concurrent runs may be
 * profiled and read at any time without corrupting them (a snapshot taken
 * during a run may count some of that run's steps and not the others).
 * Sessions of one model, signature, precision and optimize setting share
 * their compiled plans and so their counters: a profile covers every profiled
 * run of those sessions, and a reset clears them for all.
 *
 * kiln_session_profile_get takes a snapshot owned by the caller
 * (kiln_profile_free). It is an opaque object with accessors returning
 * borrowed kiln_profile_entry structs, as for signatures, rather than JSON
 * text: C callers read numbers without a parser, and the Python extension
 * builds its dicts from the fields directly. A session whose profiling is off
 * gets an empty profile (no entries), not an error. Steps that never ran since
 * the last reset are left out.
 */
typedef struct kiln_profile kiln_profile;
typedef struct kiln_profile_entry {
    const char *op;      /* op type, e.g. "Gemm", "FusedConv" (after optimization) */
    const char *node;    /* the node's name ("" when unnamed); NULL for an op entry */
    const char *kernel;  /* the kernel that ran it ("dnnl_gemm", ...), "reference" for
                            Kiln's reference kernel */
    int plan, step;      /* a step entry: which compiled plan (one per input shape) and
                            which step of it; -1 for an op entry */
    int nodes;           /* steps counted: 1 for a step entry */
    int64_t calls;       /* times the step ran (summed over the steps of an op entry) */
    int64_t total_ns;    /* wall time of those calls, nanoseconds */
    double share;        /* total_ns / the profile's total, 0..1 */
    double flops;        /* floating-point operations per call where the plan counts them
                            (products, convolutions), else 0 */
} kiln_profile_entry;
KILN_API kiln_status kiln_session_profile_enable(kiln_session *s, int on);
/* Zero the counters (see above for sessions sharing plans). */
KILN_API kiln_status kiln_session_profile_reset(kiln_session *s);
KILN_API kiln_status kiln_session_profile_get(kiln_session *s, kiln_profile **out);
/* Step entries (one per step of each plan) and op entries (grouped by op type and
 * kernel), each sorted slowest first. Entries and their strings are valid until
 * kiln_profile_free; NULL for i out of range. */
KILN_API int kiln_profile_step_count(const kiln_profile *p);
KILN_API const kiln_profile_entry *kiln_profile_step(const kiln_profile *p, int i);
KILN_API int kiln_profile_op_count(const kiln_profile *p);
KILN_API const kiln_profile_entry *kiln_profile_op(const kiln_profile *p, int i);
KILN_API void kiln_profile_free(kiln_profile *p);

KILN_API int kiln_outputs_count(const kiln_outputs *o);
KILN_API const char *kiln_outputs_name(const kiln_outputs *o, int i);
KILN_API const kiln_tensor *kiln_outputs_get(const kiln_outputs *o, int i);
/* Take ownership of output i (the outputs object forgets it). */
KILN_API kiln_tensor *kiln_outputs_take(kiln_outputs *o, int i);
KILN_API void kiln_outputs_free(kiln_outputs *o);

/* ==== Static int8 quantization with calibration (src/api/calibration.c;
 * docs/COMPRESSION.md, "Static calibration") ====
 *
 * Feed a session representative inputs, then fix its activation scales:
 *
 *     kiln_calibration *c;
 *     kiln_calibration_begin(session, &c);
 *     for each batch: kiln_calibration_feed(c, inputs, n_inputs);
 *     kiln_calibration_finish(c, KILN_CALIBRATION_ENTROPY, 0);   // the session is now int8
 *     kiln_calibration_free(c);
 *
 * Feeding runs the session's imported graph in fp32 and records every
 * activation that enters or leaves a Conv, Gemm or MatMul with constant
 * weights. finish turns each record into a range by the method, rewrites
 * the graph into ONNX's QDQ form (u8 activations with those static ranges,
 * weights symmetric s8 per output channel, int32 biases) and optimizes it
 * into int8 kernels (QLinearConv, KilnQLinearMatMul; consecutive quantized
 * ops pass int8 tensors to each other); from then on the session runs that
 * graph: no range is measured at run time. Not for sessions with
 * reference = 1 or optimize = 0, nor while the session runs on another
 * thread.
 */
typedef enum kiln_calibration_method {
    KILN_CALIBRATION_MINMAX = 0,     /* the observed min and max (and 0) */
    KILN_CALIBRATION_PERCENTILE = 1, /* |x| clipped at the given percentile */
    KILN_CALIBRATION_ENTROPY = 2,    /* |x| clipped where KL divergence is smallest (TensorRT) */
} kiln_calibration_method;
typedef struct kiln_calibration kiln_calibration;
KILN_API kiln_status kiln_calibration_begin(kiln_session *s, kiln_calibration **out);
/* Run one batch (every signature input once, as for kiln_session_run). */
KILN_API kiln_status kiln_calibration_feed(kiln_calibration *c, const kiln_named_tensor *inputs,
                                  int n_inputs);
/* percentile: in (0, 100], for KILN_CALIBRATION_PERCENTILE (e.g. 99.99); ignored otherwise. */
KILN_API kiln_status kiln_calibration_finish(kiln_calibration *c, kiln_calibration_method method,
                                    double percentile);
/* Keep node `node` (a Conv, Gemm or MatMul, by its name in the model) in fp32 when finish
 * quantizes the rest: call before finish, once per node. The values it reads and writes stay
 * float (a quantized neighbour that writes its input dequantizes on the way, unrounded);
 * KILN_ERR_NOT_FOUND names a node calibration does not quantize. */
KILN_API kiln_status kiln_calibration_exclude(kiln_calibration *c, const char *node);
/* Nodes quantized by finish (Conv, Gemm, MatMul found, less the excluded; 0 before finish). */
KILN_API int kiln_calibration_node_count(const kiln_calibration *c);
KILN_API void kiln_calibration_free(kiln_calibration *c);
/* The range [*lo, *hi] a method gives for the values x[0..n) seen as one calibration
 * record (the same histogram and method as finish uses). */
KILN_API kiln_status kiln_calibration_range(const float *x, int64_t n, kiln_calibration_method method,
                                   double percentile, float *lo, float *hi);
/* Write the statically quantized session s (after kiln_calibration_finish)
 * as an ONNX QDQ model at `path` (src/api/emit_onnx.c; docs/COMPRESSION.md,
 * "--emit-onnx"): the ONNX file `source_onnx` s's model was loaded from,
 * its nodes, initializers and opsets kept, with QuantizeLinear ->
 * DequantizeLinear pairs (u8, the calibrated scale and zero point) on the
 * activations Kiln quantizes, and each quantized weight an s8 initializer
 * read through DequantizeLinear (axis = output channel), its bias an int32
 * one, the float originals dropped. ONNX Runtime and Kiln run it with the
 * same int8 arithmetic as s. Needs default-domain opset >= 13 (per-channel
 * DequantizeLinear). KILN_ERR_UNSUPPORTED for a session that is not static
 * int8: dynamic int8 measures activation ranges per run, which QDQ's fixed
 * scales cannot express. */
KILN_API kiln_status kiln_session_write_onnx(kiln_session *s, const char *source_onnx, const char *path);
/* ---- Per-node precision (`kiln compile --precision auto`, docs/COMPRESSION.md) ----
 *
 * A session's precision applies to every node that has a kernel for it;
 * these calls make exceptions by node name (the names of the optimized
 * graph, as the profile's step entries show them). `kiln compile`'s auto
 * policy uses them to keep the nodes most sensitive to quantization in
 * bf16 or fp32, and to measure each node's sensitivity alone (an fp32
 * session with one node int8).
 *
 * kiln_session_set_node_precision replaces the session's whole list of
 * exceptions with nodes[0..n) (n = 0 clears it); the session then compiles
 * its own plans (not shared with other sessions of the model). A listed
 * node without a kernel for its precision runs fp32, as under a session
 * precision; a name the graph does not have is KILN_ERR_NOT_FOUND naming it.
 * Call it before running the session, not while runs are in flight.
 * Names are copied. Not supported with reference = 1.
 */
typedef struct kiln_node_precision {
    const char *node;            /* node name in the session's optimized graph */
    kiln_precision precision;
} kiln_node_precision;
KILN_API kiln_status kiln_session_set_node_precision(kiln_session *s, const kiln_node_precision *nodes,
                                            int n);
/* The precision node `node` is asked to run in: its exception, else the
 * session's precision (whether a kernel honours it shows in the profile). */
KILN_API kiln_precision kiln_session_node_precision(const kiln_session *s, const char *node);
/* Weight elements of a node of the session's optimized graph: the elements
 * of its constant floating-point input 1 (a product's B or a convolution's
 * W), 0 when it has none; -1 when the graph has no node of that name. */
KILN_API int64_t kiln_session_node_weight_elems(const kiln_session *s, const char *node);

/* ---- Pruning and sparse kernels (`kiln compile --prune`, docs/COMPRESSION.md) ----
 *
 * MatMul, Gemm and their fused forms whose constant weight is mostly zero
 * run on sparse kernels when that measures faster on the node's shape
 * (KILN_SPARSE=off in the environment disables them). kiln_model_prune zeroes,
 * in every MatMul / Gemm / 1x1-convolution weight of m, the `ratio` share
 * (0 < ratio < 1) with the smallest magnitude, per layer: single entries
 * (block 1) or 1x4 blocks along the reduction dimension (block 4). One-shot
 * pruning costs accuracy quickly; high sparsity needs pruning during
 * training. Call it right after loading, before any session runs. */
typedef struct kiln_prune_stats {
    int64_t layers;  /* weights pruned */
    int64_t weights; /* their elements */
    int64_t zeroed;  /* elements set to zero (some may have been zero already) */
} kiln_prune_stats;
KILN_API kiln_status kiln_model_prune(kiln_model *m, double ratio, int block, kiln_prune_stats *out);
/* Embedding tables in s8 (`kiln compile --precision int8`, docs/COMPRESSION.md): in
 * every Gather on axis 0 of a constant f32 matrix of at least 16384 elements, each
 * row of the table becomes q * s, q = clamp(nearbyint(w / s), -127, 127) with
 * s = max |row| / 127, so that the model computes with what an int8 .kiln stores
 * (s8 with a scale per row). Call it right after loading, before any session runs. */
typedef struct kiln_table_stats {
    int64_t tables;   /* tables rounded */
    int64_t elements; /* their elements */
} kiln_table_stats;
KILN_API kiln_status kiln_model_quantize_tables(kiln_model *m, kiln_table_stats *out);
/* ==== Evaluating and compiling with an accuracy bound (src/api/compile_eval.c,
 * src/api/compile.c; docs/COMPRESSION.md) ====
 *
 * What `kiln compile`, `kiln gate` and `kiln serve --allow_compression`
 * measure, in one place: a data set (one tensor per signature input,
 * samples on dimension 0), a session's outputs over it as doubles, the
 * comparison of a candidate with a baseline (top-1 agreement, distance,
 * with labels a metric and its relative drop), and the `auto` policy that
 * chooses each node's precision so that the drop stays within a bound:
 *
 *     kiln_compile_options o;
 *     kiln_compile_options_init(&o);            // auto, max_drop 1%
 *     kiln_compile_result r;
 *     char err[KILN_EVAL_ERR_LEN];
 *     if (kiln_compile(model, NULL, &o, &data, &data, &r, err) == KILN_OK) {
 *         if (r.passed) ... run r.session ...;   // r.summary: one line for a log
 *         kiln_compile_result_free(&r);
 *     }
 *
 * Errors come back as a status with a one-line message in err
 * (KILN_EVAL_ERR_LEN bytes) naming the input, output or node concerned.
 * Nothing here keeps state between calls.
 */
#define KILN_EVAL_ERR_LEN 512
#define KILN_COMPILE_MIN_SAMPLES 10   /* fewer samples measure no accuracy worth the name */
#define KILN_COMPILE_EVAL_BATCH 64    /* rows per run when measuring (one batch size for
                                         every session, since dynamic int8 depends on it) */

/* A data set: one tensor per signature input, stacked on dim 0. */
typedef struct kiln_dataset {
    int n;             /* signature inputs */
    char **names;      /* [n] input names (owned by whoever filled it) */
    kiln_tensor **t;   /* [n] tensors, dims[0] = samples */
    int64_t samples;
} kiln_dataset;
/* rows[0..d->n): new tensors holding `count` samples starting at `start`,
 * wrapping around the end of the data (owned by the caller). */
KILN_API kiln_status kiln_dataset_rows(const kiln_dataset *d, int64_t start, int64_t count,
                              kiln_tensor **rows, char *err);
/* Read a data set for signature sig from NumPy files (src/api/dataset.c):
 * path is an .npz archive holding one array per input, or a folder holding
 * one <input>.npy per input and/or any number of .npz archives (every file
 * gives every input; they are stacked on dim 0, the .npy files first, then
 * the archives in name order; other files are ignored). A file for input
 * NAME is NAME.npy, or NAME with each byte outside [A-Za-z0-9._-] replaced
 * by '_'; an archive's member is named either way. Checks each array's
 * dtype, rank and fixed dimensions against sig and that every input has the
 * same sample count. With KILN_DATASET_FINITE, a NaN or infinity in a
 * floating-point array is an error too. err names the file and the input.
 * On success *out owns its tensors and names (kiln_dataset_free). */
#define KILN_DATASET_FINITE 1u
KILN_API kiln_status kiln_dataset_read(const char *path, const kiln_signature *sig,
                                       unsigned flags, kiln_dataset *out, char *err);
KILN_API void kiln_dataset_free(kiln_dataset *d);
/* Data that measures accuracy: at least min_samples samples and no NaN or
 * infinity in a floating-point input; err names `what`, the input and the
 * first bad sample. */
KILN_API kiln_status kiln_dataset_check(const kiln_dataset *d, const char *what,
                                        int64_t min_samples, char *err);
/* Tensor t (from `what`, named in err) as data for signature input vi: vi's
 * dtype, rank and fixed dimensions after the first, at least one sample. */
KILN_API kiln_status kiln_dataset_check_input(const kiln_tensor *t, const kiln_value_info *vi,
                                              const char *what, char *err);

/* One output of one session over a whole data set, as doubles. */
typedef struct kiln_eval_output {
    double *v;         /* [samples * row_size] (owned) */
    int64_t samples;
    int64_t row_size;  /* elements per sample */
    int is_int;        /* the output's dtype is an integer or bool type */
} kiln_eval_output;
/* Run s over all samples, `batch` at a time, and collect output `output`. */
KILN_API kiln_status kiln_eval_collect(kiln_session *s, const kiln_dataset *d, const char *output,
                              int64_t batch, kiln_eval_output *out, char *err);
KILN_API void kiln_eval_output_free(kiln_eval_output *o);
/* The class of sample i of o: the value itself for one value per sample, else
 * the first index of the maximum (a NaN counts as the largest). */
KILN_API double kiln_eval_top1(const kiln_eval_output *o, int64_t i);

typedef enum kiln_eval_kind {
    KILN_EVAL_CLASS_IDS, /* integer output, one per sample: the class */
    KILN_EVAL_SCORES,    /* float output, several per sample: class scores (argmax) */
    KILN_EVAL_VALUES,    /* anything else: regression values */
} kiln_eval_kind;

typedef struct kiln_eval_quality {
    kiln_eval_kind kind;
    int64_t samples, row_size;
    int has_agreement;    /* class outputs only */
    double agreement;     /* share of samples whose top-1 class is the same */
    double mean_abs_diff; /* mean |c - b| over every element */
    double mean_rel_diff; /* mean |c - b| / max(|b|, 1e-6) */
    double max_abs_diff;
    int has_labels;
    const char *metric;   /* with labels: "accuracy" (higher is better) or "rmse" (lower) */
    double base_metric, cand_metric;
    double base_mae, cand_mae; /* regression only */
    const char *drop_of;  /* what `drop` measures, for reports (static text) */
    double drop;          /* relative drop of quality (>= 0 is worse) */
} kiln_eval_quality;
/* Compare candidate c with baseline b (same shape); labels (may be NULL)
 * holds one class per sample or as many targets as the output. Without
 * labels the drop is 1 - top-1 agreement for classes, the mean relative
 * difference for values. */
KILN_API kiln_status kiln_eval_compare(const kiln_eval_output *b, const kiln_eval_output *c,
                              const kiln_tensor *labels, kiln_eval_quality *q, char *err);

/* Every output of one session over a data set. */
typedef struct kiln_compile_run {
    int n;                 /* signature outputs */
    kiln_eval_output *o;   /* [n] */
} kiln_compile_run;
KILN_API kiln_status kiln_compile_run_all(kiln_session *s, const kiln_dataset *d, int64_t batch,
                                 kiln_compile_run *out, char *err);
KILN_API void kiln_compile_run_free(kiln_compile_run *r);
/* SQNR in dB over every non-integer output of two runs together,
 * 10 log10(sum b^2 / sum (c - b)^2); +inf when identical. */
KILN_API double kiln_compile_sqnr(const kiln_compile_run *b, const kiln_compile_run *c);

/* A node that has a low-precision kernel (found by profiling one batch in
 * bf16 and in int8), with what was measured and decided for it. */
typedef struct kiln_compile_node {
    char *name, *op;         /* owned */
    int64_t weight_elems;    /* kiln_session_node_weight_elems */
    int kernel_in[3];        /* [KILN_PRECISION_BF16], [KILN_PRECISION_INT8]: has a kernel */
    int measured;            /* sqnr_db holds its sensitivity */
    kiln_precision measured_in;
    double sqnr_db;
    kiln_precision precision; /* the precision it runs in, as compiled */
    int fell_back;           /* auto moved it to a higher precision */
    char reason[384];        /* why it fell back */
    int step;                /* its step in the profiled plan (the report's order) */
} kiln_compile_node;
/* The nodes of signature `sig` of m that run in bf16 or int8 when asked
 * (so gives threads and optimize; sample rows: one batch of d). */
KILN_API kiln_status kiln_compile_find_nodes(kiln_model *m, const char *sig, const kiln_session_options *so,
                                    const kiln_dataset *d, int64_t batch,
                                    kiln_compile_node **nodes, int *n_nodes, char *err);
KILN_API void kiln_compile_nodes_free(kiln_compile_node *nodes, int n);
/* Sensitivity of a node: the SQNR of the outputs of an fp32 session with
 * that node alone in `p`, run on d, against base (the fp32 outputs on d). */
KILN_API kiln_status kiln_compile_node_sensitivity(kiln_model *m, const char *sig,
                                          const kiln_session_options *so, kiln_compile_node *node,
                                          kiln_precision p, const kiln_dataset *d,
                                          int64_t batch, const kiln_compile_run *base, char *err);
/* The precision a node really runs in (its asked precision if it has a
 * kernel for it, else fp32). */
KILN_API kiln_precision kiln_compile_node_effective(const kiln_compile_node *n);
/* A session of m in `prec`, with each node's own precision as an exception. */
KILN_API kiln_status kiln_compile_session(kiln_model *m, const char *sig, const kiln_session_options *so,
                                 kiln_precision prec, const kiln_compile_node *nodes, int n,
                                 kiln_session **out);

typedef struct kiln_compile_options {
    int is_auto;                  /* 1 (default): the auto policy; 0: every node in `precision` */
    kiln_precision precision;     /* when not auto */
    double max_drop;              /* largest relative drop of the metric (default 0.01) */
    const char *metric_output;    /* NULL: the signature's first output */
    const kiln_tensor *labels;    /* expected outputs of the eval data, or NULL */
    int static_int8;              /* precision int8, not auto, with cal data: activation
                                     ranges fixed from cal (else int8 is dynamic) */
    kiln_calibration_method cal_method; /* for static_int8 (percentile: 99.99%) */
    kiln_session_options session; /* threads, optimize (precision is set per session) */
    kiln_model *candidate_model;  /* NULL: the model itself; else a changed copy (e.g. pruned
                                     by kiln_model_prune) that every compressed session runs,
                                     so the fp32 baseline stays the unchanged model */
} kiln_compile_options;
KILN_API void kiln_compile_options_init(kiln_compile_options *o);

/* What kiln_compile decided and measured. The auto policy:
 *   1. find the nodes with int8 (else bf16) kernels by profiling one batch;
 *   2. measure each one's sensitivity on the calibration data;
 *   3. start with all of them low; while the metric's drop on the eval data
 *      exceeds max_drop, move the most sensitive node still low (lowest
 *      SQNR) up: int8 -> bf16 where it has a bf16 kernel, else fp32; when no
 *      int8 node is left, bf16 nodes -> fp32 in the same order;
 *   4. record for each node moved why (its SQNR and the drop it left).
 * With calibration data and int8 convolutions in the model, auto also builds static
 * int8 of the whole model (MinMax ranges) and keeps it instead where its drop is
 * within max_drop and it runs the
 * evaluation data faster than the mix (CNNs: dynamic int8 quantizes every
 * activation at every run). KILN_AUTO_STATIC=0 in the environment skips that;
 * KILN_AUTO_STATIC=force keeps static int8 whenever it is within max_drop.
 * Then the session is built and checked once more on the eval data. */
typedef struct kiln_compile_result {
    kiln_session *session;        /* the compiled session (owned; NULL after an error) */
    kiln_precision precision;     /* the session's precision (auto: the lowest tried) */
    int64_t batch;                /* rows per measuring run */
    kiln_compile_node *nodes;     /* [n_nodes] (owned) */
    int n_nodes;
    int metric_index;             /* the output the metric is computed on */
    kiln_compile_run base_eval;   /* fp32 outputs on the eval data (n = 0 without it) */
    kiln_compile_run cand_eval;   /* the session's outputs on the eval data */
    int64_t cal_samples, eval_samples;
    int has_quality;              /* there was eval data to check on */
    kiln_eval_quality q;          /* of the metric output, when has_quality */
    int passed;                   /* has_quality and q.drop <= max_drop */
    int n_int8, n_bf16, n_fp32;   /* nodes by the precision they run in */
    int n_fell_back;
    char summary[1024];           /* one line for logs: precision, drop, fallbacks */
    int64_t static_weight_bytes;  /* static int8: the bytes of the constants the quantized
                                     graph's nodes read (s8 weights 1 byte each, int32
                                     biases, scales); 0 otherwise */
    int auto_static;              /* auto chose static int8 (MinMax on the calibration data,
                                     of the whole model or with auto_static_kept nodes in fp32:
                                     within max_drop and faster than the per-node mix) */
    double auto_static_drop;      /* static int8 of the whole model: its drop (-1: not tried
                                     or not built) */
    double auto_ms[2];            /* evaluation-data time of the mix and of static int8 */
    int auto_static_kept;         /* convolutions and products kept in fp32 (the most
                                     sensitive) in the first static int8 candidate within the
                                     bound (-1: none was); with auto_static the nodes say what
                                     runs, the kept ones fell back */
    double auto_static_kept_drop; /* the drop with those kept */
    int auto_mix_fell_back;       /* auto_static: nodes that fell back in the mix it beat */
} kiln_compile_result;
/* Compile signature `sig` (NULL: the default) of m under o, measuring node
 * sensitivity on cal and accuracy on eval (either may be NULL; the other is
 * used for both; with neither, nothing is measured and auto compiles fp32).
 * KILN_OK means the pipeline ran: whether the drop is within the bound is
 * r->passed. On error r is freed and err says why. */
KILN_API kiln_status kiln_compile(kiln_model *m, const char *sig, const kiln_compile_options *o,
                         const kiln_dataset *cal, const kiln_dataset *eval,
                         kiln_compile_result *r, char *err);
KILN_API void kiln_compile_result_free(kiln_compile_result *r);
/* The CPU features of this machine that Kiln's kernels use, comma-separated
 * ("avx2,fma,avx512f,..."; static storage): part of a compiled artifact's
 * cache key, since a .kiln needs the features it was compiled for. */
KILN_API const char *kiln_cpu_features(void);

#ifdef __cplusplus
}
#endif
#endif
