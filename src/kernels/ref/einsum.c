/*
 * einsum.c - reference kernels for Einsum and Det.
 *
 * Einsum parses its equation into labels: letters a-z and A-Z, and one
 * label per dim covered by "..." (the ellipsis dims of all inputs are
 * right-aligned and broadcast, like numpy). Without "->" the output is the
 * ellipsis dims followed by the letters that occur exactly once, in ASCII
 * order. A label repeated within one input walks that input's diagonal
 * (its strides add up); a label missing from the output is summed over.
 * The kernel then visits every (output index, summed index) pair with one
 * flat offset per input, accumulating the product of the inputs in double
 * (floats) or 64-bit wrapping integers. Plain and general rather than fast:
 * a contraction costs the product of all label sizes.
 *
 * Det computes determinants of the trailing M x M matrices by Gaussian
 * elimination with partial pivoting, in double.
 */
#include "kernels/kernel.h"

/* ---- Einsum ---- */

#define EIN_LETTERS 52                            /* a-z then A-Z */
#define EIN_LABELS (EIN_LETTERS + KILN_MAX_RANK)  /* letters, then ellipsis dims */
#define EIN_ELLIPSIS (-1)                         /* token for "..." */

/* An equation resolved against the input shapes. */
struct einsum_plan {
    int n_in;
    int in_rank[KILN_MAX_IO];                     /* -1 if unknown */
    int in_label[KILN_MAX_IO][KILN_MAX_RANK];     /* label of each input dim */
    int ell_rank;                                 /* dims "..." stands for; -1 unknown */
    bool used[EIN_LABELS];                        /* label occurs in some input */
    int64_t size[EIN_LABELS];                     /* label extent, -1 unknown */
    int out_rank;                                 /* -1 if unknown */
    int out_label[KILN_MAX_RANK];
};

/* Label of a letter, or -1. */
static int einsum_letter(char c)
{
    if (c >= 'a' && c <= 'z') return c - 'a';
    if (c >= 'A' && c <= 'Z') return 26 + (c - 'A');
    return -1;
}

/* Parse one term (up to ',' or '-' or the end) into tokens; *pos is advanced. */
static kiln_status einsum_term(const struct kiln_node *node, const char *eq, size_t *pos,
                               int *tokens, int *n_tokens)
{
    int n = 0;
    bool ell = false;
    size_t i = *pos;
    for (;; i++) {
        char c = eq[i];
        if (c == ' ') continue;
        if (c == '\0' || c == ',' || c == '-') break;
        int t;
        if (c == '.') {
            if (eq[i + 1] != '.' || eq[i + 2] != '.' || ell)
                return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                       "equation '%s' has a stray '.' or a second '...' in a term",
                                       eq);
            ell = true;
            t = EIN_ELLIPSIS;
            i += 2;
        } else {
            t = einsum_letter(c);
            if (t < 0)
                return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                       "equation '%s' has an invalid character '%c'", eq, c);
        }
        if (n >= KILN_MAX_RANK + 1)
            return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                                   "equation '%s' has a term with more than %d dims", eq,
                                   KILN_MAX_RANK);
        tokens[n++] = t;
    }
    *pos = i;
    *n_tokens = n;
    return KILN_OK;
}

/* Fold a dim into a label's size: 1 broadcasts, unknown (-1) stays unknown
 * unless a known size other than 1 turns up. */
static kiln_status einsum_merge(const struct kiln_node *node, const char *eq, int label,
                                int64_t *size, bool *unknown, int64_t d)
{
    if (d < 0) {
        *unknown = true;
        return KILN_OK;
    }
    if (d == 1) return KILN_OK;
    if (*size != 1 && *size != d) {
        char what[16] = "a '...' dim";
        if (label < EIN_LETTERS)
            snprintf(what, sizeof what, "label '%c'", label < 26 ? 'a' + label : 'A' + label - 26);
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                               "equation '%s': %s has size %lld in one place and %lld in another",
                               eq, what, (long long)*size, (long long)d);
    }
    *size = d;
    return KILN_OK;
}

/* Resolve the equation of node against n inputs of the given ranks and dims. */
static kiln_status einsum_plan_make(const struct kiln_node *node, int n, const int *ranks,
                                    const int64_t *const *dims, struct einsum_plan *p)
{
    const char *eq = kiln_attr_str(node, "equation", NULL);
    if (!eq) return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "attribute equation is missing");
    memset(p, 0, sizeof *p);
    p->n_in = n;

    /* left-hand side: one term per input */
    int tokens[KILN_MAX_IO][KILN_MAX_RANK + 1], n_tokens[KILN_MAX_IO];
    size_t pos = 0;
    int terms = 0;
    for (;;) {
        if (terms >= n || terms >= KILN_MAX_IO)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "equation '%s' has more terms than the %d inputs", eq, n);
        kiln_status st = einsum_term(node, eq, &pos, tokens[terms], &n_tokens[terms]);
        if (st != KILN_OK) return st;
        terms++;
        if (eq[pos] != ',') break;
        pos++;
    }
    if (terms != n)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "equation '%s' has %d terms for %d inputs", eq, terms, n);
    bool explicit_out = false;
    int out_tokens[KILN_MAX_RANK + 1], n_out_tokens = 0;
    if (eq[pos] == '-') {
        if (eq[pos + 1] != '>')
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "equation '%s': bad '-'", eq);
        pos += 2;
        explicit_out = true;
        kiln_status st = einsum_term(node, eq, &pos, out_tokens, &n_out_tokens);
        if (st != KILN_OK) return st;
        if (eq[pos] != '\0')
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "equation '%s' has more than one output term", eq);
    }

    /* how many dims "..." covers in each input, and overall */
    int ell[KILN_MAX_IO];
    p->ell_rank = 0;
    for (int k = 0; k < n; k++) {
        int letters = 0;
        bool has_ell = false;
        for (int j = 0; j < n_tokens[k]; j++) {
            if (tokens[k][j] == EIN_ELLIPSIS) has_ell = true;
            else letters++;
        }
        p->in_rank[k] = ranks[k];
        ell[k] = 0;
        if (ranks[k] < 0) {
            if (has_ell) p->ell_rank = -1;
            continue;
        }
        if (has_ell ? ranks[k] < letters : ranks[k] != letters)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "equation '%s': input %d has rank %d, but its term has %d "
                                   "letters%s",
                                   eq, k, ranks[k], letters, has_ell ? " and '...'" : "");
        ell[k] = ranks[k] - letters;
        if (p->ell_rank >= 0 && ell[k] > p->ell_rank) p->ell_rank = ell[k];
    }

    /* label of every input dim, and the label sizes */
    int64_t size[EIN_LABELS];
    bool unknown[EIN_LABELS] = {false};
    int count[EIN_LABELS] = {0};
    for (int l = 0; l < EIN_LABELS; l++) size[l] = 1;
    for (int k = 0; k < n; k++) {
        int d = 0;
        for (int j = 0; j < n_tokens[k]; j++) {
            int t = tokens[k][j];
            if (t != EIN_ELLIPSIS) {
                p->used[t] = true;
                count[t]++;
                if (ranks[k] >= 0) {
                    p->in_label[k][d] = t;
                    kiln_status st = einsum_merge(node, eq, t, &size[t], &unknown[t], dims[k][d]);
                    if (st != KILN_OK) return st;
                    d++;
                }
                continue;
            }
            if (ranks[k] < 0 || p->ell_rank < 0) continue;
            for (int e = 0; e < ell[k]; e++, d++) {
                int l = EIN_LETTERS + p->ell_rank - ell[k] + e;
                p->used[l] = true;
                p->in_label[k][d] = l;
                kiln_status st = einsum_merge(node, eq, l, &size[l], &unknown[l], dims[k][d]);
                if (st != KILN_OK) return st;
            }
        }
    }
    for (int l = 0; l < EIN_LABELS; l++) p->size[l] = size[l] != 1 || !unknown[l] ? size[l] : -1;

    /* output labels */
    bool in_out[EIN_LABELS] = {false};
    int r = 0;
    bool out_has_ell = !explicit_out;
    if (explicit_out) {
        out_has_ell = false;
        for (int j = 0; j < n_out_tokens; j++)
            if (out_tokens[j] == EIN_ELLIPSIS) out_has_ell = true;
    }
    if (out_has_ell && p->ell_rank < 0) {
        p->out_rank = -1;
        return KILN_OK;
    }
    if (!out_has_ell && p->ell_rank > 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "equation '%s': the inputs have '...' dims but the output has no "
                               "'...'",
                               eq);
    int ell_out = out_has_ell ? p->ell_rank : 0;
    if (explicit_out) {
        for (int j = 0; j < n_out_tokens; j++) {
            int t = out_tokens[j];
            if (t == EIN_ELLIPSIS) {
                for (int e = 0; e < ell_out; e++) p->out_label[r++] = EIN_LETTERS + e;
                continue;
            }
            if (!p->used[t] || in_out[t])
                return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                       "equation '%s': output label '%c' is %s", eq,
                                       t < 26 ? 'a' + t : 'A' + (t - 26),
                                       in_out[t] ? "repeated" : "not in any input");
            in_out[t] = true;
            p->out_label[r++] = t;
        }
    } else {
        for (int e = 0; e < ell_out; e++) p->out_label[r++] = EIN_LETTERS + e;
        /* letters used once, in ASCII order: A-Z before a-z */
        for (int c = 0; c < EIN_LETTERS; c++) {
            int t = c < 26 ? 26 + c : c - 26;
            if (count[t] != 1) continue;
            if (r >= KILN_MAX_RANK)
                return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                                       "equation '%s' gives an output of rank above %d", eq,
                                       KILN_MAX_RANK);
            p->out_label[r++] = t;
        }
    }
    p->out_rank = r;
    return KILN_OK;
}

/* Output type of Einsum from the equation and whatever input shapes are known. */
static kiln_status einsum_infer(struct kiln_infer_ctx *ctx)
{
    struct kiln_type *out = ctx->out[0];
    int n = ctx->n_in;
    if (n > KILN_MAX_IO)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "has %d inputs, at most %d", n,
                               KILN_MAX_IO);
    int ranks[KILN_MAX_IO] = {0};
    const int64_t *dims[KILN_MAX_IO] = {NULL};
    for (int k = 0; k < n; k++) {
        if (!ctx->in[k])
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL, "input %d is missing", k);
        ranks[k] = ctx->in[k]->rank;
        dims[k] = ctx->in[k]->dims;
    }
    struct einsum_plan p;
    kiln_status st = einsum_plan_make(ctx->node, n, ranks, dims, &p);
    if (st != KILN_OK || !out) return st;
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = n > 0 ? ctx->in[0]->dtype : KILN_DTYPE_UNDEFINED;
    t.rank = p.out_rank;
    for (int d = 0; d < p.out_rank; d++) t.dims[d] = p.size[p.out_label[d]];
    *out = t;
    return KILN_OK;
}

/* Read element i as double (floats) with typed loads for the common dtypes. */
static inline double ein_get_f64(kiln_dtype dt, const void *data, int64_t i)
{
    if (dt == KILN_DTYPE_F32) return ((const float *)data)[i];
    if (dt == KILN_DTYPE_F64) return ((const double *)data)[i];
    return kiln_get_f64(dt, data, i);
}

/* Sum over the summed labels of the product of the inputs, per output element. */
static kiln_status einsum_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    int n = ctx->n_in;
    kiln_tensor *y = ctx->out[0];
    if (n > KILN_MAX_IO)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "has %d inputs, at most %d", n,
                               KILN_MAX_IO);
    int ranks[KILN_MAX_IO] = {0};
    const int64_t *dims[KILN_MAX_IO] = {NULL};
    kiln_dtype dt = y->dtype;
    for (int k = 0; k < n; k++) {
        if (!ctx->in[k])
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "input %d is missing", k);
        if (ctx->in[k]->dtype != dt)
            return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                   "input %d is %s, expected %s like the others", k,
                                   kiln_dtype_name(ctx->in[k]->dtype), kiln_dtype_name(dt));
        ranks[k] = ctx->in[k]->rank;
        dims[k] = ctx->in[k]->dims;
    }
    if (!kiln_dtype_is_numeric(dt) || dt == KILN_DTYPE_BOOL)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(dt));
    struct einsum_plan p;
    kiln_status st = einsum_plan_make(node, n, ranks, dims, &p);
    if (st != KILN_OK) return st;

    /* loop dims: output labels, then the summed ones */
    int loop_label[EIN_LABELS], n_loop = 0;
    bool in_out[EIN_LABELS] = {false};
    for (int d = 0; d < p.out_rank; d++) {
        loop_label[n_loop++] = p.out_label[d];
        in_out[p.out_label[d]] = true;
    }
    for (int l = 0; l < EIN_LABELS; l++)
        if (p.used[l] && !in_out[l]) loop_label[n_loop++] = l;
    int64_t n_out = 1, n_sum = 1;
    for (int d = 0; d < n_loop; d++) {
        if (d < p.out_rank) n_out *= p.size[loop_label[d]];
        else n_sum *= p.size[loop_label[d]];
    }
    if (n_out != kiln_shape_count(y->rank, y->dims))
        return kiln_node_error(node, KILN_ERR_INTERNAL, "output has %lld elements, expected %lld",
                               (long long)kiln_shape_count(y->rank, y->dims), (long long)n_out);
    if (n_out == 0) return KILN_OK;
    if (n_sum == 0) { /* an empty sum: zeros (the output is written in full) */
        for (int64_t o = 0; o < n_out; o++) kiln_set_f64(dt, y->data, o, 0.0);
        return KILN_OK;
    }

    /* per input, the stride of each loop dim: dims sharing a label add up */
    int64_t stride[KILN_MAX_IO][EIN_LABELS];
    memset(stride, 0, (size_t)n * sizeof stride[0]);
    int label_pos[EIN_LABELS];
    for (int d = 0; d < n_loop; d++) label_pos[loop_label[d]] = d;
    for (int k = 0; k < n; k++) {
        int64_t s[KILN_MAX_RANK];
        kiln_shape_strides(ranks[k], dims[k], s);
        for (int j = 0; j < ranks[k]; j++)
            if (dims[k][j] != 1) stride[k][label_pos[p.in_label[k][j]]] += s[j];
    }
    int64_t loop_dim[EIN_LABELS], idx[EIN_LABELS] = {0}, off[KILN_MAX_IO] = {0};
    for (int d = 0; d < n_loop; d++) loop_dim[d] = p.size[loop_label[d]];

    bool is_float = kiln_dtype_is_float(dt);
    for (int64_t o = 0; o < n_out; o++) {
        double facc = 0.0;
        uint64_t iacc = 0;
        for (int64_t s = 0; s < n_sum; s++) {
            if (is_float) {
                double prod = 1.0;
                for (int k = 0; k < n; k++) prod *= ein_get_f64(dt, ctx->in[k]->data, off[k]);
                facc += prod;
            } else {
                uint64_t prod = 1;
                for (int k = 0; k < n; k++)
                    prod *= (uint64_t)kiln_get_i64(dt, ctx->in[k]->data, off[k]);
                iacc += prod;
            }
            /* next index, innermost loop dim fastest */
            for (int d = n_loop - 1; d >= 0; d--) {
                idx[d]++;
                for (int k = 0; k < n; k++) off[k] += stride[k][d];
                if (idx[d] < loop_dim[d]) break;
                for (int k = 0; k < n; k++) off[k] -= stride[k][d] * loop_dim[d];
                idx[d] = 0;
            }
        }
        if (is_float) kiln_set_f64(dt, y->data, o, facc);
        else kiln_set_i64(dt, y->data, o, (int64_t)iacc);
    }
    return KILN_OK;
}

KILN_REF_OP(Einsum, einsum_infer, einsum_run);

/* ---- Det ---- */

/* Det drops the two trailing (matrix) dims. */
static kiln_status det_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    struct kiln_type t;
    kiln_type_unknown(&t);
    t.dtype = x ? x->dtype : KILN_DTYPE_UNDEFINED;
    if (x && x->rank >= 0) {
        if (x->rank < 2)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "input has rank %d, expected at least 2 (... x M x M)",
                                   x->rank);
        int64_t a = x->dims[x->rank - 2], b = x->dims[x->rank - 1];
        if (a >= 0 && b >= 0 && a != b)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "matrices are %lld x %lld, expected square", (long long)a,
                                   (long long)b);
        t.rank = x->rank - 2;
        for (int d = 0; d < t.rank; d++) {
            t.dims[d] = x->dims[d];
            t.sym[d] = x->sym[d];
        }
    }
    if (ctx->out[0]) *ctx->out[0] = t;
    return KILN_OK;
}

/* Determinant of the m x m matrix a (row-major, overwritten). */
static double det_lu(double *a, int64_t m)
{
    double det = 1.0;
    for (int64_t c = 0; c < m; c++) {
        int64_t piv = c;
        for (int64_t r = c + 1; r < m; r++)
            if (fabs(a[r * m + c]) > fabs(a[piv * m + c])) piv = r;
        if (a[piv * m + c] == 0.0) return 0.0;
        if (piv != c) {
            for (int64_t j = 0; j < m; j++) {
                double t = a[c * m + j];
                a[c * m + j] = a[piv * m + j];
                a[piv * m + j] = t;
            }
            det = -det;
        }
        double p = a[c * m + c];
        det *= p;
        for (int64_t r = c + 1; r < m; r++) {
            double f = a[r * m + c] / p;
            if (f == 0.0) continue;
            for (int64_t j = c + 1; j < m; j++) a[r * m + j] -= f * a[c * m + j];
        }
    }
    return det;
}

/* Determinant of every trailing M x M matrix. */
static kiln_status det_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    kiln_dtype dt = x->dtype;
    if (!kiln_dtype_is_float(dt))
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "input dtype %s is not supported",
                               kiln_dtype_name(dt));
    if (x->rank < 2 || x->dims[x->rank - 1] != x->dims[x->rank - 2])
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input must be a batch of square matrices (rank %d)", x->rank);
    int64_t m = x->dims[x->rank - 1];
    int64_t batch = kiln_shape_count(x->rank - 2, x->dims);
    if (batch == 0) return KILN_OK;
    double *a = malloc((size_t)(m > 0 ? m * m : 1) * sizeof *a);
    if (!a)
        return kiln_node_error(ctx->node, KILN_ERR_OUT_OF_MEMORY,
                               "out of memory for a %lld x %lld matrix", (long long)m,
                               (long long)m);
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t i = 0; i < m * m; i++) a[i] = kiln_get_f64(dt, x->data, b * m * m + i);
        kiln_set_f64(dt, y->data, b, det_lu(a, m));
    }
    free(a);
    return KILN_OK;
}

KILN_REF_OP(Det, det_infer, det_run);
