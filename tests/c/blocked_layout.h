/*
 * blocked_layout.h - the tests' own converter between plain NCHW and the
 * layout pass's channel-blocked storage ([N][ceil(C/b)][H][W][b], padding
 * lanes zero), independent of KilnReorder: kernel_case.h and unit_dnnl.c.
 */
#ifndef KILN_TESTS_BLOCKED_LAYOUT_H
#define KILN_TESTS_BLOCKED_LAYOUT_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"

/* Element count of a [N][C][H][W] tensor stored blocked by b. */
static inline int64_t kc_blocked_count(const int64_t *d, int b)
{
    return d[0] * ((d[1] + b - 1) / b * b) * d[2] * d[3];
}

/* A copy of plain 4-D x stored blocked by b, padding lanes zero; dims stay x's. */
static inline kiln_tensor *kc_to_blocked(const kiln_tensor *x, int b)
{
    int64_t flat = kc_blocked_count(x->dims, b);
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_F32, 1, &flat, &t) != KILN_OK) abort();
    t->rank = 4;
    memcpy(t->dims, x->dims, sizeof t->dims);
    const float *s = x->data;
    float *o = t->data;
    int64_t N = x->dims[0], C = x->dims[1], HW = x->dims[2] * x->dims[3], CB = (C + b - 1) / b;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t p = 0; p < HW; p++)
                o[((n * CB + c / b) * HW + p) * b + c % b] = s[(n * C + c) * HW + p];
    return t;
}

/* Plain copy of x, stored blocked by b; *pad_bad when a padding lane is not zero. */
static inline kiln_tensor *kc_from_blocked(const kiln_tensor *x, int b, bool *pad_bad)
{
    kiln_tensor *t;
    if (kiln_tensor_new(KILN_DTYPE_F32, 4, x->dims, &t) != KILN_OK) abort();
    const float *s = x->data;
    float *o = t->data;
    int64_t N = x->dims[0], C = x->dims[1], HW = x->dims[2] * x->dims[3], CB = (C + b - 1) / b;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < CB * b; c++)
            for (int64_t p = 0; p < HW; p++) {
                float v = s[((n * CB + c / b) * HW + p) * b + c % b];
                if (c < C) o[(n * C + c) * HW + p] = v;
                else if (v != 0.0f) *pad_bad = true;
            }
    return t;
}

#endif
