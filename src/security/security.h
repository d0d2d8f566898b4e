/*
 * security.h - Kiln's model integrity and encryption at rest: key files,
 * the signed manifest of a model folder, and the encrypted-file format.
 *
 * This is a small library of its own (src/security/, built into the `kiln`
 * binary, not into libkiln): the CLI uses it to make keys, sign, verify,
 * encrypt and re-key model folders (src/cli/cmd_security.c), and the
 * server uses it when it loads a version (src/serve/integrity.c). It knows
 * files and bytes only, never the runtime's internals: what it hands on is
 * a verified folder or a decrypted buffer for kiln_model_load_memory().
 * All cryptography is libsodium's: Ed25519 signatures, SHA-256 file
 * digests, XChaCha20-Poly1305 secretstream. The formats are specified in
 * docs/SECURITY.md.
 *
 * Every fallible function returns a kiln_status and, on failure, writes a
 * one-line message naming the file and the problem into err
 * (KILN_SEC_ERR_LEN bytes). Nothing a file contains makes these abort.
 */
#ifndef KILN_SECURITY_SECURITY_H
#define KILN_SECURITY_SECURITY_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_SEC_ERR_LEN 512
#define KILN_SIG_FILE "kiln.sig"          /* the signature file, at a model folder's root */
#define KILN_ENC_SUFFIX ".kenc"           /* an encrypted file's name: the plaintext's + this */
#define KILN_KEY_ID_MAX 64                /* bytes of an encryption key id */
#define KILN_MANIFEST_MAX_FILES 100000    /* files a manifest may list */

/* ---- keys (keys.c) ---- */

/* An Ed25519 public key and its short id (hex of BLAKE2b-64 of the key). */
typedef struct kiln_pubkey {
    uint8_t pk[32];
    char id[17];
} kiln_pubkey;

typedef struct kiln_trusted_keys {
    int n;
    kiln_pubkey *keys; /* owned */
} kiln_trusted_keys;

/* A symmetric key of the encryption key ring. */
typedef struct kiln_ring_key {
    char id[KILN_KEY_ID_MAX + 1];
    uint8_t key[32];
} kiln_ring_key;

typedef struct kiln_key_ring {
    int n;
    kiln_ring_key *keys; /* owned; wiped when freed */
} kiln_key_ring;

/* Make an Ed25519 key pair and write PREFIX.key (mode 0600) and PREFIX.pub. */
kiln_status kiln_sec_keygen_sign(const char *prefix, char *err);
/* Make a random 256-bit encryption key; line_out receives "ID HEX\n" (a
 * key ring line, 2 + KILN_KEY_ID_MAX + 66 bytes at most). */
kiln_status kiln_sec_keygen_encrypt(const char *id, char *line_out, size_t cap, char *err);
/* Read a secret signing key file (PREFIX.key); sk is wiped by the caller. */
kiln_status kiln_sec_read_secret_key(const char *path, uint8_t sk[64], char *err);
/* Parse a trusted keys file: "kiln-ed25519-public-key HEX [comment]" lines. */
kiln_status kiln_sec_parse_trusted_keys(const char *text, size_t len, const char *what,
                                        kiln_trusted_keys *out, char *err);
kiln_status kiln_sec_read_trusted_keys(const char *path, kiln_trusted_keys *out, char *err);
void kiln_sec_trusted_keys_free(kiln_trusted_keys *t);
/* Parse a key ring file: "ID HEX64" lines. */
kiln_status kiln_sec_parse_key_ring(const char *text, size_t len, const char *what,
                                    kiln_key_ring *out, char *err);
kiln_status kiln_sec_read_key_ring(const char *path, kiln_key_ring *out, char *err);
void kiln_sec_key_ring_free(kiln_key_ring *r);
const kiln_ring_key *kiln_sec_key_ring_find(const kiln_key_ring *r, const char *id);
/* True if id is 1..KILN_KEY_ID_MAX characters of [A-Za-z0-9._-]. */
int kiln_sec_key_id_valid(const char *id, size_t len);

/* Read a whole file (at most max bytes) into a malloc'd buffer. */
kiln_status kiln_sec_read_file(const char *path, size_t max, uint8_t **data, size_t *size,
                               char *err);

/* ---- the manifest and its signature (manifest.c) ---- */

typedef struct kiln_manifest_entry {
    char *path;          /* relative, '/'-separated (owned) */
    uint64_t size;
    uint8_t sha256[32];
} kiln_manifest_entry;

typedef struct kiln_manifest {
    int n;
    kiln_manifest_entry *files; /* sorted by path, unique (owned) */
} kiln_manifest;

void kiln_manifest_free(kiln_manifest *m);
/* Hash every regular file under dir (except the root's kiln.sig) into m. */
kiln_status kiln_manifest_build(const char *dir, kiln_manifest *m, char *err);
/* Parse manifest lines ("sha256 HEX SIZE PATH\n", sorted, no duplicates). */
kiln_status kiln_manifest_parse(const char *text, size_t len, kiln_manifest *m, char *err);
const kiln_manifest_entry *kiln_manifest_find(const kiln_manifest *m, const char *path);

/* A parsed kiln.sig: the signer's key, the signature and the manifest. */
typedef struct kiln_signature_file {
    kiln_pubkey key;
    uint8_t sig[64];
    kiln_manifest manifest;
    const char *manifest_text;   /* the signed bytes, inside the caller's buffer */
    size_t manifest_len;
} kiln_signature_file;

/* Parse the bytes of a kiln.sig (no signature check). */
kiln_status kiln_sigfile_parse(const uint8_t *data, size_t len, kiln_signature_file *out,
                               char *err);
/* Write dir/kiln.sig: the manifest of dir signed with sk. */
kiln_status kiln_sec_sign_dir(const char *dir, const uint8_t sk[64], char *err);
/* Check dir against its kiln.sig: a trusted signer, a valid signature, and
 * exactly the signed files with their sizes and digests. On success, if
 * manifest_out is not NULL, it receives the verified manifest (owned by the
 * caller) and signer (17 bytes, if not NULL) the key's id. */
kiln_status kiln_sec_verify_dir(const char *dir, const kiln_trusted_keys *trusted,
                                kiln_manifest *manifest_out, char *signer, char *err);

/* ---- encrypted files (encfile.c) ---- */

/* Parse an encrypted file's header: its key id (id_out, KILN_KEY_ID_MAX+1
 * bytes). header_len receives the bytes before the first chunk. */
kiln_status kiln_enc_parse_header(const uint8_t *data, size_t len, char *id_out,
                                  size_t *header_len, char *err);
/* Encrypt plain under key (id) for the file name `name` (bound as associated
 * data); *out is malloc'd. */
kiln_status kiln_enc_encrypt(const uint8_t *plain, size_t plain_len, const kiln_ring_key *key,
                             const char *name, uint8_t **out, size_t *out_len, char *err);
/* Decrypt with the ring key named in the header; *plain is malloc'd (wipe
 * it with sodium_memzero before free). what names the file in messages. */
kiln_status kiln_enc_decrypt(const uint8_t *data, size_t len, const kiln_key_ring *ring,
                             const char *name, const char *what, uint8_t **plain,
                             size_t *plain_len, char *err);
/* Wipe and free a decrypted buffer. */
void kiln_enc_plain_free(uint8_t *plain, size_t len);

/* One-time libsodium initialisation; KILN_ERR_RUNTIME if it fails. */
kiln_status kiln_sec_init(char *err);

#endif
