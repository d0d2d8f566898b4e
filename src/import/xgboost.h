/*
 * xgboost.h - loading XGBoost's save_model files (JSON and UBJSON) as a
 * Kiln model (xgboost.c; docs/TABULAR.md).
 */
#ifndef KILN_IMPORT_XGBOOST_H
#define KILN_IMPORT_XGBOOST_H

#include <stddef.h>

struct kiln_model;

/* 0: not an XGBoost model file; 1: JSON; 2: UBJSON (by the first bytes). */
int kiln_xgboost_sniff(const void *data, size_t size);
/* Parse the bytes (not kept) into m: one signature, input "features"
 * [N, num_feature] float, output "predictions". */
kiln_status kiln_xgboost_load(const void *data, size_t size, struct kiln_model *m);

#endif
