/*
 * fileio.c - map files read-only.
 */
#define _GNU_SOURCE
#include "core/fileio.h"

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

void kiln_file_unmap(struct kiln_file_map *m)
{
    if (m->mapped && m->data) munmap((void *)m->data, m->size);
    memset(m, 0, sizeof *m);
}

void kiln_file_release_pages(const struct kiln_file_map *m)
{
    if (m && m->mapped && m->data && m->size) (void)madvise((void *)m->data, m->size, MADV_DONTNEED);
}

void kiln_file_release_range(const void *data, size_t size)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)data, hi = lo + size;
    uintptr_t a = (lo + page - 1) & ~(page - 1), b = hi & ~(page - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}
