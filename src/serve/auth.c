/*
 * auth.c - bearer tokens with scopes (auth.h): the token file's parser,
 * the check of an Authorization header against a token set, and kiln_auth,
 * the server's kiln_authorize_fn that re-reads its file when it changes.
 *
 * Only hashes are kept: a presented token is hashed with SHA-256 (libsodium)
 * and compared with every entry with sodium_memcmp, so neither the file nor
 * the timing of a refusal tells anything about a valid token. Readers take
 * a read lock on the current set; a reload parses the new file outside any
 * lock and swaps the set under the write lock.
 */
#include "serve/auth.h"

#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#define KILN_AUTH_FILE_MAX ((size_t)16 << 20) /* a token file larger than this is refused */
#define KILN_AUTH_RECHECK_MS 1000             /* how often the file's identity is looked at */

static const struct {
    const char *name;
    unsigned bit;
} scope_names[] = {
    {"predict", KILN_SCOPE_PREDICT},
    {"metadata", KILN_SCOPE_METADATA},
    {"admin", KILN_SCOPE_ADMIN},
};

unsigned kiln_scope_bit(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof scope_names / sizeof scope_names[0]; i++)
        if (strlen(scope_names[i].name) == len && memcmp(scope_names[i].name, name, len) == 0)
            return scope_names[i].bit;
    return 0;
}

static void set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || !err_len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int name_char_ok(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || c == '@';
}

/* Parse a comma-separated scope list into bits; 0 on error (err filled). */
static unsigned parse_scopes(const char *v, size_t n, char *bad, size_t bad_len)
{
    unsigned bits = 0;
    size_t i = 0;
    if (n == 0) {
        snprintf(bad, bad_len, "scopes= is empty");
        return 0;
    }
    while (i <= n) {
        size_t j = i;
        while (j < n && v[j] != ',') j++;
        unsigned b = kiln_scope_bit(v + i, j - i);
        if (!b) {
            snprintf(bad, bad_len, "unknown scope '%.*s' (expected predict, metadata or admin)",
                     (int)(j - i > 64 ? 64 : j - i), v + i);
            return 0;
        }
        bits |= b;
        i = j + 1;
    }
    return bits;
}

/* Parse one non-comment line of fields into e; 0 ok, else bad says why. */
static int parse_line(const char *p, size_t n, kiln_token_entry *e, char *bad, size_t bad_len)
{
    memset(e, 0, sizeof *e);
    int have_hash = 0, have_scopes = 0, have_name = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
        if (i >= n) break;
        size_t j = i;
        while (j < n && p[j] != ' ' && p[j] != '\t') j++;
        const char *f = p + i;
        size_t fl = j - i;
        if (fl >= 7 && memcmp(f, "sha256:", 7) == 0) {
            if (have_hash) {
                snprintf(bad, bad_len, "two sha256: fields");
                return -1;
            }
            if (fl != 7 + 64) {
                snprintf(bad, bad_len, "sha256: needs 64 hex digits, got %zu characters", fl - 7);
                return -1;
            }
            for (int k = 0; k < 32; k++) {
                int hi = hexval(f[7 + 2 * k]), lo = hexval(f[8 + 2 * k]);
                if (hi < 0 || lo < 0) {
                    snprintf(bad, bad_len, "sha256: holds a character that is not hex");
                    return -1;
                }
                e->hash[k] = (uint8_t)(hi << 4 | lo);
            }
            have_hash = 1;
        } else if (fl >= 7 && memcmp(f, "scopes=", 7) == 0) {
            if (have_scopes) {
                snprintf(bad, bad_len, "two scopes= fields");
                return -1;
            }
            e->scopes = parse_scopes(f + 7, fl - 7, bad, bad_len);
            if (!e->scopes) return -1;
            have_scopes = 1;
        } else if (fl >= 5 && memcmp(f, "name=", 5) == 0) {
            if (have_name) {
                snprintf(bad, bad_len, "two name= fields");
                return -1;
            }
            if (fl - 5 < 1 || fl - 5 > KILN_AUTH_NAME_MAX) {
                snprintf(bad, bad_len, "name= needs 1 to %d characters", KILN_AUTH_NAME_MAX);
                return -1;
            }
            for (size_t k = 5; k < fl; k++)
                if (!name_char_ok(f[k])) {
                    snprintf(bad, bad_len, "name= may hold only A-Z a-z 0-9 . _ - @");
                    return -1;
                }
            memcpy(e->name, f + 5, fl - 5);
            e->name[fl - 5] = '\0';
            have_name = 1;
        } else {
            snprintf(bad, bad_len, "unknown field '%.*s' (expected sha256:HEX, scopes=, name=)",
                     (int)(fl > 40 ? 40 : fl), f);
            return -1;
        }
        i = j;
    }
    if (!have_hash) {
        snprintf(bad, bad_len, "no sha256:HEX field");
        return -1;
    }
    if (!have_scopes) {
        snprintf(bad, bad_len, "no scopes= field");
        return -1;
    }
    return 0;
}

kiln_status kiln_token_file_parse(const char *text, size_t len, const char *path,
                                  kiln_token_set *out, char *err, size_t err_len)
{
    out->e = NULL;
    out->n = 0;
    int cap = 0, line = 0;
    size_t i = 0;
    char bad[160];
    while (i < len) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        line++;
        size_t n = j - i;
        const char *p = text + i;
        i = j + 1;
        if (n && p[n - 1] == '\r') n--;
        for (size_t k = 0; k < n; k++)
            if ((unsigned char)p[k] < 0x20 && p[k] != '\t') {
                set_err(err, err_len, "token file '%s' line %d: control character 0x%02x", path,
                        line, (unsigned char)p[k]);
                goto err_free;
            }
        size_t s = 0;
        while (s < n && (p[s] == ' ' || p[s] == '\t')) s++;
        if (s == n || p[s] == '#') continue;
        kiln_token_entry e;
        if (parse_line(p + s, n - s, &e, bad, sizeof bad) != 0) {
            set_err(err, err_len, "token file '%s' line %d: %s", path, line, bad);
            goto err_free;
        }
        for (int k = 0; k < out->n; k++)
            if (memcmp(out->e[k].hash, e.hash, 32) == 0) {
                set_err(err, err_len, "token file '%s' line %d: the same sha256 as an earlier line",
                        path, line);
                goto err_free;
            }
        if (out->n == cap) {
            int nc = cap ? cap * 2 : 8;
            kiln_token_entry *ne = realloc(out->e, (size_t)nc * sizeof *ne);
            if (!ne) {
                set_err(err, err_len, "token file '%s': out of memory", path);
                kiln_token_set_free(out);
                return KILN_ERR_OUT_OF_MEMORY;
            }
            out->e = ne;
            cap = nc;
        }
        out->e[out->n++] = e;
    }
    return KILN_OK;
err_free:
    kiln_token_set_free(out);
    return KILN_ERR_INVALID_ARGUMENT;
}

void kiln_token_set_free(kiln_token_set *s)
{
    if (!s) return;
    if (s->e) sodium_memzero(s->e, (size_t)s->n * sizeof *s->e);
    free(s->e);
    s->e = NULL;
    s->n = 0;
}

/* The token an Authorization value carries ("Bearer T", or "Basic
 * base64(user:T)"), copied into buf; its length, or -1 for none. */
static int presented_token(const char *authorization, char *buf, size_t cap)
{
    if (!authorization) return -1;
    const char *a = authorization;
    while (*a == ' ' || *a == '\t') a++;
    int basic = 0;
    if (strncasecmp(a, "Bearer", 6) == 0 && (a[6] == ' ' || a[6] == '\t')) a += 6;
    else if (strncasecmp(a, "Basic", 5) == 0 && (a[5] == ' ' || a[5] == '\t')) a += 5, basic = 1;
    else return -1;
    while (*a == ' ' || *a == '\t') a++;
    size_t n = strlen(a);
    while (n && (a[n - 1] == ' ' || a[n - 1] == '\t')) n--;
    if (n == 0 || n >= cap) return -1;
    if (!basic) {
        memcpy(buf, a, n);
        buf[n] = '\0';
        return (int)n;
    }
    size_t bin_len = 0;
    if (sodium_base642bin((unsigned char *)buf, cap - 1, a, n, NULL, &bin_len, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0)
        return -1;
    buf[bin_len] = '\0';
    char *colon = memchr(buf, ':', bin_len);
    if (!colon) return -1;
    size_t tl = bin_len - (size_t)(colon + 1 - buf);
    memmove(buf, colon + 1, tl);
    buf[tl] = '\0';
    return tl ? (int)tl : -1;
}

int kiln_token_set_check(const kiln_token_set *set, const char *authorization, const char *scope)
{
    char tok[KILN_AUTH_TOKEN_MAX + 1];
    int n = presented_token(authorization, tok, sizeof tok);
    if (n < 0) return 401;
    uint8_t h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)tok, (unsigned long long)n);
    sodium_memzero(tok, sizeof tok);
    int found = -1;
    for (int i = 0; i < set->n; i++) /* every entry, whether found or not */
        if (sodium_memcmp(h, set->e[i].hash, sizeof h) == 0) found = i;
    if (found < 0) return 401;
    if (!scope) return 0;
    unsigned bit = kiln_scope_bit(scope, strlen(scope));
    return bit && (set->e[found].scopes & bit) ? 0 : 403;
}

kiln_status kiln_token_line(const char *token, const char *scopes, const char *name, char *out,
                            size_t out_len, char *err, size_t err_len)
{
    char bad[160];
    if (!parse_scopes(scopes, strlen(scopes), bad, sizeof bad)) {
        set_err(err, err_len, "--scopes: %s", bad);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (name) {
        size_t nl = strlen(name);
        int ok = nl >= 1 && nl <= KILN_AUTH_NAME_MAX;
        for (size_t i = 0; ok && i < nl; i++) ok = name_char_ok(name[i]);
        if (!ok) {
            set_err(err, err_len, "--name '%.80s': 1 to %d of A-Z a-z 0-9 . _ - @", name,
                    KILN_AUTH_NAME_MAX);
            return KILN_ERR_INVALID_ARGUMENT;
        }
    }
    uint8_t h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)token, strlen(token));
    char hex[2 * sizeof h + 1];
    sodium_bin2hex(hex, sizeof hex, h, sizeof h);
    int w = snprintf(out, out_len, "sha256:%s scopes=%s%s%s", hex, scopes, name ? " name=" : "",
                     name ? name : "");
    if (w < 0 || (size_t)w >= out_len) {
        set_err(err, err_len, "token line too long");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

/* ------------------------------------------------------------ kiln_auth */

struct kiln_auth {
    char *path;
    pthread_rwlock_t lock;        /* guards set */
    kiln_token_set set;
    pthread_mutex_t reload_mu;    /* one reloader at a time; guards the identity below */
    struct timespec mtime;
    off_t size;
    ino_t ino;
    atomic_llong next_check_ms;   /* monotonic ms of the next look at the file */
};

static long long mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Read and parse the file; on success *st holds its identity. */
static kiln_status load_file(const char *path, kiln_token_set *out, struct stat *st, char *err,
                             size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, err_len, "token file '%s': %s", path, strerror(errno));
        return KILN_ERR_IO;
    }
    if (fstat(fileno(f), st) != 0 || !S_ISREG(st->st_mode)) {
        fclose(f);
        set_err(err, err_len, "token file '%s': not a regular file", path);
        return KILN_ERR_IO;
    }
    if ((size_t)st->st_size > KILN_AUTH_FILE_MAX) {
        fclose(f);
        set_err(err, err_len, "token file '%s': %lld bytes, more than the %zu allowed", path,
                (long long)st->st_size, KILN_AUTH_FILE_MAX);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    size_t cap = (size_t)st->st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        set_err(err, err_len, "token file '%s': out of memory", path);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    n = fread(buf, 1, cap - 1, f); /* a file that grew since fstat is read up to its old size */
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        free(buf);
        set_err(err, err_len, "token file '%s': read error", path);
        return KILN_ERR_IO;
    }
    kiln_status s = kiln_token_file_parse(buf, n, path, out, err, err_len);
    sodium_memzero(buf, n);
    free(buf);
    return s;
}

static void remember_identity(kiln_auth *a, const struct stat *st)
{
    a->mtime = st->st_mtim;
    a->size = st->st_size;
    a->ino = st->st_ino;
}

kiln_status kiln_auth_open(const char *path, kiln_auth **out, char *err, size_t err_len)
{
    *out = NULL;
    if (sodium_init() < 0) {
        set_err(err, err_len, "libsodium failed to initialise");
        return KILN_ERR_RUNTIME;
    }
    kiln_auth *a = calloc(1, sizeof *a);
    if (!a || !(a->path = strdup(path))) {
        free(a);
        set_err(err, err_len, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    struct stat st;
    kiln_status s = load_file(path, &a->set, &st, err, err_len);
    if (s != KILN_OK) {
        free(a->path);
        free(a);
        return s;
    }
    remember_identity(a, &st);
    if (st.st_mode & S_IWOTH)
        fprintf(stderr, "kiln serve: warning: token file '%s' is writable by every user: anyone "
                        "on this host can add a token (chmod o-w)\n", path);
    pthread_rwlock_init(&a->lock, NULL);
    pthread_mutex_init(&a->reload_mu, NULL);
    atomic_store(&a->next_check_ms, mono_ms() + KILN_AUTH_RECHECK_MS);
    *out = a;
    return KILN_OK;
}

/* Re-read the file if it changed since the last look (at most once a
 * second; a request that finds another thread reloading goes on with the
 * current set). */
static void maybe_reload(kiln_auth *a)
{
    long long now = mono_ms();
    if (now < atomic_load(&a->next_check_ms)) return;
    if (pthread_mutex_trylock(&a->reload_mu) != 0) return;
    atomic_store(&a->next_check_ms, now + KILN_AUTH_RECHECK_MS);
    struct stat st;
    if (stat(a->path, &st) != 0) {
        if (a->size != -1)
            fprintf(stderr, "kiln serve: token file '%s': %s; the last tokens read stay in force\n",
                    a->path, strerror(errno));
        a->size = -1; /* said once; looked at again until it is back */
        pthread_mutex_unlock(&a->reload_mu);
        return;
    }
    if (st.st_mtim.tv_sec == a->mtime.tv_sec && st.st_mtim.tv_nsec == a->mtime.tv_nsec &&
        st.st_size == a->size && st.st_ino == a->ino) {
        pthread_mutex_unlock(&a->reload_mu);
        return;
    }
    kiln_token_set fresh;
    char err[KILN_AUTH_ERR_LEN];
    struct stat lst;
    if (load_file(a->path, &fresh, &lst, err, sizeof err) != KILN_OK) {
        fprintf(stderr, "kiln serve: %s; the last tokens read stay in force\n", err);
        remember_identity(a, &st); /* said once per change */
        pthread_mutex_unlock(&a->reload_mu);
        return;
    }
    remember_identity(a, &lst);
    pthread_rwlock_wrlock(&a->lock);
    kiln_token_set old = a->set;
    a->set = fresh;
    pthread_rwlock_unlock(&a->lock);
    kiln_token_set_free(&old);
    fprintf(stderr, "kiln serve: token file '%s' re-read: %d tokens\n", a->path, fresh.n);
    pthread_mutex_unlock(&a->reload_mu);
}

int kiln_auth_authorize(void *ctx, const char *authorization, const char *scope)
{
    kiln_auth *a = ctx;
    maybe_reload(a);
    pthread_rwlock_rdlock(&a->lock);
    int r = kiln_token_set_check(&a->set, authorization, scope);
    pthread_rwlock_unlock(&a->lock);
    return r;
}

int kiln_auth_count(kiln_auth *a)
{
    pthread_rwlock_rdlock(&a->lock);
    int n = a->set.n;
    pthread_rwlock_unlock(&a->lock);
    return n;
}

void kiln_auth_free(kiln_auth *a)
{
    if (!a) return;
    kiln_token_set_free(&a->set);
    pthread_rwlock_destroy(&a->lock);
    pthread_mutex_destroy(&a->reload_mu);
    free(a->path);
    free(a);
}
