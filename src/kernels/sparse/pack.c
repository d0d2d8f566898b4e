/*
 * pack.c - the packed sparse weight format of sparse.h: W[K, N] (any
 * strides, so Gemm's transB needs no copy) stored as compressed rows of
 * W^T, one row per output column, each entry a block of 1 or 4 consecutive
 * k. fp32 values carry alpha; int8 values are symmetric s8 per output
 * column with the dense int8 path's formula (scale = max|w| / 127, 1 for an
 * all-zero column; q = clamp(nearbyint(w / scale), -127, 127)), and a block
 * is stored when any of its four q is nonzero.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/sparse/sparse.h"

#define SP_ALIGN64(x) (((x) + 63) / 64 * 64)

static int block_nonzero(const float *w, int64_t K, int64_t ldk, int64_t ldn, int64_t n, int64_t k0,
                         int block)
{
    for (int b = 0; b < block && k0 + b < K; b++)
        if (w[(k0 + b) * ldk + n * ldn] != 0.0f) return 1;
    return 0;
}

double kiln_sparse_density(const float *w, int64_t K, int64_t N, int64_t ldk, int64_t ldn, int block)
{
    int64_t kb = (K + block - 1) / block, nz = 0;
    if (kb * N == 0) return 1.0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < kb; j++) nz += block_nonzero(w, K, ldk, ldn, n, j * block, block);
    return (double)nz / (double)(kb * N);
}

static int8_t quant(float w, float s)
{
    float q = nearbyintf(w / s);
    return (int8_t)(q < -127.0f ? -127 : q > 127.0f ? 127 : (int)q);
}

kiln_status kiln_sparse_pack(const float *w, int64_t K, int64_t N, int64_t ldk, int64_t ldn,
                             int block, int is_int8, float alpha, struct kiln_sparse_w **out)
{
    *out = NULL;
    if (is_int8) block = 4;
    if ((block != 1 && block != 4) || K <= 0 || N <= 0 || K > INT32_MAX - 4)
        return kiln_error(KILN_ERR_INVALID_ARGUMENT, "sparse pack: bad shape %lldx%lld block %d",
                          (long long)K, (long long)N, block);
    float *scale = NULL;
    if (is_int8) {
        scale = malloc(sizeof(float) * (size_t)N);
        if (!scale) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory packing a sparse weight");
        for (int64_t n = 0; n < N; n++) {
            float mx = 0.0f;
            for (int64_t k = 0; k < K; k++) mx = fmaxf(mx, fabsf(w[k * ldk + n * ldn]));
            scale[n] = mx > 0.0f ? mx / 127.0f : 1.0f;
        }
    }
    /* count stored blocks (int8: blocks whose quantized values are not all zero) */
    int64_t kb = (K + block - 1) / block, nnzb = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < kb; j++) {
            int nz = 0;
            for (int b = 0; b < block && j * block + b < K; b++) {
                float v = w[(j * block + b) * ldk + n * ldn];
                nz |= is_int8 ? quant(v, scale[n]) != 0 : v != 0.0f;
            }
            nnzb += nz;
        }
    size_t off_rp = SP_ALIGN64(sizeof(struct kiln_sparse_w));
    size_t off_k = off_rp + SP_ALIGN64(sizeof(int64_t) * (size_t)(N + 1));
    size_t off_v = off_k + SP_ALIGN64(sizeof(int32_t) * (size_t)(nnzb > 0 ? nnzb : 1));
    size_t vbytes = is_int8 ? (size_t)nnzb * 4 : sizeof(float) * (size_t)(nnzb * block);
    size_t off_s = off_v + SP_ALIGN64(vbytes > 0 ? vbytes : 1);
    size_t total = off_s + (is_int8 ? SP_ALIGN64(sizeof(float) * (size_t)N) * 2 : 0);
    char *mem = aligned_alloc(64, total);
    if (!mem) {
        free(scale);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory packing a sparse weight (%zu bytes)",
                          total);
    }
    memset(mem, 0, off_rp);
    struct kiln_sparse_w *s = (struct kiln_sparse_w *)mem;
    s->K = K;
    s->N = N;
    s->block = block;
    s->is_int8 = is_int8;
    s->nnzb = nnzb;
    s->bytes = total;
    s->row_ptr = (int64_t *)(mem + off_rp);
    s->kidx = (int32_t *)(mem + off_k);
    if (is_int8) {
        s->qval = (int8_t *)(mem + off_v);
        s->scale = (float *)(mem + off_s);
        s->wsum = (int32_t *)(mem + off_s + SP_ALIGN64(sizeof(float) * (size_t)N));
    } else {
        s->val = (float *)(mem + off_v);
    }
    int64_t e = 0;
    for (int64_t n = 0; n < N; n++) {
        s->row_ptr[n] = e;
        int32_t sum = 0;
        for (int64_t j = 0; j < kb; j++) {
            int64_t k0 = j * block;
            if (is_int8) {
                int8_t q[4] = {0, 0, 0, 0};
                int nz = 0;
                for (int b = 0; b < 4 && k0 + b < K; b++) {
                    q[b] = quant(w[(k0 + b) * ldk + n * ldn], scale[n]);
                    nz |= q[b] != 0;
                }
                if (!nz) continue;
                s->kidx[e] = (int32_t)k0;
                memcpy(s->qval + e * 4, q, 4);
                sum += q[0] + q[1] + q[2] + q[3];
            } else {
                if (!block_nonzero(w, K, ldk, ldn, n, k0, block)) continue;
                s->kidx[e] = (int32_t)k0;
                for (int b = 0; b < block; b++)
                    s->val[e * block + b] = k0 + b < K ? w[(k0 + b) * ldk + n * ldn] * alpha : 0.0f;
            }
            e++;
        }
        if (is_int8) {
            s->scale[n] = scale[n] * alpha;
            s->wsum[n] = sum;
        }
    }
    s->row_ptr[N] = e;
    free(scale);
    *out = s;
    return KILN_OK;
}
