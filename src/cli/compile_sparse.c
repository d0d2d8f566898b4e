/*
 * compile_sparse.c - the sparse part of `kiln compile`'s report: which
 * nodes of the compiled session run on sparse kernels (found by profiling
 * one batch-1 run of zeros through the public API, as `kiln inspect` names
 * kernels), and what --prune did. The kernels choose themselves per node by
 * timing (src/kernels/sparse/sparse.h); this file only reports the choice.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/compile.h"
#include "cli/json_out.h"

static int add(kiln_compile_sparse *sp, const char *node, const char *kernel)
{
    char **n = realloc(sp->node, sizeof *n * (size_t)(sp->n + 1));
    if (!n) return 0;
    sp->node = n;
    char **k = realloc(sp->kernel, sizeof *k * (size_t)(sp->n + 1));
    if (!k) return 0;
    sp->kernel = k;
    sp->node[sp->n] = strdup(node);
    sp->kernel[sp->n] = strdup(kernel);
    sp->n++;
    return sp->node[sp->n - 1] && sp->kernel[sp->n - 1];
}

kiln_status kiln_compile_sparse_nodes(kiln_session *s, const kiln_signature *sig,
                                      kiln_compile_sparse *sp, char *err)
{
    int n_in = kiln_signature_input_count(sig);
    kiln_named_tensor *in = calloc((size_t)(n_in > 0 ? n_in : 1), sizeof *in);
    kiln_outputs *out = NULL;
    kiln_profile *prof = NULL;
    kiln_status st = in ? KILN_OK : KILN_ERR_OUT_OF_MEMORY;
    for (int i = 0; st == KILN_OK && i < n_in; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        int64_t dims[KILN_MAX_RANK];
        int rank = vi->rank > 0 ? vi->rank : 0;
        for (int d = 0; d < rank; d++) dims[d] = vi->dims[d] > 0 ? vi->dims[d] : 1;
        kiln_tensor *t = NULL;
        st = kiln_tensor_create(vi->dtype, rank, dims, &t);
        in[i] = (kiln_named_tensor){vi->name, t};
    }
    if (st == KILN_OK) st = kiln_session_profile_enable(s, 1);
    if (st == KILN_OK) st = kiln_session_profile_reset(s);
    if (st == KILN_OK) st = kiln_session_run(s, in, n_in, &out);
    if (st == KILN_OK) st = kiln_session_profile_get(s, &prof);
    if (st != KILN_OK)
        snprintf(err, KILN_GATE_ERR_LEN, "finding the sparse nodes (a batch-1 run of zeros): %.400s",
                 kiln_last_error());
    for (int i = 0; st == KILN_OK && i < kiln_profile_step_count(prof); i++) {
        const kiln_profile_entry *e = kiln_profile_step(prof, i);
        if (!e->kernel || strncmp(e->kernel, "sparse_", 7)) continue;
        if (!add(sp, e->node && e->node[0] ? e->node : "(unnamed)", e->kernel)) {
            snprintf(err, KILN_GATE_ERR_LEN, "out of memory");
            st = KILN_ERR_OUT_OF_MEMORY;
        }
    }
    if (prof) kiln_session_profile_enable(s, 0);
    kiln_profile_free(prof);
    kiln_outputs_free(out);
    for (int i = 0; in && i < n_in; i++) kiln_tensor_free((kiln_tensor *)in[i].tensor);
    free(in);
    return st;
}

void kiln_compile_sparse_free(kiln_compile_sparse *sp)
{
    for (int i = 0; i < sp->n; i++) {
        free(sp->node[i]);
        free(sp->kernel[i]);
    }
    free(sp->node);
    free(sp->kernel);
    sp->node = sp->kernel = NULL;
    sp->n = 0;
}

void kiln_compile_sparse_print(const kiln_compile_sparse *sp, FILE *f)
{
    if (sp->prune_ratio > 0)
        fprintf(f, "\npruned:      %.4g%% of each weight by magnitude (%s), one shot: %lld layers, "
                   "%lld of %lld weights zero\n",
                100 * sp->prune_ratio, sp->prune_block == 4 ? "1x4 blocks" : "single weights",
                (long long)sp->prune.layers, (long long)sp->prune.zeroed, (long long)sp->prune.weights);
    fprintf(f, "%ssparse:      %s", sp->prune_ratio > 0 ? "" : "\n", sp->mode);
    if (!strcmp(sp->mode, "off")) {
        fputs(" (dense kernels only)\n", f);
        return;
    }
    fprintf(f, ", %d node%s on sparse kernels in a batch-1 plan (chosen per node by timing)\n", sp->n,
            sp->n == 1 ? "" : "s");
    for (int i = 0; i < sp->n; i++) {
        fputs("  ", f);
        kiln_text_write(f, sp->node[i]);
        fputs("  ", f);
        kiln_text_write(f, sp->kernel[i]);
        fputc('\n', f);
    }
}

void kiln_compile_sparse_json(const kiln_compile_sparse *sp, FILE *f)
{
    fputs("{\"mode\":", f);
    kiln_json_write_string(f, sp->mode);
    fputs(",\"prune\":", f);
    if (sp->prune_ratio > 0)
        fprintf(f, "{\"ratio\":%.17g,\"block\":%d,\"scope\":\"per layer\",\"layers\":%lld,"
                   "\"weights\":%lld,\"zeroed\":%lld}",
                sp->prune_ratio, sp->prune_block, (long long)sp->prune.layers,
                (long long)sp->prune.weights, (long long)sp->prune.zeroed);
    else
        fputs("null", f);
    fputs(",\"nodes\":[", f);
    for (int i = 0; i < sp->n; i++) {
        fputs(i ? ",{\"node\":" : "{\"node\":", f);
        kiln_json_write_string(f, sp->node[i]);
        fputs(",\"kernel\":", f);
        kiln_json_write_string(f, sp->kernel[i]);
        fputc('}', f);
    }
    fputs("]}", f);
}
