/*
 * fuzz_tflite.c - libFuzzer target for the TFLite importer (the FlatBuffer
 * reader in src/import/flatbuf.c, the model reader and the lowering in
 * src/import/tflite*.c).
 *
 * Every byte string must end in a loaded model or a status with a message:
 * never a crash, a hang, unbounded memory or a leak. The bytes are loaded
 * with kiln_model_load_memory as a TFLite model; what loads is inspected,
 * and each signature whose inputs all have small, fully known shapes is run
 * once on zero-filled inputs through an optimized, an as-imported and a
 * reference session, so that the quantized kernels and the lowered float
 * graphs see what a hostile file makes of them.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_tflite
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_tflite that the test suite runs over tests/corpus/tflite
 * (seeds written by tools/make_tflite_corpus.py).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kiln/kiln.h"

#define FUZZ_MAX_INPUT_ELEMENTS 4096
/* A run stops here, as a server's request timeout stops it: a While or Loop whose
 * condition never turns false is the model's meaning, not a defect, and would otherwise
 * run to the loop bound (2^24 iterations). */
#define FUZZ_RUN_DEADLINE_MS 1000
#define FUZZ_MAX_INPUTS 16

/* Run the session once with zero-filled inputs if every input is small and known. */
static void run_once(kiln_session *session)
{
    const kiln_signature *sig = kiln_session_signature(session);
    int n = sig ? kiln_signature_input_count(sig) : -1;
    if (n < 0 || n > FUZZ_MAX_INPUTS)
        return;
    kiln_tensor *tensors[FUZZ_MAX_INPUTS] = {0};
    kiln_named_tensor named[FUZZ_MAX_INPUTS];
    int made = 0;
    for (; made < n; made++) {
        const kiln_value_info *vi = kiln_signature_input(sig, made);
        if (!vi || !vi->name || vi->dtype <= KILN_DTYPE_UNDEFINED || vi->dtype >= KILN_DTYPE_COUNT ||
            vi->rank < 0 || vi->rank > KILN_MAX_RANK)
            goto out;
        int64_t count = 1, dims[KILN_MAX_RANK];
        for (int d = 0; d < vi->rank; d++) {
            dims[d] = vi->dims[d] < 0 ? 1 : vi->dims[d]; /* a free dim (batch) of 1 */
            count *= dims[d];
            if (dims[d] > FUZZ_MAX_INPUT_ELEMENTS || count > FUZZ_MAX_INPUT_ELEMENTS)
                goto out;
        }
        if (kiln_tensor_create(vi->dtype, vi->rank, dims, &tensors[made]) != KILN_OK)
            goto out;
        named[made].name = vi->name;
        named[made].tensor = tensors[made];
    }
    kiln_outputs *outputs = NULL;
    kiln_run_options ro = {.deadline_ms = kiln_monotonic_ms() + FUZZ_RUN_DEADLINE_MS};
    if (kiln_session_run_opts(session, named, n, &ro, &outputs) == KILN_OK) {
        for (int i = 0; i < kiln_outputs_count(outputs); i++) {
            const kiln_tensor *t = kiln_outputs_get(outputs, i);
            if (t && t->nbytes > 0 && t->data)
                (void)*(volatile const unsigned char *)t->data;
        }
        kiln_outputs_free(outputs);
    }
out:
    for (int i = 0; i < made; i++)
        kiln_tensor_free(tensors[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_load_options lo = {.format = KILN_FORMAT_TFLITE, .tags = NULL};
    kiln_model *model = NULL;
    if (kiln_model_load_memory(data, size, &lo, &model) != KILN_OK) {
        const char *msg = kiln_last_error();
        if (msg)
            (void)*(volatile const char *)msg;
        return 0;
    }
    kiln_model_stats stats;
    kiln_model_get_stats(model, &stats);
    for (int s = 0; s < kiln_model_signature_count(model) && s < 4; s++) {
        const kiln_signature *sig = kiln_model_signature(model, s);
        for (int kind = 0; kind < 3; kind++) {
            kiln_session_options so;
            kiln_session_options_init(&so);
            so.threads = 1;
            so.max_tensor_bytes = 64 << 20;
            so.optimize = kind != 1;
            so.reference = kind == 2;
            kiln_session *session = NULL;
            if (kiln_session_create(model, kiln_signature_name(sig), &so, &session) == KILN_OK) {
                run_once(session);
                kiln_session_free(session);
            }
        }
    }
    kiln_model_free(model);
    return 0;
}
