/*
 * tune.c - timing a node's candidate kernels at compile time (tune.h).
 */
#include "kernels/tune.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir/graph.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A tensor of type t stored in `layout` (a blocked 4-D value has its channels padded). */
static kiln_status new_stored(const struct kiln_type *t, int layout, kiln_tensor **out)
{
    int64_t d[KILN_MAX_RANK];
    for (int i = 0; i < t->rank; i++) d[i] = t->dims[i];
    if (layout > 0 && t->rank == 4) d[1] = kiln_layout_channels(d[1], layout);
    return kiln_tensor_new(t->dtype, t->rank, d, out);
}

kiln_status kiln_kernel_time(const struct kiln_compile_ctx *cc, struct kiln_kernel_inst *const *insts,
                             int n, int rounds, double *best_s)
{
    enum { MAX_IN = 8 };
    kiln_status st = KILN_OK;
    kiln_tensor *t[MAX_IN] = {NULL}, *y = NULL;
    kiln_tensor *in[MAX_IN] = {NULL};
    int n_in = cc->n_in < MAX_IN ? cc->n_in : MAX_IN;
    if (n < 1 || n > KILN_TUNE_MAX || cc->n_out < 1 || !cc->out[0])
        return kiln_node_error(cc->node, KILN_ERR_INTERNAL, "cannot time %d kernels", n);
    size_t scratch_bytes = 64;
    for (int k = 0; k < n; k++)
        if (insts[k]->scratch_bytes > scratch_bytes) scratch_bytes = insts[k]->scratch_bytes;
    void *scratch = aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
    if (!scratch) return kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory timing");
    int threads = cc->threads > 1 ? cc->threads : 1;
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_in && st == KILN_OK; i++) {
        if (!cc->in[i]) continue;
        if (cc->in_value && cc->in_value[i]) {
            in[i] = (kiln_tensor *)cc->in_value[i];
            continue;
        }
        st = new_stored(cc->in[i], cc->in_layout ? cc->in_layout[i] : 0, &t[i]);
        if (st != KILN_OK) break;
        if (t[i]->dtype == KILN_DTYPE_F32) {
            float *d = t[i]->data;
            for (int64_t k = 0; k < kiln_tensor_count(t[i]); k++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                d[k] = (float)(r >> 40) * (1.0f / 8388608.0f) - 1.0f;
            }
        }
        in[i] = t[i];
    }
    if (st == KILN_OK) st = new_stored(cc->out[0], cc->out_layout ? cc->out_layout[0] : 0, &y);
    /* Constants of 4 MiB or more (a wide layer's weights): in a model each run finds them
     * evicted by the layers before it, so each timed run here starts with the caches
     * flushed too (4x their size written, 16 MiB to KILN_TUNE_FLUSH_BYTES; two timed
     * rounds), or a format that makes them larger (Winograd's) would be timed reading
     * them from cache. */
    size_t const_bytes = 0;
    for (int i = 0; i < n_in; i++)
        if (cc->in_value && cc->in_value[i]) const_bytes += cc->in_value[i]->nbytes;
    char *flush = NULL;
    size_t flush_bytes = const_bytes * 4;
    if (flush_bytes < ((size_t)16 << 20)) flush_bytes = (size_t)16 << 20;
    if (flush_bytes > KILN_TUNE_FLUSH_BYTES) flush_bytes = KILN_TUNE_FLUSH_BYTES;
    if (st == KILN_OK && const_bytes >= ((size_t)4 << 20)) {
        flush = malloc(flush_bytes);
        if (!flush) st = kiln_node_error(cc->node, KILN_ERR_OUT_OF_MEMORY, "out of memory timing");
        if (rounds > 2) rounds = 2; /* each flush costs a few ms */
    }
    for (int k = 0; k < n; k++) best_s[k] = 1e30;
    for (int it = 0; it <= rounds && st == KILN_OK; it++) {
        for (int k = 0; k < n && st == KILN_OK; k++) {
            struct kiln_kernel_inst *x = insts[k];
            kiln_tensor *outs[1] = {y};
            struct kiln_run_ctx rc = {cc->node, n_in, in, 1, outs, NULL, scratch, cc->threads};
            if (flush && it > 0) memset(flush, it + k, flush_bytes);
            double t0 = now_s(), c0 = cpu_s();
            st = x->run(x->state, &rc);
            double dt = now_s() - t0, dc = (cpu_s() - c0) / threads;
            if (dc > 0 && dc < dt) dt = dc; /* descheduled by other processes: their time */
            if (it > 0 && dt < best_s[k]) best_s[k] = dt;
            if (it == 0 && k == 0 && dt > 0.02 && rounds > 1) rounds = 1; /* a slow node: bound */
        }
    }
    for (int i = 0; i < MAX_IN; i++) kiln_tensor_free(t[i]);
    kiln_tensor_free(y);
    free(scratch);
    free(flush);
    return st;
}

static kiln_status choice_pack(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    (void)arg;
    int *c = malloc(sizeof *c);
    if (!c) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    *c = -1;
    *packed = c;
    *bytes = 0;
    *free_fn = free;
    return KILN_OK;
}

kiln_status kiln_kernel_choice_slot(const struct kiln_compile_ctx *cc, const kiln_tensor *w,
                                    const char *tag, int **slot)
{
    void *p = NULL;
    kiln_status st = kiln_weight_cache_get(cc->weights, w, tag, choice_pack, NULL, &p);
    *slot = st == KILN_OK ? p : NULL;
    return st;
}
