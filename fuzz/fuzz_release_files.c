/*
 * fuzz_release_files.c - libFuzzer target for the two release files the
 * model manager reads from a version folder (src/serve/gate/):
 * assets.extra/kiln_version.json (traceability) and
 * assets.extra/kiln_blessing.json (the gate's blessing).
 *
 * The input is given to both parsers. A failure must come with a message;
 * a version record that parses is written back as JSON and as KServe
 * parameters, and that JSON must parse again to an equal record (unless
 * escaping grew it past the file limit); a
 * blessing that parses must list sorted, unique, non-empty paths (a
 * mismatch aborts). Only crashes, hangs, leaks, sanitizer reports and that
 * abort count.
 *
 * Built with clang and -fsanitize=fuzzer as fuzz/fuzz_release_files (cmake
 * -DKILN_FUZZ=ON), and with fuzz/replay_main.c as
 * kiln_fuzz_replay_release_files, which the test suite runs over
 * tests/corpus/release_files.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/gate/release.h"

static int same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KILN_JSON_ERR_LEN];
    err[0] = '\0';
    kiln_version_info *vi = NULL;
    if (kiln_version_info_parse((const char *)data, size, "fuzz", &vi, err) == KILN_OK) {
        kiln_sbuf b = {0}, p = {0};
        int wrote;
        kiln_version_info_write_json(&b, vi);
        kiln_version_info_write_params(&p, vi, &wrote);
        kiln_version_info *again = NULL;
        /* escaping may grow the text past the file limit; only then may it not parse */
        if (b.oom) abort();
        if (kiln_version_info_parse(b.p, b.len, "again", &again, err) != KILN_OK) {
            if (b.len <= KILN_VERSION_INFO_MAX_BYTES) abort();
            again = NULL;
        }
        if (again && (!same(vi->source_commit, again->source_commit) ||
            !same(vi->data_version, again->data_version) ||
            !same(vi->training_run, again->training_run) || !same(vi->created, again->created) ||
            vi->n_labels != again->n_labels))
            abort();
        for (int i = 0; again && i < vi->n_labels; i++)
            if (strcmp(vi->label_keys[i], again->label_keys[i]) != 0 ||
                strcmp(vi->label_values[i], again->label_values[i]) != 0)
                abort();
        kiln_version_info_free(again);
        kiln_version_info_free(vi);
        kiln_sbuf_free(&b);
        kiln_sbuf_free(&p);
    } else if (!err[0]) {
        abort();
    }
    err[0] = '\0';
    kiln_blessing bl;
    if (kiln_blessing_parse((const char *)data, size, "fuzz", &bl, err) == KILN_OK) {
        for (int i = 0; i < bl.n_files; i++) {
            if (!bl.files[i].path[0]) abort();
            if (i && strcmp(bl.files[i - 1].path, bl.files[i].path) >= 0) abort();
        }
        kiln_blessing_free(&bl);
    } else if (!err[0]) {
        abort();
    }
    return 0;
}
