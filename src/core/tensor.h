/*
 * tensor.h - internal tensor helpers: checked element counts, allocation,
 * shape utilities shared by importers, the executor and kernels.
 */
#ifndef KILN_CORE_TENSOR_H
#define KILN_CORE_TENSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "kiln/kiln_util.h"

/* A sequence or optional (kiln.h): a tensor whose data is kiln_tensor pointers. */
static inline bool kiln_dtype_is_container(kiln_dtype dt)
{
    return dt == KILN_DTYPE_SEQUENCE || dt == KILN_DTYPE_OPTIONAL;
}
/* Most items a sequence may hold. */
#define KILN_SEQUENCE_MAX_ITEMS ((int64_t)1 << 24)

/* Largest tensor Kiln will allocate (bytes): a bound on what a model or
 * request can make us allocate. */
#define KILN_TENSOR_MAX_BYTES ((int64_t)1 << 36)

/* kiln_shape_count (include/kiln/kiln_util.h): the element count of
 * dims[0..rank), or -1 if a dim is negative or the product of the nonzero dims
 * exceeds KILN_TENSOR_MAX_BYTES. */

/* Allocate a tensor of the given shape with zeroed data (owned). */
kiln_status kiln_tensor_new(kiln_dtype dt, int rank, const int64_t *dims, kiln_tensor **out);
/* The same, without zeroing: for callers that overwrite every byte at once. */
kiln_status kiln_tensor_new_uninit(kiln_dtype dt, int rank, const int64_t *dims, kiln_tensor **out);
/* Allocate a tensor with the same dtype and shape as t (zeroed). */
kiln_status kiln_tensor_new_like(const kiln_tensor *t, kiln_tensor **out);
/* Deep copy. */
kiln_status kiln_tensor_clone(const kiln_tensor *t, kiln_tensor **out);
/* A scalar (rank 0) tensor. */
kiln_status kiln_tensor_scalar_i64(kiln_dtype dt, int64_t v, kiln_tensor **out);

/* Row-major strides (in elements) of a shape. */
void kiln_shape_strides(int rank, const int64_t *dims, int64_t *strides);
/* Numpy-style broadcast of two shapes; false if incompatible. */
bool kiln_shape_broadcast(int ra, const int64_t *a, int rb, const int64_t *b, int *rout,
                          int64_t *out);
/* Strides of `in` (rank rin) broadcast to rank rout: 0 where the input dim is 1 or missing. */
void kiln_broadcast_strides(int rin, const int64_t *din, int rout, const int64_t *dout,
                            int64_t *strides);
/* Format a shape as "[2,3,4]" into buf. */
const char *kiln_shape_str(int rank, const int64_t *dims, char *buf, size_t n);

/* Read element i of an integer tensor as int64 (any int dtype). */
int64_t kiln_tensor_i64(const kiln_tensor *t, int64_t i);
double kiln_tensor_f64(const kiln_tensor *t, int64_t i);

/* Copy n consecutive elements src[si..] to dst[di..] (same dtype; strings
 * duplicated; overlapping ranges of one tensor are fine for other dtypes). */
kiln_status kiln_tensor_copy_elems(kiln_tensor *dst, int64_t di, const kiln_tensor *src,
                                   int64_t si, int64_t n);
/* Set dst[di..di+n) to copies of the single element src[si]. */
kiln_status kiln_tensor_fill_elems(kiln_tensor *dst, int64_t di, int64_t n,
                                   const kiln_tensor *src, int64_t si);

#endif
