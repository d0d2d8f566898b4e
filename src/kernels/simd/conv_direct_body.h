/*
 * conv_direct_body.h - the vector loop of the plain direct convolution
 * (conv_direct.c), included by simd_body.h once per ISA table.
 *
 * One output row of a stride-1 convolution of plain (NCHW) storage with few
 * output channels: up to four output channels times 3 to 8 vectors of
 * consecutive output pixels in registers (8 to 12 independent chains); each
 * tap (input channel, ky, kx) loads the pixel vectors (stride 1: consecutive
 * input pixels) and broadcasts one weight per output channel. The input comes
 * zero-padded, with slack after each row, so every load is a whole vector.
 */

#define CD_MAX_NV 8 /* pixel vectors per register block (the slack the caller leaves) */

/* Output channels [m0, m0 + MB) of the row, NV vectors of pixels at a time: MB * NV
 * accumulators, at least 8 chains to cover the FMA latency. */
static inline __attribute__((always_inline)) void
cd_block(const struct simd_conv_row *r, int64_t m0, const int MB, const int NV)
{
    const int64_t kh = r->kh, kw = r->kw, c = r->c, wstep = c * kh * kw;
    for (int64_t ox = 0; ox < r->ow; ox += NV * W) {
        vf acc[4][CD_MAX_NV];
#pragma GCC unroll 4
        for (int i = 0; i < MB; i++) {
            vf b0 = vset(r->bias ? r->bias[m0 + i] : 0.0f);
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[i][v] = b0;
        }
        for (int64_t ci = 0; ci < c; ci++) {
            const float *xc = r->x + ci * r->x_plane + ox;
            const float *wc = r->w + (m0 * c + ci) * kh * kw;
            for (int64_t ky = 0; ky < kh; ky++) {
                const float *xr = xc + ky * r->dh * r->x_row;
                const float *wr = wc + ky * kw;
                for (int64_t kx = 0; kx < kw; kx++) {
                    vf xv[CD_MAX_NV];
#pragma GCC unroll 8
                    for (int v = 0; v < NV; v++) xv[v] = vld(xr + kx * r->dw + v * W);
#pragma GCC unroll 4
                    for (int i = 0; i < MB; i++) {
                        vf wv = vset(wr[i * wstep + kx]);
#pragma GCC unroll 8
                        for (int v = 0; v < NV; v++) acc[i][v] = vfma(wv, xv[v], acc[i][v]);
                    }
                }
            }
        }
        int64_t left = r->ow - ox;
        for (int i = 0; i < MB; i++) {
            float *y = r->y + (m0 + i) * r->y_plane + ox;
            for (int v = 0; v < NV; v++) {
                int64_t n = left - v * W;
                if (n >= W) vst(y + v * W, acc[i][v]);
                else if (n > 0) vst_part(y + v * W, acc[i][v], n);
            }
        }
    }
}

static void k_conv_direct_row(const struct simd_conv_row *r)
{
    int64_t m0 = 0;
    for (; m0 + 4 <= r->m; m0 += 4) cd_block(r, m0, 4, 3);
    switch (r->m - m0) {
    case 3: cd_block(r, m0, 3, 4); break;
    case 2: cd_block(r, m0, 2, 6); break;
    case 1: cd_block(r, m0, 1, 8); break;
    default: break;
    }
}
