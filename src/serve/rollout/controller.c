/*
 * controller.c - `kiln rollout-controller` (controller.h): a minimal
 * Prometheus query client (HTTP/1.0 over a TCP socket, the JSON answer read
 * with serve/json.c), a protobuf text-format writer for the rollout file,
 * and the round that evaluates each canary with gate.c and writes the
 * fleet's decision into the file.
 */
#include "serve/rollout/controller.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "serve/json.h"
#include "serve/rollout/gate.h"
#include "serve/rollout/rollout.h"

#define PROM_MAX_BYTES ((size_t)16 << 20)
#define PROM_MAX_BUCKETS 64

/* ------------------------------------------------------------ text format */

static void indent_to(kiln_sbuf *b, int n)
{
    for (int i = 0; i < n; i++) kiln_sbuf_puts(b, "  ");
}

static void write_scalar(const ProtobufCFieldDescriptor *f, const void *p, kiln_sbuf *b)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        kiln_sbuf_printf(b, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        kiln_sbuf_printf(b, "%" PRId64, *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        kiln_sbuf_printf(b, "%" PRIu32, *(const uint32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        kiln_sbuf_printf(b, "%" PRIu64, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_DOUBLE: { /* the shortest form that reads back the same */
        double v = *(const double *)p;
        char t[40];
        snprintf(t, sizeof t, "%.15g", v);
        if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
        kiln_sbuf_puts(b, t);
        break;
    }
    case PROTOBUF_C_TYPE_FLOAT:
        kiln_sbuf_printf(b, "%.9g", (double)*(const float *)p);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        kiln_sbuf_puts(b, *(const protobuf_c_boolean *)p ? "true" : "false");
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *v =
            protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)p);
        if (v) kiln_sbuf_puts(b, v->name);
        else kiln_sbuf_printf(b, "%d", *(const int *)p);
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        kiln_sbuf_puts(b, "\"");
        for (; s && *s; s++) {
            unsigned char c = (unsigned char)*s;
            if (c == '"' || c == '\\') kiln_sbuf_printf(b, "\\%c", c);
            else if (c < 0x20 || c == 0x7f) kiln_sbuf_printf(b, "\\%03o", c);
            else kiln_sbuf_put(b, s, 1);
        }
        kiln_sbuf_puts(b, "\"");
        break;
    }
    default: /* bytes: not in the rollout schema */
        kiln_sbuf_puts(b, "\"\"");
        break;
    }
}

static int is_zero(const ProtobufCFieldDescriptor *f, const void *p)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return *(const int32_t *)p == 0;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return *(const int64_t *)p == 0;
    case PROTOBUF_C_TYPE_DOUBLE:
        return *(const double *)p == 0.0 && !signbit(*(const double *)p);
    case PROTOBUF_C_TYPE_FLOAT:
        return *(const float *)p == 0.0f;
    case PROTOBUF_C_TYPE_BOOL:
        return !*(const protobuf_c_boolean *)p;
    case PROTOBUF_C_TYPE_STRING:
        return !*(char *const *)p || !**(char *const *)p;
    case PROTOBUF_C_TYPE_MESSAGE:
        return !*(void *const *)p;
    default:
        return 1;
    }
}

static size_t type_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default:
        return 4;
    }
}

static void write_value(const ProtobufCFieldDescriptor *f, const void *p, kiln_sbuf *b, int indent)
{
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        kiln_sbuf_printf(b, "%s {\n", f->name);
        kiln_textproto_write(*(const ProtobufCMessage *const *)p, b, indent + 1);
        indent_to(b, indent);
        kiln_sbuf_puts(b, "}\n");
    } else {
        kiln_sbuf_printf(b, "%s: ", f->name);
        write_scalar(f, p, b);
        kiln_sbuf_puts(b, "\n");
    }
}

void kiln_textproto_write(const ProtobufCMessage *msg, kiln_sbuf *b, int indent)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    const char *base = (const char *)msg;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *p = base + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(const char *const *)p;
            for (size_t k = 0; k < n; k++) {
                indent_to(b, indent);
                write_value(f, arr + k * type_size(f), b, indent);
            }
            continue;
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)(base + f->quantifier_offset) != f->id) continue;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset &&
                   f->type != PROTOBUF_C_TYPE_MESSAGE && f->type != PROTOBUF_C_TYPE_STRING) {
            if (!*(const protobuf_c_boolean *)(base + f->quantifier_offset)) continue;
        } else if (is_zero(f, p)) {
            continue;
        }
        indent_to(b, indent);
        write_value(f, p, b, indent);
    }
}

/* ------------------------------------------------------------ Prometheus */

typedef struct prom_url {
    char host[256], port[16];
} prom_url;

static int parse_url(const char *url, prom_url *u)
{
    if (strncmp(url, "http://", 7) != 0) return 0;
    const char *h = url + 7;
    size_t n = strcspn(h, ":/");
    if (n == 0 || n >= sizeof u->host) return 0;
    memcpy(u->host, h, n);
    u->host[n] = '\0';
    if (h[n] == ':') {
        size_t m = strcspn(h + n + 1, "/");
        if (m == 0 || m >= sizeof u->port) return 0;
        memcpy(u->port, h + n + 1, m);
        u->port[m] = '\0';
    } else {
        snprintf(u->port, sizeof u->port, "80");
    }
    return 1;
}

static void url_encode(kiln_sbuf *b, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '_' || c == '.' || c == '~')
            kiln_sbuf_put(b, s, 1);
        else
            kiln_sbuf_printf(b, "%%%02X", c);
    }
}

/* GET /api/v1/query?query=q; *body malloc'd (NUL-terminated). */
static kiln_status prom_query(const prom_url *u, const char *q, char **body, size_t *len, char *err)
{
    *body = NULL;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(u->host, u->port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, 512, "prometheus %s:%s: %s", u->host, u->port, gai_strerror(rc));
        return KILN_ERR_IO;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {10, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        snprintf(err, 512, "prometheus %s:%s: cannot connect: %s", u->host, u->port, strerror(errno));
        return KILN_ERR_IO;
    }
    kiln_sbuf req = {0};
    kiln_sbuf_puts(&req, "GET /api/v1/query?query=");
    url_encode(&req, q);
    kiln_sbuf_printf(&req, " HTTP/1.0\r\nHost: %s:%s\r\nAccept: application/json\r\n\r\n", u->host,
                     u->port);
    kiln_status st = KILN_OK;
    size_t off = 0;
    while (!req.oom && off < req.len) {
        ssize_t w = write(fd, req.p + off, req.len - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    if (req.oom || off < req.len) {
        snprintf(err, 512, "prometheus: cannot send the query");
        st = KILN_ERR_IO;
    }
    kiln_sbuf_free(&req);
    kiln_sbuf resp = {0};
    char buf[16384];
    while (st == KILN_OK) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0) {
            snprintf(err, 512, "prometheus: read: %s", strerror(errno));
            st = KILN_ERR_IO;
        }
        if (n <= 0) break;
        kiln_sbuf_put(&resp, buf, (size_t)n);
        if (resp.len > PROM_MAX_BYTES || resp.oom) {
            snprintf(err, 512, "prometheus: answer larger than %zu bytes", PROM_MAX_BYTES);
            st = KILN_ERR_IO;
        }
    }
    close(fd);
    if (st != KILN_OK) {
        kiln_sbuf_free(&resp);
        return st;
    }
    kiln_sbuf_put(&resp, "", 1); /* NUL */
    const char *sep = resp.p ? strstr(resp.p, "\r\n\r\n") : NULL;
    if (!sep || strncmp(resp.p, "HTTP/1.", 7) != 0 || strncmp(resp.p + 8, " 200", 4) != 0) {
        snprintf(err, 512, "prometheus: query '%.200s' answered %.40s", q,
                 resp.p ? resp.p : "nothing");
        kiln_sbuf_free(&resp);
        return KILN_ERR_IO;
    }
    size_t hl = (size_t)(sep + 4 - resp.p);
    *len = resp.len - 1 - hl;
    *body = malloc(*len + 1);
    if (!*body) {
        kiln_sbuf_free(&resp);
        return KILN_ERR_OUT_OF_MEMORY;
    }
    memcpy(*body, resp.p + hl, *len + 1);
    kiln_sbuf_free(&resp);
    return KILN_OK;
}

typedef kiln_prom_sample prom_sample;

static double label_double(const kiln_json_doc *d, int t)
{
    char *s = kiln_json_string_dup(d, t, NULL);
    if (!s) return NAN;
    double v = strcmp(s, "+Inf") == 0 ? INFINITY : strtod(s, NULL);
    free(s);
    return v;
}

kiln_status kiln_prom_parse_vector(const char *body, size_t len, kiln_prom_sample *out, int cap,
                                   int *n, char *err)
{
    *n = 0;
    kiln_status st = KILN_OK;
    kiln_json_doc d;
    char jerr[KILN_JSON_ERR_LEN];
    if (kiln_json_parse(body, len, 16, &d, jerr) != KILN_OK) {
        snprintf(err, 512, "prometheus: %.480s", jerr);
        return KILN_ERR_IO;
    }
    if (d.tok[0].type != KILN_JSON_OBJECT) {
        snprintf(err, 512, "prometheus: the answer is not a JSON object");
        kiln_json_doc_free(&d);
        return KILN_ERR_IO;
    }
    int data = kiln_json_object_get(&d, 0, "data");
    int res = data >= 0 && d.tok[data].type == KILN_JSON_OBJECT
                  ? kiln_json_object_get(&d, data, "result")
                  : -1;
    if (res < 0 || d.tok[res].type != KILN_JSON_ARRAY) {
        snprintf(err, 512, "prometheus: no data.result array in the answer");
        kiln_json_doc_free(&d);
        return KILN_ERR_IO;
    }
    for (uint32_t e = (uint32_t)res + 1, k = 0; k < d.tok[res].size;
         k++, e = d.tok[e].next) {
        if (*n == cap) break;
        if (d.tok[e].type != KILN_JSON_OBJECT) continue;
        int met = kiln_json_object_get(&d, (int)e, "metric"), val = kiln_json_object_get(&d, (int)e, "value");
        if (met < 0 || val < 0 || d.tok[met].type != KILN_JSON_OBJECT ||
            d.tok[val].type != KILN_JSON_ARRAY || d.tok[val].size != 2)
            continue;
        prom_sample *s = &out[*n];
        memset(s, 0, sizeof *s);
        s->version = -1;
        s->le = NAN;
        int tv = kiln_json_object_get(&d, met, "version"), to = kiln_json_object_get(&d, met, "outcome");
        int tl = kiln_json_object_get(&d, met, "le");
        int tf = kiln_json_object_get(&d, met, "feature");
        int tval = (int)d.tok[val + 1].next;
        if ((tv >= 0 && d.tok[tv].type != KILN_JSON_STRING) ||
            (to >= 0 && d.tok[to].type != KILN_JSON_STRING) ||
            (tl >= 0 && d.tok[tl].type != KILN_JSON_STRING) || d.tok[tval].type != KILN_JSON_STRING)
            continue;
        if (tv >= 0) {
            double v = label_double(&d, tv);
            /* a version label past int64_t (a "1e30") names no version: not converted */
            s->version = isfinite(v) && v >= 0 && v < 9223372036854775808.0 ? (int64_t)v : -1;
        }
        if (to >= 0) {
            char *o = kiln_json_string_dup(&d, to, NULL);
            if (o) snprintf(s->outcome, sizeof s->outcome, "%s", o);
            free(o);
        }
        if (tl >= 0) s->le = label_double(&d, tl);
        if (tf >= 0 && d.tok[tf].type == KILN_JSON_STRING) {
            char *f = kiln_json_string_dup(&d, tf, NULL);
            if (f) snprintf(s->feature, sizeof s->feature, "%.63s", f);
            free(f);
        }
        s->value = label_double(&d, tval);
        if (!isfinite(s->value) || s->value < 0) s->value = 0;
        (*n)++;
    }
    kiln_json_doc_free(&d);
    return st;
}

/* Run q and collect (version, outcome, le, value) of each sample. */
static kiln_status prom_vector(const prom_url *u, const char *q, prom_sample *out, int cap, int *n,
                               char *err)
{
    char *body;
    size_t len;
    *n = 0;
    kiln_status st = prom_query(u, q, &body, &len, err);
    if (st != KILN_OK) return st;
    st = kiln_prom_parse_vector(body, len, out, cap, n, err);
    if (st != KILN_OK) fprintf(stderr, "kiln rollout-controller: query %.300s\n", q);
    free(body);
    return st;
}

/* ------------------------------------------------------------ one round */

typedef struct arm_data {
    uint64_t ok, err;
    int n_buckets;
    double bounds[PROM_MAX_BUCKETS];
    uint64_t hist[PROM_MAX_BUCKETS];
} arm_data;

static int cmp_le(const void *a, const void *b)
{
    double x = ((const prom_sample *)a)->le, y = ((const prom_sample *)b)->le;
    return x < y ? -1 : x > y;
}

/* Escape a model name for a PromQL string literal. */
static void promql_string(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s && o + 3 < cap; s++) {
        if (*s == '"' || *s == '\\') out[o++] = '\\';
        out[o++] = *s;
    }
    out[o] = '\0';
}

static kiln_status window_of(const prom_url *u, const char *model, int64_t cand, int64_t base,
                             int64_t seconds, arm_data *c, arm_data *b, char *err)
{
    static prom_sample s[4096];
    int n;
    char m[300], q[1024];
    promql_string(m, sizeof m, model);
    memset(c, 0, sizeof *c);
    memset(b, 0, sizeof *b);
    snprintf(q, sizeof q,
             "sum by (version, outcome) "
             "(increase(kiln_rollout_requests_total{model_name=\"%s\"}[%" PRId64 "s]))",
             m, seconds);
    kiln_status st = prom_vector(u, q, s, 4096, &n, err);
    if (st != KILN_OK) return st;
    for (int i = 0; i < n; i++) {
        arm_data *a = s[i].version == cand ? c : s[i].version == base ? b : NULL;
        if (!a) continue;
        uint64_t v = (uint64_t)llround(s[i].value);
        if (strcmp(s[i].outcome, "error") == 0) a->err += v;
        else a->ok += v;
    }
    snprintf(q, sizeof q,
             "sum by (version, le) "
             "(increase(kiln_request_latency_us_bucket{model_name=\"%s\"}[%" PRId64 "s]))",
             m, seconds);
    st = prom_vector(u, q, s, 4096, &n, err);
    if (st != KILN_OK) return st;
    qsort(s, (size_t)n, sizeof *s, cmp_le);
    for (int i = 0; i < n; i++) {
        arm_data *a = s[i].version == cand ? c : s[i].version == base ? b : NULL;
        if (!a || isnan(s[i].le) || a->n_buckets == PROM_MAX_BUCKETS) continue;
        /* cumulative counts in le order: store them, differentiate below */
        a->bounds[a->n_buckets] = s[i].le;
        a->hist[a->n_buckets++] = (uint64_t)llround(s[i].value);
    }
    arm_data *arms[2] = {c, b};
    for (int k = 0; k < 2; k++) {
        arm_data *a = arms[k];
        uint64_t prev = 0;
        for (int i = 0; i < a->n_buckets; i++) {
            uint64_t cum = a->hist[i] < prev ? prev : a->hist[i]; /* rounding of increase() */
            a->hist[i] = cum - prev;
            prev = cum;
        }
    }
    return KILN_OK;
}

/* The sum of the values of q's answer (0 when it is empty); *found: the
 * number of samples. */
static kiln_status prom_sum(const prom_url *u, const char *q, double *sum, int *found, char *err)
{
    static prom_sample s[256];
    int n;
    *sum = 0.0;
    kiln_status st = prom_vector(u, q, s, 256, &n, err);
    if (st != KILN_OK) return st;
    for (int i = 0; i < n; i++) *sum += s[i].value;
    if (found) *found = n;
    return KILN_OK;
}

/* The paired gates (agreement, output divergence) over the fleet: the
 * increase of the replicas' shadow counters over the window, summed. */
static kiln_status paired_gates(const prom_url *u, const char *model, int64_t seconds,
                                const kiln_gate_params *gp, kiln_gate_result *res, char *err)
{
    static const char *const names[] = {"top1_agree", "top1_rows", "js_rows", "js_sum",
                                        "js_sq_sum"};
    double v[5];
    char m[300], q[1024];
    promql_string(m, sizeof m, model);
    for (int i = 0; i < 5; i++) {
        snprintf(q, sizeof q,
                 "sum(increase(kiln_shadow_%s_total{model_name=\"%s\"}[%" PRId64 "s]))",
                 names[i], m, seconds);
        kiln_status st = prom_sum(u, q, &v[i], NULL, err);
        if (st != KILN_OK) return st;
    }
    uint64_t agree = (uint64_t)llround(v[0]), paired = (uint64_t)llround(v[1]);
    kiln_gate_agreement(gp, agree, paired, res);
    kiln_gate_divergence(gp, (uint64_t)llround(v[2]), v[3], v[4], res);
    return KILN_OK;
}

/* The input drift gate over the fleet, folded into res: a feature of the
 * candidate fails when at least half of the replicas that judge it (the
 * ones with the profile's min_count values in their window) see it past
 * its threshold; the gate holds while no replica judges any feature yet,
 * and is skipped when no replica exports the version's profile. */
static kiln_status drift_gate(const prom_url *u, const char *model, int64_t version,
                              kiln_gate_result *res, char *err)
{
    static prom_sample s[256];
    int n;
    char m[300], q[1024];
    promql_string(m, sizeof m, model);
    snprintf(q, sizeof q,
             "avg by (feature) (kiln_drift_alert{model_name=\"%s\",version=\"%" PRId64 "\"})", m,
             version);
    kiln_status st = prom_vector(u, q, s, 256, &n, err);
    if (st != KILN_OK) return st;
    if (res->verdict == KILN_GATE_FAIL) return KILN_OK;
    int worst = -1, past = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].value < 0.5) continue;
        past++;
        if (worst < 0 || s[i].value > s[worst].value) worst = i;
    }
    if (past) {
        res->verdict = KILN_GATE_FAIL;
        snprintf(res->reason, sizeof res->reason,
                 "input drift: %d feature%s of version %" PRId64 " past the profile's "
                 "thresholds on at least half of the replicas that judge them; farthest "
                 "feature '%s' (on %.0f%% of them)",
                 past, past == 1 ? "" : "s", version, s[worst].feature, 100.0 * s[worst].value);
        return KILN_OK;
    }
    if (n > 0 || res->verdict != KILN_GATE_PASS) return KILN_OK;
    double count;
    int found;
    snprintf(q, sizeof q, "kiln_drift_window_values{model_name=\"%s\",version=\"%" PRId64 "\"}",
             m, version);
    st = prom_sum(u, q, &count, &found, err);
    if (st != KILN_OK) return st;
    if (found) {
        res->verdict = KILN_GATE_HOLD;
        snprintf(res->reason, sizeof res->reason,
                 "input drift: too few of version %" PRId64 "'s input values in any replica's "
                 "monitoring window to tell (its profile's min_count)", version);
    }
    return KILN_OK;
}

static void event_line(const char *event, const KilnRollout__ModelRollout *mr, double pct,
                       const char *reason)
{
    kiln_sbuf b = {0};
    char ts[32];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    kiln_sbuf_printf(&b, "{\"time\":\"%s\",\"component\":\"rollout-controller\",\"event\":\"%s\","
                         "\"model\":", ts, event);
    kiln_sbuf_json_string(&b, mr->model_name, strlen(mr->model_name));
    kiln_sbuf_printf(&b, ",\"state\":\"%s\",\"step_percent\":%g,\"candidate\":%" PRId64
                         ",\"baseline\":%" PRId64 ",\"reason\":",
                     mr->canary->state, pct, mr->canary->candidate_version,
                     mr->canary->baseline_version);
    kiln_sbuf_json_string(&b, reason, strlen(reason));
    kiln_sbuf_puts(&b, "}\n");
    if (!b.oom) fputs(b.p, stderr);
    kiln_sbuf_free(&b);
}

/* Replace a string field of a protobuf-c message (freed by free_unpacked
 * with the default allocator, i.e. free()). */
static void set_string(char **field, const char *v)
{
    char *s = strdup(v);
    if (!s) return;
    if (*field && *field != protobuf_c_empty_string) free(*field);
    *field = s;
}

static kiln_status write_file(const char *path, const KilnRollout__RolloutConfig *cfg, char *err)
{
    kiln_sbuf b = {0};
    kiln_sbuf_puts(&b, "# Written by kiln rollout-controller: the canaries' state is the fleet's.\n");
    kiln_textproto_write(&cfg->base, &b, 0);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = b.oom ? NULL : fopen(tmp, "wb");
    int ok = f && fwrite(b.p, 1, b.len, f) == b.len;
    if (f) ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    kiln_sbuf_free(&b);
    if (!ok) {
        snprintf(err, 512, "cannot write %s: %s", path, strerror(errno));
        return KILN_ERR_IO;
    }
    return KILN_OK;
}

static int round_once(const kiln_rollout_controller_options *o, const prom_url *u, char *err)
{
    KilnRollout__RolloutConfig *cfg;
    char lerr[KILN_ROLLOUT_ERR_LEN];
    if (kiln_rollout_config_load(o->rollout_file, &cfg, lerr) != KILN_OK) {
        fprintf(stderr, "kiln rollout-controller: %s\n", lerr);
        return 0;
    }
    int changed = 0;
    int64_t now = (int64_t)time(NULL);
    for (size_t i = 0; i < cfg->n_model_rollouts; i++) {
        KilnRollout__ModelRollout *mr = cfg->model_rollouts[i];
        KilnRollout__Canary *k = mr->canary;
        if (!k) continue;
        if (!k->candidate_version || !k->baseline_version) {
            fprintf(stderr, "kiln rollout-controller: %s: the controller needs candidate_version "
                            "and baseline_version (labels are resolved by each replica)\n",
                    mr->model_name);
            continue;
        }
        static const double def_steps[] = {5, 50, 100};
        int n_steps = k->n_steps ? (int)k->n_steps : 3;
        const double *steps = k->n_steps ? k->steps : def_steps;
        if (!k->controlled) { /* take the canary over: step 0, a window from now */
            k->controlled = 1;
            set_string(&k->state, k->paused ? "paused" : "progressing");
            k->step = 0;
            k->step_started_unix = now;
            set_string(&k->reason, "taken over by kiln rollout-controller");
            event_line("start", mr, steps[0], k->reason);
            changed = 1;
            continue;
        }
        if (!k->state || (k->state[0] && strcmp(k->state, "progressing") != 0)) continue;
        int64_t secs = now - k->step_started_unix;
        if (secs < 1) continue;
        arm_data c, b;
        if (window_of(u, mr->model_name, k->candidate_version, k->baseline_version, secs, &c, &b,
                      err) != KILN_OK) {
            fprintf(stderr, "kiln rollout-controller: %s\n", err);
            continue;
        }
        const KilnRollout__Gates *g = k->gates;
        kiln_gate_params gp = {g && g->max_error_rate_increase ? g->max_error_rate_increase : 0.01,
                               g && g->max_p99_latency_ratio ? g->max_p99_latency_ratio : 1.5,
                               g && g->confidence ? g->confidence : 0.95,
                               g && g->p99_latency_slack_us ? g->p99_latency_slack_us : 200.0,
                               g ? g->min_agreement : 0.0,
                               g ? g->max_output_divergence : 0.0};
        kiln_gate_arm ac = {c.ok + c.err, c.err, c.n_buckets ? c.hist : NULL, c.bounds, c.n_buckets};
        kiln_gate_arm ab = {b.ok + b.err, b.err, b.n_buckets ? b.hist : NULL, b.bounds, b.n_buckets};
        kiln_gate_result res;
        kiln_gate_evaluate(&gp, &ac, &ab, &res);
        kiln_status gst = KILN_OK;
        if (gp.min_agreement > 0 || gp.max_output_divergence > 0)
            gst = paired_gates(u, mr->model_name, secs, &gp, &res, err);
        if (gst == KILN_OK && g && g->roll_back_on_input_drift)
            gst = drift_gate(u, mr->model_name, k->candidate_version, &res, err);
        if (gst != KILN_OK) {
            fprintf(stderr, "kiln rollout-controller: %s\n", err);
            continue;
        }
        char why[600];
        int64_t min_req = k->min_requests ? k->min_requests : 100;
        int min_s = k->min_step_seconds ? k->min_step_seconds : 60;
        if (res.verdict == KILN_GATE_FAIL) {
            snprintf(why, sizeof why, "step %g%%: %s (fleet, from Prometheus)", steps[k->step], res.reason);
            set_string(&k->state, "rolled_back");
            set_string(&k->reason, why);
            event_line("rollback", mr, 0, why);
            changed = 1;
        } else if (res.verdict == KILN_GATE_PASS && ac.requests >= (uint64_t)min_req &&
                   ab.requests >= (uint64_t)min_req && secs >= min_s) {
            snprintf(why, sizeof why, "step %g%% passed: error rate %.4f vs %.4f, p99 %.0f vs %.0f us "
                     "over %" PRIu64 " and %" PRIu64 " requests (fleet, from Prometheus)",
                     steps[k->step], res.err_candidate, res.err_baseline, res.p99_candidate,
                     res.p99_baseline, ac.requests, ab.requests);
            set_string(&k->reason, why);
            k->step++;
            k->step_started_unix = now;
            if (k->step >= n_steps - 1) {
                k->step = n_steps - 1;
                set_string(&k->state, "promoted");
                event_line("promote", mr, 100, why);
            } else {
                event_line("advance", mr, steps[k->step], why);
            }
            changed = 1;
        } else if (res.verdict == KILN_GATE_HOLD && ac.requests >= (uint64_t)min_req &&
                   ab.requests >= (uint64_t)min_req && secs >= min_s) {
            /* inconclusive: the step holds; said once per step */
            static char held[KILN_ROLLOUT_MAX_MODELS][160];
            char key[160];
            snprintf(key, sizeof key, "%.120s/%" PRId64, mr->model_name, k->step_started_unix);
            int seen = 0, free_slot = -1;
            for (int h = 0; h < KILN_ROLLOUT_MAX_MODELS; h++) {
                if (strcmp(held[h], key) == 0) seen = 1;
                if (free_slot < 0 && strncmp(held[h], key, strlen(mr->model_name) + 1) == 0)
                    free_slot = h; /* this model's previous step */
                if (free_slot < 0 && !held[h][0]) free_slot = h;
            }
            if (!seen && free_slot >= 0) {
                snprintf(held[free_slot], sizeof held[free_slot], "%s", key);
                event_line("hold", mr, steps[k->step], res.reason);
            }
        }
    }
    int ok = 1;
    if (changed && write_file(o->rollout_file, cfg, err) != KILN_OK) {
        fprintf(stderr, "kiln rollout-controller: %s\n", err);
        ok = 0;
    }
    kiln_rollout__rollout_config__free_unpacked(cfg, NULL);
    return ok;
}

kiln_status kiln_rollout_controller_run(const kiln_rollout_controller_options *o,
                                        volatile sig_atomic_t *stop, char *err)
{
    prom_url u;
    if (!o->prometheus || !parse_url(o->prometheus, &u)) {
        snprintf(err, 512, "--prometheus '%.200s': an http://host:port URL",
                 o->prometheus ? o->prometheus : "");
        return KILN_ERR_INVALID_ARGUMENT;
    }
    KilnRollout__RolloutConfig *cfg;
    char lerr[KILN_ROLLOUT_ERR_LEN];
    if (kiln_rollout_config_load(o->rollout_file, &cfg, lerr) != KILN_OK) {
        snprintf(err, 512, "%.500s", lerr);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    kiln_rollout__rollout_config__free_unpacked(cfg, NULL);
    char rerr[512];
    while (!*stop) {
        round_once(o, &u, rerr);
        if (o->once) break;
        for (int i = 0; i < o->interval_seconds * 10 && !*stop; i++) {
            struct timespec ts = {0, 100000000};
            nanosleep(&ts, NULL);
        }
    }
    return KILN_OK;
}
