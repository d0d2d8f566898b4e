/*
 * manifest.c - the signed manifest of a model folder (security.h).
 *
 * `kiln sign` hashes every regular file of a model folder (SHA-256, any
 * depth, hidden files too; the root's kiln.sig excepted) into a manifest,
 * one line per file sorted by path,
 *     sha256 <64 hex> <size> <relative/path>\n
 * signs "kiln-manifest-v1\n" followed by those bytes with Ed25519, and
 * writes kiln.sig:
 *     kiln-signature-v1\n
 *     key <64 hex: the signer's public key>\n
 *     signature <128 hex>\n
 *     manifest\n
 *     <the manifest lines>
 * Verifying (`kiln verify`, and the server with --trusted_keys) parses
 * kiln.sig, requires a trusted key and a valid signature, then rebuilds the
 * folder's manifest and compares: a changed, extra or missing file is named
 * in the error. The parser is fuzzed (fuzz/fuzz_manifest.c). The same idea
 * as OpenSSF model-signing's in-toto subjects (path, digest), in a format
 * a C server checks without JSON or certificates.
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

#include "security/security.h"

#define SIG_MAGIC "kiln-signature-v1\n"
#define SIGN_CONTEXT "kiln-manifest-v1\n"
#define MAX_DEPTH 32
#define SIGFILE_MAX (64u << 20)

void kiln_manifest_free(kiln_manifest *m)
{
    for (int i = 0; i < m->n; i++) free(m->files[i].path);
    free(m->files);
    m->files = NULL;
    m->n = 0;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const kiln_manifest_entry *)a)->path, ((const kiln_manifest_entry *)b)->path);
}

const kiln_manifest_entry *kiln_manifest_find(const kiln_manifest *m, const char *path)
{
    kiln_manifest_entry key = {(char *)path, 0, {0}};
    if (m->n == 0) return NULL;
    return bsearch(&key, m->files, (size_t)m->n, sizeof key, cmp_entry);
}

static kiln_status append(kiln_manifest *m, int *cap, const char *path, uint64_t size,
                          const uint8_t sha[32], char *err)
{
    if (m->n >= KILN_MANIFEST_MAX_FILES) {
        snprintf(err, KILN_SEC_ERR_LEN, "more than %d files", KILN_MANIFEST_MAX_FILES);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (m->n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        kiln_manifest_entry *f = realloc(m->files, (size_t)nc * sizeof *f);
        if (!f) goto oom;
        m->files = f;
        *cap = nc;
    }
    char *p = strdup(path);
    if (!p) goto oom;
    m->files[m->n].path = p;
    m->files[m->n].size = size;
    memcpy(m->files[m->n].sha256, sha, 32);
    m->n++;
    return KILN_OK;
oom:
    snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
    return KILN_ERR_OUT_OF_MEMORY;
}

/* SHA-256 and size of the file at path, streamed. */
static kiln_status hash_file(const char *path, const char *rel, uint8_t sha[32], uint64_t *size,
                             char *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "file '%.300s': %s", rel, strerror(errno));
        return KILN_ERR_IO;
    }
    static const size_t bufsz = 1u << 20;
    uint8_t *buf = malloc(bufsz);
    if (!buf) {
        close(fd);
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    crypto_hash_sha256_state h;
    crypto_hash_sha256_init(&h);
    uint64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, bufsz);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(err, KILN_SEC_ERR_LEN, "file '%.300s': %s", rel, strerror(errno));
            free(buf);
            close(fd);
            return KILN_ERR_IO;
        }
        if (r == 0) break;
        crypto_hash_sha256_update(&h, buf, (unsigned long long)r);
        total += (uint64_t)r;
    }
    free(buf);
    close(fd);
    crypto_hash_sha256_final(&h, sha);
    *size = total;
    return KILN_OK;
}

/* Add every regular file under root/rel to m. */
static kiln_status walk(const char *root, const char *rel, int depth, kiln_manifest *m, int *cap,
                        char *err)
{
    char dirpath[8192];
    snprintf(dirpath, sizeof dirpath, "%s%s%s", root, *rel ? "/" : "", rel);
    if (depth > MAX_DEPTH) {
        snprintf(err, KILN_SEC_ERR_LEN, "folder '%.300s' is nested more than %d deep", rel,
                 MAX_DEPTH);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    DIR *d = opendir(dirpath);
    if (!d) {
        snprintf(err, KILN_SEC_ERR_LEN, "folder '%.300s': %s", *rel ? rel : dirpath,
                 strerror(errno));
        return errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO;
    }
    kiln_status st = KILN_OK;
    struct dirent *e;
    while (st == KILN_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (depth == 0 && strcmp(e->d_name, KILN_SIG_FILE) == 0) continue;
        char childrel[4096], childpath[8192];
        int n = snprintf(childrel, sizeof childrel, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        if (n < 0 || (size_t)n >= sizeof childrel) {
            snprintf(err, KILN_SEC_ERR_LEN, "path '%.200s...' is too long", childrel);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        for (const char *c = e->d_name; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) {
                snprintf(err, KILN_SEC_ERR_LEN, "file name in '%.300s' holds a control character",
                         *rel ? rel : ".");
                st = KILN_ERR_INVALID_ARGUMENT;
            }
        if (st != KILN_OK) break;
        snprintf(childpath, sizeof childpath, "%s/%s", root, childrel);
        struct stat sb;
        if (lstat(childpath, &sb) != 0) {
            snprintf(err, KILN_SEC_ERR_LEN, "file '%.300s': %s", childrel, strerror(errno));
            st = KILN_ERR_IO;
        } else if (S_ISDIR(sb.st_mode)) {
            st = walk(root, childrel, depth + 1, m, cap, err);
        } else if (S_ISREG(sb.st_mode)) {
            uint8_t sha[32];
            uint64_t size;
            st = hash_file(childpath, childrel, sha, &size, err);
            if (st == KILN_OK) st = append(m, cap, childrel, size, sha, err);
        } else {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "file '%.300s' is a %s; a signed folder holds only regular files and folders",
                     childrel, S_ISLNK(sb.st_mode) ? "symbolic link" : "special file");
            st = KILN_ERR_INVALID_ARGUMENT;
        }
    }
    closedir(d);
    return st;
}

kiln_status kiln_manifest_build(const char *dir, kiln_manifest *m, char *err)
{
    m->n = 0;
    m->files = NULL;
    kiln_status st = kiln_sec_init(err);
    if (st != KILN_OK) return st;
    int cap = 0;
    st = walk(dir, "", 0, m, &cap, err);
    if (st != KILN_OK) {
        kiln_manifest_free(m);
        return st;
    }
    if (m->n > 1) qsort(m->files, (size_t)m->n, sizeof *m->files, cmp_entry);
    return KILN_OK;
}

/* True if p is a clean relative path: no empty, "." or ".." component, no
 * leading '/', no control characters. */
static int path_ok(const char *p, size_t n)
{
    if (n == 0 || n >= 4096 || p[0] == '/' || p[n - 1] == '/') return 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)) return 0;
        if (i == n || p[i] == '/') {
            size_t cl = i - start;
            if (cl == 0) return 0;
            if (cl == 1 && p[start] == '.') return 0;
            if (cl == 2 && p[start] == '.' && p[start + 1] == '.') return 0;
            start = i + 1;
        }
    }
    return 1;
}

kiln_status kiln_manifest_parse(const char *text, size_t len, kiln_manifest *m, char *err)
{
    m->n = 0;
    m->files = NULL;
    int cap = 0, line = 0;
    const char *p = text, *end = text + len;
    kiln_status st = KILN_OK;
    while (p < end) {
        line++;
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) {
            snprintf(err, KILN_SEC_ERR_LEN, "manifest line %d does not end with a newline", line);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        size_t ll = (size_t)(nl - p);
        /* "sha256 " + 64 hex + " " + size + " " + path */
        const char *q = p;
        uint8_t sha[32];
        size_t bl = 0;
        if (ll < 7 + 64 + 4 || memcmp(q, "sha256 ", 7) != 0 || q[71] != ' ' ||
            sodium_hex2bin(sha, 32, q + 7, 64, NULL, &bl, NULL) != 0 || bl != 32) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "manifest line %d: expected 'sha256 <64 hex digits> <size> <path>'", line);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        q += 72;
        uint64_t size = 0;
        int digits = 0;
        while (q < nl && *q >= '0' && *q <= '9' && digits < 19) {
            size = size * 10 + (uint64_t)(*q - '0');
            q++;
            digits++;
        }
        if (digits == 0 || q >= nl || *q != ' ' || (digits > 1 && p[72] == '0')) {
            snprintf(err, KILN_SEC_ERR_LEN, "manifest line %d: the size is not a decimal number "
                                            "(at most 19 digits, no leading zero)", line);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        q++;
        size_t pl = (size_t)(nl - q);
        if (!path_ok(q, pl)) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "manifest line %d: the path is not a clean relative path (no '..', '.', "
                     "empty parts, leading '/' or control characters)", line);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        char path[4096];
        memcpy(path, q, pl);
        path[pl] = '\0';
        if (strcmp(path, KILN_SIG_FILE) == 0) {
            snprintf(err, KILN_SEC_ERR_LEN, "manifest line %d lists " KILN_SIG_FILE " itself",
                     line);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        if (m->n > 0 && strcmp(m->files[m->n - 1].path, path) >= 0) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "manifest line %d: '%.300s' is out of order or listed twice", line, path);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        st = append(m, &cap, path, size, sha, err);
        if (st != KILN_OK) break;
        p = nl + 1;
    }
    if (st != KILN_OK) kiln_manifest_free(m);
    return st;
}

/* Write the manifest's lines into a malloc'd buffer. */
static kiln_status manifest_text(const kiln_manifest *m, char **out, size_t *len, char *err)
{
    size_t cap = 1;
    for (int i = 0; i < m->n; i++) cap += 7 + 64 + 1 + 20 + 1 + strlen(m->files[i].path) + 1;
    char *t = malloc(cap), *p = t;
    if (!t) {
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < m->n; i++) {
        char hex[65];
        sodium_bin2hex(hex, sizeof hex, m->files[i].sha256, 32);
        p += sprintf(p, "sha256 %s %llu %s\n", hex, (unsigned long long)m->files[i].size,
                     m->files[i].path);
    }
    *out = t;
    *len = (size_t)(p - t);
    return KILN_OK;
}

/* The signed message: the context string, then the manifest bytes. */
static unsigned char *signed_message(const char *manifest, size_t len, size_t *mlen)
{
    size_t cl = strlen(SIGN_CONTEXT);
    unsigned char *msg = malloc(cl + len + 1);
    if (!msg) return NULL;
    memcpy(msg, SIGN_CONTEXT, cl);
    if (len) memcpy(msg + cl, manifest, len);
    *mlen = cl + len;
    return msg;
}

/* Match "<word> <2n hex>\n" at *p, advancing past it. */
static int hex_line(const char **p, const char *end, const char *word, uint8_t *out, size_t n)
{
    size_t wl = strlen(word), need = wl + 1 + 2 * n + 1;
    if ((size_t)(end - *p) < need || memcmp(*p, word, wl) != 0 || (*p)[wl] != ' ' ||
        (*p)[need - 1] != '\n')
        return 0;
    size_t bl = 0;
    if (sodium_hex2bin(out, n, *p + wl + 1, 2 * n, NULL, &bl, NULL) != 0 || bl != n) return 0;
    *p += need;
    return 1;
}

kiln_status kiln_sigfile_parse(const uint8_t *data, size_t len, kiln_signature_file *out,
                               char *err)
{
    memset(out, 0, sizeof *out);
    kiln_status st = kiln_sec_init(err);
    if (st != KILN_OK) return st;
    const char *p = (const char *)data, *end = p + len;
    size_t ml = strlen(SIG_MAGIC);
    if (len < ml || memcmp(p, SIG_MAGIC, ml) != 0) {
        snprintf(err, KILN_SEC_ERR_LEN, KILN_SIG_FILE " does not start with 'kiln-signature-v1'");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    p += ml;
    if (!hex_line(&p, end, "key", out->key.pk, 32)) {
        snprintf(err, KILN_SEC_ERR_LEN, KILN_SIG_FILE " line 2: expected 'key <64 hex digits>'");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (!hex_line(&p, end, "signature", out->sig, 64)) {
        snprintf(err, KILN_SEC_ERR_LEN,
                 KILN_SIG_FILE " line 3: expected 'signature <128 hex digits>'");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if ((size_t)(end - p) < 9 || memcmp(p, "manifest\n", 9) != 0) {
        snprintf(err, KILN_SEC_ERR_LEN, KILN_SIG_FILE " line 4: expected 'manifest'");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    p += 9;
    uint8_t h[8];
    crypto_generichash(h, sizeof h, out->key.pk, 32, NULL, 0);
    sodium_bin2hex(out->key.id, sizeof out->key.id, h, sizeof h);
    out->manifest_text = p;
    out->manifest_len = (size_t)(end - p);
    st = kiln_manifest_parse(p, out->manifest_len, &out->manifest, err);
    if (st != KILN_OK) {
        char inner[KILN_SEC_ERR_LEN];
        snprintf(inner, sizeof inner, "%s", err);
        snprintf(err, KILN_SEC_ERR_LEN, KILN_SIG_FILE ": %.480s", inner);
    }
    return st;
}

kiln_status kiln_sec_sign_dir(const char *dir, const uint8_t sk[64], char *err)
{
    kiln_manifest m;
    kiln_status st = kiln_manifest_build(dir, &m, err);
    if (st != KILN_OK) return st;
    char *text = NULL;
    size_t tl = 0, mlen = 0;
    st = manifest_text(&m, &text, &tl, err);
    kiln_manifest_free(&m);
    if (st != KILN_OK) return st;
    unsigned char *msg = signed_message(text, tl, &mlen);
    if (!msg) {
        free(text);
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    uint8_t sig[64], pk[32];
    crypto_sign_detached(sig, NULL, msg, mlen, sk);
    crypto_sign_ed25519_sk_to_pk(pk, sk);
    free(msg);
    char pkhex[65], sighex[129], path[4096], tmp[4200];
    sodium_bin2hex(pkhex, sizeof pkhex, pk, 32);
    sodium_bin2hex(sighex, sizeof sighex, sig, 64);
    snprintf(path, sizeof path, "%s/" KILN_SIG_FILE, dir);
    snprintf(tmp, sizeof tmp, "%s/.kiln.sig.tmp", dir);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(text);
        snprintf(err, KILN_SEC_ERR_LEN, "cannot create '%.300s': %s", tmp, strerror(errno));
        return KILN_ERR_IO;
    }
    fprintf(f, SIG_MAGIC "key %s\nsignature %s\nmanifest\n", pkhex, sighex);
    fwrite(text, 1, tl, f);
    free(text);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "cannot write '%.300s': %s", path, strerror(errno));
        unlink(tmp);
        return KILN_ERR_IO;
    }
    return KILN_OK;
}

kiln_status kiln_sec_verify_dir(const char *dir, const kiln_trusted_keys *trusted,
                                kiln_manifest *manifest_out, char *signer, char *err)
{
    if (manifest_out) manifest_out->n = 0, manifest_out->files = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/" KILN_SIG_FILE, dir);
    uint8_t *data;
    size_t len;
    char rerr[KILN_SEC_ERR_LEN];
    kiln_status st = kiln_sec_read_file(path, SIGFILE_MAX, &data, &len, rerr);
    if (st == KILN_ERR_NOT_FOUND) {
        snprintf(err, KILN_SEC_ERR_LEN,
                 "file '" KILN_SIG_FILE "' is missing: the version is not signed (sign it with "
                 "'kiln sign')");
        return KILN_ERR_INVALID_MODEL;
    }
    if (st != KILN_OK) {
        snprintf(err, KILN_SEC_ERR_LEN, "%s", rerr);
        return st;
    }
    kiln_signature_file sf;
    st = kiln_sigfile_parse(data, len, &sf, err);
    if (st != KILN_OK) goto out_free_data;
    int known = 0;
    for (int i = 0; i < trusted->n; i++)
        known |= sodium_memcmp(trusted->keys[i].pk, sf.key.pk, 32) == 0;
    if (!known) {
        snprintf(err, KILN_SEC_ERR_LEN,
                 "file '" KILN_SIG_FILE "': signed by key %s, which is not a trusted key",
                 sf.key.id);
        st = KILN_ERR_INVALID_MODEL;
        goto out_free_manifest;
    }
    size_t mlen;
    unsigned char *msg = signed_message(sf.manifest_text, sf.manifest_len, &mlen);
    if (!msg) {
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
        st = KILN_ERR_OUT_OF_MEMORY;
        goto out_free_manifest;
    }
    int bad = crypto_sign_verify_detached(sf.sig, msg, mlen, sf.key.pk) != 0;
    free(msg);
    if (bad) {
        snprintf(err, KILN_SEC_ERR_LEN,
                 "file '" KILN_SIG_FILE "': the signature by key %s does not match its manifest "
                 "(the manifest or the signature was altered)",
                 sf.key.id);
        st = KILN_ERR_INVALID_MODEL;
        goto out_free_manifest;
    }
    kiln_manifest disk;
    st = kiln_manifest_build(dir, &disk, err);
    if (st != KILN_OK) goto out_free_manifest;
    /* both sorted: walk them together */
    int i = 0, j = 0;
    while (st == KILN_OK && (i < sf.manifest.n || j < disk.n)) {
        int c = i >= sf.manifest.n ? 1
                : j >= disk.n      ? -1
                                   : strcmp(sf.manifest.files[i].path, disk.files[j].path);
        if (c < 0) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "file '%.300s' is in the signed manifest but missing (partly copied?)",
                     sf.manifest.files[i].path);
            st = KILN_ERR_INVALID_MODEL;
        } else if (c > 0) {
            snprintf(err, KILN_SEC_ERR_LEN, "file '%.300s' is not in the signed manifest",
                     disk.files[j].path);
            st = KILN_ERR_INVALID_MODEL;
        } else if (sf.manifest.files[i].size != disk.files[j].size) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "file '%.300s' is %llu bytes, the signed manifest says %llu (partly "
                     "copied or altered)",
                     disk.files[j].path, (unsigned long long)disk.files[j].size,
                     (unsigned long long)sf.manifest.files[i].size);
            st = KILN_ERR_INVALID_MODEL;
        } else if (sodium_memcmp(sf.manifest.files[i].sha256, disk.files[j].sha256, 32) != 0) {
            snprintf(err, KILN_SEC_ERR_LEN,
                     "file '%.300s' does not match the signed manifest (SHA-256 differs: altered)",
                     disk.files[j].path);
            st = KILN_ERR_INVALID_MODEL;
        } else {
            i++;
            j++;
        }
    }
    kiln_manifest_free(&disk);
    if (st == KILN_OK) {
        if (signer) memcpy(signer, sf.key.id, sizeof sf.key.id);
        if (manifest_out) {
            *manifest_out = sf.manifest;
            sf.manifest.n = 0;
            sf.manifest.files = NULL;
        }
    }
out_free_manifest:
    kiln_manifest_free(&sf.manifest);
out_free_data:
    free(data);
    return st;
}
