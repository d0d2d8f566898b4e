/*
 * ml.c - reference kernels for the ai.onnx.ml operators other than the tree
 * ensembles (trees.c): LinearClassifier, LinearRegressor, SVMClassifier,
 * SVMRegressor, Scaler, Normalizer, Imputer, Binarizer, OneHotEncoder,
 * LabelEncoder, ArrayFeatureExtractor, CategoryMapper, FeatureVectorizer and
 * ZipMap.
 *
 * Semantics are those of the ONNX-ML specification as ONNX Runtime and the
 * ONNX reference implementation compute them (docs/TABULAR.md): features are
 * the last axis of X ([N, C], or [C] for one row), scores are float, labels
 * int64 or string after classlabels_int64s / classlabels_strings.
 *
 * ZipMap's output is a sequence of maps (label -> probability) in ONNX. Kiln
 * has no map type: ZipMap passes its [N, C] probability tensor through, its
 * columns in the order of the node's classlabels_int64s / _strings (the order
 * of the classifier's labels), and the serving formats return that matrix
 * (docs/TABULAR.md).
 */
#include <float.h>
#include <stdlib.h>

#include "kernels/ref/trees.h"

/* ---- helpers ---- */

/* Rows and columns of a feature input: [N, C], or [C] as one row. */
static kiln_status rows_cols(const struct kiln_node *n, const kiln_tensor *x, int64_t *rows,
                             int64_t *cols)
{
    if (x->rank > 2)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X must be [N, C] or [C], got rank %d",
                               x->rank);
    if (!kiln_dtype_is_float(x->dtype) && !kiln_dtype_is_int(x->dtype))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has dtype %s",
                               kiln_dtype_name(x->dtype));
    *rows = x->rank == 2 ? x->dims[0] : 1;
    *cols = x->rank == 0 ? 1 : x->dims[x->rank - 1];
    return KILN_OK;
}

/* Rows of a static type ([N, C] -> N, [C] -> 1, unknown -> -1). */
static int64_t type_rows(const struct kiln_type *x)
{
    if (!x || x->rank < 0) return -1;
    return x->rank == 2 ? x->dims[0] : 1;
}

static kiln_string str_or_empty(kiln_string s)
{
    if (!s.data) {
        s.data = "";
        s.len = 0;
    }
    return s;
}

static bool str_eq(kiln_string a, kiln_string b)
{
    a = str_or_empty(a);
    b = str_or_empty(b);
    return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

/* Class labels of a classifier: strings or ints; count 0 if neither. */
struct labels {
    int n;
    const int64_t *ints;
    const kiln_string *strs;
};

static void read_labels(const struct kiln_node *n, const char *ints_name, struct labels *l)
{
    memset(l, 0, sizeof *l);
    const struct kiln_attr *s = kiln_node_attr(n, "classlabels_strings");
    if (s && s->type == KILN_ATTR_STRINGS && s->n > 0) {
        l->strs = s->strings;
        l->n = s->n;
        return;
    }
    int c = kiln_attr_ints(n, ints_name, &l->ints);
    l->n = c > 0 ? c : 0;
    if (c <= 0) l->ints = NULL;
}

static kiln_status store_label(kiln_tensor *y, int64_t r, const struct labels *l, int64_t idx)
{
    if (!y) return KILN_OK;
    if (y->dtype == KILN_DTYPE_STRING) {
        kiln_string s = {0, ""};
        if (l->strs && idx >= 0 && idx < l->n) s = str_or_empty(l->strs[idx]);
        return kiln_tensor_set_string(y, (size_t)r, s.data, s.len);
    }
    ((int64_t *)y->data)[r] = l->ints && idx >= 0 && idx < l->n ? l->ints[idx] : idx;
    return KILN_OK;
}

/* ---- LinearClassifier ---- */

/* A classifier's output types: labels [N] (strings or int64, as its labels
 * are) and scores [N, cols] float. */
static kiln_status classifier_types(struct kiln_infer_ctx *ctx, const struct labels *l,
                                    int64_t cols)
{
    int64_t d[2] = {type_rows(ctx->in[0]), cols};
    if (ctx->out[0]) kiln_type_set(ctx->out[0], l->strs ? KILN_DTYPE_STRING : KILN_DTYPE_I64, 1, d);
    if (ctx->n_out > 1 && ctx->out[1]) kiln_type_set(ctx->out[1], KILN_DTYPE_F32, 2, d);
    return KILN_OK;
}

static kiln_status linclass_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    struct labels l;
    read_labels(n, "classlabels_ints", &l);
    const float *coef, *icpt;
    int nc = kiln_attr_floats(n, "coefficients", &coef);
    int ni = kiln_attr_floats(n, "intercepts", &icpt);
    if (nc <= 0) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "coefficients are missing");
    int64_t k = ni > 0 ? ni : (l.n > 0 ? l.n : 1);
    int64_t cols = k == 1 && l.n == 2 ? 2 : k;
    return classifier_types(ctx, &l, cols);
}

static kiln_status linclass_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    int64_t rows, c;
    kiln_status st = rows_cols(n, x, &rows, &c);
    if (st != KILN_OK) return st;
    struct labels l;
    read_labels(n, "classlabels_ints", &l);
    const float *coef, *icpt = NULL;
    int nc = kiln_attr_floats(n, "coefficients", &coef);
    int ni = kiln_attr_floats(n, "intercepts", &icpt);
    int post;
    if ((st = kiln_ml_post_attr(n, &post)) != KILN_OK) return st;
    int64_t k = ni > 0 ? ni : (l.n > 0 ? l.n : 1);
    if (c == 0 || nc != k * c)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "coefficients has %d values, expected %lld classes x %lld features",
                               nc, (long long)k, (long long)c);
    int64_t cols = k == 1 && l.n == 2 ? 2 : k;
    double *s = malloc(sizeof(double) * (size_t)(cols + 1));
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    kiln_tensor *z = ctx->n_out > 1 ? ctx->out[1] : NULL;
    for (int64_t r = 0; r < rows && st == KILN_OK; r++) {
        for (int64_t j = 0; j < k; j++) {
            double acc = ni > 0 ? icpt[j] : 0.0;
            for (int64_t i = 0; i < c; i++)
                acc += (double)(float)kiln_get_f64(x->dtype, x->data, r * c + i) * coef[j * c + i];
            s[j] = acc;
        }
        if (cols == 2 && k == 1) {
            s[1] = s[0];
            s[0] = -s[1];
        }
        kiln_ml_post_transform(post, s, cols);
        if (cols > 1) {
            int64_t idx = 0;
            for (int64_t j = 1; j < cols; j++)
                if (s[j] > s[idx]) idx = j;
            st = store_label(ctx->out[0], r, &l, idx);
        } else if (ctx->out[0]) {
            /* one score: the first label when it passes the threshold, else 0 / "" */
            bool pos = s[0] >= (post == KILN_POST_NONE ? 0.0 : 0.5);
            if (ctx->out[0]->dtype == KILN_DTYPE_STRING)
                st = pos && l.strs ? store_label(ctx->out[0], r, &l, 0)
                                   : kiln_tensor_set_string(ctx->out[0], (size_t)r, "", 0);
            else
                ((int64_t *)ctx->out[0]->data)[r] = pos ? (l.ints ? l.ints[0] : 1) : 0;
        }
        if (z)
            for (int64_t j = 0; j < cols; j++) ((float *)z->data)[r * cols + j] = (float)s[j];
    }
    free(s);
    return st;
}

KILN_REF_OP(LinearClassifier, linclass_infer, linclass_run);

/* ---- LinearRegressor ---- */

static kiln_status linreg_infer(struct kiln_infer_ctx *ctx)
{
    int64_t t = kiln_attr_int(ctx->node, "targets", 1);
    if (t < 1) return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "targets is %lld", (long long)t);
    int64_t d[2] = {type_rows(ctx->in[0]), t};
    if (ctx->out[0]) kiln_type_set(ctx->out[0], KILN_DTYPE_F32, 2, d);
    return KILN_OK;
}

static kiln_status linreg_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    int64_t rows, c;
    kiln_status st = rows_cols(n, x, &rows, &c);
    if (st != KILN_OK) return st;
    int64_t t = kiln_attr_int(n, "targets", 1);
    const float *coef, *icpt = NULL;
    int nc = kiln_attr_floats(n, "coefficients", &coef);
    int ni = kiln_attr_floats(n, "intercepts", &icpt);
    int post;
    if ((st = kiln_ml_post_attr(n, &post)) != KILN_OK) return st;
    if (nc != t * c || (ni > 0 && ni != t))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "coefficients has %d values and intercepts %d, expected %lld x %lld "
                               "and %lld", nc, ni, (long long)t, (long long)c, (long long)t);
    double *s = malloc(sizeof(double) * (size_t)(t + 1));
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    float *y = ctx->out[0]->data;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t j = 0; j < t; j++) {
            double acc = ni > 0 ? icpt[j] : 0.0;
            for (int64_t i = 0; i < c; i++)
                acc += (double)(float)kiln_get_f64(x->dtype, x->data, r * c + i) * coef[j * c + i];
            s[j] = acc;
        }
        kiln_ml_post_transform(post, s, t);
        for (int64_t j = 0; j < t; j++) y[r * t + j] = (float)s[j];
    }
    free(s);
    return KILN_OK;
}

KILN_REF_OP(LinearRegressor, linreg_infer, linreg_run);

/* ---- SVMs ---- */

enum { SVM_LINEAR, SVM_POLY, SVM_RBF, SVM_SIGMOID };

struct svm {
    int kernel;
    double gamma, coef0, degree;
    int n_coef, n_sv, n_rho, n_pa, n_pb;
    const float *coef, *sv, *rho, *prob_a, *prob_b;
    int post;
};

static kiln_status svm_parse(const struct kiln_node *n, struct svm *s)
{
    memset(s, 0, sizeof *s);
    const char *k = kiln_attr_str(n, "kernel_type", "LINEAR");
    s->kernel = strcmp(k, "LINEAR") == 0 ? SVM_LINEAR : strcmp(k, "POLY") == 0 ? SVM_POLY
                : strcmp(k, "RBF") == 0 ? SVM_RBF : strcmp(k, "SIGMOID") == 0 ? SVM_SIGMOID : -1;
    if (s->kernel < 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "kernel_type is '%s'", k);
    const float *kp;
    int nkp = kiln_attr_floats(n, "kernel_params", &kp);
    s->gamma = nkp > 0 ? kp[0] : 0.0;
    s->coef0 = nkp > 1 ? kp[1] : 0.0;
    s->degree = nkp > 2 ? kp[2] : 0.0;
    s->n_coef = kiln_attr_floats(n, "coefficients", &s->coef);
    s->n_sv = kiln_attr_floats(n, "support_vectors", &s->sv);
    s->n_rho = kiln_attr_floats(n, "rho", &s->rho);
    s->n_pa = kiln_attr_floats(n, "prob_a", &s->prob_a);
    s->n_pb = kiln_attr_floats(n, "prob_b", &s->prob_b);
    if (s->n_coef < 0) s->n_coef = 0;
    if (s->n_sv < 0) s->n_sv = 0;
    if (s->n_rho < 0) s->n_rho = 0;
    if (s->n_pa < 0) s->n_pa = 0;
    if (s->n_pb < 0) s->n_pb = 0;
    if (s->n_coef == 0 || s->n_rho == 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "coefficients and rho are required");
    return kiln_ml_post_attr(n, &s->post);
}

/* K(x, v) over c features; x is one row as doubles. */
static double svm_kernel(const struct svm *s, const double *x, const float *v, int64_t c)
{
    double acc = 0;
    if (s->kernel == SVM_RBF) {
        for (int64_t i = 0; i < c; i++) acc += (x[i] - v[i]) * (x[i] - v[i]);
        return exp(-s->gamma * acc);
    }
    for (int64_t i = 0; i < c; i++) acc += x[i] * v[i];
    if (s->kernel == SVM_POLY) return pow(s->gamma * acc + s->coef0, s->degree);
    if (s->kernel == SVM_SIGMOID) return tanh(s->gamma * acc + s->coef0);
    return acc;
}

static double *row_doubles(const kiln_tensor *x, int64_t r, int64_t c, double *buf)
{
    for (int64_t i = 0; i < c; i++) buf[i] = (float)kiln_get_f64(x->dtype, x->data, r * c + i);
    return buf;
}

static kiln_status svmreg_infer(struct kiln_infer_ctx *ctx)
{
    int64_t d[2] = {type_rows(ctx->in[0]), 1};
    if (ctx->out[0]) kiln_type_set(ctx->out[0], KILN_DTYPE_F32, 2, d);
    return KILN_OK;
}

static kiln_status svmreg_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    int64_t rows, c;
    kiln_status st = rows_cols(n, x, &rows, &c);
    if (st != KILN_OK) return st;
    struct svm s;
    if ((st = svm_parse(n, &s)) != KILN_OK) return st;
    int64_t nsup = kiln_attr_int(n, "n_supports", 0);
    int one_class = (int)kiln_attr_int(n, "one_class", 0);
    if (nsup > 0 ? (s.n_sv != nsup * c || s.n_coef < nsup) : s.n_coef < c)
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "%lld support vectors of %lld features need %lld values; "
                               "support_vectors has %d, coefficients %d", (long long)nsup,
                               (long long)c, (long long)(nsup * c), s.n_sv, s.n_coef);
    double *buf = malloc(sizeof(double) * (size_t)(c + 1));
    if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    float *y = ctx->out[0]->data;
    for (int64_t r = 0; r < rows; r++) {
        row_doubles(x, r, c, buf);
        double acc = 0;
        if (nsup > 0) {
            for (int64_t j = 0; j < nsup; j++) acc += s.coef[j] * svm_kernel(&s, buf, s.sv + j * c, c);
        } else {
            struct svm lin = s;
            lin.kernel = SVM_LINEAR;
            acc = svm_kernel(&lin, buf, s.coef, c);
        }
        acc += s.rho[0];
        if (one_class) acc = acc > 0 ? 1.0 : -1.0;
        kiln_ml_post_transform(s.post, &acc, 1);
        y[r] = (float)acc;
    }
    free(buf);
    return KILN_OK;
}

KILN_REF_OP(SVMRegressor, svmreg_infer, svmreg_run);

/* libsvm's pairwise coupling of the one-vs-one probabilities r[k][k]. */
static void svm_multiclass_prob(int k, const double *r, double *p, double *q, double *qp)
{
    int max_iter = k > 100 ? k : 100;
    double eps = 0.005 / k;
    for (int t = 0; t < k; t++) {
        p[t] = 1.0 / k;
        q[t * k + t] = 0;
        for (int j = 0; j < t; j++) {
            q[t * k + t] += r[j * k + t] * r[j * k + t];
            q[t * k + j] = q[j * k + t];
        }
        for (int j = t + 1; j < k; j++) {
            q[t * k + t] += r[j * k + t] * r[j * k + t];
            q[t * k + j] = -r[j * k + t] * r[t * k + j];
        }
    }
    for (int it = 0; it < max_iter; it++) {
        double pqp = 0;
        for (int t = 0; t < k; t++) {
            qp[t] = 0;
            for (int j = 0; j < k; j++) qp[t] += q[t * k + j] * p[j];
            pqp += p[t] * qp[t];
        }
        double max_err = 0;
        for (int t = 0; t < k; t++) {
            double e = fabs(qp[t] - pqp);
            if (e > max_err) max_err = e;
        }
        if (max_err < eps) break;
        for (int t = 0; t < k; t++) {
            double diff = (-qp[t] + pqp) / q[t * k + t];
            p[t] += diff;
            pqp = (pqp + diff * (diff * q[t * k + t] + 2 * qp[t])) / (1 + diff) / (1 + diff);
            for (int j = 0; j < k; j++) {
                qp[j] = (qp[j] + diff * q[t * k + j]) / (1 + diff);
                p[j] /= 1 + diff;
            }
        }
    }
}

/* Classes, score columns and whether probabilities are computed. */
struct svc_shape {
    int64_t k, n_sv, cols;
    int proba, linear;
};

static kiln_status svc_shape(const struct kiln_node *n, const struct svm *s, const struct labels *l,
                             struct svc_shape *sh)
{
    const int64_t *vpc;
    int nv = kiln_attr_ints(n, "vectors_per_class", &vpc);
    sh->k = l->n > 0 ? l->n : 1;
    sh->n_sv = 0;
    for (int i = 0; i < nv; i++) {
        if (vpc[i] < 0) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "vectors_per_class has %lld",
                                               (long long)vpc[i]);
        sh->n_sv += vpc[i];
    }
    if (sh->n_sv > 0 && nv != sh->k)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "vectors_per_class has %d entries for %lld classes", nv,
                               (long long)sh->k);
    sh->linear = sh->n_sv == 0;
    sh->proba = !sh->linear && s->n_pa > 0;
    int64_t raw = sh->linear ? sh->k : sh->k * (sh->k - 1) / 2;
    int64_t cols = sh->proba ? sh->k : raw;
    /* one score with two labels is written as two columns */
    if (cols == 1 && l->n == 2 && s->post != KILN_POST_PROBIT) cols = 2;
    sh->cols = cols;
    return KILN_OK;
}

static kiln_status svmclass_infer(struct kiln_infer_ctx *ctx)
{
    struct svm s;
    kiln_status st = svm_parse(ctx->node, &s);
    if (st != KILN_OK) return st;
    struct labels l;
    read_labels(ctx->node, "classlabels_ints", &l);
    struct svc_shape sh;
    if ((st = svc_shape(ctx->node, &s, &l, &sh)) != KILN_OK) return st;
    return classifier_types(ctx, &l, sh.cols);
}

static kiln_status svmclass_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    int64_t rows, c;
    kiln_status st = rows_cols(n, x, &rows, &c);
    if (st != KILN_OK) return st;
    struct svm s;
    if ((st = svm_parse(n, &s)) != KILN_OK) return st;
    struct labels l;
    read_labels(n, "classlabels_ints", &l);
    struct svc_shape sh;
    if ((st = svc_shape(n, &s, &l, &sh)) != KILN_OK) return st;
    const int64_t *vpc;
    kiln_attr_ints(n, "vectors_per_class", &vpc);
    int64_t k = sh.k, pairs = k * (k - 1) / 2;
    if (sh.linear ? s.n_coef != k * c
                  : (s.n_sv != sh.n_sv * c || s.n_coef != (k - 1) * sh.n_sv || s.n_rho < pairs ||
                     (sh.proba && (s.n_pa < pairs || s.n_pb < pairs))))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "coefficients (%d), support_vectors (%d), rho (%d) or prob_a/b do "
                               "not fit %lld classes, %lld vectors and %lld features",
                               s.n_coef, s.n_sv, s.n_rho, (long long)k, (long long)sh.n_sv,
                               (long long)c);
    if (k > 4096) return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "%lld classes", (long long)k);
    size_t scratch = (size_t)(c + sh.n_sv + 2 * pairs + 3 * k + 2 * k * k + 4);
    double *buf = malloc(sizeof(double) * scratch);
    if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    double *xr = buf, *kern = xr + c, *scores = kern + sh.n_sv, *votes = scores + pairs + k + 2,
           *rr = votes + k, *q = rr + k * k, *qp = q + k * k;
    double *out = scores; /* final scores */
    kiln_tensor *z = ctx->n_out > 1 ? ctx->out[1] : NULL;
    int all_pos = 1;
    for (int i = 0; i < s.n_coef; i++) all_pos &= s.coef[i] >= 0;
    for (int64_t r = 0; r < rows && st == KILN_OK; r++) {
        row_doubles(x, r, c, xr);
        int64_t n_scores, best;
        double max_weight;
        if (sh.linear) {
            struct svm lin = s;
            lin.kernel = SVM_LINEAR;
            for (int64_t j = 0; j < k; j++) scores[j] = s.rho[0] + svm_kernel(&lin, xr, s.coef + j * c, c);
            n_scores = k;
            best = 0;
            for (int64_t j = 1; j < k; j++)
                if (scores[j] > scores[best]) best = j;
            max_weight = scores[best];
        } else {
            for (int64_t j = 0; j < sh.n_sv; j++) kern[j] = svm_kernel(&s, xr, s.sv + j * c, c);
            for (int64_t j = 0; j < k; j++) votes[j] = 0;
            int64_t e = 0, si = 0;
            for (int64_t i = 0; i < k; i++) {
                int64_t sj = si + vpc[i];
                for (int64_t j = i + 1; j < k; j++) {
                    double acc = s.rho[e];
                    for (int64_t m = 0; m < vpc[i]; m++)
                        acc += s.coef[(j - 1) * sh.n_sv + si + m] * kern[si + m];
                    for (int64_t m = 0; m < vpc[j]; m++)
                        acc += s.coef[i * sh.n_sv + sj + m] * kern[sj + m];
                    scores[e++] = acc;
                    votes[acc > 0 ? i : j] += 1;
                    sj += vpc[j];
                }
                si += vpc[i];
            }
            n_scores = pairs;
            if (sh.proba) {
                int64_t idx = 0;
                for (int64_t i = 0; i < k; i++) {
                    rr[i * k + i] = 0;
                    for (int64_t j = i + 1; j < k; j++, idx++) {
                        double v = scores[idx] * s.prob_a[idx] + s.prob_b[idx];
                        double lg = 1.0 / (1.0 + exp(-fabs(v)));
                        lg = v < 0 ? 1.0 - lg : lg;
                        double p = 1.0 - lg;
                        p = p < 1e-7 ? 1e-7 : p > 1 - 1e-7 ? 1 - 1e-7 : p;
                        rr[i * k + j] = p;
                        rr[j * k + i] = 1 - p;
                    }
                }
                svm_multiclass_prob((int)k, rr, scores, q, qp);
                n_scores = k;
            }
            best = 0;
            for (int64_t j = 1; j < k; j++)
                if (votes[j] > votes[best]) best = j;
            max_weight = votes[best];
        }
        /* the label (ONNX Runtime's rules for one decision function) */
        int64_t label_idx = best;
        if (s.n_rho == 1 && l.n == 2 && !sh.linear) {
            if (!sh.proba && all_pos && max_weight >= 0.5) label_idx = 1;
        } else if (s.n_rho == 1 && l.n != 2 && n_scores == 1) {
            label_idx = max_weight > 0 ? 1 : 0; /* positive / negative class */
        }
        /* final scores */
        int64_t cols = sh.cols;
        if (n_scores == 1 && cols == 2) {
            double v = scores[0];
            out[0] = -v;
            out[1] = v;
            if (s.post == KILN_POST_LOGISTIC || s.post == KILN_POST_SOFTMAX ||
                s.post == KILN_POST_SOFTMAX_ZERO)
                kiln_ml_post_transform(s.post, out, 2);
        } else {
            kiln_ml_post_transform(s.post, scores, n_scores);
        }
        st = store_label(ctx->out[0], r, &l, label_idx);
        if (z)
            for (int64_t j = 0; j < cols; j++) ((float *)z->data)[r * cols + j] = (float)out[j];
    }
    free(buf);
    return st;
}

KILN_REF_OP(SVMClassifier, svmclass_infer, svmclass_run);

/* ---- Scaler, Normalizer, Binarizer, Imputer ---- */

static kiln_status float_same_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = kiln_infer_same(ctx);
    if (st == KILN_OK && ctx->out[0]) ctx->out[0]->dtype = KILN_DTYPE_F32;
    return st;
}

static kiln_status scaler_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    int64_t rows, c;
    kiln_status st = rows_cols(n, x, &rows, &c);
    if (st != KILN_OK && x->rank > 2) {
        kiln_error_clear();
        c = x->dims[x->rank - 1];
        rows = kiln_tensor_count(x) / (c ? c : 1);
    } else if (st != KILN_OK) {
        return st;
    }
    const float *off, *sc;
    int no = kiln_attr_floats(n, "offset", &off), ns = kiln_attr_floats(n, "scale", &sc);
    if ((no > 1 && no != c) || (ns > 1 && ns != c))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "offset has %d values and scale %d, expected 1 or %lld", no, ns,
                               (long long)c);
    float *y = ctx->out[0]->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < c; i++) {
            float o = no <= 0 ? 0.0f : off[no == 1 ? 0 : i];
            float s = ns <= 0 ? 1.0f : sc[ns == 1 ? 0 : i];
            y[r * c + i] = ((float)kiln_get_f64(x->dtype, x->data, r * c + i) - o) * s;
        }
    return KILN_OK;
}

KILN_REF_OP(Scaler, float_same_infer, scaler_run);

static kiln_status normalizer_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    int64_t rows, c;
    kiln_status st = rows_cols(n, x, &rows, &c);
    if (st != KILN_OK) return st;
    const char *norm = kiln_attr_str(n, "norm", "MAX");
    int kind = strcmp(norm, "MAX") == 0 ? 0 : strcmp(norm, "L1") == 0 ? 1 : strcmp(norm, "L2") == 0 ? 2 : -1;
    if (kind < 0) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "norm is '%s', expected MAX, L1 or L2", norm);
    float *y = ctx->out[0]->data;
    for (int64_t r = 0; r < rows; r++) {
        double d = kind == 0 ? -DBL_MAX : 0.0;
        for (int64_t i = 0; i < c; i++) {
            double v = (float)kiln_get_f64(x->dtype, x->data, r * c + i);
            if (kind == 0) d = v > d ? v : d;
            else if (kind == 1) d += fabs(v);
            else d += v * v;
        }
        if (kind == 2) d = sqrt(d);
        for (int64_t i = 0; i < c; i++) {
            double v = (float)kiln_get_f64(x->dtype, x->data, r * c + i);
            y[r * c + i] = (float)(d != 0 ? v / d : v);
        }
    }
    return KILN_OK;
}

KILN_REF_OP(Normalizer, float_same_infer, normalizer_run);

static kiln_status binarizer_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (!kiln_dtype_is_float(x->dtype) && !kiln_dtype_is_int(x->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "X has dtype %s",
                               kiln_dtype_name(x->dtype));
    double th = kiln_attr_float(ctx->node, "threshold", 0.0f);
    int64_t n = kiln_tensor_count(x);
    for (int64_t i = 0; i < n; i++)
        kiln_set_f64(x->dtype, ctx->out[0]->data, i, kiln_get_f64(x->dtype, x->data, i) > th ? 1 : 0);
    return KILN_OK;
}

KILN_REF_OP(Binarizer, kiln_infer_same, binarizer_run);

static kiln_status imputer_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    int64_t c = x->rank == 0 ? 1 : x->dims[x->rank - 1];
    int64_t total = kiln_tensor_count(x);
    const float *fv;
    const int64_t *iv;
    int nf = kiln_attr_floats(n, "imputed_value_floats", &fv);
    int ni = kiln_attr_ints(n, "imputed_value_int64s", &iv);
    if (kiln_dtype_is_float(x->dtype)) {
        if (nf <= 0 || (nf > 1 && nf != c))
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                   "imputed_value_floats has %d values, expected 1 or %lld", nf,
                                   (long long)c);
        float rv = kiln_attr_float(n, "replaced_value_float", 0.0f);
        for (int64_t i = 0; i < total; i++) {
            double v = kiln_get_f64(x->dtype, x->data, i);
            bool hit = rv != rv ? v != v : v == rv;
            kiln_set_f64(y->dtype, y->data, i, hit ? fv[nf == 1 ? 0 : i % c] : v);
        }
    } else if (kiln_dtype_is_int(x->dtype)) {
        if (ni <= 0 || (ni > 1 && ni != c))
            return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                                   "imputed_value_int64s has %d values, expected 1 or %lld", ni,
                                   (long long)c);
        int64_t rv = kiln_attr_int(n, "replaced_value_int64", 0);
        for (int64_t i = 0; i < total; i++) {
            int64_t v = kiln_get_i64(x->dtype, x->data, i);
            kiln_set_i64(y->dtype, y->data, i, v == rv ? iv[ni == 1 ? 0 : i % c] : v);
        }
    } else {
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has dtype %s",
                               kiln_dtype_name(x->dtype));
    }
    return KILN_OK;
}

KILN_REF_OP(Imputer, kiln_infer_same, imputer_run);

/* ---- OneHotEncoder ---- */

static kiln_status onehot_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const int64_t *ci;
    int nc = kiln_attr_ints(n, "cats_int64s", &ci);
    const struct kiln_attr *cs = kiln_node_attr(n, "cats_strings");
    if (cs && cs->type == KILN_ATTR_STRINGS) nc = cs->n;
    if (nc <= 0) return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "cats_int64s or cats_strings is required");
    const struct kiln_type *x = ctx->in[0];
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    ctx->out[0]->dtype = KILN_DTYPE_F32;
    if (!x || x->rank < 0) return KILN_OK;
    if (x->rank >= KILN_MAX_RANK)
        return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "X has rank %d", x->rank);
    int64_t d[KILN_MAX_RANK];
    for (int i = 0; i < x->rank; i++) d[i] = x->dims[i];
    d[x->rank] = nc;
    kiln_type_set(ctx->out[0], KILN_DTYPE_F32, x->rank + 1, d);
    return KILN_OK;
}

static kiln_status onehot_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    const int64_t *ci;
    int nc = kiln_attr_ints(n, "cats_int64s", &ci);
    const struct kiln_attr *cs = kiln_node_attr(n, "cats_strings");
    bool strs = cs && cs->type == KILN_ATTR_STRINGS;
    if (strs) nc = cs->n;
    if (strs != (x->dtype == KILN_DTYPE_STRING))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has dtype %s but the categories are %s",
                               kiln_dtype_name(x->dtype), strs ? "strings" : "integers");
    int zeros = (int)kiln_attr_int(n, "zeros", 1);
    int64_t total = kiln_tensor_count(x);
    float *y = ctx->out[0]->data;
    for (int64_t i = 0; i < total; i++) {
        int hit = -1;
        for (int k = 0; k < nc && hit < 0; k++) {
            if (strs) {
                if (str_eq(((const kiln_string *)x->data)[i], cs->strings[k])) hit = k;
            } else if (kiln_dtype_is_float(x->dtype)) {
                if ((double)ci[k] == kiln_get_f64(x->dtype, x->data, i)) hit = k;
            } else if (kiln_get_i64(x->dtype, x->data, i) == ci[k]) {
                hit = k;
            }
        }
        if (hit >= 0) y[i * nc + hit] = 1.0f;
        else if (!zeros)
            return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                                   "element %lld is not one of the categories (zeros is 0)",
                                   (long long)i);
    }
    return KILN_OK;
}

KILN_REF_OP(OneHotEncoder, onehot_infer, onehot_run);

/* ---- LabelEncoder ---- */

/* A typed list from an attribute: keys or values of a LabelEncoder. */
struct tlist {
    kiln_dtype dt;               /* STRING, I64, F32, or a tensor's dtype */
    int64_t n;
    const kiln_string *strs;
    const int64_t *ints;
    const float *floats;
    const kiln_tensor *t;
};

static double tl_num(const struct tlist *l, int64_t i)
{
    if (l->t) return kiln_get_f64(l->t->dtype, l->t->data, i);
    return l->ints ? (double)l->ints[i] : l->floats[i];
}

static kiln_string tl_str(const struct tlist *l, int64_t i)
{
    if (l->t) return str_or_empty(((const kiln_string *)l->t->data)[i]);
    return str_or_empty(l->strs[i]);
}

/* keys_* / values_* (or opset 1's classes_strings with an implied index list). */
static kiln_status tl_read(const struct kiln_node *n, const char *prefix, struct tlist *l)
{
    memset(l, 0, sizeof *l);
    char nm[48];
    snprintf(nm, sizeof nm, "%s_strings", prefix);
    const struct kiln_attr *a = kiln_node_attr(n, nm);
    if (a && a->type == KILN_ATTR_STRINGS) {
        l->dt = KILN_DTYPE_STRING;
        l->strs = a->strings;
        l->n = a->n;
        return KILN_OK;
    }
    snprintf(nm, sizeof nm, "%s_int64s", prefix);
    int c = kiln_attr_ints(n, nm, &l->ints);
    if (c >= 0) {
        l->dt = KILN_DTYPE_I64;
        l->n = c;
        return KILN_OK;
    }
    snprintf(nm, sizeof nm, "%s_floats", prefix);
    c = kiln_attr_floats(n, nm, &l->floats);
    if (c >= 0) {
        l->dt = KILN_DTYPE_F32;
        l->n = c;
        return KILN_OK;
    }
    snprintf(nm, sizeof nm, "%s_tensor", prefix);
    l->t = kiln_attr_tensor(n, nm);
    if (l->t) {
        l->dt = l->t->dtype;
        l->n = kiln_tensor_count(l->t);
        if (l->dt != KILN_DTYPE_STRING && !kiln_dtype_is_float(l->dt) && !kiln_dtype_is_int(l->dt))
            return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "%s has dtype %s", nm,
                                   kiln_dtype_name(l->dt));
        return KILN_OK;
    }
    return kiln_node_error(n, KILN_ERR_INVALID_MODEL, "%s_strings, _int64s, _floats or _tensor is required",
                           prefix);
}

/* Opset 1 maps strings <-> their index in classes_strings. */
static kiln_status le_parse(const struct kiln_node *n, kiln_dtype in_dt, struct tlist *keys,
                            struct tlist *vals)
{
    const struct kiln_attr *cls = kiln_node_attr(n, "classes_strings");
    if (n->opset < 2 && cls && cls->type == KILN_ATTR_STRINGS) {
        struct tlist s = {.dt = KILN_DTYPE_STRING, .n = cls->n, .strs = cls->strings};
        struct tlist idx = {.dt = KILN_DTYPE_I64, .n = cls->n};
        if (in_dt == KILN_DTYPE_STRING) {
            *keys = s;
            *vals = idx;
        } else {
            *keys = idx;
            *vals = s;
        }
        return KILN_OK;
    }
    kiln_status st = tl_read(n, "keys", keys);
    if (st == KILN_OK) st = tl_read(n, "values", vals);
    if (st == KILN_OK && keys->n != vals->n)
        st = kiln_node_error(n, KILN_ERR_INVALID_MODEL, "%lld keys but %lld values",
                             (long long)keys->n, (long long)vals->n);
    return st;
}

static kiln_status le_infer(struct kiln_infer_ctx *ctx)
{
    struct tlist k, v;
    kiln_dtype in_dt = ctx->in[0] ? ctx->in[0]->dtype : KILN_DTYPE_UNDEFINED;
    kiln_status st = le_parse(ctx->node, in_dt, &k, &v);
    if (st != KILN_OK) return st;
    st = kiln_infer_same(ctx);
    if (st == KILN_OK && ctx->out[0]) ctx->out[0]->dtype = v.dt;
    return st;
}

static kiln_status le_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    struct tlist k, v;
    kiln_status st = le_parse(n, x->dtype, &k, &v);
    if (st != KILN_OK) return st;
    if ((x->dtype == KILN_DTYPE_STRING) != (k.dt == KILN_DTYPE_STRING))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has dtype %s, the keys are %s",
                               kiln_dtype_name(x->dtype), kiln_dtype_name(k.dt));
    /* the default */
    const kiln_tensor *dt = kiln_attr_tensor(n, "default_tensor");
    double dnum = v.dt == KILN_DTYPE_F32 || kiln_dtype_is_float(v.dt)
                      ? kiln_attr_float(n, "default_float", -0.0f)
                      : (double)kiln_attr_int(n, "default_int64", -1);
    const char *dstr = kiln_attr_str(n, "default_string", "_Unused");
    kiln_string dstring = {strlen(dstr), (char *)dstr};
    if (dt && kiln_tensor_count(dt) >= 1) {
        if (dt->dtype == KILN_DTYPE_STRING) dstring = str_or_empty(((const kiln_string *)dt->data)[0]);
        else dnum = kiln_get_f64(dt->dtype, dt->data, 0);
    }
    int64_t total = kiln_tensor_count(x);
    for (int64_t i = 0; i < total; i++) {
        int64_t hit = -1;
        if (k.dt == KILN_DTYPE_STRING) {
            kiln_string s = str_or_empty(((const kiln_string *)x->data)[i]);
            for (int64_t j = 0; j < k.n && hit < 0; j++)
                if (str_eq(s, tl_str(&k, j))) hit = j;
        } else {
            double xv = kiln_get_f64(x->dtype, x->data, i);
            for (int64_t j = 0; j < k.n && hit < 0; j++) {
                double kv = k.ints || k.t || k.floats ? tl_num(&k, j) : (double)j;
                if (kv == xv || (kv != kv && xv != xv)) hit = j;
            }
        }
        if (v.dt == KILN_DTYPE_STRING) {
            kiln_string s = hit >= 0 ? tl_str(&v, hit) : dstring;
            if ((st = kiln_tensor_set_string(y, (size_t)i, s.data, s.len)) != KILN_OK) return st;
        } else {
            double val = hit < 0 ? dnum : (v.ints || v.t || v.floats ? tl_num(&v, hit) : (double)hit);
            if (kiln_dtype_is_int(y->dtype)) {
                int64_t iv = hit >= 0 && v.ints ? v.ints[hit] : (int64_t)val;
                if (hit < 0 && !dt) iv = kiln_attr_int(n, "default_int64", -1);
                kiln_set_i64(y->dtype, y->data, i, iv);
            } else {
                kiln_set_f64(y->dtype, y->data, i, val);
            }
        }
    }
    return KILN_OK;
}

KILN_REF_OP(LabelEncoder, le_infer, le_run);

/* ---- CategoryMapper ---- */

static kiln_status catmap_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = kiln_infer_same(ctx);
    const struct kiln_type *x = ctx->in[0];
    if (st == KILN_OK && ctx->out[0] && x && x->dtype != KILN_DTYPE_UNDEFINED)
        ctx->out[0]->dtype = x->dtype == KILN_DTYPE_STRING ? KILN_DTYPE_I64 : KILN_DTYPE_STRING;
    return st;
}

static kiln_status catmap_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    const struct kiln_attr *cs = kiln_node_attr(n, "cats_strings");
    const int64_t *ci;
    int ni = kiln_attr_ints(n, "cats_int64s", &ci);
    if (!cs || cs->type != KILN_ATTR_STRINGS || ni != cs->n)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "cats_strings and cats_int64s must have the same length");
    int64_t total = kiln_tensor_count(x);
    if (x->dtype == KILN_DTYPE_STRING) {
        int64_t dflt = kiln_attr_int(n, "default_int64", -1);
        for (int64_t i = 0; i < total; i++) {
            int64_t v = dflt;
            for (int k = 0; k < ni; k++)
                if (str_eq(((const kiln_string *)x->data)[i], cs->strings[k])) {
                    v = ci[k];
                    break;
                }
            ((int64_t *)y->data)[i] = v;
        }
        return KILN_OK;
    }
    if (!kiln_dtype_is_int(x->dtype))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT, "X has dtype %s", kiln_dtype_name(x->dtype));
    const char *dflt = kiln_attr_str(n, "default_string", "_Unused");
    for (int64_t i = 0; i < total; i++) {
        kiln_string s = {strlen(dflt), (char *)dflt};
        int64_t xv = kiln_get_i64(x->dtype, x->data, i);
        for (int k = 0; k < ni; k++)
            if (ci[k] == xv) {
                s = str_or_empty(cs->strings[k]);
                break;
            }
        kiln_status st = kiln_tensor_set_string(y, (size_t)i, s.data, s.len);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

KILN_REF_OP(CategoryMapper, catmap_infer, catmap_run);

/* ---- ArrayFeatureExtractor ---- */

static kiln_status afe_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0], *ix = ctx->in[1];
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    if (x) ctx->out[0]->dtype = x->dtype;
    if (!x || x->rank < 0 || !ix || ix->rank < 0) return KILN_OK;
    int64_t k = 1;
    for (int i = 0; i < ix->rank; i++) k = ix->dims[i] < 0 || k < 0 ? -1 : k * ix->dims[i];
    if (x->rank <= 1) {
        int64_t d[2] = {1, k};
        kiln_type_set(ctx->out[0], x->dtype, 2, d);
        return KILN_OK;
    }
    int64_t d[KILN_MAX_RANK];
    for (int i = 0; i < x->rank; i++) d[i] = x->dims[i];
    d[x->rank - 1] = k;
    kiln_type_set(ctx->out[0], x->dtype, x->rank, d);
    return KILN_OK;
}

static kiln_status afe_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0], *ix = ctx->in[1];
    kiln_tensor *y = ctx->out[0];
    if (!kiln_dtype_is_int(ix->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "Y has dtype %s",
                               kiln_dtype_name(ix->dtype));
    int64_t c = x->rank == 0 ? 1 : x->dims[x->rank - 1];
    int64_t k = kiln_tensor_count(ix), rows = c ? kiln_tensor_count(x) / c : 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t col = kiln_get_i64(ix->dtype, ix->data, j);
        if (col < 0 || col >= c)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "index %lld is out of range for %lld columns", (long long)col,
                                   (long long)c);
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < k; j++) {
            int64_t col = kiln_get_i64(ix->dtype, ix->data, j);
            kiln_status st = kiln_tensor_copy_elems(y, r * k + j, x, r * c + col, 1);
            if (st != KILN_OK) return st;
        }
    return KILN_OK;
}

KILN_REF_OP(ArrayFeatureExtractor, afe_infer, afe_run);

/* ---- FeatureVectorizer ---- */

static kiln_status fv_infer(struct kiln_infer_ctx *ctx)
{
    const int64_t *dims;
    int nd = kiln_attr_ints(ctx->node, "inputdimensions", &dims);
    if (nd != ctx->n_in)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "inputdimensions has %d values for %d inputs", nd, ctx->n_in);
    int64_t total = 0;
    for (int i = 0; i < nd; i++) {
        if (dims[i] < 0) return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "inputdimensions has %lld",
                                                (long long)dims[i]);
        total += dims[i];
    }
    int64_t d[2] = {type_rows(ctx->in[0]), total};
    if (ctx->out[0]) kiln_type_set(ctx->out[0], KILN_DTYPE_F32, 2, d);
    return KILN_OK;
}

static kiln_status fv_run(struct kiln_run_ctx *ctx)
{
    const int64_t *dims;
    kiln_attr_ints(ctx->node, "inputdimensions", &dims);
    kiln_tensor *y = ctx->out[0];
    int64_t rows = y->dims[0], total = y->dims[1], at = 0;
    for (int i = 0; i < ctx->n_in; i++) {
        const kiln_tensor *x = ctx->in[i];
        if (!x) return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "input %d is absent", i);
        int64_t r_in, c;
        kiln_status st = rows_cols(ctx->node, x, &r_in, &c);
        if (st != KILN_OK) return st;
        if (r_in != rows)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "input %d has %lld rows, input 0 has %lld", i, (long long)r_in,
                                   (long long)rows);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < dims[i] && j < c; j++)
                ((float *)y->data)[r * total + at + j] =
                    (float)kiln_get_f64(x->dtype, x->data, r * c + j);
        at += dims[i];
    }
    return KILN_OK;
}

KILN_REF_OP(FeatureVectorizer, fv_infer, fv_run);

/* ---- ZipMap ---- */

static kiln_status zipmap_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_node *n = ctx->node;
    const struct kiln_attr *s = kiln_node_attr(n, "classlabels_strings");
    const int64_t *li;
    int nl = s && s->type == KILN_ATTR_STRINGS ? s->n : kiln_attr_ints(n, "classlabels_int64s", &li);
    if (nl <= 0)
        return kiln_node_error(n, KILN_ERR_INVALID_MODEL,
                               "one of classlabels_int64s and classlabels_strings is required");
    const struct kiln_type *x = ctx->in[0];
    if (x && x->rank >= 0 && (x->rank != 2 || (x->dims[1] >= 0 && x->dims[1] != nl)))
        return kiln_node_error(n, KILN_ERR_INVALID_ARGUMENT,
                               "X must be [N, %d] (one column per label)", nl);
    return kiln_infer_same(ctx);
}

static kiln_status zipmap_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    if (x->dtype != KILN_DTYPE_F32)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "X has dtype %s, expected float",
                               kiln_dtype_name(x->dtype));
    memcpy(ctx->out[0]->data, x->data, x->nbytes);
    return KILN_OK;
}

KILN_REF_OP(ZipMap, zipmap_infer, zipmap_run);
