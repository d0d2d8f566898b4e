/*
 * emit_onnx.c - kiln_session_write_onnx (kiln.h): write a statically
 * quantized session as an ONNX QDQ model, so that ONNX Runtime (or any ONNX
 * tool) runs exactly the quantization Kiln runs (`kiln compile --emit-onnx`,
 * docs/COMPRESSION.md).
 *
 * Calibration (calibration.c) leaves the session the targets and ranges it
 * quantized with; here kiln_sq_rewrite (src/opt/static_quant.c) is run
 * again on a clone of the imported graph with them, so the scales, zero
 * points and int8 weights written are the very ones the session's int8
 * kernels were built from. The rewrite only appends: original values and
 * nodes keep their ids, and it (a) renames the output of the node that
 * produces a quantized activation, (b) points a target's input 0, 1 and 2
 * at new DequantizeLinear outputs, and (c) appends QuantizeLinear /
 * DequantizeLinear nodes and their constants. The source ONNX file is read
 * again whole (protobuf-c keeps fields Kiln's schema leaves out as unknown
 * fields, and packs them back), and the same three edits are made to it by
 * value name: (a) and (b) on the ONNX node that writes the IR node's
 * outputs, (c) as new nodes, inserted where their inputs exist (ONNX wants
 * nodes in topological order), and new initializers. Float weights and
 * biases no node reads any more are dropped (and from graph.input, where
 * old exporters list initializers). Every string, array and message put
 * into the parsed model is malloc'd, so protobuf-c's free_unpacked frees
 * the edited model as it would the parsed one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/internal.h"
#include "core/dtype.h"
#include "core/fileio.h"
#include "core/tensor.h"
#include "import/pbcheck.h"
#include "kernels/fast.h"
#include "ir/graph.h"
#include "onnx.pb-c.h"
#include "opt/opt.h"
#include "opt/static_quant.h"

#define EMIT_MAX_MODEL_BYTES ((size_t)1 << 31)
#define EMIT_MAX_PROTO_DEPTH 256

/* ---- a map of names to ints (open addressing; keys borrowed unless owns) ---- */

struct name_set {
    const char **keys;
    int *vals;
    size_t cap, n;
    int owns;  /* keys are copies, freed with the set */
};

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

static int set_grow(struct name_set *m)
{
    size_t cap = m->cap ? m->cap * 2 : 256;
    const char **keys = calloc(cap, sizeof *keys);
    int *vals = calloc(cap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return 0;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = name_hash(m->keys[i]) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return 1;
}

/* Insert or overwrite; 0 on out of memory. */
static int set_put(struct name_set *m, const char *k, int v)
{
    if ((m->n + 1) * 2 > m->cap && !set_grow(m)) return 0;
    size_t j = name_hash(k) & (m->cap - 1);
    while (m->keys[j] && strcmp(m->keys[j], k)) j = (j + 1) & (m->cap - 1);
    if (!m->keys[j]) {
        const char *key = m->owns ? strdup(k) : k;
        if (!key) return 0;
        m->n++;
        m->keys[j] = key;
    }
    m->vals[j] = v;
    return 1;
}

/* The value of k, -1 if absent. */
static int set_get(const struct name_set *m, const char *k)
{
    if (!m->cap || !k) return -1;
    size_t j = name_hash(k) & (m->cap - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], k)) return m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

static void set_free(struct name_set *m)
{
    for (size_t i = 0; m->owns && i < m->cap; i++) free((char *)m->keys[i]);
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- building the edits ---- */

struct emit {
    const struct kiln_graph *g;  /* the imported graph */
    const struct kiln_graph *q;  /* its QDQ rewrite */
    KilnOnnx__GraphProto *gp;
    char **new_names;            /* ONNX name of each q value added by the rewrite (by id - g->n_values) */
};

static kiln_status oom(void) { return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory"); }

/* The ONNX name of q's value v: its own for an original value, else a fresh one. */
static const char *value_name(const struct emit *e, int v)
{
    return v < e->g->n_values ? e->g->values[v].name : e->new_names[v - e->g->n_values];
}

/* Replace *slot (a malloc'd string of the parsed model) by a copy of s. */
static int set_string(char **slot, const char *s)
{
    char *c = strdup(s);
    if (!c) return 0;
    free(*slot);
    *slot = c;
    return 1;
}

/* A TensorProto initializer of constant t named `name` (raw little-endian data). */
static kiln_status make_initializer(const char *name, const kiln_tensor *t,
                                    KilnOnnx__TensorProto **out)
{
    int code = kiln_onnx_dtype_code(t->dtype);
    if (code <= 0)
        return kiln_error(KILN_ERR_INTERNAL, "--emit-onnx: constant '%s' has a dtype ONNX lacks",
                          name);
    KilnOnnx__TensorProto *tp = malloc(sizeof *tp);
    if (!tp) return oom();
    kiln_onnx__tensor_proto__init(tp);
    tp->name = strdup(name);
    tp->dims = malloc(sizeof *tp->dims * (size_t)(t->rank ? t->rank : 1));
    tp->raw_data.data = malloc(t->nbytes ? t->nbytes : 1);
    if (!tp->name || !tp->dims || !tp->raw_data.data) {
        kiln_onnx__tensor_proto__free_unpacked(tp, NULL);
        return oom();
    }
    tp->n_dims = (size_t)t->rank;
    for (int d = 0; d < t->rank; d++) tp->dims[d] = t->dims[d];
    tp->has_data_type = 1;
    tp->data_type = code;
    tp->has_raw_data = 1;
    tp->raw_data.len = t->nbytes;
    if (t->nbytes) memcpy(tp->raw_data.data, t->data, t->nbytes);
    *out = tp;
    return KILN_OK;
}

/* A QuantizeLinear / DequantizeLinear NodeProto of q's node n. */
static kiln_status make_node(const struct emit *e, int ni, KilnOnnx__NodeProto **out)
{
    const struct kiln_node *n = &e->q->nodes[ni];
    if (n->op != KILN_OP_QuantizeLinear && n->op != KILN_OP_DequantizeLinear)
        return kiln_error(KILN_ERR_INTERNAL, "--emit-onnx: the rewrite added a %s node",
                          kiln_op_name(n->op));
    KilnOnnx__NodeProto *np = malloc(sizeof *np);
    if (!np) return oom();
    kiln_onnx__node_proto__init(np);
    char nm[64];
    snprintf(nm, sizeof nm, "kiln_qdq_%d", ni);
    np->name = strdup(nm);
    np->op_type = strdup(n->op == KILN_OP_QuantizeLinear ? "QuantizeLinear" : "DequantizeLinear");
    np->domain = strdup("");
    np->input = calloc((size_t)n->n_in + 1, sizeof *np->input);
    np->output = calloc((size_t)n->n_out + 1, sizeof *np->output);
    int ok = np->name && np->op_type && np->domain && np->input && np->output;
    for (int k = 0; ok && k < n->n_in; k++) {
        np->input[k] = strdup(n->in[k] >= 0 ? value_name(e, n->in[k]) : "");
        np->n_input = (size_t)k + 1;
        ok = np->input[k] != NULL;
    }
    for (int k = 0; ok && k < n->n_out; k++) {
        np->output[k] = strdup(value_name(e, n->out[k]));
        np->n_output = (size_t)k + 1;
        ok = np->output[k] != NULL;
    }
    const struct kiln_attr *axis = ok ? kiln_node_attr(n, "axis") : NULL;
    if (axis) {
        np->attribute = calloc(1, sizeof *np->attribute);
        KilnOnnx__AttributeProto *a = malloc(sizeof *a);
        if (a) kiln_onnx__attribute_proto__init(a);
        if (np->attribute) np->attribute[0] = a;
        np->n_attribute = np->attribute && a ? 1 : 0;
        ok = a && np->attribute && (a->name = strdup("axis")) != NULL;
        if (ok) {
            a->has_type = 1;
            a->type = 2; /* AttributeProto.INT */
            a->has_i = 1;
            a->i = axis->i;
        }
    }
    if (!ok) {
        kiln_onnx__node_proto__free_unpacked(np, NULL);
        return oom();
    }
    *out = np;
    return KILN_OK;
}

/* Mark every name graph gp's nodes read (and those of the graphs in their attributes). */
static int mark_reads(const KilnOnnx__GraphProto *gp, struct name_set *reads)
{
    for (size_t i = 0; i < gp->n_node; i++) {
        const KilnOnnx__NodeProto *np = gp->node[i];
        for (size_t k = 0; k < np->n_input; k++)
            if (np->input[k] && !set_put(reads, np->input[k], 1)) return 0;
        for (size_t a = 0; a < np->n_attribute; a++) {
            const KilnOnnx__AttributeProto *ap = np->attribute[a];
            if (ap->g && !mark_reads(ap->g, reads)) return 0;
            for (size_t k = 0; k < ap->n_graphs; k++)
                if (!mark_reads(ap->graphs[k], reads)) return 0;
        }
    }
    for (size_t i = 0; i < gp->n_output; i++)
        if (gp->output[i]->name && !set_put(reads, gp->output[i]->name, 1)) return 0;
    return 1;
}

/* Edits (a) and (b): the ONNX nodes of the IR nodes the rewrite changed. */
static kiln_status edit_nodes(struct emit *e, const struct name_set *writer,
                              struct name_set *replaced)
{
    const struct kiln_graph *g = e->g, *q = e->q;
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct kiln_node *a = &g->nodes[ni], *b = &q->nodes[ni];
        int changed = 0;
        for (int k = 0; k < a->n_in; k++) changed |= a->in[k] != b->in[k];
        for (int k = 0; k < a->n_out; k++) changed |= a->out[k] != b->out[k];
        if (!changed) continue;
        int on = -1;
        for (int k = 0; k < a->n_out && on < 0; k++)
            if (a->out[k] >= 0) on = set_get(writer, g->values[a->out[k]].name);
        if (on < 0)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "--emit-onnx: %s node '%s' of Kiln's graph has no ONNX node writing "
                              "its outputs in the source file (was the session loaded from it?)",
                              kiln_op_name(a->op), a->name);
        KilnOnnx__NodeProto *np = e->gp->node[on];
        for (int k = 0; k < a->n_in; k++) {
            if (a->in[k] == b->in[k]) continue;
            const char *old = g->values[a->in[k]].name;
            if ((size_t)k >= np->n_input || strcmp(np->input[k], old))
                return kiln_error(KILN_ERR_UNSUPPORTED,
                                  "--emit-onnx: ONNX node '%s' (%s) does not read '%s' as input %d "
                                  "like Kiln's node",
                                  np->name ? np->name : "", np->op_type ? np->op_type : "", old, k);
            if (!set_put(replaced, old, 1) || !set_string(&np->input[k], value_name(e, b->in[k])))
                return oom();
        }
        for (int k = 0; k < a->n_out; k++) {
            if (a->out[k] == b->out[k]) continue;
            const char *old = g->values[a->out[k]].name;
            size_t j = 0;
            while (j < np->n_output && strcmp(np->output[j], old)) j++;
            if (j == np->n_output)
                return kiln_error(KILN_ERR_UNSUPPORTED,
                                  "--emit-onnx: ONNX node '%s' (%s) does not write '%s'",
                                  np->name ? np->name : "", np->op_type ? np->op_type : "", old);
            if (!set_string(&np->output[j], value_name(e, b->out[k]))) return oom();
        }
    }
    return KILN_OK;
}

/* Edit (c): the new nodes, each placed after the nodes writing its inputs, and the new
 * initializers; then drop the initializers nothing reads any more. */
static kiln_status add_nodes(struct emit *e, const struct name_set *replaced)
{
    const struct kiln_graph *g = e->g, *q = e->q;
    KilnOnnx__GraphProto *gp = e->gp;
    int n_new = q->n_nodes - g->n_nodes, n_const = 0;
    for (int v = g->n_values; v < q->n_values; v++) n_const += q->values[v].kind == KILN_VALUE_CONST;
    KilnOnnx__NodeProto **extra = calloc((size_t)n_new + 1, sizeof *extra);
    KilnOnnx__NodeProto **nodes = calloc(gp->n_node + (size_t)n_new + 1, sizeof *nodes);
    KilnOnnx__TensorProto **inits = calloc(gp->n_initializer + (size_t)n_const + 1, sizeof *inits);
    struct name_set avail = {0};
    kiln_status st = extra && nodes && inits ? KILN_OK : oom();
    for (int i = 0; st == KILN_OK && i < n_new; i++) st = make_node(e, g->n_nodes + i, &extra[i]);
    /* the initializers: the old ones, then the rewrite's constants */
    size_t ni = 0;
    for (size_t i = 0; i < gp->n_initializer; i++) inits[ni++] = gp->initializer[i];
    for (int v = g->n_values; st == KILN_OK && v < q->n_values; v++) {
        if (q->values[v].kind != KILN_VALUE_CONST) continue;
        st = make_initializer(value_name(e, v), q->values[v].konst, &inits[ni]);
        if (st == KILN_OK) ni++;
    }
    if (st != KILN_OK) goto err_free;
    /* names there before any node runs */
    int ok = 1;
    for (size_t i = 0; ok && i < gp->n_input; i++)
        if (gp->input[i]->name) ok = set_put(&avail, gp->input[i]->name, 1);
    for (size_t i = 0; ok && i < ni; i++)
        if (inits[i]->name) ok = set_put(&avail, inits[i]->name, 1);
    ok = ok && set_put(&avail, "", 1);
    /* the outer scope: an ONNX main graph has none, but keep a name no node writes available */
    size_t nn = 0;
    int left = n_new;
    for (size_t i = 0; ok && i <= gp->n_node; i++) {
        for (int progress = 1; ok && progress && left > 0;) { /* every new node that can go */
            progress = 0;
            for (int k = 0; ok && k < n_new; k++) {
                if (!extra[k]) continue;
                int ready = 1;
                for (size_t j = 0; ready && j < extra[k]->n_input; j++)
                    ready = set_get(&avail, extra[k]->input[j]) >= 0;
                if (!ready) continue;
                for (size_t j = 0; ok && j < extra[k]->n_output; j++)
                    ok = set_put(&avail, extra[k]->output[j], 1);
                nodes[nn++] = extra[k];
                extra[k] = NULL;
                left--;
                progress = 1;
            }
        }
        if (i == gp->n_node) break;
        nodes[nn++] = gp->node[i];
        for (size_t j = 0; ok && j < gp->node[i]->n_output; j++)
            ok = set_put(&avail, gp->node[i]->output[j], 1);
    }
    if (!ok) {
        st = oom();
        goto err_free;
    }
    if (left > 0) {
        st = kiln_error(KILN_ERR_INTERNAL, "--emit-onnx: %d QuantizeLinear/DequantizeLinear node%s "
                        "read names no ONNX node writes", left, left == 1 ? "" : "s");
        goto err_free;
    }
    free(gp->node);
    gp->node = nodes;
    gp->n_node = nn;
    free(gp->initializer);
    gp->initializer = inits;
    gp->n_initializer = ni;
    nodes = NULL;
    inits = NULL;
    set_free(&avail);
    free(extra);

    /* the float weights the rewrite replaced, where nothing reads them now */
    struct name_set reads = {0};
    if (!mark_reads(gp, &reads)) {
        set_free(&reads);
        return oom();
    }
    size_t w = 0;
    for (size_t i = 0; i < gp->n_initializer; i++) {
        KilnOnnx__TensorProto *tp = gp->initializer[i];
        if (tp->name && set_get(replaced, tp->name) >= 0 && set_get(&reads, tp->name) < 0)
            kiln_onnx__tensor_proto__free_unpacked(tp, NULL);
        else gp->initializer[w++] = tp;
    }
    gp->n_initializer = w;
    w = 0;
    for (size_t i = 0; i < gp->n_input; i++) {
        KilnOnnx__ValueInfoProto *vi = gp->input[i];
        if (vi->name && set_get(replaced, vi->name) >= 0 && set_get(&reads, vi->name) < 0)
            kiln_onnx__value_info_proto__free_unpacked(vi, NULL);
        else gp->input[w++] = vi;
    }
    gp->n_input = w;
    set_free(&reads);
    return KILN_OK;

err_free:
    for (int i = 0; extra && i < n_new; i++)
        if (extra[i]) kiln_onnx__node_proto__free_unpacked(extra[i], NULL);
    for (size_t i = gp->n_initializer; inits && i < ni; i++)
        kiln_onnx__tensor_proto__free_unpacked(inits[i], NULL);
    free(extra);
    free(nodes);
    free(inits);
    set_free(&avail);
    return st;
}

/* The default domain's opset of mp, -1 if it imports none. */
static int64_t default_opset(const KilnOnnx__ModelProto *mp)
{
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const char *d = mp->opset_import[i]->domain;
        if (!d || !d[0] || !strcmp(d, "ai.onnx")) return mp->opset_import[i]->version;
    }
    return -1;
}

static kiln_status write_file(const char *path, const KilnOnnx__ModelProto *mp)
{
    size_t n = kiln_onnx__model_proto__get_packed_size(mp);
    if (n > EMIT_MAX_MODEL_BYTES)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "--emit-onnx: the quantized model would be %zu bytes, beyond protobuf's "
                          "2 GiB limit", n);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return oom();
    kiln_onnx__model_proto__pack(mp, buf);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(buf, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    free(buf);
    if (!ok) return kiln_error(KILN_ERR_IO, "cannot write the ONNX model '%s'", path);
    return KILN_OK;
}

kiln_status kiln_session_write_onnx(kiln_session *s, const char *source_onnx, const char *path)
{
    if (!s || !source_onnx || !path)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_write_onnx: NULL argument");
    const struct kiln_sq_target *t;
    const float(*range)[2];
    int n_t = kiln_session_static_quant(s, &t, &range);
    if (n_t < 0)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "ONNX QDQ export needs a statically quantized session (calibrated with "
                          "kiln_calibration_*, `kiln compile --precision int8 --calibration DATA`): "
                          "dynamic int8 measures activation ranges on every run, which QDQ's fixed "
                          "scales cannot express");
    const struct kiln_graph *g = kiln_session_graph(s);
    struct emit e = {.g = g};
    struct kiln_graph *q = NULL;
    struct kiln_file_map map = {0};
    KilnOnnx__ModelProto *mp = NULL;
    struct name_set writer = {.owns = 1}, replaced = {0};

    kiln_status st = kiln_weight_cache_pin_all(kiln_session_weights(s)); /* float weights read */
    if (st == KILN_OK) st = kiln_graph_clone(g, &q);
    if (st == KILN_OK) st = kiln_sq_rewrite(q, t, n_t, range);
    if (st != KILN_OK) goto out;
    e.q = q;
    if (q->n_nodes < g->n_nodes || q->n_values < g->n_values) {
        st = kiln_error(KILN_ERR_INTERNAL, "--emit-onnx: the QDQ rewrite removed nodes");
        goto out;
    }
    e.new_names = calloc((size_t)(q->n_values - g->n_values) + 1, sizeof *e.new_names);
    if (!e.new_names) {
        st = oom();
        goto out;
    }
    for (int v = g->n_values; v < q->n_values; v++) {
        const char *base = q->values[v].name ? q->values[v].name : "v";
        size_t len = strlen(base) + 32;
        char *nm = malloc(len);
        if (!nm) {
            st = oom();
            goto out;
        }
        snprintf(nm, len, "%s/kiln_qdq_%d", base, v);
        e.new_names[v - g->n_values] = nm;
    }

    struct stat sb;
    if (stat(source_onnx, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        st = kiln_error(KILN_ERR_UNSUPPORTED,
                        "--emit-onnx: '%s' is a folder; ONNX QDQ export needs the ONNX file the "
                        "model was loaded from (not a SavedModel)",
                        source_onnx);
        goto out;
    }
    st = kiln_file_map(source_onnx, &map);
    if (st != KILN_OK) goto out;
    if (map.size > EMIT_MAX_MODEL_BYTES) {
        st = kiln_error(KILN_ERR_UNSUPPORTED, "--emit-onnx: '%s' exceeds 2 GiB", source_onnx);
        goto out;
    }
    st = kiln_pb_check(&kiln_onnx__model_proto__descriptor, map.data, map.size,
                       EMIT_MAX_PROTO_DEPTH, "ONNX model");
    if (st != KILN_OK) goto out;
    mp = kiln_onnx__model_proto__unpack(NULL, map.size, map.data);
    if (!mp || !mp->graph) {
        st = kiln_error(KILN_ERR_INVALID_MODEL, "--emit-onnx: '%s' is not an ONNX model",
                        source_onnx);
        goto out;
    }
    e.gp = mp->graph;
    int64_t opset = default_opset(mp);
    if (opset < 13) {
        st = kiln_error(KILN_ERR_UNSUPPORTED,
                        "--emit-onnx: '%s' imports ONNX opset %lld; per-channel "
                        "DequantizeLinear needs opset 13 or later (re-export the model with "
                        "opset_version >= 13)",
                        source_onnx, (long long)opset);
        goto out;
    }
    for (size_t i = 0; i < e.gp->n_initializer; i++) {
        const KilnOnnx__TensorProto *tp = e.gp->initializer[i];
        if (tp->has_data_location && tp->data_location == 1) {
            st = kiln_error(KILN_ERR_UNSUPPORTED,
                            "--emit-onnx: initializer '%s' of '%s' lives in an external data "
                            "file, which the written model could not reach",
                            tp->name ? tp->name : "", source_onnx);
            goto out;
        }
    }
    for (size_t i = 0; i < e.gp->n_node; i++)
        for (size_t k = 0; k < e.gp->node[i]->n_output; k++)
            if (e.gp->node[i]->output[k] && e.gp->node[i]->output[k][0] &&
                !set_put(&writer, e.gp->node[i]->output[k], (int)i)) {
                st = oom();
                goto out;
            }
    st = edit_nodes(&e, &writer, &replaced);
    if (st == KILN_OK) st = add_nodes(&e, &replaced);
    if (st == KILN_OK) st = write_file(path, mp);
out:
    set_free(&writer);
    set_free(&replaced);
    if (mp) kiln_onnx__model_proto__free_unpacked(mp, NULL);
    kiln_file_unmap(&map);
    if (e.new_names)
        for (int v = g->n_values; q && v < q->n_values; v++) free(e.new_names[v - g->n_values]);
    free(e.new_names);
    kiln_graph_free(q);
    return st;
}
