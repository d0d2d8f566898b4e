/*
 * check.h - a tiny test helper: CHECK(cond, fmt, ...) records a failure
 * with file and line and goes on; CHECK_SKIP(fmt, ...) says that a part of
 * the test did not run (data absent); CHECK_DONE() prints the closing line
 * and gives the exit code: 1 on any failure, else CHECK_SKIP_CODE (77,
 * which tests/CMakeLists.txt names as SKIP_RETURN_CODE, so ctest reports
 * the test as skipped) if anything was skipped, else 0.
 *
 * With KILN_REQUIRE_TESTDATA=1 in the environment (CI sets it), a skip is
 * a failure: data that CI must have cannot go missing unnoticed.
 * CHECK_SKIP_CPU(fmt, ...) is the other kind of skip: this CPU lacks an
 * instruction set the part needs (VNNI, AVX512-BF16). It stays a skip with
 * KILN_REQUIRE_TESTDATA=1, since CI machines differ in what they have.
 */
#ifndef KILN_TEST_CHECK_H
#define KILN_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_SKIP_CODE 77

static int check_passed, check_failed, check_skipped;

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

static inline int check_require_testdata(void)
{
    const char *e = getenv("KILN_REQUIRE_TESTDATA");
    return e && strcmp(e, "1") == 0;
}

#define CHECK_SKIP(...)                                                  \
    do {                                                                 \
        if (check_require_testdata()) {                                  \
            check_failed++;                                              \
            fprintf(stderr, "%s:%d: FAIL (KILN_REQUIRE_TESTDATA=1): ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                \
            fputc('\n', stderr);                                         \
        } else {                                                         \
            check_skipped++;                                             \
            printf("SKIP: ");                                            \
            printf(__VA_ARGS__);                                         \
            putchar('\n');                                               \
        }                                                                \
    } while (0)

#define CHECK_SKIP_CPU(...)                                              \
    do {                                                                 \
        check_skipped++;                                                 \
        printf("SKIP (this CPU): ");                                     \
        printf(__VA_ARGS__);                                             \
        putchar('\n');                                                  \
    } while (0)

#define CHECK_DONE()                                                      \
    (printf("%d passed, %d failed, %d skipped\n", check_passed, check_failed, check_skipped), \
     check_failed ? 1 : check_skipped ? CHECK_SKIP_CODE : 0)

/* Reproducible random numbers (xorshift64) for test inputs. */
static inline uint64_t check_xorshift(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

#endif
