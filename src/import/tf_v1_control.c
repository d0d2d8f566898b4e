/*
 * tf_v1_control.c - TensorFlow 1 control flow and TensorArrays to Kiln IR.
 *
 * TF1 graphs spell loops and conditionals with dataflow primitives: a
 * tf.cond is Switch nodes (one per value a branch reads, predicate on input
 * 1; output 0 is the false side, 1 the true side) and a Merge per result; a
 * tf.while_loop is a "frame": Enter (frame_name; is_constant for values the
 * loop only reads), Merge(Enter, NextIteration), Switch(Merge, LoopCond),
 * the body from Switch:1 to NextIteration, Exit from Switch:0. The rest of
 * the importer walks a graph backwards from its outputs and has no place for
 * such cycles, so, as TensorFlow's own functionalize_control_flow pass does
 * for XLA, tf_v1_functionalize rewrites the main GraphDef before anything
 * reads it:
 *
 *   - frames are found by a topological pass that ignores the NextIteration
 *     back edges: Enter opens the child frame its frame_name names, Exit
 *     returns to the parent, any other node lives in the deepest frame of
 *     its inputs (inputs from two unrelated frames are an error);
 *   - then, innermost first, until nothing is left:
 *       a Merge that is not a loop's is a conditional: the nodes between
 *       its two inputs and the Switches they depend on become a then and an
 *       else function, the values they read from outside become arguments
 *       (a Switch's data input, or the tensor itself), and the Merge is
 *       replaced, under its own name, by an If(pred, args) whose outputs are
 *       the Merge's (the value and value_index). Each Merge becomes its own
 *       If (a cond with several results runs the shared part of a branch
 *       once per result; Kiln's graphs are pure, so only time is lost);
 *       a frame whose inner frames and conditionals are done becomes a
 *       While: the loop variables are the non-constant Enters, the
 *       invariants the constant Enters (and any outer tensor read
 *       directly), the cond function is the frame's nodes up to LoopCond,
 *       the body the nodes up to each NextIteration; each Exit is replaced,
 *       under its own name, by an Identity of the While's output.
 *   The new functions are added to the library, so the TF2 lowering in
 *   tf_control.c (Loop and If subgraphs, invariants captured, nesting)
 *   does the rest. References inside the new functions use "node::k", the
 *   flat output index form tf_graph.c resolves without the op's output
 *   argument names. A graph without TF1 control-flow ops is left alone.
 *   Malformed frames (an Exit or NextIteration with no Enter before it, a
 *   NextIteration that feeds no Merge, mismatched frame names, a loop
 *   without LoopCond) are errors naming the node; the rewrite is all or
 *   nothing, done when the model is loaded.
 *
 * TensorArrayV3 and its ops (tf_v1_control_lower, called by tf_lower.c) use
 * the dense-tensor representation of tf_control.c's TensorLists: the flow
 * tensor, which TF1 threads through every op and loop to order them, *is*
 * the array, [size, ...element]. The handle is a constant scalar that
 * records dynamic_size. Write is TfListSetItem (growing when dynamic_size),
 * Read and Gather are Gather on axis 0, Size the first dim, Scatter and
 * Split a ScatterND after a TfListSetItem of the largest index (which fixes
 * the element shape of an array created with an unknown one, and grows a
 * dynamic one), Concat a Reshape; Close does nothing. Split needs constant,
 * equal lengths (an array of unequal elements has no dense form).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tf_import.h"
#include "kernels/kernel.h"

#define V1_MAX_NODES (1 << 24)   /* nodes of a graph being rewritten */
#define V1_FLOW_DEPTH 256        /* Identity-like nodes followed to see a TensorArray flow */
#define TF_DT_INT32 3
#define TF_DT_BOOL 10
#define TF_DT_VARIANT 21

struct edge {
    int src;  /* node index */
    int port; /* output index; -1 for a control edge */
};

struct frame {
    const char *name; /* frame_name of its Enters ("" for the main graph) */
    int parent;       /* -1 for the main graph */
    const char *enter; /* an Enter node that opens it, for messages */
    bool done;
};

/* The graph being rewritten. Node arrays grow as While nodes are added;
 * the scratch arena holds everything that does not outlive the rewrite. */
struct fz {
    struct kiln_arena *mem;   /* the model's arena: new nodes, functions, strings */
    struct kiln_arena tmp;    /* scratch */
    KilnSm__NodeDef **nd;
    struct edge **in;         /* parsed inputs per node */
    int *n_in;
    int *frame;               /* frame per node */
    unsigned char *done;      /* moved into a function: no longer part of the main graph */
    unsigned *flow;           /* bit k: output k is a TensorArray flow */
    int n, cap;
    int *out_off, *out_src;   /* consumers of the original nodes (CSR): node, and -(node+1) for control */
    int n_orig;
    struct frame *fr;
    int n_fr, cap_fr;
    int *ht;                  /* node name hash: index + 1, 0 empty */
    int ht_cap;
    KilnSm__FunctionDef **fns; /* functions made */
    int n_fns, cap_fns;
    const KilnSm__FunctionDefLibrary *lib;
    int counter;
};

static kiln_status oom(void) { return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory"); }

static kiln_status nerr(struct fz *z, int n, const char *fmt, ...) KILN_PRINTF(3, 4);
static kiln_status nerr(struct fz *z, int n, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_error(KILN_ERR_INVALID_MODEL, "TF1 control flow: node '%s' (op %s): %s",
                      z->nd[n]->name, z->nd[n]->op, msg);
}

static const char *name_of(const struct fz *z, int n) { return z->nd[n]->name; }

/* op, or Ref<op> */
static bool is_op(const KilnSm__NodeDef *nd, const char *op)
{
    const char *o = nd->op ? nd->op : "";
    if (strncmp(o, "Ref", 3) == 0 && strcmp(o + 3, op) == 0) return true;
    return strcmp(o, op) == 0;
}

static bool is_cf_op(const KilnSm__NodeDef *nd)
{
    return is_op(nd, "Enter") || is_op(nd, "Exit") || is_op(nd, "Merge") || is_op(nd, "Switch") ||
           is_op(nd, "NextIteration") || is_op(nd, "LoopCond");
}

/* ---- names ---- */

static uint64_t hash_n(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int find_n(const struct fz *z, const char *s, size_t n)
{
    for (uint64_t i = hash_n(s, n) & (uint64_t)(z->ht_cap - 1);; i = (i + 1) & (uint64_t)(z->ht_cap - 1)) {
        int k = z->ht[i];
        if (!k) return -1;
        const char *nm = z->nd[k - 1]->name;
        if (strlen(nm) == n && memcmp(nm, s, n) == 0) return k - 1;
    }
}

static kiln_status put_name(struct fz *z, int node)
{
    if ((z->n + 1) * 2 > z->ht_cap) {
        int cap = z->ht_cap ? z->ht_cap * 2 : 1024;
        while (cap < (z->n + 1) * 2) cap *= 2;
        int *ht = calloc((size_t)cap, sizeof *ht);
        if (!ht) return oom();
        int *old = z->ht, oc = z->ht_cap;
        z->ht = ht;
        z->ht_cap = cap;
        for (int i = 0; i < oc; i++)
            if (old[i]) {
                const char *nm = z->nd[old[i] - 1]->name;
                uint64_t j = hash_n(nm, strlen(nm)) & (uint64_t)(cap - 1);
                while (ht[j]) j = (j + 1) & (uint64_t)(cap - 1);
                ht[j] = old[i];
            }
        free(old);
    }
    const char *nm = z->nd[node]->name;
    uint64_t j = hash_n(nm, strlen(nm)) & (uint64_t)(z->ht_cap - 1);
    while (z->ht[j]) j = (j + 1) & (uint64_t)(z->ht_cap - 1);
    z->ht[j] = node + 1;
    return KILN_OK;
}

static char *fmt(struct fz *z, const char *f, ...) KILN_PRINTF(2, 3);
static char *fmt(struct fz *z, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(NULL, 0, f, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *s = kiln_arena_alloc(z->mem, (size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, f);
    vsnprintf(s, (size_t)n + 1, f, ap);
    va_end(ap);
    return s;
}

/* A node name not yet in the graph, from base. */
static char *fresh_name(struct fz *z, const char *base)
{
    char *s = base ? fmt(z, "%s", base) : NULL;
    for (int k = 1; s && find_n(z, s, strlen(s)) >= 0; k++) s = fmt(z, "%s_%d", base, k);
    return s;
}

/* A function name not in the library and not made before. */
static char *fresh_fn_name(struct fz *z, const char *node, const char *role)
{
    for (;;) {
        char *s = fmt(z, "__kiln_tf1_%d_%s_%s", z->counter++, node, role);
        if (!s) return NULL;
        bool clash = false;
        for (size_t i = 0; z->lib && i < z->lib->n_function && !clash; i++)
            clash = z->lib->function[i]->signature && z->lib->function[i]->signature->name &&
                    strcmp(z->lib->function[i]->signature->name, s) == 0;
        if (!clash) return s;
    }
}

/* ---- attributes ---- */

static const KilnSm__AttrValue *attr(const struct fz *z, int n, const char *key)
{
    return tf_attr(z->nd[n], NULL, key);
}

static int attr_type(const struct fz *z, int n, const char *key)
{
    const KilnSm__AttrValue *v = attr(z, n, key);
    return v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? (int)v->type : 0;
}

static KilnSm__AttrEntry *entry(struct fz *z, const char *key, KilnSm__AttrValue *v)
{
    KilnSm__AttrEntry *e = kiln_arena_alloc(z->mem, sizeof *e);
    if (!e || !v) return NULL;
    kiln_sm__attr_entry__init(e);
    e->key = (char *)key;
    e->value = v;
    return e;
}

static KilnSm__AttrValue *av_func(struct fz *z, const char *name)
{
    KilnSm__AttrValue *v = kiln_arena_alloc(z->mem, sizeof *v);
    KilnSm__NameAttrList *f = kiln_arena_alloc(z->mem, sizeof *f);
    if (!v || !f) return NULL;
    kiln_sm__attr_value__init(v);
    kiln_sm__name_attr_list__init(f);
    f->name = (char *)name;
    v->value_case = KILN_SM__ATTR_VALUE__VALUE_FUNC;
    v->func = f;
    return v;
}

static KilnSm__AttrValue *av_type(struct fz *z, int t)
{
    KilnSm__AttrValue *v = kiln_arena_alloc(z->mem, sizeof *v);
    if (!v) return NULL;
    kiln_sm__attr_value__init(v);
    v->value_case = KILN_SM__ATTR_VALUE__VALUE_TYPE;
    v->type = (KilnSm__DataType)t;
    return v;
}

static KilnSm__AttrValue *av_types(struct fz *z, const int *t, int n)
{
    KilnSm__AttrValue *v = kiln_arena_alloc(z->mem, sizeof *v);
    KilnSm__AttrValue__ListValue *l = kiln_arena_alloc(z->mem, sizeof *l);
    KilnSm__DataType *ty = kiln_arena_alloc(z->mem, sizeof *ty * ((size_t)n + 1));
    if (!v || !l || !ty) return NULL;
    kiln_sm__attr_value__init(v);
    kiln_sm__attr_value__list_value__init(l);
    for (int i = 0; i < n; i++) ty[i] = (KilnSm__DataType)t[i];
    l->n_type = (size_t)n;
    l->type = ty;
    v->value_case = KILN_SM__ATTR_VALUE__VALUE_LIST;
    v->list = l;
    return v;
}

/* ---- the node table ---- */

static kiln_status grow(struct fz *z, int need)
{
    if (need <= z->cap) return KILN_OK;
    if (need > V1_MAX_NODES) return kiln_error(KILN_ERR_UNSUPPORTED, "TF1 control flow: too many nodes");
    int cap = z->cap ? z->cap : 64;
    while (cap < need) cap *= 2;
#define GROW(p)                                                           \
    do {                                                                  \
        void *q = realloc(p, sizeof *(p) * (size_t)cap);                  \
        if (!q) return oom();                                             \
        p = q;                                                            \
        memset(&(p)[z->cap], 0, sizeof *(p) * (size_t)(cap - z->cap));    \
    } while (0)
    GROW(z->nd);
    GROW(z->in);
    GROW(z->n_in);
    GROW(z->frame);
    GROW(z->done);
    GROW(z->flow);
#undef GROW
    z->cap = cap;
    return KILN_OK;
}

static void fz_free(struct fz *z)
{
    free(z->nd);
    free(z->in);
    free(z->n_in);
    free(z->frame);
    free(z->done);
    free(z->flow);
    free(z->out_off);
    free(z->out_src);
    free(z->fr);
    free(z->ht);
    free(z->fns);
    kiln_arena_free(&z->tmp);
}

/* The main-graph reference "name", "name:k" or "^name" for an edge. */
static char *ref_str(struct fz *z, struct edge e)
{
    if (e.port < 0) return fmt(z, "^%s", name_of(z, e.src));
    if (e.port == 0) return fmt(z, "%s", name_of(z, e.src));
    return fmt(z, "%s:%d", name_of(z, e.src), e.port);
}

static kiln_status parse_inputs(struct fz *z, int n)
{
    const KilnSm__NodeDef *nd = z->nd[n];
    z->in[n] = kiln_arena_alloc(&z->tmp, sizeof(struct edge) * (nd->n_input + 1));
    if (!z->in[n]) return oom();
    z->n_in[n] = 0;
    for (size_t k = 0; k < nd->n_input; k++) {
        const char *s = nd->input[k];
        bool control = s[0] == '^';
        if (control) s++;
        const char *colon = strchr(s, ':');
        size_t len = colon ? (size_t)(colon - s) : strlen(s);
        int port = 0;
        if (colon) {
            char *end;
            long p = strtol(colon + 1, &end, 10);
            if (*end || end == colon + 1 || p < 0 || p > 1 << 20)
                return nerr(z, n, "malformed input '%s'", nd->input[k]);
            port = (int)p;
        }
        int src = find_n(z, s, len);
        if (src < 0)
            return nerr(z, n, "input '%s' names no node of the graph", nd->input[k]);
        z->in[n][z->n_in[n]++] = (struct edge){src, control ? -1 : port};
    }
    return KILN_OK;
}

/* Add a node (inputs given as edges; attrs borrowed) in frame f. */
static kiln_status add_node(struct fz *z, int at, const char *name, const char *op,
                            const struct edge *in, int n_in, KilnSm__AttrEntry **attrs,
                            int n_attrs, int f, int *out)
{
    kiln_status st;
    int n = at;
    if (at < 0) {
        if ((st = grow(z, z->n + 1)) != KILN_OK) return st;
        n = z->n;
    }
    KilnSm__NodeDef *nd = kiln_arena_alloc(z->mem, sizeof *nd);
    char **ins = kiln_arena_alloc(z->mem, sizeof(char *) * ((size_t)n_in + 1));
    struct edge *e = kiln_arena_alloc(&z->tmp, sizeof *e * ((size_t)n_in + 1));
    if (!nd || !ins || !e) return oom();
    kiln_sm__node_def__init(nd);
    nd->name = (char *)name;
    nd->op = (char *)op;
    nd->n_attr = (size_t)n_attrs;
    nd->attr = attrs;
    nd->n_input = (size_t)n_in;
    nd->input = ins;
    z->nd[n] = nd;
    for (int k = 0; k < n_in; k++)
        if (!(ins[k] = ref_str(z, in[k]))) return oom();
    if (n_in) memcpy(e, in, sizeof *e * (size_t)n_in);
    z->in[n] = e;
    z->n_in[n] = n_in;
    z->frame[n] = f;
    z->done[n] = 0;
    z->flow[n] = 0;
    if (at < 0) {
        z->n++;
        if ((st = put_name(z, n)) != KILN_OK) return st;
    }
    if (out) *out = n;
    return KILN_OK;
}

/* ---- frames ---- */

static bool ancestor(const struct fz *z, int a, int b) /* a is b or an ancestor of b */
{
    for (; b >= 0; b = z->fr[b].parent)
        if (a == b) return true;
    return false;
}

static kiln_status child_frame(struct fz *z, int parent, const char *name, int enter, int *out)
{
    for (int i = 0; i < z->n_fr; i++)
        if (z->fr[i].parent == parent && strcmp(z->fr[i].name, name) == 0) {
            *out = i;
            return KILN_OK;
        }
    if (z->n_fr == z->cap_fr) {
        int cap = z->cap_fr ? z->cap_fr * 2 : 16;
        struct frame *p = realloc(z->fr, sizeof *p * (size_t)cap);
        if (!p) return oom();
        z->fr = p;
        z->cap_fr = cap;
    }
    z->fr[z->n_fr] = (struct frame){.name = name, .parent = parent, .enter = name_of(z, enter)};
    *out = z->n_fr++;
    return KILN_OK;
}

static bool from_next_iteration(const struct fz *z, struct edge e)
{
    return is_op(z->nd[e.src], "NextIteration");
}

/* Consumers of the original nodes, and frames by a topological pass that
 * ignores the NextIteration back edges. */
static kiln_status assign_frames(struct fz *z)
{
    int n = z->n;
    kiln_status st = KILN_OK;
    z->out_off = calloc((size_t)n + 1, sizeof(int));
    int *indeg = calloc((size_t)n + 1, sizeof(int));
    int *queue = malloc(sizeof(int) * ((size_t)n + 1));
    int *fill = calloc((size_t)n + 1, sizeof(int));
    long total = 0;
    if (!z->out_off || !indeg || !queue || !fill) {
        st = oom();
        goto out;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < z->n_in[i]; k++) {
            z->out_off[z->in[i][k].src + 1]++;
            total++;
            if (!from_next_iteration(z, z->in[i][k])) indeg[i]++;
        }
    for (int i = 0; i < n; i++) z->out_off[i + 1] += z->out_off[i];
    z->out_src = malloc(sizeof(int) * ((size_t)total + 1));
    if (!z->out_src) {
        st = oom();
        goto out;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < z->n_in[i]; k++) {
            int s = z->in[i][k].src;
            z->out_src[z->out_off[s] + fill[s]++] = z->in[i][k].port < 0 ? -(i + 1) : i;
        }
    z->fr = NULL;
    z->n_fr = z->cap_fr = 0;
    int root;
    if ((st = child_frame(z, -1, "", 0, &root)) != KILN_OK) goto out;
    z->fr[root].enter = "";
    int qh = 0, qt = 0;
    for (int i = 0; i < n; i++)
        if (!indeg[i]) queue[qt++] = i;
    while (qh < qt) {
        int i = queue[qh++];
        const KilnSm__NodeDef *nd = z->nd[i];
        int f = 0;
        if (is_op(nd, "Enter")) {
            if (z->n_in[i] < 1 || z->in[i][0].port < 0) {
                st = nerr(z, i, "has no data input");
                goto out;
            }
            const KilnSm__AttrValue *fn = attr(z, i, "frame_name");
            if (!fn || fn->value_case != KILN_SM__ATTR_VALUE__VALUE_S || fn->s.len == 0) {
                st = nerr(z, i, "has no frame_name");
                goto out;
            }
            char *name = kiln_arena_alloc(&z->tmp, fn->s.len + 1);
            if (!name) {
                st = oom();
                goto out;
            }
            memcpy(name, fn->s.data, fn->s.len);
            if ((st = child_frame(z, z->frame[z->in[i][0].src], name, i, &f)) != KILN_OK) goto out;
        } else if (is_op(nd, "Exit")) {
            if (z->n_in[i] < 1 || z->in[i][0].port < 0) {
                st = nerr(z, i, "has no data input");
                goto out;
            }
            int g = z->frame[z->in[i][0].src];
            if (g == 0) {
                st = nerr(z, i, "is not inside a while loop: no Enter node leads to its input '%s'",
                          name_of(z, z->in[i][0].src));
                goto out;
            }
            f = z->fr[g].parent;
        } else {
            for (int k = 0; k < z->n_in[i]; k++) {
                if (from_next_iteration(z, z->in[i][k])) continue;
                int g = z->frame[z->in[i][k].src];
                if (ancestor(z, f, g)) f = g;
                else if (!ancestor(z, g, f)) {
                    st = nerr(z, i,
                              "reads from two different while loops: frame '%s' (input '%s') and "
                              "frame '%s'",
                              z->fr[g].name, name_of(z, z->in[i][k].src), z->fr[f].name);
                    goto out;
                }
            }
        }
        z->frame[i] = f;
        for (int k = z->out_off[i]; k < z->out_off[i + 1]; k++) {
            int j = z->out_src[k] < 0 ? -z->out_src[k] - 1 : z->out_src[k];
            if (is_op(nd, "NextIteration")) continue;
            /* each edge i->j counted once per input slot: decrement per slot */
            if (--indeg[j] == 0) queue[qt++] = j;
        }
    }
    if (qt < n) {
        for (int i = 0; i < n; i++)
            if (indeg[i] > 0) {
                st = nerr(z, i, "is on (or after) a cycle that does not pass through a "
                                "NextIteration node");
                goto out;
            }
    }
    /* NextIteration must lead back to a Merge of its own frame */
    for (int i = 0; i < n; i++) {
        if (is_op(z->nd[i], "LoopCond") && z->frame[i] == 0) {
            st = nerr(z, i, "is not inside a while loop (no Enter node leads to it)");
            goto out;
        }
        if (!is_op(z->nd[i], "NextIteration")) continue;
        if (z->frame[i] == 0) {
            st = nerr(z, i, "is not inside a while loop (no Enter node leads to it)");
            goto out;
        }
        int merge = -1;
        for (int k = z->out_off[i]; k < z->out_off[i + 1] && merge < 0; k++)
            if (z->out_src[k] >= 0 && is_op(z->nd[z->out_src[k]], "Merge")) merge = z->out_src[k];
        if (merge < 0) {
            st = nerr(z, i, "feeds no Merge (a NextIteration must lead back to the Merge of its "
                            "loop variable)");
            goto out;
        }
        if (z->frame[merge] != z->frame[i]) {
            st = nerr(z, i, "is in while loop frame '%s' but feeds Merge '%s' of frame '%s'",
                      z->fr[z->frame[i]].name, name_of(z, merge), z->fr[z->frame[merge]].name);
            goto out;
        }
    }
out:
    free(indeg);
    free(queue);
    free(fill);
    return st;
}

/* ---- classification ---- */

static bool has_input_from(const struct fz *z, int n, const char *op)
{
    for (int k = 0; k < z->n_in[n]; k++)
        if (z->in[n][k].port >= 0 && is_op(z->nd[z->in[n][k].src], op)) return true;
    return false;
}

static bool loop_merge(const struct fz *z, int n)
{
    return is_op(z->nd[n], "Merge") && (has_input_from(z, n, "NextIteration") || has_input_from(z, n, "Enter"));
}

static bool loop_switch(const struct fz *z, int n)
{
    return is_op(z->nd[n], "Switch") && z->n_in[n] >= 2 &&
           is_op(z->nd[z->in[n][1].src], "LoopCond");
}

static bool loop_machinery(const struct fz *z, int n)
{
    return is_op(z->nd[n], "Enter") || is_op(z->nd[n], "NextIteration") ||
           is_op(z->nd[n], "LoopCond") || loop_merge(z, n) || loop_switch(z, n);
}

static bool cond_merge(const struct fz *z, int n)
{
    return !z->done[n] && is_op(z->nd[n], "Merge") && !loop_merge(z, n);
}

/* Whether endpoint e carries a TensorArray flow. */
static bool is_flow(const struct fz *z, struct edge e, int depth)
{
    if (e.port < 0 || depth > V1_FLOW_DEPTH) return false;
    const KilnSm__NodeDef *nd = z->nd[e.src];
    if (e.port < 32 && (z->flow[e.src] >> e.port & 1u)) return true;
    if (is_op(nd, "TensorArrayV3")) return e.port == 1;
    if (is_op(nd, "TensorArrayWriteV3") || is_op(nd, "TensorArrayScatterV3") ||
        is_op(nd, "TensorArraySplitV3"))
        return true;
    if ((is_op(nd, "Identity") || is_cf_op(nd)) && z->n_in[e.src] >= 1 &&
        z->in[e.src][0].port >= 0)
        return is_flow(z, (struct edge){z->in[e.src][0].src, z->in[e.src][0].port}, depth + 1);
    return false;
}

/* Strip Identity nodes off an endpoint. */
static struct edge strip_identity(const struct fz *z, struct edge e)
{
    for (int i = 0; i < V1_FLOW_DEPTH && is_op(z->nd[e.src], "Identity") && z->n_in[e.src] >= 1 &&
                    z->in[e.src][0].port >= 0;
         i++)
        e = z->in[e.src][0];
    return e;
}

/* ---- regions and the functions made of them ---- */

enum kind { K_REGION, K_ARG, K_VAR, K_SWITCH, K_DROP, K_WAIT };

/* What a source endpoint is to the structure being made. */
struct resolver {
    enum kind (*fn)(struct fz *z, struct resolver *r, struct edge e, struct edge *ep, int *var);
    int n_vars;
    /* loops */
    int frame;
    int *merge, *sw; /* per loop variable */
    /* conds: switches met on the current side */
    struct edge *sws;
    int n_sws, cap_sws;
    kiln_status err;
};

struct args {
    struct edge *ep;
    int n, cap, fixed; /* the first `fixed` are loop variables, never shared */
};

static int arg_add(struct args *a, struct edge e)
{
    for (int i = a->fixed; i < a->n; i++)
        if (a->ep[i].src == e.src && a->ep[i].port == e.port) return i;
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 16;
        struct edge *p = realloc(a->ep, sizeof *p * (size_t)cap);
        if (!p) return -1;
        a->ep = p;
        a->cap = cap;
    }
    a->ep[a->n] = e;
    return a->n++;
}

struct region {
    int *nodes;
    int n, cap;
    unsigned char *in; /* per node: 1 candidate, 2 member */
};

static kiln_status region_push(struct region *R, int n)
{
    if (R->n == R->cap) {
        int cap = R->cap ? R->cap * 2 : 64;
        int *p = realloc(R->nodes, sizeof *p * (size_t)cap);
        if (!p) return oom();
        R->nodes = p;
        R->cap = cap;
    }
    R->nodes[R->n++] = n;
    R->in[n] = 1;
    return KILN_OK;
}

/* Walk backwards from the roots, adding the nodes the resolver calls
 * K_REGION to R. *wait is set when something inside is not yet done. */
static kiln_status walk(struct fz *z, struct resolver *rs, struct region *R, const struct edge *roots,
                        int n_roots, bool *wait)
{
    kiln_status st = KILN_OK;
    int *stack = malloc(sizeof(int) * ((size_t)z->n + 1));
    int top = 0;
    if (!stack) return oom();
    *wait = false;
    for (int r = 0; r < n_roots || top > 0;) {
        const struct edge *es;
        int ne;
        if (r < n_roots) {
            es = &roots[r++];
            ne = 1;
        } else {
            int n = stack[--top];
            es = z->in[n];
            ne = z->n_in[n];
        }
        for (int k = 0; k < ne; k++) {
            struct edge ep;
            int var = -1;
            enum kind kd = rs->fn(z, rs, es[k], &ep, &var);
            if ((st = rs->err) != KILN_OK) goto out;
            if (kd == K_WAIT) *wait = true;
            if (kd == K_REGION && !R->in[es[k].src]) {
                if ((st = region_push(R, es[k].src)) != KILN_OK) goto out;
                stack[top++] = es[k].src;
            }
        }
    }
out:
    free(stack);
    return st;
}

/* The function-body reference for endpoint e of a node in region R. */
static kiln_status body_ref(struct fz *z, struct resolver *rs, struct region *R, struct args *a,
                            struct edge e, char **out)
{
    if (R->in[e.src] == 2) {
        *out = e.port < 0 ? fmt(z, "^%s", name_of(z, e.src)) : fmt(z, "%s::%d", name_of(z, e.src), e.port);
        return *out ? KILN_OK : oom();
    }
    if (e.port < 0) {
        *out = NULL; /* control edge from outside: dropped */
        return KILN_OK;
    }
    struct edge ep = e;
    int var = -1;
    enum kind k = rs->fn(z, rs, e, &ep, &var);
    if (rs->err != KILN_OK) return rs->err;
    int i;
    if (k == K_VAR) i = var;
    else if (k == K_SWITCH || k == K_ARG || k == K_REGION) i = arg_add(a, k == K_REGION ? e : ep);
    else return kiln_error(KILN_ERR_INVALID_MODEL, "TF1 control flow: node '%s' cannot be read here",
                           name_of(z, e.src));
    if (i < 0) return oom();
    *out = fmt(z, "arg#%d", i);
    return *out ? KILN_OK : oom();
}

/* Make a function of the members of R returning rets (and, when
 * extra_index >= 0, an int32 constant extra_index). The argument list
 * (a) grows with what the body reads; the signature is written by
 * fn_finish once every function sharing it is made. */
static kiln_status make_fn(struct fz *z, struct resolver *rs, struct region *R, struct args *a,
                           const char *name, const struct edge *rets, int n_rets, int extra_index,
                           KilnSm__FunctionDef **out)
{
    kiln_status st;
    KilnSm__FunctionDef *fd = kiln_arena_alloc(z->mem, sizeof *fd);
    int n_members = 0;
    for (int i = 0; i < R->n; i++) n_members += R->in[R->nodes[i]] == 2;
    KilnSm__NodeDef **nodes = kiln_arena_alloc(z->mem, sizeof *nodes * ((size_t)n_members + 2));
    int n_out = n_rets + (extra_index >= 0);
    KilnSm__FunctionDef__StringEntry **ret = kiln_arena_alloc(z->mem, sizeof *ret * ((size_t)n_out + 1));
    if (!fd || !nodes || !ret) return oom();
    kiln_sm__function_def__init(fd);
    int m = 0;
    for (int i = 0; i < R->n; i++) {
        int n = R->nodes[i];
        if (R->in[n] != 2) continue;
        const KilnSm__NodeDef *src = z->nd[n];
        KilnSm__NodeDef *nd = kiln_arena_alloc(z->mem, sizeof *nd);
        char **ins = kiln_arena_alloc(z->mem, sizeof(char *) * ((size_t)z->n_in[n] + 1));
        if (!nd || !ins) return oom();
        *nd = *src;
        nd->input = ins;
        nd->n_input = 0;
        for (int k = 0; k < z->n_in[n]; k++) {
            char *r = NULL;
            if ((st = body_ref(z, rs, R, a, z->in[n][k], &r)) != KILN_OK) return st;
            if (r) ins[nd->n_input++] = r;
        }
        nodes[m++] = nd;
    }
    for (int k = 0; k < n_rets; k++) {
        KilnSm__FunctionDef__StringEntry *e = kiln_arena_alloc(z->mem, sizeof *e);
        if (!e) return oom();
        kiln_sm__function_def__string_entry__init(e);
        e->key = fmt(z, "out%d", k);
        if (!e->key) return oom();
        if ((st = body_ref(z, rs, R, a, rets[k], &e->value)) != KILN_OK) return st;
        ret[k] = e;
    }
    if (extra_index >= 0) {
        /* Merge's value_index: which input the value came from */
        KilnSm__NodeDef *c = kiln_arena_alloc(z->mem, sizeof *c);
        KilnSm__TensorProto *t = kiln_arena_alloc(z->mem, sizeof *t);
        KilnSm__TensorShapeProto *sh = kiln_arena_alloc(z->mem, sizeof *sh);
        KilnSm__AttrValue *tv = kiln_arena_alloc(z->mem, sizeof *tv);
        KilnSm__AttrEntry **ats = kiln_arena_alloc(z->mem, sizeof *ats * 2);
        int32_t *iv = kiln_arena_alloc(z->mem, sizeof *iv);
        KilnSm__FunctionDef__StringEntry *e = kiln_arena_alloc(z->mem, sizeof *e);
        if (!c || !t || !sh || !tv || !ats || !iv || !e) return oom();
        kiln_sm__node_def__init(c);
        kiln_sm__tensor_proto__init(t);
        kiln_sm__tensor_shape_proto__init(sh);
        kiln_sm__attr_value__init(tv);
        *iv = extra_index;
        t->has_dtype = 1;
        t->dtype = KILN_SM__DATA_TYPE__DT_INT32;
        t->tensor_shape = sh;
        t->n_int_val = 1;
        t->int_val = iv;
        tv->value_case = KILN_SM__ATTR_VALUE__VALUE_TENSOR;
        tv->tensor = t;
        ats[0] = entry(z, "dtype", av_type(z, TF_DT_INT32));
        ats[1] = entry(z, "value", tv);
        if (!ats[0] || !ats[1]) return oom();
        c->name = "value_index#";
        c->op = "Const";
        c->n_attr = 2;
        c->attr = ats;
        nodes[m++] = c;
        kiln_sm__function_def__string_entry__init(e);
        e->key = fmt(z, "out%d", n_rets);
        e->value = "value_index#::0";
        if (!e->key) return oom();
        ret[n_rets] = e;
    }
    fd->n_node_def = (size_t)m;
    fd->node_def = nodes;
    fd->n_ret = (size_t)n_out;
    fd->ret = ret;
    KilnSm__OpDef *sig = kiln_arena_alloc(z->mem, sizeof *sig);
    KilnSm__OpDef__ArgDef **outs = kiln_arena_alloc(z->mem, sizeof *outs * ((size_t)n_out + 1));
    if (!sig || !outs) return oom();
    kiln_sm__op_def__init(sig);
    sig->name = (char *)name;
    for (int k = 0; k < n_out; k++) {
        KilnSm__OpDef__ArgDef *ad = kiln_arena_alloc(z->mem, sizeof *ad);
        if (!ad) return oom();
        kiln_sm__op_def__arg_def__init(ad);
        ad->name = ret[k]->key;
        outs[k] = ad;
    }
    sig->n_output_arg = (size_t)n_out;
    sig->output_arg = outs;
    fd->signature = sig;
    if (z->n_fns == z->cap_fns) {
        int cap = z->cap_fns ? z->cap_fns * 2 : 16;
        KilnSm__FunctionDef **p = realloc(z->fns, sizeof *p * (size_t)cap);
        if (!p) return oom();
        z->fns = p;
        z->cap_fns = cap;
    }
    z->fns[z->n_fns++] = fd;
    *out = fd;
    return KILN_OK;
}

/* Give fd the arguments arg#0..n-1. */
static kiln_status fn_args(struct fz *z, KilnSm__FunctionDef *fd, int n)
{
    KilnSm__OpDef__ArgDef **ins = kiln_arena_alloc(z->mem, sizeof *ins * ((size_t)n + 1));
    if (!ins) return oom();
    for (int k = 0; k < n; k++) {
        KilnSm__OpDef__ArgDef *ad = kiln_arena_alloc(z->mem, sizeof *ad);
        if (!ad) return oom();
        kiln_sm__op_def__arg_def__init(ad);
        if (!(ad->name = fmt(z, "arg#%d", k))) return oom();
        ins[k] = ad;
    }
    fd->signature->n_input_arg = (size_t)n;
    fd->signature->input_arg = ins;
    return KILN_OK;
}

/* ---- conditionals ---- */

static enum kind cond_kind(struct fz *z, struct resolver *rs, struct edge e, struct edge *ep, int *var)
{
    (void)var;
    int s = e.src;
    const KilnSm__NodeDef *nd = z->nd[s];
    *ep = e;
    if (is_op(nd, "Switch") && !loop_switch(z, s)) {
        if (e.port < 0) return K_DROP;
        if (z->n_in[s] < 2 || z->in[s][0].port < 0 || z->in[s][1].port < 0) {
            rs->err = nerr(z, s, "needs a data input and a predicate");
            return K_DROP;
        }
        *ep = z->in[s][0];
        if (rs->n_sws == rs->cap_sws) {
            int cap = rs->cap_sws ? rs->cap_sws * 2 : 16;
            struct edge *p = realloc(rs->sws, sizeof *p * (size_t)cap);
            if (!p) {
                rs->err = oom();
                return K_DROP;
            }
            rs->sws = p;
            rs->cap_sws = cap;
        }
        rs->sws[rs->n_sws++] = e;
        return K_SWITCH;
    }
    if (loop_machinery(z, s)) return e.port < 0 ? K_DROP : K_ARG;
    if (is_op(nd, "Exit") || cond_merge(z, s)) return K_WAIT;
    if (z->n_in[s] == 0) return e.port < 0 ? K_DROP : K_ARG;
    return K_REGION;
}

/* Keep the candidates of R that depend on a Switch (through data or control
 * edges) as members; the others are read from outside. */
static kiln_status keep_dependent(struct fz *z, struct region *R)
{
    /* candidates were found from the roots backwards, so every candidate's
     * candidate inputs come later in R->nodes: decide from the end */
    for (int pass = 0, changed = 1; changed; pass++) {
        changed = 0;
        for (int i = R->n - 1; i >= 0; i--) {
            int n = R->nodes[i];
            if (R->in[n] == 2) continue;
            for (int k = 0; k < z->n_in[n]; k++) {
                int s = z->in[n][k].src;
                if ((is_op(z->nd[s], "Switch") && !loop_switch(z, s)) || R->in[s] == 2) {
                    R->in[n] = 2;
                    changed = 1;
                    break;
                }
            }
        }
        if (pass > R->n) break;
    }
    return KILN_OK;
}

static void region_reset(struct region *R)
{
    for (int i = 0; i < R->n; i++) R->in[R->nodes[i]] = 0;
    R->n = 0;
}

/* Turn cond Merge m into an If; *ready false when something inside it is
 * not done yet. */
static kiln_status do_cond(struct fz *z, int m, bool *ready)
{
    kiln_status st = KILN_OK;
    *ready = false;
    struct edge data[2];
    int nd_in = 0;
    for (int k = 0; k < z->n_in[m]; k++)
        if (z->in[m][k].port >= 0) {
            if (nd_in < 2) data[nd_in] = z->in[m][k];
            nd_in++;
        }
    if (nd_in != 2)
        return nerr(z, m, "has %d data inputs; Kiln turns a Merge of the two branches of a "
                          "tf.cond (Switch nodes) into a conditional", nd_in);
    struct region R[2] = {{0}};
    struct resolver rs[2] = {{.fn = cond_kind}, {.fn = cond_kind}};
    struct args a = {0};
    int side[2] = {-1, -1};
    struct edge pred = {-1, 0};
    R[0].in = calloc((size_t)z->n + 1, 1);
    R[1].in = calloc((size_t)z->n + 1, 1);
    if (!R[0].in || !R[1].in) {
        st = oom();
        goto out;
    }
    for (int s = 0; s < 2; s++) {
        bool wait = false;
        if ((st = walk(z, &rs[s], &R[s], &data[s], 1, &wait)) != KILN_OK) goto out;
        if (wait) goto out; /* an inner loop or conditional first */
        keep_dependent(z, &R[s]);
        for (int i = 0; i < rs[s].n_sws; i++) {
            struct edge sw = rs[s].sws[i];
            int p = sw.port ? 1 : 0;
            if (side[s] >= 0 && side[s] != p) {
                st = nerr(z, m, "its input %d depends on both the true and the false output of "
                                "Switch nodes (e.g. '%s')", s, name_of(z, sw.src));
                goto out;
            }
            side[s] = p;
            struct edge pe = strip_identity(z, z->in[sw.src][1]);
            if (pred.src < 0) pred = pe;
            else if (pred.src != pe.src || pred.port != pe.port) {
                st = nerr(z, m, "its branches are chosen by two predicates, '%s' and '%s' (Switch "
                                "'%s')", name_of(z, pred.src), name_of(z, pe.src), name_of(z, sw.src));
                goto out;
            }
        }
    }
    if (pred.src < 0) {
        st = nerr(z, m, "is not the end of a tf.cond: no Switch node leads to its inputs");
        goto out;
    }
    if (side[0] < 0) side[0] = !side[1];
    if (side[1] < 0) side[1] = !side[0];
    if (side[0] == side[1]) {
        st = nerr(z, m, "both of its inputs come from the %s side of the conditional",
                  side[0] ? "true" : "false");
        goto out;
    }
    /* both branches share one argument list */
    const char *base = name_of(z, m);
    KilnSm__FunctionDef *fd[2];
    for (int s = 0; s < 2; s++) {
        char *fname = fresh_fn_name(z, base, side[s] ? "then" : "else");
        if (!fname) {
            st = oom();
            goto out;
        }
        /* the value_index output: the Merge input this side is */
        if ((st = make_fn(z, &rs[s], &R[s], &a, fname, &data[s], 1, s, &fd[s])) != KILN_OK) goto out;
    }
    for (int s = 0; s < 2; s++)
        if ((st = fn_args(z, fd[s], a.n)) != KILN_OK) goto out;
    struct edge *ins = kiln_arena_alloc(&z->tmp, sizeof *ins * ((size_t)a.n + 2));
    KilnSm__AttrEntry **ats = kiln_arena_alloc(z->mem, sizeof *ats * 3);
    if (!ins || !ats) {
        st = oom();
        goto out;
    }
    ins[0] = pred;
    for (int i = 0; i < a.n; i++) ins[i + 1] = a.ep[i];
    int tout[2] = {attr_type(z, m, "T"), TF_DT_INT32};
    int t = side[0] ? 0 : 1; /* the input that is the true side */
    ats[0] = entry(z, "then_branch", av_func(z, fd[t]->signature->name));
    ats[1] = entry(z, "else_branch", av_func(z, fd[1 - t]->signature->name));
    ats[2] = entry(z, "Tout", av_types(z, tout, 2));
    if (!ats[0] || !ats[1] || !ats[2]) {
        st = oom();
        goto out;
    }
    unsigned flow = is_flow(z, data[0], 0) || is_flow(z, data[1], 0);
    if ((st = add_node(z, m, name_of(z, m), "If", ins, a.n + 1, ats, 3, z->frame[m], NULL)) != KILN_OK)
        goto out;
    z->flow[m] = flow;
    *ready = true;
out:
    free(R[0].nodes);
    free(R[1].nodes);
    free(R[0].in);
    free(R[1].in);
    free(rs[0].sws);
    free(rs[1].sws);
    free(a.ep);
    return st;
}

/* ---- while loops ---- */

struct loop_var {
    int enter, merge, sw, next;
};

static enum kind loop_kind(struct fz *z, struct resolver *rs, struct edge e, struct edge *ep, int *var)
{
    int s = e.src;
    const KilnSm__NodeDef *nd = z->nd[s];
    *ep = e;
    for (int i = 0; i < rs->n_vars; i++)
        if (s == rs->merge[i] || s == rs->sw[i]) {
            if (e.port < 0) return K_DROP;
            if (s == rs->sw[i] && e.port != 1) {
                rs->err = nerr(z, s, "its false output (the loop's exit) is read inside the loop");
                return K_DROP;
            }
            *var = i;
            return K_VAR;
        }
    if (z->frame[s] != rs->frame) {
        if (!ancestor(z, z->frame[s], rs->frame)) {
            rs->err = nerr(z, s, "is read by while loop frame '%s' but is not outside it",
                           z->fr[rs->frame].name);
            return K_DROP;
        }
        return e.port < 0 ? K_DROP : K_ARG;
    }
    if (is_op(nd, "Enter")) {
        const KilnSm__AttrValue *c = attr(z, s, "is_constant");
        if (!(c && c->value_case == KILN_SM__ATTR_VALUE__VALUE_B && c->b)) {
            rs->err = nerr(z, s, "is a loop variable's Enter but is read by the loop body directly "
                                 "(not through its Merge)");
            return K_DROP;
        }
        if (e.port < 0) return K_DROP;
        *ep = z->in[s][0];
        return K_ARG;
    }
    if (z->done[s] || is_op(nd, "LoopCond") || is_op(nd, "Merge") || is_op(nd, "Switch") ||
        is_op(nd, "NextIteration") || is_op(nd, "Exit")) {
        if (e.port < 0) return K_DROP;
        rs->err = nerr(z, s, "is read inside while loop frame '%s' in a way Kiln does not "
                             "recognize", z->fr[rs->frame].name);
        return K_DROP;
    }
    return K_REGION;
}

static kiln_status do_loop(struct fz *z, int f, bool *ready)
{
    kiln_status st = KILN_OK;
    *ready = false;
    for (int c = 0; c < z->n_fr; c++)
        if (z->fr[c].parent == f && !z->fr[c].done) return KILN_OK;
    int lc = -1, n_vars = 0, n_enter = 0;
    for (int i = 0; i < z->n; i++) {
        if (z->done[i]) continue;
        if (z->frame[i] == f && cond_merge(z, i)) return KILN_OK; /* conditionals first */
        if (z->frame[i] == f && is_op(z->nd[i], "LoopCond")) {
            if (lc >= 0)
                return nerr(z, i, "is a second LoopCond of while loop frame '%s' (the first is "
                                  "'%s')", z->fr[f].name, name_of(z, lc));
            lc = i;
        }
    }
    /* the Enters of frame f are the nodes in f whose input is outside */
    struct loop_var *lv = calloc((size_t)z->n + 1, sizeof *lv);
    struct region R = {0};
    struct resolver rs = {.fn = loop_kind, .frame = f};
    struct args a = {0};
    int *exits = NULL, n_exits = 0;
    if (!lv) return oom();
    for (int i = 0; i < z->n; i++) {
        if (z->done[i] || z->frame[i] != f || !is_op(z->nd[i], "Enter")) continue;
        n_enter++;
        const KilnSm__AttrValue *c = attr(z, i, "is_constant");
        if (c && c->value_case == KILN_SM__ATTR_VALUE__VALUE_B && c->b) continue;
        struct loop_var *v = &lv[n_vars];
        v->enter = i;
        v->merge = v->sw = v->next = -1;
        for (int k = z->out_off[i]; k < z->out_off[i + 1]; k++)
            if (z->out_src[k] >= 0 && is_op(z->nd[z->out_src[k]], "Merge")) v->merge = z->out_src[k];
        if (v->merge < 0) {
            st = nerr(z, i, "starts a loop variable of frame '%s' but feeds no Merge", z->fr[f].name);
            goto out;
        }
        for (int k = 0; k < z->n_in[v->merge]; k++)
            if (z->in[v->merge][k].port >= 0 && is_op(z->nd[z->in[v->merge][k].src], "NextIteration"))
                v->next = z->in[v->merge][k].src;
        if (v->next < 0) {
            st = nerr(z, v->merge, "joins Enter '%s' with no NextIteration: a loop variable's "
                                   "Merge needs both", name_of(z, i));
            goto out;
        }
        if (lc < 0) {
            st = nerr(z, i, "starts while loop frame '%s', which has no LoopCond node", z->fr[f].name);
            goto out;
        }
        int m = v->merge;
        for (int k = z->out_off[m]; k < z->out_off[m + 1]; k++) {
            int j = z->out_src[k];
            if (j >= 0 && is_op(z->nd[j], "Switch") && z->n_in[j] >= 2 && z->in[j][1].src == lc &&
                z->in[j][0].src == m)
                v->sw = j;
        }
        if (v->sw < 0) {
            st = nerr(z, m, "feeds no Switch on the loop's LoopCond '%s'", name_of(z, lc));
            goto out;
        }
        if (z->n_in[v->next] < 1 || z->in[v->next][0].port < 0) {
            st = nerr(z, v->next, "has no data input");
            goto out;
        }
        n_vars++;
    }
    if (n_vars == 0) {
        int any = -1;
        for (int i = 0; i < z->n && any < 0; i++)
            if (!z->done[i] && z->frame[i] == f) any = i;
        st = nerr(z, any >= 0 ? any : lc, "is in while loop frame '%s', which has no loop "
                                         "variable (an Enter with is_constant false)",
                  z->fr[f].name);
        goto out;
    }
    if (lc < 0 || z->n_in[lc] < 1 || z->in[lc][0].port < 0) {
        st = nerr(z, lv[0].enter, "starts while loop frame '%s', whose LoopCond is missing or "
                                  "has no input", z->fr[f].name);
        goto out;
    }
    rs.n_vars = n_vars;
    rs.merge = malloc(sizeof(int) * (size_t)n_vars);
    rs.sw = malloc(sizeof(int) * (size_t)n_vars);
    R.in = calloc((size_t)z->n + 1, 1);
    exits = malloc(sizeof(int) * ((size_t)z->n + 1));
    struct edge *roots = malloc(sizeof *roots * ((size_t)n_vars + 1));
    if (!rs.merge || !rs.sw || !R.in || !exits || !roots) {
        free(roots);
        st = oom();
        goto out;
    }
    a.fixed = n_vars;
    for (int i = 0; i < n_vars; i++) {
        rs.merge[i] = lv[i].merge;
        rs.sw[i] = lv[i].sw;
        if (arg_add(&a, z->in[lv[i].enter][0]) < 0) {
            free(roots);
            st = oom();
            goto out;
        }
        a.fixed = i + 1;
        roots[i] = z->in[lv[i].next][0];
    }
    a.fixed = n_vars;
    bool wait = false;
    /* cond: the frame's nodes up to LoopCond's input */
    struct edge croot = z->in[lc][0];
    if ((st = walk(z, &rs, &R, &croot, 1, &wait)) != KILN_OK) {
        free(roots);
        goto out;
    }
    for (int i = 0; i < R.n; i++) R.in[R.nodes[i]] = 2;
    KilnSm__FunctionDef *cfd, *bfd;
    char *cname = fresh_fn_name(z, name_of(z, lc), "cond");
    if (!cname) {
        free(roots);
        st = oom();
        goto out;
    }
    if ((st = make_fn(z, &rs, &R, &a, cname, &croot, 1, -1, &cfd)) != KILN_OK) {
        free(roots);
        goto out;
    }
    region_reset(&R);
    /* body: the frame's nodes up to each NextIteration's input */
    if ((st = walk(z, &rs, &R, roots, n_vars, &wait)) != KILN_OK) {
        free(roots);
        goto out;
    }
    for (int i = 0; i < R.n; i++) R.in[R.nodes[i]] = 2;
    char *bname = fresh_fn_name(z, name_of(z, lc), "body");
    if (!bname) {
        free(roots);
        st = oom();
        goto out;
    }
    /* the body's returns: the next values, then the invariants unchanged.
     * Its reads may add invariants: make it, then add their returns. */
    if ((st = make_fn(z, &rs, &R, &a, bname, roots, n_vars, -1, &bfd)) != KILN_OK) {
        free(roots);
        goto out;
    }
    free(roots);
    int n_args = a.n;
    {
        KilnSm__FunctionDef__StringEntry **ret =
            kiln_arena_alloc(z->mem, sizeof *ret * ((size_t)n_args + 1));
        KilnSm__OpDef__ArgDef **outs = kiln_arena_alloc(z->mem, sizeof *outs * ((size_t)n_args + 1));
        if (!ret || !outs) {
            st = oom();
            goto out;
        }
        memcpy(ret, bfd->ret, sizeof *ret * (size_t)n_vars);
        memcpy(outs, bfd->signature->output_arg, sizeof *outs * (size_t)n_vars);
        for (int k = n_vars; k < n_args; k++) {
            KilnSm__FunctionDef__StringEntry *e = kiln_arena_alloc(z->mem, sizeof *e);
            KilnSm__OpDef__ArgDef *ad = kiln_arena_alloc(z->mem, sizeof *ad);
            if (!e || !ad) {
                st = oom();
                goto out;
            }
            kiln_sm__function_def__string_entry__init(e);
            kiln_sm__op_def__arg_def__init(ad);
            e->key = ad->name = fmt(z, "out%d", k);
            e->value = fmt(z, "arg#%d", k);
            if (!e->key || !e->value) {
                st = oom();
                goto out;
            }
            ret[k] = e;
            outs[k] = ad;
        }
        bfd->ret = ret;
        bfd->n_ret = (size_t)n_args;
        bfd->signature->output_arg = outs;
        bfd->signature->n_output_arg = (size_t)n_args;
    }
    if ((st = fn_args(z, cfd, n_args)) != KILN_OK) goto out;
    if ((st = fn_args(z, bfd, n_args)) != KILN_OK) goto out;
    /* the While, in the parent frame */
    int *types = kiln_arena_alloc(&z->tmp, sizeof(int) * ((size_t)n_args + 1));
    KilnSm__AttrEntry **ats = kiln_arena_alloc(z->mem, sizeof *ats * 4);
    if (!types || !ats) {
        st = oom();
        goto out;
    }
    unsigned flow = 0;
    for (int k = 0; k < n_args; k++) {
        bool fl = is_flow(z, a.ep[k], 0);
        types[k] = fl ? TF_DT_VARIANT : k < n_vars ? attr_type(z, lv[k].enter, "T") : 0;
        if (fl && k < 32) flow |= 1u << k;
    }
    ats[0] = entry(z, "T", av_types(z, types, n_args));
    ats[1] = entry(z, "cond", av_func(z, cfd->signature->name));
    ats[2] = entry(z, "body", av_func(z, bfd->signature->name));
    const KilnSm__AttrValue *pi = attr(z, lv[0].enter, "parallel_iterations");
    int n_ats = 3;
    if (pi) ats[n_ats++] = entry(z, "parallel_iterations", (KilnSm__AttrValue *)pi);
    if (!ats[0] || !ats[1] || !ats[2] || !ats[n_ats - 1]) {
        st = oom();
        goto out;
    }
    char *wname = fresh_name(z, fmt(z, "%s/While", name_of(z, lc)));
    int w;
    if (!wname) {
        st = oom();
        goto out;
    }
    int parent = z->fr[f].parent;
    if ((st = add_node(z, -1, wname, "While", a.ep, n_args, ats, n_ats, parent, &w)) != KILN_OK)
        goto out;
    z->flow[w] = flow;
    /* each Exit becomes an Identity of the While's output */
    for (int i = 0; i < n_vars; i++) {
        int s = lv[i].sw;
        for (int k = z->out_off[s]; k < z->out_off[s + 1]; k++) {
            int x = z->out_src[k];
            if (x < 0 || z->done[x] || !is_op(z->nd[x], "Exit")) continue;
            if (z->in[x][0].src != s || z->in[x][0].port != 0) continue;
            exits[n_exits++] = x;
            KilnSm__AttrEntry **xa = kiln_arena_alloc(z->mem, sizeof *xa);
            if (!xa) {
                st = oom();
                goto out;
            }
            xa[0] = entry(z, "T", av_type(z, attr_type(z, x, "T")));
            if (!xa[0]) {
                st = oom();
                goto out;
            }
            struct edge e = {w, i};
            if ((st = add_node(z, x, name_of(z, x), "Identity", &e, 1, xa, 1, parent, NULL)) != KILN_OK)
                goto out;
        }
    }
    /* an Exit that is not on a loop variable's Switch is malformed */
    for (int i = 0; i < z->n; i++)
        if (!z->done[i] && z->frame[i] == parent && is_op(z->nd[i], "Exit") &&
            z->frame[z->in[i][0].src] == f) {
            st = nerr(z, i, "leaves while loop frame '%s' from '%s', which is not the Switch of "
                            "a loop variable", z->fr[f].name, name_of(z, z->in[i][0].src));
            goto out;
        }
    for (int i = 0; i < z->n; i++)
        if (z->frame[i] == f) z->done[i] = 1;
    z->fr[f].done = true;
    *ready = true;
out:
    free(lv);
    free(R.nodes);
    free(R.in);
    free(rs.merge);
    free(rs.sw);
    free(a.ep);
    free(exits);
    return st;
}

/* ---- the rewrite ---- */

kiln_status tf_v1_functionalize(struct kiln_arena *mem, const KilnSm__GraphDef **gdp)
{
    const KilnSm__GraphDef *gd = *gdp;
    bool any = false;
    for (size_t i = 0; i < gd->n_node; i++) {
        const KilnSm__NodeDef *nd = gd->node[i];
        if (!nd->name || !nd->name[0] || !nd->op || !nd->op[0]) return KILN_OK; /* index_graph says */
        for (size_t k = 0; k < nd->n_input; k++)
            if (!nd->input[k]) return KILN_OK;
        any |= is_cf_op(nd);
    }
    if (!any) return KILN_OK;
    if (gd->n_node > V1_MAX_NODES / 2)
        return kiln_error(KILN_ERR_UNSUPPORTED, "TF1 control flow: the graph has too many nodes");
    struct fz z = {.mem = mem, .lib = gd->library};
    kiln_status st = grow(&z, (int)gd->n_node + 1);
    if (st != KILN_OK) goto out;
    z.n_orig = (int)gd->n_node;
    for (int i = 0; i < (int)gd->n_node; i++) {
        z.nd[i] = gd->node[i];
        if (z.ht_cap && find_n(&z, gd->node[i]->name, strlen(gd->node[i]->name)) >= 0)
            goto out; /* two nodes of one name: index_graph reports it */
        z.n = i + 1;
        if ((st = put_name(&z, i)) != KILN_OK) goto out;
    }
    for (int i = 0; i < z.n; i++)
        if ((st = parse_inputs(&z, i)) != KILN_OK) goto out;
    if ((st = assign_frames(&z)) != KILN_OK) goto out;
    for (bool progress = true; progress;) {
        progress = false;
        for (int i = 0; i < z.n; i++) {
            if (!cond_merge(&z, i) || z.done[i]) continue;
            bool ready;
            if ((st = do_cond(&z, i, &ready)) != KILN_OK) goto out;
            progress |= ready;
        }
        for (int f = 1; f < z.n_fr; f++) {
            if (z.fr[f].done) continue;
            bool ready;
            if ((st = do_loop(&z, f, &ready)) != KILN_OK) goto out;
            progress |= ready;
        }
    }
    for (int i = 0; i < z.n; i++)
        if (!z.done[i] && (cond_merge(&z, i) || (z.frame[i] > 0 && !z.fr[z.frame[i]].done))) {
            st = nerr(&z, i, "is part of TF1 control flow Kiln could not turn into loops and "
                             "conditionals (loops and conditionals that depend on each other "
                             "in a cycle)");
            goto out;
        }
    /* the new graph: the main graph's nodes as rewritten, the library plus the new functions */
    KilnSm__GraphDef *ng = kiln_arena_alloc(mem, sizeof *ng);
    KilnSm__FunctionDefLibrary *lib = kiln_arena_alloc(mem, sizeof *lib);
    KilnSm__NodeDef **nodes = kiln_arena_alloc(mem, sizeof *nodes * ((size_t)z.n + 1));
    size_t n_old = gd->library ? gd->library->n_function : 0;
    KilnSm__FunctionDef **fns = kiln_arena_alloc(mem, sizeof *fns * (n_old + (size_t)z.n_fns + 1));
    if (!ng || !lib || !nodes || !fns) {
        st = oom();
        goto out;
    }
    *ng = *gd;
    if (gd->library) *lib = *gd->library;
    else kiln_sm__function_def_library__init(lib);
    memcpy(nodes, z.nd, sizeof *nodes * (size_t)z.n);
    if (n_old) memcpy(fns, gd->library->function, sizeof *fns * n_old);
    if (z.n_fns) memcpy(fns + n_old, z.fns, sizeof *fns * (size_t)z.n_fns);
    ng->node = nodes;
    ng->n_node = (size_t)z.n;
    lib->function = fns;
    lib->n_function = n_old + (size_t)z.n_fns;
    ng->library = lib;
    *gdp = ng;
out:
    fz_free(&z);
    return st;
}

/* ---- TensorArrayV3 ---- */

typedef struct tf_node_ctx L_t;

static kiln_status set_outs(L_t *L, int n)
{
    L->n_out = n;
    L->out = kiln_arena_alloc(L->g->mem, sizeof *L->out * ((size_t)n + 1));
    if (!L->out) return oom();
    for (int i = 0; i < n; i++) L->out[i] = (struct tf_sym){.v = -1, .var = -1};
    return KILN_OK;
}

static kiln_status out1(L_t *L, int v)
{
    kiln_status st = set_outs(L, 1);
    if (st == KILN_OK) L->out[0].v = v;
    return st;
}

static kiln_status emit_a(L_t *L, enum kiln_op op, int n_in, const int *in, const char *an,
                          int64_t av, int *out)
{
    struct kiln_attr a = {.name = an, .type = KILN_ATTR_INT, .i = av};
    return tf_emit(L, op, n_in, in, 1, &a, 1, out);
}

/* Shape(x)[start:end] (end < 0: to the end) as int64 [k]. */
static kiln_status shape_part(L_t *L, int x, int64_t start, int64_t end, int *out)
{
    struct kiln_attr a[2] = {{.name = "start", .type = KILN_ATTR_INT, .i = start},
                             {.name = "end", .type = KILN_ATTR_INT, .i = end}};
    return tf_emit(L, KILN_OP_Shape, 1, &x, 1, a, end < 0 ? 1 : 2, out);
}

/* The array's length (its first dim) as an int64 scalar. */
static kiln_status ta_length(L_t *L, int ta, int *out)
{
    int s = -1, none = -1;
    kiln_status st = shape_part(L, ta, 0, 1, &s);
    if (st == KILN_OK) st = tf_const_i64(L, 1, 0, NULL, &none);
    int in[2] = {s, none};
    return st == KILN_OK ? tf_emit1(L, KILN_OP_Reshape, 2, in, out) : st;
}

/* Whether the array behind handle input k grows (dynamic_size): the handle
 * is the int64 constant TensorArrayV3 made; anything else may grow. */
static bool ta_dynamic(L_t *L, int k)
{
    if (k >= L->n_in || L->in[k].v < 0) return true;
    const struct kiln_value *v = &L->g->values[L->in[k].v];
    if (v->kind != KILN_VALUE_CONST || !v->konst || v->konst->dtype != KILN_DTYPE_I64 ||
        kiln_tensor_count(v->konst) != 1)
        return true;
    return kiln_tensor_i64(v->konst, 0) != 0;
}

static kiln_status lower_ta_new(L_t *L)
{
    const KilnSm__AttrValue *dt_a = tf_attr(L->nd, L->inst, "dtype");
    kiln_dtype dt = dt_a && dt_a->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype(dt_a->type)
                                                                              : KILN_DTYPE_UNDEFINED;
    if (dt == KILN_DTYPE_UNDEFINED || dt == KILN_DTYPE_STRING)
        return tf_node_err(L, KILN_ERR_UNSUPPORTED, "TensorArrays of dtype %s are not supported",
                           dt_a && dt_a->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE
                               ? tf_dtype_name(dt_a->type)
                               : "(none)");
    int64_t dims[KILN_MAX_RANK];
    int rank = 1;
    dims[0] = 0; /* unknown rank: no elements until the first write fixes the shape */
    const KilnSm__AttrValue *es = tf_attr(L->nd, L->inst, "element_shape");
    if (es && es->value_case == KILN_SM__ATTR_VALUE__VALUE_SHAPE && !es->shape->unknown_rank &&
        es->shape->n_dim < KILN_MAX_RANK) {
        rank = (int)es->shape->n_dim;
        for (int i = 0; i < rank; i++) {
            int64_t d = es->shape->dim[i]->size;
            dims[i] = d >= 0 ? d : 0;
        }
    }
    const KilnSm__AttrValue *dyn = tf_attr(L->nd, L->inst, "dynamic_size");
    int64_t dynamic = dyn && dyn->value_case == KILN_SM__ATTR_VALUE__VALUE_B && dyn->b;
    int size, size64, size1, tail, shape, list, handle, one_v;
    int64_t one = 1;
    kiln_status st = tf_in_value(L, 0, &size);
    if (st == KILN_OK) st = tf_cast_to(L, size, KILN_DTYPE_I64, &size64);
    if (st == KILN_OK) st = tf_const_i64(L, 1, 1, &one, &one_v);
    if (st != KILN_OK) return st;
    int r_in[2] = {size64, one_v};
    if ((st = tf_emit1(L, KILN_OP_Reshape, 2, r_in, &size1)) != KILN_OK) return st;
    if ((st = tf_const_i64(L, 1, rank, dims, &tail)) != KILN_OK) return st;
    int c_in[2] = {size1, tail};
    if ((st = emit_a(L, KILN_OP_Concat, 2, c_in, "axis", 0, &shape)) != KILN_OK) return st;
    int64_t d1 = 1;
    kiln_tensor *zero;
    if ((st = kiln_tensor_new(dt, 1, &d1, &zero)) != KILN_OK) return st;
    if ((st = kiln_graph_own_tensor(L->g, zero)) != KILN_OK) return st;
    struct kiln_attr va = {.name = "value", .type = KILN_ATTR_TENSOR, .t = zero};
    if ((st = tf_emit(L, KILN_OP_ConstantOfShape, 1, &shape, 1, &va, 1, &list)) != KILN_OK) return st;
    if ((st = tf_const_i64(L, 0, 1, &dynamic, &handle)) != KILN_OK) return st;
    if ((st = set_outs(L, 2)) != KILN_OK) return st;
    L->out[0].v = handle;
    L->out[1].v = list;
    return KILN_OK;
}

/* ScatterND of value's rows into the array at indices, after setting the
 * row of the largest index (which fixes the element shape of an array made
 * with an unknown one and grows a dynamic array). */
static kiln_status ta_scatter(L_t *L, int ta, int idx, int value, int *out)
{
    int idx64, mx, am, row, base, col, flat, shp;
    kiln_status st = tf_cast_to(L, idx, KILN_DTYPE_I64, &idx64);
    if (st != KILN_OK) return st;
    if ((st = emit_a(L, KILN_OP_ReduceMax, 1, &idx64, "keepdims", 0, &mx)) != KILN_OK) return st;
    {
        struct kiln_attr a[2] = {{.name = "axis", .type = KILN_ATTR_INT, .i = 0},
                                 {.name = "keepdims", .type = KILN_ATTR_INT, .i = 0}};
        if ((st = tf_emit(L, KILN_OP_ArgMax, 1, &idx64, 1, a, 2, &am)) != KILN_OK) return st;
    }
    int g_in[2] = {value, am};
    if ((st = emit_a(L, KILN_OP_Gather, 2, g_in, "axis", 0, &row)) != KILN_OK) return st;
    int s_in[3] = {ta, mx, row};
    if ((st = emit_a(L, KILN_OP_TfListSetItem, 3, s_in, "resize", ta_dynamic(L, 0), &base)) != KILN_OK)
        return st;
    int64_t col_shape[2] = {-1, 1};
    if ((st = tf_const_i64(L, 1, 2, col_shape, &shp)) != KILN_OK) return st;
    int r_in[2] = {idx64, shp};
    if ((st = tf_emit1(L, KILN_OP_Reshape, 2, r_in, &col)) != KILN_OK) return st;
    int sc_in[3] = {base, col, value};
    if ((st = tf_emit1(L, KILN_OP_ScatterND, 3, sc_in, &flat)) != KILN_OK) return st;
    *out = flat;
    return KILN_OK;
}

static kiln_status lower_ta_op(L_t *L, const char *op)
{
    kiln_status st;
    int ta, v, idx, value;
    if (strcmp(op, "TensorArrayCloseV3") == 0) return set_outs(L, 0);
    int flow_k = strcmp(op, "TensorArrayWriteV3") == 0 || strcmp(op, "TensorArrayScatterV3") == 0 ||
                         strcmp(op, "TensorArraySplitV3") == 0
                     ? 3
                 : strcmp(op, "TensorArraySizeV3") == 0 || strcmp(op, "TensorArrayConcatV3") == 0
                     ? 1
                     : 2;
    if (L->n_in != flow_k + 1)
        return tf_node_err(L, KILN_ERR_INVALID_MODEL, "has %d inputs, expected %d", L->n_in, flow_k + 1);
    if ((st = tf_in_value(L, flow_k, &ta)) != KILN_OK) return st;
    if (L->g->values[ta].type.rank == 0)
        return tf_node_err(L, KILN_ERR_UNSUPPORTED,
                           "its flow input is a scalar, not the flow of a TensorArrayV3 (Kiln "
                           "keeps a TensorArray in its flow tensor)");
    if (strcmp(op, "TensorArrayWriteV3") == 0) {
        int in[3] = {ta, 0, 0};
        if ((st = tf_in_value(L, 1, &in[1])) != KILN_OK) return st;
        if ((st = tf_in_value(L, 2, &in[2])) != KILN_OK) return st;
        if ((st = emit_a(L, KILN_OP_TfListSetItem, 3, in, "resize", ta_dynamic(L, 0), &v)) != KILN_OK)
            return st;
        return out1(L, v);
    }
    if (strcmp(op, "TensorArrayReadV3") == 0 || strcmp(op, "TensorArrayGatherV3") == 0) {
        if ((st = tf_in_value(L, 1, &idx)) != KILN_OK) return st;
        int in[2] = {ta, idx};
        if ((st = emit_a(L, KILN_OP_Gather, 2, in, "axis", 0, &v)) != KILN_OK) return st;
        return out1(L, v);
    }
    if (strcmp(op, "TensorArraySizeV3") == 0) {
        int len;
        if ((st = ta_length(L, ta, &len)) != KILN_OK) return st;
        if ((st = tf_cast_to(L, len, KILN_DTYPE_I32, &v)) != KILN_OK) return st;
        return out1(L, v);
    }
    if (strcmp(op, "TensorArrayScatterV3") == 0) {
        if ((st = tf_in_value(L, 1, &idx)) != KILN_OK) return st;
        if ((st = tf_in_value(L, 2, &value)) != KILN_OK) return st;
        if ((st = ta_scatter(L, ta, idx, value, &v)) != KILN_OK) return st;
        return out1(L, v);
    }
    if (strcmp(op, "TensorArrayConcatV3") == 0) {
        /* [n, a, ...] -> [n * a, ...]; lengths: n times a */
        int rest, m1, shp, n1, a1, lens;
        int64_t minus1 = -1;
        if ((st = shape_part(L, ta, 2, -1, &rest)) != KILN_OK) return st;
        if ((st = tf_const_i64(L, 1, 1, &minus1, &m1)) != KILN_OK) return st;
        int c_in[2] = {m1, rest};
        if ((st = emit_a(L, KILN_OP_Concat, 2, c_in, "axis", 0, &shp)) != KILN_OK) return st;
        int r_in[2] = {ta, shp};
        if ((st = tf_emit1(L, KILN_OP_Reshape, 2, r_in, &v)) != KILN_OK) return st;
        if ((st = shape_part(L, ta, 0, 1, &n1)) != KILN_OK) return st;
        if ((st = shape_part(L, ta, 1, 2, &a1)) != KILN_OK) return st;
        int e_in[2] = {a1, n1};
        if ((st = tf_emit1(L, KILN_OP_Expand, 2, e_in, &lens)) != KILN_OK) return st;
        if ((st = set_outs(L, 2)) != KILN_OK) return st;
        L->out[0].v = v;
        L->out[1].v = lens;
        return KILN_OK;
    }
    /* TensorArraySplitV3: equal constant lengths only */
    int lengths;
    if ((st = tf_in_value(L, 1, &value)) != KILN_OK) return st;
    if ((st = tf_in_value(L, 2, &lengths)) != KILN_OK) return st;
    const struct kiln_value *lv = &L->g->values[lengths];
    const kiln_tensor *lt = lv->kind == KILN_VALUE_CONST ? lv->konst : NULL;
    int64_t n = lt ? kiln_tensor_count(lt) : 0;
    if (!lt || lt->rank != 1 || n < 1 || !kiln_dtype_is_int(lt->dtype))
        return tf_node_err(L, KILN_ERR_UNSUPPORTED,
                           "lengths must be a constant vector (Kiln keeps a TensorArray as one "
                           "dense tensor, so its elements must be of one shape)");
    int64_t l0 = kiln_tensor_i64(lt, 0);
    for (int64_t i = 1; i < n; i++)
        if (kiln_tensor_i64(lt, i) != l0)
            return tf_node_err(L, KILN_ERR_UNSUPPORTED,
                               "lengths %lld and %lld differ (Kiln keeps a TensorArray as one "
                               "dense tensor, so its elements must be of one shape)",
                               (long long)l0, (long long)kiln_tensor_i64(lt, i));
    int head, rest, shp, rows, range, start, step, limit;
    int64_t nl[2] = {n, l0}, zero = 0, one = 1;
    if ((st = tf_const_i64(L, 1, 2, nl, &head)) != KILN_OK) return st;
    if ((st = shape_part(L, value, 1, -1, &rest)) != KILN_OK) return st;
    int c_in[2] = {head, rest};
    if ((st = emit_a(L, KILN_OP_Concat, 2, c_in, "axis", 0, &shp)) != KILN_OK) return st;
    int r_in[2] = {value, shp};
    if ((st = tf_emit1(L, KILN_OP_Reshape, 2, r_in, &rows)) != KILN_OK) return st;
    if ((st = tf_const_i64(L, 0, 1, &zero, &start)) != KILN_OK) return st;
    if ((st = tf_const_i64(L, 0, 1, &n, &limit)) != KILN_OK) return st;
    if ((st = tf_const_i64(L, 0, 1, &one, &step)) != KILN_OK) return st;
    int g_in[3] = {start, limit, step};
    if ((st = tf_emit1(L, KILN_OP_Range, 3, g_in, &range)) != KILN_OK) return st;
    if ((st = ta_scatter(L, ta, range, rows, &v)) != KILN_OK) return st;
    return out1(L, v);
}

static const char *const TA_OPS[] = {
    "TensorArrayV3",        "TensorArrayWriteV3",  "TensorArrayReadV3",  "TensorArrayGatherV3",
    "TensorArrayScatterV3", "TensorArraySizeV3",   "TensorArrayConcatV3", "TensorArraySplitV3",
    "TensorArrayCloseV3",
};

bool tf_v1_control_handles(const char *op)
{
    for (size_t i = 0; i < sizeof TA_OPS / sizeof *TA_OPS; i++)
        if (strcmp(op, TA_OPS[i]) == 0) return true;
    KilnSm__NodeDef nd = KILN_SM__NODE_DEF__INIT;
    nd.op = (char *)op;
    return is_cf_op(&nd);
}

kiln_status tf_v1_control_lower(struct tf_node_ctx *L)
{
    const char *op = L->nd->op ? L->nd->op : "";
    if (is_cf_op(L->nd))
        return tf_node_err(L, KILN_ERR_UNSUPPORTED,
                           "TF1 control flow is supported as the loops and conditionals "
                           "tf.while_loop and tf.cond build; this node is used outside of one%s",
                           L->scope && L->inst ? " (inside a function)" : "");
    if (strcmp(op, "TensorArrayV3") == 0) return lower_ta_new(L);
    return lower_ta_op(L, op);
}
