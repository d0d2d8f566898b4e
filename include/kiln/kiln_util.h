/*
 * kiln_util.h - the internal utilities libkiln exports for Kiln's own server
 * and command-line tool (src/serve, src/security, src/cli).
 *
 * libkiln.so is built with hidden visibility: it exports the public API of
 * kiln.h and, marked KILN_API here, the few runtime pieces that the server
 * and the `kiln` tool share with the runtime instead of copying them -- CPU
 * counting, CRC-32C, the protobuf wire guard and text-format parser, the
 * TensorFlow TensorProto converter, the NumPy .npy/.npz reader and writer,
 * and the profile and inspection extras of `kiln bench`, `kiln inspect` and
 * `kiln fingerprint`. Nothing else of the
 * runtime (src/core, src/ir, src/exec, src/kernels, src/opt, src/import,
 * src/api/internal.h) is visible to the server or the tool.
 *
 * This header is not installed and is not a stable API: the functions may
 * change with any release. The runtime's own headers include it, so each
 * function is declared once. tests/api/check_exports.py checks that the
 * library exports exactly the functions kiln.h and this header declare.
 */
#ifndef KILN_KILN_UTIL_H
#define KILN_KILN_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* protobuf-c's types (protobuf-c/protobuf-c.h) and the generated TensorProto
 * of saved_model.proto, by name only. */
struct ProtobufCMessage;
struct ProtobufCMessageDescriptor;
struct KilnSm__TensorProto;

/* ---- threads (src/core/threadpool.c) ---- */

/* CPUs the process may use: its affinity mask at start-up (not the calling
 * thread's, which OMP_PROC_BIND pins to one CPU), bounded by a cgroup quota. */
KILN_API int kiln_cpu_count(void);
/* Give the calling thread back every CPU of the process when OMP_PROC_BIND
 * has pinned it to one, so that threads it creates later (a server's request
 * threads) are not all confined to that CPU. Nothing to do otherwise. */
KILN_API void kiln_threads_unpin_caller(void);

/* ---- shapes (src/core/tensor.c) ---- */

/* Element count of dims[0..rank), or -1 if a dim is negative or the product
 * of the nonzero dims exceeds the largest tensor Kiln allocates (also for a
 * tensor with a zero dim, so that no product of its dims overflows). */
KILN_API int64_t kiln_shape_count(int rank, const int64_t *dims);

/* ---- CRC-32C (src/core/crc32c.c) ---- */

/* CRC-32C of data[0..n) appended to a message whose CRC-32C is crc. Uses the
 * SSE4.2 crc32 instruction when the CPU has it, tables otherwise. */
KILN_API uint32_t kiln_crc32c_extend(uint32_t crc, const void *data, size_t n);

/* CRC-32C of data[0..n). */
static inline uint32_t kiln_crc32c(const void *data, size_t n)
{
    return kiln_crc32c_extend(0, data, n);
}

/* The masked form TFRecord and LevelDB-style tables store. */
static inline uint32_t kiln_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static inline uint32_t kiln_crc32c_unmask(uint32_t masked)
{
    uint32_t rot = masked - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}

/* ---- protobuf (src/import/pbcheck.c, textproto.c, tf_lower.c) ---- */

/* A pre-parse guard for protobuf bytes: walks the wire format against the
 * message descriptors, iteratively bounded, and rejects malformed framing and
 * nesting deeper than max_depth with a message naming `what`. */
KILN_API kiln_status kiln_pb_check(const struct ProtobufCMessageDescriptor *desc,
                                   const uint8_t *data, size_t len, int max_depth,
                                   const char *what);

/*
 * Parse text[0..len) (not NUL-terminated; NUL bytes are an error) as a
 * message of type desc (protobuf text format). On success *out owns the
 * message: free it with protobuf_c_message_free_unpacked(*out, NULL). On
 * failure *out is NULL and the status is KILN_ERR_INVALID_MODEL for
 * malformed text, KILN_ERR_UNSUPPORTED for extensions and Any expansions,
 * KILN_ERR_OUT_OF_MEMORY for allocation failures and size limits
 * (src/import/textproto.h has the limits).
 */
KILN_API kiln_status kiln_textproto_parse(const struct ProtobufCMessageDescriptor *desc,
                                          const char *text, size_t len,
                                          struct ProtobufCMessage **out);

/* A TensorFlow TensorProto as a new tensor (owned by the caller): dtype,
 * shape, and the values from tensor_content, the typed fields or string_val,
 * a single value filling the shape as TensorFlow does. Errors name `what`. */
KILN_API kiln_status kiln_tf_tensor_from_proto(const struct KilnSm__TensorProto *tp,
                                               const char *what, kiln_tensor **out);

/* ---- NumPy .npy and .npz (src/core/npy.c, npz.c) ----
 *
 * The .npy reader and writer and the .npz reader that `kiln predict`,
 * `kiln gate`, `kiln compile`, kiln_dataset_read and the server share.
 *
 * Reading accepts .npy format versions 1.0, 2.0 and 3.0, C order only, with
 * these element types (either byte order; big-endian data is swapped):
 *
 *     .npy descr          Kiln dtype
 *     <f2 <f4 <f8         KILN_DTYPE_F16, F32, F64
 *     |i1 <i2 <i4 <i8     KILN_DTYPE_I8, I16, I32, I64
 *     |u1 <u2 <u4 <u8     KILN_DTYPE_U8, U16, U32, U64
 *     |b1                 KILN_DTYPE_BOOL (any nonzero byte reads as 1)
 *     |S<n>               KILN_DTYPE_STRING, bytes; trailing NULs dropped
 *     <U<n>               KILN_DTYPE_STRING, UTF-32 converted to UTF-8;
 *                         trailing NUL code points dropped
 *
 * as NumPy itself does for 'S' and 'U'. Files are untrusted: the header
 * length is capped, the header is parsed as the small Python literal NumPy
 * writes (no eval), shapes are checked for overflow, and the data must be
 * exactly as long as the shape says. Every error names the file and the
 * problem. Both parsers are fuzzed (fuzz/fuzz_npy.c, fuzz/fuzz_npz.c).
 *
 * Writing produces format 1.0 in host byte order. Strings are written as
 * |S<maxlen> (UTF-8 bytes; maxlen is at least 1); bfloat16, which NumPy
 * lacks, is widened losslessly to <f4.
 *
 * Errors: each kiln_npy_* function returns a kiln_status; when it is not
 * KILN_OK, kiln_npy_last_error() holds a one-line message (thread-local,
 * valid until the next failing kiln_npy_* call on the same thread).
 *
 * An .npz is a ZIP archive of .npy files. The reader walks the central
 * directory (ZIP64 included, which NumPy writes for every member), takes
 * each member's sizes and offset from it, and decodes stored (method 0) or
 * deflated (method 8, zlib) data, checking the CRC-32; each member is then
 * read by the .npy parser. Every offset and size is checked against the
 * buffer, the members and the inflated bytes are bounded
 * (KILN_NPZ_MAX_MEMBERS, KILN_NPZ_MAX_BYTES in all), and encrypted or
 * otherwise compressed members are errors. Every error names the archive
 * and the member. */

/* Header bytes accepted at most (NumPy writes far less for plain arrays). */
#define KILN_NPY_MAX_HEADER (1u << 20)

/* Read the .npy file at path into a new tensor, owned by the caller
 * (free with kiln_tensor_free). */
KILN_API kiln_status kiln_npy_read(const char *path, kiln_tensor **out);
/* The same from bytes in memory; `what` names them in messages (e.g. an
 * input name). The bytes are not retained. */
KILN_API kiln_status kiln_npy_parse(const void *data, size_t size, const char *what,
                                    kiln_tensor **out);
/* Write t to path as a .npy file, replacing any file there. On failure no
 * partial file is left behind. */
KILN_API kiln_status kiln_npy_write(const char *path, const kiln_tensor *t);
/* Encode t as .npy bytes in a new malloc'd buffer, owned by the caller
 * (release with free). */
KILN_API kiln_status kiln_npy_encode(const kiln_tensor *t, void **data_out, size_t *size_out);
/* The message for the last failing kiln_npy_* call on this thread. */
KILN_API const char *kiln_npy_last_error(void);

#define KILN_NPZ_MAX_MEMBERS 4096
#define KILN_NPZ_MAX_BYTES ((uint64_t)4 << 30) /* uncompressed bytes of all members */
#define KILN_NPZ_ERR_LEN 512

typedef struct kiln_npz {
    int n;
    char **names;           /* [n] member names without ".npy" (owned) */
    kiln_tensor **tensors;  /* [n] (owned) */
} kiln_npz;
/* Parse an archive's bytes (what names it in messages). On success *out
 * owns everything (kiln_npz_free); err: KILN_NPZ_ERR_LEN bytes. */
KILN_API kiln_status kiln_npz_parse(const uint8_t *data, size_t size, const char *what,
                                    kiln_npz **out, char *err);
/* Read and parse the archive at path. */
KILN_API kiln_status kiln_npz_read(const char *path, kiln_npz **out, char *err);
KILN_API void kiln_npz_free(kiln_npz *z);

/* ---- `kiln bench`, `kiln inspect`, `kiln fingerprint` (src/api, src/exec) ---- */

/* Profiling of every plan (KILN_PROFILE=1 in the environment turns it on too):
 * each plan accumulates the time of every step. */
KILN_API void kiln_plan_profile_enable(int on);
/* Per-op time of the session's cached plans (profiling must have been
 * enabled with kiln_plan_profile_enable before the runs). */
KILN_API void kiln_session_profile_print(kiln_session *s, FILE *f);
/* The share of the profiled run time spent on reference code: 1 on the
 * reference executor, -1 when nothing was profiled. */
KILN_API double kiln_session_reference_share(kiln_session *s);
/* One line about the session's plans: count, steps, fast kernels, arena bytes. */
KILN_API void kiln_session_plan_summary(kiln_session *s, char *buf, size_t n);
/* Stream the canonical form of the model's imported graph and weights
 * (api/fingerprint.c) to write(ctx, bytes, n): names and file encoding do
 * not enter it. `kiln fingerprint` hashes it. */
KILN_API kiln_status kiln_model_canonical_write(const kiln_model *m,
                                                void (*write)(void *ctx, const void *p, size_t n),
                                                void *ctx);
/* The constants (initializers, folded constants) of the model's root graph
 * (for a .kiln file the graph it stores, after optimization; for a SavedModel
 * its constants and variables as imported), in the order the graph's nodes,
 * in topological order, first read them, then those no node reads in the
 * order the graph holds them. kiln_model_constant returns the i-th
 * (0 <= i < count; NULL past the end) and its name ("" if none) in *name; both
 * stay owned by m. `kiln watermark verify` reads a loaded model's weights
 * through these. */
KILN_API int kiln_model_constant_count(const kiln_model *m);
KILN_API const kiln_tensor *kiln_model_constant(const kiln_model *m, int i, const char **name);
/* For a .kiln model, write what `kiln inspect` shows of the file (format and
 * Kiln versions, precision, CPU features, batch sizes, section sizes, the
 * precision of every node and the stored report) to f; 0 for another model. */
KILN_API int kiln_model_artifact_print(const kiln_model *m, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
