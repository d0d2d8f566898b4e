/*
 * gate_data.c - the evaluation data of `kiln gate` and `kiln compile`
 * (gate.h): read for a signature, checked against it, and cut into batches
 * of rows.
 *
 * A folder (of <input>.npy files and/or .npz archives) or an .npz archive
 * is read by the library (kiln_dataset_read, src/api/dataset.c), the reader
 * `kiln serve --allow_compression` uses for a version's calibration folder.
 * A file named tf_serving_warmup_requests or *.tfrecord is read as a TF
 * Serving warmup file (serve/warmup.h): its predict records, stacked. Any
 * other file is a JSON-lines file of TF Serving predict request bodies
 * (decoded by the server's own codec, serve/codec.h, so the gate sees
 * exactly what a REST client would send). Every error names the file and
 * the input.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/gate.h"
#include "serve/codec.h"
#include "serve/json.h"
#include "serve/warmup.h"
#include "security/security.h"

#define GATE_JSONL_MAX_BYTES (1u << 30) /* a JSON-lines file read at most */

void kiln_gate_data_free(kiln_gate_data *d)
{
    kiln_dataset_free(d);
}

static kiln_status check_input(const kiln_tensor *t, const kiln_value_info *vi, const char *what,
                               char *err)
{
    return kiln_dataset_check_input(t, vi, what, err);
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
    struct stat sb;
    size_t pl = strlen(path);
    if (stat(path, &sb) == 0 && (S_ISDIR(sb.st_mode) || (pl > 4 && !strcmp(path + pl - 4, ".npz"))))
        return kiln_dataset_read(path, sig, 0, d, err);
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
    kiln_status st;
    if (stat(path, &sb) != 0) {
        snprintf(err, KILN_GATE_ERR_LEN, "data '%.300s' does not exist", path);
        st = KILN_ERR_NOT_FOUND;
    } else if (is_warmup_file(path)) {
        st = load_warmup(path, sig, d, err);
    } else {
        st = load_jsonl(path, sig, d, err);
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
    return kiln_dataset_check(d, path, min_samples, err);
}
