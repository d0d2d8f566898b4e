/*
 * cmd_bench.c - `kiln bench MODEL --batch N --threads T [--iterations K]
 * [--warmup W] [--dim NAME=SIZE ...] [--signature S] [--json]`: measure how
 * fast a model loads and runs on random inputs.
 *
 * What is timed (CLOCK_MONOTONIC, milliseconds):
 *   model_load_ms       kiln_model_load
 *   session_create_ms   kiln_session_create
 *   load_ms             the two together
 *   first_inference_ms  the first kiln_session_run
 *   load_to_first_inference_ms   load_ms + first_inference_ms
 *   then W warmup runs (not recorded) and K recorded runs, of which the
 *   median, p90, p99 (linear interpolation between the two nearest ranks,
 *   as numpy.percentile does), mean, min and max are reported, with
 *   throughput = batch * 1000 / median_ms examples per second and the
 *   process's peak resident set at the end (MiB; VmHWM, or getrusage's
 *   ru_maxrss where /proc is missing: see peak_rss_mb).
 * Only kiln_session_run is inside the timer; making the inputs and freeing
 * the outputs are not.
 *
 * The inputs are random, from a fixed seed (--seed), made once and reused
 * by every run. Their shapes come from the signature: a fixed dim is used
 * as it is; a symbolic or unknown dim on axis 0, and every dim sharing the
 * first such dim's name, is the batch dim and gets --batch; any other
 * symbolic dim needs --dim NAME=SIZE (an error names the dim otherwise).
 * Their values, by dtype (the same scheme as bench/ort_bench.js and
 * bench/torch_bench.py):
 *   float types          uniform in [-1, 1)
 *   integer types        uniform in [0, --int-high) (default 100), because
 *                        integer inputs are nearly always ids or indices
 *                        (token ids, embedding rows) and 100 is below every
 *                        vocabulary and table size of the benchmark models;
 *                        an input whose name contains "mask" is all 1s
 *                        instead (every position attended, as in an unpadded
 *                        batch), so attention masks stay masks
 *   bool                 0 or 1 with equal odds
 * String and float8/4-bit inputs are rejected.
 *
 * --threads is passed to the session options (the reference executor runs
 * on the calling thread and ignores it for now).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/json_out.h"
#include "kiln/kiln_util.h"

static const char bench_usage[] =
    "usage: kiln bench MODEL [--batch N] [--threads T] [--iterations K] [--warmup W]\n"
    "                  [--dim NAME=SIZE ...] [--signature NAME] [--json]\n"
    "                  [--int-high N] [--seed N] [--disable-optimizer] [--reference]\n"
    "                  [--profile] [--tags TAGS]\n"
    "\n"
    "Load MODEL, run it on random inputs made from its signature, and report the\n"
    "load time, the first inference, the median / p90 / p99 latency of K runs after\n"
    "W warmup runs, the throughput (batch * 1000 / median ms) and the peak RSS.\n"
    "\n"
    "  MODEL              an .onnx file or a SavedModel directory\n"
    "  --batch N          size of the batch dim: the symbolic dim on axis 0 of the\n"
    "                     inputs (and every dim with its name); default 1\n"
    KILN_CLI_RUN_OPTIONS_HELP
    "  --iterations K     recorded runs (default 20)\n"
    "  --warmup W         runs after the first one that are not recorded (default 2)\n"
    "  --dim NAME=SIZE    size of the symbolic dim NAME (any other than the batch);\n"
    "                     repeat for several\n"
    "  --signature NAME   the signature to run (default: the model's default)\n"
    "  --json             print one JSON object instead of text\n"
    "  --int-high N       integer inputs are uniform in [0, N) (default 100); inputs\n"
    "                     whose name contains \"mask\" are all 1s\n"
    "  --seed N           seed of the random inputs (default 1)\n"
    "  --profile          after the runs, print the time per op and kernel, and the\n"
    "                     work, rate and share of peak of the products, over the\n"
    "                     timed runs (not the first run or the warmup), and every\n"
    "                     step on reference code (stderr)\n"
    "  --tags TAGS        SavedModel MetaGraph tags, comma-separated (default: serve)\n"
    "  -h, --help         show this help\n"
    "\n"
    "Float inputs are uniform in [-1, 1), bool inputs 0 or 1. JSON keys: load_ms,\n"
    "model_load_ms, session_create_ms, first_inference_ms,\n"
    "load_to_first_inference_ms, median_ms, p90_ms, p99_ms, mean_ms, min_ms, max_ms,\n"
    "throughput_per_s, peak_rss_mb, reference_share (the share of the timed runs'\n"
    "time on reference kernels), and the model, batch, inputs and outputs.\n";

#define BENCH_DEFAULT_ITERATIONS 20
#define BENCH_DEFAULT_WARMUP 2
#define BENCH_DEFAULT_INT_HIGH 100

/* One --dim NAME=SIZE. */
typedef struct bench_dim {
    const char *arg;   /* NAME=SIZE as given */
    size_t name_len;   /* NAME is arg[0..name_len) */
    int64_t size;
    bool used;         /* matched a symbolic dim of the signature */
} bench_dim;

/* The parsed command line. */
typedef struct bench_args {
    const char *model;
    const char *signature;   /* NULL: the default */
    const char *tags;
    int batch;
    bool batch_given;
    kiln_session_options so; /* --threads, --disable-optimizer, --reference */
    int iterations;
    int warmup;
    int profile;
    int int_high;
    int seed;
    bool json;
    bench_dim *dims;         /* n_dims entries; malloc'd */
    int n_dims;
} bench_args;

/* Parse argv into a; returns an exit status or -1 to go on. */
static int parse_args(int argc, char **argv, bench_args *a)
{
    static const char cmd[] = "bench";
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
        if ((r = kiln_cli_option(cmd, argc, argv, &i, "--batch", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, 1 << 20, &a->batch))
                return kiln_cli_usage_error(cmd, "--batch '%s' is not a number in 1..1048576",
                                            val);
            a->batch_given = true;
        } else if ((r = kiln_cli_run_option(cmd, argc, argv, &i, &a->so)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--iterations", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, 10000000, &a->iterations))
                return kiln_cli_usage_error(cmd,
                                            "--iterations '%s' is not a number in 1..10000000",
                                            val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--warmup", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 0, 10000000, &a->warmup))
                return kiln_cli_usage_error(cmd, "--warmup '%s' is not a number in 0..10000000",
                                            val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--dim", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            const char *eq = strrchr(val, '=');
            int size = 0;
            if (!eq || eq == val || !kiln_cli_parse_int(eq + 1, 1, INT32_MAX, &size))
                return kiln_cli_usage_error(cmd, "--dim '%s' is not NAME=SIZE with SIZE >= 1",
                                            val);
            a->dims[a->n_dims++] = (bench_dim){val, (size_t)(eq - val), size, false};
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--signature", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->signature = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--tags", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->tags = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--int-high", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, INT32_MAX, &a->int_high))
                return kiln_cli_usage_error(cmd,
                                            "--int-high '%s' is not a number in 1..2147483647",
                                            val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--seed", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 0, INT32_MAX, &a->seed))
                return kiln_cli_usage_error(cmd, "--seed '%s' is not a number in 0..2147483647",
                                            val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--json", NULL)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->json = true;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--profile", NULL)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            a->profile = 1;
        } else {
            return kiln_cli_usage_error(cmd, "unknown option '%s'", arg);
        }
    }
    if (!a->model) return kiln_cli_usage_error(cmd, "missing MODEL");
    for (int k = 0; k < a->n_dims; k++)
        for (int p = 0; p < k; p++)
            if (a->dims[p].name_len == a->dims[k].name_len &&
                strncmp(a->dims[p].arg, a->dims[k].arg, a->dims[k].name_len) == 0)
                return kiln_cli_usage_error(cmd, "--dim '%.*s' is given more than once",
                                            (int)a->dims[k].name_len, a->dims[k].arg);
    return -1;
}

/* ------------------------------------------------------------- shapes */

/* The --dim entry for symbol name, or NULL. */
static bench_dim *find_dim(bench_args *a, const char *name)
{
    if (!name) return NULL;
    size_t n = strlen(name);
    for (int k = 0; k < a->n_dims; k++)
        if (a->dims[k].name_len == n && strncmp(a->dims[k].arg, name, n) == 0) return &a->dims[k];
    return NULL;
}

/*
 * The batch dim's name: the first input whose axis 0 is not fixed. Sets
 * *found to whether there is one (its name may still be NULL: unnamed).
 */
static const char *batch_dim_name(const kiln_signature *sig, bool *found)
{
    *found = false;
    for (int j = 0; j < kiln_signature_input_count(sig); j++) {
        const kiln_value_info *v = kiln_signature_input(sig, j);
        if (v->rank >= 1 && v->dims[0] < 0) {
            *found = true;
            return v->dim_names[0] && v->dim_names[0][0] ? v->dim_names[0] : NULL;
        }
    }
    return NULL;
}

/* Fill dims (v->rank entries) with the concrete shape of input v; returns
 * an exit status or -1 to go on. */
static int resolve_shape(const kiln_value_info *v, bench_args *a, const char *batch_name,
                         int64_t *dims)
{
    if (v->rank < 0)
        return kiln_cli_fail("input '%s' has unknown rank; kiln bench cannot make a tensor for it",
                             v->name);
    for (int d = 0; d < v->rank; d++) {
        const char *sym = v->dim_names[d] && v->dim_names[d][0] ? v->dim_names[d] : NULL;
        if (v->dims[d] >= 0) {
            dims[d] = v->dims[d];
        } else if (d == 0 || (sym && batch_name && strcmp(sym, batch_name) == 0)) {
            dims[d] = a->batch;
        } else if (sym) {
            bench_dim *given = find_dim(a, sym);
            if (!given)
                return kiln_cli_fail("input '%s' dim %d is symbolic ('%s'); give its size "
                                     "with --dim %s=SIZE",
                                     v->name, d, sym, sym);
            given->used = true;
            dims[d] = given->size;
        } else {
            return kiln_cli_fail("input '%s' dim %d is unknown and unnamed; kiln bench cannot "
                                 "choose its size",
                                 v->name, d);
        }
    }
    return -1;
}

/* ------------------------------------------------------------- inputs */

/* splitmix64: a small, fast generator that is the same everywhere. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 random bits (exact in float32). */
static double random_unit(uint64_t *state)
{
    return (double)(next_random(state) >> 40) * (1.0 / 16777216.0);
}


/* True if the input name contains "mask" (any case). */
static bool name_is_mask(const char *name)
{
    for (const char *p = name; *p; p++)
        if ((p[0] | 0x20) == 'm' && (p[1] | 0x20) == 'a' && (p[2] | 0x20) == 's' &&
            (p[3] | 0x20) == 'k')
            return true;
    return false;
}

/* The largest value an integer dtype holds (0 for other dtypes). */
static int64_t int_dtype_max(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_I8: return INT8_MAX;
    case KILN_DTYPE_U8: return UINT8_MAX;
    case KILN_DTYPE_I16: return INT16_MAX;
    case KILN_DTYPE_U16: return UINT16_MAX;
    case KILN_DTYPE_I32: case KILN_DTYPE_U32: case KILN_DTYPE_I64: case KILN_DTYPE_U64:
        return INT32_MAX;
    default: return 0;
    }
}

/* Fill t with random values for input `name` by the scheme in the file comment. */
static int fill_random(kiln_tensor *t, const char *name, int int_high, uint64_t *state)
{
    int64_t n = kiln_tensor_count(t);
    bool mask = name_is_mask(name);
    int64_t top = int_dtype_max(t->dtype);
    if (top && !mask && int_high - 1 > top)
        return kiln_cli_fail("input '%s' is %s, which cannot hold values up to --int-high %d",
                             name, kiln_dtype_name(t->dtype), int_high);
    for (int64_t i = 0; i < n; i++) {
        double u = random_unit(state);
        int64_t k = mask ? 1 : (int64_t)(u * int_high); /* integers: [0, int_high) */
        double f = 2.0 * u - 1.0;                          /* floats: [-1, 1) */
        switch (t->dtype) {
        case KILN_DTYPE_F32: ((float *)t->data)[i] = (float)f; break;
        case KILN_DTYPE_F64: ((double *)t->data)[i] = f; break;
        case KILN_DTYPE_F16: /* n / 1024 for n in [-1024, 1023]: exact in float16 */
            ((uint16_t *)t->data)[i] = kiln_f32_to_f16((float)((int)(u * 2048) - 1024) / 1024.0f);
            break;
        case KILN_DTYPE_BF16: ((uint16_t *)t->data)[i] = kiln_f32_to_bf16((float)f); break;
        case KILN_DTYPE_I8: ((int8_t *)t->data)[i] = (int8_t)k; break;
        case KILN_DTYPE_U8: ((uint8_t *)t->data)[i] = (uint8_t)k; break;
        case KILN_DTYPE_I16: ((int16_t *)t->data)[i] = (int16_t)k; break;
        case KILN_DTYPE_U16: ((uint16_t *)t->data)[i] = (uint16_t)k; break;
        case KILN_DTYPE_I32: ((int32_t *)t->data)[i] = (int32_t)k; break;
        case KILN_DTYPE_U32: ((uint32_t *)t->data)[i] = (uint32_t)k; break;
        case KILN_DTYPE_I64: ((int64_t *)t->data)[i] = k; break;
        case KILN_DTYPE_U64: ((uint64_t *)t->data)[i] = (uint64_t)k; break;
        case KILN_DTYPE_BOOL: ((uint8_t *)t->data)[i] = u < 0.5 ? 0 : 1; break;
        default:
            return kiln_cli_fail("input '%s' is %s; kiln bench makes random inputs only for "
                                 "float16/bfloat16/float32/float64, integer and bool tensors",
                                 name, kiln_dtype_name(t->dtype));
        }
    }
    return -1;
}

/* ------------------------------------------------------------- timing */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int compare_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The p-th percentile of sorted[0..n), interpolating linearly between the
 * two nearest ranks (numpy.percentile's default). */
static double percentile(const double *sorted, int n, double p)
{
    double pos = p / 100.0 * (double)(n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    double frac = pos - (double)lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

/* The measurements one bench produces. */
typedef struct bench_result {
    double model_load_ms, session_create_ms, first_ms;
    double median_ms, p90_ms, p99_ms, mean_ms, min_ms, max_ms;
    double throughput_per_s;
    double peak_rss_mb;
    int64_t nonfinite;   /* NaN or infinite float elements in the first run's outputs */
    double reference_share; /* of the timed runs' time, on reference code; -1 = unknown */
} bench_result;

/* Non-finite elements of a float output (0 for other dtypes). */
static int64_t count_nonfinite(const kiln_tensor *t)
{
    int64_t n = kiln_tensor_count(t), bad = 0;
    if (t->dtype == KILN_DTYPE_F32) {
        for (int64_t i = 0; i < n; i++) bad += !isfinite(((const float *)t->data)[i]);
    } else if (t->dtype == KILN_DTYPE_F64) {
        for (int64_t i = 0; i < n; i++) bad += !isfinite(((const double *)t->data)[i]);
    }
    return bad;
}

/*
 * The peak resident set of this process in MiB: VmHWM from /proc/self/status,
 * else getrusage's ru_maxrss. VmHWM comes first because Linux carries
 * ru_maxrss across execve: a bench started by a large parent (a Python
 * harness) would otherwise report the parent's peak at fork time.
 */
static double peak_rss_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        long long kib = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
        fclose(f);
        if (kib >= 0) return (double)kib / 1024.0;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

/* ------------------------------------------------------------- output */

/* "[1,3,224,224]" in text, "[1, 3, 224, 224]" in JSON. */
static void print_dims(const kiln_tensor *t, bool json)
{
    putchar('[');
    for (int d = 0; d < t->rank; d++)
        printf(d ? (json ? ", %lld" : ",%lld") : "%lld", (long long)t->dims[d]);
    putchar(']');
}

/* [{"name": ..., "dtype": ..., "shape": [...]}, ...] */
static void json_tensors(const kiln_named_tensor *ts, int n)
{
    putchar('[');
    for (int i = 0; i < n; i++) {
        printf(i ? ", {\"name\": " : "{\"name\": ");
        kiln_json_write_string(stdout, ts[i].name);
        printf(", \"dtype\": ");
        kiln_json_write_string(stdout, kiln_dtype_name(ts[i].tensor->dtype));
        printf(", \"shape\": ");
        print_dims(ts[i].tensor, true);
        putchar('}');
    }
    putchar(']');
}

static void print_json(const bench_args *a, const kiln_signature *sig, const kiln_named_tensor *in,
                       int n_in, const kiln_named_tensor *out, int n_out, const bench_result *r)
{
    printf("{\"model\": ");
    kiln_json_write_string(stdout, a->model);
    printf(", \"signature\": ");
    kiln_json_write_string(stdout, kiln_signature_name(sig));
    printf(", \"batch\": %d, \"threads\": %d, \"cpus\": %d, \"iterations\": %d, "
           "\"warmup\": %d, \"optimize\": %s, \"seed\": %d,\n \"inputs\": ",
           a->batch, a->so.threads, kiln_cpu_count(), a->iterations, a->warmup,
           a->so.optimize ? "true" : "false", a->seed);
    json_tensors(in, n_in);
    printf(",\n \"outputs\": ");
    json_tensors(out, n_out);
    printf(",\n \"load_ms\": %.3f, \"model_load_ms\": %.3f, \"session_create_ms\": %.3f, "
           "\"first_inference_ms\": %.3f, \"load_to_first_inference_ms\": %.3f,\n",
           r->model_load_ms + r->session_create_ms, r->model_load_ms, r->session_create_ms,
           r->first_ms, r->model_load_ms + r->session_create_ms + r->first_ms);
    printf(" \"median_ms\": %.6f, \"p90_ms\": %.6f, \"p99_ms\": %.6f, \"mean_ms\": %.6f, "
           "\"min_ms\": %.6f, \"max_ms\": %.6f,\n",
           r->median_ms, r->p90_ms, r->p99_ms, r->mean_ms, r->min_ms, r->max_ms);
    printf(" \"throughput_per_s\": %.3f, \"peak_rss_mb\": %.2f, \"nonfinite_outputs\": %lld, "
           "\"reference_share\": ",
           r->throughput_per_s, r->peak_rss_mb, (long long)r->nonfinite);
    if (r->reference_share >= 0) printf("%.6f}\n", r->reference_share);
    else printf("null}\n");
}

static void print_text(const bench_args *a, const kiln_signature *sig,
                       const kiln_named_tensor *in, int n_in, const bench_result *r)
{
    printf("model: ");
    kiln_text_write(stdout, a->model);
    printf(" (signature ");
    kiln_text_write(stdout, kiln_signature_name(sig));
    printf(")\ninputs:");
    for (int i = 0; i < n_in; i++) {
        printf(i ? ", " : " ");
        kiln_text_write(stdout, in[i].name);
        printf(" %s", kiln_dtype_name(in[i].tensor->dtype));
        print_dims(in[i].tensor, false);
    }
    printf("\nbatch %d, threads %d (of %d CPUs), warmup %d, iterations %d%s\n", a->batch,
           a->so.threads, kiln_cpu_count(), a->warmup, a->iterations,
           a->so.reference ? ", reference path" : a->so.optimize ? "" : ", optimizer off");
    printf("load:       %.3f ms (model %.3f ms + session %.3f ms)\n",
           r->model_load_ms + r->session_create_ms, r->model_load_ms, r->session_create_ms);
    printf("first run:  %.3f ms (load to first inference %.3f ms)\n", r->first_ms,
           r->model_load_ms + r->session_create_ms + r->first_ms);
    printf("latency:    median %.4f ms, p90 %.4f ms, p99 %.4f ms (mean %.4f, min %.4f, "
           "max %.4f)\n",
           r->median_ms, r->p90_ms, r->p99_ms, r->mean_ms, r->min_ms, r->max_ms);
    printf("throughput: %.3f examples/s\n", r->throughput_per_s);
    printf("peak RSS:   %.2f MiB\n", r->peak_rss_mb);
    if (r->nonfinite)
        printf("warning:    the outputs hold %lld NaN or infinite values\n",
               (long long)r->nonfinite);
}

/* ------------------------------------------------------------- the command */

/* Every signature input as a random tensor; fills named[0..n). Returns an
 * exit status or -1 to go on. */
static int make_inputs(const kiln_signature *sig, bench_args *a, kiln_named_tensor *named)
{
    bool has_batch = false;
    const char *batch_name = batch_dim_name(sig, &has_batch);
    if (!has_batch && a->batch_given && a->batch != 1)
        return kiln_cli_fail("%s: signature '%s' has no symbolic batch dim (axis 0 of every "
                             "input is fixed), so --batch %d cannot apply",
                             a->model, kiln_signature_name(sig), a->batch);
    if (batch_name && find_dim(a, batch_name))
        return kiln_cli_usage_error("bench", "--dim %s: '%s' is the batch dim; use --batch",
                                    batch_name, batch_name);
    uint64_t state = (uint64_t)a->seed;
    int n = kiln_signature_input_count(sig);
    for (int j = 0; j < n; j++) {
        const kiln_value_info *v = kiln_signature_input(sig, j);
        int64_t dims[KILN_MAX_RANK];
        int rc = resolve_shape(v, a, batch_name, dims);
        if (rc >= 0) return rc;
        kiln_tensor *t = NULL;
        if (v->dtype == KILN_DTYPE_UNDEFINED)
            return kiln_cli_fail("input '%s' has no known dtype", v->name);
        if (kiln_tensor_create(v->dtype, v->rank, dims, &t) != KILN_OK)
            return kiln_cli_fail("input '%s': %s", v->name, kiln_last_error());
        named[j] = (kiln_named_tensor){v->name, t};
        if ((rc = fill_random(t, v->name, a->int_high, &state)) >= 0) return rc;
    }
    for (int k = 0; k < a->n_dims; k++)
        if (!a->dims[k].used)
            return kiln_cli_fail("--dim '%.*s' names no symbolic dim of signature '%s'",
                                 (int)a->dims[k].name_len, a->dims[k].arg,
                                 kiln_signature_name(sig));
    return -1;
}

int kiln_cmd_bench(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv)) {
        fputs(bench_usage, stdout);
        return KILN_CLI_EXIT_OK;
    }
    bench_args a = {.batch = 1, .iterations = BENCH_DEFAULT_ITERATIONS,
                    .warmup = BENCH_DEFAULT_WARMUP, .int_high = BENCH_DEFAULT_INT_HIGH, .seed = 1};
    kiln_session_options_init(&a.so);
    a.dims = calloc((size_t)(argc > 0 ? argc : 1), sizeof *a.dims);
    if (!a.dims) return kiln_cli_fail("out of memory");
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) goto out_free_dims;

    bench_result r = {0};
    double t0 = now_ms();
    kiln_model *m = kiln_cli_load_model(a.model, a.tags);
    r.model_load_ms = now_ms() - t0;
    if (!m) {
        rc = KILN_CLI_EXIT_FAIL;
        goto out_free_dims;
    }
    const kiln_signature *sig = kiln_model_find_signature(m, a.signature);
    if (!sig) {
        if (a.signature)
            rc = kiln_cli_fail("%s has no signature '%s'", a.model, a.signature);
        else
            rc = kiln_cli_fail("%s has no default signature", a.model);
        goto out_free_model;
    }
    kiln_session *session = NULL;
    t0 = now_ms();
    if (kiln_session_create(m, a.signature, &a.so, &session) != KILN_OK) {
        rc = kiln_cli_fail("%s", kiln_last_error());
        goto out_free_model;
    }
    r.session_create_ms = now_ms() - t0;

    int n_in = kiln_signature_input_count(sig);
    kiln_named_tensor *in = calloc((size_t)(n_in > 0 ? n_in : 1), sizeof *in);
    double *lat = malloc((size_t)a.iterations * sizeof *lat);
    if (!in || !lat) {
        rc = kiln_cli_fail("out of memory");
        goto out_free_buffers;
    }
    if ((rc = make_inputs(sig, &a, in)) >= 0) goto out_free_buffers;

    /* The first run, kept until the end for its output shapes. */
    kiln_outputs *first = NULL;
    t0 = now_ms();
    if (kiln_session_run(session, in, n_in, &first) != KILN_OK) {
        rc = kiln_cli_fail("%s", kiln_last_error());
        goto out_free_buffers;
    }
    r.first_ms = now_ms() - t0;

    for (int i = 0; i < a.warmup + a.iterations; i++) {
        kiln_outputs *out = NULL;
        /* the profile covers the timed runs only: the first runs also pay for oneDNN's
         * just-in-time code and the arena's first page faults */
        if ((a.profile || a.json) && i == a.warmup) kiln_plan_profile_enable(1);
        t0 = now_ms();
        kiln_status st = kiln_session_run(session, in, n_in, &out);
        double dt = now_ms() - t0;
        if (st != KILN_OK) {
            rc = kiln_cli_fail("run %d: %s", i + 2, kiln_last_error());
            goto out_free_first;
        }
        kiln_outputs_free(out);
        if (i >= a.warmup) lat[i - a.warmup] = dt;
    }

    double sum = 0;
    for (int i = 0; i < a.iterations; i++) sum += lat[i];
    qsort(lat, (size_t)a.iterations, sizeof *lat, compare_double);
    r.median_ms = percentile(lat, a.iterations, 50);
    r.p90_ms = percentile(lat, a.iterations, 90);
    r.p99_ms = percentile(lat, a.iterations, 99);
    r.mean_ms = sum / a.iterations;
    r.min_ms = lat[0];
    r.max_ms = lat[a.iterations - 1];
    r.throughput_per_s = r.median_ms > 0 ? a.batch * 1000.0 / r.median_ms : 0;
    r.peak_rss_mb = peak_rss_mb();
    r.reference_share = kiln_session_reference_share(session);

    int n_out = kiln_outputs_count(first);
    kiln_named_tensor *outs = calloc((size_t)(n_out > 0 ? n_out : 1), sizeof *outs);
    if (!outs) {
        rc = kiln_cli_fail("out of memory");
        goto out_free_first;
    }
    for (int i = 0; i < n_out; i++) {
        outs[i] = (kiln_named_tensor){kiln_outputs_name(first, i), kiln_outputs_get(first, i)};
        r.nonfinite += count_nonfinite(outs[i].tensor);
    }
    if (a.profile) kiln_session_profile_print(session, stderr);
    if (a.json) print_json(&a, sig, in, n_in, outs, n_out, &r);
    else print_text(&a, sig, in, n_in, &r);
    free(outs);
    rc = KILN_CLI_EXIT_OK;
    if (fflush(stdout) != 0 || ferror(stdout)) rc = kiln_cli_fail("writing to stdout failed");

out_free_first:
    kiln_outputs_free(first);
out_free_buffers:
    for (int j = 0; in && j < n_in; j++) kiln_tensor_free((kiln_tensor *)in[j].tensor);
    free(lat);
    free(in);
    kiln_session_free(session);
out_free_model:
    kiln_model_free(m);
out_free_dims:
    free(a.dims);
    return rc;
}
