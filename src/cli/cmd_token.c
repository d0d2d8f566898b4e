/*
 * cmd_token.c - `kiln token create`: a new random bearer token for
 * `kiln serve --auth_token_file` (src/serve/auth.h, docs/SECURITY.md).
 *
 * The token is 32 bytes from libsodium's randombytes, written as "kiln_"
 * and 43 characters of URL-safe base64. It is printed once and stored
 * nowhere: what goes into the token file is the line with its SHA-256,
 * its scopes and an optional name, printed after it (or appended to the
 * file with --append FILE, created with mode 0600).
 */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "serve/auth.h"

static const char token_help[] =
    "usage: kiln token create --scopes S[,S...] [--name NAME] [--append FILE]\n"
    "\n"
    "Print a new random bearer token (first line) and the token file line that\n"
    "grants it (second line: its SHA-256, scopes and name; the token itself is\n"
    "not stored anywhere). Scopes: predict, metadata, admin. With --append the\n"
    "line is also appended to FILE (created 0600), which `kiln serve\n"
    "--auth_token_file=FILE` re-reads within a second or two.\n";

int kiln_cmd_token(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv) || argc == 0) {
        fputs(token_help, argc == 0 ? stderr : stdout);
        return argc == 0 ? KILN_CLI_EXIT_USAGE : KILN_CLI_EXIT_OK;
    }
    if (strcmp(argv[0], "create") != 0)
        return kiln_cli_usage_error("token", "unknown action '%s' (expected create)", argv[0]);
    const char *scopes = NULL, *name = NULL, *append = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = kiln_cli_option("token", argc, argv, &i, "--scopes", &scopes)) != 0 ||
            (r = kiln_cli_option("token", argc, argv, &i, "--name", &name)) != 0 ||
            (r = kiln_cli_option("token", argc, argv, &i, "--append", &append)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            continue;
        }
        return kiln_cli_usage_error("token", "unexpected argument '%s'", argv[i]);
    }
    if (!scopes) return kiln_cli_usage_error("token", "--scopes is required (predict, metadata, admin)");
    if (sodium_init() < 0) return kiln_cli_fail("libsodium failed to initialise");
    unsigned char raw[32];
    randombytes_buf(raw, sizeof raw);
    char b64[sodium_base64_ENCODED_LEN(32, sodium_base64_VARIANT_URLSAFE_NO_PADDING)];
    sodium_bin2base64(b64, sizeof b64, raw, sizeof raw, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    sodium_memzero(raw, sizeof raw);
    char token[8 + sizeof b64];
    snprintf(token, sizeof token, "kiln_%s", b64);
    char line[256], err[KILN_AUTH_ERR_LEN];
    if (kiln_token_line(token, scopes, name, line, sizeof line, err, sizeof err) != KILN_OK)
        return kiln_cli_usage_error("token", "%s", err);
    if (append) {
        int fd = open(append, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) return kiln_cli_fail("%s: %s", append, strerror(errno));
        size_t n = strlen(line);
        line[n] = '\n';
        ssize_t w = write(fd, line, n + 1);
        line[n] = '\0';
        if (w != (ssize_t)(n + 1) || close(fd) != 0)
            return kiln_cli_fail("%s: cannot append the line", append);
    }
    printf("%s\n%s\n", token, line);
    sodium_memzero(token, sizeof token);
    return KILN_CLI_EXIT_OK;
}
