/*
 * pbcheck.c - walk protobuf wire format with a depth bound before parsing.
 */
#include "import/pbcheck.h"

static int read_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*pos >= len) return 0;
        uint8_t b = p[(*pos)++];
        if (shift == 63 && (b & 0x7e)) return 0;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

static const ProtobufCFieldDescriptor *find_field(const ProtobufCMessageDescriptor *d, uint32_t id)
{
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].id == id) return &d->fields[i];
    return NULL;
}

static kiln_status check(const ProtobufCMessageDescriptor *desc, const uint8_t *p, size_t len,
                         int depth, int max_depth, const char *what)
{
    if (depth > max_depth)
        return kiln_error(KILN_ERR_INVALID_MODEL,
                          "%s: messages are nested more than %d levels deep (at %s); "
                          "refusing to parse",
                          what, max_depth, desc->name);
    size_t pos = 0;
    while (pos < len) {
        uint64_t key;
        size_t at = pos;
        if (!read_varint(p, len, &pos, &key))
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: truncated or bad field key at byte %zu of a %s",
                              what, at, desc->name);
        uint32_t id = (uint32_t)(key >> 3);
        unsigned wt = key & 7;
        if (id == 0)
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: field number 0 at byte %zu of a %s", what,
                              at, desc->name);
        uint64_t v = 0;
        switch (wt) {
        case 0:
            if (!read_varint(p, len, &pos, &v))
                return kiln_error(KILN_ERR_INVALID_MODEL, "%s: truncated varint in %s field %u", what,
                                  desc->name, id);
            break;
        case 1:
            if (len - pos < 8)
                return kiln_error(KILN_ERR_INVALID_MODEL, "%s: truncated fixed64 in %s field %u",
                                  what, desc->name, id);
            pos += 8;
            break;
        case 5:
            if (len - pos < 4)
                return kiln_error(KILN_ERR_INVALID_MODEL, "%s: truncated fixed32 in %s field %u",
                                  what, desc->name, id);
            pos += 4;
            break;
        case 2: {
            if (!read_varint(p, len, &pos, &v) || v > len - pos)
                return kiln_error(KILN_ERR_INVALID_MODEL,
                                  "%s: %s field %u claims %llu bytes but only %zu remain "
                                  "(truncated file?)",
                                  what, desc->name, id, (unsigned long long)v, len - pos);
            const ProtobufCFieldDescriptor *f = find_field(desc, id);
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                kiln_status st = check((const ProtobufCMessageDescriptor *)f->descriptor, p + pos,
                                       (size_t)v, depth + 1, max_depth, what);
                if (st != KILN_OK) return st;
            }
            pos += (size_t)v;
            break;
        }
        default:
            return kiln_error(KILN_ERR_INVALID_MODEL, "%s: unsupported wire type %u in %s field %u",
                              what, wt, desc->name, id);
        }
    }
    return KILN_OK;
}

kiln_status kiln_pb_check(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                          int max_depth, const char *what)
{
    return check(desc, data, len, 0, max_depth, what);
}
