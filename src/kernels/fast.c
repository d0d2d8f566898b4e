/*
 * fast.c - the fast-kernel table (weak references, as in registry.c) and
 * the per-model weight cache. An op whose kernels are declared in a family
 * list (family.h) takes its entry from families.c instead.
 */
#include "kernels/fast.h"

#include "core/fileio.h"
#include "kernels/family.h"

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
    const struct kiln_fast_op *f = kiln_kernel_fast_op(op); /* a family's (families.c) */
    if (f) return f;
    f = fast_table[op];
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

/* A reloadable weight; released while t->data is NULL. */
struct wc_reload {
    kiln_tensor *t;
    const void *src;  /* the bytes t was copied from (alive as long as the model) */
    int pinned;       /* never released again */
};

struct kiln_weight_cache {
    pthread_mutex_t mu;         /* entries and reloadable state */
    pthread_mutex_t compile_mu; /* one plan compile at a time */
    struct wc_entry *head;
    size_t bytes;
    struct { uintptr_t lo, hi; } *maps;
    int n_maps;
    struct wc_reload *reload;   /* sorted by tensor address once lookups start */
    int n_reload, cap_reload;
    int reload_sorted;
    int all_pinned;
    size_t released_bytes;
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
        kiln_file_release_range(t->data, t->nbytes);
        return;
    }
}

/* ---- reloadable weights ---- */

kiln_status kiln_weight_cache_add_reloadable(struct kiln_weight_cache *wc, kiln_tensor *t,
                                             const void *src)
{
    if (wc->n_reload == wc->cap_reload) {
        int cap = wc->cap_reload ? wc->cap_reload * 2 : 64;
        struct wc_reload *r = realloc(wc->reload, sizeof *r * (size_t)cap);
        if (!r) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        wc->reload = r;
        wc->cap_reload = cap;
    }
    wc->reload[wc->n_reload++] = (struct wc_reload){t, src, 0};
    wc->reload_sorted = 0;
    wc->all_pinned = 0;
    return KILN_OK;
}

static int reload_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct wc_reload *)a)->t;
    uintptr_t y = (uintptr_t)((const struct wc_reload *)b)->t;
    return x < y ? -1 : x > y;
}

/* The entry of t, or NULL (wc->mu held). */
static struct wc_reload *reload_find(struct kiln_weight_cache *wc, const kiln_tensor *t)
{
    if (!wc->n_reload || !t) return NULL;
    if (!wc->reload_sorted) {
        qsort(wc->reload, (size_t)wc->n_reload, sizeof *wc->reload, reload_cmp);
        wc->reload_sorted = 1;
    }
    size_t lo = 0, hi = (size_t)wc->n_reload;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uintptr_t m = (uintptr_t)wc->reload[mid].t;
        if (m == (uintptr_t)t) return &wc->reload[mid];
        if (m < (uintptr_t)t) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Copy a released weight back in (wc->mu held). */
static kiln_status reload_materialize(struct kiln_weight_cache *wc, struct wc_reload *r)
{
    kiln_tensor *t = r->t;
    if (t->data) return KILN_OK;
    void *d = aligned_alloc(64, (t->nbytes + 63) / 64 * 64 + 64);
    if (!d)
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory reloading a %zu-byte weight",
                          t->nbytes);
    memcpy(d, r->src, t->nbytes);
    t->data = d;
    wc->released_bytes -= t->nbytes;
    return KILN_OK;
}

kiln_status kiln_weight_cache_acquire(struct kiln_weight_cache *wc, const kiln_tensor *t, int pin)
{
    if (!wc || !wc->n_reload) return KILN_OK;
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&wc->mu);
    struct wc_reload *r = reload_find(wc, t);
    if (r) {
        st = reload_materialize(wc, r);
        if (st == KILN_OK && pin) r->pinned = 1;
    }
    pthread_mutex_unlock(&wc->mu);
    return st;
}

kiln_status kiln_weight_cache_pin_all(struct kiln_weight_cache *wc)
{
    if (!wc || !wc->n_reload) return KILN_OK;
    kiln_status st = KILN_OK;
    pthread_mutex_lock(&wc->mu);
    for (int i = 0; i < wc->n_reload && st == KILN_OK && !wc->all_pinned; i++) {
        st = reload_materialize(wc, &wc->reload[i]);
        if (st == KILN_OK) wc->reload[i].pinned = 1;
    }
    if (st == KILN_OK) wc->all_pinned = 1;
    pthread_mutex_unlock(&wc->mu);
    return st;
}

void kiln_weight_cache_release(struct kiln_weight_cache *wc, const kiln_tensor *t)
{
    if (!wc || !wc->n_reload) return;
    pthread_mutex_lock(&wc->mu);
    struct wc_reload *r = reload_find(wc, t);
    if (r && !r->pinned && r->t->data) {
        free(r->t->data);
        r->t->data = NULL;
        wc->released_bytes += r->t->nbytes;
    }
    pthread_mutex_unlock(&wc->mu);
}

void kiln_weight_cache_compile_lock(struct kiln_weight_cache *wc)
{
    if (wc) pthread_mutex_lock(&wc->compile_mu);
}

void kiln_weight_cache_compile_unlock(struct kiln_weight_cache *wc)
{
    if (wc) pthread_mutex_unlock(&wc->compile_mu);
}

size_t kiln_weight_cache_released_bytes(struct kiln_weight_cache *wc)
{
    if (!wc) return 0;
    pthread_mutex_lock(&wc->mu);
    size_t b = wc->released_bytes;
    pthread_mutex_unlock(&wc->mu);
    return b;
}

/* ---- the cache ---- */

kiln_status kiln_weight_cache_new(struct kiln_weight_cache **out)
{
    struct kiln_weight_cache *wc = calloc(1, sizeof *wc);
    if (!wc) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory creating a weight cache");
    pthread_mutex_init(&wc->mu, NULL);
    pthread_mutex_init(&wc->compile_mu, NULL);
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
    pthread_mutex_destroy(&wc->compile_mu);
    free(wc->maps);
    free(wc->reload);
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
    struct wc_reload *r = reload_find(wc, (const kiln_tensor *)key); /* a released weight: copied back to pack */
    if (r && (st = reload_materialize(wc, r)) != KILN_OK) {
        free(e);
        free(t);
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

void kiln_weight_cache_each(struct kiln_weight_cache *wc,
                            void (*fn)(void *ctx, const void *key, const char *tag,
                                       const void *packed, size_t bytes),
                            void *ctx)
{
    pthread_mutex_lock(&wc->mu);
    for (struct wc_entry *e = wc->head; e; e = e->next)
        if (e->packed) fn(ctx, e->key, e->tag, e->packed, e->bytes);
    pthread_mutex_unlock(&wc->mu);
}

kiln_status kiln_weight_cache_preload(struct kiln_weight_cache *wc, const void *key,
                                      const char *tag, const void *packed, size_t bytes)
{
    struct wc_entry *e = calloc(1, sizeof *e);
    char *t = strdup(tag);
    if (!e || !t) {
        free(e);
        free(t);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    e->key = key;
    e->tag = t;
    e->packed = (void *)packed;
    e->bytes = bytes;
    pthread_mutex_lock(&wc->mu);
    e->next = wc->head;
    wc->head = e;
    wc->bytes += bytes;
    pthread_mutex_unlock(&wc->mu);
    return KILN_OK;
}

size_t kiln_weight_cache_entry_bytes(struct kiln_weight_cache *wc, const void *key, const char *tag)
{
    size_t n = 0;
    pthread_mutex_lock(&wc->mu);
    for (struct wc_entry *e = wc->head; e && !n; e = e->next)
        if (e->key == key && strcmp(e->tag, tag) == 0) n = e->bytes;
    pthread_mutex_unlock(&wc->mu);
    return n;
}

size_t kiln_weight_cache_bytes(const struct kiln_weight_cache *wc)
{
    return wc ? wc->bytes : 0;
}
