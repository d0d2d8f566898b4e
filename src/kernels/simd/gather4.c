/*
 * gather4.c - the per-axis copy of 4-D float32 tensors in plain and blocked
 * layouts (gather4.h). Offsets of every picked channel, row and column are
 * tabled at compile time; a run walks output rows (one image, one channel
 * or block of channels, one row) split over the run's threads.
 */
#include "kernels/simd/gather4.h"

#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"

static int64_t blocks(int64_t c, int l)
{
    return l ? (c + l - 1) / l : c;
}

kiln_status kiln_gather4_init(struct kiln_gather4 *g, const int64_t *xd, int lx, int64_t c_total,
                              int64_t h, int64_t w, int ly, int64_t c_lo, int64_t nc,
                              const int64_t *chan, int64_t r0, int64_t rs, int64_t c0, int64_t cs)
{
    memset(g, 0, sizeof *g);
    g->n = xd[0];
    g->c_total = c_total;
    g->h = h;
    g->w = w;
    g->c_lo = c_lo;
    g->c_hi = c_lo + nc;
    g->ly = ly;
    g->lx = lx;
    int64_t hw = xd[2] * xd[3], px = lx ? lx : 1;
    g->x_image = (lx ? blocks(xd[1], lx) * lx : xd[1]) * hw;
    int64_t nb = ly ? blocks(c_total, ly) : 0;
    g->coff = malloc(sizeof(int64_t) * (size_t)(nc + h + w + 1));
    g->whole = calloc((size_t)nb + 1, 1);
    if (!g->coff || !g->whole) {
        kiln_gather4_free(g);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a channel copy");
    }
    g->roff = g->coff + nc;
    g->woff = g->roff + h;
    for (int64_t k = 0; k < nc; k++) {
        int64_t c = chan[k];
        g->coff[k] = lx ? (c / lx) * hw * lx + c % lx : c * hw;
    }
    for (int64_t r = 0; r < h; r++) g->roff[r] = (r0 + r * rs) * xd[3] * px;
    for (int64_t q = 0; q < w; q++) g->woff[q] = (c0 + q * cs) * px;
    g->w_contig = cs == 1;
    /* output blocks that are one whole input block: lanes 0..ly-1 all written, from
     * input channels b*ly .. b*ly+ly-1 of one block, none of them beyond c_total */
    for (int64_t b = 0; ly && ly == lx && b < nb; b++) {
        int64_t first = b * ly;
        if (first < c_lo || first + ly > g->c_hi || first + ly > c_total) continue;
        int64_t c = chan[first - c_lo];
        if (c % lx || c + ly > xd[1]) continue;
        int ok = 1;
        for (int j = 1; j < ly && ok; j++) ok = chan[first - c_lo + j] == c + j;
        g->whole[b] = (unsigned char)ok;
    }
    return KILN_OK;
}

void kiln_gather4_free(struct kiln_gather4 *g)
{
    free(g->coff);
    free(g->whole);
    g->coff = NULL;
    g->whole = NULL;
}

struct g4_job {
    const struct kiln_gather4 *g;
    const float *x;
    float *y;
    int64_t units; /* output channels (plain) or blocks touched (blocked) per image */
    int64_t u0;    /* the first of them */
};

static void g4_range(void *arg, int64_t begin, int64_t end)
{
    const struct g4_job *j = arg;
    const struct kiln_gather4 *g = j->g;
    int64_t h = g->h, w = g->w;
    int ly = g->ly, px = g->lx ? g->lx : 1;
    int64_t y_units = ly ? (g->c_total + ly - 1) / ly : g->c_total;
    for (int64_t it = begin; it < end; it++) {
        int64_t r = it % h, u = j->u0 + (it / h) % j->units, n = it / h / j->units;
        const float *xn = j->x + n * g->x_image + g->roff[r];
        if (!ly) { /* plain output: channel u */
            float *dst = j->y + ((n * y_units + u) * h + r) * w;
            const float *src = xn + g->coff[u - g->c_lo];
            if (g->w_contig && px == 1) {
                memcpy(dst, src + g->woff[0], sizeof(float) * (size_t)w);
            } else {
                for (int64_t q = 0; q < w; q++) dst[q] = src[g->woff[q]];
            }
            continue;
        }
        float *dst = j->y + ((n * y_units + u) * h + r) * w * ly;
        if (g->whole[u] && g->w_contig) {
            memcpy(dst, xn + g->coff[u * ly - g->c_lo] + g->woff[0],
                   sizeof(float) * (size_t)(w * ly));
            continue;
        }
        /* lanes [l0, l1) are copied, lanes from lz on are padding to zero */
        const float *lane[16];
        int l0 = ly, l1 = 0, lz = ly;
        for (int l = 0; l < ly; l++) {
            int64_t c = u * ly + l;
            if (c >= g->c_total) {
                if (g->c_hi == g->c_total && l < lz) lz = l;
                continue;
            }
            if (c < g->c_lo || c >= g->c_hi) continue;
            lane[l] = xn + g->coff[c - g->c_lo];
            if (l < l0) l0 = l;
            l1 = l + 1;
        }
        for (int64_t q = 0; q < w; q++) {
            float *d = dst + q * ly;
            int64_t o = g->woff[q];
            for (int l = l0; l < l1; l++) d[l] = lane[l][o];
            for (int l = lz; l < ly; l++) d[l] = 0.0f;
        }
    }
}

void kiln_gather4_run(const struct kiln_gather4 *g, const float *x, float *y, int threads)
{
    if (g->c_hi <= g->c_lo || g->h <= 0 || g->w <= 0 || g->n <= 0) return;
    struct g4_job j = {g, x, y, 0, 0};
    if (g->ly) {
        int64_t last = g->c_hi == g->c_total ? (g->c_total + g->ly - 1) / g->ly : 0;
        j.u0 = g->c_lo / g->ly;
        int64_t u1 = (g->c_hi - 1) / g->ly + 1;
        if (last > u1) u1 = last;
        j.units = u1 - j.u0;
    } else {
        j.u0 = g->c_lo;
        j.units = g->c_hi - g->c_lo;
    }
    int64_t row = g->w * (g->ly ? g->ly : 1) * (int64_t)sizeof(float);
    kiln_parallel_for(threads, g->n * j.units * g->h, kiln_copy_grain(row), g4_range, &j);
}
