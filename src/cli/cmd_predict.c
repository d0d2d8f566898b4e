/*
 * cmd_predict.c - `kiln predict MODEL --input NAME=FILE.npy ... --output-dir
 * DIR [--signature NAME]`: run a model once on .npy inputs and write each
 * output as DIR/<output>.npy.
 *
 * The steps, each of which stops with one "kiln: ..." line on failure:
 * load the model; find the signature (the model's default unless
 * --signature names one); match every --input to a signature input (each
 * signature input exactly once); read the .npy files (npy.c); create a
 * session and run it; create DIR if missing; write one .npy per output,
 * named after the output with every byte outside [A-Za-z0-9._-] replaced by
 * '_', and print "<name>: <dtype>[d0,d1,...] -> DIR/<file>.npy" for each.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "cli/cli.h"
#include "cli/json_out.h"
#include "cli/npy.h"
#include "serve/integrity.h"
#include "serve/json.h"

static const char predict_usage[] =
    "usage: kiln predict MODEL --input NAME=FILE.npy [--input ...] --output-dir DIR\n"
    "                    [--signature NAME] [--threads N] [--disable-optimizer] [--reference] [--tags TAGS]\n"
    "                    [--decryption-key RING]\n"
    "\n"
    "Run MODEL once on inputs read from NumPy .npy files and write each output\n"
    "to DIR/<output>.npy (characters outside [A-Za-z0-9._-] in the output name\n"
    "become '_'). Prints one line per output: NAME: DTYPE[DIMS] -> PATH.\n"
    "\n"
    "  MODEL              an .onnx file or a SavedModel directory\n"
    "  --input NAME=FILE  the .npy file for signature input NAME; give every input once\n"
    "  --output-dir DIR   where to write outputs (created if missing)\n"
    "  --signature NAME   the signature to run (default: the model's default)\n"
    KILN_CLI_RUN_OPTIONS_HELP
    "  --tags TAGS        SavedModel MetaGraph tags, comma-separated (default: serve)\n"
    "  --decryption-key RING  key ring for a folder encrypted by 'kiln encrypt' (decrypted\n"
    "                     in memory, as kiln serve --model_decryption_key_file does)\n"
    "  -h, --help         show this help\n"
    "\n"
    ".npy inputs: C order; float16/32/64, (u)int8/16/32/64, bool, bytes (S) and\n"
    "unicode (U, passed to the model as UTF-8). String outputs are written as S.\n";

/* One --input argument, matched to a signature input. */
typedef struct predict_input {
    const char *arg;     /* the NAME=FILE text as given */
    const char *file;    /* points into arg, after the '=' */
    int sig_index;       /* which signature input, or -1 before matching */
    kiln_tensor *tensor; /* read from file; owned */
} predict_input;

/* The parsed command line. */
typedef struct predict_args {
    const char *model;
    const char *output_dir;
    const char *signature;   /* NULL: the default */
    const char *tags;
    const char *key_ring;    /* --decryption-key: NULL = a plain model */
    kiln_session_options so; /* --threads, --disable-optimizer, --reference */
    predict_input *inputs;   /* n_inputs entries; malloc'd */
    int n_inputs;
} predict_args;

/* Parse argv into a; returns an exit status or -1 to go on. */
static int parse_args(int argc, char **argv, predict_args *a)
{
    static const char cmd[] = "predict";
    bool positional_only = false;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *val = NULL;
        int r;
        if (!positional_only && strcmp(arg, "--") == 0) {
            positional_only = true;
            continue;
        }
        if (positional_only || arg[0] != '-' || arg[1] == '\0') {
            if (a->model) return kiln_cli_usage_error(cmd, "unexpected argument '%s'", arg);
            a->model = arg;
            continue;
        }
        if ((r = kiln_cli_option(cmd, argc, argv, &i, "--input", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            const char *eq = strchr(val, '=');
            if (!eq || eq == val || eq[1] == '\0')
                return kiln_cli_usage_error(cmd, "--input '%s' is not NAME=FILE", val);
            a->inputs[a->n_inputs++] = (predict_input){val, eq + 1, -1, NULL};
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--output-dir", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!val[0]) return kiln_cli_usage_error(cmd, "--output-dir is empty");
            a->output_dir = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--signature", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->signature = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--tags", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->tags = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--decryption-key", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->key_ring = val;
        } else if ((r = kiln_cli_run_option(cmd, argc, argv, &i, &a->so)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else {
            return kiln_cli_usage_error(cmd, "unknown option '%s'", arg);
        }
    }
    if (!a->model) return kiln_cli_usage_error(cmd, "missing MODEL");
    if (!a->output_dir) return kiln_cli_usage_error(cmd, "missing --output-dir DIR");
    return -1;
}

/* Write "a, b, c" (the signature's input names) into buf. */
static const char *input_names(const kiln_signature *sig, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    int n = kiln_signature_input_count(sig);
    for (int j = 0; j < n && k < cap; j++)
        k += (size_t)snprintf(buf + k, cap - k, j ? ", %s" : "%s",
                              kiln_signature_input(sig, j)->name);
    if (n == 0) snprintf(buf, cap, "none");
    return buf;
}

/*
 * Match each --input to a signature input. NAME=FILE splits at the '='
 * after the longest signature input name it starts with, so names that
 * contain '=' still work; otherwise at the first '='.
 */
static int match_inputs(const kiln_signature *sig, predict_args *a)
{
    char names[1024];
    const char *sig_name = kiln_signature_name(sig);
    int n_sig = kiln_signature_input_count(sig);
    for (int k = 0; k < a->n_inputs; k++) {
        predict_input *in = &a->inputs[k];
        size_t best = 0;
        for (int j = 0; j < n_sig; j++) {
            const char *name = kiln_signature_input(sig, j)->name;
            size_t len = strlen(name);
            if (len >= best && strncmp(in->arg, name, len) == 0 && in->arg[len] == '=' &&
                in->arg[len + 1] != '\0') {
                best = len;
                in->sig_index = j;
                in->file = in->arg + len + 1;
            }
        }
        if (in->sig_index < 0) {
            int len = (int)(strchr(in->arg, '=') - in->arg);
            return kiln_cli_fail("--input '%.*s' is not an input of signature '%s' (inputs: %s)",
                                 len, in->arg, sig_name, input_names(sig, names, sizeof names));
        }
        for (int p = 0; p < k; p++)
            if (a->inputs[p].sig_index == in->sig_index)
                return kiln_cli_fail("--input '%s' is given more than once",
                                     kiln_signature_input(sig, in->sig_index)->name);
    }
    for (int j = 0; j < n_sig; j++) {
        bool given = false;
        for (int k = 0; k < a->n_inputs; k++) given |= a->inputs[k].sig_index == j;
        if (!given)
            return kiln_cli_fail("missing --input for '%s' (signature '%s' needs: %s)",
                                 kiln_signature_input(sig, j)->name, sig_name,
                                 input_names(sig, names, sizeof names));
    }
    return -1;
}

/* mkdir -p: create dir and any missing parents. */
static int make_dirs(const char *dir)
{
    char *path = strdup(dir);
    if (!path) return kiln_cli_fail("out of memory");
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            free(path);
            return kiln_cli_fail("cannot create output directory %s: %s", dir, strerror(e));
        }
        *p = c;
        if (c == '\0') break;
    }
    free(path);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kiln_cli_fail("output directory %s is not a directory", dir);
    return -1;
}

/* The file name for output `name`: bytes outside [A-Za-z0-9._-] become '_'. */
static char *output_file_name(const char *name)
{
    size_t n = strlen(name);
    char *s = malloc(n + 5);
    if (!s) return NULL;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        s[i] = ok ? c : '_';
    }
    memcpy(s + n, ".npy", 5);
    return s;
}

/* Write every output to the output directory and print a line for each. */
static int write_outputs(const kiln_outputs *out, const char *dir)
{
    int n = kiln_outputs_count(out);
    char **files = calloc((size_t)(n > 0 ? n : 1), sizeof *files);
    int rc = -1;
    if (!files) return kiln_cli_fail("out of memory");
    for (int i = 0; i < n && rc < 0; i++) {
        files[i] = output_file_name(kiln_outputs_name(out, i));
        if (!files[i]) rc = kiln_cli_fail("out of memory");
        for (int p = 0; p < i && rc < 0; p++)
            if (strcmp(files[p], files[i]) == 0)
                rc = kiln_cli_fail("outputs '%s' and '%s' would both be written to %s",
                                   kiln_outputs_name(out, p), kiln_outputs_name(out, i),
                                   files[i]);
    }
    if (rc < 0) rc = make_dirs(dir);
    size_t dlen = strlen(dir);
    const char *sep = dlen && dir[dlen - 1] == '/' ? "" : "/";
    for (int i = 0; i < n && rc < 0; i++) {
        const kiln_tensor *t = kiln_outputs_get(out, i);
        size_t plen = dlen + strlen(files[i]) + 2;
        char *path = malloc(plen);
        if (!path) {
            rc = kiln_cli_fail("out of memory");
            break;
        }
        snprintf(path, plen, "%s%s%s", dir, sep, files[i]);
        if (t->dtype == KILN_DTYPE_SEQUENCE || t->dtype == KILN_DTYPE_OPTIONAL) {
            rc = kiln_cli_fail("output '%s' is a %s value; .npy files hold tensors "
                               "(docs/SEQUENCES.md)", kiln_outputs_name(out, i),
                               kiln_dtype_name(t->dtype));
        } else if (kiln_npy_write(path, t) != KILN_OK) {
            rc = kiln_cli_fail("output '%s': %s", kiln_outputs_name(out, i),
                               kiln_npy_last_error());
        } else {
            kiln_text_write(stdout, kiln_outputs_name(out, i));
            printf(": %s[", kiln_dtype_name(t->dtype));
            for (int d = 0; d < t->rank; d++) printf(d ? ",%lld" : "%lld", (long long)t->dims[d]);
            printf("] -> ");
            kiln_text_write(stdout, path);
            putchar('\n');
        }
        free(path);
    }
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    return rc;
}

int kiln_cmd_predict(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) {
        fputs(predict_usage, stdout);
        return KILN_CLI_EXIT_OK;
    }
    predict_args a = {0};
    kiln_session_options_init(&a.so);
    a.inputs = calloc((size_t)(argc > 0 ? argc : 1), sizeof *a.inputs);
    if (!a.inputs) return kiln_cli_fail("out of memory");
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) goto out_free_inputs;

    kiln_model *m = NULL;
    if (a.key_ring) { /* an encrypted folder, decrypted in memory (serve/integrity.c) */
        kiln_integrity_options io = {NULL, a.key_ring};
        kiln_load_options lo = {KILN_FORMAT_AUTO, a.tags, 0};
        char err[KILN_JSON_ERR_LEN];
        if (kiln_integrity_load(&io, a.model, &lo, &m, err) != KILN_OK)
            kiln_cli_fail("%s: %s", a.model, err);
    } else {
        m = kiln_cli_load_model(a.model, a.tags);
    }
    if (!m) {
        rc = KILN_CLI_EXIT_FAIL;
        goto out_free_inputs;
    }
    const kiln_signature *sig = kiln_model_find_signature(m, a.signature);
    if (!sig) {
        char names[1024];
        size_t k = 0;
        names[0] = '\0';
        for (int i = 0; i < kiln_model_signature_count(m) && k < sizeof names; i++)
            k += (size_t)snprintf(names + k, sizeof names - k, i ? ", %s" : "%s",
                                  kiln_signature_name(kiln_model_signature(m, i)));
        if (a.signature)
            rc = kiln_cli_fail("%s has no signature '%s' (signatures: %s)", a.model, a.signature,
                               names[0] ? names : "none");
        else
            rc = kiln_cli_fail("%s has no default signature (signatures: %s)", a.model,
                               names[0] ? names : "none");
        goto out_free_model;
    }
    if ((rc = match_inputs(sig, &a)) >= 0) goto out_free_model;

    kiln_named_tensor *named = calloc((size_t)(a.n_inputs > 0 ? a.n_inputs : 1), sizeof *named);
    if (!named) {
        rc = kiln_cli_fail("out of memory");
        goto out_free_model;
    }
    for (int k = 0; k < a.n_inputs; k++) {
        predict_input *in = &a.inputs[k];
        if (kiln_npy_read(in->file, &in->tensor) != KILN_OK) {
            rc = kiln_cli_fail("input '%s': %s", kiln_signature_input(sig, in->sig_index)->name,
                               kiln_npy_last_error());
            goto out_free_named;
        }
        named[k] = (kiln_named_tensor){kiln_signature_input(sig, in->sig_index)->name,
                                       in->tensor};
    }

    kiln_session *session = NULL;
    if (kiln_session_create(m, a.signature, &a.so, &session) != KILN_OK) {
        rc = kiln_cli_fail("%s", kiln_last_error());
        goto out_free_named;
    }
    kiln_outputs *out = NULL;
    if (kiln_session_run(session, named, a.n_inputs, &out) != KILN_OK) {
        rc = kiln_cli_fail("%s", kiln_last_error());
        goto out_free_session;
    }
    rc = write_outputs(out, a.output_dir);
    if (rc < 0 && (fflush(stdout) != 0 || ferror(stdout)))
        rc = kiln_cli_fail("writing to stdout failed");
    if (rc < 0) rc = KILN_CLI_EXIT_OK;
    kiln_outputs_free(out);

out_free_session:
    kiln_session_free(session);
out_free_named:
    free(named);
out_free_model:
    kiln_model_free(m);
out_free_inputs:
    for (int k = 0; k < a.n_inputs; k++) kiln_tensor_free(a.inputs[k].tensor);
    free(a.inputs);
    return rc;
}
