/*
 * npz.h - the NumPy .npz reader functions are the library's (src/core/npz.c, declared with
 * KILN_API in include/kiln/kiln_util.h, where their contract is written):
 * the CLI, the server and the fuzz targets share them with kiln_dataset_read.
 */
#ifndef KILN_CLI_NPZ_H
#define KILN_CLI_NPZ_H

#include "kiln/kiln_util.h"

#endif
