/*
 * fileio.h - read-only file mapping.
 *
 * Model weights are mapped, not copied: kiln_file_map maps a whole file
 * (or reads it when mapping is impossible) and the mapping lives until
 * kiln_file_unmap.
 */
#ifndef KILN_CORE_FILEIO_H
#define KILN_CORE_FILEIO_H

#include <stddef.h>

#include "core/status.h"

struct kiln_file_map {
    const void *data;
    size_t size;
    int mapped;  /* 1: munmap; 2: a heap copy of an in-memory file, wiped and freed; 0: nothing */
};

kiln_status kiln_file_map(const char *path, struct kiln_file_map *out);

/* Where an importer reads a model folder's files from: the file system
 * (a NULL source) or a table of files held in memory (kiln_model_load_files).
 * Paths under dir + "/" are looked up in the table by the rest of the path;
 * any other path, and a path not in the table, is not found. */
struct kiln_memory_file;
struct kiln_file_source {
    const char *dir;
    const struct kiln_memory_file *files;
    int n;
};
/* kiln_file_map from src: with a NULL src the file itself; otherwise a
 * private, 64-byte aligned heap copy of the table's bytes (mapped = 2),
 * which outlives the table and is freed by kiln_file_unmap. */
kiln_status kiln_file_map_from(const struct kiln_file_source *src, const char *path,
                               struct kiln_file_map *out);
/* Map an already open descriptor (it is not closed). */
kiln_status kiln_file_map_fd(int fd, const char *path_for_errors, struct kiln_file_map *out);
void kiln_file_unmap(struct kiln_file_map *m);
/* Give a mapping's resident pages back to the kernel (madvise DONTNEED). The
 * mapping is read-only and file-backed, so a later read faults the same bytes
 * back in from the page cache; only what is still read stays resident. No-op
 * for files that were read rather than mapped. */
void kiln_file_release_pages(const struct kiln_file_map *m);
/* The same for the whole pages inside [data, data + size) of a mapping. */
void kiln_file_release_range(const void *data, size_t size);

#endif
