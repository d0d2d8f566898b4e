/*
 * artifact.c - kiln_session_save: the writer of compiled artifacts (.kiln
 * files, docs/KILN_FORMAT.md; the reader is src/import/kiln_artifact.c).
 *
 * It writes the graph a session runs (the optimized graph, as the optimizer
 * left it, blocked layouts included), the session's signature, precision and
 * the CPU features its kernels need, the batch sizes to precompile at load,
 * the compile report verbatim, and every constant tensor once (shared
 * tensors are written once) at a 64-byte aligned offset of the weight
 * section, so that the reader can use them in place from the mapped file.
 * Each section is built in memory, then the file is written to a temporary
 * name beside the target and renamed over it, so a reader never sees half
 * a file.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/internal.h"
#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "import/kiln_artifact.h"
#include "import/model.h"
#include "exec/plan.h"
#include "kernels/fast.h"

#define ALIGN64(x) (((x) + 63) / 64 * 64)

struct wbuf {
    uint8_t *p;
    size_t n, cap;
    int oom;
};

static void put(struct wbuf *b, const void *src, size_t k)
{
    if (b->oom) return;
    if (b->n + k > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + k) cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    if (k) memcpy(b->p + b->n, src, k);
    b->n += k;
}

static void put_u8(struct wbuf *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(struct wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_i32(struct wbuf *b, int32_t v) { put(b, &v, 4); }
static void put_i64(struct wbuf *b, int64_t v) { put(b, &v, 8); }
static void put_f32(struct wbuf *b, float v) { put(b, &v, 4); }

static void put_str(struct wbuf *b, const char *s)
{
    if (!s) {
        put_u32(b, KILN_ART_NULL_STR);
        return;
    }
    size_t n = strlen(s);
    put_u32(b, (uint32_t)n);
    put(b, s, n);
}

static void put_bytes(struct wbuf *b, const kiln_string *s)
{
    put_u32(b, (uint32_t)s->len);
    put(b, s->data, s->len);
}

/* Tensors already in the weight section (one entry per distinct tensor). */
struct wlist {
    const kiln_tensor **t;
    int64_t *off;
    uint8_t *bf16;         /* stored as bfloat16 */
    int n, cap;
};

struct writer {
    struct wbuf meta, sign, grph, wght, pack;
    int n_packs;
    struct wlist w;
    kiln_status st;
    const struct kiln_graph *root;
    uint8_t *as_bf16;      /* per root value: a weight the bf16 session rounds to bfloat16 */
};

/* f32 -> bf16, rounding to nearest even (what the bf16 kernels do when they
 * pack a weight: rounding a bf16 value again gives the same bits). */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static int is_bf16_product(const struct kiln_node *n)
{
    switch (n->op) {
    case KILN_OP_MatMul:
    case KILN_OP_Conv:
    case KILN_OP_KilnFusedConv:
        return 1;
    case KILN_OP_Gemm:
    case KILN_OP_KilnFusedMatMul: {
        const struct kiln_attr *a = kiln_node_attr(n, "alpha");
        return !a || (a->type == KILN_ATTR_FLOAT && a->f == 1.0f); /* alpha is folded into B */
    }
    default:
        return 0;
    }
}

/* The weights a bf16 session packs as bfloat16: f32 constants of the root
 * graph read only as the weight (input 1) of a MatMul, Gemm or convolution
 * (alpha 1), so that widening the stored bf16 and packing it again gives
 * the kernels the same bits. Any other reader keeps a weight f32. */
static kiln_status mark_bf16_weights(struct writer *w, const struct kiln_graph *g)
{
    w->as_bf16 = calloc((size_t)g->n_values + 1, 1);
    uint8_t *other = calloc((size_t)g->n_values + 1, 1);
    if (!w->as_bf16 || !other) {
        free(other);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v < 0) continue;
            const struct kiln_attr *pa = kiln_node_attr(n, KILN_NODE_PRECISION_ATTR);
            int own = pa && pa->type == KILN_ATTR_INT && pa->i != KILN_PRECISION_BF16;
            if (k == 1 && is_bf16_product(n) && !own) w->as_bf16[v] = 1; /* not an fp32/int8 exception */
            else other[v] = 1;
        }
        for (int k = 0; k < n->n_implicit; k++) other[n->implicit[k]] = 1;
    }
    for (int k = 0; k < g->n_outputs; k++) other[g->outputs[k]] = 1;
    for (int v = 0; v < g->n_values; v++) {
        const struct kiln_value *val = &g->values[v];
        if (other[v] || val->kind != KILN_VALUE_CONST || !val->konst ||
            val->konst->dtype != KILN_DTYPE_F32)
            w->as_bf16[v] = 0;
    }
    free(other);
    return KILN_OK;
}

static void wfail(struct writer *w, kiln_status st, const char *msg)
{
    if (w->st == KILN_OK) w->st = kiln_error(st, "kiln_session_save: %s", msg);
}

static void put_tensor(struct writer *w, struct wbuf *b, const kiln_tensor *t, int bf16)
{
    put_i32(b, (int32_t)t->dtype);
    put_i32(b, t->rank);
    for (int i = 0; i < t->rank; i++) put_i64(b, t->dims[i]);
    if (t->dtype == KILN_DTYPE_STRING) {
        int64_t n = kiln_tensor_count(t);
        const kiln_string *s = t->data;
        for (int64_t i = 0; i < n; i++) put_bytes(b, &s[i]);
        return;
    }
    if (t->nbytes && !t->data) {
        wfail(w, KILN_ERR_INTERNAL, "a constant's data is not resident");
        return;
    }
    int64_t off = -1;
    for (int i = 0; i < w->w.n && off < 0; i++)
        if (w->w.t[i] == t && w->w.bf16[i] == bf16) off = w->w.off[i];
    if (off < 0) {
        if (w->w.n == w->w.cap) {
            int cap = w->w.cap ? w->w.cap * 2 : 256;
            const kiln_tensor **nt = realloc(w->w.t, (size_t)cap * sizeof *nt);
            if (nt) w->w.t = nt;
            int64_t *no = realloc(w->w.off, (size_t)cap * sizeof *no);
            if (no) w->w.off = no;
            uint8_t *nb = realloc(w->w.bf16, (size_t)cap);
            if (nb) w->w.bf16 = nb;
            if (!nt || !no || !nb) {
                wfail(w, KILN_ERR_OUT_OF_MEMORY, "out of memory");
                return;
            }
            w->w.cap = cap;
        }
        static const uint8_t zeros[64];
        put(&w->wght, zeros, ALIGN64(w->wght.n) - w->wght.n);
        off = (int64_t)w->wght.n;
        if (bf16) {
            const float *f = t->data;
            for (int64_t i = 0; i < kiln_tensor_count(t); i++) {
                uint16_t h = f32_to_bf16(f[i]);
                put(&w->wght, &h, 2);
            }
        } else {
            put(&w->wght, t->data, t->nbytes);
        }
        w->w.t[w->w.n] = t;
        w->w.bf16[w->w.n] = (uint8_t)bf16;
        w->w.off[w->w.n++] = off;
    }
    put_i32(b, (int32_t)(bf16 ? KILN_DTYPE_BF16 : t->dtype)); /* stored dtype */
    put_i64(b, off);
    put_i64(b, bf16 ? (int64_t)kiln_tensor_count(t) * 2 : (int64_t)t->nbytes);
}

static void put_type(struct wbuf *b, const struct kiln_type *t)
{
    put_i32(b, (int32_t)t->dtype);
    put_i32(b, t->rank);
    for (int i = 0; i < t->rank && i < KILN_MAX_RANK; i++) {
        put_i64(b, t->dims[i]);
        put_str(b, t->sym[i]);
    }
}

static void put_graph(struct writer *w, struct wbuf *b, const struct kiln_graph *g);

static int attr_valid(const struct kiln_attr *a)
{
    return a->type >= KILN_ATTR_FLOAT && a->type <= KILN_ATTR_STRINGS &&
           (a->type != KILN_ATTR_TENSOR || a->t) && (a->type != KILN_ATTR_GRAPH || a->g);
}

static void put_attr(struct writer *w, struct wbuf *b, const struct kiln_attr *a)
{
    put_str(b, a->name ? a->name : "");
    put_u8(b, (uint8_t)a->type);
    switch (a->type) {
    case KILN_ATTR_FLOAT: put_f32(b, a->f); break;
    case KILN_ATTR_INT: put_i64(b, a->i); break;
    case KILN_ATTR_STRING: put_bytes(b, &a->s); break;
    case KILN_ATTR_TENSOR: put_tensor(w, b, a->t, 0); break;
    case KILN_ATTR_GRAPH: put_graph(w, b, a->g); break;
    case KILN_ATTR_FLOATS:
        put_u32(b, (uint32_t)a->n);
        for (int i = 0; i < a->n; i++) put_f32(b, a->floats[i]);
        break;
    case KILN_ATTR_INTS:
        put_u32(b, (uint32_t)a->n);
        for (int i = 0; i < a->n; i++) put_i64(b, a->ints[i]);
        break;
    case KILN_ATTR_STRINGS:
        put_u32(b, (uint32_t)a->n);
        for (int i = 0; i < a->n; i++) put_bytes(b, &a->strings[i]);
        break;
    }
}

static void put_graph(struct writer *w, struct wbuf *b, const struct kiln_graph *g)
{
    put_str(b, g->name ? g->name : "");
    put_u32(b, (uint32_t)g->n_values);
    for (int v = 0; v < g->n_values; v++) {
        const struct kiln_value *val = &g->values[v];
        put_str(b, val->name ? val->name : "");
        put_u8(b, (uint8_t)val->kind);
        put_type(b, &val->type);
        put_i32(b, val->kind == KILN_VALUE_OUTER ? val->outer : -1);
        put_i32(b, val->layout);
        if (val->kind == KILN_VALUE_CONST) {
            if (!val->konst) {
                wfail(w, KILN_ERR_INTERNAL, "a constant value has no tensor");
                return;
            }
            put_tensor(w, b, val->konst, g == w->root && w->as_bf16 && w->as_bf16[v]);
        }
    }
    put_u32(b, (uint32_t)g->n_nodes);
    for (int i = 0; i < g->n_nodes; i++) {
        const struct kiln_node *n = &g->nodes[i];
        put_str(b, kiln_op_name(n->op));
        put_str(b, n->op_type ? n->op_type : kiln_op_name(n->op));
        put_str(b, n->name ? n->name : "");
        put_i32(b, n->opset);
        put_u32(b, (uint32_t)n->n_in);
        for (int k = 0; k < n->n_in; k++) put_i32(b, n->in[k]);
        put_u32(b, (uint32_t)n->n_out);
        for (int k = 0; k < n->n_out; k++) put_i32(b, n->out[k]);
        int na = 0;
        for (int k = 0; k < n->n_attr; k++) na += attr_valid(&n->attr[k]);
        put_u32(b, (uint32_t)na);
        for (int k = 0; k < n->n_attr; k++)
            if (attr_valid(&n->attr[k])) put_attr(w, b, &n->attr[k]);
    }
    put_u32(b, (uint32_t)g->n_inputs);
    for (int i = 0; i < g->n_inputs; i++) put_i32(b, g->inputs[i]);
    put_u32(b, (uint32_t)g->n_outputs);
    for (int i = 0; i < g->n_outputs; i++) put_i32(b, g->outputs[i]);
}

/* One packed weight of the weight cache: kept when it packs a constant of the
 * saved graph by a plain oneDNN reorder (tags "dnnl_..."; int8 packs carry
 * their scales in the buffer and are made again at load). */
static void put_pack(void *ctx, const void *key, const char *tag, const void *packed, size_t bytes)
{
    struct writer *w = ctx;
    if (strncmp(tag, "dnnl_", 5) || strstr(tag, "_s8_") || !bytes) return;
    const struct kiln_graph *g = w->root;
    int v = -1;
    for (int i = 0; i < g->n_values && v < 0; i++)
        if (g->values[i].kind == KILN_VALUE_CONST && g->values[i].konst == key) v = i;
    if (v < 0) return;
    static const uint8_t zeros[64];
    put(&w->wght, zeros, ALIGN64(w->wght.n) - w->wght.n);
    int64_t off = (int64_t)w->wght.n;
    put(&w->wght, packed, bytes);
    put_i32(&w->pack, v);
    put_str(&w->pack, tag);
    put_i64(&w->pack, off);
    put_i64(&w->pack, (int64_t)bytes);
    w->n_packs++;
}

static void put_value_info(struct wbuf *b, const kiln_value_info *vi, int id)
{
    put_str(b, vi->name ? vi->name : "");
    put_i32(b, (int32_t)vi->dtype);
    put_i32(b, vi->rank);
    for (int i = 0; i < vi->rank && i < KILN_MAX_RANK; i++) {
        put_i64(b, vi->dims[i]);
        put_str(b, vi->dim_names[i]);
    }
    put_i32(b, id);
}

/* Write the sections as one file: header, table, sections at 64-byte offsets. */
static kiln_status write_file(const char *path, struct wbuf **secs, const uint32_t *kinds, int n)
{
    uint8_t table[KILN_ART_MAX_SECTIONS * 32];
    uint64_t offs[KILN_ART_MAX_SECTIONS];
    uint64_t off = ALIGN64(KILN_ART_HEADER_BYTES + 32 * (uint64_t)n);
    memset(table, 0, sizeof table);
    for (int i = 0; i < n; i++) {
        uint32_t crc = kiln_crc32c(secs[i]->p ? secs[i]->p : (const uint8_t *)"", secs[i]->n);
        uint64_t len = secs[i]->n;
        offs[i] = off;
        memcpy(table + 32 * i, &kinds[i], 4);
        memcpy(table + 32 * i + 4, &crc, 4);
        memcpy(table + 32 * i + 8, &off, 8);
        memcpy(table + 32 * i + 16, &len, 8);
        off = ALIGN64(off + len);
    }
    uint64_t fsize = n ? offs[n - 1] + secs[n - 1]->n : off;
    uint8_t head[KILN_ART_HEADER_BYTES];
    memset(head, 0, sizeof head);
    memcpy(head, KILN_ART_MAGIC, KILN_ART_MAGIC_LEN);
    uint32_t version = KILN_ART_FORMAT_VERSION, hbytes = KILN_ART_HEADER_BYTES, nsec = (uint32_t)n;
    uint32_t tcrc = kiln_crc32c(table, 32 * (size_t)n);
    memcpy(head + 8, &version, 4);
    memcpy(head + 12, &hbytes, 4);
    memcpy(head + 16, &fsize, 8);
    memcpy(head + 24, &nsec, 4);
    memcpy(head + 28, &tcrc, 4);
    strncpy((char *)head + 32, KILN_VERSION_STRING, 16);
    uint32_t hcrc = kiln_crc32c(head, 60);
    memcpy(head + 60, &hcrc, 4);

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        kiln_status st = kiln_error(KILN_ERR_IO, "cannot write '%s'", tmp);
        free(tmp);
        return st;
    }
    static const uint8_t zeros[64];
    int ok = fwrite(head, 1, sizeof head, f) == sizeof head &&
             fwrite(table, 1, 32 * (size_t)n, f) == 32 * (size_t)n;
    uint64_t at = KILN_ART_HEADER_BYTES + 32 * (uint64_t)n;
    for (int i = 0; i < n && ok; i++) {
        size_t pad = (size_t)(offs[i] - at);
        ok = fwrite(zeros, 1, pad, f) == pad &&
             (secs[i]->n == 0 || fwrite(secs[i]->p, 1, secs[i]->n, f) == secs[i]->n);
        at = offs[i] + secs[i]->n;
    }
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        free(tmp);
        return kiln_error(KILN_ERR_IO, "cannot write '%s'", path);
    }
    free(tmp);
    return KILN_OK;
}

kiln_status kiln_session_save(kiln_session *s, const char *path, const kiln_save_options *opts)
{
    if (!s || !path) return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_save: NULL argument");
    const struct kiln_model *m;
    const struct kiln_signature *sig;
    const struct kiln_graph *g;
    int precision;
    int nb = opts && opts->batch_sizes ? opts->n_batch_sizes : 0;
    if (nb < 0 || nb > 1024)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "kiln_session_save: %d batch sizes (0..1024)",
                          nb);
    for (int i = 0; i < nb; i++)
        if (opts->batch_sizes[i] < 1 || opts->batch_sizes[i] > (1 << 24))
            return kiln_error(KILN_ERR_INVALID_ARGUMENT,
                              "kiln_session_save: batch size %lld is not 1..%d",
                              (long long)opts->batch_sizes[i], 1 << 24);
    /* the plans of the saved batch sizes pack the weights PACK keeps */
    kiln_status st = nb ? kiln_session_precompile(s, opts->batch_sizes, nb) : KILN_OK;
    if (st != KILN_OK) return st;
    st = kiln_session_artifact_view(s, &m, &sig, &g, &precision); /* pins every weight */
    if (st != KILN_OK) return st;
    struct writer w = {0};
    char cpu[128];
    kiln_artifact_cpu_features(g, precision, cpu, sizeof cpu);
    /* META */
    put_u32(&w.meta, (uint32_t)precision);
    put_str(&w.meta, cpu);
    const struct kiln_artifact_info *src_art = m->artifact;
    put_str(&w.meta, src_art ? src_art->source_format : m->format ? m->format : "");
    put_str(&w.meta, m->stats.producer ? m->stats.producer : "");
    put_i64(&w.meta, m->stats.ir_version);
    put_u32(&w.meta, (uint32_t)nb);
    for (int i = 0; i < nb; i++) put_i64(&w.meta, opts->batch_sizes[i]);
    put_u32(&w.meta, (uint32_t)m->n_opsets);
    for (int i = 0; i < m->n_opsets; i++) {
        put_str(&w.meta, m->opset_domain[i] ? m->opset_domain[i] : "");
        put_i64(&w.meta, m->opset_version[i]);
    }
    /* SIGN */
    put_str(&w.sign, sig->name);
    put_str(&w.sign, sig->method ? sig->method : "");
    put_u32(&w.sign, (uint32_t)sig->n_inputs);
    for (int i = 0; i < sig->n_inputs; i++)
        put_value_info(&w.sign, &sig->inputs[i], sig->input_values[i]);
    put_u32(&w.sign, (uint32_t)sig->n_outputs);
    for (int i = 0; i < sig->n_outputs; i++)
        put_value_info(&w.sign, &sig->outputs[i], sig->output_values[i]);
    /* GRPH and WGHT */
    w.root = g;
    if (precision == KILN_PRECISION_BF16) w.st = mark_bf16_weights(&w, g);
    if (w.st == KILN_OK) put_graph(&w, &w.grph, g);
    /* PACK: the weights as the plans of the saved batch sizes packed them */
    struct wbuf packs = {0};
    if (w.st == KILN_OK && nb > 0) {
        char env[128];
        kiln_weight_cache_pack_env(env, sizeof env);
        put_str(&packs, env);
        kiln_weight_cache_each(m->weights, put_pack, &w);
        put_u32(&packs, (uint32_t)w.n_packs);
        put(&packs, w.pack.p, w.pack.n);
    }
    struct wbuf rept = {0};
    if (opts && opts->report_json) put(&rept, opts->report_json, strlen(opts->report_json));
    if (w.st == KILN_OK && (w.meta.oom || w.sign.oom || w.grph.oom || w.wght.oom || rept.oom ||
                            w.pack.oom || packs.oom))
        wfail(&w, KILN_ERR_OUT_OF_MEMORY, "out of memory");
    if (w.st == KILN_OK) {
        struct wbuf *secs[6] = {&w.meta, &w.sign, &w.grph, &w.wght, &packs, &rept};
        uint32_t kinds[6] = {KILN_ART_SEC_META, KILN_ART_SEC_SIGN, KILN_ART_SEC_GRPH,
                             KILN_ART_SEC_WGHT, KILN_ART_SEC_PACK, KILN_ART_SEC_REPT};
        int n = 4;
        if (packs.n) n++;
        else secs[4] = &rept, kinds[4] = KILN_ART_SEC_REPT;
        if (opts && opts->report_json) secs[n] = &rept, kinds[n] = KILN_ART_SEC_REPT, n++;
        w.st = write_file(path, secs, kinds, n);
    }
    free(w.meta.p);
    free(w.sign.p);
    free(w.grph.p);
    free(w.wght.p);
    free(rept.p);
    free(packs.p);
    free(w.pack.p);
    free(w.w.t);
    free(w.w.off);
    free(w.w.bf16);
    free(w.as_bf16);
    return w.st;
}

/* ---- kiln inspect ---- */

static const char *section_title(uint32_t kind)
{
    switch (kind) {
    case KILN_ART_SEC_META: return "META (versions, precision, CPU features, batch sizes)";
    case KILN_ART_SEC_SIGN: return "SIGN (signature)";
    case KILN_ART_SEC_GRPH: return "GRPH (optimized graph)";
    case KILN_ART_SEC_WGHT: return "WGHT (weights)";
    case KILN_ART_SEC_REPT: return "REPT (compile report)";
    case KILN_ART_SEC_PACK: return "PACK (index of packed weights, bytes in WGHT)";
    }
    return "(unknown, skipped)";
}

/* The precision a kernel computes in, from its name ("dnnl_gemm_bf16"). */
static const char *kernel_precision(const char *kernel)
{
    size_t n = strlen(kernel);
    if (n >= 5 && !strcmp(kernel + n - 5, "_bf16")) return "bf16";
    if (n >= 5 && !strcmp(kernel + n - 5, "_int8")) return "int8";
    /* statically quantized graphs: their quantized ops run on int8 kernels
     * in an fp32 session ("dnnl_qlinear_conv", "dnnl_matmul_integer") */
    if (strstr(kernel, "qlinear") || strstr(kernel, "integer")) return "int8";
    return "fp32";
}

/* Run the model once on zero inputs (batch 1) with the profile on, and list
 * each step's node, op, kernel and the precision that kernel computes in. */
static void print_node_precisions(const kiln_model *cm, FILE *f)
{
    kiln_model *m = (kiln_model *)cm;
    kiln_session_options so;
    kiln_session_options_init(&so);
    so.profile = 1;
    kiln_session *s = NULL;
    kiln_tensor *in[64] = {0};
    kiln_named_tensor named[64];
    kiln_outputs *out = NULL;
    kiln_profile *prof = NULL;
    const char *why = NULL;
    if (kiln_session_create(m, NULL, &so, &s) != KILN_OK) {
        why = kiln_last_error();
        goto done;
    }
    const kiln_signature *sig = kiln_session_signature(s);
    int n = kiln_signature_input_count(sig);
    if (n > 64) {
        why = "more than 64 inputs";
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        int64_t dims[KILN_MAX_RANK];
        for (int d = 0; d < vi->rank; d++) dims[d] = vi->dims[d] >= 0 ? vi->dims[d] : 1;
        if (vi->rank < 0 || vi->dtype == KILN_DTYPE_UNDEFINED ||
            kiln_tensor_create(vi->dtype, vi->rank, dims, &in[i]) != KILN_OK) {
            why = "an input has no known type";
            goto done;
        }
        named[i].name = vi->name;
        named[i].tensor = in[i];
    }
    if (kiln_session_run(s, named, n, &out) != KILN_OK ||
        kiln_session_profile_get(s, &prof) != KILN_OK) {
        why = kiln_last_error();
        goto done;
    }
    int steps = kiln_profile_step_count(prof), by[3] = {0};
    int plan = steps ? kiln_profile_step(prof, 0)->plan : 0; /* the one plan that ran */
    fprintf(f, "precision per node (kernels of a batch-1 plan, in graph order):\n");
    for (int k = 0; k < steps; k++) /* steps are sorted slowest first: print in step order */
        for (int i = 0; i < steps; i++) {
            const kiln_profile_entry *e = kiln_profile_step(prof, i);
            if (e->plan != plan || e->step != k) continue;
            const char *p = kernel_precision(e->kernel);
            by[p[0] == 'b' ? 1 : p[0] == 'i' ? 2 : 0]++;
            fprintf(f, "  %-5s %-22s %-28s %s\n", p, e->op, e->kernel, e->node);
        }
    fprintf(f, "nodes by precision: fp32 %d, bf16 %d, int8 %d\n", by[0], by[1], by[2]);
done:
    if (why) fprintf(f, "precision per node: not measured (%s)\n", why);
    kiln_profile_free(prof);
    kiln_outputs_free(out);
    for (int i = 0; i < 64; i++) kiln_tensor_free(in[i]);
    kiln_session_free(s);
}

int kiln_model_artifact_print(const kiln_model *m, FILE *f)
{
    const struct kiln_artifact_info *a = m->artifact;
    if (!a) return 0;
    fprintf(f, "compiled artifact: .kiln format version %u, written by Kiln %s\n",
            a->format_version, a->kiln_version);
    fprintf(f, "source format: %s\n", a->source_format);
    fprintf(f, "precision: %s\n", kiln_precision_name(a->precision));
    fprintf(f, "CPU features needed: %s\n", a->cpu_features[0] ? a->cpu_features : "(none)");
    fprintf(f, "batch sizes precompiled at load:");
    for (int i = 0; i < a->n_batch_sizes; i++) fprintf(f, "%s%lld", i ? "," : " ",
                                                       (long long)a->batch_sizes[i]);
    fprintf(f, "%s\n", a->n_batch_sizes ? "" : " (none)");
    fprintf(f, "file: %llu bytes; sections:\n", (unsigned long long)a->file_size);
    for (int i = 0; i < a->n_sections; i++)
        fprintf(f, "  %-56s %12llu bytes at %llu\n", section_title(a->sections[i].kind),
                (unsigned long long)a->sections[i].size,
                (unsigned long long)a->sections[i].offset);
    print_node_precisions(m, f);
    if (a->report) fprintf(f, "compile report:\n%s\n", a->report);
    else fprintf(f, "compile report: (none)\n");
    return 1;
}
