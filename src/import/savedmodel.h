/*
 * savedmodel.h - TensorFlow SavedModel import.
 *
 * A SavedModel is a folder: saved_model.pb (or saved_model.pbtxt, the
 * protobuf text format), variables/variables.index + variables.data-* (a
 * TensorBundle checkpoint) and assets/. kiln_savedmodel_load picks the
 * MetaGraphDef whose tag set equals `tags`, and builds one IR graph per
 * SignatureDef (function calls inlined, variables restored into constants,
 * TF ops lowered to Kiln IR ops). See src/import/savedmodel.c.
 */
#ifndef KILN_IMPORT_SAVEDMODEL_H
#define KILN_IMPORT_SAVEDMODEL_H

#include <stddef.h>

#include "import/model.h"

/* Load the SavedModel in folder dir into m (which must be zeroed). tags is a
 * comma-separated tag set ("serve,gpu"); NULL or "" means "serve". On error
 * m may be partly filled; free it as a model (m->proto_free owns the rest). */
kiln_status kiln_savedmodel_load(const char *dir, const char *tags, struct kiln_model *m);

/* Load from the bytes of a saved_model.pb (binary) or, if text is nonzero,
 * saved_model.pbtxt. dir is the folder variables and assets are read from;
 * NULL means the model has none (a model that needs them is an error).
 * The bytes are not retained. */
kiln_status kiln_savedmodel_load_bytes(const void *data, size_t size, int text, const char *dir,
                                       const char *tags, struct kiln_model *m);
/* The same with the variables read through src (core/fileio.h: a table of
 * files held in memory; NULL: the file system under dir). */
struct kiln_file_source;
kiln_status kiln_savedmodel_load_source(const void *data, size_t size, int text, const char *dir,
                                        const struct kiln_file_source *src, const char *tags,
                                        struct kiln_model *m);

#endif
