/*
 * fuzz_manifest.c - libFuzzer target for the parsers of signing files
 * (src/security/): kiln.sig with its manifest, trusted keys files and
 * encryption key ring files.
 *
 * The input is given to each parser. A failure must come with a message;
 * a kiln.sig that parses must hold a sorted manifest of clean relative
 * paths, each of which kiln_manifest_find finds again (a mismatch aborts).
 * Only crashes, hangs, leaks, sanitizer reports and that abort count.
 *
 * Built with clang and -fsanitize=fuzzer as fuzz/fuzz_manifest (cmake
 * -DKILN_FUZZ=ON), and with fuzz/replay_main.c as kiln_fuzz_replay_manifest,
 * which the test suite runs over tests/corpus/manifest.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "security/security.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KILN_SEC_ERR_LEN];
    err[0] = '\0';
    kiln_signature_file sf;
    if (kiln_sigfile_parse(data, size, &sf, err) == KILN_OK) {
        for (int i = 0; i < sf.manifest.n; i++) {
            const char *p = sf.manifest.files[i].path;
            if (!p[0] || p[0] == '/' || strstr(p, "//") ||
                kiln_manifest_find(&sf.manifest, p) != &sf.manifest.files[i])
                abort();
            if (i && strcmp(sf.manifest.files[i - 1].path, p) >= 0) abort();
        }
        kiln_manifest_free(&sf.manifest);
    } else if (!err[0]) {
        abort();
    }
    err[0] = '\0';
    kiln_trusted_keys tk;
    if (kiln_sec_parse_trusted_keys((const char *)data, size, "fuzz", &tk, err) == KILN_OK)
        kiln_sec_trusted_keys_free(&tk);
    else if (!err[0])
        abort();
    err[0] = '\0';
    kiln_key_ring ring;
    if (kiln_sec_parse_key_ring((const char *)data, size, "fuzz", &ring, err) == KILN_OK) {
        for (int i = 0; i < ring.n; i++)
            if (kiln_sec_key_ring_find(&ring, ring.keys[i].id) != &ring.keys[i]) abort();
        kiln_sec_key_ring_free(&ring);
    } else if (!err[0]) {
        abort();
    }
    return 0;
}
