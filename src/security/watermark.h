/*
 * watermark.h - a keyed spread-spectrum watermark in an ONNX model's float
 * weights (watermark.c; docs/WATERMARK.md specifies it).
 *
 * `kiln watermark embed` (src/cli/cmd_watermark.c) writes a copy of an ONNX
 * file whose float32 initializers carry a message of 8..64 bits derived
 * from a secret key file and a label (dither modulation, see watermark.c); `kiln watermark verify` reads it back
 * from the weights alone (no original needed) and says how many bits agree
 * and how unlikely that is for an unmarked model; kiln_wm_verify_tensors
 * reads it from a loaded model's constants (.kiln files, SavedModels). The file's bytes are
 * edited in place (the weights' sizes do not change), so everything else in
 * the file stays byte for byte as it was. Nothing a file contains makes
 * these functions abort: errors are a kiln_status and a message in err
 * (KILN_SEC_ERR_LEN bytes).
 */
#ifndef KILN_SECURITY_WATERMARK_H
#define KILN_SECURITY_WATERMARK_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#define KILN_WM_MAX_BITS 64
#define KILN_WM_MIN_TENSOR 256      /* float32 elements a tensor needs to carry the mark */
#define KILN_WM_MIN_PER_BIT 16      /* carrying elements needed per message bit */
#define KILN_WM_MAX_TENSORS 65536

/* What embedding or verifying found. */
typedef struct kiln_wm_report {
    int bits;                       /* message length */
    int matched;                    /* bits read back equal to the expected message */
    int tensors;                    /* initializers carrying the mark */
    size_t elements;                /* weights carrying the mark */
    uint64_t message;               /* the expected message (bit k = bit k of the key's hash) */
    uint64_t decoded;               /* the message read from the weights */
    double bit_z[KILN_WM_MAX_BITS]; /* per bit: score / its null standard deviation (> 0: 1) */
    double z;                       /* sum over bits of sign * bit_z / sqrt(bits) */
    double p_value;                 /* P(Z >= z) for an unmarked model, N(0,1) */
    double mean_rel_change;         /* embed: mean |w' - w| / 2^floor(log2(max |w|)) */
    double max_rel_change;          /* embed: largest such change (at most step / 2) */
} kiln_wm_report;

/* Derive the 256-bit watermark key from a key file's bytes (16 bytes at least). */
kiln_status kiln_wm_derive_key(const uint8_t *file, size_t len, uint8_t key[32], char *err);

/* Embed the mark for (key, label) into the ONNX bytes in place. step is the
 * lattice step relative to each tensor's magnitude (the CLI default is 0.01):
 * weights move by at most step/2 of 2^floor(log2(max |w|)). */
kiln_status kiln_wm_embed(uint8_t *onnx, size_t len, const uint8_t key[32], const char *label,
                          int bits, double step, kiln_wm_report *rep, char *err);

/* Read the mark for (key, label) from the ONNX bytes. */
kiln_status kiln_wm_verify(const uint8_t *onnx, size_t len, const uint8_t key[32],
                           const char *label, int bits, double step, kiln_wm_report *rep,
                           char *err);

/* Read the mark for (key, label) from float32 tensors given in order (a
 * loaded model's constants: kiln_model_constant): data[t] holds count[t]
 * floats; tensors of fewer than KILN_WM_MIN_TENSOR elements and NULL ones are
 * skipped, the rest are the carrying weights as an ONNX file's initializers
 * are. The tensors are only read. */
kiln_status kiln_wm_verify_tensors(const float *const *data, const size_t *count, int n,
                                   const uint8_t key[32], const char *label, int bits, double step,
                                   kiln_wm_report *rep, char *err);

#endif
