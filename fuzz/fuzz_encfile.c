/*
 * fuzz_encfile.c - libFuzzer target for Kiln's encrypted model files
 * (src/security/encfile.c): the header parser and the chunked decryptor.
 *
 * The input is a .kenc file decrypted as "model.onnx" with a key ring of
 * two fixed keys, "fuzz" (32 bytes of 0x01) and "other" (0x02): the seeds
 * in tests/corpus/encfile are real files encrypted under "fuzz", so the
 * fuzzer starts past the authentication. A failure must come with a
 * message; a success must give no more plaintext than the input had bytes,
 * and re-encrypting that plaintext and decrypting again must give it back
 * (a mismatch aborts). Only crashes, hangs, leaks, sanitizer reports and
 * that abort count.
 *
 * Built with clang and -fsanitize=fuzzer as fuzz/fuzz_encfile (cmake
 * -DKILN_FUZZ=ON), and with fuzz/replay_main.c as kiln_fuzz_replay_encfile,
 * which the test suite runs over tests/corpus/encfile.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "security/security.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_ring_key keys[2];
    memset(keys, 0, sizeof keys);
    strcpy(keys[0].id, "fuzz");
    memset(keys[0].key, 1, 32);
    strcpy(keys[1].id, "other");
    memset(keys[1].key, 2, 32);
    kiln_key_ring ring = {2, keys};
    char err[KILN_SEC_ERR_LEN], id[KILN_KEY_ID_MAX + 1];
    err[0] = '\0';
    size_t hl;
    if (kiln_enc_parse_header(data, size, id, &hl, err) == KILN_OK) {
        if (hl > size || !kiln_sec_key_id_valid(id, strlen(id))) abort();
    } else if (!err[0]) {
        abort();
    }
    err[0] = '\0';
    uint8_t *plain = NULL, *ct = NULL, *again = NULL;
    size_t plen = 0, ctlen = 0, alen = 0;
    if (kiln_enc_decrypt(data, size, &ring, "model.onnx", "fuzz", &plain, &plen, err) != KILN_OK) {
        if (!err[0]) abort();
        return 0;
    }
    if (plen > size) abort();
    if (kiln_enc_encrypt(plain, plen, &keys[1], "model.onnx", &ct, &ctlen, err) != KILN_OK ||
        kiln_enc_decrypt(ct, ctlen, &ring, "model.onnx", "fuzz", &again, &alen, err) != KILN_OK ||
        alen != plen || (plen && memcmp(plain, again, plen) != 0))
        abort();
    kiln_enc_plain_free(plain, plen);
    kiln_enc_plain_free(again, alen);
    free(ct);
    return 0;
}
