/*
 * cmd_security.c - `kiln keygen`, `kiln sign`, `kiln verify`, `kiln encrypt`
 * and `kiln rekey`: signing and encrypting model folders.
 *
 * Thin command-line shells over src/security/ (security.h), which the
 * server uses too (src/serve/integrity.c) when it loads a version with
 * --trusted_keys or --model_decryption_key_file. Formats and the workflow
 * are in docs/SECURITY.md.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "cli/cli.h"
#include "security/security.h"

#define MODEL_FILE_MAX ((size_t)16 << 30)

static const char keygen_help[] =
    "usage: kiln keygen -o PREFIX            an Ed25519 signing key pair:\n"
    "                                        PREFIX.key (secret, mode 0600), PREFIX.pub\n"
    "       kiln keygen --encryption --key-id ID [-o FILE]\n"
    "                                        a 256-bit encryption key as a key ring line\n"
    "                                        'ID HEX', appended to FILE (created 0600) or printed\n"
    "Trusted keys for 'kiln verify' and 'kiln serve --trusted_keys' are .pub lines, one per key.\n";

int kiln_cmd_keygen(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) return fputs(keygen_help, stdout), KILN_CLI_EXIT_OK;
    const char *out = NULL, *id = NULL;
    int enc = 0, r;
    for (int i = 0; i < argc; i++) {
        if ((r = kiln_cli_option("keygen", argc, argv, &i, "-o", &out)) != 0 ||
            (r = kiln_cli_option("keygen", argc, argv, &i, "--key-id", &id)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option("keygen", argc, argv, &i, "--encryption", NULL)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            enc = 1;
        } else {
            return kiln_cli_usage_error("keygen", "unexpected argument '%s'", argv[i]);
        }
    }
    char err[KILN_SEC_ERR_LEN];
    if (!enc) {
        if (!out) return kiln_cli_usage_error("keygen", "-o PREFIX is required");
        if (kiln_sec_keygen_sign(out, err) != KILN_OK) return kiln_cli_fail("%s", err);
        fprintf(stderr, "kiln keygen: wrote %s.key (secret) and %s.pub\n", out, out);
        return KILN_CLI_EXIT_OK;
    }
    if (!id) return kiln_cli_usage_error("keygen", "--encryption needs --key-id ID");
    char line[KILN_KEY_ID_MAX + 80];
    if (kiln_sec_keygen_encrypt(id, line, sizeof line, err) != KILN_OK)
        return kiln_cli_fail("%s", err);
    if (!out) {
        fputs(line, stdout);
    } else {
        int fd = open(out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        ssize_t n = (ssize_t)strlen(line);
        int ok = fd >= 0 && write(fd, line, (size_t)n) == n;
        if (fd >= 0 && close(fd) != 0) ok = 0;
        sodium_memzero(line, sizeof line);
        if (!ok) return kiln_cli_fail("cannot append to '%s': %s", out, strerror(errno));
        fprintf(stderr, "kiln keygen: key '%s' appended to %s\n", id, out);
    }
    sodium_memzero(line, sizeof line);
    return KILN_CLI_EXIT_OK;
}

static const char sign_help[] =
    "usage: kiln sign MODEL_DIR --key PREFIX.key\n"
    "Hashes every file of MODEL_DIR (SHA-256) into a manifest, signs it with the\n"
    "Ed25519 key and writes MODEL_DIR/kiln.sig. Sign the folder as it will be served\n"
    "(after 'kiln encrypt', if encrypted).\n";

int kiln_cmd_sign(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) return fputs(sign_help, stdout), KILN_CLI_EXIT_OK;
    const char *dir = NULL, *key = NULL;
    for (int i = 0; i < argc; i++) {
        int r = kiln_cli_option("sign", argc, argv, &i, "--key", &key);
        if (r < 0) return KILN_CLI_EXIT_USAGE;
        if (r > 0) continue;
        if (dir || argv[i][0] == '-')
            return kiln_cli_usage_error("sign", "unexpected argument '%s'", argv[i]);
        dir = argv[i];
    }
    if (!dir || !key) return kiln_cli_usage_error("sign", "MODEL_DIR and --key are required");
    char err[KILN_SEC_ERR_LEN];
    uint8_t sk[64];
    if (kiln_sec_init(err) != KILN_OK || kiln_sec_read_secret_key(key, sk, err) != KILN_OK)
        return kiln_cli_fail("%s", err);
    kiln_status st = kiln_sec_sign_dir(dir, sk, err);
    sodium_memzero(sk, sizeof sk);
    if (st != KILN_OK) return kiln_cli_fail("%s: %s", dir, err);
    fprintf(stderr, "kiln sign: wrote %s/" KILN_SIG_FILE "\n", dir);
    return KILN_CLI_EXIT_OK;
}

static const char verify_help[] =
    "usage: kiln verify MODEL_DIR --trusted_keys FILE\n"
    "Checks MODEL_DIR/kiln.sig: signed by a key in FILE, a valid signature, and\n"
    "every file present with the signed size and SHA-256 (no file missing, none\n"
    "added). Exit 0 and 'OK' if so; else 1 and the file that differs.\n";

int kiln_cmd_verify(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) return fputs(verify_help, stdout), KILN_CLI_EXIT_OK;
    const char *dir = NULL, *keys = NULL;
    for (int i = 0; i < argc; i++) {
        int r = kiln_cli_option("verify", argc, argv, &i, "--trusted_keys", &keys);
        if (r == 0) r = kiln_cli_option("verify", argc, argv, &i, "--trusted-keys", &keys);
        if (r < 0) return KILN_CLI_EXIT_USAGE;
        if (r > 0) continue;
        if (dir || argv[i][0] == '-')
            return kiln_cli_usage_error("verify", "unexpected argument '%s'", argv[i]);
        dir = argv[i];
    }
    if (!dir || !keys)
        return kiln_cli_usage_error("verify", "MODEL_DIR and --trusted_keys are required");
    char err[KILN_SEC_ERR_LEN], signer[17];
    kiln_trusted_keys tk;
    if (kiln_sec_init(err) != KILN_OK || kiln_sec_read_trusted_keys(keys, &tk, err) != KILN_OK)
        return kiln_cli_fail("--trusted_keys: %s", err);
    kiln_manifest m;
    kiln_status st = kiln_sec_verify_dir(dir, &tk, &m, signer, err);
    kiln_sec_trusted_keys_free(&tk);
    if (st != KILN_OK) return kiln_cli_fail("%s: %s", dir, err);
    printf("OK: %s: %d files signed by key %s\n", dir, m.n, signer);
    kiln_manifest_free(&m);
    return KILN_CLI_EXIT_OK;
}

/* Write data to path via a temporary file and rename (mode 0644). */
static kiln_status write_file(const char *path, const uint8_t *data, size_t len, char *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "cannot create '%.300s': %s", tmp, strerror(errno));
        return KILN_ERR_IO;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    if (close(fd) != 0 || off != len || rename(tmp, path) != 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "cannot write '%.300s': %s", path, strerror(errno));
        unlink(tmp);
        return KILN_ERR_IO;
    }
    return KILN_OK;
}

typedef struct enc_job {
    const char *in_root, *out_root; /* out_root NULL: rekey in place */
    const kiln_key_ring *ring;
    const kiln_ring_key *key;       /* the key to encrypt under */
    int files;
} enc_job;

/* Encrypt (or, for rekey, re-encrypt) the files under in_root/rel. */
static kiln_status enc_walk(enc_job *j, const char *rel, int depth, char *err)
{
    char dirpath[8192];
    snprintf(dirpath, sizeof dirpath, "%s%s%s", j->in_root, *rel ? "/" : "", rel);
    if (depth > 32) {
        snprintf(err, KILN_SEC_ERR_LEN, "'%.300s' is nested too deep", dirpath);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (j->out_root) {
        char od[8192];
        snprintf(od, sizeof od, "%s%s%s", j->out_root, *rel ? "/" : "", rel);
        if (mkdir(od, 0755) != 0 && errno != EEXIST) {
            snprintf(err, KILN_SEC_ERR_LEN, "cannot create '%.300s': %s", od, strerror(errno));
            return KILN_ERR_IO;
        }
    }
    DIR *d = opendir(dirpath);
    if (!d) {
        snprintf(err, KILN_SEC_ERR_LEN, "'%.300s': %s", dirpath, strerror(errno));
        return KILN_ERR_IO;
    }
    kiln_status st = KILN_OK;
    struct dirent *e;
    while (st == KILN_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char crel[4096], cpath[8192];
        snprintf(crel, sizeof crel, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(cpath, sizeof cpath, "%s/%s", j->in_root, crel);
        struct stat sb;
        if (lstat(cpath, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            st = enc_walk(j, crel, depth + 1, err);
            continue;
        }
        if (!S_ISREG(sb.st_mode)) continue;
        size_t nl = strlen(crel), sl = strlen(KILN_ENC_SUFFIX);
        int is_enc = nl > sl && strcmp(crel + nl - sl, KILN_ENC_SUFFIX) == 0;
        if (depth == 0 && strcmp(e->d_name, KILN_SIG_FILE) == 0) continue; /* re-sign after */
        uint8_t *data, *plain = NULL, *ct = NULL;
        size_t len, plen = 0, ctlen = 0;
        st = kiln_sec_read_file(cpath, MODEL_FILE_MAX, &data, &len, err);
        if (st != KILN_OK) break;
        char name[4096], opath[8192];
        if (!j->out_root) { /* rekey: only .kenc files, in place */
            if (!is_enc) {
                free(data);
                continue;
            }
            snprintf(name, sizeof name, "%.*s", (int)(nl - sl), crel);
            st = kiln_enc_decrypt(data, len, j->ring, name, crel, &plain, &plen, err);
            free(data);
            if (st != KILN_OK) break;
            snprintf(opath, sizeof opath, "%s", cpath);
        } else if (is_enc || strncmp(crel, "assets.extra/", 13) == 0) {
            /* already encrypted, or warmup requests: copied as they are */
            snprintf(opath, sizeof opath, "%s/%s", j->out_root, crel);
            st = write_file(opath, data, len, err);
            free(data);
            continue;
        } else {
            snprintf(name, sizeof name, "%s", crel);
            plain = data;
            plen = len;
            snprintf(opath, sizeof opath, "%s/%s" KILN_ENC_SUFFIX, j->out_root, crel);
        }
        st = kiln_enc_encrypt(plain, plen, j->key, name, &ct, &ctlen, err);
        kiln_enc_plain_free(plain, plen);
        if (st != KILN_OK) break;
        st = write_file(opath, ct, ctlen, err);
        free(ct);
        j->files++;
    }
    closedir(d);
    return st;
}

static int enc_command(const char *cmd, int argc, char **argv, const char *help)
{
    if (kiln_cli_wants_help(argc, argv)) return fputs(help, stdout), KILN_CLI_EXIT_OK;
    const char *dir = NULL, *keyfile = NULL, *id = NULL, *out = NULL;
    int rekey = strcmp(cmd, "rekey") == 0;
    for (int i = 0; i < argc; i++) {
        int r;
        if ((r = kiln_cli_option(cmd, argc, argv, &i, "--key", &keyfile)) != 0 ||
            (r = kiln_cli_option(cmd, argc, argv, &i, "--key-id", &id)) != 0 ||
            (!rekey && (r = kiln_cli_option(cmd, argc, argv, &i, "-o", &out)) != 0)) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            continue;
        }
        if (dir || argv[i][0] == '-')
            return kiln_cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
        dir = argv[i];
    }
    if (!dir || !keyfile || !id || (!rekey && !out))
        return kiln_cli_usage_error(cmd, rekey ? "MODEL_DIR, --key and --key-id are required"
                                               : "MODEL_DIR, --key, --key-id and -o are required");
    char err[KILN_SEC_ERR_LEN];
    kiln_key_ring ring;
    if (kiln_sec_init(err) != KILN_OK || kiln_sec_read_key_ring(keyfile, &ring, err) != KILN_OK)
        return kiln_cli_fail("--key: %s", err);
    enc_job j = {dir, out, &ring, kiln_sec_key_ring_find(&ring, id), 0};
    if (!j.key) {
        kiln_sec_key_ring_free(&ring);
        return kiln_cli_fail("--key-id '%s' is not in %s", id, keyfile);
    }
    struct stat sb;
    if (out && stat(out, &sb) == 0)
        return kiln_sec_key_ring_free(&ring), kiln_cli_fail("-o '%s' exists already", out);
    kiln_status st = enc_walk(&j, "", 0, err);
    kiln_sec_key_ring_free(&ring);
    if (st != KILN_OK) return kiln_cli_fail("%s: %s", dir, err);
    fprintf(stderr, "kiln %s: %d files %s under key '%s'%s\n", cmd, j.files,
            rekey ? "re-encrypted" : "encrypted", id,
            rekey ? "; sign the folder again if it was signed" : "");
    return KILN_CLI_EXIT_OK;
}

static const char encrypt_help[] =
    "usage: kiln encrypt MODEL_DIR --key KEYRING --key-id ID -o OUT_DIR\n"
    "Writes OUT_DIR with every file of MODEL_DIR encrypted into NAME.kenc\n"
    "(XChaCha20-Poly1305 under key ID of the key ring file; the id is in each\n"
    "file's header, the file's name is bound as associated data). assets.extra/\n"
    "is copied as is. 'kiln serve --model_decryption_key_file=KEYRING' loads\n"
    "OUT_DIR's model.onnx.kenc in memory.\n";

static const char rekey_help[] =
    "usage: kiln rekey MODEL_DIR --key KEYRING --key-id NEW_ID\n"
    "Re-encrypts every .kenc file of MODEL_DIR in place under key NEW_ID (each is\n"
    "decrypted in memory with the key its header names, which must be in KEYRING).\n";

int kiln_cmd_encrypt(int argc, char **argv) { return enc_command("encrypt", argc, argv, encrypt_help); }
int kiln_cmd_rekey(int argc, char **argv) { return enc_command("rekey", argc, argv, rekey_help); }
