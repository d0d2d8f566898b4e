/*
 * integrity.h - how the model manager loads a version folder when the
 * server checks signatures (--trusted_keys) or decrypts models
 * (--model_decryption_key_file).
 *
 * kiln_integrity_load() replaces the manager's plain kiln_model_load():
 * with trusted keys it first verifies the folder's kiln.sig (src/security/),
 * and with a key ring it reads model.onnx.kenc, decrypts it in memory and
 * hands the bytes to kiln_model_load_memory(), so plaintext never touches
 * the disk. A refusal is an ordinary load failure: the version shows END
 * with the message (naming the file) and the previous version keeps
 * serving. The key files are re-read at every load, so adding a key to the
 * ring or the trusted keys takes effect for the next new version without a
 * restart.
 */
#ifndef KILN_SERVE_INTEGRITY_H
#define KILN_SERVE_INTEGRITY_H

#include "kiln/kiln.h"

typedef struct kiln_integrity_options {
    const char *trusted_keys_file;   /* --trusted_keys: NULL = signatures not required */
    const char *decryption_key_file; /* --model_decryption_key_file: NULL = none */
} kiln_integrity_options;

/* Check that the key files parse (at startup); err is KILN_JSON_ERR_LEN bytes. */
kiln_status kiln_integrity_check_options(const kiln_integrity_options *o, char *err);
/* Load the model of version folder dir as the options require. o may be
 * NULL (a plain kiln_model_load). err: KILN_JSON_ERR_LEN bytes. */
kiln_status kiln_integrity_load(const kiln_integrity_options *o, const char *dir,
                                const kiln_load_options *lo, kiln_model **out, char *err);

#endif
