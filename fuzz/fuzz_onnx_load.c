/*
 * fuzz_onnx_load.c - libFuzzer target for the ONNX loader.
 *
 * A model file is the first untrusted input Kiln parses, so every byte
 * string must end in either a loaded model or a status with a message:
 * never a crash, a hang, unbounded memory or a leak. The target loads the
 * bytes with kiln_model_load_memory; when that succeeds it also creates a
 * session and, if every input of the default signature has a known dtype
 * and a small fully known shape, runs it once on zero-filled inputs, so
 * that shape inference, compilation and the reference kernels see what a
 * hostile file can make of them. Then it loads the same bytes as a mapped
 * file (a memfd), where misaligned weights become reloadable copies (the
 * size threshold lowered to 64 bytes through KILN_RELOAD_MIN_BYTES), and
 * runs an optimized, an as-imported and a reference session on that one
 * model in turn, so that weights released by one plan are read back by the
 * next. Everything is freed before returning.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_onnx_load
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_onnx that the test suite runs over tests/corpus/onnx.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kiln/kiln.h"

/* Inputs larger than this (elements) or with more inputs than this are not
 * run: the point is to exercise the code paths, not to spend time in
 * kernels. */
#define FUZZ_MAX_INPUT_ELEMENTS 4096
/* A run stops here, as a server's request timeout stops it: a While or Loop whose
 * condition never turns false is the model's meaning, not a defect, and would otherwise
 * run to the loop bound (2^24 iterations). */
#define FUZZ_RUN_DEADLINE_MS 1000
#define FUZZ_MAX_INPUTS 64

/* Element count of a fully known, small shape; -1 if unknown or too big. */
static int64_t fuzz_small_count(const kiln_value_info *vi)
{
    if (vi->dtype <= KILN_DTYPE_UNDEFINED || vi->dtype >= KILN_DTYPE_COUNT)
        return -1;
    if (vi->rank < 0 || vi->rank > KILN_MAX_RANK)
        return -1;
    int64_t count = 1;
    for (int d = 0; d < vi->rank; d++) {
        if (vi->dims[d] < 0 || vi->dims[d] > FUZZ_MAX_INPUT_ELEMENTS)
            return -1;
        count *= vi->dims[d];
        if (count > FUZZ_MAX_INPUT_ELEMENTS)
            return -1;
    }
    return count;
}

/* Run the session once with zero-filled inputs if the signature allows it. */
static void fuzz_run_once(kiln_session *session)
{
    const kiln_signature *sig = kiln_session_signature(session);
    if (!sig)
        return;
    int n = kiln_signature_input_count(sig);
    if (n < 0 || n > FUZZ_MAX_INPUTS)
        return;

    kiln_tensor *tensors[FUZZ_MAX_INPUTS] = {0};
    kiln_named_tensor named[FUZZ_MAX_INPUTS];
    int made = 0;
    for (; made < n; made++) {
        const kiln_value_info *vi = kiln_signature_input(sig, made);
        if (!vi || !vi->name || fuzz_small_count(vi) < 0)
            goto out_free_inputs;
        if (kiln_tensor_create(vi->dtype, vi->rank, vi->dims, &tensors[made]) != KILN_OK)
            goto out_free_inputs;
        named[made].name = vi->name;
        named[made].tensor = tensors[made];
    }

    kiln_outputs *outputs = NULL;
    kiln_run_options ro = {.deadline_ms = kiln_monotonic_ms() + FUZZ_RUN_DEADLINE_MS};
    if (kiln_session_run_opts(session, named, n, &ro, &outputs) == KILN_OK) {
        /* Touch every output so that a bad count or a dangling tensor shows. */
        int m = kiln_outputs_count(outputs);
        for (int i = 0; i < m; i++) {
            const kiln_tensor *t = kiln_outputs_get(outputs, i);
            (void)kiln_outputs_name(outputs, i);
            if (t && t->nbytes > 0 && t->data)
                (void)*(volatile const unsigned char *)t->data;
        }
        kiln_outputs_free(outputs);
    }

out_free_inputs:
    for (int i = 0; i < made; i++)
        kiln_tensor_free(tensors[i]);
}

/* The bytes as a mapped file, through sessions of every kind in turn. */
static void fuzz_mapped(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz_onnx", MFD_CLOEXEC);
    if (fd < 0)
        return;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    kiln_model *model = NULL;
    kiln_load_options lo = {.format = KILN_FORMAT_ONNX, .tags = NULL};
    if (write(fd, data, size) == (ssize_t)size && kiln_model_load(path, &lo, &model) == KILN_OK) {
        for (int kind = 0; kind < 3; kind++) {
            kiln_session_options so;
            kiln_session_options_init(&so);
            so.threads = 1;
            so.max_tensor_bytes = 64 << 20;
            so.optimize = kind != 1;
            so.reference = kind == 2;
            kiln_session *session = NULL;
            if (kiln_session_create(model, NULL, &so, &session) == KILN_OK) {
                fuzz_run_once(session);
                kiln_session_free(session);
            }
        }
        kiln_model_free(model);
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setenv("KILN_RELOAD_MIN_BYTES", "64", 0); /* no-op once set */
    kiln_load_options lo = {.format = KILN_FORMAT_ONNX, .tags = NULL};
    kiln_model *model = NULL;
    if (kiln_model_load_memory(data, size, &lo, &model) != KILN_OK) {
        /* A failure must come with a message; reading it checks it is a string. */
        const char *msg = kiln_last_error();
        if (msg)
            (void)*(volatile const char *)msg;
        return 0;
    }

    /* Inspection must work on anything that loaded. */
    kiln_model_stats stats;
    kiln_model_get_stats(model, &stats);
    for (int i = 0; i < kiln_model_op_kinds(model); i++) {
        const char *op;
        int count;
        kiln_model_op_kind(model, i, &op, &count);
    }

    kiln_session_options so;
    kiln_session_options_init(&so);
    so.threads = 1;  /* deterministic and cheap: one fuzz input, one thread */
    so.max_tensor_bytes = 64 << 20; /* a 100-byte model may not make us fill gigabytes */
    kiln_session *session = NULL;
    if (kiln_session_create(model, NULL, &so, &session) == KILN_OK) {
        fuzz_run_once(session);
        kiln_session_free(session);
    }
    kiln_model_free(model);
    fuzz_mapped(data, size);
    return 0;
}
