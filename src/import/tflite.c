/*
 * tflite.c - the TFLite model reader and importer entry point.
 *
 * tfl_read walks a .tflite FlatBuffer with the checked reader (flatbuf.c)
 * and fills the structs of tflite.h; every table and field it touches is
 * named in its errors and every index (operator code, buffer, tensor,
 * subgraph) is checked against what it indexes. The field ids below are
 * the positions of the fields in TFLite's schema.fbs (a union takes two:
 * its type byte, then its value). kiln_tflite_load then builds one Kiln
 * graph per subgraph a signature runs (tflite_lower.c) and the signatures:
 * the model's SignatureDefs under their keys and TF Serving's tensor
 * aliases, or, for a file without SignatureDefs, one "serving_default" over
 * subgraph 0's inputs and outputs named by their tensor names.
 */
#include "import/tflite.h"

#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"

/* Limits on what a file may declare (far above any real model). */
#define TFL_MAX_COUNT (1 << 22)   /* tensors, operators, buffers, ... per vector */
#define TFL_MAX_OP_IO 1024        /* inputs or outputs of one operator */

/* schema.fbs field ids */
enum { MODEL_VERSION = 0, MODEL_OPCODES = 1, MODEL_SUBGRAPHS = 2, MODEL_DESCRIPTION = 3,
       MODEL_BUFFERS = 4, MODEL_SIGNATURE_DEFS = 7 };
enum { OPCODE_DEPRECATED_BUILTIN = 0, OPCODE_CUSTOM = 1, OPCODE_VERSION = 2, OPCODE_BUILTIN = 3 };
enum { SG_TENSORS = 0, SG_INPUTS = 1, SG_OUTPUTS = 2, SG_OPERATORS = 3, SG_NAME = 4 };
enum { T_SHAPE = 0, T_TYPE = 1, T_BUFFER = 2, T_NAME = 3, T_QUANT = 4, T_IS_VARIABLE = 5,
       T_SPARSITY = 6, T_SHAPE_SIGNATURE = 7 };
enum { Q_SCALE = 2, Q_ZERO_POINT = 3, Q_DETAILS_TYPE = 4, Q_DIM = 6 };
enum { OP_OPCODE = 0, OP_INPUTS = 1, OP_OUTPUTS = 2, OP_OPTIONS_TYPE = 3, OP_OPTIONS = 4,
       OP_INTERMEDIATES = 8, OP_OPTIONS2_TYPE = 11 };
enum { BUF_DATA = 0, BUF_OFFSET = 1, BUF_SIZE = 2 };
enum { TMAP_NAME = 0, TMAP_INDEX = 1 };
enum { SIG_INPUTS = 0, SIG_OUTPUTS = 1, SIG_KEY = 2, SIG_SUBGRAPH = 4 };

#define TRY(x)                                  \
    do {                                        \
        kiln_status st_ = (x);                  \
        if (st_ != KILN_OK) return st_;         \
    } while (0)

static kiln_status oom(void) { return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory"); }

/* A what-string for messages, kept in the arena. */
static const char *whatf(struct kiln_arena *a, const char *fmt, int i, int j)
{
    char buf[96];
    snprintf(buf, sizeof buf, fmt, i, j);
    const char *s = kiln_arena_strdup(a, buf);
    return s ? s : "TFLite table";
}

static kiln_status str_field(struct kiln_arena *a, const struct kiln_fb_table *t, int id,
                             const char *name, const char **out)
{
    const char *s;
    size_t len;
    TRY(kiln_fb_str(t, id, name, &s, &len));
    *out = NULL;
    if (!s) return KILN_OK;
    char *c = kiln_arena_strndup(a, s, len);
    if (!c) return oom();
    *out = c;
    return KILN_OK;
}

static kiln_status count_ok(const struct kiln_fb_table *t, const char *name, uint32_t n)
{
    if (n > TFL_MAX_COUNT)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field '%s' lists %u entries, more than "
                          "Kiln's limit of %d", t->what, name, n, TFL_MAX_COUNT);
    return KILN_OK;
}

/* An [int] field as int32s in the arena, each index checked against lim
 * (-1 allowed when opt). */
static kiln_status index_vec(struct kiln_arena *a, const struct kiln_fb_table *t, int id,
                             const char *name, int32_t lim, bool opt, int max, int *n_out,
                             int32_t **out)
{
    struct kiln_fb_vec v;
    TRY(kiln_fb_vec_field(t, id, name, 4, &v));
    if (v.n > (uint32_t)max)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field '%s' lists %u entries, more than "
                          "Kiln's limit of %d", t->what, name, v.n, max);
    int32_t *p = kiln_arena_alloc(a, sizeof(int32_t) * ((size_t)v.n + 1));
    if (!p) return oom();
    for (uint32_t i = 0; i < v.n; i++) {
        p[i] = kiln_fb_vec_i32(&v, i);
        if ((p[i] < 0 && !(opt && p[i] == -1)) || p[i] >= lim)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "%s: field '%s' entry %u is tensor %d; the subgraph has %d tensors",
                              t->what, name, i, (int)p[i], (int)lim);
    }
    *n_out = (int)v.n;
    *out = p;
    return KILN_OK;
}

static kiln_dtype map_type(int code)
{
    switch (code) {
    case TFL_T_FLOAT32: return KILN_DTYPE_F32;
    case TFL_T_FLOAT16: return KILN_DTYPE_F16;
    case TFL_T_INT32: return KILN_DTYPE_I32;
    case TFL_T_UINT8: return KILN_DTYPE_U8;
    case TFL_T_INT64: return KILN_DTYPE_I64;
    case TFL_T_STRING: return KILN_DTYPE_STRING;
    case TFL_T_BOOL: return KILN_DTYPE_BOOL;
    case TFL_T_INT16: return KILN_DTYPE_I16;
    case TFL_T_INT8: return KILN_DTYPE_I8;
    case TFL_T_FLOAT64: return KILN_DTYPE_F64;
    case 12: return KILN_DTYPE_U64;
    case 15: return KILN_DTYPE_U32;
    case 16: return KILN_DTYPE_U16;
    default: return KILN_DTYPE_UNDEFINED;
    }
}

static kiln_status read_dims(const struct kiln_fb_table *t, int id, const char *name, int *rank,
                             int64_t *dims, bool sig)
{
    struct kiln_fb_vec v;
    TRY(kiln_fb_vec_field(t, id, name, 4, &v));
    if (v.n > KILN_MAX_RANK)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: field '%s' has rank %u; Kiln's limit is %d",
                          t->what, name, v.n, KILN_MAX_RANK);
    for (uint32_t i = 0; i < v.n; i++) {
        int32_t d = kiln_fb_vec_i32(&v, i);
        if (d < (sig ? -1 : 0))
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: field '%s' dim %u is %d", t->what,
                              name, i, (int)d);
        dims[i] = d;
    }
    *rank = (int)v.n;
    return KILN_OK;
}

static kiln_status read_tensor(struct kiln_arena *a, const struct kiln_fb_table *t,
                               int n_buffers, struct tfl_tensor *out)
{
    TRY(str_field(a, t, T_NAME, "name", &out->name));
    if (!out->name) out->name = "";
    TRY(read_dims(t, T_SHAPE, "shape", &out->rank, out->shape, false));
    int8_t type;
    TRY(kiln_fb_i8(t, T_TYPE, "type", 0, &type));
    out->type = type;
    out->dtype = map_type(type);
    TRY(kiln_fb_u32(t, T_BUFFER, "buffer", 0, &out->buffer));
    if (out->buffer >= (uint32_t)n_buffers && out->buffer != 0)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s ('%s'): buffer %u; the model has %d buffers",
                          t->what, out->name, out->buffer, n_buffers);
    uint8_t var;
    TRY(kiln_fb_u8(t, T_IS_VARIABLE, "is_variable", 0, &var));
    out->is_variable = var != 0;
    if (kiln_fb_has(t, T_SPARSITY))
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s ('%s'): sparse tensors are not supported",
                          t->what, out->name);
    if (kiln_fb_has(t, T_SHAPE_SIGNATURE)) {
        int r;
        TRY(read_dims(t, T_SHAPE_SIGNATURE, "shape_signature", &r, out->signature, true));
        if (r == out->rank) out->has_signature = true;
    }
    struct kiln_fb_table q;
    bool has_q;
    TRY(kiln_fb_table_field(t, T_QUANT, "quantization", "QuantizationParameters", &q, &has_q));
    if (has_q) {
        uint8_t details;
        TRY(kiln_fb_u8(&q, Q_DETAILS_TYPE, "details_type", 0, &details));
        if (details)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s ('%s'): custom quantization is not "
                              "supported", t->what, out->name);
        struct kiln_fb_vec sv, zv;
        TRY(kiln_fb_vec_field(&q, Q_SCALE, "scale", 4, &sv));
        TRY(kiln_fb_vec_field(&q, Q_ZERO_POINT, "zero_point", 8, &zv));
        TRY(kiln_fb_i32(&q, Q_DIM, "quantized_dimension", 0, &out->q_dim));
        if (sv.n) {
            if (zv.n != sv.n && zv.n > 1)
                return kiln_error(KILN_ERR_INVALID_MODEL, "%s ('%s'): %u scales but %u zero "
                                  "points", t->what, out->name, sv.n, zv.n);
            TRY(count_ok(&q, "scale", sv.n));
            out->n_q = (int)sv.n;
            out->scale = kiln_arena_alloc(a, sizeof(float) * sv.n);
            out->zero_point = kiln_arena_alloc(a, sizeof(int64_t) * sv.n);
            if (!out->scale || !out->zero_point) return oom();
            for (uint32_t i = 0; i < sv.n; i++) {
                out->scale[i] = kiln_fb_vec_f32(&sv, i);
                out->zero_point[i] = zv.n ? kiln_fb_vec_i64(&zv, zv.n == 1 ? 0 : i) : 0;
            }
        }
    }
    return KILN_OK;
}

static kiln_status read_subgraph(struct kiln_arena *a, const struct tfl_model *m, int si,
                                 const struct kiln_fb_table *t, struct tfl_subgraph *out)
{
    TRY(str_field(a, t, SG_NAME, "name", &out->name));
    if (!out->name) out->name = "";
    struct kiln_fb_vec tv;
    TRY(kiln_fb_vec_field(t, SG_TENSORS, "tensors", 4, &tv));
    TRY(count_ok(t, "tensors", tv.n));
    out->n_tensors = (int)tv.n;
    out->tensors = kiln_arena_alloc(a, sizeof *out->tensors * ((size_t)tv.n + 1));
    if (!out->tensors) return oom();
    for (uint32_t i = 0; i < tv.n; i++) {
        struct kiln_fb_table tt;
        TRY(kiln_fb_vec_table(&tv, i, whatf(a, "Tensor %d of subgraph %d", (int)i, si), &tt));
        TRY(read_tensor(a, &tt, m->n_buffers, &out->tensors[i]));
        if (!out->tensors[i].name[0]) { /* unnamed (stripped models): tensor_<index> */
            char nm[32];
            snprintf(nm, sizeof nm, "tensor_%u", i);
            out->tensors[i].name = kiln_arena_strdup(a, nm);
            if (!out->tensors[i].name) return oom();
        }
    }
    TRY(index_vec(a, t, SG_INPUTS, "inputs", out->n_tensors, false, TFL_MAX_OP_IO, &out->n_in,
                  &out->in));
    TRY(index_vec(a, t, SG_OUTPUTS, "outputs", out->n_tensors, false, TFL_MAX_OP_IO,
                  &out->n_out, &out->out));
    struct kiln_fb_vec ov;
    TRY(kiln_fb_vec_field(t, SG_OPERATORS, "operators", 4, &ov));
    TRY(count_ok(t, "operators", ov.n));
    out->n_ops = (int)ov.n;
    out->ops = kiln_arena_alloc(a, sizeof *out->ops * ((size_t)ov.n + 1));
    if (!out->ops) return oom();
    for (uint32_t i = 0; i < ov.n; i++) {
        struct kiln_fb_table ot;
        struct tfl_op *op = &out->ops[i];
        TRY(kiln_fb_vec_table(&ov, i, whatf(a, "Operator %d of subgraph %d", (int)i, si), &ot));
        TRY(kiln_fb_u32(&ot, OP_OPCODE, "opcode_index", 0, &op->opcode));
        if (op->opcode >= (uint32_t)m->n_codes)
            return kiln_error(KILN_ERR_INVALID_MODEL,
                              "%s: opcode_index %u; the model has %d operator codes", ot.what,
                              op->opcode, m->n_codes);
        TRY(index_vec(a, &ot, OP_INPUTS, "inputs", out->n_tensors, true, TFL_MAX_OP_IO,
                      &op->n_in, &op->in));
        TRY(index_vec(a, &ot, OP_OUTPUTS, "outputs", out->n_tensors, false, TFL_MAX_OP_IO,
                      &op->n_out, &op->out));
        TRY(index_vec(a, &ot, OP_INTERMEDIATES, "intermediates", out->n_tensors, false,
                      TFL_MAX_OP_IO, &op->n_inter, &op->inter));
        TRY(kiln_fb_u8(&ot, OP_OPTIONS_TYPE, "builtin_options_type", 0, &op->opt_type));
        const char *ow = whatf(a, "Options of operator %d of subgraph %d", (int)i, si);
        TRY(kiln_fb_table_field(&ot, OP_OPTIONS, "builtin_options", ow, &op->opts, &op->has_opts));
        uint8_t t2;
        TRY(kiln_fb_u8(&ot, OP_OPTIONS2_TYPE, "builtin_options_2_type", 0, &t2));
        if (t2)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: builtin_options_2 (StableHLO options, "
                              "type %u) are not supported", ot.what, t2);
    }
    return KILN_OK;
}

static kiln_status read_sigdef(struct kiln_arena *a, const struct tfl_model *m,
                               const struct kiln_fb_table *t, struct tfl_sigdef *out)
{
    TRY(str_field(a, t, SIG_KEY, "signature_key", &out->key));
    if (!out->key || !out->key[0])
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: no signature_key", t->what);
    TRY(kiln_fb_u32(t, SIG_SUBGRAPH, "subgraph_index", 0, &out->subgraph));
    if (out->subgraph >= (uint32_t)m->n_subgraphs)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s ('%s'): subgraph_index %u; the model has "
                          "%d subgraphs", t->what, out->key, out->subgraph, m->n_subgraphs);
    const struct tfl_subgraph *sg = &m->subgraphs[out->subgraph];
    for (int io = 0; io < 2; io++) {
        const char *fname = io ? "outputs" : "inputs";
        struct kiln_fb_vec v;
        TRY(kiln_fb_vec_field(t, io ? SIG_OUTPUTS : SIG_INPUTS, fname, 4, &v));
        if (v.n > TFL_MAX_OP_IO)
            return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %u %s", t->what, v.n, fname);
        const char **names = kiln_arena_alloc(a, sizeof(char *) * ((size_t)v.n + 1));
        uint32_t *idx = kiln_arena_alloc(a, sizeof(uint32_t) * ((size_t)v.n + 1));
        if (!names || !idx) return oom();
        for (uint32_t i = 0; i < v.n; i++) {
            struct kiln_fb_table mt;
            TRY(kiln_fb_vec_table(&v, i, "TensorMap", &mt));
            TRY(str_field(a, &mt, TMAP_NAME, "name", &names[i]));
            TRY(kiln_fb_u32(&mt, TMAP_INDEX, "tensor_index", 0, &idx[i]));
            if (!names[i] || !names[i][0])
                return kiln_error(KILN_ERR_INVALID_MODEL, "%s ('%s'): %s entry %u has no name",
                                  t->what, out->key, fname, i);
            if (idx[i] >= (uint32_t)sg->n_tensors)
                return kiln_error(KILN_ERR_INVALID_MODEL, "%s ('%s'): %s '%s' is tensor %u; "
                                  "subgraph %u has %d tensors", t->what, out->key, fname,
                                  names[i], idx[i], out->subgraph, sg->n_tensors);
        }
        if (io) {
            out->n_out = (int)v.n, out->out_names = names, out->out_idx = idx;
        } else {
            out->n_in = (int)v.n, out->in_names = names, out->in_idx = idx;
        }
    }
    return KILN_OK;
}

kiln_status tfl_read(const void *data, size_t size, struct kiln_arena *a, struct tfl_model *m)
{
    memset(m, 0, sizeof *m);
    m->fb = (struct kiln_fb){data, size};
    struct kiln_fb_table root;
    TRY(kiln_fb_root(&m->fb, "TFL3", "TFLite Model", &root));
    TRY(kiln_fb_u32(&root, MODEL_VERSION, "version", 0, &m->version));
    if (m->version != 3)
        return kiln_error(KILN_ERR_UNSUPPORTED, "TFLite Model: schema version %u; Kiln reads "
                          "version 3", m->version);
    TRY(str_field(a, &root, MODEL_DESCRIPTION, "description", &m->description));

    struct kiln_fb_vec v;
    TRY(kiln_fb_vec_field(&root, MODEL_BUFFERS, "buffers", 4, &v));
    TRY(count_ok(&root, "buffers", v.n));
    m->n_buffers = (int)v.n;
    m->buffers = kiln_arena_alloc(a, sizeof *m->buffers * ((size_t)v.n + 1));
    if (!m->buffers) return oom();
    for (uint32_t i = 0; i < v.n; i++) {
        struct kiln_fb_table bt;
        TRY(kiln_fb_vec_table(&v, i, whatf(a, "Buffer %d", (int)i, 0), &bt));
        struct kiln_fb_vec dv;
        TRY(kiln_fb_vec_field(&bt, BUF_DATA, "data", 1, &dv));
        m->buffers[i] = (struct tfl_buffer){dv.n ? m->fb.p + dv.pos : NULL, dv.n};
        uint64_t off, sz;
        TRY(kiln_fb_u64(&bt, BUF_OFFSET, "offset", 0, &off));
        TRY(kiln_fb_u64(&bt, BUF_SIZE, "size", 0, &sz));
        if (off > 1) { /* data stored after the FlatBuffer (models over 2 GiB) */
            if (off > size || sz > size - off)
                return kiln_error(KILN_ERR_INVALID_MODEL, "%s: offset %llu and size %llu lie "
                                  "outside the file (%zu bytes)", bt.what,
                                  (unsigned long long)off, (unsigned long long)sz, size);
            m->buffers[i] = (struct tfl_buffer){m->fb.p + off, (size_t)sz};
        }
    }

    TRY(kiln_fb_vec_field(&root, MODEL_OPCODES, "operator_codes", 4, &v));
    TRY(count_ok(&root, "operator_codes", v.n));
    m->n_codes = (int)v.n;
    m->codes = kiln_arena_alloc(a, sizeof *m->codes * ((size_t)v.n + 1));
    if (!m->codes) return oom();
    for (uint32_t i = 0; i < v.n; i++) {
        struct kiln_fb_table ct;
        TRY(kiln_fb_vec_table(&v, i, whatf(a, "OperatorCode %d", (int)i, 0), &ct));
        int8_t dep;
        int32_t code;
        TRY(kiln_fb_i8(&ct, OPCODE_DEPRECATED_BUILTIN, "deprecated_builtin_code", 0, &dep));
        TRY(kiln_fb_i32(&ct, OPCODE_BUILTIN, "builtin_code", 0, &code));
        /* files from before builtin_code carry only the byte; newer ones
         * write 127 (PLACEHOLDER_FOR_GREATER_OP_CODES) there for codes > 126 */
        m->codes[i].builtin = code > dep ? code : dep;
        TRY(kiln_fb_i32(&ct, OPCODE_VERSION, "version", 1, &m->codes[i].version));
        TRY(str_field(a, &ct, OPCODE_CUSTOM, "custom_code", &m->codes[i].custom));
    }

    TRY(kiln_fb_vec_field(&root, MODEL_SUBGRAPHS, "subgraphs", 4, &v));
    TRY(count_ok(&root, "subgraphs", v.n));
    if (v.n == 0) return kiln_error(KILN_ERR_INVALID_MODEL, "TFLite Model: no subgraphs");
    m->n_subgraphs = (int)v.n;
    m->subgraphs = kiln_arena_alloc(a, sizeof *m->subgraphs * ((size_t)v.n + 1));
    if (!m->subgraphs) return oom();
    for (uint32_t i = 0; i < v.n; i++) {
        struct kiln_fb_table st;
        TRY(kiln_fb_vec_table(&v, i, whatf(a, "SubGraph %d", (int)i, 0), &st));
        TRY(read_subgraph(a, m, (int)i, &st, &m->subgraphs[i]));
    }

    TRY(kiln_fb_vec_field(&root, MODEL_SIGNATURE_DEFS, "signature_defs", 4, &v));
    if (v.n > 1024)
        return kiln_error(KILN_ERR_UNSUPPORTED, "TFLite Model: %u signature_defs", v.n);
    m->n_sigs = (int)v.n;
    m->sigs = kiln_arena_alloc(a, sizeof *m->sigs * ((size_t)v.n + 1));
    if (!m->sigs) return oom();
    for (uint32_t i = 0; i < v.n; i++) {
        struct kiln_fb_table st;
        TRY(kiln_fb_vec_table(&v, i, whatf(a, "SignatureDef %d", (int)i, 0), &st));
        TRY(read_sigdef(a, m, &st, &m->sigs[i]));
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(m->sigs[j].key, m->sigs[i].key) == 0)
                return kiln_error(KILN_ERR_INVALID_MODEL, "TFLite Model: signature '%s' is "
                                  "defined twice", m->sigs[i].key);
    }
    return KILN_OK;
}

bool kiln_tflite_detect(const void *data, size_t size)
{
    return size >= 8 && memcmp((const char *)data + 4, "TFL3", 4) == 0;
}

/* ---- the importer ---- */

/* What the model keeps beyond m->graph: the root graphs of subgraphs other
 * than the default signature's. */
struct tfl_state {
    int n;
    struct kiln_graph **graphs;
};

static void state_free(void *p)
{
    struct tfl_state *s = p;
    for (int i = 0; i < s->n; i++) kiln_graph_free(s->graphs[i]);
    free(s->graphs);
    free(s);
}

/* Fill signature sig over graph g (built from subgraph sgi): inputs and
 * outputs either from a SignatureDef (sd) or from the subgraph. */
static kiln_status make_signature(struct kiln_model *m, const struct tfl_model *tm, int sgi,
                                  const struct tfl_sigdef *sd, struct kiln_graph *g,
                                  struct kiln_signature *sig)
{
    struct kiln_arena *a = m->graph->mem;
    const struct tfl_subgraph *sg = &tm->subgraphs[sgi];
    sig->name = sd ? sd->key : "serving_default";
    sig->method = "tensorflow/serving/predict";
    sig->graph = g;
    int ni = sd ? sd->n_in : g->n_inputs, no = sd ? sd->n_out : g->n_outputs;
    sig->n_inputs = ni;
    sig->n_outputs = no;
    sig->input_values = kiln_arena_alloc(a, sizeof(int) * ((size_t)ni + 1));
    sig->output_values = kiln_arena_alloc(a, sizeof(int) * ((size_t)no + 1));
    if (!sig->input_values || !sig->output_values) return oom();
    for (int io = 0; io < 2; io++) {
        int n = io ? no : ni;
        for (int i = 0; i < n; i++) {
            int v;
            if (!sd) {
                v = io ? g->outputs[i] : g->inputs[i];
            } else {
                /* the graph's inputs and outputs are the subgraph's, in order */
                uint32_t t = io ? sd->out_idx[i] : sd->in_idx[i];
                const int32_t *list = io ? sg->out : sg->in;
                int cnt = io ? sg->n_out : sg->n_in, k = 0;
                while (k < cnt && (uint32_t)list[k] != t) k++;
                if (k == cnt)
                    return kiln_error(KILN_ERR_INVALID_MODEL, "signature '%s': %s '%s' is "
                                      "tensor %u, which is not one of subgraph %d's %s",
                                      sd->key, io ? "output" : "input",
                                      io ? sd->out_names[i] : sd->in_names[i], t, sgi,
                                      io ? "outputs" : "inputs");
                v = io ? g->outputs[k] : g->inputs[k];
            }
            (io ? sig->output_values : sig->input_values)[i] = v;
        }
    }
    TRY(kiln_signature_describe(m, sig));
    if (sd) /* callers use the SignatureDef's names, as TF Serving shows them */
        for (int i = 0; i < ni; i++) sig->inputs[i].name = sd->in_names[i];
    if (sd)
        for (int i = 0; i < no; i++) sig->outputs[i].name = sd->out_names[i];
    return KILN_OK;
}

kiln_status kiln_tflite_load(const void *data, size_t size, struct kiln_model *m)
{
    struct tfl_state *state = calloc(1, sizeof *state);
    if (!state) return oom();
    m->proto = state;
    m->proto_free = state_free;
    m->format = "tflite";
    kiln_status st = kiln_graph_new(&m->graph);
    if (st != KILN_OK) return st;
    struct tfl_model tm;
    st = tfl_read(data, size, m->graph->mem, &tm);
    if (st != KILN_OK) return st;

    /* signatures: the SignatureDefs, or one over subgraph 0 */
    int ns = tm.n_sigs ? tm.n_sigs : 1;
    m->signatures = kiln_arena_alloc(m->graph->mem, sizeof *m->signatures * (size_t)ns);
    state->graphs = calloc((size_t)tm.n_subgraphs, sizeof *state->graphs);
    struct kiln_graph **built = calloc((size_t)tm.n_subgraphs, sizeof *built);
    if (!m->signatures || !state->graphs || !built) {
        free(built);
        return oom();
    }
    int dflt = 0;
    for (int i = 0; i < tm.n_sigs; i++)
        if (strcmp(tm.sigs[i].key, "serving_default") == 0) dflt = i;
    m->default_signature = dflt;
    /* the default signature's subgraph is lowered into m->graph */
    int dsg = tm.n_sigs ? (int)tm.sigs[dflt].subgraph : 0;
    st = tfl_lower_subgraph(&tm, dsg, m->graph);
    if (st == KILN_OK) built[dsg] = m->graph;
    for (int i = 0; i < ns && st == KILN_OK; i++) {
        const struct tfl_sigdef *sd = tm.n_sigs ? &tm.sigs[i] : NULL;
        int sgi = sd ? (int)sd->subgraph : 0;
        if (!built[sgi]) {
            struct kiln_graph *g;
            if ((st = kiln_graph_new(&g)) != KILN_OK) break;
            state->graphs[state->n++] = g;
            if ((st = tfl_lower_subgraph(&tm, sgi, g)) != KILN_OK) break;
            built[sgi] = g;
        }
        st = make_signature(m, &tm, sgi, sd, built[sgi], &m->signatures[i]);
        if (st != KILN_OK && sd) kiln_error_wrap(st, "signature '%s'", sd->key);
    }
    free(built);
    if (st != KILN_OK) return st;
    m->n_signatures = ns;
    m->stats.producer = tm.description ? tm.description : "";
    return kiln_model_finish(m);
}
