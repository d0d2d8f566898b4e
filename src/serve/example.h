/*
 * example.h - TF Serving's :classify and :regress request bodies, turned
 * into the serialized tf.Example protos a classify or regress signature
 * takes as its string input.
 *
 *   {"signature_name": "...", "context": {feature: value},
 *    "examples": [{feature: value, ...}, ...]}
 *
 * A feature value is a number (int64_list when written without '.', 'e' or
 * 'E', else float_list), true/false (int64_list 1/0), a string or
 * {"b64": ...} (bytes_list), or a flat list of one of those kinds. Context
 * features are added to every example and may not repeat an example's key.
 * Encoding is by hand (tf.Example is three small messages), so no schema is
 * needed.
 */
#ifndef KILN_SERVE_EXAMPLE_H
#define KILN_SERVE_EXAMPLE_H

#include "kiln/kiln.h"
#include "serve/json.h"

/* Encode the "examples" of the request object at token root into a new
 * string tensor [n] (owned by the caller). INVALID_ARGUMENT with err set for
 * a malformed request. */
kiln_status kiln_examples_encode(const kiln_json_doc *d, int root, kiln_tensor **out, char *err);

#endif
