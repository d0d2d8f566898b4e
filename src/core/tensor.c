/*
 * tensor.c - tensor allocation and shape utilities.
 */
#include "core/tensor.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"

int64_t kiln_shape_count(int rank, const int64_t *dims)
{
    /* the product of the nonzero dims is bounded too, so that no product of
     * any of a tensor's dims (strides, row counts) overflows, even for a
     * tensor with no elements */
    int64_t n = 1;
    bool empty = false;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0) return -1;
        if (dims[i] == 0) empty = true;
        else if (n > KILN_TENSOR_MAX_BYTES / dims[i]) return -1;
        else n *= dims[i];
    }
    return empty ? 0 : n;
}

static kiln_status tensor_alloc_z(kiln_dtype dt, int rank, const int64_t *dims, bool zero,
                                  kiln_tensor **out)
{
    if ((unsigned)dt >= KILN_DTYPE_COUNT || dt == KILN_DTYPE_UNDEFINED)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "tensor dtype %d is not valid", (int)dt);
    if (rank < 0 || rank > KILN_MAX_RANK)
        return kiln_error(KILN_ERR_UNSUPPORTED, "tensor rank %d exceeds Kiln's maximum of %d",
                          rank, KILN_MAX_RANK);
    int64_t n = kiln_shape_count(rank, dims);
    char buf[160];
    if (n < 0)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "tensor shape %s is negative or too large",
                          kiln_shape_str(rank, dims, buf, sizeof buf));
    size_t es = kiln_dtype_size(dt);
    if ((int64_t)es * n > KILN_TENSOR_MAX_BYTES)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "tensor %s of %s would exceed %lld bytes",
                          kiln_shape_str(rank, dims, buf, sizeof buf), kiln_dtype_name(dt),
                          (long long)KILN_TENSOR_MAX_BYTES);
    kiln_tensor *t = calloc(1, sizeof *t);
    if (!t) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory allocating a tensor");
    t->dtype = dt;
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
    t->nbytes = es * (size_t)n;
    /* never a zero-size malloc: keep data non-NULL and aligned */
    size_t padded = (t->nbytes + 63) & ~(size_t)63;
    t->data = aligned_alloc(64, padded ? padded : 64);
    if (!t->data) {
        free(t);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory allocating %zu bytes",
                          (size_t)es * n);
    }
    /* strings must start as empty (NULL) entries whatever the caller asks */
    if (zero || dt == KILN_DTYPE_STRING) memset(t->data, 0, t->nbytes);
    t->owns_data = 1;
    *out = t;
    return KILN_OK;
}

static kiln_status tensor_alloc(kiln_dtype dt, int rank, const int64_t *dims, kiln_tensor **out)
{
    return tensor_alloc_z(dt, rank, dims, true, out);
}

kiln_status kiln_tensor_new(kiln_dtype dt, int rank, const int64_t *dims, kiln_tensor **out)
{
    return tensor_alloc(dt, rank, dims, out);
}

kiln_status kiln_tensor_new_uninit(kiln_dtype dt, int rank, const int64_t *dims, kiln_tensor **out)
{
    return tensor_alloc_z(dt, rank, dims, false, out);
}

kiln_status kiln_tensor_create(kiln_dtype dt, int rank, const int64_t *dims, kiln_tensor **out)
{
    if (!out || (rank > 0 && !dims))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_tensor_create: NULL argument");
    return tensor_alloc(dt, rank, dims, out);
}

kiln_status kiln_tensor_wrap(kiln_dtype dt, int rank, const int64_t *dims, void *data,
                             size_t nbytes, kiln_tensor **out)
{
    if (!out || (rank > 0 && !dims))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_tensor_wrap: NULL argument");
    if ((unsigned)dt >= KILN_DTYPE_COUNT || dt == KILN_DTYPE_UNDEFINED)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "tensor dtype %d is not valid", (int)dt);
    if (rank < 0 || rank > KILN_MAX_RANK)
        return kiln_error(KILN_ERR_UNSUPPORTED, "tensor rank %d exceeds Kiln's maximum of %d",
                          rank, KILN_MAX_RANK);
    int64_t n = kiln_shape_count(rank, dims);
    if (n < 0 || (uint64_t)n * kiln_dtype_size(dt) != nbytes) {
        char buf[160];
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "tensor %s of %s needs %lld bytes, %zu given",
                          kiln_shape_str(rank, dims, buf, sizeof buf), kiln_dtype_name(dt),
                          (long long)(n < 0 ? -1 : n * (int64_t)kiln_dtype_size(dt)), nbytes);
    }
    kiln_tensor *t = calloc(1, sizeof *t);
    if (!t) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory allocating a tensor");
    t->dtype = dt;
    t->rank = rank;
    for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
    t->data = data;
    t->nbytes = nbytes;
    t->owns_data = 0;
    *out = t;
    return KILN_OK;
}

/* Elements of one row (a slice along dimension 0) of t. */
static int64_t row_elems(const kiln_tensor *t)
{
    int64_t n = 1;
    for (int k = 1; k < t->rank; k++) n *= t->dims[k];
    return n;
}

kiln_status kiln_tensor_copy_rows(kiln_tensor *dst, int64_t dst_row, const kiln_tensor *src,
                                  int64_t src_row, int64_t count)
{
    if (!dst || !src || dst->dtype != src->dtype || kiln_dtype_is_container(src->dtype) ||
        dst->rank < 1 || src->rank < 1 || row_elems(dst) != row_elems(src) || count < 0 ||
        src_row < 0 || dst_row < 0 || src_row > src->dims[0] - count ||
        dst_row > dst->dims[0] - count)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "copy_rows: %lld rows from row %lld of a %s tensor with %lld rows to "
                          "row %lld of a %s tensor with %lld rows (rows must match in dtype, "
                          "size and range)",
                          (long long)count, (long long)src_row,
                          src ? kiln_dtype_name(src->dtype) : "missing",
                          src && src->rank > 0 ? (long long)src->dims[0] : 0LL,
                          (long long)dst_row, dst ? kiln_dtype_name(dst->dtype) : "missing",
                          dst && dst->rank > 0 ? (long long)dst->dims[0] : 0LL);
    int64_t re = row_elems(src);
    if (src->dtype == KILN_DTYPE_STRING) {
        const kiln_string *s = src->data;
        for (int64_t i = 0; i < count * re; i++) {
            const kiln_string *e = &s[src_row * re + i];
            kiln_status st = kiln_tensor_set_string(dst, (size_t)(dst_row * re + i), e->data, e->len);
            if (st != KILN_OK) return st;
        }
        return KILN_OK;
    }
    size_t rb = (size_t)re * kiln_dtype_size(src->dtype);
    if (count) memmove((char *)dst->data + (size_t)dst_row * rb,
                       (const char *)src->data + (size_t)src_row * rb, (size_t)count * rb);
    return KILN_OK;
}

kiln_status kiln_tensor_set_string(kiln_tensor *t, size_t i, const char *bytes, size_t len)
{
    if (!t || t->dtype != KILN_DTYPE_STRING || (int64_t)i >= kiln_tensor_count(t))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "kiln_tensor_set_string: not a string tensor or index %zu out of range",
                          i);
    kiln_string *s = &((kiln_string *)t->data)[i];
    char *copy = malloc(len + 1);
    if (!copy) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory copying a string");
    if (len) memcpy(copy, bytes, len);
    copy[len] = '\0';
    if (t->owns_data) free(s->data);
    s->data = copy;
    s->len = len;
    return KILN_OK;
}

int64_t kiln_tensor_count(const kiln_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

kiln_status kiln_tensor_container_create(kiln_dtype kind, int64_t n, kiln_tensor **out)
{
    if (!out || !kiln_dtype_is_container(kind))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "kiln_tensor_container_create: kind %d is not a sequence or optional",
                          (int)kind);
    int64_t max = kind == KILN_DTYPE_OPTIONAL ? 1 : KILN_SEQUENCE_MAX_ITEMS;
    if (n < 0 || n > max)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "a %s cannot hold %lld items (0 to %lld)",
                          kiln_dtype_name(kind), (long long)n, (long long)max);
    kiln_tensor *t = calloc(1, sizeof *t);
    kiln_tensor **items = calloc((size_t)(n ? n : 1), sizeof *items);
    if (!t || !items) {
        free(t);
        free(items);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory allocating a %s",
                          kiln_dtype_name(kind));
    }
    t->dtype = kind;
    t->rank = 1;
    t->dims[0] = n;
    t->data = items;
    t->nbytes = (size_t)n * sizeof *items;
    t->owns_data = 1;
    *out = t;
    return KILN_OK;
}

kiln_status kiln_tensor_set_item(kiln_tensor *t, int64_t i, kiln_tensor *item)
{
    if (!t || !kiln_dtype_is_container(t->dtype) || i < 0 || i >= t->dims[0] || !item) {
        kiln_tensor_free(item);
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "kiln_tensor_set_item: not a container, no item, or slot %lld out of "
                          "range", (long long)i);
    }
    if (item == t || (t->dtype == KILN_DTYPE_SEQUENCE && item->dtype == KILN_DTYPE_OPTIONAL)) {
        if (item != t) kiln_tensor_free(item);
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "kiln_tensor_set_item: a sequence cannot hold itself or an optional");
    }
    kiln_tensor **items = t->data;
    kiln_tensor_free(items[i]);
    items[i] = item;
    return KILN_OK;
}

const kiln_tensor *kiln_tensor_item(const kiln_tensor *t, int64_t i)
{
    if (!t || !kiln_dtype_is_container(t->dtype) || i < 0 || i >= t->dims[0]) return NULL;
    return ((kiln_tensor *const *)t->data)[i];
}

void kiln_tensor_free(kiln_tensor *t)
{
    if (!t) return;
    if (kiln_dtype_is_container(t->dtype)) {
        kiln_tensor **items = t->data;
        if (t->owns_data && items)
            for (int64_t i = 0; i < t->dims[0]; i++) kiln_tensor_free(items[i]);
        if (t->owns_data) free(items);
        free(t);
        return;
    }
    if (t->owns_data) {
        if (t->dtype == KILN_DTYPE_STRING && t->data) {
            int64_t n = kiln_tensor_count(t);
            kiln_string *s = t->data;
            for (int64_t i = 0; i < n; i++) free(s[i].data);
        }
        free(t->data);
    }
    free(t);
}

kiln_status kiln_tensor_new_like(const kiln_tensor *t, kiln_tensor **out)
{
    return tensor_alloc(t->dtype, t->rank, t->dims, out);
}

kiln_status kiln_tensor_clone(const kiln_tensor *t, kiln_tensor **out)
{
    kiln_tensor *c;
    if (kiln_dtype_is_container(t->dtype)) { /* deep: the clone owns copies of the items */
        kiln_status st = kiln_tensor_container_create(t->dtype, t->dims[0], &c);
        if (st != KILN_OK) return st;
        for (int64_t i = 0; i < t->dims[0]; i++) {
            const kiln_tensor *item = ((kiln_tensor *const *)t->data)[i];
            if (!item) continue;
            kiln_tensor *ic;
            if ((st = kiln_tensor_clone(item, &ic)) != KILN_OK ||
                (st = kiln_tensor_set_item(c, i, ic)) != KILN_OK) {
                kiln_tensor_free(c);
                return st;
            }
        }
        *out = c;
        return KILN_OK;
    }
    kiln_status st = tensor_alloc_z(t->dtype, t->rank, t->dims, false, &c);
    if (st != KILN_OK) return st;
    if (t->dtype == KILN_DTYPE_STRING) {
        int64_t n = kiln_tensor_count(t);
        const kiln_string *s = t->data;
        for (int64_t i = 0; i < n; i++) {
            st = kiln_tensor_set_string(c, (size_t)i, s[i].data ? s[i].data : "", s[i].len);
            if (st != KILN_OK) {
                kiln_tensor_free(c);
                return st;
            }
        }
    } else if (t->nbytes) {
        memcpy(c->data, t->data, t->nbytes);
    }
    *out = c;
    return KILN_OK;
}

kiln_status kiln_tensor_scalar_i64(kiln_dtype dt, int64_t v, kiln_tensor **out)
{
    kiln_status st = tensor_alloc(dt, 0, NULL, out);
    if (st == KILN_OK) kiln_set_i64(dt, (*out)->data, 0, v);
    return st;
}

/* s * d, or 0 where that overflows: only a tensor with a zero dimension
 * has dimensions whose product overflows (a stored tensor's element count
 * fits), and none of its strides is ever used. */
static int64_t stride_mul(int64_t s, int64_t d)
{
    int64_t r;
    return __builtin_mul_overflow(s, d, &r) ? 0 : r;
}

void kiln_shape_strides(int rank, const int64_t *dims, int64_t *strides)
{
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s = stride_mul(s, dims[i]);
    }
}

bool kiln_shape_broadcast(int ra, const int64_t *a, int rb, const int64_t *b, int *rout,
                          int64_t *out)
{
    int r = ra > rb ? ra : rb;
    if (r > KILN_MAX_RANK) return false;
    for (int i = 0; i < r; i++) {
        int64_t da = i < r - ra ? 1 : a[i - (r - ra)];
        int64_t db = i < r - rb ? 1 : b[i - (r - rb)];
        if (da == db || db == 1) out[i] = da;
        else if (da == 1) out[i] = db;
        else return false;
    }
    *rout = r;
    return true;
}

void kiln_broadcast_strides(int rin, const int64_t *din, int rout, const int64_t *dout,
                            int64_t *strides)
{
    int64_t s = 1;
    for (int i = rout - 1; i >= 0; i--) {
        int j = i - (rout - rin);
        if (j < 0 || din[j] == 1 || dout[i] == 0) {
            strides[i] = 0;
            if (j >= 0) s = stride_mul(s, din[j]);
        } else {
            strides[i] = s;
            s = stride_mul(s, din[j]);
        }
    }
}

const char *kiln_shape_str(int rank, const int64_t *dims, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "[");
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, k < n ? n - k : 0, i ? ",%lld" : "%lld",
                              (long long)dims[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

int64_t kiln_tensor_i64(const kiln_tensor *t, int64_t i)
{
    return kiln_get_i64(t->dtype, t->data, i);
}

double kiln_tensor_f64(const kiln_tensor *t, int64_t i)
{
    return kiln_get_f64(t->dtype, t->data, i);
}

/* Copy n consecutive elements src[si..] to dst[di..] (same dtype); strings are duplicated. */
kiln_status kiln_tensor_copy_elems(kiln_tensor *dst, int64_t di, const kiln_tensor *src,
                                   int64_t si, int64_t n)
{
    if (n <= 0) return KILN_OK;
    if (src->dtype != KILN_DTYPE_STRING) {
        size_t es = kiln_dtype_size(src->dtype);
        memmove((char *)dst->data + (size_t)di * es, (const char *)src->data + (size_t)si * es,
                (size_t)n * es);
        return KILN_OK;
    }
    const kiln_string *s = (const kiln_string *)src->data + si;
    for (int64_t k = 0; k < n; k++) {
        kiln_status st = kiln_tensor_set_string(dst, (size_t)(di + k), s[k].data, s[k].len);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

/* Set dst[di..di+n) to copies of the single element src[si]. */
kiln_status kiln_tensor_fill_elems(kiln_tensor *dst, int64_t di, int64_t n,
                                   const kiln_tensor *src, int64_t si)
{
    if (n <= 0) return KILN_OK;
    if (src->dtype == KILN_DTYPE_STRING) {
        const kiln_string *s = (const kiln_string *)src->data + si;
        for (int64_t k = 0; k < n; k++) {
            kiln_status st = kiln_tensor_set_string(dst, (size_t)(di + k), s->data, s->len);
            if (st != KILN_OK) return st;
        }
        return KILN_OK;
    }
    size_t es = kiln_dtype_size(src->dtype);
    const char *e = (const char *)src->data + (size_t)si * es;
    char *d = (char *)dst->data + (size_t)di * es;
    for (int64_t k = 0; k < n; k++) memcpy(d + (size_t)k * es, e, es);
    return KILN_OK;
}
