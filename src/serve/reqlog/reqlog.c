/*
 * reqlog.c - the request log (see reqlog.h): a predict-path observer that
 * samples successful runs and encodes them (PredictionLog in TFRecord
 * framing, or a JSON line), a bounded queue, and one writer thread that
 * owns the files: naming, size rotation, and the disk bound over every log
 * file, oldest deleted first.
 *
 * Threads: the observer runs on request threads and touches only the
 * queue (under mu) and atomic counters; everything about files belongs to
 * the writer thread, except the scan of earlier files in create, before
 * the thread starts.
 */
#include "serve/reqlog/reqlog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "prediction_log.pb-c.h"
#include "serve/grpc/grpc_tensor.h"
#include "serve/json.h"
#include "serve/manager.h"
#include "serve/tfrecord.h"
#include "serve/results.h"

enum { DROP_QUEUE_FULL, DROP_WRITE_ERROR, DROP_TOO_LARGE, DROP_ENCODE_ERROR, DROP_N };
static const char *const drop_names[DROP_N] = {"queue_full", "write_error", "too_large",
                                               "encode_error"};

/* A model's logging_config. Replaced (never changed) when a reloaded model
 * config changes it; a replaced one stays allocated until the log is freed,
 * since queued records and request threads may still point to it. */
typedef struct log_settings {
    char *prefix;                    /* filename_prefix */
    double rate;                     /* sampling_rate */
    int jsonl;
    struct log_settings *retired;    /* the list of replaced ones */
} log_settings;

/* One model's log. */
typedef struct log_target {
    char *model;
    _Atomic(log_settings *) set;     /* NULL: not logged (any more) */
    const log_settings *file_set;    /* writer thread: the settings of the open file */
    atomic_uint_fast64_t records;    /* written */
    atomic_uint_fast64_t dropped[DROP_N];
    /* writer thread only */
    int fd;                          /* the current file, or -1 */
    char *path;                      /* its path (also in files[]) */
    uint64_t size;                   /* its bytes */
    int seq;                         /* next file number */
    int failing;                     /* the last write or open failed (logged once) */
    time_t retry_at;                 /* while failing to open: not before this */
} log_target;

/* A log file on disk, oldest first in kiln_reqlog.files. */
typedef struct log_file {
    char *path;
    uint64_t size;
    time_t mtime;
} log_file;

/* A queued record: framed bytes, ready to append. */
typedef struct log_item {
    int target;
    const log_settings *set;         /* what it was sampled and encoded with */
    size_t len;
    uint8_t *data;
} log_item;

#define REQLOG_MAX_TARGETS 256        /* models logged, over every reload */

struct kiln_reqlog {
    kiln_reqlog_options opt;
    atomic_int n_targets;            /* published after the target is set up */
    log_target *t;                   /* REQLOG_MAX_TARGETS */
    pthread_mutex_t cfg_mu;          /* kiln_reqlog_apply */
    log_settings *retired;           /* replaced settings (cfg_mu) */
    pthread_mutex_t mu;              /* the queue and stop */
    pthread_cond_t cv;
    log_item *q;                     /* ring of opt.queue_records */
    int q_head, q_len;
    uint64_t q_bytes;
    int stop;
    pthread_t thread;
    int thread_started;
    /* writer thread (and create, before it starts) only */
    log_file *files;
    int n_files, cap_files;
    atomic_uint_fast64_t disk_bytes; /* sum of files[].size */
};

void kiln_reqlog_options_default(kiln_reqlog_options *o)
{
    o->max_file_bytes = (uint64_t)64 << 20;
    o->max_disk_bytes = (uint64_t)1 << 30;
    o->queue_records = 1024;
    o->queue_bytes = (uint64_t)64 << 20;
}

int kiln_reqlog_parse_bytes(const char *v, uint64_t *out)
{
    if (!v || *v < '0' || *v > '9') return 0;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno) return 0;
    int shift = 0;
    switch (*end) {
    case '\0': break;
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: return 0;
    }
    if (shift && *end == 'i') end++; /* "64Mi", "64MiB", "64MB" */
    if (shift && *end == 'B') end++;
    if (*end || (shift && n > (UINT64_MAX >> shift))) return 0;
    *out = (uint64_t)n << shift;
    return 1;
}

/* ------------------------------------------------------------ sampling */

/* A uniform draw in [0, 1) from a per-thread splitmix64 stream. */
static double uniform01(void)
{
    static _Thread_local uint64_t state;
    if (!state) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        state = ((uint64_t)ts.tv_sec * 0x9E3779B97F4A7C15u) ^ (uint64_t)ts.tv_nsec ^
                ((uint64_t)(uintptr_t)&state << 17);
        if (!state) state = 1;
    }
    uint64_t z = (state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* ------------------------------------------------------------ encoding */

/* Allocations that live until one record is packed. */
typedef struct scratch {
    void **p;
    int n, cap;
} scratch;

static void *scratch_own(scratch *s, void *p)
{
    if (!p) return NULL;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        void **a = realloc(s->p, (size_t)cap * sizeof *a);
        if (!a) {
            free(p);
            return NULL;
        }
        s->p = a;
        s->cap = cap;
    }
    s->p[s->n++] = p;
    return p;
}

static void scratch_free(scratch *s)
{
    for (int i = 0; i < s->n; i++) free(s->p[i]);
    free(s->p);
}

static const char *signature_name(const kiln_observation *o)
{
    const kiln_signature *sig = kiln_model_signature(o->sv->model, o->si);
    const char *n = sig ? kiln_signature_name(sig) : NULL;
    return n ? n : "";
}

static const char *input_name(const kiln_observation *o, int i)
{
    const kiln_signature *sig = kiln_model_signature(o->sv->model, o->si);
    const kiln_value_info *v = sig ? kiln_signature_input(sig, i) : NULL;
    return v && v->name ? v->name : "";
}

/* The examples of a classify / regress run: its one string input [n]. */
static ProtobufCBinaryData *examples_of(const kiln_observation *o, scratch *s, size_t *n)
{
    const kiln_tensor *t = o->n_inputs == 1 ? o->inputs[0] : NULL;
    if (!t || t->dtype != KILN_DTYPE_STRING || t->rank != 1) return NULL;
    *n = (size_t)t->dims[0];
    ProtobufCBinaryData *ex = scratch_own(s, calloc(*n ? *n : 1, sizeof *ex));
    if (!ex) return NULL;
    const kiln_string *str = t->data;
    for (size_t i = 0; i < *n; i++) {
        ex[i].data = (uint8_t *)(str[i].data ? str[i].data : "");
        ex[i].len = str[i].len;
    }
    return ex;
}

/* A classify run's ClassificationResult (NULL when its outputs are not a
 * classifier's: the request is still logged). */
static KilnTfs__ClassificationResult *classify_result(const kiln_observation *o, int64_t n,
                                                      scratch *s)
{
    char err[KILN_JSON_ERR_LEN];
    kiln_class_results cr;
    if (kiln_results_classify(o->out, n, &cr, err) != KILN_OK) return NULL;
    KilnTfs__ClassificationResult *r = scratch_own(s, malloc(sizeof *r));
    KilnTfs__Classifications *cs = scratch_own(s, calloc((size_t)(n ? n : 1), sizeof *cs));
    KilnTfs__Classifications **csp = scratch_own(s, calloc((size_t)(n ? n : 1), sizeof *csp));
    size_t nk = (size_t)(n * cr.k);
    KilnTfs__Class *c = scratch_own(s, calloc(nk ? nk : 1, sizeof *c));
    KilnTfs__Class **cp = scratch_own(s, calloc(nk ? nk : 1, sizeof *cp));
    if (!r || !cs || !csp || !c || !cp) return NULL;
    kiln_tfs__classification_result__init(r);
    const kiln_string *labels = cr.classes ? cr.classes->data : NULL;
    const float *scores = cr.scores ? cr.scores->data : NULL;
    for (size_t i = 0; i < nk; i++) {
        kiln_tfs__class__init(&c[i]);
        if (labels) {
            char *l = scratch_own(s, malloc(labels[i].len + 1));
            if (!l) return NULL;
            if (labels[i].len) memcpy(l, labels[i].data, labels[i].len);
            l[labels[i].len] = '\0';
            c[i].label = l;
        }
        if (scores) {
            c[i].has_score = 1;
            c[i].score = scores[i];
        }
        cp[i] = &c[i];
    }
    for (int64_t i = 0; i < n; i++) {
        kiln_tfs__classifications__init(&cs[i]);
        cs[i].n_classes = (size_t)cr.k;
        cs[i].classes = cp + i * cr.k;
        csp[i] = &cs[i];
    }
    r->n_classifications = (size_t)n;
    r->classifications = csp;
    return r;
}

/* A regress run's RegressionResult, or NULL. */
static KilnTfs__RegressionResult *regress_result(const kiln_observation *o, int64_t n, scratch *s)
{
    char err[KILN_JSON_ERR_LEN];
    const float *v;
    if (kiln_results_regress(o->out, n, &v, err) != KILN_OK) return NULL;
    KilnTfs__RegressionResult *r = scratch_own(s, malloc(sizeof *r));
    KilnTfs__Regression *g = scratch_own(s, calloc((size_t)(n ? n : 1), sizeof *g));
    KilnTfs__Regression **gp = scratch_own(s, calloc((size_t)(n ? n : 1), sizeof *gp));
    if (!r || !g || !gp) return NULL;
    kiln_tfs__regression_result__init(r);
    for (int64_t i = 0; i < n; i++) {
        kiln_tfs__regression__init(&g[i]);
        g[i].has_value = 1;
        g[i].value = v[i];
        gp[i] = &g[i];
    }
    r->n_regressions = (size_t)n;
    r->regressions = gp;
    return r;
}

/* The observation as one framed PredictionLog (malloc'd), or NULL. */
static uint8_t *encode_tfrecord(const log_settings *t, const kiln_observation *o, size_t *len)
{
    uint8_t *buf = NULL;
    scratch s = {0};
    kiln_grpc_tensor_set ins, outs;
    kiln_grpc_tensor_set_init(&ins);
    kiln_grpc_tensor_set_init(&outs);

    KilnTfs__Int64Value ver = KILN_TFS__INT64_VALUE__INIT;
    ver.has_value = 1;
    ver.value = o->sv->version;
    KilnTfs__ModelSpec spec = KILN_TFS__MODEL_SPEC__INIT;
    spec.name = (char *)o->model;
    spec.version = &ver;
    spec.signature_name = (char *)signature_name(o);
    KilnTfs__SamplingConfig sc = KILN_TFS__SAMPLING_CONFIG__INIT;
    sc.has_sampling_rate = 1;
    sc.sampling_rate = t->rate;
    KilnTfs__LogMetadata md = KILN_TFS__LOG_METADATA__INIT;
    md.model_spec = &spec;
    md.sampling_config = &sc;
    KilnTfs__PredictionLog log = KILN_TFS__PREDICTION_LOG__INIT;
    log.log_metadata = &md;

    KilnTfs__PredictRequest preq = KILN_TFS__PREDICT_REQUEST__INIT;
    KilnTfs__PredictResponse pres = KILN_TFS__PREDICT_RESPONSE__INIT;
    KilnTfs__PredictLog plog = KILN_TFS__PREDICT_LOG__INIT;
    KilnTfs__ExampleList el = KILN_TFS__EXAMPLE_LIST__INIT;
    KilnTfs__Input input = KILN_TFS__INPUT__INIT;
    KilnTfs__ClassificationRequest creq = KILN_TFS__CLASSIFICATION_REQUEST__INIT;
    KilnTfs__ClassificationResponse cres = KILN_TFS__CLASSIFICATION_RESPONSE__INIT;
    KilnTfs__ClassifyLog clog = KILN_TFS__CLASSIFY_LOG__INIT;
    KilnTfs__RegressionRequest rreq = KILN_TFS__REGRESSION_REQUEST__INIT;
    KilnTfs__RegressionResponse rres = KILN_TFS__REGRESSION_RESPONSE__INIT;
    KilnTfs__RegressLog rlog = KILN_TFS__REGRESS_LOG__INIT;

    int classify = strcmp(o->api, "classify") == 0, regress = strcmp(o->api, "regress") == 0;
    if (classify || regress) {
        size_t n = 0;
        el.examples = examples_of(o, &s, &n);
        if (!el.examples) goto out;
        el.n_examples = n;
        input.kind_case = KILN_TFS__INPUT__KIND_EXAMPLE_LIST;
        input.example_list = &el;
        if (classify) {
            creq.model_spec = &spec;
            creq.input = &input;
            cres.model_spec = &spec;
            cres.result = classify_result(o, (int64_t)n, &s);
            clog.request = &creq;
            clog.response = cres.result ? &cres : NULL;
            log.log_type_case = KILN_TFS__PREDICTION_LOG__LOG_TYPE_CLASSIFY_LOG;
            log.classify_log = &clog;
        } else {
            rreq.model_spec = &spec;
            rreq.input = &input;
            rres.model_spec = &spec;
            rres.result = regress_result(o, (int64_t)n, &s);
            rlog.request = &rreq;
            rlog.response = rres.result ? &rres : NULL;
            log.log_type_case = KILN_TFS__PREDICTION_LOG__LOG_TYPE_REGRESS_LOG;
            log.regress_log = &rlog;
        }
    } else {
        int no = o->out->n;
        KilnTfs__PredictRequest__InputsEntry *ie =
            scratch_own(&s, calloc((size_t)o->n_inputs + 1, sizeof *ie));
        KilnTfs__PredictRequest__InputsEntry **iep =
            scratch_own(&s, calloc((size_t)o->n_inputs + 1, sizeof *iep));
        KilnTfs__PredictResponse__OutputsEntry *oe =
            scratch_own(&s, calloc((size_t)no + 1, sizeof *oe));
        KilnTfs__PredictResponse__OutputsEntry **oep =
            scratch_own(&s, calloc((size_t)no + 1, sizeof *oep));
        if (!ie || !iep || !oe || !oep) goto out;
        for (int i = 0; i < o->n_inputs; i++) {
            if (!kiln_grpc_tensor_set_add(&ins, input_name(o, i), o->inputs[i], 1)) goto out;
            kiln_tfs__predict_request__inputs_entry__init(&ie[i]);
            ie[i].key = ins.entries[i]->key;
            ie[i].value = ins.entries[i]->value;
            iep[i] = &ie[i];
        }
        for (int i = 0; i < no; i++) {
            if (!kiln_grpc_tensor_set_add(&outs, o->out->names[i], o->out->t[i], 1)) goto out;
            kiln_tfs__predict_response__outputs_entry__init(&oe[i]);
            oe[i].key = outs.entries[i]->key;
            oe[i].value = outs.entries[i]->value;
            oep[i] = &oe[i];
        }
        preq.model_spec = &spec;
        preq.n_inputs = (size_t)o->n_inputs;
        preq.inputs = iep;
        pres.model_spec = &spec;
        pres.n_outputs = (size_t)no;
        pres.outputs = oep;
        plog.request = &preq;
        plog.response = &pres;
        log.log_type_case = KILN_TFS__PREDICTION_LOG__LOG_TYPE_PREDICT_LOG;
        log.predict_log = &plog;
    }
    size_t n = kiln_tfs__prediction_log__get_packed_size(&log);
    buf = malloc(n + KILN_TFRECORD_OVERHEAD);
    if (!buf) goto out;
    kiln_tfs__prediction_log__pack(&log, buf + 12);
    kiln_tfrecord_frame(buf, n);
    *len = n + KILN_TFRECORD_OVERHEAD;
out:
    kiln_grpc_tensor_set_free(&ins);
    kiln_grpc_tensor_set_free(&outs);
    scratch_free(&s);
    return buf;
}

/* Whether every string of t is printable ASCII (JSON text as is), else base64. */
static int strings_need_b64(const kiln_tensor *t)
{
    if (t->dtype != KILN_DTYPE_STRING) return 0;
    const kiln_string *s = t->data;
    int64_t n = kiln_tensor_count(t);
    for (int64_t i = 0; i < n; i++)
        for (size_t k = 0; k < s[i].len; k++) {
            unsigned char c = (unsigned char)s[i].data[k];
            if (c < 0x20 || c >= 0x7f) return 1;
        }
    return 0;
}

static void json_tensor_map(kiln_sbuf *b, int n, const char *(*name)(const kiln_observation *, int),
                            const char *const *names, const kiln_tensor *const *t,
                            const kiln_observation *o)
{
    kiln_sbuf_puts(b, "{");
    for (int i = 0; i < n; i++) {
        const char *nm = name ? name(o, i) : names[i];
        if (i) kiln_sbuf_puts(b, ",");
        kiln_sbuf_json_string(b, nm, strlen(nm));
        kiln_sbuf_puts(b, ":");
        kiln_json_write_tensor(b, t[i], -1, strings_need_b64(t[i]), 0);
    }
    kiln_sbuf_puts(b, "}");
}

/* The observation as one JSON line (malloc'd, with its newline), or NULL. */
static uint8_t *encode_jsonl(const log_settings *t, const kiln_observation *o, size_t *len)
{
    kiln_sbuf b = {0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    const char *sig = signature_name(o);
    kiln_sbuf_printf(&b, "{\"time\":\"%s.%06ldZ\",\"model_name\":", when, ts.tv_nsec / 1000);
    kiln_sbuf_json_string(&b, o->model, strlen(o->model));
    kiln_sbuf_printf(&b, ",\"version\":%" PRId64 ",\"signature_name\":", o->sv->version);
    kiln_sbuf_json_string(&b, sig, strlen(sig));
    kiln_sbuf_printf(&b, ",\"api\":\"%s\",\"entrypoint\":\"%s\",\"latency_us\":%.1f,"
                     "\"sampling_rate\":%.17g,\"request\":{\"signature_name\":",
                     o->api, o->entrypoint, o->latency_us, t->rate);
    kiln_sbuf_json_string(&b, sig, strlen(sig));
    kiln_sbuf_puts(&b, ",\"inputs\":");
    json_tensor_map(&b, o->n_inputs, input_name, NULL, (const kiln_tensor *const *)o->inputs, o);
    kiln_sbuf_puts(&b, "},\"response\":{\"outputs\":");
    json_tensor_map(&b, o->out->n, NULL, o->out->names, (const kiln_tensor *const *)o->out->t, o);
    kiln_sbuf_puts(&b, "}}\n");
    if (b.oom) {
        kiln_sbuf_free(&b);
        return NULL;
    }
    *len = b.len;
    return (uint8_t *)b.p;
}

/* ------------------------------------------------------------ observer */

static void count_drop(log_target *t, int reason)
{
    atomic_fetch_add(&t->dropped[reason], 1);
}

static void reqlog_after(void *ctx, const kiln_observation *o)
{
    kiln_reqlog *rl = ctx;
    if (!o->out || !o->sv) return; /* failed runs are not logged */
    int ti = -1, n = atomic_load_explicit(&rl->n_targets, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (strcmp(rl->t[i].model, o->model) == 0) {
            ti = i;
            break;
        }
    if (ti < 0) return;
    log_target *t = &rl->t[ti];
    const log_settings *set = atomic_load_explicit(&t->set, memory_order_acquire);
    if (!set || set->rate <= 0.0) return;
    if (set->rate < 1.0 && uniform01() >= set->rate) return;
    pthread_mutex_lock(&rl->mu);
    int full = rl->q_len == rl->opt.queue_records || rl->q_bytes >= rl->opt.queue_bytes;
    pthread_mutex_unlock(&rl->mu);
    if (full) {
        count_drop(t, DROP_QUEUE_FULL);
        return;
    }
    size_t len = 0;
    uint8_t *data = set->jsonl ? encode_jsonl(set, o, &len) : encode_tfrecord(set, o, &len);
    if (!data) {
        count_drop(t, DROP_ENCODE_ERROR);
        return;
    }
    pthread_mutex_lock(&rl->mu);
    if (rl->q_len == rl->opt.queue_records || rl->q_bytes + len > rl->opt.queue_bytes ||
        rl->stop) {
        pthread_mutex_unlock(&rl->mu);
        free(data);
        count_drop(t, DROP_QUEUE_FULL);
        return;
    }
    log_item *it = &rl->q[(rl->q_head + rl->q_len) % rl->opt.queue_records];
    it->target = ti;
    it->set = set;
    it->len = len;
    it->data = data;
    rl->q_len++;
    rl->q_bytes += len;
    pthread_cond_signal(&rl->cv);
    pthread_mutex_unlock(&rl->mu);
}

static void put_label(kiln_sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') kiln_sbuf_printf(b, "\\%c", *s);
        else if (*s == '\n') kiln_sbuf_puts(b, "\\n");
        else kiln_sbuf_put(b, s, 1);
    }
}

static void reqlog_metrics(void *ctx, kiln_sbuf *b)
{
    kiln_reqlog *rl = ctx;
    int n = atomic_load_explicit(&rl->n_targets, memory_order_acquire);
    kiln_sbuf_puts(b, "# HELP kiln_request_log_records_total Sampled requests written to the "
                      "request log.\n# TYPE kiln_request_log_records_total counter\n");
    for (int i = 0; i < n; i++) {
        kiln_sbuf_puts(b, "kiln_request_log_records_total{model_name=\"");
        put_label(b, rl->t[i].model);
        kiln_sbuf_printf(b, "\"} %llu\n", (unsigned long long)atomic_load(&rl->t[i].records));
    }
    kiln_sbuf_puts(b, "# HELP kiln_request_log_dropped_total Sampled requests not written to the "
                      "request log, by reason.\n# TYPE kiln_request_log_dropped_total counter\n");
    for (int i = 0; i < n; i++)
        for (int r = 0; r < DROP_N; r++) {
            kiln_sbuf_puts(b, "kiln_request_log_dropped_total{model_name=\"");
            put_label(b, rl->t[i].model);
            kiln_sbuf_printf(b, "\",reason=\"%s\"} %llu\n", drop_names[r],
                             (unsigned long long)atomic_load(&rl->t[i].dropped[r]));
        }
    kiln_sbuf_printf(b, "# HELP kiln_request_log_disk_bytes Bytes in request log files.\n"
                        "# TYPE kiln_request_log_disk_bytes gauge\n"
                        "kiln_request_log_disk_bytes %llu\n",
                     (unsigned long long)atomic_load(&rl->disk_bytes));
}

void kiln_reqlog_observer(kiln_reqlog *rl, kiln_observer *obs)
{
    memset(obs, 0, sizeof *obs);
    obs->name = "reqlog";
    obs->ctx = rl;
    obs->after = reqlog_after;
    obs->write_metrics = reqlog_metrics;
}

/* ------------------------------------------------------------ files */

static void scan_existing(kiln_reqlog *rl, const char *prefix);
static int file_order(const void *a, const void *b);

/* Track a file (the path is taken over); 0 when out of memory. */
static int files_add(kiln_reqlog *rl, char *path, uint64_t size, time_t mtime)
{
    if (rl->n_files == rl->cap_files) {
        int cap = rl->cap_files ? rl->cap_files * 2 : 32;
        log_file *a = realloc(rl->files, (size_t)cap * sizeof *a);
        if (!a) return 0;
        rl->files = a;
        rl->cap_files = cap;
    }
    rl->files[rl->n_files++] = (log_file){path, size, mtime};
    atomic_fetch_add(&rl->disk_bytes, size);
    return 1;
}

static void close_current(log_target *t)
{
    if (t->fd >= 0) close(t->fd);
    t->fd = -1;
    t->path = NULL;
    t->size = 0;
}

/* Delete the oldest log files until `need` more bytes fit within the bound. */
static void make_room(kiln_reqlog *rl, uint64_t need)
{
    while (rl->n_files > 0 && atomic_load(&rl->disk_bytes) + need > rl->opt.max_disk_bytes) {
        log_file f = rl->files[0];
        for (int i = 0, n = atomic_load(&rl->n_targets); i < n; i++)
            if (rl->t[i].path == f.path) close_current(&rl->t[i]);
        if (unlink(f.path) != 0 && errno != ENOENT)
            fprintf(stderr, "kiln serve: request log: cannot delete %s: %s\n", f.path,
                    strerror(errno));
        atomic_fetch_sub(&rl->disk_bytes, f.size);
        free(f.path);
        memmove(rl->files, rl->files + 1, (size_t)(rl->n_files - 1) * sizeof *rl->files);
        rl->n_files--;
    }
}

/* A write or open failed: say so once until it works again. */
static void note_failure(log_target *t, const char *what, const char *path, int e)
{
    if (!t->failing)
        fprintf(stderr, "kiln serve: request log of model '%s': cannot %s %s: %s; sampled "
                "requests are dropped (kiln_request_log_dropped_total{reason=\"write_error\"}) "
                "until it can\n", t->model, what, path, strerror(e));
    t->failing = 1;
}

/* Open the target's next file; 0 on failure (noted). */
static int open_next(kiln_reqlog *rl, log_target *t)
{
    time_t now = time(NULL);
    if (t->failing && now < t->retry_at) return 0;
    struct tm tm;
    gmtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    const log_settings *set = t->file_set;
    size_t cap = strlen(set->prefix) + 64;
    char *path = malloc(cap);
    if (!path) return 0;
    int fd = -1;
    for (int tries = 0; tries < 1000; tries++) {
        snprintf(path, cap, "%s.%s.%06d.%s", set->prefix, stamp, t->seq++ % 1000000,
                 set->jsonl ? "jsonl" : "tfrecord");
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST) break;
    }
    if (fd < 0) {
        note_failure(t, "create", path, errno);
        t->retry_at = now + 1;
        free(path);
        return 0;
    }
    if (!files_add(rl, path, 0, now)) {
        close(fd);
        unlink(path);
        free(path);
        return 0;
    }
    t->fd = fd;
    t->path = path;
    t->size = 0;
    return 1;
}

/* Append one record to its target's log (writer thread). */
static void write_item(kiln_reqlog *rl, const log_item *it)
{
    log_target *t = &rl->t[it->target];
    if (it->len > rl->opt.max_disk_bytes) {
        count_drop(t, DROP_TOO_LARGE);
        return;
    }
    if (it->set != t->file_set) { /* a reloaded logging_config: a new file from here on */
        int moved = !t->file_set || strcmp(t->file_set->prefix, it->set->prefix) != 0;
        close_current(t);
        t->file_set = it->set;
        t->failing = 0;
        if (moved) { /* count the new folder's earlier files toward the bound */
            scan_existing(rl, it->set->prefix);
            if (rl->n_files > 1) qsort(rl->files, (size_t)rl->n_files, sizeof *rl->files, file_order);
        }
    }
    if (t->fd >= 0 && t->size > 0 && t->size + it->len > rl->opt.max_file_bytes) close_current(t);
    make_room(rl, it->len);
    if (t->fd < 0 && !open_next(rl, t)) {
        count_drop(t, DROP_WRITE_ERROR);
        return;
    }
    size_t done = 0;
    while (done < it->len) {
        ssize_t w = write(t->fd, it->data + done, it->len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            /* no half record stays behind: the file ends at a record boundary */
            if (done && ftruncate(t->fd, (off_t)t->size) != 0) close_current(t);
            note_failure(t, "write to", t->path ? t->path : t->file_set->prefix, e);
            count_drop(t, DROP_WRITE_ERROR);
            return;
        }
        done += (size_t)w;
    }
    if (t->failing) {
        fprintf(stderr, "kiln serve: request log of model '%s': writing again (%s)\n", t->model,
                t->path);
        t->failing = 0;
    }
    t->size += it->len;
    for (int i = rl->n_files - 1; i >= 0; i--)
        if (rl->files[i].path == t->path) {
            rl->files[i].size += it->len;
            break;
        }
    atomic_fetch_add(&rl->disk_bytes, it->len);
    atomic_fetch_add(&t->records, 1);
}

static void *writer_main(void *arg)
{
    kiln_reqlog *rl = arg;
    pthread_mutex_lock(&rl->mu);
    for (;;) {
        while (rl->q_len == 0 && !rl->stop) pthread_cond_wait(&rl->cv, &rl->mu);
        if (rl->q_len == 0) break; /* stopping, queue drained */
        log_item it = rl->q[rl->q_head];
        rl->q_head = (rl->q_head + 1) % rl->opt.queue_records;
        rl->q_len--;
        rl->q_bytes -= it.len;
        pthread_mutex_unlock(&rl->mu);
        write_item(rl, &it);
        free(it.data);
        pthread_mutex_lock(&rl->mu);
    }
    pthread_mutex_unlock(&rl->mu);
    return NULL;
}

/* Whether name is base + ".YYYYMMDD-HHMMSS.N+.tfrecord|jsonl" (a file this log writes). */
static int is_log_name(const char *name, const char *base)
{
    size_t bl = strlen(base);
    if (strncmp(name, base, bl) != 0 || name[bl] != '.') return 0;
    const char *p = name + bl + 1;
    for (int i = 0; i < 15; i++, p++)
        if (i == 8 ? *p != '-' : (*p < '0' || *p > '9')) return 0;
    if (*p++ != '.') return 0;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') p++;
    return strcmp(p, ".tfrecord") == 0 || strcmp(p, ".jsonl") == 0;
}

/* Track the log files earlier runs left under prefix. */
static void scan_existing(kiln_reqlog *rl, const char *prefix)
{
    const char *slash = strrchr(prefix, '/');
    char dir[4096];
    const char *base = slash ? slash + 1 : prefix;
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - prefix), prefix);
    else snprintf(dir, sizeof dir, ".");
    if (!dir[0]) snprintf(dir, sizeof dir, "/");
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_log_name(e->d_name, base)) continue;
        size_t cap = strlen(dir) + strlen(e->d_name) + 2;
        char *path = malloc(cap);
        if (!path) break;
        snprintf(path, cap, "%s/%s", dir, e->d_name);
        struct stat sb;
        int dup = 0;
        for (int i = 0; i < rl->n_files && !dup; i++) dup = strcmp(rl->files[i].path, path) == 0;
        if (dup || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) ||
            !files_add(rl, path, (uint64_t)sb.st_size, sb.st_mtime))
            free(path);
    }
    closedir(d);
}

static int file_order(const void *a, const void *b)
{
    const log_file *x = a, *y = b;
    if (x->mtime != y->mtime) return x->mtime < y->mtime ? -1 : 1;
    return strcmp(x->path, y->path);
}

static void say_settings(const char *model, const log_settings *set, const char *how)
{
    if (set)
        fprintf(stderr, "kiln serve: request log of model '%s'%s: sampling_rate %g, %s files %s.*\n",
                model, how, set->rate, set->jsonl ? "JSON-lines" : "PredictionLog TFRecord",
                set->prefix);
    else
        fprintf(stderr, "kiln serve: request log of model '%s'%s: off\n", model, how);
}

/* New settings from a model's config; NULL when it has no logging. */
static log_settings *settings_of(const kiln_model_config *m, int *oom)
{
    if (!m->log_prefix) return NULL;
    log_settings *set = calloc(1, sizeof *set);
    if (set) set->prefix = strdup(m->log_prefix);
    if (!set || !set->prefix) {
        free(set);
        *oom = 1;
        return NULL;
    }
    set->rate = m->log_rate;
    set->jsonl = m->log_jsonl;
    return set;
}

static int same_settings(const log_settings *a, const log_settings *b)
{
    if (!a || !b) return a == b;
    return a->rate == b->rate && a->jsonl == b->jsonl && strcmp(a->prefix, b->prefix) == 0;
}

/* Apply c's logging_configs (cfg_mu held); `how` is said in the log lines
 * of changed models (NULL: say nothing). */
static kiln_status apply_locked(kiln_reqlog *rl, const kiln_server_config *c, const char *how)
{
    int oom = 0, n = atomic_load(&rl->n_targets);
    for (int i = 0; i < n; i++) { /* models no longer configured, or without logging */
        int listed = 0;
        for (int k = 0; k < c->n_models && !listed; k++)
            listed = strcmp(c->models[k].name, rl->t[i].model) == 0 && c->models[k].log_prefix;
        log_settings *old = atomic_load(&rl->t[i].set);
        if (listed || !old) continue;
        atomic_store_explicit(&rl->t[i].set, NULL, memory_order_release);
        old->retired = rl->retired;
        rl->retired = old;
        if (how) say_settings(rl->t[i].model, NULL, how);
    }
    for (int k = 0; k < c->n_models; k++) {
        const kiln_model_config *m = &c->models[k];
        if (!m->log_prefix) continue;
        int ti = -1;
        for (int i = 0; i < n && ti < 0; i++)
            if (strcmp(rl->t[i].model, m->name) == 0) ti = i;
        log_settings *old = ti >= 0 ? atomic_load(&rl->t[ti].set) : NULL;
        log_settings want = {m->log_prefix, m->log_rate, m->log_jsonl, NULL};
        if (ti >= 0 && same_settings(old, &want)) continue;
        if (ti < 0 && n == REQLOG_MAX_TARGETS) {
            fprintf(stderr, "kiln serve: request log: %d models are logged already; model '%s' "
                            "is not\n", REQLOG_MAX_TARGETS, m->name);
            continue;
        }
        log_settings *set = settings_of(m, &oom);
        if (!set) continue;
        if (ti < 0) { /* a new target, published once set up */
            log_target *t = &rl->t[n];
            t->fd = -1;
            t->model = strdup(m->name);
            if (!t->model) {
                free(set->prefix);
                free(set);
                oom = 1;
                continue;
            }
            atomic_store(&t->set, set);
            atomic_store_explicit(&rl->n_targets, ++n, memory_order_release);
        } else {
            atomic_store_explicit(&rl->t[ti].set, set, memory_order_release);
            if (old) {
                old->retired = rl->retired;
                rl->retired = old;
            }
        }
        if (how) say_settings(m->name, set, how);
    }
    return oom ? KILN_ERR_OUT_OF_MEMORY : KILN_OK;
}

kiln_status kiln_reqlog_apply(kiln_reqlog *rl, const kiln_server_config *c)
{
    if (!rl || !c) return KILN_OK;
    pthread_mutex_lock(&rl->cfg_mu);
    kiln_status st = apply_locked(rl, c, " (reloaded)");
    pthread_mutex_unlock(&rl->cfg_mu);
    return st;
}

kiln_status kiln_reqlog_create(const kiln_reqlog_options *o, const kiln_server_config *c,
                               kiln_reqlog **out, char *err)
{
    *out = NULL;
    if (!c) return KILN_OK; /* --model_name: no model config, no logging_config */
    if (o->max_file_bytes < 1 || o->max_disk_bytes < o->max_file_bytes) {
        snprintf(err, KILN_REQLOG_ERR_LEN, "--request_log_max_disk_bytes (%llu) must be at least "
                 "--request_log_max_file_bytes (%llu), which must be at least 1",
                 (unsigned long long)o->max_disk_bytes, (unsigned long long)o->max_file_bytes);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (o->queue_records < 1) {
        snprintf(err, KILN_REQLOG_ERR_LEN, "--request_log_queue_size must be at least 1, got %d",
                 o->queue_records);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_reqlog *rl = calloc(1, sizeof *rl);
    if (!rl) goto err_oom;
    rl->opt = *o;
    pthread_mutex_init(&rl->mu, NULL);
    pthread_mutex_init(&rl->cfg_mu, NULL);
    pthread_cond_init(&rl->cv, NULL);
    rl->q = calloc((size_t)o->queue_records, sizeof *rl->q);
    rl->t = calloc(REQLOG_MAX_TARGETS, sizeof *rl->t);
    if (!rl->q || !rl->t) goto err_free;
    if (apply_locked(rl, c, NULL) != KILN_OK) goto err_free;
    int n = atomic_load(&rl->n_targets);
    for (int i = 0; i < n; i++) scan_existing(rl, atomic_load(&rl->t[i].set)->prefix);
    if (rl->n_files > 1) qsort(rl->files, (size_t)rl->n_files, sizeof *rl->files, file_order);
    make_room(rl, 0); /* a smaller bound than last time */
    if (pthread_create(&rl->thread, NULL, writer_main, rl) != 0) {
        snprintf(err, KILN_REQLOG_ERR_LEN, "request log: cannot start the writer thread");
        kiln_reqlog_free(rl);
        return KILN_ERR_RUNTIME;
    }
    rl->thread_started = 1;
    for (int i = 0; i < n; i++) say_settings(rl->t[i].model, atomic_load(&rl->t[i].set), "");
    *out = rl;
    return KILN_OK;
err_free:
    kiln_reqlog_free(rl);
err_oom:
    snprintf(err, KILN_REQLOG_ERR_LEN, "request log: out of memory");
    return KILN_ERR_OUT_OF_MEMORY;
}

void kiln_reqlog_free(kiln_reqlog *rl)
{
    if (!rl) return;
    if (rl->thread_started) {
        pthread_mutex_lock(&rl->mu);
        rl->stop = 1;
        pthread_cond_signal(&rl->cv);
        pthread_mutex_unlock(&rl->mu);
        pthread_join(rl->thread, NULL);
    }
    for (int i = 0; i < rl->q_len; i++) free(rl->q[(rl->q_head + i) % rl->opt.queue_records].data);
    for (int i = 0, n = atomic_load(&rl->n_targets); i < n; i++) {
        close_current(&rl->t[i]);
        free(rl->t[i].model);
        log_settings *set = atomic_load(&rl->t[i].set);
        if (set) {
            set->retired = rl->retired;
            rl->retired = set;
        }
    }
    while (rl->retired) {
        log_settings *next = rl->retired->retired;
        free(rl->retired->prefix);
        free(rl->retired);
        rl->retired = next;
    }
    for (int i = 0; i < rl->n_files; i++) free(rl->files[i].path);
    free(rl->files);
    free(rl->t);
    free(rl->q);
    pthread_mutex_destroy(&rl->mu);
    pthread_mutex_destroy(&rl->cfg_mu);
    pthread_cond_destroy(&rl->cv);
    free(rl);
}
