/*
 * textproto.h - protobuf text format, parsed into protobuf-c messages.
 *
 * TensorFlow writes some files in protobuf text format: saved_model.pbtxt,
 * and TF-Serving's model config and batching parameter files. This parser
 * works for any protobuf-c message type: it reads the text against the
 * message descriptors, writes the equivalent binary wire format, and lets
 * protobuf_c_message_unpack build the message. For example:
 *
 *     ProtobufCMessage *msg;
 *     if (kiln_textproto_parse(&kiln_onnx__model_proto__descriptor, text, len, &msg) != KILN_OK)
 *         fprintf(stderr, "%s\n", kiln_last_error());  // "line 3:12: unknown field ..."
 *     ...
 *     protobuf_c_message_free_unpacked(msg, NULL);
 *
 * Accepted: fields by name with ':' (optional before a message), messages in
 * { } or < >, map fields as repeated entries { key: .. value: .. }, repeated
 * fields one value at a time or as [a, b, c], strings in "..." or '...' with
 * C escapes (octal, \x hex, \u and \U code points as UTF-8) and adjacent
 * strings concatenated, integers in decimal, hex (0x) or octal (leading 0)
 * with range checks for the field's type, floats with exponents, an f suffix,
 * inf, infinity and nan (any case), enum values by name or number, booleans
 * as true/false/True/False/t/f/1/0, '#' comments, and ';' or ',' after a
 * field. Rejected with a message: unknown fields, a non-repeated field given
 * twice, two fields of one oneof, missing required fields, extensions and
 * Any expansions ("[type.googleapis.com/...]"), nesting deeper than
 * KILN_TEXTPROTO_MAX_DEPTH and text larger than KILN_TEXTPROTO_MAX_BYTES.
 * Messages give the line and column and name the field and message type:
 * "line 3:12: unknown field 'max_batch_sise' in BatchingParameters".
 */
#ifndef KILN_IMPORT_TEXTPROTO_H
#define KILN_IMPORT_TEXTPROTO_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

#include "core/status.h"
#include "kiln/kiln_util.h"

#define KILN_TEXTPROTO_MAX_DEPTH 100                 /* nested message levels */
#define KILN_TEXTPROTO_MAX_BYTES ((size_t)1 << 30)   /* text size */

/*
 * Parse text[0..len) (not NUL-terminated; NUL bytes are an error) as a
 * message of type desc. On success *out owns the message: free it with
 * protobuf_c_message_free_unpacked(*out, NULL). On failure *out is NULL and
 * the status is KILN_ERR_INVALID_MODEL for malformed text, KILN_ERR_UNSUPPORTED
 * for extensions and Any expansions, KILN_ERR_OUT_OF_MEMORY for
 * allocation failures and size limits. Callers reading a config file rather
 * than a model may re-map the status with kiln_error_wrap.
 */
/* kiln_textproto_parse(desc, text, len, &out) is declared in include/kiln/kiln_util.h. */

#endif
