/*
 * unit_monitor_binplan.c - the monitor's fast binning (src/serve/monitor/
 * binplan.c) against the plain path it replaces (monitor.c's per-value
 * loop: the double of each float, isnan / isinf, the range test in
 * doubles, kiln_mon_bin's binary search) and against a plain count of the
 * edges <= v (numpy's searchsorted(edges, v, side="right")).
 *
 * The values are the hard ones: every edge rounded to float and its
 * neighbouring floats, edges that fall between two floats, signed zeros,
 * float and double subnormals, edges and values beyond float's range,
 * NaN (quiet, signalling, negative), infinities, values out of the range
 * on both sides; then random rows. The portable path and, where the CPU
 * has them, the AVX-512 and AVX2 paths; features on contiguous columns and
 * on permuted ones with padding lanes.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "serve/monitor/binplan.h"
#include "serve/monitor/profile.h"

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* the doubles the thresholds are tested on */
static int edge_values(double *e)
{
    int n = 0;
    const double base[] = {0.0, -0.0, 1.0, -1.0, 0.1, -0.1, 1.0 / 3.0, 2.5, 1e-40, -1e-40,
                           1e-45, 1.401298464324817e-45 /* the least float subnormal */,
                           7e-46 /* below half of it */, 1e-310 /* a double subnormal */,
                           -1e-310, 1.1754943508222875e-38 /* FLT_MIN */, 1.17549e-38,
                           3.4028234663852886e38 /* FLT_MAX */, 3.4028235e38, 3.5e38, 1e300,
                           -3.5e38, -1e300, 16777217.0, 0.30000001192092896, 1e-8};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
        e[n++] = base[i];
        e[n++] = nextafter(base[i], INFINITY);
        e[n++] = nextafter(base[i], -INFINITY);
    }
    return n;
}

/* floats around e and the special ones */
static int probe_values(const double *edges, int ne, float *v)
{
    int n = 0;
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u,
                                0x007fffffu, 0x807fffffu, 0x00800000u, 0x7f7fffffu,
                                0xff7fffffu, 0x3f800000u, 0xbf800000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) v[n++] = from_bits(special[i]);
    for (int i = 0; i < ne; i++) {
        float f = (float)edges[i];
        if (!isfinite(f)) f = edges[i] > 0 ? FLT_MAX : -FLT_MAX;
        v[n++] = f;
        v[n++] = nextafterf(f, INFINITY);
        v[n++] = nextafterf(f, -INFINITY);
        v[n++] = nextafterf(nextafterf(f, INFINITY), INFINITY);
    }
    for (int i = 0; i < n; i++)
        if (!isfinite(v[i])) v[i] = 0.0f;
    return n;
}

static void test_keys(void)
{
    double e[128];
    float v[1024];
    int ne = edge_values(e), nv = probe_values(e, ne, v);
    int bad = 0;
    for (int i = 0; i < ne; i++) {
        int32_t ge = kiln_mon_key_ge(e[i]), le = kiln_mon_key_le(e[i]);
        for (int j = 0; j < nv; j++) {
            uint32_t u;
            memcpy(&u, &v[j], sizeof u);
            int32_t k = kiln_mon_key(u);
            if (((double)v[j] >= e[i]) != (k >= ge) || ((double)v[j] <= e[i]) != (k <= le)) {
                if (bad++ < 5)
                    fprintf(stderr, "key mismatch: v %.9g (0x%08x) edge %.17g\n", (double)v[j], u, e[i]);
            }
        }
    }
    CHECK(bad == 0, "%d value/edge pairs order differently by key", bad);
    /* infinite bounds: every finite float is >= -inf and <= +inf, none >= +inf */
    CHECK(kiln_mon_key(0xff7fffffu) >= kiln_mon_key_ge(-INFINITY), "-FLT_MAX >= -inf");
    CHECK(kiln_mon_key(0x7f7fffffu) <= kiln_mon_key_le(INFINITY), "FLT_MAX <= +inf");
    CHECK(!(kiln_mon_key(0x7f7fffffu) >= kiln_mon_key_ge(INFINITY)), "FLT_MAX < +inf");
    /* keys order the floats: a random sample of pairs */
    int disorder = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t a = (uint32_t)rnd(), b = (uint32_t)rnd();
        float fa = from_bits(a), fb = from_bits(b);
        if (isnan(fa) || isnan(fb)) continue;
        int32_t ka = kiln_mon_key(a), kb = kiln_mon_key(b);
        if (fa < fb ? !(ka < kb) : fa > fb ? !(ka > kb) : !(fa == 0.0f || ka == kb)) disorder++;
    }
    CHECK(disorder == 0, "%d random float pairs out of order by key", disorder);
}

#define NF 64
#define WIDTH 70

typedef struct feat {
    int col, n_edges, base;
    double edges[KILN_MON_MAX_BINS - 1];
    double lo, hi;
} feat;

/* monitor.c's plain path for one float (before binplan.c) */
static void plain(const feat *f, int fi, float x, int64_t *bins, int64_t *anom)
{
    double e = x;
    int64_t *an = anom + (size_t)fi * KILN_MON_ANOM_KINDS;
    if (isnan(e)) an[KILN_MON_ANOM_NAN]++;
    else if (isinf(e)) an[KILN_MON_ANOM_INF]++;
    else {
        if (e < f->lo || e > f->hi) an[KILN_MON_ANOM_RANGE]++;
        bins[f->base + kiln_mon_bin(f->edges, f->n_edges, e)]++;
    }
}

/* the number of edges <= e, by counting (searchsorted side="right") */
static int count_le(const feat *f, double e)
{
    int c = 0;
    for (int k = 0; k < f->n_edges; k++) c += f->edges[k] <= e;
    return c;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *const path_names[] = {"portable", "avx512", "avx2"};

/* n_feat features on columns (contiguous from col0, or permuted), with
 * edges from the hard values; rows of hard and random values. */
static void test_plan(int n_feat, int permuted, int path)
{
    static feat fs[NF];
    double pool[128];
    int np = edge_values(pool);
    int nbins = 0;
    int cols[WIDTH];
    for (int c = 0; c < WIDTH; c++) cols[c] = c;
    if (permuted)
        for (int c = WIDTH - 1; c > 0; c--) {
            int j = (int)(rnd() % (uint64_t)(c + 1)), t = cols[c];
            cols[c] = cols[j];
            cols[j] = t;
        }
    kiln_mon_binplan bp;
    CHECK(kiln_mon_binplan_init(&bp, KILN_MON_MAX_BINS - 1), "plan init");
    for (int i = 0; i < n_feat; i++) {
        feat *f = &fs[i];
        f->col = permuted ? cols[i] : 3 + i;
        /* 1..63 strictly increasing edges from the pool (ties removed) */
        int want = i == 0 ? KILN_MON_MAX_BINS - 1 : 1 + (int)(rnd() % 20);
        double tmp[128];
        for (int k = 0; k < want; k++) tmp[k] = pool[rnd() % (uint64_t)np];
        qsort(tmp, (size_t)want, sizeof *tmp, cmp_double);
        f->n_edges = 0;
        for (int k = 0; k < want; k++)
            if (f->n_edges == 0 || tmp[k] > f->edges[f->n_edges - 1]) f->edges[f->n_edges++] = tmp[k];
        f->base = nbins;
        nbins += f->n_edges + 1;
        switch (i % 4) { /* the range: the reference's, a rule's, open, or one-sided */
        case 0: f->lo = f->edges[0]; f->hi = f->edges[f->n_edges - 1]; break;
        case 1: f->lo = -0.0; f->hi = 1.0 / 3.0; break;
        case 2: f->lo = -INFINITY; f->hi = INFINITY; break;
        default: f->lo = -1e-310; f->hi = INFINITY; break;
        }
        CHECK(kiln_mon_binplan_add(&bp, i, f->col, f->edges, f->n_edges, f->lo, f->hi, f->base),
              "add feature %d", i);
    }
    CHECK(bp.contiguous == !permuted || n_feat == 1, "contiguous %d", bp.contiguous);

    /* rows: each hard value in every column, then random and special mixes */
    float probes[1024];
    int nprobe = probe_values(pool, np, probes);
    const uint32_t nonfinite[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu,
                                  0xffffffffu, 0x7f800000u, 0xff800000u};
    int n_nf = (int)(sizeof nonfinite / sizeof nonfinite[0]);
    int rows = nprobe + n_nf + 400;
    static float x[(1024 + 7 + 400) * WIDTH];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < WIDTH; c++) {
            float val;
            if (r < nprobe) val = probes[(r + c) % nprobe];
            else if (r < nprobe + n_nf) val = from_bits(nonfinite[(r - nprobe + c) % n_nf]);
            else if (rnd() % 8 == 0) val = from_bits(nonfinite[rnd() % (uint64_t)n_nf]);
            else if (rnd() % 2) val = probes[rnd() % (uint64_t)nprobe];
            else val = (float)((double)(int64_t)(rnd() % 2000001) / 1e5 - 10.0);
            x[(size_t)r * WIDTH + c] = val;
        }

    static int64_t bins_ref[NF * KILN_MON_MAX_BINS], bins_fast[NF * KILN_MON_MAX_BINS];
    static int64_t anom_ref[NF * KILN_MON_ANOM_KINDS], anom_fast[NF * KILN_MON_ANOM_KINDS];
    memset(bins_ref, 0, sizeof bins_ref);
    memset(bins_fast, 0, sizeof bins_fast);
    memset(anom_ref, 0, sizeof anom_ref);
    memset(anom_fast, 0, sizeof anom_fast);
    int count_bad = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n_feat; i++) {
            float v = x[(size_t)r * WIDTH + fs[i].col];
            plain(&fs[i], i, v, bins_ref, anom_ref);
            if (isfinite(v) && count_le(&fs[i], v) != kiln_mon_bin(fs[i].edges, fs[i].n_edges, v))
                count_bad++;
        }
    CHECK(count_bad == 0, "kiln_mon_bin differs from counting the edges <= v %d times", count_bad);
    /* in two calls (the second part row by row) */
    kiln_mon_binplan_rows_path(&bp, path, x, rows / 2, WIDTH, bins_fast, anom_fast);
    for (int r = rows / 2; r < rows; r++)
        kiln_mon_binplan_rows_path(&bp, path, x + (size_t)r * WIDTH, 1, WIDTH, bins_fast, anom_fast);
    int diff = 0;
    for (int k = 0; k < nbins; k++) diff += bins_ref[k] != bins_fast[k];
    CHECK(diff == 0, "%s, %d features%s: %d bin counts differ from the plain path",
          path_names[path], n_feat, permuted ? " (permuted)" : "", diff);
    diff = 0;
    int64_t nan = 0, inf = 0, range = 0;
    for (int k = 0; k < n_feat * KILN_MON_ANOM_KINDS; k++) diff += anom_ref[k] != anom_fast[k];
    for (int i = 0; i < n_feat; i++) {
        nan += anom_ref[i * KILN_MON_ANOM_KINDS + KILN_MON_ANOM_NAN];
        inf += anom_ref[i * KILN_MON_ANOM_KINDS + KILN_MON_ANOM_INF];
        range += anom_ref[i * KILN_MON_ANOM_KINDS + KILN_MON_ANOM_RANGE];
    }
    CHECK(diff == 0, "%s, %d features: %d anomaly counts differ from the plain path",
          path_names[path], n_feat, diff);
    CHECK(nan > 0 && inf > 0 && (range > 0 || n_feat == 1), "the rows hold NaN (%lld), inf (%lld), out of range (%lld)",
          (long long)nan, (long long)inf, (long long)range);
    kiln_mon_binplan_free(&bp);
}

int main(void)
{
    test_keys();
    const int sizes[] = {1, 5, 16, 17, 40, 64};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int permuted = 0; permuted < 2; permuted++) {
            for (int path = KILN_MON_PATH_PORTABLE; path <= KILN_MON_PATH_AVX2; path++)
                if (kiln_mon_binplan_has_path(path)) test_plan(sizes[s], permuted, path);
        }
    for (int path = KILN_MON_PATH_AVX512; path <= KILN_MON_PATH_AVX2; path++)
        if (!kiln_mon_binplan_has_path(path)) printf("note: this CPU lacks %s; that path is not tested\n", path_names[path]);
    /* a full plan refuses a 65th feature */
    kiln_mon_binplan bp;
    double e = 0.5;
    CHECK(kiln_mon_binplan_init(&bp, 1), "init");
    int added = 0;
    for (int i = 0; i < KILN_MON_PLAN_LANES + 1; i++) added += kiln_mon_binplan_add(&bp, i, i, &e, 1, -1, 1, 2 * i);
    CHECK(added == KILN_MON_PLAN_LANES, "added %d", added);
    kiln_mon_binplan_free(&bp);
    return CHECK_DONE();
}
