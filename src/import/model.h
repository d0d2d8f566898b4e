/*
 * model.h - what an importer produces: a graph plus its signatures and the
 * facts `kiln inspect` shows. Importers fill a struct kiln_model; the
 * public API (src/api/) serves it.
 */
#ifndef KILN_IMPORT_MODEL_H
#define KILN_IMPORT_MODEL_H

#include "core/fileio.h"
#include "ir/graph.h"

struct kiln_signature {
    const char *name;
    const char *method;
    struct kiln_graph *graph;     /* the graph this signature runs */
    int n_inputs;
    kiln_value_info *inputs;      /* caller-facing names and types */
    int *input_values;            /* graph value ids, parallel to inputs */
    int n_outputs;
    kiln_value_info *outputs;
    int *output_values;
    /* Set by the API after import (src/api/kiln.c): */
    struct kiln_graph *opt_graph;     /* optimized clone of graph, or NULL (optimizer failed) */
    struct kiln_opt_log *opt_log;
    char *opt_error;                  /* why opt_graph is NULL */
    int opt_has_layout;               /* opt_graph has blocked values (needs plans) */
    struct kiln_plan_cache *plans[2]; /* [0] imported graph, [1] optimized graph */
    struct kiln_plan_cache *lowp_plans[2][2]; /* the same for sessions asking for bf16 [0]
                                                 or int8 [1] (kiln_precision - 1) */
    int shares_graph_of;              /* index of an earlier signature with the same graph, or -1 */
};

struct kiln_model {
    const char *format;           /* "onnx", "savedmodel" */
    struct kiln_graph *graph;     /* owns the arena everything else lives in */
    int n_signatures;
    struct kiln_signature *signatures;
    int default_signature;
    kiln_model_stats stats;
    int n_opsets;
    const char **opset_domain;
    int64_t *opset_version;
    int n_op_kinds;
    const char **op_kind_name;
    int *op_kind_count;
    void *proto;                  /* parsed file kept alive: weights point into it */
    void (*proto_free)(void *);
    struct kiln_file_map *maps;   /* mapped files (model, external data) */
    int n_maps, cap_maps;
    struct kiln_weight_cache *weights; /* packed weights shared by every plan */
    /* Weights the importer copied out of a kept file mapping (misaligned
     * raw_data): the weight cache may free such a copy and copy it again. */
    struct kiln_weight_copy { kiln_tensor *t; const void *src; } *copies;
    int n_copies, cap_copies;
    struct kiln_artifact_info *artifact; /* a .kiln model: what the file says (import/kiln_artifact.h) */
};

/* Keep a mapping alive for the model's lifetime. */
kiln_status kiln_model_keep_map(struct kiln_model *m, const struct kiln_file_map *map);
/* Record that t was copied from src, which stays mapped while m lives. */
kiln_status kiln_model_note_copy(struct kiln_model *m, kiln_tensor *t, const void *src);
/* Fill op histogram and stats from m->graph (recursing into subgraphs). */
kiln_status kiln_model_finish(struct kiln_model *m);
/* Build the signature value infos for sig from its graph's value types. */
kiln_status kiln_signature_describe(struct kiln_model *m, struct kiln_signature *sig);
/* Run static shape inference over a graph (types of node outputs). */
kiln_status kiln_graph_infer(struct kiln_graph *g);

/* ONNX. dir is the folder external data is resolved against (NULL: none allowed). */
kiln_status kiln_onnx_load(const void *data, size_t size, const char *dir, struct kiln_model *m);
/* Load from a mapped file, which the model keeps (weights are used in
 * place) or unmaps; *map is consumed either way. */
kiln_status kiln_onnx_load_file(struct kiln_file_map *map, const char *dir, struct kiln_model *m);
/* Read a serialized TensorProto (conformance data) into an owned tensor. */
kiln_status kiln_onnx_read_tensor(const void *data, size_t size, kiln_tensor **out,
                                  char **name_out);
/* Read a serialized TensorProto, SequenceProto or OptionalProto (as kind says:
 * KILN_DTYPE_SEQUENCE, KILN_DTYPE_OPTIONAL, anything else a tensor) into an owned
 * value; sequences and optionals become containers (docs/SEQUENCES.md). */
kiln_status kiln_onnx_read_value(const void *data, size_t size, kiln_dtype kind,
                                 kiln_tensor **out);

#endif
