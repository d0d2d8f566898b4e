/*
 * containers.h - sequence and optional outputs on the serving APIs.
 *
 * TF Serving's REST and gRPC APIs and KServe v2 carry tensors only. A model
 * whose signature output is an ONNX sequence or optional (docs/SEQUENCES.md)
 * is answered with that output flattened into tensors, the same way on every
 * API: a sequence NAME of n items becomes the tensors NAME/0 ... NAME/n-1 (a
 * sequence inside a sequence NAME/i/j), an optional NAME holding a value
 * becomes NAME (or its items, if it holds a sequence), and an empty optional
 * or an empty sequence contributes nothing. Everything downstream of the run
 * (encoders, monitors, the shadow, the request log) sees tensors only.
 */
#ifndef KILN_SERVE_CONTAINERS_H
#define KILN_SERVE_CONTAINERS_H

#include "kiln/kiln.h"
#include "serve/batch.h"

/* The index of the first sequence or optional output of sig, or -1. */
int kiln_serve_container_output(const kiln_signature *sig);

/* Move o's outputs into out (names and tensors owned by out), flattening
 * containers as above. o is left with its outputs taken; the caller frees it.
 * On failure (out of memory, an output name too long, nesting too deep) out is
 * freed and err names the output. */
kiln_status kiln_serve_take_outputs(kiln_outputs *o, kiln_batch_result *out, char *err,
                                    size_t err_len);

#endif
