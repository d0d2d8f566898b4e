/*
 * fuzz_serve_config.c - libFuzzer target for `kiln serve`'s config files
 * (src/serve/config.c): --model_config_file (ModelServerConfig) and
 * --batching_parameters_file (BatchingParameters), both protobuf text
 * format read through src/import/textproto.c and then checked.
 *
 * The loaders take a path, so each input is written to an anonymous
 * in-memory file (memfd, opened again through /proc/self/fd) and given to
 * both loaders, with the same bytes. A load must succeed or fill the error
 * buffer; a loaded server config must hold at least one model, each with a
 * non-empty name and base_path, a valid version policy and distinct names;
 * loaded batching parameters must be within the ranges config.c promises.
 * Anything else aborts.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "serve/config.h"

static int fuzz_fd = -1;
static char fuzz_path[64];

/* Make the in-memory file once; the fd lives for the whole process. */
static int fuzz_file_init(void)
{
    if (fuzz_fd >= 0) return 0;
    fuzz_fd = memfd_create("kiln-fuzz-config", MFD_CLOEXEC);
    if (fuzz_fd < 0) {
        perror("fuzz_serve_config: memfd_create");
        abort();
    }
    snprintf(fuzz_path, sizeof fuzz_path, "/proc/self/fd/%d", fuzz_fd);
    return 0;
}

/* Replace the file's contents with data. */
static void fuzz_file_set(const uint8_t *data, size_t size)
{
    if (ftruncate(fuzz_fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fuzz_fd, data + done, size - done, (off_t)done);
        if (n <= 0) abort();
        done += (size_t)n;
    }
}

static void check_error(const char *err)
{
    if (!err[0]) {
        fprintf(stderr, "fuzz_serve_config: a load failed without a message\n");
        abort();
    }
}

static void check_server_config(const kiln_server_config *c)
{
    int ok = c && c->n_models >= 1 && c->models;
    for (int i = 0; ok && i < c->n_models; i++) {
        const kiln_model_config *m = &c->models[i];
        ok = m->name && *m->name && m->base_path && *m->base_path && m->platform;
        if (ok && m->policy == KILN_POLICY_LATEST) ok = m->num_versions >= 1;
        else if (ok && m->policy == KILN_POLICY_SPECIFIC)
            ok = m->n_specific >= 1 && m->specific;
        else if (ok) ok = m->policy == KILN_POLICY_ALL;
        for (int k = 0; ok && k < m->n_specific; k++) ok = m->specific[k] >= 0;
        for (int k = 0; ok && k < m->n_labels; k++)
            ok = m->label_names[k] && *m->label_names[k] && !strpbrk(m->label_names[k], "/:");
        for (int k = 0; ok && k < i; k++) ok = strcmp(c->models[k].name, m->name) != 0;
    }
    if (!ok) {
        fprintf(stderr, "fuzz_serve_config: a loaded server config breaks config.h's promises\n");
        abort();
    }
}

static void check_batching(const kiln_batching_params *p)
{
    int ok = p->max_batch_size >= 1 && p->max_batch_size <= 1000000 &&
             p->batch_timeout_micros >= 0 && p->max_enqueued_batches >= 1 &&
             p->num_batch_threads >= 1 && p->num_batch_threads <= 1024 && p->n_allowed >= 0 &&
             p->n_allowed <= 64;
    for (int i = 0; ok && i < p->n_allowed; i++)
        ok = p->allowed_batch_sizes[i] >= 1 &&
             (i == 0 || p->allowed_batch_sizes[i] > p->allowed_batch_sizes[i - 1]);
    if (ok && p->n_allowed) ok = p->allowed_batch_sizes[p->n_allowed - 1] == p->max_batch_size;
    if (!ok) {
        fprintf(stderr, "fuzz_serve_config: loaded batching parameters are out of range\n");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_file_init();
    fuzz_file_set(data, size);

    char err[KILN_CONFIG_ERR_LEN];
    err[0] = '\0';
    kiln_server_config *c = NULL;
    if (kiln_server_config_load(fuzz_path, &c, err) == KILN_OK) {
        check_server_config(c);
        kiln_server_config_free(c);
    } else {
        if (c) abort(); /* *out is NULL on failure */
        check_error(err);
    }

    err[0] = '\0';
    kiln_batching_params p;
    if (kiln_batching_params_load(fuzz_path, &p, err) == KILN_OK)
        check_batching(&p);
    else
        check_error(err);
    return 0;
}
