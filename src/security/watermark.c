/*
 * watermark.c - a keyed spread-spectrum watermark in an ONNX model's
 * float32 initializers (declared in watermark.h, specified in
 * docs/WATERMARK.md, used by src/cli/cmd_watermark.c).
 *
 * A small protobuf walker finds, in ModelProto.graph.initializer, every
 * float32 tensor of at least KILN_WM_MIN_TENSOR elements stored inline
 * (raw_data, or packed float_data); their elements, in file order, are the
 * carrying weights. The message is the first `bits` bits of BLAKE2b(label)
 * keyed with the watermark key. A ChaCha20 keystream under the watermark
 * key gives each carrying weight a message bit k and a dither u in [0, 1).
 * The mark is dither modulation (quantization index modulation): with a
 * tensor's step D = step * 2^floor(log2(max |w|)), a weight of bit value b
 * is moved to the nearest point of D * (Z + u + b/2), at most D/2 away.
 * Verifying needs only the weights: the phase f = frac(w/D - u) is near 0
 * for b = 0 and near 1/2 for b = 1; each bit's score is the sum of
 * cos(2 pi f) over its weights, which for an unmarked model (or a wrong
 * key: the dither is then independent of the weights) has mean 0 and
 * variance n/2, so per-bit and combined z-scores and a false-positive
 * probability follow exactly. Weights are edited in place in the file's
 * bytes (sizes do not change). The choice over an additive spread-spectrum
 * mark, which must overcome the weights themselves as noise and so moved
 * the small test models' weights by tens of percent, is in docs/WATERMARK.md.
 */
#include "security/watermark.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "security/security.h"

typedef struct wm_span {
    size_t off;   /* byte offset of the first float in the file */
    size_t count; /* floats */
} wm_span;

typedef struct wm_scan {
    wm_span spans[KILN_WM_MAX_TENSORS];
    int n;
    size_t total;
} wm_scan;

static int read_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= len) return -1;
        uint8_t b = p[(*pos)++];
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return 0;
        }
    }
    return -1;
}

/* Skip a field's value of the given wire type; -1 on malformed input. */
static int skip_field(const uint8_t *p, size_t len, size_t *pos, int wire)
{
    uint64_t v;
    switch (wire) {
    case 0: return read_varint(p, len, pos, &v);
    case 1: if (len - *pos < 8) return -1; *pos += 8; return 0;
    case 5: if (len - *pos < 4) return -1; *pos += 4; return 0;
    case 2:
        if (read_varint(p, len, pos, &v) < 0 || v > len - *pos) return -1;
        *pos += (size_t)v;
        return 0;
    default: return -1;
    }
}

/* Read a length-delimited field's extent [*start, *start + *n). */
static int read_len(const uint8_t *p, size_t len, size_t *pos, size_t *start, size_t *n)
{
    uint64_t v;
    if (read_varint(p, len, pos, &v) < 0 || v > len - *pos) return -1;
    *start = *pos;
    *n = (size_t)v;
    *pos += (size_t)v;
    return 0;
}

/* One TensorProto at p[0..len): add it to s if it carries the mark. */
static int scan_tensor(const uint8_t *p, size_t len, size_t base, wm_scan *s)
{
    size_t pos = 0, data_off = 0, data_len = 0;
    uint64_t dtype = 0, location = 0, prod = 1;
    int have_data = 0, overflow = 0;
    while (pos < len) {
        uint64_t key;
        if (read_varint(p, len, &pos, &key) < 0) return -1;
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 1 && wire == 0) { /* dims */
            uint64_t d;
            if (read_varint(p, len, &pos, &d) < 0) return -1;
            if (d != 0 && prod > UINT64_MAX / d) overflow = 1; else prod *= d;
        } else if (field == 1 && wire == 2) { /* packed dims */
            size_t st, n;
            if (read_len(p, len, &pos, &st, &n) < 0) return -1;
            size_t q = st;
            while (q < st + n) {
                uint64_t d;
                if (read_varint(p, st + n, &q, &d) < 0) return -1;
                if (d != 0 && prod > UINT64_MAX / d) overflow = 1; else prod *= d;
            }
        } else if (field == 2 && wire == 0) {
            if (read_varint(p, len, &pos, &dtype) < 0) return -1;
        } else if (field == 14 && wire == 0) {
            if (read_varint(p, len, &pos, &location) < 0) return -1;
        } else if ((field == 9 || field == 4) && wire == 2) { /* raw_data, packed float_data */
            if (read_len(p, len, &pos, &data_off, &data_len) < 0) return -1;
            have_data = 1;
        } else if (skip_field(p, len, &pos, wire) < 0) {
            return -1;
        }
    }
    if (dtype != 1 || location != 0 || !have_data || overflow || data_len % 4 ||
        data_len / 4 != prod || prod < KILN_WM_MIN_TENSOR)
        return 0;
    if (s->n >= KILN_WM_MAX_TENSORS) return 0;
    s->spans[s->n].off = base + data_off;
    s->spans[s->n].count = (size_t)prod;
    s->n++;
    s->total += (size_t)prod;
    return 0;
}

static kiln_status scan_model(const uint8_t *p, size_t len, wm_scan *s, char *err)
{
    size_t pos = 0;
    s->n = 0;
    s->total = 0;
    int graphs = 0;
    while (pos < len) {
        uint64_t key;
        if (read_varint(p, len, &pos, &key) < 0) goto bad;
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 7 && wire == 2) { /* ModelProto.graph */
            size_t gs, gn;
            if (read_len(p, len, &pos, &gs, &gn) < 0) goto bad;
            graphs++;
            size_t q = gs;
            while (q < gs + gn) {
                uint64_t k2;
                if (read_varint(p, gs + gn, &q, &k2) < 0) goto bad;
                int f2 = (int)(k2 >> 3), w2 = (int)(k2 & 7);
                if (f2 == 5 && w2 == 2) { /* GraphProto.initializer */
                    size_t ts, tn;
                    if (read_len(p, gs + gn, &q, &ts, &tn) < 0) goto bad;
                    if (scan_tensor(p + ts, tn, ts, s) < 0) goto bad;
                } else if (skip_field(p, gs + gn, &q, w2) < 0) {
                    goto bad;
                }
            }
        } else if (skip_field(p, len, &pos, wire) < 0) {
            goto bad;
        }
    }
    if (!graphs) {
        snprintf(err, KILN_SEC_ERR_LEN, "not an ONNX model: no graph");
        return KILN_ERR_INVALID_MODEL;
    }
    return KILN_OK;
bad:
    snprintf(err, KILN_SEC_ERR_LEN, "not an ONNX model: malformed protobuf near byte %zu", pos);
    return KILN_ERR_INVALID_MODEL;
}

kiln_status kiln_wm_derive_key(const uint8_t *file, size_t len, uint8_t key[32], char *err)
{
    static const char ctx[] = "kiln-watermark-v1";
    if (len < 16) {
        snprintf(err, KILN_SEC_ERR_LEN, "key file has %zu bytes; a watermark key needs at least 16 "
                 "(make one with 'kiln keygen --encryption')", len);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    crypto_generichash(key, 32, file, (unsigned long long)len, (const unsigned char *)ctx,
                       sizeof ctx - 1);
    return KILN_OK;
}

static float get_f(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* Per element: sign (bit 0 of the keystream word) and message bit. */
typedef struct wm_ctx {
    wm_scan *scan;
    uint32_t *stream; /* one keystream word per carrying element */
    int bits;
    uint64_t message;
} wm_ctx;

/* The message and keystream for c->scan (filled, over `bits`). */
static kiln_status wm_setup(const uint8_t key[32], const char *label, int bits, wm_ctx *c,
                            kiln_wm_report *rep, char *err)
{
    if (c->scan->total < (size_t)bits * KILN_WM_MIN_PER_BIT) {
        snprintf(err, KILN_SEC_ERR_LEN, "the model has %zu float32 weights in initializers of at "
                 "least %d elements; %d bits need at least %d (try fewer --bits)",
                 c->scan->total, KILN_WM_MIN_TENSOR, bits, bits * KILN_WM_MIN_PER_BIT);
        return KILN_ERR_UNSUPPORTED;
    }
    c->stream = malloc(c->scan->total * sizeof(uint32_t));
    if (!c->stream) {
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    static const uint8_t nonce[crypto_stream_chacha20_NONCEBYTES] = {0};
    crypto_stream_chacha20((unsigned char *)c->stream, c->scan->total * sizeof(uint32_t), nonce,
                           key);
    uint8_t h[8];
    const char *l = label ? label : "";
    crypto_generichash(h, sizeof h, (const unsigned char *)l, strlen(l), key, 32);
    uint64_t m = 0;
    for (int i = 0; i < 8; i++) m |= (uint64_t)h[i] << (8 * i);
    c->bits = bits;
    c->message = bits == 64 ? m : (m & ((UINT64_C(1) << bits) - 1));
    rep->bits = bits;
    rep->message = c->message;
    rep->tensors = c->scan->n;
    rep->elements = c->scan->total;
    return KILN_OK;
}

/* Checks, an empty scan and the libsodium start shared by both entry points. */
static kiln_status wm_begin(int bits, double step, wm_ctx *c, kiln_wm_report *rep, char *err)
{
    memset(c, 0, sizeof *c);
    memset(rep, 0, sizeof *rep);
    if (!(step > 0 && step <= 0.5)) {
        snprintf(err, KILN_SEC_ERR_LEN, "--step %g: must be in (0, 0.5]", step);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (bits < 8 || bits > KILN_WM_MAX_BITS) {
        snprintf(err, KILN_SEC_ERR_LEN, "--bits %d: must be 8..%d", bits, KILN_WM_MAX_BITS);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (sodium_init() < 0) {
        snprintf(err, KILN_SEC_ERR_LEN, "libsodium failed to initialise");
        return KILN_ERR_INTERNAL;
    }
    c->scan = malloc(sizeof *c->scan);
    if (!c->scan) {
        snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    c->scan->n = 0;
    c->scan->total = 0;
    return KILN_OK;
}

static kiln_status wm_prepare(const uint8_t *onnx, size_t len, const uint8_t key[32],
                              const char *label, int bits, double step, wm_ctx *c,
                              kiln_wm_report *rep, char *err)
{
    kiln_status st = wm_begin(bits, step, c, rep, err);
    if (st == KILN_OK) st = scan_model(onnx, len, c->scan, err);
    if (st == KILN_OK) st = wm_setup(key, label, bits, c, rep, err);
    return st;
}

static void wm_free(wm_ctx *c)
{
    free(c->scan);
    free(c->stream);
}

/* Keystream word -> (sign, bit). Little-endian words; the split is specified
 * in docs/WATERMARK.md. */
static void elem_of(const wm_ctx *c, size_t i, int *sign, int *bit)
{
    const uint8_t *b = (const uint8_t *)&c->stream[i];
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    *sign = (u & 1) ? 1 : -1;
    *bit = (int)((u >> 1) % (uint32_t)c->bits);
}

/* A tensor's lattice step: step * 2^floor(log2(max |w|)), so that the small
 * moves of embedding (and bf16 or int8 rounding) rarely change it; 0 if the
 * tensor has no finite nonzero weight. */
static double tensor_step(const uint8_t *d, size_t n, double step, size_t *argmax)
{
    double mx = 0;
    *argmax = n;
    for (size_t j = 0; j < n; j++) {
        double a = fabs((double)get_f(d + 4 * j));
        if (isfinite(a) && a > mx) mx = a, *argmax = j;
    }
    if (mx == 0) return 0;
    int e;
    frexp(mx, &e); /* mx = f * 2^e, f in [0.5, 1) */
    return step * ldexp(1.0, e - 1);
}

/* The keyed dither of element i, uniform in [0, 1). */
static double dither_of(const wm_ctx *c, size_t i)
{
    const uint8_t *b = (const uint8_t *)&c->stream[i];
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    (void)b;
    return (double)(u >> 8) / 16777216.0;
}

/* Per bit: sum of cos(2 pi phase) over its weights, and how many. */
static void correlate(const uint8_t *onnx, const wm_ctx *c, double step, double *score,
                      double *count)
{
    for (int k = 0; k < c->bits; k++) score[k] = count[k] = 0;
    size_t i = 0;
    for (int t = 0; t < c->scan->n; t++) {
        const uint8_t *d = onnx + c->scan->spans[t].off;
        size_t n = c->scan->spans[t].count, amax;
        double delta = tensor_step(d, n, step, &amax);
        for (size_t j = 0; j < n; j++, i++) {
            double w = get_f(d + 4 * j);
            if (delta == 0 || !isfinite(w) || w == 0 || j == amax) continue;
            int s, k;
            elem_of(c, i, &s, &k);
            double ph = w / delta - dither_of(c, i);
            score[k] += cos(2 * M_PI * (ph - floor(ph)));
            count[k] += 1;
        }
    }
}

static void read_mark(const uint8_t *onnx, const wm_ctx *c, double step, kiln_wm_report *rep)
{
    double score[KILN_WM_MAX_BITS], count[KILN_WM_MAX_BITS];
    correlate(onnx, c, step, score, count);
    double sum = 0;
    rep->matched = 0;
    rep->decoded = 0;
    for (int k = 0; k < c->bits; k++) {
        /* bit 0 sits on the lattice (cos = +1), bit 1 half a step off (-1);
         * for an unmarked model each cos has mean 0 and variance 1/2. */
        double z = count[k] > 0 ? -score[k] / sqrt(count[k] / 2) : 0;
        rep->bit_z[k] = z;
        int want = (int)((c->message >> k) & 1);
        if (z > 0) rep->decoded |= UINT64_C(1) << k;
        if ((z > 0) == (want == 1)) rep->matched++;
        sum += want ? z : -z;
    }
    rep->z = sum / sqrt((double)c->bits);
    rep->p_value = 0.5 * erfc(rep->z / sqrt(2.0));
}

kiln_status kiln_wm_verify(const uint8_t *onnx, size_t len, const uint8_t key[32],
                           const char *label, int bits, double step, kiln_wm_report *rep,
                           char *err)
{
    wm_ctx c;
    kiln_status st = wm_prepare(onnx, len, key, label, bits, step, &c, rep, err);
    if (st == KILN_OK) read_mark(onnx, &c, step, rep);
    wm_free(&c);
    return st;
}

kiln_status kiln_wm_verify_tensors(const float *const *data, const size_t *count, int n,
                                   const uint8_t key[32], const char *label, int bits, double step,
                                   kiln_wm_report *rep, char *err)
{
    wm_ctx c;
    uint8_t *buf = NULL;
    kiln_status st = wm_begin(bits, step, &c, rep, err);
    size_t total = 0;
    for (int t = 0; st == KILN_OK && t < n; t++) {
        if (!data[t] || count[t] < KILN_WM_MIN_TENSOR || c.scan->n >= KILN_WM_MAX_TENSORS) continue;
        c.scan->spans[c.scan->n].off = total * 4;
        c.scan->spans[c.scan->n].count = count[t];
        c.scan->n++;
        total += count[t];
    }
    if (st == KILN_OK) c.scan->total = total;
    if (st == KILN_OK && total) {
        buf = malloc(total * 4);
        if (!buf) {
            snprintf(err, KILN_SEC_ERR_LEN, "out of memory");
            st = KILN_ERR_OUT_OF_MEMORY;
        }
        for (int t = 0, k = 0; buf && t < n; t++) {
            if (!data[t] || count[t] < KILN_WM_MIN_TENSOR || k >= c.scan->n) continue;
            memcpy(buf + c.scan->spans[k].off, data[t], count[t] * 4);
            k++;
        }
    }
    if (st == KILN_OK) st = wm_setup(key, label, bits, &c, rep, err);
    if (st == KILN_OK) read_mark(buf, &c, step, rep);
    free(buf);
    wm_free(&c);
    return st;
}

kiln_status kiln_wm_embed(uint8_t *onnx, size_t len, const uint8_t key[32], const char *label,
                          int bits, double step, kiln_wm_report *rep, char *err)
{
    wm_ctx c;
    kiln_status st = wm_prepare(onnx, len, key, label, bits, step, &c, rep, err);
    if (st != KILN_OK) {
        wm_free(&c);
        return st;
    }
    double sum = 0, mx = 0;
    size_t i = 0, moved = 0;
    for (int t = 0; t < c.scan->n; t++) {
        uint8_t *d = onnx + c.scan->spans[t].off;
        size_t n = c.scan->spans[t].count, amax;
        double delta = tensor_step(d, n, step, &amax);
        for (size_t j = 0; j < n; j++, i++) {
            double w = get_f(d + 4 * j);
            if (delta == 0 || !isfinite(w) || w == 0 || j == amax) continue;
            int s, k;
            elem_of(&c, i, &s, &k);
            /* the nearest point of delta * (Z + dither + bit/2) */
            double off = dither_of(&c, i) + (((c.message >> k) & 1) ? 0.5 : 0.0);
            float nw = (float)(delta * (nearbyint(w / delta - off) + off));
            if (nw == 0 || (nw > 0) != (w > 0)) continue; /* keep signs; never write 0 */
            double rel = fabs(nw - w) / (delta / step);
            sum += rel;
            if (rel > mx) mx = rel;
            moved++;
            memcpy(d + 4 * j, &nw, 4);
        }
    }
    read_mark(onnx, &c, step, rep);
    rep->mean_rel_change = moved ? sum / (double)moved : 0;
    rep->max_rel_change = mx;
    wm_free(&c);
    if (rep->matched != bits) {
        snprintf(err, KILN_SEC_ERR_LEN, "the marked weights read back only %d of %d bits "
                 "(the model's largest weights sit at a power of two; try another --step)",
                 rep->matched, bits);
        return KILN_ERR_UNSUPPORTED;
    }
    return KILN_OK;
}
