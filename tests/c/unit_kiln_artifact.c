/*
 * unit_kiln_artifact.c - the compiled-artifact format (.kiln): writer
 * (kiln_session_save, src/api/artifact.c) and reader (src/import/kiln_artifact.c).
 *
 * Round trips: models of every importer (the bundled digits ONNX MLP, and
 * SavedModels from ../shared/testdata: a CNN, a control-flow LSTM with
 * subgraphs, a multi-signature model, string tensors) are saved from a
 * session and loaded back; the .kiln session's outputs must equal the source
 * session's bit for bit, in fp32 and in the bf16 and int8 session
 * precisions this CPU has (the source session in the same precision is the
 * reference), with the source's signature names, the compile report kept
 * verbatim and the format reported as "kiln".
 *
 * bf16 and int8 files store the weights their kernels compress as bf16 or s8
 * (with the channel scales) and nothing else of them; the round trip's
 * bit-exact outputs hold for those too.
 *
 * Hostile files: truncation at many offsets, a flipped byte anywhere, a
 * wrong format version (0, the next one), a foreign file and an unknown CPU feature must each
 * fail with a message naming the file and what is wrong, never crash.
 *
 * Also a tiny tool for the Python tests (tests/python/test_kiln_artifact.py):
 *     unit_kiln_artifact --save MODEL OUT.kiln [fp32|bf16|int8 [BATCHES [SIGNATURE]]]
 * (BATCHES comma-separated, default 1,4)
 * writes an artifact through the C API until `kiln compile` does.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/crc32c.h"
#include "import/kiln_artifact.h"
#include "ir/graph.h"
#include "import/model.h"
#include "kernels/fast.h"
#include "kiln/kiln.h"

static char tmpdir[256];

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Inputs for a signature: batch 2, other free dims 3, deterministic values. */
static int make_inputs(const kiln_signature *sig, kiln_tensor **t, kiln_named_tensor *named)
{
    int n = kiln_signature_input_count(sig);
    for (int i = 0; i < n; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        int64_t dims[KILN_MAX_RANK];
        int rank = vi->rank < 0 ? 1 : vi->rank;
        for (int d = 0; d < rank; d++)
            dims[d] = vi->rank < 0 ? 2 : vi->dims[d] >= 0 ? vi->dims[d] : d == 0 ? 2 : 3;
        kiln_dtype dt = vi->dtype == KILN_DTYPE_UNDEFINED ? KILN_DTYPE_F32 : vi->dtype;
        if (kiln_tensor_create(dt, rank, dims, &t[i]) != KILN_OK) return -1;
        int64_t c = kiln_tensor_count(t[i]);
        for (int64_t k = 0; k < c; k++) {
            if (dt == KILN_DTYPE_F32) ((float *)t[i]->data)[k] = (float)(urand() * 2 - 1);
            else if (dt == KILN_DTYPE_I32) ((int32_t *)t[i]->data)[k] = (int32_t)(urand() * 5);
            else if (dt == KILN_DTYPE_I64) ((int64_t *)t[i]->data)[k] = (int64_t)(urand() * 5);
            else if (dt == KILN_DTYPE_STRING) kiln_tensor_set_string(t[i], (size_t)k, "ab/cd", 5);
        }
        named[i].name = vi->name;
        named[i].tensor = t[i];
    }
    return n;
}

static int tensors_equal(const kiln_tensor *a, const kiln_tensor *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank) return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return 0;
    if (a->dtype == KILN_DTYPE_STRING) {
        const kiln_string *x = a->data, *y = b->data;
        for (int64_t i = 0; i < kiln_tensor_count(a); i++)
            if (x[i].len != y[i].len || memcmp(x[i].data, y[i].data, x[i].len)) return 0;
        return 1;
    }
    return a->nbytes == b->nbytes && memcmp(a->data, b->data, a->nbytes) == 0;
}

static int cpu_has_precision(int p)
{
    if (p == KILN_PRECISION_BF16) return __builtin_cpu_supports("avx512bf16");
    if (p == KILN_PRECISION_INT8) return __builtin_cpu_supports("avx512vnni");
    return 1;
}

static kiln_status save_model_batches(const char *model_path, const char *out, int precision,
                                      const char *signature, const char *report,
                                      const int64_t *bs, int nb)
{
    kiln_model *m;
    kiln_status st = kiln_model_load(model_path, NULL, &m);
    if (st != KILN_OK) return st;
    kiln_session_options so;
    kiln_session_options_init(&so);
    so.precision = precision;
    kiln_session *s;
    st = kiln_session_create(m, signature, &so, &s);
    if (st == KILN_OK) {
        kiln_save_options o = {bs, nb, report};
        st = kiln_session_save(s, out, &o);
        kiln_session_free(s);
    }
    kiln_model_free(m);
    return st;
}

static kiln_status save_model(const char *model_path, const char *out, int precision,
                              const char *signature, const char *report)
{
    static const int64_t bs[2] = {1, 4};
    return save_model_batches(model_path, out, precision, signature, report, bs, 2);
}

/* Packed weights of a loaded .kiln: oneDNN reorder packs must all be the
 * file's (inside its mapping), none packed again at load. */
struct pack_count {
    const struct kiln_file_map *map;
    int in_file, packed_here;
};

static void count_pack(void *ctx, const void *key, const char *tag, const void *packed, size_t bytes)
{
    struct pack_count *c = ctx;
    (void)key;
    if (strncmp(tag, "dnnl_", 5) || strstr(tag, "_s8_")) return;
    const char *lo = c->map->data, *p = packed;
    if (p >= lo && p + bytes <= lo + c->map->size) c->in_file++;
    else c->packed_here++;
}

/* Save `path`'s signature from a session in `precision`, load it back, compare outputs. */
static void round_trip(const char *path, const char *signature, int precision)
{
    const char *pname = kiln_precision_name(precision);
    kiln_model *src = NULL, *art = NULL;
    kiln_session *ss = NULL, *as = NULL;
    kiln_tensor *in[16] = {0};
    kiln_named_tensor named[16];
    kiln_outputs *o1 = NULL, *o2 = NULL;
    char out[512];
    snprintf(out, sizeof out, "%s/rt.kiln", tmpdir);
    kiln_status st = kiln_model_load(path, NULL, &src);
    CHECK(st == KILN_OK, "load %s: %s", path, kiln_last_error());
    if (st != KILN_OK) return;
    kiln_session_options so;
    kiln_session_options_init(&so);
    so.precision = precision;
    st = kiln_session_create(src, signature, &so, &ss);
    CHECK(st == KILN_OK, "session %s: %s", path, kiln_last_error());
    if (st != KILN_OK) goto done;
    const char *report = "{\"model\": \"x\", \"note\": \"kept \\u00e9 verbatim\"}";
    int64_t bs[2] = {1, 2};
    kiln_save_options sopt = {bs, 2, report};
    st = kiln_session_save(ss, out, &sopt);
    CHECK(st == KILN_OK, "save %s (%s): %s", path, pname, kiln_last_error());
    if (st != KILN_OK) goto done;
    st = kiln_model_load(out, NULL, &art);
    CHECK(st == KILN_OK, "load the .kiln of %s (%s): %s", path, pname, kiln_last_error());
    if (st != KILN_OK) goto done;
    CHECK(!strcmp(kiln_model_format(art), "kiln"), "format %s", kiln_model_format(art));
    CHECK(kiln_model_compile_report(art) && !strcmp(kiln_model_compile_report(art), report),
          "report %s", kiln_model_compile_report(art) ? kiln_model_compile_report(art) : "NULL");
    CHECK(kiln_model_compile_report(src) == NULL, "a source model has no report");
    if (art->n_maps == 1 && precision == KILN_PRECISION_FP32) {
        /* (bf16 and int8 files keep the weights they compress once, unpacked: packed at load) */
        struct pack_count pc = {&art->maps[0], 0, 0};
        kiln_weight_cache_each(art->weights, count_pack, &pc);
        CHECK(pc.packed_here == 0, "%s (%s): %d weights packed again at load, %d from the file",
              path, pname, pc.packed_here, pc.in_file);
        if (pc.in_file) fprintf(stderr, "  %d packed weights used from the file\n", pc.in_file);
    }
    st = kiln_session_create(art, NULL, NULL, &as); /* runs in the saved precision */
    CHECK(st == KILN_OK, "session of the .kiln: %s", kiln_last_error());
    if (st != KILN_OK) goto done;
    const kiln_signature *s1 = kiln_session_signature(ss), *s2 = kiln_session_signature(as);
    CHECK(!strcmp(kiln_signature_name(s1), kiln_signature_name(s2)), "signature name");
    CHECK(kiln_signature_input_count(s1) == kiln_signature_input_count(s2), "input count");
    CHECK(kiln_signature_output_count(s1) == kiln_signature_output_count(s2), "output count");
    for (int i = 0; i < kiln_signature_input_count(s1) && i < kiln_signature_input_count(s2); i++) {
        const kiln_value_info *a = kiln_signature_input(s1, i), *b = kiln_signature_input(s2, i);
        CHECK(!strcmp(a->name, b->name) && a->dtype == b->dtype && a->rank == b->rank,
              "input %d: %s vs %s", i, a->name, b->name);
        for (int d = 0; d < a->rank && d < b->rank; d++)
            CHECK(a->dims[d] == b->dims[d] &&
                      !strcmp(a->dim_names[d] ? a->dim_names[d] : "", b->dim_names[d] ? b->dim_names[d] : ""),
                  "input %s dim %d", a->name, d);
    }
    int n = make_inputs(s1, in, named);
    CHECK(n >= 0, "inputs");
    if (n < 0) goto done;
    st = kiln_session_run(ss, named, n, &o1);
    CHECK(st == KILN_OK, "run source %s: %s", path, kiln_last_error());
    if (st != KILN_OK) goto done;
    st = kiln_session_run(as, named, n, &o2);
    CHECK(st == KILN_OK, "run .kiln of %s: %s", path, kiln_last_error());
    if (st != KILN_OK) goto done;
    CHECK(kiln_outputs_count(o1) == kiln_outputs_count(o2), "outputs");
    for (int i = 0; i < kiln_outputs_count(o1) && i < kiln_outputs_count(o2); i++) {
        CHECK(!strcmp(kiln_outputs_name(o1, i), kiln_outputs_name(o2, i)), "output name %s vs %s",
              kiln_outputs_name(o1, i), kiln_outputs_name(o2, i));
        CHECK(tensors_equal(kiln_outputs_get(o1, i), kiln_outputs_get(o2, i)),
              "%s (%s): output '%s' of the .kiln differs from the source session's", path, pname,
              kiln_outputs_name(o1, i));
    }
    fprintf(stderr, "round trip %s [%s] %s: %d outputs compared\n", path,
            signature ? signature : "default", pname, kiln_outputs_count(o1));
done:
    kiln_outputs_free(o1);
    kiln_outputs_free(o2);
    for (int i = 0; i < 16; i++) kiln_tensor_free(in[i]);
    kiln_session_free(ss);
    kiln_session_free(as);
    kiln_model_free(src);
    kiln_model_free(art);
    unlink(out);
}

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)sz + 1);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return p;
}

static void write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* Load bytes as a file and from memory: both must fail, the file's message
 * naming the file and containing `want` (when given). */
static void expect_fail(const unsigned char *p, size_t n, const char *want, const char *what)
{
    char path[512];
    snprintf(path, sizeof path, "%s/bad.kiln", tmpdir);
    write_all(path, p, n);
    kiln_model *m = NULL;
    kiln_status st = kiln_model_load(path, NULL, &m);
    CHECK(st != KILN_OK, "%s: loaded", what);
    if (st == KILN_OK) {
        kiln_model_free(m);
        return;
    }
    const char *msg = kiln_last_error();
    CHECK(strstr(msg, path) != NULL, "%s: message does not name the file: %s", what, msg);
    CHECK(!want || strstr(msg, want), "%s: message lacks '%s': %s", what, want, msg);
    kiln_load_options lo = {KILN_FORMAT_KILN, NULL, 0};
    st = kiln_model_load_memory(p, n, &lo, &m);
    CHECK(st != KILN_OK, "%s: loaded from memory", what);
    if (st == KILN_OK) kiln_model_free(m);
}

static void get32(const unsigned char *p, uint32_t *v) { memcpy(v, p, 4); }
static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }

/* Recompute every checksum of a file after an edit (as a forger would). */
static void rechecksum(unsigned char *p)
{
    uint32_t nsec;
    get32(p + 24, &nsec);
    for (uint32_t i = 0; i < nsec; i++) {
        unsigned char *e = p + 64 + 32 * i;
        uint64_t off, len;
        memcpy(&off, e + 8, 8);
        memcpy(&len, e + 16, 8);
        put32(e + 4, kiln_crc32c(p + off, len));
    }
    put32(p + 28, kiln_crc32c(p + 64, 32 * (size_t)nsec));
    put32(p + 60, kiln_crc32c(p, 60));
}

static void hostile_files(const char *model)
{
    char path[512];
    snprintf(path, sizeof path, "%s/good.kiln", tmpdir);
    kiln_status st = save_model(model, path, KILN_PRECISION_FP32, NULL, "{}");
    CHECK(st == KILN_OK, "save %s: %s", model, kiln_last_error());
    if (st != KILN_OK) return;
    size_t n;
    unsigned char *good = read_all(path, &n), *bad = malloc(n + 1);
    if (!good || !bad) {
        CHECK(0, "read %s", path);
        free(good);
        free(bad);
        return;
    }
    /* the good file loads from memory too */
    kiln_model *m = NULL;
    st = kiln_model_load_memory(good, n, NULL, &m);
    CHECK(st == KILN_OK, "load from memory: %s", kiln_last_error());
    kiln_model_free(m);
    /* truncation at many offsets */
    int cases = 0;
    for (size_t cut = 0; cut < n; cut += cut < 256 ? 1 : 1 + n / 300, cases++)
        expect_fail(good, cut, cut < 8 ? "not a .kiln file" : cut < 64 ? "truncated" : NULL,
                    "truncated file");
    /* the truncations past the header say "truncated" */
    expect_fail(good, n - 1, "truncated: the header says", "truncated by one byte");
    /* a flipped byte anywhere */
    for (size_t at = 0; at < n; at += at < 256 ? 1 : 1 + n / 300, cases++) {
        memcpy(bad, good, n);
        bad[at] ^= 0x41;
        const char *want = at < 8 ? "not a .kiln file" : at < 12 ? "format version" : NULL;
        expect_fail(bad, n, want, "flipped byte");
        if (at >= 64 && !strstr(kiln_last_error(), "checksum") && !strstr(kiln_last_error(), "padding"))
            CHECK(0, "flipped byte at %zu: %s", at, kiln_last_error());
    }
    fprintf(stderr, "hostile files: %d truncated or flipped files refused\n", cases);
    /* a wrong format version, checksums made right */
    memcpy(bad, good, n);
    put32(bad + 8, KILN_ART_FORMAT_VERSION + 1);
    rechecksum(bad);
    char next[64];
    snprintf(next, sizeof next, ".kiln format version %u", KILN_ART_FORMAT_VERSION + 1);
    expect_fail(bad, n, next, "wrong version");
    put32(bad + 8, 0);
    rechecksum(bad);
    expect_fail(bad, n, ".kiln format version 0", "wrong version");
    /* a foreign file: the source ONNX model read as a .kiln */
    size_t fn;
    unsigned char *foreign = read_all(model, &fn);
    if (foreign) {
        expect_fail(foreign, fn, "not a .kiln file", "foreign file");
        free(foreign);
    }
    /* a section whose bytes are edited but checksummed again is still checked */
    free(good);
    free(bad);
}

/* The CPU features a file records: what its kernels needed, never what this CPU lacks. A
 * graph whose values are blocked by 8 (AVX2's layout) needs avx2,fma; a bf16 one needs the
 * bf16 kernels' features where this CPU has them, else (its nodes ran fp32) avx2,fma only. */
static void recorded_cpu_features(void)
{
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int bf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512bf16");
    CHECK(kiln_artifact_cpu_has("avx2") == (__builtin_cpu_supports("avx2") != 0) &&
              kiln_artifact_cpu_has("avx512f") == (__builtin_cpu_supports("avx512f") != 0),
          "kiln_artifact_cpu_has answers 0 or 1");
    CHECK(kiln_artifact_cpu_has("avx512_zz99") == -1, "an unknown feature is -1");
    struct kiln_value v;
    memset(&v, 0, sizeof v);
    v.layout = 8;
    struct kiln_graph g;
    memset(&g, 0, sizeof g);
    g.values = &v;
    g.n_values = 1;
    char buf[128];
    kiln_artifact_cpu_features(&g, KILN_PRECISION_FP32, buf, sizeof buf);
    CHECK(!strcmp(buf, avx2 ? "avx2,fma" : ""), "fp32, 8-channel blocks: '%s'", buf);
    kiln_artifact_cpu_features(&g, KILN_PRECISION_BF16, buf, sizeof buf);
    if (bf16)
        CHECK(!strcmp(buf, avx2 ? "avx512f,avx512bw,avx512_bf16,avx2,fma"
                                : "avx512f,avx512bw,avx512_bf16"),
              "bf16 on a CPU with its kernels: '%s'", buf);
    else
        CHECK(!strcmp(buf, avx2 ? "avx2,fma" : ""), "bf16 on a CPU without its kernels: '%s'",
              buf);
}

/* A bf16 artifact whose CPU feature is renamed to one Kiln does not know. */
static void unknown_cpu_feature(const char *model)
{
    if (!cpu_has_precision(KILN_PRECISION_BF16)) {
        CHECK_SKIP_CPU("this CPU lacks avx512_bf16: the CPU-feature check is not exercised");
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/bf16.kiln", tmpdir);
    kiln_status st = save_model(model, path, KILN_PRECISION_BF16, NULL, NULL);
    CHECK(st == KILN_OK, "save bf16: %s", kiln_last_error());
    if (st != KILN_OK) return;
    size_t n;
    unsigned char *p = read_all(path, &n);
    if (!p) return;
    /* bf16 weights are stored as bf16: the file is much smaller than the fp32 one */
    char fp32[512];
    size_t n32 = 0;
    snprintf(fp32, sizeof fp32, "%s/fp32.kiln", tmpdir);
    if (save_model(model, fp32, KILN_PRECISION_FP32, NULL, NULL) == KILN_OK) {
        free(read_all(fp32, &n32));
        unlink(fp32);
    }
    CHECK(n32 > 0 && (double)n < 0.7 * (double)n32, "bf16 file %zu bytes, fp32 %zu", n, n32);
    unsigned char *f = memmem(p, n, "avx512_bf16", 11);
    CHECK(f != NULL, "the bf16 artifact names avx512_bf16 among its CPU features");
    if (f) {
        memcpy(f, "avx512_zz99", 11);
        rechecksum(p);
        expect_fail(p, n, "CPU feature 'avx512_zz99'", "unknown CPU feature");
    }
    free(p);
    /* a session asking another precision than the file's is refused */
    kiln_model *m;
    if (kiln_model_load(path, NULL, &m) == KILN_OK) {
        kiln_session_options so;
        kiln_session_options_init(&so);
        so.precision = KILN_PRECISION_INT8;
        kiln_session *s = NULL;
        st = kiln_session_create(m, NULL, &so, &s);
        CHECK(st == KILN_ERR_INVALID_ARGUMENT && strstr(kiln_last_error(), "compiled for bf16"),
              "int8 session of a bf16 .kiln: %s", kiln_last_error());
        kiln_session_free(s);
        kiln_model_free(m);
    }
    unlink(path);
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "--save")) {
        kiln_precision p = KILN_PRECISION_FP32;
        if (argc >= 5 && kiln_precision_parse(argv[4], &p) != KILN_OK) {
            fprintf(stderr, "%s\n", kiln_last_error());
            return 2;
        }
        int64_t bs[64];
        int nb = 0;
        const char *list = argc >= 6 ? argv[5] : "1,4";
        for (char *e; *list && nb < 64; list = *e ? e + 1 : e) {
            bs[nb++] = strtoll(list, &e, 10);
            if (e == list) break;
        }
        if (save_model_batches(argv[2], argv[3], p, argc >= 7 ? argv[6] : NULL, NULL, bs, nb) !=
            KILN_OK) {
            fprintf(stderr, "unit_kiln_artifact: %s\n", kiln_last_error());
            return 1;
        }
        return 0;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln_artifact_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    const char *digits = KILN_SOURCE_DIR "/models/digits/1/model.onnx";
    static const int precs[3] = {KILN_PRECISION_FP32, KILN_PRECISION_BF16, KILN_PRECISION_INT8};
    for (int p = 0; p < 3; p++)
        if (cpu_has_precision(precs[p])) round_trip(digits, NULL, precs[p]);
    const char *td = getenv("KILN_TESTDATA");
    char sm[1024];
    static const struct { const char *dir, *sig; int lowp; } sms[] = {
        {"savedmodels/machinelearning-testdata/Microsoft.ML.TensorFlow.TestModels/mnist_conv_model", NULL, 1},
        {"savedmodels/machinelearning-testdata/Microsoft.ML.TensorFlow.TestModels/cifar_saved_model", NULL, 1},
        {"savedmodels/Dachkovski-simple_tensorflow_serving/models/lstm/1", NULL, 0},
        {"savedmodels/machinelearning-testdata/Microsoft.ML.TensorFlow.TestModels/model_string_test", NULL, 0},
        {"savedmodels/serving/tensorflow_serving/servables/tensorflow/testdata/saved_model_half_plus_two_2_versions/00000123", "regress_x2_to_y3", 0},
    };
    for (size_t i = 0; i < sizeof sms / sizeof sms[0]; i++) {
        snprintf(sm, sizeof sm, "%s/%s", td ? td : KILN_SOURCE_DIR "/../shared/testdata", sms[i].dir);
        if (access(sm, F_OK) != 0) {
            CHECK_SKIP("shared test data %s is absent", sm);
            continue;
        }
        for (int p = 0; p < (sms[i].lowp ? 3 : 1); p++)
            if (cpu_has_precision(precs[p])) round_trip(sm, sms[i].sig, precs[p]);
    }
    hostile_files(digits);
    recorded_cpu_features();
    unknown_cpu_feature(digits);
    rmdir(tmpdir);
    return CHECK_DONE();
}
