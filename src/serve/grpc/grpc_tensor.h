/*
 * grpc_tensor.h - Kiln tensors as TensorProto in gRPC responses, and TF's
 * DataType numbers and names.
 *
 * Responses are encoded as TF Serving encodes them (Tensor::AsProtoField):
 * numbers in the typed field of their dtype (float_val, int_val, half_val
 * for fp16 and bf16 bit patterns, ...), strings in string_val; or, with
 * tensor_content set, numeric tensors as raw little-endian bytes in
 * tensor_content (AsProtoTensorContent). Where a dtype's typed field has the
 * tensor's element layout (float, double, int32, int64, uint32, uint64) the
 * proto points into the tensor's data: no copy before packing.
 */
#ifndef KILN_SERVE_GRPC_TENSOR_H
#define KILN_SERVE_GRPC_TENSOR_H

#include <stddef.h>

#include "kiln/kiln.h"

#include "grpc_service.pb-c.h"

/* The map entries of named output tensors (borrowed tensors; the set owns
 * the entries and any converted arrays). */
typedef struct kiln_grpc_tensor_set {
    KilnGrpc__TensorEntry **entries;
    int n, cap;
    void **owned;           /* allocations to free */
    int n_owned, cap_owned;
} kiln_grpc_tensor_set;

void kiln_grpc_tensor_set_init(kiln_grpc_tensor_set *s);
/* Add name -> t; 0 when out of memory. t must outlive the set. */
int kiln_grpc_tensor_set_add(kiln_grpc_tensor_set *s, const char *name, const kiln_tensor *t,
                             int tensor_content);
void kiln_grpc_tensor_set_free(kiln_grpc_tensor_set *s);

/* TF DataType number of a Kiln dtype (0 = DT_INVALID when TF has none). */
int kiln_grpc_tf_dtype(kiln_dtype dt);
/* TF's short dtype name ("float", "int32", ...), as its messages print it. */
const char *kiln_grpc_tf_dtype_name(kiln_dtype dt);
/* "[2,3]" ("[?]" for a -1 dim, "<unknown>" for rank < 0). */
void kiln_grpc_shape_str(int rank, const int64_t *dims, char *buf, size_t cap);

#endif
