/*
 * tls.h - TLS credentials for `kiln serve`'s ports, re-read when their
 * files change so that certificates rotate without a restart
 * (docs/SECURITY.md, "TLS").
 *
 * A kiln_tls is built from either an SSLConfig text file (TF Serving's
 * --ssl_config_file format: PEM text of server_key, server_cert, custom_ca,
 * and client_verify) or from PEM files (Kiln's --ssl_cert_file,
 * --ssl_key_file, --ssl_ca_file, --ssl_client_verify: what cert-manager
 * and Kubernetes secrets provide). Either way the files are watched: at
 * most once a second, when a connection asks for the credentials, their
 * modification time, size and inode are compared with the last load, and a
 * change loads a new credential generation that later handshakes use. A
 * set that does not load (a key written before its certificate, a broken
 * file) keeps the last good generation in force and is reported on stderr
 * once per change. Connections already open keep the generation they
 * started with.
 *
 * A generation is immutable once published. Replaced generations are kept
 * until kiln_tls_free (a few KiB each), because GnuTLS sessions, in the
 * REST server's libmicrohttpd and in the gRPC transport, hold pointers into
 * them for as long as they live.
 */
#ifndef KILN_SERVE_TLS_H
#define KILN_SERVE_TLS_H

#include <gnutls/gnutls.h>
#include <gnutls/abstract.h>
#include <gnutls/x509.h>
#include <stddef.h>

#include "kiln/kiln.h"

#define KILN_TLS_MAX_CHAIN 16 /* certificates in a server chain */

/* Where the credentials come from. */
typedef struct kiln_tls_files {
    const char *ssl_config; /* SSLConfig text file; when set, the fields below are unused */
    const char *cert_file;  /* PEM certificate chain, server first */
    const char *key_file;   /* PEM private key */
    const char *ca_file;    /* PEM CA bundle for client certificates, or NULL */
    int client_verify;      /* clients must present a certificate signed by ca_file */
    const char *flag;       /* the flag named in messages ("--ssl_config_file", ...) */
} kiln_tls_files;

/* One loaded set of credentials. */
typedef struct kiln_tls_gen {
    gnutls_certificate_credentials_t cred; /* key, chain and CA trust (gRPC) */
    gnutls_pcert_st pcert[KILN_TLS_MAX_CHAIN]; /* the chain (REST's certificate callback) */
    unsigned n_pcert;
    gnutls_privkey_t key;                  /* the key (REST's certificate callback) */
    gnutls_x509_trust_list_t trust;        /* the CA for client certificates, or NULL */
    int client_verify;
    char serial_hex[64];                   /* the server certificate's serial (log lines) */
    struct kiln_tls_gen *older;            /* the generation it replaced */
} kiln_tls_gen;

typedef struct kiln_tls kiln_tls;

/* Load the files once (an error names the flag, the file and why). */
kiln_status kiln_tls_open(const kiln_tls_files *files, kiln_tls **out, char *err, size_t err_len);
/* The current generation, after a look at the files if the last one was
 * more than a second ago. Valid until kiln_tls_free. Thread-safe. */
const kiln_tls_gen *kiln_tls_current(kiln_tls *t);
/* Does the chain of DER certificates `peers` (leaf first) verify against
 * g's CA? (client certificates) */
int kiln_tls_verify_peers(const kiln_tls_gen *g, const gnutls_datum_t *peers, unsigned n);
/* A line for the startup log: what is served from where. */
const char *kiln_tls_describe(const kiln_tls *t);
void kiln_tls_free(kiln_tls *t);

#endif
