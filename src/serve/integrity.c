/*
 * integrity.c - signed and encrypted model versions in the server
 * (integrity.h; formats in docs/SECURITY.md).
 *
 * Order of checks for one version folder:
 *   1. with --trusted_keys: kiln.sig must be signed by a trusted key and
 *      list exactly the folder's files with their sizes and SHA-256;
 *   2. if the folder holds model.onnx.kenc: it is read once into memory
 *      (and, when signed, its digest is checked again on those very bytes,
 *      so a file swapped after step 1 is caught), decrypted with the key
 *      its header names from the key ring, loaded with
 *      kiln_model_load_memory(), and the plaintext wiped;
 *   3. otherwise the folder loads as usual (kiln_model_load).
 * SavedModel folders load from files only, so an encrypted SavedModel
 * (saved_model.pb.kenc) is refused with a message saying so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <sodium.h>

#include "security/security.h"
#include "serve/integrity.h"
#include "serve/json.h"

#define ENC_MODEL "model.onnx" KILN_ENC_SUFFIX
#define MODEL_FILE_MAX ((size_t)16 << 30)

kiln_status kiln_integrity_check_options(const kiln_integrity_options *o, char *err)
{
    char e[KILN_SEC_ERR_LEN];
    kiln_status st = kiln_sec_init(e);
    if (st == KILN_OK && o->trusted_keys_file) {
        kiln_trusted_keys tk;
        st = kiln_sec_read_trusted_keys(o->trusted_keys_file, &tk, e);
        if (st == KILN_OK) kiln_sec_trusted_keys_free(&tk);
        else snprintf(err, KILN_JSON_ERR_LEN, "--trusted_keys: %.480s", e);
        if (st != KILN_OK) return st;
    }
    if (st == KILN_OK && o->decryption_key_file) {
        kiln_key_ring ring;
        st = kiln_sec_read_key_ring(o->decryption_key_file, &ring, e);
        if (st == KILN_OK) kiln_sec_key_ring_free(&ring);
        else snprintf(err, KILN_JSON_ERR_LEN, "--model_decryption_key_file: %.470s", e);
        return st;
    }
    if (st != KILN_OK) snprintf(err, KILN_JSON_ERR_LEN, "%s", e);
    return st;
}

static int exists(const char *dir, const char *name)
{
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* Read, check against the manifest (if any), decrypt and load model.onnx.kenc. */
static kiln_status load_encrypted(const kiln_integrity_options *o, const char *dir,
                                  const kiln_manifest *signed_files, const kiln_load_options *lo,
                                  kiln_model **out, char *err)
{
    if (!o || !o->decryption_key_file) {
        snprintf(err, KILN_JSON_ERR_LEN,
                 "file '" ENC_MODEL "' is encrypted: start the server with "
                 "--model_decryption_key_file");
        return KILN_ERR_INVALID_MODEL;
    }
    char e[KILN_SEC_ERR_LEN], path[4200];
    kiln_key_ring ring;
    kiln_status st = kiln_sec_read_key_ring(o->decryption_key_file, &ring, e);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "--model_decryption_key_file: %.470s", e);
        return st;
    }
    snprintf(path, sizeof path, "%s/" ENC_MODEL, dir);
    uint8_t *ct = NULL, *plain = NULL;
    size_t ctlen = 0, plen = 0;
    st = kiln_sec_read_file(path, MODEL_FILE_MAX, &ct, &ctlen, e);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "%s", e);
        goto out_ring;
    }
    if (signed_files) {
        const kiln_manifest_entry *me = kiln_manifest_find(signed_files, ENC_MODEL);
        uint8_t sha[32];
        crypto_hash_sha256(sha, ct, ctlen);
        if (!me || me->size != ctlen || sodium_memcmp(sha, me->sha256, 32) != 0) {
            snprintf(err, KILN_JSON_ERR_LEN,
                     "file '" ENC_MODEL "' changed after its signature was checked");
            st = KILN_ERR_INVALID_MODEL;
            goto out_ct;
        }
    }
    st = kiln_enc_decrypt(ct, ctlen, &ring, "model.onnx", ENC_MODEL, &plain, &plen, e);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "%s", e);
        goto out_ct;
    }
    kiln_load_options mlo = *lo;
    mlo.format = KILN_FORMAT_ONNX;
    st = kiln_model_load_memory(plain, plen, &mlo, out);
    if (st != KILN_OK)
        snprintf(err, KILN_JSON_ERR_LEN, "'" ENC_MODEL "' (decrypted): %.420s", kiln_last_error());
    kiln_enc_plain_free(plain, plen);
out_ct:
    free(ct);
out_ring:
    kiln_sec_key_ring_free(&ring);
    return st;
}

kiln_status kiln_integrity_load(const kiln_integrity_options *o, const char *dir,
                                const kiln_load_options *lo, kiln_model **out, char *err)
{
    *out = NULL;
    kiln_manifest signed_files = {0, NULL};
    kiln_status st = KILN_OK;
    char e[KILN_SEC_ERR_LEN];
    if (o && o->trusted_keys_file) {
        kiln_trusted_keys tk;
        st = kiln_sec_read_trusted_keys(o->trusted_keys_file, &tk, e);
        if (st != KILN_OK) {
            snprintf(err, KILN_JSON_ERR_LEN, "--trusted_keys: %.480s", e);
            return st;
        }
        st = kiln_sec_verify_dir(dir, &tk, &signed_files, NULL, e);
        kiln_sec_trusted_keys_free(&tk);
        if (st != KILN_OK) {
            snprintf(err, KILN_JSON_ERR_LEN, "signature check failed: %.480s", e);
            return st;
        }
    }
    if (exists(dir, ENC_MODEL)) {
        st = load_encrypted(o, dir, o && o->trusted_keys_file ? &signed_files : NULL, lo, out,
                            err);
    } else if (exists(dir, "saved_model.pb" KILN_ENC_SUFFIX)) {
        snprintf(err, KILN_JSON_ERR_LEN,
                 "file 'saved_model.pb" KILN_ENC_SUFFIX "': encrypted SavedModel folders are not "
                 "supported (SavedModels load from files, not memory); encrypt an ONNX model");
        st = KILN_ERR_UNSUPPORTED;
    } else {
        st = kiln_model_load(dir, lo, out);
        if (st != KILN_OK)
            snprintf(err, KILN_JSON_ERR_LEN, "%s",
                     *kiln_last_error() ? kiln_last_error() : kiln_status_name(st));
    }
    kiln_manifest_free(&signed_files);
    return st;
}
