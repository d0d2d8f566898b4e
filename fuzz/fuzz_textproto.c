/*
 * fuzz_textproto.c - libFuzzer target for the protobuf text format parser.
 *
 * TF-Serving config files and text-format SavedModels (saved_model.pbtxt)
 * are parsed by kiln_textproto_parse, so any byte string must end in a
 * message or a status with a message: never a crash, a hang, unbounded
 * memory or a leak. Each input is parsed as an ONNX ModelProto (nested
 * messages, oneofs, packed and bytes fields) and as a TensorFlow SavedModel
 * (enums, map entries, deep nesting). A parsed message is packed back to
 * binary, which walks every field protobuf-c filled in.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_textproto
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_textproto that the test suite runs over
 * tests/corpus/textproto.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "import/textproto.h"
#include "onnx.pb-c.h"
#include "saved_model.pb-c.h"

/* Parse as desc; on success pack the message again and free it. */
static void fuzz_parse(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t size)
{
    ProtobufCMessage *m = NULL;
    if (kiln_textproto_parse(desc, (const char *)data, size, &m) != KILN_OK) {
        /* A failure must come with a message; reading it checks it is a string. */
        const char *msg = kiln_last_error();
        if (msg) (void)*(volatile const char *)msg;
        return;
    }
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf) {
        protobuf_c_message_pack(m, buf);
        free(buf);
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_parse(&kiln_onnx__model_proto__descriptor, data, size);
    fuzz_parse(&kiln_sm__saved_model__descriptor, data, size);
    return 0;
}
