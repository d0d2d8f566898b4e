/*
 * kiln_artifact.h - the compiled-artifact file format (.kiln) shared by its
 * writer (src/api/artifact.c, behind kiln_session_save) and its reader
 * (src/import/kiln_artifact.c, behind kiln_model_load).
 *
 * A .kiln file is one optimized graph with its signature, its weights, the
 * precision its sessions run in, the CPU features its kernels need, the
 * batch sizes to precompile and a compile report, laid out as a 64-byte
 * header, a section table and 64-byte aligned sections, each with a CRC-32C.
 * The byte layout is documented in docs/KILN_FORMAT.md; the constants below
 * are its facts.
 */
#ifndef KILN_IMPORT_KILN_ARTIFACT_H
#define KILN_IMPORT_KILN_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/fileio.h"
#include "import/model.h"

#define KILN_ART_MAGIC "\x89KILN\r\n\x1a" /* 8 bytes: bit 7 set, CR LF, ^Z */
#define KILN_ART_MAGIC_LEN 8
#define KILN_ART_FORMAT_VERSION 3u     /* what the writer writes: 2 added s8 weights and SPRS,
                                          3 the deflated graph (GRPZ) */
#define KILN_ART_FORMAT_VERSION_MIN 1u /* the oldest version the reader reads */
#define KILN_ART_HEADER_BYTES 64
#define KILN_ART_ALIGN 64
#define KILN_ART_MAX_SECTIONS 64
#define KILN_ART_NULL_STR 0xffffffffu /* a string length meaning "no string" */

/* Section kinds, four ASCII bytes read as a little-endian u32. */
#define KILN_ART_FOURCC(a, b, c, d) \
    ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define KILN_ART_SEC_META KILN_ART_FOURCC('M', 'E', 'T', 'A') /* versions, precision, CPU, batches */
#define KILN_ART_SEC_SIGN KILN_ART_FOURCC('S', 'I', 'G', 'N') /* the signature */
#define KILN_ART_SEC_GRPH KILN_ART_FOURCC('G', 'R', 'P', 'H') /* the optimized graph */
#define KILN_ART_SEC_WGHT KILN_ART_FOURCC('W', 'G', 'H', 'T') /* tensor bytes, 64-aligned */
#define KILN_ART_SEC_REPT KILN_ART_FOURCC('R', 'E', 'P', 'T') /* compile report, verbatim */
#define KILN_ART_SEC_PACK KILN_ART_FOURCC('P', 'A', 'C', 'K') /* weights packed for the kernels */
#define KILN_ART_SEC_SPRS KILN_ART_FOURCC('S', 'P', 'R', 'S') /* sparse kernel choices (v2) */
#define KILN_ART_SEC_GRPZ KILN_ART_FOURCC('G', 'R', 'P', 'Z') /* GRPH deflated by zlib (v3) */
#define KILN_ART_GRPZ_MAX ((uint64_t)1 << 30) /* the largest inflated graph a reader accepts */

/* What a loaded artifact says about itself (kept with the model for
 * `kiln inspect` and kiln_model_compile_report). */
struct kiln_artifact_info {
    uint32_t format_version;
    char kiln_version[17];        /* the Kiln that wrote it */
    int precision;                /* kiln_precision its sessions run in */
    char *cpu_features;           /* comma-separated, "" for none */
    char *source_format;          /* format of the model it was compiled from */
    int n_batch_sizes;
    int64_t *batch_sizes;
    char *report;                 /* compile report JSON (NUL-terminated), or NULL */
    int n_sections;
    struct { uint32_t kind; uint64_t offset, size; } sections[KILN_ART_MAX_SECTIONS];
    uint64_t file_size;
    /* PACK: weights as the kernels packed them (bytes in WGHT), valid where
     * the packing environment (kiln_weight_cache_pack_env) is pack_env */
    char *pack_env;
    int n_packs;
    struct kiln_artifact_pack { const kiln_tensor *key; char *tag; const void *data; uint64_t bytes; } *packs;
    /* SPRS: the sparse kernels' timed choices (the weight cache's "sparse_choice:..."
     * slots: 0 dense, 1 or 4 sparse with that block), put in the weight cache at load */
    int n_sparse;
    struct kiln_artifact_sparse { const kiln_tensor *key; char *tag; int choice; } *sparse;
};

/* Whether a weight-cache tag is a sparse kernel's decision slot (an int: 0 dense,
 * 1 or 4 sparse with that block), as SPRS keeps them: "sparse_choice:..."
 * (MatMul, Gemm) or "sparse_conv_choice:..." (1x1 convolutions). */
static inline int kiln_artifact_sparse_choice_tag(const char *tag)
{
    return !strncmp(tag, "sparse_choice:", 14) || !strncmp(tag, "sparse_conv_choice:", 19);
}

/* Whether bytes begin with the .kiln magic. */
int kiln_artifact_detect(const void *data, size_t size);
/* Read an artifact whose bytes are `map` (64-byte aligned; kept by the model,
 * which uses fp32 weights in place; consumed either way) into m. `name` is the
 * file name errors begin with. Checks the CPU this runs on against the
 * features the file needs. */
kiln_status kiln_artifact_load(struct kiln_file_map *map, const char *name, struct kiln_model *m);
void kiln_artifact_info_free(struct kiln_artifact_info *info);
/* The CPU features (comma-separated) the kernels of a graph need in a
 * precision: what its blocked layouts and low-precision kernels use. */
void kiln_artifact_cpu_features(const struct kiln_graph *g, int precision, char *buf, size_t n);
/* Whether this CPU has a feature named as in the file ("avx512f", ...):
 * 1 yes, 0 no, -1 a name Kiln does not know. */
int kiln_artifact_cpu_has(const char *feature);

#endif
