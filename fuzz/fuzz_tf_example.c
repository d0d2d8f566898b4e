/*
 * fuzz_tf_example.c - libFuzzer target for the tf.Example parser inside the
 * TfParseExample reference kernel (src/kernels/ref/tf_ops.c), which reads
 * the serialized examples of :classify / :regress requests and of
 * SavedModels that take tf.Example input.
 *
 * Each input is one serialized tf.Example. The op is INTERNAL (no model
 * file can name it), so, as tests/c/test_tf_ops.c does, the target builds
 * one-node IR graphs and runs them with kiln_exec_run:
 *
 *   1. serialized is a scalar holding the bytes; dense features "f" float
 *      [2], "i" int64 [] and "s" string [1], each with a one-element
 *      default (broadcast);
 *   2. serialized is [bytes, "", bytes]; "f" float [1,2], "i" int64 [1],
 *      "s" string [] and "b" string [2], each with a full default (the
 *      empty example takes them all; the others fill rows 0 and 2);
 *   3. serialized is [bytes]; "f", "i" and "s" as in 1, all required.
 *
 * A run must succeed or fail with a message; a success must give each
 * dense output the dtype and the [batch] + dense shape the op's contract
 * promises, with every string element readable. Anything else aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"
#include "import/model.h"
#include "ir/graph.h"

#define FEAT_MAX 4

/* One dense feature: key, dtype, dense shape, and its default (n_def
 * elements of f, i or s by dtype; 0 elements: required). */
struct feat {
    const char *key;
    kiln_dtype dt;
    int rank;
    int64_t dims[2];
    int n_def;
    float f[3];
    int64_t i[3];
    const char *s[3];
};

struct config {
    int batch;     /* 0: scalar serialized; else the vector's length */
    int n;         /* dense features */
    struct feat feat[FEAT_MAX];
};

static const struct config configs[] = {
    {0, 3,
     {{"f", KILN_DTYPE_F32, 1, {2}, 1, {0.5f}, {0}, {NULL}},
      {"i", KILN_DTYPE_I64, 0, {0}, 1, {0}, {7}, {NULL}},
      {"s", KILN_DTYPE_STRING, 1, {1}, 1, {0}, {0}, {"none"}}}},
    {3, 4,
     {{"f", KILN_DTYPE_F32, 2, {1, 2}, 2, {1.0f, 2.0f}, {0}, {NULL}},
      {"i", KILN_DTYPE_I64, 1, {1}, 1, {0}, {-1}, {NULL}},
      {"s", KILN_DTYPE_STRING, 0, {0}, 1, {0}, {0}, {""}},
      {"b", KILN_DTYPE_STRING, 1, {2}, 2, {0}, {0}, {"x", "yy"}}}},
    {1, 3,
     {{"f", KILN_DTYPE_F32, 1, {2}, 0, {0}, {0}, {NULL}},
      {"i", KILN_DTYPE_I64, 0, {0}, 0, {0}, {0}, {NULL}},
      {"s", KILN_DTYPE_STRING, 1, {1}, 0, {0}, {0}, {NULL}}}},
};

/* Give up quietly when the harness itself runs out of memory. */
#define NEED(x)                  \
    do {                         \
        if (!(x)) goto out_free; \
    } while (0)

/* The default tensor of feature ft (a vector of n_def elements). */
static kiln_tensor *default_of(const struct feat *ft)
{
    int64_t n = ft->n_def;
    kiln_tensor *t;
    if (kiln_tensor_create(ft->dt, 1, &n, &t) != KILN_OK) return NULL;
    for (int k = 0; k < ft->n_def; k++) {
        if (ft->dt == KILN_DTYPE_F32) {
            ((float *)t->data)[k] = ft->f[k];
        } else if (ft->dt == KILN_DTYPE_I64) {
            ((int64_t *)t->data)[k] = ft->i[k];
        } else if (kiln_tensor_set_string(t, (size_t)k, ft->s[k], strlen(ft->s[k])) != KILN_OK) {
            kiln_tensor_free(t);
            return NULL;
        }
    }
    return t;
}

/* The serialized input: the bytes as a scalar, or [bytes, "", bytes, ...]. */
static kiln_tensor *serialized_of(const struct config *c, const uint8_t *data, size_t size)
{
    int64_t n = c->batch;
    kiln_tensor *t;
    if (kiln_tensor_create(KILN_DTYPE_STRING, c->batch ? 1 : 0, &n, &t) != KILN_OK) return NULL;
    int64_t count = kiln_tensor_count(t);
    for (int64_t k = 0; k < count; k++) {
        int empty = k % 2 == 1;
        if (kiln_tensor_set_string(t, (size_t)k, empty ? "" : (const char *)data,
                                   empty ? 0 : size) != KILN_OK) {
            kiln_tensor_free(t);
            return NULL;
        }
    }
    return t;
}

/* The output of a successful run must be what the contract promises. */
static void check_output(const struct config *c, int d, const kiln_tensor *out)
{
    const struct feat *ft = &c->feat[d];
    int b = c->batch ? 1 : 0;
    int ok = out && out->dtype == ft->dt && out->rank == b + ft->rank;
    if (ok && b) ok = out->dims[0] == c->batch;
    for (int k = 0; ok && k < ft->rank; k++) ok = out->dims[b + k] == ft->dims[k];
    if (!ok) {
        fprintf(stderr, "fuzz_tf_example: output '%s' has the wrong dtype or shape\n", ft->key);
        abort();
    }
    if (out->dtype == KILN_DTYPE_STRING) {
        const kiln_string *s = out->data;
        for (int64_t k = 0; k < kiln_tensor_count(out); k++)
            if (s[k].len) (void)*(volatile const char *)&s[k].data[s[k].len - 1];
    }
}

static void run_config(const struct config *c, const uint8_t *data, size_t size)
{
    struct kiln_graph *g = NULL;
    kiln_tensor *ser = NULL;
    kiln_tensor *out[FEAT_MAX] = {0};
    if (kiln_graph_new(&g) != KILN_OK) return;
    g->inputs = kiln_arena_alloc(g->mem, sizeof(int));
    g->outputs = kiln_arena_alloc(g->mem, sizeof(int) * FEAT_MAX);
    NEED(g->inputs && g->outputs);

    int ins[1 + FEAT_MAX];
    NEED(kiln_graph_value_add(g, "serialized", KILN_VALUE_INPUT, &ins[0]) == KILN_OK);
    g->values[ins[0]].type.dtype = KILN_DTYPE_STRING;
    g->values[ins[0]].type.rank = c->batch ? 1 : 0;
    g->values[ins[0]].type.dims[0] = -1;
    g->inputs[g->n_inputs++] = ins[0];
    for (int d = 0; d < c->n; d++) {
        kiln_tensor *def = default_of(&c->feat[d]);
        NEED(def);
        if (kiln_graph_own_tensor(g, def) != KILN_OK) {
            kiln_tensor_free(def);
            goto out_free;
        }
        NEED(kiln_graph_value_add(g, "default", KILN_VALUE_CONST, &ins[1 + d]) == KILN_OK);
        g->values[ins[1 + d]].konst = def;
        kiln_type_from_tensor(&g->values[ins[1 + d]].type, def);
    }

    struct kiln_node *n;
    NEED(kiln_graph_node_add(g, KILN_OP_TfParseExample, "parse", 1 + c->n, c->n, 4, &n) ==
         KILN_OK);
    for (int k = 0; k < 1 + c->n; k++) n->in[k] = ins[k];
    for (int d = 0; d < c->n; d++) {
        int id;
        NEED(kiln_graph_value_add(g, c->feat[d].key, KILN_VALUE_NODE, &id) == KILN_OK);
        g->values[id].producer = g->n_nodes - 1;
        n->out[d] = id;
        g->outputs[g->n_outputs++] = id;
    }
    /* dense_keys, dense_types, dense_ranks, dense_shapes */
    struct kiln_attr *a = n->attr;
    n->n_attr = 4;
    a[0].name = "dense_keys";
    a[0].type = KILN_ATTR_STRINGS;
    a[0].n = c->n;
    a[0].strings = kiln_arena_alloc(g->mem, sizeof(kiln_string) * FEAT_MAX);
    a[1].name = "dense_types";
    a[1].type = KILN_ATTR_INTS;
    a[1].n = c->n;
    a[1].ints = kiln_arena_alloc(g->mem, sizeof(int64_t) * FEAT_MAX);
    a[2].name = "dense_ranks";
    a[2].type = KILN_ATTR_INTS;
    a[2].n = c->n;
    a[2].ints = kiln_arena_alloc(g->mem, sizeof(int64_t) * FEAT_MAX);
    a[3].name = "dense_shapes";
    a[3].type = KILN_ATTR_INTS;
    a[3].n = 0;
    a[3].ints = kiln_arena_alloc(g->mem, sizeof(int64_t) * 2 * FEAT_MAX);
    NEED(a[0].strings && a[1].ints && a[2].ints && a[3].ints);
    for (int d = 0; d < c->n; d++) {
        const struct feat *ft = &c->feat[d];
        a[0].strings[d].len = strlen(ft->key);
        a[0].strings[d].data = kiln_arena_strdup(g->mem, ft->key);
        NEED(a[0].strings[d].data);
        a[1].ints[d] = ft->dt;
        a[2].ints[d] = ft->rank;
        for (int k = 0; k < ft->rank; k++) a[3].ints[a[3].n++] = ft->dims[k];
    }

    ser = serialized_of(c, data, size);
    NEED(ser);
    kiln_status st = kiln_graph_verify(g);
    if (st == KILN_OK) st = kiln_graph_infer(g);
    if (st != KILN_OK) { /* the graph is fixed: it must always verify and infer */
        fprintf(stderr, "fuzz_tf_example: the harness graph is rejected: %s\n", kiln_last_error());
        abort();
    }
    st = kiln_exec_run(g, NULL, &ser, out);
    if (st == KILN_OK) {
        for (int d = 0; d < c->n; d++) check_output(c, d, out[d]);
    } else {
        /* A failure must come with a message; reading it checks it is a string. */
        const char *msg = kiln_last_error();
        if (!msg || !*msg) abort();
        (void)*(volatile const char *)msg;
    }

out_free:
    for (int d = 0; d < FEAT_MAX; d++) kiln_tensor_free(out[d]);
    kiln_tensor_free(ser);
    kiln_graph_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++)
        run_config(&configs[k], data, size);
    return 0;
}
