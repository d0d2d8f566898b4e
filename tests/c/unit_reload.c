/*
 * unit_reload.c - reloadable weights: the copies the importer makes of
 * misaligned raw_data are freed once their plans hold them packed, and
 * whatever reads them later (another plan, the imported graph's plans, the
 * reference executor, concurrent compiles) gets them back intact.
 *
 * The test writes its own ONNX file (every weight's raw_data at an odd file
 * offset), runs it through every kind of session in one process and checks
 * every output against a double-precision product computed here. Last,
 * bf16 and int8 sessions compile plans after fp32 plans released the
 * weights (outputs within 5% of their scale).
 *
 *   X [batch, 64] -> MatMul W1 [64,128] -> Relu -> MatMul W2 [128,64] = C
 *   U = C P            (P [64,64] packed as B ...)
 *   T = P C^T          (... and read as it is, as A: P must stay resident)
 *   V = C W3^T         (W3 [64,64] only through a Transpose: folded away)
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "import/model.h"
#include "kernels/fast.h"
#include "kiln/kiln.h"

/* ---- a minimal protobuf writer ---- */

struct pb {
    unsigned char *d;
    size_t n, cap;
};

static void pb_put(struct pb *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->d = realloc(b->d, b->cap);
        if (!b->d) abort();
    }
    memcpy(b->d + b->n, p, n);
    b->n += n;
}

static void pb_varint(struct pb *b, uint64_t v)
{
    unsigned char c[10];
    int n = 0;
    do {
        c[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) c[n] |= 0x80;
        n++;
    } while (v);
    pb_put(b, c, (size_t)n);
}

static void pb_int(struct pb *b, int field, int64_t v)
{
    pb_varint(b, (uint64_t)field << 3);
    pb_varint(b, (uint64_t)v);
}

static void pb_bytes(struct pb *b, int field, const void *p, size_t n)
{
    pb_varint(b, (uint64_t)field << 3 | 2);
    pb_varint(b, n);
    pb_put(b, p, n);
}

static void pb_str(struct pb *b, int field, const char *s) { pb_bytes(b, field, s, strlen(s)); }

static void pb_msg(struct pb *b, int field, struct pb *sub)
{
    pb_bytes(b, field, sub->d, sub->n);
    free(sub->d);
    memset(sub, 0, sizeof *sub);
}

/* ---- the model ---- */

enum { D = 64, H = 128, NW = 4 };
static const char *wname[NW] = {"W1", "W2", "P", "W3"};
static const int wrows[NW] = {D, H, D, D}, wcols[NW] = {H, D, D, D};
static float *wdata[NW];

static void node(struct pb *g, const char *op, const char *a, const char *b, const char *out,
                 int transpose)
{
    struct pb n = {0};
    pb_str(&n, 1, a);
    if (b) pb_str(&n, 1, b);
    pb_str(&n, 2, out);
    pb_str(&n, 4, op);
    if (transpose) { /* perm = [1, 0] */
        struct pb at = {0};
        pb_str(&at, 1, "perm");
        pb_int(&at, 8, 1);
        pb_int(&at, 8, 0);
        pb_int(&at, 20, 7); /* INTS */
        pb_msg(&n, 5, &at);
    }
    pb_msg(g, 1, &n);
}

static void value_info(struct pb *g, int field, const char *name, const char *d0, int64_t d1)
{
    struct pb dim0 = {0}, dim1 = {0}, shape = {0}, tt = {0}, type = {0}, vi = {0};
    pb_str(&dim0, 2, d0); /* dim_param */
    pb_int(&dim1, 1, d1); /* dim_value */
    pb_msg(&shape, 1, &dim0);
    pb_msg(&shape, 1, &dim1);
    pb_int(&tt, 1, 1); /* FLOAT */
    pb_msg(&tt, 2, &shape);
    pb_msg(&type, 1, &tt);
    pb_str(&vi, 1, name);
    pb_msg(&vi, 2, &type);
    pb_msg(g, field, &vi);
}

/* The model with `pad[i]` bytes of doc_string before initializer i's data. */
static struct pb build(const int *pad)
{
    struct pb g = {0}, m = {0};
    node(&g, "MatMul", "X", "W1", "A", 0);
    node(&g, "Relu", "A", NULL, "B", 0);
    node(&g, "MatMul", "B", "W2", "C", 0);
    node(&g, "MatMul", "C", "P", "U", 0);
    node(&g, "Transpose", "C", NULL, "Ct", 1);
    node(&g, "MatMul", "P", "Ct", "T", 0);
    node(&g, "Transpose", "W3", NULL, "W3t", 1);
    node(&g, "MatMul", "C", "W3t", "V", 0);
    pb_str(&g, 2, "reload");
    for (int i = 0; i < NW; i++) {
        struct pb t = {0};
        char doc[8] = "xxxxxxx";
        doc[pad[i]] = '\0';
        pb_int(&t, 1, wrows[i]);
        pb_int(&t, 1, wcols[i]);
        pb_int(&t, 2, 1); /* FLOAT */
        pb_str(&t, 8, wname[i]);
        pb_str(&t, 12, doc);
        pb_bytes(&t, 9, wdata[i], sizeof(float) * (size_t)wrows[i] * (size_t)wcols[i]);
        pb_msg(&g, 5, &t);
    }
    value_info(&g, 11, "X", "batch", D);
    value_info(&g, 12, "U", "batch", D);
    struct pb dim0 = {0}, dim1 = {0}, shape = {0}, tt = {0}, type = {0}, vi = {0};
    pb_int(&dim0, 1, D);
    pb_str(&dim1, 2, "batch");
    pb_msg(&shape, 1, &dim0);
    pb_msg(&shape, 1, &dim1);
    pb_int(&tt, 1, 1);
    pb_msg(&tt, 2, &shape);
    pb_msg(&type, 1, &tt);
    pb_str(&vi, 1, "T");
    pb_msg(&vi, 2, &type);
    pb_msg(&g, 12, &vi);
    value_info(&g, 12, "V", "batch", D);
    pb_int(&m, 1, 8); /* ir_version */
    struct pb ops = {0};
    pb_str(&ops, 1, "");
    pb_int(&ops, 2, 17);
    pb_msg(&m, 8, &ops);
    pb_msg(&m, 7, &g);
    return m;
}

/* File offset of initializer i's raw bytes (its data is unique random floats). */
static long data_offset(const struct pb *m, int i)
{
    size_t n = sizeof(float) * 16;
    for (size_t o = 0; o + n <= m->n; o++)
        if (memcmp(m->d + o, wdata[i], n) == 0) return (long)o;
    return -1;
}

/* Write the model with every weight's data misaligned for floats. */
static int write_model(const char *path)
{
    int pad[NW] = {0};
    struct pb m = {0};
    for (int tries = 0; tries < 64; tries++) {
        free(m.d);
        m = build(pad);
        int ok = 1;
        for (int i = 0; i < NW; i++) {
            long off = data_offset(&m, i);
            if (off < 0) {
                free(m.d);
                return 0;
            }
            if (off % 4 == 0) {
                pad[i] = (pad[i] + 1) % 4;
                ok = 0;
                break;
            }
        }
        if (ok) {
            FILE *f = fopen(path, "wb");
            int w = f && fwrite(m.d, 1, m.n, f) == m.n;
            if (f) fclose(f);
            free(m.d);
            return w;
        }
    }
    free(m.d);
    return 0;
}

/* ---- the reference ---- */

static float *x_of(int batch, uint64_t seed)
{
    float *x = malloc(sizeof(float) * (size_t)batch * D);
    for (int i = 0; i < batch * D; i++)
        x[i] = (float)((double)(check_xorshift(&seed) % 2001) / 1000.0 - 1.0);
    return x;
}

static double w(int k, int r, int c) { return wdata[k][r * wcols[k] + c]; }

/* U, T, V for one input, in double. */
static void reference(const float *x, int batch, double *u, double *t, double *v)
{
    double *c = calloc((size_t)batch * D, sizeof *c);
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < D; j++) {
            double acc = 0;
            for (int h = 0; h < H; h++) {
                double a = 0;
                for (int k = 0; k < D; k++) a += x[b * D + k] * w(0, k, h);
                acc += (a > 0 ? a : 0) * w(1, h, j);
            }
            c[b * D + j] = acc;
        }
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < D; j++) {
            double su = 0, sv = 0;
            for (int k = 0; k < D; k++) {
                su += c[b * D + k] * w(2, k, j);
                sv += c[b * D + k] * w(3, j, k);
            }
            u[b * D + j] = su;
            v[b * D + j] = sv;
        }
    for (int i = 0; i < D; i++)
        for (int b = 0; b < batch; b++) {
            double s = 0;
            for (int k = 0; k < D; k++) s += w(2, i, k) * c[b * D + k];
            t[i * batch + b] = s;
        }
    free(c);
}

/* Run s on a batch and compare the three outputs with the reference; 1 if all agree. */
static double g_tol = 1e-4; /* of the output's scale; looser for bf16 and int8 sessions */

static int run_and_check(kiln_session *s, int batch, uint64_t seed, const char *what)
{
    float *x = x_of(batch, seed);
    int64_t dims[2] = {batch, D};
    kiln_tensor *xt = NULL;
    kiln_tensor_wrap(KILN_DTYPE_F32, 2, dims, x, sizeof(float) * (size_t)batch * D, &xt);
    kiln_named_tensor in = {"X", xt};
    kiln_outputs *o = NULL;
    kiln_status st = kiln_session_run(s, &in, 1, &o);
    int ok = st == KILN_OK;
    CHECK(ok, "%s batch %d: %s", what, batch, kiln_last_error());
    if (ok) {
        size_t n = (size_t)batch * D;
        double *want[3] = {malloc(n * sizeof(double)), malloc(n * sizeof(double)),
                           malloc(n * sizeof(double))};
        reference(x, batch, want[0], want[1], want[2]);
        for (int k = 0; k < 3; k++) {
            const kiln_tensor *y = kiln_outputs_get(o, k);
            double scale = 0, err = 0;
            for (size_t i = 0; i < n; i++) scale = fabs(want[k][i]) > scale ? fabs(want[k][i]) : scale;
            for (size_t i = 0; i < n && y && y->nbytes == n * sizeof(float); i++) {
                double e = fabs(((const float *)y->data)[i] - want[k][i]);
                if (e > err) err = e;
            }
            int good = y && y->nbytes == n * sizeof(float) && err <= g_tol * (scale > 1 ? scale : 1);
            CHECK(good, "%s batch %d output %s: max error %g of scale %g", what, batch,
                  kiln_outputs_name(o, k), err, scale);
            ok = ok && good;
            free(want[k]);
        }
        kiln_outputs_free(o);
    }
    kiln_tensor_free(xt);
    free(x);
    return ok;
}

static int g_precision; /* kiln_precision of the sessions made next */

static kiln_session *session(kiln_model *m, int optimize, int reference_path)
{
    kiln_session_options o;
    kiln_session_options_init(&o);
    o.threads = 2;
    o.precision = g_precision;
    o.optimize = optimize;
    o.reference = reference_path;
    kiln_session *s = NULL;
    kiln_status st = kiln_session_create(m, NULL, &o, &s);
    CHECK(st == KILN_OK, "session: %s", kiln_last_error());
    return s;
}

static const kiln_tensor *weight(kiln_model *m, const char *name)
{
    int v = kiln_graph_value_find(m->graph, name);
    return v >= 0 ? m->graph->values[v].konst : NULL;
}

struct worker {
    kiln_model *m;
    int optimize;
    int ok;
};

static void *work(void *arg)
{
    struct worker *wk = arg;
    kiln_session *s = session(wk->m, wk->optimize, 0);
    wk->ok = s != NULL;
    for (int b = 1; s && b <= 9; b++)
        wk->ok &= run_and_check(s, b, 100 + (uint64_t)b, wk->optimize ? "concurrent optimized"
                                                                      : "concurrent imported");
    kiln_session_free(s);
    return NULL;
}

int main(void)
{
    uint64_t seed = 42;
    for (int i = 0; i < NW; i++) {
        size_t n = (size_t)wrows[i] * (size_t)wcols[i];
        wdata[i] = malloc(n * sizeof(float));
        for (size_t k = 0; k < n; k++)
            wdata[i][k] = (float)((double)(check_xorshift(&seed) % 20001) / 100000.0 - 0.1);
    }
    char path[] = "/tmp/kiln_reload_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "temporary file");
    if (fd < 0) return CHECK_DONE();
    close(fd);
    CHECK(write_model(path), "writing the model");

    /* 1. one model: optimized plans release W1 and W2 once packed */
    kiln_model *m = NULL;
    kiln_status st = kiln_model_load(path, NULL, &m);
    CHECK(st == KILN_OK, "load: %s", kiln_last_error());
    if (st != KILN_OK) return CHECK_DONE();
    CHECK(m->n_copies == NW, "%d of %d weights were reloadable copies", m->n_copies, NW);
    const kiln_tensor *w1 = weight(m, "W1"), *w2 = weight(m, "W2"), *p = weight(m, "P"),
                      *w3 = weight(m, "W3");
    CHECK(w1 && w2 && p && w3, "weights found");
    if (!w1 || !w2 || !p || !w3) return CHECK_DONE();
    CHECK(w3->data == NULL, "W3 (only read through a folded Transpose) released at load");
    /* KILN_FAST=0 (reference kernels in the plans) packs nothing */
    const char *fe = getenv("KILN_FAST");
    int packs = !(fe && strcmp(fe, "0") == 0);
    kiln_session *opt = session(m, 1, 0);
    run_and_check(opt, 3, 1, "optimized");
    CHECK(!packs || (w1->data == NULL && w2->data == NULL),
          "W1 and W2 released once packed (%p %p)", w1->data, w2->data);
    CHECK(p->data != NULL, "P stays: one step reads it as it is");
    size_t released = kiln_weight_cache_released_bytes(m->weights);
    CHECK(released == w3->nbytes + (packs ? w1->nbytes + w2->nbytes : 0), "released %zu bytes",
          released);
    run_and_check(opt, 3, 2, "optimized, same plan");
    run_and_check(opt, 7, 3, "optimized, a new plan");
    CHECK(!packs || (w1->data == NULL && w2->data == NULL), "still released after a second plan");

    /* 2. the imported graph's plans: W3's Transpose folds (copied back), W1/W2 pack again */
    kiln_session *imp = session(m, 0, 0);
    run_and_check(imp, 5, 4, "imported graph");
    run_and_check(opt, 5, 5, "optimized after the imported graph");

    /* 3. compiles in two threads at once, on both graphs, new batch sizes */
    struct worker a = {m, 1, 0}, b = {m, 0, 0};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, work, &a);
    pthread_create(&tb, NULL, work, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(a.ok && b.ok, "concurrent sessions");

    /* 4. the reference executor pins everything back */
    kiln_session *ref = session(m, 1, 1);
    run_and_check(ref, 4, 6, "reference");
    CHECK(w1->data && w2->data && w3->data, "reference path reloaded every weight");
    CHECK(kiln_weight_cache_released_bytes(m->weights) == 0, "nothing released after pinning");
    run_and_check(opt, 11, 7, "optimized after pinning");
    CHECK(w1->data && w2->data, "pinned weights are not released again");
    kiln_session_free(ref);
    kiln_session_free(imp);
    kiln_session_free(opt);
    kiln_model_free(m);

    /* 5. a fresh model whose first run is the reference executor */
    st = kiln_model_load(path, NULL, &m);
    CHECK(st == KILN_OK, "reload: %s", kiln_last_error());
    if (st == KILN_OK) {
        ref = session(m, 1, 1);
        run_and_check(ref, 2, 8, "reference first");
        opt = session(m, 1, 0);
        run_and_check(opt, 2, 9, "optimized after the reference");
        CHECK(kiln_weight_cache_released_bytes(m->weights) == 0, "pinned before any plan");
        kiln_session_free(ref);
        kiln_session_free(opt);
        kiln_model_free(m);
    }
    /* 6. bf16 and int8 plans after fp32 plans released W1 and W2: they read them back */
    st = kiln_model_load(path, NULL, &m);
    CHECK(st == KILN_OK, "reload: %s", kiln_last_error());
    if (st == KILN_OK) {
        opt = session(m, 1, 0);
        run_and_check(opt, 3, 10, "optimized before the low-precision sessions");
        w1 = weight(m, "W1");
        CHECK(!packs || (w1 && w1->data == NULL), "W1 released by the fp32 plan");
        g_tol = 0.05;
        for (int prec = KILN_PRECISION_BF16; prec <= KILN_PRECISION_INT8; prec++) {
            g_precision = prec;
            kiln_session *lp = session(m, 1, 0);
            run_and_check(lp, 3, 11, prec == KILN_PRECISION_INT8 ? "int8" : "bf16");
            run_and_check(lp, 6, 12, prec == KILN_PRECISION_INT8 ? "int8, a second plan"
                                                                  : "bf16, a second plan");
            kiln_session_free(lp);
        }
        g_precision = KILN_PRECISION_FP32;
        g_tol = 1e-4;
        run_and_check(opt, 3, 13, "optimized after the low-precision sessions");
        kiln_session_free(opt);
        kiln_model_free(m);
    }
    if (!getenv("KILN_KEEP")) unlink(path);
    for (int i = 0; i < NW; i++) free(wdata[i]);
    return CHECK_DONE();
}
