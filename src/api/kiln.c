/*
 * kiln.c - the public API (include/kiln/kiln.h) over importers and the
 * executor.
 *
 * A model is immutable once loaded; a session is a model plus a chosen
 * signature and options. kiln_session_run validates the inputs against
 * the signature, runs the executor, and hands the outputs to the caller.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/tensor.h"
#include "core/threadpool.h"
#include "exec/exec.h"
#include "exec/plan.h"
#include "api/internal.h"
#include "opt/opt.h"
#include "import/kiln_artifact.h"
#include "import/model.h"
#include "import/savedmodel.h"
#include "import/tflite.h"
#include "import/xgboost.h"

struct kiln_session {
    struct kiln_model *model;
    const struct kiln_signature *sig;
    kiln_session_options opts;
    atomic_int profile;   /* time every step of this session's runs (kiln_session_profile_enable) */
    struct kiln_graph *own_graph;        /* calibrated static int8 graph (kiln_session_adopt_graph) */
    struct kiln_plan_cache *cal_plans;   /* its plans */
    struct kiln_weight_cache *own_weights; /* their packed weights (the graph's constants die
                                              with the session, so they are not keys of the
                                              model's cache) */
    struct kiln_plan_node_prec *node_prec; /* per-node precision exceptions (owned), or NULL */
    int n_node_prec;
    struct kiln_plan_cache *own_plans[2]; /* this session's plans when it has exceptions
                                             ([0] imported graph, [1] optimized) */
    struct kiln_graph *save_graph; /* kiln_session_save's graph: the session's graph with
                                      the exceptions recorded on the nodes (owned), or NULL */
    struct kiln_sq_target *sq_targets; /* static int8: what calibration quantized and */
    float (*sq_range)[2];              /* its ranges by value id (owned; emit_onnx.c) */
    int n_sq_targets;
};

struct kiln_outputs {
    int n;
    const char **names;   /* borrowed from the model's signature */
    kiln_tensor **tensors;
};

/* ---- models ---- */

static void model_free(struct kiln_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_signatures; i++) {
        struct kiln_signature *sig = &m->signatures[i];
        if (sig->shares_graph_of >= 0) continue;
        kiln_plan_cache_free(sig->plans[0]);
        kiln_plan_cache_free(sig->plans[1]);
        for (int p = 0; p < 2; p++)
            for (int k = 0; k < 2; k++) kiln_plan_cache_free(sig->lowp_plans[p][k]);
        kiln_graph_free(sig->opt_graph);
        free(sig->opt_log);
        free(sig->opt_error);
    }
    kiln_weight_cache_free(m->weights);
    free(m->copies);
    kiln_artifact_info_free(m->artifact);
    kiln_graph_free(m->graph);
    if (m->proto_free && m->proto) m->proto_free(m->proto);
    for (int i = 0; i < m->n_maps; i++) kiln_file_unmap(&m->maps[i]);
    free(m->maps);
    free(m);
}

void kiln_model_free(kiln_model *m) { model_free(m); }

static bool has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static kiln_status load_onnx_file(const char *path, struct kiln_model *m)
{
    struct kiln_file_map map;
    kiln_status st = kiln_file_map(path, &map);
    if (st != KILN_OK) return st;
    /* the model's folder, for external data */
    char *dir = strdup(path);
    if (!dir) {
        kiln_file_unmap(&map);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = '\0';
    else if (slash) *slash = '\0';
    else strcpy(dir, ".");
    st = kiln_onnx_load_file(&map, dir, m); /* keeps the mapping if weights live in it */
    free(dir);
    if (st != KILN_OK) kiln_error_wrap(st, "%s", path);
    return st;
}

/* A TFLite file: read whole (weights are copied out while lowering). */
static kiln_status load_tflite_file(const char *path, struct kiln_model *m)
{
    struct kiln_file_map map;
    kiln_status st = kiln_file_map(path, &map);
    if (st != KILN_OK) return st;
    st = kiln_tflite_load(map.data, map.size, m);
    kiln_file_unmap(&map);
    if (st != KILN_OK) kiln_error_wrap(st, "%s", path);
    return st;
}

/* An XGBoost save_model file (JSON or UBJSON; src/import/xgboost.c). */
static kiln_status load_xgboost_file(const char *path, struct kiln_model *m)
{
    struct kiln_file_map map;
    kiln_status st = kiln_file_map(path, &map);
    if (st != KILN_OK) return st;
    st = kiln_xgboost_load(map.data, map.size, m); /* copies what it keeps */
    kiln_file_unmap(&map);
    if (st != KILN_OK) kiln_error_wrap(st, "%s", path);
    return st;
}

/* A compiled artifact (src/import/kiln_artifact.c): mapped, weights used in place. */
static kiln_status load_kiln_file(const char *path, struct kiln_model *m)
{
    struct kiln_file_map map;
    kiln_status st = kiln_file_map(path, &map);
    if (st != KILN_OK) return st;
    return kiln_artifact_load(&map, path, m); /* messages name the file */
}

/* Whether the file at path begins with the .kiln magic. */
static bool file_is_kiln(const char *path)
{
    unsigned char head[KILN_ART_MAGIC_LEN];
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    bool yes = fread(head, 1, sizeof head, f) == sizeof head && kiln_artifact_detect(head, sizeof head);
    fclose(f);
    return yes;
}

/* Compile the plans a .kiln file asks for at load (its batch sizes, in its
 * precision), so that the first request finds them ready. */
static kiln_status artifact_precompile(struct kiln_model *m, const kiln_load_options *lo)
{
    if (!m->artifact || !m->artifact->n_batch_sizes) return KILN_OK;
    kiln_session *s;
    kiln_session_options so;
    kiln_session_options_init(&so);
    /* bounded before any kernel is built: a file cannot make load build
     * primitives for values of any size it likes */
    if (lo && lo->max_tensor_bytes > 0) so.max_tensor_bytes = lo->max_tensor_bytes;
    kiln_status st = kiln_session_create(m, NULL, &so, &s);
    if (st != KILN_OK) return st;
    st = kiln_session_precompile(s, m->artifact->batch_sizes, m->artifact->n_batch_sizes);
    kiln_session_free(s);
    if (st != KILN_OK)
        kiln_error_wrap(st, "precompiling the batch sizes the .kiln file asks for");
    return st;
}

/* Whether the file at path starts like a TFLite model. */
static bool file_is_tflite(const char *path)
{
    unsigned char head[8];
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    bool yes = fread(head, 1, 8, f) == 8 && kiln_tflite_detect(head, 8);
    fclose(f);
    return yes;
}

/* Whether a single-file model is XGBoost's: a .json / .ubj name, or bytes
 * that begin as a JSON or UBJSON object (a valid ONNX file never does; a
 * file named .onnx is always read as ONNX, so a broken one gets ONNX's error). */
static bool is_xgboost_file(const char *path)
{
    if (has_suffix(path, ".json") || has_suffix(path, ".ubj")) return true;
    unsigned char head[2] = {0};
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    size_t n = fread(head, 1, sizeof head, fp);
    fclose(fp);
    return kiln_xgboost_sniff(head, n) != 0;
}

static int ptr_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(const void *const *)a, y = (uintptr_t)*(const void *const *)b;
    return x < y ? -1 : x > y;
}

/* Hand the importer's reloadable weight copies to the weight cache. Those no
 * optimized graph reads (the optimizer folded, transposed or concatenated them
 * into new constants) are released at once: only a session running the
 * imported graph reads them, and its plans (or the reference executor) copy
 * them back in. The others are released by the plans that pack them. */
static kiln_status release_unused_copies(struct kiln_model *m)
{
    kiln_status st = KILN_OK;
    for (int i = 0; i < m->n_copies && st == KILN_OK; i++)
        st = kiln_weight_cache_add_reloadable(m->weights, m->copies[i].t, m->copies[i].src);
    if (st != KILN_OK || !m->n_copies) return st;
    size_t n = 0, cap = 0;
    for (int i = 0; i < m->n_signatures; i++) {
        const struct kiln_graph *g = m->signatures[i].opt_graph;
        if (!g || m->signatures[i].shares_graph_of >= 0) continue;
        cap += (size_t)g->n_outputs;
        for (int k = 0; k < g->n_nodes; k++) cap += (size_t)g->nodes[k].n_in;
    }
    /* constants the optimized graphs' nodes and outputs read (a clone keeps
     * the values the optimizer left unused) */
    const kiln_tensor **used = malloc((cap + 1) * sizeof *used);
    if (!used) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < m->n_signatures; i++) {
        const struct kiln_graph *g = m->signatures[i].opt_graph;
        if (!g || m->signatures[i].shares_graph_of >= 0) continue;
        for (int k = 0; k < g->n_nodes; k++)
            for (int j = 0; j < g->nodes[k].n_in; j++) {
                int v = g->nodes[k].in[j];
                if (v >= 0 && g->values[v].kind == KILN_VALUE_CONST) used[n++] = g->values[v].konst;
            }
        for (int k = 0; k < g->n_outputs; k++)
            if (g->values[g->outputs[k]].kind == KILN_VALUE_CONST)
                used[n++] = g->values[g->outputs[k]].konst;
    }
    qsort(used, n, sizeof *used, ptr_cmp);
    kiln_weight_cache_compile_lock(m->weights);
    for (int i = 0; i < m->n_copies; i++) {
        const kiln_tensor *t = m->copies[i].t;
        if (!bsearch(&t, used, n, sizeof *used, ptr_cmp)) kiln_weight_cache_release(m->weights, t);
    }
    kiln_weight_cache_compile_unlock(m->weights);
    free(used);
    return KILN_OK;
}

/* After import: an optimized copy of every signature's graph, plan caches
 * and the weight cache. The optimizer failing is not a load failure: the
 * signature then runs its imported graph, and the log says why. */
static kiln_status model_prepare(struct kiln_model *m)
{
    kiln_status st = kiln_weight_cache_new(&m->weights);
    if (st != KILN_OK) return st;
    for (int i = 0; i < m->n_maps; i++)
        if (m->maps[i].mapped == 1 && /* file pages the kernel can drop and fault back */
            (st = kiln_weight_cache_add_mapping(m->weights, m->maps[i].data, m->maps[i].size)) !=
                KILN_OK)
            return st;
    if (m->artifact && m->artifact->n_packs) { /* a .kiln's packed weights, if packed here */
        char env[128];
        kiln_weight_cache_pack_env(env, sizeof env);
        for (int i = 0; i < m->artifact->n_packs && !strcmp(env, m->artifact->pack_env); i++) {
            const struct kiln_artifact_pack *pk = &m->artifact->packs[i];
            st = kiln_weight_cache_preload(m->weights, pk->key, pk->tag, pk->data, pk->bytes);
            if (st != KILN_OK) return st;
        }
    }
    /* a .kiln's sparse-or-dense choices (0 bytes each: the weight cache's decision slots) */
    for (int i = 0; m->artifact && i < m->artifact->n_sparse; i++) {
        struct kiln_artifact_sparse *sc = &m->artifact->sparse[i];
        st = kiln_weight_cache_preload(m->weights, sc->key, sc->tag, &sc->choice, 0);
        if (st != KILN_OK) return st;
    }
    for (int i = 0; i < m->n_signatures; i++) m->signatures[i].shares_graph_of = -1;
    for (int i = 0; i < m->n_signatures; i++) {
        struct kiln_signature *sig = &m->signatures[i];
        for (int j = 0; j < i; j++)
            if (m->signatures[j].graph == sig->graph && m->signatures[j].shares_graph_of < 0) {
                sig->shares_graph_of = j;
                break;
            }
        if (sig->shares_graph_of >= 0) {
            const struct kiln_signature *o = &m->signatures[sig->shares_graph_of];
            sig->opt_graph = o->opt_graph;
            sig->opt_log = o->opt_log;
            sig->opt_error = o->opt_error;
            sig->opt_has_layout = o->opt_has_layout;
            sig->plans[0] = o->plans[0];
            sig->plans[1] = o->plans[1];
            memcpy(sig->lowp_plans, o->lowp_plans, sizeof sig->lowp_plans);
            continue;
        }
        if ((st = kiln_plan_cache_new(16, &sig->plans[0])) != KILN_OK ||
            (st = kiln_plan_cache_new(16, &sig->plans[1])) != KILN_OK)
            return st;
        for (int p = 0; p < 2; p++)
            for (int k = 0; k < 2; k++) {
                if ((st = kiln_plan_cache_new(16, &sig->lowp_plans[p][k])) != KILN_OK) return st;
                kiln_plan_cache_set_precision(sig->lowp_plans[p][k], p + 1);
            }
        sig->opt_log = calloc(1, sizeof *sig->opt_log);
        if (!sig->opt_log) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        struct kiln_graph *c = NULL;
        st = kiln_graph_clone(sig->graph, &c);
        if (st == KILN_OK && !m->artifact) { /* a .kiln graph is optimized already */
            struct kiln_opt_options oo = {.layout = 1};
            st = kiln_optimize(c, &oo, sig->opt_log);
        }
        if (st != KILN_OK) {
            sig->opt_error = strdup(kiln_last_error());
            kiln_graph_free(c);
            continue;
        }
        sig->opt_graph = c;
        for (int v = 0; v < c->n_values; v++)
            if (c->values[v].layout) sig->opt_has_layout = 1;
    }
    /* Import copied the misaligned weights and the optimizer folded, fused and
     * concatenated others: the file pages they were read from are no longer
     * needed. Weights still used in place fault back in when read (and those
     * packed later are given back again once packed), so the resident copy of
     * the model file shrinks to what the runs actually read. */
    for (int i = 0; i < m->n_maps; i++) kiln_file_release_pages(&m->maps[i]);
    return release_unused_copies(m);
}

kiln_status kiln_model_load(const char *path, const kiln_load_options *opts, kiln_model **out)
{
    if (!path || !out) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_model_load: NULL argument");
    *out = NULL;
    struct kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_format fmt = opts ? opts->format : KILN_FORMAT_AUTO;
    struct stat stt;
    if (stat(path, &stt) != 0) {
        free(m);
        return kiln_error(KILN_ERR_NOT_FOUND, "model '%s' does not exist", path);
    }
    kiln_status st;
    if (S_ISDIR(stt.st_mode)) {
        /* a model folder: model.onnx, a SavedModel, or XGBoost's model.json / model.ubj
         * (after the SavedModel, whose folder may hold an unrelated model.json) */
        char buf[4096], buf2[4096], xgb_json[4096], xgb_ubj[4096];
        snprintf(buf, sizeof buf, "%s/model.onnx", path);
        char tfl[4096];
        snprintf(tfl, sizeof tfl, "%s/model.tflite", path);
        snprintf(xgb_json, sizeof xgb_json, "%s/model.json", path);
        snprintf(xgb_ubj, sizeof xgb_ubj, "%s/model.ubj", path);
        char kln[4096];
        snprintf(kln, sizeof kln, "%s/model.kiln", path);
        if (fmt == KILN_FORMAT_TFLITE) {
            st = load_tflite_file(tfl, m);
        } else if (fmt == KILN_FORMAT_KILN || (fmt == KILN_FORMAT_AUTO && access(kln, F_OK) == 0)) {
            st = load_kiln_file(kln, m);
        } else if ((fmt == KILN_FORMAT_AUTO || fmt == KILN_FORMAT_ONNX) && access(buf, F_OK) == 0) {
            st = load_onnx_file(buf, m);
        } else {
            snprintf(buf, sizeof buf, "%s/saved_model.pb", path);
            snprintf(buf2, sizeof buf2, "%s/saved_model.pbtxt", path);
            if (access(buf, F_OK) == 0 || access(buf2, F_OK) == 0) {
                st = kiln_savedmodel_load(path, opts ? opts->tags : NULL, m);
                if (st != KILN_OK) kiln_error_wrap(st, "%s", path);
            } else if (fmt == KILN_FORMAT_AUTO && access(tfl, F_OK) == 0) {
                st = load_tflite_file(tfl, m);
            } else if (fmt == KILN_FORMAT_AUTO && access(xgb_json, F_OK) == 0) {
                st = load_xgboost_file(xgb_json, m);
            } else if (fmt == KILN_FORMAT_AUTO && access(xgb_ubj, F_OK) == 0) {
                st = load_xgboost_file(xgb_ubj, m);
            } else {
                st = kiln_error(KILN_ERR_NOT_FOUND,
                                "folder '%s' holds no model.onnx, saved_model.pb, model.tflite or "
                                "XGBoost model.json / model.ubj", path);
            }
        }
    } else if (fmt == KILN_FORMAT_SAVEDMODEL) {
        st = kiln_error(KILN_ERR_INVALID_ARGUMENT, "a SavedModel is a folder; '%s' is a file", path);
    } else {
        if (fmt == KILN_FORMAT_KILN ||
            (fmt == KILN_FORMAT_AUTO && (has_suffix(path, ".kiln") || file_is_kiln(path))))
            st = load_kiln_file(path, m);
        else if (fmt == KILN_FORMAT_TFLITE ||
            (fmt == KILN_FORMAT_AUTO && (has_suffix(path, ".tflite") || file_is_tflite(path))))
            st = load_tflite_file(path, m);
        else if (fmt == KILN_FORMAT_AUTO && !has_suffix(path, ".onnx") && is_xgboost_file(path))
            st = load_xgboost_file(path, m);
        else
            st = load_onnx_file(path, m);
    }
    if (st == KILN_OK) st = model_prepare(m);
    if (st == KILN_OK) st = artifact_precompile(m, opts);
    if (st != KILN_OK) {
        model_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

kiln_status kiln_model_load_memory(const void *data, size_t size, const kiln_load_options *opts,
                                   kiln_model **out)
{
    if (!out || (!data && size)) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_model_load_memory: NULL argument");
    *out = NULL;
    if (opts && opts->format == KILN_FORMAT_SAVEDMODEL)
        return kiln_error(KILN_ERR_UNSUPPORTED, "SavedModels load from a folder, not from memory");
    struct kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_format fmt = opts ? opts->format : KILN_FORMAT_AUTO;
    kiln_status st;
    if (fmt == KILN_FORMAT_KILN || (fmt == KILN_FORMAT_AUTO && data && kiln_artifact_detect(data, size))) {
        /* a 64-byte aligned copy the model keeps (the caller's bytes are not retained) */
        struct kiln_file_map map = {aligned_alloc(64, (size + 63) / 64 * 64 + 64), size, 0};
        if (!map.data) st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        else {
            m->proto = (void *)map.data; /* freed with the model */
            m->proto_free = free;
            if (size) memcpy((void *)map.data, data, size);
            st = kiln_artifact_load(&map, "(memory)", m);
        }
    } else if (fmt == KILN_FORMAT_TFLITE || (fmt == KILN_FORMAT_AUTO && data && kiln_tflite_detect(data, size)))
        st = kiln_tflite_load(data ? data : "", size, m);
    else
        st = kiln_onnx_load(data ? data : "", size, NULL, m);
    if (st == KILN_OK) st = model_prepare(m);
    if (st == KILN_OK) st = artifact_precompile(m, opts);
    if (st != KILN_OK) {
        model_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

kiln_status kiln_model_load_files(const char *dir, const kiln_memory_file *files, int n,
                                  const kiln_load_options *opts, kiln_model **out)
{
    if (!out || !dir || (n > 0 && !files) || n < 0)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_model_load_files: NULL argument");
    *out = NULL;
    const kiln_memory_file *pb = NULL, *pbtxt = NULL, *onnx = NULL;
    for (int i = 0; i < n; i++) {
        if (!files[i].path || (!files[i].data && files[i].size))
            return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_model_load_files: file %d of "
                              "'%s' has no path or no bytes", i, dir);
        if (strcmp(files[i].path, "saved_model.pb") == 0) pb = &files[i];
        else if (strcmp(files[i].path, "saved_model.pbtxt") == 0) pbtxt = &files[i];
        else if (strcmp(files[i].path, "model.onnx") == 0) onnx = &files[i];
    }
    kiln_format fmt = opts ? opts->format : KILN_FORMAT_AUTO;
    if (onnx && fmt != KILN_FORMAT_SAVEDMODEL) {
        kiln_load_options lo = {KILN_FORMAT_ONNX, opts ? opts->tags : NULL, 0};
        kiln_status st = kiln_model_load_memory(onnx->data, onnx->size, &lo, out);
        return st == KILN_OK ? st : kiln_error_wrap(st, "%s/model.onnx", dir);
    }
    const kiln_memory_file *sm = pb ? pb : pbtxt;
    if (!sm || (fmt != KILN_FORMAT_AUTO && fmt != KILN_FORMAT_SAVEDMODEL))
        return kiln_error(KILN_ERR_NOT_FOUND, "the in-memory files of '%s' hold no model.onnx or "
                          "saved_model.pb of the format asked for", dir);
    struct kiln_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    struct kiln_file_source src = {dir, files, n};
    kiln_status st = kiln_savedmodel_load_source(sm->data ? sm->data : "", sm->size, sm == pbtxt,
                                                 dir, &src, opts ? opts->tags : NULL, m);
    if (st != KILN_OK) kiln_error_wrap(st, "%s", dir);
    if (st == KILN_OK) st = model_prepare(m);
    if (st == KILN_OK) st = artifact_precompile(m, opts);
    if (st != KILN_OK) {
        model_free(m);
        return st;
    }
    *out = m;
    return KILN_OK;
}

const char *kiln_model_format(const kiln_model *m) { return m->format; }

int kiln_model_signature_count(const kiln_model *m) { return m->n_signatures; }

const kiln_signature *kiln_model_signature(const kiln_model *m, int i)
{
    return i >= 0 && i < m->n_signatures ? &m->signatures[i] : NULL;
}

const kiln_signature *kiln_model_find_signature(const kiln_model *m, const char *name)
{
    if (!name) return m->n_signatures ? &m->signatures[m->default_signature] : NULL;
    for (int i = 0; i < m->n_signatures; i++)
        if (strcmp(m->signatures[i].name, name) == 0) return &m->signatures[i];
    return NULL;
}

const char *kiln_signature_name(const kiln_signature *s) { return s->name; }
const char *kiln_signature_method(const kiln_signature *s) { return s->method; }
int kiln_signature_input_count(const kiln_signature *s) { return s->n_inputs; }
int kiln_signature_output_count(const kiln_signature *s) { return s->n_outputs; }

const kiln_value_info *kiln_signature_input(const kiln_signature *s, int i)
{
    return i >= 0 && i < s->n_inputs ? &s->inputs[i] : NULL;
}

const kiln_value_info *kiln_signature_output(const kiln_signature *s, int i)
{
    return i >= 0 && i < s->n_outputs ? &s->outputs[i] : NULL;
}

void kiln_model_get_stats(const kiln_model *m, kiln_model_stats *out) { *out = m->stats; }

int kiln_model_opset_count(const kiln_model *m) { return m->n_opsets; }

void kiln_model_opset(const kiln_model *m, int i, const char **domain, int64_t *version)
{
    *domain = i >= 0 && i < m->n_opsets ? m->opset_domain[i] : "";
    *version = i >= 0 && i < m->n_opsets ? m->opset_version[i] : 0;
}

int kiln_model_op_kinds(const kiln_model *m) { return m->n_op_kinds; }

void kiln_model_op_kind(const kiln_model *m, int i, const char **op, int *count)
{
    *op = i >= 0 && i < m->n_op_kinds ? m->op_kind_name[i] : "";
    *count = i >= 0 && i < m->n_op_kinds ? m->op_kind_count[i] : 0;
}

/* ---- sessions ---- */

const char *kiln_precision_name(kiln_precision p)
{
    switch (p) {
    case KILN_PRECISION_FP32: return "fp32";
    case KILN_PRECISION_BF16: return "bf16";
    case KILN_PRECISION_INT8: return "int8";
    }
    return "?";
}

kiln_status kiln_precision_parse(const char *text, kiln_precision *out)
{
    static const kiln_precision all[] = {KILN_PRECISION_FP32, KILN_PRECISION_BF16,
                                         KILN_PRECISION_INT8};
    for (size_t i = 0; text && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(text, kiln_precision_name(all[i]))) {
            *out = all[i];
            return KILN_OK;
        }
    return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                      "precision '%s' is not one of fp32, bf16, int8", text ? text : "(null)");
}

void kiln_session_options_init(kiln_session_options *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 0;
    o->optimize = 1;
}

kiln_status kiln_session_create(kiln_model *m, const char *signature,
                                const kiln_session_options *opts, kiln_session **out)
{
    if (!m || !out) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_create: NULL argument");
    *out = NULL;
    const struct kiln_signature *sig = kiln_model_find_signature(m, signature);
    if (!sig) {
        char names[512] = "";
        size_t k = 0;
        for (int i = 0; i < m->n_signatures && k < sizeof names; i++)
            k += (size_t)snprintf(names + k, sizeof names - k, "%s'%s'", i ? ", " : "",
                                  m->signatures[i].name);
        return kiln_error(KILN_ERR_NOT_FOUND, "signature '%s' not found; the model has %s",
                          signature ? signature : "(default)", names[0] ? names : "none");
    }
    if (opts && (opts->precision < KILN_PRECISION_FP32 || opts->precision > KILN_PRECISION_INT8))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "session precision %d is not KILN_PRECISION_FP32, BF16 or INT8",
                          opts->precision);
    if (opts && opts->profile && opts->reference)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "session options profile = 1 and reference = 1: the reference executor "
                          "keeps no profile");
    if (m->artifact && opts && opts->precision != KILN_PRECISION_FP32 &&
        opts->precision != m->artifact->precision)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "the model was compiled for %s; a session of it cannot run in %s",
                          kiln_precision_name(m->artifact->precision),
                          kiln_precision_name(opts->precision));
    if (m->artifact && opts && opts->reference && sig->opt_has_layout)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "the compiled model's graph holds blocked layouts, which the reference "
                          "executor (reference = 1) cannot run; load the source model instead");
    struct kiln_session *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    s->model = m;
    s->sig = sig;
    if (opts) s->opts = *opts;
    else kiln_session_options_init(&s->opts);
    if (m->artifact) s->opts.precision = m->artifact->precision; /* a .kiln runs as compiled */
    atomic_init(&s->profile, s->opts.profile ? 1 : 0);
    *out = s;
    return KILN_OK;
}

static void session_node_prec_clear(kiln_session *s)
{
    for (int k = 0; k < 2; k++) {
        kiln_plan_cache_free(s->own_plans[k]);
        s->own_plans[k] = NULL;
    }
    for (int i = 0; i < s->n_node_prec; i++) free(s->node_prec[i].node);
    free(s->node_prec);
    kiln_graph_free(s->save_graph);
    s->save_graph = NULL;
    s->node_prec = NULL;
    s->n_node_prec = 0;
}

void kiln_session_free(kiln_session *s)
{
    if (!s) return;
    session_node_prec_clear(s);
    kiln_plan_cache_free(s->cal_plans);
    kiln_weight_cache_free(s->own_weights);
    kiln_graph_free(s->own_graph);
    free(s->sq_targets);
    free(s->sq_range);
    free(s);
}

kiln_status kiln_session_adopt_graph(kiln_session *s, struct kiln_graph *g)
{
    struct kiln_plan_cache *pc = NULL;
    struct kiln_weight_cache *wc = NULL;
    /* the graph borrows the model's constants: keep them resident for its plans */
    kiln_status st = kiln_weight_cache_pin_all(s->model->weights);
    if (st == KILN_OK) st = kiln_plan_cache_new(16, &pc);
    if (st == KILN_OK) st = kiln_weight_cache_new(&wc);
    if (st != KILN_OK) {
        kiln_plan_cache_free(pc);
        kiln_graph_free(g);
        return st;
    }
    kiln_plan_cache_free(s->cal_plans);
    kiln_weight_cache_free(s->own_weights);
    kiln_graph_free(s->own_graph);
    s->own_graph = g;
    s->cal_plans = pc;
    s->own_weights = wc;
    return KILN_OK;
}

void kiln_session_set_static_quant(kiln_session *s, struct kiln_sq_target *t, int n,
                                   float (*range)[2])
{
    free(s->sq_targets);
    free(s->sq_range);
    s->sq_targets = t;
    s->n_sq_targets = n;
    s->sq_range = range;
}

int kiln_session_static_quant(const kiln_session *s, const struct kiln_sq_target **t,
                              const float (**range)[2])
{
    *t = s->sq_targets;
    *range = (const float(*)[2])s->sq_range;
    return s->sq_range ? s->n_sq_targets : -1;
}

const struct kiln_graph *kiln_session_graph(const kiln_session *s) { return s->sig->graph; }
struct kiln_weight_cache *kiln_session_weights(const kiln_session *s) { return s->model->weights; }
const kiln_session_options *kiln_session_opts(const kiln_session *s) { return &s->opts; }

const kiln_signature *kiln_session_signature(const kiln_session *s) { return s->sig; }

/* A caller's sequence or optional (kiln.h): the kind the signature declares, every
 * slot filled with a well-formed tensor (or, in an optional, a sequence), nesting
 * bounded. */
static kiln_status container_ok(const char *name, const kiln_tensor *t, int depth)
{
    if (!t || depth > 2)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s': a %s", name,
                          t ? "container nests too deeply" : "container slot is empty");
    if (!kiln_dtype_is_container(t->dtype)) {
        int64_t n = (unsigned)t->dtype < KILN_DTYPE_COUNT && t->dtype != KILN_DTYPE_UNDEFINED &&
                            t->rank >= 0 && t->rank <= KILN_MAX_RANK
                        ? kiln_shape_count(t->rank, t->dims)
                        : -1;
        if (n < 0 || (t->dtype != KILN_DTYPE_STRING && (size_t)n * kiln_dtype_size(t->dtype) != t->nbytes) ||
            (n > 0 && !t->data))
            return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                              "input '%s': an item is not a valid tensor", name);
        return KILN_OK;
    }
    int64_t max = t->dtype == KILN_DTYPE_OPTIONAL ? 1 : KILN_SEQUENCE_MAX_ITEMS;
    if (t->rank != 1 || t->dims[0] < 0 || t->dims[0] > max || (t->dims[0] > 0 && !t->data))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s': not a valid %s", name,
                          kiln_dtype_name(t->dtype));
    for (int64_t i = 0; i < t->dims[0]; i++) {
        const kiln_tensor *item = kiln_tensor_item(t, i);
        if (item && item->dtype == KILN_DTYPE_OPTIONAL)
            return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                              "input '%s': a %s cannot hold an optional", name,
                              kiln_dtype_name(t->dtype));
        kiln_status st = container_ok(name, item, depth + 1);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

static kiln_status check_container(const kiln_value_info *vi, const kiln_tensor *t)
{
    if (vi->dtype != KILN_DTYPE_UNDEFINED && t->dtype != vi->dtype)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s' must be %s, got %s", vi->name,
                          kiln_dtype_name(vi->dtype), kiln_dtype_name(t->dtype));
    return container_ok(vi->name, t, 0);
}

/* Check a caller's tensor against the signature's declared type. */
static kiln_status check_input(const kiln_value_info *vi, const kiln_tensor *t)
{
    char a[160], b[160];
    if (!t) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s' is NULL", vi->name);
    if (kiln_dtype_is_container(t->dtype) || kiln_dtype_is_container(vi->dtype))
        return check_container(vi, t);
    if ((unsigned)t->dtype >= KILN_DTYPE_COUNT || t->dtype == KILN_DTYPE_UNDEFINED ||
        t->rank < 0 || t->rank > KILN_MAX_RANK)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s' is not a valid tensor", vi->name);
    if (vi->dtype != KILN_DTYPE_UNDEFINED && t->dtype != vi->dtype)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s' must be %s, got %s", vi->name,
                          kiln_dtype_name(vi->dtype), kiln_dtype_name(t->dtype));
    int64_t n = kiln_shape_count(t->rank, t->dims);
    if (n < 0 || (t->dtype != KILN_DTYPE_STRING && (size_t)n * kiln_dtype_size(t->dtype) != t->nbytes) ||
        (n > 0 && !t->data))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                          "input '%s': shape %s does not match its %zu data bytes", vi->name,
                          kiln_shape_str(t->rank, t->dims, a, sizeof a), t->nbytes);
    if (vi->rank >= 0) {
        bool ok = vi->rank == t->rank;
        for (int i = 0; ok && i < vi->rank; i++) ok = vi->dims[i] < 0 || vi->dims[i] == t->dims[i];
        if (!ok) {
            size_t k = 0;
            k += (size_t)snprintf(b + k, sizeof b - k, "[");
            for (int i = 0; i < vi->rank && k < sizeof b; i++) {
                if (vi->dims[i] >= 0)
                    k += (size_t)snprintf(b + k, sizeof b - k, i ? ",%lld" : "%lld",
                                          (long long)vi->dims[i]);
                else
                    k += (size_t)snprintf(b + k, sizeof b - k, i ? ",%s" : "%s",
                                          vi->dim_names[i] ? vi->dim_names[i] : "?");
            }
            if (k < sizeof b) snprintf(b + k, sizeof b - k, "]");
            return kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s' must have shape %s, got %s",
                              vi->name, b, kiln_shape_str(t->rank, t->dims, a, sizeof a));
        }
    }
    return KILN_OK;
}

/* Run through a plan when the graph can be planned (the usual case), else
 * with the reference executor (control flow, strings, data-dependent
 * shapes), on the optimized graph unless it holds blocked layouts, which
 * only plans understand. */
/* The plan cache for a session's precision and graph (imported or optimized). */
static struct kiln_plan_cache *plans_for(const kiln_session *s, bool use_opt)
{
    if (s->own_graph && use_opt) return s->cal_plans;
    if (s->own_plans[use_opt ? 1 : 0]) return s->own_plans[use_opt ? 1 : 0];
    int p = s->opts.precision;
    if (p == KILN_PRECISION_BF16 || p == KILN_PRECISION_INT8)
        return s->sig->lowp_plans[p - 1][use_opt ? 1 : 0];
    return s->sig->plans[use_opt ? 1 : 0];
}

static kiln_status run_graph(kiln_session *s, const struct kiln_graph *g, bool use_opt,
                             kiln_tensor **gin, kiln_tensor **gout, const kiln_run_options *ro)
{
    const struct kiln_signature *sig = s->sig;
    if (!s->opts.reference) {
        struct kiln_plan_cache *pc = plans_for(s, use_opt);
        struct kiln_plan *p = NULL;
        struct kiln_weight_cache *wc =
            use_opt && s->own_graph ? s->own_weights : s->model->weights;
        int64_t limit = s->opts.max_tensor_bytes > 0 ? s->opts.max_tensor_bytes
                                                     : KILN_EXEC_DEFAULT_MAX_TENSOR_BYTES;
        kiln_status st = kiln_plan_cache_get(pc, g, (const kiln_tensor *const *)gin, wc,
                                             s->opts.threads, limit, &p);
        if (st == KILN_OK && kiln_plan_max_value_bytes(p) > (size_t)limit) {
            kiln_plan_cache_release(pc, p);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY,
                              "a value of this run would need %zu bytes, above the session's "
                              "limit of %lld bytes per tensor",
                              kiln_plan_max_value_bytes(p), (long long)limit);
        }
        if (st == KILN_OK) {
            st = kiln_plan_run_profiled(p, gin, gout, s->opts.threads, ro,
                                        atomic_load(&s->profile));
            kiln_plan_cache_release(pc, p);
            return st;
        }
        if (st != KILN_ERR_UNSUPPORTED) return st;
        if (sig->opt_has_layout && s->model->artifact) return st; /* no unblocked graph */
        if (use_opt && (sig->opt_has_layout || s->own_graph)) g = sig->graph;
    }
    /* the reference executor reads every constant as it is */
    kiln_status st = kiln_weight_cache_pin_all(s->model->weights);
    if (st != KILN_OK) return st;
    return kiln_exec_run_limited(g, gin, gout, s->opts.max_tensor_bytes, ro);
}

kiln_status kiln_session_run(kiln_session *s, const kiln_named_tensor *inputs, int n_inputs,
                             kiln_outputs **out)
{
    return kiln_session_run_opts(s, inputs, n_inputs, NULL, out);
}

kiln_status kiln_session_run_opts(kiln_session *s, const kiln_named_tensor *inputs, int n_inputs,
                                  const kiln_run_options *ro, kiln_outputs **out)
{
    if (!s || !out || (n_inputs > 0 && !inputs))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_run: NULL argument");
    *out = NULL;
    const struct kiln_signature *sig = s->sig;
    bool use_opt = s->opts.optimize && !s->opts.reference && sig->opt_graph;
    const struct kiln_graph *g = use_opt ? sig->opt_graph : sig->graph;
    if (use_opt && s->own_graph) g = s->own_graph; /* same inputs and outputs, by value id */
    kiln_status st = KILN_OK;
    kiln_tensor **gin = calloc((size_t)g->n_inputs + 1, sizeof *gin);
    kiln_tensor **gout = calloc((size_t)g->n_outputs + 1, sizeof *gout);
    struct kiln_outputs *o = calloc(1, sizeof *o);
    if (!gin || !gout || !o) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n_inputs; i++) {
        const char *name = inputs[i].name ? inputs[i].name : "";
        int k = -1;
        for (int j = 0; j < sig->n_inputs; j++)
            if (strcmp(sig->inputs[j].name, name) == 0) k = j;
        if (k < 0) {
            st = kiln_error(KILN_ERR_INVALID_ARGUMENT, "'%s' is not an input of signature '%s'",
                            name, sig->name);
            goto fail;
        }
        /* map the signature input to the graph input slot */
        int slot = -1;
        for (int j = 0; j < g->n_inputs; j++)
            if (g->inputs[j] == sig->input_values[k]) slot = j;
        if (slot < 0) {
            st = kiln_error(KILN_ERR_INTERNAL, "signature input '%s' is not a graph input", name);
            goto fail;
        }
        if (gin[slot]) {
            st = kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s' is given twice", name);
            goto fail;
        }
        if ((st = check_input(&sig->inputs[k], inputs[i].tensor)) != KILN_OK) goto fail;
        gin[slot] = (kiln_tensor *)inputs[i].tensor;
    }
    for (int j = 0; j < g->n_inputs; j++)
        if (!gin[j]) {
            st = kiln_error(KILN_ERR_INVALID_ARGUMENT, "input '%s' is missing",
                            g->values[g->inputs[j]].name);
            goto fail;
        }
    st = run_graph(s, g, use_opt, gin, gout, ro);
    if (st != KILN_OK) goto fail;
    o->n = sig->n_outputs;
    o->names = calloc((size_t)o->n + 1, sizeof *o->names);
    o->tensors = calloc((size_t)o->n + 1, sizeof *o->tensors);
    if (!o->names || !o->tensors) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    for (int i = 0; i < o->n; i++) {
        o->names[i] = sig->outputs[i].name;
        for (int j = 0; j < g->n_outputs; j++)
            if (gout[j] && g->outputs[j] == sig->output_values[i]) {
                o->tensors[i] = gout[j];
                gout[j] = NULL;
                break;
            }
        if (!o->tensors[i]) {
            st = kiln_error(KILN_ERR_INTERNAL, "signature output '%s' was not produced", o->names[i]);
            goto fail;
        }
    }
    for (int j = 0; j < g->n_outputs; j++) kiln_tensor_free(gout[j]);
    free(gin);
    free(gout);
    *out = o;
    return KILN_OK;
fail:
    if (gout)
        for (int j = 0; j < g->n_outputs; j++) kiln_tensor_free(gout[j]);
    free(gin);
    free(gout);
    kiln_outputs_free(o);
    return st;
}

kiln_status kiln_session_precompile(kiln_session *s, const int64_t *batch_sizes, int n)
{
    if (!s || (n > 0 && !batch_sizes))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_precompile: NULL argument");
    const struct kiln_signature *sig = s->sig;
    if (s->opts.reference) return KILN_OK;
    bool use_opt = s->opts.optimize && sig->opt_graph;
    const struct kiln_graph *g = use_opt ? sig->opt_graph : sig->graph;
    if (use_opt && s->own_graph) g = s->own_graph;
    struct kiln_plan_cache *pc = plans_for(s, use_opt);
    struct kiln_weight_cache *wc = use_opt && s->own_graph ? s->own_weights : s->model->weights;
    kiln_status st = KILN_OK;
    int64_t limit = s->opts.max_tensor_bytes > 0 ? s->opts.max_tensor_bytes
                                                 : KILN_EXEC_DEFAULT_MAX_TENSOR_BYTES;
    kiln_tensor **gin = calloc((size_t)g->n_inputs + 1, sizeof *gin);
    if (!gin) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int b = 0; b < n && st == KILN_OK; b++) {
        if (batch_sizes[b] <= 0) {
            st = kiln_error(KILN_ERR_INVALID_ARGUMENT, "batch size %lld is not positive",
                            (long long)batch_sizes[b]);
            break;
        }
        bool plannable = true;
        for (int j = 0; j < g->n_inputs && st == KILN_OK; j++) {
            const struct kiln_value *v = &g->values[g->inputs[j]];
            int64_t dims[KILN_MAX_RANK];
            if (v->type.rank < 1 || v->type.dtype == KILN_DTYPE_STRING ||
                v->type.dtype == KILN_DTYPE_UNDEFINED) {
                plannable = false;
                break;
            }
            for (int d = 0; d < v->type.rank; d++)
                dims[d] = d == 0 ? batch_sizes[b] : (v->type.dims[d] >= 0 ? v->type.dims[d] : 1);
            /* only the types are read: a header without data is enough */
            st = kiln_tensor_new_uninit(v->type.dtype, 0, NULL, &gin[j]);
            if (st != KILN_OK) break;
            gin[j]->rank = v->type.rank;
            memcpy(gin[j]->dims, dims, sizeof dims[0] * (size_t)v->type.rank);
        }
        if (st == KILN_OK && plannable) {
            struct kiln_plan *p = NULL;
            st = kiln_plan_cache_get(pc, g, (const kiln_tensor *const *)gin, wc, s->opts.threads,
                                     limit, &p);
            if (st == KILN_OK) kiln_plan_cache_release(pc, p);
            if (st == KILN_ERR_UNSUPPORTED) st = KILN_OK; /* runs on the reference executor */
        }
        for (int j = 0; j < g->n_inputs; j++) {
            kiln_tensor_free(gin[j]);
            gin[j] = NULL;
        }
    }
    free(gin);
    return st;
}

struct text_buf {
    char *s;
    size_t n, cap;
    int oom;
};

static void text_line(void *ctx, const char *line)
{
    struct text_buf *b = ctx;
    size_t k = strlen(line);
    if (b->n + k + 2 > b->cap) {
        size_t cap = (b->cap + k + 2) * 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, line, k);
    b->n += k;
    b->s[b->n++] = '\n';
    b->s[b->n] = '\0';
}

kiln_status kiln_session_optimization_log(kiln_session *s, char **text)
{
    if (!s || !text)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_optimization_log: NULL argument");
    *text = NULL;
    const struct kiln_signature *sig = s->sig;
    struct text_buf b = {0};
    char line[256];
    if (s->model->artifact) {
        snprintf(line, sizeof line, "compiled model (.kiln, %s): optimized when it was compiled, "
                 "loaded without import or optimization",
                 kiln_precision_name(s->model->artifact->precision));
        text_line(&b, line);
    } else if (!s->opts.optimize || s->opts.reference) {
        text_line(&b, "optimizer disabled: the graph runs as imported");
    } else if (!sig->opt_graph) {
        snprintf(line, sizeof line, "optimizer failed, the graph runs as imported: %s",
                 sig->opt_error ? sig->opt_error : "unknown error");
        text_line(&b, line);
    } else {
        struct kiln_opt_log log = *sig->opt_log;
        if (sig->plans[1]) {
            int steps, fast;
            kiln_plan_cache_summary(plans_for(s, true), &log.plans, &steps, &fast, &log.arena_bytes);
        }
        log.packed_weight_bytes = kiln_weight_cache_bytes(s->model->weights);
        kiln_opt_log_print(&log, text_line, &b);
        if (sig->plans[1]) kiln_plan_cache_fallbacks(sig->plans[1], text_line, &b);
        if (sig->plans[1]) kiln_plan_cache_concat_lines(sig->plans[1], text_line, &b);
    }
    if (b.oom || !b.s) {
        free(b.s);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    *text = b.s;
    return KILN_OK;
}

static struct kiln_plan_cache *session_plans(kiln_session *s)
{
    bool use_opt = s->opts.optimize && s->sig->opt_graph;
    return plans_for(s, use_opt);
}

void kiln_session_profile_print(kiln_session *s, FILE *f)
{
    if (s->opts.reference) {
        fprintf(f, "profile: the reference executor keeps no profile\n");
        return;
    }
    kiln_plan_cache_profile_print(session_plans(s), f);
}

/* ---- compiled artifacts (the writer is api/artifact.c) ---- */

/* s->save_graph: a clone of g with attribute KILN_NODE_PRECISION_ATTR on every node
 * whose precision the session overrides. */
static kiln_status session_save_graph(kiln_session *s, const struct kiln_graph *g)
{
    struct kiln_graph *c = NULL;
    kiln_status st = kiln_graph_clone(g, &c);
    if (st != KILN_OK) return st;
    for (int i = 0; i < c->n_nodes; i++) {
        struct kiln_node *n = &c->nodes[i];
        if (!n->name || !n->name[0]) continue;
        int k = 0;
        while (k < s->n_node_prec && strcmp(s->node_prec[k].node, n->name)) k++;
        if (k == s->n_node_prec) continue;
        struct kiln_attr *a = kiln_arena_alloc(c->mem, (size_t)(n->n_attr + 1) * sizeof *a);
        if (!a) {
            kiln_graph_free(c);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
        int m = 0;
        for (int j = 0; j < n->n_attr; j++)
            if (strcmp(n->attr[j].name, KILN_NODE_PRECISION_ATTR)) a[m++] = n->attr[j];
        a[m].name = KILN_NODE_PRECISION_ATTR;
        a[m].type = KILN_ATTR_INT;
        a[m].i = s->node_prec[k].precision;
        n->attr = a;
        n->n_attr = m + 1;
    }
    s->save_graph = c;
    return KILN_OK;
}

kiln_status kiln_session_artifact_view(kiln_session *s, const struct kiln_model **m,
                                       const struct kiln_signature **sig,
                                       const struct kiln_graph **g, int *precision)
{
    bool use_opt = s->opts.optimize && !s->opts.reference && s->sig->opt_graph;
    kiln_status st = kiln_weight_cache_pin_all(s->model->weights);
    if (st != KILN_OK) return st;
    *m = s->model;
    *sig = s->sig;
    *g = use_opt ? s->sig->opt_graph : s->sig->graph;
    *precision = s->opts.precision;
    if (s->own_graph) {
        /* static int8 after calibration: its graph carries the quantized ops itself */
        *g = s->own_graph;
        *precision = KILN_PRECISION_FP32;
        return KILN_OK;
    }
    if (s->n_node_prec) {
        /* per-node precisions travel as a node attribute the plan compiler honours */
        if (!s->save_graph && (st = session_save_graph(s, *g)) != KILN_OK) return st;
        *g = s->save_graph;
    }
    return KILN_OK;
}

const char *kiln_model_compile_report(const kiln_model *m)
{
    return m && m->artifact ? m->artifact->report : NULL;
}

const char *kiln_model_precision(const kiln_model *m)
{
    if (!m) return NULL;
    int p = m->artifact ? m->artifact->precision : KILN_PRECISION_FP32;
    for (int i = 0; m->graph && i < m->graph->n_nodes; i++) {
        const struct kiln_node *n = &m->graph->nodes[i];
        if (n->op == KILN_OP_QLinearConv || n->op == KILN_OP_QLinearMatMul ||
            n->op == KILN_OP_KilnQLinearMatMul || n->op == KILN_OP_KilnQLinearConvAdd ||
            n->op == KILN_OP_MatMulInteger || n->op == KILN_OP_ConvInteger)
            p = KILN_PRECISION_INT8;
        const struct kiln_attr *a = kiln_node_attr(n, KILN_NODE_PRECISION_ATTR);
        if (a && a->type == KILN_ATTR_INT && a->i > p && a->i <= KILN_PRECISION_INT8) p = (int)a->i;
    }
    return kiln_precision_name((kiln_precision)p);
}

/* ---- profile as data ---- */

struct kiln_profile {
    int n_steps, cap_steps, n_ops;
    kiln_profile_entry *steps; /* slowest first */
    kiln_profile_entry *ops;   /* slowest first */
    int failed;                /* an allocation failed while collecting */
};

static char *dup_or_null(const char *s, int *failed)
{
    char *d = strdup(s ? s : "");
    if (!d) *failed = 1;
    return d;
}

static void profile_collect(void *ctx, const struct kiln_plan_step_profile *r)
{
    struct kiln_profile *p = ctx;
    if (p->failed) return;
    if (p->n_steps == p->cap_steps) {
        int cap = p->cap_steps ? p->cap_steps * 2 : 32;
        kiln_profile_entry *e = realloc(p->steps, (size_t)cap * sizeof *e);
        if (!e) {
            p->failed = 1;
            return;
        }
        p->steps = e;
        p->cap_steps = cap;
    }
    kiln_profile_entry *e = &p->steps[p->n_steps++];
    memset(e, 0, sizeof *e);
    e->op = dup_or_null(r->op, &p->failed);
    e->node = dup_or_null(r->node, &p->failed);
    e->kernel = dup_or_null(r->kernel, &p->failed);
    e->plan = r->plan;
    e->step = r->step;
    e->nodes = 1;
    e->calls = r->calls;
    e->total_ns = r->ns;
    e->flops = r->flops;
}

static int entry_slower_first(const void *a, const void *b)
{
    const kiln_profile_entry *x = a, *y = b;
    if (x->total_ns != y->total_ns) return x->total_ns < y->total_ns ? 1 : -1;
    if (x->plan != y->plan) return x->plan - y->plan;
    return x->step - y->step;
}

void kiln_profile_free(kiln_profile *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_steps; i++) {
        free((char *)p->steps[i].op);
        free((char *)p->steps[i].node);
        free((char *)p->steps[i].kernel);
    }
    free(p->steps);
    free(p->ops); /* op entries borrow the steps' strings */
    free(p);
}

kiln_status kiln_session_profile_enable(kiln_session *s, int on)
{
    if (!s) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "session is NULL");
    if (on && s->opts.reference)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "the session runs on the reference executor (reference = 1), which "
                          "keeps no profile");
    atomic_store(&s->profile, on ? 1 : 0);
    return KILN_OK;
}

kiln_status kiln_session_profile_reset(kiln_session *s)
{
    if (!s) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "session is NULL");
    if (!s->opts.reference) kiln_plan_cache_profile_reset(session_plans(s));
    return KILN_OK;
}

kiln_status kiln_session_profile_get(kiln_session *s, kiln_profile **out)
{
    if (!s || !out) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "session or out is NULL");
    *out = NULL;
    struct kiln_profile *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (atomic_load(&s->profile) && !s->opts.reference)
        kiln_plan_cache_profile_steps(session_plans(s), profile_collect, p);
    if (!p->failed && p->n_steps) {
        p->ops = calloc((size_t)p->n_steps, sizeof *p->ops);
        if (!p->ops) p->failed = 1;
    }
    if (p->failed) {
        kiln_profile_free(p);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory collecting the profile");
    }
    int64_t total = 0;
    for (int i = 0; i < p->n_steps; i++) total += p->steps[i].total_ns;
    for (int i = 0; i < p->n_steps; i++) {
        kiln_profile_entry *e = &p->steps[i];
        e->share = total > 0 ? (double)e->total_ns / (double)total : 0.0;
        int j = 0;
        while (j < p->n_ops &&
               !(strcmp(p->ops[j].op, e->op) == 0 && strcmp(p->ops[j].kernel, e->kernel) == 0))
            j++;
        kiln_profile_entry *o = &p->ops[j];
        if (j == p->n_ops) {
            p->n_ops++;
            o->op = e->op;
            o->kernel = e->kernel;
            o->node = NULL;
            o->plan = o->step = -1;
        }
        o->nodes++;
        o->calls += e->calls;
        o->total_ns += e->total_ns;
        o->flops += e->flops * (double)e->calls;
        o->share += e->share;
    }
    for (int j = 0; j < p->n_ops; j++) /* per call, like a step's */
        p->ops[j].flops = p->ops[j].calls ? p->ops[j].flops / (double)p->ops[j].calls : 0.0;
    if (p->n_steps) {
        qsort(p->steps, (size_t)p->n_steps, sizeof *p->steps, entry_slower_first);
        qsort(p->ops, (size_t)p->n_ops, sizeof *p->ops, entry_slower_first);
    }
    *out = p;
    return KILN_OK;
}

int kiln_profile_step_count(const kiln_profile *p) { return p ? p->n_steps : 0; }
int kiln_profile_op_count(const kiln_profile *p) { return p ? p->n_ops : 0; }
const kiln_profile_entry *kiln_profile_step(const kiln_profile *p, int i)
{
    return p && i >= 0 && i < p->n_steps ? &p->steps[i] : NULL;
}
const kiln_profile_entry *kiln_profile_op(const kiln_profile *p, int i)
{
    return p && i >= 0 && i < p->n_ops ? &p->ops[i] : NULL;
}

double kiln_session_reference_share(kiln_session *s)
{
    if (s->opts.reference) return 1.0;
    return kiln_plan_cache_reference_share(session_plans(s));
}

void kiln_session_plan_summary(kiln_session *s, char *buf, size_t n)
{
    int plans, steps, fast;
    size_t arena;
    kiln_plan_cache_summary(session_plans(s), &plans, &steps, &fast, &arena);
    char why[512];
    kiln_plan_cache_why_none(session_plans(s), why, sizeof why);
    if (!plans && why[0])
        snprintf(buf, n, "no plan: the graph runs on the reference executor (%s)", why);
    else if (!plans)
        snprintf(buf, n, "no plan: the graph runs on the reference executor");
    else
        snprintf(buf, n, "%d plan%s; largest: %d steps (%d on fast kernels), arena %.2f MiB, "
                 "packed weights %.2f MiB", plans, plans == 1 ? "" : "s", steps, fast,
                 (double)arena / 1048576.0,
                 (double)kiln_weight_cache_bytes(s->model->weights) / 1048576.0);
}

int kiln_outputs_count(const kiln_outputs *o) { return o->n; }
const char *kiln_outputs_name(const kiln_outputs *o, int i) { return i >= 0 && i < o->n ? o->names[i] : NULL; }
const kiln_tensor *kiln_outputs_get(const kiln_outputs *o, int i) { return i >= 0 && i < o->n ? o->tensors[i] : NULL; }

kiln_tensor *kiln_outputs_take(kiln_outputs *o, int i)
{
    if (i < 0 || i >= o->n) return NULL;
    kiln_tensor *t = o->tensors[i];
    o->tensors[i] = NULL;
    return t;
}

void kiln_outputs_free(kiln_outputs *o)
{
    if (!o) return;
    if (o->tensors)
        for (int i = 0; i < o->n; i++) kiln_tensor_free(o->tensors[i]);
    free(o->tensors);
    free(o->names);
    free(o);
}

/* Stand-ins until the optimizer lands. */
__attribute__((weak)) kiln_status kiln_optimize(struct kiln_graph *g, const struct kiln_opt_options *o,
                                                struct kiln_opt_log *log)
{
    (void)g, (void)o, (void)log;
    return KILN_OK;
}
__attribute__((weak)) void kiln_opt_log_print(const struct kiln_opt_log *log,
                                              void (*line)(void *ctx, const char *s), void *ctx)
{
    (void)log;
    line(ctx, "no passes");
}

/* ---- per-node precision (kiln.h, `kiln compile --precision auto`) ---- */

/* The graph a session's plans are compiled from. */
static const struct kiln_graph *session_graph(const kiln_session *s)
{
    return s->opts.optimize && s->sig->opt_graph ? s->sig->opt_graph : s->sig->graph;
}

static const struct kiln_node *session_find_node(const kiln_session *s, const char *name)
{
    const struct kiln_graph *g = session_graph(s);
    if (!name || !name[0]) return NULL;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].name && !strcmp(g->nodes[i].name, name)) return &g->nodes[i];
    return NULL;
}

kiln_status kiln_session_set_node_precision(kiln_session *s, const kiln_node_precision *nodes,
                                            int n)
{
    if (!s || n < 0 || (n > 0 && !nodes))
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_set_node_precision: bad argument");
    if (s->opts.reference)
        return kiln_error(KILN_ERR_UNSUPPORTED,
                          "per-node precision needs plans; the session uses the reference executor");
    for (int i = 0; i < n; i++) {
        if (nodes[i].precision < KILN_PRECISION_FP32 || nodes[i].precision > KILN_PRECISION_INT8)
            return kiln_error(KILN_ERR_INVALID_ARGUMENT, "node '%s': precision %d is not fp32, "
                              "bf16 or int8", nodes[i].node ? nodes[i].node : "(null)",
                              (int)nodes[i].precision);
        if (!session_find_node(s, nodes[i].node))
            return kiln_error(KILN_ERR_NOT_FOUND, "node '%s' is not in the session's graph",
                              nodes[i].node ? nodes[i].node : "(null)");
    }
    session_node_prec_clear(s);
    if (n == 0) return KILN_OK;
    struct kiln_plan_node_prec *ov = calloc((size_t)n, sizeof *ov);
    if (!ov) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    s->node_prec = ov;
    for (int i = 0; i < n; i++) {
        ov[i].precision = (int)nodes[i].precision;
        if (!(ov[i].node = strdup(nodes[i].node))) goto oom;
        s->n_node_prec = i + 1;
    }
    for (int k = 0; k < 2; k++) {
        kiln_status st = kiln_plan_cache_new(16, &s->own_plans[k]);
        if (st != KILN_OK) goto fail;
        kiln_plan_cache_set_precision(s->own_plans[k], s->opts.precision);
        st = kiln_plan_cache_set_node_precisions(s->own_plans[k], ov, n);
        if (st != KILN_OK) goto fail;
    }
    return KILN_OK;
oom:
    session_node_prec_clear(s);
    return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
fail:
    session_node_prec_clear(s);
    return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
}

kiln_precision kiln_session_node_precision(const kiln_session *s, const char *node)
{
    if (node)
        for (int i = 0; i < s->n_node_prec; i++)
            if (!strcmp(s->node_prec[i].node, node)) return (kiln_precision)s->node_prec[i].precision;
    return (kiln_precision)s->opts.precision;
}

int64_t kiln_session_node_weight_elems(const kiln_session *s, const char *node)
{
    const struct kiln_node *n = session_find_node(s, node);
    if (!n) return -1;
    if (n->n_in < 2 || n->in[1] < 0) return 0;
    const struct kiln_value *v = &session_graph(s)->values[n->in[1]];
    if (v->kind != KILN_VALUE_CONST || !v->konst) return 0;
    kiln_dtype dt = v->konst->dtype;
    if (dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16 && dt != KILN_DTYPE_BF16 && dt != KILN_DTYPE_F64)
        return 0;
    return kiln_tensor_count(v->konst);
}
