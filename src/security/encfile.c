/*
 * encfile.c - Kiln's encrypted model files (security.h).
 *
 * `kiln encrypt` turns FILE into FILE.kenc, and the server decrypts it in
 * memory (never to disk) before kiln_model_load_memory(). The layout:
 *     "KILNENC1"              8 bytes, magic and version
 *     L                       1 byte, the key id's length (1..64)
 *     key id                  L bytes of [A-Za-z0-9._-]: which key of the ring
 *     secretstream header     24 bytes (libsodium XChaCha20-Poly1305)
 *     chunks                  64 KiB of plaintext each (the last shorter),
 *                             each + 17 bytes of tag; the last carries
 *                             TAG_FINAL, so a truncated file is detected
 * Every chunk's associated data is the 9 + L header bytes followed by the
 * file's name (its path inside the model folder, without .kenc), so a
 * ciphertext renamed to another file of the folder, or given another key
 * id, fails to decrypt. The header parser and the decryptor are fuzzed
 * (fuzz/fuzz_encfile.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "security/security.h"

#define MAGIC "KILNENC1"
#define CHUNK 65536u
#define ABYTES crypto_secretstream_xchacha20poly1305_ABYTES
#define HBYTES crypto_secretstream_xchacha20poly1305_HEADERBYTES

kiln_status kiln_enc_parse_header(const uint8_t *data, size_t len, char *id_out,
                                  size_t *header_len, char *err)
{
    if (len < 9 || memcmp(data, MAGIC, 8) != 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "not a Kiln encrypted file (no 'KILNENC1' magic)");
        return KILN_ERR_INVALID_MODEL;
    }
    size_t l = data[8];
    if (len < 9 + l || !kiln_sec_key_id_valid((const char *)data + 9, l)) {
        snprintf(err, KILN_SEC_ERR_LEN, "the key id in the header is not 1-%d of "
                                        "A-Z a-z 0-9 . _ - (damaged header)", KILN_KEY_ID_MAX);
        return KILN_ERR_INVALID_MODEL;
    }
    if (len < 9 + l + HBYTES + ABYTES) {
        snprintf(err, KILN_SEC_ERR_LEN, "truncated: %zu bytes, too short for any content", len);
        return KILN_ERR_INVALID_MODEL;
    }
    memcpy(id_out, data + 9, l);
    id_out[l] = '\0';
    *header_len = 9 + l + HBYTES;
    return KILN_OK;
}

/* Associated data: the header's first 9 + L bytes, then the name. */
static unsigned char *make_ad(const uint8_t *hdr, size_t hl, const char *name, size_t *adlen)
{
    size_t nl = strlen(name);
    unsigned char *ad = malloc(hl + nl + 1);
    if (!ad) return NULL;
    memcpy(ad, hdr, hl);
    memcpy(ad + hl, name, nl);
    *adlen = hl + nl;
    return ad;
}

kiln_status kiln_enc_encrypt(const uint8_t *plain, size_t plain_len, const kiln_ring_key *key,
                             const char *name, uint8_t **out, size_t *out_len, char *err)
{
    kiln_status st = kiln_sec_init(err);
    if (st != KILN_OK) return st;
    size_t l = strlen(key->id);
    size_t chunks = plain_len / CHUNK + (plain_len % CHUNK || plain_len == 0);
    if (plain_len > SIZE_MAX / 2) {
        snprintf(err, KILN_SEC_ERR_LEN, "file too large to encrypt");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    size_t total = 9 + l + HBYTES + plain_len + chunks * ABYTES;
    uint8_t *buf = malloc(total);
    size_t adlen = 0;
    unsigned char *ad = NULL;
    if (buf) {
        memcpy(buf, MAGIC, 8);
        buf[8] = (uint8_t)l;
        memcpy(buf + 9, key->id, l);
        ad = make_ad(buf, 9 + l, name, &adlen);
    }
    if (!buf || !ad) {
        free(buf);
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    crypto_secretstream_xchacha20poly1305_state s;
    crypto_secretstream_xchacha20poly1305_init_push(&s, buf + 9 + l, key->key);
    size_t off = 0, w = 9 + l + HBYTES;
    for (size_t c = 0; c < chunks; c++) {
        size_t n = plain_len - off < CHUNK ? plain_len - off : CHUNK;
        unsigned char tag = c + 1 == chunks ? crypto_secretstream_xchacha20poly1305_TAG_FINAL : 0;
        unsigned long long clen = 0;
        crypto_secretstream_xchacha20poly1305_push(&s, buf + w, &clen, plain + off, n, ad, adlen,
                                                   tag);
        w += (size_t)clen;
        off += n;
    }
    sodium_memzero(&s, sizeof s);
    free(ad);
    *out = buf;
    *out_len = w;
    return KILN_OK;
}

void kiln_enc_plain_free(uint8_t *plain, size_t len)
{
    if (plain) sodium_memzero(plain, len);
    free(plain);
}

kiln_status kiln_enc_decrypt(const uint8_t *data, size_t len, const kiln_key_ring *ring,
                             const char *name, const char *what, uint8_t **plain,
                             size_t *plain_len, char *err)
{
    *plain = NULL;
    *plain_len = 0;
    kiln_status st = kiln_sec_init(err);
    if (st != KILN_OK) return st;
    char id[KILN_KEY_ID_MAX + 1], herr[KILN_SEC_ERR_LEN];
    size_t hl;
    st = kiln_enc_parse_header(data, len, id, &hl, herr);
    if (st != KILN_OK) {
        snprintf(err, KILN_SEC_ERR_LEN, "encrypted file '%.200s': %.280s", what, herr);
        return st;
    }
    const kiln_ring_key *key = kiln_sec_key_ring_find(ring, id);
    if (!key) {
        snprintf(err, KILN_SEC_ERR_LEN,
                 "encrypted file '%.200s': key id '%s' is not in the decryption key file",
                 what, id);
        return KILN_ERR_NOT_FOUND;
    }
    size_t adlen = 0;
    unsigned char *ad = make_ad(data, hl - HBYTES, name, &adlen);
    uint8_t *out = malloc(len - hl > 0 ? len - hl : 1); /* plaintext < ciphertext */
    if (!ad || !out) {
        free(ad);
        free(out);
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    crypto_secretstream_xchacha20poly1305_state s;
    if (crypto_secretstream_xchacha20poly1305_init_pull(&s, data + hl - HBYTES, key->key) != 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "encrypted file '%.200s': bad stream header", what);
        st = KILN_ERR_INVALID_MODEL;
        goto fail;
    }
    size_t off = hl, w = 0;
    int final = 0, chunk = 0;
    while (off < len) {
        size_t n = len - off < CHUNK + ABYTES ? len - off : CHUNK + ABYTES;
        if (final) {
            snprintf(err, KILN_SEC_ERR_LEN, "encrypted file '%.200s': data after the final chunk",
                     what);
            st = KILN_ERR_INVALID_MODEL;
            goto fail;
        }
        unsigned long long ml = 0;
        unsigned char tag = 0;
        if (n < ABYTES ||
            crypto_secretstream_xchacha20poly1305_pull(&s, out + w, &ml, &tag, data + off, n, ad,
                                                       adlen) != 0) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "encrypted file '%.200s': chunk %d does not authenticate with key '%s' "
                     "(wrong key for this id, altered ciphertext, or a file renamed from '%.80s')",
                     what, chunk, id, name);
            st = KILN_ERR_INVALID_MODEL;
            goto fail;
        }
        final = tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL;
        w += (size_t)ml;
        off += n;
        chunk++;
    }
    if (!final) {
        snprintf(err, KILN_SEC_ERR_LEN,
                 "encrypted file '%.200s': truncated (no final chunk after %d chunks)", what,
                 chunk);
        st = KILN_ERR_INVALID_MODEL;
        goto fail;
    }
    sodium_memzero(&s, sizeof s);
    free(ad);
    *plain = out;
    *plain_len = w;
    return KILN_OK;
fail:
    sodium_memzero(&s, sizeof s);
    kiln_enc_plain_free(out, len - hl);
    free(ad);
    return st;
}
