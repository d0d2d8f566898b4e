/*
 * keys.c - key files for model signing and encryption (security.h).
 *
 * Three text formats, all line-based with '#' comments and blank lines
 * allowed (docs/SECURITY.md):
 *   PREFIX.key      "kiln-ed25519-secret-key HEX128"  (libsodium's 64-byte
 *                   secret key, which holds the public key; mode 0600)
 *   PREFIX.pub and  "kiln-ed25519-public-key HEX64 [comment]", one per key;
 *   trusted keys    a trusted keys file is any number of .pub lines
 *   key ring        "ID HEX64": encryption keys by id; several ids let new
 *                   versions use a new key while older ones still load
 * Also the whole-file reader the rest of src/security/ uses.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "security/security.h"

#define SECRET_TAG "kiln-ed25519-secret-key"
#define PUBLIC_TAG "kiln-ed25519-public-key"
#define KEYFILE_MAX (1u << 20)

kiln_status kiln_sec_init(char *err)
{
    if (sodium_init() < 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "libsodium failed to initialise");
        return KILN_ERR_RUNTIME;
    }
    return KILN_OK;
}

kiln_status kiln_sec_read_file(const char *path, size_t max, uint8_t **data, size_t *size,
                               char *err)
{
    *data = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "'%.300s': %s", path, strerror(errno));
        return errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, KILN_SEC_ERR_LEN, "'%.300s' is not a regular file", path);
        close(fd);
        return KILN_ERR_IO;
    }
    if ((uint64_t)st.st_size > max) {
        snprintf(err, KILN_SEC_ERR_LEN, "'%.300s' is %lld bytes, more than the limit %zu", path,
                 (long long)st.st_size, max);
        close(fd);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory reading '%.300s'", path);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(err, KILN_SEC_ERR_LEN, "'%.300s': %s", path,
                     r < 0 ? strerror(errno) : "shorter than its size (changed while read)");
            free(buf);
            close(fd);
            return KILN_ERR_IO;
        }
        got += (size_t)r;
    }
    close(fd);
    *data = buf;
    *size = n;
    return KILN_OK;
}

int kiln_sec_key_id_valid(const char *id, size_t len)
{
    if (len == 0 || len > KILN_KEY_ID_MAX) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Decode exactly n bytes of hex from s (2n characters). */
static int hex_decode(const char *s, size_t slen, uint8_t *out, size_t n)
{
    size_t bin_len = 0;
    if (slen != 2 * n) return 0;
    return sodium_hex2bin(out, n, s, slen, NULL, &bin_len, NULL) == 0 && bin_len == n;
}

static void pubkey_id(kiln_pubkey *k)
{
    uint8_t h[8];
    crypto_generichash(h, sizeof h, k->pk, sizeof k->pk, NULL, 0);
    sodium_bin2hex(k->id, sizeof k->id, h, sizeof h);
}

/* Split the next line off text: [*p, eol); returns 0 at the end. */
static int next_line(const char **p, const char *end, const char **ls, size_t *ll)
{
    if (*p >= end) return 0;
    const char *nl = memchr(*p, '\n', (size_t)(end - *p));
    const char *e = nl ? nl : end;
    *ls = *p;
    *ll = (size_t)(e - *p);
    if (*ll && (*ls)[*ll - 1] == '\r') (*ll)--;
    *p = nl ? nl + 1 : end;
    return 1;
}

/* Split a line into whitespace-separated fields (at most max). */
static int fields(const char *s, size_t n, const char **f, size_t *fl, int max)
{
    int k = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
        if (i >= n) break;
        size_t st = i;
        while (i < n && s[i] != ' ' && s[i] != '\t') i++;
        if (k < max) {
            f[k] = s + st;
            fl[k] = i - st;
        }
        k++;
    }
    return k;
}

static int is_blank_or_comment(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
    return i == n || s[i] == '#';
}

kiln_status kiln_sec_parse_trusted_keys(const char *text, size_t len, const char *what,
                                        kiln_trusted_keys *out, char *err)
{
    out->n = 0;
    out->keys = NULL;
    const char *p = text, *end = text + len, *ls;
    size_t ll;
    int line = 0;
    while (next_line(&p, end, &ls, &ll)) {
        line++;
        if (is_blank_or_comment(ls, ll)) continue;
        const char *f[3];
        size_t fl[3];
        int k = fields(ls, ll, f, fl, 3);
        kiln_pubkey key;
        if (k < 2 || fl[0] != strlen(PUBLIC_TAG) || memcmp(f[0], PUBLIC_TAG, fl[0]) != 0 ||
            !hex_decode(f[1], fl[1], key.pk, 32)) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "%.300s line %d: expected '" PUBLIC_TAG " <64 hex digits> [comment]'", what,
                     line);
            kiln_sec_trusted_keys_free(out);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        pubkey_id(&key);
        kiln_pubkey *nk = realloc(out->keys, (size_t)(out->n + 1) * sizeof *nk);
        if (!nk) {
            snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
            kiln_sec_trusted_keys_free(out);
            return KILN_ERR_OUT_OF_MEMORY;
        }
        out->keys = nk;
        out->keys[out->n++] = key;
    }
    if (out->n == 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "%.300s holds no public key", what);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

kiln_status kiln_sec_read_trusted_keys(const char *path, kiln_trusted_keys *out, char *err)
{
    uint8_t *d;
    size_t n;
    out->n = 0;
    out->keys = NULL;
    kiln_status st = kiln_sec_read_file(path, KEYFILE_MAX, &d, &n, err);
    if (st != KILN_OK) return st;
    st = kiln_sec_parse_trusted_keys((const char *)d, n, path, out, err);
    free(d);
    return st;
}

void kiln_sec_trusted_keys_free(kiln_trusted_keys *t)
{
    free(t->keys);
    t->keys = NULL;
    t->n = 0;
}

kiln_status kiln_sec_parse_key_ring(const char *text, size_t len, const char *what,
                                    kiln_key_ring *out, char *err)
{
    out->n = 0;
    out->keys = NULL;
    const char *p = text, *end = text + len, *ls;
    size_t ll;
    int line = 0;
    while (next_line(&p, end, &ls, &ll)) {
        line++;
        if (is_blank_or_comment(ls, ll)) continue;
        const char *f[3];
        size_t fl[3];
        int k = fields(ls, ll, f, fl, 3);
        kiln_ring_key key;
        if (k != 2 || !kiln_sec_key_id_valid(f[0], fl[0]) || !hex_decode(f[1], fl[1], key.key, 32)) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "%.300s line %d: expected 'KEY_ID <64 hex digits>' (id: 1-%d of "
                     "A-Z a-z 0-9 . _ -)",
                     what, line, KILN_KEY_ID_MAX);
            sodium_memzero(&key, sizeof key);
            kiln_sec_key_ring_free(out);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        memcpy(key.id, f[0], fl[0]);
        key.id[fl[0]] = '\0';
        if (kiln_sec_key_ring_find(out, key.id)) {
            snprintf(err, KILN_SEC_ERR_LEN, "%.300s line %d: key id '%s' appears twice", what, line,
                     key.id);
            sodium_memzero(&key, sizeof key);
            kiln_sec_key_ring_free(out);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        kiln_ring_key *nk = malloc((size_t)(out->n + 1) * sizeof *nk);
        if (!nk) {
            snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
            sodium_memzero(&key, sizeof key);
            kiln_sec_key_ring_free(out);
            return KILN_ERR_OUT_OF_MEMORY;
        }
        if (out->n) memcpy(nk, out->keys, (size_t)out->n * sizeof *nk);
        nk[out->n] = key;
        sodium_memzero(&key, sizeof key);
        if (out->keys) sodium_memzero(out->keys, (size_t)out->n * sizeof *nk);
        free(out->keys);
        out->keys = nk;
        out->n++;
    }
    if (out->n == 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "%.300s holds no key", what);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

kiln_status kiln_sec_read_key_ring(const char *path, kiln_key_ring *out, char *err)
{
    uint8_t *d;
    size_t n;
    out->n = 0;
    out->keys = NULL;
    kiln_status st = kiln_sec_read_file(path, KEYFILE_MAX, &d, &n, err);
    if (st != KILN_OK) return st;
    st = kiln_sec_parse_key_ring((const char *)d, n, path, out, err);
    sodium_memzero(d, n);
    free(d);
    return st;
}

void kiln_sec_key_ring_free(kiln_key_ring *r)
{
    if (r->keys) sodium_memzero(r->keys, (size_t)r->n * sizeof *r->keys);
    free(r->keys);
    r->keys = NULL;
    r->n = 0;
}

const kiln_ring_key *kiln_sec_key_ring_find(const kiln_key_ring *r, const char *id)
{
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->keys[i].id, id) == 0) return &r->keys[i];
    return NULL;
}

kiln_status kiln_sec_read_secret_key(const char *path, uint8_t sk[64], char *err)
{
    uint8_t *d;
    size_t n;
    kiln_status st = kiln_sec_read_file(path, KEYFILE_MAX, &d, &n, err);
    if (st != KILN_OK) return st;
    const char *p = (const char *)d, *end = p + n, *ls;
    size_t ll;
    int found = 0;
    while (!found && next_line(&p, end, &ls, &ll)) {
        if (is_blank_or_comment(ls, ll)) continue;
        const char *f[2];
        size_t fl[2];
        int k = fields(ls, ll, f, fl, 2);
        found = k == 2 && fl[0] == strlen(SECRET_TAG) && memcmp(f[0], SECRET_TAG, fl[0]) == 0 &&
                hex_decode(f[1], fl[1], sk, 64);
        if (!found) break;
    }
    sodium_memzero(d, n);
    free(d);
    if (!found) {
        snprintf(err, KILN_SEC_ERR_LEN,
                 "'%.300s' is not a Kiln signing key ('" SECRET_TAG " <128 hex digits>'; make one "
                 "with 'kiln keygen')",
                 path);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    /* the secret key holds its public key: check they belong together */
    uint8_t pk[32];
    crypto_sign_ed25519_sk_to_pk(pk, sk);
    uint8_t seed[32], pk2[32], sk2[64];
    crypto_sign_ed25519_sk_to_seed(seed, sk);
    crypto_sign_seed_keypair(pk2, sk2, seed);
    int same = sodium_memcmp(pk, pk2, 32) == 0;
    sodium_memzero(seed, sizeof seed);
    sodium_memzero(sk2, sizeof sk2);
    if (!same) {
        snprintf(err, KILN_SEC_ERR_LEN, "'%.300s': the secret key is damaged (its public half "
                                        "does not match)", path);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

/* Write text to path (created, not overwritten) with the given mode. */
static kiln_status write_new(const char *path, const char *text, mode_t mode, char *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "cannot create '%.300s': %s", path, strerror(errno));
        return KILN_ERR_IO;
    }
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    if (close(fd) != 0 || w != (ssize_t)n) {
        snprintf(err, KILN_SEC_ERR_LEN, "cannot write '%.300s'", path);
        return KILN_ERR_IO;
    }
    return KILN_OK;
}

kiln_status kiln_sec_keygen_sign(const char *prefix, char *err)
{
    kiln_status st = kiln_sec_init(err);
    if (st != KILN_OK) return st;
    uint8_t pk[32], sk[64];
    crypto_sign_keypair(pk, sk);
    char path[4096], line[256];
    char hex[129];
    sodium_bin2hex(hex, sizeof hex, sk, sizeof sk);
    snprintf(line, sizeof line, SECRET_TAG " %s\n", hex);
    snprintf(path, sizeof path, "%s.key", prefix);
    st = write_new(path, line, 0600, err);
    sodium_memzero(hex, sizeof hex);
    sodium_memzero(line, sizeof line);
    sodium_memzero(sk, sizeof sk);
    if (st != KILN_OK) return st;
    kiln_pubkey k;
    memcpy(k.pk, pk, 32);
    pubkey_id(&k);
    sodium_bin2hex(hex, sizeof hex, pk, sizeof pk);
    snprintf(line, sizeof line, PUBLIC_TAG " %s key-id=%s\n", hex, k.id);
    snprintf(path, sizeof path, "%s.pub", prefix);
    return write_new(path, line, 0644, err);
}

kiln_status kiln_sec_keygen_encrypt(const char *id, char *line_out, size_t cap, char *err)
{
    kiln_status st = kiln_sec_init(err);
    if (st != KILN_OK) return st;
    if (!kiln_sec_key_id_valid(id, strlen(id))) {
        snprintf(err, KILN_SEC_ERR_LEN, "key id '%.100s' is not 1-%d of A-Z a-z 0-9 . _ -", id,
                 KILN_KEY_ID_MAX);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    uint8_t key[32];
    char hex[65];
    crypto_secretstream_xchacha20poly1305_keygen(key);
    sodium_bin2hex(hex, sizeof hex, key, sizeof key);
    snprintf(line_out, cap, "%s %s\n", id, hex);
    sodium_memzero(key, sizeof key);
    sodium_memzero(hex, sizeof hex);
    return KILN_OK;
}
