/*
 * containers.c - flattening sequence and optional outputs into tensors for
 * the serving APIs (containers.h). Used by the unbatched run path in
 * manager.c; a signature with such an output is never batched (the items of a
 * sequence have no batch dimension to split on).
 */
#include "serve/containers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 1024
#define MAX_NESTING 4

static int is_container(kiln_dtype dt)
{
    return dt == KILN_DTYPE_SEQUENCE || dt == KILN_DTYPE_OPTIONAL;
}

int kiln_serve_container_output(const kiln_signature *sig)
{
    int n = kiln_signature_output_count(sig);
    for (int i = 0; i < n; i++)
        if (is_container(kiln_signature_output(sig, i)->dtype)) return i;
    return -1;
}

/* Tensors a value flattens into. */
static int64_t count_leaves(const kiln_tensor *t)
{
    if (!is_container(t->dtype)) return 1;
    int64_t n = 0;
    for (int64_t i = 0; i < t->dims[0]; i++) {
        const kiln_tensor *item = kiln_tensor_item(t, i);
        if (item) n += count_leaves(item);
    }
    return n;
}

/* Append t (taken: the caller gives up its reference) under name to out. */
static kiln_status push(kiln_batch_result *out, const char *name, kiln_tensor *t, char *err,
                        size_t err_len, int depth)
{
    if (!is_container(t->dtype)) {
        char *nm = strdup(name);
        if (!nm) {
            kiln_tensor_free(t);
            snprintf(err, err_len, "out of memory");
            return KILN_ERR_OUT_OF_MEMORY;
        }
        out->names[out->n] = nm;
        out->t[out->n] = t;
        out->n++;
        return KILN_OK;
    }
    kiln_status st = KILN_OK;
    if (depth >= MAX_NESTING) {
        snprintf(err, err_len, "output '%s' nests sequences more than %d deep", name, MAX_NESTING);
        st = KILN_ERR_UNSUPPORTED;
    }
    /* the container owns its items (kiln.h): move each out of its slot */
    kiln_tensor **items = t->data;
    if (st == KILN_OK && !t->owns_data) {
        snprintf(err, err_len, "output '%.200s': a container that does not own its items", name);
        st = KILN_ERR_INVALID_ARGUMENT;
    }
    for (int64_t i = 0; st == KILN_OK && i < t->dims[0]; i++) {
        if (!items[i]) continue;
        char sub[NAME_MAX_LEN];
        int len = t->dtype == KILN_DTYPE_OPTIONAL
                      ? snprintf(sub, sizeof sub, "%s", name)
                      : snprintf(sub, sizeof sub, "%s/%lld", name, (long long)i);
        if (len < 0 || (size_t)len >= sizeof sub) {
            snprintf(err, err_len, "output '%.200s': flattened name too long", name);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        kiln_tensor *item = items[i];
        items[i] = NULL;
        st = push(out, sub, item, err, err_len, depth + 1);
    }
    kiln_tensor_free(t);
    return st;
}

kiln_status kiln_serve_take_outputs(kiln_outputs *o, kiln_batch_result *out, char *err,
                                    size_t err_len)
{
    memset(out, 0, sizeof *out);
    int no = kiln_outputs_count(o);
    int64_t total = 0;
    for (int i = 0; i < no; i++) total += count_leaves(kiln_outputs_get(o, i));
    if (total > (1 << 20)) {
        snprintf(err, err_len, "the outputs flatten into %lld tensors (at most %d)",
                 (long long)total, 1 << 20);
        return KILN_ERR_UNSUPPORTED;
    }
    out->names = calloc((size_t)total + 1, sizeof *out->names);
    out->t = calloc((size_t)total + 1, sizeof *out->t);
    if (!out->names || !out->t) {
        kiln_batch_result_free(out);
        snprintf(err, err_len, "out of memory");
        return KILN_ERR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < no; i++) {
        kiln_tensor *t = kiln_outputs_take(o, i);
        if (!t) continue;
        kiln_status st = push(out, kiln_outputs_name(o, i), t, err, err_len, 0);
        if (st != KILN_OK) {
            kiln_batch_result_free(out);
            return st;
        }
    }
    return KILN_OK;
}
