/*
 * fuzz_example_json.c - libFuzzer target for the server's JSON -> tf.Example
 * encoder (src/serve/example.c), which turns the bodies of :classify and
 * :regress requests into serialized tf.Example protos.
 *
 * Each input is a request body. It is tokenized with the server's limits
 * (src/serve/json.c) and, when it parses, encoded with
 * kiln_examples_encode from the top-level value, as routes.c does. A
 * failure must fill the error buffer. A success must give a string vector
 * with one element per entry of "examples", and each element must be a
 * well-formed Example exactly as example.c's header describes it (Example
 * { features = 1 }, Features { entry = 1 { key = 1; value = 2 } }, Feature
 * with one of bytes_list = 1, float_list = 2 (packed, whole floats) or
 * int64_list = 3 (packed varints)): the bytes go on to the TfParseExample
 * kernel, so the encoder must not write what that parser rejects. Anything
 * else aborts.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/example.h"
#include "serve/json.h"

struct span {
    const uint8_t *p, *end;
};

static bool rd_varint(struct span *s, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 70 && s->p < s->end; shift += 7) {
        uint8_t b = *s->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* A length-delimited field with the given field number. */
static bool rd_field(struct span *s, uint64_t field, struct span *sub)
{
    uint64_t tag, n;
    if (!rd_varint(s, &tag) || tag != (field << 3 | 2)) return false;
    if (!rd_varint(s, &n) || n > (uint64_t)(s->end - s->p)) return false;
    sub->p = s->p;
    sub->end = s->p + n;
    s->p += n;
    return true;
}

/* Feature { one of bytes_list = 1, float_list = 2, int64_list = 3 }. */
static bool valid_feature(struct span f)
{
    if (f.p >= f.end) return false;
    uint64_t kind = *f.p >> 3;
    struct span list, v;
    if (kind < 1 || kind > 3 || !rd_field(&f, kind, &list) || f.p != f.end) return false;
    if (kind == 1) { /* BytesList: repeated bytes value = 1 */
        while (list.p < list.end)
            if (!rd_field(&list, 1, &v)) return false;
        return true;
    }
    if (!rd_field(&list, 1, &v) || list.p != list.end) return false; /* one packed field */
    if (kind == 2) return (v.end - v.p) % 4 == 0;
    uint64_t x;
    while (v.p < v.end)
        if (!rd_varint(&v, &x)) return false;
    return true;
}

/* Example { Features features = 1 { map<string, Feature> feature = 1 } }. */
static bool valid_example(const kiln_string *s)
{
    struct span ex = {(const uint8_t *)s->data, (const uint8_t *)s->data + s->len};
    struct span feats, entry, key, value;
    if (!rd_field(&ex, 1, &feats) || ex.p != ex.end) return false;
    while (feats.p < feats.end) {
        if (!rd_field(&feats, 1, &entry)) return false;
        if (!rd_field(&entry, 1, &key) || !rd_field(&entry, 2, &value) || entry.p != entry.end)
            return false;
        if (!valid_feature(value)) return false;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KILN_JSON_ERR_LEN];
    kiln_json_doc doc;
    if (kiln_json_parse((const char *)data, size, KILN_JSON_MAX_DEPTH, &doc, err) != KILN_OK)
        return 0;
    err[0] = '\0';
    kiln_tensor *t = NULL;
    if (kiln_examples_encode(&doc, 0, &t, err) == KILN_OK) {
        int exs = kiln_json_object_get(&doc, 0, "examples");
        if (!t || t->dtype != KILN_DTYPE_STRING || t->rank != 1 || exs < 0 ||
            t->dims[0] != (int64_t)doc.tok[exs].size) {
            fprintf(stderr, "fuzz_example_json: the encoded tensor has the wrong shape\n");
            abort();
        }
        const kiln_string *s = t->data;
        for (int64_t i = 0; i < t->dims[0]; i++)
            if (!valid_example(&s[i])) {
                fprintf(stderr, "fuzz_example_json: example %lld is not a well-formed "
                        "tf.Example\n", (long long)i);
                abort();
            }
        kiln_tensor_free(t);
    } else if (t || !err[0]) {
        fprintf(stderr, "fuzz_example_json: a failed encode left a tensor or no message\n");
        abort();
    }
    kiln_json_doc_free(&doc);
    return 0;
}
