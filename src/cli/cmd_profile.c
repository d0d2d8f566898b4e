/*
 * cmd_profile.c - `kiln profile MODEL --data DATA -o profile.json`: run a
 * model on reference data and write the reference profile that `kiln
 * serve` compares live traffic with (src/serve/monitor/, docs/MONITORING.md).
 *
 * DATA is a folder of .npy files named by input (NAME.npy, first dimension
 * = samples, the same count in every file) or an .npz archive of them
 * (npz.c), a JSON-lines file whose
 * lines are TF Serving predict request bodies ("instances" or "inputs"),
 * decoded by the server's own codec, or a TF Serving warmup file (its
 * predict records, read by serve/warmup.c). The data runs through the model in
 * batches; every input value and every output row is collected, then each
 * feature gets its histogram (numeric: bins at the reference deciles;
 * categorical: the top-k values and "other") and each probability output
 * the distribution of its max probability. Profiles hold no validation
 * rules: the user adds them (docs/MONITORING.md).
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/npy.h"
#include "cli/npz.h"
#include "serve/codec.h"
#include "serve/json.h"
#include "serve/monitor/profile.h"
#include "serve/warmup.h"

static const char profile_help[] =
    "usage: kiln profile MODEL --data DATA -o FILE [options]\n"
    "\n"
    "Run MODEL on reference data and write a reference profile (JSON) for model\n"
    "monitoring: per input feature a histogram (numeric: 10 bins at the deciles;\n"
    "categorical: the top-k values), missing/NaN/inf counts and min/max; per\n"
    "probability output the distribution of its max probability. Put the file in a\n"
    "version folder as assets.extra/kiln_profile.json and `kiln serve` reports drift\n"
    "and confidence for that version (docs/MONITORING.md).\n"
    "\n"
    "  --data DATA        a folder of NAME.npy files (one per input, first dimension =\n"
    "                     samples) or an .npz archive of them, a JSON-lines file of TF Serving predict bodies, or a\n"
    "                     TF Serving warmup file (tf_serving_warmup_requests)\n"
    "  -o, --output FILE  where to write the profile\n"
    "  --signature NAME   signature to profile (default: the default one)\n"
    "  --tags TAGS        SavedModel MetaGraph tags (default serve)\n"
    "  --batch N          rows per run for .npy data (default 256)\n"
    "  --top-k K          categorical values kept (default 20, at most 64); integer and\n"
    "                     bool columns with at most K distinct values are categorical\n"
    "  --psi X, --js X, --linf X  drift alert thresholds (default 0.25, 0.1, 0.1)\n"
    "  --window-seconds N, --sub-windows N  the sliding window (default 300 s in 5 slots)\n"
    "  --min-count N      window values needed before drift is reported (default 500)\n";

/* A positive finite number for --psi / --js / --linf. */
static int parse_threshold(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

#define PROFILE_DECILES 9

/* The values of one feature, collected over the whole data set. */
typedef struct feat_acc {
    kiln_mon_feature f;  /* name, input, column; the rest filled at the end */
    int input;           /* signature input index */
    int is_string, is_integer;
    double *x;           /* finite numeric values */
    size_t nx, capx;
    kiln_string *s;      /* string values (copies) */
    size_t ns, caps;
} feat_acc;

typedef struct out_acc {
    char name[KILN_MON_NAME_MAX];
    int candidate;       /* still looks like probabilities */
    int64_t rows;
    double sum_max;
    int64_t hist[KILN_MON_CONF_BUCKETS + 1];
} out_acc;

typedef struct profiler {
    const kiln_signature *sig;
    kiln_session *sess;
    int n_in;
    feat_acc *feats;
    int n_feats;
    int *cols;           /* [input] columns seen first (-1: pooled), to check later batches */
    out_acc *outs;
    int n_outs;
    int64_t rows;
    int top_k;
} profiler;

static int push_x(feat_acc *a, double v)
{
    if (a->nx == a->capx) {
        size_t c = a->capx ? a->capx * 2 : 1024;
        double *p = realloc(a->x, c * sizeof *p);
        if (!p) return 0;
        a->x = p;
        a->capx = c;
    }
    a->x[a->nx++] = v;
    return 1;
}

static int push_s(feat_acc *a, const kiln_string *s)
{
    if (a->ns == a->caps) {
        size_t c = a->caps ? a->caps * 2 : 1024;
        kiln_string *p = realloc(a->s, c * sizeof *p);
        if (!p) return 0;
        a->s = p;
        a->caps = c;
    }
    char *d = malloc(s->len + 1);
    if (!d) return 0;
    if (s->len) memcpy(d, s->data, s->len);
    d[s->len] = '\0';
    a->s[a->ns].data = d;
    a->s[a->ns].len = s->len;
    a->ns++;
    return 1;
}

static int is_integer_dtype(kiln_dtype dt)
{
    return dt == KILN_DTYPE_I8 || dt == KILN_DTYPE_U8 || dt == KILN_DTYPE_I16 ||
           dt == KILN_DTYPE_U16 || dt == KILN_DTYPE_I32 || dt == KILN_DTYPE_U32 ||
           dt == KILN_DTYPE_I64 || dt == KILN_DTYPE_U64 || dt == KILN_DTYPE_BOOL;
}

/* Create the features of every input from the first batch's shapes. */
static int make_features(profiler *p, kiln_tensor *const *in, const char *where)
{
    int cap = 0;
    for (int i = 0; i < p->n_in; i++) {
        const kiln_tensor *t = in[i];
        int c = t->rank == 2 && t->dims[1] >= 1 && t->dims[1] <= KILN_MON_MAX_COLUMNS ? (int)t->dims[1] : 1;
        cap += c;
    }
    if (cap > KILN_MON_MAX_FEATURES)
        return kiln_cli_fail("%s: the inputs make %d features, at most %d are profiled", where, cap,
                             KILN_MON_MAX_FEATURES);
    p->feats = calloc((size_t)cap + 1, sizeof *p->feats);
    p->cols = calloc((size_t)p->n_in + 1, sizeof *p->cols);
    if (!p->feats || !p->cols) return kiln_cli_fail("out of memory");
    for (int i = 0; i < p->n_in; i++) {
        const kiln_tensor *t = in[i];
        const char *name = kiln_signature_input(p->sig, i)->name;
        if (strlen(name) + 8 > KILN_MON_NAME_MAX)
            return kiln_cli_fail("input '%.60s...': the name is longer than %d bytes", name,
                                 KILN_MON_NAME_MAX - 8);
        if (t->dtype != KILN_DTYPE_STRING && !kiln_mon_numeric_dtype(t->dtype))
            return kiln_cli_fail("%s: input '%s' has dtype %s, which monitoring does not read", where,
                                 name, kiln_dtype_name(t->dtype));
        int per_col = t->rank == 2 && t->dims[1] >= 1 && t->dims[1] <= KILN_MON_MAX_COLUMNS;
        p->cols[i] = per_col ? (int)t->dims[1] : -1;
        for (int c = 0; c < (per_col ? (int)t->dims[1] : 1); c++) {
            feat_acc *a = &p->feats[p->n_feats++];
            a->input = i;
            a->is_string = t->dtype == KILN_DTYPE_STRING;
            a->is_integer = is_integer_dtype(t->dtype);
            a->f.column = per_col ? c : -1;
            snprintf(a->f.input, sizeof a->f.input, "%s", name);
            if (per_col) snprintf(a->f.name, sizeof a->f.name, "%s[%d]", name, c);
            else snprintf(a->f.name, sizeof a->f.name, "%s", name);
        }
    }
    return -1;
}

/* Add one batch: the inputs' values and the outputs' rows. */
static int add_batch(profiler *p, kiln_tensor *const *in, const char *where)
{
    if (!p->feats) {
        int r = make_features(p, in, where);
        if (r >= 0) return r;
    }
    for (int i = 0; i < p->n_in; i++) {
        const kiln_tensor *t = in[i];
        int per_col = t->rank == 2 && t->dims[1] >= 1 && t->dims[1] <= KILN_MON_MAX_COLUMNS;
        if ((per_col ? (int)t->dims[1] : -1) != p->cols[i])
            return kiln_cli_fail("%s: input '%s' has shape %s%lld columns, the first batch had %d",
                                 where, kiln_signature_input(p->sig, i)->name,
                                 t->rank == 2 ? "" : "other than [N, F] with ",
                                 t->rank == 2 ? (long long)t->dims[1] : 0LL, p->cols[i]);
    }
    for (int k = 0; k < p->n_feats; k++) {
        feat_acc *a = &p->feats[k];
        const kiln_tensor *t = in[a->input];
        int64_t n = a->f.column >= 0 ? t->dims[0] : kiln_tensor_count(t);
        int64_t stride = a->f.column >= 0 ? t->dims[1] : 1, first = a->f.column >= 0 ? a->f.column : 0;
        for (int64_t r = 0; r < n; r++) {
            int64_t idx = first + r * stride;
            if (a->is_string) {
                const kiln_string *s = (const kiln_string *)t->data + idx;
                if (s->len == 0) a->f.missing++;
                else if (!push_s(a, s)) return kiln_cli_fail("out of memory");
                continue;
            }
            double v = kiln_mon_element(t, idx);
            if (isnan(v)) a->f.nan++;
            else if (isinf(v)) a->f.inf++;
            else if (!push_x(a, v)) return kiln_cli_fail("out of memory");
        }
    }
    p->rows += in[0] && in[0]->rank > 0 ? in[0]->dims[0] : 1;

    kiln_named_tensor named[64];
    for (int i = 0; i < p->n_in; i++) named[i] = (kiln_named_tensor){kiln_signature_input(p->sig, i)->name, in[i]};
    kiln_outputs *out;
    if (kiln_session_run(p->sess, named, p->n_in, &out) != KILN_OK)
        return kiln_cli_fail("%s: the model failed on this data: %s", where, kiln_last_error());
    int no = kiln_outputs_count(out);
    if (!p->outs) {
        p->outs = calloc((size_t)no + 1, sizeof *p->outs);
        if (!p->outs) {
            kiln_outputs_free(out);
            return kiln_cli_fail("out of memory");
        }
        p->n_outs = no;
        for (int j = 0; j < no; j++) {
            snprintf(p->outs[j].name, sizeof p->outs[j].name, "%s", kiln_outputs_name(out, j));
            p->outs[j].candidate = strlen(kiln_outputs_name(out, j)) < KILN_MON_NAME_MAX;
        }
    }
    for (int j = 0; j < no && j < p->n_outs; j++) {
        out_acc *o = &p->outs[j];
        const kiln_tensor *t = kiln_outputs_get(out, j);
        if (!o->candidate) continue;
        if (t->rank != 2 || t->dims[1] < 2 || t->dims[1] > INT32_MAX ||
            (t->dtype != KILN_DTYPE_F32 && t->dtype != KILN_DTYPE_F64)) {
            o->candidate = 0;
            continue;
        }
        int c = (int)t->dims[1];
        for (int64_t r = 0; r < t->dims[0] && o->candidate; r++) {
            double sum = 0, maxp, margin, ent;
            for (int k = 0; k < c; k++) {
                double v = kiln_mon_element(t, r * c + k);
                if (!(v >= -1e-6 && v <= 1 + 1e-6)) o->candidate = 0;
                sum += v;
            }
            if (!o->candidate || fabs(sum - 1) > 1e-3) {
                o->candidate = 0;
                break;
            }
            int ok = t->dtype == KILN_DTYPE_F32
                         ? kiln_mon_confidence_f32((const float *)t->data + r * c, c, &maxp, &margin, &ent)
                         : kiln_mon_confidence_f64((const double *)t->data + r * c, c, &maxp, &margin, &ent);
            if (!ok) continue;
            o->rows++;
            o->sum_max += maxp;
            o->hist[kiln_mon_conf_bucket(maxp)]++;
        }
    }
    kiln_outputs_free(out);
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmp_string(const void *a, const void *b)
{
    const kiln_string *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->data, y->data, n);
    return c ? c : (x->len < y->len ? -1 : x->len > y->len);
}

/* A distinct value and how often it occurs, for the top-k. */
typedef struct value_count {
    size_t first;  /* index of its first occurrence in the sorted values */
    int64_t n;
} value_count;

static int cmp_count_desc(const void *a, const void *b)
{
    const value_count *x = a, *y = b;
    if (x->n != y->n) return x->n > y->n ? -1 : 1;
    return x->first < y->first ? -1 : x->first > y->first; /* ties: sorted order */
}

/* numpy.quantile's default (linear) on sorted x[0..n). */
static double quantile(const double *x, size_t n, double q)
{
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    if (lo + 1 >= n) return x[n - 1];
    double frac = pos - (double)lo, d = x[lo + 1] - x[lo];
    return frac >= 0.5 ? x[lo + 1] - d * (1 - frac) : x[lo] + d * frac; /* as numpy's _lerp */
}

/* Turn the collected values into the feature's histogram. */
static int finish_feature(feat_acc *a, int top_k)
{
    kiln_mon_feature *f = &a->f;
    if (a->is_string) {
        f->kind = KILN_MON_CATEGORICAL;
        f->strings = 1;
        f->min = -INFINITY;
        f->max = INFINITY;
        f->count = (int64_t)a->ns;
        if (a->ns) qsort(a->s, a->ns, sizeof *a->s, cmp_string);
        value_count *vc = malloc((a->ns + 1) * sizeof *vc);
        if (!vc) return 0;
        size_t nd = 0;
        for (size_t i = 0; i < a->ns; i++) {
            if (i == 0 || cmp_string(&a->s[i], &a->s[i - 1]) != 0) vc[nd++] = (value_count){i, 0};
            vc[nd - 1].n++;
        }
        qsort(vc, nd, sizeof *vc, cmp_count_desc);
        f->n_values = nd < (size_t)top_k ? (int)nd : top_k;
        int64_t kept = 0;
        for (int k = 0; k < f->n_values; k++) {
            const kiln_string *s = &a->s[vc[k].first];
            f->values[k] = malloc(s->len + 1);
            if (!f->values[k]) {
                free(vc);
                return 0;
            }
            memcpy(f->values[k], s->data, s->len + 1);
            f->value_len[k] = s->len;
            f->counts[k] = vc[k].n;
            kept += vc[k].n;
        }
        f->counts[f->n_values] = f->count - kept;
        f->n_counts = f->n_values + 1;
        free(vc);
        return 1;
    }
    f->count = (int64_t)a->nx;
    if (a->nx) qsort(a->x, a->nx, sizeof *a->x, cmp_double);
    f->min = a->nx ? a->x[0] : INFINITY;
    f->max = a->nx ? a->x[a->nx - 1] : -INFINITY;
    size_t nd = 0;
    for (size_t i = 0; i < a->nx; i++) nd += i == 0 || a->x[i] != a->x[i - 1];
    if (a->is_integer && nd <= (size_t)top_k) {
        f->kind = KILN_MON_CATEGORICAL;
        f->strings = 0;
        value_count *vc = malloc((nd + 1) * sizeof *vc);
        if (!vc) return 0;
        nd = 0;
        for (size_t i = 0; i < a->nx; i++) {
            if (i == 0 || a->x[i] != a->x[i - 1]) vc[nd++] = (value_count){i, 0};
            vc[nd - 1].n++;
        }
        qsort(vc, nd, sizeof *vc, cmp_count_desc);
        f->n_values = (int)nd;
        for (int k = 0; k < f->n_values; k++) {
            f->value_num[k] = a->x[vc[k].first];
            f->counts[k] = vc[k].n;
        }
        f->counts[f->n_values] = 0;
        f->n_counts = f->n_values + 1;
        free(vc);
        return 1;
    }
    f->kind = KILN_MON_NUMERIC;
    f->n_edges = 0;
    if (a->nx) {
        for (int q = 1; q <= PROFILE_DECILES; q++) {
            double e = quantile(a->x, a->nx, q / 10.0);
            if (f->n_edges == 0 || e > f->edges[f->n_edges - 1]) f->edges[f->n_edges++] = e;
        }
        if (f->n_edges < 2) { /* (nearly) constant: bins below, at and above the value */
            double v = f->min < f->max ? f->min : f->edges[0];
            double w = f->min < f->max ? f->max : nextafter(v, INFINITY);
            f->edges[0] = v;
            f->edges[1] = w;
            f->n_edges = 2;
        }
    }
    f->n_counts = f->n_edges + 1;
    memset(f->counts, 0, sizeof f->counts);
    for (size_t i = 0; i < a->nx; i++) f->counts[kiln_mon_bin(f->edges, f->n_edges, a->x[i])]++;
    return 1;
}

/* Read DATA/NAME.npy (or the .npz archive z's member NAME.npy) for every
 * input and run them in batches. */
static int run_npy_folder(profiler *p, const char *dir, const kiln_npz *z, int batch)
{
    kiln_tensor *all[64] = {0};
    int rc = -1;
    int64_t n = -1;
    char path[4096];
    for (int i = 0; i < p->n_in && rc < 0; i++) {
        const char *name = kiln_signature_input(p->sig, i)->name;
        if (z) {
            snprintf(path, sizeof path, "%s, member '%s.npy'", dir, name);
            for (int k = 0; k < z->n && !all[i]; k++)
                if (strcmp(z->names[k], name) == 0) all[i] = z->tensors[k];
            if (!all[i]) {
                rc = kiln_cli_fail("--data %s: input '%s': no member '%s.npy' in the archive", dir,
                                   name, name);
                break;
            }
        } else {
            snprintf(path, sizeof path, "%s/%s.npy", dir, name);
            if (kiln_npy_read(path, &all[i]) != KILN_OK) {
                rc = kiln_cli_fail("--data: input '%s': %s", name, kiln_npy_last_error());
                break;
            }
        }
        if (all[i]->rank < 1) {
            rc = kiln_cli_fail("--data: %s (input '%s') is a scalar; the first dimension counts "
                               "samples", path, name);
        } else if (n >= 0 && all[i]->dims[0] != n) {
            rc = kiln_cli_fail("--data: %s (input '%s') has %lld samples, the other inputs %lld",
                               path, name, (long long)all[i]->dims[0], (long long)n);
        }
        n = all[i]->rank >= 1 ? all[i]->dims[0] : n;
    }
    for (int64_t r0 = 0; rc < 0 && n > 0 && r0 < n; r0 += batch) {
        int64_t rows = n - r0 < batch ? n - r0 : batch;
        kiln_tensor *views[64] = {0};
        char where[4200];
        snprintf(where, sizeof where, "--data %s, rows %lld..%lld", dir, (long long)r0,
                 (long long)(r0 + rows - 1));
        for (int i = 0; i < p->n_in && rc < 0; i++) {
            int64_t dims[KILN_MAX_RANK];
            memcpy(dims, all[i]->dims, sizeof dims);
            int64_t per_row = dims[0] ? kiln_tensor_count(all[i]) / dims[0] : 0;
            dims[0] = rows;
            size_t es = all[i]->dtype == KILN_DTYPE_STRING ? sizeof(kiln_string)
                                                            : kiln_dtype_size(all[i]->dtype);
            size_t off = (size_t)(r0 * per_row) * es, nb = (size_t)(rows * per_row) * es;
            if (kiln_tensor_wrap(all[i]->dtype, all[i]->rank, dims, (char *)all[i]->data + off, nb,
                                 &views[i]) != KILN_OK)
                rc = kiln_cli_fail("%s: %s", where, kiln_last_error());
        }
        if (rc < 0) rc = add_batch(p, views, where);
        for (int i = 0; i < p->n_in; i++) kiln_tensor_free(views[i]);
    }
    if (rc < 0 && n <= 0) rc = kiln_cli_fail("--data %s: no samples", dir);
    for (int i = 0; i < p->n_in && !z; i++) kiln_tensor_free(all[i]);
    return rc;
}

/* Each line a TF Serving predict body, run as one batch. */
static int run_jsonl(profiler *p, const char *file)
{
    FILE *f = fopen(file, "rb");
    if (!f) return kiln_cli_fail("--data %s: %s", file, strerror(errno));
    kiln_value_info specs[64];
    for (int i = 0; i < p->n_in; i++) specs[i] = *kiln_signature_input(p->sig, i);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = -1;
    long lineno = 0, used = 0;
    while (rc < 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = '\0';
        if (len == 0) continue;
        char err[KILN_JSON_ERR_LEN], where[4200];
        snprintf(where, sizeof where, "--data %s:%ld", file, lineno);
        kiln_json_doc doc;
        kiln_predict_request req;
        kiln_tensor *in[64] = {0};
        if ((size_t)len > KILN_JSON_MAX_BYTES) {
            rc = kiln_cli_fail("%s: the line is longer than %u bytes", where, KILN_JSON_MAX_BYTES);
            break;
        }
        if (kiln_json_parse(line, (size_t)len, KILN_JSON_MAX_DEPTH, &doc, err) != KILN_OK) {
            rc = kiln_cli_fail("%s: %s", where, err);
            break;
        }
        if (kiln_predict_parse(&doc, &req, err) != KILN_OK ||
            kiln_predict_decode(&doc, &req, specs, p->n_in, in, err) != KILN_OK)
            rc = kiln_cli_fail("%s: %s", where, err);
        else
            rc = add_batch(p, in, where);
        used++;
        for (int i = 0; i < p->n_in; i++) kiln_tensor_free(in[i]);
        kiln_json_doc_free(&doc);
    }
    free(line);
    fclose(f);
    if (rc < 0 && used == 0) rc = kiln_cli_fail("--data %s: no requests in the file", file);
    return rc;
}

/* A TF Serving warmup file (TFRecord of PredictionLogs): each predict
 * record run as one batch; classify, regress and multi-inference records
 * are skipped. */
static int run_warmup(profiler *p, const char *file)
{
    FILE *f = fopen(file, "rb");
    if (!f) return kiln_cli_fail("--data %s: %s", file, strerror(errno));
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        if (len == cap) {
            if (cap >= KILN_WARMUP_MAX_BYTES) break;
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) return kiln_cli_fail("out of memory");
    if (bad || len >= KILN_WARMUP_MAX_BYTES) {
        free(buf);
        return kiln_cli_fail("--data %s: %s", file, bad ? "read error" : "larger than 1 GiB");
    }
    char err[KILN_WARMUP_ERR_LEN];
    kiln_warmup *w = NULL;
    kiln_status st = kiln_warmup_parse(buf, len, &w, err);
    free(buf);
    if (st != KILN_OK) return kiln_cli_fail("--data %s (a warmup file): %s", file, err);
    int rc = -1, used = 0;
    for (int r = 0; rc < 0 && r < w->n; r++) {
        const kiln_warmup_request *q = &w->req[r];
        if (q->kind != KILN_WARMUP_PREDICT) continue;
        char where[4200];
        snprintf(where, sizeof where, "--data %s, record %d", file, r + 1);
        if (q->signature[0] && strcmp(q->signature, kiln_signature_name(p->sig)) != 0) {
            rc = kiln_cli_fail("%s: signature '%s', the profile is of '%s' (--signature)", where,
                               q->signature, kiln_signature_name(p->sig));
            break;
        }
        kiln_tensor *in[64] = {0};
        for (int i = 0; i < p->n_in && rc < 0; i++) {
            const char *name = kiln_signature_input(p->sig, i)->name;
            for (int k = 0; k < q->n_inputs && !in[i]; k++)
                if (strcmp(q->names[k], name) == 0) in[i] = q->tensors[k];
            if (!in[i]) rc = kiln_cli_fail("%s: input '%s' is missing", where, name);
        }
        if (rc < 0) rc = add_batch(p, in, where);
        used++;
    }
    kiln_warmup_free(w);
    if (rc < 0 && used == 0) rc = kiln_cli_fail("--data %s: no predict records in the warmup file", file);
    return rc;
}

/* JSON lines start with '{'; anything else is taken for a warmup file. */
static int looks_like_json(const char *file)
{
    FILE *f = fopen(file, "rb");
    if (!f) return 1; /* run_jsonl reports the error */
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\n' || c == '\r' || c == '\t') {
    }
    fclose(f);
    return c == '{';
}

int kiln_cmd_profile(int argc, char **argv)
{
    static const char cmd[] = "profile";
    if (kiln_cli_wants_help(argc, argv)) {
        fputs(profile_help, stdout);
        return KILN_CLI_EXIT_OK;
    }
    const char *model_path = NULL, *data = NULL, *outp = NULL, *sig_name = NULL, *tags = NULL;
    int batch = 256, top_k = 20, window_s = KILN_MON_DEFAULT_WINDOW_S,
        sub_windows = KILN_MON_DEFAULT_SUB_WINDOWS, min_count = KILN_MON_DEFAULT_MIN_COUNT;
    double thr[3] = {KILN_MON_DEFAULT_PSI, KILN_MON_DEFAULT_JS, KILN_MON_DEFAULT_LINF};
    static const char *const thr_flags[3] = {"--psi", "--js", "--linf"};
    for (int i = 0; i < argc; i++) {
        const char *val = NULL;
        int r;
        if (argv[i][0] != '-' || argv[i][1] == '\0') {
            if (model_path) return kiln_cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
            model_path = argv[i];
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--data", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            data = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--output", &val)) != 0 ||
                   (r = kiln_cli_option(cmd, argc, argv, &i, "-o", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            outp = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--signature", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            sig_name = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--tags", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            tags = val;
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--batch", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, 1 << 20, &batch))
                return kiln_cli_usage_error(cmd, "--batch needs an integer in [1, 1048576], got '%s'", val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--top-k", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, KILN_MON_MAX_VALUES, &top_k))
                return kiln_cli_usage_error(cmd, "--top-k needs an integer in [1, %d], got '%s'",
                                            KILN_MON_MAX_VALUES, val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--window-seconds", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, 86400, &window_s))
                return kiln_cli_usage_error(cmd, "--window-seconds needs an integer in [1, 86400], got '%s'", val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--sub-windows", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, 60, &sub_windows))
                return kiln_cli_usage_error(cmd, "--sub-windows needs an integer in [1, 60], got '%s'", val);
        } else if ((r = kiln_cli_option(cmd, argc, argv, &i, "--min-count", &val)) != 0) {
            if (r < 0) return KILN_CLI_EXIT_USAGE;
            if (!kiln_cli_parse_int(val, 1, 2147483647, &min_count))
                return kiln_cli_usage_error(cmd, "--min-count needs a positive integer, got '%s'", val);
        } else {
            int k = 0;
            for (; k < 3; k++) {
                if ((r = kiln_cli_option(cmd, argc, argv, &i, thr_flags[k], &val)) == 0) continue;
                if (r < 0) return KILN_CLI_EXIT_USAGE;
                if (!parse_threshold(val, &thr[k]))
                    return kiln_cli_usage_error(cmd, "%s needs a positive number, got '%s'",
                                                thr_flags[k], val);
                break;
            }
            if (k == 3) return kiln_cli_usage_error(cmd, "unknown option '%s'", argv[i]);
        }
    }
    if (!model_path) return kiln_cli_usage_error(cmd, "missing MODEL");
    if (!data || !*data) return kiln_cli_usage_error(cmd, "missing --data DATA");
    if (!outp || !*outp) return kiln_cli_usage_error(cmd, "missing -o FILE");
    struct stat st;
    if (stat(data, &st) != 0) return kiln_cli_fail("--data %s: %s", data, strerror(errno));
    size_t dl = strlen(data);
    kiln_npz *npz = NULL;
    char nerr[KILN_NPZ_ERR_LEN];
    if (!S_ISDIR(st.st_mode) && dl > 4 && strcmp(data + dl - 4, ".npz") == 0 &&
        kiln_npz_read(data, &npz, nerr) != KILN_OK)
        return kiln_cli_fail("--data %s", nerr);

    kiln_model *m = kiln_cli_load_model(model_path, tags);
    if (!m) {
        kiln_npz_free(npz);
        return KILN_CLI_EXIT_FAIL;
    }
    profiler p;
    memset(&p, 0, sizeof p);
    p.top_k = top_k;
    int rc = -1;
    p.sig = kiln_model_find_signature(m, sig_name);
    if (!p.sig) rc = kiln_cli_fail("%s: no signature '%s'", model_path, sig_name ? sig_name : "(default)");
    else if ((p.n_in = kiln_signature_input_count(p.sig)) < 1 || p.n_in > 64)
        rc = kiln_cli_fail("%s: signature '%s' has %d inputs (1 to 64 are profiled)", model_path,
                           kiln_signature_name(p.sig), p.n_in);
    else if (kiln_session_create(m, kiln_signature_name(p.sig), NULL, &p.sess) != KILN_OK)
        rc = kiln_cli_fail("%s: %s", model_path, kiln_last_error());
    if (rc < 0)
        rc = S_ISDIR(st.st_mode) || npz ? run_npy_folder(&p, data, npz, batch)
             : looks_like_json(data)    ? run_jsonl(&p, data)
                                        : run_warmup(&p, data);
    kiln_npz_free(npz);

    kiln_mon_profile *prof = rc < 0 ? kiln_mon_profile_new() : NULL;
    if (rc < 0 && !prof) rc = kiln_cli_fail("out of memory");
    if (rc < 0) {
        prof->rows = p.rows;
        prof->psi_threshold = thr[0];
        prof->js_threshold = thr[1];
        prof->linf_threshold = thr[2];
        prof->window_seconds = window_s;
        prof->sub_windows = sub_windows;
        prof->min_count = min_count;
        prof->features = calloc((size_t)p.n_feats + 1, sizeof *prof->features);
        prof->outputs = calloc(2, sizeof *prof->outputs);
        if (!prof->features || !prof->outputs) rc = kiln_cli_fail("out of memory");
        for (int k = 0; rc < 0 && k < p.n_feats; k++) {
            if (!finish_feature(&p.feats[k], top_k)) rc = kiln_cli_fail("out of memory");
            prof->features[k] = p.feats[k].f; /* the value strings move into the profile */
            memset(p.feats[k].f.values, 0, sizeof p.feats[k].f.values);
            prof->n_features = k + 1;
        }
        for (int j = 0; rc < 0 && j < p.n_outs; j++) {
            out_acc *o = &p.outs[j];
            if (!o->candidate || o->rows == 0) continue;
            kiln_mon_output *po = &prof->outputs[0];
            snprintf(po->name, sizeof po->name, "%s", o->name);
            po->count = o->rows;
            po->mean_max_probability = o->sum_max / (double)o->rows;
            for (int k = 0; k < KILN_MON_CONF_BUCKETS; k++) po->max_probability[k] = o->hist[k];
            prof->n_outputs = 1; /* the first probability output is monitored */
            break;
        }
    }
    if (rc < 0) {
        kiln_sbuf b = {0};
        kiln_mon_profile_write(prof, &b);
        FILE *f = b.oom ? NULL : fopen(outp, "wb");
        if (!f || fwrite(b.p, 1, b.len, f) != b.len || fclose(f) != 0)
            rc = kiln_cli_fail("-o %s: cannot write: %s", outp, b.oom ? "out of memory" : strerror(errno));
        else
            fprintf(stderr, "kiln profile: %lld samples, %d features, %s; wrote %s\n",
                    (long long)p.rows, prof->n_features,
                    prof->n_outputs ? "probability output monitored" : "no probability output",
                    outp);
        kiln_sbuf_free(&b);
        if (rc < 0) rc = KILN_CLI_EXIT_OK;
    }
    kiln_mon_profile_free(prof);
    for (int k = 0; k < p.n_feats; k++) {
        free(p.feats[k].x);
        for (size_t i = 0; i < p.feats[k].ns; i++) free(p.feats[k].s[i].data);
        free(p.feats[k].s);
        for (int v = 0; v < p.feats[k].f.n_values; v++) free(p.feats[k].f.values[v]);
    }
    free(p.feats);
    free(p.cols);
    free(p.outs);
    kiln_session_free(p.sess);
    kiln_model_free(m);
    return rc;
}
