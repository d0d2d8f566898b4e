/*
 * savedmodel.c - TensorFlow SavedModel to Kiln IR.
 *
 * Reading: saved_model.pb is walked by kiln_pb_check (framing, nesting
 * depth) and parsed by protobuf-c into the schema in proto/saved_model.proto;
 * saved_model.pbtxt goes through the text-format parser into the same
 * messages. The MetaGraphDef whose tag set equals the requested one is used.
 *
 * Lowering: the chosen graph (TF1 control flow made functional by
 * tf_v1_control.c) is indexed and handed to tf_graph.c as a struct tf_model
 * (tf_import.h), which builds one IR graph per SignatureDef; the reader
 * supplies only the variables' values, through sm_restore_var. Nothing in
 * the lowering calls back into this file otherwise.
 *
 * Variables are restored the way TensorFlow's loader restores them: by
 * running (here: tracing) the saver's restore op. Every Assign /
 * AssignVariableOp it reaches pairs a variable (VariableV2 node in TF1,
 * VarHandleOp passed into the restore function in TF2) with output k of a
 * RestoreV2 node, whose tensor_names constant gives the checkpoint key
 * ("a" in TF1, "v/.ATTRIBUTES/VARIABLE_VALUE" in TF2 object-based
 * checkpoints). The values are read from the TensorBundle
 * (variables/variables.index + .data shards) once and shared as constants
 * by every signature that needs them.
 */
#define _GNU_SOURCE
#include "import/savedmodel.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/fileio.h"
#include "core/tensor.h"
#include "import/pbcheck.h"
#include "import/tensor_bundle.h"
#include "import/textproto.h"
#include "import/tf_import.h"
#include "kernels/kernel.h"
#include "saved_model.pb-c.h"


#define SM_MAX_PROTO_DEPTH 100        /* message nesting of a SavedModel; real files use < 20 */
#define SM_MAX_FILE_BYTES ((size_t)1 << 31)
#define TF_MAX_RESTORE_NODES 1000000  /* nodes the restore trace may visit */

/* ---- model-lifetime state (kept in m->proto) ---- */

struct sm_state {
    KilnSm__SavedModel *sm;      /* the parsed file */
    struct kiln_graph **graphs;  /* signature graphs other than m->graph */
    int n_graphs, cap_graphs;
};

static void sm_state_free(void *p)
{
    struct sm_state *s = p;
    if (!s) return;
    for (int i = 0; i < s->n_graphs; i++) kiln_graph_free(s->graphs[i]);
    free(s->graphs);
    if (s->sm) protobuf_c_message_free_unpacked(&s->sm->base, NULL);
    free(s);
}

/* ---- load context ---- */

struct sm_restore {              /* one assignment the restore op makes */
    const char *var;             /* variable node name in the main graph */
    const char *key;             /* checkpoint key */
    const char *slice;           /* shape_and_slices entry ("" = whole tensor) */
};

struct sm_ctx {
    struct kiln_model *m;
    struct sm_state *state;
    const char *dir;                   /* model folder, or NULL */
    const struct kiln_file_source *src; /* its files in memory, or NULL: on disk */
    const KilnSm__MetaGraphDef *mg;
    const KilnSm__GraphDef *gd;
    struct tf_model tm;                /* the graph, indexed: what the lowering gets */
    bool restore_traced;
    struct sm_restore *restores;
    int n_restores, cap_restores;
    struct tf_map restore_index;         /* variable node name -> restores[] index */
    struct kiln_bundle *bundle;        /* the checkpoint, opened on first use */
    bool bundle_tried;
};

static kiln_status sm_trace_restore(struct sm_ctx *c);

/* Read variable node nd's value from the checkpoint (tf_restore_fn). */
static kiln_status sm_restore_var(void *ctx, const KilnSm__NodeDef *nd, kiln_dtype dtype,
                                  kiln_tensor **out)
{
    struct sm_ctx *c = ctx;
    kiln_status st = sm_trace_restore(c);
    if (st != KILN_OK) return st;
    int r = tf_map_get(&c->restore_index, nd->name);
    if (r < 0) {
        if (!c->mg->saver_def)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "variable '%s': the SavedModel has no saver, so its value cannot "
                              "be restored",
                              nd->name);
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "variable '%s' is not restored by the SavedModel's restore op '%s' "
                          "(variables set only by init ops are not supported)",
                          nd->name,
                          c->mg->saver_def->restore_op_name ? c->mg->saver_def->restore_op_name
                                                            : "");
    }
    const struct sm_restore *rs = &c->restores[r];
    if (rs->slice && rs->slice[0])
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "variable '%s' is restored from a slice ('%s') of checkpoint tensor "
                          "'%s'; partitioned variables are not supported",
                          nd->name, rs->slice, rs->key);
    if (!c->dir)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "variable '%s' needs the checkpoint, but the model was not loaded "
                          "from a folder",
                          nd->name);
    if (!c->bundle) {
        if (c->bundle_tried)
            return kiln_error(KILN_ERR_INVALID_MODEL, "variable '%s': the checkpoint could not be "
                              "opened", nd->name);
        c->bundle_tried = true;
        size_t n = strlen(c->dir) + 32;
        char *prefix = malloc(n);
        if (!prefix) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        snprintf(prefix, n, "%s/variables/variables", c->dir);
        st = kiln_bundle_open_from(prefix, c->src, &c->bundle);
        free(prefix);
        if (st != KILN_OK)
            return kiln_error_wrap(st, "variable '%s': cannot open the checkpoint", nd->name);
        /* tensors read zero-copy borrow the data files: the model keeps them mapped */
        if ((st = kiln_bundle_keep_maps(c->bundle, c->m)) != KILN_OK) return st;
    }
    kiln_tensor *t;
    st = kiln_bundle_read(c->bundle, rs->key, &t);
    if (st != KILN_OK) /* the reader names the checkpoint key; add the graph's name if it differs */
        return strcmp(rs->key, nd->name) != 0 ? kiln_error_wrap(st, "variable '%s'", nd->name)
                                                  : st;
    if (dtype != KILN_DTYPE_UNDEFINED && t->dtype != dtype) {
        kiln_dtype got = t->dtype;
        kiln_tensor_free(t);
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "variable '%s' is %s but checkpoint tensor '%s' is %s", nd->name,
                          kiln_dtype_name(dtype), rs->key, kiln_dtype_name(got));
    }
    const KilnSm__AttrValue *sh = tf_attr(nd, NULL, "shape");
    if (sh && sh->value_case == KILN_SM__ATTR_VALUE__VALUE_SHAPE) {
        struct kiln_type want;
        kiln_type_unknown(&want);
        if (tf_shape_from_proto(sh->shape, nd->name, &want) == KILN_OK && want.rank >= 0) {
            bool ok = want.rank == t->rank;
            for (int i = 0; ok && i < t->rank; i++)
                ok = want.dims[i] < 0 || want.dims[i] == t->dims[i];
            if (!ok) {
                char a[160], bb[160];
                kiln_shape_str(want.rank, want.dims, a, sizeof a);
                kiln_shape_str(t->rank, t->dims, bb, sizeof bb);
                kiln_tensor_free(t);
                return kiln_error(KILN_ERR_INVALID_MODEL,
                                  "variable '%s' has shape %s but checkpoint tensor '%s' has "
                                  "shape %s",
                                  nd->name, a, rs->key, bb);
            }
        } else {
            kiln_error_clear();
        }
    }
    if ((st = kiln_graph_own_tensor(c->m->graph, t)) != KILN_OK) return st;
    *out = t;
    return KILN_OK;
}

/* ---- the restore trace ---- */

/* A place the trace looks at: the main graph (fn -1) or a function body
 * whose arguments are bound to main-graph node names. */
struct rscope {
    int fn;
    KilnSm__NodeDef **nodes;
    size_t n_nodes;
    const struct tf_map *index;
    int n_args;
    const char **arg_names;
    const char **arg_bind;     /* main-graph node name each argument traces to, or NULL */
};

/* Follow a reference through Identity nodes to (node index, output index) in
 * rs, or to an argument (*arg >= 0). */
static kiln_status rtrace(struct sm_ctx *c, const struct rscope *rs, const char *in, int *node,
                          int *out, int *arg)
{
    *node = -1;
    *arg = -1;
    *out = 0;
    for (int hops = 0; hops < 64; hops++) {
        if (in[0] == '^') return KILN_OK;
        size_t nl;
        int idx = 0;
        if (rs->fn < 0) {
            if (!tf_split_ref(in, &nl, &idx)) return KILN_OK;
        } else {
            const char *c1 = strchr(in, ':');
            nl = c1 ? (size_t)(c1 - in) : strlen(in);
            for (int a = 0; a < rs->n_args; a++)
                if (strlen(rs->arg_names[a]) == nl && memcmp(rs->arg_names[a], in, nl) == 0) {
                    *arg = a;
                    return KILN_OK;
                }
            const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (c2 && !tf_parse_index(c2 + 1, strlen(c2 + 1), &idx)) return KILN_OK;
        }
        int j = tf_map_getn(rs->index, in, nl);
        if (j < 0) return KILN_OK;
        const KilnSm__NodeDef *nd = rs->nodes[j];
        const char *op = nd->op ? nd->op : "";
        if ((strcmp(op, "Identity") == 0 || strcmp(op, "Snapshot") == 0) && nd->n_input > 0 &&
            idx == 0) {
            in = nd->input[0];
            continue;
        }
        *node = j;
        *out = idx;
        return KILN_OK;
    }
    (void)c;
    return KILN_OK;
}

/* The main-graph variable node a reference in rs traces to, or NULL. */
static const char *rtrace_var(struct sm_ctx *c, const struct rscope *rs, const char *in)
{
    int node = -1, out = -1, arg = -1;
    if (rtrace(c, rs, in, &node, &out, &arg) != KILN_OK) return NULL;
    if (arg >= 0) return rs->arg_bind[arg];
    if (node < 0 || rs->fn >= 0) return NULL;
    const char *op = rs->nodes[node]->op ? rs->nodes[node]->op : "";
    if (strcmp(op, "VariableV2") == 0 || strcmp(op, "Variable") == 0 ||
        strcmp(op, "VarHandleOp") == 0)
        return rs->nodes[node]->name;
    return NULL;
}

/* String element k of the Const a reference traces to. */
static const char *rtrace_string(struct sm_ctx *c, const struct rscope *rs, const char *in, int k,
                                 struct kiln_arena *a)
{
    int node = -1, out = -1, arg = -1;
    if (rtrace(c, rs, in, &node, &out, &arg) != KILN_OK || node < 0) return NULL;
    const KilnSm__NodeDef *nd = rs->nodes[node];
    if (!nd->op || strcmp(nd->op, "Const") != 0) return NULL;
    const KilnSm__AttrValue *v = tf_attr(nd, NULL, "value");
    if (!v || v->value_case != KILN_SM__ATTR_VALUE__VALUE_TENSOR) return NULL;
    const KilnSm__TensorProto *tp = v->tensor;
    if (k < 0 || (size_t)k >= tp->n_string_val) {
        if (tp->n_string_val == 1 && k >= 0) k = 0; /* a repeated single value */
        else return NULL;
    }
    return kiln_arena_strndup(a, (const char *)tp->string_val[k].data, tp->string_val[k].len);
}

static kiln_status restore_add(struct sm_ctx *c, const char *var, const char *key,
                               const char *slice)
{
    if (c->n_restores == c->cap_restores) {
        int cap = c->cap_restores ? c->cap_restores * 2 : 16;
        struct sm_restore *p = realloc(c->restores, sizeof *p * (size_t)cap);
        if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        c->restores = p;
        c->cap_restores = cap;
    }
    c->restores[c->n_restores] = (struct sm_restore){var, key, slice};
    bool dup;
    kiln_status st = tf_map_put(&c->restore_index, var, c->n_restores, &dup);
    if (st != KILN_OK) return st;
    if (!dup) c->n_restores++;
    return KILN_OK;
}

/* An assignment node of the restore op: record (variable, checkpoint key). */
static kiln_status restore_assign(struct sm_ctx *c, const struct rscope *rs,
                                  const KilnSm__NodeDef *nd)
{
    struct kiln_arena *a = c->m->graph->mem;
    if (nd->n_input < 2) return KILN_OK;
    const char *var = rtrace_var(c, rs, nd->input[0]);
    if (!var) return KILN_OK;
    int node = -1, out = -1, arg = -1;
    kiln_status st = rtrace(c, rs, nd->input[1], &node, &out, &arg);
    if (st != KILN_OK || node < 0) return st;
    const KilnSm__NodeDef *rn = rs->nodes[node];
    const char *op = rn->op ? rn->op : "";
    if (strcmp(op, "RestoreV2") != 0) {
        if (strcmp(op, "Restore") == 0 || strcmp(op, "RestoreSlice") == 0)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "variable '%s' is restored by a %s op (a V1 checkpoint); only V2 "
                              "checkpoints (RestoreV2) are supported",
                              var, op);
        return KILN_OK;
    }
    if (rn->n_input < 3) return KILN_OK;
    const char *key = rtrace_string(c, rs, rn->input[1], out, a);
    const char *slice = rtrace_string(c, rs, rn->input[2], out, a);
    if (!key) return KILN_OK;
    return restore_add(c, kiln_arena_strdup(a, var), key, slice ? slice : "");
}

/* Visit every assignment of function fn (restore functions are small and
 * dedicated); nested calls are followed with their arguments bound. */
static kiln_status restore_function(struct sm_ctx *c, int fn, const char **bind, int n_bind,
                                    int depth)
{
    if (depth > TF_MAX_CALL_DEPTH)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "restore op: function calls nest deeper than %d levels",
                          TF_MAX_CALL_DEPTH);
    kiln_status st = tf_index_function(&c->tm, fn);
    if (st != KILN_OK) return st;
    const KilnSm__FunctionDef *fd = c->tm.fns[fn];
    struct rscope rs = {fn, fd->node_def, fd->n_node_def, &c->tm.fn_node_index[fn], 0, NULL, NULL};
    rs.n_args = (int)fd->signature->n_input_arg;
    rs.arg_names = calloc((size_t)rs.n_args + 1, sizeof(char *));
    rs.arg_bind = calloc((size_t)rs.n_args + 1, sizeof(char *));
    if (!rs.arg_names || !rs.arg_bind) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    for (int a = 0; a < rs.n_args; a++) {
        rs.arg_names[a] = fd->signature->input_arg[a]->name ? fd->signature->input_arg[a]->name : "";
        rs.arg_bind[a] = a < n_bind ? bind[a] : NULL;
    }
    for (size_t i = 0; i < fd->n_node_def && st == KILN_OK; i++) {
        const KilnSm__NodeDef *nd = fd->node_def[i];
        const char *op = nd->op ? nd->op : "";
        if (strcmp(op, "Assign") == 0 || strcmp(op, "AssignVariableOp") == 0) {
            st = restore_assign(c, &rs, nd);
            continue;
        }
        KilnSm__NameAttrList inst;
        int callee = tf_called_function(&c->tm, nd, NULL, &inst);
        if (callee < 0) continue;
        const char **nb = calloc(nd->n_input + 1, sizeof(char *));
        if (!nb) {
            st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
            break;
        }
        int nn = 0;
        for (size_t k = 0; k < nd->n_input && nd->input[k][0] != '^'; k++)
            nb[nn++] = rtrace_var(c, &rs, nd->input[k]);
        st = restore_function(c, callee, nb, nn, depth + 1);
        free(nb);
    }
out:
    free(rs.arg_names);
    free(rs.arg_bind);
    return st;
}

/* Trace the saver's restore op once: which checkpoint key each variable gets. */
static kiln_status sm_trace_restore(struct sm_ctx *c)
{
    if (c->restore_traced) return KILN_OK;
    c->restore_traced = true;
    const KilnSm__SaverDef *sd = c->mg->saver_def;
    if (!sd || !sd->restore_op_name || !sd->restore_op_name[0]) return KILN_OK;
    size_t nl;
    int idx = -1;
    const char *rname = sd->restore_op_name;
    if (rname[0] == '^') rname++;
    if (!tf_split_ref(rname, &nl, &idx))
        return kiln_error(KILN_ERR_INVALID_MODEL, "saver_def: malformed restore_op_name '%s'",
                          sd->restore_op_name);
    int start = tf_map_getn(&c->tm.node_index, rname, nl);
    if (start < 0)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "saver_def: restore op '%s' is not a node of the graph",
                          sd->restore_op_name);
    struct rscope rs = {-1, c->tm.nodes, c->tm.n_nodes, &c->tm.node_index, 0, NULL, NULL};
    unsigned char *seen = calloc(c->tm.n_nodes + 1, 1);
    int *stack = malloc(sizeof(int) * (c->tm.n_nodes + 1));
    kiln_status st = KILN_OK;
    if (!seen || !stack) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    int n = 0;
    stack[n++] = start;
    seen[start] = 1;
    long visited = 0;
    while (n > 0 && st == KILN_OK) {
        if (++visited > TF_MAX_RESTORE_NODES) break;
        const KilnSm__NodeDef *nd = c->tm.nodes[stack[--n]];
        const char *op = nd->op ? nd->op : "";
        if (strcmp(op, "Assign") == 0 || strcmp(op, "AssignVariableOp") == 0) {
            st = restore_assign(c, &rs, nd);
        } else {
            KilnSm__NameAttrList inst;
            int fn = tf_called_function(&c->tm, nd, NULL, &inst);
            if (fn >= 0) {
                const char **bind = calloc(nd->n_input + 1, sizeof(char *));
                if (!bind) {
                    st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
                    break;
                }
                int nb = 0;
                for (size_t k = 0; k < nd->n_input && nd->input[k][0] != '^'; k++)
                    bind[nb++] = rtrace_var(c, &rs, nd->input[k]);
                st = restore_function(c, fn, bind, nb, 1);
                free(bind);
            }
        }
        for (size_t k = 0; k < nd->n_input && st == KILN_OK; k++) {
            const char *in = nd->input[k];
            if (in[0] == '^') in++;
            if (!tf_split_ref(in, &nl, &idx)) continue;
            int j = tf_map_getn(&c->tm.node_index, in, nl);
            if (j < 0 || seen[j]) continue;
            seen[j] = 1;
            stack[n++] = j;
        }
    }
out:
    free(seen);
    free(stack);
    return st;
}

/* ---- tags ---- */

/* Whether the MetaGraphDef's tag set equals the comma-separated `want`. */
static bool tags_match(const KilnSm__MetaGraphDef *mg, const char *want)
{
    const KilnSm__MetaGraphDef__MetaInfoDef *mi = mg->meta_info_def;
    size_t nt = mi ? mi->n_tags : 0;
    /* every wanted tag is present */
    int n_want = 0;
    const char *p = want;
    while (*p) {
        while (*p == ',' || *p == ' ') p++;
        if (!*p) break;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *te = e;
        while (te > p && te[-1] == ' ') te--;
        size_t n = (size_t)(te - p);
        bool found = false;
        for (size_t i = 0; i < nt; i++)
            if (mi->tags[i] && strlen(mi->tags[i]) == n && memcmp(mi->tags[i], p, n) == 0)
                found = true;
        if (!found) return false;
        n_want++;
        p = e;
    }
    /* every present tag is wanted */
    for (size_t i = 0; i < nt; i++) {
        const char *t = mi->tags[i] ? mi->tags[i] : "";
        size_t n = strlen(t);
        bool found = false;
        p = want;
        while (*p && !found) {
            while (*p == ',' || *p == ' ') p++;
            const char *e = p;
            while (*e && *e != ',') e++;
            const char *te = e;
            while (te > p && te[-1] == ' ') te--;
            found = (size_t)(te - p) == n && memcmp(p, t, n) == 0;
            p = e;
        }
        if (!found) return false;
    }
    return n_want > 0 || nt == 0;
}

static void describe_tag_sets(const KilnSm__SavedModel *sm, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sm->n_meta_graphs && k + 4 < n; i++) {
        const KilnSm__MetaGraphDef__MetaInfoDef *mi = sm->meta_graphs[i]->meta_info_def;
        k += (size_t)snprintf(buf + k, n - k, "%s'", i ? ", " : "");
        for (size_t j = 0; mi && j < mi->n_tags && k + 4 < n; j++)
            k += (size_t)snprintf(buf + k, n - k, "%s%s", j ? "," : "",
                                  mi->tags[j] ? mi->tags[j] : "");
        if (k + 2 < n) k += (size_t)snprintf(buf + k, n - k, "'");
    }
}

/* ---- model statistics ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(const void *const *)a, y = (uintptr_t)*(const void *const *)b;
    return x < y ? -1 : x > y;
}

static kiln_status finish_stats(struct kiln_model *m, struct kiln_graph **graphs, int n,
                                const char *tf_version)
{
    struct kiln_arena *mem = m->graph->mem;
    int counts[KILN_OP_COUNT] = {0};
    m->stats.node_count = 0;
    m->stats.param_count = 0;
    m->stats.param_bytes = 0;
    /* parameters: distinct constant tensors across the signature graphs
     * (variables are shared by every signature that reads them) */
    size_t nk = 0, total = 0;
    for (int gi = 0; gi < n; gi++) total += (size_t)graphs[gi]->n_values;
    const kiln_tensor **seen = malloc(sizeof *seen * (total + 1));
    if (!seen) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int gi = 0; gi < n; gi++) {
        const struct kiln_graph *g = graphs[gi];
        m->stats.node_count += g->n_nodes;
        for (int i = 0; i < g->n_nodes; i++) counts[g->nodes[i].op]++;
        for (int v = 0; v < g->n_values; v++)
            if (g->values[v].kind == KILN_VALUE_CONST && g->values[v].konst)
                seen[nk++] = g->values[v].konst;
    }
    qsort(seen, nk, sizeof *seen, cmp_ptr);
    for (size_t j = 0; j < nk; j++) {
        if (j > 0 && seen[j] == seen[j - 1]) continue;
        m->stats.param_count += kiln_tensor_count(seen[j]);
        m->stats.param_bytes += (int64_t)seen[j]->nbytes;
    }
    free(seen);
    int kinds = 0;
    for (int i = 0; i < KILN_OP_COUNT; i++) kinds += counts[i] > 0;
    m->op_kind_name = kiln_arena_alloc(mem, sizeof(char *) * ((size_t)kinds + 1));
    m->op_kind_count = kiln_arena_alloc(mem, sizeof(int) * ((size_t)kinds + 1));
    if (!m->op_kind_name || !m->op_kind_count)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    m->n_op_kinds = 0;
    for (int i = 0; i < KILN_OP_COUNT; i++)
        if (counts[i]) m->op_kind_name[m->n_op_kinds++] = kiln_op_name((enum kiln_op)i);
    qsort(m->op_kind_name, (size_t)m->n_op_kinds, sizeof(char *), cmp_str);
    for (int k = 0; k < m->n_op_kinds; k++)
        m->op_kind_count[k] = counts[kiln_op_find(m->op_kind_name[k])];
    char prod[128];
    snprintf(prod, sizeof prod, "TensorFlow%s%s", tf_version && tf_version[0] ? " " : "",
             tf_version ? tf_version : "");
    m->stats.producer = kiln_arena_strdup(mem, prod);
    m->stats.ir_version = 0;
    if (!m->stats.producer) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    return KILN_OK;
}

/* ---- entry points ---- */

static int cmp_sig_entry(const void *a, const void *b)
{
    const KilnSm__MetaGraphDef__SignatureDefEntry *x = *(KilnSm__MetaGraphDef__SignatureDefEntry *const *)a;
    const KilnSm__MetaGraphDef__SignatureDefEntry *y = *(KilnSm__MetaGraphDef__SignatureDefEntry *const *)b;
    return strcmp(x->key, y->key);
}

static bool is_init_signature(const char *key)
{
    return strcmp(key, "__saved_model_init_op") == 0 || strcmp(key, "__saved_model_train_op") == 0;
}

static kiln_status state_add_graph(struct sm_state *s, struct kiln_graph *g)
{
    if (s->n_graphs == s->cap_graphs) {
        int cap = s->cap_graphs ? s->cap_graphs * 2 : 8;
        struct kiln_graph **p = realloc(s->graphs, sizeof *p * (size_t)cap);
        if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        s->graphs = p;
        s->cap_graphs = cap;
    }
    s->graphs[s->n_graphs++] = g;
    return KILN_OK;
}

static kiln_status load_parsed(struct sm_ctx *c, const char *tags)
{
    struct kiln_model *m = c->m;
    const KilnSm__SavedModel *sm = c->state->sm;
    kiln_status st;
    const char *want = tags && tags[0] ? tags : "serve";
    if (sm->n_meta_graphs == 0)
        return kiln_error(KILN_ERR_INVALID_MODEL, "the SavedModel has no MetaGraphDef");
    for (size_t i = 0; i < sm->n_meta_graphs && !c->mg; i++)
        if (tags_match(sm->meta_graphs[i], want)) c->mg = sm->meta_graphs[i];
    if (!c->mg) {
        char sets[512];
        describe_tag_sets(sm, sets, sizeof sets);
        return kiln_error(KILN_ERR_NOT_FOUND,
                          "the SavedModel has no MetaGraphDef with tags '%s'; its tag sets are %s",
                          want, sets);
    }
    c->gd = c->mg->graph_def;
    if (!c->gd) return kiln_error(KILN_ERR_INVALID_MODEL, "the MetaGraphDef has no graph_def");
    if ((st = tf_v1_functionalize(m->graph->mem, &c->gd)) != KILN_OK) return st; /* TF1 loops, conds */
    c->tm.m = m;
    c->tm.mg = c->mg;
    c->tm.dir = c->dir;
    c->tm.restore = sm_restore_var;
    c->tm.restore_ctx = c;
    if ((st = tf_model_index(&c->tm, c->gd)) != KILN_OK) return st;

    /* serving signatures, sorted by name; the default is serving_default */
    size_t ns = 0;
    for (size_t i = 0; i < c->mg->n_signature_def; i++) {
        const KilnSm__MetaGraphDef__SignatureDefEntry *e = c->mg->signature_def[i];
        if (!e->key || !e->value)
            return kiln_error(KILN_ERR_INVALID_MODEL, "signature_def %zu has no name or value", i);
        if (!is_init_signature(e->key)) ns++;
    }
    if (ns == 0)
        return kiln_error(KILN_ERR_INVALID_MODEL, "the SavedModel (tags '%s') has no signatures",
                          want);
    KilnSm__MetaGraphDef__SignatureDefEntry **sigs = calloc(ns, sizeof *sigs);
    if (!sigs) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    ns = 0;
    for (size_t i = 0; i < c->mg->n_signature_def; i++)
        if (!is_init_signature(c->mg->signature_def[i]->key)) sigs[ns++] = c->mg->signature_def[i];
    qsort(sigs, ns, sizeof *sigs, cmp_sig_entry);
    if ((st = tf_mark_written_vars(&c->tm, sigs, ns)) != KILN_OK) {
        free(sigs);
        return st;
    }
    int dflt = 0;
    for (size_t i = 0; i < ns; i++) {
        if (i > 0 && strcmp(sigs[i]->key, sigs[i - 1]->key) == 0) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "signature '%s' is defined twice", sigs[i]->key);
            goto out;
        }
        if (strcmp(sigs[i]->key, "serving_default") == 0) dflt = (int)i;
    }
    struct kiln_graph **graphs = calloc(ns, sizeof *graphs);
    if (!graphs) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    m->signatures = kiln_arena_alloc(m->graph->mem, sizeof *m->signatures * ns);
    if (!m->signatures) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out_graphs;
    }
    m->n_signatures = (int)ns;
    m->default_signature = dflt;
    /* the default signature's graph is m->graph; the others are their own
     * roots, freed with the parsed file (sm_state_free) */
    for (size_t i = 0; i < ns; i++) {
        if ((int)i == dflt) {
            graphs[i] = m->graph;
        } else {
            if ((st = kiln_graph_new(&graphs[i])) != KILN_OK) goto out_graphs;
            if ((st = state_add_graph(c->state, graphs[i])) != KILN_OK) {
                kiln_graph_free(graphs[i]);
                goto out_graphs;
            }
        }
    }
    for (size_t i = 0; i < ns; i++) {
        st = tf_lower_signature(&c->tm, sigs[i]->key, sigs[i]->value, graphs[i], &m->signatures[i]);
        if (st != KILN_OK) goto out_graphs;
    }
    const KilnSm__MetaGraphDef__MetaInfoDef *mi = c->mg->meta_info_def;
    st = finish_stats(m, graphs, (int)ns, mi ? mi->tensorflow_version : NULL);
out_graphs:
    free(graphs);
out:
    free(sigs);
    return st;
}

static void ctx_free(struct sm_ctx *c)
{
    tf_model_free(&c->tm);
    free(c->restores);
    tf_map_free(&c->restore_index);
    if (c->bundle) kiln_bundle_close(c->bundle);
}

kiln_status kiln_savedmodel_load_bytes(const void *data, size_t size, int text, const char *dir,
                                       const char *tags, struct kiln_model *m)
{
    return kiln_savedmodel_load_source(data, size, text, dir, NULL, tags, m);
}

kiln_status kiln_savedmodel_load_source(const void *data, size_t size, int text, const char *dir,
                                        const struct kiln_file_source *src, const char *tags,
                                        struct kiln_model *m)
{
    kiln_status st;
    if (size > SM_MAX_FILE_BYTES)
        return kiln_error(KILN_ERR_UNSUPPORTED, "saved_model.pb of %zu bytes exceeds the 2 GiB "
                          "protobuf limit", size);
    struct sm_state *state = calloc(1, sizeof *state);
    if (!state) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    m->proto = state;
    m->proto_free = sm_state_free;
    m->format = "savedmodel";
    if (text) {
        ProtobufCMessage *msg = NULL;
        st = kiln_textproto_parse(&kiln_sm__saved_model__descriptor, data, size, &msg);
        if (st != KILN_OK) return kiln_error_wrap(st, "saved_model.pbtxt");
        state->sm = (KilnSm__SavedModel *)msg;
    } else {
        st = kiln_pb_check(&kiln_sm__saved_model__descriptor, data, size, SM_MAX_PROTO_DEPTH,
                           "saved_model.pb");
        if (st != KILN_OK) return st;
        state->sm = kiln_sm__saved_model__unpack(NULL, size, data);
        if (!state->sm)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "saved_model.pb is not a valid SavedModel (protobuf parse failed: "
                              "wrong field types or bad strings)");
    }
    if ((st = kiln_graph_new(&m->graph)) != KILN_OK) return st;
    struct sm_ctx c = {.m = m, .state = state, .dir = dir, .src = src};
    st = load_parsed(&c, tags);
    ctx_free(&c);
    return st;
}

kiln_status kiln_savedmodel_load(const char *dir, const char *tags, struct kiln_model *m)
{
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (!path) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    int text = 0;
    snprintf(path, n, "%s/saved_model.pb", dir);
    if (access(path, F_OK) != 0) {
        snprintf(path, n, "%s/saved_model.pbtxt", dir);
        text = 1;
    }
    struct kiln_file_map map;
    kiln_status st = kiln_file_map(path, &map);
    if (st == KILN_OK) {
        st = kiln_savedmodel_load_bytes(map.data, map.size, text, dir, tags, m);
        kiln_file_unmap(&map); /* protobuf-c copied what it keeps */
    }
    free(path);
    return st;
}
