/*
 * grpc_tensor.c - Kiln tensors -> TensorProto map entries for gRPC
 * responses (see grpc_tensor.h), and TF's DataType numbers and names.
 */
#include "serve/grpc/grpc_tensor.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    kiln_dtype dt;
    int tf;
    const char *name;
} dtypes[] = {
    {KILN_DTYPE_F32, 1, "float"},     {KILN_DTYPE_F64, 2, "double"},   {KILN_DTYPE_I32, 3, "int32"},
    {KILN_DTYPE_U8, 4, "uint8"},      {KILN_DTYPE_I16, 5, "int16"},    {KILN_DTYPE_I8, 6, "int8"},
    {KILN_DTYPE_STRING, 7, "string"}, {KILN_DTYPE_I64, 9, "int64"},    {KILN_DTYPE_BOOL, 10, "bool"},
    {KILN_DTYPE_BF16, 14, "bfloat16"}, {KILN_DTYPE_U16, 17, "uint16"}, {KILN_DTYPE_F16, 19, "half"},
    {KILN_DTYPE_U32, 22, "uint32"},   {KILN_DTYPE_U64, 23, "uint64"},
    {KILN_DTYPE_F8E5M2, 24, "float8_e5m2"}, {KILN_DTYPE_F8E4M3FN, 25, "float8_e4m3fn"},
    {KILN_DTYPE_I4, 29, "int4"},      {KILN_DTYPE_U4, 30, "uint4"},
};

int kiln_grpc_tf_dtype(kiln_dtype dt)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == dt) return dtypes[i].tf;
    return 0;
}

const char *kiln_grpc_tf_dtype_name(kiln_dtype dt)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == dt) return dtypes[i].name;
    return kiln_dtype_name(dt);
}

void kiln_grpc_shape_str(int rank, const int64_t *dims, char *buf, size_t cap)
{
    if (rank < 0) {
        snprintf(buf, cap, "<unknown>");
        return;
    }
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int d = 0; d < rank && o < cap; d++) {
        if (dims[d] < 0) o += (size_t)snprintf(buf + o, cap - o, "%s?", d ? "," : "");
        else o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? "," : "", (long long)dims[d]);
    }
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

void kiln_grpc_tensor_set_init(kiln_grpc_tensor_set *s)
{
    memset(s, 0, sizeof *s);
}

/* Keep p for kiln_grpc_tensor_set_free; frees p and returns NULL when out of memory. */
static void *own(kiln_grpc_tensor_set *s, void *p)
{
    if (!p) return NULL;
    if (s->n_owned == s->cap_owned) {
        int cap = s->cap_owned ? s->cap_owned * 2 : 16;
        void **a = realloc(s->owned, (size_t)cap * sizeof *a);
        if (!a) {
            free(p);
            return NULL;
        }
        s->owned = a;
        s->cap_owned = cap;
    }
    s->owned[s->n_owned++] = p;
    return p;
}

/* One TensorEntry with its proto, shape and dims in a single allocation. */
typedef struct entry_block {
    KilnGrpc__TensorEntry e;
    KilnSm__TensorProto tp;
    KilnSm__TensorShapeProto sh;
    KilnSm__TensorShapeProto__Dim d[KILN_MAX_RANK];
    KilnSm__TensorShapeProto__Dim *dp[KILN_MAX_RANK];
} entry_block;

int kiln_grpc_tensor_set_add(kiln_grpc_tensor_set *s, const char *name, const kiln_tensor *t,
                             int tensor_content)
{
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        KilnGrpc__TensorEntry **a = realloc(s->entries, (size_t)cap * sizeof *a);
        if (!a) return 0;
        s->entries = a;
        s->cap = cap;
    }
    entry_block *b = own(s, calloc(1, sizeof *b));
    if (!b) return 0;
    kiln_grpc__tensor_entry__init(&b->e);
    kiln_sm__tensor_proto__init(&b->tp);
    kiln_sm__tensor_shape_proto__init(&b->sh);
    b->e.key = (char *)name;
    b->e.value = &b->tp;
    KilnSm__TensorProto *tp = &b->tp;
    tp->has_dtype = 1;
    tp->dtype = (KilnSm__DataType)kiln_grpc_tf_dtype(t->dtype);
    tp->tensor_shape = &b->sh;
    for (int d = 0; d < t->rank && d < KILN_MAX_RANK; d++) {
        kiln_sm__tensor_shape_proto__dim__init(&b->d[d]);
        b->d[d].has_size = 1;
        b->d[d].size = t->dims[d];
        b->dp[d] = &b->d[d];
    }
    b->sh.n_dim = (size_t)(t->rank > 0 ? t->rank : 0);
    b->sh.dim = b->dp;
    s->entries[s->n++] = &b->e;
    size_t n = (size_t)kiln_tensor_count(t);
    if (n == 0) return 1;
    const void *data = t->data;
    size_t bytes = n * kiln_dtype_size(t->dtype);
    if (t->dtype == KILN_DTYPE_STRING) {
        ProtobufCBinaryData *sv = own(s, calloc(n, sizeof *sv));
        if (!sv) return 0;
        const kiln_string *str = data;
        for (size_t i = 0; i < n; i++) {
            sv[i].data = (uint8_t *)(str[i].data ? str[i].data : "");
            sv[i].len = str[i].len;
        }
        tp->n_string_val = n;
        tp->string_val = sv;
        return 1;
    }
    int typed = !tensor_content;
    switch (typed ? t->dtype : KILN_DTYPE_UNDEFINED) {
    case KILN_DTYPE_F32: tp->n_float_val = n; tp->float_val = (float *)data; return 1;
    case KILN_DTYPE_F64: tp->n_double_val = n; tp->double_val = (double *)data; return 1;
    case KILN_DTYPE_I32: tp->n_int_val = n; tp->int_val = (int32_t *)data; return 1;
    case KILN_DTYPE_I64: tp->n_int64_val = n; tp->int64_val = (int64_t *)data; return 1;
    case KILN_DTYPE_U32: tp->n_uint32_val = n; tp->uint32_val = (uint32_t *)data; return 1;
    case KILN_DTYPE_U64: tp->n_uint64_val = n; tp->uint64_val = (uint64_t *)data; return 1;
    case KILN_DTYPE_I8: case KILN_DTYPE_U8: case KILN_DTYPE_I16: case KILN_DTYPE_U16:
    case KILN_DTYPE_F16: case KILN_DTYPE_BF16: {
        int32_t *v = own(s, malloc(n * sizeof *v));
        if (!v) return 0;
        for (size_t i = 0; i < n; i++) {
            switch (t->dtype) {
            case KILN_DTYPE_I8: v[i] = ((const int8_t *)data)[i]; break;
            case KILN_DTYPE_U8: v[i] = ((const uint8_t *)data)[i]; break;
            case KILN_DTYPE_I16: v[i] = ((const int16_t *)data)[i]; break;
            default: v[i] = ((const uint16_t *)data)[i]; break; /* u16, half and bf16 bits */
            }
        }
        if (t->dtype == KILN_DTYPE_F16 || t->dtype == KILN_DTYPE_BF16) {
            tp->n_half_val = n;
            tp->half_val = v;
        } else {
            tp->n_int_val = n;
            tp->int_val = v;
        }
        return 1;
    }
    case KILN_DTYPE_BOOL: {
        protobuf_c_boolean *v = own(s, malloc(n * sizeof *v));
        if (!v) return 0;
        for (size_t i = 0; i < n; i++) v[i] = ((const uint8_t *)data)[i] != 0;
        tp->n_bool_val = n;
        tp->bool_val = v;
        return 1;
    }
    default: /* tensor_content: raw bytes, row-major, little-endian */
        tp->has_tensor_content = 1;
        tp->tensor_content.data = (uint8_t *)data;
        tp->tensor_content.len = bytes;
        return 1;
    }
}

void kiln_grpc_tensor_set_free(kiln_grpc_tensor_set *s)
{
    for (int i = 0; i < s->n_owned; i++) free(s->owned[i]);
    free(s->owned);
    free(s->entries);
    memset(s, 0, sizeof *s);
}
