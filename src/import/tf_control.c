/*
 * tf_control.c - TensorFlow 2 control flow and TensorLists to Kiln IR.
 *
 * While / StatelessWhile become Kiln's Loop (the ONNX Loop, run by the
 * control-flow executor in src/exec/control.c), If / StatelessIf become If,
 * and Case becomes a chain of Ifs. Their cond, body and branch functions
 * are inlined by tf_graph.c (tf_function_lower) into subgraphs of the
 * graph being built, so everything the rest of the importer lowers works
 * inside loops and branches too, nested to any depth the call-depth bound
 * allows.
 *
 * While(vars; cond, body) runs `while cond(vars): vars = body(vars)`:
 *   - the condition is evaluated once on the initial values in the
 *     enclosing graph, and again on each iteration's new values inside the
 *     Loop body, whose first output is the Loop's condition;
 *   - a loop variable the body returns unchanged (directly or through
 *     Identity nodes; Keras passes its weights and resource handles that
 *     way) is not carried: the body reads it from the enclosing graph
 *     (a constant is shared, anything else captured), and the While's
 *     output is its input;
 *   - the others are the Loop's loop-carried values. Their types inside the
 *     body are the initial values' types with the dims the While's
 *     output_shapes leaves open made unknown;
 *   - the Loop has no trip count: TF's maximum_iterations is an ordinary
 *     loop variable the cond function compares with, and the executor's
 *     iteration bound keeps a loop that never ends from hanging a run.
 *   parallel_iterations and _lower_using_switch_merge are ignored.
 *
 * If(cond, args; then_branch, else_branch) becomes If with two subgraphs
 * that capture the arguments. Case(index, args; branches) becomes a
 * balanced tree of If(index < mid, ...), log2(branches) deep, after an
 * index out of range is replaced by the last one (TF runs the last branch).
 *
 * A TensorList (DT_VARIANT) is a dense tensor [n, ...element] (see
 * src/kernels/ref/tf_list.c for the one kernel this needs):
 *   TensorListFromTensor(t)        t
 *   TensorListReserve(shape, n)    zeros [n, ...shape], unknown dims 0 (the
 *                                  first SetItem then fixes the shape)
 *   TensorListGetItem(l, i)        Gather(l, i, axis 0)
 *   EmptyTensorList(shape)         a Reserve of 0 elements
 *   TensorListSetItem(l, i, x)     TfListSetItem(l, i, x) (resize as TF's
 *                                  resize_if_index_out_of_bounds says)
 *   TensorListPushBack(l, x)       TfListSetItem(l, length(l), x), resizing
 *   TensorListGather(l, idx)       Gather(l, idx, axis 0)
 *   TensorListStack(l)             l
 *   TensorListLength(l)            Shape(l)[0] as int32
 *   TensorListElementShape(l)      Shape(l)[1:] as shape_type
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "import/tf_import.h"
#include "kernels/kernel.h"

#define TF_MAX_LOOP_VARS 4096     /* loop variables of one While */
#define TF_MAX_CASE_BRANCHES 256  /* branches of one Case */
#define TF_PASS_CHAIN_MAX 64      /* Identity nodes followed to see a variable pass through */
#define TF_DT_VARIANT 21

typedef struct tf_node_ctx L_t;

static const KilnSm__AttrValue *attr(L_t *L, const char *key) { return tf_attr(L->nd, L->inst, key); }

static const KilnSm__NameAttrList *func_attr(L_t *L, const char *key)
{
    const KilnSm__AttrValue *v = attr(L, key);
    return v && v->value_case == KILN_SM__ATTR_VALUE__VALUE_FUNC ? v->func : NULL;
}

static kiln_status oom(void) { return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory"); }

static void *alloc(L_t *L, size_t n) { return kiln_arena_alloc(L->g->mem, n ? n : 1); }

static kiln_status set_outputs(L_t *L, int n)
{
    L->n_out = n;
    L->out = alloc(L, sizeof *L->out * ((size_t)n + 1));
    if (!L->out) return oom();
    for (int i = 0; i < n; i++) L->out[i] = (struct tf_sym){.v = -1, .var = -1};
    return KILN_OK;
}

static kiln_status out1(L_t *L, int v)
{
    kiln_status st = set_outputs(L, 1);
    if (st == KILN_OK) L->out[0].v = v;
    return st;
}

/* The same node context, emitting into graph g. */
static L_t in_graph(const L_t *L, struct kiln_graph *g)
{
    L_t s = *L;
    s.g = g;
    return s;
}

/* ---- small IR helpers ---- */

static kiln_status gather0(L_t *L, int x, int idx, int *out)
{
    struct kiln_attr a = {.name = "axis", .type = KILN_ATTR_INT, .i = 0};
    int in[2] = {x, idx};
    return tf_emit(L, KILN_OP_Gather, 2, in, 1, &a, 1, out);
}

/* Shape(x)[start:end] (end < 0: to the end) as int64 [k]. */
static kiln_status shape_part(L_t *L, int x, int64_t start, int64_t end, int *out)
{
    struct kiln_attr a[2] = {{.name = "start", .type = KILN_ATTR_INT, .i = start},
                             {.name = "end", .type = KILN_ATTR_INT, .i = end}};
    return tf_emit(L, KILN_OP_Shape, 1, &x, 1, a, end < 0 ? 1 : 2, out);
}

/* A value of sub's parent graph made visible in sub: a constant is shared
 * (so the lowering inside can fold with it), anything else captured. */
static kiln_status capture(struct kiln_graph *sub, int v, int *out)
{
    const struct kiln_graph *p = sub->parent;
    const struct kiln_value *pv = &p->values[v];
    bool konst = pv->kind == KILN_VALUE_CONST;
    int id = -1;
    kiln_status st = kiln_graph_value_add(sub, pv->name, konst ? KILN_VALUE_CONST : KILN_VALUE_OUTER, &id);
    if (st != KILN_OK) return st;
    pv = &p->values[v];
    if (konst) sub->values[id].konst = pv->konst; /* borrowed: the parent owns it */
    else sub->values[id].outer = v;
    sub->values[id].type = pv->type;
    *out = id;
    return KILN_OK;
}

static kiln_status capture_sym(struct kiln_graph *sub, const struct tf_sym *in, struct tf_sym *out)
{
    *out = *in;
    return in->v >= 0 ? capture(sub, in->v, &out->v) : KILN_OK;
}

static kiln_status check_not_random(L_t *L)
{
    for (int k = 0; k < L->n_in; k++)
        if (L->in[k].rnd)
            return tf_node_err(L, KILN_ERR_UNSUPPORTED,
                               "input %d is random (from RandomUniform node '%s'); Kiln does not "
                               "evaluate random ops",
                               k, L->in[k].rnd_node);
    return KILN_OK;
}

/* The subgraphs made while lowering one node. Their arrays live outside the
 * arena until a node's graph attribute holds them; those that end up held by
 * no node (an error, or a loop replaced by a fused op) are freed at the end. */
struct tf_subs {
    struct kiln_graph **g;
    int n, cap;
};

static kiln_status track(L_t *L, struct kiln_graph *sub)
{
    struct tf_subs *t = L->subs;
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 8;
        struct kiln_graph **p = realloc(t->g, sizeof *p * (size_t)cap);
        if (!p) {
            kiln_graph_free_sub(sub);
            return oom();
        }
        t->g = p;
        t->cap = cap;
    }
    t->g[t->n++] = sub;
    return KILN_OK;
}

/* Whether a node of sub's parent holds sub as a graph attribute. */
static bool held(const struct kiln_graph *sub)
{
    const struct kiln_graph *p = sub->parent;
    for (int i = p->n_nodes - 1; i >= 0; i--)
        for (int k = 0; k < p->nodes[i].n_attr; k++)
            if (p->nodes[i].attr[k].type == KILN_ATTR_GRAPH && p->nodes[i].attr[k].g == sub)
                return true;
    return false;
}

static void release_subs(struct tf_subs *t)
{
    bool *keep = calloc((size_t)t->n + 1, sizeof *keep);
    for (int i = 0; i < t->n; i++) keep[i] = keep ? held(t->g[i]) : false;
    /* a held subgraph inside an abandoned one goes with it */
    for (int i = 0; i < t->n && keep; i++)
        if (!keep[i]) kiln_graph_free_sub(t->g[i]);
    free(keep);
    free(t->g);
}

/* A new subgraph of L->g with room for n_in inputs and n_out outputs. */
static kiln_status new_sub(L_t *L, const char *role, int n_in, int n_out, struct kiln_graph **out)
{
    struct kiln_graph *sub;
    kiln_status st = kiln_graph_new_sub(L->g, &sub);
    if (st == KILN_OK) st = track(L, sub);
    if (st != KILN_OK) return st;
    size_t nl = strlen(L->name) + strlen(role) + 2;
    char *name = kiln_arena_alloc(L->g->mem, nl);
    sub->inputs = kiln_arena_alloc(L->g->mem, sizeof(int) * ((size_t)n_in + 1));
    sub->outputs = kiln_arena_alloc(L->g->mem, sizeof(int) * ((size_t)n_out + 1));
    if (!name || !sub->inputs || !sub->outputs) return oom();
    snprintf(name, nl, "%s/%s", L->name, role);
    sub->name = name;
    *out = sub;
    return KILN_OK;
}

/* The tensor value of a function's return value (not a handle). */
static kiln_status ret_value(L_t *L, const struct tf_sym *s, const char *what, int k, int *v)
{
    if (s->v < 0 || s->rnd)
        return tf_node_err(L, KILN_ERR_UNSUPPORTED,
                           "%s value %d is %s, which Kiln cannot pass out of a loop or branch", what,
                           k, s->rnd ? "random" : "a resource handle");
    *v = s->v;
    return KILN_OK;
}

/* ---- While / StatelessWhile ---- */

/* Whether body function fd returns its argument k unchanged as output k
 * (directly or through Identity-like nodes). */
static bool passes_through(const KilnSm__FunctionDef *fd, int k)
{
    const KilnSm__OpDef *sig = fd->signature;
    const char *arg = sig->input_arg[k]->name, *oname = sig->output_arg[k]->name;
    const char *ep = NULL;
    if (!arg || !oname) return false;
    for (size_t r = 0; r < fd->n_ret; r++)
        if (fd->ret[r]->key && strcmp(fd->ret[r]->key, oname) == 0) ep = fd->ret[r]->value;
    for (int step = 0; ep && step < TF_PASS_CHAIN_MAX; step++) {
        const char *c1 = strchr(ep, ':');
        size_t n0 = c1 ? (size_t)(c1 - ep) : strlen(ep);
        if (strlen(arg) == n0 && memcmp(ep, arg, n0) == 0) return !c1 || strcmp(c1, ":0") == 0;
        if (!c1 || strcmp(c1, ":output:0") != 0) return false;
        const KilnSm__NodeDef *nd = NULL;
        for (size_t i = 0; i < fd->n_node_def && !nd; i++)
            if (fd->node_def[i]->name && strlen(fd->node_def[i]->name) == n0 &&
                memcmp(fd->node_def[i]->name, ep, n0) == 0)
                nd = fd->node_def[i];
        if (!nd || !nd->op || nd->n_input < 1 || nd->input[0][0] == '^') return false;
        if (strcmp(nd->op, "Identity") != 0 && strcmp(nd->op, "Snapshot") != 0 &&
            strcmp(nd->op, "StopGradient") != 0)
            return false;
        ep = nd->input[0];
    }
    return false;
}

/* The type loop variable k has inside the body: its initial type, with the
 * dims output_shapes leaves unknown (or, for a TensorList, whatever
 * SetItem may change) made unknown. */
static void body_type(L_t *L, int k, struct kiln_type *t)
{
    *t = L->g->values[L->in[k].v].type;
    for (int i = 0; i < KILN_MAX_RANK; i++) t->sym[i] = NULL;
    const KilnSm__AttrValue *T = attr(L, "T");
    bool variant = T && T->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST &&
                   (size_t)k < T->list->n_type && T->list->type[k] == TF_DT_VARIANT;
    if (variant) {
        bool lazy = false;
        for (int i = 1; i < t->rank; i++) lazy |= t->dims[i] == 0;
        if (lazy) t->rank = -1;
        for (int i = 0; i < t->rank; i++) t->dims[i] = -1; /* lists may grow */
        return;
    }
    const KilnSm__AttrValue *os = attr(L, "output_shapes");
    const KilnSm__TensorShapeProto *sp =
        os && os->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST && (size_t)k < os->list->n_shape
            ? os->list->shape[k]
            : NULL;
    if (!sp) {
        for (int i = 0; i < t->rank; i++) t->dims[i] = -1;
        return;
    }
    if (sp->unknown_rank || (t->rank >= 0 && (size_t)t->rank != sp->n_dim) ||
        sp->n_dim > KILN_MAX_RANK) {
        t->rank = -1;
        return;
    }
    t->rank = (int)sp->n_dim;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = sp->dim[i]->size;
        t->dims[i] = d >= 0 && d == t->dims[i] ? d : -1;
    }
}

static kiln_status lower_while(L_t *L)
{
    int n = L->n_in;
    kiln_status st = check_not_random(L);
    if (st != KILN_OK) return st;
    const KilnSm__NameAttrList *cond = func_attr(L, "cond"), *body = func_attr(L, "body");
    if (!cond || !body)
        return tf_node_err(L, KILN_ERR_INVALID_MODEL, "needs function attributes cond and body");
    if (n < 1 || n > TF_MAX_LOOP_VARS)
        return tf_node_err(L, KILN_ERR_INVALID_MODEL, "has %d loop variables", n);
    const KilnSm__FunctionDef *bd = tf_function_def(L->b, body->name);
    if (!bd)
        return tf_node_err(L, KILN_ERR_INVALID_MODEL,
                           "its body function '%s' is not in the graph's function library",
                           body->name ? body->name : "");
    if (bd->signature->n_input_arg != (size_t)n || bd->signature->n_output_arg != (size_t)n)
        return tf_node_err(L, KILN_ERR_INVALID_MODEL,
                           "its body function '%s' takes %zu arguments and returns %zu values; "
                           "the loop has %d loop variables",
                           body->name, bd->signature->n_input_arg, bd->signature->n_output_arg, n);
    bool *inv = alloc(L, sizeof(bool) * (size_t)n);
    struct tf_sym *args = alloc(L, sizeof *args * (size_t)n);
    struct tf_sym *bo = alloc(L, sizeof *bo * (size_t)n);
    struct tf_sym *next = alloc(L, sizeof *next * (size_t)n);
    int *loop_in = alloc(L, sizeof(int) * ((size_t)n + 2));
    int *loop_out = alloc(L, sizeof(int) * ((size_t)n + 1));
    if (!inv || !args || !bo || !next || !loop_in || !loop_out) return oom();
    int n_carried = 0;
    for (int k = 0; k < n; k++) {
        inv[k] = passes_through(bd, k);
        if (inv[k]) continue;
        if (L->in[k].v < 0)
            return tf_node_err(L, KILN_ERR_UNSUPPORTED,
                               "loop variable %d is a resource handle that the body replaces", k);
        n_carried++;
    }
    /* the condition on the initial values, in this graph */
    struct tf_sym c0;
    if ((st = tf_function_lower(L, cond, "cond", L->g, L->in, n, 1, &c0)) != KILN_OK) return st;
    int c0v = -1;
    if ((st = ret_value(L, &c0, "the cond function's", 0, &c0v)) != KILN_OK) return st;
    if (n_carried == 0) {
        /* nothing changes: the loop runs zero times, or (in TF) forever */
        if ((st = set_outputs(L, n)) != KILN_OK) return st;
        for (int k = 0; k < n; k++) L->out[k] = L->in[k];
        return KILN_OK;
    }
    /* the body: (iteration, condition, carried...) -> (condition, carried...) */
    struct kiln_graph *sub;
    if ((st = new_sub(L, "body", n_carried + 2, n_carried + 1, &sub)) != KILN_OK) return st;
    int id;
    if ((st = kiln_graph_value_add(sub, "iteration", KILN_VALUE_INPUT, &id)) != KILN_OK) return st;
    kiln_type_set(&sub->values[id].type, KILN_DTYPE_I64, 0, NULL);
    sub->inputs[sub->n_inputs++] = id;
    if ((st = kiln_graph_value_add(sub, "condition", KILN_VALUE_INPUT, &id)) != KILN_OK) return st;
    kiln_type_set(&sub->values[id].type, KILN_DTYPE_BOOL, 0, NULL);
    sub->inputs[sub->n_inputs++] = id;
    int j = 0;
    for (int k = 0; k < n; k++) {
        if (inv[k]) {
            if ((st = capture_sym(sub, &L->in[k], &args[k])) != KILN_OK) return st;
            continue;
        }
        const char *bname = bd->signature->input_arg[k]->name;
        if ((st = kiln_graph_value_add(sub, bname ? bname : "var", KILN_VALUE_INPUT, &id)) != KILN_OK)
            return st;
        body_type(L, k, &sub->values[id].type);
        sub->inputs[sub->n_inputs++] = id;
        args[k] = (struct tf_sym){.v = id, .var = -1};
        loop_in[2 + j++] = L->in[k].v;
    }
    if ((st = tf_function_lower(L, body, "body", sub, args, n, n, bo)) != KILN_OK) return st;
    for (int k = 0; k < n; k++) {
        next[k] = inv[k] ? args[k] : bo[k];
        if (!inv[k] && (st = ret_value(L, &bo[k], "the body function's", k, &id)) != KILN_OK)
            return st;
    }
    struct tf_sym c1;
    if ((st = tf_function_lower(L, cond, "cond", sub, next, n, 1, &c1)) != KILN_OK) return st;
    if ((st = ret_value(L, &c1, "the cond function's", 0, &id)) != KILN_OK) return st;
    sub->outputs[sub->n_outputs++] = id;
    for (int k = 0; k < n; k++)
        if (!inv[k]) sub->outputs[sub->n_outputs++] = bo[k].v;
    if ((st = set_outputs(L, n)) != KILN_OK) return st;
    int *carried_var = alloc(L, sizeof(int) * (size_t)n_carried);
    if (!carried_var) return oom();
    j = 0;
    for (int k = 0; k < n; k++) {
        if (inv[k]) L->out[k] = L->in[k];
        else carried_var[j++] = k;
    }
    /* a Keras LSTM or GRU loop becomes one LSTM or GRU op */
    bool fused = false;
    if ((st = tf_keras_rnn_fuse(L, sub, carried_var, n_carried, &fused)) != KILN_OK || fused)
        return st;
    /* the Loop: no trip count, the initial condition, the carried values */
    loop_in[0] = -1;
    loop_in[1] = c0v;
    struct kiln_attr ga = {.name = "body", .type = KILN_ATTR_GRAPH, .g = sub};
    if ((st = tf_emit(L, KILN_OP_Loop, n_carried + 2, loop_in, n_carried, &ga, 1, loop_out)) != KILN_OK)
        return st;
    j = 0;
    for (int k = 0; k < n; k++) {
        if (inv[k]) continue;
        int v = loop_out[j];
        L->g->values[v].type = sub->values[sub->inputs[2 + j]].type;
        L->out[k].v = v;
        j++;
    }
    return KILN_OK;
}

/* ---- If / StatelessIf / Case ---- */

/* Lower branch function f into a new subgraph of L->g that captures args
 * (values of L->g) and returns n_outs values. */
static kiln_status branch_graph(L_t *L, const KilnSm__NameAttrList *f, const char *role,
                                const struct tf_sym *args, int n_args, int n_outs,
                                struct kiln_graph **out)
{
    struct kiln_graph *sub;
    kiln_status st = new_sub(L, role, 0, n_outs, &sub);
    if (st != KILN_OK) return st;
    struct tf_sym *a = alloc(L, sizeof *a * ((size_t)n_args + 1));
    struct tf_sym *o = alloc(L, sizeof *o * ((size_t)n_outs + 1));
    if (!a || !o) return oom();
    for (int k = 0; k < n_args; k++)
        if ((st = capture_sym(sub, &args[k], &a[k])) != KILN_OK) return st;
    if ((st = tf_function_lower(L, f, role, sub, a, n_args, n_outs, o)) != KILN_OK) return st;
    for (int k = 0; k < n_outs; k++) {
        int v = -1;
        if ((st = ret_value(L, &o[k], role, k, &v)) != KILN_OK) return st;
        sub->outputs[sub->n_outputs++] = v;
    }
    *out = sub;
    return KILN_OK;
}

/* Number of outputs of an If or Case: the length of Tout, else what the
 * first branch function returns. */
static kiln_status branch_outputs(L_t *L, const KilnSm__NameAttrList *f, int *n)
{
    const KilnSm__AttrValue *t = attr(L, "Tout");
    if (t && t->value_case == KILN_SM__ATTR_VALUE__VALUE_LIST) {
        *n = (int)t->list->n_type;
    } else {
        const KilnSm__FunctionDef *fd = tf_function_def(L->b, f ? f->name : NULL);
        if (!fd)
            return tf_node_err(L, KILN_ERR_INVALID_MODEL,
                               "its branch function '%s' is not in the graph's function library",
                               f && f->name ? f->name : "");
        *n = (int)fd->signature->n_output_arg;
    }
    if (*n > TF_MAX_LOOP_VARS) return tf_node_err(L, KILN_ERR_UNSUPPORTED, "has %d outputs", *n);
    return KILN_OK;
}

/* Emit If(pred; then, else) into L->g with n_outs outputs. */
static kiln_status emit_if(L_t *L, int pred, struct kiln_graph *tg, struct kiln_graph *eg,
                           int n_outs, int *outs)
{
    struct kiln_attr a[2] = {{.name = "then_branch", .type = KILN_ATTR_GRAPH, .g = tg},
                             {.name = "else_branch", .type = KILN_ATTR_GRAPH, .g = eg}};
    return tf_emit(L, KILN_OP_If, 1, &pred, n_outs, a, 2, outs);
}

static kiln_status finish_branches(L_t *L, int n_outs, const int *outs)
{
    kiln_status st = set_outputs(L, n_outs);
    if (st != KILN_OK) return st;
    for (int k = 0; k < n_outs; k++) L->out[k].v = outs[k];
    return KILN_OK;
}

static kiln_status lower_if(L_t *L)
{
    kiln_status st = check_not_random(L);
    if (st != KILN_OK) return st;
    const KilnSm__NameAttrList *tf = func_attr(L, "then_branch"), *ef = func_attr(L, "else_branch");
    if (!tf || !ef)
        return tf_node_err(L, KILN_ERR_INVALID_MODEL,
                           "needs function attributes then_branch and else_branch");
    int pred = -1, n_outs = 0;
    if ((st = tf_in_value(L, 0, &pred)) != KILN_OK) return st;
    if ((st = branch_outputs(L, tf, &n_outs)) != KILN_OK) return st;
    if (n_outs == 0) return set_outputs(L, 0); /* nothing to compute: Kiln runs pure graphs */
    struct kiln_graph *tg, *eg;
    if ((st = branch_graph(L, tf, "then", L->in + 1, L->n_in - 1, n_outs, &tg)) != KILN_OK) return st;
    if ((st = branch_graph(L, ef, "else", L->in + 1, L->n_in - 1, n_outs, &eg)) != KILN_OK) return st;
    int *outs = alloc(L, sizeof(int) * (size_t)n_outs);
    if (!outs) return oom();
    if ((st = emit_if(L, pred, tg, eg, n_outs, outs)) != KILN_OK) return st;
    return finish_branches(L, n_outs, outs);
}

/* A scalar constant of dtype dt holding v, in L->g. */
static kiln_status const_like(L_t *L, kiln_dtype dt, int64_t v, int *id)
{
    kiln_tensor *t;
    kiln_status st = kiln_tensor_scalar_i64(dt, v, &t);
    return st == KILN_OK ? tf_const(L, t, id) : st;
}

/* Branches lo..hi-1 of a Case emitted into L->g (index, already in range,
 * and args are values of L->g): a leaf inlines its branch function, an
 * inner node is If(index < mid, lo..mid-1, mid..hi-1), so that the nesting
 * depth is log2 of the number of branches. */
static kiln_status case_range(L_t *L, int index, const struct tf_sym *args, int n_args,
                              KilnSm__NameAttrList *const *br, int lo, int hi, int n_outs,
                              int *outs)
{
    kiln_status st;
    char role[48];
    if (hi - lo == 1) {
        struct tf_sym *o = alloc(L, sizeof *o * (size_t)n_outs);
        if (!o) return oom();
        snprintf(role, sizeof role, "branch%d", lo);
        if ((st = tf_function_lower(L, br[lo], role, L->g, args, n_args, n_outs, o)) != KILN_OK)
            return st;
        for (int i = 0; i < n_outs; i++)
            if ((st = ret_value(L, &o[i], role, i, &outs[i])) != KILN_OK) return st;
        return KILN_OK;
    }
    int mid = lo + (hi - lo) / 2, kv, pred;
    if ((st = const_like(L, L->g->values[index].type.dtype, mid, &kv)) != KILN_OK) return st;
    int lt_in[2] = {index, kv};
    if ((st = tf_emit1(L, KILN_OP_Less, 2, lt_in, &pred)) != KILN_OK) return st;
    struct kiln_graph *side[2];
    for (int h = 0; h < 2; h++) {
        int a0 = h ? mid : lo, a1 = h ? hi : mid;
        snprintf(role, sizeof role, "branches%d-%d", a0, a1 - 1);
        if ((st = new_sub(L, role, 0, n_outs, &side[h])) != KILN_OK) return st;
        L_t E = in_graph(L, side[h]);
        struct tf_sym *a = alloc(L, sizeof *a * ((size_t)n_args + 1));
        int *so = alloc(L, sizeof(int) * (size_t)n_outs);
        int sindex;
        if (!a || !so) return oom();
        for (int i = 0; i < n_args; i++)
            if ((st = capture_sym(side[h], &args[i], &a[i])) != KILN_OK) return st;
        if ((st = capture(side[h], index, &sindex)) != KILN_OK) return st;
        if ((st = case_range(&E, sindex, a, n_args, br, a0, a1, n_outs, so)) != KILN_OK) return st;
        for (int i = 0; i < n_outs; i++) side[h]->outputs[side[h]->n_outputs++] = so[i];
    }
    return emit_if(L, pred, side[0], side[1], n_outs, outs);
}

static kiln_status lower_case(L_t *L)
{
    kiln_status st = check_not_random(L);
    if (st != KILN_OK) return st;
    const KilnSm__AttrValue *b = attr(L, "branches");
    if (!b || b->value_case != KILN_SM__ATTR_VALUE__VALUE_LIST || b->list->n_func < 1)
        return tf_node_err(L, KILN_ERR_INVALID_MODEL, "needs a non-empty function list 'branches'");
    if (b->list->n_func > TF_MAX_CASE_BRANCHES)
        return tf_node_err(L, KILN_ERR_UNSUPPORTED, "has %zu branches, more than %d",
                           b->list->n_func, TF_MAX_CASE_BRANCHES);
    int index = -1, n_outs = 0;
    if ((st = tf_in_value(L, 0, &index)) != KILN_OK) return st;
    if (!kiln_dtype_is_int(L->g->values[index].type.dtype))
        return tf_node_err(L, KILN_ERR_INVALID_MODEL, "branch_index must be an integer, got %s",
                           kiln_dtype_name(L->g->values[index].type.dtype));
    if ((st = branch_outputs(L, b->list->func[0], &n_outs)) != KILN_OK) return st;
    if (n_outs == 0) return set_outputs(L, 0);
    int *outs = alloc(L, sizeof(int) * (size_t)n_outs);
    if (!outs) return oom();
    /* an index out of range runs the last branch: index = (index < 0 || index >= n) ? n-1 : index */
    int n_br = (int)b->list->n_func;
    if (n_br > 1) {
        kiln_dtype dt = L->g->values[index].type.dtype;
        int zero, nv, last, neg, big, out_of_range, fixed;
        if ((st = const_like(L, dt, 0, &zero)) != KILN_OK) return st;
        if ((st = const_like(L, dt, n_br, &nv)) != KILN_OK) return st;
        if ((st = const_like(L, dt, n_br - 1, &last)) != KILN_OK) return st;
        int in_neg[2] = {index, zero}, in_big[2] = {index, nv};
        if ((st = tf_emit1(L, KILN_OP_Less, 2, in_neg, &neg)) != KILN_OK) return st;
        if ((st = tf_emit1(L, KILN_OP_GreaterOrEqual, 2, in_big, &big)) != KILN_OK) return st;
        int in_or[2] = {neg, big};
        if ((st = tf_emit1(L, KILN_OP_Or, 2, in_or, &out_of_range)) != KILN_OK) return st;
        int in_w[3] = {out_of_range, last, index};
        if ((st = tf_emit1(L, KILN_OP_Where, 3, in_w, &fixed)) != KILN_OK) return st;
        index = fixed;
    }
    st = case_range(L, index, L->in + 1, L->n_in - 1, b->list->func, 0, n_br, n_outs, outs);
    if (st != KILN_OK) return st;
    return finish_branches(L, n_outs, outs);
}

/* ---- TensorLists ---- */

/* A constant element_shape input: rank (-1 unknown) and dims (-1 unknown). */
static void element_shape(L_t *L, int k, int *rank, int64_t *dims)
{
    *rank = -1;
    if (k >= L->n_in || L->in[k].v < 0) return;
    const struct kiln_value *v = &L->g->values[L->in[k].v];
    const kiln_tensor *t = v->kind == KILN_VALUE_CONST ? v->konst : NULL;
    if (!t || !kiln_dtype_is_int(t->dtype) || t->rank > 1) return;
    int64_t c = kiln_tensor_count(t);
    if (t->rank == 0 || c > KILN_MAX_RANK - 1) return; /* scalar -1: unknown rank */
    *rank = (int)c;
    for (int64_t i = 0; i < c; i++) {
        int64_t d = kiln_tensor_i64(t, i);
        dims[i] = d >= 0 ? d : -1;
    }
}

/* A list value whose static type says nothing gets [n, ...element_shape]. */
static void hint_list_type(L_t *L, int v, int elem_input, bool list_axis)
{
    struct kiln_type *t = &L->g->values[v].type;
    int r;
    int64_t d[KILN_MAX_RANK];
    if (t->rank >= 0) return;
    element_shape(L, elem_input, &r, d);
    if (r < 0) return;
    int off = list_axis ? 1 : 0;
    t->rank = r + off;
    if (list_axis) t->dims[0] = -1;
    for (int i = 0; i < r; i++) {
        t->dims[i + off] = d[i];
        t->sym[i + off] = NULL;
    }
}

static kiln_status lower_list_reserve(L_t *L)
{
    const KilnSm__AttrValue *ed = attr(L, "element_dtype");
    kiln_dtype dt = ed && ed->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype(ed->type)
                                                                          : KILN_DTYPE_UNDEFINED;
    if (dt == KILN_DTYPE_UNDEFINED || dt == KILN_DTYPE_STRING)
        return tf_node_err(L, KILN_ERR_UNSUPPORTED,
                           "lists of element_dtype %s are not supported",
                           ed && ed->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE
                               ? tf_dtype_name(ed->type)
                               : "(none)");
    int rank;
    int64_t dims[KILN_MAX_RANK];
    element_shape(L, 0, &rank, dims);
    if (rank < 0) { /* unknown rank: no elements until the first SetItem */
        rank = 1;
        dims[0] = 0;
    }
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0) dims[i] = 0;
    int num, shape_tail, num64, num1, shape, out;
    kiln_status st;
    if (strcmp(L->nd->op, "EmptyTensorList") == 0) { /* no elements; SetItem and PushBack grow it */
        int64_t zero = 0;
        st = tf_const_i64(L, 0, 1, &zero, &num);
    } else {
        st = tf_in_value(L, 1, &num);
    }
    if (st != KILN_OK) return st;
    int64_t one = 1;
    if ((st = tf_cast_to(L, num, KILN_DTYPE_I64, &num64)) != KILN_OK) return st;
    int r_in[2];
    if ((st = tf_const_i64(L, 1, 1, &one, &r_in[1])) != KILN_OK) return st;
    r_in[0] = num64;
    {
        struct kiln_attr a = {.name = "allowzero", .type = KILN_ATTR_INT, .i = 0};
        if ((st = tf_emit(L, KILN_OP_Reshape, 2, r_in, 1, &a, 1, &num1)) != KILN_OK) return st;
    }
    if ((st = tf_const_i64(L, 1, rank, dims, &shape_tail)) != KILN_OK) return st;
    int c_in[2] = {num1, shape_tail};
    struct kiln_attr ca = {.name = "axis", .type = KILN_ATTR_INT, .i = 0};
    if ((st = tf_emit(L, KILN_OP_Concat, 2, c_in, 1, &ca, 1, &shape)) != KILN_OK) return st;
    int64_t d1 = 1;
    kiln_tensor *zero;
    if ((st = kiln_tensor_new(dt, 1, &d1, &zero)) != KILN_OK) return st;
    if ((st = kiln_graph_own_tensor(L->g, zero)) != KILN_OK) return st;
    struct kiln_attr va = {.name = "value", .type = KILN_ATTR_TENSOR, .t = zero};
    if ((st = tf_emit(L, KILN_OP_ConstantOfShape, 1, &shape, 1, &va, 1, &out)) != KILN_OK) return st;
    return out1(L, out);
}

/* The length of a list (its first dim) as an int64 scalar. */
static kiln_status list_length(L_t *L, int list, int *out)
{
    int s = 0, none_v = 0;
    int64_t none = 0;
    kiln_status st = shape_part(L, list, 0, 1, &s);
    if (st == KILN_OK) st = tf_const_i64(L, 1, 0, &none, &none_v);
    int r_in[2] = {s, none_v};
    if (st == KILN_OK) st = tf_emit1(L, KILN_OP_Reshape, 2, r_in, out);
    return st;
}

static kiln_status lower_list_op(L_t *L, const char *op)
{
    int list, v;
    kiln_status st = tf_in_value(L, 0, &list);
    if (st != KILN_OK) return st;
    if (strcmp(op, "TensorListFromTensor") == 0) {
        if (L->g->values[list].type.rank == 0)
            return tf_node_err(L, KILN_ERR_INVALID_MODEL, "the tensor is a scalar");
        return out1(L, list);
    }
    if (strcmp(op, "TensorListStack") == 0) {
        hint_list_type(L, list, 1, true);
        return out1(L, list);
    }
    if (strcmp(op, "TensorListGetItem") == 0 || strcmp(op, "TensorListGather") == 0) {
        int idx;
        if ((st = tf_in_value(L, 1, &idx)) != KILN_OK) return st;
        if ((st = gather0(L, list, idx, &v)) != KILN_OK) return st;
        hint_list_type(L, v, 2, strcmp(op, "TensorListGather") == 0);
        return out1(L, v);
    }
    if (strcmp(op, "TensorListSetItem") == 0 || strcmp(op, "TensorListPushBack") == 0) {
        bool push = op[10] == 'P';
        const KilnSm__AttrValue *rz = attr(L, "resize_if_index_out_of_bounds");
        int in[3];
        in[0] = list;
        if (push) st = list_length(L, list, &in[1]);
        else st = tf_in_value(L, 1, &in[1]);
        if (st == KILN_OK) st = tf_in_value(L, push ? 1 : 2, &in[2]);
        if (st != KILN_OK) return st;
        struct kiln_attr a = {.name = "resize", .type = KILN_ATTR_INT,
                              .i = push || (rz && rz->value_case == KILN_SM__ATTR_VALUE__VALUE_B &&
                                            rz->b)};
        if ((st = tf_emit(L, KILN_OP_TfListSetItem, 3, in, 1, &a, 1, &v)) != KILN_OK) return st;
        return out1(L, v);
    }
    if (strcmp(op, "TensorListLength") == 0) {
        int len;
        if ((st = list_length(L, list, &len)) != KILN_OK) return st;
        if ((st = tf_cast_to(L, len, KILN_DTYPE_I32, &v)) != KILN_OK) return st;
        return out1(L, v);
    }
    /* TensorListElementShape */
    const KilnSm__AttrValue *stt = attr(L, "shape_type");
    kiln_dtype dt = stt && stt->value_case == KILN_SM__ATTR_VALUE__VALUE_TYPE ? tf_dtype(stt->type)
                                                                            : KILN_DTYPE_I32;
    if (!kiln_dtype_is_int(dt))
        return tf_node_err(L, KILN_ERR_INVALID_MODEL, "shape_type must be an integer type");
    int s;
    if ((st = shape_part(L, list, 1, -1, &s)) != KILN_OK) return st;
    if ((st = tf_cast_to(L, s, dt, &v)) != KILN_OK) return st;
    return out1(L, v);
}

/* ---- dispatch ---- */

static const char *const LIST_OPS[] = {
    "TensorListFromTensor", "TensorListStack",  "TensorListGetItem",     "TensorListGather",
    "TensorListSetItem",    "TensorListLength", "TensorListElementShape", "TensorListPushBack",
};

bool tf_control_handles(const char *op)
{
    if (strcmp(op, "While") == 0 || strcmp(op, "StatelessWhile") == 0 || strcmp(op, "If") == 0 ||
        strcmp(op, "StatelessIf") == 0 || strcmp(op, "Case") == 0 ||
        strcmp(op, "StatelessCase") == 0 || strcmp(op, "TensorListReserve") == 0 ||
        strcmp(op, "EmptyTensorList") == 0)
        return true;
    for (size_t i = 0; i < sizeof LIST_OPS / sizeof *LIST_OPS; i++)
        if (strcmp(op, LIST_OPS[i]) == 0) return true;
    return false;
}

kiln_status tf_control_lower(struct tf_node_ctx *L)
{
    const char *op = L->nd->op ? L->nd->op : "";
    struct tf_subs subs = {0};
    kiln_status st;
    L->subs = &subs;
    if (strcmp(op, "While") == 0 || strcmp(op, "StatelessWhile") == 0) st = lower_while(L);
    else if (strcmp(op, "If") == 0 || strcmp(op, "StatelessIf") == 0) st = lower_if(L);
    else if (strcmp(op, "Case") == 0 || strcmp(op, "StatelessCase") == 0) st = lower_case(L);
    else if (strcmp(op, "TensorListReserve") == 0 || strcmp(op, "EmptyTensorList") == 0)
        st = lower_list_reserve(L);
    else st = lower_list_op(L, op);
    release_subs(&subs);
    L->subs = NULL;
    return st;
}
