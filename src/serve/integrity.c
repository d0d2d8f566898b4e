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
 *   3. if it holds saved_model.pb.kenc (an encrypted SavedModel): every
 *      file of the folder (but assets.extra/ and kiln.sig) is read once into
 *      memory (checked against the manifest when signed), each .kenc
 *      decrypted under its own name, and the lot loaded with
 *      kiln_model_load_files(), which reads nothing from disk; the
 *      plaintexts are wiped after;
 *   4. otherwise the folder loads as usual (kiln_model_load).
 */
#include <dirent.h>
#include <errno.h>
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

/* An encrypted SavedModel folder held in memory: every file's bytes, the
 * .kenc ones decrypted (under their names without the suffix). */
typedef struct mem_folder {
    kiln_memory_file *files;
    uint8_t **owned;   /* per file: the buffer to free */
    int *decrypted;    /* per file: wipe before freeing */
    int n, cap;
} mem_folder;

static void mem_folder_free(mem_folder *f)
{
    for (int i = 0; i < f->n; i++) {
        if (f->decrypted[i]) kiln_enc_plain_free(f->owned[i], f->files[i].size);
        else free(f->owned[i]);
        free((char *)f->files[i].path);
    }
    free(f->files);
    free(f->owned);
    free(f->decrypted);
}

/* Read (and decrypt) the files under dir/rel into f; assets.extra/ (the
 * warmup file, read by the server) and the root's kiln.sig are left out. */
static kiln_status mem_folder_walk(const kiln_integrity_options *o, const kiln_key_ring *ring,
                                   const kiln_manifest *signed_files, const char *dir,
                                   const char *rel, int depth, mem_folder *f, char *err)
{
    char dpath[8400];
    snprintf(dpath, sizeof dpath, "%s%s%s", dir, *rel ? "/" : "", rel);
    DIR *d = depth > 16 ? NULL : opendir(dpath);
    if (!d) {
        snprintf(err, KILN_JSON_ERR_LEN, "folder '%.300s': %s", dpath,
                 depth > 16 ? "nested too deep" : strerror(errno));
        return KILN_ERR_IO;
    }
    (void)o;
    kiln_status st = KILN_OK;
    struct dirent *e;
    while (st == KILN_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (depth == 0 && (strcmp(e->d_name, KILN_SIG_FILE) == 0 ||
                           strcmp(e->d_name, "assets.extra") == 0))
            continue;
        char crel[4096], cpath[8400];
        snprintf(crel, sizeof crel, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(cpath, sizeof cpath, "%s/%s", dir, crel);
        struct stat sb;
        if (lstat(cpath, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            st = mem_folder_walk(o, ring, signed_files, dir, crel, depth + 1, f, err);
            continue;
        }
        if (!S_ISREG(sb.st_mode)) continue;
        if (f->n == f->cap) {
            int cap = f->cap ? 2 * f->cap : 16;
            kiln_memory_file *nf = realloc(f->files, (size_t)cap * sizeof *nf);
            if (nf) f->files = nf;
            uint8_t **no = realloc(f->owned, (size_t)cap * sizeof *no);
            if (no) f->owned = no;
            int *nd = realloc(f->decrypted, (size_t)cap * sizeof *nd);
            if (nd) f->decrypted = nd;
            if (!nf || !no || !nd || f->n > 100000) {
                snprintf(err, KILN_JSON_ERR_LEN, "out of memory (or over 100000 files) in '%.300s'",
                         dir);
                st = KILN_ERR_OUT_OF_MEMORY;
                break;
            }
            f->cap = cap;
        }
        char e2[KILN_SEC_ERR_LEN];
        uint8_t *data = NULL;
        size_t len = 0;
        st = kiln_sec_read_file(cpath, MODEL_FILE_MAX, &data, &len, e2);
        if (st != KILN_OK) {
            snprintf(err, KILN_JSON_ERR_LEN, "%s", e2);
            break;
        }
        if (signed_files) { /* the bytes read now are the bytes that were verified */
            const kiln_manifest_entry *me = kiln_manifest_find(signed_files, crel);
            uint8_t sha[32];
            crypto_hash_sha256(sha, data, len);
            if (!me || me->size != len || sodium_memcmp(sha, me->sha256, 32) != 0) {
                snprintf(err, KILN_JSON_ERR_LEN, "file '%.300s' changed after its signature was "
                         "checked", crel);
                free(data);
                st = KILN_ERR_INVALID_MODEL;
                break;
            }
        }
        size_t nl = strlen(crel), sl = strlen(KILN_ENC_SUFFIX);
        int enc = nl > sl && strcmp(crel + nl - sl, KILN_ENC_SUFFIX) == 0;
        uint8_t *plain = data;
        size_t plen = len;
        if (enc) {
            crel[nl - sl] = '\0'; /* the plaintext's name, bound as associated data */
            char what[sizeof crel + sizeof KILN_ENC_SUFFIX];
            snprintf(what, sizeof what, "%s" KILN_ENC_SUFFIX, crel);
            st = kiln_enc_decrypt(data, len, ring, crel, what, &plain, &plen, e2);
            free(data);
            if (st != KILN_OK) {
                snprintf(err, KILN_JSON_ERR_LEN, "%s", e2);
                break;
            }
        }
        char *path = strdup(crel);
        if (!path) {
            if (enc) kiln_enc_plain_free(plain, plen);
            else free(plain);
            snprintf(err, KILN_JSON_ERR_LEN, "out of memory");
            st = KILN_ERR_OUT_OF_MEMORY;
            break;
        }
        f->files[f->n] = (kiln_memory_file){path, plain, plen};
        f->owned[f->n] = plain;
        f->decrypted[f->n] = enc;
        f->n++;
    }
    closedir(d);
    return st;
}

/* An encrypted SavedModel: every file read once, the .kenc ones decrypted in
 * memory, and the lot loaded with kiln_model_load_files (nothing written). */
static kiln_status load_encrypted_folder(const kiln_integrity_options *o, const char *dir,
                                         const kiln_manifest *signed_files,
                                         const kiln_load_options *lo, kiln_model **out, char *err)
{
    if (!o || !o->decryption_key_file) {
        snprintf(err, KILN_JSON_ERR_LEN,
                 "file 'saved_model.pb" KILN_ENC_SUFFIX "' is encrypted: start the server with "
                 "--model_decryption_key_file");
        return KILN_ERR_INVALID_MODEL;
    }
    char e[KILN_SEC_ERR_LEN];
    kiln_key_ring ring;
    kiln_status st = kiln_sec_read_key_ring(o->decryption_key_file, &ring, e);
    if (st != KILN_OK) {
        snprintf(err, KILN_JSON_ERR_LEN, "--model_decryption_key_file: %.470s", e);
        return st;
    }
    mem_folder f = {0};
    st = mem_folder_walk(o, &ring, signed_files, dir, "", 0, &f, err);
    kiln_sec_key_ring_free(&ring);
    if (st == KILN_OK) {
        kiln_load_options mlo = *lo;
        mlo.format = KILN_FORMAT_SAVEDMODEL;
        st = kiln_model_load_files(dir, f.files, f.n, &mlo, out);
        if (st != KILN_OK)
            snprintf(err, KILN_JSON_ERR_LEN, "(decrypted SavedModel): %.440s", kiln_last_error());
    }
    mem_folder_free(&f);
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
    } else if (exists(dir, "saved_model.pb" KILN_ENC_SUFFIX) ||
               exists(dir, "saved_model.pbtxt" KILN_ENC_SUFFIX)) {
        st = load_encrypted_folder(o, dir, o && o->trusted_keys_file ? &signed_files : NULL, lo,
                                   out, err);
    } else {
        st = kiln_model_load(dir, lo, out);
        if (st != KILN_OK)
            snprintf(err, KILN_JSON_ERR_LEN, "%s",
                     *kiln_last_error() ? kiln_last_error() : kiln_status_name(st));
    }
    kiln_manifest_free(&signed_files);
    return st;
}
