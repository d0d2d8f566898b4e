/*
 * tf_import.h - the TensorFlow importer's internal interface (src/import/).
 *
 * One way only: savedmodel.c reads a SavedModel (protobuf, tags, the
 * checkpoint through tensor_bundle.c, assets) and hands the chosen graph to
 * the lowering as a struct tf_model; the lowering (tf_graph.c: the graph
 * walk, function inlining, signatures; tf_lower*.c, tf_control.c,
 * tf_v1_control.c, tf_keras_rnn.c: the ops) never includes savedmodel.h or
 * calls savedmodel.c. Variable values reach it through the model's restore
 * function, set by the reader.
 *
 * The walk goes from each signature's outputs back to its inputs. Every TF
 * node it reaches is handed to tf_lower_node with its data inputs already
 * converted; the lowering appends IR nodes to the signature's graph and
 * reports the node's outputs as tf_syms.
 */
#ifndef KILN_IMPORT_TF_IMPORT_H
#define KILN_IMPORT_TF_IMPORT_H

#include <stdbool.h>

#include "import/model.h"
#include "saved_model.pb-c.h"
#include "kiln/kiln_util.h"

#define TF_OPSET 21 /* the ONNX semantics Kiln's kernels apply to the IR nodes we create */
#define TF_MAX_CALL_DEPTH 32 /* nested function calls being inlined (or traced) */

/* ---- what the reader hands the lowering ---- */

/* A string -> int map (keys are not copied). */
struct tf_map {
    const char **keys;
    size_t *lens;
    int *vals;
    size_t cap, n;
};
/* Value of key k (k[0..n)), or -1. */
int tf_map_get(const struct tf_map *mp, const char *k);
int tf_map_getn(const struct tf_map *mp, const char *k, size_t n);
/* Insert; *dup (may be NULL) is set, and nothing changes, if the key is present. */
kiln_status tf_map_put(struct tf_map *mp, const char *k, int v, bool *dup);
void tf_map_free(struct tf_map *mp);

/* A variable node of the main graph, as the lowering meets it. */
struct tf_var {
    const KilnSm__NodeDef *nd;   /* VariableV2 / Variable / VarHandleOp in the main graph */
    bool resource;               /* VarHandleOp */
    kiln_dtype dtype;
    kiln_tensor *value;          /* restored value, owned by m->graph; NULL until needed */
    bool written;                /* a signature assigns it: reads and writes are nodes */
};

/* Reads variable node var's value (dtype: its declared dtype, or
 * KILN_DTYPE_UNDEFINED) from the checkpoint into a tensor owned by the
 * model's main graph. Set by the reader; called once per variable used. */
typedef kiln_status (*tf_restore_fn)(void *ctx, const KilnSm__NodeDef *var, kiln_dtype dtype,
                                     kiln_tensor **value);

/* The graph to lower. The reader fills m, mg, dir, restore and
 * restore_ctx, then calls tf_model_index; the rest belongs to tf_graph.c
 * (freed by tf_model_free). */
struct tf_model {
    struct kiln_model *m;
    const KilnSm__MetaGraphDef *mg;    /* the chosen MetaGraphDef (assets) */
    const char *dir;                   /* model folder (assets), or NULL */
    tf_restore_fn restore;
    void *restore_ctx;
    size_t n_nodes;                    /* main graph */
    KilnSm__NodeDef **nodes;
    struct tf_map node_index;          /* main graph node name -> index */
    size_t n_fns;
    KilnSm__FunctionDef **fns;
    struct tf_map fn_index;            /* function name -> index */
    struct tf_map *fn_node_index;      /* per function: node name -> index (built on use) */
    signed char *fn_writes;            /* per function: writes state? -1 unknown, 2 visiting */
    struct tf_var *vars;
    int n_vars, cap_vars;
    struct tf_map var_index;           /* variable node name -> index */
    struct tf_map written_vars;        /* TF1 variable node names a signature assigns */
};

/* Index graph gd (the main graph, after tf_v1_functionalize) and its
 * function library; checks names, ops and inputs are present and unique. */
kiln_status tf_model_index(struct tf_model *c, const KilnSm__GraphDef *gd);
/* Index the nodes of library function fn (once). */
kiln_status tf_index_function(struct tf_model *c, int fn);
/* Mark the TF1 variables the signatures sigs[0..ns) assign. */
kiln_status tf_mark_written_vars(struct tf_model *c,
                                 KilnSm__MetaGraphDef__SignatureDefEntry **sigs, size_t ns);
/* Build signature `name` (sd) into graph g and describe it in sig. */
kiln_status tf_lower_signature(struct tf_model *c, const char *name,
                               const KilnSm__SignatureDef *sd, struct kiln_graph *g,
                               struct kiln_signature *sig);
void tf_model_free(struct tf_model *c);

/* Helpers on graph references the reader's restore trace shares. */
/* Split "name:idx" of the main graph. Returns false if idx is malformed. */
bool tf_split_ref(const char *ref, size_t *name_len, int *idx);
/* A decimal output index of 1 to 9 digits. */
bool tf_parse_index(const char *s, size_t n, int *out);
/* The library function node nd calls (op PartitionedCall /
 * StatefulPartitionedCall, or the function's name), or -1 (-2: a call op
 * without a function); inst receives its instantiation attrs. */
int tf_called_function(struct tf_model *c, const KilnSm__NodeDef *nd,
                       const KilnSm__NameAttrList *scope_inst, KilnSm__NameAttrList *inst);
/* A TensorShapeProto as a kiln_type shape (rank -1 when unknown). */
kiln_status tf_shape_from_proto(const KilnSm__TensorShapeProto *sp, const char *what,
                                struct kiln_type *t);

/* What a TF tensor endpoint is in the graph being built. */
struct tf_sym {
    int v;   /* IR value id in the signature graph; -1 for a bare resource handle */
    int var; /* variable index when the endpoint is a variable (ref or handle), else -1 */
    /* A RandomUniform result (and scalar arithmetic on it) is not computed:
     * it is known only as "uniform values in [lo, hi) of shape rnd_shape".
     * Ops whose result is the same for every value drawn (dropout's
     * floor(keep_prob + U) with keep_prob 1) turn it into a constant; any
     * other use is an error naming rnd_node. */
    bool rnd;
    int rnd_shape;          /* IR value: the int64 shape */
    double lo, hi;
    bool lo_open, hi_open;  /* interval ends */
    const char *rnd_node;   /* the RandomUniform node, for messages */
};

struct tf_build; /* per-signature build state, owned by tf_graph.c */
struct scope;    /* the function body (or main graph) a node belongs to, owned by tf_graph.c */
struct tf_subs;  /* subgraphs being made for a control-flow node (tf_control.c) */

/* One TF node being lowered. */
struct tf_node_ctx {
    struct tf_build *b;
    struct scope *scope;             /* where the node is (for calls into functions) */
    int node_index;                  /* its index in the scope's node list */
    struct kiln_graph *g;            /* the graph being built: the signature's, or a loop
                                        body or branch (tf_control.c) */
    const KilnSm__NodeDef *nd;       /* the node (attrs, op) */
    const KilnSm__NameAttrList *inst; /* attrs of the enclosing function instantiation, or NULL */
    const char *name;                /* unique name: function call path + node name */
    const char *where;               /* "signature 'x'" or "signature 'x', function 'f'" */
    int n_in;
    const struct tf_sym *in;         /* data inputs (control inputs are not passed) */
    int n_out;
    struct tf_sym *out;              /* set by tf_outputs() */
    struct tf_subs *subs;            /* tf_control.c: the subgraphs it is making */
};

/* Lower one node. Returns KILN_ERR_UNSUPPORTED naming the op, node and
 * signature for an op Kiln cannot run. */
kiln_status tf_lower_node(struct tf_node_ctx *L);

/* The flat output index of "node:arg:idx" inside a function body, from the
 * op's output arguments. */
kiln_status tf_output_index(const KilnSm__NodeDef *nd, const KilnSm__NameAttrList *inst,
                            const char *arg, int idx, int *flat);

/* Whether op writes variable or other state (Assign, AssignVariableOp, ...). */
bool tf_op_writes_state(const char *op);

/* Attribute of a node; placeholders resolved through inst. NULL if absent. */
const KilnSm__AttrValue *tf_attr(const KilnSm__NodeDef *nd, const KilnSm__NameAttrList *inst,
                                 const char *key);

/* TF DataType code (DT_*_REF folded to the base type) to Kiln dtype;
 * KILN_DTYPE_UNDEFINED if Kiln has no such dtype. */
kiln_dtype tf_dtype(int code);
const char *tf_dtype_name(int code);

/* kiln_tf_tensor_from_proto (a TensorProto to a new owned tensor; `what` names
 * it in messages) is declared in include/kiln/kiln_util.h: the server's gRPC
 * and warmup readers use it too. */

/* Provided by tf_lower.c for the op-family files (tf_control.c): */

/* Emit one IR node into L->g named L->name, with n_attrs attributes copied
 * from attrs (their data must live in the graph's arena), folded when its
 * inputs are constants, else typed by its shape function. outs (may be
 * NULL) receives the n_out output value ids. */
kiln_status tf_emit(struct tf_node_ctx *L, enum kiln_op op, int n_in, const int *in, int n_out,
                    const struct kiln_attr *attrs, int n_attrs, int *outs);
/* emit with one output and no attributes. */
static inline kiln_status tf_emit1(struct tf_node_ctx *L, enum kiln_op op, int n_in, const int *in,
                                   int *out)
{
    return tf_emit(L, op, n_in, in, 1, NULL, 0, out);
}
/* A 1-D (rank 1) or scalar (rank 0) int64 constant of n values. */
kiln_status tf_const_i64(struct tf_node_ctx *L, int rank, int n, const int64_t *vals, int *id);
/* x cast to dt (x itself when it already is dt). */
kiln_status tf_cast_to(struct tf_node_ctx *L, int x, kiln_dtype dt, int *out);
/* A new constant owned by L->g (t is taken over, also on error). */
kiln_status tf_const(struct tf_node_ctx *L, kiln_tensor *t, int *id);
/* The IR value of data input k (a TF1 variable reads its value); an error
 * naming the node for a resource handle or a random value. */
kiln_status tf_in_value(struct tf_node_ctx *L, int k, int *v);
/* An error "<where>: node '<name>' (op <op>): <message>". */
kiln_status tf_node_err(const struct tf_node_ctx *L, kiln_status st, const char *fmt, ...)
    KILN_PRINTF(3, 4);

/* Provided by tf_control.c: whether op is a control-flow or TensorList op
 * it lowers, and the lowering. */
bool tf_control_handles(const char *op);
kiln_status tf_control_lower(struct tf_node_ctx *L);

/* Provided by tf_v1_control.c: rewrite a main graph with TF1 control flow
 * (Switch/Merge conditionals, Enter/Exit while-loop frames) into one with
 * If and While nodes whose functions are added to the library (*gd is
 * replaced by a copy living in mem; a graph without them is left alone);
 * and the lowering of the TensorArrayV3 ops (and a clear refusal of a TF1
 * control-flow node left outside any loop or conditional). */
kiln_status tf_v1_functionalize(struct kiln_arena *mem, const KilnSm__GraphDef **gd);
bool tf_v1_control_handles(const char *op);
kiln_status tf_v1_control_lower(struct tf_node_ctx *L);

/* Provided by tf_keras_rnn.c: when the While node L whose body was lowered
 * into sub (inputs: iteration, condition, the carried values; carried
 * value j is loop variable carried_var[j]) is a Keras LSTM or GRU loop,
 * emit Kiln's LSTM or GRU op in its place, set the carried outputs
 * L->out[k] and set *done; otherwise leave everything as it is. */
kiln_status tf_keras_rnn_fuse(struct tf_node_ctx *L, const struct kiln_graph *sub,
                              const int *carried_var, int n_carried, bool *done);

/* Provided by tf_graph.c for the op lowering: */

/* The body of library function `name`, or NULL. */
const KilnSm__FunctionDef *tf_function_def(const struct tf_build *b, const char *name);
/* Lower a call of function f (name and instantiation attrs; `role` says
 * what it is to node L, e.g. "body", for names and messages) into graph g,
 * which is L->g or a subgraph of it: its n_args arguments are bound to args
 * (values of g), and outs[0..n_outs) receives its return values (values of
 * g). The function must return exactly n_outs tensors. */
kiln_status tf_function_lower(struct tf_node_ctx *L, const KilnSm__NameAttrList *f,
                              const char *role, struct kiln_graph *g, const struct tf_sym *args,
                              int n_args, int n_outs, struct tf_sym *outs);

/* The IR value holding variable var's value: a constant (the restored
 * value) or, for a variable a signature writes, a TfVariable node. */
kiln_status tf_var_value(struct tf_build *b, int var, int *value_out);
/* Whether variable var is a resource variable (VarHandleOp) rather than a
 * TF1 ref variable (VariableV2), whose endpoint is its value. */
bool tf_var_is_resource(const struct tf_build *b, int var);
/* Whether a signature assigns TF1 variable var (then it is read with a
 * TfVariable node and written with TfAssign nodes). */
bool tf_var_written(const struct tf_build *b, int var);
/* The name a variable has in messages. */
const char *tf_var_name(const struct tf_build *b, int var);

#endif
