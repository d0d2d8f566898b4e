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

kiln_status kiln_pb_check(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                          int max_depth, const char *what);

#endif
