/*
 * fileio.c - map files read-only, or take them from a table of files held
 * in memory (an encrypted model decrypted by the server, never on disk).
 */
#define _GNU_SOURCE
#include "core/fileio.h"

#include "kiln/kiln.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

kiln_status kiln_file_map_fd(int fd, const char *path, struct kiln_file_map *out)
{
    struct stat stt;
    memset(out, 0, sizeof *out);
    if (fstat(fd, &stt) != 0)
        return kiln_error(KILN_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
    if (!S_ISREG(stt.st_mode))
        return kiln_error(KILN_ERR_IO, "'%s' is not a regular file", path);
    size_t size = (size_t)stt.st_size;
    if (size == 0) {
        out->data = "";
        out->size = 0;
        out->mapped = 0;
        return KILN_OK;
    }
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return kiln_error(KILN_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
    out->data = p;
    out->size = size;
    out->mapped = 1;
    return KILN_OK;
}

kiln_status kiln_file_map(const char *path, struct kiln_file_map *out)
{
    /* O_NONBLOCK so that opening a FIFO does not block; the fstat check rejects it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        memset(out, 0, sizeof *out);
        return kiln_error(errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO,
                          "cannot open '%s': %s", path, strerror(errno));
    }
    kiln_status st = kiln_file_map_fd(fd, path, out);
    close(fd);
    return st;
}

kiln_status kiln_file_map_from(const struct kiln_file_source *src, const char *path,
                               struct kiln_file_map *out)
{
    if (!src) return kiln_file_map(path, out);
    memset(out, 0, sizeof *out);
    size_t dl = strlen(src->dir);
    const char *rel = strncmp(path, src->dir, dl) == 0 && path[dl] == '/' ? path + dl + 1 : NULL;
    for (int i = 0; rel && i < src->n; i++) {
        const struct kiln_memory_file *f = &src->files[i];
        if (!f->path || strcmp(f->path, rel) != 0) continue;
        if (f->size == 0) {
            out->data = "";
            return KILN_OK;
        }
        if (!f->data || f->size > SIZE_MAX - 128)
            return kiln_error(KILN_ERR_INVALID_ARGUMENT, "in-memory file '%s': no bytes", path);
        void *p = aligned_alloc(64, (f->size + 63) / 64 * 64);
        if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory copying '%s'", path);
        memcpy(p, f->data, f->size);
        out->data = p;
        out->size = f->size;
        out->mapped = 2;
        return KILN_OK;
    }
    return kiln_error(KILN_ERR_NOT_FOUND, "cannot open '%s': not among the model's in-memory files",
                      path);
}

void kiln_file_unmap(struct kiln_file_map *m)
{
    if (m->mapped == 1 && m->data) munmap((void *)m->data, m->size);
    if (m->mapped == 2 && m->data) { /* possibly decrypted weights: wipe them */
        explicit_bzero((void *)m->data, m->size);
        free((void *)m->data);
    }
    memset(m, 0, sizeof *m);
}

void kiln_file_release_pages(const struct kiln_file_map *m)
{
    if (m && m->mapped == 1 && m->data && m->size) (void)madvise((void *)m->data, m->size, MADV_DONTNEED);
}

void kiln_file_release_range(const void *data, size_t size)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)data, hi = lo + size;
    uintptr_t a = (lo + page - 1) & ~(page - 1), b = hi & ~(page - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}
