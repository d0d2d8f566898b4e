/*
 * flatbuf.h - Kiln's own bounds-checked reader of FlatBuffers, the binary
 * format TFLite models are stored in (src/import/tflite.c uses it).
 *
 * A FlatBuffer is a tree of tables addressed by 32-bit offsets: a table
 * starts with a signed offset to its vtable, the vtable lists the byte
 * offset of each field inside the table (0 = absent, the schema's default
 * applies), and a field either holds a scalar in place or an unsigned
 * offset, relative to the field, to a sub-table, a vector (u32 length, then
 * the elements) or a string (a byte vector followed by a NUL). Nothing here
 * trusts the bytes: every offset, vtable, field, vector length and string is
 * checked against the buffer before it is read, reads go through memcpy
 * (no alignment is assumed), and a failure is a KILN_ERR_INVALID_MODEL whose
 * message names the table and the field ("Tensor 3 of subgraph 0: field
 * 'shape': vector of 4000000000 elements runs past the end of the buffer").
 *
 * The reader knows nothing of any schema: callers pass field ids (the
 * position of the field in the schema's table, a fact of the format) and
 * names for messages.
 */
#ifndef KILN_IMPORT_FLATBUF_H
#define KILN_IMPORT_FLATBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

struct kiln_fb {
    const uint8_t *p;   /* the whole buffer */
    size_t n;           /* its size in bytes (at most 2 GiB: offsets are 32-bit) */
};

/* A checked table: its position, its vtable and both lengths. */
struct kiln_fb_table {
    const struct kiln_fb *fb;
    size_t pos;         /* table start */
    size_t vt;          /* vtable start */
    uint16_t vt_len;    /* vtable size in bytes (4 + 2 per field) */
    uint16_t obj_len;   /* table size in bytes */
    const char *what;   /* the table, for messages ("SubGraph 0") */
};

/* A checked vector: elements start at pos, n of them, elem bytes each. */
struct kiln_fb_vec {
    const struct kiln_fb *fb;
    size_t pos;
    uint32_t n;
    size_t elem;
};

/* The root table; checks the size and, when ident is not NULL, the 4-byte
 * file identifier at bytes 4..8. */
kiln_status kiln_fb_root(const struct kiln_fb *fb, const char *ident, const char *what,
                         struct kiln_fb_table *out);

/* Whether field id is present in t. */
bool kiln_fb_has(const struct kiln_fb_table *t, int id);

/* Scalar fields; absent fields give dflt. name is for messages. */
kiln_status kiln_fb_u8(const struct kiln_fb_table *t, int id, const char *name, uint8_t dflt,
                       uint8_t *out);
kiln_status kiln_fb_i8(const struct kiln_fb_table *t, int id, const char *name, int8_t dflt,
                       int8_t *out);
kiln_status kiln_fb_i32(const struct kiln_fb_table *t, int id, const char *name, int32_t dflt,
                        int32_t *out);
kiln_status kiln_fb_u32(const struct kiln_fb_table *t, int id, const char *name, uint32_t dflt,
                        uint32_t *out);
kiln_status kiln_fb_u64(const struct kiln_fb_table *t, int id, const char *name, uint64_t dflt,
                        uint64_t *out);
kiln_status kiln_fb_f32(const struct kiln_fb_table *t, int id, const char *name, float dflt,
                        float *out);

/* A sub-table field; *present false (and out untouched) when absent.
 * sub_what names the sub-table in its own messages (kept by pointer). */
kiln_status kiln_fb_table_field(const struct kiln_fb_table *t, int id, const char *name,
                                const char *sub_what, struct kiln_fb_table *out, bool *present);

/* A vector field of elem-byte scalars (or of 4-byte offsets to tables);
 * absent gives an empty vector. */
kiln_status kiln_fb_vec_field(const struct kiln_fb_table *t, int id, const char *name,
                              size_t elem, struct kiln_fb_vec *out);
/* Element i of a vector of tables. */
kiln_status kiln_fb_vec_table(const struct kiln_fb_vec *v, uint32_t i, const char *what,
                              struct kiln_fb_table *out);
/* Elements of scalar vectors (i < v->n is the caller's to check). */
int32_t kiln_fb_vec_i32(const struct kiln_fb_vec *v, uint32_t i);
int64_t kiln_fb_vec_i64(const struct kiln_fb_vec *v, uint32_t i);
float kiln_fb_vec_f32(const struct kiln_fb_vec *v, uint32_t i);
uint8_t kiln_fb_vec_u8(const struct kiln_fb_vec *v, uint32_t i);

/* A string field: *s points into the buffer (not NUL-terminated in
 * general), *len its length; absent gives NULL, 0. */
kiln_status kiln_fb_str(const struct kiln_fb_table *t, int id, const char *name, const char **s,
                        size_t *len);

#endif
