/*
 * tf_ops.c - reference kernels for the TensorFlow ops that have no ONNX
 * equivalent: TfParseExample, TfStringJoin, TfReduceJoin and TfStringSplit.
 *
 * The SavedModel importer (src/import/savedmodel.c) creates these nodes
 * (their ops are INTERNAL in ops.def, so no ONNX file can name them). Their
 * semantics are TensorFlow's; this is the contract the importer writes to:
 *
 * TfParseExample (ParseExample / ParseExampleV2, dense features only)
 *   inputs  [0] serialized: string, rank 0 or 1, serialized tf.train.Example
 *           [1..N] dense_defaults: one per dense key, of that key's type.
 *           0 elements: the feature is required; otherwise the element count
 *           equals the dense shape's, or is 1 (broadcast to the dense shape).
 *   attrs   "dense_keys" STRINGS (N feature names), "dense_types" INTS (N
 *           kiln_dtype values: float32, int64 or string), "dense_ranks" INTS
 *           (N ranks), "dense_shapes" INTS (the N dense shapes concatenated;
 *           every dim known and >= 0).
 *   outputs N tensors: [batch] + dense_shape when serialized is rank 1,
 *           dense_shape when it is rank 0.
 *   A feature's value count must equal its dense shape's element count; a
 *   missing feature (or one whose Feature has no list set) takes its default,
 *   and is an error naming the key and the example index if it is required;
 *   a list of the wrong kind (float_list for an int64 feature) is an error.
 *   When a key appears twice, the last entry wins, as in protobuf.
 *
 * TfStringJoin (StringJoin; also TF's string Add, lowered with separator "")
 *   inputs  1..N string tensors, broadcast numpy-style (scalars broadcast).
 *   attrs   "separator" STRING (default "").
 *   output  string tensor: the inputs joined elementwise with the separator.
 *
 * TfReduceJoin (ReduceJoin)
 *   inputs  [0] x: string tensor, [1] axes: int32/int64, scalar or 1-D;
 *           negative axes count from the end; duplicates are an error; an
 *           empty list reduces nothing (TF's axis=None is passed by the
 *           importer as every axis, last first: [r-1, ..., 0]).
 *   attrs   "keep_dims" INT (0/1, default 0), "separator" STRING (default "").
 *   output  x with the axes joined away (kept as 1s with keep_dims). As in
 *           TF, the first listed axis varies fastest within a join: for
 *           [[a,b],[c,d]], axes [1,0] give "abcd" and axes [0,1] give "acbd".
 *
 * TfStringSplit (StringSplit, StringSplitV2; DYNOUT)
 *   inputs  [0] input: string [N], [1] delimiter: string scalar.
 *   attrs   "v2" INT (default 0), "skip_empty" INT (default 1, v1 only),
 *           "maxsplit" INT (default -1, v2 only).
 *           v1 (StringSplit): the delimiter is a SET of bytes, each a split
 *           point; an empty delimiter splits into single bytes; skip_empty
 *           drops empty tokens.
 *           v2 (StringSplitV2): the delimiter is a whole string (Python's
 *           str.split); an empty delimiter splits on runs of ASCII
 *           whitespace; at most maxsplit splits (< 0: no limit), the rest of
 *           the string being the last token.
 *   outputs indices int64 [n, 2] (row, position), values string [n],
 *           dense_shape int64 [2] = [N, most tokens in a row].
 *
 * tf.Example bytes come from requests, so they are read by a small
 * bounds-checked protobuf wire reader (below), not trusted: malformed bytes
 * give KILN_ERR_INVALID_ARGUMENT naming the example, and nothing allocated
 * is larger than the input strings.
 */
#include <pthread.h>
#include <stdlib.h>

#include "kernels/kernel.h"

/* ---- Helpers ---- */

/* The bytes of a STRING attribute (binary-safe), or "" when absent. */
static kiln_string attr_bytes(const struct kiln_node *n, const char *name)
{
    kiln_string s = {0, ""};
    if (kiln_attr_str(n, name, NULL)) /* type-checked by the getter */
        s = kiln_node_attr(n, name)->s;
    if (!s.data) {
        s.len = 0;
        s.data = "";
    }
    return s;
}

/* The bytes of string element i of t ("" for an unset element). */
static kiln_string str_at(const kiln_tensor *t, int64_t i)
{
    kiln_string s = ((const kiln_string *)t->data)[i];
    if (!s.data) {
        s.len = 0;
        s.data = "";
    }
    return s;
}

/* Give string element i of an owned tensor the malloc'd buffer buf. */
static void str_put(kiln_tensor *t, int64_t i, char *buf, size_t len)
{
    kiln_string *s = &((kiln_string *)t->data)[i];
    free(s->data);
    s->data = buf;
    s->len = len;
}

/* Join parts[0..n) with sep into string element i of out. *total counts the
 * bytes made so far by the node, bounded by KILN_TENSOR_MAX_BYTES. */
static kiln_status join_into(const struct kiln_node *node, kiln_tensor *out, int64_t i,
                             const kiln_string *parts, int64_t n, kiln_string sep,
                             uint64_t *total)
{
    uint64_t len = 0;
    for (int64_t k = 0; k < n; k++) len += parts[k].len + (k ? sep.len : 0);
    *total += len;
    if (*total > (uint64_t)KILN_TENSOR_MAX_BYTES)
        return kiln_node_error(node, KILN_ERR_OUT_OF_MEMORY,
                               "joined strings would exceed %lld bytes",
                               (long long)KILN_TENSOR_MAX_BYTES);
    char *buf = malloc((size_t)len + 1), *p = buf;
    if (!buf) return kiln_node_error(node, KILN_ERR_OUT_OF_MEMORY, "out of memory joining strings");
    for (int64_t k = 0; k < n; k++) {
        if (k && sep.len) {
            memcpy(p, sep.data, sep.len);
            p += sep.len;
        }
        if (parts[k].len) {
            memcpy(p, parts[k].data, parts[k].len);
            p += parts[k].len;
        }
    }
    *p = '\0';
    str_put(out, i, buf, (size_t)len);
    return KILN_OK;
}

/* Error unless a known dtype is string; what names the input. */
static kiln_status want_string(const struct kiln_node *node, const struct kiln_type *t,
                               const char *what)
{
    if (!t || t->dtype == KILN_DTYPE_UNDEFINED || t->dtype == KILN_DTYPE_STRING) return KILN_OK;
    return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "%s must be a string tensor, got %s",
                           what, kiln_dtype_name(t->dtype));
}

/* ---- Protobuf wire reader (bounds-checked) ---- */

/* An unread span of bytes. */
struct pb {
    const uint8_t *p, *end;
};

/* Read a varint of at most 10 bytes. */
static bool pb_varint(struct pb *r, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 70 && r->p < r->end; shift += 7) {
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false; /* truncated or longer than 10 bytes */
}

/* Read a field tag: field number (>= 1) and wire type. */
static bool pb_tag(struct pb *r, uint32_t *field, int *wt)
{
    uint64_t t;
    if (!pb_varint(r, &t) || t > UINT32_MAX || (t >> 3) == 0) return false;
    *field = (uint32_t)(t >> 3);
    *wt = (int)(t & 7);
    return true;
}

/* Read a length-delimited payload into *sub. */
static bool pb_bytes(struct pb *r, struct pb *sub)
{
    uint64_t n;
    if (!pb_varint(r, &n) || n > (uint64_t)(r->end - r->p)) return false;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return true;
}

/* Skip a field's value of wire type wt (groups are not accepted, as in TF). */
static bool pb_skip(struct pb *r, int wt)
{
    uint64_t v;
    struct pb sub;
    switch (wt) {
    case 0: return pb_varint(r, &v);
    case 1:
        if (r->end - r->p < 8) return false;
        r->p += 8;
        return true;
    case 2: return pb_bytes(r, &sub);
    case 5:
        if (r->end - r->p < 4) return false;
        r->p += 4;
        return true;
    default: return false;
    }
}

/* ---- TfParseExample ---- */

/* tf.train.Feature's oneof kinds (feature.proto field numbers). */
enum { KIND_NONE = 0, KIND_BYTES = 1, KIND_FLOAT = 2, KIND_INT64 = 3 };

/* The node's dense feature configuration, read from its attributes. */
struct pe_config {
    int n;                            /* dense features */
    const kiln_string *keys;          /* dense_keys[n] */
    const int64_t *types;             /* dense_types[n] (kiln_dtype) */
    const int64_t *ranks;             /* dense_ranks[n] */
    const int64_t *dims[KILN_MAX_IO]; /* dense shape d: dims[d][0..ranks[d]) */
    int64_t count[KILN_MAX_IO];       /* elements of dense shape d */
};

static const char *kind_name(int kind)
{
    switch (kind) {
    case KIND_BYTES: return "bytes";
    case KIND_FLOAT: return "float";
    case KIND_INT64: return "int64";
    }
    return "none";
}

/* Dense key d, for messages. */
static const char *key_name(const struct pe_config *c, int d)
{
    return c->keys && c->keys[d].data ? c->keys[d].data : "";
}

/* The Feature kind that holds values of dtype dt. */
static int kind_of(kiln_dtype dt)
{
    return dt == KILN_DTYPE_F32 ? KIND_FLOAT : dt == KILN_DTYPE_I64 ? KIND_INT64 : KIND_BYTES;
}

/* Read and check the dense-feature attributes; N is the node's output count. */
static kiln_status pe_config_read(const struct kiln_node *node, int n_in, int n_out,
                                  struct pe_config *c)
{
    memset(c, 0, sizeof *c);
    c->n = n_out;
    if (n_out >= KILN_MAX_IO)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "%d dense features; at most %d",
                               n_out, KILN_MAX_IO - 1);
    if (n_in != n_out + 1)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "has %d inputs for %d dense features; expected serialized "
                               "plus one default per feature",
                               n_in, n_out);
    const struct kiln_attr *keys = kiln_node_attr(node, "dense_keys");
    if (!keys && n_out > 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "attribute 'dense_keys' is missing");
    if (keys && keys->type != KILN_ATTR_STRINGS)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "attribute 'dense_keys' must be STRINGS");
    if (keys && keys->n != n_out)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "attribute 'dense_keys' has %d names for %d outputs", keys->n,
                               n_out);
    c->keys = keys ? keys->strings : NULL;
    const int64_t *shapes;
    int nt = kiln_attr_ints(node, "dense_types", &c->types);
    int nr = kiln_attr_ints(node, "dense_ranks", &c->ranks);
    int ns = kiln_attr_ints(node, "dense_shapes", &shapes);
    if (n_out == 0) return KILN_OK;
    if (nt != n_out || nr != n_out)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "attributes 'dense_types' and 'dense_ranks' need %d values each "
                               "(one per dense key), got %d and %d",
                               n_out, nt, nr);
    int64_t at = 0;
    for (int d = 0; d < n_out; d++) {
        kiln_dtype dt = (kiln_dtype)c->types[d];
        if (c->types[d] != KILN_DTYPE_F32 && c->types[d] != KILN_DTYPE_I64 &&
            c->types[d] != KILN_DTYPE_STRING)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                                   "dense feature '%s' has type %s; tf.Example holds float32, "
                                   "int64 and string",
                                   key_name(c, d),
                                   c->types[d] > 0 && c->types[d] < KILN_DTYPE_COUNT
                                       ? kiln_dtype_name(dt)
                                       : "(invalid)");
        if (c->ranks[d] < 0 || c->ranks[d] >= KILN_MAX_RANK)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                                   "dense feature '%s' has rank %lld; at most %d",
                                   key_name(c, d),
                                   (long long)c->ranks[d], KILN_MAX_RANK - 1);
        if (ns < 0 || c->ranks[d] > ns - at)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "attribute 'dense_shapes' has %d dims, fewer than "
                                   "'dense_ranks' adds up to",
                                   ns < 0 ? 0 : ns);
        c->dims[d] = shapes + at;
        for (int i = 0; i < c->ranks[d]; i++)
            if (c->dims[d][i] < 0)
                return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                                       "dense feature '%s' has an unknown dim (variable-length "
                                       "dense features are not supported)",
                                       key_name(c, d));
        c->count[d] = kiln_shape_count((int)c->ranks[d], c->dims[d]);
        if (c->count[d] < 0)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "dense feature '%s' has a shape too large",
                                   key_name(c, d));
        at += c->ranks[d];
    }
    if (at != ns)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "attribute 'dense_shapes' has %d dims, 'dense_ranks' adds up "
                               "to %lld",
                               ns, (long long)at);
    return KILN_OK;
}

/* Check dense default d against the config: its dtype and element count. */
static kiln_status pe_check_default(const struct kiln_node *node, const struct pe_config *c,
                                    int d, const struct kiln_type *t)
{
    const char *key = key_name(c, d);
    if (t->dtype != KILN_DTYPE_UNDEFINED && t->dtype != (kiln_dtype)c->types[d])
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "default of dense feature '%s' is %s, the feature is %s", key,
                               kiln_dtype_name(t->dtype), kiln_dtype_name((kiln_dtype)c->types[d]));
    if (!kiln_type_is_concrete(t)) return KILN_OK;
    int64_t n = kiln_shape_count(t->rank, t->dims);
    if (n != 0 && n != 1 && n != c->count[d]) {
        char buf[160];
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "default of dense feature '%s' has %lld elements; the dense shape "
                               "%s has %lld",
                               key, (long long)n,
                               kiln_shape_str((int)c->ranks[d], c->dims[d], buf, sizeof buf),
                               (long long)c->count[d]);
    }
    return KILN_OK;
}

/* Output d: the dense shape, after the batch dim when serialized is rank 1. */
static kiln_status parse_example_infer(struct kiln_infer_ctx *ctx)
{
    struct pe_config c;
    kiln_status st = pe_config_read(ctx->node, ctx->n_in, ctx->n_out, &c);
    if (st != KILN_OK) return st;
    const struct kiln_type *ser = ctx->in[0];
    st = want_string(ctx->node, ser, "input 'serialized'");
    if (st != KILN_OK) return st;
    if (ser && ser->rank > 1)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input 'serialized' must be a scalar or a vector, got rank %d",
                               ser->rank);
    for (int d = 0; d < c.n; d++) {
        if (ctx->in[1 + d]) {
            st = pe_check_default(ctx->node, &c, d, ctx->in[1 + d]);
            if (st != KILN_OK) return st;
        }
        struct kiln_type *t = ctx->out[d];
        if (!t) continue;
        kiln_type_unknown(t);
        t->dtype = (kiln_dtype)c.types[d];
        if (!ser || ser->rank < 0) continue;
        int b = ser->rank; /* 1 with a batch dim, 0 without */
        t->rank = b + (int)c.ranks[d];
        if (b) {
            t->dims[0] = ser->dims[0];
            t->sym[0] = ser->sym[0];
        }
        for (int i = 0; i < c.ranks[d]; i++) t->dims[b + i] = c.dims[d][i];
    }
    return KILN_OK;
}

/* The kind of list a Feature holds (KIND_NONE if none) and where its last
 * run of fields of that kind starts (an earlier run was replaced by another
 * kind; fields of one kind in a row merge, as protobuf does). */
static bool feature_kind(struct pb f, int *kind, const uint8_t **from)
{
    *kind = KIND_NONE;
    *from = f.p;
    while (f.p < f.end) {
        const uint8_t *at = f.p;
        uint32_t field;
        int wt;
        if (!pb_tag(&f, &field, &wt)) return false;
        if (field >= KIND_BYTES && field <= KIND_INT64) {
            struct pb sub;
            if (wt != 2 || !pb_bytes(&f, &sub)) return false;
            if ((int)field != *kind) *from = at;
            *kind = (int)field;
        } else if (!pb_skip(&f, wt)) {
            return false;
        }
    }
    return true;
}

/* A dense key's Feature in one Example. */
struct pe_found {
    struct pb feature;   /* the Feature's bytes */
    int kind;            /* its list kind; KIND_NONE: not in this Example */
    const uint8_t *from; /* where its last run of lists of that kind starts */
};

/* Scan one serialized Example and find each dense key's Feature: the last
 * entry for the key that has a list set wins, as protobuf map parsing and
 * TensorFlow give. False if the bytes are not a well-formed Example; *bad is
 * then the dense key whose Feature is malformed, or -1. */
static bool example_scan(struct pb ex, const struct pe_config *c, struct pe_found *found, int *bad)
{
    *bad = -1;
    for (int d = 0; d < c->n; d++) found[d].kind = KIND_NONE;
    while (ex.p < ex.end) {
        uint32_t field;
        int wt;
        if (!pb_tag(&ex, &field, &wt)) return false;
        if (field != 1) { /* Example.features is field 1; skip the rest */
            if (!pb_skip(&ex, wt)) return false;
            continue;
        }
        struct pb feats;
        if (wt != 2 || !pb_bytes(&ex, &feats)) return false;
        while (feats.p < feats.end) { /* Features: map<string, Feature> feature = 1 */
            if (!pb_tag(&feats, &field, &wt)) return false;
            if (field != 1) {
                if (!pb_skip(&feats, wt)) return false;
                continue;
            }
            struct pb entry, key = {NULL, NULL}, value = {NULL, NULL};
            if (wt != 2 || !pb_bytes(&feats, &entry)) return false;
            while (entry.p < entry.end) { /* map entry: key = 1, value = 2 */
                if (!pb_tag(&entry, &field, &wt)) return false;
                if (field == 1 || field == 2) {
                    if (wt != 2 || !pb_bytes(&entry, field == 1 ? &key : &value)) return false;
                } else if (!pb_skip(&entry, wt)) {
                    return false;
                }
            }
            size_t klen = (size_t)(key.end - key.p);
            for (int d = 0; d < c->n; d++) {
                if (c->keys[d].len != klen || (klen && memcmp(c->keys[d].data, key.p, klen)))
                    continue;
                int kind;
                const uint8_t *from;
                if (!feature_kind(value, &kind, &from)) {
                    *bad = d;
                    return false;
                }
                if (kind == KIND_NONE) continue; /* no list set: as if absent */
                found[d].feature = value;
                found[d].kind = kind;
                found[d].from = from;
            }
        }
    }
    return true;
}

/* Result of reading a Feature's values. */
enum { VALS_OK, VALS_BAD, VALS_OOM };

/* Count the values of the Feature's lists of `kind` from `from` on; with out
 * set, also store them at out[off..off+count). */
static int feature_values(struct pb f, const uint8_t *from, int kind, kiln_tensor *out,
                          int64_t off, int64_t *count)
{
    int64_t n = 0;
    f.p = from;
    while (f.p < f.end) {
        uint32_t field;
        int wt;
        struct pb list;
        if (!pb_tag(&f, &field, &wt)) return VALS_BAD;
        if ((int)field != kind) {
            if (!pb_skip(&f, wt)) return VALS_BAD;
            continue;
        }
        if (wt != 2 || !pb_bytes(&f, &list)) return VALS_BAD;
        while (list.p < list.end) { /* {Bytes,Float,Int64}List: repeated value = 1 */
            if (!pb_tag(&list, &field, &wt)) return VALS_BAD;
            if (field != 1) {
                if (!pb_skip(&list, wt)) return VALS_BAD;
                continue;
            }
            struct pb v;
            uint64_t x;
            if (kind == KIND_BYTES) {
                if (wt != 2 || !pb_bytes(&list, &v)) return VALS_BAD;
                if (out && kiln_tensor_set_string(out, (size_t)(off + n), (const char *)v.p,
                                                  (size_t)(v.end - v.p)) != KILN_OK)
                    return VALS_OOM;
                n++;
            } else if (kind == KIND_FLOAT && (wt == 2 || wt == 5)) {
                if (wt == 2) { /* packed */
                    if (!pb_bytes(&list, &v) || (v.end - v.p) % 4) return VALS_BAD;
                } else {
                    if (list.end - list.p < 4) return VALS_BAD;
                    v.p = list.p;
                    v.end = list.p += 4;
                }
                for (; v.p < v.end; v.p += 4, n++) {
                    if (!out) continue;
                    uint32_t bits = (uint32_t)v.p[0] | (uint32_t)v.p[1] << 8 |
                                    (uint32_t)v.p[2] << 16 | (uint32_t)v.p[3] << 24;
                    memcpy((float *)out->data + off + n, &bits, 4);
                }
            } else if (kind == KIND_INT64 && wt == 2) { /* packed varints */
                if (!pb_bytes(&list, &v)) return VALS_BAD;
                while (v.p < v.end) {
                    if (!pb_varint(&v, &x)) return VALS_BAD;
                    if (out) ((int64_t *)out->data)[off + n] = (int64_t)x;
                    n++;
                }
            } else if (kind == KIND_INT64 && wt == 0) {
                if (!pb_varint(&list, &x)) return VALS_BAD;
                if (out) ((int64_t *)out->data)[off + n] = (int64_t)x;
                n++;
            } else {
                return VALS_BAD;
            }
        }
    }
    *count = n;
    return VALS_OK;
}

/* Fill dense feature d of example b from its default (broadcast if 1 element). */
static kiln_status pe_fill_default(const struct pe_config *c, int d, const kiln_tensor *def,
                                   kiln_tensor *out, int64_t b)
{
    int64_t n = c->count[d], nd = kiln_tensor_count(def);
    for (int64_t i = 0; i < n; i++) {
        int64_t j = nd == 1 ? 0 : i;
        if (out->dtype == KILN_DTYPE_STRING) {
            kiln_string s = str_at(def, j);
            kiln_status st = kiln_tensor_set_string(out, (size_t)(b * n + i), s.data, s.len);
            if (st != KILN_OK) return st;
        } else if (out->dtype == KILN_DTYPE_F32) {
            ((float *)out->data)[b * n + i] = ((const float *)def->data)[j];
        } else {
            ((int64_t *)out->data)[b * n + i] = ((const int64_t *)def->data)[j];
        }
    }
    return KILN_OK;
}

/* Parse each serialized Example into the dense outputs. */
static kiln_status parse_example_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    struct pe_config c;
    kiln_status st = pe_config_read(node, ctx->n_in, ctx->n_out, &c);
    if (st != KILN_OK) return st;
    const kiln_tensor *ser = ctx->in[0];
    if (ser->dtype != KILN_DTYPE_STRING || ser->rank > 1)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input 'serialized' must be a string scalar or vector");
    int64_t batch = kiln_tensor_count(ser);
    for (int d = 0; d < c.n; d++) { /* the shape function checked these; stay defensive */
        if (!ctx->in[1 + d])
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "the default of dense feature '%s' is missing",
                                   key_name(&c, d));
        struct kiln_type t;
        kiln_type_from_tensor(&t, ctx->in[1 + d]);
        st = pe_check_default(node, &c, d, &t);
        if (st != KILN_OK) return st;
        if (!ctx->out[d] || ctx->out[d]->dtype != (kiln_dtype)c.types[d] ||
            kiln_tensor_count(ctx->out[d]) != batch * c.count[d])
            return kiln_node_error(node, KILN_ERR_INTERNAL, "output %d has the wrong shape", d);
    }
    struct pe_found found[KILN_MAX_IO];
    for (int64_t b = 0; b < batch; b++) {
        kiln_string s = str_at(ser, b);
        struct pb ex = {(const uint8_t *)s.data, (const uint8_t *)s.data + s.len};
        int bad;
        if (!example_scan(ex, &c, found, &bad)) {
            if (bad >= 0)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "example %lld: feature '%s' is not a valid tf.Feature "
                                       "(malformed protobuf)",
                                       (long long)b, key_name(&c, bad));
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "serialized example %lld is not a valid tf.Example "
                                   "(truncated or malformed protobuf)",
                                   (long long)b);
        }
        for (int d = 0; d < c.n; d++) {
            const char *key = key_name(&c, d);
            kiln_dtype dt = (kiln_dtype)c.types[d];
            const struct pe_found *f = &found[d];
            if (f->kind == KIND_NONE) {
                const kiln_tensor *def = ctx->in[1 + d];
                if (kiln_tensor_count(def) == 0)
                    return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                           "example %lld: feature '%s' (%s) is required but "
                                           "could not be found",
                                           (long long)b, key, kiln_dtype_name(dt));
                st = pe_fill_default(&c, d, def, ctx->out[d], b);
                if (st != KILN_OK) return st;
                continue;
            }
            if (f->kind != kind_of(dt))
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "example %lld: feature '%s' holds a %s_list but the "
                                       "feature is %s",
                                       (long long)b, key, kind_name(f->kind), kiln_dtype_name(dt));
            int64_t n;
            if (feature_values(f->feature, f->from, f->kind, NULL, 0, &n) != VALS_OK)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "example %lld: the %s_list of feature '%s' is malformed",
                                       (long long)b, kind_name(f->kind), key);
            if (n != c.count[d]) {
                char buf[160];
                return kiln_node_error(
                    node, KILN_ERR_INVALID_ARGUMENT,
                    "example %lld: feature '%s' has %lld %s values; its dense shape %s "
                    "needs %lld",
                    (long long)b, key, (long long)n, kind_name(f->kind),
                    kiln_shape_str((int)c.ranks[d], c.dims[d], buf, sizeof buf),
                    (long long)c.count[d]);
            }
            if (feature_values(f->feature, f->from, f->kind, ctx->out[d], b * n, &n) != VALS_OK)
                return kiln_node_error(node, KILN_ERR_OUT_OF_MEMORY,
                                       "out of memory copying feature '%s'", key);
        }
    }
    return KILN_OK;
}

KILN_REF_OP(TfParseExample, parse_example_infer, parse_example_run);

/* ---- TfStringJoin ---- */

/* Numpy broadcast of the string inputs. */
static kiln_status string_join_infer(struct kiln_infer_ctx *ctx)
{
    for (int k = 0; k < ctx->n_in; k++) {
        kiln_status st = want_string(ctx->node, ctx->in[k], "every input");
        if (st != KILN_OK) return st;
    }
    kiln_status st = kiln_infer_broadcast(ctx);
    if (st == KILN_OK && ctx->out[0]) ctx->out[0]->dtype = KILN_DTYPE_STRING;
    return st;
}

/* Join the broadcast inputs element by element. */
static kiln_status string_join_run(struct kiln_run_ctx *ctx)
{
    kiln_tensor *y = ctx->out[0];
    int n = ctx->n_in;
    if (n > KILN_MAX_IO)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "%d inputs; at most %d", n,
                               KILN_MAX_IO);
    for (int k = 0; k < n; k++)
        if (!ctx->in[k] || ctx->in[k]->dtype != KILN_DTYPE_STRING)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                                   "input %d must be a string tensor", k);
    kiln_string sep = attr_bytes(ctx->node, "separator");
    int64_t strides[KILN_MAX_IO][KILN_MAX_RANK], off[KILN_MAX_IO] = {0}, idx[KILN_MAX_RANK] = {0};
    kiln_string parts[KILN_MAX_IO];
    for (int k = 0; k < n; k++)
        kiln_broadcast_strides(ctx->in[k]->rank, ctx->in[k]->dims, y->rank, y->dims, strides[k]);
    int64_t count = kiln_tensor_count(y);
    uint64_t total = 0;
    for (int64_t i = 0; i < count; i++) {
        for (int k = 0; k < n; k++) parts[k] = str_at(ctx->in[k], off[k]);
        kiln_status st = join_into(ctx->node, y, i, parts, n, sep, &total);
        if (st != KILN_OK) return st;
        for (int d = y->rank - 1; d >= 0; d--) { /* next output index */
            for (int k = 0; k < n; k++) off[k] += strides[k][d];
            if (++idx[d] < y->dims[d]) break;
            for (int k = 0; k < n; k++) off[k] -= strides[k][d] * y->dims[d];
            idx[d] = 0;
        }
    }
    return KILN_OK;
}

KILN_REF_OP(TfStringJoin, string_join_infer, string_join_run);

/* ---- TfReduceJoin ---- */

/* Read the axes to reduce, in the given order, normalized to [0, rank);
 * reduced[d] marks each. Out of range or repeated axes are errors. */
static kiln_status reduce_join_axes(const struct kiln_node *node, const kiln_tensor *t, int rank,
                                    int *axes, int *n, bool *reduced)
{
    if (t->dtype != KILN_DTYPE_I32 && t->dtype != KILN_DTYPE_I64)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "input 'axes' must be int32 or int64, got %s",
                               kiln_dtype_name(t->dtype));
    if (t->rank > 1)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input 'axes' must be a scalar or a vector, got rank %d", t->rank);
    for (int d = 0; d < KILN_MAX_RANK; d++) reduced[d] = false;
    int64_t count = kiln_tensor_count(t);
    *n = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t a = kiln_tensor_i64(t, i);
        if (a < -rank || a >= rank)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "axis %lld is out of range for an input of rank %d",
                                   (long long)a, rank);
        int d = (int)(a < 0 ? a + rank : a);
        if (reduced[d])
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "axis %lld is repeated",
                                   (long long)a);
        reduced[d] = true;
        axes[(*n)++] = d;
    }
    return KILN_OK;
}

/* The input's shape without (or with 1 in place of) the reduced axes. */
static kiln_status reduce_join_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0], *at = ctx->in[1];
    kiln_status st = want_string(ctx->node, x, "input 'x'");
    if (st != KILN_OK) return st;
    if (at && at->dtype != KILN_DTYPE_UNDEFINED && at->dtype != KILN_DTYPE_I32 &&
        at->dtype != KILN_DTYPE_I64)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "input 'axes' must be int32 or int64, got %s",
                               kiln_dtype_name(at->dtype));
    bool keep = kiln_attr_int(ctx->node, "keep_dims", 0) != 0;
    struct kiln_type *t = ctx->out[0];
    if (!t) return KILN_OK;
    kiln_type_unknown(t);
    t->dtype = KILN_DTYPE_STRING;
    if (!x || x->rank < 0) return KILN_OK;
    const kiln_tensor *av = ctx->in_value ? ctx->in_value[1] : NULL;
    if (!av) { /* which axes is not known yet; maybe how many */
        int64_t k = !at || at->rank < 0 ? -1 : at->rank == 0 ? 1 : at->dims[0];
        if (keep) k = 0;
        if (k < 0 || k > x->rank) return KILN_OK;
        t->rank = x->rank - (int)k;
        for (int i = 0; i < t->rank; i++) t->dims[i] = -1;
        return KILN_OK;
    }
    int axes[KILN_MAX_RANK], n;
    bool reduced[KILN_MAX_RANK];
    st = reduce_join_axes(ctx->node, av, x->rank, axes, &n, reduced);
    if (st != KILN_OK) return st;
    t->rank = 0;
    for (int d = 0; d < x->rank; d++) {
        if (reduced[d] && !keep) continue;
        t->dims[t->rank] = reduced[d] ? 1 : x->dims[d];
        t->sym[t->rank] = reduced[d] ? NULL : x->sym[d];
        t->rank++;
    }
    return KILN_OK;
}

/* For each output element, join the inputs along the reduced axes. */
static kiln_status reduce_join_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    if (x->dtype != KILN_DTYPE_STRING)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "input 'x' must be a string tensor, got %s",
                               kiln_dtype_name(x->dtype));
    int axes[KILN_MAX_RANK], n, kept[KILN_MAX_RANK], nk = 0;
    bool reduced[KILN_MAX_RANK];
    kiln_status st = reduce_join_axes(ctx->node, ctx->in[1], x->rank, axes, &n, reduced);
    if (st != KILN_OK) return st;
    kiln_string sep = attr_bytes(ctx->node, "separator");
    int64_t strides[KILN_MAX_RANK];
    kiln_shape_strides(x->rank, x->dims, strides);
    for (int d = 0; d < x->rank; d++)
        if (!reduced[d]) kept[nk++] = d;
    /* offsets of one join's inputs from its first: the first axis varies fastest */
    int64_t per = 1;
    for (int j = 0; j < n; j++) per *= x->dims[axes[j]];
    int64_t outs = kiln_tensor_count(y);
    if (outs == 0) return KILN_OK;
    kiln_string *parts = malloc(sizeof *parts * (size_t)(per ? per : 1));
    int64_t *roff = malloc(sizeof *roff * (size_t)(per ? per : 1));
    if (!parts || !roff) {
        st = kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out_free;
    }
    for (int64_t r = 0; r < per; r++) {
        int64_t q = r, o = 0;
        for (int j = 0; j < n; j++) {
            o += strides[axes[j]] * (q % x->dims[axes[j]]);
            q /= x->dims[axes[j]];
        }
        roff[r] = o;
    }
    uint64_t total = 0;
    for (int64_t i = 0; i < outs; i++) {
        int64_t q = i, base = 0; /* row-major over the kept axes */
        for (int j = nk - 1; j >= 0; j--) {
            base += strides[kept[j]] * (q % x->dims[kept[j]]);
            q /= x->dims[kept[j]];
        }
        for (int64_t r = 0; r < per; r++) parts[r] = str_at(x, base + roff[r]);
        st = join_into(ctx->node, y, i, parts, per, sep, &total);
        if (st != KILN_OK) goto out_free;
    }
out_free:
    free(parts);
    free(roff);
    return st;
}

KILN_REF_OP(TfReduceJoin, reduce_join_infer, reduce_join_run);

/* ---- TfStringSplit ---- */

/* How a string is cut into tokens. */
enum split_mode {
    SPLIT_CHARS,  /* v1: at any byte of the delimiter set */
    SPLIT_BYTES,  /* v1 with an empty delimiter: one token per byte */
    SPLIT_STRING, /* v2: at each occurrence of the delimiter string */
    SPLIT_SPACE,  /* v2 with an empty delimiter: at runs of whitespace */
};

/* A tokenizer over one string. */
struct split_iter {
    const char *s;
    size_t n, pos;
    kiln_string delim;
    enum split_mode mode;
    bool skip_empty;  /* v1: drop empty tokens */
    int64_t maxsplit; /* v2: most splits to make (< 0: no limit; 0: none) */
    int64_t splits;   /* v2: splits made */
    bool done;
    bool rest;        /* v2: the next token is the rest of the string */
};

static bool is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

/* Start tokenizing s. */
static void split_init(struct split_iter *it, kiln_string s, kiln_string delim, bool v2,
                       bool skip_empty, int64_t maxsplit)
{
    memset(it, 0, sizeof *it);
    it->s = s.data;
    it->n = s.len;
    it->delim = delim;
    it->mode = v2 ? (delim.len ? SPLIT_STRING : SPLIT_SPACE)
                  : (delim.len ? SPLIT_CHARS : SPLIT_BYTES);
    it->skip_empty = skip_empty;
    it->maxsplit = maxsplit;
    if (v2 && maxsplit == 0) it->rest = true; /* TF: the whole string, untouched */
    if (it->mode == SPLIT_SPACE && !it->rest)
        while (it->pos < it->n && is_space(it->s[it->pos])) it->pos++;
}

/* Position of the first delimiter at or after pos (n if none). */
static size_t split_find(const struct split_iter *it, size_t pos)
{
    for (size_t i = pos; i < it->n; i++) {
        if (it->mode == SPLIT_CHARS) {
            if (memchr(it->delim.data, it->s[i], it->delim.len)) return i;
        } else if (it->n - i >= it->delim.len &&
                   memcmp(it->s + i, it->delim.data, it->delim.len) == 0) {
            return i;
        }
    }
    return it->n;
}

/* The next token as [*start, *start + *len); false when there are no more. */
static bool split_next(struct split_iter *it, size_t *start, size_t *len)
{
    while (!it->done) {
        if (it->rest) { /* v2 after maxsplit splits */
            *start = it->pos;
            *len = it->n - it->pos;
            it->done = true;
            return true;
        }
        switch (it->mode) {
        case SPLIT_BYTES:
            if (it->pos >= it->n) {
                it->done = true;
                return false;
            }
            *start = it->pos++;
            *len = 1;
            return true;
        case SPLIT_CHARS: {
            size_t e = split_find(it, it->pos);
            *start = it->pos;
            *len = e - it->pos;
            if (e >= it->n) it->done = true;
            else it->pos = e + 1;
            if (it->skip_empty && *len == 0) continue;
            return true;
        }
        case SPLIT_STRING: {
            size_t e = split_find(it, it->pos);
            *start = it->pos;
            *len = e - it->pos;
            if (e >= it->n) {
                it->done = true;
                return true;
            }
            it->pos = e + it->delim.len;
            if (++it->splits == it->maxsplit) it->rest = true;
            return true;
        }
        case SPLIT_SPACE: {
            if (it->pos >= it->n) {
                it->done = true;
                return false;
            }
            size_t e = it->pos;
            while (e < it->n && !is_space(it->s[e])) e++;
            *start = it->pos;
            *len = e - it->pos;
            it->pos = e;
            while (it->pos < it->n && is_space(it->s[it->pos])) it->pos++;
            if (++it->splits == it->maxsplit) it->rest = true;
            return true;
        }
        }
    }
    return false;
}

/* indices int64 [n, 2], values string [n], dense_shape int64 [2]. */
static kiln_status string_split_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = want_string(ctx->node, ctx->in[0], "input 'input'");
    if (st == KILN_OK) st = want_string(ctx->node, ctx->in[1], "input 'delimiter'");
    if (st != KILN_OK) return st;
    if (ctx->in[0] && ctx->in[0]->rank >= 0 && ctx->in[0]->rank != 1)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input 'input' must be a vector, got rank %d", ctx->in[0]->rank);
    if (ctx->in[1] && ctx->in[1]->rank > 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input 'delimiter' must be a scalar, got rank %d",
                               ctx->in[1]->rank);
    int64_t d2[2] = {-1, 2}, d1 = -1, ds = 2;
    if (ctx->out[0]) kiln_type_set(ctx->out[0], KILN_DTYPE_I64, 2, d2);
    if (ctx->n_out > 1 && ctx->out[1]) kiln_type_set(ctx->out[1], KILN_DTYPE_STRING, 1, &d1);
    if (ctx->n_out > 2 && ctx->out[2]) kiln_type_set(ctx->out[2], KILN_DTYPE_I64, 1, &ds);
    return KILN_OK;
}

/* Count the tokens, make the outputs, then fill them. */
static kiln_status string_split_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0], *dt = ctx->in[1];
    if (x->dtype != KILN_DTYPE_STRING || x->rank != 1)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input 'input' must be a string vector");
    if (dt->dtype != KILN_DTYPE_STRING || dt->rank != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "input 'delimiter' must be a string scalar");
    kiln_string delim = str_at(dt, 0);
    bool v2 = kiln_attr_int(node, "v2", 0) != 0;
    bool skip_empty = kiln_attr_int(node, "skip_empty", 1) != 0;
    int64_t maxsplit = kiln_attr_int(node, "maxsplit", -1);
    int64_t rows = x->dims[0], total = 0, most = 0;
    struct split_iter it;
    size_t start, len;
    for (int64_t r = 0; r < rows; r++) {
        int64_t k = 0;
        split_init(&it, str_at(x, r), delim, v2, skip_empty, maxsplit);
        while (split_next(&it, &start, &len)) k++;
        total += k;
        if (k > most) most = k;
    }
    int64_t di[2] = {total, 2}, ds = 2;
    kiln_status st = kiln_tensor_new(KILN_DTYPE_I64, 2, di, &ctx->out[0]);
    if (st == KILN_OK) st = kiln_tensor_new(KILN_DTYPE_STRING, 1, &total, &ctx->out[1]);
    if (st == KILN_OK) st = kiln_tensor_new(KILN_DTYPE_I64, 1, &ds, &ctx->out[2]);
    if (st != KILN_OK) return st; /* the executor frees what was made */
    int64_t *ind = ctx->out[0]->data, *shape = ctx->out[2]->data, c = 0;
    shape[0] = rows;
    shape[1] = most;
    for (int64_t r = 0; r < rows; r++) {
        kiln_string s = str_at(x, r);
        split_init(&it, s, delim, v2, skip_empty, maxsplit);
        for (int64_t j = 0; split_next(&it, &start, &len); j++, c++) {
            ind[2 * c] = r;
            ind[2 * c + 1] = j;
            st = kiln_tensor_set_string(ctx->out[1], (size_t)c, s.data + start, len);
            if (st != KILN_OK) return st;
        }
    }
    return KILN_OK;
}

KILN_REF_OP(TfStringSplit, string_split_infer, string_split_run);

/* ---- model state (TF1 reference variables written by a signature) ----
 *
 * TfVariable ()              -> a copy of the variable's current value
 * TfAssign   (value)         -> the variable's value after the write
 *   attrs   "var" TENSOR: the variable itself (owned by the model, shared
 *           by every signature graph and the optimized copies), "mode"
 *           STRING for TfAssign: "assign", "add" or "sub" (Assign,
 *           AssignAdd, AssignSub).
 * One process-wide lock orders reads and writes, so concurrent requests
 * see each update exactly once (as TensorFlow does with use_locking). */

static pthread_mutex_t var_lock = PTHREAD_MUTEX_INITIALIZER;

static kiln_status var_attr(const struct kiln_node *n, kiln_tensor **out)
{
    const kiln_tensor *t = kiln_attr_tensor(n, "var");
    if (!t) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "missing its 'var' attribute");
    if (t->dtype == KILN_DTYPE_STRING)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "string variables are not supported");
    *out = (kiln_tensor *)t;
    return KILN_OK;
}

static kiln_status variable_infer(struct kiln_infer_ctx *ctx)
{
    kiln_tensor *v = NULL;
    kiln_status st = var_attr(ctx->node, &v);
    if (st != KILN_OK) return st;
    if (ctx->out[0]) kiln_type_from_tensor(ctx->out[0], v);
    if (ctx->node->op == KILN_OP_TfAssign && ctx->in[0]) {
        const struct kiln_type *x = ctx->in[0];
        if (x->dtype != KILN_DTYPE_UNDEFINED && x->dtype != v->dtype)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                                   "value is %s but the variable is %s",
                                   kiln_dtype_name(x->dtype), kiln_dtype_name(v->dtype));
    }
    return KILN_OK;
}

static kiln_status variable_run(struct kiln_run_ctx *ctx)
{
    kiln_tensor *v = NULL;
    kiln_status st = var_attr(ctx->node, &v);
    if (st != KILN_OK) return st;
    pthread_mutex_lock(&var_lock);
    memcpy(ctx->out[0]->data, v->data, v->nbytes);
    pthread_mutex_unlock(&var_lock);
    return KILN_OK;
}

static kiln_status assign_run(struct kiln_run_ctx *ctx)
{
    kiln_tensor *v = NULL;
    kiln_status st = var_attr(ctx->node, &v);
    if (st != KILN_OK) return st;
    const kiln_tensor *x = ctx->in[0];
    const char *mode = kiln_attr_str(ctx->node, "mode", "assign");
    int64_t n = kiln_shape_count(v->rank, v->dims);
    int64_t nx = kiln_shape_count(x->rank, x->dims);
    bool whole = strcmp(mode, "assign") == 0;
    if (!whole && strcmp(mode, "add") != 0 && strcmp(mode, "sub") != 0)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "unknown mode '%s'", mode);
    if (x->dtype != v->dtype || (nx != n && nx != 1))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "value has %lld elements of %s; the variable has %lld of %s",
                               (long long)nx, kiln_dtype_name(x->dtype), (long long)n,
                               kiln_dtype_name(v->dtype));
    if (!whole && v->dtype != KILN_DTYPE_F32 && v->dtype != KILN_DTYPE_F64 &&
        v->dtype != KILN_DTYPE_I32 && v->dtype != KILN_DTYPE_I64)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "%s of %s variables",
                               mode, kiln_dtype_name(v->dtype));
    double sign = strcmp(mode, "sub") == 0 ? -1.0 : 1.0;
    pthread_mutex_lock(&var_lock);
    for (int64_t i = 0; i < n; i++) {
        int64_t j = nx == 1 ? 0 : i;
        switch (v->dtype) {
        case KILN_DTYPE_F32: {
            float *d = v->data;
            const float *s = x->data;
            d[i] = whole ? s[j] : d[i] + (float)sign * s[j];
            break;
        }
        case KILN_DTYPE_F64: {
            double *d = v->data;
            const double *s = x->data;
            d[i] = whole ? s[j] : d[i] + sign * s[j];
            break;
        }
        case KILN_DTYPE_I32: {
            int32_t *d = v->data;
            const int32_t *s = x->data;
            d[i] = whole ? s[j] : (int32_t)((uint32_t)d[i] + (uint32_t)(sign < 0 ? -(int64_t)s[j] : s[j]));
            break;
        }
        case KILN_DTYPE_I64: {
            int64_t *d = v->data;
            const int64_t *s = x->data;
            d[i] = whole ? s[j] : (int64_t)((uint64_t)d[i] + (sign < 0 ? 0 - (uint64_t)s[j] : (uint64_t)s[j]));
            break;
        }
        default: {
            size_t es = kiln_dtype_size(v->dtype);
            memcpy((char *)v->data + (size_t)i * es, (const char *)x->data + (size_t)j * es, es);
        }
        }
    }
    memcpy(ctx->out[0]->data, v->data, v->nbytes);
    pthread_mutex_unlock(&var_lock);
    return KILN_OK;
}

KILN_REF_OP(TfVariable, variable_infer, variable_run);
KILN_REF_OP(TfAssign, variable_infer, assign_run);
