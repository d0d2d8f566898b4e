/*
 * test_textproto.c - the protobuf text format parser (src/import/textproto.c)
 * against the schemas already in the build: an ONNX ModelProto exercising
 * every value syntax, the error cases with their messages and positions,
 * the depth and oneof rules, and, when the shared test data is present, the
 * text-format SavedModel half_plus_two_pbtxt.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "import/textproto.h"
#include "onnx.pb-c.h"
#include "saved_model.pb-c.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

static ProtobufCMessage *parse(const ProtobufCMessageDescriptor *d, const char *text,
                               kiln_status *st)
{
    ProtobufCMessage *m = NULL;
    *st = kiln_textproto_parse(d, text, strlen(text), &m);
    return m;
}

static KilnOnnx__ModelProto *parse_model(const char *text, kiln_status *st)
{
    return (KilnOnnx__ModelProto *)parse(&kiln_onnx__model_proto__descriptor, text, st);
}

/* Expect text to fail with status want and a message containing each of the
 * NULL-terminated substrings. */
static void expect_error(const char *text, kiln_status want, ...)
{
    kiln_status st;
    ProtobufCMessage *m = parse(&kiln_onnx__model_proto__descriptor, text, &st);
    CHECK(st == want && m == NULL, "'%s': status %s, want %s (%s)", text, kiln_status_name(st),
          kiln_status_name(want), kiln_last_error());
    if (m) protobuf_c_message_free_unpacked(m, NULL);
    va_list ap;
    va_start(ap, want);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;)
        CHECK(strstr(kiln_last_error(), s) != NULL, "'%s': message '%s' lacks '%s'", text,
              kiln_last_error(), s);
    va_end(ap);
}

static const char *model_text =
    "# a model written by hand\n"
    "ir_version: 8\n"
    "producer_name: \"kiln\" 'test'  # adjacent strings concatenate\n"
    "opset_import { domain: \"\" version: 13 }\n"
    "opset_import < version: 0x11 >;\n"
    "graph {\n"
    "  name: \"g\"\n"
    "  node {\n"
    "    input: [\"x\", \"w\"]\n"
    "    output: \"y\"\n"
    "    op_type: \"Conv\",\n"
    "    attribute { name: \"kernel_shape\" ints: [3, 3] type: 7 }\n"
    "    attribute { name: \"pads\" ints: 1 ints: -1; ints: 0, ints: 017 }\n"
    "    attribute { name: \"alpha\" f: 1.5f }\n"
    "    attribute { name: \"beta\" f: -inf }\n"
    "    attribute { name: \"gamma\" f: NaN }\n"
    "    attribute { name: \"delta\" floats: [1e3, .5, -2.5E-1, 7, 1e39] }\n"
    "    attribute { name: \"s\" s: \"\\001\\x02\\n\\\"q\\'\\\\\\u00e9\\U0001F600\\0\" }\n"
    "    attribute { name: \"t\" type: -2147483648 }\n"
    "  }\n"
    "  node: { op_type: 'Relu' }\n"
    "  initializer {\n"
    "    dims: [2, 3] data_type: 1\n"
    "    float_data: [1, -2.5, 1e3, .5, 0x10, 017]\n"
    "    raw_data: \"\\000\\377\"\n"
    "    uint64_data: 18446744073709551615\n"
    "    double_data: [-1.25, 1e-300]\n"
    "  }\n"
    "  input {\n"
    "    name: \"x\"\n"
    "    type { tensor_type { elem_type: 1 shape { dim { dim_value: -1 } dim { dim_param: \"N\" } } } }\n"
    "  }\n"
    "  input []\n"
    "}\n"
    "model_version: -9223372036854775808\n"
    "doc_string: \"line1\\nline2\"\n"
    "metadata_props [{ key: \"k1\" value: \"v1\" }, { key: \"k2\" value: \"v2\" }]\n";

static void test_model(void)
{
    kiln_status st;
    KilnOnnx__ModelProto *m = parse_model(model_text, &st);
    CHECK(st == KILN_OK && m, "model: %s", kiln_last_error());
    if (!m) return;
    CHECK(m->has_ir_version && m->ir_version == 8, "ir_version %lld", (long long)m->ir_version);
    CHECK(m->producer_name && strcmp(m->producer_name, "kilntest") == 0, "producer_name '%s'",
          m->producer_name);
    CHECK(m->n_opset_import == 2 && m->opset_import[0]->version == 13 &&
              strcmp(m->opset_import[0]->domain, "") == 0 && m->opset_import[1]->version == 17,
          "opset_import");
    CHECK(m->model_version == INT64_MIN, "model_version %lld", (long long)m->model_version);
    CHECK(m->doc_string && strcmp(m->doc_string, "line1\nline2") == 0, "doc_string");
    CHECK(m->n_metadata_props == 2 && strcmp(m->metadata_props[1]->key, "k2") == 0 &&
              strcmp(m->metadata_props[1]->value, "v2") == 0,
          "metadata_props (list of messages)");
    KilnOnnx__GraphProto *g = m->graph;
    CHECK(g && strcmp(g->name, "g") == 0 && g->n_node == 2, "graph");
    if (!g || g->n_node != 2) goto out;
    KilnOnnx__NodeProto *n = g->node[0];
    CHECK(n->n_input == 2 && strcmp(n->input[1], "w") == 0 && n->n_output == 1 &&
              strcmp(n->op_type, "Conv") == 0,
          "node");
    CHECK(strcmp(g->node[1]->op_type, "Relu") == 0, "second node ('node: {', single quotes)");
    CHECK(n->n_attribute == 8, "attributes %zu", n->n_attribute);
    if (n->n_attribute != 8) goto out;
    KilnOnnx__AttributeProto **a = n->attribute;
    CHECK(a[0]->n_ints == 2 && a[0]->ints[0] == 3 && a[0]->ints[1] == 3 && a[0]->type == 7,
          "kernel_shape");
    CHECK(a[1]->n_ints == 4 && a[1]->ints[0] == 1 && a[1]->ints[1] == -1 && a[1]->ints[2] == 0 &&
              a[1]->ints[3] == 15,
          "pads (separators, octal)");
    CHECK(a[2]->has_f && a[2]->f == 1.5f, "f suffix: %g", a[2]->f);
    CHECK(isinf(a[3]->f) && a[3]->f < 0, "-inf: %g", a[3]->f);
    CHECK(isnan(a[4]->f), "NaN: %g", a[4]->f);
    CHECK(a[5]->n_floats == 5 && a[5]->floats[0] == 1000.0f && a[5]->floats[1] == 0.5f &&
              a[5]->floats[2] == -0.25f && a[5]->floats[3] == 7.0f && isinf(a[5]->floats[4]),
          "floats");
    static const char want_s[] = "\001\002\n\"q'\\\xc3\xa9\xf0\x9f\x98\x80";
    CHECK(a[6]->has_s && a[6]->s.len == sizeof want_s && memcmp(a[6]->s.data, want_s, sizeof want_s) == 0,
          "bytes with escapes (%zu bytes)", a[6]->s.len);
    CHECK(a[7]->type == INT32_MIN, "int32 minimum %d", a[7]->type);
    CHECK(g->n_initializer == 1, "initializer");
    if (g->n_initializer == 1) {
        KilnOnnx__TensorProto *t = g->initializer[0];
        CHECK(t->n_dims == 2 && t->dims[0] == 2 && t->dims[1] == 3 && t->data_type == 1, "dims");
        static const float want_f[] = {1, -2.5f, 1000, 0.5f, 16, 15};
        CHECK(t->n_float_data == 6 && memcmp(t->float_data, want_f, sizeof want_f) == 0,
              "float_data (packed field written unpacked)");
        CHECK(t->raw_data.len == 2 && t->raw_data.data[0] == 0 && t->raw_data.data[1] == 0xff,
              "raw_data");
        CHECK(t->n_uint64_data == 1 && t->uint64_data[0] == UINT64_MAX, "uint64 maximum");
        CHECK(t->n_double_data == 2 && t->double_data[0] == -1.25 && t->double_data[1] == 1e-300,
              "double_data");
    }
    CHECK(g->n_input == 1, "inputs %zu ('input []' adds none)", g->n_input);
    if (g->n_input == 1) {
        KilnOnnx__TypeProto *tp = g->input[0]->type;
        CHECK(tp && tp->value_case == KILN_ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE, "oneof case");
        if (tp && tp->value_case == KILN_ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE) {
            KilnOnnx__TensorShapeProto *sh = tp->tensor_type->shape;
            CHECK(sh && sh->n_dim == 2 && sh->dim[0]->dim_value == -1 &&
                      strcmp(sh->dim[1]->dim_param, "N") == 0,
                  "shape");
        }
    }
out:
    protobuf_c_message_free_unpacked(&m->base, NULL);
}

/* Messages of 128 bytes or more get 5-byte lengths; check they unpack. */
static void test_large_nested(void)
{
    size_t cap = 200000, n = 0;
    char *text = malloc(cap);
    n += (size_t)snprintf(text + n, cap - n, "graph { ");
    for (int i = 0; i < 2000; i++)
        n += (size_t)snprintf(text + n, cap - n, "node { name: \"node%d\" input: \"a\" }\n", i);
    n += (size_t)snprintf(text + n, cap - n, "doc_string: \"");
    for (int i = 0; i < 300; i++) text[n++] = 'x';
    n += (size_t)snprintf(text + n, cap - n, "\" }");
    kiln_status st;
    KilnOnnx__ModelProto *m = parse_model(text, &st);
    CHECK(st == KILN_OK && m && m->graph && m->graph->n_node == 2000 &&
              strcmp(m->graph->node[1999]->name, "node1999") == 0 &&
              strlen(m->graph->doc_string) == 300,
          "large nested message: %s", kiln_last_error());
    if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
    free(text);
}

/* graph > input > type, then (sequence_type > elem_type) pairs: 3 + 2k levels. */
static char *nested_text(int pairs)
{
    size_t cap = (size_t)pairs * 40 + 100;
    char *s = malloc(cap);
    size_t n = (size_t)snprintf(s, cap, "graph { input { type { ");
    for (int i = 0; i < pairs; i++) n += (size_t)snprintf(s + n, cap - n, "sequence_type { elem_type { ");
    for (int i = 0; i < pairs * 2 + 3; i++) n += (size_t)snprintf(s + n, cap - n, "}");
    return s;
}

static void test_depth(void)
{
    kiln_status st;
    char *ok = nested_text((KILN_TEXTPROTO_MAX_DEPTH - 4) / 2); /* 99 levels */
    KilnOnnx__ModelProto *m = parse_model(ok, &st);
    CHECK(st == KILN_OK && m, "99 levels: %s", kiln_last_error());
    if (m) protobuf_c_message_free_unpacked(&m->base, NULL);
    free(ok);
    char *deep = nested_text(5000);
    expect_error(deep, KILN_ERR_INVALID_MODEL, "nested more than 100 levels", NULL);
    free(deep);
}

static void test_errors(void)
{
    expect_error("ir_version: 1\nmax_batch_sise: 3", KILN_ERR_INVALID_MODEL,
                 "line 2:1: unknown field 'max_batch_sise' in ModelProto", NULL);
    expect_error("graph {\n  node { attribute { nme: \"x\" } } }", KILN_ERR_INVALID_MODEL,
                 "line 2:22: unknown field 'nme' in AttributeProto", NULL);
    expect_error("graph { node { attribute { type: 2147483648 } } }", KILN_ERR_INVALID_MODEL,
                 "out of range", "'type' (int32)", NULL);
    expect_error("graph { node { attribute { type: -2147483649 } } }", KILN_ERR_INVALID_MODEL,
                 "value -2147483649 is out of range", NULL);
    expect_error("ir_version: 9223372036854775808", KILN_ERR_INVALID_MODEL, "out of range", NULL);
    expect_error("ir_version: 99999999999999999999", KILN_ERR_INVALID_MODEL, "does not fit", NULL);
    expect_error("graph { initializer { uint64_data: -1 } }", KILN_ERR_INVALID_MODEL,
                 "out of range", "uint64", NULL);
    expect_error("ir_version 3", KILN_ERR_INVALID_MODEL, "line 1:12: expected ':' after field 'ir_version'", NULL);
    expect_error("producer_name: \"abc", KILN_ERR_INVALID_MODEL, "line 1:16:", "not closed", NULL);
    expect_error("producer_name: \"abc\ndef\"", KILN_ERR_INVALID_MODEL, "not closed", NULL);
    expect_error("producer_name: \"a\\qb\"", KILN_ERR_INVALID_MODEL, "line 1:18: unknown escape '\\q'", NULL);
    expect_error("producer_name: \"\\x\"", KILN_ERR_INVALID_MODEL, "hex digits", NULL);
    expect_error("producer_name: \"\\777\"", KILN_ERR_INVALID_MODEL, "larger than", NULL);
    expect_error("producer_name: \"\\ud800\"", KILN_ERR_INVALID_MODEL, "surrogate", NULL);
    expect_error("producer_name: \"\\U00110000\"", KILN_ERR_INVALID_MODEL, "Unicode", NULL);
    expect_error("graph { name: \"x\"", KILN_ERR_INVALID_MODEL, "expected '}' to close GraphProto", NULL);
    expect_error("graph { name: \"x\" >", KILN_ERR_INVALID_MODEL, "expected a field name", NULL);
    expect_error("graph < name: \"x\" }", KILN_ERR_INVALID_MODEL, "expected a field name", NULL);
    expect_error("}", KILN_ERR_INVALID_MODEL, "line 1:1: expected a field name in ModelProto", NULL);
    expect_error("[kiln.ext]: 1", KILN_ERR_UNSUPPORTED, "extension or Any field '[kiln.ext]' in ModelProto", NULL);
    expect_error("graph { [type.googleapis.com/kiln.Foo] { } }", KILN_ERR_UNSUPPORTED,
                 "'[type.googleapis.com/kiln.Foo]' in GraphProto is not supported", NULL);
    expect_error("ir_version: 1 ir_version: 2", KILN_ERR_INVALID_MODEL,
                 "line 1:15: field 'ir_version' in ModelProto is given more than once", NULL);
    expect_error("graph { } graph { }", KILN_ERR_INVALID_MODEL, "more than once", NULL);
    expect_error("ir_version: [1]", KILN_ERR_INVALID_MODEL, "not repeated", NULL);
    expect_error("ir_version: \"1\"", KILN_ERR_INVALID_MODEL, "expected an integer for field 'ir_version'", NULL);
    expect_error("ir_version: 1.5", KILN_ERR_INVALID_MODEL, "expected an integer", NULL);
    expect_error("ir_version: 12abc", KILN_ERR_INVALID_MODEL, "'12abc' is not a valid number", NULL);
    expect_error("ir_version: 09", KILN_ERR_INVALID_MODEL, "octal", NULL);
    expect_error("ir_version: 0x", KILN_ERR_INVALID_MODEL, "hex digits", NULL);
    expect_error("graph { node { attribute { f: 1e } } }", KILN_ERR_INVALID_MODEL, "exponent", NULL);
    expect_error("graph { node { attribute { f: \"x\" } } }", KILN_ERR_INVALID_MODEL, "expected a number", NULL);
    expect_error("graph { node { attribute { f: infinite } } }", KILN_ERR_INVALID_MODEL, "expected a number", NULL);
    expect_error("producer_name: 5", KILN_ERR_INVALID_MODEL, "expected a string", NULL);
    expect_error("graph: 5", KILN_ERR_INVALID_MODEL, "expected '{' to open field 'graph' (GraphProto)", NULL);
    expect_error("graph { node { input: [\"a\" \"b\" } }", KILN_ERR_INVALID_MODEL, "expected ',' or ']'", NULL);
    expect_error("graph { input { type { tensor_type { } sequence_type { } } } }", KILN_ERR_INVALID_MODEL,
                 "fields 'tensor_type' and 'sequence_type' in TypeProto belong to one oneof", NULL);
    expect_error("graph { input { type { tensor_type { shape { dim { dim_value: 1 dim_param: \"N\" } } } } } }",
                 KILN_ERR_INVALID_MODEL, "one oneof", NULL);
    expect_error("ir_version: 1 $", KILN_ERR_INVALID_MODEL, "line 1:15: expected a field name", NULL);
    expect_error("ir_version: 1 \xc3\xa9", KILN_ERR_INVALID_MODEL, "unexpected byte 0xc3", NULL);
    expect_error("ir_version: -", KILN_ERR_INVALID_MODEL, "expected an integer", "end of input", NULL);

    /* NUL bytes are not text */
    static const char nul[] = "ir_version: 1\0 ir_version: 2";
    ProtobufCMessage *m = NULL;
    kiln_status st = kiln_textproto_parse(&kiln_onnx__model_proto__descriptor, nul, sizeof nul - 1, &m);
    CHECK(st == KILN_ERR_INVALID_MODEL && !m && strstr(kiln_last_error(), "0x00"), "NUL: %s",
          kiln_last_error());

    /* Only len bytes are read: the same text cut short is an error. */
    const char *cut = "graph { name: \"abc\" }";
    st = kiln_textproto_parse(&kiln_onnx__model_proto__descriptor, cut, strlen(cut) - 1, &m);
    CHECK(st == KILN_ERR_INVALID_MODEL, "cut: %s", kiln_last_error());

    /* Empty text is an empty message. */
    st = kiln_textproto_parse(&kiln_onnx__model_proto__descriptor, NULL, 0, &m);
    CHECK(st == KILN_OK && m, "empty: %s", kiln_last_error());
    if (m) protobuf_c_message_free_unpacked(m, NULL);
    st = kiln_textproto_parse(&kiln_onnx__model_proto__descriptor, " # only a comment", 17, &m);
    CHECK(st == KILN_OK && m, "comment only: %s", kiln_last_error());
    if (m) protobuf_c_message_free_unpacked(m, NULL);
}

/* Enums and bools, with the SavedModel schema (kiln_sm). */
static void test_enum_bool(void)
{
    kiln_status st;
    KilnSm__TensorProto *t = (KilnSm__TensorProto *)parse(
        &kiln_sm__tensor_proto__descriptor,
        "dtype: DT_STRING tensor_shape { unknown_rank: t } ", &st);
    CHECK(st == KILN_OK && t && t->dtype == KILN_SM__DATA_TYPE__DT_STRING && t->tensor_shape &&
              t->tensor_shape->unknown_rank,
          "enum by name, bool 't': %s", kiln_last_error());
    if (t) protobuf_c_message_free_unpacked(&t->base, NULL);
    t = (KilnSm__TensorProto *)parse(&kiln_sm__tensor_proto__descriptor,
                                     "dtype: 19 tensor_shape { unknown_rank: False }", &st);
    CHECK(st == KILN_OK && t && t->dtype == KILN_SM__DATA_TYPE__DT_HALF && t->tensor_shape &&
              !t->tensor_shape->unknown_rank,
          "enum by number, bool 'False': %s", kiln_last_error());
    if (t) protobuf_c_message_free_unpacked(&t->base, NULL);
    t = (KilnSm__TensorProto *)parse(&kiln_sm__tensor_proto__descriptor, "dtype: DT_FLOAT32", &st);
    CHECK(st == KILN_ERR_INVALID_MODEL && !t && strstr(kiln_last_error(), "unknown value 'DT_FLOAT32'"),
          "unknown enum name: %s", kiln_last_error());
    t = (KilnSm__TensorProto *)parse(&kiln_sm__tensor_proto__descriptor,
                                     "tensor_shape { unknown_rank: yes }", &st);
    CHECK(st == KILN_ERR_INVALID_MODEL && !t && strstr(kiln_last_error(), "expected true or false"),
          "bad bool: %s", kiln_last_error());
}

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(len > 0 ? (size_t)len : 1);
    *n = buf ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    return buf;
}

/* The text-format SavedModel in the shared test data. */
static void test_saved_model_pbtxt(void)
{
    const char *root = getenv("KILN_TESTDATA");
    char path[1024];
    snprintf(path, sizeof path,
             "%s/savedmodels/tensorflow/tensorflow/cc/saved_model/testdata/half_plus_two_pbtxt/"
             "00000123/saved_model.pbtxt",
             root ? root : KILN_SOURCE_DIR "/../shared/testdata");
    size_t n;
    char *text = read_file(path, &n);
    if (!text) {
        CHECK_SKIP("%s not found (set KILN_TESTDATA to the shared test data folder)", path);
        return;
    }
    ProtobufCMessage *m = NULL;
    kiln_status st = kiln_textproto_parse(&kiln_sm__saved_model__descriptor, text, n, &m);
    CHECK(st == KILN_OK && m, "half_plus_two_pbtxt: %s", kiln_last_error());
    if (m) {
        KilnSm__SavedModel *sm = (KilnSm__SavedModel *)m;
        CHECK(sm->n_meta_graphs == 1 && sm->meta_graphs[0]->graph_def &&
                  sm->meta_graphs[0]->graph_def->n_node > 10,
              "meta graph");
        protobuf_c_message_free_unpacked(m, NULL);
    }
    free(text);
}

int main(void)
{
    test_model();
    test_large_nested();
    test_depth();
    test_errors();
    test_enum_bool();
    test_saved_model_pbtxt();
    return CHECK_DONE();
}
