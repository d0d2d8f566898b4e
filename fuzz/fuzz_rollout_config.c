/*
 * fuzz_rollout_config.c - libFuzzer target for `kiln serve`'s rollout file
 * (src/serve/rollout/config.c): protobuf text format read through
 * src/import/textproto.c, then every field checked.
 *
 * The loader takes a path, so each input is written to an anonymous
 * in-memory file (memfd, opened again through /proc/self/fd). A load must
 * succeed or fill the error buffer; a loaded config must keep the promises
 * the controller relies on (names present and distinct, split weights
 * finite and non-negative with a positive sum, canary steps increasing and
 * ending at 100, shadow fractions in [0, 1]). Anything else aborts.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "serve/rollout/rollout.h"

static int fuzz_fd = -1;
static char fuzz_path[64];

static void fuzz_file_set(const uint8_t *data, size_t size)
{
    if (fuzz_fd < 0) {
        fuzz_fd = memfd_create("kiln-fuzz-rollout", MFD_CLOEXEC);
        if (fuzz_fd < 0) {
            perror("fuzz_rollout_config: memfd_create");
            abort();
        }
        snprintf(fuzz_path, sizeof fuzz_path, "/proc/self/fd/%d", fuzz_fd);
    }
    if (ftruncate(fuzz_fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fuzz_fd, data + done, size - done, (off_t)done);
        if (n <= 0) abort();
        done += (size_t)n;
    }
}

static int promises(const KilnRollout__RolloutConfig *c)
{
    if (c->n_model_rollouts > KILN_ROLLOUT_MAX_MODELS) return 0;
    for (size_t i = 0; i < c->n_model_rollouts; i++) {
        const KilnRollout__ModelRollout *m = c->model_rollouts[i];
        if (!m->model_name || !m->model_name[0] || strlen(m->model_name) >= 128) return 0;
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->model_rollouts[j]->model_name, m->model_name) == 0) return 0;
        if (m->n_split && m->canary) return 0;
        if (m->n_split > KILN_ROLLOUT_MAX_TARGETS) return 0;
        double sum = 0;
        for (size_t k = 0; k < m->n_split; k++) {
            if (!(m->split[k]->weight >= 0) || !isfinite(m->split[k]->weight)) return 0;
            sum += m->split[k]->weight;
        }
        if (m->n_split && !(sum > 0)) return 0;
        if (m->canary) {
            const KilnRollout__Canary *k = m->canary;
            if ((k->candidate_version != 0) == (k->candidate_label && k->candidate_label[0])) return 0;
            if (k->n_steps == 1 || k->n_steps > 16) return 0;
            for (size_t s = 0; s < k->n_steps; s++)
                if (!(k->steps[s] > 0 && k->steps[s] <= 100) || (s && !(k->steps[s] > k->steps[s - 1])))
                    return 0;
            if (k->n_steps && k->steps[k->n_steps - 1] != 100) return 0;
        }
        if (m->shadow && !(m->shadow->fraction >= 0 && m->shadow->fraction <= 1)) return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_file_set(data, size);
    KilnRollout__RolloutConfig *cfg = NULL;
    char err[KILN_ROLLOUT_ERR_LEN];
    err[0] = '\0';
    if (kiln_rollout_config_load(fuzz_path, &cfg, err) == KILN_OK) {
        if (!promises(cfg)) {
            fprintf(stderr, "fuzz_rollout_config: a loaded rollout file breaks the loader's promises\n");
            abort();
        }
        kiln_rollout__rollout_config__free_unpacked(cfg, NULL);
    } else if (!err[0]) {
        fprintf(stderr, "fuzz_rollout_config: a load failed without a message\n");
        abort();
    }
    return 0;
}
