/*
 * compile_report.c - the measurements behind `kiln compile` (compile.h) and
 * its accuracy report: every output of a session over a data set, the
 * error of a compressed session against fp32 per output (top-1 agreement,
 * absolute and relative error, SQNR), the nodes that have bf16 or int8
 * kernels (found by profiling one batch), each node's sensitivity (the
 * outputs' SQNR with that node alone in the low precision, on the
 * calibration data), and the report itself as a table and as JSON.
 *
 * The policy that uses these (which nodes fall back in `auto`) and the
 * command's flags are in cmd_compile.c. Definitions: compile.h and
 * docs/COMPRESSION.md.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/compile.h"
#include "cli/json_out.h"

#define REL_FLOOR 1e-6

void kiln_compile_out_compare(const kiln_gate_output *b, const kiln_gate_output *c,
                              kiln_compile_out_stats *st)
{
    int64_t n = b->samples * b->row_size;
    double sa = 0, sr = 0, sig = 0, noise = 0, ma = 0, mr = 0;
    for (int64_t k = 0; k < n; k++) {
        double d = fabs(c->v[k] - b->v[k]);
        double r = d / fmax(fabs(b->v[k]), REL_FLOOR);
        if (isnan(c->v[k]) != isnan(b->v[k])) d = r = NAN;
        else if (isnan(d)) d = r = 0; /* NaN in both: the same */
        sa += d;
        sr += r;
        ma = d > ma || isnan(d) ? d : ma;
        mr = r > mr || isnan(r) ? r : mr;
        if (!isnan(b->v[k])) sig += b->v[k] * b->v[k];
        noise += d * d;
    }
    st->samples = b->samples;
    st->row_size = b->row_size;
    st->max_abs = ma;
    st->max_rel = mr;
    st->mean_abs = n ? sa / (double)n : 0;
    st->mean_rel = n ? sr / (double)n : 0;
    st->sqnr_db = noise > 0 ? 10 * log10(sig / noise) : isnan(noise) ? NAN : INFINITY;
    st->has_agreement = b->is_int ? b->row_size == 1 : b->row_size > 1;
    st->agreement = 0;
    if (st->has_agreement) {
        int64_t same = 0;
        for (int64_t i = 0; i < b->samples; i++) same += kiln_gate_top1(b, i) == kiln_gate_top1(c, i);
        st->agreement = b->samples ? (double)same / (double)b->samples : 1;
    }
}

/* A number, or null when it is not finite (JSON has no infinity). */
static void jnum(FILE *f, double v)
{
    if (isfinite(v)) fprintf(f, "%.17g", v);
    else fputs("null", f);
}

static void jkey(FILE *f, int *first, const char *key)
{
    fputs(*first ? "" : ",", f);
    *first = 0;
    kiln_json_write_string(f, key);
    fputc(':', f);
}

static void jstr_or_null(FILE *f, const char *s)
{
    if (s) kiln_json_write_string(f, s);
    else fputs("null", f);
}

char *kiln_compile_report_json(const kiln_compile_report *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    int first = 1;
    fputc('{', f);
    jkey(f, &first, "kiln_version");
    kiln_json_write_string(f, kiln_version());
    jkey(f, &first, "model");
    kiln_json_write_string(f, r->model);
    jkey(f, &first, "signature");
    kiln_json_write_string(f, r->signature);
    jkey(f, &first, "precision_asked");
    kiln_json_write_string(f, r->precision_asked);
    jkey(f, &first, "precision");
    kiln_json_write_string(f, kiln_precision_name(r->precision));
    jkey(f, &first, "max_drop");
    jnum(f, r->max_drop);
    jkey(f, &first, "calibration");
    if (r->cal_static)
        fprintf(f, "{\"method\":\"%s\",\"note\":\"static int8: activation ranges fixed from the "
                   "calibration data\",\"data\":", r->cal_static);
    else
        fprintf(f, "{\"method\":\"dynamic\",\"note\":\"int8 activation ranges are measured on every "
                   "run; calibration data measures node sensitivity\",\"data\":");
    jstr_or_null(f, r->cal_path);
    fprintf(f, ",\"samples\":%lld}", (long long)r->cal_samples);
    jkey(f, &first, "eval");
    fputs("{\"data\":", f);
    jstr_or_null(f, r->eval_path);
    fputs(",\"labels\":", f);
    jstr_or_null(f, r->labels_path);
    fprintf(f, ",\"samples\":%lld}", (long long)r->eval_samples);
    jkey(f, &first, "metric");
    if (!r->has_quality) {
        fputs("null", f);
    } else {
        const kiln_gate_quality *q = &r->q;
        fputs("{\"output\":", f);
        kiln_json_write_string(f, r->metric_output);
        fputs(",\"name\":", f);
        jstr_or_null(f, q->has_labels ? q->metric : NULL);
        fputs(",\"fp32\":", f);
        if (q->has_labels) jnum(f, q->base_metric);
        else fputs("null", f);
        fputs(",\"compressed\":", f);
        if (q->has_labels) jnum(f, q->cand_metric);
        else fputs("null", f);
        fputs(",\"drop_of\":", f);
        kiln_json_write_string(f, q->drop_of);
        fputs(",\"drop\":", f);
        jnum(f, q->drop);
        fputc('}', f);
    }
    jkey(f, &first, "outputs");
    fputc('[', f);
    for (int i = 0; i < r->n_outputs; i++) {
        const kiln_compile_out_stats *o = &r->outs[i];
        fputs(i ? ",{\"name\":" : "{\"name\":", f);
        kiln_json_write_string(f, o->name);
        fprintf(f, ",\"samples\":%lld,\"row_size\":%lld,\"top1_agreement\":", (long long)o->samples,
                (long long)o->row_size);
        if (o->has_agreement) jnum(f, o->agreement);
        else fputs("null", f);
        fputs(",\"max_abs_error\":", f);
        jnum(f, o->max_abs);
        fputs(",\"mean_abs_error\":", f);
        jnum(f, o->mean_abs);
        fputs(",\"max_rel_error\":", f);
        jnum(f, o->max_rel);
        fputs(",\"mean_rel_error\":", f);
        jnum(f, o->mean_rel);
        fputs(",\"sqnr_db\":", f);
        jnum(f, o->sqnr_db);
        fputs(",\"identical\":", f);
        fputs(o->sqnr_db == INFINITY ? "true}" : "false}", f);
    }
    fputc(']', f);
    jkey(f, &first, "nodes");
    fputc('[', f);
    for (int i = 0; i < r->n_nodes; i++) {
        const kiln_compile_node *n = &r->nodes[i];
        fputs(i ? ",{\"name\":" : "{\"name\":", f);
        kiln_json_write_string(f, n->name);
        fputs(",\"op\":", f);
        kiln_json_write_string(f, n->op);
        fprintf(f, ",\"weight_elements\":%lld,\"kernels\":[", (long long)n->weight_elems);
        int k = 0;
        for (int p = KILN_PRECISION_BF16; p <= KILN_PRECISION_INT8; p++)
            if (n->kernel_in[p]) fprintf(f, "%s\"%s\"", k++ ? "," : "", kiln_precision_name(p));
        fputs("],\"sqnr_db\":", f);
        if (n->measured) jnum(f, n->sqnr_db);
        else fputs("null", f);
        fputs(",\"sqnr_measured_in\":", f);
        jstr_or_null(f, n->measured ? kiln_precision_name(n->measured_in) : NULL);
        fputs(",\"precision\":", f);
        kiln_json_write_string(f, kiln_precision_name(kiln_compile_node_effective(n)));
        fprintf(f, ",\"fell_back\":%s,\"reason\":", n->fell_back ? "true" : "false");
        jstr_or_null(f, n->fell_back ? n->reason : NULL);
        fputc('}', f);
    }
    fputc(']', f);
    jkey(f, &first, "fallbacks");
    fputc('[', f);
    for (int i = 0, k = 0; i < r->n_nodes; i++) {
        const kiln_compile_node *n = &r->nodes[i];
        if (!n->fell_back) continue;
        fputs(k++ ? ",{\"node\":" : "{\"node\":", f);
        kiln_json_write_string(f, n->name);
        fputs(",\"precision\":", f);
        kiln_json_write_string(f, kiln_precision_name(kiln_compile_node_effective(n)));
        fputs(",\"reason\":", f);
        kiln_json_write_string(f, n->reason);
        fputc('}', f);
    }
    fputc(']', f);
    jkey(f, &first, "size");
    fprintf(f, "{\"fp32_weight_bytes\":%lld,\"compressed_weight_bytes\":%lld,\"ratio\":",
            (long long)r->fp32_weight_bytes, (long long)r->compressed_weight_bytes);
    jnum(f, r->fp32_weight_bytes ? (double)r->compressed_weight_bytes / (double)r->fp32_weight_bytes
                                 : 1.0);
    fputc('}', f);
    jkey(f, &first, "latency");
    fputc('[', f);
    for (int i = 0; i < r->n_latency; i++) {
        const kiln_gate_latency *l = &r->latency[i];
        fprintf(f, "%s{\"batch\":%lld,\"runs\":%d,\"fp32_p50_ms\":", i ? "," : "", (long long)l->batch,
                l->runs);
        jnum(f, l->base_p50_ms);
        fputs(",\"compressed_p50_ms\":", f);
        jnum(f, l->cand_p50_ms);
        fputs(",\"fp32_p99_ms\":", f);
        jnum(f, l->base_p99_ms);
        fputs(",\"compressed_p99_ms\":", f);
        jnum(f, l->cand_p99_ms);
        fputs(",\"speedup_p50\":", f);
        jnum(f, l->cand_p50_ms > 0 ? l->base_p50_ms / l->cand_p50_ms : NAN);
        fputc('}', f);
    }
    fputc(']', f);
    jkey(f, &first, "tables");
    if (r->tables_rounded)
        fprintf(f, "{\"mode\":\"s8\",\"tables\":%lld,\"elements\":%lld}", (long long)r->tables.tables,
                (long long)r->tables.elements);
    else
        fputs("{\"mode\":\"f32\"}", f);
    if (r->sparse) {
        jkey(f, &first, "sparse");
        kiln_compile_sparse_json(r->sparse, f);
    }
    if (r->auto_result) { /* auto's static int8 candidates (docs/COMPRESSION.md, step 5) */
        const kiln_compile_result *a = r->auto_result;
        jkey(f, &first, "auto");
        fprintf(f, "{\"static\":%s,\"static_whole_model_drop\":", a->auto_static ? "true" : "false");
        if (a->auto_static_drop >= 0) jnum(f, a->auto_static_drop);
        else fputs("null", f);
        fputs(",\"static_kept_fp32\":", f);
        if (a->auto_static_kept >= 0) fprintf(f, "%d", a->auto_static_kept);
        else fputs("null", f);
        fputs(",\"static_kept_drop\":", f);
        if (a->auto_static_kept >= 0) jnum(f, a->auto_static_kept_drop);
        else fputs("null", f);
        fputs(",\"mix_ms\":", f);
        if (a->auto_ms[0] > 0) jnum(f, a->auto_ms[0]);
        else fputs("null", f);
        fputs(",\"static_ms\":", f);
        if (a->auto_ms[1] > 0) jnum(f, a->auto_ms[1]);
        else fputs("null", f);
        fputc('}', f);
    }
    jkey(f, &first, "passed");
    fputs(r->passed ? "true" : "false", f);
    jkey(f, &first, "verdict");
    kiln_json_write_string(f, r->verdict);
    fputs("}\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void print_db(FILE *f, double v)
{
    if (v == INFINITY) fprintf(f, "%9s", "inf");
    else fprintf(f, "%9.2f", v);
}

void kiln_compile_report_print(const kiln_compile_report *r, FILE *f)
{
    fputs("model:       ", f);
    kiln_text_write(f, r->model);
    fputs(" (signature ", f);
    kiln_text_write(f, r->signature);
    fprintf(f, ")\nprecision:   %s (asked: %s)\n", kiln_precision_name(r->precision),
            r->precision_asked);
    if (r->cal_static)
        fprintf(f, "calibration: static int8, %s ranges from %lld samples%s", r->cal_static,
                (long long)r->cal_samples, r->cal_path ? " of " : "");
    else
        fprintf(f, "calibration: dynamic int8 (activation ranges per run); sensitivity measured on "
                   "%lld samples%s",
                (long long)r->cal_samples, r->cal_path ? " of " : "");
    if (r->cal_path) kiln_text_write(f, r->cal_path);
    fputc('\n', f);
    if (r->eval_path) {
        fprintf(f, "evaluation:  %lld samples of ", (long long)r->eval_samples);
        kiln_text_write(f, r->eval_path);
        if (r->labels_path) {
            fputs(", labels ", f);
            kiln_text_write(f, r->labels_path);
        }
        fputc('\n', f);
    }
    if (r->n_outputs) {
        fprintf(f, "\n%-24s %8s %11s %11s %11s %11s %9s\n", "output", "top-1", "max abs", "mean abs",
                "max rel", "mean rel", "SQNR dB");
        for (int i = 0; i < r->n_outputs; i++) {
            const kiln_compile_out_stats *o = &r->outs[i];
            char name[25];
            snprintf(name, sizeof name, "%s", o->name);
            kiln_text_write(f, name);
            fprintf(f, "%*s", (int)(25 - strlen(name)), "");
            if (o->has_agreement) fprintf(f, "%7.2f%%", 100 * o->agreement);
            else fprintf(f, "%8s", "-");
            fprintf(f, " %11.4g %11.4g %11.4g %11.4g ", o->max_abs, o->mean_abs, o->max_rel,
                    o->mean_rel);
            print_db(f, o->sqnr_db);
            fputc('\n', f);
        }
    }
    if (r->has_quality) {
        const kiln_gate_quality *q = &r->q;
        fputc('\n', f);
        if (q->has_labels)
            fprintf(f, "%s: fp32 %.4f, %s %.4f; ", q->metric, q->base_metric,
                    kiln_precision_name(r->precision), q->cand_metric);
        fprintf(f, "%s %.4f%% (--max-drop %.4g%%)\n", q->drop_of, 100 * q->drop, 100 * r->max_drop);
    }
    if (r->n_nodes) {
        fprintf(f, "\n%-28s %-18s %10s %9s %7s  %s\n", "node", "op", "weights", "SQNR dB", "runs in",
                "fell back because");
        for (int i = 0; i < r->n_nodes; i++) {
            const kiln_compile_node *n = &r->nodes[i];
            char name[29], op[19];
            snprintf(name, sizeof name, "%s", n->name);
            snprintf(op, sizeof op, "%s", n->op);
            kiln_text_write(f, name);
            fprintf(f, "%*s", (int)(29 - strlen(name)), "");
            kiln_text_write(f, op);
            fprintf(f, "%*s %10lld ", (int)(18 - strlen(op)), "", (long long)n->weight_elems);
            if (n->measured) print_db(f, n->sqnr_db);
            else fprintf(f, "%9s", "-");
            fprintf(f, " %7s", kiln_precision_name(kiln_compile_node_effective(n)));
            if (n->fell_back) {
                fputs("  ", f);
                kiln_text_write(f, n->reason);
            }
            fputc('\n', f);
        }
    }
    if (r->sparse) kiln_compile_sparse_print(r->sparse, f);
    if (r->tables_rounded)
        fprintf(f, "\ntables:      %lld embedding table%s (%lld elements) rounded to s8 per row\n",
                (long long)r->tables.tables, r->tables.tables == 1 ? "" : "s",
                (long long)r->tables.elements);
    fprintf(f, "\nweights: fp32 %lld bytes, compressed %lld bytes (%.2fx)\n",
            (long long)r->fp32_weight_bytes, (long long)r->compressed_weight_bytes,
            r->fp32_weight_bytes ? (double)r->compressed_weight_bytes / (double)r->fp32_weight_bytes
                                 : 1.0);
    if (r->n_latency) {
        fprintf(f, "\n%6s %6s %14s %14s %9s\n", "batch", "runs", "fp32 p50 ms",
                "compressed p50", "speedup");
        for (int i = 0; i < r->n_latency; i++) {
            const kiln_gate_latency *l = &r->latency[i];
            fprintf(f, "%6lld %6d %14.4f %14.4f %8.2fx\n", (long long)l->batch, l->runs,
                    l->base_p50_ms, l->cand_p50_ms,
                    l->cand_p50_ms > 0 ? l->base_p50_ms / l->cand_p50_ms : 0.0);
        }
    }
    fprintf(f, "\n%s\n", r->verdict);
}
