/*
 * status.c - thread-local error messages and status names.
 */
#include "core/status.h"

#include <stdarg.h>
#include <string.h>

#define KILN_ERROR_MAX 1024

static _Thread_local char error_buf[KILN_ERROR_MAX];

/* Names in messages come from untrusted files: keep the message one line. */
static void sanitize(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) *s = '?';
}

kiln_status kiln_error(kiln_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_buf, sizeof error_buf, fmt, ap);
    va_end(ap);
    sanitize(error_buf);
    return st;
}

kiln_status kiln_error_wrap(kiln_status st, const char *fmt, ...)
{
    char old[KILN_ERROR_MAX];
    va_list ap;
    memcpy(old, error_buf, sizeof old);
    va_start(ap, fmt);
    int k = vsnprintf(error_buf, sizeof error_buf, fmt, ap);
    va_end(ap);
    if (k < 0) k = 0;
    size_t used = (size_t)k < sizeof error_buf ? (size_t)k : sizeof error_buf - 1;
    size_t room = sizeof error_buf - used;
    if (room > 2) {
        memcpy(error_buf + used, ": ", 2);
        size_t n = strnlen(old, room - 3);
        memcpy(error_buf + used + 2, old, n);
        error_buf[used + 2 + n] = '\0';
    }
    sanitize(error_buf);
    return st;
}

void kiln_error_clear(void) { error_buf[0] = '\0'; }

const char *kiln_last_error(void) { return error_buf; }

const char *kiln_status_name(kiln_status st)
{
    switch (st) {
    case KILN_OK: return "OK";
    case KILN_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case KILN_ERR_INVALID_MODEL: return "INVALID_MODEL";
    case KILN_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case KILN_ERR_NOT_FOUND: return "NOT_FOUND";
    case KILN_ERR_IO: return "IO";
    case KILN_ERR_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
    case KILN_ERR_RUNTIME: return "RUNTIME";
    case KILN_ERR_INTERNAL: return "INTERNAL";
    case KILN_ERR_DEADLINE: return "DEADLINE_EXCEEDED";
    }
    return "UNKNOWN";
}

const char *kiln_version(void) { return KILN_VERSION_STRING; }
