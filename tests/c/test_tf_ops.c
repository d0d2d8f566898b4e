/*
 * test_tf_ops.c - the TensorFlow-only ops (src/kernels/ref/tf_ops.c):
 * TfParseExample on hand-serialized tf.Example protos (float, int64 and
 * bytes features, packed and unpacked lists, defaults, required features,
 * wrong kinds and counts, duplicate keys, truncated and corrupted bytes),
 * TfStringJoin with broadcasting, TfReduceJoin over axes with keep_dims,
 * TfStringSplit in its v1 and v2 forms, and TfListSetItem (TensorLists).
 *
 * The ops are INTERNAL (no ONNX file can name them), so each test builds a
 * one-node IR graph directly, checks its static shape inference, and runs it
 * with the reference executor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "exec/exec.h"
#include "import/model.h"
#include "ir/graph.h"

/* ---- Building one-node graphs ---- */

#define MAX_GRAPH_IO 16

struct test_graph {
    struct kiln_graph *g;
    struct kiln_node *node; /* the node under test (valid until another node is added) */
};

static void tg_init(struct test_graph *t)
{
    if (kiln_graph_new(&t->g) != KILN_OK) abort();
    t->g->inputs = kiln_arena_alloc(t->g->mem, sizeof(int) * MAX_GRAPH_IO);
    t->g->outputs = kiln_arena_alloc(t->g->mem, sizeof(int) * MAX_GRAPH_IO);
    t->node = NULL;
}

/* A graph input; its declared type is unknown unless rank >= 0. */
static int tg_input(struct test_graph *t, kiln_dtype dt, int rank, const int64_t *dims)
{
    char name[16];
    int id;
    snprintf(name, sizeof name, "in%d", t->g->n_inputs);
    if (kiln_graph_value_add(t->g, name, KILN_VALUE_INPUT, &id) != KILN_OK) abort();
    t->g->values[id].type.dtype = dt;
    t->g->values[id].type.rank = rank;
    for (int i = 0; i < rank; i++) t->g->values[id].type.dims[i] = dims[i];
    t->g->inputs[t->g->n_inputs++] = id;
    return id;
}

/* A constant value owning x. */
static int tg_const(struct test_graph *t, kiln_tensor *x)
{
    int id;
    if (kiln_graph_value_add(t->g, "const", KILN_VALUE_CONST, &id) != KILN_OK) abort();
    kiln_graph_own_tensor(t->g, x);
    t->g->values[id].konst = x;
    kiln_type_from_tensor(&t->g->values[id].type, x);
    return id;
}

/* The node under test, its outputs becoming the graph's outputs. */
static void tg_node(struct test_graph *t, enum kiln_op op, const int *ins, int n_in, int n_out,
                    int n_attr)
{
    struct kiln_node *n;
    if (kiln_graph_node_add(t->g, op, "node", n_in, n_out, n_attr, &n) != KILN_OK) abort();
    for (int k = 0; k < n_in; k++) n->in[k] = ins[k];
    for (int k = 0; k < n_out; k++) {
        char name[16];
        int id;
        snprintf(name, sizeof name, "out%d", k);
        if (kiln_graph_value_add(t->g, name, KILN_VALUE_NODE, &id) != KILN_OK) abort();
        t->g->values[id].producer = t->g->n_nodes - 1;
        n->out[k] = id;
        t->g->outputs[t->g->n_outputs++] = id;
    }
    n->n_attr = 0; /* attributes are added one by one below */
    t->node = n;
}

static struct kiln_attr *tg_attr(struct test_graph *t, const char *name, enum kiln_attr_type type)
{
    struct kiln_attr *a = &t->node->attr[t->node->n_attr++];
    a->name = kiln_arena_strdup(t->g->mem, name);
    a->type = type;
    return a;
}

static void attr_int(struct test_graph *t, const char *name, int64_t v)
{
    tg_attr(t, name, KILN_ATTR_INT)->i = v;
}

static void attr_str(struct test_graph *t, const char *name, const char *v)
{
    struct kiln_attr *a = tg_attr(t, name, KILN_ATTR_STRING);
    a->s.len = strlen(v);
    a->s.data = kiln_arena_strdup(t->g->mem, v);
}

static void attr_ints(struct test_graph *t, const char *name, const int64_t *v, int n)
{
    struct kiln_attr *a = tg_attr(t, name, KILN_ATTR_INTS);
    a->n = n;
    a->ints = kiln_arena_alloc(t->g->mem, sizeof(int64_t) * (size_t)(n ? n : 1));
    if (n) memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
}

static void attr_strs(struct test_graph *t, const char *name, const char *const *v, int n)
{
    struct kiln_attr *a = tg_attr(t, name, KILN_ATTR_STRINGS);
    a->n = n;
    a->strings = kiln_arena_alloc(t->g->mem, sizeof(kiln_string) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        a->strings[i].len = strlen(v[i]);
        a->strings[i].data = kiln_arena_strdup(t->g->mem, v[i]);
    }
}

/* Verify, infer statically, run; outputs are owned by the caller. */
static kiln_status tg_run(struct test_graph *t, kiln_tensor **in, kiln_tensor **out)
{
    kiln_status st = kiln_graph_verify(t->g);
    if (st == KILN_OK) st = kiln_graph_infer(t->g);
    if (st == KILN_OK) st = kiln_exec_run(t->g, NULL, in, out);
    return st;
}

static const struct kiln_type *tg_out_type(struct test_graph *t, int k)
{
    return &t->g->values[t->g->outputs[k]].type;
}

static void tg_free(struct test_graph *t, kiln_tensor **out)
{
    for (int k = 0; out && k < t->g->n_outputs; k++) kiln_tensor_free(out[k]);
    kiln_graph_free(t->g);
}

/* ---- Tensors ---- */

static kiln_tensor *strings(int rank, const int64_t *dims, const char *const *v)
{
    kiln_tensor *x;
    if (kiln_tensor_create(KILN_DTYPE_STRING, rank, dims, &x) != KILN_OK) abort();
    for (int64_t i = 0; i < kiln_tensor_count(x); i++)
        kiln_tensor_set_string(x, (size_t)i, v[i], strlen(v[i]));
    return x;
}

static kiln_tensor *ints(kiln_dtype dt, int rank, const int64_t *dims, const int64_t *v)
{
    kiln_tensor *x;
    if (kiln_tensor_create(dt, rank, dims, &x) != KILN_OK) abort();
    for (int64_t i = 0; i < kiln_tensor_count(x); i++) kiln_set_i64(dt, x->data, i, v[i]);
    return x;
}

static kiln_tensor *floats(int rank, const int64_t *dims, const float *v)
{
    kiln_tensor *x;
    if (kiln_tensor_create(KILN_DTYPE_F32, rank, dims, &x) != KILN_OK) abort();
    if (v && x->nbytes) memcpy(x->data, v, x->nbytes);
    return x;
}

/* True if string tensor x holds exactly want[0..count). */
static bool strings_are(const kiln_tensor *x, const char *const *want, int64_t count)
{
    if (!x || x->dtype != KILN_DTYPE_STRING || kiln_tensor_count(x) != count) return false;
    const kiln_string *s = x->data;
    for (int64_t i = 0; i < count; i++) {
        size_t n = strlen(want[i]);
        if (s[i].len != n || (n && memcmp(s[i].data, want[i], n))) {
            fprintf(stderr, "  element %lld is '%.*s', expected '%s'\n", (long long)i,
                    (int)s[i].len, s[i].data ? s[i].data : "", want[i]);
            return false;
        }
    }
    return true;
}

static bool shape_is(const kiln_tensor *x, int rank, const int64_t *dims)
{
    if (!x || x->rank != rank) return false;
    for (int i = 0; i < rank; i++)
        if (x->dims[i] != dims[i]) return false;
    return true;
}

/* ---- tf.Example serialization ---- */

struct buf {
    uint8_t d[1024];
    size_t n;
};

static void put_byte(struct buf *b, uint8_t v)
{
    if (b->n < sizeof b->d) b->d[b->n++] = v;
}

static void put_varint(struct buf *b, uint64_t v)
{
    while (v >= 0x80) {
        put_byte(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    put_byte(b, (uint8_t)v);
}

static void put_tag(struct buf *b, int field, int wt) { put_varint(b, (uint64_t)field << 3 | wt); }

static void put_bytes(struct buf *b, int field, const void *p, size_t n)
{
    put_tag(b, field, 2);
    put_varint(b, n);
    for (size_t i = 0; i < n; i++) put_byte(b, ((const uint8_t *)p)[i]);
}

static void put_f32(struct buf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    for (int i = 0; i < 4; i++) put_byte(b, (uint8_t)(u >> (8 * i)));
}

/* A Feature with a float_list (field 2), packed or not. */
static struct buf feat_floats(const float *v, int n, bool packed)
{
    struct buf list = {0}, f = {0};
    if (packed) {
        struct buf p = {0};
        for (int i = 0; i < n; i++) put_f32(&p, v[i]);
        put_bytes(&list, 1, p.d, p.n);
    } else {
        for (int i = 0; i < n; i++) {
            put_tag(&list, 1, 5);
            put_f32(&list, v[i]);
        }
    }
    put_bytes(&f, 2, list.d, list.n);
    return f;
}

/* A Feature with an int64_list (field 3), packed or not. */
static struct buf feat_int64s(const int64_t *v, int n, bool packed)
{
    struct buf list = {0}, f = {0};
    if (packed) {
        struct buf p = {0};
        for (int i = 0; i < n; i++) put_varint(&p, (uint64_t)v[i]);
        put_bytes(&list, 1, p.d, p.n);
    } else {
        for (int i = 0; i < n; i++) {
            put_tag(&list, 1, 0);
            put_varint(&list, (uint64_t)v[i]);
        }
    }
    put_bytes(&f, 3, list.d, list.n);
    return f;
}

/* A Feature with a bytes_list (field 1). */
static struct buf feat_bytes(const char *const *v, int n)
{
    struct buf list = {0}, f = {0};
    for (int i = 0; i < n; i++) put_bytes(&list, 1, v[i], strlen(v[i]));
    put_bytes(&f, 1, list.d, list.n);
    return f;
}

/* Append the map entry key -> feature to a Features message. */
static void features_add(struct buf *feats, const char *key, const struct buf *feature)
{
    struct buf entry = {0};
    put_bytes(&entry, 1, key, strlen(key));
    put_bytes(&entry, 2, feature->d, feature->n);
    put_bytes(feats, 1, entry.d, entry.n);
}

/* Example { features = 1 }. */
static struct buf example_of(const struct buf *feats)
{
    struct buf ex = {0};
    put_bytes(&ex, 1, feats->d, feats->n);
    return ex;
}

/* A string tensor [n] (or a scalar when rank is 0) of serialized Examples. */
static kiln_tensor *serialized(int rank, const struct buf *ex, int n)
{
    int64_t dims[1] = {n};
    kiln_tensor *x;
    if (kiln_tensor_create(KILN_DTYPE_STRING, rank, dims, &x) != KILN_OK) abort();
    for (int i = 0; i < n; i++)
        kiln_tensor_set_string(x, (size_t)i, (const char *)ex[i].d, ex[i].n);
    return x;
}

/* ---- TfParseExample ---- */

/* Features "x" float [2], "id" int64 [], "name" string [1]; defaults given
 * (NULL: required). Runs the node on ser (freed); outputs in out[3]. */
static kiln_status run_parse(kiln_tensor *ser, kiln_tensor *dx, kiln_tensor *did,
                             kiln_tensor *dname, kiln_tensor **out, struct test_graph *t)
{
    static const char *const keys[3] = {"x", "id", "name"};
    const int64_t types[3] = {KILN_DTYPE_F32, KILN_DTYPE_I64, KILN_DTYPE_STRING};
    const int64_t ranks[3] = {1, 0, 1}, shapes[2] = {2, 1}, zero = 0;
    tg_init(t);
    int64_t batch = -1;
    int ins[4];
    ins[0] = tg_input(t, KILN_DTYPE_STRING, ser->rank, &batch);
    ins[1] = tg_const(t, dx ? dx : floats(1, &zero, NULL));
    ins[2] = tg_const(t, did ? did : ints(KILN_DTYPE_I64, 1, &zero, NULL));
    ins[3] = tg_const(t, dname ? dname : strings(1, &zero, NULL));
    tg_node(t, KILN_OP_TfParseExample, ins, 4, 3, 4);
    attr_strs(t, "dense_keys", keys, 3);
    attr_ints(t, "dense_types", types, 3);
    attr_ints(t, "dense_ranks", ranks, 3);
    attr_ints(t, "dense_shapes", shapes, 2);
    kiln_status st = tg_run(t, &ser, out);
    kiln_tensor_free(ser);
    return st;
}

static void test_parse_example(void)
{
    struct test_graph t;
    kiln_tensor *out[3] = {0};
    const float x0[2] = {1.5f, -2.0f}, x1[2] = {3.0f, 4.25f};
    const int64_t id0 = -5, id1[1] = {1234567890123LL};
    static const char *const name0[1] = {"alice"};
    struct buf feats[4] = {0}, ex[4];

    /* example 0: every feature, packed; example 1: x unpacked, id missing,
     * name missing, an unknown feature; example 2: everything missing */
    struct buf f = feat_floats(x0, 2, true);
    features_add(&feats[0], "x", &f);
    f = feat_int64s(&id0, 1, true);
    features_add(&feats[0], "id", &f);
    f = feat_bytes(name0, 1);
    features_add(&feats[0], "name", &f);
    f = feat_floats(x1, 2, false);
    features_add(&feats[1], "other", &f);
    features_add(&feats[1], "x", &f);
    for (int i = 0; i < 3; i++) ex[i] = example_of(&feats[i]);

    int64_t one = 1;
    const float dxv[1] = {0.5f};
    static const char *const dname[1] = {"nobody"};
    kiln_status st = run_parse(serialized(1, ex, 3), floats(1, &one, dxv),
                               ints(KILN_DTYPE_I64, 0, NULL, (const int64_t[]){7}),
                               strings(1, &one, dname), out, &t);
    CHECK(st == KILN_OK, "parse: %s", kiln_last_error());
    if (st == KILN_OK) {
        const struct kiln_type *ty = tg_out_type(&t, 0);
        CHECK(ty->dtype == KILN_DTYPE_F32 && ty->rank == 2 && ty->dims[0] == -1 &&
                  ty->dims[1] == 2,
              "static type of x: rank %d", ty->rank);
        ty = tg_out_type(&t, 1);
        CHECK(ty->dtype == KILN_DTYPE_I64 && ty->rank == 1, "static type of id");
        CHECK(shape_is(out[0], 2, (const int64_t[]){3, 2}), "x shape");
        CHECK(shape_is(out[1], 1, (const int64_t[]){3}), "id shape");
        CHECK(shape_is(out[2], 2, (const int64_t[]){3, 1}), "name shape");
        const float *x = out[0]->data;
        CHECK(x[0] == 1.5f && x[1] == -2.0f && x[2] == 3.0f && x[3] == 4.25f && x[4] == 0.5f &&
                  x[5] == 0.5f,
              "x values %g %g %g %g %g %g", x[0], x[1], x[2], x[3], x[4], x[5]);
        const int64_t *id = out[1]->data;
        CHECK(id[0] == -5 && id[1] == 7 && id[2] == 7, "id values %lld %lld %lld",
              (long long)id[0], (long long)id[1], (long long)id[2]);
        CHECK(strings_are(out[2], (const char *const[]){"alice", "nobody", "nobody"}, 3),
              "name values");
    }
    tg_free(&t, out);

    /* a scalar serialized Example: outputs are the dense shapes; unpacked int64 */
    memset(&feats[3], 0, sizeof feats[3]);
    f = feat_floats(x1, 2, true);
    features_add(&feats[3], "x", &f);
    f = feat_int64s(id1, 1, false);
    features_add(&feats[3], "id", &f);
    f = feat_bytes(name0, 1);
    features_add(&feats[3], "name", &f);
    ex[3] = example_of(&feats[3]);
    memset(out, 0, sizeof out);
    st = run_parse(serialized(0, &ex[3], 1), NULL, NULL, NULL, out, &t);
    CHECK(st == KILN_OK, "scalar parse: %s", kiln_last_error());
    if (st == KILN_OK) {
        CHECK(shape_is(out[0], 1, (const int64_t[]){2}), "scalar x shape");
        CHECK(shape_is(out[1], 0, NULL), "scalar id shape");
        CHECK(((int64_t *)out[1]->data)[0] == 1234567890123LL, "unpacked int64");
        CHECK(((float *)out[0]->data)[1] == 4.25f, "packed float");
    }
    tg_free(&t, out);

    /* a required feature that is missing names the key and the example */
    memset(out, 0, sizeof out);
    st = run_parse(serialized(1, ex, 2), NULL, NULL, NULL, out, &t);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "'id'") &&
              strstr(kiln_last_error(), "example 1") && strstr(kiln_last_error(), "required"),
          "missing required: %s", kiln_last_error());
    tg_free(&t, out);

    /* a float_list for an int64 feature */
    struct buf bad = {0};
    f = feat_floats(x0, 2, true);
    features_add(&bad, "x", &f);
    f = feat_floats(x0, 1, true);
    features_add(&bad, "id", &f);
    struct buf exb = example_of(&bad);
    memset(out, 0, sizeof out);
    st = run_parse(serialized(1, &exb, 1), NULL,
                   ints(KILN_DTYPE_I64, 0, NULL, (const int64_t[]){0}),
                   strings(1, &one, dname), out, &t);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "'id'") &&
              strstr(kiln_last_error(), "float_list") && strstr(kiln_last_error(), "example 0"),
          "wrong kind: %s", kiln_last_error());
    tg_free(&t, out);

    /* three floats for a [2] feature */
    const float x3[3] = {1, 2, 3};
    memset(&bad, 0, sizeof bad);
    f = feat_floats(x3, 3, false);
    features_add(&bad, "x", &f);
    exb = example_of(&bad);
    memset(out, 0, sizeof out);
    st = run_parse(serialized(1, &exb, 1), NULL,
                   ints(KILN_DTYPE_I64, 0, NULL, (const int64_t[]){0}),
                   strings(1, &one, dname), out, &t);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "has 3 float values"),
          "wrong count: %s", kiln_last_error());
    tg_free(&t, out);

    /* a key given twice: the last entry wins; an entry with no list set is skipped */
    memset(&bad, 0, sizeof bad);
    f = feat_floats(x0, 2, true);
    features_add(&bad, "x", &f);
    f = feat_floats(x1, 2, true);
    features_add(&bad, "x", &f);
    struct buf empty = {0};
    features_add(&bad, "x", &empty);
    exb = example_of(&bad);
    memset(out, 0, sizeof out);
    st = run_parse(serialized(1, &exb, 1), NULL,
                   ints(KILN_DTYPE_I64, 0, NULL, (const int64_t[]){0}),
                   strings(1, &one, dname), out, &t);
    CHECK(st == KILN_OK && ((float *)out[0]->data)[0] == 3.0f, "last entry wins: %s",
          kiln_last_error());
    tg_free(&t, out);

    /* unknown fields are skipped; a Feature with no list set counts as absent */
    memset(&bad, 0, sizeof bad);
    struct buf unknown = {0};
    put_tag(&unknown, 7, 0);
    put_varint(&unknown, 300);
    features_add(&bad, "x", &unknown);
    put_tag(&bad, 9, 5);
    put_f32(&bad, 1.0f);
    exb = example_of(&bad);
    put_tag(&exb, 4, 1);
    for (int i = 0; i < 8; i++) put_byte(&exb, 0xff);
    memset(out, 0, sizeof out);
    st = run_parse(serialized(1, &exb, 1), floats(1, &one, dxv),
                   ints(KILN_DTYPE_I64, 0, NULL, (const int64_t[]){0}),
                   strings(1, &one, dname), out, &t);
    CHECK(st == KILN_OK && ((float *)out[0]->data)[0] == 0.5f && ((float *)out[0]->data)[1] == 0.5f,
          "unknown fields: %s", kiln_last_error());
    tg_free(&t, out);

    /* a packed float list whose length is not a multiple of 4 */
    memset(&bad, 0, sizeof bad);
    struct buf list = {0}, feat = {0};
    put_bytes(&list, 1, "12345", 5);
    put_bytes(&feat, 2, list.d, list.n);
    features_add(&bad, "x", &feat);
    exb = example_of(&bad);
    memset(out, 0, sizeof out);
    st = run_parse(serialized(1, &exb, 1), NULL, NULL, NULL, out, &t);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "'x'") &&
              strstr(kiln_last_error(), "malformed"),
          "bad packed floats: %s", kiln_last_error());
    tg_free(&t, out);

    /* a group (wire type 3) and an 11-byte varint are malformed */
    for (int k = 0; k < 2; k++) {
        memset(&bad, 0, sizeof bad);
        if (k == 0) {
            put_tag(&bad, 2, 3);
        } else {
            put_tag(&bad, 2, 0);
            for (int i = 0; i < 10; i++) put_byte(&bad, 0x80);
            put_byte(&bad, 0);
        }
        exb = example_of(&bad);
        memset(out, 0, sizeof out);
        st = run_parse(serialized(1, &exb, 1), NULL, NULL, NULL, out, &t);
        CHECK(st == KILN_ERR_INVALID_ARGUMENT &&
                  strstr(kiln_last_error(), "not a valid tf.Example"),
              "malformed case %d: %s", k, kiln_last_error());
        tg_free(&t, out);
    }

    /* every truncation of a valid Example is an error naming it, never a crash */
    int truncated_ok = 0;
    for (size_t cut = 1; cut < ex[0].n; cut++) {
        struct buf part = ex[0];
        part.n = cut;
        memset(out, 0, sizeof out);
        st = run_parse(serialized(1, &part, 1), NULL, NULL, NULL, out, &t);
        if (st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "example 0"))
            truncated_ok++;
        else
            fprintf(stderr, "  cut %zu: %s\n", cut, kiln_last_error());
        tg_free(&t, out);
    }
    CHECK(truncated_ok == (int)ex[0].n - 1, "truncations: %d of %zu rejected", truncated_ok,
          ex[0].n - 1);

    /* flipped bits and bytes: any answer but a crash (the sanitizer build watches) */
    unsigned seed = 12345;
    for (int trial = 0; trial < 3000; trial++) {
        struct buf m = ex[0];
        for (int k = 0; k < 1 + trial % 3; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % m.n;
            seed = seed * 1103515245u + 12345u;
            if (trial % 2) m.d[at] ^= (uint8_t)(1u << ((seed >> 16) % 8));
            else m.d[at] = (uint8_t)(seed >> 16);
        }
        memset(out, 0, sizeof out);
        st = run_parse(serialized(1, &m, 1), NULL, NULL, NULL, out, &t);
        if (st != KILN_OK && st != KILN_ERR_INVALID_ARGUMENT) {
            CHECK(false, "corrupted example %d: %s", trial, kiln_last_error());
            tg_free(&t, out);
            break;
        }
        tg_free(&t, out);
    }

    /* a default of the wrong size is a model error at load */
    memset(out, 0, sizeof out);
    const float d3[3] = {0, 0, 0};
    int64_t three = 3;
    st = run_parse(serialized(1, ex, 1), floats(1, &three, d3), NULL, NULL, out, &t);
    CHECK(st == KILN_ERR_INVALID_MODEL && strstr(kiln_last_error(), "'x'"),
          "bad default: %s", kiln_last_error());
    tg_free(&t, out);

    /* bad attributes */
    tg_init(&t);
    int in0 = tg_input(&t, KILN_DTYPE_STRING, 1, (const int64_t[]){-1});
    tg_node(&t, KILN_OP_TfParseExample, &in0, 1, 1, 0);
    memset(out, 0, sizeof out);
    kiln_tensor *s1 = serialized(1, ex, 1);
    st = tg_run(&t, &s1, out);
    CHECK(st == KILN_ERR_INVALID_MODEL, "inputs and outputs disagree: %s", kiln_last_error());
    kiln_tensor_free(s1);
    tg_free(&t, out);
}

/* ---- TfStringJoin ---- */

static void test_string_join(void)
{
    struct test_graph t;
    kiln_tensor *out[1] = {0};
    tg_init(&t);
    int ins[3] = {
        tg_const(&t, strings(2, (const int64_t[]){2, 1}, (const char *const[]){"a", "b"})),
        tg_const(&t, strings(1, (const int64_t[]){3}, (const char *const[]){"x", "y", "z"})),
        tg_const(&t, strings(0, NULL, (const char *const[]){"!"})),
    };
    tg_node(&t, KILN_OP_TfStringJoin, ins, 3, 1, 1);
    attr_str(&t, "separator", "-");
    kiln_status st = tg_run(&t, NULL, out);
    CHECK(st == KILN_OK, "string join: %s", kiln_last_error());
    if (st == KILN_OK) {
        CHECK(shape_is(out[0], 2, (const int64_t[]){2, 3}), "join shape");
        CHECK(strings_are(out[0],
                          (const char *const[]){"a-x-!", "a-y-!", "a-z-!", "b-x-!", "b-y-!",
                                                "b-z-!"},
                          6),
              "join values");
        const struct kiln_type *ty = tg_out_type(&t, 0);
        CHECK(ty->dtype == KILN_DTYPE_STRING && ty->rank == 2 && ty->dims[1] == 3,
              "join static type");
    }
    tg_free(&t, out);

    /* string Add as the importer lowers it: no separator */
    tg_init(&t);
    int a = tg_input(&t, KILN_DTYPE_STRING, -1, NULL);
    int b = tg_input(&t, KILN_DTYPE_STRING, -1, NULL);
    tg_node(&t, KILN_OP_TfStringJoin, (const int[]){a, b}, 2, 1, 0);
    kiln_tensor *in[2] = {strings(1, (const int64_t[]){2}, (const char *const[]){"foo", ""}),
                          strings(1, (const int64_t[]){2}, (const char *const[]){"bar", "baz"})};
    out[0] = NULL;
    st = tg_run(&t, in, out);
    CHECK(st == KILN_OK && strings_are(out[0], (const char *const[]){"foobar", "baz"}, 2),
          "string add: %s", kiln_last_error());
    kiln_tensor_free(in[0]);
    kiln_tensor_free(in[1]);
    tg_free(&t, out);

    /* shapes that do not broadcast */
    tg_init(&t);
    a = tg_input(&t, KILN_DTYPE_STRING, -1, NULL);
    b = tg_input(&t, KILN_DTYPE_STRING, -1, NULL);
    tg_node(&t, KILN_OP_TfStringJoin, (const int[]){a, b}, 2, 1, 0);
    in[0] = strings(1, (const int64_t[]){2}, (const char *const[]){"a", "b"});
    in[1] = strings(1, (const int64_t[]){3}, (const char *const[]){"a", "b", "c"});
    out[0] = NULL;
    st = tg_run(&t, in, out);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT, "no broadcast: %s", kiln_last_error());
    kiln_tensor_free(in[0]);
    kiln_tensor_free(in[1]);
    tg_free(&t, out);
}

/* ---- TfReduceJoin ---- */

/* ReduceJoin of x over axes (NULL: a 1-D int32 list of n) with the given attributes. */
static kiln_status run_reduce_join(kiln_tensor *x, const int64_t *axes, int n, bool scalar_axis,
                                   int keep, const char *sep, kiln_tensor **out)
{
    struct test_graph t;
    tg_init(&t);
    int64_t nn = n;
    int ins[2] = {tg_const(&t, x),
                  tg_const(&t, ints(KILN_DTYPE_I32, scalar_axis ? 0 : 1, &nn, axes))};
    tg_node(&t, KILN_OP_TfReduceJoin, ins, 2, 1, 2);
    attr_int(&t, "keep_dims", keep);
    attr_str(&t, "separator", sep);
    kiln_status st = tg_run(&t, NULL, out);
    kiln_graph_free(t.g);
    return st;
}

static void test_reduce_join(void)
{
    const int64_t d22[2] = {2, 2};
    static const char *const abcd[4] = {"a", "b", "c", "d"};
    kiln_tensor *y = NULL;
    struct {
        int64_t axes[3];
        int n;
        bool scalar;
        int keep;
        const char *sep;
        int rank;
        int64_t dims[2];
        const char *want[4];
    } cases[] = {
        {{0}, 1, true, 0, "", 1, {2}, {"ac", "bd"}},
        {{1}, 1, false, 0, "", 1, {2}, {"ab", "cd"}},
        {{-2}, 1, false, 0, "", 1, {2}, {"ac", "bd"}},
        {{0}, 1, false, 1, "", 2, {1, 2}, {"ac", "bd"}},
        {{-1}, 1, false, 1, "", 2, {2, 1}, {"ab", "cd"}},
        {{0}, 1, false, 0, ".", 1, {2}, {"a.c", "b.d"}},
        {{0, 1}, 2, false, 0, "", 0, {0}, {"acbd"}},
        {{1, 0}, 2, false, 0, "", 0, {0}, {"abcd"}},
        {{1, 0}, 2, false, 1, " ", 2, {1, 1}, {"a b c d"}},
        {{0}, 0, false, 0, "", 2, {2, 2}, {"a", "b", "c", "d"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        y = NULL;
        kiln_status st = run_reduce_join(strings(2, d22, abcd), cases[i].axes, cases[i].n,
                                         cases[i].scalar, cases[i].keep, cases[i].sep, &y);
        int64_t count = kiln_shape_count(cases[i].rank, cases[i].dims);
        CHECK(st == KILN_OK && shape_is(y, cases[i].rank, cases[i].dims) &&
                  strings_are(y, cases[i].want, count),
              "reduce join case %zu: %s", i, st == KILN_OK ? "wrong output" : kiln_last_error());
        kiln_tensor_free(y);
    }

    /* rank 3, reducing the outer and inner axes */
    static const char *const v8[8] = {"0", "1", "2", "3", "4", "5", "6", "7"};
    y = NULL;
    kiln_status st = run_reduce_join(strings(3, (const int64_t[]){2, 2, 2}, v8),
                                     (const int64_t[]){2, 0}, 2, false, 0, ",", &y);
    CHECK(st == KILN_OK && shape_is(y, 1, (const int64_t[]){2}) &&
              strings_are(y, (const char *const[]){"0,1,4,5", "2,3,6,7"}, 2),
          "rank 3: %s", kiln_last_error());
    kiln_tensor_free(y);

    /* an empty axis joins nothing into "" */
    y = NULL;
    st = run_reduce_join(strings(2, (const int64_t[]){2, 0}, NULL), (const int64_t[]){1}, 1,
                         false, 0, "-", &y);
    CHECK(st == KILN_OK && strings_are(y, (const char *const[]){"", ""}, 2), "empty axis: %s",
          kiln_last_error());
    kiln_tensor_free(y);

    y = NULL;
    st = run_reduce_join(strings(2, d22, abcd), (const int64_t[]){0, -2}, 2, false, 0, "", &y);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "repeated"),
          "duplicate axis: %s", kiln_last_error());
    kiln_tensor_free(y);
    y = NULL;
    st = run_reduce_join(strings(2, d22, abcd), (const int64_t[]){2}, 1, false, 0, "", &y);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "out of range"),
          "axis out of range: %s", kiln_last_error());
    kiln_tensor_free(y);

    /* axes known only at run time: the static type keeps the rank it can */
    struct test_graph t;
    tg_init(&t);
    int x = tg_input(&t, KILN_DTYPE_STRING, 2, d22);
    int ax = tg_input(&t, KILN_DTYPE_I64, 1, (const int64_t[]){1});
    tg_node(&t, KILN_OP_TfReduceJoin, (const int[]){x, ax}, 2, 1, 0);
    kiln_tensor *in[2] = {strings(2, d22, abcd), ints(KILN_DTYPE_I64, 1, (const int64_t[]){1},
                                                       (const int64_t[]){-1})};
    kiln_tensor *out[1] = {0};
    st = tg_run(&t, in, out);
    CHECK(st == KILN_OK && tg_out_type(&t, 0)->rank == 1 &&
              strings_are(out[0], (const char *const[]){"ab", "cd"}, 2),
          "run-time axes: %s", kiln_last_error());
    kiln_tensor_free(in[0]);
    kiln_tensor_free(in[1]);
    tg_free(&t, out);
}

/* ---- TfStringSplit ---- */

/* Split input[n] by delim; check the tokens and the dense shape. */
static void check_split(const char *what, const char *const *input, int64_t n, const char *delim,
                        int v2, int skip_empty, int64_t maxsplit, const char *const *want_tokens,
                        const int64_t *want_rows, int64_t want_count)
{
    struct test_graph t;
    tg_init(&t);
    int x = tg_input(&t, KILN_DTYPE_STRING, 1, &n);
    int d = tg_const(&t, strings(0, NULL, &delim));
    tg_node(&t, KILN_OP_TfStringSplit, (const int[]){x, d}, 2, 3, 3);
    attr_int(&t, "v2", v2);
    attr_int(&t, "skip_empty", skip_empty);
    attr_int(&t, "maxsplit", maxsplit);
    kiln_tensor *in = strings(1, &n, input), *out[3] = {0};
    kiln_status st = tg_run(&t, &in, out);
    CHECK(st == KILN_OK, "%s: %s", what, kiln_last_error());
    if (st == KILN_OK) {
        CHECK(shape_is(out[0], 2, (const int64_t[]){want_count, 2}), "%s: indices shape", what);
        CHECK(strings_are(out[1], want_tokens, want_count), "%s: tokens", what);
        const int64_t *ind = out[0]->data, *shape = out[2]->data;
        int64_t most = 0, run = 0;
        bool ok = true;
        for (int64_t i = 0; i < want_count; i++) {
            run = i && want_rows[i] == want_rows[i - 1] ? run + 1 : 0;
            if (run + 1 > most) most = run + 1;
            ok &= ind[2 * i] == want_rows[i] && ind[2 * i + 1] == run;
        }
        CHECK(ok, "%s: indices", what);
        CHECK(shape[0] == n && shape[1] == most, "%s: dense shape [%lld, %lld]", what,
              (long long)shape[0], (long long)shape[1]);
        const struct kiln_type *ty = tg_out_type(&t, 1);
        CHECK(ty->dtype == KILN_DTYPE_STRING && ty->rank == 1, "%s: static type", what);
    }
    kiln_tensor_free(in);
    tg_free(&t, out);
}

static void test_string_split(void)
{
    static const char *const in3[3] = {"a b  c", "", "x"};
    check_split("v1 skip_empty", in3, 3, " ", 0, 1, -1, (const char *const[]){"a", "b", "c", "x"},
                (const int64_t[]){0, 0, 0, 2}, 4);
    check_split("v1 keep empty", in3, 3, " ", 0, 0, -1,
                (const char *const[]){"a", "b", "", "c", "", "x"},
                (const int64_t[]){0, 0, 0, 0, 1, 2}, 6);
    static const char *const set[1] = {"a,b c,,d"};
    check_split("v1 delimiter set", set, 1, ", ", 0, 1, -1,
                (const char *const[]){"a", "b", "c", "d"}, (const int64_t[]){0, 0, 0, 0}, 4);
    static const char *const bytes[2] = {"hey", ""};
    check_split("v1 empty delimiter", bytes, 2, "", 0, 1, -1, (const char *const[]){"h", "e", "y"},
                (const int64_t[]){0, 0, 0}, 3);

    static const char *const v2in[3] = {"1,,2", "", "3,"};
    check_split("v2 keeps empty tokens", v2in, 3, ",", 1, 1, -1,
                (const char *const[]){"1", "", "2", "", "3", ""},
                (const int64_t[]){0, 0, 0, 1, 2, 2}, 6);
    static const char *const multi[1] = {"1<>2<>3"};
    check_split("v2 string delimiter", multi, 1, "<>", 1, 1, -1,
                (const char *const[]){"1", "2", "3"}, (const int64_t[]){0, 0, 0}, 3);
    static const char *const ws[3] = {"  a b\t\n c ", "   ", ""};
    check_split("v2 whitespace", ws, 3, "", 1, 1, -1, (const char *const[]){"a", "b", "c"},
                (const int64_t[]){0, 0, 0}, 3);
    static const char *const ms[2] = {"a,b,c", "  a b  c "};
    check_split("v2 maxsplit", ms, 1, ",", 1, 1, 1, (const char *const[]){"a", "b,c"},
                (const int64_t[]){0, 0}, 2);
    check_split("v2 whitespace maxsplit", ms + 1, 1, "", 1, 1, 1,
                (const char *const[]){"a", "b  c "}, (const int64_t[]){0, 0}, 2);
    check_split("v2 maxsplit 0", ms + 1, 1, "", 1, 1, 0, (const char *const[]){"  a b  c "},
                (const int64_t[]){0}, 1);

    /* a matrix input is rejected */
    struct test_graph t;
    tg_init(&t);
    int x = tg_input(&t, KILN_DTYPE_STRING, -1, NULL);
    int d = tg_const(&t, strings(0, NULL, (const char *const[]){" "}));
    tg_node(&t, KILN_OP_TfStringSplit, (const int[]){x, d}, 2, 3, 0);
    kiln_tensor *in = strings(2, (const int64_t[]){1, 1}, (const char *const[]){"a b"});
    kiln_tensor *out[3] = {0};
    kiln_status st = tg_run(&t, &in, out);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT, "rank 2 input: %s", kiln_last_error());
    kiln_tensor_free(in);
    tg_free(&t, out);
}

/* ---- TfListSetItem (src/kernels/ref/tf_list.c) ---- */

/* SetItem(list, index, item) (resize: growing the list); out[0] receives the result. */
static kiln_status run_set_item_r(kiln_tensor *list, int64_t index, kiln_tensor *item, int resize,
                                  kiln_tensor **out)
{
    struct test_graph t;
    tg_init(&t);
    int ins[3] = {tg_input(&t, list->dtype, -1, NULL),
                  tg_const(&t, ints(KILN_DTYPE_I32, 0, NULL, &index)),
                  tg_input(&t, item->dtype, -1, NULL)};
    tg_node(&t, KILN_OP_TfListSetItem, ins, 3, 1, 1);
    if (resize) attr_int(&t, "resize", 1);
    kiln_tensor *in[2] = {list, item};
    out[0] = NULL;
    kiln_status st = tg_run(&t, in, out);
    kiln_graph_free(t.g);
    kiln_tensor_free(list);
    kiln_tensor_free(item);
    return st;
}

static kiln_status run_set_item(kiln_tensor *list, int64_t index, kiln_tensor *item,
                                kiln_tensor **out)
{
    return run_set_item_r(list, index, item, 0, out);
}

static void test_list_set_item(void)
{
    kiln_tensor *out[1];
    const int64_t d32[2] = {3, 2}, d2[1] = {2}, d3[1] = {3}, d30[2] = {3, 0};
    /* an element replaced, the rest kept */
    kiln_status st = run_set_item(ints(KILN_DTYPE_I32, 2, d32, (const int64_t[]){1, 2, 3, 4, 5, 6}),
                                  1, ints(KILN_DTYPE_I32, 1, d2, (const int64_t[]){7, 8}), out);
    CHECK(st == KILN_OK && shape_is(out[0], 2, d32), "set item: %s", kiln_last_error());
    if (st == KILN_OK) {
        const int32_t want[6] = {1, 2, 7, 8, 5, 6};
        CHECK(memcmp(out[0]->data, want, sizeof want) == 0, "set item values");
    }
    kiln_tensor_free(out[0]);
    /* a list reserved without an element shape ([3, 0]) takes the item's */
    st = run_set_item(ints(KILN_DTYPE_I32, 2, d30, NULL), 2,
                      ints(KILN_DTYPE_I32, 1, d3, (const int64_t[]){4, 5, 6}), out);
    CHECK(st == KILN_OK && shape_is(out[0], 2, (const int64_t[]){3, 3}), "lazy list: %s",
          kiln_last_error());
    if (st == KILN_OK) {
        const int32_t want[9] = {0, 0, 0, 0, 0, 0, 4, 5, 6};
        CHECK(memcmp(out[0]->data, want, sizeof want) == 0, "lazy list values");
    }
    kiln_tensor_free(out[0]);
    /* resize: an index past the end grows the list, zeros between */
    st = run_set_item_r(ints(KILN_DTYPE_I32, 2, d32, (const int64_t[]){1, 2, 3, 4, 5, 6}), 4,
                        ints(KILN_DTYPE_I32, 1, d2, (const int64_t[]){7, 8}), 1, out);
    CHECK(st == KILN_OK && shape_is(out[0], 2, (const int64_t[]){5, 2}), "grow: %s",
          kiln_last_error());
    if (st == KILN_OK) {
        const int32_t want[10] = {1, 2, 3, 4, 5, 6, 0, 0, 7, 8};
        CHECK(memcmp(out[0]->data, want, sizeof want) == 0, "grow values");
    }
    kiln_tensor_free(out[0]);
    /* errors: index out of range, negative index, wrong item shape, wrong dtype */
    st = run_set_item(ints(KILN_DTYPE_I32, 2, d32, (const int64_t[]){1, 2, 3, 4, 5, 6}), 3,
                      ints(KILN_DTYPE_I32, 1, d2, (const int64_t[]){7, 8}), out);
    CHECK(st != KILN_OK && strstr(kiln_last_error(), "out of range"), "index 3: %s",
          kiln_last_error());
    st = run_set_item(ints(KILN_DTYPE_I32, 2, d32, (const int64_t[]){1, 2, 3, 4, 5, 6}), -1,
                      ints(KILN_DTYPE_I32, 1, d2, (const int64_t[]){7, 8}), out);
    CHECK(st != KILN_OK && strstr(kiln_last_error(), "out of range"), "index -1: %s",
          kiln_last_error());
    st = run_set_item(ints(KILN_DTYPE_I32, 2, d32, (const int64_t[]){1, 2, 3, 4, 5, 6}), 0,
                      ints(KILN_DTYPE_I32, 1, d3, (const int64_t[]){7, 8, 9}), out);
    CHECK(st != KILN_OK && strstr(kiln_last_error(), "does not fit"), "shape: %s",
          kiln_last_error());
    st = run_set_item(ints(KILN_DTYPE_I32, 2, d32, (const int64_t[]){1, 2, 3, 4, 5, 6}), 0,
                      ints(KILN_DTYPE_I64, 1, d2, (const int64_t[]){7, 8}), out);
    CHECK(st != KILN_OK && strstr(kiln_last_error(), "dtype"), "dtype: %s", kiln_last_error());
}

int main(void)
{
    test_parse_example();
    test_string_join();
    test_reduce_join();
    test_string_split();
    test_list_set_item();
    return CHECK_DONE();
}
