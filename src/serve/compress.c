/*
 * compress.c - --allow_compression and --allow_precompilation at version
 * load (compress.h; docs/COMPRESSION.md, "In kiln serve").
 *
 * Compression: the data is the version's calibration folder
 * (assets.extra/kiln_calibration/: <input>.npy files and/or .npz archives,
 * read by the library's kiln_dataset_read, as `kiln compile --calibration`
 * reads a folder) when it exists, else the rows of the version's warmup
 * file that call its signature, stacked per input; with at least
 * KILN_COMPILE_MIN_SAMPLES finite rows, kiln_compile runs the `auto` policy
 * on it (calibration and check on the same rows, no labels: the drop is the
 * top-1 disagreement for class outputs, the mean relative difference for
 * values) and the compressed session replaces the imported one only when
 * the drop is within the bound. The cache: one .kiln per key in a folder,
 * written by kiln_session_save (temporary name, then rename) and read by
 * kiln_model_load, whose checksums and version checks turn a damaged entry
 * into an error here, never a crash; such an entry is removed and rebuilt.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve/compress.h"
#include "serve/gate/release.h"
#include "serve/warmup.h"

/* A version's calibration data for --allow_compression, beside the warmup file. */
#define KILN_CALIBRATION_DIR "assets.extra/kiln_calibration"

void kiln_compress_default_cache(char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/') snprintf(buf, cap, "%s/kiln/precompiled", xdg);
    else if (home && home[0] == '/') snprintf(buf, cap, "%s/.cache/kiln/precompiled", home);
    else snprintf(buf, cap, "/tmp/kiln-precompiled-%ld", (long)getuid());
}

/* mkdir -p, owner-only for the folders it creates. */
static int make_dirs(const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return 0;
    for (char *p = tmp + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(tmp, 0700) != 0 && errno != EEXIST) return 0;
            *p = c;
            if (!c) break;
        }
    }
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

void kiln_compress_lookup(const kiln_compress_options *o, const char *dir,
                          const char *options_text, kiln_compress_state *st, kiln_model **model,
                          kiln_sbuf *kv)
{
    memset(st, 0, sizeof *st);
    snprintf(st->precision, sizeof st->precision, "fp32");
    *model = NULL;
    if (!o->allow_precompilation) return;
    char digest[72], err[512];
    if (kiln_blessing_digest(dir, digest, NULL, err) != KILN_OK) {
        kiln_sbuf_puts(kv, " precompilation=off precompilation_reason=");
        kiln_sbuf_json_string(kv, err, strlen(err));
        return;
    }
    char key_text[1024];
    snprintf(key_text, sizeof key_text,
             "files=%s kiln=%s cpu=%s compression=%d max_drop=%.17g %s", digest, kiln_version(),
             kiln_cpu_features(), o->allow_compression, o->allow_compression ? o->max_drop : 0.0,
             options_text ? options_text : "");
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)key_text, strlen(key_text));
    char hex[2 * sizeof h + 1];
    for (size_t i = 0; i < sizeof h; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
    char cache[4096];
    if (o->cache_dir) snprintf(cache, sizeof cache, "%s", o->cache_dir);
    else kiln_compress_default_cache(cache, sizeof cache);
    if (!make_dirs(cache)) {
        kiln_sbuf_puts(kv, " precompilation=off precompilation_reason=");
        snprintf(err, sizeof err, "cannot create the cache folder '%.300s': %s", cache,
                 strerror(errno));
        kiln_sbuf_json_string(kv, err, strlen(err));
        return;
    }
    if (snprintf(st->cache_file, sizeof st->cache_file, "%s/%s.kiln", cache, hex) >=
        (int)sizeof st->cache_file) {
        st->cache_file[0] = '\0';
        kiln_sbuf_puts(kv, " precompilation=off precompilation_reason=\"cache path too long\"");
        return;
    }
    struct stat sb;
    if (stat(st->cache_file, &sb) != 0) return; /* a miss: kiln_compress_session stores it */
    kiln_load_options lo = {KILN_FORMAT_KILN, NULL, 0};
    kiln_model *m = NULL;
    if (kiln_model_load(st->cache_file, &lo, &m) != KILN_OK) {
        const char *why = kiln_last_error();
        kiln_sbuf_puts(kv, " precompilation_cache=unusable precompilation_cache_error=");
        kiln_sbuf_json_string(kv, why, strlen(why));
        unlink(st->cache_file); /* rebuilt after import */
        return;
    }
    st->hit = 1;
    *model = m;
    /* the served precision, as stored with the entry */
    static const char *const names[] = {"fp32", "bf16", "int8"};
    const char *rep = kiln_model_compile_report(m);
    const char *p = rep ? strstr(rep, "\"kiln_serve_precision\": \"") : NULL;
    for (size_t i = 0; p && i < sizeof names / sizeof names[0]; i++)
        if (!strncmp(p + strlen("\"kiln_serve_precision\": \""), names[i], 4))
            snprintf(st->precision, sizeof st->precision, "%s", names[i]);
    kiln_sbuf_printf(kv, " precompilation=hit precision=%s cache_file=", st->precision);
    kiln_sbuf_json_string(kv, st->cache_file, strlen(st->cache_file));
    if (rep) {
        kiln_sbuf_puts(kv, " compile_report=");
        kiln_sbuf_json_string(kv, rep, strlen(rep));
    }
}

/* Does warmup request q call signature sig (name; is_default: it is the
 * model's default signature)? */
static int calls(const kiln_warmup_request *q, const char *sig, int is_default)
{
    if (q->kind != KILN_WARMUP_PREDICT) return 0;
    return q->signature[0] ? !strcmp(q->signature, sig) : is_default;
}

/* A fixed batch dimension runs whole batches only. */
static int whole_batches(const kiln_signature *sig, const kiln_dataset *d, const char *prefix,
                         const char *what, char *why, size_t cap)
{
    for (int i = 0; i < d->n; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        if (vi->rank > 0 && vi->dims[0] > 0 && d->samples % vi->dims[0]) {
            snprintf(why, cap, "%s: the batch dimension is fixed at %lld and %s holds %lld "
                     "samples", prefix, (long long)vi->dims[0], what, (long long)d->samples);
            return 0;
        }
    }
    return 1;
}

/* The rows of the warmup file's predict requests for sig, stacked per
 * input. 0 with `why` when there is nothing usable to check on. */
static int warmup_dataset(const char *dir, const kiln_model *m, const kiln_signature *sig,
                          kiln_dataset *d, char *why, size_t cap)
{
    memset(d, 0, sizeof *d);
    kiln_warmup *w = NULL;
    char err[KILN_WARMUP_ERR_LEN];
    if (kiln_warmup_read(dir, &w, err) != KILN_OK) {
        snprintf(why, cap, "no data to check it on: the warmup file does not read: %.400s", err);
        return 0;
    }
    if (!w) {
        snprintf(why, cap, "no data to check it on: the version has no %s/ folder and no %s",
                 KILN_CALIBRATION_DIR, KILN_WARMUP_FILE);
        return 0;
    }
    const char *sn = kiln_signature_name(sig);
    int is_default = kiln_model_find_signature(m, NULL) == sig;
    int n = kiln_signature_input_count(sig), ok = 1;
    d->n = n;
    d->names = calloc((size_t)n + 1, sizeof *d->names);
    d->t = calloc((size_t)n + 1, sizeof *d->t);
    if (!d->names || !d->t) {
        snprintf(why, cap, "out of memory");
        ok = 0;
    }
    /* count the rows, checking each record against the signature */
    int64_t rows = 0;
    for (int r = 0; ok && r < w->n; r++) {
        const kiln_warmup_request *q = &w->req[r];
        if (!calls(q, sn, is_default)) continue;
        int64_t rr = -1;
        for (int i = 0; ok && i < n; i++) {
            const kiln_value_info *vi = kiln_signature_input(sig, i);
            const kiln_tensor *t = NULL;
            for (int k = 0; k < q->n_inputs; k++)
                if (q->names[k] && !strcmp(q->names[k], vi->name)) t = q->tensors[k];
            if (!t || t->dtype != vi->dtype || t->dtype == KILN_DTYPE_STRING || t->rank < 1 ||
                (vi->rank >= 0 && t->rank != vi->rank) || (rr >= 0 && t->dims[0] != rr)) {
                snprintf(why, cap,
                         "no data to check it on: warmup record %d does not give input '%.100s' "
                         "as a numeric %s tensor with one row per sample",
                         r, vi->name, kiln_dtype_name(vi->dtype));
                ok = 0;
                break;
            }
            for (int k = 1; k < t->rank; k++)
                if (vi->rank >= 0 && vi->dims[k] > 0 && t->dims[k] != vi->dims[k]) ok = 0;
            if (d->t[i]) { /* the rows of every record must stack */
                for (int k = 1; k < t->rank; k++) ok &= d->t[i]->dims[k] == t->dims[k];
            } else if (ok && kiln_tensor_create(t->dtype, t->rank, t->dims, &d->t[i]) != KILN_OK) {
                d->t[i] = NULL;
                ok = 0;
            }
            if (!ok)
                snprintf(why, cap,
                         "no data to check it on: warmup record %d: input '%.100s' has a shape "
                         "that does not match the signature or the other records",
                         r, vi->name);
            rr = t->dims[0];
        }
        if (ok) rows += rr;
    }
    if (ok && rows < KILN_COMPILE_MIN_SAMPLES) {
        snprintf(why, cap,
                 "no data to check it on: the warmup file holds %lld samples for signature "
                 "'%.100s', fewer than %d",
                 (long long)rows, sn, KILN_COMPILE_MIN_SAMPLES);
        ok = 0;
    }
    /* the stacked tensors */
    for (int i = 0; ok && i < n; i++) {
        kiln_tensor *proto = d->t[i];
        int64_t dims[KILN_MAX_RANK];
        memcpy(dims, proto->dims, sizeof dims);
        dims[0] = rows;
        d->names[i] = strdup(kiln_signature_input(sig, i)->name);
        if (!d->names[i] || kiln_tensor_create(proto->dtype, proto->rank, dims, &d->t[i]) != KILN_OK) {
            d->t[i] = proto;
            snprintf(why, cap, "out of memory");
            ok = 0;
            break;
        }
        kiln_dtype dt = proto->dtype;
        kiln_tensor_free(proto);
        size_t off = 0;
        for (int r = 0; r < w->n; r++) {
            const kiln_warmup_request *q = &w->req[r];
            if (!calls(q, sn, is_default)) continue;
            for (int k = 0; k < q->n_inputs; k++) {
                if (!q->names[k] || strcmp(q->names[k], d->names[i])) continue;
                size_t bytes = (size_t)kiln_tensor_count(q->tensors[k]) * kiln_dtype_size(q->tensors[k]->dtype);
                memcpy((char *)d->t[i]->data + off, q->tensors[k]->data, bytes);
                off += bytes;
                break;
            }
        }
        if (dt == KILN_DTYPE_F32) {
            const float *x = d->t[i]->data;
            for (int64_t k = 0; ok && k < kiln_tensor_count(d->t[i]); k++)
                if (!isfinite(x[k])) {
                    snprintf(why, cap, "no data to check it on: input '%.100s' of the warmup "
                             "file holds NaN or infinity", d->names[i]);
                    ok = 0;
                }
        }
    }
    d->samples = rows;
    if (ok) ok = whole_batches(sig, d, "no data to check it on", "the warmup file", why, cap);
    kiln_warmup_free(w);
    if (!ok) kiln_dataset_free(d);
    return ok;
}

/* The version's calibration folder (KILN_CALIBRATION_DIR), read by the
 * library as `kiln compile --calibration DIR` reads a folder: checked
 * against the signature (names, dtypes, shapes), finite, and at least
 * KILN_COMPILE_MIN_SAMPLES samples. 0 with `why` (naming the file and the
 * input) when it cannot be used. */
static int folder_dataset(const char *path, const kiln_signature *sig, kiln_dataset *d,
                          char *why, size_t cap)
{
    char err[KILN_EVAL_ERR_LEN];
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(why, cap, "bad calibration data: %s is not a folder", KILN_CALIBRATION_DIR);
        return 0;
    }
    if (kiln_dataset_read(path, sig, KILN_DATASET_FINITE, d, err) != KILN_OK ||
        kiln_dataset_check(d, path, KILN_COMPILE_MIN_SAMPLES, err) != KILN_OK) {
        kiln_dataset_free(d);
        snprintf(why, cap, "bad calibration data: %.600s", err);
        return 0;
    }
    if (!whole_batches(sig, d, "bad calibration data", KILN_CALIBRATION_DIR, why, cap)) {
        kiln_dataset_free(d);
        return 0;
    }
    return 1;
}

/* The lowest precision any compiled node runs in. */
static const char *served_precision(const kiln_compile_result *r)
{
    return r->n_int8 ? "int8" : r->n_bf16 ? "bf16" : "fp32";
}

static void compress(const kiln_compress_options *o, const char *dir, kiln_model *m,
                     const kiln_session_options *so, kiln_session **sessions, int n,
                     kiln_compress_state *st, kiln_sbuf *kv)
{
    char why[768];
    kiln_dataset d;
    if (n != 1) {
        snprintf(why, sizeof why, "the model has %d signatures; compression handles one", n);
        goto uncompressed;
    }
    const kiln_signature *sig = kiln_model_signature(m, 0);
    /* the calibration folder, made for it, wins over the warmup file */
    char cal_dir[4096], warmup_file[4096];
    struct stat sb;
    snprintf(cal_dir, sizeof cal_dir, "%.2000s/%s", dir, KILN_CALIBRATION_DIR);
    snprintf(warmup_file, sizeof warmup_file, "%.2000s/%s", dir, KILN_WARMUP_FILE);
    int use_folder = lstat(cal_dir, &sb) == 0;
    if (use_folder ? !folder_dataset(cal_dir, sig, &d, why, sizeof why)
                   : !warmup_dataset(dir, m, sig, &d, why, sizeof why))
        goto uncompressed;
    kiln_sbuf_printf(kv, " compression_data=\"%s: %lld samples%s\"",
                     use_folder ? KILN_CALIBRATION_DIR : KILN_WARMUP_FILE, (long long)d.samples,
                     use_folder && stat(warmup_file, &sb) == 0 ? " (preferred to the warmup file)"
                                                               : "");
    kiln_compile_options co;
    kiln_compile_options_init(&co);
    co.max_drop = o->max_drop;
    co.session = *so;
    kiln_compile_result r;
    char err[KILN_EVAL_ERR_LEN];
    kiln_status cs = kiln_compile(m, kiln_signature_name(sig), &co, &d, &d, &r, err);
    kiln_dataset_free(&d);
    if (cs != KILN_OK) {
        snprintf(why, sizeof why, "compiling failed: %.600s", err);
        goto uncompressed;
    }
    snprintf(st->summary, sizeof st->summary, "%s", r.summary);
    if (!r.passed || !strcmp(served_precision(&r), "fp32")) {
        snprintf(why, sizeof why, "%s", r.passed ? "no node has a bf16 or int8 kernel" :
                                                   "the drop exceeds the bound");
        kiln_sbuf_puts(kv, " compression=off compression_reason=");
        kiln_sbuf_json_string(kv, why, strlen(why));
        kiln_sbuf_puts(kv, " compression_summary=");
        kiln_sbuf_json_string(kv, r.summary, strlen(r.summary));
        kiln_compile_result_free(&r);
        return;
    }
    kiln_session_free(sessions[0]);
    sessions[0] = r.session;
    r.session = NULL;
    snprintf(st->precision, sizeof st->precision, "%s", served_precision(&r));
    kiln_sbuf_printf(kv, " compression=%s compression_summary=", st->precision);
    kiln_sbuf_json_string(kv, r.summary, strlen(r.summary));
    kiln_compile_result_free(&r);
    return;
uncompressed:
    kiln_sbuf_puts(kv, " compression=off compression_reason=");
    kiln_sbuf_json_string(kv, why, strlen(why));
}

void kiln_compress_session(const kiln_compress_options *o, const char *dir, kiln_model *m,
                           const kiln_session_options *so, kiln_session **sessions, int n,
                           kiln_compress_state *st, kiln_sbuf *kv)
{
    if (o->allow_compression) compress(o, dir, m, so, sessions, n, st, kv);
    if (!o->allow_precompilation || !st->cache_file[0]) return;
    if (n != 1) {
        kiln_sbuf_printf(kv, " precompilation=off precompilation_reason=\"the model has %d "
                             "signatures; a .kiln holds one\"", n);
        return;
    }
    kiln_sbuf rep = {0};
    kiln_sbuf_printf(&rep, "{\"kiln_serve_precision\": \"%s\", \"kiln_serve_summary\": ",
                     st->precision);
    kiln_sbuf_json_string(&rep, st->summary, strlen(st->summary));
    kiln_sbuf_puts(&rep, "}");
    kiln_save_options sv = {NULL, 0, rep.oom ? NULL : rep.p};
    if (kiln_session_save(sessions[0], st->cache_file, &sv) != KILN_OK) {
        const char *why = kiln_last_error();
        kiln_sbuf_puts(kv, " precompilation=store_failed precompilation_reason=");
        kiln_sbuf_json_string(kv, why, strlen(why));
    } else {
        kiln_sbuf_puts(kv, " precompilation=stored cache_file=");
        kiln_sbuf_json_string(kv, st->cache_file, strlen(st->cache_file));
    }
    kiln_sbuf_free(&rep);
}
