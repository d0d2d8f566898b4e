/*
 * check.h - a tiny test helper: CHECK(cond, fmt, ...) records a failure
 * with file and line and goes on; CHECK_DONE() prints the closing line.
 */
#ifndef KILN_TEST_CHECK_H
#define KILN_TEST_CHECK_H

#include <stdint.h>
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

/* Reproducible random numbers (xorshift64) for test inputs. */
static inline uint64_t check_xorshift(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

#endif
