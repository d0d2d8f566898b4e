/*
 * unit_node_precision.c - per-node precision (kiln_session_set_node_precision,
 * the block at the end of kiln.h), which `kiln compile --precision auto` uses.
 *
 * On the bundled digits MLP (fc1: Gemm+Relu, fc2: Gemm, softmax):
 * - exceptions that name every product in the session's own precision's
 *   opposite reproduce the other precision bit for bit (an int8 session with
 *   both nodes fp32 equals the fp32 session; an fp32 session with both int8
 *   equals the int8 session), so the plan honours exactly the named nodes;
 * - one node alone: the profile shows that node, and only it, on an int8
 *   kernel, and the outputs differ from both uniform precisions;
 * - clearing the list returns to the shared plans (fp32 bit for bit);
 * - unknown names, bad precisions and the reference executor are refused;
 * - a mixed session saved as .kiln loads with the same per-node precisions
 *   and outputs (bit for bit), also a bf16 session with an fp32 node (whose
 *   weights the file must not round to bf16).
 * The numeric correctness of each precision's kernels is unit_lowp.c's; the
 * mixed outputs against a numpy emulation are tests/python/test_compile.py's.
 * int8 parts need VNNI (elsewhere int8 nodes run fp32) and are skipped.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kiln/kiln.h"

#define ROWS 16

static kiln_tensor *input(void)
{
    int64_t dims[2] = {ROWS, 64};
    kiln_tensor *x = NULL;
    if (kiln_tensor_create(KILN_DTYPE_F32, 2, dims, &x) != KILN_OK) return NULL;
    uint32_t s = 12345;
    for (int i = 0; i < ROWS * 64; i++) {
        s = s * 1664525u + 1013904223u;
        ((float *)x->data)[i] = (float)(s >> 8) / (float)(1u << 24) * 16.0f;
    }
    return x;
}

static long file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

/* Run s on x; the probabilities (caller frees), or NULL. */
static kiln_tensor *run(kiln_session *s, const kiln_tensor *x)
{
    kiln_named_tensor in = {"pixels", x};
    kiln_outputs *o = NULL;
    if (kiln_session_run(s, &in, 1, &o) != KILN_OK) {
        fprintf(stderr, "run: %s\n", kiln_last_error());
        return NULL;
    }
    kiln_tensor *t = kiln_outputs_take(o, 0);
    kiln_outputs_free(o);
    return t;
}

static int same(const kiln_tensor *a, const kiln_tensor *b)
{
    return a && b && a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes);
}

static kiln_session *session(kiln_model *m, kiln_precision p, int profile)
{
    kiln_session_options o;
    kiln_session_options_init(&o);
    o.precision = p;
    o.profile = profile;
    kiln_session *s = NULL;
    if (kiln_session_create(m, NULL, &o, &s) != KILN_OK) return NULL;
    return s;
}

/* The kernel step `node` ran on in s's profile ("" if none). */
static void kernel_of(kiln_session *s, const char *node, char *out, size_t n)
{
    kiln_profile *p = NULL;
    out[0] = '\0';
    if (kiln_session_profile_get(s, &p) != KILN_OK) return;
    for (int i = 0; i < kiln_profile_step_count(p); i++) {
        const kiln_profile_entry *e = kiln_profile_step(p, i);
        if (e->node && !strcmp(e->node, node)) snprintf(out, n, "%s", e->kernel);
    }
    kiln_profile_free(p);
}

static int cpu_has_vnni(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[4096];
    int yes = 0;
    while (!yes && fgets(line, sizeof line, f))
        yes = strstr(line, " avx512_vnni") || strstr(line, " avx_vnni") || strstr(line, " amx_int8");
    fclose(f);
    return yes;
}

int main(void)
{
    kiln_model *m = NULL;
    if (kiln_model_load(KILN_SOURCE_DIR "/models/digits/1/model.onnx", NULL, &m) != KILN_OK) {
        fprintf(stderr, "%s\n", kiln_last_error());
        return 1;
    }
    kiln_tensor *x = input();
    kiln_session *s32 = session(m, KILN_PRECISION_FP32, 0), *s8 = session(m, KILN_PRECISION_INT8, 0);
    kiln_tensor *y32 = run(s32, x), *y8 = run(s8, x);
    CHECK(y32 && y8, "uniform runs");

    /* refusals */
    kiln_session *s = session(m, KILN_PRECISION_FP32, 0);
    kiln_node_precision bad = {"no_such_node", KILN_PRECISION_INT8};
    CHECK(kiln_session_set_node_precision(s, &bad, 1) == KILN_ERR_NOT_FOUND, "unknown node");
    CHECK(strstr(kiln_last_error(), "'no_such_node'") != NULL, "message: %s", kiln_last_error());
    kiln_node_precision badp = {"fc1", (kiln_precision)7};
    CHECK(kiln_session_set_node_precision(s, &badp, 1) == KILN_ERR_INVALID_ARGUMENT, "bad precision");
    CHECK(kiln_session_node_weight_elems(s, "fc1") == 64 * 32, "fc1 weights %lld",
          (long long)kiln_session_node_weight_elems(s, "fc1"));
    CHECK(kiln_session_node_weight_elems(s, "softmax") == 0, "softmax has no weights");
    CHECK(kiln_session_node_weight_elems(s, "nope") == -1, "unknown node");
    kiln_session_free(s);
    kiln_session_options ro;
    kiln_session_options_init(&ro);
    ro.reference = 1;
    if (kiln_session_create(m, NULL, &ro, &s) == KILN_OK) {
        kiln_node_precision one = {"fc1", KILN_PRECISION_INT8};
        CHECK(kiln_session_set_node_precision(s, &one, 1) == KILN_ERR_UNSUPPORTED, "reference");
        kiln_session_free(s);
    }

    /* an int8 session with both products fp32 is the fp32 session */
    s = session(m, KILN_PRECISION_INT8, 0);
    kiln_node_precision both32[2] = {{"fc1", KILN_PRECISION_FP32}, {"fc2", KILN_PRECISION_FP32}};
    CHECK(kiln_session_set_node_precision(s, both32, 2) == KILN_OK, "%s", kiln_last_error());
    CHECK(kiln_session_node_precision(s, "fc1") == KILN_PRECISION_FP32, "fc1 asked fp32");
    CHECK(kiln_session_node_precision(s, "softmax") == KILN_PRECISION_INT8, "default");
    kiln_tensor *y = run(s, x);
    CHECK(same(y, y32), "int8 session with every product fp32 == fp32 session");
    kiln_tensor_free(y);
    /* cleared: the int8 session again */
    CHECK(kiln_session_set_node_precision(s, NULL, 0) == KILN_OK, "clear");
    y = run(s, x);
    CHECK(same(y, y8), "cleared exceptions == int8 session");
    kiln_tensor_free(y);
    kiln_session_free(s);

    /* a bf16 session with fc1 kept fp32, saved: fc1's weights stay fp32 in the file */
    s = session(m, KILN_PRECISION_BF16, 0);
    kiln_node_precision keep = {"fc1", KILN_PRECISION_FP32};
    CHECK(kiln_session_set_node_precision(s, &keep, 1) == KILN_OK, "%s", kiln_last_error());
    kiln_tensor *yb = run(s, x);
    char bpath[] = "/tmp/kiln_node_prec_bf16_XXXXXX";
    int bfd = mkstemp(bpath);
    if (bfd >= 0) close(bfd);
    CHECK(bfd >= 0 && kiln_session_save(s, bpath, NULL) == KILN_OK, "save: %s", kiln_last_error());
    kiln_model *mb = NULL;
    CHECK(kiln_model_load(bpath, NULL, &mb) == KILN_OK, "load: %s", kiln_last_error());
    if (mb) {
        kiln_session *sb = session(mb, KILN_PRECISION_BF16, 0);
        kiln_tensor *ybk = sb ? run(sb, x) : NULL;
        CHECK(same(ybk, yb), "the bf16 .kiln with fc1 fp32 computes what the session did");
        kiln_tensor_free(ybk);
        kiln_session_free(sb);
        kiln_model_free(mb);
    }
    unlink(bpath);
    kiln_tensor_free(yb);
    kiln_session_free(s);

    if (!cpu_has_vnni()) {
        CHECK_SKIP_CPU("no VNNI/AMX: int8 nodes run fp32, the mixed cases are not meaningful");
    } else {
        CHECK(!same(y32, y8), "int8 differs from fp32 on this input");
        s = session(m, KILN_PRECISION_FP32, 0);
        kiln_node_precision both8[2] = {{"fc1", KILN_PRECISION_INT8}, {"fc2", KILN_PRECISION_INT8}};
        CHECK(kiln_session_set_node_precision(s, both8, 2) == KILN_OK, "%s", kiln_last_error());
        y = run(s, x);
        CHECK(same(y, y8), "fp32 session with every product int8 == int8 session");
        kiln_tensor_free(y);
        kiln_session_free(s);

        /* one node alone */
        s = session(m, KILN_PRECISION_FP32, 1);
        kiln_node_precision one = {"fc1", KILN_PRECISION_INT8};
        CHECK(kiln_session_set_node_precision(s, &one, 1) == KILN_OK, "%s", kiln_last_error());
        kiln_tensor *ym = run(s, x);
        char k1[64], k2[64];
        kernel_of(s, "fc1", k1, sizeof k1);
        kernel_of(s, "fc2", k2, sizeof k2);
        CHECK(strstr(k1, "_int8") != NULL, "fc1 ran on %s", k1);
        CHECK(k2[0] && strstr(k2, "_int8") == NULL, "fc2 ran on %s", k2);
        CHECK(ym && !same(ym, y32) && !same(ym, y8), "mixed differs from both uniform runs");

        /* saved and loaded back: the same per-node precisions */
        char path[] = "/tmp/kiln_node_prec_XXXXXX";
        int fd = mkstemp(path);
        if (fd >= 0) close(fd);
        CHECK(fd >= 0 && kiln_session_save(s, path, NULL) == KILN_OK, "save: %s", kiln_last_error());
        /* fc1's weight (32 x 64 f32: 8 of the 11 KB of the fp32 file) is stored s8:
         * the file is well under the fp32 session's (format version 2) */
        long mixed_size = file_size(path);
        kiln_session *sf32 = session(m, KILN_PRECISION_FP32, 0);
        char p32[] = "/tmp/kiln_node_prec_fp32_XXXXXX";
        int fd32 = mkstemp(p32);
        if (fd32 >= 0) close(fd32);
        CHECK(sf32 && fd32 >= 0 && kiln_session_save(sf32, p32, NULL) == KILN_OK, "save fp32: %s",
              kiln_last_error());
        long fp32_size = file_size(p32);
        CHECK(mixed_size > 0 && fp32_size > 0 && mixed_size < fp32_size * 3 / 4,
              "fp32 session with fc1 int8: %ld bytes, all fp32: %ld", mixed_size, fp32_size);
        unlink(p32);
        kiln_session_free(sf32);
        kiln_model *mk = NULL;
        CHECK(kiln_model_load(path, NULL, &mk) == KILN_OK, "load: %s", kiln_last_error());
        if (mk) {
            kiln_session *sk = session(mk, KILN_PRECISION_FP32, 1);
            kiln_tensor *yk = sk ? run(sk, x) : NULL;
            CHECK(same(yk, ym), "the .kiln computes what the mixed session did");
            if (sk) {
                kernel_of(sk, "fc1", k1, sizeof k1);
                kernel_of(sk, "fc2", k2, sizeof k2);
            }
            CHECK(strstr(k1, "_int8") != NULL && !strstr(k2, "_int8"), "loaded: %s, %s", k1, k2);
            kiln_tensor_free(yk);
            kiln_session_free(sk);
            kiln_model_free(mk);
        }
        unlink(path);
        kiln_tensor_free(ym);
        kiln_session_free(s);
    }
    kiln_tensor_free(y32);
    kiln_tensor_free(y8);
    kiln_tensor_free(x);
    kiln_session_free(s32);
    kiln_session_free(s8);
    kiln_model_free(m);
    return CHECK_DONE();
}
