/*
 * status.h - errors as values.
 *
 * Every fallible function returns enum kiln_status. The message for the
 * last failure lives in a thread-local buffer, set with kiln_error() and
 * read with kiln_last_error(); messages name the thing and the bad value.
 * KILN_ASSERT is for states that no input can cause.
 */
#ifndef KILN_CORE_STATUS_H
#define KILN_CORE_STATUS_H

#include <stdio.h>
#include <stdlib.h>

#include "kiln/kiln.h"

#if defined(__GNUC__)
#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KILN_PRINTF(a, b)
#endif

/* Record a message for st and return st. */
kiln_status kiln_error(kiln_status st, const char *fmt, ...) KILN_PRINTF(2, 3);
/* Prefix the current message with "prefix: " (for adding context on the way up). */
kiln_status kiln_error_wrap(kiln_status st, const char *fmt, ...) KILN_PRINTF(2, 3);
void kiln_error_clear(void);

#define KILN_ASSERT(cond)                                                           \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "kiln: internal error at %s:%d: %s\n", __FILE__, __LINE__, \
                    #cond);                                                         \
            abort();                                                                \
        }                                                                           \
    } while (0)

#endif
