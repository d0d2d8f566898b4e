/*
 * fuzz_tensor_proto.c - libFuzzer target for the gRPC request decoders of
 * `kiln serve` (src/serve/grpc/): the first byte picks a message, the rest
 * are its bytes, decoded as the handlers decode them (kiln_pb_check, then
 * protobuf-c):
 *
 *   0  PredictRequest: every input's TensorProto -> tensor (TF's rules:
 *      tensor_content or typed fields, half_val, strings, the last value
 *      repeating), then each tensor encoded back as a response TensorProto
 *      both ways (typed fields and tensor_content) and packed;
 *   1  ClassificationRequest / RegressionRequest: Input -> examples tensor;
 *   2  MultiInferenceRequest: the same for its Input;
 *   3  ReloadConfigRequest: ModelServerConfig -> Kiln's config (the checks);
 *   4  GetModelMetadataRequest, GetModelStatusRequest, HealthCheckRequest;
 *   5  ServerReflectionRequest -> a reflection answer.
 *
 * A decoded tensor must have as many elements as its shape says and a
 * known dtype; anything else aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "import/pbcheck.h"
#include "import/tf_import.h"
#include "serve/config.h"
#include "serve/grpc/call.h"
#include "serve/grpc/grpc_tensor.h"
#include "serve/warmup.h"

#include "grpc_service.pb-c.h"
#include "prediction_log.pb-c.h"

static ProtobufCMessage *decode(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n)
{
    if (kiln_pb_check(d, p, n, 64, d->name) != KILN_OK) return NULL;
    return protobuf_c_message_unpack(d, NULL, n, p);
}

static void predict(const uint8_t *p, size_t n)
{
    KilnTfs__PredictRequest *r =
        (KilnTfs__PredictRequest *)decode(&kiln_tfs__predict_request__descriptor, p, n);
    if (!r) return;
    kiln_grpc_tensor_set typed, content;
    kiln_grpc_tensor_set_init(&typed);
    kiln_grpc_tensor_set_init(&content);
    kiln_tensor **t = calloc(r->n_inputs + 1, sizeof *t);
    for (size_t i = 0; t && i < r->n_inputs; i++) {
        if (!r->inputs[i]->value) continue;
        if (kiln_tf_tensor_from_proto(r->inputs[i]->value, "fuzz", &t[i]) != KILN_OK) continue;
        if (kiln_tensor_count(t[i]) < 0 || t[i]->dtype <= KILN_DTYPE_UNDEFINED ||
            t[i]->dtype >= KILN_DTYPE_COUNT)
            abort();
        kiln_grpc_tensor_set_add(&typed, "t", t[i], 0);
        kiln_grpc_tensor_set_add(&content, "t", t[i], 1);
    }
    for (int k = 0; k < 2; k++) {
        kiln_grpc_tensor_set *s = k ? &content : &typed;
        KilnGrpc__PredictResponse resp = KILN_GRPC__PREDICT_RESPONSE__INIT;
        resp.n_outputs = (size_t)s->n;
        resp.outputs = s->entries;
        size_t len = protobuf_c_message_get_packed_size(&resp.base);
        uint8_t *buf = malloc(len + 1);
        if (buf && protobuf_c_message_pack(&resp.base, buf) != len) abort();
        free(buf);
    }
    kiln_grpc_tensor_set_free(&typed);
    kiln_grpc_tensor_set_free(&content);
    for (size_t i = 0; t && i < r->n_inputs; i++) kiln_tensor_free(t[i]);
    free(t);
    protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void examples(const KilnTfs__Input *in)
{
    kiln_tensor *t = NULL;
    if (kiln_warmup_examples(in, &t) == KILN_OK && (!t || t->dtype != KILN_DTYPE_STRING || t->rank != 1))
        abort();
    kiln_tensor_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    ProtobufCMessage *m = NULL;
    switch (data[0] % 6) {
    case 0:
        predict(p, n);
        break;
    case 1:
        m = decode(&kiln_tfs__classification_request__descriptor, p, n);
        if (m) examples(((KilnTfs__ClassificationRequest *)m)->input);
        break;
    case 2:
        m = decode(&kiln_grpc__multi_inference_request__descriptor, p, n);
        if (m) examples(((KilnGrpc__MultiInferenceRequest *)m)->input);
        break;
    case 3: {
        m = decode(&kiln_grpc__reload_config_request__descriptor, p, n);
        KilnGrpc__ReloadConfigRequest *r = (KilnGrpc__ReloadConfigRequest *)m;
        if (r && r->config) {
            kiln_server_config *c = NULL;
            char err[KILN_CONFIG_ERR_LEN];
            if (kiln_server_config_from_proto(r->config, "fuzz", &c, err) == KILN_OK && !c) abort();
            kiln_server_config_free(c);
        }
        break;
    }
    case 4: {
        const ProtobufCMessageDescriptor *d[3] = {&kiln_grpc__get_model_metadata_request__descriptor,
                                                  &kiln_grpc__get_model_status_request__descriptor,
                                                  &kiln_grpc__health_check_request__descriptor};
        for (int i = 0; i < 3; i++) {
            ProtobufCMessage *x = decode(d[i], p, n);
            if (x) protobuf_c_message_free_unpacked(x, NULL);
        }
        char service[64];
        kiln_grpc_health_decode(p, n, service, sizeof service);
        break;
    }
    default: {
        kiln_bytes out = {0};
        kiln_grpc_reflect(p, n, &out);
        kiln_bytes_free(&out);
        break;
    }
    }
    if (m) protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
