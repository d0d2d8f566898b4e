/*
 * fast.c - the fast-kernel table (weak references, as in registry.c) and
 * the per-model weight cache.
 */
#include "kernels/fast.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KILN_OP(name, mi, ma, mo, mao, fl) \
    extern const struct kiln_fast_op kiln_fast_##name __attribute__((weak));
#include "ir/ops.def"
#undef KILN_OP

static const struct kiln_fast_op *const fast_table[] = {
#define KILN_OP(name, mi, ma, mo, mao, fl) &kiln_fast_##name,
#include "ir/ops.def"
#undef KILN_OP
};

_Static_assert(sizeof fast_table / sizeof fast_table[0] == KILN_OP_COUNT,
               "fast_table must have one entry per op");

static int fast_disabled(void)
{
    static int cached = -1;
    if (cached < 0) {
        const char *e = getenv("KILN_FAST");
        cached = e && strcmp(e, "0") == 0;
    }
    return cached;
}

const struct kiln_fast_op *kiln_fast_op(enum kiln_op op)
{
    if ((unsigned)op >= KILN_OP_COUNT || fast_disabled()) return NULL;
    const struct kiln_fast_op *f = fast_table[op];
    return f && f->compile ? f : NULL;
}

int kiln_fast_accepts_blocked(const struct kiln_node *n, int i, int block)
{
    const struct kiln_fast_op *f = kiln_fast_op(n->op);
    return f && f->accepts_blocked ? f->accepts_blocked(n, i, block) : 0;
}

void kiln_kernel_inst_destroy(struct kiln_kernel_inst *inst)
{
    if (inst->destroy && inst->state) inst->destroy(inst->state);
    memset(inst, 0, sizeof *inst);
}

struct wc_entry {
    const void *key;
    char *tag;
    void *packed;
    size_t bytes;
    void (*free_fn)(void *);
    struct wc_entry *next;
};

struct kiln_weight_cache {
    pthread_mutex_t mu;
    struct wc_entry *head;
    size_t bytes;
    struct { uintptr_t lo, hi; } *maps;
    int n_maps;
};

kiln_status kiln_weight_cache_add_mapping(struct kiln_weight_cache *wc, const void *data,
                                          size_t size)
{
    void *m = realloc(wc->maps, sizeof *wc->maps * (size_t)(wc->n_maps + 1));
    if (!m) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    wc->maps = m;
    wc->maps[wc->n_maps].lo = (uintptr_t)data;
    wc->maps[wc->n_maps].hi = (uintptr_t)data + size;
    wc->n_maps++;
    return KILN_OK;
}

/* Give back the whole pages of a packed weight that lies in a file mapping. */
static void release_source_pages(const struct kiln_weight_cache *wc, const void *key)
{
    const kiln_tensor *t = key;
    if (!t || !t->data || t->nbytes == 0) return;
    uintptr_t lo = (uintptr_t)t->data, hi = lo + t->nbytes;
    for (int i = 0; i < wc->n_maps; i++) {
        if (lo < wc->maps[i].lo || hi > wc->maps[i].hi) continue;
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t a = (lo + page - 1) & ~(page - 1), b = hi & ~(page - 1);
        if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
        return;
    }
}

kiln_status kiln_weight_cache_new(struct kiln_weight_cache **out)
{
    struct kiln_weight_cache *wc = calloc(1, sizeof *wc);
    if (!wc) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory creating a weight cache");
    pthread_mutex_init(&wc->mu, NULL);
    *out = wc;
    return KILN_OK;
}

void kiln_weight_cache_free(struct kiln_weight_cache *wc)
{
    if (!wc) return;
    for (struct wc_entry *e = wc->head, *next; e; e = next) {
        next = e->next;
        if (e->free_fn) e->free_fn(e->packed);
        free(e->tag);
        free(e);
    }
    pthread_mutex_destroy(&wc->mu);
    free(wc->maps);
    free(wc);
}

kiln_status kiln_weight_cache_get(struct kiln_weight_cache *wc, const void *key, const char *tag,
                                  kiln_pack_fn pack, void *arg, void **out)
{
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&wc->mu);
    for (struct wc_entry *e = wc->head; e; e = e->next)
        if (e->key == key && strcmp(e->tag, tag) == 0) {
            *out = e->packed;
            goto done;
        }
    struct wc_entry *e = calloc(1, sizeof *e);
    char *t = strdup(tag);
    if (!e || !t) {
        free(e);
        free(t);
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory packing weights (%s)", tag);
        goto done;
    }
    st = pack(arg, &e->packed, &e->bytes, &e->free_fn);
    if (st != KILN_OK) {
        free(e);
        free(t);
        goto done;
    }
    release_source_pages(wc, key);
    e->key = key;
    e->tag = t;
    e->next = wc->head;
    wc->head = e;
    wc->bytes += e->bytes;
    *out = e->packed;
done:
    pthread_mutex_unlock(&wc->mu);
    return st;
}

size_t kiln_weight_cache_bytes(const struct kiln_weight_cache *wc)
{
    return wc ? wc->bytes : 0;
}
