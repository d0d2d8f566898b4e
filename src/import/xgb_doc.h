/*
 * xgb_doc.h - a small document tree for XGBoost's model files: JSON and
 * UBJSON (Universal Binary JSON, big-endian) parsed into the same values.
 * Internal to src/import/ (xgboost.c reads it).
 *
 * Arrays whose elements are all numbers (or booleans) are kept as one
 * double array, so a model's node arrays cost 8 bytes an element. Every
 * allocation lives in one arena freed with the document. Parsing checks
 * every length against the bytes left and bounds nesting, so malformed
 * input is an error value, never a crash.
 */
#ifndef KILN_IMPORT_XGB_DOC_H
#define KILN_IMPORT_XGB_DOC_H

#include <stddef.h>

#include "ir/graph.h"

enum xd_type { XD_NULL = 0, XD_BOOL, XD_NUM, XD_STR, XD_ARR, XD_NUMS, XD_OBJ };

struct xd {
    enum xd_type t;
    double num;            /* BOOL (0 / 1) and NUM */
    const char *s;         /* STR: NUL-terminated (may hold NULs; see len) */
    size_t len;            /* STR bytes; ARR / NUMS / OBJ element count */
    struct xd *items;      /* ARR and OBJ values */
    const char **keys;     /* OBJ keys, NUL-terminated */
    double *nums;          /* NUMS */
};

struct xd_doc {
    struct kiln_arena arena;
    struct xd root;
};

/* Parse JSON (ubj = 0) or UBJSON (ubj = 1). On error the message says where. */
kiln_status xd_parse(const void *data, size_t size, int ubj, struct xd_doc *doc);
void xd_free(struct xd_doc *doc);

/* Object member or NULL. */
const struct xd *xd_get(const struct xd *obj, const char *key);
/* Element count of an array (ARR or NUMS), or -1 if v is not an array. */
long long xd_count(const struct xd *v);
/* Number i of an array, or of a one-element ARR of numbers; 0 on failure (*ok = 0). */
double xd_num_at(const struct xd *v, size_t i, int *ok);

#endif
