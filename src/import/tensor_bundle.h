/*
 * tensor_bundle.h - TensorFlow TensorBundle checkpoints (SavedModel variables).
 *
 * A SavedModel keeps its variable values in a TensorBundle: an index file
 * "<prefix>.index" (a LevelDB-format table mapping each tensor name to its
 * dtype, shape, data file, offset, size and CRC-32C; the entry with the
 * empty key is a header with the number of data files) and data files
 * "<prefix>.data-00000-of-00001" ... holding the raw little-endian bytes.
 * The prefix of a SavedModel's variables is "<dir>/variables/variables".
 *
 *     struct kiln_bundle *b;
 *     if (kiln_bundle_open("model/variables/variables", &b) != KILN_OK) return ...;
 *     for (int i = 0; i < kiln_bundle_count(b); i++) {
 *         kiln_tensor *t;
 *         if (kiln_bundle_read(b, kiln_bundle_key(b, i), &t) == KILN_OK) ... kiln_tensor_free(t);
 *     }
 *     kiln_bundle_close(b);  // after every tensor read from it is freed (see below)
 *
 * Everything in the files is checked before use: the table's framing,
 * block CRCs and key order; each entry's dtype, shape, shard, offset and
 * size against the data file; the CRC-32C of every tensor read. Index
 * blocks may be uncompressed or Snappy-compressed (newer TF versions write
 * Snappy). Not supported, with a message saying so: partitioned (sliced)
 * variables, big-endian bundles, and complex, quantized, resource and
 * variant tensors.
 */
#ifndef KILN_IMPORT_TENSOR_BUNDLE_H
#define KILN_IMPORT_TENSOR_BUNDLE_H

#include "core/status.h"
#include "kiln/kiln.h"

struct kiln_bundle;
struct kiln_model;

#define KILN_BUNDLE_MAX_SHARDS 65536 /* data files one bundle may name */

/*
 * Open the bundle at prefix: read and check the whole index, and map every
 * data file an entry refers to. Fails with KILN_ERR_NOT_FOUND when the index
 * or a data file is missing, KILN_ERR_INVALID_MODEL when a file is corrupt,
 * KILN_ERR_UNSUPPORTED for bundles Kiln cannot read (big-endian, newer
 * format versions). On success *out is owned by the caller.
 */
kiln_status kiln_bundle_open(const char *prefix, struct kiln_bundle **out);
/* The same, reading the index and data files through src (core/fileio.h;
 * NULL: the file system), which need only live until this returns. */
struct kiln_file_source;
kiln_status kiln_bundle_open_from(const char *prefix, const struct kiln_file_source *src,
                                  struct kiln_bundle **out);

/* Number of tensors (entries other than the header), and the name of the
 * i-th in the index's (sorted) order; NULL if i is out of range. The name
 * lives as long as the bundle. */
int kiln_bundle_count(const struct kiln_bundle *b);
const char *kiln_bundle_key(const struct kiln_bundle *b, int i);

/*
 * Read the tensor named key (KILN_ERR_NOT_FOUND if there is none) into a new
 * tensor owned by the caller (free it with kiln_tensor_free). A numeric
 * tensor whose bytes are suitably aligned in the data file is returned
 * zero-copy: it borrows the read-only mapping (its owns_data is 0, and its
 * data must not be written), so the bundle (or whoever the mappings were
 * handed to with kiln_bundle_keep_maps) must outlive it. Other tensors,
 * strings and bools are copies. Reads of one open bundle may run
 * concurrently from several threads.
 */
kiln_status kiln_bundle_read(struct kiln_bundle *b, const char *key, kiln_tensor **out);

/* Hand the data file mappings to model m (kiln_model_keep_map), so that
 * zero-copy tensors stay valid for the model's lifetime, after
 * kiln_bundle_close too. From then on m must outlive the bundle and every
 * tensor read from it, before or after this call. */
kiln_status kiln_bundle_keep_maps(struct kiln_bundle *b, struct kiln_model *m);

/* Free the bundle and unmap its data files (unless handed to a model). */
void kiln_bundle_close(struct kiln_bundle *b);

#endif
