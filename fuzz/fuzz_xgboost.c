/*
 * fuzz_xgboost.c - libFuzzer target for the XGBoost model loader
 * (src/import/xgboost.c and its JSON / UBJSON reader, xgb_doc.c).
 *
 * The bytes are written to a memfd and loaded with kiln_model_load, which
 * recognizes an XGBoost file by its first byte ('{': a JSON or UBJSON
 * object); inputs that do not start so are skipped (they belong to the ONNX
 * target). A load must succeed or fail with a message. A model that loads
 * is run once on the fast path and once on the reference path with three
 * rows of features (all NaN; 0, 1, 2, ... as category codes; 0.5) when it
 * has at most 1,024 features, and every output is touched. Everything is
 * freed before returning.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_xgboost
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_xgboost that the test suite runs over tests/corpus/xgboost.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kiln/kiln.h"

#define FUZZ_MAX_FEATURES 1024

static void run_once(kiln_session *session)
{
    const kiln_signature *sig = kiln_session_signature(session);
    if (!sig || kiln_signature_input_count(sig) != 1) return;
    const kiln_value_info *vi = kiln_signature_input(sig, 0);
    if (!vi || vi->rank != 2 || vi->dims[1] < 1 || vi->dims[1] > FUZZ_MAX_FEATURES) return;
    int64_t dims[2] = {3, vi->dims[1]};
    kiln_tensor *x = NULL;
    if (kiln_tensor_create(KILN_DTYPE_F32, 2, dims, &x) != KILN_OK) return;
    float *p = x->data;
    for (int64_t j = 0; j < dims[1]; j++) {
        p[j] = NAN;
        p[dims[1] + j] = (float)j;
        p[2 * dims[1] + j] = 0.5f;
    }
    kiln_named_tensor in = {vi->name, x};
    kiln_outputs *outputs = NULL;
    if (kiln_session_run(session, &in, 1, &outputs) == KILN_OK) {
        for (int i = 0; i < kiln_outputs_count(outputs); i++) {
            const kiln_tensor *t = kiln_outputs_get(outputs, i);
            if (t && t->nbytes > 0 && t->data) (void)*(volatile const unsigned char *)t->data;
        }
        kiln_outputs_free(outputs);
    } else {
        const char *msg = kiln_last_error();
        if (!msg || !*msg) abort();
    }
    kiln_tensor_free(x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || data[0] != '{') return 0;
    int fd = memfd_create("fuzz_xgboost", MFD_CLOEXEC);
    if (fd < 0) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    kiln_model *model = NULL;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    if (kiln_model_load(path, NULL, &model) != KILN_OK) {
        const char *msg = kiln_last_error();
        if (!msg || !*msg) abort();
        close(fd);
        return 0;
    }
    for (int kind = 0; kind < 2; kind++) {
        kiln_session_options so;
        kiln_session_options_init(&so);
        so.threads = 1;
        so.max_tensor_bytes = 64 << 20;
        so.reference = kind == 1;
        kiln_session *session = NULL;
        if (kiln_session_create(model, NULL, &so, &session) == KILN_OK) {
            run_once(session);
            kiln_session_free(session);
        }
    }
    kiln_model_free(model);
    close(fd);
    return 0;
}
