/*
 * test_api.c - the public C API: loading from a path and from memory,
 * signatures, runs, input validation errors, and concurrent runs of one
 * model from several threads.
 */
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

struct worker {
    kiln_session *s;
    const kiln_tensor *x;
    const float *want;
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
        if (memcmp(y->data, w->want, y->nbytes) != 0) w->mismatches++;
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

int main(void)
{
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

    /* a run: probabilities sum to one per row */
    kiln_tensor *x = make_pixels(4, 7);
    kiln_outputs *o = run_once(s, x);
    CHECK(o != NULL, "run: %s", kiln_last_error());
    float want[40];
    if (o) {
        const kiln_tensor *y = kiln_outputs_get(o, 0);
        CHECK(y->dtype == KILN_DTYPE_F32 && y->rank == 2 && y->dims[0] == 4 && y->dims[1] == 10,
              "output shape");
        for (int r = 0; r < 4; r++) {
            double sum = 0;
            for (int c = 0; c < 10; c++) sum += ((float *)y->data)[r * 10 + c];
            CHECK(sum > 0.999 && sum < 1.001, "row %d sums to %f", r, sum);
        }
        memcpy(want, y->data, sizeof want);
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
        CHECK(o2 && memcmp(kiln_outputs_get(o2, 0)->data, want, sizeof want) == 0,
              "memory-loaded model differs");
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
