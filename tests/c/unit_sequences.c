/*
 * unit_sequences.c - sequence and optional values through the public API
 * (kiln.h: KILN_DTYPE_SEQUENCE / KILN_DTYPE_OPTIONAL, docs/SEQUENCES.md).
 *
 * The container calls themselves: slots out of range, wrong kinds, an
 * optional holding two items, a sequence holding an optional are errors that
 * free what they were given; clones are deep. Then sessions on two ONNX
 * conformance models (from ../shared/testdata, skipped when absent) with
 * containers built here: SequenceInsert appends the caller's tensor to the
 * caller's sequence (answers known by construction), OptionalHasElement
 * sees an empty and a full optional, and malformed caller containers (an
 * empty slot, the wrong kind, a tensor where a sequence is declared) are
 * refused with a message naming the input.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/tensor.h"
#include "kiln/kiln.h"

static kiln_tensor *vec(float a, float b)
{
    int64_t d = 2;
    kiln_tensor *t = NULL;
    if (kiln_tensor_create(KILN_DTYPE_F32, 1, &d, &t) != KILN_OK) return NULL;
    ((float *)t->data)[0] = a;
    ((float *)t->data)[1] = b;
    return t;
}

static void api(void)
{
    kiln_tensor *s = NULL, *o = NULL, *c = NULL;
    CHECK(kiln_tensor_container_create(KILN_DTYPE_F32, 2, &s) != KILN_OK, "a float32 container");
    CHECK(kiln_tensor_container_create(KILN_DTYPE_OPTIONAL, 2, &o) != KILN_OK,
          "an optional of two");
    CHECK(kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, 3, &s) == KILN_OK, "%s",
          kiln_last_error());
    CHECK(s->dtype == KILN_DTYPE_SEQUENCE && s->rank == 1 && s->dims[0] == 3, "shape");
    CHECK(kiln_tensor_item(s, 0) == NULL && kiln_tensor_item(s, 3) == NULL &&
              kiln_tensor_item(s, -1) == NULL,
          "empty and out-of-range slots");
    for (int i = 0; i < 3; i++) CHECK(kiln_tensor_set_item(s, i, vec((float)i, 1)) == KILN_OK, "set");
    CHECK(kiln_tensor_set_item(s, 3, vec(0, 0)) != KILN_OK, "slot 3 of 3");
    CHECK(kiln_tensor_set_item(s, 1, vec(7, 8)) == KILN_OK, "replace (frees the old item)");
    CHECK(((const float *)kiln_tensor_item(s, 1)->data)[0] == 7, "replaced");
    CHECK(kiln_tensor_container_create(KILN_DTYPE_OPTIONAL, 1, &o) == KILN_OK, "optional");
    CHECK(kiln_tensor_clone(s, &c) == KILN_OK, "clone");
    CHECK(kiln_tensor_set_item(o, 0, c) == KILN_OK, "optional of a sequence");
    CHECK(kiln_tensor_item(kiln_tensor_item(o, 0), 2) != kiln_tensor_item(s, 2), "deep clone");
    CHECK(((const float *)kiln_tensor_item(kiln_tensor_item(o, 0), 2)->data)[0] == 2, "clone data");
    kiln_tensor *o2 = NULL;
    CHECK(kiln_tensor_clone(o, &o2) == KILN_OK, "clone an optional");
    CHECK(kiln_tensor_set_item(s, 0, o2) != KILN_OK, "a sequence holding an optional");
    CHECK(strstr(kiln_last_error(), "optional") != NULL, "%s", kiln_last_error());
    CHECK(strcmp(kiln_dtype_name(KILN_DTYPE_SEQUENCE), "sequence") == 0, "name");
    kiln_tensor_free(o);
    kiln_tensor_free(s);
}

static kiln_model *load(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/onnx/node/%s/model.onnx", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fclose(f);
    kiln_model *m = NULL;
    CHECK(kiln_model_load(path, NULL, &m) == KILN_OK, "%s: %s", name, kiln_last_error());
    return m;
}

static kiln_tensor *ivec(int64_t a, int64_t b) /* [a, b, a + b]: the model's [3] */
{
    int64_t d = 3;
    kiln_tensor *t = NULL;
    if (kiln_tensor_create(KILN_DTYPE_I64, 1, &d, &t) != KILN_OK) return NULL;
    ((int64_t *)t->data)[0] = a;
    ((int64_t *)t->data)[1] = b;
    ((int64_t *)t->data)[2] = a + b;
    return t;
}

static void insert_at_back(kiln_model *m)
{
    kiln_session *s = NULL;
    CHECK(kiln_session_create(m, NULL, NULL, &s) == KILN_OK, "%s", kiln_last_error());
    if (!s) return;
    const kiln_signature *sig = kiln_session_signature(s);
    CHECK(kiln_signature_input(sig, 0)->dtype == KILN_DTYPE_SEQUENCE, "input 0 is a sequence");
    CHECK(kiln_signature_output(sig, 0)->dtype == KILN_DTYPE_SEQUENCE, "output is a sequence");
    kiln_tensor *seq = NULL, *x = ivec(10, 20);
    kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, 2, &seq);
    kiln_named_tensor in[2] = {{kiln_signature_input(sig, 0)->name, seq},
                               {kiln_signature_input(sig, 1)->name, x}};
    /* an empty slot is refused */
    kiln_tensor_set_item(seq, 0, ivec(1, 2));
    kiln_outputs *out = NULL;
    CHECK(kiln_session_run(s, in, 2, &out) == KILN_ERR_INVALID_ARGUMENT, "empty slot");
    CHECK(strstr(kiln_last_error(), in[0].name) != NULL, "names the input: %s", kiln_last_error());
    kiln_tensor_set_item(seq, 1, ivec(3, 4));
    /* a tensor where a sequence is declared is refused */
    kiln_named_tensor wrong[2] = {{in[0].name, x}, in[1]};
    CHECK(kiln_session_run(s, wrong, 2, &out) == KILN_ERR_INVALID_ARGUMENT, "tensor for sequence");
    CHECK(strstr(kiln_last_error(), "sequence") != NULL, "%s", kiln_last_error());
    CHECK(kiln_session_run(s, in, 2, &out) == KILN_OK, "%s", kiln_last_error());
    if (out) {
        const kiln_tensor *y = kiln_outputs_get(out, 0);
        CHECK(y->dtype == KILN_DTYPE_SEQUENCE && y->dims[0] == 3, "three items");
        const int64_t want[3][3] = {{1, 2, 3}, {3, 4, 7}, {10, 20, 30}};
        for (int i = 0; i < 3 && y->dims[0] == 3; i++) {
            const kiln_tensor *it = kiln_tensor_item(y, i);
            CHECK(it && it->dtype == KILN_DTYPE_I64 && kiln_tensor_count(it) == 3 &&
                      !memcmp(it->data, want[i], sizeof want[i]),
                  "item %d", i);
        }
        CHECK(kiln_tensor_item(y, 2) != x, "the output owns a copy");
        kiln_tensor *taken = kiln_outputs_take(out, 0);
        kiln_outputs_free(out);
        kiln_tensor_free(taken);
    }
    kiln_tensor_free(seq);
    kiln_tensor_free(x);
    kiln_session_free(s);
}

static void has_element(kiln_model *m)
{
    kiln_session *s = NULL;
    CHECK(kiln_session_create(m, NULL, NULL, &s) == KILN_OK, "%s", kiln_last_error());
    if (!s) return;
    const char *name = kiln_signature_input(kiln_session_signature(s), 0)->name;
    for (int full = 0; full < 2; full++) {
        kiln_tensor *o = NULL;
        kiln_tensor_container_create(KILN_DTYPE_OPTIONAL, full, &o);
        if (full) kiln_tensor_set_item(o, 0, vec(1, 1));
        kiln_named_tensor in = {name, o};
        kiln_outputs *out = NULL;
        CHECK(kiln_session_run(s, &in, 1, &out) == KILN_OK, "%s", kiln_last_error());
        if (out) {
            const kiln_tensor *y = kiln_outputs_get(out, 0);
            CHECK(y->dtype == KILN_DTYPE_BOOL && ((const uint8_t *)y->data)[0] == full,
                  "has element %d", full);
        }
        kiln_outputs_free(out);
        kiln_tensor *seq = NULL;
        kiln_tensor_container_create(KILN_DTYPE_SEQUENCE, 0, &seq);
        in.tensor = seq;
        CHECK(kiln_session_run(s, &in, 1, &out) == KILN_ERR_INVALID_ARGUMENT,
              "a sequence for an optional");
        kiln_tensor_free(seq);
        kiln_tensor_free(o);
    }
    kiln_session_free(s);
}

int main(void)
{
    api();
    const char *dir = getenv("KILN_TESTDATA");
    kiln_model *a = dir ? load(dir, "test_sequence_insert_at_back") : NULL;
    kiln_model *b = dir ? load(dir, "test_optional_has_element_optional_input") : NULL;
    if (!a || !b) CHECK_SKIP("ONNX conformance models not found under KILN_TESTDATA");
    if (a) insert_at_back(a);
    if (b) has_element(b);
    kiln_model_free(a);
    kiln_model_free(b);
    return CHECK_DONE();
}
