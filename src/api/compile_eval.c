/*
 * compile_eval.c - the measurements shared by `kiln compile`, `kiln gate`
 * and `kiln serve --allow_compression` (kiln.h, "Evaluating and compiling
 * with an accuracy bound"): batches cut from a data set, one output of a
 * session over the whole data set as doubles, and the quality comparison
 * of a candidate with a baseline. The policy that uses them is compile.c.
 *
 * Quality (docs/RELEASE_GATE.md has the same rules in prose):
 *   kind        integer output with one value per sample: class ids;
 *               float output with several values per sample: class scores,
 *               the class is the first index of the maximum (numpy argmax),
 *               unless labels give as many values per sample (then targets);
 *               anything else: regression values.
 *   labels      class kinds with one label per sample: accuracy, and the
 *               drop is (acc_b - acc_c) / acc_b. Otherwise the labels must
 *               hold as many values per sample as the output: RMSE and MAE,
 *               and the drop is (rmse_c - rmse_b) / rmse_b.
 *   no labels   class kinds: the drop is 1 - top-1 agreement; values: the
 *               drop is the mean relative difference, mean |c-b| / max(|b|, 1e-6).
 * Output distance (mean and max absolute, mean relative difference) is
 * reported in every case. A NaN anywhere makes a metric NaN, which fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define REL_FLOOR 1e-6

kiln_status kiln_dataset_rows(const kiln_dataset *d, int64_t start, int64_t count,
                                kiln_tensor **rows, char *err)
{
    for (int i = 0; i < d->n; i++) rows[i] = NULL;
    for (int i = 0; i < d->n; i++) {
        const kiln_tensor *t = d->t[i];
        int64_t dims[KILN_MAX_RANK];
        memcpy(dims, t->dims, sizeof dims);
        dims[0] = count;
        kiln_status st = kiln_tensor_create(t->dtype, t->rank, dims, &rows[i]);
        for (int64_t done = 0; st == KILN_OK && done < count;) {
            int64_t from = (start + done) % d->samples;
            int64_t k = d->samples - from < count - done ? d->samples - from : count - done;
            st = kiln_tensor_copy_rows(rows[i], done, t, from, k);
            done += k;
        }
        if (st != KILN_OK) {
            snprintf(err, KILN_EVAL_ERR_LEN, "input '%.200s': cannot make a batch of %lld: %s",
                     d->names[i], (long long)count, kiln_status_name(st));
            for (int k = 0; k <= i; k++) {
                kiln_tensor_free(rows[k]);
                rows[k] = NULL;
            }
            return st;
        }
    }
    return KILN_OK;
}


void kiln_eval_output_free(kiln_eval_output *o)
{
    free(o->v);
    memset(o, 0, sizeof *o);
}

/* Element i of t as a double; 0 for a dtype the gate does not compare. */
static int is_int_dtype(kiln_dtype dt)
{
    switch (dt) {
    case KILN_DTYPE_I8: case KILN_DTYPE_U8: case KILN_DTYPE_I16: case KILN_DTYPE_U16:
    case KILN_DTYPE_I32: case KILN_DTYPE_U32: case KILN_DTYPE_I64: case KILN_DTYPE_U64:
    case KILN_DTYPE_BOOL: return 1;
    default: return 0;
    }
}

static int to_doubles(const kiln_tensor *t, double *out, int64_t n)
{
    const void *p = t->data;
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case KILN_DTYPE_F32: out[i] = ((const float *)p)[i]; break;
        case KILN_DTYPE_F64: out[i] = ((const double *)p)[i]; break;
        case KILN_DTYPE_I8: out[i] = ((const int8_t *)p)[i]; break;
        case KILN_DTYPE_U8: case KILN_DTYPE_BOOL: out[i] = ((const uint8_t *)p)[i]; break;
        case KILN_DTYPE_I16: out[i] = ((const int16_t *)p)[i]; break;
        case KILN_DTYPE_U16: out[i] = ((const uint16_t *)p)[i]; break;
        case KILN_DTYPE_I32: out[i] = ((const int32_t *)p)[i]; break;
        case KILN_DTYPE_U32: out[i] = ((const uint32_t *)p)[i]; break;
        case KILN_DTYPE_I64: out[i] = (double)((const int64_t *)p)[i]; break;
        case KILN_DTYPE_U64: out[i] = (double)((const uint64_t *)p)[i]; break;
        default: return 0;
        }
    }
    return 1;
}

kiln_status kiln_eval_collect(kiln_session *s, const kiln_dataset *d, const char *output,
                              int64_t batch, kiln_eval_output *out, char *err)
{
    memset(out, 0, sizeof *out);
    kiln_tensor **rows = calloc((size_t)d->n, sizeof *rows);
    kiln_named_tensor *in = calloc((size_t)d->n, sizeof *in);
    kiln_status st = KILN_OK;
    if (!rows || !in) {
        snprintf(err, KILN_EVAL_ERR_LEN, "out of memory");
        st = KILN_ERR_OUT_OF_MEMORY;
        goto out;
    }
    out->samples = d->samples;
    for (int64_t start = 0; start < d->samples && st == KILN_OK; start += batch) {
        int64_t count = d->samples - start < batch ? d->samples - start : batch;
        st = kiln_dataset_rows(d, start, count, rows, err);
        if (st != KILN_OK) break;
        for (int i = 0; i < d->n; i++) in[i] = (kiln_named_tensor){d->names[i], rows[i]};
        kiln_outputs *o = NULL;
        st = kiln_session_run(s, in, d->n, &o);
        for (int i = 0; i < d->n; i++) kiln_tensor_free(rows[i]);
        if (st != KILN_OK) {
            snprintf(err, KILN_EVAL_ERR_LEN, "run on samples %lld..%lld: %.400s", (long long)start,
                     (long long)(start + count - 1), kiln_last_error());
            break;
        }
        const kiln_tensor *t = NULL;
        for (int k = 0; k < kiln_outputs_count(o); k++)
            if (strcmp(kiln_outputs_name(o, k), output) == 0) t = kiln_outputs_get(o, k);
        if (!t) {
            snprintf(err, KILN_EVAL_ERR_LEN, "the model has no output '%.200s'", output);
            st = KILN_ERR_NOT_FOUND;
        } else if (t->rank < 1 || t->dims[0] != count) {
            snprintf(err, KILN_EVAL_ERR_LEN,
                     "output '%.200s' does not have one row per sample (%lld samples in, first "
                     "dimension %lld out)",
                     output, (long long)count, t->rank ? (long long)t->dims[0] : 0LL);
            st = KILN_ERR_INVALID_ARGUMENT;
        } else {
            int64_t rs = kiln_tensor_count(t) / count;
            if (!out->v) {
                out->row_size = rs;
                out->is_int = is_int_dtype(t->dtype);
                out->v = malloc(sizeof(double) * (size_t)(d->samples * (rs ? rs : 1)));
                if (!out->v) {
                    snprintf(err, KILN_EVAL_ERR_LEN, "out of memory");
                    st = KILN_ERR_OUT_OF_MEMORY;
                }
            } else if (rs != out->row_size) {
                snprintf(err, KILN_EVAL_ERR_LEN, "output '%.200s' changed its row size", output);
                st = KILN_ERR_INVALID_ARGUMENT;
            }
            if (st == KILN_OK && !to_doubles(t, out->v + start * rs, count * rs)) {
                snprintf(err, KILN_EVAL_ERR_LEN,
                         "output '%.200s' is %s; kiln gate compares numeric outputs", output,
                         kiln_dtype_name(t->dtype));
                st = KILN_ERR_UNSUPPORTED;
            }
        }
        kiln_outputs_free(o);
    }
out:
    free(rows);
    free(in);
    if (st != KILN_OK) kiln_eval_output_free(out);
    return st;
}

double kiln_eval_top1(const kiln_eval_output *o, int64_t i)
{
    const double *r = o->v + i * o->row_size;
    if (o->row_size == 1) return r[0];
    int64_t best = 0;
    for (int64_t k = 1; k < o->row_size; k++)
        if (r[k] > r[best] || (isnan(r[k]) && !isnan(r[best]))) best = k;
    return (double)best;
}

kiln_status kiln_eval_compare(const kiln_eval_output *b, const kiln_eval_output *c,
                              const kiln_tensor *labels, kiln_eval_quality *q, char *err)
{
    memset(q, 0, sizeof *q);
    if (b->samples != c->samples || b->row_size != c->row_size) {
        snprintf(err, KILN_EVAL_ERR_LEN,
                 "output shape mismatch: the candidate gives %lld values per sample, the baseline "
                 "%lld",
                 (long long)c->row_size, (long long)b->row_size);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    int64_t n = b->samples, rs = b->row_size;
    q->samples = n;
    q->row_size = rs;
    q->kind = c->is_int && rs == 1 ? KILN_EVAL_CLASS_IDS
              : !c->is_int && rs > 1 ? KILN_EVAL_SCORES
                                     : KILN_EVAL_VALUES;
    /* several float values per sample with as many labels: regression targets */
    if (q->kind == KILN_EVAL_SCORES && labels && labels->rank >= 1 && labels->dims[0] > 0 &&
        kiln_tensor_count(labels) / labels->dims[0] == rs)
        q->kind = KILN_EVAL_VALUES;
    /* distance and agreement */
    double sum_abs = 0, sum_rel = 0, max_abs = 0;
    int64_t agree = 0;
    for (int64_t i = 0; i < n * rs; i++) {
        double diff = fabs(c->v[i] - b->v[i]);
        sum_abs += diff;
        sum_rel += diff / fmax(fabs(b->v[i]), REL_FLOOR);
        if (diff > max_abs || isnan(diff)) max_abs = diff;
    }
    q->mean_abs_diff = n * rs > 0 ? sum_abs / (double)(n * rs) : 0;
    q->mean_rel_diff = n * rs > 0 ? sum_rel / (double)(n * rs) : 0;
    q->max_abs_diff = max_abs;
    if (q->kind != KILN_EVAL_VALUES) {
        for (int64_t i = 0; i < n; i++) agree += kiln_eval_top1(c, i) == kiln_eval_top1(b, i);
        q->has_agreement = 1;
        q->agreement = n ? (double)agree / (double)n : 1;
    }
    if (!labels) {
        q->drop_of = q->has_agreement ? "disagreement (1 - top-1 agreement)" : "mean relative difference";
        q->drop = q->has_agreement ? 1 - q->agreement : q->mean_rel_diff;
        return KILN_OK;
    }
    int64_t ln = labels->rank ? labels->dims[0] : 1;
    int64_t lrs = ln ? kiln_tensor_count(labels) / ln : 0;
    if (ln != n) {
        snprintf(err, KILN_EVAL_ERR_LEN, "--labels has %lld samples, the data %lld", (long long)ln,
                 (long long)n);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    double *lv = malloc(sizeof(double) * (size_t)(n * (lrs ? lrs : 1)));
    if (!lv) {
        snprintf(err, KILN_EVAL_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    if (!to_doubles(labels, lv, n * lrs)) {
        free(lv);
        snprintf(err, KILN_EVAL_ERR_LEN, "--labels is %s; labels must be numeric",
                 kiln_dtype_name(labels->dtype));
        return KILN_ERR_INVALID_ARGUMENT;
    }
    q->has_labels = 1;
    if (q->kind != KILN_EVAL_VALUES && lrs == 1) {
        int64_t hit_b = 0, hit_c = 0;
        for (int64_t i = 0; i < n; i++) {
            hit_b += kiln_eval_top1(b, i) == lv[i];
            hit_c += kiln_eval_top1(c, i) == lv[i];
        }
        q->metric = "accuracy";
        q->base_metric = n ? (double)hit_b / (double)n : 0;
        q->cand_metric = n ? (double)hit_c / (double)n : 0;
        q->drop_of = "relative accuracy drop";
        q->drop = q->base_metric > 0 ? (q->base_metric - q->cand_metric) / q->base_metric
                                     : (q->cand_metric >= q->base_metric ? 0 : INFINITY);
    } else if (lrs == rs) {
        double se_b = 0, se_c = 0, ae_b = 0, ae_c = 0;
        for (int64_t i = 0; i < n * rs; i++) {
            double eb = b->v[i] - lv[i], ec = c->v[i] - lv[i];
            se_b += eb * eb;
            se_c += ec * ec;
            ae_b += fabs(eb);
            ae_c += fabs(ec);
        }
        double m = (double)(n * rs);
        q->metric = "rmse";
        q->base_metric = sqrt(se_b / m);
        q->cand_metric = sqrt(se_c / m);
        q->base_mae = ae_b / m;
        q->cand_mae = ae_c / m;
        q->drop_of = "relative RMSE increase";
        q->drop = q->base_metric > 0 ? (q->cand_metric - q->base_metric) / q->base_metric
                                     : (q->cand_metric > 0 ? INFINITY : 0);
    } else {
        free(lv);
        snprintf(err, KILN_EVAL_ERR_LEN,
                 "--labels has %lld values per sample; the output has %lld (class labels need 1 "
                 "per sample, regression targets as many as the output)",
                 (long long)lrs, (long long)rs);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    free(lv);
    return KILN_OK;
}