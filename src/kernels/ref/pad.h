/* Pad's modes and its coordinate mapping, shared by the reference kernel (shape_ops.c)
 * and the fast one (simd/pad_nd.c), so both read the same input element. */
#ifndef KILN_KERNELS_REF_PAD_H
#define KILN_KERNELS_REF_PAD_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

/* The mode named m; false when it names none. */
static inline bool pad_mode_parse(const char *m, enum pad_mode *mode)
{
    if (strcmp(m, "constant") == 0) *mode = PAD_CONSTANT;
    else if (strcmp(m, "reflect") == 0) *mode = PAD_REFLECT;
    else if (strcmp(m, "edge") == 0) *mode = PAD_EDGE;
    else if (strcmp(m, "wrap") == 0) *mode = PAD_WRAP;
    else return false;
    return true;
}

/* Map coordinate c of a padded axis to the input axis of size n; false = constant. */
static inline bool pad_map(int64_t c, int64_t n, enum pad_mode mode, int64_t *out)
{
    if (c >= 0 && c < n) {
        *out = c;
        return true;
    }
    switch (mode) {
    case PAD_CONSTANT: return false;
    case PAD_EDGE: *out = c < 0 ? 0 : n - 1; return true;
    case PAD_WRAP: *out = ((c % n) + n) % n; return true;
    case PAD_REFLECT:
        if (n == 1) {
            *out = 0;
        } else {
            int64_t p = 2 * (n - 1);
            int64_t m = ((c % p) + p) % p;
            *out = m < n ? m : p - m;
        }
        return true;
    }
    return false;
}

#endif
