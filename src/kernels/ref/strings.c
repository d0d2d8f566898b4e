/*
 * strings.c - reference kernels for ONNX's text ops: StringConcat,
 * StringSplit, StringNormalizer, RegexFullMatch and TfIdfVectorizer.
 *
 * Strings are byte strings (UTF-8 by convention). Case changes and
 * case-insensitive comparison touch ASCII letters only; other bytes pass
 * through unchanged.
 *
 * StringSplit follows Python's str.split: with a non-empty delimiter every
 * occurrence splits (empty pieces kept); without one, runs of whitespace
 * split and leading / trailing whitespace is dropped; maxsplit bounds the
 * splits. Y is the input's shape plus one dim, the most pieces of any
 * element, padded with ""; Z holds each element's piece count.
 *
 * RegexFullMatch takes an RE2 pattern. Kiln runs it with POSIX <regex.h>
 * (glibc's extended syntax, which also knows \w \W \s \S \b \B) after a
 * translation of the RE2 forms POSIX lacks: (?:...) groups, \d \D, class
 * escapes inside brackets ([\w.\-]), \A \z, lazy quantifiers (which cannot
 * change whether the whole string matches) and . (which in RE2 does not
 * match a newline). Constructs with no POSIX equivalent (flags such as
 * (?i), named groups, \p classes, negated class escapes inside brackets)
 * are reported as unsupported rather than guessed.
 *
 * TfIdfVectorizer counts the pool's n-grams (of lengths min_gram_length to
 * max_gram_length, items max_skip_count + 1 apart at most) in each row, as
 * the ONNX reference does: unigrams are counted once, longer n-grams once
 * per skip distance that forms them.
 */
#include <regex.h>
#include <stdlib.h>

#include "kernels/kernel.h"

/* ---- helpers ---- */

/* The bytes of string element i of t ("" for an unset element). */
static kiln_string str_at(const kiln_tensor *t, int64_t i)
{
    kiln_string s = ((const kiln_string *)t->data)[i];
    if (!s.data) {
        s.data = "";
        s.len = 0;
    }
    return s;
}

/* The bytes of a STRING attribute, or dflt when absent. */
static kiln_string attr_bytes(const struct kiln_node *n, const char *name, const char *dflt)
{
    kiln_string s = {strlen(dflt), (char *)dflt};
    if (kiln_attr_str(n, name, NULL)) s = kiln_node_attr(n, name)->s;
    if (!s.data) {
        s.len = 0;
        s.data = "";
    }
    return s;
}

static kiln_status need_strings(const struct kiln_node *node, const kiln_tensor *t,
                                const char *what)
{
    if (t->dtype != KILN_DTYPE_STRING)
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "%s has dtype %s, expected string",
                               what, kiln_dtype_name(t->dtype));
    return KILN_OK;
}

/* ---- StringConcat ---- */

static kiln_status concat_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = kiln_infer_broadcast(ctx);
    if (st == KILN_OK && ctx->out[0]) ctx->out[0]->dtype = KILN_DTYPE_STRING;
    return st;
}

/* y = x1 + x2 elementwise, with numpy broadcasting. */
static kiln_status concat_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *a = ctx->in[0], *b = ctx->in[1];
    kiln_tensor *y = ctx->out[0];
    kiln_status st = need_strings(ctx->node, a, "X");
    if (st == KILN_OK) st = need_strings(ctx->node, b, "Y");
    if (st != KILN_OK) return st;
    const kiln_tensor *ins[2] = {a, b};
    struct kiln_bcast_iter it;
    kiln_bcast_iter_init(&it, y, 2, ins);
    int64_t n = kiln_tensor_count(y);
    for (int64_t i = 0; i < n; i++, kiln_bcast_iter_next(&it)) {
        kiln_string sa = str_at(a, it.off[0]), sb = str_at(b, it.off[1]);
        char *buf = malloc(sa.len + sb.len + 1);
        if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "StringConcat");
        memcpy(buf, sa.data, sa.len);
        memcpy(buf + sa.len, sb.data, sb.len);
        st = kiln_tensor_set_string(y, (size_t)i, buf, sa.len + sb.len);
        free(buf);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

KILN_REF_OP(StringConcat, concat_infer, concat_run);

/* ---- StringSplit ---- */

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Split s into pieces (Python str.split semantics); calls emit for each piece
 * when emit_to is non-NULL, returns the piece count. */
static int64_t split_pieces(kiln_string s, kiln_string delim, int64_t maxsplit, kiln_tensor *emit_to,
                            int64_t base, kiln_status *st)
{
    int64_t count = 0;
    size_t pos = 0;
#define EMIT(p, l)                                                                               \
    do {                                                                                         \
        if (emit_to && *st == KILN_OK)                                                           \
            *st = kiln_tensor_set_string(emit_to, (size_t)(base + count), s.data + (p), (l));    \
        count++;                                                                                 \
    } while (0)
    if (delim.len > 0) {
        for (;;) {
            size_t hit = s.len + 1;
            if (maxsplit < 0 || count < maxsplit) {
                for (size_t k = pos; k + delim.len <= s.len; k++)
                    if (memcmp(s.data + k, delim.data, delim.len) == 0) {
                        hit = k;
                        break;
                    }
            }
            if (hit > s.len) {
                EMIT(pos, s.len - pos);
                break;
            }
            EMIT(pos, hit - pos);
            pos = hit + delim.len;
        }
    } else {
        for (;;) {
            while (pos < s.len && is_space(s.data[pos])) pos++;
            if (pos >= s.len) break;
            if (maxsplit >= 0 && count >= maxsplit) { /* the rest, trailing spaces and all */
                EMIT(pos, s.len - pos);
                break;
            }
            size_t start = pos;
            while (pos < s.len && !is_space(s.data[pos])) pos++;
            EMIT(start, pos - start);
        }
    }
#undef EMIT
    return count;
}

static kiln_status split_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (ctx->out[0]) {
        kiln_type_unknown(ctx->out[0]);
        if (x && x->rank >= 0 && x->rank < KILN_MAX_RANK) {
            *ctx->out[0] = *x;
            ctx->out[0]->rank = x->rank + 1;
            ctx->out[0]->dims[x->rank] = -1;
            ctx->out[0]->sym[x->rank] = NULL;
        }
        ctx->out[0]->dtype = KILN_DTYPE_STRING;
    }
    if (ctx->n_out > 1 && ctx->out[1]) {
        if (x) *ctx->out[1] = *x;
        else kiln_type_unknown(ctx->out[1]);
        ctx->out[1]->dtype = KILN_DTYPE_I64;
    }
    return KILN_OK;
}

static kiln_status split_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_status st = need_strings(ctx->node, x, "X");
    if (st != KILN_OK) return st;
    if (x->rank >= KILN_MAX_RANK)
        return kiln_node_error(ctx->node, KILN_ERR_UNSUPPORTED, "input rank %d is too large",
                               x->rank);
    kiln_string delim = attr_bytes(ctx->node, "delimiter", "");
    int64_t maxsplit = kiln_attr_int(ctx->node, "maxsplit", -1);
    int64_t n = kiln_tensor_count(x), most = 0;
    st = kiln_tensor_new(KILN_DTYPE_I64, x->rank, x->dims, &ctx->out[1]);
    if (st != KILN_OK) return st;
    int64_t *counts = ctx->out[1]->data;
    for (int64_t i = 0; i < n; i++) {
        counts[i] = split_pieces(str_at(x, i), delim, maxsplit, NULL, 0, &st);
        if (counts[i] > most) most = counts[i];
    }
    int64_t dims[KILN_MAX_RANK];
    for (int d = 0; d < x->rank; d++) dims[d] = x->dims[d];
    dims[x->rank] = most;
    st = kiln_tensor_new(KILN_DTYPE_STRING, x->rank + 1, dims, &ctx->out[0]);
    for (int64_t i = 0; i < n && st == KILN_OK; i++)
        split_pieces(str_at(x, i), delim, maxsplit, ctx->out[0], i * most, &st);
    return st;
}

KILN_REF_OP(StringSplit, split_infer, split_run);

/* ---- StringNormalizer ---- */

static char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }
static char ascii_upper(char c) { return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c; }

/* Whether a and b are equal, ignoring ASCII case unless case_sensitive. */
static bool str_equal(kiln_string a, kiln_string b, bool case_sensitive)
{
    if (a.len != b.len) return false;
    for (size_t k = 0; k < a.len; k++) {
        char x = a.data[k], y = b.data[k];
        if (!case_sensitive) {
            x = ascii_lower(x);
            y = ascii_lower(y);
        }
        if (x != y) return false;
    }
    return true;
}

static kiln_status normalizer_infer(struct kiln_infer_ctx *ctx)
{
    const struct kiln_type *x = ctx->in[0];
    if (!ctx->out[0]) return KILN_OK;
    kiln_type_unknown(ctx->out[0]);
    ctx->out[0]->dtype = KILN_DTYPE_STRING;
    if (x && x->rank >= 0) {
        if (x->rank != 1 && !(x->rank == 2 && (x->dims[0] == 1 || x->dims[0] < 0)))
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                                   "input must be [C] or [1, C], got rank %d", x->rank);
        int64_t dims[2] = {1, -1};
        kiln_type_set(ctx->out[0], KILN_DTYPE_STRING, x->rank, x->rank == 1 ? dims + 1 : dims);
    }
    return KILN_OK;
}

/* Drop stopwords, then change case; [C] or [1, C] in, same rank out. */
static kiln_status normalizer_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_status st = need_strings(node, x, "X");
    if (st != KILN_OK) return st;
    if (x->rank != 1 && !(x->rank == 2 && x->dims[0] == 1))
        return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT, "input must be [C] or [1, C]");
    const char *action = kiln_attr_str(node, "case_change_action", "NONE");
    int mode; /* 0 none, 1 lower, 2 upper */
    if (strcmp(action, "NONE") == 0) mode = 0;
    else if (strcmp(action, "LOWER") == 0) mode = 1;
    else if (strcmp(action, "UPPER") == 0) mode = 2;
    else
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "case_change_action is '%s', expected NONE, LOWER or UPPER",
                               action);
    bool cs = kiln_attr_int(node, "is_case_sensitive", 0) != 0;
    const struct kiln_attr *sw = kiln_node_attr(node, "stopwords");
    if (sw && sw->type != KILN_ATTR_STRINGS)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "stopwords must be STRINGS");
    int64_t n = kiln_tensor_count(x), kept = 0;
    bool *keep = malloc((size_t)(n > 0 ? n : 1));
    if (!keep) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "StringNormalizer");
    for (int64_t i = 0; i < n; i++) {
        keep[i] = true;
        for (int k = 0; sw && k < sw->n && keep[i]; k++) {
            kiln_string w = sw->strings[k];
            if (!w.data) w.data = "";
            if (str_equal(str_at(x, i), w, cs)) keep[i] = false;
        }
        kept += keep[i];
    }
    /* everything removed: one empty string, as the ONNX reference returns */
    int64_t dims[2] = {1, kept > 0 ? kept : 1};
    st = kiln_tensor_new(KILN_DTYPE_STRING, x->rank, x->rank == 1 ? dims + 1 : dims, &ctx->out[0]);
    int64_t o = 0;
    for (int64_t i = 0; i < n && st == KILN_OK; i++) {
        if (!keep[i]) continue;
        kiln_string s = str_at(x, i);
        char *buf = malloc(s.len + 1);
        if (!buf) {
            st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "StringNormalizer");
            break;
        }
        for (size_t k = 0; k < s.len; k++)
            buf[k] = mode == 1 ? ascii_lower(s.data[k]) : mode == 2 ? ascii_upper(s.data[k])
                                                                   : s.data[k];
        st = kiln_tensor_set_string(ctx->out[0], (size_t)o++, buf, s.len);
        free(buf);
    }
    free(keep);
    return st;
}

KILN_REF_OP(StringNormalizer, normalizer_infer, normalizer_run);

/* ---- RegexFullMatch ---- */

/* A growing NUL-terminated buffer. */
struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 64) + n;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Translate the bracket expression starting at pat[*i] == '[' into POSIX; *i ends past ']'.
 * Returns an error message or NULL. */
static const char *re2_bracket(const char *pat, size_t n, size_t *i, struct sbuf *out)
{
    size_t k = *i + 1;
    bool neg = false, dash = false, close = false;
    struct sbuf body = {0};
    if (k < n && pat[k] == '^') {
        neg = true;
        k++;
    }
    bool first = true;
    for (; k < n; k++, first = false) {
        char c = pat[k];
        if (c == ']' && !first) break;
        if (c == '[' && k + 1 < n && pat[k + 1] == ':') { /* [:alpha:] passes through */
            const char *end = strstr(pat + k + 2, ":]");
            if (!end) break;
            sb_put(&body, pat + k, (size_t)(end + 2 - (pat + k)));
            k = (size_t)(end + 1 - pat);
            continue;
        }
        if (c == '\\' && k + 1 < n) {
            char e = pat[++k];
            switch (e) {
            case 'w': sb_str(&body, "[:alnum:]_"); break;
            case 'd': sb_str(&body, "0-9"); break;
            case 's': sb_str(&body, "[:space:]"); break;
            case 'W': case 'D': case 'S':
                free(body.p);
                return "a negated class escape inside [...]";
            case '-': dash = true; break;
            case ']': close = true; break;
            case 't': sb_str(&body, "\t"); break;
            case 'n': sb_str(&body, "\n"); break;
            case 'r': sb_str(&body, "\r"); break;
            default:
                if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
                    free(body.p);
                    return "an escape sequence inside [...]";
                }
                if (e == '^') sb_str(&body, "[.^.]"); /* a literal caret anywhere */
                else sb_put(&body, &e, 1);
            }
            continue;
        }
        if (c == ']' && first) close = true;
        else if (c == '-' && (first || (k + 1 < n && pat[k + 1] == ']'))) dash = true;
        else sb_put(&body, &c, 1);
    }
    if (k >= n) {
        free(body.p);
        return "an unterminated [...]";
    }
    /* POSIX: ']' must come first and '-' last to be literal */
    sb_str(out, neg ? "[^" : "[");
    if (close) sb_str(out, "]");
    if (body.p) sb_put(out, body.p, body.len);
    if (dash) sb_str(out, "-");
    sb_str(out, "]");
    bool oom = body.oom;
    free(body.p);
    *i = k;
    return oom ? "out of memory" : NULL;
}

/* Translate an RE2 pattern to a POSIX extended one anchored at both ends.
 * Returns an error message (unsupported construct) or NULL. */
static const char *re2_to_posix(const char *pat, size_t n, struct sbuf *out)
{
    sb_str(out, "^(");
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '[') {
            const char *err = re2_bracket(pat, n, &i, out);
            if (err) return err;
            continue;
        }
        if (c == '(' && i + 1 < n && pat[i + 1] == '?') {
            if (i + 2 < n && pat[i + 2] == ':') {
                sb_str(out, "(");
                i += 2;
                continue;
            }
            return "a (?...) group other than (?:...)";
        }
        if ((c == '*' || c == '+' || c == '?' || c == '}') && i + 1 < n && pat[i + 1] == '?') {
            sb_put(out, &c, 1); /* lazy: same full-match result */
            i++;
            continue;
        }
        if (c == '\\' && i + 1 < n) {
            char e = pat[++i];
            switch (e) {
            case 'd': sb_str(out, "[0-9]"); break;
            case 'D': sb_str(out, "[^0-9]"); break;
            case 'w': case 'W': case 's': case 'S': case 'b': case 'B':
                sb_put(out, "\\", 1);
                sb_put(out, &e, 1);
                break;
            case 'A': sb_str(out, "^"); break;
            case 'z': sb_str(out, "$"); break;
            case 't': sb_str(out, "\t"); break;
            case 'n': sb_str(out, "\n"); break;
            case 'r': sb_str(out, "\r"); break;
            case 'f': sb_str(out, "\f"); break;
            case 'v': sb_str(out, "\v"); break;
            default:
                if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
                    return "an escape sequence POSIX lacks (\\p, \\x, \\Q, back references...)";
                sb_put(out, "\\", 1); /* an escaped punctuation character */
                sb_put(out, &e, 1);
            }
            continue;
        }
        if (c == '\\') return "a trailing backslash";
        if (c == '.') sb_str(out, "[^\n]"); /* RE2's . does not match a newline */
        else sb_put(out, &c, 1);
    }
    sb_str(out, ")$");
    return out->oom ? "out of memory" : NULL;
}

static kiln_status regex_infer(struct kiln_infer_ctx *ctx)
{
    kiln_status st = kiln_infer_same(ctx);
    if (st == KILN_OK && ctx->out[0]) {
        if (!ctx->in[0]) kiln_type_unknown(ctx->out[0]);
        ctx->out[0]->dtype = KILN_DTYPE_BOOL;
    }
    return st;
}

static kiln_status regex_run(struct kiln_run_ctx *ctx)
{
    const struct kiln_node *node = ctx->node;
    const kiln_tensor *x = ctx->in[0];
    kiln_status st = need_strings(node, x, "X");
    if (st != KILN_OK) return st;
    kiln_string pat = attr_bytes(node, "pattern", "");
    if (memchr(pat.data, '\0', pat.len))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "pattern contains a NUL byte");
    struct sbuf posix = {0};
    const char *err = re2_to_posix(pat.data, pat.len, &posix);
    if (err) {
        free(posix.p);
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "pattern '%.*s' uses %s",
                               (int)pat.len, pat.data, err);
    }
    regex_t re;
    int rc = regcomp(&re, posix.p, REG_EXTENDED | REG_NOSUB);
    free(posix.p);
    if (rc != 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "pattern '%.*s' does not compile",
                               (int)pat.len, pat.data);
    int64_t n = kiln_tensor_count(x);
    uint8_t *y = ctx->out[0]->data;
    for (int64_t i = 0; i < n; i++) {
        kiln_string s = str_at(x, i);
        regmatch_t m = {.rm_so = 0, .rm_eo = (regoff_t)s.len}; /* REG_STARTEND: no NUL needed */
        y[i] = regexec(&re, s.data, 1, &m, REG_STARTEND) == 0;
    }
    regfree(&re);
    return KILN_OK;
}

KILN_REF_OP(RegexFullMatch, regex_infer, regex_run);

/* ---- TfIdfVectorizer ---- */

/* The n-gram pool: n-grams of each length, consecutive in the pool attribute. */
struct tfidf {
    int64_t min_len, max_len, max_skip, out_size;
    int mode;                  /* 1 TF, 2 IDF, 3 TFIDF */
    int n_counts;
    const int64_t *counts;     /* ngram_counts: start of each length's n-grams */
    int n_indexes;
    const int64_t *indexes;    /* ngram_indexes: output slot of each n-gram */
    int pool_n;
    const int64_t *pool_ints;  /* or */
    const kiln_string *pool_strs;
    int n_weights;
    const float *weights;
};

/* Read and check the attributes. */
static kiln_status tfidf_parse(const struct kiln_node *node, struct tfidf *t)
{
    memset(t, 0, sizeof *t);
    t->min_len = kiln_attr_int(node, "min_gram_length", 0);
    t->max_len = kiln_attr_int(node, "max_gram_length", 0);
    t->max_skip = kiln_attr_int(node, "max_skip_count", 0);
    const char *mode = kiln_attr_str(node, "mode", "");
    t->mode = strcmp(mode, "TF") == 0 ? 1 : strcmp(mode, "IDF") == 0 ? 2
                                         : strcmp(mode, "TFIDF") == 0 ? 3 : 0;
    if (!t->mode)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "mode is '%s', expected TF, IDF or TFIDF", mode);
    if (t->min_len < 1 || t->max_len < t->min_len || t->max_skip < 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "gram lengths %lld..%lld, max_skip_count %lld",
                               (long long)t->min_len, (long long)t->max_len,
                               (long long)t->max_skip);
    t->n_counts = kiln_attr_ints(node, "ngram_counts", &t->counts);
    t->n_indexes = kiln_attr_ints(node, "ngram_indexes", &t->indexes);
    if (t->n_counts < 0 || t->n_indexes < 0)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "ngram_counts and ngram_indexes are required");
    int ni = kiln_attr_ints(node, "pool_int64s", &t->pool_ints);
    const struct kiln_attr *ps = kiln_node_attr(node, "pool_strings");
    if (ps && ps->type == KILN_ATTR_STRINGS) {
        t->pool_strs = ps->strings;
        t->pool_n = ps->n;
    } else if (ni >= 0) {
        t->pool_n = ni;
    } else {
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "one of pool_int64s and pool_strings is required");
    }
    t->n_weights = kiln_attr_floats(node, "weights", &t->weights);
    if (t->n_weights < 0) t->n_weights = 0;
    t->out_size = 0;
    for (int i = 0; i < t->n_indexes; i++) {
        if (t->indexes[i] < 0)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "ngram_indexes has %lld",
                                   (long long)t->indexes[i]);
        if (t->indexes[i] + 1 > t->out_size) t->out_size = t->indexes[i] + 1;
    }
    int64_t id = 0;
    for (int i = 0; i < t->n_counts; i++) {
        int64_t start = t->counts[i], end = i + 1 < t->n_counts ? t->counts[i + 1] : t->pool_n;
        if (start < 0 || end < start || end > t->pool_n)
            return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                                   "ngram_counts does not fit a pool of %d items", t->pool_n);
        id += (end - start) / (i + 1);
    }
    if (id > t->n_indexes)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "the pool has %lld n-grams but ngram_indexes only %d",
                               (long long)id, t->n_indexes);
    if (t->mode != 1 && t->n_weights > 0 && t->n_weights < t->out_size)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "weights has %d values, expected %lld",
                               t->n_weights, (long long)t->out_size);
    return KILN_OK;
}

/* Whether input item xi equals pool item pi. */
static bool tfidf_item_eq(const struct tfidf *t, const kiln_tensor *x, int64_t xi, int64_t pi)
{
    if (t->pool_strs) {
        if (x->dtype != KILN_DTYPE_STRING) return false;
        kiln_string a = str_at(x, xi), b = t->pool_strs[pi];
        return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
    }
    return kiln_get_i64(x->dtype, x->data, xi) == t->pool_ints[pi];
}

/* The id (index into ngram_indexes) of the pool n-gram of length len formed by
 * x[pos], x[pos + step], ...; -1 if none. The last equal pool entry wins. */
static int64_t tfidf_find(const struct tfidf *t, const kiln_tensor *x, int64_t pos, int64_t step,
                          int64_t len)
{
    if (len > t->n_counts) return -1;
    int64_t id = 0;
    for (int i = 0; i < len - 1; i++) {
        int64_t end = i + 1 < t->n_counts ? t->counts[i + 1] : t->pool_n;
        id += (end - t->counts[i]) / (i + 1);
    }
    int64_t start = t->counts[len - 1];
    int64_t end = len < t->n_counts ? t->counts[len] : t->pool_n;
    int64_t found = -1;
    for (int64_t g = 0; g < (end - start) / len; g++) {
        bool eq = true;
        for (int64_t k = 0; k < len && eq; k++)
            eq = tfidf_item_eq(t, x, pos + k * step, start + g * len + k);
        if (eq) found = id + g;
    }
    return found;
}

static kiln_status tfidf_infer(struct kiln_infer_ctx *ctx)
{
    struct tfidf t;
    kiln_status st = tfidf_parse(ctx->node, &t);
    if (st != KILN_OK || !ctx->out[0]) return st;
    const struct kiln_type *x = ctx->in[0];
    kiln_type_unknown(ctx->out[0]);
    ctx->out[0]->dtype = KILN_DTYPE_F32;
    if (!x || x->rank < 0) return KILN_OK;
    if (x->rank > 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_MODEL,
                               "input must be [C] or [N, C], got rank %d", x->rank);
    int64_t dims[2] = {x->rank == 2 ? x->dims[0] : t.out_size, t.out_size};
    kiln_type_set(ctx->out[0], KILN_DTYPE_F32, x->rank == 2 ? 2 : 1, dims);
    return KILN_OK;
}

static kiln_status tfidf_run(struct kiln_run_ctx *ctx)
{
    const kiln_tensor *x = ctx->in[0];
    kiln_tensor *y = ctx->out[0];
    struct tfidf t;
    kiln_status st = tfidf_parse(ctx->node, &t);
    if (st != KILN_OK) return st;
    if (x->rank > 2)
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT, "input must be [C] or [N, C]");
    if (t.pool_strs ? x->dtype != KILN_DTYPE_STRING : !kiln_dtype_is_int(x->dtype))
        return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                               "input dtype %s does not match the pool", kiln_dtype_name(x->dtype));
    int64_t rows = x->rank == 2 ? x->dims[0] : 1;
    int64_t c = x->rank == 0 ? 1 : x->dims[x->rank - 1];
    float *out = y->data;
    for (int64_t r = 0; r < rows; r++) {
        float *freq = out + r * t.out_size;
        int64_t min_len = t.min_len;
        for (int64_t skip = 1; skip <= t.max_skip + 1; skip++) {
            for (int64_t s = 0; s < c; s++) {
                for (int64_t len = min_len; len <= t.max_len; len++) {
                    if (s + skip * (len - 1) >= c) break;
                    int64_t id = tfidf_find(&t, x, r * c + s, skip, len);
                    if (id >= 0) freq[t.indexes[id]] += 1.0f;
                }
            }
            if (min_len == 1) { /* unigrams do not depend on the skip */
                min_len = 2;
                if (min_len > t.max_len) break;
            }
        }
        for (int64_t i = 0; i < t.out_size; i++) {
            float w = t.n_weights > 0 ? t.weights[i] : 1.0f;
            if (t.mode == 2) freq[i] = freq[i] > 0 ? w : 0.0f;
            else if (t.mode == 3) freq[i] *= w;
        }
    }
    return KILN_OK;
}

KILN_REF_OP(TfIdfVectorizer, tfidf_infer, tfidf_run);
