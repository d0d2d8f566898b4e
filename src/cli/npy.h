/*
 * npy.h - the NumPy .npy reader and writer functions are the library's (src/core/npy.c, declared with
 * KILN_API in include/kiln/kiln_util.h, where their contract is written):
 * the CLI, the server and the fuzz targets share them with kiln_dataset_read.
 */
#ifndef KILN_CLI_NPY_H
#define KILN_CLI_NPY_H

#include "kiln/kiln_util.h"

#endif
