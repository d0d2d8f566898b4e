/*
 * cmd_healthcheck.c - `kiln healthcheck`: ask a local `kiln serve` whether
 * it is ready, for container HEALTHCHECKs and exec probes in images that
 * hold nothing but the kiln binary and its libraries (deploy/Dockerfile).
 *
 * Sends one HTTP/1.0 GET (default /v2/health/ready) to 127.0.0.1 and exits
 * 0 if the status is 200, 1 otherwise (with one "kiln: ..." line), within
 * a timeout (default 2 s). With --tls the GET goes over TLS (GnuTLS), for a
 * server whose REST port serves HTTPS; the server's certificate is not
 * checked (the probe asks a process on this host whether it is ready, it
 * sends nothing secret), and --cert/--key present a client certificate to
 * a server that requires one (--ssl_client_verify).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gnutls/gnutls.h>

#include "cli/cli.h"

static const char healthcheck_help[] =
    "usage: kiln healthcheck [--port N] [--path P] [--timeout_ms N] [--tls [--cert F --key F]]\n"
    "GET http://127.0.0.1:N/P (default port 8501, path /v2/health/ready, timeout\n"
    "2000 ms); exit 0 on status 200, else 1. --tls: https (the server's certificate is\n"
    "not checked); --cert/--key: a client certificate for mutual TLS.\n";

/* One TLS exchange on the connected socket fd: send req, read up to cap - 1
 * bytes of the answer into resp. The byte count, or -1 with err set. */
static ssize_t tls_exchange(int fd, int timeout_ms, const char *cert, const char *key,
                            const char *req, size_t n, char *resp, size_t cap, char *err,
                            size_t err_len)
{
    gnutls_certificate_credentials_t cred = NULL;
    gnutls_session_t ses = NULL;
    ssize_t got = -1;
    int rc = gnutls_certificate_allocate_credentials(&cred);
    if (rc >= 0 && cert)
        rc = gnutls_certificate_set_x509_key_file(cred, cert, key, GNUTLS_X509_FMT_PEM);
    if (rc >= 0) rc = gnutls_init(&ses, GNUTLS_CLIENT);
    if (rc >= 0) rc = gnutls_set_default_priority(ses);
    if (rc >= 0) rc = gnutls_credentials_set(ses, GNUTLS_CRD_CERTIFICATE, cred);
    if (rc >= 0) {
        gnutls_transport_set_int(ses, fd);
        gnutls_handshake_set_timeout(ses, (unsigned)timeout_ms);
        do rc = gnutls_handshake(ses);
        while (rc == GNUTLS_E_INTERRUPTED); /* AGAIN: the socket's timeout ran out */
    }
    if (rc >= 0) {
        ssize_t w = gnutls_record_send(ses, req, n);
        rc = w == (ssize_t)n ? 0 : (w < 0 ? (int)w : GNUTLS_E_PUSH_ERROR);
    }
    if (rc < 0) {
        snprintf(err, err_len, "TLS: %s", gnutls_strerror(rc));
        goto out;
    }
    got = 0;
    while ((size_t)got < cap - 1) {
        ssize_t r = gnutls_record_recv(ses, resp + got, cap - 1 - (size_t)got);
        if (r <= 0) break;
        got += r;
    }
out:
    if (ses) gnutls_deinit(ses);
    if (cred) gnutls_certificate_free_credentials(cred);
    return got;
}

int kiln_cmd_healthcheck(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) return fputs(healthcheck_help, stdout), KILN_CLI_EXIT_OK;
    const char *port_s = NULL, *path = "/v2/health/ready", *timeout_s = NULL;
    const char *cert = NULL, *key = NULL;
    int tls = 0;
    for (int i = 0; i < argc; i++) {
        int r;
        if (strcmp(argv[i], "--tls") == 0) {
            tls = 1;
            continue;
        }
        if ((r = kiln_cli_option("healthcheck", argc, argv, &i, "--port", &port_s)) != 0 ||
            (r = kiln_cli_option("healthcheck", argc, argv, &i, "--cert", &cert)) != 0 ||
            (r = kiln_cli_option("healthcheck", argc, argv, &i, "--key", &key)) != 0 ||
            (r = kiln_cli_option("healthcheck", argc, argv, &i, "--path", &path)) != 0 ||
            (r = kiln_cli_option("healthcheck", argc, argv, &i, "--timeout_ms", &timeout_s)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            continue;
        }
        return kiln_cli_usage_error("healthcheck", "unexpected argument '%s'", argv[i]);
    }
    int port = 8501, timeout = 2000;
    if (port_s && !kiln_cli_parse_int(port_s, 1, 65535, &port))
        return kiln_cli_usage_error("healthcheck", "--port '%s' is not in 1..65535", port_s);
    if (timeout_s && !kiln_cli_parse_int(timeout_s, 1, 600000, &timeout))
        return kiln_cli_usage_error("healthcheck", "--timeout_ms '%s' is not in 1..600000",
                                    timeout_s);
    if ((cert || key) && !(cert && key && tls))
        return kiln_cli_usage_error("healthcheck", "--cert and --key go together, with --tls");
    if (path[0] != '/' || strpbrk(path, " \r\n"))
        return kiln_cli_usage_error("healthcheck", "--path '%s' is not an absolute URL path", path);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return kiln_cli_fail("socket: %s", strerror(errno));
    struct timeval tv = {timeout / 1000, (timeout % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return kiln_cli_fail("127.0.0.1:%d: %s", port, strerror(errno));
    }
    char req[600], resp[64];
    int n = snprintf(req, sizeof req, "GET %.500s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    ssize_t got = 0;
    if (tls) {
        char err[200];
        got = tls_exchange(fd, timeout, cert, key, req, (size_t)n, resp, sizeof resp, err, sizeof err);
        close(fd);
        if (got < 0) return kiln_cli_fail("127.0.0.1:%d: %s", port, err);
    } else {
        if (write(fd, req, (size_t)n) != n) {
            close(fd);
            return kiln_cli_fail("127.0.0.1:%d: cannot send the request", port);
        }
        while ((size_t)got < sizeof resp - 1) {
            ssize_t r = read(fd, resp + got, sizeof resp - 1 - (size_t)got);
            if (r <= 0) break;
            got += r;
        }
        close(fd);
    }
    resp[got] = '\0';
    int status = 0;
    if (sscanf(resp, "HTTP/%*d.%*d %d", &status) != 1)
        return kiln_cli_fail("127.0.0.1:%d%s: no HTTP answer", port, path);
    if (status != 200) return kiln_cli_fail("127.0.0.1:%d%s: status %d", port, path, status);
    return KILN_CLI_EXIT_OK;
}
