/*
 * pbcheck.h - a pre-parse guard for protobuf bytes.
 *
 * protobuf-c parses nested messages recursively with no depth limit, so a
 * hostile file (a GraphProto inside an If inside a GraphProto ... 100,000
 * levels deep) could exhaust the stack. kiln_pb_check walks the wire format
 * against the message descriptors first, iteratively bounded, and rejects
 * malformed framing and nesting deeper than max_depth with a clear message.
 */
#ifndef KILN_IMPORT_PBCHECK_H
#define KILN_IMPORT_PBCHECK_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "kiln/kiln_util.h"

/* kiln_pb_check(desc, data, len, max_depth, what) is declared in include/kiln/kiln_util.h. */

#endif
