/*
 * tls.c - TLS credential generations read from files and re-read when the
 * files change (tls.h).
 *
 * kiln_tls_current is called on every new connection (the gRPC loop's
 * accept, the REST server's certificate callback). It reads the published
 * generation with one atomic load; at most once a second one caller (a
 * trylock: the others go on with the current generation) stats the watched
 * files and, when one changed, loads and validates a complete new
 * generation (GnuTLS checks that key and certificate match) before
 * publishing it. Nothing is freed before kiln_tls_free.
 */
#include "serve/tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "serve/config.h"

#define KILN_TLS_FILE_MAX ((size_t)1 << 20) /* a PEM file larger than this is refused */
#define KILN_TLS_RECHECK_MS 1000

typedef struct file_id {
    struct timespec mtime;
    off_t size;
    ino_t ino;
    dev_t dev;
    int missing;
} file_id;

struct kiln_tls {
    char *paths[3];                 /* watched: the SSLConfig, or cert, key and ca */
    int n_paths;
    int is_ssl_config;
    int client_verify;              /* files mode */
    char flag[64];
    char describe[512];
    _Atomic(kiln_tls_gen *) current;
    pthread_mutex_t reload_mu;      /* one reloader; guards ids */
    file_id ids[3];
    atomic_llong next_check_ms;
};

static void set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static long long mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void gen_free(kiln_tls_gen *g)
{
    if (!g) return;
    if (g->cred) gnutls_certificate_free_credentials(g->cred);
    for (unsigned i = 0; i < g->n_pcert; i++) gnutls_pcert_deinit(&g->pcert[i]);
    if (g->key) gnutls_privkey_deinit(g->key);
    if (g->trust) gnutls_x509_trust_list_deinit(g->trust, 1);
    free(g);
}

/* A generation from PEM text; `what` names the source in messages. */
static kiln_tls_gen *gen_load(const char *cert, const char *key, const char *ca, int verify,
                              const char *what, char *err, size_t err_len)
{
    kiln_tls_gen *g = calloc(1, sizeof *g);
    if (!g) {
        set_err(err, err_len, "%s: out of memory", what);
        return NULL;
    }
    gnutls_datum_t dc = {(unsigned char *)(uintptr_t)cert, (unsigned)strlen(cert)};
    gnutls_datum_t dk = {(unsigned char *)(uintptr_t)key, (unsigned)strlen(key)};
    int rc = gnutls_certificate_allocate_credentials(&g->cred);
    if (rc < 0) {
        g->cred = NULL;
        set_err(err, err_len, "%s: %s", what, gnutls_strerror(rc));
        goto err_free;
    }
    rc = gnutls_certificate_set_x509_key_mem(g->cred, &dc, &dk, GNUTLS_X509_FMT_PEM);
    if (rc < 0) {
        set_err(err, err_len, "%s: server key / certificate: %s", what, gnutls_strerror(rc));
        goto err_free;
    }
    g->n_pcert = KILN_TLS_MAX_CHAIN;
    rc = gnutls_pcert_list_import_x509_raw(g->pcert, &g->n_pcert, &dc, GNUTLS_X509_FMT_PEM, 0);
    if (rc < 0 || g->n_pcert == 0) {
        g->n_pcert = 0;
        set_err(err, err_len, "%s: server certificate: %s", what,
                rc < 0 ? gnutls_strerror(rc) : "no certificate");
        goto err_free;
    }
    if (gnutls_privkey_init(&g->key) < 0) {
        g->key = NULL;
        set_err(err, err_len, "%s: out of memory", what);
        goto err_free;
    }
    rc = gnutls_privkey_import_x509_raw(g->key, &dk, GNUTLS_X509_FMT_PEM, NULL, 0);
    if (rc < 0) {
        set_err(err, err_len, "%s: server key: %s", what, gnutls_strerror(rc));
        goto err_free;
    }
    if (ca && *ca) {
        gnutls_datum_t da = {(unsigned char *)(uintptr_t)ca, (unsigned)strlen(ca)};
        rc = gnutls_certificate_set_x509_trust_mem(g->cred, &da, GNUTLS_X509_FMT_PEM);
        if (rc <= 0) {
            set_err(err, err_len, "%s: CA: %s", what, rc < 0 ? gnutls_strerror(rc) : "no certificate in it");
            goto err_free;
        }
        if (gnutls_x509_trust_list_init(&g->trust, 0) < 0) {
            g->trust = NULL;
            set_err(err, err_len, "%s: out of memory", what);
            goto err_free;
        }
        rc = gnutls_x509_trust_list_add_trust_mem(g->trust, &da, NULL, GNUTLS_X509_FMT_PEM, 0, 0);
        if (rc <= 0) {
            set_err(err, err_len, "%s: CA: %s", what, rc < 0 ? gnutls_strerror(rc) : "no certificate in it");
            goto err_free;
        }
    }
    g->client_verify = verify;
    /* the leaf's serial, for the log line that says a new certificate is served */
    gnutls_x509_crt_t leaf;
    if (gnutls_pcert_export_x509(&g->pcert[0], &leaf) >= 0) {
        unsigned char serial[40];
        size_t sn = sizeof serial;
        if (gnutls_x509_crt_get_serial(leaf, serial, &sn) >= 0)
            for (size_t i = 0; i < sn && 2 * i + 2 < sizeof g->serial_hex; i++)
                snprintf(g->serial_hex + 2 * i, 3, "%02x", serial[i]);
        gnutls_x509_crt_deinit(leaf);
    }
    return g;
err_free:
    gen_free(g);
    return NULL;
}

/* A whole file as NUL-terminated text. */
static char *read_text(const char *path, const char *flag, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, err_len, "%s: '%s': %s", flag, path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(KILN_TLS_FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, KILN_TLS_FILE_MAX + 1, f) : 0;
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad || n > KILN_TLS_FILE_MAX) {
        set_err(err, err_len, "%s: '%s': %s", flag, path,
                !buf ? "out of memory" : n > KILN_TLS_FILE_MAX ? "larger than 1 MiB" : "read error");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static kiln_tls_gen *load_current_files(kiln_tls *t, char *err, size_t err_len)
{
    char what[700];
    if (t->is_ssl_config) {
        kiln_ssl_config ssl;
        char cerr[KILN_CONFIG_ERR_LEN];
        if (kiln_ssl_config_load(t->paths[0], &ssl, cerr) != KILN_OK) {
            set_err(err, err_len, "%s: %s", t->flag, cerr);
            return NULL;
        }
        snprintf(what, sizeof what, "%s '%s'", t->flag, t->paths[0]);
        kiln_tls_gen *g = gen_load(ssl.server_cert, ssl.server_key, ssl.custom_ca, ssl.client_verify,
                                   what, err, err_len);
        kiln_ssl_config_free(&ssl);
        return g;
    }
    char *text[3] = {NULL, NULL, NULL};
    kiln_tls_gen *g = NULL;
    static const char *const names[3] = {"--ssl_cert_file", "--ssl_key_file", "--ssl_ca_file"};
    for (int i = 0; i < t->n_paths; i++)
        if (!(text[i] = read_text(t->paths[i], names[i], err, err_len))) goto out;
    snprintf(what, sizeof what, "--ssl_cert_file '%s' / --ssl_key_file '%s'", t->paths[0], t->paths[1]);
    g = gen_load(text[0], text[1], text[2], t->client_verify, what, err, err_len);
out:
    for (int i = 0; i < 3; i++) free(text[i]);
    return g;
}

static void file_identity(const char *path, file_id *id)
{
    struct stat st;
    memset(id, 0, sizeof *id);
    if (stat(path, &st) != 0) {
        id->missing = 1;
        return;
    }
    id->mtime = st.st_mtim;
    id->size = st.st_size;
    id->ino = st.st_ino;
    id->dev = st.st_dev;
}

static int same_id(const file_id *a, const file_id *b)
{
    return a->missing == b->missing && a->mtime.tv_sec == b->mtime.tv_sec &&
           a->mtime.tv_nsec == b->mtime.tv_nsec && a->size == b->size && a->ino == b->ino &&
           a->dev == b->dev;
}

kiln_status kiln_tls_open(const kiln_tls_files *files, kiln_tls **out, char *err, size_t err_len)
{
    *out = NULL;
    kiln_tls *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, err_len, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    snprintf(t->flag, sizeof t->flag, "%s", files->flag ? files->flag : "TLS");
    if (files->ssl_config) {
        t->is_ssl_config = 1;
        t->paths[t->n_paths++] = strdup(files->ssl_config);
        snprintf(t->describe, sizeof t->describe, "SSLConfig %s", files->ssl_config);
    } else {
        if (!files->cert_file || !files->key_file) {
            set_err(err, err_len, "--ssl_cert_file and --ssl_key_file are both needed");
            free(t);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        if (files->client_verify && !files->ca_file) {
            set_err(err, err_len, "--ssl_client_verify needs --ssl_ca_file (the CA that signs "
                                  "client certificates)");
            free(t);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        t->paths[t->n_paths++] = strdup(files->cert_file);
        t->paths[t->n_paths++] = strdup(files->key_file);
        if (files->ca_file) t->paths[t->n_paths++] = strdup(files->ca_file);
        t->client_verify = files->client_verify;
        snprintf(t->describe, sizeof t->describe, "certificate %s, key %s%s%s", files->cert_file,
                 files->key_file, files->ca_file ? ", client CA " : "",
                 files->ca_file ? files->ca_file : "");
    }
    for (int i = 0; i < t->n_paths; i++)
        if (!t->paths[i]) {
            set_err(err, err_len, "out of memory");
            goto err_free;
        }
    for (int i = 0; i < t->n_paths; i++) file_identity(t->paths[i], &t->ids[i]);
    kiln_tls_gen *g = load_current_files(t, err, err_len);
    if (!g) goto err_free;
    atomic_store(&t->current, g);
    pthread_mutex_init(&t->reload_mu, NULL);
    atomic_store(&t->next_check_ms, mono_ms() + KILN_TLS_RECHECK_MS);
    *out = t;
    return KILN_OK;
err_free:
    for (int i = 0; i < t->n_paths; i++) free(t->paths[i]);
    free(t);
    return KILN_ERR_INVALID_ARGUMENT;
}

/* Load a new generation if a watched file changed (reload_mu held). */
static void reload_if_changed(kiln_tls *t)
{
    file_id now[3];
    int changed = 0;
    for (int i = 0; i < t->n_paths; i++) {
        file_identity(t->paths[i], &now[i]);
        changed |= !same_id(&now[i], &t->ids[i]);
    }
    if (!changed) return;
    for (int i = 0; i < t->n_paths; i++) t->ids[i] = now[i]; /* reported once per change */
    char err[768];
    kiln_tls_gen *g = load_current_files(t, err, sizeof err);
    if (!g) {
        fprintf(stderr, "kiln serve: TLS (%s): %s; the certificate loaded before stays in use\n",
                t->describe, err);
        return;
    }
    kiln_tls_gen *old = atomic_load(&t->current);
    g->older = old;
    atomic_store(&t->current, g);
    fprintf(stderr, "kiln serve: TLS (%s) re-read: serving certificate serial %s to new connections\n",
            t->describe, g->serial_hex);
}

const kiln_tls_gen *kiln_tls_current(kiln_tls *t)
{
    long long now = mono_ms();
    if (now >= atomic_load(&t->next_check_ms) && pthread_mutex_trylock(&t->reload_mu) == 0) {
        atomic_store(&t->next_check_ms, now + KILN_TLS_RECHECK_MS);
        reload_if_changed(t);
        pthread_mutex_unlock(&t->reload_mu);
    }
    return atomic_load(&t->current);
}

int kiln_tls_verify_peers(const kiln_tls_gen *g, const gnutls_datum_t *peers, unsigned n)
{
    if (!g->trust || !peers || n == 0) return 0;
    if (n > KILN_TLS_MAX_CHAIN) n = KILN_TLS_MAX_CHAIN;
    gnutls_x509_crt_t crts[KILN_TLS_MAX_CHAIN];
    unsigned have = 0;
    int ok = 0;
    for (; have < n; have++) {
        if (gnutls_x509_crt_init(&crts[have]) < 0) goto out;
        if (gnutls_x509_crt_import(crts[have], &peers[have], GNUTLS_X509_FMT_DER) < 0) {
            have++;
            goto out;
        }
    }
    unsigned status = 0;
    ok = gnutls_x509_trust_list_verify_crt(g->trust, crts, have, 0, &status, NULL) >= 0 && status == 0;
out:
    for (unsigned i = 0; i < have; i++) gnutls_x509_crt_deinit(crts[i]);
    return ok;
}

const char *kiln_tls_describe(const kiln_tls *t) { return t->describe; }

void kiln_tls_free(kiln_tls *t)
{
    if (!t) return;
    for (kiln_tls_gen *g = atomic_load(&t->current), *older; g; g = older) {
        older = g->older;
        gen_free(g);
    }
    pthread_mutex_destroy(&t->reload_mu);
    for (int i = 0; i < t->n_paths; i++) free(t->paths[i]);
    free(t);
}
