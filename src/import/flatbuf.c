/*
 * flatbuf.c - the bounds-checked FlatBuffers reader (see flatbuf.h).
 *
 * Every check is against the whole buffer [0, n): a table's vtable and
 * body, a field's bytes inside its table, and an offset's target with the
 * bytes it needs. Positions are size_t and every sum is checked before it
 * is formed, so a hostile 32-bit length cannot wrap.
 */
#include "import/flatbuf.h"

#include <string.h>

#define FB_MAX_BYTES ((size_t)INT32_MAX) /* offsets are 32-bit */

static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Whether [pos, pos + len) lies inside the buffer. */
static bool in_buf(const struct kiln_fb *fb, size_t pos, size_t len)
{
    return pos <= fb->n && len <= fb->n - pos;
}

static kiln_status table_at(const struct kiln_fb *fb, size_t pos, const char *what,
                            struct kiln_fb_table *out)
{
    if (!in_buf(fb, pos, 4))
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: table at byte %zu lies outside the buffer (%zu bytes)", what, pos,
                          fb->n);
    int32_t soff = (int32_t)rd32(fb->p + pos);
    int64_t vt = (int64_t)pos - (int64_t)soff;
    if (vt < 0 || !in_buf(fb, (size_t)vt, 4))
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: vtable offset %d of the table at byte %zu points outside the "
                          "buffer",
                          what, (int)soff, pos);
    uint16_t vt_len = rd16(fb->p + vt), obj_len = rd16(fb->p + vt + 2);
    if (vt_len < 4 || (vt_len & 1) || !in_buf(fb, (size_t)vt, vt_len))
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: vtable at byte %lld has a bad length %u", what, (long long)vt,
                          (unsigned)vt_len);
    if (obj_len < 4 || !in_buf(fb, pos, obj_len))
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: table at byte %zu of %u bytes runs past the end of the buffer",
                          what, pos, (unsigned)obj_len);
    *out = (struct kiln_fb_table){fb, pos, (size_t)vt, vt_len, obj_len, what};
    return KILN_OK;
}

kiln_status kiln_fb_root(const struct kiln_fb *fb, const char *ident, const char *what,
                         struct kiln_fb_table *out)
{
    if (fb->n > FB_MAX_BYTES)
        return kiln_error(KILN_ERR_UNSUPPORTED, "%s: %zu bytes exceed the 2 GiB FlatBuffer limit",
                          what, fb->n);
    if (fb->n < 8)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: %zu bytes are too few for a FlatBuffer",
                          what, fb->n);
    if (ident && memcmp(fb->p + 4, ident, 4) != 0)
        return kiln_error(KILN_ERR_INVALID_MODEL, "%s: file identifier is not '%.4s'", what,
                          ident);
    return table_at(fb, rd32(fb->p), what, out);
}

/* Offset of field id inside t (0 = absent); checks that size bytes fit. */
static kiln_status field(const struct kiln_fb_table *t, int id, const char *name, size_t size,
                         size_t *off)
{
    *off = 0;
    size_t slot = 4 + 2 * (size_t)id;
    if (id < 0 || slot + 2 > t->vt_len) return KILN_OK;
    uint16_t o = rd16(t->fb->p + t->vt + slot);
    if (!o) return KILN_OK;
    if ((size_t)o + size > t->obj_len)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: field '%s' (%zu bytes at offset %u) lies outside its table of %u "
                          "bytes",
                          t->what, name, size, (unsigned)o, (unsigned)t->obj_len);
    *off = t->pos + o;
    return KILN_OK;
}

bool kiln_fb_has(const struct kiln_fb_table *t, int id)
{
    size_t slot = 4 + 2 * (size_t)id;
    return id >= 0 && slot + 2 <= t->vt_len && rd16(t->fb->p + t->vt + slot) != 0;
}

#define FB_SCALAR(fname, type)                                                              \
    kiln_status fname(const struct kiln_fb_table *t, int id, const char *name, type dflt,   \
                      type *out)                                                            \
    {                                                                                       \
        size_t off;                                                                         \
        kiln_status st = field(t, id, name, sizeof(type), &off);                            \
        if (st != KILN_OK) return st;                                                       \
        if (!off) *out = dflt;                                                              \
        else memcpy(out, t->fb->p + off, sizeof(type));                                     \
        return KILN_OK;                                                                     \
    }
FB_SCALAR(kiln_fb_u8, uint8_t)
FB_SCALAR(kiln_fb_i8, int8_t)
FB_SCALAR(kiln_fb_i32, int32_t)
FB_SCALAR(kiln_fb_u32, uint32_t)
FB_SCALAR(kiln_fb_u64, uint64_t)
FB_SCALAR(kiln_fb_f32, float)
#undef FB_SCALAR

/* Follow the unsigned offset stored in field id; *target 0 = absent. */
static kiln_status follow(const struct kiln_fb_table *t, int id, const char *name, size_t *target)
{
    size_t off;
    kiln_status st = field(t, id, name, 4, &off);
    if (st != KILN_OK || !off) {
        *target = 0;
        return st;
    }
    uint32_t rel = rd32(t->fb->p + off);
    if (rel == 0 || !in_buf(t->fb, off, (size_t)rel) || !in_buf(t->fb, off + rel, 4))
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: field '%s': offset %u points outside the buffer (%zu bytes)",
                          t->what, name, rel, t->fb->n);
    *target = off + rel;
    return KILN_OK;
}

kiln_status kiln_fb_table_field(const struct kiln_fb_table *t, int id, const char *name,
                                const char *sub_what, struct kiln_fb_table *out, bool *present)
{
    size_t target = 0;
    *present = false;
    kiln_status st = follow(t, id, name, &target);
    if (st != KILN_OK || !target) return st;
    st = table_at(t->fb, target, sub_what, out);
    if (st != KILN_OK) return kiln_error_wrap(st, "%s: field '%s'", t->what, name);
    *present = true;
    return KILN_OK;
}

/* A vector at pos (its length word) of elem-byte elements. */
static kiln_status vec_at(const struct kiln_fb_table *t, const char *name, size_t pos,
                          size_t elem, struct kiln_fb_vec *out)
{
    uint32_t n = rd32(t->fb->p + pos);
    if ((uint64_t)n * elem > t->fb->n - pos - 4)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: field '%s': vector of %u elements runs past the end of the buffer "
                          "(%zu bytes)",
                          t->what, name, n, t->fb->n);
    *out = (struct kiln_fb_vec){t->fb, pos + 4, n, elem};
    return KILN_OK;
}

kiln_status kiln_fb_vec_field(const struct kiln_fb_table *t, int id, const char *name,
                              size_t elem, struct kiln_fb_vec *out)
{
    size_t target = 0;
    *out = (struct kiln_fb_vec){t->fb, 0, 0, elem};
    kiln_status st = follow(t, id, name, &target);
    if (st != KILN_OK || !target) return st;
    return vec_at(t, name, target, elem, out);
}

kiln_status kiln_fb_vec_table(const struct kiln_fb_vec *v, uint32_t i, const char *what,
                              struct kiln_fb_table *out)
{
    if (i >= v->n || v->elem != 4)
        return kiln_error(KILN_ERR_INTERNAL, "%s: vector element %u out of range", what, i);
    size_t at = v->pos + 4 * (size_t)i;
    uint32_t rel = rd32(v->fb->p + at);
    if (rel == 0 || !in_buf(v->fb, at, (size_t)rel))
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: offset %u in its vector points outside the buffer", what, rel);
    return table_at(v->fb, at + rel, what, out);
}

int32_t kiln_fb_vec_i32(const struct kiln_fb_vec *v, uint32_t i)
{
    return (int32_t)rd32(v->fb->p + v->pos + 4 * (size_t)i);
}
int64_t kiln_fb_vec_i64(const struct kiln_fb_vec *v, uint32_t i)
{
    int64_t x;
    memcpy(&x, v->fb->p + v->pos + 8 * (size_t)i, 8);
    return x;
}
float kiln_fb_vec_f32(const struct kiln_fb_vec *v, uint32_t i)
{
    float x;
    memcpy(&x, v->fb->p + v->pos + 4 * (size_t)i, 4);
    return x;
}
uint8_t kiln_fb_vec_u8(const struct kiln_fb_vec *v, uint32_t i) { return v->fb->p[v->pos + i]; }

kiln_status kiln_fb_str(const struct kiln_fb_table *t, int id, const char *name, const char **s,
                        size_t *len)
{
    *s = NULL;
    *len = 0;
    size_t target = 0;
    kiln_status st = follow(t, id, name, &target);
    if (st != KILN_OK || !target) return st;
    struct kiln_fb_vec v = {0};
    if ((st = vec_at(t, name, target, 1, &v)) != KILN_OK) return st;
    *s = (const char *)t->fb->p + v.pos;
    *len = v.n;
    return KILN_OK;
}
