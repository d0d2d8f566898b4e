/*
 * warmup.c - reading TF Serving warmup files (see warmup.h): TFRecord
 * framing with CRC-32C checks (tfrecord.c, shared with the request log),
 * then PredictionLog records decoded with protobuf-c (after kiln_pb_check
 * has walked the bytes) into replayable requests. Tensors come from TensorProto through the SavedModel importer's
 * converter (kiln_tf_tensor_from_proto), so the warmup file follows the same
 * rules as tensors in a SavedModel (dtype table, tensor_content or typed
 * values, the last value repeating).
 */
#include "serve/warmup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/kiln_util.h"
#include "prediction_log.pb-c.h"
#include "serve/tfrecord.h"

void kiln_warmup_free(kiln_warmup *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        kiln_warmup_request *r = &w->req[i];
        for (int k = 0; k < r->n_inputs; k++) {
            if (r->names) free(r->names[k]);
            if (r->tensors) kiln_tensor_free(r->tensors[k]);
        }
        free(r->names);
        free(r->tensors);
        free(r->signature);
    }
    free(w->req);
    free(w);
}

static const char *model_spec_signature(const KilnTfs__ModelSpec *ms)
{
    return ms && ms->signature_name ? ms->signature_name : "";
}

/* PredictRequest -> named tensors. */
static kiln_status fill_predict(const KilnTfs__PredictRequest *pr, kiln_warmup_request *r, int rec,
                                char *err)
{
    if (!pr) {
        snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: predict_log has no request", rec);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    r->signature = strdup(model_spec_signature(pr->model_spec));
    size_t n = pr->n_inputs;
    r->names = calloc(n + 1, sizeof *r->names);
    r->tensors = calloc(n + 1, sizeof *r->tensors);
    if (!r->signature || !r->names || !r->tensors) goto err_oom;
    for (size_t i = 0; i < n; i++) {
        const KilnTfs__PredictRequest__InputsEntry *e = pr->inputs[i];
        const char *key = e->key ? e->key : "";
        if (!e->value) {
            snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: input '%.100s' has no TensorProto", rec,
                     key);
            return KILN_ERR_INVALID_ARGUMENT;
        }
        for (size_t k = 0; k < i; k++)
            if (strcmp(r->names[k], key) == 0) {
                snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: input '%.100s' appears twice", rec,
                         key);
                return KILN_ERR_INVALID_ARGUMENT;
            }
        r->names[i] = strdup(key);
        if (!r->names[i]) goto err_oom;
        r->n_inputs = (int)i + 1;
        kiln_status st = kiln_tf_tensor_from_proto(e->value, key, &r->tensors[i]);
        if (st != KILN_OK) {
            snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: %s", rec, kiln_last_error());
            return KILN_ERR_INVALID_ARGUMENT;
        }
    }
    return KILN_OK;
err_oom:
    snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: out of memory", rec);
    return KILN_ERR_OUT_OF_MEMORY;
}

kiln_status kiln_warmup_examples(const KilnTfs__Input *in, kiln_tensor **out)
{
    const ProtobufCBinaryData *ex = NULL, *ctx = NULL;
    size_t n = 0;
    *out = NULL;
    if (in && in->kind_case == KILN_TFS__INPUT__KIND_EXAMPLE_LIST) {
        ex = in->example_list->examples;
        n = in->example_list->n_examples;
    } else if (in && in->kind_case == KILN_TFS__INPUT__KIND_EXAMPLE_LIST_WITH_CONTEXT) {
        ex = in->example_list_with_context->examples;
        n = in->example_list_with_context->n_examples;
        if (in->example_list_with_context->has_context) ctx = &in->example_list_with_context->context;
    }
    if (n == 0) return KILN_ERR_INVALID_ARGUMENT; /* TF Serving: "Input is empty" */
    int64_t dims[1] = {(int64_t)n};
    kiln_tensor *t;
    if (kiln_tensor_create(KILN_DTYPE_STRING, 1, dims, &t) != KILN_OK) return KILN_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) {
        size_t cl = ctx ? ctx->len : 0;
        char *buf = ex[i].len > SIZE_MAX - cl - 1 ? NULL : malloc(cl + ex[i].len + 1);
        if (!buf) goto err_oom;
        if (cl) memcpy(buf, ctx->data, cl);
        if (ex[i].len) memcpy(buf + cl, ex[i].data, ex[i].len);
        kiln_status st = kiln_tensor_set_string(t, i, buf, cl + ex[i].len);
        free(buf);
        if (st != KILN_OK) goto err_oom;
    }
    *out = t;
    return KILN_OK;
err_oom:
    kiln_tensor_free(t);
    return KILN_ERR_OUT_OF_MEMORY;
}

/* ClassificationRequest / RegressionRequest input -> string [n] of examples. */
static kiln_status fill_examples(const KilnTfs__ModelSpec *ms, const KilnTfs__Input *in,
                                 kiln_warmup_request *r, int rec, char *err)
{
    r->signature = strdup(model_spec_signature(ms));
    r->tensors = calloc(1, sizeof *r->tensors);
    if (!r->signature || !r->tensors) goto err_oom;
    kiln_status st = kiln_warmup_examples(in, &r->tensors[0]);
    if (st == KILN_ERR_INVALID_ARGUMENT) {
        /* TF Serving: "Input is empty" */
        snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: the request's input holds no examples", rec);
        return st;
    }
    if (st != KILN_OK) goto err_oom;
    r->n_inputs = 1;
    return KILN_OK;
err_oom:
    snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: out of memory", rec);
    return KILN_ERR_OUT_OF_MEMORY;
}

/* One PredictionLog's bytes -> r. */
static kiln_status parse_record(const uint8_t *p, size_t n, kiln_warmup_request *r, int rec,
                                char *err)
{
    if (kiln_pb_check(&kiln_tfs__prediction_log__descriptor, p, n, 64, "PredictionLog") !=
        KILN_OK) {
        snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: %s", rec, kiln_last_error());
        return KILN_ERR_INVALID_ARGUMENT;
    }
    KilnTfs__PredictionLog *log = kiln_tfs__prediction_log__unpack(NULL, n, p);
    if (!log) {
        snprintf(err, KILN_WARMUP_ERR_LEN, "record %d: not a valid PredictionLog", rec);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_status st = KILN_OK;
    switch (log->log_type_case) {
    case KILN_TFS__PREDICTION_LOG__LOG_TYPE_PREDICT_LOG:
        r->kind = KILN_WARMUP_PREDICT;
        st = fill_predict(log->predict_log->request, r, rec, err);
        break;
    case KILN_TFS__PREDICTION_LOG__LOG_TYPE_CLASSIFY_LOG:
    case KILN_TFS__PREDICTION_LOG__LOG_TYPE_REGRESS_LOG: {
        int classify = log->log_type_case == KILN_TFS__PREDICTION_LOG__LOG_TYPE_CLASSIFY_LOG;
        r->kind = classify ? KILN_WARMUP_CLASSIFY : KILN_WARMUP_REGRESS;
        const KilnTfs__ModelSpec *ms = NULL;
        const KilnTfs__Input *in = NULL;
        if (classify && log->classify_log->request) {
            ms = log->classify_log->request->model_spec;
            in = log->classify_log->request->input;
        } else if (!classify && log->regress_log->request) {
            ms = log->regress_log->request->model_spec;
            in = log->regress_log->request->input;
        }
        st = fill_examples(ms, in, r, rec, err);
        break;
    }
    case KILN_TFS__PREDICTION_LOG__LOG_TYPE_MULTI_INFERENCE_LOG:
        r->kind = KILN_WARMUP_SKIPPED;
        break;
    default:
        /* TF Serving: "Unsupported log_type for warmup" */
        snprintf(err, KILN_WARMUP_ERR_LEN,
                 "record %d: unsupported log_type for warmup (field %d); expected predict_log, "
                 "classify_log, regress_log or multi_inference_log",
                 rec, (int)log->log_type_case);
        st = KILN_ERR_INVALID_ARGUMENT;
        break;
    }
    kiln_tfs__prediction_log__free_unpacked(log, NULL);
    return st;
}

kiln_status kiln_warmup_parse(const uint8_t *data, size_t len, kiln_warmup **out, char *err)
{
    *out = NULL;
    kiln_warmup *w = calloc(1, sizeof *w);
    if (!w) goto err_oom;
    size_t at = 0;
    int cap = 0;
    for (;;) {
        int rec = w->n; /* 0-based, as TF's reader counts */
        const uint8_t *body;
        size_t n;
        char ferr[KILN_TFRECORD_ERR_LEN];
        kiln_tfrecord_next_result fr = kiln_tfrecord_next(data, len, &at, rec, &body, &n, ferr);
        if (fr == KILN_TFRECORD_END) break;
        if (fr != KILN_TFRECORD_RECORD) {
            snprintf(err, KILN_WARMUP_ERR_LEN, "%s", ferr);
            goto err_bad;
        }
        if (w->n == KILN_WARMUP_MAX_RECORDS) {
            snprintf(err, KILN_WARMUP_ERR_LEN,
                     "more than %d warmup records; TF Serving allows at most %d",
                     KILN_WARMUP_MAX_RECORDS, KILN_WARMUP_MAX_RECORDS);
            goto err_bad;
        }
        if (w->n == cap) {
            int nc = cap ? cap * 2 : 8;
            kiln_warmup_request *nr = realloc(w->req, (size_t)nc * sizeof *nr);
            if (!nr) goto err_oom;
            w->req = nr;
            cap = nc;
        }
        kiln_warmup_request *r = &w->req[w->n++];
        memset(r, 0, sizeof *r);
        kiln_status st = parse_record(body, n, r, rec, err);
        if (st != KILN_OK) {
            kiln_warmup_free(w);
            return st;
        }
    }
    *out = w;
    return KILN_OK;
err_bad:
    kiln_warmup_free(w);
    return KILN_ERR_INVALID_ARGUMENT;
err_oom:
    kiln_warmup_free(w);
    snprintf(err, KILN_WARMUP_ERR_LEN, "out of memory reading the warmup file");
    return KILN_ERR_OUT_OF_MEMORY;
}

kiln_status kiln_warmup_read(const char *version_dir, kiln_warmup **out, char *err)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", version_dir, KILN_WARMUP_FILE);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) return KILN_OK;
        snprintf(err, KILN_WARMUP_ERR_LEN, "%s: %s", KILN_WARMUP_FILE, strerror(errno));
        return KILN_ERR_IO;
    }
    struct stat sb;
    kiln_status st = KILN_ERR_IO;
    uint8_t *buf = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, KILN_WARMUP_ERR_LEN, "%s: not a regular file", KILN_WARMUP_FILE);
        goto out;
    }
    if ((uint64_t)sb.st_size > KILN_WARMUP_MAX_BYTES) {
        snprintf(err, KILN_WARMUP_ERR_LEN, "%s: %lld bytes, more than the %zu Kiln reads",
                 KILN_WARMUP_FILE, (long long)sb.st_size, KILN_WARMUP_MAX_BYTES);
        goto out;
    }
    size_t size = (size_t)sb.st_size, got = 0;
    buf = malloc(size ? size : 1);
    if (!buf) {
        snprintf(err, KILN_WARMUP_ERR_LEN, "%s: out of memory", KILN_WARMUP_FILE);
        st = KILN_ERR_OUT_OF_MEMORY;
        goto out;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* shrank while reading: parse what is there */
        got += (size_t)r;
    }
    char perr[KILN_WARMUP_ERR_LEN];
    st = kiln_warmup_parse(buf, got, out, perr);
    if (st != KILN_OK) snprintf(err, KILN_WARMUP_ERR_LEN, "%s: %.450s", KILN_WARMUP_FILE, perr);
out:
    free(buf);
    close(fd);
    return st;
}
