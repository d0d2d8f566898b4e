/*
 * fuzz_kiln_artifact.c - libFuzzer target for the compiled-artifact reader
 * (.kiln files, src/import/kiln_artifact.c).
 *
 * Every byte string must end in a loaded model or a status with a message:
 * never a crash, a hang, unbounded memory or a leak. The bytes are loaded
 * with kiln_model_load_memory as a .kiln file (in fuzzing builds the reader
 * computes its CRCs but goes on past a mismatch, so that mutations reach the
 * section parsers); what loads is inspected, and its signature is run once
 * on zero-filled inputs when they are small and fully known, through a
 * session in the file's precision, so that the plans see what a hostile
 * graph makes of them.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_kiln_artifact
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_kiln_artifact that the test suite runs over
 * tests/corpus/kiln_artifact (seeds written by tools/make_kiln_corpus.py).
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
    if (n < 0 || n > FUZZ_MAX_INPUTS) return;
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
            dims[d] = vi->dims[d] < 0 ? 1 : vi->dims[d];
            count *= dims[d];
            if (dims[d] > FUZZ_MAX_INPUT_ELEMENTS || count > FUZZ_MAX_INPUT_ELEMENTS) goto out;
        }
        if (kiln_tensor_create(vi->dtype, vi->rank, dims, &tensors[made]) != KILN_OK) goto out;
        named[made].name = vi->name;
        named[made].tensor = tensors[made];
    }
    kiln_outputs *outputs = NULL;
    kiln_run_options ro = {.deadline_ms = kiln_monotonic_ms() + FUZZ_RUN_DEADLINE_MS};
    if (kiln_session_run_opts(session, named, n, &ro, &outputs) == KILN_OK) {
        for (int i = 0; i < kiln_outputs_count(outputs); i++) {
            const kiln_tensor *t = kiln_outputs_get(outputs, i);
            if (t && t->nbytes > 0 && t->data) (void)*(volatile const unsigned char *)t->data;
        }
        kiln_outputs_free(outputs);
    }
out:
    for (int i = 0; i < made; i++) kiln_tensor_free(tensors[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the plans the file asks to precompile at load get the same bound as the run below */
    kiln_load_options lo = {.format = KILN_FORMAT_KILN, .tags = NULL, .max_tensor_bytes = 64 << 20};
    kiln_model *model = NULL;
    if (kiln_model_load_memory(data, size, &lo, &model) != KILN_OK) {
        const char *msg = kiln_last_error();
        if (msg) (void)*(volatile const char *)msg;
        return 0;
    }
    kiln_model_stats stats;
    kiln_model_get_stats(model, &stats);
    const char *report = kiln_model_compile_report(model);
    if (report) (void)*(volatile const char *)report;
    kiln_session_options so;
    kiln_session_options_init(&so);
    so.threads = 1;
    so.max_tensor_bytes = 64 << 20;
    kiln_session *session = NULL;
    if (kiln_session_create(model, NULL, &so, &session) == KILN_OK) {
        run_once(session);
        kiln_session_free(session);
    }
    kiln_model_free(model);
    return 0;
}
