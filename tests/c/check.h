/*
 * check.h - a tiny test helper: CHECK(cond, fmt, ...) records a failure
 * with file and line and goes on; CHECK_DONE() prints the closing line.
 */
#ifndef KILN_TEST_CHECK_H
#define KILN_TEST_CHECK_H

#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        if (cond) {                                                      \
            check_passed++;                                              \
        } else {                                                         \
            check_failed++;                                              \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                \
            fputc('\n', stderr);                                         \
        }                                                                \
    } while (0)

#define CHECK_DONE()                                                      \
    (printf("%d passed, %d failed\n", check_passed, check_failed), check_failed ? 1 : 0)

#endif
