/*
 * pool_body.h - the vector loops of the SIMD pooling kernels (simd/pool.c),
 * included by simd_body.h once per ISA table.
 *
 * Storage is "channels inner": each pixel holds `inner` consecutive floats (one
 * channel block of a blocked layout, or all C channels of a channels-last
 * image), so every tap of a window is a run of vector loads and the lanes are
 * channels; partial vectors go through vld_part / vst_part.
 *
 * Max keeps NaN: a window that holds a NaN gives NaN (vmaxs alone would drop it,
 * as its result for a NaN operand is the other one).
 */

static inline vf pool_max_step(vf acc, vf v) { return vsel(vnan(v), vmaxs(v, acc), v); }

/* acc + v for an average, pool_max_step for a max. */
static inline vf pool_comb(vf acc, vf v, bool avg)
{
    if (avg) return acc + v;
    return pool_max_step(acc, v);
}

#define POOL_LD(p) (m == W ? vld(p) : vld_part((p), m, 0.0f))

/* Four output pixels ox0 .. ox0 + 3 whose windows lie inside the row (every tap valid):
 * four independent chains, so that a tap costs its throughput, not the latency of the
 * max and blend it waits on. Instantiated with constant kw (KW > 0: 2 and 3, the
 * usual windows, fully unrolled; 0: p->kw), kind and full vectors (FULL: inner is a
 * multiple of W, no partial loads). */
static inline __attribute__((always_inline)) void
pool_quad(const float *const *rows, int nrows, float *y, int64_t ox0,
          const struct simd_pool_row *p, float scale, const int KW, const bool AVG,
          const bool FULL)
{
    const int64_t in = p->inner, dw = p->dw, kw = KW ? KW : p->kw, step = p->sw * in;
    const int64_t x0 = ox0 * p->sw - p->pw;
    for (int64_t c = 0; c < in; c += W) {
        const int64_t m = FULL ? W : in - c < W ? in - c : W;
        const float *b0 = rows[0] + x0 * in + c;
        vf a0 = POOL_LD(b0), a1 = POOL_LD(b0 + step), a2 = POOL_LD(b0 + 2 * step),
           a3 = POOL_LD(b0 + 3 * step);
        for (int r = 0; r < nrows; r++) {
            const float *xr = rows[r] + x0 * in + c;
#pragma GCC unroll 4
            for (int64_t kx = 0; kx < kw; kx++) {
                if (r == 0 && kx == 0) continue;
                const float *t = xr + kx * dw * in;
                vf v0 = POOL_LD(t), v1 = POOL_LD(t + step), v2 = POOL_LD(t + 2 * step),
                   v3 = POOL_LD(t + 3 * step);
                if (AVG) {
                    a0 = a0 + v0;
                    a1 = a1 + v1;
                    a2 = a2 + v2;
                    a3 = a3 + v3;
                } else {
                    a0 = pool_max_step(a0, v0);
                    a1 = pool_max_step(a1, v1);
                    a2 = pool_max_step(a2, v2);
                    a3 = pool_max_step(a3, v3);
                }
            }
        }
        if (AVG) {
            const vf sc = vset(scale);
            a0 = a0 * sc;
            a1 = a1 * sc;
            a2 = a2 * sc;
            a3 = a3 * sc;
        }
        float *yo = y + ox0 * in + c;
        if (m == W) {
            vst(yo, a0);
            vst(yo + in, a1);
            vst(yo + 2 * in, a2);
            vst(yo + 3 * in, a3);
        } else {
            vst_part(yo, a0, m);
            vst_part(yo + in, a1, m);
            vst_part(yo + 2 * in, a2, m);
            vst_part(yo + 3 * in, a3, m);
        }
    }
}

/* The pixels [lo, hi) of one row in fours, on the instance of pool_quad for the window. */
static void pool_quads(const float *const *rows, int nrows, float *y, int64_t lo, int64_t hi,
                       const struct simd_pool_row *p, float scale)
{
    const bool avg = p->kind == SIMD_POOL_AVG, full = p->inner % W == 0;
#define POOL_QUADS(KW, AVG, FULL)                                                        \
    for (int64_t ox = lo; ox + 4 <= hi; ox += 4)                                         \
        pool_quad(rows, nrows, y, ox, p, scale, KW, AVG, FULL);
    if (!full) {
        if (avg) POOL_QUADS(0, true, false) else POOL_QUADS(0, false, false)
    } else if (p->kw == 3) {
        if (avg) POOL_QUADS(3, true, true) else POOL_QUADS(3, false, true)
    } else if (p->kw == 2) {
        if (avg) POOL_QUADS(2, true, true) else POOL_QUADS(2, false, true)
    } else {
        if (avg) POOL_QUADS(0, true, true) else POOL_QUADS(0, false, true)
    }
#undef POOL_QUADS
}

/* A row of plain storage (inner 1: one channel's rows, as a 1-D pool's [N, C, L] keeps
 * them): stride-1 windows inside the row W outputs at a time (consecutive outputs read
 * consecutive inputs), non-overlapping windows of 2 or 4 W outputs at a time (vdeint),
 * everything else one output at a time. */
static void pool_plain_row(const float *const *rows, int nrows, float *y,
                           const struct simd_pool_row *p)
{
    const int64_t dw = p->dw, kw = p->kw, sw = p->sw;
    const bool avg = p->kind == SIMD_POOL_AVG;
    int64_t lo = (p->pw + sw - 1) / sw, hi = 0;
    int64_t last = p->iw - 1 - (kw - 1) * dw + p->pw;
    if (last >= 0) hi = last / sw + 1;
    if (hi > p->ow) hi = p->ow;
    int64_t vend = lo; /* outputs [lo, vend) done by vectors */
    /* the interior's divisor: every tap valid */
    const float scale = avg ? 1.0f / (float)((p->include_pad ? p->rows_counted : nrows) * kw)
                            : 1.0f;
    const vf sc = vset(scale);
    if ((sw == 2 || sw == 4) && kw == sw && dw == 1 && nrows > 0 && hi - lo >= W) {
        /* non-overlapping windows of 2 or 4 (a 1-D CNN's downsampling): sw vectors of
         * consecutive inputs hold W windows; split pairs by parity and combine, twice for 4 */
        for (; vend + W <= hi; vend += W) {
            const int64_t x0 = vend * sw - p->pw;
            vf v[4];
            for (int i = 0; i < sw; i++) {
                vf acc = vld(rows[0] + x0 + i * W);
                for (int r = 1; r < nrows; r++) {
                    vf t = vld(rows[r] + x0 + i * W);
                    acc = pool_comb(acc, t, avg);
                }
                v[i] = acc;
            }
            vf e, o;
            vdeint(v[0], v[1], &e, &o);
            vf m = pool_comb(e, o, avg);
            if (sw == 4) {
                vdeint(v[2], v[3], &e, &o);
                vf m1 = pool_comb(e, o, avg);
                vdeint(m, m1, &e, &o);
                m = pool_comb(e, o, avg);
            }
            if (avg) m = m * sc;
            vst(y + vend, m);
        }
    }
    if (sw == 1 && nrows > 0 && hi - lo >= W) {
        for (; vend + W <= hi; vend += W) {
            const int64_t x0 = vend - p->pw;
            vf acc = vld(rows[0] + x0);
            for (int r = 0; r < nrows; r++)
                for (int64_t kx = r == 0 ? 1 : 0; kx < kw; kx++) {
                    vf v = vld(rows[r] + x0 + kx * dw);
                    if (avg) acc = acc + v;
                    else acc = pool_max_step(acc, v);
                }
            if (avg) acc = acc * sc;
            vst(y + vend, acc);
        }
    }
    if (nrows > 0 && hi > vend) { /* the rest of the interior: every tap valid, no division */
        int64_t ox = vend;
        for (; ox + 8 <= hi; ox += 8) { /* eight independent chains */
            const int64_t x0 = ox * sw - p->pw;
            float acc[8];
            for (int j = 0; j < 8; j++) acc[j] = rows[0][x0 + j * sw];
            for (int r = 0; r < nrows; r++) {
                const float *xr = rows[r] + x0;
                for (int64_t kx = r == 0 ? 1 : 0; kx < kw; kx++)
                    for (int j = 0; j < 8; j++) {
                        float v = xr[j * sw + kx * dw];
                        if (avg) acc[j] += v;
                        else acc[j] = v != v ? v : v > acc[j] ? v : acc[j];
                    }
            }
            for (int j = 0; j < 8; j++) y[ox + j] = avg ? acc[j] * scale : acc[j];
        }
        for (; ox < hi; ox++) {
            const int64_t x0 = ox * sw - p->pw;
            float acc = rows[0][x0];
            for (int r = 0; r < nrows; r++) {
                const float *xr = rows[r] + x0;
                for (int64_t kx = r == 0 ? 1 : 0; kx < kw; kx++) {
                    float v = xr[kx * dw];
                    if (avg) acc += v;
                    else acc = v != v ? v : v > acc ? v : acc;
                }
            }
            y[ox] = avg ? acc * scale : acc;
        }
        vend = hi > vend ? hi : vend;
    }
    for (int64_t ox = 0; ox < p->ow; ox++) {
        if (ox == lo && vend > lo) {
            ox = vend - 1;
            continue;
        }
        const int64_t x0 = ox * sw - p->pw;
        int64_t k0 = x0 >= 0 ? 0 : (-x0 + dw - 1) / dw;
        int64_t k1 = (p->iw - x0 + dw - 1) / dw;
        if (k1 > kw) k1 = kw;
        if (k1 <= k0 || nrows <= 0) {
            y[ox] = 0.0f;
            continue;
        }
        float acc = rows[0][x0 + k0 * dw];
        for (int r = 0; r < nrows; r++)
            for (int64_t kx = r == 0 ? k0 + 1 : k0; kx < k1; kx++) {
                float v = rows[r][x0 + kx * dw];
                if (avg) acc += v;
                else acc = v != v ? v : v > acc ? v : acc;
            }
        if (avg) {
            int64_t cols = k1 - k0, cnt = (int64_t)nrows * cols;
            if (p->include_pad) {
                cols = (p->iw + p->pr - x0 + dw - 1) / dw;
                if (cols > kw) cols = kw;
                cnt = p->rows_counted * cols;
            }
            acc /= (float)cnt;
        }
        y[ox] = acc;
    }
}

static void k_pool_row(const float *const *rows, int nrows, float *y,
                       const struct simd_pool_row *p)
{
    if (p->inner == 1) {
        pool_plain_row(rows, nrows, y, p);
        return;
    }
    const int64_t in = p->inner, dw = p->dw;
    const bool avg = p->kind == SIMD_POOL_AVG;
    /* [lo, hi): the pixels whose windows lie inside the row */
    int64_t lo = (p->pw + p->sw - 1) / p->sw, hi = 0;
    int64_t last = p->iw - 1 - (p->kw - 1) * dw + p->pw; /* the last window's start, padded */
    if (last >= 0) hi = last / p->sw + 1;
    if (hi > p->ow) hi = p->ow;
    if (nrows > 0 && hi - lo >= 4) {
        float scale = avg ? 1.0f / (float)((p->include_pad ? p->rows_counted : nrows) * p->kw)
                          : 1.0f;
        pool_quads(rows, nrows, y, lo, hi, p, scale);
    } else {
        lo = hi = 0;
    }
    int64_t quads_end = lo + (hi - lo) / 4 * 4;
    for (int64_t ox = 0; ox < p->ow; ox++) {
        if (ox == lo && quads_end > lo) {
            ox = quads_end - 1;
            continue;
        }
        int64_t x0 = ox * p->sw - p->pw;
        int64_t k0 = x0 >= 0 ? 0 : (-x0 + dw - 1) / dw;
        int64_t k1 = (p->iw - x0 + dw - 1) / dw; /* taps below k1 land before iw */
        if (k1 > p->kw) k1 = p->kw;
        float *yo = y + ox * in;
        if (k1 <= k0 || nrows <= 0) { /* no input in the window: the layer declines these */
            for (int64_t c = 0; c < in; c += W) {
                int64_t m = in - c < W ? in - c : W;
                vst_part(yo + c, vset(0.0f), m);
            }
            continue;
        }
        float scale = 1.0f;
        if (avg) {
            int64_t cols = k1 - k0;
            if (p->include_pad) { /* taps inside the input or its declared padding */
                cols = (p->iw + p->pr - x0 + dw - 1) / dw;
                if (cols > p->kw) cols = p->kw;
                scale = 1.0f / (float)(p->rows_counted * cols);
            } else {
                scale = 1.0f / (float)((int64_t)nrows * cols);
            }
        }
        const float *first = rows[0] + (x0 + k0 * dw) * in;
        for (int64_t c = 0; c < in; c += W) {
            int64_t m = in - c < W ? in - c : W;
            vf acc = POOL_LD(first + c);
            for (int r = 0; r < nrows; r++) {
                const float *xr = rows[r] + (x0 + k0 * dw) * in + c;
                for (int64_t kx = r == 0 ? 1 : 0; kx < k1 - k0; kx++) {
                    vf v = POOL_LD(xr + kx * dw * in);
                    if (avg) acc = acc + v;
                    else acc = pool_max_step(acc, v);
                }
            }
            if (avg) acc = acc * vset(scale);
            if (m == W) vst(yo + c, acc);
            else vst_part(yo + c, acc, m);
        }
    }
}

/* y[c] for c < n_out (<= inner): the max, or the sum times scale, of x[p * inner + c] over
 * the pixels p < pixels. Sums run in float per 256 pixels and add up across them. */
static void k_pool_global(const float *x, int64_t pixels, int64_t inner, float *y,
                          int64_t n_out, int kind, float scale)
{
    const bool avg = kind == SIMD_POOL_AVG;
    for (int64_t c = 0; c < n_out; c += W) {
        int64_t m = inner - c < W ? inner - c : W;
        const float *xc = x + c;
        vf acc;
        if (avg) {
            acc = vset(0.0f);
            for (int64_t p0 = 0; p0 < pixels; p0 += 256) {
                int64_t p1 = p0 + 256 < pixels ? p0 + 256 : pixels;
                vf a0 = vset(0.0f), a1 = vset(0.0f);
                int64_t q = p0;
                for (; q + 2 <= p1; q += 2) {
                    a0 = a0 + POOL_LD(xc + q * inner);
                    a1 = a1 + POOL_LD(xc + (q + 1) * inner);
                }
                if (q < p1) a0 = a0 + POOL_LD(xc + q * inner);
                acc = acc + (a0 + a1);
            }
            acc = acc * vset(scale);
        } else {
            acc = POOL_LD(xc);
            for (int64_t q = 1; q < pixels; q++) acc = pool_max_step(acc, POOL_LD(xc + q * inner));
        }
        int64_t keep = n_out - c < W ? n_out - c : W;
        if (keep == W) vst(y + c, acc);
        else vst_part(y + c, acc, keep);
    }
}

#undef POOL_LD
