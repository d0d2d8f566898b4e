/*
 * replay_main.c - run a libFuzzer target without libFuzzer.
 *
 * Provides main() for a fuzz target so that its stored corpus can be
 * replayed by the normal test suite, with gcc and optionally ASan/UBSan
 * (KILN_SANITIZE=ON): every argument is a file, or a folder whose regular
 * files are replayed in name order. Each file is read whole and passed to
 * LLVMFuzzerTestOneInput once. Like SQLite's fuzzcheck, this looks only for
 * crashes, hangs and leaks; a clean return means the corpus passed.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Read a whole file into a malloc'd buffer; NULL on failure (reported). */
static uint8_t *replay_read_file(const char *path, size_t *size_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
        if (len == cap) {
            uint8_t *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        fprintf(stderr, "replay: %s: read failed\n", path);
        free(buf);
        return NULL;
    }
    *size_out = len;
    return buf;
}

/* Replay one file; returns 0 on success, 1 if it could not be read. */
static int replay_file(const char *path)
{
    size_t size = 0;
    uint8_t *data = replay_read_file(path, &size);
    if (!data)
        return 1;
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, size);
    /* An exact-size copy so that ASan sees reads past the end. */
    uint8_t *exact = malloc(size ? size : 1);
    if (!exact) {
        free(data);
        return 1;
    }
    if (size)
        memcpy(exact, data, size);
    free(data);
    LLVMFuzzerTestOneInput(exact, size);
    free(exact);
    return 0;
}

static int replay_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replay every regular file in a folder, in name order; returns failures. */
static int replay_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int failures = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            char **bigger = realloc(names, ncap * sizeof *names);
            if (!bigger) {
                failures++;
                break;
            }
            names = bigger;
            cap = ncap;
        }
        size_t len = strlen(dir) + 1 + strlen(e->d_name) + 1;
        names[n] = malloc(len);
        if (!names[n]) {
            failures++;
            break;
        }
        snprintf(names[n], len, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    if (n > 0)
        qsort(names, n, sizeof *names, replay_name_cmp);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            failures += replay_file(names[i]);
            (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return failures;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 2;
    }
    int failures = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            failures++;
        } else if (S_ISDIR(st.st_mode)) {
            failures += replay_dir(argv[i], &count);
        } else {
            failures += replay_file(argv[i]);
            count++;
        }
    }
    fprintf(stderr, "replay: %d inputs, %d unreadable\n", count, failures);
    return failures ? 1 : 0;
}
