/*
 * tf_graph.c - a SavedModel's graph to Kiln IR: the walk that drives the
 * op lowering (tf_lower*.c, tf_control.c, ...).
 *
 * savedmodel.c reads the file and hands over a struct tf_model (tf_import.h):
 * the chosen MetaGraphDef's GraphDef (TF1 control flow already made
 * functional), its function library, and a restore function that reads a
 * variable's value from the checkpoint. Nothing here calls into savedmodel.c.
 *
 * Each SignatureDef becomes its own IR graph, named by the signature's
 * aliases. The GraphDef is walked backwards from the signature's output
 * tensors, as TensorFlow prunes a graph to what a fetch needs, with an
 * explicit stack (a long chain of nodes cannot exhaust the C stack). Calls
 * to library functions (PartitionedCall, StatefulPartitionedCall, or a node
 * whose op is a function's name) are inlined: the callee's arguments are
 * bound to the caller's inputs, its `ret` map gives the call's outputs, and
 * "node:out_arg:index" references inside bodies are mapped to flat output
 * indices. A function reached again while it is being inlined is an error
 * (recursion), as is inlining deeper than TF_MAX_CALL_DEPTH. Control inputs
 * ("^node") order side effects in TensorFlow; Kiln runs pure graphs, so they
 * are checked (a control dependency on an op that writes variable state is
 * an error) and dropped. Variables become constants holding their restored
 * values (or TfVariable nodes for TF1 variables a signature assigns).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tf_import.h"
#include "saved_model.pb-c.h"

#define TF_MAX_LOWERED_NODES 200000   /* TF nodes lowered for one signature */
#define TF_MAX_INLINED_NODES 400000   /* function body nodes instantiated for one signature */

/* ---- string -> int map (keys are not copied) ---- */

static uint64_t hash_n(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

void tf_map_free(struct tf_map *mp)
{
    free(mp->keys);
    free(mp->lens);
    free(mp->vals);
    memset(mp, 0, sizeof *mp);
}

/* Value of key k[0..n), or -1. */
int tf_map_getn(const struct tf_map *mp, const char *k, size_t n)
{
    if (!mp->cap) return -1;
    size_t i = hash_n(k, n) & (mp->cap - 1);
    while (mp->keys[i]) {
        if (mp->lens[i] == n && memcmp(mp->keys[i], k, n) == 0) return mp->vals[i];
        i = (i + 1) & (mp->cap - 1);
    }
    return -1;
}

int tf_map_get(const struct tf_map *mp, const char *k) { return tf_map_getn(mp, k, strlen(k)); }

/* Insert; *dup is set (and nothing changes) if the key is present. */
kiln_status tf_map_put(struct tf_map *mp, const char *k, int v, bool *dup)
{
    size_t n = strlen(k);
    if (dup) *dup = false;
    if ((mp->n + 1) * 2 > mp->cap) {
        size_t cap = mp->cap ? mp->cap * 2 : 64;
        const char **keys = calloc(cap, sizeof *keys);
        size_t *lens = calloc(cap, sizeof *lens);
        int *vals = calloc(cap, sizeof *vals);
        if (!keys || !lens || !vals) {
            free(keys);
            free(lens);
            free(vals);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory building a name map");
        }
        for (size_t i = 0; i < mp->cap; i++) {
            if (!mp->keys[i]) continue;
            size_t j = hash_n(mp->keys[i], mp->lens[i]) & (cap - 1);
            while (keys[j]) j = (j + 1) & (cap - 1);
            keys[j] = mp->keys[i];
            lens[j] = mp->lens[i];
            vals[j] = mp->vals[i];
        }
        free(mp->keys);
        free(mp->lens);
        free(mp->vals);
        mp->keys = keys;
        mp->lens = lens;
        mp->vals = vals;
        mp->cap = cap;
    }
    size_t i = hash_n(k, n) & (mp->cap - 1);
    while (mp->keys[i]) {
        if (mp->lens[i] == n && memcmp(mp->keys[i], k, n) == 0) {
            if (dup) *dup = true;
            return KILN_OK;
        }
        i = (i + 1) & (mp->cap - 1);
    }
    mp->keys[i] = k;
    mp->lens[i] = n;
    mp->vals[i] = v;
    mp->n++;
    return KILN_OK;
}

/* ---- per-signature build ---- */

enum { NS_NEW = 0, NS_VISITING, NS_DONE };

struct scope;

struct nstate {
    unsigned char phase;
    unsigned char scanned;      /* visited by the state-write scan */
    int n_out;
    struct tf_sym *out;
    struct scope *child;        /* call nodes: the inlined callee */
};

struct scope {
    struct scope *caller;            /* enclosing scope; NULL for the main graph */
    int fn;                          /* function index, -1 for the main graph */
    KilnSm__NodeDef **nodes;
    size_t n_nodes;
    const struct tf_map *index;
    struct nstate *ns;
    KilnSm__NameAttrList *inst;      /* instantiation attrs (placeholders); may be NULL */
    int n_args;
    const char **arg_names;
    int *arg_off, *arg_cnt;
    struct tf_sym *args;
    const char *prefix;              /* IR name prefix: "" or "call/path/" */
    const char *where;               /* for messages */
    int depth;
};

struct tf_build {
    struct tf_model *c;
    const char *sig;                 /* signature name */
    struct kiln_graph *g;
    int *var_value;                  /* per variable: IR value id in g, -1 if not yet */
    int n_var_value;
    struct tf_map feeds;               /* "node:idx" of the main graph -> IR value id */
    struct kiln_arena tmp;           /* scopes and strings of this build */
    long lowered;                    /* TF nodes lowered */
    long inlined;                    /* nodes of the function bodies instantiated */
};

static char *tmp_printf(struct tf_build *b, const char *fmt, ...) KILN_PRINTF(2, 3);
static char *tmp_printf(struct tf_build *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    char *s = kiln_arena_alloc(&b->tmp, (size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- attributes, dtypes, shapes ---- */

const KilnSm__AttrValue *tf_attr(const KilnSm__NodeDef *nd, const KilnSm__NameAttrList *inst,
                                 const char *key)
{
    for (size_t i = 0; i < nd->n_attr; i++) {
        const KilnSm__AttrEntry *e = nd->attr[i];
        if (!e->key || strcmp(e->key, key) != 0) continue;
        const KilnSm__AttrValue *v = e->value;
        if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_PLACEHOLDER && inst) {
            /* a function body's attr bound at instantiation */
            for (size_t j = 0; j < inst->n_attr; j++)
                if (inst->attr[j]->key && v->placeholder &&
                    strcmp(inst->attr[j]->key, v->placeholder) == 0)
                    return inst->attr[j]->value;
            return NULL;
        }
        return v;
    }
    return NULL;
}

kiln_dtype tf_dtype(int code)
{
    if (code > 100) code -= 100; /* DT_*_REF */
    switch (code) {
    case 1: return KILN_DTYPE_F32;
    case 2: return KILN_DTYPE_F64;
    case 3: return KILN_DTYPE_I32;
    case 4: return KILN_DTYPE_U8;
    case 5: return KILN_DTYPE_I16;
    case 6: return KILN_DTYPE_I8;
    case 7: return KILN_DTYPE_STRING;
    case 9: return KILN_DTYPE_I64;
    case 10: return KILN_DTYPE_BOOL;
    case 14: return KILN_DTYPE_BF16;
    case 17: return KILN_DTYPE_U16;
    case 19: return KILN_DTYPE_F16;
    case 22: return KILN_DTYPE_U32;
    case 23: return KILN_DTYPE_U64;
    default: return KILN_DTYPE_UNDEFINED;
    }
}

const char *tf_dtype_name(int code)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&kiln_sm__data_type__descriptor, code);
    return v ? v->name : "an unknown DataType";
}

/* A TensorShapeProto as a kiln_type shape (rank -1 when unknown). */
kiln_status tf_shape_from_proto(const KilnSm__TensorShapeProto *sp, const char *what,
                                    struct kiln_type *t)
{
    if (!sp || sp->unknown_rank) {
        t->rank = -1;
        return KILN_OK;
    }
    if (sp->n_dim > KILN_MAX_RANK)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: rank %zu exceeds Kiln's maximum %d", what,
                          sp->n_dim, KILN_MAX_RANK);
    t->rank = (int)sp->n_dim;
    for (size_t i = 0; i < sp->n_dim; i++) {
        int64_t d = sp->dim[i]->has_size ? sp->dim[i]->size : -1;
        if (d < -1)
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: dim %zu is %lld", what, i,
                              (long long)d);
        t->dims[i] = d;
        t->sym[i] = NULL;
    }
    return KILN_OK;
}

/* ---- parsing input references ---- */

/* Split "name:idx" of the main graph. Returns false if idx is malformed. */
bool tf_split_ref(const char *ref, size_t *name_len, int *idx)
{
    const char *colon = strchr(ref, ':');
    *idx = 0;
    if (!colon) {
        *name_len = strlen(ref);
        return true;
    }
    *name_len = (size_t)(colon - ref);
    char *end;
    errno = 0;
    long v = strtol(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || v < 0 || v > INT_MAX) return false;
    *idx = (int)v;
    return true;
}

bool tf_parse_index(const char *s, size_t n, int *out)
{
    if (n == 0 || n > 9) return false;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

/* How messages name the reader of a reference: "node 'x'", or what a
 * synthetic reader's name (starting with \x01) says. */
static const char *who(const KilnSm__NodeDef *nd, char *buf, size_t n)
{
    const char *name = nd->name ? nd->name : "";
    if (name[0] == '\x01') return name + 1;
    snprintf(buf, n, "node '%s'", name);
    return buf;
}
#define WHO(nd) who((nd), whobuf, sizeof whobuf)

/* A resolved input reference. */
struct ref {
    bool is_sym;          /* a function argument or a fed tensor */
    struct tf_sym sym;
    struct scope *s;      /* else: node `node` of scope s, output (arg, idx) */
    int node;
    const char *arg;      /* output argument name inside a function ("" in the main graph) */
    size_t arg_len;
    int idx;
};

static kiln_status feed_asset(struct tf_build *b, const char *tensor, int *value);

/* Resolve input reference `in` of node nd in scope s. Control inputs ("^x")
 * resolve to node x. */
static kiln_status resolve_ref(struct tf_build *b, struct scope *s, const KilnSm__NodeDef *nd,
                               const char *in, struct ref *r)
{
    char whobuf[200];
    memset(r, 0, sizeof *r);
    bool control = in[0] == '^';
    if (control) in++;
    if (!s->caller) {
        size_t nl;
        int idx = -1;
        if (!tf_split_ref(in, &nl, &idx))
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: %s has malformed input '%s'",
                              s->where, WHO(nd), in);
        if (!control) {
            /* a fed tensor (signature input or asset path) replaces its producer */
            char buf[256];
            char *key = nl + 16 <= sizeof buf ? buf : malloc(nl + 16);
            if (!key) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
            snprintf(key, nl + 16, "%.*s:%d", (int)nl, in, idx);
            int v = tf_map_get(&b->feeds, key);
            kiln_status st = v < 0 ? feed_asset(b, key, &v) : KILN_OK;
            if (key != buf) free(key);
            if (st != KILN_OK) return st;
            if (v >= 0) {
                r->is_sym = true;
                r->sym.v = v;
                r->sym.var = -1;
                return KILN_OK;
            }
        }
        int j = tf_map_getn(s->index, in, nl);
        if (j < 0)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "%s: %s has input '%s%s', but the graph has no node named "
                              "'%.*s'",
                              s->where, WHO(nd), control ? "^" : "", in, (int)nl, in);
        r->s = s;
        r->node = j;
        r->arg = "";
        r->idx = idx;
        return KILN_OK;
    }
    /* inside a function: "arg", "arg:i", "node:out", "node:out:i", "^node" */
    const char *c1 = strchr(in, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    size_t n0 = c1 ? (size_t)(c1 - in) : strlen(in);
    if (!control) {
        for (int a = 0; a < s->n_args; a++) {
            if (strlen(s->arg_names[a]) != n0 || memcmp(s->arg_names[a], in, n0) != 0) continue;
            int i = 0;
            if (c1 && (c2 || !tf_parse_index(c1 + 1, strlen(c1 + 1), &i)))
                return kiln_error(KILN_ERR_INVALID_MODEL,
                                  "%s: %s has malformed input '%s'", s->where, WHO(nd),
                                  in);
            if (i >= s->arg_cnt[a])
                return kiln_error(KILN_ERR_INVALID_MODEL,
                                  "%s: %s reads element %d of argument '%s', which has %d",
                                  s->where, WHO(nd), i, s->arg_names[a], s->arg_cnt[a]);
            r->is_sym = true;
            r->sym = s->args[s->arg_off[a] + i];
            return KILN_OK;
        }
    }
    int j = tf_map_getn(s->index, in, n0);
    if (j < 0)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: %s has input '%s%s', which names no argument or node of "
                          "the function",
                          s->where, WHO(nd), control ? "^" : "", in);
    r->s = s;
    r->node = j;
    if (control) return KILN_OK;
    if (!c1)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: %s has input '%s' without an output name (expected "
                          "'node:output:index')",
                          s->where, WHO(nd), in);
    r->arg = c1 + 1;
    r->arg_len = c2 ? (size_t)(c2 - r->arg) : strlen(r->arg);
    r->idx = 0;
    if (c2 && !tf_parse_index(c2 + 1, strlen(c2 + 1), &r->idx))
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: %s has malformed input '%s'",
                          s->where, WHO(nd), in);
    return KILN_OK;
}

static bool is_call_op(const char *op)
{
    return strcmp(op, "PartitionedCall") == 0 || strcmp(op, "StatefulPartitionedCall") == 0;
}

/* The function a node calls, or -1. inst receives its instantiation attrs. */
int tf_called_function(struct tf_model *c, const KilnSm__NodeDef *nd,
                           const KilnSm__NameAttrList *scope_inst, KilnSm__NameAttrList *inst)
{
    const char *op = nd->op ? nd->op : "";
    if (is_call_op(op)) {
        const KilnSm__AttrValue *f = tf_attr(nd, scope_inst, "f");
        if (!f || f->value_case != KILN_SM__ATTR_VALUE__VALUE_FUNC || !f->func->name) return -2;
        *inst = *f->func;
        return tf_map_get(&c->fn_index, f->func->name);
    }
    int fn = tf_map_get(&c->fn_index, op);
    if (fn >= 0) {
        kiln_sm__name_attr_list__init(inst);
        inst->name = (char *)op;
        inst->n_attr = nd->n_attr;
        inst->attr = nd->attr;
    }
    return fn;
}

/* Flat output index of a resolved node reference (producer must be known). */
static kiln_status ref_output(struct tf_model *c, const struct ref *r, int *flat)
{
    const KilnSm__NodeDef *nd = r->s->nodes[r->node];
    if (!r->s->caller || r->arg_len == 0) {
        *flat = r->idx;
        return KILN_OK;
    }
    char arg[128];
    if (r->arg_len >= sizeof arg)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: output name '%.40s...' is too long",
                          r->s->where, r->arg);
    memcpy(arg, r->arg, r->arg_len);
    arg[r->arg_len] = '\0';
    KilnSm__NameAttrList inst;
    int fn = tf_called_function(c, nd, r->s->inst, &inst);
    if (fn >= 0 && !is_call_op(nd->op)) {
        /* a direct call: outputs are the callee's output args, one tensor each */
        const KilnSm__OpDef *sig = c->fns[fn]->signature;
        for (size_t i = 0; sig && i < sig->n_output_arg; i++)
            if (sig->output_arg[i]->name && strcmp(sig->output_arg[i]->name, arg) == 0) {
                if (r->idx != 0)
                    return kiln_error(KILN_ERR_UNSUPPORTED,
                                      "%s: node '%s': list outputs of function calls are not "
                                      "supported",
                                      r->s->where, nd->name);
                *flat = (int)i;
                return KILN_OK;
            }
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: function '%s' has no output '%s'",
                          r->s->where, nd->op, arg);
    }
    kiln_status st = tf_output_index(nd, r->s->inst, arg, r->idx, flat);
    if (st != KILN_OK) return kiln_error_wrap(st, "%s: node '%s'", r->s->where, nd->name);
    return KILN_OK;
}

/* The value a resolved reference stands for (its producer is done). */
static kiln_status ref_sym(struct tf_model *c, const struct ref *r, const char *in,
                           struct tf_sym *out)
{
    if (r->is_sym) {
        *out = r->sym;
        return KILN_OK;
    }
    int flat = -1;
    kiln_status st = ref_output(c, r, &flat);
    if (st != KILN_OK) return st;
    const struct nstate *ns = &r->s->ns[r->node];
    if (flat < 0 || flat >= ns->n_out)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: input '%s' refers to output %d of node '%s' (op %s), which has %d "
                          "output%s",
                          r->s->where, in, flat, r->s->nodes[r->node]->name,
                          r->s->nodes[r->node]->op, ns->n_out, ns->n_out == 1 ? "" : "s");
    *out = ns->out[flat];
    return KILN_OK;
}

/* ---- scopes ---- */

static kiln_status scope_main(struct tf_build *b, struct scope **out)
{
    struct tf_model *c = b->c;
    struct scope *s = kiln_arena_alloc(&b->tmp, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    s->fn = -1;
    s->nodes = c->nodes;
    s->n_nodes = c->n_nodes;
    s->index = &c->node_index;
    s->ns = kiln_arena_alloc(&b->tmp, sizeof *s->ns * (c->n_nodes + 1));
    s->prefix = "";
    s->where = tmp_printf(b, "signature '%s'", b->sig);
    if (!s->ns || !s->where) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    *out = s;
    return KILN_OK;
}

/* Number of tensors a function argument stands for. */
static kiln_status arg_count(const KilnSm__OpDef__ArgDef *a, const KilnSm__NameAttrList *inst,
                             const char *fname, int *n)
{
    *n = 1;
    const char *attr = NULL;
    if (a->number_attr && a->number_attr[0]) attr = a->number_attr;
    else if (a->type_list_attr && a->type_list_attr[0]) attr = a->type_list_attr;
    if (!attr) return KILN_OK;
    const KilnSm__AttrValue *v = NULL;
    for (size_t j = 0; inst && j < inst->n_attr; j++)
        if (inst->attr[j]->key && strcmp(inst->attr[j]->key, attr) == 0) v = inst->attr[j]->value;
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_I && v->i >= 0 && v->i <= 4096) {
        *n = (int)v->i;
        return KILN_OK;
    }
    if (v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST && v->list->n_type <= 4096) {
        *n = (int)v->list->n_type;
        return KILN_OK;
    }
    return kiln_error(KILN_ERR_INVALID_MODEL,
                      "function '%s': the length of list argument '%s' (attr '%s') is not given",
                      fname, a->name ? a->name : "", attr);
}

/* Create the scope that inlines function fn for call node i of scope s. */
static kiln_status scope_call(struct tf_build *b, struct scope *s, int i, int fn,
                              const KilnSm__NameAttrList *inst, const struct tf_sym *in, int n_in,
                              struct scope **out)
{
    struct tf_model *c = b->c;
    const KilnSm__NodeDef *nd = s->nodes[i];
    const KilnSm__FunctionDef *fd = c->fns[fn];
    const char *fname = fd->signature->name;
    for (struct scope *p = s; p; p = p->caller)
        if (p->fn == fn)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "%s: node '%s' calls function '%s', which is already being called "
                              "(recursive functions are not supported)",
                              s->where, nd->name, fname);
    if (s->depth + 1 > TF_MAX_CALL_DEPTH)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: node '%s': function calls nest deeper than %d levels", s->where,
                          nd->name, TF_MAX_CALL_DEPTH);
    kiln_status st = tf_index_function(c, fn);
    if (st != KILN_OK) return st;
    /* every instance costs its whole body in bookkeeping: bound the total, so
     * that functions calling functions many times over cannot exhaust memory */
    b->inlined += (long)fd->n_node_def;
    if (b->inlined > TF_MAX_INLINED_NODES)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: node '%s': inlining function calls makes more than %d nodes",
                          s->where, nd->name, TF_MAX_INLINED_NODES);
    struct scope *cs = kiln_arena_alloc(&b->tmp, sizeof *cs);
    if (!cs) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    cs->caller = s;
    cs->fn = fn;
    cs->nodes = fd->node_def;
    cs->n_nodes = fd->n_node_def;
    cs->index = &c->fn_node_index[fn];
    cs->ns = kiln_arena_alloc(&b->tmp, sizeof *cs->ns * (fd->n_node_def + 1));
    KilnSm__NameAttrList *ci = kiln_arena_alloc(&b->tmp, sizeof *ci);
    if (!cs->ns || !ci) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    *ci = *inst;
    cs->inst = ci;
    cs->depth = s->depth + 1;
    cs->prefix = tmp_printf(b, "%s%s/", s->prefix, nd->name);
    cs->where = tmp_printf(b, "signature '%s', function '%s'", b->sig, fname);
    if (!cs->prefix || !cs->where) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    const KilnSm__OpDef *sig = fd->signature;
    cs->n_args = (int)sig->n_input_arg;
    cs->arg_names = kiln_arena_alloc(&b->tmp, sizeof(char *) * (sig->n_input_arg + 1));
    cs->arg_off = kiln_arena_alloc(&b->tmp, sizeof(int) * (sig->n_input_arg + 1));
    cs->arg_cnt = kiln_arena_alloc(&b->tmp, sizeof(int) * (sig->n_input_arg + 1));
    cs->args = kiln_arena_alloc(&b->tmp, sizeof(struct tf_sym) * ((size_t)n_in + 1));
    if (!cs->arg_names || !cs->arg_off || !cs->arg_cnt || !cs->args)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    int total = 0;
    for (size_t a = 0; a < sig->n_input_arg; a++) {
        int n = -1;
        if ((st = arg_count(sig->input_arg[a], ci, fname, &n)) != KILN_OK) return st;
        cs->arg_names[a] = sig->input_arg[a]->name ? sig->input_arg[a]->name : "";
        cs->arg_off[a] = total;
        cs->arg_cnt[a] = n;
        total += n;
        if (total > n_in) break;
    }
    if (total != n_in)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: node '%s' passes %d input%s to function '%s', which takes %d",
                          s->where, nd->name, n_in, n_in == 1 ? "" : "s", fname, total);
    if (n_in) memcpy(cs->args, in, sizeof *in * (size_t)n_in);
    *out = cs;
    return KILN_OK;
}

/* ---- state writes reachable through control dependencies ---- */

static kiln_status function_writes(struct tf_model *c, int fn, int depth, const char **what);

/* Whether node i of scope s, or anything it depends on, writes state. */
static kiln_status scan_writes(struct tf_build *b, struct scope *s, int i, const char **what)
{
    struct tf_model *c = b->c;
    int cap = 64, n = 0;
    int *stack = malloc(sizeof(int) * (size_t)cap);
    if (!stack) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_status st = KILN_OK;
    *what = NULL;
    if (!s->ns[i].scanned) {
        s->ns[i].scanned = 1;
        stack[n++] = i;
    }
    while (n > 0 && !*what) {
        int j = stack[--n];
        const KilnSm__NodeDef *nd = s->nodes[j];
        const char *op = nd->op ? nd->op : "";
        if (tf_op_writes_state(op)) {
            *what = nd->name;
            break;
        }
        KilnSm__NameAttrList inst;
        int fn = tf_called_function(c, nd, s->inst, &inst);
        if (fn >= 0) {
            st = function_writes(c, fn, s->depth + 1, what);
            if (st != KILN_OK) break;
            if (*what) {
                *what = nd->name;
                break;
            }
        }
        for (size_t k = 0; k < nd->n_input; k++) {
            struct ref r;
            /* a fed input cuts the dependency; malformed ones are reported elsewhere */
            if (resolve_ref(b, s, nd, nd->input[k], &r) != KILN_OK) {
                kiln_error_clear();
                continue;
            }
            if (r.is_sym || r.s->ns[r.node].scanned) continue;
            r.s->ns[r.node].scanned = 1;
            if (n == cap) {
                int *p = realloc(stack, sizeof(int) * (size_t)cap * 2);
                if (!p) {
                    st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
                    goto out;
                }
                stack = p;
                cap *= 2;
            }
            stack[n++] = r.node;
        }
    }
out:
    free(stack);
    return st;
}

/* Whether function fn contains a state-writing op (directly or in a callee). */
static kiln_status function_writes(struct tf_model *c, int fn, int depth, const char **what)
{
    *what = NULL;
    if (c->fn_writes[fn] == 0 || c->fn_writes[fn] == 2) return KILN_OK; /* no, or on the path */
    if (depth > TF_MAX_CALL_DEPTH)
        return kiln_error(KILN_ERR_UNSUPPORTED, "function calls nest deeper than %d levels",
                          TF_MAX_CALL_DEPTH);
    if (c->fn_writes[fn] == 1) {
        *what = "";
        return KILN_OK;
    }
    c->fn_writes[fn] = 2;
    const KilnSm__FunctionDef *fd = c->fns[fn];
    for (size_t i = 0; i < fd->n_node_def && !*what; i++) {
        const KilnSm__NodeDef *nd = fd->node_def[i];
        if (tf_op_writes_state(nd->op ? nd->op : "")) {
            *what = "";
            break;
        }
        KilnSm__NameAttrList inst;
        int callee = tf_called_function(c, nd, NULL, &inst);
        if (callee >= 0) {
            kiln_status st = function_writes(c, callee, depth + 1, what);
            if (st != KILN_OK) {
                c->fn_writes[fn] = -1;
                return st;
            }
        }
    }
    c->fn_writes[fn] = *what ? 1 : 0;
    return KILN_OK;
}

static kiln_status check_control_dep(struct tf_build *b, struct scope *s,
                                     const KilnSm__NodeDef *user, int dep)
{
    const char *what;
    kiln_status st = scan_writes(b, s, dep, &what);
    if (st != KILN_OK) return st;
    if (!what) return KILN_OK;
    return kiln_error(KILN_ERR_UNSUPPORTED,
                      "%s: node '%s' depends on node '%s', which writes variable state (via "
                      "'%s'); Kiln models are immutable, so stateful signatures are not "
                      "supported",
                      s->where, user->name, s->nodes[dep]->name, what[0] ? what : s->nodes[dep]->name);
}

/* ---- variables ---- */

static kiln_status var_register(struct tf_model *c, int node, bool resource, int *out)
{
    const KilnSm__NodeDef *nd = c->nodes[node];
    int v = tf_map_get(&c->var_index, nd->name);
    if (v >= 0) {
        *out = v;
        return KILN_OK;
    }
    if (c->n_vars == c->cap_vars) {
        int cap = c->cap_vars ? c->cap_vars * 2 : 16;
        struct tf_var *p = realloc(c->vars, sizeof *p * (size_t)cap);
        if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        c->vars = p;
        c->cap_vars = cap;
    }
    struct tf_var *var = &c->vars[c->n_vars];
    memset(var, 0, sizeof *var);
    var->nd = nd;
    var->resource = resource;
    const KilnSm__AttrValue *dt = tf_attr(nd, NULL, "dtype");
    var->dtype = dt && dt->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype(dt->type)
                                                                          : KILN_DTYPE_UNDEFINED;
    var->written = !resource && tf_map_get(&c->written_vars, nd->name) >= 0;
    kiln_status st = tf_map_put(&c->var_index, nd->name, c->n_vars, NULL);
    if (st != KILN_OK) return st;
    *out = c->n_vars++;
    return KILN_OK;
}

/* The main-graph node index an input reference ("^name", "name:1") names, or -1. */
static int input_node(const struct tf_model *c, const char *in)
{
    if (in[0] == '^') in++;
    const char *colon = strchr(in, ':');
    return tf_map_getn(&c->node_index, in, colon ? (size_t)(colon - in) : strlen(in));
}

/* TF1 signatures that assign variables (the stateful counter model's
 * incr/reset signatures): every Assign / AssignAdd / AssignSub reachable
 * from a signature output whose target is a VariableV2 of the main graph
 * marks that variable written. Reads of such a variable become TfVariable
 * nodes and the writes TfAssign nodes, on one copy of the value the model
 * owns; every other variable stays a constant the optimizer can fold. */
kiln_status tf_mark_written_vars(struct tf_model *c, KilnSm__MetaGraphDef__SignatureDefEntry **sigs,
                                     size_t ns)
{
    size_t n = c->n_nodes;
    unsigned char *seen = calloc(n + 1, 1);
    int *stack = malloc((n + 1) * sizeof *stack);
    kiln_status st = KILN_OK;
    if (!seen || !stack) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    size_t top = 0;
    for (size_t i = 0; i < ns; i++) {
        const KilnSm__SignatureDef *sd = sigs[i]->value;
        for (size_t j = 0; j < sd->n_outputs; j++) {
            const KilnSm__TensorInfo *ti = sd->outputs[j]->value;
            if (!ti || ti->encoding_case != KILN_SM__TENSOR_INFO__ENCODING_NAME || !ti->name) continue;
            int k = input_node(c, ti->name);
            if (k >= 0 && !seen[k]) {
                seen[k] = 1;
                stack[top++] = k;
            }
        }
    }
    while (top > 0) {
        const KilnSm__NodeDef *nd = c->nodes[stack[--top]];
        const char *op = nd->op ? nd->op : "";
        if ((strcmp(op, "Assign") == 0 || strcmp(op, "AssignAdd") == 0 ||
             strcmp(op, "AssignSub") == 0) && nd->n_input >= 1) {
            int v = input_node(c, nd->input[0]);
            const char *vop = v >= 0 && c->nodes[v]->op ? c->nodes[v]->op : "";
            if (v >= 0 && (strcmp(vop, "VariableV2") == 0 || strcmp(vop, "Variable") == 0) &&
                tf_map_get(&c->written_vars, c->nodes[v]->name) < 0 &&
                (st = tf_map_put(&c->written_vars, c->nodes[v]->name, 1, NULL)) != KILN_OK)
                goto out;
        }
        for (size_t k = 0; k < nd->n_input; k++) {
            int j = input_node(c, nd->input[k]);
            if (j >= 0 && !seen[j]) {
                seen[j] = 1;
                stack[top++] = j;
            }
        }
    }
out:
    free(seen);
    free(stack);
    return st;
}

bool tf_var_written(const struct tf_build *b, int var)
{
    return var >= 0 && var < b->c->n_vars && b->c->vars[var].written;
}

bool tf_var_is_resource(const struct tf_build *b, int var)
{
    return var >= 0 && var < b->c->n_vars && b->c->vars[var].resource;
}

const char *tf_var_name(const struct tf_build *b, int var)
{
    return var >= 0 && var < b->c->n_vars ? b->c->vars[var].nd->name : "?";
}

kiln_status tf_var_value(struct tf_build *b, int var, int *value_out)
{
    struct tf_model *c = b->c;
    if (var < 0 || var >= c->n_vars)
        return kiln_error(KILN_ERR_INTERNAL, "bad variable index %d", var);
    if (var >= b->n_var_value) {
        int n = c->n_vars + 16;
        int *p = realloc(b->var_value, sizeof(int) * (size_t)n);
        if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        for (int i = b->n_var_value; i < n; i++) p[i] = -1;
        b->var_value = p;
        b->n_var_value = n;
    }
    if (b->var_value[var] >= 0) {
        *value_out = b->var_value[var];
        return KILN_OK;
    }
    kiln_status st;
    if (!c->vars[var].value) { /* read from the checkpoint by the reader, once */
        kiln_tensor *t = NULL;
        if ((st = c->restore(c->restore_ctx, c->vars[var].nd, c->vars[var].dtype, &t)) != KILN_OK)
            return st;
        c->vars[var].value = t;
    }
    int id = -1;
    if (c->vars[var].written) { /* read at run time: the value changes */
        const char *name = c->vars[var].nd->name;
        if (!c->vars[var].value->owns_data) { /* restored in place from the mapped checkpoint */
            kiln_tensor *copy;
            if ((st = kiln_tensor_clone(c->vars[var].value, &copy)) != KILN_OK) return st;
            if ((st = kiln_graph_own_tensor(c->m->graph, copy)) != KILN_OK) return st; /* frees */
            c->vars[var].value = copy;
        }
        struct kiln_node *n;
        if ((st = kiln_graph_node_add(b->g, KILN_OP_TfVariable, name, 0, 1, 1, &n)) != KILN_OK)
            return st;
        n->opset = TF_OPSET;
        n->op_type = "VariableV2";
        n->attr[0] = (struct kiln_attr){.name = "var", .type = KILN_ATTR_TENSOR,
                                        .t = c->vars[var].value};
        n->n_attr = 1;
        int node = b->g->n_nodes - 1;
        if ((st = kiln_graph_value_add(b->g, name, KILN_VALUE_NODE, &id)) != KILN_OK) return st;
        b->g->nodes[node].out[0] = id;
        b->g->values[id].producer = node;
        kiln_type_from_tensor(&b->g->values[id].type, c->vars[var].value);
        b->var_value[var] = id;
        *value_out = id;
        return KILN_OK;
    }
    if ((st = kiln_graph_value_add(b->g, c->vars[var].nd->name, KILN_VALUE_CONST, &id)) != KILN_OK)
        return st;
    b->g->values[id].konst = c->vars[var].value; /* borrowed: owned by m->graph */
    kiln_type_from_tensor(&b->g->values[id].type, c->vars[var].value);
    b->var_value[var] = id;
    *value_out = id;
    return KILN_OK;
}

/* ---- assets ---- */

/* If tensor ("node:idx") is bound to an asset file, a string constant with
 * the asset's path in the model folder (what TensorFlow's loader feeds). */
static kiln_status feed_asset(struct tf_build *b, const char *tensor, int *value)
{
    struct tf_model *c = b->c;
    *value = -1;
    for (size_t i = 0; i < c->mg->n_asset_file_def; i++) {
        const KilnSm__AssetFileDef *af = c->mg->asset_file_def[i];
        if (!af->tensor_info || af->tensor_info->encoding_case != KILN_SM__TENSOR_INFO__ENCODING_NAME ||
            !af->tensor_info->name)
            continue;
        size_t nl, tl = strcspn(tensor, ":");
        int idx = -1;
        if (!tf_split_ref(af->tensor_info->name, &nl, &idx)) continue;
        if (nl != tl || memcmp(af->tensor_info->name, tensor, nl) != 0 ||
            tensor[tl] != ':' || idx != atoi(tensor + tl + 1))
            continue;
        const char *key = tensor;
        const char *fname = af->filename ? af->filename : "";
        if (!fname[0] || strchr(fname, '/') || strcmp(fname, "..") == 0 || strcmp(fname, ".") == 0)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "asset '%s': the file name must be a plain name inside assets/",
                              fname);
        if (!c->dir)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "asset '%s' needs the model folder, but the model was not loaded "
                              "from a folder",
                              fname);
        kiln_tensor *t;
        kiln_status st = kiln_tensor_new(KILN_DTYPE_STRING, 0, NULL, &t);
        if (st != KILN_OK) return st;
        size_t n = strlen(c->dir) + strlen(fname) + 16;
        char *path = malloc(n);
        if (!path) {
            kiln_tensor_free(t);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
        snprintf(path, n, "%s/assets/%s", c->dir, fname);
        st = kiln_tensor_set_string(t, 0, path, strlen(path));
        free(path);
        if (st != KILN_OK) {
            kiln_tensor_free(t);
            return st;
        }
        if ((st = kiln_graph_own_tensor(b->g, t)) != KILN_OK) return st;
        int id = -1;
        if ((st = kiln_graph_value_add(b->g, key, KILN_VALUE_CONST, &id)) != KILN_OK) return st;
        b->g->values[id].konst = t;
        kiln_type_from_tensor(&b->g->values[id].type, t);
        char *k = kiln_arena_strdup(&b->tmp, key);
        if (!k) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        if ((st = tf_map_put(&b->feeds, k, id, NULL)) != KILN_OK) return st;
        *value = id;
        return KILN_OK;
    }
    return KILN_OK;
}

/* ---- conversion ---- */

struct task {
    struct scope *s;
    int node;
};

struct tstack {
    struct task *t;
    int n, cap;
};

static kiln_status tpush(struct tstack *ts, struct scope *s, int node)
{
    if (ts->n == ts->cap) {
        int cap = ts->cap ? ts->cap * 2 : 256;
        struct task *p = realloc(ts->t, sizeof *p * (size_t)cap);
        if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        ts->t = p;
        ts->cap = cap;
    }
    ts->t[ts->n++] = (struct task){s, node};
    s->ns[node].phase = NS_VISITING;
    return KILN_OK;
}

/* Make sure the producer of reference r is converted: returns *pending if
 * it was pushed. A producer already on the stack closes a cycle. */
static kiln_status need(struct tstack *ts, const struct ref *r, const KilnSm__NodeDef *user,
                        bool *pending)
{
    *pending = false;
    if (r->is_sym) return KILN_OK;
    struct nstate *ns = &r->s->ns[r->node];
    if (ns->phase == NS_DONE) return KILN_OK;
    if (ns->phase == NS_VISITING)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: the graph has a cycle through nodes '%s' and '%s' (loops are not "
                          "supported)",
                          r->s->where, user->name, r->s->nodes[r->node]->name);
    *pending = true;
    return tpush(ts, r->s, r->node);
}

static kiln_status set_outputs(struct tf_build *b, struct nstate *ns, int n)
{
    ns->n_out = n;
    ns->out = kiln_arena_alloc(&b->tmp, sizeof *ns->out * ((size_t)n + 1));
    if (!ns->out) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) ns->out[i] = (struct tf_sym){.v = -1, .var = -1};
    return KILN_OK;
}

/* Number of outputs of a call: the callee's output args (one tensor each). */
static kiln_status call_outputs(struct tf_build *b, struct scope *cs, struct nstate *ns,
                                struct tstack *ts, const KilnSm__NodeDef *call, bool *pending)
{
    const KilnSm__FunctionDef *fd = b->c->fns[cs->fn];
    const KilnSm__OpDef *sig = fd->signature;
    *pending = false;
    for (size_t a = 0; a < sig->n_output_arg; a++) {
        const KilnSm__OpDef__ArgDef *oa = sig->output_arg[a];
        if ((oa->number_attr && oa->number_attr[0]) || (oa->type_list_attr && oa->type_list_attr[0]))
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: function '%s' returns a list ('%s'); list outputs are not "
                              "supported",
                              cs->where, sig->name, oa->name ? oa->name : "");
        const char *ep = NULL;
        for (size_t k = 0; k < fd->n_ret; k++)
            if (fd->ret[k]->key && oa->name && strcmp(fd->ret[k]->key, oa->name) == 0)
                ep = fd->ret[k]->value;
        if (!ep)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "%s: function '%s' does not say what it returns for output '%s'",
                              cs->where, sig->name, oa->name ? oa->name : "");
        struct ref r;
        /* resolve as if read by a node of the callee */
        KilnSm__NodeDef fake = KILN_SM__NODE_DEF__INIT;
        fake.name = (char *)"\x01the function's return value";
        kiln_status st = resolve_ref(b, cs, &fake, ep, &r);
        if (st != KILN_OK) return st;
        if ((st = need(ts, &r, call, pending)) != KILN_OK || *pending) return st;
    }
    /* everything is converted: collect */
    kiln_status st = set_outputs(b, ns, (int)sig->n_output_arg);
    if (st != KILN_OK) return st;
    for (size_t a = 0; a < sig->n_output_arg; a++) {
        const char *ep = NULL;
        for (size_t k = 0; k < fd->n_ret; k++)
            if (fd->ret[k]->key && strcmp(fd->ret[k]->key, sig->output_arg[a]->name) == 0)
                ep = fd->ret[k]->value;
        struct ref r;
        KilnSm__NodeDef fake = KILN_SM__NODE_DEF__INIT;
        fake.name = (char *)"\x01the function's return value";
        if ((st = resolve_ref(b, cs, &fake, ep, &r)) != KILN_OK) return st;
        if ((st = ref_sym(b->c, &r, ep, &ns->out[a])) != KILN_OK) return st;
    }
    /* side effects the function declares as control outputs */
    for (size_t k = 0; k < fd->n_control_ret; k++) {
        const char *nm = fd->control_ret[k]->value ? fd->control_ret[k]->value : "";
        int j = tf_map_get(cs->index, nm);
        if (j < 0) continue;
        if ((st = check_control_dep(b, cs, call, j)) != KILN_OK) return st;
    }
    return KILN_OK;
}

/* Convert node i of scope s (the top of the stack) if its inputs are ready. */
static kiln_status convert_step(struct tf_build *b, struct tstack *ts)
{
    struct tf_model *c = b->c;
    struct task t = ts->t[ts->n - 1];
    struct scope *s = t.s;
    struct nstate *ns = &s->ns[t.node];
    if (ns->phase == NS_DONE) {
        ts->n--;
        return KILN_OK;
    }
    const KilnSm__NodeDef *nd = s->nodes[t.node];
    const char *op = nd->op ? nd->op : "";
    const char *name = nd->name ? nd->name : "";
    kiln_status st;
    bool pending;
    /* data inputs first */
    if (nd->n_input > (size_t)INT32_MAX / 2)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: node '%s' has too many inputs", s->where,
                          name);
    for (size_t k = 0; k < nd->n_input; k++) {
        if (nd->input[k][0] == '^') continue;
        struct ref r;
        if ((st = resolve_ref(b, s, nd, nd->input[k], &r)) != KILN_OK) return st;
        if ((st = need(ts, &r, nd, &pending)) != KILN_OK || pending) return st;
    }
    if (ns->child) {
        /* a call whose callee scope exists: wait for its return values */
        if ((st = call_outputs(b, ns->child, ns, ts, nd, &pending)) != KILN_OK || pending)
            return st;
        ns->phase = NS_DONE;
        ts->n--;
        return KILN_OK;
    }
    /* control inputs: checked, then dropped */
    for (size_t k = 0; k < nd->n_input; k++) {
        if (nd->input[k][0] != '^') continue;
        struct ref r;
        if ((st = resolve_ref(b, s, nd, nd->input[k], &r)) != KILN_OK) return st;
        if ((st = check_control_dep(b, s, nd, r.node)) != KILN_OK) return st;
    }
    int n_in = 0;
    for (size_t k = 0; k < nd->n_input; k++) n_in += nd->input[k][0] != '^';
    struct tf_sym *in = kiln_arena_alloc(&b->tmp, sizeof *in * ((size_t)n_in + 1));
    if (!in) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    n_in = 0;
    for (size_t k = 0; k < nd->n_input; k++) {
        if (nd->input[k][0] == '^') continue;
        struct ref r;
        if ((st = resolve_ref(b, s, nd, nd->input[k], &r)) != KILN_OK) return st;
        if ((st = ref_sym(c, &r, nd->input[k], &in[n_in++])) != KILN_OK) return st;
    }
    if (++b->lowered > TF_MAX_LOWERED_NODES)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "%s: more than %d nodes after inlining function calls", s->where,
                          TF_MAX_LOWERED_NODES);
    /* function calls */
    KilnSm__NameAttrList inst;
    int fn = tf_called_function(c, nd, s->inst, &inst);
    if (fn == -2 || (fn < 0 && is_call_op(op))) {
        const KilnSm__AttrValue *f = tf_attr(nd, s->inst, "f");
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: node '%s' (op %s) calls function '%s', which is not in the "
                          "graph's function library",
                          s->where, name, op,
                          f && f->value_case == KILN_SM__ATTR_VALUE__VALUE_FUNC && f->func->name
                              ? f->func->name
                              : "");
    }
    if (fn >= 0) {
        if ((st = scope_call(b, s, t.node, fn, &inst, in, n_in, &ns->child)) != KILN_OK)
            return st;
        return KILN_OK; /* next step waits for the return values */
    }
    /* variables and placeholders of the main graph */
    bool var_v1 = strcmp(op, "VariableV2") == 0 || strcmp(op, "Variable") == 0;
    bool var_res = strcmp(op, "VarHandleOp") == 0;
    if (var_v1 || var_res) {
        if (s->caller)
            return kiln_error(KILN_ERR_UNSUPPORTED,
                              "%s: node '%s' creates variable inside a function; only variables "
                              "of the main graph are supported",
                              s->where, name);
        int var = -1;
        if ((st = var_register(c, t.node, var_res, &var)) != KILN_OK) return st;
        /* the value is restored when something reads it */
        if ((st = set_outputs(b, ns, 1)) != KILN_OK) return st;
        ns->out[0].var = var;
        ns->phase = NS_DONE;
        ts->n--;
        return KILN_OK;
    }
    if (strcmp(op, "Placeholder") == 0 && !s->caller)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "signature '%s' needs placeholder '%s', which is not one of its inputs",
                          b->sig, name);
    struct tf_node_ctx L = {
        .b = b, .scope = s, .node_index = t.node, .g = b->g, .nd = nd, .inst = s->inst,
        .where = s->where, .n_in = n_in, .in = in,
    };
    L.name = s->prefix[0] ? tmp_printf(b, "%s%s", s->prefix, name) : name;
    if (!L.name) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if ((st = tf_lower_node(&L)) != KILN_OK) return st;
    ns->n_out = L.n_out;
    ns->out = L.out;
    ns->phase = NS_DONE;
    ts->n--;
    return KILN_OK;
}

const KilnSm__FunctionDef *tf_function_def(const struct tf_build *b, const char *name)
{
    int fn = name ? tf_map_get(&b->c->fn_index, name) : -1;
    return fn >= 0 ? b->c->fns[fn] : NULL;
}

/* Inline function f into graph g for node L (a loop body or condition, a
 * branch): the same conversion as a call, run to completion here. While g
 * is a subgraph, variables read inside it get their own constants there. */
kiln_status tf_function_lower(struct tf_node_ctx *L, const KilnSm__NameAttrList *f,
                              const char *role, struct kiln_graph *g, const struct tf_sym *args,
                              int n_args, int n_outs, struct tf_sym *outs)
{
    struct tf_build *b = L->b;
    struct scope *s = L->scope;
    const KilnSm__NodeDef *nd = L->nd;
    int fn = f && f->name ? tf_map_get(&b->c->fn_index, f->name) : -1;
    if (fn < 0)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: node '%s' (op %s): its %s function '%s' is not in the graph's "
                          "function library",
                          L->where, nd->name, nd->op, role, f && f->name ? f->name : "");
    const KilnSm__OpDef *sig = b->c->fns[fn]->signature;
    if ((int)sig->n_output_arg != n_outs)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: node '%s' (op %s): its %s function '%s' returns %zu value%s, "
                          "where %d %s expected",
                          L->where, nd->name, nd->op, role, f->name, sig->n_output_arg,
                          sig->n_output_arg == 1 ? "" : "s", n_outs, n_outs == 1 ? "is" : "are");
    struct kiln_graph *saved_g = b->g;
    int *saved_vv = b->var_value, saved_nvv = b->n_var_value;
    if (g != b->g) {
        b->g = g;
        b->var_value = NULL;
        b->n_var_value = 0;
    }
    struct scope *cs = NULL;
    struct tstack ts = {0};
    struct nstate ns = {0};
    bool pending = true;
    kiln_status st = scope_call(b, s, L->node_index, fn, f, args, n_args, &cs);
    if (st == KILN_OK) {
        cs->prefix = tmp_printf(b, "%s%s/%s/", s->prefix, nd->name, role);
        if (!cs->prefix) st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    while (st == KILN_OK) {
        st = call_outputs(b, cs, &ns, &ts, nd, &pending);
        if (st != KILN_OK || !pending) break;
        while (st == KILN_OK && ts.n > 0) st = convert_step(b, &ts);
    }
    free(ts.t);
    if (st == KILN_OK)
        for (int k = 0; k < n_outs; k++) outs[k] = ns.out[k];
    if (g != saved_g) {
        free(b->var_value);
        b->g = saved_g;
        b->var_value = saved_vv;
        b->n_var_value = saved_nvv;
    }
    if (st != KILN_OK && !strstr(kiln_last_error(), nd->name ? nd->name : ""))
        kiln_error_wrap(st, "%s function of node '%s'", role, nd->name);
    return st;
}

/* The value tensor endpoint `ep` of the main graph has for this signature. */
static kiln_status convert_endpoint(struct tf_build *b, struct scope *root, const char *ep,
                                    const char *alias, struct tf_sym *out)
{
    KilnSm__NodeDef fake = KILN_SM__NODE_DEF__INIT;
    char *fname = tmp_printf(b, "\x01output '%s'", alias);
    if (!fname) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    fake.name = fname;
    struct ref r;
    kiln_status st = resolve_ref(b, root, &fake, ep, &r);
    if (st != KILN_OK) return st;
    struct tstack ts = {0};
    bool pending;
    st = need(&ts, &r, &fake, &pending);
    while (st == KILN_OK && ts.n > 0) st = convert_step(b, &ts);
    free(ts.t);
    if (st != KILN_OK) return st;
    return ref_sym(b->c, &r, ep, out);
}

/* ---- signatures ---- */

static kiln_status sig_input(struct tf_build *b, const char *alias, const KilnSm__TensorInfo *ti,
                             int *value)
{
    struct tf_model *c = b->c;
    if (ti->encoding_case != KILN_SM__TENSOR_INFO__ENCODING_NAME || !ti->name)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "signature '%s': input '%s' is a sparse or composite tensor, which "
                          "Kiln does not support",
                          b->sig, alias);
    size_t nl;
    int idx = -1;
    if (!tf_split_ref(ti->name, &nl, &idx))
        return kiln_error(KILN_ERR_INVALID_MODEL, "signature '%s': input '%s' names tensor '%s'",
                          b->sig, alias, ti->name);
    int node = tf_map_getn(&c->node_index, ti->name, nl);
    if (node < 0)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "signature '%s': input '%s' is tensor '%s', but the graph has no node "
                          "'%.*s'",
                          b->sig, alias, ti->name, (int)nl, ti->name);
    const KilnSm__NodeDef *nd = c->nodes[node];
    struct kiln_type t;
    kiln_type_unknown(&t);
    /* a placeholder's own dtype wins: old exporters wrote wrong TensorInfo
     * dtypes (half_plus_three's regress signature says float for a string) */
    int code = ti->has_dtype ? ti->dtype : 0;
    const char *op = nd->op ? nd->op : "";
    if (!code || strcmp(op, "Placeholder") == 0 || strcmp(op, "PlaceholderWithDefault") == 0) {
        const KilnSm__AttrValue *a = tf_attr(nd, NULL, "dtype");
        if (!a) a = tf_attr(nd, NULL, "T");
        if (a && a->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE && a->type) code = a->type;
    }
    t.dtype = tf_dtype(code);
    if (t.dtype == KILN_DTYPE_UNDEFINED)
        return kiln_error(code ? KILN_ERR_UNSUPPORTED : KILN_ERR_INVALID_MODEL,
                          "signature '%s': input '%s' has dtype %s, which Kiln does not support",
                          b->sig, alias, code ? tf_dtype_name(code) : "(none)");
    char what[256];
    snprintf(what, sizeof what, "signature '%s' input '%s'", b->sig, alias);
    kiln_status st;
    if (ti->tensor_shape && !ti->tensor_shape->unknown_rank) {
        if ((st = tf_shape_from_proto(ti->tensor_shape, what, &t)) != KILN_OK) return st;
    } else {
        const KilnSm__AttrValue *a = tf_attr(nd, NULL, "shape");
        if (a && a->value_case == KILN_SM__ATTR_VALUE__VALUE_SHAPE &&
            (st = tf_shape_from_proto(a->shape, what, &t)) != KILN_OK)
            return st;
    }
    int id = -1;
    if ((st = kiln_graph_value_add(b->g, alias, KILN_VALUE_INPUT, &id)) != KILN_OK) return st;
    b->g->values[id].type = t;
    char *key = tmp_printf(b, "%.*s:%d", (int)nl, ti->name, idx);
    if (!key) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if ((st = tf_map_put(&b->feeds, key, id, NULL)) != KILN_OK) return st;
    *value = id;
    return KILN_OK;
}

/* Build signature sd into graph g. */
kiln_status tf_lower_signature(struct tf_model *c, const char *name,
                                   const KilnSm__SignatureDef *sd, struct kiln_graph *g,
                                   struct kiln_signature *sig)
{
    struct kiln_arena *mem = c->m->graph->mem;
    struct tf_build b = {.c = c, .sig = name, .g = g};
    kiln_status st;
    struct scope *root = NULL;
    g->name = kiln_arena_strdup(g->mem, name);
    sig->name = kiln_arena_strdup(mem, name);
    sig->method = kiln_arena_strdup(mem, sd->method_name ? sd->method_name : "");
    sig->graph = g;
    if (!g->name || !sig->name || !sig->method) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (sd->n_inputs > 4096 || sd->n_outputs > 4096)
        return kiln_error(KILN_ERR_UNSUPPORTED, "signature '%s' has too many inputs or outputs",
                          name);
    g->inputs = kiln_arena_alloc(g->mem, sizeof(int) * (sd->n_inputs + 1));
    g->outputs = kiln_arena_alloc(g->mem, sizeof(int) * (sd->n_outputs + 1));
    if (!g->inputs || !g->outputs) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < sd->n_inputs; i++) {
        const KilnSm__SignatureDef__TensorInfoEntry *e = sd->inputs[i];
        /* errors after the first input go through out: (the feeds map holds its names) */
        if (!e->key || !e->value) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "signature '%s': input %zu has no name or "
                            "tensor", name, i);
            goto out;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(sd->inputs[j]->key, e->key) == 0) {
                st = kiln_error(KILN_ERR_INVALID_MODEL,
                                "signature '%s': input '%s' is listed twice", name, e->key);
                goto out;
            }
        int id = -1;
        if ((st = sig_input(&b, e->key, e->value, &id)) != KILN_OK) goto out;
        g->inputs[g->n_inputs++] = id;
    }
    if ((st = scope_main(&b, &root)) != KILN_OK) goto out;
    for (size_t i = 0; i < sd->n_outputs; i++) {
        const KilnSm__SignatureDef__TensorInfoEntry *e = sd->outputs[i];
        if (!e->key || !e->value) {
            st = kiln_error(KILN_ERR_INVALID_MODEL, "signature '%s': output %zu has no name or "
                            "tensor", name, i);
            goto out;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(sd->outputs[j]->key, e->key) == 0) {
                st = kiln_error(KILN_ERR_INVALID_MODEL,
                                "signature '%s': output '%s' is listed twice", name, e->key);
                goto out;
            }
        if (e->value->encoding_case != KILN_SM__TENSOR_INFO__ENCODING_NAME || !e->value->name) {
            st = kiln_error(KILN_ERR_UNSUPPORTED,
                            "signature '%s': output '%s' is a sparse or composite tensor, which "
                            "Kiln does not support",
                            name, e->key);
            goto out;
        }
        struct tf_sym sym;
        if ((st = convert_endpoint(&b, root, e->value->name, e->key, &sym)) != KILN_OK) goto out;
        if (sym.rnd) {
            st = kiln_error(KILN_ERR_UNSUPPORTED,
                            "signature '%s': output '%s' is random (from RandomUniform node "
                            "'%s'); Kiln does not evaluate random ops",
                            name, e->key, sym.rnd_node);
            goto out;
        }
        if (sym.v < 0 && sym.var >= 0 && !c->vars[sym.var].resource &&
            (st = tf_var_value(&b, sym.var, &sym.v)) != KILN_OK)
            goto out;
        if (sym.v < 0) {
            st = kiln_error(KILN_ERR_UNSUPPORTED,
                            "signature '%s': output '%s' ('%s') is a resource handle, not a "
                            "tensor",
                            name, e->key, e->value->name);
            goto out;
        }
        g->outputs[g->n_outputs++] = sym.v;
    }
    if ((st = kiln_graph_verify(g)) != KILN_OK) goto out;
    if ((st = kiln_graph_infer(g)) != KILN_OK) goto out;
    sig->n_inputs = g->n_inputs;
    sig->input_values = g->inputs;
    sig->n_outputs = g->n_outputs;
    sig->output_values = g->outputs;
    if ((st = kiln_signature_describe(c->m, sig)) != KILN_OK) goto out;
    /* outputs are named by their aliases; declared types fill what inference left open */
    for (int i = 0; i < sig->n_outputs; i++) {
        const KilnSm__TensorInfo *ti = sd->outputs[i]->value;
        kiln_value_info *vi = &sig->outputs[i];
        vi->name = kiln_arena_strdup(mem, sd->outputs[i]->key);
        if (!vi->name) {
            st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
            goto out;
        }
        if (vi->dtype == KILN_DTYPE_UNDEFINED && ti->has_dtype) vi->dtype = tf_dtype(ti->dtype);
        if (vi->rank < 0 && ti->tensor_shape && !ti->tensor_shape->unknown_rank) {
            struct kiln_type t;
            kiln_type_unknown(&t);
            if (tf_shape_from_proto(ti->tensor_shape, "output", &t) == KILN_OK) {
                vi->rank = t.rank;
                for (int k = 0; k < t.rank; k++) vi->dims[k] = t.dims[k];
            } else {
                kiln_error_clear();
            }
        }
    }
out:
    if (st != KILN_OK && !strstr(kiln_last_error(), "signature '"))
        kiln_error_wrap(st, "signature '%s'", name);
    tf_map_free(&b.feeds);
    free(b.var_value);
    kiln_arena_free(&b.tmp);
    return st;
}

/* ---- function library ---- */

kiln_status tf_index_function(struct tf_model *c, int fn)
{
    struct tf_map *mp = &c->fn_node_index[fn];
    if (mp->cap) return KILN_OK;
    const KilnSm__FunctionDef *fd = c->fns[fn];
    for (size_t i = 0; i < fd->n_node_def; i++) {
        const KilnSm__NodeDef *nd = fd->node_def[i];
        if (!nd->name || !nd->name[0])
            return kiln_error(KILN_ERR_INVALID_MODEL, "function '%s': node %zu has no name",
                              fd->signature->name, i);
        bool dup;
        kiln_status st = tf_map_put(mp, nd->name, (int)i, &dup);
        if (st != KILN_OK) return st;
        if (dup)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "function '%s': two nodes are named '%s'", fd->signature->name,
                              nd->name);
    }
    if (!mp->cap) {
        /* an empty body: give the map a table so it counts as built */
        bool dup;
        kiln_status st = tf_map_put(mp, "", -1, &dup);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

kiln_status tf_model_index(struct tf_model *c, const KilnSm__GraphDef *gd)
{
    c->nodes = gd->node;
    c->n_nodes = gd->n_node;
    if (gd->n_node > (size_t)INT32_MAX / 4)
        return kiln_error(KILN_ERR_INVALID_MODEL, "graph has too many nodes");
    for (size_t i = 0; i < gd->n_node; i++) {
        const KilnSm__NodeDef *nd = gd->node[i];
        if (!nd->name || !nd->name[0])
            return kiln_error(KILN_ERR_INVALID_MODEL, "graph node %zu has no name", i);
        if (!nd->op || !nd->op[0])
            return kiln_error(KILN_ERR_INVALID_MODEL, "graph node '%s' has no op", nd->name);
        bool dup;
        kiln_status st = tf_map_put(&c->node_index, nd->name, (int)i, &dup);
        if (st != KILN_OK) return st;
        if (dup)
            return kiln_error(KILN_ERR_INVALID_MODEL, "two graph nodes are named '%s'", nd->name);
        for (size_t k = 0; k < nd->n_input; k++)
            if (!nd->input[k])
                return kiln_error(KILN_ERR_INVALID_MODEL, "node '%s': input %zu is missing",
                                  nd->name, k);
    }
    const KilnSm__FunctionDefLibrary *lib = gd->library;
    c->n_fns = lib ? lib->n_function : 0;
    c->fns = lib ? lib->function : NULL;
    if (c->n_fns > (size_t)INT32_MAX / 4)
        return kiln_error(KILN_ERR_INVALID_MODEL, "too many functions");
    c->fn_node_index = calloc(c->n_fns + 1, sizeof *c->fn_node_index);
    c->fn_writes = malloc(c->n_fns + 1);
    if (!c->fn_node_index || !c->fn_writes)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    memset(c->fn_writes, -1, c->n_fns + 1);
    for (size_t i = 0; i < c->n_fns; i++) {
        const KilnSm__FunctionDef *fd = c->fns[i];
        if (!fd->signature || !fd->signature->name || !fd->signature->name[0])
            return kiln_error(KILN_ERR_INVALID_MODEL, "function %zu of the library has no name", i);
        bool dup;
        kiln_status st = tf_map_put(&c->fn_index, fd->signature->name, (int)i, &dup);
        if (st != KILN_OK) return st;
        if (dup)
            return kiln_error(KILN_ERR_INVALID_MODEL, "the library defines function '%s' twice",
                              fd->signature->name);
        for (size_t k = 0; k < fd->n_node_def; k++) {
            const KilnSm__NodeDef *nd = fd->node_def[k];
            if (!nd->op || !nd->op[0])
                return kiln_error(KILN_ERR_INVALID_MODEL, "function '%s': node '%s' has no op",
                                  fd->signature->name, nd->name ? nd->name : "");
            for (size_t j = 0; j < nd->n_input; j++)
                if (!nd->input[j])
                    return kiln_error(KILN_ERR_INVALID_MODEL,
                                      "function '%s': node '%s': input %zu is missing",
                                      fd->signature->name, nd->name ? nd->name : "", j);
        }
        for (size_t k = 0; k < fd->signature->n_input_arg; k++)
            if (!fd->signature->input_arg[k]->name)
                return kiln_error(KILN_ERR_INVALID_MODEL, "function '%s': argument %zu has no name",
                                  fd->signature->name, k);
        for (size_t k = 0; k < fd->signature->n_output_arg; k++)
            if (!fd->signature->output_arg[k]->name)
                return kiln_error(KILN_ERR_INVALID_MODEL, "function '%s': output %zu has no name",
                                  fd->signature->name, k);
        for (size_t k = 0; k < fd->n_ret; k++)
            if (!fd->ret[k]->key || !fd->ret[k]->value)
                return kiln_error(KILN_ERR_INVALID_MODEL, "function '%s': return %zu is "
                                  "incomplete", fd->signature->name, k);
    }
    return KILN_OK;
}
void tf_model_free(struct tf_model *c)
{
    tf_map_free(&c->node_index);
    tf_map_free(&c->fn_index);
    if (c->fn_node_index)
        for (size_t i = 0; i < c->n_fns; i++) tf_map_free(&c->fn_node_index[i]);
    free(c->fn_node_index);
    free(c->fn_writes);
    free(c->vars);
    tf_map_free(&c->var_index);
    tf_map_free(&c->written_vars);
}
