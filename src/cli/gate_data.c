/*
 * gate_data.c - the evaluation data of `kiln gate` (gate.h): read for a
 * signature from a folder of <input>.npy files (npy.c) or from a JSON-lines
 * file of TF Serving predict request bodies (decoded by the server's own
 * codec, serve/codec.h, so the gate sees exactly what a REST client would
 * send), checked against the signature, and cut into batches of rows.
 *
 * An .npz archive (npz.c) holds one array per input, named as the files.
 * A file named tf_serving_warmup_requests or *.tfrecord is read as a TF
 * Serving warmup file (serve/warmup.h): its predict records, stacked.
 * A folder's file for input NAME is NAME.npy, or, when NAME holds bytes
 * outside [A-Za-z0-9._-] (e.g. "serving_default_x:0"), the name with each
 * of those bytes replaced by '_' (as `kiln predict` names output files).
 * Every error names the file and the input.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/gate.h"
#include "cli/npy.h"
#include "cli/npz.h"
#include "serve/codec.h"
#include "serve/json.h"
#include "serve/warmup.h"
#include "security/security.h"

#define GATE_JSONL_MAX_BYTES (1u << 30) /* a JSON-lines file read at most */

void kiln_gate_data_free(kiln_gate_data *d)
{
    for (int i = 0; i < d->n; i++) {
        if (d->names) free(d->names[i]);
        if (d->t) kiln_tensor_free(d->t[i]);
    }
    free(d->names);
    free(d->t);
    memset(d, 0, sizeof *d);
}

/* The input's file name in a data folder when NAME has unsafe bytes. */
static void safe_name(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    for (; name[n] && n + 5 < cap; n++) {
        char c = name[n];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        out[n] = ok ? c : '_';
    }
    memcpy(out + n, ".npy", 5);
}

/* Check tensor t (from `what`) against signature input vi. */
static kiln_status check_input(const kiln_tensor *t, const kiln_value_info *vi, const char *what,
                               char *err)
{
    if (vi->dtype != KILN_DTYPE_UNDEFINED && t->dtype != vi->dtype) {
        snprintf(err, KILN_GATE_ERR_LEN, "%.250s: input '%.100s' is %s, the signature wants %s",
                 what, vi->name, kiln_dtype_name(t->dtype), kiln_dtype_name(vi->dtype));
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (t->rank < 1) {
        snprintf(err, KILN_GATE_ERR_LEN,
                 "%.250s: input '%.100s' is a scalar; the first dimension must count samples",
                 what, vi->name);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (vi->rank >= 0 && t->rank != vi->rank) {
        snprintf(err, KILN_GATE_ERR_LEN, "%.250s: input '%.100s' has rank %d, the signature wants %d",
                 what, vi->name, t->rank, vi->rank);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    for (int k = 1; vi->rank >= 0 && k < t->rank; k++) {
        if (vi->dims[k] >= 0 && vi->dims[k] != t->dims[k]) {
            snprintf(err, KILN_GATE_ERR_LEN,
                     "%.250s: input '%.100s' dimension %d is %lld, the signature wants %lld", what,
                     vi->name, k, (long long)t->dims[k], (long long)vi->dims[k]);
            return KILN_ERR_INVALID_ARGUMENT;
        }
    }
    if (t->dims[0] < 1) {
        snprintf(err, KILN_GATE_ERR_LEN, "%.250s: input '%.100s' has no samples", what, vi->name);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

static kiln_status load_npy_folder(const char *dir, const kiln_signature *sig, kiln_gate_data *d,
                                   char *err)
{
    for (int i = 0; i < d->n; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        char path[4096], file[1024] = "";
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s.npy", dir, vi->name);
        if (stat(path, &sb) != 0) {
            safe_name(vi->name, file, sizeof file);
            snprintf(path, sizeof path, "%s/%s", dir, file);
        }
        if (stat(path, &sb) != 0) {
            snprintf(err, KILN_GATE_ERR_LEN, "data folder '%.200s' has no %.120s for input '%.100s'",
                     dir, file, vi->name);
            return KILN_ERR_NOT_FOUND;
        }
        if (kiln_npy_read(path, &d->t[i]) != KILN_OK) {
            snprintf(err, KILN_GATE_ERR_LEN, "input '%.100s': %.380s", vi->name,
                     kiln_npy_last_error());
            return KILN_ERR_INVALID_ARGUMENT;
        }
        kiln_status st = check_input(d->t[i], vi, path, err);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

/* An .npz archive (npz.h): one member per input, named like the folder's files. */
static kiln_status load_npz(const char *path, const kiln_signature *sig, kiln_gate_data *d,
                            char *err)
{
    kiln_npz *z = NULL;
    kiln_status st = kiln_npz_read(path, &z, err);
    if (st != KILN_OK) return st;
    for (int i = 0; i < d->n && st == KILN_OK; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        char file[1024];
        safe_name(vi->name, file, sizeof file);
        file[strlen(file) - 4] = '\0'; /* without ".npy", as members are named */
        int found = -1;
        for (int k = 0; k < z->n && found < 0; k++)
            if (strcmp(z->names[k], vi->name) == 0) found = k;
        for (int k = 0; k < z->n && found < 0; k++)
            if (strcmp(z->names[k], file) == 0) found = k;
        if (found < 0) {
            snprintf(err, KILN_GATE_ERR_LEN, "data '%.250s' has no array '%.100s' for input '%.100s'",
                     path, file, vi->name);
            st = KILN_ERR_NOT_FOUND;
            break;
        }
        d->t[i] = z->tensors[found]; /* moved */
        z->tensors[found] = NULL;
        char what[300];
        snprintf(what, sizeof what, "%.250s[%.40s]", path, z->names[found]);
        st = check_input(d->t[i], vi, what, err);
    }
    kiln_npz_free(z);
    return st;
}

/* Append the rows of src to the growing tensor *acc (created on first use). */
static kiln_status append_rows(kiln_tensor **acc, const kiln_tensor *src)
{
    if (!*acc) {
        int64_t dims[KILN_MAX_RANK];
        memcpy(dims, src->dims, sizeof dims);
        kiln_status st = kiln_tensor_create(src->dtype, src->rank, dims, acc);
        if (st != KILN_OK) return st;
        return kiln_tensor_copy_rows(*acc, 0, src, 0, src->dims[0]);
    }
    kiln_tensor *old = *acc, *grown;
    int64_t dims[KILN_MAX_RANK];
    memcpy(dims, old->dims, sizeof dims);
    dims[0] = old->dims[0] + src->dims[0];
    kiln_status st = kiln_tensor_create(old->dtype, old->rank, dims, &grown);
    if (st != KILN_OK) return st;
    st = kiln_tensor_copy_rows(grown, 0, old, 0, old->dims[0]);
    if (st == KILN_OK) st = kiln_tensor_copy_rows(grown, old->dims[0], src, 0, src->dims[0]);
    if (st != KILN_OK) {
        kiln_tensor_free(grown);
        return st;
    }
    kiln_tensor_free(old);
    *acc = grown;
    return KILN_OK;
}

static kiln_status load_jsonl(const char *path, const kiln_signature *sig, kiln_gate_data *d,
                              char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, KILN_GATE_ERR_LEN, "cannot open data file '%.300s'", path);
        return KILN_ERR_NOT_FOUND;
    }
    kiln_value_info *specs = calloc((size_t)d->n, sizeof *specs);
    kiln_tensor **one = calloc((size_t)d->n, sizeof *one);
    char *line = NULL;
    size_t cap = 0, total = 0;
    ssize_t len;
    int lineno = 0;
    kiln_status st = KILN_OK;
    if (!specs || !one) {
        snprintf(err, KILN_GATE_ERR_LEN, "out of memory");
        st = KILN_ERR_OUT_OF_MEMORY;
        goto out;
    }
    for (int i = 0; i < d->n; i++) specs[i] = *kiln_signature_input(sig, i);
    while (st == KILN_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        total += (size_t)len;
        if (total > GATE_JSONL_MAX_BYTES) {
            snprintf(err, KILN_GATE_ERR_LEN, "%.300s: more than %u bytes", path,
                     GATE_JSONL_MAX_BYTES);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        size_t n = (size_t)len;
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
        if (n == 0) continue; /* blank lines are allowed */
        kiln_json_doc doc;
        kiln_predict_request req;
        char jerr[KILN_JSON_ERR_LEN];
        st = kiln_json_parse(line, n, KILN_JSON_MAX_DEPTH, &doc, jerr);
        if (st == KILN_OK) {
            st = kiln_predict_parse(&doc, &req, jerr);
            if (st == KILN_OK) st = kiln_predict_decode(&doc, &req, specs, d->n, one, jerr);
            kiln_json_doc_free(&doc);
        }
        if (st != KILN_OK) {
            snprintf(err, KILN_GATE_ERR_LEN, "%.250s line %d: %.220s", path, lineno, jerr);
            break;
        }
        for (int i = 0; i < d->n && st == KILN_OK; i++) {
            char what[320];
            snprintf(what, sizeof what, "%.250s line %d", path, lineno);
            st = check_input(one[i], &specs[i], what, err);
            if (st == KILN_OK && d->t[i] &&
                (one[i]->rank != d->t[i]->rank ||
                 memcmp(one[i]->dims + 1, d->t[i]->dims + 1,
                        sizeof(int64_t) * (size_t)(one[i]->rank - 1)) != 0)) {
                snprintf(err, KILN_GATE_ERR_LEN,
                         "%.300s: input '%.100s' has another shape than on the lines before", what,
                         specs[i].name);
                st = KILN_ERR_INVALID_ARGUMENT;
            }
            if (st == KILN_OK && append_rows(&d->t[i], one[i]) != KILN_OK) {
                snprintf(err, KILN_GATE_ERR_LEN, "%.300s: out of memory", what);
                st = KILN_ERR_OUT_OF_MEMORY;
            }
        }
        for (int i = 0; i < d->n; i++) {
            kiln_tensor_free(one[i]);
            one[i] = NULL;
        }
    }
    if (st == KILN_OK && d->n > 0 && !d->t[0]) {
        snprintf(err, KILN_GATE_ERR_LEN, "%.300s: no requests", path);
        st = KILN_ERR_INVALID_ARGUMENT;
    }
out:
    free(line);
    free(specs);
    free(one);
    fclose(f);
    return st;
}

/* A TF Serving warmup file (TFRecord of PredictionLog, warmup.h): its
 * predict records' inputs, stacked. */
static kiln_status load_warmup(const char *path, const kiln_signature *sig, kiln_gate_data *d,
                               char *err)
{
    uint8_t *bytes;
    size_t size;
    char rerr[KILN_SEC_ERR_LEN];
    kiln_status st = kiln_sec_read_file(path, KILN_WARMUP_MAX_BYTES, &bytes, &size, rerr);
    if (st != KILN_OK) {
        snprintf(err, KILN_GATE_ERR_LEN, "data: %.480s", rerr);
        return st;
    }
    kiln_warmup *w = NULL;
    char werr[KILN_WARMUP_ERR_LEN];
    st = kiln_warmup_parse(bytes, size, &w, werr);
    free(bytes);
    if (st != KILN_OK) {
        snprintf(err, KILN_GATE_ERR_LEN, "%.200s: %.300s", path, werr);
        return st;
    }
    for (int r = 0; r < w->n && st == KILN_OK; r++) {
        const kiln_warmup_request *q = &w->req[r];
        if (q->kind == KILN_WARMUP_SKIPPED) continue;
        char what[320];
        snprintf(what, sizeof what, "%.250s record %d", path, r);
        if (q->kind != KILN_WARMUP_PREDICT) {
            snprintf(err, KILN_GATE_ERR_LEN, "%.300s: a classify or regress request; kiln gate "
                     "reads predict requests", what);
            st = KILN_ERR_UNSUPPORTED;
            break;
        }
        for (int i = 0; i < d->n && st == KILN_OK; i++) {
            const kiln_value_info *vi = kiln_signature_input(sig, i);
            const kiln_tensor *t = NULL;
            for (int k = 0; k < q->n_inputs; k++)
                if (strcmp(q->names[k], vi->name) == 0) t = q->tensors[k];
            if (!t) {
                snprintf(err, KILN_GATE_ERR_LEN, "%.300s: no input '%.100s'", what, vi->name);
                st = KILN_ERR_INVALID_ARGUMENT;
                break;
            }
            st = check_input(t, vi, what, err);
            if (st == KILN_OK && d->t[i] &&
                (t->rank != d->t[i]->rank ||
                 memcmp(t->dims + 1, d->t[i]->dims + 1, sizeof(int64_t) * (size_t)(t->rank - 1)))) {
                snprintf(err, KILN_GATE_ERR_LEN,
                         "%.300s: input '%.100s' has another shape than in the records before",
                         what, vi->name);
                st = KILN_ERR_INVALID_ARGUMENT;
            }
            if (st == KILN_OK && append_rows(&d->t[i], t) != KILN_OK) {
                snprintf(err, KILN_GATE_ERR_LEN, "%.300s: out of memory", what);
                st = KILN_ERR_OUT_OF_MEMORY;
            }
        }
    }
    if (st == KILN_OK && d->n > 0 && !d->t[0]) {
        snprintf(err, KILN_GATE_ERR_LEN, "%.300s: no predict requests", path);
        st = KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_warmup_free(w);
    return st;
}

/* True if path names a TF Serving warmup file (by name: the TFRecord has no magic). */
static int is_warmup_file(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    return strcmp(base, "tf_serving_warmup_requests") == 0 ||
           (n > 9 && strcmp(base + n - 9, ".tfrecord") == 0);
}

kiln_status kiln_gate_data_load(const char *path, const kiln_signature *sig, kiln_gate_data *d,
                                char *err)
{
    memset(d, 0, sizeof *d);
    int n = kiln_signature_input_count(sig);
    d->names = calloc((size_t)(n > 0 ? n : 1), sizeof *d->names);
    d->t = calloc((size_t)(n > 0 ? n : 1), sizeof *d->t);
    if (!d->names || !d->t) {
        snprintf(err, KILN_GATE_ERR_LEN, "out of memory");
        kiln_gate_data_free(d);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    d->n = n;
    for (int i = 0; i < n; i++) {
        d->names[i] = strdup(kiln_signature_input(sig, i)->name);
        if (!d->names[i]) {
            snprintf(err, KILN_GATE_ERR_LEN, "out of memory");
            kiln_gate_data_free(d);
            return KILN_ERR_OUT_OF_MEMORY;
        }
    }
    struct stat sb;
    kiln_status st;
    if (stat(path, &sb) != 0) {
        snprintf(err, KILN_GATE_ERR_LEN, "data '%.300s' does not exist", path);
        st = KILN_ERR_NOT_FOUND;
    } else if (S_ISDIR(sb.st_mode)) {
        st = load_npy_folder(path, sig, d, err);
    } else {
        size_t pl = strlen(path);
        if (pl > 4 && strcmp(path + pl - 4, ".npz") == 0) {
            st = load_npz(path, sig, d, err);
        } else if (is_warmup_file(path)) {
            st = load_warmup(path, sig, d, err);
        } else {
            st = load_jsonl(path, sig, d, err);
        }
    }
    for (int i = 0; st == KILN_OK && i < n; i++) {
        if (i == 0) d->samples = d->t[0]->dims[0];
        else if (d->t[i]->dims[0] != d->samples) {
            snprintf(err, KILN_GATE_ERR_LEN,
                     "data '%.250s': input '%.100s' has %lld samples, input '%.100s' %lld", path,
                     d->names[i], (long long)d->t[i]->dims[0], d->names[0],
                     (long long)d->samples);
            st = KILN_ERR_INVALID_ARGUMENT;
        }
    }
    if (st == KILN_OK && n == 0) {
        snprintf(err, KILN_GATE_ERR_LEN, "the signature has no inputs to feed from '%.300s'", path);
        st = KILN_ERR_INVALID_ARGUMENT;
    }
    if (st != KILN_OK) kiln_gate_data_free(d);
    return st;
}

kiln_status kiln_gate_data_check(const kiln_gate_data *d, const char *path, int64_t min_samples,
                                 char *err)
{
    if (d->samples < min_samples) {
        snprintf(err, KILN_GATE_ERR_LEN,
                 "data '%.250s' has %lld samples; at least %lld are needed to measure accuracy",
                 path, (long long)d->samples, (long long)min_samples);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < d->n; i++) {
        const kiln_tensor *t = d->t[i];
        int64_t n = kiln_tensor_count(t), re = t->rank > 0 && t->dims[0] > 0 ? n / t->dims[0] : n;
        for (int64_t k = 0; k < n; k++) {
            double v;
            if (t->dtype == KILN_DTYPE_F32) v = ((const float *)t->data)[k];
            else if (t->dtype == KILN_DTYPE_F64) v = ((const double *)t->data)[k];
            else break;
            if (!isfinite(v)) {
                snprintf(err, KILN_GATE_ERR_LEN,
                         "data '%.250s': input '%.100s' holds %s at sample %lld; accuracy cannot "
                         "be measured on it",
                         path, d->names[i], isnan(v) ? "NaN" : "an infinity",
                         (long long)(re ? k / re : 0));
                return KILN_ERR_INVALID_ARGUMENT;
            }
        }
    }
    return KILN_OK;
}
