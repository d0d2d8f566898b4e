/*
 * dataset.c - data sets read from NumPy files for a signature (kiln.h,
 * kiln_dataset_read): what `kiln compile --calibration/--eval`, `kiln gate
 * --eval` and `kiln serve --allow_compression` (a version's
 * assets.extra/kiln_calibration/ folder) read, through one reader.
 *
 * A folder holds `<input>.npy` files, one per signature input, and/or any
 * number of `.npz` archives, each holding one array per input; every source
 * gives every input, and the sources are stacked on dimension 0: the .npy
 * set first, then the archives in name order. The file for input NAME is
 * NAME.npy, or, when NAME holds bytes outside [A-Za-z0-9._-] (e.g.
 * "serving_default_x:0"), the name with each of those bytes replaced by '_'
 * (as `kiln predict` names output files); an archive's member is named
 * either way (a NAME holding '/' only by the replaced name, so that no file
 * outside the folder is read). Other files in the folder are ignored. Every
 * error names the file and the input.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kiln/kiln.h"
#include "kiln/kiln_util.h"

#define ERR_LEN KILN_EVAL_ERR_LEN
#define MAX_ARCHIVES 4096 /* .npz files read from one folder at most */

void kiln_dataset_free(kiln_dataset *d)
{
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        if (d->names) free(d->names[i]);
        if (d->t) kiln_tensor_free(d->t[i]);
    }
    free(d->names);
    free(d->t);
    memset(d, 0, sizeof *d);
}

/* The input's file name in a data folder when NAME has unsafe bytes
 * (with ".npy"). */
static void safe_name(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    for (; name[n] && n + 5 < cap; n++) {
        char c = name[n];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        out[n] = ok ? c : '_';
    }
    memcpy(out + n, ".npy", 5);
}

kiln_status kiln_dataset_check_input(const kiln_tensor *t, const kiln_value_info *vi,
                                     const char *what, char *err)
{
    if (vi->dtype != KILN_DTYPE_UNDEFINED && t->dtype != vi->dtype) {
        snprintf(err, ERR_LEN, "%.250s: input '%.100s' is %s, the signature wants %s", what,
                 vi->name, kiln_dtype_name(t->dtype), kiln_dtype_name(vi->dtype));
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (t->rank < 1) {
        snprintf(err, ERR_LEN,
                 "%.250s: input '%.100s' is a scalar; the first dimension must count samples",
                 what, vi->name);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    if (vi->rank >= 0 && t->rank != vi->rank) {
        snprintf(err, ERR_LEN, "%.250s: input '%.100s' has rank %d, the signature wants %d", what,
                 vi->name, t->rank, vi->rank);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    for (int k = 1; vi->rank >= 0 && k < t->rank; k++) {
        if (vi->dims[k] >= 0 && vi->dims[k] != t->dims[k]) {
            snprintf(err, ERR_LEN,
                     "%.250s: input '%.100s' dimension %d is %lld, the signature wants %lld", what,
                     vi->name, k, (long long)t->dims[k], (long long)vi->dims[k]);
            return KILN_ERR_INVALID_ARGUMENT;
        }
    }
    if (t->dims[0] < 1) {
        snprintf(err, ERR_LEN, "%.250s: input '%.100s' has no samples", what, vi->name);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    return KILN_OK;
}

/* No NaN or infinity in a floating-point tensor (samples on dim 0). */
static kiln_status check_finite(const kiln_tensor *t, const char *what, const char *name,
                                int64_t first_sample, char *err)
{
    int64_t n = kiln_tensor_count(t), re = t->rank > 0 && t->dims[0] > 0 ? n / t->dims[0] : n;
    for (int64_t k = 0; k < n; k++) {
        double v;
        if (t->dtype == KILN_DTYPE_F32) v = ((const float *)t->data)[k];
        else if (t->dtype == KILN_DTYPE_F64) v = ((const double *)t->data)[k];
        else return KILN_OK;
        if (!isfinite(v)) {
            snprintf(err, ERR_LEN,
                     "%.250s: input '%.100s' holds %s at sample %lld; accuracy cannot be "
                     "measured on it",
                     what, name, isnan(v) ? "NaN" : "an infinity",
                     (long long)(first_sample + (re ? k / re : 0)));
            return KILN_ERR_INVALID_ARGUMENT;
        }
    }
    return KILN_OK;
}

kiln_status kiln_dataset_check(const kiln_dataset *d, const char *what, int64_t min_samples,
                               char *err)
{
    if (d->samples < min_samples) {
        snprintf(err, ERR_LEN,
                 "data '%.250s' has %lld samples; at least %lld are needed to measure accuracy",
                 what, (long long)d->samples, (long long)min_samples);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    char w[300];
    snprintf(w, sizeof w, "data '%.250s'", what);
    for (int i = 0; i < d->n; i++) {
        kiln_status st = check_finite(d->t[i], w, d->names[i], 0, err);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

/* Append the rows of *src to d->t[i] (taking src when it is the first),
 * checking that the shapes stack; `what` names src's file. */
static kiln_status stack(kiln_dataset *d, int i, kiln_tensor **src, const char *what, char *err)
{
    kiln_tensor *old = d->t[i], *s = *src;
    if (!old) {
        d->t[i] = s;
        *src = NULL;
        return KILN_OK;
    }
    if (old->dtype != s->dtype || old->rank != s->rank ||
        memcmp(old->dims + 1, s->dims + 1, sizeof(int64_t) * (size_t)(s->rank - 1)) != 0) {
        snprintf(err, ERR_LEN,
                 "%.250s: input '%.100s' has another dtype or shape than in the files before",
                 what, d->names[i]);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    int64_t dims[KILN_MAX_RANK];
    memcpy(dims, old->dims, sizeof dims);
    dims[0] = old->dims[0] + s->dims[0];
    kiln_tensor *grown = NULL;
    kiln_status st = kiln_tensor_create(old->dtype, old->rank, dims, &grown);
    if (st == KILN_OK) st = kiln_tensor_copy_rows(grown, 0, old, 0, old->dims[0]);
    if (st == KILN_OK) st = kiln_tensor_copy_rows(grown, old->dims[0], s, 0, s->dims[0]);
    if (st != KILN_OK) {
        kiln_tensor_free(grown);
        snprintf(err, ERR_LEN, "%.250s: input '%.100s': %s", what, d->names[i],
                 kiln_status_name(st));
        return st;
    }
    kiln_tensor_free(old);
    d->t[i] = grown;
    return KILN_OK;
}

/* One source's tensors, one per input: checked and stacked onto d. */
static kiln_status add_set(kiln_dataset *d, const kiln_signature *sig, kiln_tensor **set,
                           char (*what)[600], unsigned flags, char *err)
{
    kiln_status st = KILN_OK;
    int64_t rows = -1;
    for (int i = 0; i < d->n && st == KILN_OK; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        st = kiln_dataset_check_input(set[i], vi, what[i], err);
        if (st == KILN_OK && rows >= 0 && set[i]->dims[0] != rows) {
            snprintf(err, ERR_LEN, "%.250s: input '%.100s' has %lld samples, input '%.100s' %lld",
                     what[i], vi->name, (long long)set[i]->dims[0], d->names[0], (long long)rows);
            st = KILN_ERR_INVALID_ARGUMENT;
        }
        if (st == KILN_OK) rows = set[i]->dims[0];
        if (st == KILN_OK && (flags & KILN_DATASET_FINITE))
            st = check_finite(set[i], what[i], vi->name, 0, err);
    }
    for (int i = 0; i < d->n && st == KILN_OK; i++) st = stack(d, i, &set[i], what[i], err);
    if (st == KILN_OK) d->samples += rows;
    for (int i = 0; i < d->n; i++) {
        kiln_tensor_free(set[i]);
        set[i] = NULL;
    }
    return st;
}

/* An .npz archive: one member per input. */
static kiln_status add_npz(kiln_dataset *d, const kiln_signature *sig, const char *path,
                           kiln_tensor **set, char (*what)[600], unsigned flags, char *err)
{
    kiln_npz *z = NULL;
    char zerr[KILN_NPZ_ERR_LEN];
    kiln_status st = kiln_npz_read(path, &z, zerr);
    if (st != KILN_OK) {
        snprintf(err, ERR_LEN, "%.500s", zerr);
        return st;
    }
    for (int i = 0; i < d->n && st == KILN_OK; i++) {
        const char *name = d->names[i];
        char file[1024];
        safe_name(name, file, sizeof file);
        file[strlen(file) - 4] = '\0'; /* without ".npy", as members are named */
        int found = -1;
        for (int k = 0; k < z->n && found < 0; k++)
            if (strcmp(z->names[k], name) == 0) found = k;
        for (int k = 0; k < z->n && found < 0; k++)
            if (strcmp(z->names[k], file) == 0) found = k;
        if (found < 0) {
            snprintf(err, ERR_LEN, "data '%.250s' has no array '%.100s' for input '%.100s'", path,
                     file, name);
            st = KILN_ERR_NOT_FOUND;
            break;
        }
        set[i] = z->tensors[found]; /* moved */
        z->tensors[found] = NULL;
        snprintf(what[i], sizeof what[i], "%.500s[%.80s]", path, z->names[found]);
    }
    kiln_npz_free(z);
    if (st == KILN_OK) return add_set(d, sig, set, what, flags, err);
    for (int i = 0; i < d->n; i++) {
        kiln_tensor_free(set[i]);
        set[i] = NULL;
    }
    return st;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static kiln_status read_folder(kiln_dataset *d, const kiln_signature *sig, const char *dir,
                               kiln_tensor **set, char (*what)[600], unsigned flags, char *err)
{
    /* the .npy set: a file for every input, or for none */
    int have = 0, missing = -1;
    char missing_file[1024] = "";
    for (int i = 0; i < d->n; i++) {
        const char *name = d->names[i];
        char file[1024];
        struct stat sb;
        snprintf(what[i], sizeof what[i], "%.400s/%.190s.npy", dir, name);
        if (strchr(name, '/') || stat(what[i], &sb) != 0) { /* never outside the folder */
            safe_name(name, file, sizeof file);
            snprintf(what[i], sizeof what[i], "%.400s/%.190s", dir, file);
        }
        if (stat(what[i], &sb) == 0 && S_ISREG(sb.st_mode)) {
            have++;
        } else if (missing < 0) {
            missing = i;
            safe_name(name, missing_file, sizeof missing_file);
        }
    }
    /* the .npz archives, in name order */
    DIR *dh = opendir(dir);
    if (!dh) {
        snprintf(err, ERR_LEN, "cannot read data folder '%.400s'", dir);
        return KILN_ERR_IO;
    }
    char **arch = NULL;
    int n_arch = 0, cap = 0;
    kiln_status st = KILN_OK;
    for (struct dirent *e; st == KILN_OK && (e = readdir(dh));) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".npz")) continue;
        if (n_arch == MAX_ARCHIVES) {
            snprintf(err, ERR_LEN, "data folder '%.400s' holds more than %d .npz files", dir,
                     MAX_ARCHIVES);
            st = KILN_ERR_INVALID_ARGUMENT;
            break;
        }
        if (n_arch == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(arch, (size_t)cap * sizeof *arch);
            if (!grown) {
                st = KILN_ERR_OUT_OF_MEMORY;
                break;
            }
            arch = grown;
        }
        if (!(arch[n_arch] = strdup(e->d_name))) st = KILN_ERR_OUT_OF_MEMORY;
        else n_arch++;
    }
    closedir(dh);
    if (st == KILN_ERR_OUT_OF_MEMORY) snprintf(err, ERR_LEN, "out of memory");
    if (st == KILN_OK && have > 0 && missing >= 0) {
        snprintf(err, ERR_LEN, "data folder '%.250s' has no %.120s for input '%.100s'", dir,
                 missing_file, d->names[missing]);
        st = KILN_ERR_NOT_FOUND;
    }
    if (st == KILN_OK && have == 0 && n_arch == 0) {
        snprintf(err, ERR_LEN,
                 "data folder '%.200s' has no %.120s for input '%.100s' and no .npz files", dir,
                 missing_file, missing >= 0 ? d->names[missing] : "");
        st = KILN_ERR_NOT_FOUND;
    }
    if (st == KILN_OK && have > 0) {
        for (int i = 0; i < d->n && st == KILN_OK; i++) {
            if (kiln_npy_read(what[i], &set[i]) != KILN_OK) {
                snprintf(err, ERR_LEN, "input '%.100s': %.380s", d->names[i],
                         kiln_npy_last_error());
                st = KILN_ERR_INVALID_ARGUMENT;
            }
        }
        if (st == KILN_OK) {
            st = add_set(d, sig, set, what, flags, err);
        } else {
            for (int i = 0; i < d->n; i++) {
                kiln_tensor_free(set[i]);
                set[i] = NULL;
            }
        }
    }
    if (n_arch > 1) qsort(arch, (size_t)n_arch, sizeof *arch, by_name);
    for (int k = 0; k < n_arch && st == KILN_OK; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%.2000s/%.1000s", dir, arch[k]);
        st = add_npz(d, sig, path, set, what, flags, err);
    }
    for (int k = 0; k < n_arch; k++) free(arch[k]);
    free(arch);
    return st;
}

kiln_status kiln_dataset_read(const char *path, const kiln_signature *sig, unsigned flags,
                              kiln_dataset *d, char *err)
{
    memset(d, 0, sizeof *d);
    int n = kiln_signature_input_count(sig);
    if (n <= 0) {
        snprintf(err, ERR_LEN, "the signature has no inputs to feed from '%.300s'", path);
        return KILN_ERR_INVALID_ARGUMENT;
    }
    d->names = calloc((size_t)n, sizeof *d->names);
    d->t = calloc((size_t)n, sizeof *d->t);
    kiln_tensor **set = calloc((size_t)n, sizeof *set);
    char(*what)[600] = calloc((size_t)n, sizeof *what);
    kiln_status st = KILN_OK;
    if (!d->names || !d->t || !set || !what) st = KILN_ERR_OUT_OF_MEMORY;
    if (st == KILN_OK) d->n = n;
    for (int i = 0; i < n && st == KILN_OK; i++)
        if (!(d->names[i] = strdup(kiln_signature_input(sig, i)->name))) st = KILN_ERR_OUT_OF_MEMORY;
    if (st != KILN_OK) {
        snprintf(err, ERR_LEN, "out of memory");
    } else {
        struct stat sb;
        if (stat(path, &sb) != 0) {
            snprintf(err, ERR_LEN, "data '%.300s' does not exist", path);
            st = KILN_ERR_NOT_FOUND;
        } else if (S_ISDIR(sb.st_mode)) {
            st = read_folder(d, sig, path, set, what, flags, err);
        } else if (ends_with(path, ".npz")) {
            st = add_npz(d, sig, path, set, what, flags, err);
        } else {
            snprintf(err, ERR_LEN, "data '%.300s' is neither a folder nor an .npz file", path);
            st = KILN_ERR_INVALID_ARGUMENT;
        }
    }
    free(set);
    free(what);
    if (st != KILN_OK) kiln_dataset_free(d);
    return st;
}
