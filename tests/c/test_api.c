/*
 * test_api.c - the public C API: loading from a path and from memory,
 * signatures, runs, input validation errors, and concurrent runs of one
 * model from several threads.
 *
 * Every output is compared with a double-precision reference computed here
 * from the model file's own weights (read by a few lines of protobuf wire
 * decoding below, not by Kiln's loader): Gemm, Relu, Gemm, Softmax.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kiln/kiln.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif
#define DIGITS KILN_SOURCE_DIR "/models/digits/1/model.onnx"

static kiln_tensor *make_pixels(int64_t batch, unsigned seed)
{
    int64_t dims[2] = {batch, 64};
    kiln_tensor *t;
    if (kiln_tensor_create(KILN_DTYPE_F32, 2, dims, &t) != KILN_OK) return NULL;
    float *p = t->data;
    for (int64_t i = 0; i < batch * 64; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)((seed >> 16) % 17);
    }
    return t;
}

static kiln_outputs *run_once(kiln_session *s, const kiln_tensor *x)
{
    kiln_named_tensor in = {"pixels", x};
    kiln_outputs *o = NULL;
    if (kiln_session_run(s, &in, 1, &o) != KILN_OK) return NULL;
    return o;
}

/* ---- the double-precision reference ---- */

/* Reads a protobuf varint at *p (< end); 0 on a malformed one. */
static int pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t c = *(*p)++;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (c < 0x80) return 1;
    }
    return 0;
}

/* The next length-delimited field number `field` of the message bytes [p, end):
 * sets *at, *len and returns the position after it, or NULL. */
static const uint8_t *pb_find(const uint8_t *p, const uint8_t *end, unsigned field,
                              const uint8_t **at, size_t *len)
{
    while (p < end) {
        uint64_t key, v;
        if (!pb_varint(&p, end, &key)) return NULL;
        switch (key & 7) {
        case 0: if (!pb_varint(&p, end, &v)) return NULL; break;
        case 1: p += 8; break;
        case 5: p += 4; break;
        case 2:
            if (!pb_varint(&p, end, &v) || v > (uint64_t)(end - p)) return NULL;
            if ((key >> 3) == field) {
                *at = p;
                *len = (size_t)v;
                return p + v;
            }
            p += v;
            break;
        default: return NULL;
        }
    }
    return NULL;
}

/* The float32 raw_data of initializer `name` (ModelProto.graph = 7,
 * GraphProto.initializer = 5, TensorProto.name = 8, raw_data = 9) as doubles. */
static int onnx_weight(const uint8_t *model, size_t n, const char *name, double *out, size_t count)
{
    const uint8_t *g, *t, *f;
    size_t glen, tlen, flen;
    if (!pb_find(model, model + n, 7, &g, &glen)) return 0;
    for (const uint8_t *p = g; (p = pb_find(p, g + glen, 5, &t, &tlen)) != NULL;) {
        if (!pb_find(t, t + tlen, 8, &f, &flen) || flen != strlen(name) || memcmp(f, name, flen))
            continue;
        if (!pb_find(t, t + tlen, 9, &f, &flen) || flen != count * 4) return 0;
        for (size_t i = 0; i < count; i++) {
            float v;
            memcpy(&v, f + 4 * i, 4);
            out[i] = v;
        }
        return 1;
    }
    return 0;
}

/* digits.onnx on x [batch, 64] in double: softmax(relu(x W1^T + b1) W2^T + b2). */
static int reference_probs(const kiln_tensor *x, double *out)
{
    static double w1[32 * 64], b1[32], w2[10 * 32], b2[10];
    FILE *f = fopen(DIGITS, "rb");
    if (!f) return 0;
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (!onnx_weight(buf, n, "fc1.weight", w1, 32 * 64) || !onnx_weight(buf, n, "fc1.bias", b1, 32) ||
        !onnx_weight(buf, n, "fc2.weight", w2, 10 * 32) || !onnx_weight(buf, n, "fc2.bias", b2, 10))
        return 0;
    const float *px = x->data;
    for (int64_t r = 0; r < x->dims[0]; r++) {
        double h[32], z[10], mx = -INFINITY, sum = 0;
        for (int j = 0; j < 32; j++) {
            double a = b1[j];
            for (int k = 0; k < 64; k++) a += px[r * 64 + k] * w1[j * 64 + k];
            h[j] = a > 0 ? a : 0;
        }
        for (int c = 0; c < 10; c++) {
            z[c] = b2[c];
            for (int j = 0; j < 32; j++) z[c] += h[j] * w2[c * 32 + j];
            if (z[c] > mx) mx = z[c];
        }
        for (int c = 0; c < 10; c++) sum += (z[c] = exp(z[c] - mx));
        for (int c = 0; c < 10; c++) out[r * 10 + c] = z[c] / sum;
    }
    return 1;
}

/* Largest |got - want| over n probabilities. */
static double max_diff(const float *got, const double *want, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= d)) d = isnan(got[i]) ? INFINITY : fabs(got[i] - want[i]);
    return d;
}

#define PROB_TOL 1e-5 /* float32 arithmetic against double, on probabilities */

struct worker {
    kiln_session *s;
    const kiln_tensor *x;
    const double *want;
    int mismatches, errors;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (int i = 0; i < 200; i++) {
        kiln_outputs *o = run_once(w->s, w->x);
        if (!o) {
            w->errors++;
            continue;
        }
        const kiln_tensor *y = kiln_outputs_get(o, 0);
        if (y->nbytes != 40 * sizeof(float) || max_diff(y->data, w->want, 40) > PROB_TOL)
            w->mismatches++;
        kiln_outputs_free(o);
    }
    return NULL;
}

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    *n = fread(buf, 1, (size_t)len, f);
    fclose(f);
    return buf;
}

/* kiln_tensor_copy_rows: values and strings copied, every mismatch refused untouched. */
static void test_copy_rows(void)
{
    int64_t d3[2] = {3, 2}, d2[2] = {2, 2}, d23[2] = {2, 3};
    kiln_tensor *a, *b, *c, *s, *t;
    CHECK(kiln_tensor_create(KILN_DTYPE_F32, 2, d3, &a) == KILN_OK, "create");
    CHECK(kiln_tensor_create(KILN_DTYPE_F32, 2, d2, &b) == KILN_OK, "create");
    CHECK(kiln_tensor_create(KILN_DTYPE_F32, 2, d23, &c) == KILN_OK, "create");
    CHECK(kiln_tensor_create(KILN_DTYPE_STRING, 2, d2, &s) == KILN_OK, "create");
    CHECK(kiln_tensor_create(KILN_DTYPE_STRING, 2, d3, &t) == KILN_OK, "create");
    for (int i = 0; i < 6; i++) ((float *)a->data)[i] = (float)i + 1;
    CHECK(kiln_tensor_copy_rows(b, 0, a, 1, 2) == KILN_OK, "copy: %s", kiln_last_error());
    const float *bv = b->data;
    CHECK(bv[0] == 3 && bv[1] == 4 && bv[2] == 5 && bv[3] == 6, "rows 1..2 of a: %g %g %g %g",
          bv[0], bv[1], bv[2], bv[3]);
    CHECK(kiln_tensor_copy_rows(a, 2, a, 0, 1) == KILN_OK && ((float *)a->data)[4] == 1 &&
              ((float *)a->data)[5] == 2, "row 0 onto row 2 of the same tensor");
    CHECK(kiln_tensor_copy_rows(b, 1, a, 1, 2) == KILN_ERR_INVALID_ARGUMENT, "dst range");
    CHECK(kiln_tensor_copy_rows(b, 0, a, 2, 2) == KILN_ERR_INVALID_ARGUMENT, "src range");
    CHECK(kiln_tensor_copy_rows(b, 0, a, -1, 1) == KILN_ERR_INVALID_ARGUMENT, "negative row");
    CHECK(kiln_tensor_copy_rows(c, 0, a, 0, 1) == KILN_ERR_INVALID_ARGUMENT, "row sizes");
    CHECK(kiln_tensor_copy_rows(s, 0, a, 0, 1) == KILN_ERR_INVALID_ARGUMENT, "dtypes");
    CHECK(strstr(kiln_last_error(), "float32") != NULL, "message names the dtype: %s",
          kiln_last_error());
    CHECK(bv[0] == 3 && bv[3] == 6, "a refused copy wrote nothing");
    CHECK(kiln_tensor_set_string(t, 4, "abc", 3) == KILN_OK, "set");
    CHECK(kiln_tensor_copy_rows(s, 1, t, 2, 1) == KILN_OK, "string copy: %s", kiln_last_error());
    const kiln_string *sv = s->data;
    CHECK(sv[2].len == 3 && memcmp(sv[2].data, "abc", 3) == 0, "string row copied");
    kiln_tensor_free(a);
    kiln_tensor_free(b);
    kiln_tensor_free(c);
    kiln_tensor_free(s);
    kiln_tensor_free(t);
}

int main(void)
{
    test_copy_rows();
    kiln_model *m = NULL;
    kiln_status st = kiln_model_load(DIGITS, NULL, &m);
    CHECK(st == KILN_OK, "load: %s", kiln_last_error());
    if (st != KILN_OK) return CHECK_DONE();

    /* signature */
    CHECK(strcmp(kiln_model_format(m), "onnx") == 0, "format %s", kiln_model_format(m));
    CHECK(kiln_model_signature_count(m) == 1, "signatures %d", kiln_model_signature_count(m));
    const kiln_signature *sig = kiln_model_find_signature(m, NULL);
    CHECK(sig && strcmp(kiln_signature_name(sig), "serving_default") == 0, "default signature");
    const kiln_value_info *vi = kiln_signature_input(sig, 0);
    CHECK(vi && strcmp(vi->name, "pixels") == 0, "input name");
    CHECK(vi->dtype == KILN_DTYPE_F32 && vi->rank == 2 && vi->dims[0] == -1 && vi->dims[1] == 64,
          "input type");
    CHECK(vi->dim_names[0] && strcmp(vi->dim_names[0], "batch") == 0, "symbolic dim name");
    const kiln_value_info *vo = kiln_signature_output(sig, 0);
    CHECK(vo && strcmp(vo->name, "probabilities") == 0, "output name");
    kiln_model_stats stats;
    kiln_model_get_stats(m, &stats);
    CHECK(stats.param_count == 64 * 32 + 32 + 32 * 10 + 10, "param count %lld",
          (long long)stats.param_count);

    kiln_session *s = NULL;
    st = kiln_session_create(m, NULL, NULL, &s);
    CHECK(st == KILN_OK, "session: %s", kiln_last_error());
    kiln_session *bad = NULL;
    st = kiln_session_create(m, "no_such_signature", NULL, &bad);
    CHECK(st == KILN_ERR_NOT_FOUND && strstr(kiln_last_error(), "no_such_signature"),
          "unknown signature: %s", kiln_last_error());

    /* a run: the double-precision reference's probabilities, summing to one per row */
    kiln_tensor *x = make_pixels(4, 7);
    double want[40];
    CHECK(reference_probs(x, want), "reading the weights of %s for the reference", DIGITS);
    kiln_outputs *o = run_once(s, x);
    CHECK(o != NULL, "run: %s", kiln_last_error());
    if (o) {
        const kiln_tensor *y = kiln_outputs_get(o, 0);
        CHECK(y->dtype == KILN_DTYPE_F32 && y->rank == 2 && y->dims[0] == 4 && y->dims[1] == 10,
              "output shape");
        for (int r = 0; r < 4; r++) {
            double sum = 0;
            for (int c = 0; c < 10; c++) sum += ((float *)y->data)[r * 10 + c];
            CHECK(sum > 0.999 && sum < 1.001, "row %d sums to %f", r, sum);
        }
        double d = max_diff(y->data, want, 40);
        CHECK(d <= PROB_TOL, "outputs differ from the double-precision reference by %g", d);
        kiln_outputs_free(o);
    }

    /* the same model from memory gives the same answer */
    size_t n = 0;
    char *bytes = read_file(DIGITS, &n);
    kiln_model *m2 = NULL;
    st = kiln_model_load_memory(bytes, n, NULL, &m2);
    CHECK(st == KILN_OK, "load_memory: %s", kiln_last_error());
    free(bytes); /* the model must not keep the caller's bytes */
    if (m2) {
        kiln_session *s2;
        kiln_session_create(m2, NULL, NULL, &s2);
        kiln_outputs *o2 = run_once(s2, x);
        CHECK(o2 && max_diff(kiln_outputs_get(o2, 0)->data, want, 40) <= PROB_TOL,
              "memory-loaded model differs from the reference");
        kiln_outputs_free(o2);
        kiln_session_free(s2);
        kiln_model_free(m2);
    }

    /* input validation */
    kiln_outputs *none = NULL;
    st = kiln_session_run(s, NULL, 0, &none);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "pixels"),
          "missing input: %s", kiln_last_error());
    int64_t d63[2] = {4, 63}, d64[2] = {4, 64};
    kiln_tensor *wrong_shape, *wrong_type;
    kiln_tensor_create(KILN_DTYPE_F32, 2, d63, &wrong_shape);
    kiln_tensor_create(KILN_DTYPE_I64, 2, d64, &wrong_type);
    kiln_named_tensor in = {"pixels", wrong_shape};
    st = kiln_session_run(s, &in, 1, &none);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "[batch,64]"),
          "wrong shape: %s", kiln_last_error());
    in.tensor = wrong_type;
    st = kiln_session_run(s, &in, 1, &none);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "float32"),
          "wrong dtype: %s", kiln_last_error());
    kiln_named_tensor unknown = {"pixelz", x};
    st = kiln_session_run(s, &unknown, 1, &none);
    CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "pixelz"),
          "unknown input: %s", kiln_last_error());
    kiln_tensor_free(wrong_shape);
    kiln_tensor_free(wrong_type);

    /* bad loads */
    kiln_model *m3 = NULL;
    st = kiln_model_load("/nonexistent/model.onnx", NULL, &m3);
    CHECK(st == KILN_ERR_NOT_FOUND && m3 == NULL, "missing file: %s", kiln_last_error());
    st = kiln_model_load_memory("\x0a\xff\xff\xff\x0f garbage", 14, NULL, &m3);
    CHECK(st == KILN_ERR_INVALID_MODEL && m3 == NULL, "garbage: %s", kiln_last_error());

    /* concurrent runs of one session from four threads */
    pthread_t th[4];
    struct worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){s, x, want, 0, 0};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].errors == 0 && w[i].mismatches == 0, "thread %d: %d errors, %d mismatches", i,
              w[i].errors, w[i].mismatches);
    }

    kiln_tensor_free(x);
    kiln_session_free(s);
    kiln_model_free(m);
    return CHECK_DONE();
}
