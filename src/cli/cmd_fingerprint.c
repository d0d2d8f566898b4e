/*
 * cmd_fingerprint.c - `kiln fingerprint MODEL`: a stable identity of a
 * model's weights and structure.
 *
 * The model is loaded, its canonical form (api/fingerprint.c: ops in
 * topological order, attributes, every constant's dtype, shape and values;
 * no names, no file encoding) is hashed with BLAKE2b-256 (libsodium), and
 * the hash printed as "kiln-fp1:<64 hex>". The same weights saved with
 * raw_data or typed fields, with external data, or with other node names
 * give the same fingerprint; one changed weight gives another.
 * docs/SECURITY.md says more.
 */
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "kiln/kiln_util.h"
#include "cli/cli.h"

static const char fingerprint_help[] =
    "usage: kiln fingerprint MODEL [--tags TAGS]\n"
    "Prints kiln-fp1:<BLAKE2b-256 of the model's canonical form>: its ops in\n"
    "topological order with their attributes, and every weight's dtype, shape and\n"
    "values; not the names nor how the file encodes them (raw_data or typed\n"
    "fields, external data). MODEL is an .onnx file or a SavedModel folder.\n";

static void hash_write(void *ctx, const void *p, size_t n)
{
    crypto_generichash_update(ctx, p, (unsigned long long)n);
}

int kiln_cmd_fingerprint(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) return fputs(fingerprint_help, stdout), KILN_CLI_EXIT_OK;
    const char *path = NULL, *tags = NULL;
    for (int i = 0; i < argc; i++) {
        int r = kiln_cli_option("fingerprint", argc, argv, &i, "--tags", &tags);
        if (r < 0) return KILN_CLI_EXIT_USAGE;
        if (r > 0) continue;
        if (path || argv[i][0] == '-')
            return kiln_cli_usage_error("fingerprint", "unexpected argument '%s'", argv[i]);
        path = argv[i];
    }
    if (!path) return kiln_cli_usage_error("fingerprint", "MODEL is required");
    if (sodium_init() < 0) return kiln_cli_fail("libsodium failed to initialise");
    kiln_model *m = kiln_cli_load_model(path, tags);
    if (!m) return KILN_CLI_EXIT_FAIL;
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, 32);
    kiln_status st = kiln_model_canonical_write(m, hash_write, &h);
    kiln_model_free(m);
    if (st != KILN_OK) return kiln_cli_fail("%s: cannot fingerprint: %s", path, kiln_status_name(st));
    uint8_t out[32];
    char hex[65];
    crypto_generichash_final(&h, out, sizeof out);
    sodium_bin2hex(hex, sizeof hex, out, sizeof out);
    printf("kiln-fp1:%s\n", hex);
    return KILN_CLI_EXIT_OK;
}
