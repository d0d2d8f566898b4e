/*
 * codec.c - TF Serving predict and KServe v2 infer bodies (codec.h), on top
 * of the tokenizer and tensor filling in json.c. Messages follow TF
 * Serving's where clients may match on them (json_tensor.cc), with the
 * input's name added.
 */
#include "serve/codec.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *kiln_kserve_datatype(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_BOOL: return "BOOL";
    case KILN_DTYPE_U8: return "UINT8";
    case KILN_DTYPE_U16: return "UINT16";
    case KILN_DTYPE_U32: return "UINT32";
    case KILN_DTYPE_U64: return "UINT64";
    case KILN_DTYPE_I8: return "INT8";
    case KILN_DTYPE_I16: return "INT16";
    case KILN_DTYPE_I32: return "INT32";
    case KILN_DTYPE_I64: return "INT64";
    case KILN_DTYPE_F16: return "FP16";
    case KILN_DTYPE_BF16: return "BF16";
    case KILN_DTYPE_F32: return "FP32";
    case KILN_DTYPE_F64: return "FP64";
    case KILN_DTYPE_STRING: return "BYTES";
    default: return "UNKNOWN";
    }
}

const char *kiln_tf_dtype_enum(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_F32: return "DT_FLOAT";
    case KILN_DTYPE_F64: return "DT_DOUBLE";
    case KILN_DTYPE_F16: return "DT_HALF";
    case KILN_DTYPE_BF16: return "DT_BFLOAT16";
    case KILN_DTYPE_I8: return "DT_INT8";
    case KILN_DTYPE_U8: return "DT_UINT8";
    case KILN_DTYPE_I16: return "DT_INT16";
    case KILN_DTYPE_U16: return "DT_UINT16";
    case KILN_DTYPE_I32: return "DT_INT32";
    case KILN_DTYPE_U32: return "DT_UINT32";
    case KILN_DTYPE_I64: return "DT_INT64";
    case KILN_DTYPE_U64: return "DT_UINT64";
    case KILN_DTYPE_BOOL: return "DT_BOOL";
    case KILN_DTYPE_STRING: return "DT_STRING";
    case KILN_DTYPE_SEQUENCE: /* as TF's TensorList; answered as NAME/i tensors (containers.h) */
    case KILN_DTYPE_OPTIONAL: return "DT_VARIANT";
    default: return "DT_INVALID";
    }
}

static int fail(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, KILN_JSON_ERR_LEN, fmt, ap);
    va_end(ap);
    return KILN_ERR_INVALID_ARGUMENT;
}

/* The signature dtype to decode into (unknown dtypes decode as float). */
static kiln_dtype spec_dtype(const kiln_value_info *s)
{
    return s->dtype == KILN_DTYPE_UNDEFINED ? KILN_DTYPE_F32 : s->dtype;
}

static void shape_str(char *buf, size_t cap, int rank, const int64_t *dims)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, i ? "," : "", dims[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Check a decoded tensor's rank and fixed dims against its spec. */
static kiln_status check_shape(const kiln_value_info *s, const kiln_tensor *t, char *err)
{
    if (s->rank < 0) return KILN_OK;
    int ok = s->rank == t->rank;
    for (int i = 0; ok && i < t->rank; i++)
        if (s->dims[i] >= 0 && s->dims[i] != t->dims[i]) ok = 0;
    if (ok) return KILN_OK;
    char want[160], got[160];
    shape_str(want, sizeof want, s->rank, s->dims);
    shape_str(got, sizeof got, t->rank, t->dims);
    return (kiln_status)fail(err, "input '%s': expected shape %s (-1 = any), got %s", s->name, want,
                             got);
}

static int find_spec(const kiln_json_doc *d, int key, const kiln_value_info *specs, int n)
{
    for (int i = 0; i < n; i++)
        if (kiln_json_string_eq(d, key, specs[i].name)) return i;
    return -1;
}

/* "{a,b,c}" for messages. */
static void spec_set(char *buf, size_t cap, const kiln_value_info *specs, int n)
{
    size_t o = (size_t)snprintf(buf, cap, "{");
    for (int i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? "," : "", specs[i].name);
    if (o < cap) snprintf(buf + o, cap - o, "}");
}

static kiln_status unknown_key(const kiln_json_doc *d, int key, const kiln_value_info *specs, int n,
                               char *err)
{
    size_t len;
    char *k = kiln_json_string_dup(d, key, &len);
    char set[256];
    spec_set(set, sizeof set, specs, n);
    fail(err, "input tensor alias not found in signature: %.100s. Inputs expected to be in the set %s.",
         k ? k : "?", set);
    free(k);
    return KILN_ERR_INVALID_ARGUMENT;
}

kiln_status kiln_predict_parse(const kiln_json_doc *d, kiln_predict_request *r, char *err)
{
    if (d->tok[0].type != KILN_JSON_OBJECT) return (kiln_status)fail(err, "Is not object");
    int inst = kiln_json_object_get(d, 0, "instances");
    int inp = kiln_json_object_get(d, 0, "inputs");
    if (inst >= 0 && inp >= 0)
        return (kiln_status)fail(
            err, "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist");
    if (inst < 0 && inp < 0) return (kiln_status)fail(err, "Missing 'inputs' or 'instances' key");
    r->columnar = inp >= 0;
    r->value = inp >= 0 ? inp : inst;
    r->signature = kiln_json_object_get(d, 0, "signature_name");
    if (r->signature >= 0 && d->tok[r->signature].type != KILN_JSON_STRING)
        return (kiln_status)fail(err, "'signature_name' must be a string");
    if (!r->columnar) {
        if (d->tok[inst].type != KILN_JSON_ARRAY)
            return (kiln_status)fail(err, "Expecting 'instances' to be an list/array");
        if (d->tok[inst].size == 0) return (kiln_status)fail(err, "No values in 'instances' array");
    }
    return KILN_OK;
}

static int is_named_object(const kiln_json_doc *d, int t)
{
    return d->tok[t].type == KILN_JSON_OBJECT && kiln_json_b64_member(d, t) < 0;
}

static void free_all(kiln_tensor **out, int n)
{
    for (int i = 0; i < n; i++) {
        kiln_tensor_free(out[i]);
        out[i] = NULL;
    }
}

/* Row format: one tensor per input, stacked from the instances. */
static kiln_status decode_rows(const kiln_json_doc *d, int inst, const kiln_value_info *specs,
                               int n, kiln_tensor **out, char *err)
{
    uint32_t rows = d->tok[inst].size;
    int *roots = malloc((size_t)rows * sizeof *roots);
    if (!roots) {
        snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    int first = inst + 1;
    kiln_status st = KILN_OK;
    if (!is_named_object(d, first)) {
        if (n != 1) {
            st = (kiln_status)fail(err, "instances is a plain list, but expecting list of objects "
                                        "as multiple input tensors required as per tensorinfo_map");
            goto out;
        }
        int k = first;
        for (uint32_t r = 0; r < rows; r++, k = (int)d->tok[k].next) roots[r] = k;
        st = kiln_json_fill_tensor(d, roots, (int)rows, 1, spec_dtype(&specs[0]), specs[0].name,
                                   &out[0], err);
        if (st == KILN_OK) st = check_shape(&specs[0], out[0], err);
        goto out;
    }
    /* every instance is an object naming each input once */
    int k = first;
    for (uint32_t r = 0; r < rows; r++, k = (int)d->tok[k].next) {
        if (!is_named_object(d, k)) {
            st = (kiln_status)fail(err, "Expecting object but got list at item %u of input list", r);
            goto out;
        }
        int key = k + 1;
        for (uint32_t m = 0; m < d->tok[k].size; m++) {
            if (find_spec(d, key, specs, n) < 0) {
                st = unknown_key(d, key, specs, n, err);
                goto out;
            }
            key = (int)d->tok[d->tok[key].next].next;
        }
    }
    for (int i = 0; i < n; i++) {
        k = first;
        for (uint32_t r = 0; r < rows; r++, k = (int)d->tok[k].next) {
            roots[r] = kiln_json_object_get(d, k, specs[i].name);
            if (roots[r] < 0) {
                st = (kiln_status)fail(err, "instances[%u] is missing input '%s'", r, specs[i].name);
                goto out;
            }
        }
        st = kiln_json_fill_tensor(d, roots, (int)rows, 1, spec_dtype(&specs[i]), specs[i].name,
                                   &out[i], err);
        if (st == KILN_OK) st = check_shape(&specs[i], out[i], err);
        if (st != KILN_OK) goto out;
    }
out:
    free(roots);
    return st;
}

kiln_status kiln_predict_decode(const kiln_json_doc *d, const kiln_predict_request *r,
                                const kiln_value_info *specs, int n, kiln_tensor **out, char *err)
{
    for (int i = 0; i < n; i++) out[i] = NULL;
    kiln_status st;
    if (!r->columnar) {
        st = decode_rows(d, r->value, specs, n, out, err);
    } else if (!is_named_object(d, r->value)) {
        if (n != 1) {
            st = (kiln_status)fail(err, "inputs is a plain value, but expecting an object as "
                                        "multiple input tensors required as per tensorinfo_map");
        } else {
            st = kiln_json_fill_tensor(d, &r->value, 1, 0, spec_dtype(&specs[0]), specs[0].name,
                                       &out[0], err);
            if (st == KILN_OK) st = check_shape(&specs[0], out[0], err);
        }
    } else {
        st = KILN_OK;
        int key = r->value + 1;
        for (uint32_t m = 0; m < d->tok[r->value].size && st == KILN_OK; m++) {
            if (find_spec(d, key, specs, n) < 0) st = unknown_key(d, key, specs, n, err);
            key = (int)d->tok[d->tok[key].next].next;
        }
        for (int i = 0; i < n && st == KILN_OK; i++) {
            int v = kiln_json_object_get(d, r->value, specs[i].name);
            if (v < 0) {
                st = (kiln_status)fail(err, "Missing input '%s' in 'inputs'", specs[i].name);
                break;
            }
            st = kiln_json_fill_tensor(d, &v, 1, 0, spec_dtype(&specs[i]), specs[i].name, &out[i],
                                       err);
            if (st == KILN_OK) st = check_shape(&specs[i], out[i], err);
        }
    }
    if (st != KILN_OK) free_all(out, n);
    return st;
}

static int is_bytes_output(const char *name, const kiln_tensor *t)
{
    size_t n = strlen(name);
    return t->dtype == KILN_DTYPE_STRING && n >= 6 && strcmp(name + n - 6, "_bytes") == 0;
}

kiln_status kiln_predict_encode(kiln_sbuf *b, int columnar, int n, const char *const *names,
                                const kiln_tensor *const *t, char *err)
{
    if (columnar) {
        kiln_sbuf_puts(b, "{\n    \"outputs\": ");
        if (n == 1) {
            kiln_json_write_tensor(b, t[0], -1, is_bytes_output(names[0], t[0]), 0);
        } else {
            kiln_sbuf_puts(b, "{\n");
            for (int i = 0; i < n; i++) {
                kiln_sbuf_puts(b, "        ");
                kiln_sbuf_json_string(b, names[i], strlen(names[i]));
                kiln_sbuf_puts(b, ": ");
                kiln_json_write_tensor(b, t[i], -1, is_bytes_output(names[i], t[i]), 0);
                kiln_sbuf_puts(b, i + 1 < n ? ",\n" : "\n");
            }
            kiln_sbuf_puts(b, "    }");
        }
        kiln_sbuf_puts(b, "\n}\n");
        return KILN_OK;
    }
    int64_t batch = -1;
    for (int i = 0; i < n; i++) {
        if (t[i]->rank == 0)
            return (kiln_status)fail(err, "Tensor name: %s has no shape information", names[i]);
        if (batch < 0) batch = t[i]->dims[0];
        else if (t[i]->dims[0] != batch)
            return (kiln_status)fail(err,
                                     "Tensor name: %s has inconsistent batch size: %" PRId64
                                     " expecting: %" PRId64,
                                     names[i], t[i]->dims[0], batch);
    }
    kiln_sbuf_puts(b, "{\n    \"predictions\": [");
    for (int64_t r = 0; r < batch; r++) {
        if (r) kiln_sbuf_puts(b, ", ");
        if (n == 1) {
            kiln_json_write_tensor(b, t[0], r, is_bytes_output(names[0], t[0]), 0);
            continue;
        }
        kiln_sbuf_puts(b, "{");
        for (int i = 0; i < n; i++) {
            if (i) kiln_sbuf_puts(b, ", ");
            kiln_sbuf_json_string(b, names[i], strlen(names[i]));
            kiln_sbuf_puts(b, ": ");
            kiln_json_write_tensor(b, t[i], r, is_bytes_output(names[i], t[i]), 0);
        }
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "]\n}\n");
    return KILN_OK;
}

kiln_status kiln_infer_decode(const kiln_json_doc *d, const kiln_value_info *specs, int n,
                              kiln_tensor **out, char *err)
{
    for (int i = 0; i < n; i++) out[i] = NULL;
    kiln_status st = KILN_OK;
    if (d->tok[0].type != KILN_JSON_OBJECT) return (kiln_status)fail(err, "Is not object");
    int inputs = kiln_json_object_get(d, 0, "inputs");
    if (inputs < 0 || d->tok[inputs].type != KILN_JSON_ARRAY)
        return (kiln_status)fail(err, "expected an 'inputs' array in the inference request");
    int e = inputs + 1;
    for (uint32_t k = 0; k < d->tok[inputs].size; k++, e = (int)d->tok[e].next) {
        if (d->tok[e].type != KILN_JSON_OBJECT) {
            st = (kiln_status)fail(err, "inputs[%u] is not an object", k);
            break;
        }
        int name = kiln_json_object_get(d, e, "name");
        int shape = kiln_json_object_get(d, e, "shape");
        int dtype = kiln_json_object_get(d, e, "datatype");
        int data = kiln_json_object_get(d, e, "data");
        if (name < 0 || d->tok[name].type != KILN_JSON_STRING || shape < 0 ||
            d->tok[shape].type != KILN_JSON_ARRAY || dtype < 0 ||
            d->tok[dtype].type != KILN_JSON_STRING || data < 0) {
            st = (kiln_status)fail(err, "inputs[%u] needs 'name', 'shape', 'datatype' and 'data'",
                                   k);
            break;
        }
        int i = find_spec(d, name, specs, n);
        if (i < 0) {
            st = unknown_key(d, name, specs, n, err);
            break;
        }
        if (out[i]) {
            st = (kiln_status)fail(err, "input '%s' is given twice", specs[i].name);
            break;
        }
        const char *want = kiln_kserve_datatype(spec_dtype(&specs[i]));
        if (!kiln_json_string_eq(d, dtype, want)) {
            st = (kiln_status)fail(err, "input '%s': datatype %.*s does not match the model's %s",
                                   specs[i].name, (int)(d->tok[dtype].len > 32 ? 32 : d->tok[dtype].len),
                                   d->text + d->tok[dtype].start, want);
            break;
        }
        int64_t dims[KILN_MAX_RANK];
        if (d->tok[shape].size > KILN_MAX_RANK) {
            st = (kiln_status)fail(err, "input '%s': more than %d dimensions", specs[i].name,
                                   KILN_MAX_RANK);
            break;
        }
        int rank = (int)d->tok[shape].size, s = shape + 1;
        for (int r = 0; r < rank; r++, s = (int)d->tok[s].next) {
            if (!kiln_json_get_int64(d, s, &dims[r]) || dims[r] < 0) {
                st = (kiln_status)fail(err, "input '%s': shape[%d] is not a non-negative integer",
                                       specs[i].name, r);
                break;
            }
        }
        if (st != KILN_OK) break;
        st = kiln_json_fill_flat(d, data, spec_dtype(&specs[i]), rank, dims, specs[i].name,
                                 &out[i], err);
        if (st == KILN_OK) st = check_shape(&specs[i], out[i], err);
        if (st != KILN_OK) break;
    }
    for (int i = 0; i < n && st == KILN_OK; i++)
        if (!out[i]) st = (kiln_status)fail(err, "expected input '%s' is missing", specs[i].name);
    if (st != KILN_OK) free_all(out, n);
    return st;
}

void kiln_infer_encode(kiln_sbuf *b, const char *model, int64_t version,
                       const kiln_json_doc *request, int n, const char *const *names,
                       const kiln_tensor *const *t)
{
    kiln_sbuf_puts(b, "{\"model_name\": ");
    kiln_sbuf_json_string(b, model, strlen(model));
    kiln_sbuf_printf(b, ", \"model_version\": \"%" PRId64 "\"", version);
    int id = request ? kiln_json_object_get(request, 0, "id") : -1;
    if (id >= 0 && request->tok[id].type == KILN_JSON_STRING) {
        size_t len;
        char *s = kiln_json_string_dup(request, id, &len);
        if (s) {
            kiln_sbuf_puts(b, ", \"id\": ");
            kiln_sbuf_json_string(b, s, len);
            free(s);
        }
    }
    kiln_sbuf_puts(b, ", \"outputs\": [");
    for (int i = 0; i < n; i++) {
        if (i) kiln_sbuf_puts(b, ", ");
        kiln_sbuf_puts(b, "{\"name\": ");
        kiln_sbuf_json_string(b, names[i], strlen(names[i]));
        kiln_sbuf_printf(b, ", \"datatype\": \"%s\", \"shape\": [", kiln_kserve_datatype(t[i]->dtype));
        for (int r = 0; r < t[i]->rank; r++)
            kiln_sbuf_printf(b, "%s%" PRId64, r ? ", " : "", t[i]->dims[r]);
        kiln_sbuf_puts(b, "], \"data\": ");
        kiln_json_write_tensor(b, t[i], -1, 0, 1);
        kiln_sbuf_puts(b, "}");
    }
    kiln_sbuf_puts(b, "]}\n");
}
