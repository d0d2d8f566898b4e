/*
 * cmd_watermark.c - `kiln watermark embed|verify`: a keyed mark in an ONNX
 * model's float32 weights (src/security/watermark.c, docs/WATERMARK.md).
 *
 * embed reads MODEL.onnx, adds the mark for (--key file, --label) and writes
 * --out; everything in the file but the carrying weights stays byte for
 * byte. verify reads the mark back from the weights alone and prints one
 * JSON object: bits matched, per-bit z-scores, the combined z-score and the
 * probability that an unmarked model scores as well; it exits 0 when the
 * mark is present (p below --max-p, default 1e-6), 1 when it is not.
 * verify of a .kiln file or a SavedModel folder loads it and reads its
 * float32 constants (kiln_model_constant) instead of the file's bytes;
 * embed writes ONNX files only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include <sodium.h>

#include "kiln/kiln_util.h"
#include "cli/cli.h"
#include "security/security.h"
#include "security/watermark.h"

#define WM_MAX_MODEL ((size_t)4 << 30)

static const char watermark_help[] =
    "usage: kiln watermark embed MODEL.onnx --key FILE --out OUT.onnx [--label TEXT]\n"
    "                            [--bits N] [--step S]\n"
    "       kiln watermark verify MODEL --key FILE [--label TEXT] [--bits N]\n"
    "                            [--step S] [--max-p P] [--tags TAGS]\n"
    "A keyed dither-modulation mark in the float32 initializers (of 256 elements or\n"
    "more) of an ONNX model; verify needs only the marked model and the key.\n"
    "verify also reads a .kiln file or a SavedModel folder (its constants as loaded,\n"
    "in graph order), so a mark embedded in an ONNX file is found after 'kiln compile';\n"
    "embed writes ONNX files only.\n"
    "  --tags TAGS    verify of a SavedModel: MetaGraph tags (default serve)\n"
    "  --key FILE     a secret file of 16 bytes or more (e.g. a key ring line from\n"
    "                 'kiln keygen --encryption'); the mark's pattern derives from it\n"
    "  --label TEXT   what the mark says (its bits are a keyed hash of TEXT; default '')\n"
    "  --bits N       message bits, 8..64 (default 32); the same at embed and verify\n"
    "  --step S       lattice step relative to each tensor's largest weight\n"
    "                 (default 0.01; weights move by at most S/2 of it); a larger\n"
    "                 step survives more rounding; the same at embed and verify\n"
    "  --max-p P      verify: the mark counts as present when the probability of\n"
    "                 an unmarked model scoring as well is below P (default 1e-6)\n"
    "verify prints one JSON object and exits 0 if the mark is present, 1 if not.\n"
    "docs/WATERMARK.md says more.\n";

static void print_report(const char *what, const kiln_wm_report *r, int present)
{
    printf("{\"%s\":true,\"bits\":%d,\"matched\":%d,\"tensors\":%d,\"elements\":%zu,"
           "\"message\":\"%016llx\",\"decoded\":\"%016llx\",\"z\":%.4f,\"p_value\":%.6g",
           what, r->bits, r->matched, r->tensors, r->elements, (unsigned long long)r->message,
           (unsigned long long)r->decoded, r->z, r->p_value);
    if (present >= 0) printf(",\"present\":%s", present ? "true" : "false");
    if (!strcmp(what, "embedded"))
        printf(",\"mean_rel_change\":%.6g,\"max_rel_change\":%.6g", r->mean_rel_change,
               r->max_rel_change);
    printf(",\"bit_z\":[");
    for (int k = 0; k < r->bits; k++) printf("%s%.4f", k ? "," : "", r->bit_z[k]);
    printf("]}\n");
}

/* An ONNX file (read byte for byte, as embed edits it), or a .kiln file or a
 * folder (SavedModel), read through the library. */
static int is_onnx_file(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return 1; /* the ONNX reader names the path */
    if (S_ISDIR(sb.st_mode)) return 0;
    static const uint8_t kiln_magic[8] = {0x89, 'K', 'I', 'L', 'N', '\r', '\n', 0x1a};
    uint8_t head[8] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    return !(n == sizeof head && memcmp(head, kiln_magic, sizeof head) == 0);
}

/* verify on a model loaded by the library: its float32 constants in graph order. */
static int verify_loaded(const char *path, const char *tags, const uint8_t key[32],
                         const char *label, int bits, double step, double max_p)
{
    kiln_model *m = kiln_cli_load_model(path, tags);
    if (!m) return KILN_CLI_EXIT_FAIL;
    int n = kiln_model_constant_count(m);
    const float **data = calloc(n > 0 ? (size_t)n : 1, sizeof *data);
    size_t *count = calloc(n > 0 ? (size_t)n : 1, sizeof *count);
    int rc = KILN_CLI_EXIT_FAIL;
    if (!data || !count) {
        kiln_cli_fail("out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const kiln_tensor *t = kiln_model_constant(m, i, NULL);
        if (!t || t->dtype != KILN_DTYPE_F32 || !t->data) continue;
        data[i] = t->data;
        count[i] = (size_t)kiln_tensor_count(t);
    }
    char err[KILN_SEC_ERR_LEN];
    kiln_wm_report rep;
    kiln_status st = kiln_wm_verify_tensors(data, count, n, key, label, bits, step, &rep, err);
    if (st != KILN_OK) {
        rc = kiln_cli_fail("%s: %s", path, err);
    } else {
        int present = rep.p_value < max_p;
        print_report("verified", &rep, present);
        rc = present ? KILN_CLI_EXIT_OK : KILN_CLI_EXIT_FAIL;
    }
out:
    free(data);
    free(count);
    kiln_model_free(m);
    return rc;
}

int kiln_cmd_watermark(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) return fputs(watermark_help, stdout), KILN_CLI_EXIT_OK;
    if (argc < 1) return kiln_cli_usage_error("watermark", "embed or verify is required");
    const char *mode = argv[0];
    int embed = !strcmp(mode, "embed");
    if (!embed && strcmp(mode, "verify"))
        return kiln_cli_usage_error("watermark", "unknown action '%s' (embed or verify)", mode);
    const char *path = NULL, *keyp = NULL, *out = NULL, *label = "", *bits_s = NULL,
               *step_s = NULL, *maxp_s = NULL, *tags = NULL;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = kiln_cli_option("watermark", argc, argv, &i, "--key", &keyp)) ||
            (r = kiln_cli_option("watermark", argc, argv, &i, "--label", &label)) ||
            (r = kiln_cli_option("watermark", argc, argv, &i, "--bits", &bits_s)) ||
            (embed && (r = kiln_cli_option("watermark", argc, argv, &i, "--out", &out))) ||
            (r = kiln_cli_option("watermark", argc, argv, &i, "--step", &step_s)) ||
            (!embed && (r = kiln_cli_option("watermark", argc, argv, &i, "--max-p", &maxp_s))) ||
            (!embed && (r = kiln_cli_option("watermark", argc, argv, &i, "--tags", &tags)))) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            continue;
        }
        if (path || argv[i][0] == '-')
            return kiln_cli_usage_error("watermark", "unexpected argument '%s'", argv[i]);
        path = argv[i];
    }
    if (!path) return kiln_cli_usage_error("watermark", "MODEL is required");
    if (!keyp) return kiln_cli_usage_error("watermark", "--key FILE is required");
    if (embed && !out) return kiln_cli_usage_error("watermark", "--out OUT.onnx is required");
    int bits = 32;
    if (bits_s && !kiln_cli_parse_int(bits_s, 8, KILN_WM_MAX_BITS, &bits))
        return kiln_cli_usage_error("watermark", "--bits '%s': expected 8..%d", bits_s,
                                    KILN_WM_MAX_BITS);
    double step = 0.01, max_p = 1e-6;
    char *end;
    if (step_s) {
        step = strtod(step_s, &end);
        if (end == step_s || *end || !(step > 0 && step <= 0.5))
            return kiln_cli_usage_error("watermark", "--step '%s': expected a number in (0, 0.5]",
                                        step_s);
    }
    if (maxp_s) {
        max_p = strtod(maxp_s, &end);
        if (end == maxp_s || *end || !(max_p > 0 && max_p < 1))
            return kiln_cli_usage_error("watermark", "--max-p '%s': expected a number in (0, 1)",
                                        maxp_s);
    }
    if (sodium_init() < 0) return kiln_cli_fail("libsodium failed to initialise");

    char err[KILN_SEC_ERR_LEN];
    uint8_t *keyfile = NULL, *model = NULL;
    size_t keylen = 0, len = 0;
    uint8_t key[32];
    if (kiln_sec_read_file(keyp, 1 << 20, &keyfile, &keylen, err) != KILN_OK)
        return kiln_cli_fail("%s", err);
    kiln_status st = kiln_wm_derive_key(keyfile, keylen, key, err);
    sodium_memzero(keyfile, keylen);
    free(keyfile);
    if (st != KILN_OK) return kiln_cli_fail("%s: %s", keyp, err);
    if (!is_onnx_file(path)) {
        if (embed) {
            sodium_memzero(key, sizeof key);
            return kiln_cli_fail("%s: embed writes ONNX files only; mark the ONNX model and "
                                 "convert it (kiln compile), then verify the result", path);
        }
        int rc = verify_loaded(path, tags, key, label, bits, step, max_p);
        sodium_memzero(key, sizeof key);
        return rc;
    }
    if (kiln_sec_read_file(path, WM_MAX_MODEL, &model, &len, err) != KILN_OK) {
        sodium_memzero(key, sizeof key);
        return kiln_cli_fail("%s", err);
    }
    kiln_wm_report rep;
    int rc = KILN_CLI_EXIT_OK;
    if (embed) {
        st = kiln_wm_embed(model, len, key, label, bits, step, &rep, err);
        if (st != KILN_OK) {
            rc = kiln_cli_fail("%s: %s", path, err);
        } else {
            FILE *f = fopen(out, "wb");
            int ok = f && fwrite(model, 1, len, f) == len;
            if (f && fclose(f) != 0) ok = 0;
            if (!ok) {
                remove(out);
                rc = kiln_cli_fail("%s: cannot write the marked model", out);
            } else {
                print_report("embedded", &rep, -1);
            }
        }
    } else {
        st = kiln_wm_verify(model, len, key, label, bits, step, &rep, err);
        if (st != KILN_OK) {
            rc = kiln_cli_fail("%s: %s", path, err);
        } else {
            int present = rep.p_value < max_p;
            print_report("verified", &rep, present);
            rc = present ? KILN_CLI_EXIT_OK : KILN_CLI_EXIT_FAIL;
        }
    }
    sodium_memzero(key, sizeof key);
    free(model);
    return rc;
}
