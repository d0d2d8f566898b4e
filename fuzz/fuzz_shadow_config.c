/*
 * fuzz_shadow_config.c - libFuzzer target for the rollout file's shadow
 * blocks (src/serve/shadow/shadow.c): any bytes are parsed as a rollout
 * file (KilnRollout__RolloutConfig, protobuf text format) and, when they
 * parse, applied with kiln_shadow_apply twice (a start and a reload of the
 * same file), then written as the JSON view and Prometheus lines. An apply
 * must succeed or fill its error message; after a successful one the JSON
 * view lists exactly the models with a shadow block. Never a crash, a hang
 * or a leak.
 *
 * Built two ways: with clang and -fsanitize=fuzzer as fuzz/fuzz_shadow_config
 * (cmake -DKILN_FUZZ=ON), and with fuzz/replay_main.c as the plain
 * kiln_fuzz_replay_shadow_config that the test suite runs over
 * tests/corpus/shadow_config.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "import/textproto.h"
#include "serve/shadow/shadow.h"

/* Occurrences of needle in s. */
static size_t count(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p++) n++;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ProtobufCMessage *m = NULL;
    if (kiln_textproto_parse(&kiln_rollout__rollout_config__descriptor, (const char *)data, size,
                             &m) != KILN_OK)
        return 0;
    const KilnRollout__RolloutConfig *cfg = (const KilnRollout__RolloutConfig *)m;
    kiln_shadow *sh = NULL;
    if (kiln_shadow_create(NULL, &sh) != KILN_OK) abort();
    for (int pass = 0; pass < 2; pass++) {
        char err[KILN_SHADOW_ERR_LEN] = "";
        kiln_status st = kiln_shadow_apply(sh, cfg, err);
        if (st != KILN_OK && !err[0]) abort();
        kiln_sbuf b = {0};
        if (kiln_shadow_write_json(sh, NULL, &b, err) != KILN_OK) abort();
        kiln_sbuf_put(&b, "", 1);
        if (st == KILN_OK && !b.oom) {
            size_t blocks = 0;
            for (size_t i = 0; i < cfg->n_model_rollouts; i++)
                blocks += cfg->model_rollouts[i]->shadow != NULL;
            if (count(b.p, "{\"model_name\": ") != blocks) abort();
        }
        kiln_sbuf_free(&b);
        kiln_observer o = kiln_shadow_observer(sh);
        kiln_sbuf mb = {0};
        o.write_metrics(o.ctx, &mb);
        kiln_sbuf_free(&mb);
    }
    kiln_shadow_free(sh);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
