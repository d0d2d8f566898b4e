/*
 * fuzz_onnx_value.c - libFuzzer target for Kiln's reader of ONNX run-time
 * values (kiln_onnx_read_value, src/import/onnx_import.c): the first byte
 * picks what the rest is read as (a TensorProto, a SequenceProto or an
 * OptionalProto), as the conformance runner reads test data by the declared
 * type of each input and output. A value that reads must be well formed: a
 * container of at most its bound in items (an optional 0 or 1), each a
 * tensor whose element count matches its bytes, or a nested container;
 * anything else aborts. Every value is cloned and freed, so a sanitizer
 * sees the container copy and free paths too.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_onnx_value
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_onnx_value that the test suite runs over
 * tests/corpus/onnx_value.
 */
#include <stdint.h>
#include <stdlib.h>

#include "core/tensor.h"
#include "import/model.h"

static void check(const kiln_tensor *t, int depth)
{
    if (!t || depth > 3) abort();
    if (kiln_dtype_is_container(t->dtype)) {
        int64_t max = t->dtype == KILN_DTYPE_OPTIONAL ? 1 : KILN_SEQUENCE_MAX_ITEMS;
        if (t->rank != 1 || t->dims[0] < 0 || t->dims[0] > max) abort();
        for (int64_t i = 0; i < t->dims[0]; i++) check(kiln_tensor_item(t, i), depth + 1);
        return;
    }
    if (t->dtype <= KILN_DTYPE_UNDEFINED || t->dtype >= KILN_DTYPE_COUNT) abort();
    int64_t n = kiln_shape_count(t->rank, t->dims);
    if (n < 0 || (size_t)n * kiln_dtype_size(t->dtype) != t->nbytes) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const kiln_dtype kinds[3] = {KILN_DTYPE_UNDEFINED, KILN_DTYPE_SEQUENCE,
                                        KILN_DTYPE_OPTIONAL};
    kiln_tensor *v = NULL;
    if (kiln_onnx_read_value(data + 1, size - 1, kinds[data[0] % 3], &v) == KILN_OK) {
        check(v, 0);
        kiln_tensor *c = NULL;
        if (kiln_tensor_clone(v, &c) == KILN_OK) check(c, 0);
        kiln_tensor_free(c);
    }
    kiln_tensor_free(v);
    return 0;
}
