/*
 * cast.c - reference kernels for Cast and CastLike: conversion between every
 * Kiln dtype, strings included.
 *
 * Numbers convert with ONNX's rules (float to int truncates toward zero,
 * anything nonzero is true); double to float16/bfloat16 rounds once, like
 * numpy, rather than through float32. Numbers cast to strings are written
 * the way numpy's astype(str) writes them, since that is what ONNX's tests
 * expect: the shortest digits that read back to the same value, positional
 * for magnitudes in [1e-4, 1e16) ("0.1", "1.0", "123456790.0") and
 * scientific otherwise ("1e-05", "1.5e+20"), "nan", "inf", "True"/"False".
 * Strings cast to numbers are parsed with strtod/strtoll ("NaN", "INF",
 * "-inf" and "1e3" are all read); a string that is not a number is an error.
 *
 * Casts to float8 round to nearest even and follow the 'saturate'
 * attribute (default 1: out-of-range values and infinities become the
 * largest finite value; 0: inf where the type has one, else NaN); float4
 * always saturates. Casts to float8e8m0 round by the 'round_mode'
 * attribute ("up", "down", "nearest"). int4 / int2 wrap like the other
 * integer types. Complex types are not supported: a 'to' attribute naming
 * one is rejected as unsupported.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "kernels/kernel.h"

/* Cast's target dtype from its 'to' attribute. */
static kiln_status cast_target(const struct kiln_node *node, kiln_dtype *out)
{
    const struct kiln_attr *a = kiln_node_attr(node, "to");
    if (!a || a->type != KILN_ATTR_INT)
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL, "attribute 'to' is missing");
    *out = kiln_onnx_dtype(a->i);
    if (*out == KILN_DTYPE_UNDEFINED)
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED,
                               "attribute 'to' is ONNX dtype %lld, which Kiln does not support",
                               (long long)a->i);
    return KILN_OK;
}

/* Output: input 0's shape with dtype dt. */
static void infer_as(struct kiln_infer_ctx *ctx, kiln_dtype dt)
{
    if (!ctx->out[0]) return;
    if (ctx->in[0]) *ctx->out[0] = *ctx->in[0];
    else kiln_type_unknown(ctx->out[0]);
    ctx->out[0]->dtype = dt;
}

static kiln_status Cast_infer(struct kiln_infer_ctx *ctx)
{
    kiln_dtype to;
    kiln_status st = cast_target(ctx->node, &to);
    if (st != KILN_OK) return st;
    infer_as(ctx, to);
    return KILN_OK;
}

static kiln_status CastLike_infer(struct kiln_infer_ctx *ctx)
{
    infer_as(ctx, ctx->in[1] ? ctx->in[1]->dtype : KILN_DTYPE_UNDEFINED);
    return KILN_OK;
}

/* ---- Numbers ---- */

/* v rounded to float32 toward zero with the lowest bit set when inexact ("round to odd"):
 * rounding that to a narrower float then equals rounding v directly. */
static float f32_round_odd(double v)
{
    float f = (float)v;
    if (isnan(v) || (double)f == v) return f;
    if (fabs((double)f) > fabs(v)) f = nextafterf(f, 0.0f);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= 1;
    memcpy(&f, &bits, 4);
    return f;
}

/* Store double v as float16 or bfloat16 element i, rounding once. */
static void store_half(kiln_dtype dt, void *data, int64_t i, double v)
{
    float f = f32_round_odd(v);
    ((uint16_t *)data)[i] = dt == KILN_DTYPE_F16 ? kiln_f32_to_f16(f) : kiln_f32_to_bf16(f);
}

/* Convert element si of src to element di of dst (both numeric). */
static void convert_number(kiln_dtype to, void *dst, int64_t di, kiln_dtype from, const void *src,
                           int64_t si)
{
    bool to_half = to == KILN_DTYPE_F16 || to == KILN_DTYPE_BF16;
    if (to_half && from != KILN_DTYPE_F32 && from != KILN_DTYPE_F16 && from != KILN_DTYPE_BF16) {
        double v = from == KILN_DTYPE_U64 ? (double)((const uint64_t *)src)[si]
                                          : kiln_get_f64(from, src, si);
        store_half(to, dst, di, v);
        return;
    }
    kiln_convert_elem(to, dst, di, from, src, si);
}

/* ---- Numbers to strings ---- */

/* Whether text reads back as v in dtype dt. */
static bool reads_back(kiln_dtype dt, const char *text, double v)
{
    switch (dt) {
    case KILN_DTYPE_F32: return strtof(text, NULL) == (float)v;
    case KILN_DTYPE_F16: return kiln_f32_to_f16(f32_round_odd(strtod(text, NULL))) ==
                                kiln_f32_to_f16((float)v);
    case KILN_DTYPE_BF16: return kiln_f32_to_bf16(f32_round_odd(strtod(text, NULL))) ==
                                 kiln_f32_to_bf16((float)v);
    default: return strtod(text, NULL) == v;
    }
}

/* Write float v (a value of dtype dt) as numpy's str() does. */
static void format_float(kiln_dtype dt, double v, char *buf, size_t n)
{
    if (isnan(v)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, n, v < 0 ? "-inf" : "inf");
        return;
    }
    if (v == 0) {
        snprintf(buf, n, signbit(v) ? "-0.0" : "0.0");
        return;
    }
    /* shortest "%.*e" that reads back: d.ddde[+-]XX */
    char sci[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec, v);
        if (reads_back(dt, sci, v)) break;
    }
    char digits[24];
    int nd = 0;
    const char *p = sci[0] == '-' ? sci + 1 : sci;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < (int)sizeof digits - 1) digits[nd++] = *p;
    int exp10 = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';

    size_t o = 0;
    char out[64];
    if (v < 0) out[o++] = '-';
    double a = fabs(v);
    if (a >= 1e-4 && a < 1e16) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (exp10 + 1 < nd) {
                for (int i = exp10 + 1; i < nd; i++) out[o++] = digits[i];
            } else {
                out[o++] = '0';
            }
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
    }
    snprintf(buf, n, "%s", out);
}

/* Write element i of numeric tensor x as text. */
static void format_number(const kiln_tensor *x, int64_t i, char *buf, size_t n)
{
    kiln_dtype dt = x->dtype;
    if (dt == KILN_DTYPE_BOOL) {
        snprintf(buf, n, "%s", ((const uint8_t *)x->data)[i] ? "True" : "False");
    } else if (kiln_dtype_is_float(dt)) {
        format_float(dt, kiln_get_f64(dt, x->data, i), buf, n);
    } else if (dt == KILN_DTYPE_U64) {
        snprintf(buf, n, "%llu", (unsigned long long)((const uint64_t *)x->data)[i]);
    } else {
        snprintf(buf, n, "%lld", (long long)kiln_get_i64(dt, x->data, i));
    }
}

/* ---- Strings to numbers ---- */

/* Whether the rest of s is only whitespace. */
static bool only_space(const char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    return *s == '\0';
}

/* Parse text as a number of dtype dt into element i of data; false if it is not one. */
static bool parse_number(const char *text, kiln_dtype dt, void *data, int64_t i)
{
    char *end;
    errno = 0;
    if (dt == KILN_DTYPE_BOOL) {
        const char *s = text;
        while (*s == ' ' || *s == '\t') s++;
        if (strncasecmp(s, "true", 4) == 0 && only_space(s + 4)) {
            ((uint8_t *)data)[i] = 1;
            return true;
        }
        if (strncasecmp(s, "false", 5) == 0 && only_space(s + 5)) {
            ((uint8_t *)data)[i] = 0;
            return true;
        }
    }
    if (kiln_dtype_is_int(dt)) {
        if (dt == KILN_DTYPE_U64) {
            unsigned long long u = strtoull(text, &end, 10);
            if (end != text && only_space(end) && errno == 0 && !strchr(text, '-')) {
                ((uint64_t *)data)[i] = u;
                return true;
            }
        } else {
            long long v = strtoll(text, &end, 10);
            if (end != text && only_space(end) && errno == 0) {
                kiln_set_i64(dt, data, i, v);
                return true;
            }
        }
        errno = 0;
    }
    if (dt == KILN_DTYPE_F32) {
        float f = strtof(text, &end);
        if (end == text || !only_space(end)) return false;
        ((float *)data)[i] = f;
        return true;
    }
    double v = strtod(text, &end);
    if (end == text || !only_space(end)) return false;
    if (dt == KILN_DTYPE_F16 || dt == KILN_DTYPE_BF16) store_half(dt, data, i, v);
    else if (kiln_dtype_is_int(dt)) kiln_set_f64(dt, data, i, trunc(v));
    else kiln_set_f64(dt, data, i, v);
    return true;
}

/* ---- The kernel ---- */

/* Whether dt is a float8 or float4 type (the ones 'saturate' and 'round_mode' concern). */
static bool is_small_float(kiln_dtype dt)
{
    return dt == KILN_DTYPE_F8E4M3FN || dt == KILN_DTYPE_F8E4M3FNUZ || dt == KILN_DTYPE_F8E5M2 ||
           dt == KILN_DTYPE_F8E5M2FNUZ || dt == KILN_DTYPE_F4E2M1 || dt == KILN_DTYPE_F8E8M0;
}

/* Cast's 'round_mode' attribute (for float8e8m0 targets). */
static kiln_status cast_round_mode(const struct kiln_node *node, enum kiln_e8m0_round *out)
{
    const char *m = kiln_attr_str(node, "round_mode", "up");
    if (strcmp(m, "up") == 0) *out = KILN_E8M0_ROUND_UP;
    else if (strcmp(m, "down") == 0) *out = KILN_E8M0_ROUND_DOWN;
    else if (strcmp(m, "nearest") == 0) *out = KILN_E8M0_ROUND_NEAREST;
    else
        return kiln_node_error(node, KILN_ERR_INVALID_MODEL,
                               "round_mode is '%s', expected 'up', 'down' or 'nearest'", m);
    return KILN_OK;
}

/* y = x converted to a float8 / float4 dtype with Cast's saturate and round_mode. */
static kiln_status cast_to_small_float(const struct kiln_node *node, const kiln_tensor *x,
                                       kiln_tensor *y)
{
    bool saturate = kiln_attr_int(node, "saturate", 1) != 0;
    enum kiln_e8m0_round mode = KILN_E8M0_ROUND_UP;
    kiln_status st = cast_round_mode(node, &mode);
    if (st != KILN_OK) return st;
    int64_t n = kiln_shape_count(x->rank, x->dims);
    uint8_t *ys = y->data;
    for (int64_t i = 0; i < n; i++) {
        double v = x->dtype == KILN_DTYPE_U64 ? (double)((const uint64_t *)x->data)[i]
                                              : kiln_get_f64(x->dtype, x->data, i);
        if (y->dtype == KILN_DTYPE_F8E8M0) ys[i] = kiln_f32_to_e8m0((float)v, saturate, mode);
        else ys[i] = kiln_f64_to_f8(y->dtype, v, saturate);
    }
    return KILN_OK;
}

/* y = x converted to y's dtype, element by element. */
static kiln_status cast_run(const struct kiln_node *node, const kiln_tensor *x, kiln_tensor *y)
{
    kiln_dtype from = x->dtype, to = y->dtype;
    int64_t n = kiln_shape_count(x->rank, x->dims);
    bool from_str = from == KILN_DTYPE_STRING, to_str = to == KILN_DTYPE_STRING;
    if ((!from_str && !kiln_dtype_is_numeric(from)) || (!to_str && !kiln_dtype_is_numeric(to)))
        return kiln_node_error(node, KILN_ERR_UNSUPPORTED, "cast from %s to %s is not supported",
                               kiln_dtype_name(from), kiln_dtype_name(to));

    if (from_str) {
        const kiln_string *s = x->data;
        for (int64_t i = 0; i < n; i++) {
            const char *bytes = s[i].data ? s[i].data : "";
            if (to_str) {
                kiln_status st = kiln_tensor_set_string(y, (size_t)i, bytes, s[i].len);
                if (st != KILN_OK) return st;
                continue;
            }
            char text[256];
            if (s[i].len >= sizeof text)
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "element %lld is a %zu-byte string, not a number",
                                       (long long)i, s[i].len);
            memcpy(text, bytes, s[i].len);
            text[s[i].len] = '\0';
            if (strlen(text) != s[i].len || !parse_number(text, to, y->data, i))
                return kiln_node_error(node, KILN_ERR_INVALID_ARGUMENT,
                                       "element %lld ('%s') is not a %s number", (long long)i,
                                       text, kiln_dtype_name(to));
        }
        return KILN_OK;
    }
    if (to_str) {
        for (int64_t i = 0; i < n; i++) {
            char text[64];
            format_number(x, i, text, sizeof text);
            kiln_status st = kiln_tensor_set_string(y, (size_t)i, text, strlen(text));
            if (st != KILN_OK) return st;
        }
        return KILN_OK;
    }
    if (from == to) {
        memcpy(y->data, x->data, (size_t)n * kiln_dtype_size(from));
        return KILN_OK;
    }
    if (is_small_float(to)) return cast_to_small_float(node, x, y);
    if (from == KILN_DTYPE_F32 && to == KILN_DTYPE_F16) {
        const float *xs = x->data;
        uint16_t *ys = y->data;
        for (int64_t i = 0; i < n; i++) ys[i] = kiln_f32_to_f16(xs[i]);
        return KILN_OK;
    }
    if (from == KILN_DTYPE_F16 && to == KILN_DTYPE_F32) {
        const uint16_t *xs = x->data;
        float *ys = y->data;
        for (int64_t i = 0; i < n; i++) ys[i] = kiln_f16_to_f32(xs[i]);
        return KILN_OK;
    }
    for (int64_t i = 0; i < n; i++) convert_number(to, y->data, i, from, x->data, i);
    return KILN_OK;
}

static kiln_status Cast_run(struct kiln_run_ctx *ctx)
{
    kiln_dtype to;
    kiln_status st = cast_target(ctx->node, &to);
    if (st != KILN_OK) return st;
    if (ctx->out[0]->dtype != to)
        return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "output has dtype %s, expected %s",
                               kiln_dtype_name(ctx->out[0]->dtype), kiln_dtype_name(to));
    return cast_run(ctx->node, ctx->in[0], ctx->out[0]);
}
KILN_REF_OP(Cast, Cast_infer, Cast_run);

static kiln_status CastLike_run(struct kiln_run_ctx *ctx)
{
    if (ctx->out[0]->dtype != ctx->in[1]->dtype)
        return kiln_node_error(ctx->node, KILN_ERR_INTERNAL, "output has dtype %s, expected %s",
                               kiln_dtype_name(ctx->out[0]->dtype),
                               kiln_dtype_name(ctx->in[1]->dtype));
    return cast_run(ctx->node, ctx->in[0], ctx->out[0]);
}
KILN_REF_OP(CastLike, CastLike_infer, CastLike_run);
