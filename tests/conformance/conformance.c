/*
 * conformance.c - runs the ONNX backend node tests against Kiln.
 *
 * Each case folder holds model.onnx and test_data_set_N/{input,output}_K.pb.
 * Every case runs in a child process (a crash or hang is a FAIL, not the
 * end of the run), outputs are compared like the ONNX backend runner does
 * (|a - b| <= atol + rtol * |b|, rtol 1e-3, atol 1e-7, NaN equals NaN), and
 * each case is reported as PASS, FAIL or UNSUPPORTED with the reason.
 *
 *   kiln_conformance --data DIR [--filter SUBSTR] [--expect FILE]
 *                    [--write-passes FILE] [--verbose] [--quiet]
 *
 * With --expect, the run fails if any case listed in FILE does not pass.
 * A case passes only if at least one stored output was compared: a case
 * without test data sets or outputs is a FAIL, never a silent pass.
 *
 * When DIR does not exist the run is skipped: it says so and exits with 77,
 * the code ctest's SKIP_RETURN_CODE reports as a skip. With
 * KILN_REQUIRE_TESTDATA=1 in the environment (CI sets it) missing data is a
 * failure (exit 1) instead.
 *
 * Set KILN_FAST=0 to run every case on the reference kernels only; the test
 * suite runs both ways against the same expected-pass list.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/fileio.h"
#include "core/tensor.h"
#include "import/model.h"
#include "kiln/kiln.h"

enum { R_PASS = 0, R_FAIL = 1, R_UNSUPPORTED = 2 };

static int verbose;

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* List entries of dir starting with prefix, sorted (numeric suffix order). */
static int list_dir(const char *dir, const char *prefix, char ***out)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0, cap = 16;
    char **v = malloc(sizeof(char *) * (size_t)cap);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        if (n == cap) v = realloc(v, sizeof(char *) * (size_t)(cap *= 2));
        v[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(v, (size_t)n, sizeof *v, cmp_names);
    *out = v;
    return n;
}

static void free_list(char **v, int n)
{
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* kind: the value's declared type; a sequence or optional is a SequenceProto or
 * OptionalProto, anything else a TensorProto. */
static kiln_status read_pb(const char *path, kiln_dtype kind, kiln_tensor **t)
{
    struct kiln_file_map m;
    kiln_status st = kiln_file_map(path, &m);
    if (st != KILN_OK) return st;
    st = kiln_onnx_read_value(m.data, m.size, kind, t);
    kiln_file_unmap(&m);
    return st;
}

/* Compare got with want; message in msg on mismatch. */
static int compare(const char *name, const kiln_tensor *got, const kiln_tensor *want, char *msg,
                   size_t n)
{
    char a[128], b[128];
    if (kiln_dtype_is_container(want->dtype) && got->dtype == want->dtype) {
        /* sequences and optionals: the same number of items, each equal */
        if (got->dims[0] != want->dims[0]) {
            snprintf(msg, n, "output '%s': %s of %lld items, expected %lld", name,
                     kiln_dtype_name(want->dtype), (long long)got->dims[0],
                     (long long)want->dims[0]);
            return 0;
        }
        for (int64_t i = 0; i < want->dims[0]; i++) {
            char item[160];
            snprintf(item, sizeof item, "%s[%lld]", name, (long long)i);
            if (!compare(item, kiln_tensor_item(got, i), kiln_tensor_item(want, i), msg, n))
                return 0;
        }
        return 1;
    }
    if (got->dtype != want->dtype) {
        snprintf(msg, n, "output '%s': dtype %s, expected %s", name, kiln_dtype_name(got->dtype),
                 kiln_dtype_name(want->dtype));
        return 0;
    }
    if (got->rank != want->rank || memcmp(got->dims, want->dims, sizeof(int64_t) * (size_t)got->rank)) {
        snprintf(msg, n, "output '%s': shape %s, expected %s", name,
                 kiln_shape_str(got->rank, got->dims, a, sizeof a),
                 kiln_shape_str(want->rank, want->dims, b, sizeof b));
        return 0;
    }
    int64_t cnt = kiln_tensor_count(want);
    int bad = 0;
    for (int64_t i = 0; i < cnt; i++) {
        int ok;
        if (want->dtype == KILN_DTYPE_STRING) {
            const kiln_string *x = &((const kiln_string *)got->data)[i];
            const kiln_string *y = &((const kiln_string *)want->data)[i];
            ok = x->len == y->len && (x->len == 0 || memcmp(x->data, y->data, x->len) == 0);
            if (!ok && !bad)
                snprintf(msg, n, "output '%s'[%lld]: '%.*s', expected '%.*s'", name, (long long)i,
                         (int)(x->len > 40 ? 40 : x->len), x->data ? x->data : "",
                         (int)(y->len > 40 ? 40 : y->len), y->data ? y->data : "");
        } else if (kiln_dtype_is_float(want->dtype)) {
            double x = kiln_get_f64(got->dtype, got->data, i);
            double y = kiln_get_f64(want->dtype, want->data, i);
            if (isnan(y)) ok = isnan(x);
            else if (isinf(y)) ok = x == y;
            else ok = fabs(x - y) <= 1e-7 + 1e-3 * fabs(y);
            if (!ok && !bad)
                snprintf(msg, n, "output '%s'[%lld]: %.9g, expected %.9g", name, (long long)i, x, y);
        } else {
            int64_t x = kiln_get_i64(got->dtype, got->data, i);
            int64_t y = kiln_get_i64(want->dtype, want->data, i);
            ok = x == y;
            if (!ok && !bad)
                snprintf(msg, n, "output '%s'[%lld]: %lld, expected %lld", name, (long long)i,
                         (long long)x, (long long)y);
        }
        if (!ok) {
            if (verbose && bad < 10) fprintf(stderr, "  mismatch at %lld\n", (long long)i);
            bad++;
        }
    }
    if (bad) {
        size_t k = strlen(msg);
        snprintf(msg + k, n - k, " (%d of %lld elements differ)", bad, (long long)cnt);
        return 0;
    }
    return 1;
}

/* Run one case; returns R_* and writes the reason into msg. */
static int run_case(const char *dir, char *msg, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    kiln_model *m;
    kiln_status st = kiln_model_load(path, NULL, &m);
    if (st != KILN_OK) {
        snprintf(msg, n, "load: %s", kiln_last_error());
        return st == KILN_ERR_UNSUPPORTED ? R_UNSUPPORTED : R_FAIL;
    }
    kiln_session *s;
    if (kiln_session_create(m, NULL, NULL, &s) != KILN_OK) {
        snprintf(msg, n, "session: %s", kiln_last_error());
        kiln_model_free(m);
        return R_FAIL;
    }
    const kiln_signature *sig = kiln_session_signature(s);
    char **sets;
    int nsets = list_dir(dir, "test_data_set_", &sets);
    int result = R_PASS, compared = 0;
    for (int si = 0; si < nsets && result == R_PASS; si++) {
        char sdir[4096];
        snprintf(sdir, sizeof sdir, "%s/%s", dir, sets[si]);
        char **ins, **outs;
        int nin = list_dir(sdir, "input_", &ins);
        int nout = list_dir(sdir, "output_", &outs);
        kiln_named_tensor *named = calloc((size_t)nin + 1, sizeof *named);
        kiln_tensor **tin = calloc((size_t)nin + 1, sizeof *tin);
        /* numeric order: input_10 after input_9 */
        for (int i = 0; i < nin && result == R_PASS; i++) {
            char p[8192];
            snprintf(p, sizeof p, "%s/input_%d.pb", sdir, i);
            kiln_dtype kind = i < kiln_signature_input_count(sig)
                                  ? kiln_signature_input(sig, i)->dtype
                                  : KILN_DTYPE_UNDEFINED;
            if (read_pb(p, kind, &tin[i]) != KILN_OK) {
                snprintf(msg, n, "input %d: %s", i, kiln_last_error());
                result = R_UNSUPPORTED;
                break;
            }
            if (i >= kiln_signature_input_count(sig)) {
                snprintf(msg, n, "test has %d inputs, model %d", nin, kiln_signature_input_count(sig));
                result = R_FAIL;
                break;
            }
            named[i].name = kiln_signature_input(sig, i)->name;
            named[i].tensor = tin[i];
        }
        kiln_outputs *o = NULL;
        if (result == R_PASS) {
            st = kiln_session_run(s, named, nin, &o);
            if (st != KILN_OK) {
                snprintf(msg, n, "run: %s", kiln_last_error());
                result = st == KILN_ERR_UNSUPPORTED ? R_UNSUPPORTED : R_FAIL;
            }
        }
        for (int i = 0; i < nout && result == R_PASS; i++) {
            char p[8192];
            snprintf(p, sizeof p, "%s/output_%d.pb", sdir, i);
            kiln_tensor *want;
            kiln_dtype kind = i < kiln_signature_output_count(sig)
                                  ? kiln_signature_output(sig, i)->dtype
                                  : KILN_DTYPE_UNDEFINED;
            if (read_pb(p, kind, &want) != KILN_OK) {
                snprintf(msg, n, "output %d: %s", i, kiln_last_error());
                result = R_UNSUPPORTED;
                break;
            }
            if (i >= kiln_outputs_count(o)) {
                snprintf(msg, n, "test has %d outputs, model produced %d", nout, kiln_outputs_count(o));
                result = R_FAIL;
            } else if (!compare(kiln_outputs_name(o, i), kiln_outputs_get(o, i), want, msg, n)) {
                result = R_FAIL;
            } else {
                compared++;
            }
            kiln_tensor_free(want);
        }
        kiln_outputs_free(o);
        for (int i = 0; i < nin; i++) kiln_tensor_free(tin[i]);
        free(tin);
        free(named);
        free_list(ins, nin);
        free_list(outs, nout);
    }
    if (nsets > 0) free_list(sets, nsets);
    if (result == R_PASS && compared == 0) {
        snprintf(msg, n, "no outputs to compare (%d test data sets)", nsets > 0 ? nsets : 0);
        result = R_FAIL;
    }
    kiln_session_free(s);
    kiln_model_free(m);
    return result;
}

/* Run a case in a child process with a time limit. */
static int run_isolated(const char *dir, char *msg, size_t n)
{
    int fds[2];
    if (pipe(fds) != 0) return run_case(dir, msg, n);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        alarm(120);
        char m[1024] = "";
        int r = run_case(dir, m, sizeof m);
        dprintf(fds[1], "%d %s", r, m);
        close(fds[1]);
        exit(0); /* not _exit: LeakSanitizer checks the case at exit */
    }
    close(fds[1]);
    char buf[1100];
    ssize_t got = 0, k;
    while ((k = read(fds[0], buf + got, sizeof buf - 1 - (size_t)got)) > 0) got += k;
    close(fds[0]);
    buf[got > 0 ? got : 0] = '\0';
    int status;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
        snprintf(msg, n, "crashed with signal %d (%s)", WTERMSIG(status),
                 WTERMSIG(status) == SIGALRM ? "timeout" : strsignal(WTERMSIG(status)));
        return R_FAIL;
    }
    if (got <= 0 || WEXITSTATUS(status) != 0) {
        snprintf(msg, n, "child exited with status %d (a sanitizer report on stderr?)",
                 WEXITSTATUS(status));
        return R_FAIL;
    }
    int r = atoi(buf);
    const char *sp = strchr(buf, ' ');
    snprintf(msg, n, "%s", sp ? sp + 1 : "");
    return r;
}

int main(int argc, char **argv)
{
    const char *data = NULL, *filter = NULL, *expect = NULL, *write_passes = NULL;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) data = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--expect") && i + 1 < argc) expect = argv[++i];
        else if (!strcmp(argv[i], "--write-passes") && i + 1 < argc) write_passes = argv[++i];
        else if (!strcmp(argv[i], "--verbose")) verbose = 1;
        else if (!strcmp(argv[i], "--quiet")) quiet = 1;
        else {
            fprintf(stderr, "usage: %s --data DIR [--filter S] [--expect FILE] "
                    "[--write-passes FILE] [--verbose] [--quiet]\n", argv[0]);
            return 2;
        }
    }
    if (!data) data = "../shared/testdata/onnx/node";
    char **cases;
    int ncases = list_dir(data, "test_", &cases);
    if (ncases < 0) {
        const char *req = getenv("KILN_REQUIRE_TESTDATA");
        if (req && strcmp(req, "1") == 0) {
            printf("FAIL: ONNX conformance data not found at '%s', and KILN_REQUIRE_TESTDATA=1 "
                   "requires it\n", data);
            return 1;
        }
        printf("SKIP: ONNX conformance data not found at '%s' (../shared/testdata is not part of "
               "the repository)\n", data);
        return 77;
    }
    char *passed = calloc((size_t)ncases + 1, 1);
    int np = 0, nf = 0, nu = 0;
    for (int i = 0; i < ncases; i++) {
        if (filter && !strstr(cases[i], filter)) continue;
        char dir[4096], msg[1024] = "";
        snprintf(dir, sizeof dir, "%s/%s", data, cases[i]);
        int r = run_isolated(dir, msg, sizeof msg);
        if (r == R_PASS) {
            np++;
            passed[i] = 1;
            if (!quiet) printf("PASS %s\n", cases[i]);
        } else if (r == R_UNSUPPORTED) {
            nu++;
            if (!quiet) printf("UNSUPPORTED %s: %s\n", cases[i], msg);
        } else {
            nf++;
            printf("FAIL %s: %s\n", cases[i], msg);
        }
        fflush(stdout);
    }
    printf("conformance: %d passed, %d failed, %d unsupported, of %d cases\n", np, nf, nu,
           np + nf + nu);
    int rc = 0;
    if (write_passes) {
        FILE *f = fopen(write_passes, "w");
        if (f) {
            for (int i = 0; i < ncases; i++)
                if (passed[i]) fprintf(f, "%s\n", cases[i]);
            fclose(f);
        }
    }
    if (expect) {
        FILE *f = fopen(expect, "r");
        if (!f) {
            fprintf(stderr, "cannot read %s\n", expect);
            return 2;
        }
        char line[512];
        int missing = 0, listed = 0;
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\r\n")] = '\0';
            if (!line[0] || line[0] == '#') continue;
            if (filter && !strstr(line, filter)) continue;
            listed++;
            int found = 0;
            for (int i = 0; i < ncases; i++)
                if (!strcmp(cases[i], line)) {
                    found = 1;
                    if (!passed[i]) {
                        printf("REGRESSION %s: expected to pass\n", line);
                        missing++;
                    }
                }
            if (!found) {
                printf("REGRESSION %s: case not found\n", line);
                missing++;
            }
        }
        fclose(f);
        printf("expected passes: %d listed, %d regressed\n", listed, missing);
        if (missing) rc = 1;
    }
    free(passed);
    free_list(cases, ncases);
    return rc;
}
