/*
 * spmm.c - the plain C sparse x dense products of sparse.h (the reference
 * the AVX-512 versions in spmm_avx512.c are tested against, and the path
 * on CPUs without AVX-512), the dispatch between them, and the sparse mode
 * read from the environment.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/sparse/sparse.h"

void kiln_sparse_f32_avx512(const struct kiln_sparse_w *w, const float *in, int64_t ldi, int64_t P,
                            float *out, int64_t ldo, int64_t n0, int64_t n1,
                            const struct kiln_sparse_epi *e);
void kiln_sparse_i8_vnni(const struct kiln_sparse_w *w, const uint8_t *in, int64_t P, int32_t zp,
                         float scale_a, float *out, int64_t ldo, int64_t n0, int64_t n1,
                         const struct kiln_sparse_epi *e);

static void f32_scalar(const struct kiln_sparse_w *w, const float *in, int64_t ldi, int64_t P,
                       float *out, int64_t ldo, int64_t n0, int64_t n1, const struct kiln_sparse_epi *e)
{
    int B = w->block;
    for (int64_t n = n0; n < n1; n++) {
        float *o = out + n * ldo;
        float b0 = e->bias ? e->bias[n] : 0.0f;
        for (int64_t p = 0; p < P; p++) o[p] = 0.0f;
        for (int64_t j = w->row_ptr[n]; j < w->row_ptr[n + 1]; j++)
            for (int b = 0; b < B; b++) {
                float v = w->val[j * B + b];
                const float *row = in + ((int64_t)w->kidx[j] + b) * ldi;
                for (int64_t p = 0; p < P; p++) o[p] += v * row[p];
            }
        for (int64_t p = 0; p < P; p++) {
            float v = e->bias ? o[p] + b0 : o[p];
            o[p] = e->relu && v < 0.0f ? 0.0f : v;
        }
    }
}

static void i8_scalar(const struct kiln_sparse_w *w, const uint8_t *in, int64_t P, int32_t zp,
                      float scale_a, float *out, int64_t ldo, int64_t n0, int64_t n1,
                      const struct kiln_sparse_epi *e)
{
    for (int64_t n = n0; n < n1; n++)
        for (int64_t p = 0; p < P; p++) {
            int32_t acc = 0;
            for (int64_t j = w->row_ptr[n]; j < w->row_ptr[n + 1]; j++) {
                const uint8_t *a = in + (((int64_t)w->kidx[j] / 4) * P + p) * 4;
                const int8_t *q = w->qval + j * 4;
                acc += a[0] * q[0] + a[1] * q[1] + a[2] * q[2] + a[3] * q[3];
            }
            acc -= zp * w->wsum[n];
            float v = (float)acc * w->scale[n];
            v = v * scale_a;
            if (e->bias) v = v + e->bias[n];
            out[n * ldo + p] = e->relu && v < 0.0f ? 0.0f : v;
        }
}

void kiln_sparse_f32(int isa, const struct kiln_sparse_w *w, const float *in, int64_t ldi,
                     int64_t P, float *out, int64_t ldo, int64_t n0, int64_t n1,
                     const struct kiln_sparse_epi *e)
{
    if (isa >= 1)
        kiln_sparse_f32_avx512(w, in, ldi, P, out, ldo, n0, n1, e);
    else
        f32_scalar(w, in, ldi, P, out, ldo, n0, n1, e);
}

void kiln_sparse_i8(int isa, const struct kiln_sparse_w *w, const uint8_t *in, int64_t P,
                    int32_t zp, float scale_a, float *out, int64_t ldo, int64_t n0, int64_t n1,
                    const struct kiln_sparse_epi *e)
{
    if (isa >= 2)
        kiln_sparse_i8_vnni(w, in, P, zp, scale_a, out, ldo, n0, n1, e);
    else
        i8_scalar(w, in, P, zp, scale_a, out, ldo, n0, n1, e);
}

void kiln_sparse_tr16_avx512(const float *src, int64_t lds, int nr, float *dst, int64_t ldd, int nc);

void kiln_sparse_tr16(int isa, const float *src, int64_t lds, int nr, float *dst, int64_t ldd, int nc)
{
    if (isa >= 1) {
        kiln_sparse_tr16_avx512(src, lds, nr, dst, ldd, nc);
        return;
    }
    for (int c = 0; c < nc; c++)
        for (int i = 0; i < 16; i++) dst[c * ldd + i] = i < nr ? src[i * lds + c] : 0.0f;
}

int kiln_sparse_isa(int is_int8)
{
    const char *env = getenv("KILN_SPARSE_ISA");
    if (env && !strcmp(env, "scalar")) return 0;
    if (!__builtin_cpu_supports("avx512f")) return 0;
    if (!is_int8) return 1;
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") ? 2 : 0;
}

enum kiln_sparse_mode kiln_sparse_mode(void)
{
    const char *env = getenv("KILN_SPARSE");
    if (!env) return KILN_SPARSE_AUTO;
    if (!strcmp(env, "off") || !strcmp(env, "0")) return KILN_SPARSE_OFF;
    if (!strcmp(env, "force")) return KILN_SPARSE_FORCE;
    return KILN_SPARSE_AUTO;
}
