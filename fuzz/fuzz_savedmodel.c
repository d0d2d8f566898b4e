/*
 * fuzz_savedmodel.c - libFuzzer target for the SavedModel reader.
 *
 * The bytes are written as saved_model.pb into a private temporary folder
 * (made once per process, removed at exit) and loaded with kiln_model_load,
 * the path every user takes: wire-format walk, MetaGraphDef and signature
 * selection, function inlining, the restore trace, op lowering, constant
 * folding, verification and shape inference. The folder has no variables/,
 * so models that need a checkpoint stop at a clean error. When a model
 * loads, every signature gets a session and, if all its inputs have known
 * dtypes and small fully known shapes, one run on zero-filled inputs.
 * Everything is freed before returning: a leak is a finding.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_savedmodel
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_savedmodel that the test suite runs over
 * tests/corpus/savedmodel (written by tools/make_savedmodel_corpus.py).
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/kiln.h"

#define FUZZ_MAX_INPUT_ELEMENTS 4096
/* A run stops here, as a server's request timeout stops it: a While or Loop whose
 * condition never turns false is the model's meaning, not a defect, and would otherwise
 * run to the loop bound (2^24 iterations). */
#define FUZZ_RUN_DEADLINE_MS 1000
#define FUZZ_MAX_INPUTS 64

static char fuzz_dir[64];
static char fuzz_file[96];

static void fuzz_cleanup(void)
{
    if (fuzz_file[0]) unlink(fuzz_file);
    if (fuzz_dir[0]) rmdir(fuzz_dir);
}

/* The private folder, made on first use. 0 on failure. */
static int fuzz_folder(void)
{
    if (fuzz_dir[0]) return 1;
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/kiln-fuzz-sm-XXXXXX",
             tmp && tmp[0] && strlen(tmp) < 32 ? tmp : "/tmp");
    if (!mkdtemp(fuzz_dir)) {
        perror("fuzz_savedmodel: mkdtemp");
        fuzz_dir[0] = '\0';
        return 0;
    }
    snprintf(fuzz_file, sizeof fuzz_file, "%s/saved_model.pb", fuzz_dir);
    atexit(fuzz_cleanup);
    return 1;
}

static int fuzz_write(const uint8_t *data, size_t size)
{
    FILE *f = fopen(fuzz_file, "wb");
    if (!f) return 0;
    size_t n = size ? fwrite(data, 1, size, f) : 0;
    int ok = n == size;
    if (fclose(f) != 0) ok = 0;
    return ok;
}

/* Element count of a fully known, small shape; -1 if unknown or too big. */
static int64_t fuzz_small_count(const kiln_value_info *vi)
{
    if (vi->dtype <= KILN_DTYPE_UNDEFINED || vi->dtype >= KILN_DTYPE_COUNT) return -1;
    if (vi->rank < 0 || vi->rank > KILN_MAX_RANK) return -1;
    int64_t count = 1;
    for (int d = 0; d < vi->rank; d++) {
        if (vi->dims[d] < 0 || vi->dims[d] > FUZZ_MAX_INPUT_ELEMENTS) return -1;
        count *= vi->dims[d];
        if (count > FUZZ_MAX_INPUT_ELEMENTS) return -1;
    }
    return count;
}

static void fuzz_run_once(kiln_session *session)
{
    const kiln_signature *sig = kiln_session_signature(session);
    int n = sig ? kiln_signature_input_count(sig) : -1;
    if (n < 0 || n > FUZZ_MAX_INPUTS) return;
    kiln_tensor *tensors[FUZZ_MAX_INPUTS] = {0};
    kiln_named_tensor named[FUZZ_MAX_INPUTS];
    int made = 0;
    for (; made < n; made++) {
        const kiln_value_info *vi = kiln_signature_input(sig, made);
        if (!vi || !vi->name || fuzz_small_count(vi) < 0) goto out_free_inputs;
        if (kiln_tensor_create(vi->dtype, vi->rank, vi->dims, &tensors[made]) != KILN_OK)
            goto out_free_inputs;
        named[made].name = vi->name;
        named[made].tensor = tensors[made];
    }
    kiln_outputs *outputs = NULL;
    kiln_run_options ro = {.deadline_ms = kiln_monotonic_ms() + FUZZ_RUN_DEADLINE_MS};
    if (kiln_session_run_opts(session, named, n, &ro, &outputs) == KILN_OK) {
        int m = kiln_outputs_count(outputs);
        for (int i = 0; i < m; i++) {
            const kiln_tensor *t = kiln_outputs_get(outputs, i);
            (void)kiln_outputs_name(outputs, i);
            if (t && t->nbytes > 0 && t->data) (void)*(volatile const unsigned char *)t->data;
        }
        kiln_outputs_free(outputs);
    }
out_free_inputs:
    for (int i = 0; i < made; i++) kiln_tensor_free(tensors[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!fuzz_folder() || !fuzz_write(data, size)) return 0;
    kiln_load_options lo = {.format = KILN_FORMAT_SAVEDMODEL, .tags = NULL};
    kiln_model *model = NULL;
    if (kiln_model_load(fuzz_dir, &lo, &model) != KILN_OK) {
        const char *msg = kiln_last_error();
        if (msg) (void)*(volatile const char *)msg;
        return 0;
    }
    kiln_model_stats stats;
    kiln_model_get_stats(model, &stats);
    for (int i = 0; i < kiln_model_op_kinds(model); i++) {
        const char *op;
        int count;
        kiln_model_op_kind(model, i, &op, &count);
    }
    kiln_session_options so;
    kiln_session_options_init(&so);
    so.threads = 1;
    for (int s = 0; s < kiln_model_signature_count(model); s++) {
        const kiln_signature *sig = kiln_model_signature(model, s);
        kiln_session *session = NULL;
        if (kiln_session_create(model, kiln_signature_name(sig), &so, &session) == KILN_OK) {
            fuzz_run_once(session);
            kiln_session_free(session);
        }
    }
    kiln_model_free(model);
    return 0;
}
