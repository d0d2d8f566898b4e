/*
 * npy.h - NumPy .npy files as Kiln tensors, for the CLI, the server and
 * tests.
 *
 * Reading accepts format versions 1.0, 2.0 and 3.0, C order only, with
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
 * problem.
 *
 * Writing produces format 1.0 in host byte order. Strings are written as
 * |S<maxlen> (UTF-8 bytes; maxlen is at least 1); bfloat16, which NumPy
 * lacks, is widened losslessly to <f4.
 *
 * Errors: each function returns a kiln_status; when it is not KILN_OK,
 * kiln_npy_last_error() holds a one-line message (thread-local, valid until
 * the next failing kiln_npy_* call on the same thread).
 */
#ifndef KILN_CLI_NPY_H
#define KILN_CLI_NPY_H

#include <stddef.h>

#include "kiln/kiln.h"

/* Header bytes accepted at most (NumPy writes far less for plain arrays). */
#define KILN_NPY_MAX_HEADER (1u << 20)

/* Read the .npy file at path into a new tensor, owned by the caller
 * (free with kiln_tensor_free). */
kiln_status kiln_npy_read(const char *path, kiln_tensor **out);

/* The same from bytes in memory; `what` names them in messages (e.g. an
 * input name). The bytes are not retained. */
kiln_status kiln_npy_parse(const void *data, size_t size, const char *what, kiln_tensor **out);

/* Write t to path as a .npy file, replacing any file there. On failure no
 * partial file is left behind. */
kiln_status kiln_npy_write(const char *path, const kiln_tensor *t);

/* Encode t as .npy bytes in a new malloc'd buffer, owned by the caller
 * (release with free). */
kiln_status kiln_npy_encode(const kiln_tensor *t, void **data_out, size_t *size_out);

/* The message for the last failing kiln_npy_* call on this thread. */
const char *kiln_npy_last_error(void);

#endif
