/*
 * plan.c - compiling a graph for concrete input shapes, and running it.
 *
 * Slots: one per graph value (plus one per unwanted optional output of a
 * node). A slot is a constant (of the graph, or computed at compile time),
 * a graph input (the caller's tensor), a graph output (allocated per run:
 * it is handed to the caller), an arena buffer, or an alias of another
 * slot's memory (reshape-like ops, elementwise kernels that write over
 * their input, and a Concat's inputs written straight into their slices of
 * its output, at a byte offset). Arena buffers get offsets from their lifetimes (first and
 * last step that touch them), largest first, lowest free offset.
 *
 * Loop, If and Scan steps, which run plans of their bodies, are in plan_control.c;
 * plan_internal.h has the structures both files read.
 */
#define _GNU_SOURCE
#include "exec/plan.h"
#include "exec/plan_internal.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "core/threadpool.h"
#include "exec/exec.h"
#include "exec/flops.h"
#include "kernels/simd/simd.h"

#define PLAN_ALIGN 64
#define PLAN_FOLD_MAX_BYTES ((int64_t)1 << 20) /* compile-time evaluation bound */

static atomic_int profile_on = -1;

void kiln_plan_profile_enable(int on) { atomic_store(&profile_on, on ? 1 : 0); }

static int profiling(void)
{
    int v = atomic_load(&profile_on);
    if (v < 0) {
        const char *e = getenv("KILN_PROFILE");
        v = e && *e && strcmp(e, "0") != 0;
        atomic_store(&profile_on, v);
    }
    return v;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- compile helpers ---- */

/* The bound on one value's bytes while compiling on this thread (0: none);
 * set by kiln_plan_cache_get, read by every plan compiled inside it. */
static _Thread_local int64_t compile_value_limit;

static size_t align_up(size_t n) { return (n + PLAN_ALIGN - 1) & ~(size_t)(PLAN_ALIGN - 1); }

static size_t type_bytes(const struct kiln_type *t, int layout)
{
    int64_t n = kiln_shape_count(t->rank, t->dims);
    if (n < 0) return (size_t)-1;
    if (layout > 0 && t->rank == 4) {
        n = t->dims[0] * kiln_layout_channels(t->dims[1], layout) * t->dims[2] * t->dims[3];
    }
    return (size_t)n * kiln_dtype_size(t->dtype);
}

static int slot_add(struct kiln_plan *p)
{
    if (p->n_slots == p->cap_slots) {
        int cap = p->cap_slots ? p->cap_slots * 2 : 64;
        struct slot *s = realloc(p->slots, (size_t)cap * sizeof *s);
        if (!s) return -1;
        p->slots = s;
        p->cap_slots = cap;
    }
    memset(&p->slots[p->n_slots], 0, sizeof p->slots[0]);
    p->slots[p->n_slots].def_step = -1;
    p->slots[p->n_slots].last_use = -1;
    p->slots[p->n_slots].buf = -1;
    p->slots[p->n_slots].alias_of = -1;
    return p->n_slots++;
}

static int buf_add(struct kiln_plan *p, size_t bytes, int first, int last)
{
    if (p->n_bufs == p->cap_bufs) {
        int cap = p->cap_bufs ? p->cap_bufs * 2 : 64;
        struct buffer *b = realloc(p->bufs, (size_t)cap * sizeof *b);
        if (!b) return -1;
        p->bufs = b;
        p->cap_bufs = cap;
    }
    p->bufs[p->n_bufs] = (struct buffer){align_up(bytes ? bytes : 1), 0, first, last};
    return p->n_bufs++;
}

static kiln_status keep_folded(struct kiln_plan *p, kiln_tensor *t)
{
    if (p->n_folded == p->cap_folded) {
        int cap = p->cap_folded ? p->cap_folded * 2 : 16;
        kiln_tensor **f = realloc(p->folded, (size_t)cap * sizeof *f);
        if (!f) {
            kiln_tensor_free(t);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
        }
        p->folded = f;
        p->cap_folded = cap;
    }
    p->folded[p->n_folded++] = t;
    return KILN_OK;
}

/* Ops whose output is the input's bytes under another shape. */
static bool is_view_op(enum kiln_op op)
{
    return op == KILN_OP_Reshape || op == KILN_OP_Flatten || op == KILN_OP_Squeeze ||
           op == KILN_OP_Unsqueeze || op == KILN_OP_Identity;
}

/* Evaluate a node whose inputs are all known, at compile time. */
static kiln_status fold_node(struct kiln_plan *p, const struct kiln_node *n, kiln_tensor *const *in)
{
    kiln_tensor *out[KILN_MAX_IO];
    kiln_status st = kiln_exec_node(n, in, out, NULL, KILN_EXEC_DEFAULT_MAX_TENSOR_BYTES);
    if (st != KILN_OK) return st;
    for (int k = 0; k < n->n_out; k++) {
        int v = n->out[k];
        kiln_tensor *t = out[k];
        out[k] = NULL;
        if ((st = keep_folded(p, t)) != KILN_OK) { /* keep_folded frees t on failure */
            for (int j = k + 1; j < n->n_out; j++) kiln_tensor_free(out[j]);
            return st;
        }
        if (v < 0) continue;
        struct slot *s = &p->slots[v];
        s->kind = SLOT_CONST;
        s->konst = t;
        kiln_type_from_tensor(&s->type, t);
    }
    return KILN_OK;
}

int kiln_plan_root_of(const struct kiln_plan *p, int s)
{
    while (p->slots[s].kind == SLOT_ALIAS) s = p->slots[s].alias_of;
    return s;
}

/* Whether slot r is a graph input its runs' caller hands over (plan->donate). */
static bool donated_input(const struct kiln_plan *p, int r)
{
    const struct slot *s = &p->slots[r];
    return p->donate && s->kind == SLOT_INPUT && s->input_index < p->g->n_inputs &&
           p->donate[s->input_index];
}

/* Offsets: largest buffer first, at the lowest offset free during its lifetime. */
static kiln_status assign_offsets(struct kiln_plan *p)
{
    int nb = p->n_bufs;
    int *ord = malloc(((size_t)nb + 1) * sizeof *ord);
    int *placed = malloc(((size_t)nb + 1) * sizeof *placed);
    struct { size_t lo, hi; } *busy = malloc(((size_t)nb + 1) * sizeof *busy);
    if (!ord || !placed || !busy) {
        free(ord);
        free(placed);
        free(busy);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning memory");
    }
    for (int i = 0; i < nb; i++) ord[i] = i;
    /* insertion sort by size, descending (stable) */
    for (int i = 1; i < nb; i++) {
        int x = ord[i], j = i - 1;
        while (j >= 0 && p->bufs[ord[j]].bytes < p->bufs[x].bytes) {
            ord[j + 1] = ord[j];
            j--;
        }
        ord[j + 1] = x;
    }
    int n_placed = 0;
    size_t total = 0;
    for (int i = 0; i < nb; i++) {
        struct buffer *b = &p->bufs[ord[i]];
        int nbusy = 0;
        for (int j = 0; j < n_placed; j++) {
            const struct buffer *o = &p->bufs[placed[j]];
            if (o->first <= b->last && b->first <= o->last) {
                busy[nbusy].lo = o->off;
                busy[nbusy].hi = o->off + o->bytes;
                nbusy++;
            }
        }
        /* sort busy ranges by start, then find the first gap that fits */
        for (int a = 1; a < nbusy; a++) {
            size_t lo = busy[a].lo, hi = busy[a].hi;
            int c = a - 1;
            while (c >= 0 && busy[c].lo > lo) {
                busy[c + 1] = busy[c];
                c--;
            }
            busy[c + 1].lo = lo;
            busy[c + 1].hi = hi;
        }
        size_t off = 0;
        for (int a = 0; a < nbusy; a++) {
            if (busy[a].lo >= off + b->bytes) break;
            if (busy[a].hi > off) off = busy[a].hi;
        }
        b->off = off;
        if (off + b->bytes > total) total = off + b->bytes;
        placed[n_placed++] = ord[i];
    }
    p->arena_bytes = total;
    free(ord);
    free(placed);
    free(busy);
    return KILN_OK;
}

/* A step that runs reference code: Kiln's reference kernel, or a fast kernel whose
 * library picked its reference implementation (oneDNN's "ref:..."). */
static int step_is_reference(const struct step *sp)
{
    return !sp->inst.run || strncmp(sp->inst.impl, "ref", 3) == 0 ||
           strncmp(sp->inst.impl, "matmul:ref", 10) == 0;
}

/* Why a compiled fast kernel is a fallback, or NULL: oneDNN's reference implementation
 * anywhere, or its generic GEMM-based convolution (im2col: a plain-layout or odd shape). */
static const char *step_fallback(const struct step *sp)
{
    const char *impl = sp->inst.impl;
    if (!sp->inst.run || !impl[0]) return NULL;
    if (strncmp(impl, "ref", 3) == 0 || strncmp(impl, "matmul:ref", 10) == 0)
        return "oneDNN's reference implementation";
    enum kiln_op op = sp->node->op;
    /* "matmul:...": a convolution run as im2col and a matmul on purpose (dnnl/conv.c) */
    if ((op == KILN_OP_Conv || op == KILN_OP_KilnFusedConv) && strncmp(impl, "matmul:", 7) != 0 &&
        strstr(impl, "gemm"))
        return "oneDNN's generic GEMM convolution";
    return NULL;
}

/* Append one line naming step sp's fallback (inputs and output shapes) to p->fallbacks. */
static void note_fallback(struct kiln_plan *p, const struct step *sp, const char *why,
                          const struct kiln_type *const *in, int n_in,
                          const struct kiln_type *out)
{
    char line[640], shape[160];
    int len = snprintf(line, sizeof line, "fallback: %s (%s) runs %s (%s, %s): inputs",
                       sp->node->name && sp->node->name[0] ? sp->node->name : "-",
                       kiln_op_name(sp->node->op), sp->inst.impl, sp->inst.name, why);
    for (int k = 0; k < n_in && len > 0 && (size_t)len < sizeof line; k++)
        if (in[k])
            len += snprintf(line + len, sizeof line - (size_t)len, " %s",
                            kiln_shape_str(in[k]->rank, in[k]->dims, shape, sizeof shape));
    if (out && len > 0 && (size_t)len < sizeof line)
        len += snprintf(line + len, sizeof line - (size_t)len, ", output %s",
                        kiln_shape_str(out->rank, out->dims, shape, sizeof shape));
    if (len < 0) return;
    size_t n = strlen(line);
    char *f = realloc(p->fallbacks, p->fallbacks_len + n + 2);
    if (!f) return; /* the log loses a line, nothing else */
    memcpy(f + p->fallbacks_len, line, n);
    f[p->fallbacks_len + n] = '\n';
    f[p->fallbacks_len + n + 1] = '\0';
    p->fallbacks = f;
    p->fallbacks_len += n + 1;
}

kiln_status kiln_plan_unsupported(const struct kiln_node *n, const char *why)
{
    if (n) return kiln_node_error(n, KILN_ERR_UNSUPPORTED, "cannot be planned: %s", why);
    return kiln_error(KILN_ERR_UNSUPPORTED, "graph cannot be planned: %s", why);
}

/* Make the constant inputs of n resident before the compile reads them, except
 * those in `skip` (inputs a fast op may pack: the weight cache reloads them
 * itself if it packs them, and they are acquired after the step otherwise). */
static kiln_status acquire_inputs(struct kiln_weight_cache *w, const struct kiln_node *n,
                                  kiln_tensor *const *inv, unsigned skip)
{
    for (int k = 0; k < n->n_in; k++) {
        if (!inv[k] || (k < 32 && (skip >> k & 1))) continue;
        kiln_status st = kiln_weight_cache_acquire(w, inv[k], 0);
        if (st != KILN_OK) return st;
    }
    return KILN_OK;
}

/* After step si is compiled: a constant input the step holds packed counts as
 * one packed use, and once every use of it in the graph is such a use, its
 * reloadable copy is released; any other constant input is read at run time
 * and pinned. */
static kiln_status settle_inputs(struct kiln_plan *p, struct kiln_weight_cache *w, int si,
                                 const int *need, int *packed_uses)
{
    const struct step *sp = &p->steps[si];
    for (int k = 0; k < sp->n_in && k < sp->node->n_in; k++) { /* a body's plan settles its own */
        int v = sp->in[k];
        if (v < 0 || p->slots[v].kind != SLOT_CONST) continue;
        const kiln_tensor *t = p->slots[v].konst;
        if (sp->inst.run && k < 32 && (sp->inst.packed >> k & 1)) {
            if (++packed_uses[v] == need[v]) kiln_weight_cache_release(w, t);
        } else {
            kiln_status st = kiln_weight_cache_acquire(w, t, 1);
            if (st != KILN_OK) return st;
        }
    }
    return KILN_OK;
}

/* ---- Concat in place ----
 *
 * A Concat whose inputs lie one after the other in its output's memory (the
 * dims before its axis, as stored, multiply to 1: axis 0, or axis 1 of a batch
 * of one, in plain or channel-blocked layout) need not copy them: each input's
 * producer can write straight into its slice of the output. slice_into makes
 * an input's root slot an alias of the output's root at the slice's byte
 * offset, so the producer's kernel gets a header onto that slice and the
 * merged buffer lives from the first producer to the output's last reader.
 * Concats are visited last first, so that an input already placed in a later
 * Concat's output (DenseNet's growing Concats of the same features, a Concat of
 * Concats) is either at the right offset already, or the whole Concat becomes
 * a view of that later output. An input stays copied when it is not a buffer of
 * the arena of its own (a graph input or output, a constant, a slice of another
 * place), or when its slice would be misaligned (64 bytes) or, blocked, would not
 * start and end on whole channel blocks. A Concat with every input in place is
 * removed; one with some, on the simd kernel, is passed NULL for those.
 *
 * Along axis 1 of a batch of N > 1 (concat_strided), an input's slice is N
 * pieces, one image's row of the output apart. Its producer is placed there
 * only when its kernel says it can write such a slice (inst.can_out_strided):
 * the step is compiled again with cc->out_host_channels, and kept so when the
 * new instance says it does (inst.out_strided). The slot is then an alias with
 * host_c set, so nothing else may read it as a dense tensor: the Concat must be
 * its only reader (through any alias), and the Concat must run on the simd
 * kernel (which skips placed inputs). oneDNN 2.6 makes its reference
 * implementation for any strided destination (convolution, 1x1 convolution,
 * pooling; plain or blocked), slower than the copy it saves, and running the
 * primitive once per image costs more than the copy as well, so the oneDNN
 * kernels do not declare it; today the simd Concat does (a Concat written
 * into a later Concat's slice: inception's nested Concats), and the inputs of
 * a Concat placed so may be placed into the same host in turn. */

static int64_t stored_dim(const struct kiln_type *t, int layout, int d, int *n_dims)
{
    if (!layout || t->rank != 4) {
        *n_dims = t->rank;
        return t->dims[d];
    }
    *n_dims = 5; /* [N][C/b][H][W][b] */
    if (d == 4) return layout;
    if (d == 1) return kiln_layout_channels(t->dims[1], layout) / layout;
    return t->dims[d];
}

/* Make root slot r an alias of root R at byte offset off; r's aliases follow. */
static void slice_into(struct kiln_plan *p, int r, int R, size_t off)
{
    for (int v = 0; v < p->n_slots; v++)
        if (p->slots[v].kind == SLOT_ALIAS && p->slots[v].alias_of == r) {
            p->slots[v].alias_of = R;
            p->slots[v].alias_off += off;
        }
    struct slot *rs = &p->slots[r], *Rs = &p->slots[R];
    if (rs->def_step >= 0 && rs->def_step < Rs->def_step) Rs->def_step = rs->def_step;
    if (rs->last_use > Rs->last_use) Rs->last_use = rs->last_use;
    rs->kind = SLOT_ALIAS;
    rs->alias_of = R;
    rs->alias_off = off;
}

static size_t slot_off(const struct kiln_plan *p, int v)
{
    return p->slots[v].kind == SLOT_ALIAS ? p->slots[v].alias_off : 0;
}

/* Where Concat step si may place its inputs: every present input's byte offset in
 * the output (local[k]) and whether its slice starts and ends on whole blocks
 * (whole[k]). False when the inputs are not contiguous pieces of the output. */
static bool concat_slices(const struct kiln_plan *p, const struct step *sp, size_t *local,
                          bool *whole)
{
    const struct slot *xs = &p->slots[sp->out[0]];
    const struct kiln_type *y = &xs->type;
    int lo = xs->layout;
    if (y->rank < 1 || (lo && y->rank != 4)) return false;
    int64_t axis = kiln_attr_int(sp->node, "axis", 1);
    if (axis < 0) axis += y->rank;
    if (axis < 0 || axis >= y->rank) return false;
    int nd;
    stored_dim(y, lo, 0, &nd);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= stored_dim(y, lo, d, &nd);
    if (outer != 1) return false;
    for (int d = (int)axis + 1; d < nd; d++) inner *= stored_dim(y, lo, d, &nd);
    size_t es = kiln_dtype_size(y->dtype);
    int blocked_axis = lo && axis == 1;
    int64_t at = 0; /* along the axis, in logical units */
    for (int k = 0; k < sp->n_in; k++) {
        local[k] = 0;
        whole[k] = false;
        if (sp->in[k] < 0) continue;
        const struct slot *s = &p->slots[sp->in[k]];
        if (s->type.dtype != y->dtype || s->type.rank != y->rank || s->layout != lo) return false;
        int64_t units = blocked_axis ? at / lo : at;
        local[k] = (size_t)(units * inner) * es;
        int64_t len = s->type.dims[axis];
        whole[k] = !blocked_axis || (at % lo == 0 && len % lo == 0);
        at += len;
    }
    if (at != y->dims[axis]) return false;
    /* the last present input may end in the output's padding lanes */
    for (int k = sp->n_in - 1; k >= 0; k--)
        if (sp->in[k] >= 0) {
            int64_t start = at - p->slots[sp->in[k]].type.dims[axis];
            if (blocked_axis && start % lo == 0) whole[k] = true;
            break;
        }
    return true;
}


static int node_precision(const struct kiln_node *n, int precision,
                          const struct kiln_plan_node_prec *ov, int n_ov);

/* Compile step si's fast kernel again for writing output 0 into a channel slice of a
 * host of host_c stored channels; *done when the kernel does (the new instance then
 * replaces the old one), else the step is left as it was. */
static kiln_status recompile_strided(struct kiln_plan *p, int si, int64_t host_c,
                                     const struct recompile_env *env, bool *done)
{
    *done = false;
    struct step *sp = &p->steps[si];
    const struct kiln_node *n = sp->node;
    const struct kiln_fast_op *fast = kiln_fast_op(n->op);
    if (!fast || n->n_in > KILN_MAX_IO || n->n_out > KILN_MAX_IO) return KILN_OK;
    const struct kiln_type *inp[KILN_MAX_IO], *ot[KILN_MAX_IO];
    const kiln_tensor *inv[KILN_MAX_IO];
    int il[KILN_MAX_IO], ol[KILN_MAX_IO];
    for (int k = 0; k < n->n_in; k++) {
        int v = sp->in[k];
        inp[k] = v >= 0 ? &p->slots[v].type : NULL;
        inv[k] = v >= 0 && p->slots[v].kind == SLOT_CONST ? p->slots[v].konst : NULL;
        il[k] = n->in[k] >= 0 ? p->g->values[n->in[k]].layout : 0;
    }
    for (int k = 0; k < n->n_out; k++) {
        ot[k] = n->out[k] >= 0 ? &p->slots[sp->out[k]].type : NULL;
        ol[k] = n->out[k] >= 0 ? p->g->values[n->out[k]].layout : 0;
    }
    struct kiln_compile_ctx cc = {n, n->n_in, inp, inv, il, n->n_out, ot, ol, env->weights,
                                  env->threads,
                                  node_precision(n, env->precision, env->ov, env->n_ov), host_c};
    struct kiln_kernel_inst inst;
    memset(&inst, 0, sizeof inst);
    kiln_status st = fast->compile(&cc, &inst);
    if (st != KILN_OK || !inst.run || !inst.out_strided) {
        kiln_kernel_inst_destroy(&inst);
        return st;
    }
    if (inst.scratch_bytes > sp->inst.scratch_bytes) { /* offsets are not assigned yet */
        if (sp->scratch_buf >= 0) {
            p->bufs[sp->scratch_buf].bytes = align_up(inst.scratch_bytes);
        } else if ((sp->scratch_buf = buf_add(p, inst.scratch_bytes, si, si)) < 0) {
            kiln_kernel_inst_destroy(&inst);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning a Concat");
        }
    }
    kiln_kernel_inst_destroy(&sp->inst);
    sp->inst = inst;
    *done = true;
    return KILN_OK;
}

/* Whether any step but si reads root slot r, or any slot aliases it. */
static bool read_elsewhere(const struct kiln_plan *p, int r, int si)
{
    for (int v = 0; v < p->n_slots; v++)
        if (p->slots[v].kind == SLOT_ALIAS && p->slots[v].alias_of == r) return true;
    for (int sj = 0; sj < p->n_steps; sj++) {
        if (sj == si) continue;
        const struct step *sq = &p->steps[sj];
        for (int k = 0; k < sq->n_in; k++)
            if (sq->in[k] >= 0 && kiln_plan_root_of(p, sq->in[k]) == r) return true;
    }
    return false;
}

/* Concat step si along axis 1 of a batch of N > 1 (see above): place the inputs whose
 * producers write strided channel slices. */
static kiln_status concat_strided(struct kiln_plan *p, int si, const struct recompile_env *env,
                                  unsigned char *take)
{
    struct step *sp = &p->steps[si];
    int X = sp->out[0];
    const struct slot *xs = &p->slots[X];
    const struct kiln_type *y = &xs->type;
    int lo = xs->layout;
    if (y->rank != 4 || y->dims[0] < 2) return KILN_OK;
    int64_t axis = kiln_attr_int(sp->node, "axis", 1);
    if (axis < 0) axis += 4;
    if (axis != 1) return KILN_OK;
    if (!(sp->inst.run && sp->inst.name && !strncmp(sp->inst.name, "concat", 6))) return KILN_OK;
    int R;
    size_t B;
    int64_t host;
    if (xs->kind == SLOT_ARENA || xs->kind == SLOT_OUTPUT) {
        R = X, B = 0, host = lo ? kiln_layout_channels(y->dims[1], lo) : y->dims[1];
    } else if (xs->kind == SLOT_ALIAS && xs->host_c > 0) {
        R = xs->alias_of, B = xs->alias_off, host = xs->host_c;
    } else {
        return KILN_OK;
    }
    size_t plane = (size_t)(y->dims[2] * y->dims[3]) * kiln_dtype_size(y->dtype);
    int64_t at = 0;
    for (int k = 0; k < sp->n_in; k++) { /* the inputs tile the output along C */
        if (sp->in[k] < 0) continue;
        const struct kiln_type *t = &p->slots[sp->in[k]].type;
        if (t->dtype != y->dtype || t->rank != 4 || p->slots[sp->in[k]].layout != lo ||
            t->dims[0] != y->dims[0] || t->dims[2] != y->dims[2] || t->dims[3] != y->dims[3])
            return KILN_OK;
        at += t->dims[1];
    }
    if (at != y->dims[1]) return KILN_OK;
    at = 0;
    int n_take = 0, n_present = 0;
    for (int k = 0; k < sp->n_in; k++) {
        take[k] = 0;
        if (sp->in[k] < 0) continue;
        n_present++;
        int v = sp->in[k];
        int64_t c0 = at, len = p->slots[v].type.dims[1];
        at += len;
        size_t off = B + (size_t)c0 * plane; /* on whole blocks: block c0/lo at c0*H*W floats */
        const struct slot *rs = &p->slots[v];
        if (rs->kind != SLOT_ARENA || (lo && (c0 % lo || len % lo)) || off % PLAN_ALIGN ||
            rs->def_step < 0 || rs->def_step >= si)
            continue;
        bool dup = false; /* Concat(x, x) */
        for (int j = 0; j < sp->n_in; j++) dup |= j != k && sp->in[j] == v;
        if (dup || read_elsewhere(p, v, si)) continue;
        struct step *ps = &p->steps[rs->def_step];
        if (ps->n_out < 1 || ps->out[0] != v || !ps->inst.run || !ps->inst.can_out_strided)
            continue;
        bool done;
        kiln_status st = recompile_strided(p, rs->def_step, host, env, &done);
        if (st != KILN_OK) return st;
        if (!done) continue;
        slice_into(p, v, R, off);
        p->slots[v].host_c = host;
        take[k] = 1;
        n_take++;
    }
    if (!n_take) return KILN_OK;
    sp->elided = calloc((size_t)sp->n_in + 1, 1);
    if (!sp->elided) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning a Concat");
    for (int k = 0; k < sp->n_in; k++) sp->elided[k] = take[k] != 0;
    p->concat_inputs_elided += n_take;
    p->concat_inputs_strided += n_take;
    (void)n_present;
    return KILN_OK;
}

static kiln_status concat_in_place(struct kiln_plan *p, const struct recompile_env *env)
{
    size_t *local = malloc(sizeof(size_t) * (KILN_MAX_IO + 1));
    bool *whole = malloc(sizeof(bool) * (KILN_MAX_IO + 1));
    unsigned char *take = malloc(KILN_MAX_IO + 1);
    int *roots = malloc(sizeof(int) * (KILN_MAX_IO + 1));
    if (!local || !whole || !take || !roots) {
        free(local), free(whole), free(take), free(roots);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning a Concat");
    }
    for (int si = p->n_steps - 1; si >= 0; si--) {
        struct step *sp = &p->steps[si];
        if (sp->node->op != KILN_OP_Concat || sp->n_out < 1 || sp->n_in > KILN_MAX_IO) continue;
        for (int k = 0; k < sp->n_in; k++) p->concat_inputs += sp->in[k] >= 0;
        int X = sp->out[0];
        struct slot *xs = &p->slots[X];
        if (xs->kind != SLOT_ARENA && xs->kind != SLOT_OUTPUT && xs->kind != SLOT_ALIAS) continue;
        if (!concat_slices(p, sp, local, whole)) {
            kiln_status st = concat_strided(p, si, env, take);
            if (st != KILN_OK) {
                free(local), free(whole), free(take), free(roots);
                return st;
            }
            continue;
        }
        int R = xs->kind == SLOT_ALIAS ? xs->alias_of : X;
        size_t B = slot_off(p, X);
        int n_present = 0;
        for (int k = 0; k < sp->n_in; k++) n_present += sp->in[k] >= 0;
        if (!n_present) continue;
        /* every input a slice of one later output, one after the other: the Concat
         * itself becomes a view of that output (DenseNet's growing Concats) */
        if (xs->kind == SLOT_ARENA) {
            int R2 = -1, first = -1;
            bool view = true;
            for (int k = 0; k < sp->n_in && view; k++) {
                if (sp->in[k] < 0) continue;
                int v = sp->in[k];
                if (p->slots[v].kind != SLOT_ALIAS || p->slots[v].alias_off % PLAN_ALIGN ||
                    !whole[k]) {
                    view = false;
                    break;
                }
                if (first < 0) {
                    first = k;
                    R2 = p->slots[v].alias_of;
                }
                view = p->slots[v].alias_of == R2 && R2 != X &&
                       p->slots[v].alias_off == p->slots[sp->in[first]].alias_off + local[k];
            }
            if (view && R2 >= 0 &&
                (p->slots[R2].kind == SLOT_ARENA || p->slots[R2].kind == SLOT_OUTPUT) &&
                p->slots[R2].layout == xs->layout &&
                p->slots[sp->in[first]].alias_off + xs->bytes <= p->slots[R2].bytes) {
                slice_into(p, X, R2, p->slots[sp->in[first]].alias_off);
                sp->elided = calloc((size_t)sp->n_in + 1, 1);
                if (!sp->elided) goto oom;
                for (int k = 0; k < sp->n_in; k++) sp->elided[k] = sp->in[k] >= 0;
                p->concat_inputs_elided += n_present;
                continue;
            }
        }
        /* each input: in place already, made a slice, or copied */
        int n_take = 0;
        for (int k = 0; k < sp->n_in; k++) {
            take[k] = 0;
            roots[k] = -1;
            if (sp->in[k] < 0) continue;
            int v = sp->in[k], r = kiln_plan_root_of(p, v);
            size_t at = B + local[k];
            if (r == R && slot_off(p, v) == at && whole[k]) { /* placed by a later Concat */
                take[k] = 2;
                n_take++;
                continue;
            }
            const struct slot *rs = &p->slots[r];
            if (rs->kind != SLOT_ARENA || r == R || slot_off(p, v) != 0 ||
                rs->bytes != p->slots[v].bytes || rs->layout != xs->layout || !whole[k] ||
                at % PLAN_ALIGN || rs->def_step < 0 || rs->def_step >= si)
                continue;
            bool dup = false; /* Concat(x, x): one slice per root */
            for (int j = 0; j < k; j++) dup |= roots[j] == r;
            if (dup) continue;
            roots[k] = r;
            take[k] = 1;
            n_take++;
        }
        bool simd_kernel = sp->inst.run && sp->inst.name && !strncmp(sp->inst.name, "concat", 6);
        if (!n_take || (n_take < n_present && !simd_kernel)) continue;
        sp->elided = calloc((size_t)sp->n_in + 1, 1);
        if (!sp->elided) goto oom;
        for (int k = 0; k < sp->n_in; k++) {
            if (take[k] == 1) slice_into(p, roots[k], R, B + local[k]);
            sp->elided[k] = take[k] != 0;
        }
        p->concat_inputs_elided += n_take;
    }
    free(local), free(whole), free(take), free(roots);
    return KILN_OK;
oom:
    free(local), free(whole), free(take), free(roots);
    return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning a Concat");
}

/* Drop the steps whose inputs are all in place (Concats made views), renumbering the
 * step indices slots and buffers hold: a read by a dropped step counts as one by the
 * next step that stays. */
static kiln_status drop_empty_steps(struct kiln_plan *p)
{
    int *map = malloc(sizeof(int) * ((size_t)p->n_steps + 1));
    if (!map) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning a Concat");
    int kept = 0;
    for (int si = 0; si < p->n_steps; si++) {
        struct step *sp = &p->steps[si];
        bool empty = sp->elided != NULL;
        for (int k = 0; k < sp->n_in && empty; k++) empty = sp->in[k] < 0 || sp->elided[k];
        map[si] = kept;
        if (!empty) {
            if (kept != si) memcpy(&p->steps[kept], &p->steps[si], sizeof *sp);
            kept++;
            continue;
        }
        if (sp->inst.run) p->n_fast--;
        kiln_kernel_inst_destroy(&sp->inst);
        /* a Concat folded into its reader is counted apart (concat_folded) */
        if (sp->n_out < 1 || p->slots[sp->out[0]].kind != SLOT_NONE) p->concat_removed++;
        free(sp->in);
        free(sp->out);
        free(sp->elided);
    }
    map[p->n_steps] = kept;
    for (int v = 0; v < p->n_slots; v++) {
        struct slot *s = &p->slots[v];
        if (s->def_step >= 0 && s->def_step <= p->n_steps) s->def_step = map[s->def_step];
        if (s->last_use >= 0 && s->last_use <= p->n_steps) s->last_use = map[s->last_use];
    }
    for (int b = 0; b < p->n_bufs; b++) {
        p->bufs[b].first = map[p->bufs[b].first];
        p->bufs[b].last = map[p->bufs[b].last];
    }
    for (int si = kept; si < p->n_steps; si++) memset(&p->steps[si], 0, sizeof p->steps[si]);
    p->n_steps = kept;
    free(map);
    return KILN_OK;
}

/* ---- Concat folded into its reader ----
 *
 * A Concat that still copies after Concat in place (along C at batch N > 1, where
 * oneDNN's kernels cannot write strided slices, or inputs that could not be placed)
 * and whose only reader is a per-channel affine step (a depthwise 1x1 convolution
 * with none, Relu or Clip: what a BatchNormalization no convolution precedes
 * becomes, opt/conv_bn.c; DenseNet's Concat -> BatchNormalization -> Relu) is not
 * run: the reader's step reads the Concat's inputs instead (reads_concat) on
 * simd/concat_affine.c, which writes each input's channels of the reader's output,
 * scaled, shifted and clamped, and the Concat's output is never stored. Plain
 * layout with any channel counts; blocked when every input but the last is whole
 * blocks (else the Concat stays, off-block inputs copied lane by lane). Every input
 * must be stored densely in the output's layout (not a strided slice of another
 * Concat's output). KILN_CONCAT_FOLD=0 turns it off. */

/* Whether step d is a depthwise 1x1 convolution of C channels that reads X as its
 * input 0 only (stride 1, no padding, no dilation, constant weights and bias, no
 * residual sum) with none, Relu or Clip fused; *lo, *hi: the activation's bounds. */
static bool per_channel_reader(const struct kiln_plan *p, const struct step *d, int X, int64_t C,
                               float *lo, float *hi)
{
    const struct kiln_node *n = d->node;
    if ((n->op != KILN_OP_Conv && n->op != KILN_OP_KilnFusedConv) || d->reads_concat ||
        d->n_in < 2 || d->n_in > 4 || d->in[0] != X || d->n_out != 1 || d->elided)
        return false;
    if (d->n_in > 3 && d->in[3] >= 0) return false; /* a residual sum */
    int w = d->in[1], b = d->n_in > 2 ? d->in[2] : -1;
    if (w < 0 || w == X || b == X || p->slots[w].kind != SLOT_CONST ||
        (b >= 0 && p->slots[b].kind != SLOT_CONST))
        return false;
    const struct kiln_type *wt = &p->slots[w].type;
    if (wt->dtype != KILN_DTYPE_F32 || wt->rank != 4 || wt->dims[0] != C || wt->dims[1] != 1 ||
        wt->dims[2] != 1 || wt->dims[3] != 1)
        return false;
    if (b >= 0) {
        const struct kiln_type *bt = &p->slots[b].type;
        if (bt->dtype != KILN_DTYPE_F32 || bt->rank != 1 || bt->dims[0] != C) return false;
    }
    bool ok = kiln_attr_int(n, "group", 1) == C;
    static const char *const ones[] = {"strides", "dilations", "kernel_shape"};
    for (size_t a = 0; a < sizeof ones / sizeof ones[0] && ok; a++) {
        const int64_t *v;
        int m = kiln_attr_ints(n, ones[a], &v);
        for (int i = 0; i < m && ok; i++) ok = v[i] == 1;
    }
    const int64_t *pads;
    int m = kiln_attr_ints(n, "pads", &pads);
    for (int i = 0; i < m && ok; i++) ok = pads[i] == 0;
    const char *act = n->op == KILN_OP_KilnFusedConv ? kiln_attr_str(n, "activation", "") : "";
    *lo = -INFINITY;
    *hi = INFINITY;
    if (!strcmp(act, "Relu")) {
        *lo = 0.0f;
    } else if (!strcmp(act, "Clip")) {
        *lo = kiln_attr_float(n, "act_alpha", -FLT_MAX);
        *hi = kiln_attr_float(n, "act_beta", FLT_MAX);
        ok = ok && *lo <= *hi;
    } else if (act[0]) {
        ok = false;
    }
    if (kiln_attr_check(n) != KILN_OK) {
        kiln_error_clear();
        return false;
    }
    return ok;
}

static kiln_status concat_fold_reader(struct kiln_plan *p, const struct recompile_env *env)
{
    const char *e = getenv("KILN_CONCAT_FOLD");
    if (e && !strcmp(e, "0")) return KILN_OK;
    int64_t chans[KILN_MAX_IO];
    int pieces[KILN_MAX_IO];
    for (int si = 0; si < p->n_steps; si++) {
        struct step *sp = &p->steps[si];
        if (sp->node->op != KILN_OP_Concat || sp->elided || sp->n_out != 1 || sp->n_in < 1 ||
            sp->n_in > KILN_MAX_IO)
            continue;
        int X = sp->out[0];
        struct slot *xs = &p->slots[X];
        const struct kiln_type *y = &xs->type;
        if (xs->kind != SLOT_ARENA || y->dtype != KILN_DTYPE_F32 || y->rank != 4) continue;
        int64_t axis = kiln_attr_int(sp->node, "axis", 1);
        if (kiln_attr_check(sp->node) != KILN_OK) {
            kiln_error_clear();
            continue;
        }
        if (axis != 1 && axis != -3) continue;
        int lo = xs->layout;
        /* X's only reader, reading nothing but X through it */
        bool alone = true;
        for (int v = 0; v < p->n_slots && alone; v++)
            alone = !(p->slots[v].kind == SLOT_ALIAS && p->slots[v].alias_of == X);
        int di = -1;
        for (int sj = si + 1; sj < p->n_steps && alone; sj++)
            for (int k = 0; k < p->steps[sj].n_in && alone; k++) {
                int v = p->steps[sj].in[k];
                if (v < 0 || kiln_plan_root_of(p, v) != X) continue;
                alone = di < 0 || di == sj;
                di = sj;
            }
        if (!alone || di < 0) continue;
        struct step *d = &p->steps[di];
        /* the inputs: dense, in X's layout, tiling its channels */
        int np = 0;
        int64_t sum = 0;
        bool ok = true;
        for (int k = 0; k < sp->n_in && ok; k++) {
            int v = sp->in[k];
            if (v < 0) continue;
            const struct slot *s = &p->slots[v];
            const struct kiln_type *t = &s->type;
            ok = s->kind != SLOT_NONE && s->host_c == 0 && s->layout == lo &&
                 t->dtype == KILN_DTYPE_F32 && t->rank == 4 && t->dims[0] == y->dims[0] &&
                 t->dims[1] > 0 && t->dims[2] == y->dims[2] && t->dims[3] == y->dims[3];
            if (!ok) break;
            chans[np] = t->dims[1];
            pieces[np++] = v;
            sum += t->dims[1];
        }
        for (int k = 0; k + 1 < np && ok && lo; k++) ok = chans[k] % lo == 0;
        float alo, ahi;
        if (!ok || !np || sum != y->dims[1] || !per_channel_reader(p, d, X, sum, &alo, &ahi))
            continue;
        const struct slot *ds = &p->slots[d->out[0]];
        if (ds->layout != lo || ds->type.dtype != KILN_DTYPE_F32 || ds->type.rank != 4 ||
            memcmp(ds->type.dims, y->dims, sizeof(int64_t) * 4) != 0)
            continue;
        /* the reader's scale and shift */
        const kiln_tensor *wt = p->slots[d->in[1]].konst;
        const kiln_tensor *bt = d->n_in > 2 && d->in[2] >= 0 ? p->slots[d->in[2]].konst : NULL;
        kiln_status st = kiln_weight_cache_acquire(env->weights, wt, 0);
        if (st == KILN_OK && bt) st = kiln_weight_cache_acquire(env->weights, bt, 0);
        if (st != KILN_OK) return st;
        float *shift = calloc((size_t)sum, sizeof(float));
        int *nin = malloc(sizeof(int) * (size_t)np);
        if (!shift || !nin) {
            free(shift);
            free(nin);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning a Concat");
        }
        if (bt) memcpy(shift, bt->data, sizeof(float) * (size_t)sum);
        struct kiln_kernel_inst inst;
        memset(&inst, 0, sizeof inst);
        st = kiln_concat_affine_compile(np, chans, lo, y->dims[2] * y->dims[3], wt->data, shift,
                                        alo, ahi, &inst);
        free(shift);
        if (st != KILN_OK) {
            free(nin);
            return st;
        }
        sp->elided = calloc((size_t)sp->n_in + 1, 1);
        if (!sp->elided) {
            free(nin);
            kiln_kernel_inst_destroy(&inst);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning a Concat");
        }
        /* the reader reads the inputs, which live until it has; the Concat (every input
         * elided) is dropped and its output never stored */
        for (int k = 0; k < sp->n_in; k++) sp->elided[k] = 1;
        memcpy(nin, pieces, sizeof(int) * (size_t)np);
        for (int k = 0; k < np; k++)
            if (p->slots[pieces[k]].last_use < di) p->slots[pieces[k]].last_use = di;
        free(d->in);
        d->in = nin;
        d->n_in = np;
        if (!d->inst.run) p->n_fast++;
        kiln_kernel_inst_destroy(&d->inst);
        d->inst = inst;
        d->scratch_buf = -1; /* the old kernel's scratch buffer stays unused */
        d->reads_concat = 1;
        xs->kind = SLOT_NONE;
        p->concat_folded++;
    }
    return KILN_OK;
}

static kiln_status plan_compile(const struct kiln_graph *g, const kiln_tensor *const *inputs,
                                struct kiln_weight_cache *weights, int threads, int precision,
                                const struct kiln_plan_node_prec *ov, int n_ov,
                                struct kiln_plan **out);

/* The precision node n is compiled in: its override, else the precision a
 * compiled artifact recorded on the node (attribute KILN_NODE_PRECISION_ATTR,
 * written by kiln_session_save for a session with per-node precisions), else
 * the plan's. */
static int node_precision(const struct kiln_node *n, int precision,
                          const struct kiln_plan_node_prec *ov, int n_ov)
{
    const struct kiln_attr *a = kiln_node_attr(n, KILN_NODE_PRECISION_ATTR);
    if (a && a->type == KILN_ATTR_INT && a->i >= KILN_PRECISION_FP32 && a->i <= KILN_PRECISION_INT8)
        precision = (int)a->i;
    if (n->name && n->name[0])
        for (int i = 0; i < n_ov; i++)
            if (!strcmp(ov[i].node, n->name)) return ov[i].precision;
    return precision;
}

static kiln_status plan_compile_mixed(const struct kiln_graph *g, const kiln_tensor *const *inputs,
                                      struct kiln_weight_cache *weights, int threads,
                                      int precision, const struct kiln_plan_node_prec *ov,
                                      int n_ov, struct kiln_plan **out)
{
    /* one compile at a time per model: a compile may release a reloadable
     * weight that another compile would be reading */
    kiln_weight_cache_compile_lock(weights);
    kiln_status st = plan_compile(g, inputs, weights, threads, precision, ov, n_ov, out);
    kiln_weight_cache_compile_unlock(weights);
    return st;
}

kiln_status kiln_plan_compile_precision(const struct kiln_graph *g,
                                        const kiln_tensor *const *inputs,
                                        struct kiln_weight_cache *weights, int threads,
                                        int precision, struct kiln_plan **out)
{
    return plan_compile_mixed(g, inputs, weights, threads, precision, NULL, 0, out);
}

kiln_status kiln_plan_compile(const struct kiln_graph *g, const kiln_tensor *const *inputs,
                              struct kiln_weight_cache *weights, int threads,
                              struct kiln_plan **out)
{
    return kiln_plan_compile_precision(g, inputs, weights, threads, 0, out);
}

/* ---- lanes: independent branches side by side ---- */

/* With two or more threads, the small convolutions of branching models (Inception modules,
 * fire modules) gain little from splitting each one over the threads: at batch 1 a 6x6
 * image's convolution is a few microseconds of work per thread plus a fork and a join.
 * Where the steps between two points of the plan form independent chains (no chain reads
 * or overwrites memory another one writes), running the chains side by side, one thread
 * each, keeps every thread busy with whole steps instead. plan_lanes cuts the step list
 * into segments (dynamic programming over the cut points, segments of at most
 * LANE_MAX_SEG steps) and, per segment, either runs its steps in order on every thread or
 * deals its chains (the connected components of the segment's dependencies) to lanes,
 * largest first onto the least loaded lane, whichever the cost model below says is
 * faster by LANE_MIN_GAIN. KILN_LANES=0 turns this off (a comparison, not a setting). */
#define LANE_MAX_SEG 64
#define LANE_MIN_GAIN 0.85   /* lanes only when predicted at most 85% of in-order */
#define LANE_FORK_NS 4000.0  /* a fork and join of the lanes */

static double step_flops(const struct kiln_plan *p, const struct step *sp);

/* The bytes of memory of slot v, as [lo, hi) inside its root (an alias's slice; a strided
 * channel slice (batch > 1) counts as the whole root). */
static int slot_range(const struct kiln_plan *p, int v, size_t *lo, size_t *hi)
{
    int r = kiln_plan_root_of(p, v);
    const struct slot *s = &p->slots[v];
    *lo = 0;
    *hi = p->slots[r].bytes;
    if (s->kind == SLOT_ALIAS && s->host_c <= 0) {
        *lo = s->alias_off;
        *hi = s->alias_off + s->bytes;
    }
    return r;
}

static bool slots_overlap(const struct kiln_plan *p, int a, int b)
{
    size_t alo, ahi, blo, bhi;
    int ra = slot_range(p, a, &alo, &ahi), rb = slot_range(p, b, &blo, &bhi);
    if (ra != rb) return false;
    if (p->slots[ra].kind == SLOT_CONST) return false; /* read only */
    return alo < bhi && blo < ahi;
}

/* Does step j (after step i) have to wait for step i: it reads memory i writes, or writes
 * memory i reads or writes. */
static bool step_after(const struct kiln_plan *p, int i, int j)
{
    const struct step *a = &p->steps[i], *b = &p->steps[j];
    for (int k = 0; k < a->n_out; k++) {
        if (a->out[k] < 0) continue;
        for (int m = 0; m < b->n_in; m++)
            if (b->in[m] >= 0 && slots_overlap(p, a->out[k], b->in[m])) return true;
        for (int m = 0; m < b->n_out; m++)
            if (b->out[m] >= 0 && slots_overlap(p, a->out[k], b->out[m])) return true;
    }
    for (int k = 0; k < a->n_in; k++) {
        if (a->in[k] < 0) continue;
        for (int m = 0; m < b->n_out; m++)
            if (b->out[m] >= 0 && slots_overlap(p, a->in[k], b->out[m])) return true;
    }
    return false;
}

/* Predicted time of a step in ns on `threads` threads: a fixed cost plus its work at a
 * typical rate of one core (flops at 170 GFLOP/s, bytes moved at 20 GB/s); on more threads
 * the work divides and the fixed cost grows by a fork and join, except for steps too
 * small for their kernels to split (KD_MIN_PARALLEL_WORK's 2 MFLOP). Rough by design:
 * it only has to rank in-order against side by side. */
static double step_cost(const struct kiln_plan *p, const struct step *sp, int threads)
{
    double f = step_flops(p, sp), bytes = 0;
    for (int k = 0; k < sp->n_out; k++)
        if (sp->out[k] >= 0) bytes += (double)p->slots[sp->out[k]].bytes;
    for (int k = 0; k < sp->n_in; k++)
        if (sp->in[k] >= 0 && p->slots[kiln_plan_root_of(p, sp->in[k])].kind != SLOT_CONST)
            bytes += (double)p->slots[sp->in[k]].bytes;
    double work = f / 170.0 + bytes / 20.0;
    if (threads <= 1 || (f > 0 ? f : bytes) < 2e6) return 3000.0 + work;
    return 5000.0 + work / threads;
}

struct lane_uf {
    int *parent;
    double *cost; /* per root: the component's one-thread cost */
};

static int uf_find(struct lane_uf *u, int x)
{
    while (u->parent[x] != x) x = u->parent[x] = u->parent[u->parent[x]];
    return x;
}

/* Deal the components of steps [a, b) (roots in u) onto at most `lanes` lanes, largest
 * first onto the least loaded; returns the busiest lane's cost and sets *used. With
 * lane_of non-NULL, writes each step's lane. */
static double lanes_deal(const struct kiln_plan *p, struct lane_uf *u, int a, int b, int lanes,
                         int *used, int *order, double *load, int *lane_of)
{
    int nc = 0;
    for (int i = a; i < b; i++)
        if (uf_find(u, i - a) == i - a) order[nc++] = i - a;
    for (int x = 1; x < nc; x++) { /* by cost, descending */
        int c = order[x], y = x - 1;
        while (y >= 0 && u->cost[order[y]] < u->cost[c]) {
            order[y + 1] = order[y];
            y--;
        }
        order[y + 1] = c;
    }
    int nl = nc < lanes ? nc : lanes;
    for (int l = 0; l < nl; l++) load[l] = 0;
    for (int x = 0; x < nc; x++) {
        int best = 0;
        for (int l = 1; l < nl; l++)
            if (load[l] < load[best]) best = l;
        load[best] += u->cost[order[x]];
        if (lane_of)
            for (int i = a; i < b; i++)
                if (uf_find(u, i - a) == order[x]) lane_of[i] = best;
    }
    double worst = 0;
    for (int l = 0; l < nl; l++)
        if (load[l] > worst) worst = load[l];
    (void)p;
    *used = nl;
    return worst;
}

static kiln_status plan_lanes(struct kiln_plan *p, int threads)
{
    const char *env = getenv("KILN_LANES");
    int n = p->n_steps;
    if (threads < 2 || n < 3 || (env && !strcmp(env, "0"))) return KILN_OK;
    size_t nn = (size_t)n + 1;
    int *dep_start = malloc(sizeof(int) * (nn + 1));
    int cap = 4 * n + 16, nd = 0;
    int *deps = malloc(sizeof(int) * (size_t)cap);
    double *c1 = malloc(sizeof(double) * nn), *cp = malloc(sizeof(double) * nn);
    double *best = malloc(sizeof(double) * (nn + 1));
    int *from = malloc(sizeof(int) * (nn + 1)), *lanes_at = malloc(sizeof(int) * (nn + 1));
    int *order = malloc(sizeof(int) * (LANE_MAX_SEG + 1));
    double *load = malloc(sizeof(double) * (LANE_MAX_SEG + 1));
    int *parent = malloc(sizeof(int) * (LANE_MAX_SEG + 1));
    double *ucost = malloc(sizeof(double) * (LANE_MAX_SEG + 1));
    int *lane_of = malloc(sizeof(int) * nn);
    kiln_status st = KILN_OK;
    if (!dep_start || !deps || !c1 || !cp || !best || !from || !lanes_at || !order || !load ||
        !parent || !ucost || !lane_of) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning lanes");
        goto done;
    }
    /* the dependencies of each step on the LANE_MAX_SEG steps before it (farther ones are
     * always in an earlier segment) */
    for (int j = 0; j < n; j++) {
        dep_start[j] = nd;
        for (int i = j - 1; i >= 0 && i >= j - LANE_MAX_SEG; i--) {
            if (!step_after(p, i, j)) continue;
            if (nd == cap) {
                int *d2 = realloc(deps, sizeof(int) * (size_t)(cap *= 2));
                if (!d2) {
                    st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning lanes");
                    goto done;
                }
                deps = d2;
            }
            deps[nd++] = i;
        }
        c1[j] = step_cost(p, &p->steps[j], 1);
        cp[j] = step_cost(p, &p->steps[j], threads);
    }
    dep_start[n] = nd;
    for (int c = 0; c <= n; c++) best[c] = c ? 1e300 : 0;
    struct lane_uf u = {parent, ucost};
    for (int a = 0; a < n; a++) {
        double seq = 0;
        int comps = 0;
        for (int b = a; b < n && b < a + LANE_MAX_SEG; b++) {
            int x = b - a;
            parent[x] = x;
            ucost[x] = c1[b];
            comps++;
            for (int d = dep_start[b]; d < dep_start[b + 1]; d++) {
                if (deps[d] < a) continue;
                int r1 = uf_find(&u, x), r2 = uf_find(&u, deps[d] - a);
                if (r1 == r2) continue;
                parent[r1] = r2;
                ucost[r2] += ucost[r1];
                comps--;
            }
            seq += cp[b];
            double cost = seq;
            int used = 1;
            if (comps > 1) {
                double par = lanes_deal(p, &u, a, b + 1, threads, &used, order, load, NULL) +
                             LANE_FORK_NS;
                if (par < LANE_MIN_GAIN * seq) cost = par;
                else used = 1;
            }
            if (best[a] + cost < best[b + 1]) {
                best[b + 1] = best[a] + cost;
                from[b + 1] = a;
                lanes_at[b + 1] = used;
            }
        }
    }
    /* walk back the chosen cuts */
    int ns = 0, lane_steps = 0;
    for (int c = n; c > 0; c = from[c]) ns++;
    struct lane_seg *segs = calloc((size_t)ns + 1, sizeof *segs);
    if (!segs) {
        st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory planning lanes");
        goto done;
    }
    int k = ns;
    for (int c = n; c > 0; c = from[c]) segs[--k] = (struct lane_seg){from[c], c, lanes_at[c]};
    for (int s = 0; s < ns; s++) {
        struct lane_seg *g = &segs[s];
        if (g->lanes <= 1) continue;
        for (int b = g->begin; b < g->end; b++) { /* the segment's components again */
            int x = b - g->begin;
            parent[x] = x;
            ucost[x] = c1[b];
            for (int d = dep_start[b]; d < dep_start[b + 1]; d++) {
                if (deps[d] < g->begin) continue;
                int r1 = uf_find(&u, x), r2 = uf_find(&u, deps[d] - g->begin);
                if (r1 == r2) continue;
                parent[r1] = r2;
                ucost[r2] += ucost[r1];
            }
        }
        int used = 0;
        lanes_deal(p, &u, g->begin, g->end, threads, &used, order, load, lane_of);
        g->lanes = used;
        for (int b = g->begin; b < g->end; b++) p->steps[b].lane = lane_of[b];
        lane_steps += g->end - g->begin;
    }
    if (lane_steps) {
        p->segs = segs;
        p->n_segs = ns;
        p->lane_steps = lane_steps;
    } else {
        free(segs);
    }
done:
    free(dep_start);
    free(deps);
    free(c1);
    free(cp);
    free(best);
    free(from);
    free(lanes_at);
    free(order);
    free(load);
    free(parent);
    free(ucost);
    free(lane_of);
    return st;
}

/* The segment holding step si, or NULL (no lanes there). */
static const struct lane_seg *lane_seg_of(const struct kiln_plan *p, int si)
{
    for (int s = 0; s < p->n_segs; s++)
        if (p->segs[s].begin <= si && si < p->segs[s].end)
            return p->segs[s].lanes > 1 ? &p->segs[s] : NULL;
    return NULL;
}

static kiln_status plan_compile(const struct kiln_graph *g, const kiln_tensor *const *inputs,
                                struct kiln_weight_cache *weights, int threads, int precision,
                                const struct kiln_plan_node_prec *ov, int n_ov,
                                struct kiln_plan **out)
{
    *out = NULL;
    struct kiln_type *types = calloc((size_t)g->n_inputs + 1, sizeof *types);
    if (!types) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
    kiln_status st = KILN_OK;
    for (int i = 0; i < g->n_inputs && st == KILN_OK; i++) {
        kiln_type_from_tensor(&types[i], inputs[i]);
        if (inputs[i]->dtype == KILN_DTYPE_STRING) st = kiln_plan_unsupported(NULL, "it has string inputs");
        else if (kiln_dtype_is_container(inputs[i]->dtype))
            st = kiln_plan_unsupported(NULL, "it has sequence or optional inputs");
    }
    if (st == KILN_OK)
        st = kiln_plan_compile_typed(g, types, NULL, NULL, 0, weights, threads, precision, ov, n_ov, out);
    free(types);
    return st;
}

kiln_status kiln_plan_compile_typed(const struct kiln_graph *g, const struct kiln_type *in_types,
                                      const unsigned char *donate,
                                      const struct kiln_plan *parent, int depth,
                                      struct kiln_weight_cache *weights, int threads,
                                      int precision, const struct kiln_plan_node_prec *ov,
                                      int n_ov, struct kiln_plan **out)
{
    *out = NULL;
    int *need = NULL, *packed_uses = NULL; /* per value: reads in the graph, packed reads */
    struct kiln_plan *p = calloc(1, sizeof *p);
    if (!p) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
    pthread_mutex_init(&p->mu, NULL);
    p->g = g;
    p->depth = depth;
    p->bodies_left_own = PLAN_MAX_BODY_PLANS;
    p->bodies_left = parent ? parent->bodies_left : &p->bodies_left_own;
    if (donate) {
        p->donate = malloc((size_t)g->n_inputs + 1);
        if (!p->donate) goto oom;
        memcpy(p->donate, donate, (size_t)g->n_inputs);
    }
    kiln_status st = KILN_OK;
    /* kernels are compiled for the most threads a run may lease (0 = every core) */
    int cpus = kiln_cpu_count();
    int plan_threads = threads > 0 && threads < cpus ? threads : cpus;
    if (plan_threads < 1) plan_threads = 1;
    p->n_in = g->n_inputs;
    p->in_types = calloc((size_t)g->n_inputs + 1, sizeof *p->in_types);
    p->steps = calloc((size_t)g->n_nodes + 1, sizeof *p->steps);
    if (!p->in_types || !p->steps) goto oom;
    need = calloc((size_t)g->n_values + 1, sizeof *need);
    packed_uses = calloc((size_t)g->n_values + 1, sizeof *packed_uses);
    if (!need || !packed_uses) goto oom;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            if (g->nodes[i].in[k] >= 0) need[g->nodes[i].in[k]]++;
    for (int i = 0; i < g->n_outputs; i++) need[g->outputs[i]]++; /* copied out per run */
    for (int v = 0; v < g->n_values; v++)
        if (slot_add(p) < 0) goto oom;
    for (int v = 0; v < g->n_values; v++) {
        const struct kiln_value *val = &g->values[v];
        struct slot *s = &p->slots[v];
        if (val->kind == KILN_VALUE_CONST) {
            s->kind = SLOT_CONST;
            s->konst = val->konst;
            kiln_type_from_tensor(&s->type, val->konst);
        } else if (val->kind == KILN_VALUE_OUTER) {
            /* a body's capture: a constant of the enclosing plan stays one; anything
             * else is an input of the body's runs after its own */
            const struct slot *ps =
                parent && val->outer >= 0 && val->outer < parent->g->n_values
                    ? &parent->slots[val->outer] : NULL;
            if (!ps || ps->kind == SLOT_NONE) {
                st = kiln_plan_unsupported(NULL, "it captures values of an enclosing graph");
                goto fail;
            }
            if (ps->kind == SLOT_CONST) {
                s->kind = SLOT_CONST;
                s->konst = ps->konst;
                s->type = ps->type;
                continue;
            }
            if (ps->layout || ps->type.dtype == KILN_DTYPE_STRING ||
                kiln_dtype_is_container(ps->type.dtype)) {
                st = kiln_plan_unsupported(NULL, "a body captures a blocked, string or sequence value");
                goto fail;
            }
            int *co = realloc(p->cap_outer, sizeof *co * ((size_t)p->n_caps + 1));
            if (!co) goto oom;
            p->cap_outer = co;
            co[p->n_caps] = val->outer;
            s->kind = SLOT_INPUT;
            s->input_index = g->n_inputs + p->n_caps++;
            s->type = ps->type;
        }
    }
    for (int i = 0; i < g->n_inputs; i++) {
        struct slot *s = &p->slots[g->inputs[i]];
        s->kind = SLOT_INPUT;
        s->input_index = i;
        s->type = in_types[i];
        p->in_types[i] = s->type;
        if (in_types[i].dtype == KILN_DTYPE_STRING) {
            st = kiln_plan_unsupported(NULL, "it has string inputs");
            goto fail;
        }
        if (kiln_dtype_is_container(in_types[i].dtype)) {
            st = kiln_plan_unsupported(NULL, "it has sequence or optional inputs");
            goto fail;
        }
        if (!kiln_type_is_concrete(&in_types[i])) {
            st = kiln_plan_unsupported(NULL, "an input's shape is not known");
            goto fail;
        }
    }

    /* walk the nodes: infer, fold what is known, make steps */
    for (int oi = 0; oi < g->n_nodes; oi++) {
        const struct kiln_node *n = &g->nodes[g->order[oi]];
        const struct kiln_op_impl *impl = kiln_op_impl(n->op);
        unsigned flags = kiln_op_info(n->op)->flags;
        if (!impl) {
            st = kiln_node_error(n, KILN_ERR_UNSUPPORTED, "no kernel for this op");
            goto fail;
        }
        if (n->n_in > KILN_MAX_IO || n->n_out > KILN_MAX_IO) {
            st = kiln_plan_unsupported(n, "too many inputs or outputs");
            goto fail;
        }
        kiln_tensor *inv[KILN_MAX_IO];
        const struct kiln_type *inp[KILN_MAX_IO];
        struct kiln_type outtype[KILN_MAX_IO];
        struct kiln_type *outp[KILN_MAX_IO];
        bool all_known = true;
        for (int k = 0; k < n->n_in; k++) {
            inv[k] = NULL;
            inp[k] = NULL;
            if (n->in[k] < 0) continue;
            struct slot *s = &p->slots[n->in[k]];
            if (s->kind == SLOT_NONE) {
                st = kiln_node_error(n, KILN_ERR_INTERNAL, "input %d has no value", k);
                goto fail;
            }
            inp[k] = &s->type;
            if (s->kind == SLOT_CONST) inv[k] = (kiln_tensor *)s->konst;
            else all_known = false;
        }
        for (int k = 0; k < n->n_out; k++) {
            kiln_type_unknown(&outtype[k]);
            outp[k] = &outtype[k];
        }
        /* Shape and Size only need their input's type */
        if ((n->op == KILN_OP_Shape || n->op == KILN_OP_Size) && n->in[0] >= 0 && !inv[0]) {
            kiln_tensor *dummy;
            const struct kiln_type *t = inp[0];
            if ((st = kiln_tensor_new_uninit(t->dtype == KILN_DTYPE_STRING ? KILN_DTYPE_U8 : t->dtype,
                                             0, NULL, &dummy)) != KILN_OK)
                goto fail;
            /* a header with the right dims and no data: Shape/Size read only dims */
            dummy->rank = t->rank;
            memcpy(dummy->dims, t->dims, sizeof dummy->dims);
            kiln_tensor *fin[KILN_MAX_IO];
            memcpy(fin, inv, sizeof(kiln_tensor *) * (size_t)n->n_in);
            fin[0] = dummy;
            st = fold_node(p, n, fin);
            kiln_tensor_free(dummy);
            if (st != KILN_OK) goto fail;
            continue;
        }
        /* Loop and If: one step running plans of their bodies (control flow, above) */
        struct kiln_kernel_inst ctl_inst;
        bool control = false;
        memset(&ctl_inst, 0, sizeof ctl_inst);
        if (flags & KILN_OPF_SUBGRAPH) {
            struct recompile_env cenv = {weights, plan_threads, precision, ov, n_ov};
            if ((st = acquire_inputs(weights, n, inv, 0)) != KILN_OK ||
                (st = kiln_plan_control_compile(p, n, inp, inv, &cenv, outtype, &ctl_inst)) != KILN_OK)
                goto fail;
            control = true;
        }
        if (!control && (flags & KILN_OPF_SEQ)) {
            st = kiln_plan_unsupported(n, "sequence and optional values run in the reference executor");
            goto fail;
        }
        const struct kiln_fast_op *fast = control ? NULL : kiln_fast_op(n->op);
        if (!control && (st = acquire_inputs(weights, n, inv, fast ? fast->packs : 0)) != KILN_OK)
            goto fail;
        bool dynout = !control && (flags & KILN_OPF_DYNOUT);
        /* an op whose outputs are sized at run time may still have a fast kernel for the
         * cases its shape function knows (TfListSetItem without resize) */
        bool dyn_fast = false;
        if (dynout && fast && !all_known) {
            struct kiln_infer_ctx ictx = {n, n->n_in, inp, (const kiln_tensor *const *)inv,
                                          n->n_out, outp};
            dyn_fast = impl->infer(&ictx) == KILN_OK && kiln_attr_check(n) == KILN_OK;
            for (int k = 0; k < n->n_out && dyn_fast; k++)
                dyn_fast = kiln_type_is_concrete(&outtype[k]);
            if (dyn_fast) dynout = false;
        }
        if (!dynout && !control && !dyn_fast) {
            struct kiln_infer_ctx ictx = {n, n->n_in, inp, (const kiln_tensor *const *)inv,
                                          n->n_out, outp};
            st = impl->infer(&ictx);
            if (st == KILN_OK) st = kiln_attr_check(n);
            if (st != KILN_OK) goto fail;
        }
        int64_t out_bytes = 0;
        for (int k = 0; k < n->n_out && !dynout; k++) {
            if (!kiln_type_is_concrete(&outtype[k])) {
                st = kiln_plan_unsupported(n, "an output shape depends on data");
                goto fail;
            }
            out_bytes += (int64_t)type_bytes(&outtype[k], 0);
        }
        if (all_known && !control && !(flags & KILN_OPF_STATEFUL) &&
            (dynout || out_bytes <= PLAN_FOLD_MAX_BYTES)) {
            if ((st = acquire_inputs(weights, n, inv, 0)) != KILN_OK ||
                (st = fold_node(p, n, inv)) != KILN_OK)
                goto fail;
            continue;
        }
        if (dynout) {
            st = kiln_plan_unsupported(n, "output shapes depend on data");
            goto fail;
        }
        for (int k = 0; k < n->n_out && compile_value_limit > 0; k++) {
            int64_t count = kiln_shape_count(outtype[k].rank, outtype[k].dims);
            int64_t es = (int64_t)kiln_dtype_size(outtype[k].dtype);
            if (count < 0 || (es > 0 && count > compile_value_limit / es)) {
                char shape[160];
                st = kiln_node_error(n, KILN_ERR_OUT_OF_MEMORY,
                                     "output %d of shape %s would be above the session's "
                                     "limit of %lld bytes per tensor", k,
                                     kiln_shape_str(outtype[k].rank, outtype[k].dims, shape,
                                                    sizeof shape),
                                     (long long)compile_value_limit);
                goto fail;
            }
        }
        for (int k = 0; k < n->n_out; k++)
            if (outtype[k].dtype == KILN_DTYPE_STRING) {
                st = kiln_plan_unsupported(n, "it produces strings");
                goto fail;
            }
        /* a step */
        int si = p->n_steps++;
        struct step *sp = &p->steps[si];
        sp->node = n;
        sp->ref = impl;
        sp->scratch_buf = -1;
        if (control) {
            sp->inst = ctl_inst; /* the plan owns it from here */
            p->n_fast++;
        }
        /* a control step also reads the values its bodies capture: inputs after the node's */
        int n_step_in = n->n_in + (control ? n->n_implicit : 0);
        sp->n_in = n_step_in;
        sp->lane = -1;
        sp->n_out = n->n_out;
        sp->in = malloc(sizeof(int) * (size_t)(n_step_in + 1));
        sp->out = malloc(sizeof(int) * (size_t)(n->n_out + 1));
        if (!sp->in || !sp->out) goto oom;
        for (int k = 0; k < n_step_in; k++) {
            int v = k < n->n_in ? n->in[k] : n->implicit[k - n->n_in];
            sp->in[k] = v;
            if (v >= 0) {
                struct slot *s = &p->slots[v];
                if (s->last_use < si) s->last_use = si;
            }
        }
        for (int k = 0; k < n->n_out; k++) {
            int v = n->out[k];
            if (v < 0) {
                v = slot_add(p);
                if (v < 0) goto oom;
                p->slots[v].last_use = si;
            }
            sp->out[k] = v;
            struct slot *s = &p->slots[v];
            s->kind = SLOT_ARENA;
            s->type = outtype[k];
            s->layout = n->out[k] >= 0 ? g->values[n->out[k]].layout : 0;
            s->bytes = type_bytes(&s->type, s->layout);
            s->def_step = si;
        }
        /* a slot for an absent output may have moved the slots: point at them again */
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0) inp[k] = &p->slots[n->in[k]].type;
        /* views share their input's memory (plain layouts only) */
        if (is_view_op(n->op) && n->in[0] >= 0 && n->out[0] >= 0 &&
            g->values[n->in[0]].layout == 0 && p->slots[n->out[0]].layout == 0) {
            struct slot *o = &p->slots[n->out[0]];
            int r = kiln_plan_root_of(p, n->in[0]);
            if (p->slots[r].kind != SLOT_CONST && o->bytes == p->slots[r].bytes) {
                o->kind = SLOT_ALIAS;
                o->alias_of = r;
                p->n_steps--; /* no work: the alias is resolved per run */
                free(sp->in);
                free(sp->out);
                memset(sp, 0, sizeof *sp);
                continue;
            }
        }
        /* the fast kernel, if any */
        if (fast) {
            const struct kiln_type *ot[KILN_MAX_IO];
            int il[KILN_MAX_IO], ol[KILN_MAX_IO];
            for (int k = 0; k < n->n_in; k++) il[k] = n->in[k] >= 0 ? g->values[n->in[k]].layout : 0;
            for (int k = 0; k < n->n_out; k++) {
                ot[k] = n->out[k] >= 0 ? &outtype[k] : NULL;
                ol[k] = n->out[k] >= 0 ? g->values[n->out[k]].layout : 0;
            }
            struct kiln_compile_ctx cc = {n, n->n_in, inp, (const kiln_tensor *const *)inv, il,
                                          n->n_out, ot, ol, weights, plan_threads,
                                          node_precision(n, precision, ov, n_ov), 0};
            st = fast->compile(&cc, &sp->inst);
            if (st != KILN_OK) goto fail;
            if (dyn_fast && !sp->inst.run) {
                st = kiln_plan_unsupported(n, "output shapes depend on data");
                goto fail;
            }
            if (sp->inst.run) {
                p->n_fast++;
                const char *why = step_fallback(sp);
                if (why) note_fallback(p, sp, why, inp, n->n_in, ot[0]);
                if (sp->inst.scratch_bytes) {
                    sp->scratch_buf = buf_add(p, sp->inst.scratch_bytes, si, si);
                    if (sp->scratch_buf < 0) goto oom;
                }
            } else {
                kiln_kernel_inst_destroy(&sp->inst);
            }
        }
        if (!sp->inst.run || control) {
            for (int k = 0; k < sp->n_in; k++)
                if (sp->in[k] >= 0 && sp->in[k] < g->n_values && g->values[sp->in[k]].layout) {
                    st = kiln_plan_unsupported(n, "a blocked-layout input has no fast kernel");
                    goto fail;
                }
            for (int k = 0; k < n->n_out; k++)
                if (n->out[k] >= 0 && g->values[n->out[k]].layout) {
                    st = kiln_plan_unsupported(n, "a blocked-layout output has no fast kernel");
                    goto fail;
                }
        }
        if ((st = settle_inputs(p, weights, si, need, packed_uses)) != KILN_OK) goto fail;
    }

    /* graph outputs: allocated per run (or copied from constants / inputs) */
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        struct slot *s = &p->slots[v];
        if (s->kind == SLOT_NONE) {
            st = kiln_error(KILN_ERR_INTERNAL, "graph output '%s' has no value", g->values[v].name);
            goto fail;
        }
        if (s->layout) {
            st = kiln_plan_unsupported(NULL, "a graph output is in a blocked layout");
            goto fail;
        }
        /* a constant output is copied out by every run: pinned */
        if (s->kind == SLOT_CONST && (st = kiln_weight_cache_acquire(weights, s->konst, 1)) != KILN_OK)
            goto fail;
        s->last_use = INT32_MAX;
        if (s->kind == SLOT_ARENA) s->kind = SLOT_OUTPUT;
        if (s->kind == SLOT_OUTPUT && s->bytes > p->max_value_bytes) p->max_value_bytes = s->bytes;
    }
    /* Concats whose producers write straight into their slices of the output */
    struct recompile_env renv = {weights, plan_threads, precision, ov, n_ov};
    if ((st = concat_in_place(p, &renv)) != KILN_OK ||
        (st = concat_fold_reader(p, &renv)) != KILN_OK || (st = drop_empty_steps(p)) != KILN_OK)
        goto fail;
    /* group lifetimes: an alias keeps its root alive */
    for (int v = 0; v < p->n_slots; v++)
        if (p->slots[v].kind == SLOT_ALIAS) {
            int r = p->slots[v].alias_of;
            if (p->slots[v].last_use > p->slots[r].last_use) p->slots[r].last_use = p->slots[v].last_use;
        }
    /* independent chains side by side (before in place, which must respect the lanes) */
    if ((st = plan_lanes(p, plan_threads)) != KILN_OK) goto fail;
    /* in place: a step may write over one input (elementwise ops: input 0; a convolution's
     * residual sum: its Sum input) when nothing reads that input's memory later */
    for (int si = 0; si < p->n_steps; si++) {
        struct step *sp = &p->steps[si];
        int ii = sp->inst.inplace_input;
        if (!sp->inst.run || !sp->inst.inplace || ii < 0 || ii >= sp->n_in || sp->in[ii] < 0)
            continue;
        struct slot *o = &p->slots[sp->out[0]];
        int r = kiln_plan_root_of(p, sp->in[ii]);
        struct slot *rs = &p->slots[r];
        /* a donated input (a Loop body's carried value) may be written over too, by a
         * graph output: the output is then handed back as the input's tensor */
        bool donated = donated_input(p, r) && (o->kind == SLOT_ARENA || o->kind == SLOT_OUTPUT) &&
                       rs->last_use == si && type_bytes(&rs->type, 0) == o->bytes && !o->layout &&
                       !rs->layout;
        if (!donated && (o->kind != SLOT_ARENA || rs->kind != SLOT_ARENA || rs->last_use != si ||
                         rs->bytes != o->bytes || o->layout != rs->layout))
            continue;
        bool other_input_shares = false; /* another input of this step on the same memory */
        for (int k = 0; k < sp->n_in; k++)
            if (k != ii && sp->in[k] >= 0 && kiln_plan_root_of(p, sp->in[k]) == r) other_input_shares = true;
        if (other_input_shares) continue;
        /* in a lanes segment, only over memory its own lane wrote there: another lane may
         * still read memory from before the segment */
        const struct lane_seg *lg = lane_seg_of(p, si);
        if (lg && (rs->def_step < lg->begin || rs->def_step >= si ||
                   p->steps[rs->def_step].lane != sp->lane))
            continue;
        o->kind = SLOT_ALIAS;
        o->alias_of = r;
        rs->last_use = o->last_use;
        for (int v = 0; v < p->n_slots; v++) /* later aliases of o now hang off r */
            if (p->slots[v].kind == SLOT_ALIAS && p->slots[v].alias_of == sp->out[0]) {
                p->slots[v].alias_of = r;
                if (p->slots[v].last_use > rs->last_use) rs->last_use = p->slots[v].last_use;
            }
    }
    for (int v = 0; v < p->n_slots; v++) {
        struct slot *s = &p->slots[v];
        if (s->kind != SLOT_ARENA) continue;
        if (s->bytes == (size_t)-1) {
            st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "value '%s' is too large",
                            v < g->n_values ? g->values[v].name : "?");
            goto fail;
        }
        if (s->bytes > p->max_value_bytes) p->max_value_bytes = s->bytes;
        int last = s->last_use < s->def_step ? s->def_step : s->last_use;
        s->buf = buf_add(p, s->bytes, s->def_step, last);
        if (s->buf < 0) goto oom;
    }
    /* a buffer live anywhere in a lanes segment is live through all of it: the lanes'
     * steps run in any order against each other */
    for (int sg = 0; sg < p->n_segs; sg++) {
        const struct lane_seg *lg = &p->segs[sg];
        if (lg->lanes <= 1) continue;
        for (int b = 0; b < p->n_bufs; b++) {
            struct buffer *bf = &p->bufs[b];
            if (bf->first >= lg->end || bf->last < lg->begin) continue;
            if (bf->first > lg->begin) bf->first = lg->begin;
            if (bf->last < lg->end - 1) bf->last = lg->end - 1;
        }
    }
    if ((st = assign_offsets(p)) != KILN_OK) goto fail;
    free(need);
    free(packed_uses);
    *out = p;
    return KILN_OK;
oom:
    st = kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling a plan");
fail:
    free(need);
    free(packed_uses);
    kiln_plan_free(p);
    return st;
}

static void arena_inst_free(struct arena_inst *a)
{
    if (!a) return;
    free(a->mem);
    free(a->t);
    free(a->tp);
    free(a);
}

void kiln_plan_free(struct kiln_plan *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_steps; i++) {
        kiln_kernel_inst_destroy(&p->steps[i].inst);
        free(p->steps[i].in);
        free(p->steps[i].out);
        free(p->steps[i].elided);
    }
    for (struct arena_inst *a = p->all, *next; a; a = next) {
        next = a->all_next;
        arena_inst_free(a);
    }
    for (int i = 0; i < p->n_folded; i++) kiln_tensor_free(p->folded[i]);
    free(p->folded);
    free(p->steps);
    free(p->slots);
    free(p->bufs);
    free(p->in_types);
    free(p->cap_outer);
    free(p->donate);
    free(p->fallbacks);
    free(p->segs);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

size_t kiln_plan_arena_bytes(const struct kiln_plan *p) { return p->arena_bytes; }
size_t kiln_plan_max_value_bytes(const struct kiln_plan *p) { return p->max_value_bytes; }
int kiln_plan_fast_steps(const struct kiln_plan *p) { return p->n_fast; }
int kiln_plan_steps(const struct kiln_plan *p) { return p->n_steps; }
int kiln_plan_lane_steps(const struct kiln_plan *p) { return p->lane_steps; }
int kiln_plan_concat_folded(const struct kiln_plan *p) { return p->concat_folded; }
int kiln_plan_concat_removed(const struct kiln_plan *p) { return p->concat_removed; }

/* ---- running ---- */

static void header_set(kiln_tensor *t, const struct slot *s, void *data)
{
    t->dtype = s->type.dtype;
    t->rank = s->type.rank;
    memset(t->dims, 0, sizeof t->dims);
    for (int d = 0; d < s->type.rank; d++) t->dims[d] = s->type.dims[d];
    t->data = data;
    t->nbytes = s->bytes;
    t->owns_data = 0;
}

static struct arena_inst *arena_take(struct kiln_plan *p)
{
    pthread_mutex_lock(&p->mu);
    struct arena_inst *a = p->free_list;
    if (a) p->free_list = a->next;
    pthread_mutex_unlock(&p->mu);
    if (a) return a;
    a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->mem = aligned_alloc(PLAN_ALIGN, p->arena_bytes ? p->arena_bytes : PLAN_ALIGN);
    a->t = calloc((size_t)p->n_slots + 1, sizeof *a->t);
    a->tp = calloc((size_t)p->n_slots + 1, sizeof *a->tp);
    if (!a->mem || !a->t || !a->tp) {
        arena_inst_free(a);
        return NULL;
    }
    for (int v = 0; v < p->n_slots; v++) {
        const struct slot *s = &p->slots[v];
        if (s->kind == SLOT_ARENA) {
            header_set(&a->t[v], s, (char *)a->mem + p->bufs[s->buf].off);
            a->tp[v] = &a->t[v];
        } else if (s->kind == SLOT_CONST) {
            a->tp[v] = (kiln_tensor *)s->konst;
        } else if (s->kind == SLOT_ALIAS) {
            a->tp[v] = &a->t[v];
        }
    }
    pthread_mutex_lock(&p->mu);
    a->all_next = p->all;
    p->all = a;
    pthread_mutex_unlock(&p->mu);
    return a;
}

static void arena_give(struct kiln_plan *p, struct arena_inst *a)
{
    pthread_mutex_lock(&p->mu);
    a->next = p->free_list;
    p->free_list = a;
    pthread_mutex_unlock(&p->mu);
}

/* Run step si of a run on `threads` threads. */
static kiln_status run_step(struct kiln_plan *p, struct arena_inst *a, int si, int threads,
                        int prof, const kiln_run_options *ro, struct kiln_exec_frame *frame)
{
    kiln_status st;
    struct step *sp = &p->steps[si];
    if (ro && (st = kiln_exec_check_deadline(ro)) != KILN_OK) return st;
    kiln_tensor *in[KILN_MAX_IO];
    kiln_tensor *outt[KILN_MAX_IO];
    for (int k = 0; k < sp->n_in; k++)
        in[k] = sp->in[k] >= 0 && !(sp->elided && sp->elided[k]) ? a->tp[sp->in[k]] : NULL;
    for (int k = 0; k < sp->n_out; k++) outt[k] = a->tp[sp->out[k]];
    void *scratch = sp->scratch_buf >= 0 ? (char *)a->mem + p->bufs[sp->scratch_buf].off : NULL;
    struct kiln_run_ctx rctx = {sp->node, sp->n_in, in, sp->n_out, outt, frame, scratch, threads};
    int64_t t0 = prof ? now_ns() : 0;
    if (sp->inst.run) {
        st = sp->inst.run(sp->inst.state, &rctx);
    } else {
        /* reference kernels expect zeroed outputs */
        for (int k = 0; k < sp->n_out; k++)
            if (outt[k]->nbytes) memset(outt[k]->data, 0, outt[k]->nbytes);
        st = sp->ref->run(&rctx);
        if (st == KILN_OK) st = kiln_attr_check(sp->node);
    }
    if (prof) {
        atomic_fetch_add(&sp->ns, now_ns() - t0);
        atomic_fetch_add(&sp->calls, 1);
    }
    if (st != KILN_OK) return st;
    for (int k = 0; k < sp->n_out; k++)
        if (rctx.out[k] != outt[k])
            return kiln_node_error(sp->node, KILN_ERR_INTERNAL, "kernel replaced output %d", k);
    return KILN_OK;
}

kiln_status kiln_plan_run(struct kiln_plan *p, kiln_tensor *const *inputs, kiln_tensor **outputs,
                          int threads, const kiln_run_options *ro)
{
    return kiln_plan_run_profiled(p, inputs, outputs, threads, ro, 0);
}

/* The caller's tensor to write graph output slot v into (preset[i] for the first graph
 * output i on v, when it has v's type), or NULL. */
static kiln_tensor *preset_for(const struct kiln_plan *p, kiln_tensor *const *preset, int v)
{
    if (!preset) return NULL;
    const struct slot *s = &p->slots[v];
    for (int i = 0; i < p->g->n_outputs; i++) {
        if (p->g->outputs[i] != v) continue;
        kiln_tensor *t = preset[i];
        if (!t || t->dtype != s->type.dtype || t->rank != s->type.rank || t->nbytes != s->bytes ||
            memcmp(t->dims, s->type.dims, sizeof(int64_t) * (size_t)t->rank) != 0)
            return NULL;
        return t;
    }
    return NULL;
}

static bool is_preset(const struct kiln_plan *p, kiln_tensor *const *preset, const kiln_tensor *t)
{
    for (int i = 0; preset && t && i < p->g->n_outputs; i++)
        if (preset[i] == t) return true;
    return false;
}

kiln_status kiln_plan_run_profiled(struct kiln_plan *p, kiln_tensor *const *inputs,
                                   kiln_tensor **outputs, int threads,
                                   const kiln_run_options *ro, int profile)
{
    int granted = kiln_threads_acquire(threads);
    kiln_status st =
        kiln_plan_run_in(p, inputs, outputs, granted, ro, profile || profiling(), NULL, NULL);
    kiln_threads_release(granted);
    return st;
}

/* A run on `granted` threads already leased (a body's plan runs inside its Loop's or If's
 * step, on the threads of the enclosing run). inputs: the graph's, then a body's captures;
 * parent: the enclosing run's frame (NULL at the top). */
kiln_status kiln_plan_run_in(struct kiln_plan *p, kiln_tensor *const *inputs,
                               kiln_tensor **outputs, int granted, const kiln_run_options *ro,
                               int prof, struct kiln_exec_frame *parent,
                               kiln_tensor *const *preset)
{
    const struct kiln_graph *g = p->g;
    for (int i = 0; i < g->n_outputs; i++) outputs[i] = NULL;
    struct arena_inst *a = arena_take(p);
    if (!a) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory for a run's arena (%zu bytes)",
                              p->arena_bytes);
    kiln_status st = KILN_OK;
    /* the frame control steps read the deadline from (and nothing else: their bodies' plans
     * take captures as inputs) */
    struct kiln_exec_frame frame = {.g = g, .parent = parent, .vals = a->tp, .depth = p->depth,
                                    .max_tensor_bytes = KILN_EXEC_DEFAULT_MAX_TENSOR_BYTES,
                                    .ro = ro, .profile = prof};
    if (prof) { /* the most threads any profiled run had */
        int seen = atomic_load(&p->prof_threads);
        while (seen < granted && !atomic_compare_exchange_weak(&p->prof_threads, &seen, granted)) {
        }
    }
    /* inputs, outputs and aliases of this run */
    for (int v = 0; v < p->n_slots; v++) {
        const struct slot *s = &p->slots[v];
        if (s->kind == SLOT_INPUT) {
            a->tp[v] = inputs[s->input_index];
        } else if (s->kind == SLOT_OUTPUT) {
            kiln_tensor *t = preset_for(p, preset, v);
            if (!t) {
                st = kiln_tensor_new_uninit(s->type.dtype, s->type.rank, s->type.dims, &t);
                if (st != KILN_OK) goto out;
            }
            a->tp[v] = t;
        }
    }
    for (int v = 0; v < p->n_slots; v++) {
        const struct slot *s = &p->slots[v];
        if (s->kind == SLOT_ALIAS)
            header_set(&a->t[v], s, (char *)a->tp[s->alias_of]->data + s->alias_off);
    }
    if (p->segs && granted > 1) {
        for (int sg = 0; sg < p->n_segs && st == KILN_OK; sg++) {
            const struct lane_seg *lg = &p->segs[sg];
            if (lg->lanes <= 1 || lg->lanes > granted) {
                for (int si = lg->begin; si < lg->end && st == KILN_OK; si++)
                    st = run_step(p, a, si, granted, prof, ro, &frame);
                continue;
            }
            kiln_status lane_st[LANE_MAX_SEG];
            for (int l = 0; l < lg->lanes; l++) lane_st[l] = KILN_OK;
#pragma omp parallel num_threads(lg->lanes)
            {
                int lane = omp_get_thread_num(), team = omp_get_num_threads();
                kiln_status ls = KILN_OK;
                /* a smaller team than asked (nested, or a thread limit): lane l runs on
                 * thread l % team, in step order */
                for (int si = lg->begin; si < lg->end && ls == KILN_OK; si++)
                    if (p->steps[si].lane % team == lane) ls = run_step(p, a, si, 1, prof, ro, &frame);
                lane_st[lane] = ls;
            }
            for (int l = 0; l < lg->lanes && st == KILN_OK; l++) st = lane_st[l];
        }
        if (st != KILN_OK) goto out;
    } else {
        for (int si = 0; si < p->n_steps; si++)
            if ((st = run_step(p, a, si, granted, prof, ro, &frame)) != KILN_OK) goto out;
    }
    /* an output on a donated input's memory is handed back as that input's tensor (the
     * first such output of each input), retyped: done last, so that the outputs copied
     * from the input's memory (the input slot itself beside a view of it) still read it
     * with its own type */
    int hand[KILN_MAX_IO];
    int n_hand = 0;
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        const struct slot *s = &p->slots[v];
        bool repeat = false;
        for (int j = 0; j < i; j++) repeat |= g->outputs[j] == v;
        int r = kiln_plan_root_of(p, v);
        if (n_hand < KILN_MAX_IO && donated_input(p, r) && slot_off(p, v) == 0 &&
            type_bytes(&s->type, 0) == inputs[p->slots[r].input_index]->nbytes) {
            bool handed = false;
            for (int j = 0; j < n_hand; j++)
                handed |= kiln_plan_root_of(p, g->outputs[hand[j]]) == r;
            if (!handed) {
                hand[n_hand++] = i;
                continue;
            }
        }
        if (s->kind == SLOT_OUTPUT && !repeat) {
            outputs[i] = a->tp[v];
            a->tp[v] = NULL;
        } else {
            const kiln_tensor *src = repeat && s->kind == SLOT_OUTPUT ? outputs[0] : a->tp[v];
            if (repeat && s->kind == SLOT_OUTPUT)
                for (int j = 0; j < i; j++)
                    if (g->outputs[j] == v) src = outputs[j];
            st = kiln_tensor_clone(src, &outputs[i]);
            if (st != KILN_OK) goto out;
        }
    }
    for (int h = 0; h < n_hand; h++) {
        int i = hand[h];
        const struct slot *s = &p->slots[g->outputs[i]];
        kiln_tensor *t = inputs[p->slots[kiln_plan_root_of(p, g->outputs[i])].input_index];
        t->dtype = s->type.dtype;
        t->rank = s->type.rank;
        memset(t->dims, 0, sizeof t->dims);
        for (int d = 0; d < s->type.rank; d++) t->dims[d] = s->type.dims[d];
        outputs[i] = t;
    }
out:
    for (int v = 0; v < p->n_slots; v++)
        if (p->slots[v].kind == SLOT_OUTPUT) {
            if (!is_preset(p, preset, a->tp[v])) kiln_tensor_free(a->tp[v]);
            a->tp[v] = NULL;
        } else if (p->slots[v].kind == SLOT_INPUT) {
            a->tp[v] = NULL;
        }
    if (st != KILN_OK)
        for (int i = 0; i < g->n_outputs; i++) {
            bool given = false; /* a donated input handed back stays the caller's */
            for (int k = 0; p->donate && k < g->n_inputs; k++)
                given |= p->donate[k] && outputs[i] == inputs[k];
            if (!given && !is_preset(p, preset, outputs[i])) kiln_tensor_free(outputs[i]);
            outputs[i] = NULL;
        }
    arena_give(p, a);
    return st;
}

/* ---- profile ---- */

/* Floating-point operations of one run of a step (exec/flops.c; 0 where not counted). */
static double step_flops(const struct kiln_plan *p, const struct step *sp)
{
    const struct kiln_type *in[KILN_MAX_IO];
    if (sp->reads_concat) return 0; /* a Concat folded into its reader: data movement */
    for (int k = 0; k < sp->n_in && k < KILN_MAX_IO; k++)
        in[k] = sp->in[k] >= 0 ? &p->slots[sp->in[k]].type : NULL;
    const struct kiln_type *o =
        sp->n_out > 0 && sp->out[0] >= 0 ? &p->slots[sp->out[0]].type : NULL;
    return kiln_node_flops(sp->node, in, sp->n_in < KILN_MAX_IO ? sp->n_in : KILN_MAX_IO, o);
}

/* The fp32 FMA peak on `threads` threads with the current SIMD table, measured once per
 * thread count and table (KILN_ISA may change between prints). */
static double profile_peak(int threads)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int known_threads;
    static const struct simd_kernels *known_table;
    static double known;
    const struct simd_kernels *table = simd_kernels_for();
    pthread_mutex_lock(&mu);
    if (known_threads != threads || known_table != table) {
        known = simd_fma_peak_gflops(threads);
        known_threads = threads;
        known_table = table;
    }
    double g = known;
    pthread_mutex_unlock(&mu);
    return g;
}

/* "GFLOP/s share-of-peak" columns for flops of work in ns, or blanks. */
static void print_rate(FILE *f, double flops, double ns, double peak)
{
    if (flops > 0 && ns > 0) {
        double g = flops / ns;
        fprintf(f, " %8.1f %5.0f%%", g, peak > 0 ? 100.0 * g / peak : 0.0);
    } else {
        fprintf(f, " %8s %6s", "-", "-");
    }
}

/* ns spent on reference steps and on all steps of p since profiling began. */
static void reference_time(const struct kiln_plan *p, int64_t *ref, int64_t *all)
{
    for (int i = 0; i < p->n_steps; i++) {
        const struct step *sp = &p->steps[i];
        int64_t ns = atomic_load(&((struct step *)sp)->ns);
        *all += ns;
        if (step_is_reference(sp)) *ref += ns;
    }
}

/* Every step that runs reference code (Kiln's reference kernel, or oneDNN's reference
 * implementation behind a fast kernel), and their share of the time. */
static void profile_print_reference(const struct kiln_plan *p, FILE *f, int64_t total)
{
    int64_t ref = 0, all = 0;
    int n = 0;
    reference_time(p, &ref, &all);
    for (int i = 0; i < p->n_steps; i++) n += step_is_reference(&p->steps[i]);
    fprintf(f, "reference-kernel steps: %d, %.2f%% of the time\n", n,
            all ? 100.0 * (double)ref / (double)all : 0.0);
    for (int i = 0; i < p->n_steps; i++) {
        const struct step *sp = &p->steps[i];
        if (!step_is_reference(sp)) continue;
        int64_t ns = atomic_load(&((struct step *)sp)->ns);
        int64_t calls = atomic_load(&((struct step *)sp)->calls);
        char shape[96] = "", kern[80];
        if (sp->n_out > 0 && sp->out[0] >= 0) {
            const struct slot *sl = &p->slots[sp->out[0]];
            kiln_shape_str(sl->type.rank, sl->type.dims, shape, sizeof shape);
        }
        if (sp->inst.run) snprintf(kern, sizeof kern, "%s (%s)", sp->inst.name, sp->inst.impl);
        else snprintf(kern, sizeof kern, "reference");
        fprintf(f, "%5d %-32.32s %-20.20s %-28.28s %10.3f %5.1f%%  %s\n", i,
                sp->node->name && sp->node->name[0] ? sp->node->name : "-",
                kiln_op_name(sp->node->op), kern,
                calls ? (double)ns / (double)calls / 1e6 : 0.0,
                total ? 100.0 * (double)ns / (double)total : 0.0, shape);
    }
}

/* The slowest steps (ten, or KILN_PROFILE_STEPS): node name, op, kernel, time, work and
 * rate, first output's shape and layout. */
static void profile_print_slowest(const struct kiln_plan *p, FILE *f, int64_t total, double peak)
{
    const char *env = getenv("KILN_PROFILE_STEPS");
    int want = env ? atoi(env) : 10;
    if (want < 1) want = 1;
    if (want > p->n_steps) want = p->n_steps > 0 ? p->n_steps : 1;
    int *top = malloc(sizeof(int) * (size_t)want), nt = 0;
    if (!top) return;
    for (int i = 0; i < p->n_steps; i++) {
        int64_t ns = atomic_load(&((struct step *)&p->steps[i])->ns);
        int j = nt < want ? nt++ : want;
        while (j > 0 && atomic_load(&((struct step *)&p->steps[top[j - 1]])->ns) < ns) {
            if (j < want) top[j] = top[j - 1];
            j--;
        }
        if (j < want) top[j] = i;
    }
    if (!nt || !total) {
        free(top);
        return;
    }
    fprintf(f, "slowest steps:\n%5s %-32s %-20s %-22s %10s %6s %10s %8s %6s  %s\n", "step", "node",
            "op", "kernel", "ms/run", "share", "MFLOP", "GFLOP/s", "peak", "output");
    for (int k = 0; k < nt; k++) {
        const struct step *sp = &p->steps[top[k]];
        int64_t ns = atomic_load(&((struct step *)sp)->ns);
        int64_t calls = atomic_load(&((struct step *)sp)->calls);
        char shape[96] = "";
        int layout = 0;
        if (sp->n_out > 0 && sp->out[0] >= 0) {
            const struct slot *sl = &p->slots[sp->out[0]];
            kiln_shape_str(sl->type.rank, sl->type.dims, shape, sizeof shape);
            layout = sl->layout;
        }
        double per_run = calls ? (double)ns / (double)calls : 0.0, flops = step_flops(p, sp);
        fprintf(f, "%5d %-32.32s %-20.20s %-22.22s %10.3f %5.1f%%", top[k],
                sp->node->name && sp->node->name[0] ? sp->node->name : "-",
                kiln_op_name(sp->node->op), sp->inst.run ? sp->inst.name : "reference",
                per_run / 1e6, 100.0 * (double)ns / (double)total);
        if (flops > 0)
            fprintf(f, " %10.3f", flops / 1e6);
        else
            fprintf(f, " %10s", "-");
        print_rate(f, flops, per_run, peak);
        fprintf(f, "  %s", shape);
        if (layout) fprintf(f, " (blocked %d)", layout);
        fputc('\n', f);
    }
    free(top);
}

void kiln_plan_profile_print(const struct kiln_plan *p, FILE *f)
{
    struct agg {
        const char *op, *kernel;
        int64_t ns, calls;
        double flops; /* per run, summed over the nodes */
        int count;
    } *ag = calloc((size_t)p->n_steps + 1, sizeof *ag);
    if (!ag) return;
    int na = 0;
    int64_t total = 0;
    for (int i = 0; i < p->n_steps; i++) {
        const struct step *sp = &p->steps[i];
        const char *op = kiln_op_name(sp->node->op);
        const char *kern = sp->inst.run ? sp->inst.name : "reference";
        int j = 0;
        while (j < na && !(strcmp(ag[j].op, op) == 0 && strcmp(ag[j].kernel, kern ? kern : "") == 0))
            j++;
        if (j == na) {
            ag[na].op = op;
            ag[na].kernel = kern ? kern : "";
            na++;
        }
        int64_t ns = atomic_load(&((struct step *)sp)->ns);
        ag[j].ns += ns;
        ag[j].calls += atomic_load(&((struct step *)sp)->calls);
        ag[j].flops += step_flops(p, sp);
        ag[j].count++;
        total += ns;
    }
    for (int i = 1; i < na; i++) {
        struct agg x = ag[i];
        int j = i - 1;
        while (j >= 0 && ag[j].ns < x.ns) {
            ag[j + 1] = ag[j];
            j--;
        }
        ag[j + 1] = x;
    }
    int threads = atomic_load(&((struct kiln_plan *)p)->prof_threads);
    if (threads < 1) threads = 1;
    double peak = total ? profile_peak(threads) : 0.0;
    if (total)
        fprintf(f, "peak: %.1f GFLOP/s (fp32 FMA loop, %s, %d thread%s, measured now)\n", peak,
                simd_kernels_for()->isa, threads, threads > 1 ? "s" : "");
    fprintf(f, "%-24s %-22s %6s %12s %7s %8s %6s\n", "op", "kernel", "nodes", "ms/run", "share",
            "GFLOP/s", "peak");
    for (int i = 0; i < na; i++) {
        double runs = ag[i].count ? (double)ag[i].calls / ag[i].count : 0;
        double ns = runs > 0 ? (double)ag[i].ns / runs : 0;
        fprintf(f, "%-24s %-22s %6d %12.3f %6.1f%%", ag[i].op, ag[i].kernel, ag[i].count, ns / 1e6,
                total ? 100.0 * (double)ag[i].ns / (double)total : 0.0);
        print_rate(f, ag[i].flops, ns, peak);
        fputc('\n', f);
    }
    free(ag);
    profile_print_slowest(p, f, total, peak);
    profile_print_reference(p, f, total);
    /* the plans of Loop and If bodies, whose time their step above includes */
    for (int i = 0; i < p->n_steps; i++) {
        const struct step *sp = &p->steps[i];
        int nb = kiln_plan_control_bodies(&sp->inst);
        for (int b = 0; b < nb; b++) {
            const struct kiln_plan *bp = kiln_plan_control_body(&sp->inst, b);
            int64_t calls = 0;
            for (int k = 0; bp && k < bp->n_steps; k++)
                calls += atomic_load(&((struct step *)&bp->steps[k])->calls);
            if (!calls) continue;
            fprintf(f, "\nbody plan %d of %s node '%s' (step %d; its time is in that step's):\n",
                    b, kiln_op_name(sp->node->op), sp->node->name ? sp->node->name : "", i);
            kiln_plan_profile_print(bp, f);
        }
    }
}

static void profile_reset_plan(struct kiln_plan *p)
{
    for (int k = 0; k < p->n_steps; k++) {
        atomic_store(&p->steps[k].ns, 0);
        atomic_store(&p->steps[k].calls, 0);
        int nb = kiln_plan_control_bodies(&p->steps[k].inst);
        for (int b = 0; b < nb; b++)
            if (kiln_plan_control_body(&p->steps[k].inst, b))
                profile_reset_plan(kiln_plan_control_body(&p->steps[k].inst, b));
    }
}

/* ---- cache ---- */

struct cache_entry {
    struct kiln_type *key;
    int n_key;
    struct kiln_plan *plan;   /* NULL: not plannable */
    kiln_status st;
    char *msg;
    int refs;
    int64_t tick;
};

struct kiln_plan_cache {
    pthread_mutex_t mu;
    int cap, n;
    struct cache_entry *e;
    int64_t tick;
    struct cache_entry *retired; /* evicted while in use: freed on release */
    int n_retired, cap_retired;
    int precision;               /* kiln_precision every plan of this cache is compiled for */
    struct kiln_plan_node_prec *ov; /* per-node overrides of precision (owned copies) */
    int n_ov;
};

void kiln_plan_cache_set_precision(struct kiln_plan_cache *c, int precision)
{
    c->precision = precision;
}

kiln_status kiln_plan_cache_set_node_precisions(struct kiln_plan_cache *c,
                                                const struct kiln_plan_node_prec *ov, int n)
{
    struct kiln_plan_node_prec *copy = calloc((size_t)n + 1, sizeof *copy);
    if (!copy) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) {
        copy[i].precision = ov[i].precision;
        copy[i].node = strdup(ov[i].node);
        if (!copy[i].node) {
            for (int k = 0; k < i; k++) free(copy[k].node);
            free(copy);
            return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
        }
    }
    c->ov = copy;
    c->n_ov = n;
    return KILN_OK;
}

kiln_status kiln_plan_cache_new(int capacity, struct kiln_plan_cache **out)
{
    struct kiln_plan_cache *c = calloc(1, sizeof *c);
    if (!c) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    c->cap = capacity > 0 ? capacity : 16;
    c->e = calloc((size_t)c->cap, sizeof *c->e);
    if (!c->e) {
        free(c);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return KILN_OK;
}

static void entry_clear(struct cache_entry *e)
{
    kiln_plan_free(e->plan);
    free(e->key);
    free(e->msg);
    memset(e, 0, sizeof *e);
}

void kiln_plan_cache_free(struct kiln_plan_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) entry_clear(&c->e[i]);
    for (int i = 0; i < c->n_retired; i++) entry_clear(&c->retired[i]);
    for (int i = 0; i < c->n_ov; i++) free(c->ov[i].node);
    free(c->ov);
    free(c->retired);
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static bool key_match(const struct cache_entry *e, const kiln_tensor *const *inputs, int n)
{
    if (e->n_key != n) return false;
    for (int i = 0; i < n; i++) {
        const struct kiln_type *t = &e->key[i];
        if (t->dtype != inputs[i]->dtype || t->rank != inputs[i]->rank) return false;
        for (int d = 0; d < t->rank; d++)
            if (t->dims[d] != inputs[i]->dims[d]) return false;
    }
    return true;
}

kiln_status kiln_plan_cache_get(struct kiln_plan_cache *c, const struct kiln_graph *g,
                                const kiln_tensor *const *inputs, struct kiln_weight_cache *w,
                                int threads, int64_t max_value_bytes, struct kiln_plan **out)
{
    *out = NULL;
    pthread_mutex_lock(&c->mu);
    c->tick++;
    for (int i = 0; i < c->n; i++) {
        struct cache_entry *e = &c->e[i];
        if (!key_match(e, inputs, g->n_inputs)) continue;
        e->tick = c->tick;
        kiln_status st = e->st;
        if (e->plan) {
            e->refs++;
            *out = e->plan;
        } else {
            kiln_error(st, "%s", e->msg ? e->msg : "graph cannot be planned");
        }
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    struct kiln_plan *p = NULL;
    int64_t outer_limit = compile_value_limit;
    compile_value_limit = max_value_bytes;
    kiln_status st = plan_compile_mixed(g, inputs, w, threads, c->precision, c->ov, c->n_ov, &p);
    compile_value_limit = outer_limit;
    if (st != KILN_OK && st != KILN_ERR_UNSUPPORTED) {
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    char *msg = st == KILN_OK ? NULL : strdup(kiln_last_error());
    struct kiln_type *key = calloc((size_t)g->n_inputs + 1, sizeof *key);
    if (!key) {
        free(msg);
        kiln_plan_free(p);
        pthread_mutex_unlock(&c->mu);
        return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < g->n_inputs; i++) kiln_type_from_tensor(&key[i], inputs[i]);
    struct cache_entry *slot = NULL;
    if (c->n < c->cap) {
        slot = &c->e[c->n++];
    } else {
        /* evict the least recently used; one in use moves to the retired list */
        int lru = 0;
        for (int i = 1; i < c->n; i++)
            if (c->e[i].tick < c->e[lru].tick) lru = i;
        slot = &c->e[lru];
        if (slot->refs > 0) {
            if (c->n_retired == c->cap_retired) {
                int cap = c->cap_retired ? c->cap_retired * 2 : 4;
                struct cache_entry *r = realloc(c->retired, (size_t)cap * sizeof *r);
                if (r) {
                    c->retired = r;
                    c->cap_retired = cap;
                }
            }
            if (c->n_retired == c->cap_retired) {
                free(msg);
                free(key);
                kiln_plan_free(p);
                pthread_mutex_unlock(&c->mu);
                return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory caching a plan");
            }
            c->retired[c->n_retired++] = *slot;
            memset(slot, 0, sizeof *slot);
        } else {
            entry_clear(slot);
        }
    }
    slot->key = key;
    slot->n_key = g->n_inputs;
    slot->plan = p;
    slot->st = st;
    slot->msg = msg;
    slot->tick = c->tick;
    if (p) {
        slot->refs = 1;
        *out = p;
    } else {
        kiln_error(st, "%s", msg ? msg : "graph cannot be planned");
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

void kiln_plan_cache_release(struct kiln_plan_cache *c, struct kiln_plan *p)
{
    if (!p) return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].plan == p) {
            c->e[i].refs--;
            pthread_mutex_unlock(&c->mu);
            return;
        }
    for (int i = 0; i < c->n_retired; i++)
        if (c->retired[i].plan == p && --c->retired[i].refs == 0) {
            entry_clear(&c->retired[i]);
            c->retired[i] = c->retired[--c->n_retired];
            break;
        }
    pthread_mutex_unlock(&c->mu);
}

void kiln_plan_cache_profile_print(struct kiln_plan_cache *c, FILE *f)
{
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        const struct cache_entry *e = &c->e[i];
        if (!e->plan) continue;
        fprintf(f, "plan for inputs");
        for (int k = 0; k < e->n_key; k++) {
            char buf[160];
            fprintf(f, " %s", kiln_shape_str(e->key[k].rank, e->key[k].dims, buf, sizeof buf));
        }
        fprintf(f, ": %d steps, %d fast, arena %zu bytes", e->plan->n_steps, e->plan->n_fast,
                e->plan->arena_bytes);
        int lane_segs = 0;
        for (int s = 0; s < e->plan->n_segs; s++) lane_segs += e->plan->segs[s].lanes > 1;
        if (lane_segs)
            fprintf(f, ", %d steps in %d segments of lanes", e->plan->lane_steps, lane_segs);
        fprintf(f, "\n");
        kiln_plan_profile_print(e->plan, f);
    }
    pthread_mutex_unlock(&c->mu);
}

void kiln_plan_cache_profile_steps(struct kiln_plan_cache *c,
                                   void (*fn)(void *ctx, const struct kiln_plan_step_profile *s),
                                   void *ctx)
{
    pthread_mutex_lock(&c->mu);
    int np = 0;
    for (int i = 0; i < c->n; i++) {
        struct kiln_plan *p = c->e[i].plan;
        if (!p) continue;
        for (int k = 0; k < p->n_steps; k++) {
            struct step *sp = &p->steps[k];
            struct kiln_plan_step_profile r = {
                .plan = np,
                .step = k,
                .node = sp->node->name ? sp->node->name : "",
                .op = kiln_op_name(sp->node->op),
                .kernel = !sp->inst.run ? "reference" : sp->inst.name ? sp->inst.name : "",
                .ns = atomic_load(&sp->ns),
                .calls = atomic_load(&sp->calls),
                .flops = step_flops(p, sp),
            };
            if (r.calls > 0) fn(ctx, &r);
        }
        np++;
    }
    pthread_mutex_unlock(&c->mu);
}

void kiln_plan_cache_profile_reset(struct kiln_plan_cache *c)
{
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        struct kiln_plan *p = c->e[i].plan;
        if (p) profile_reset_plan(p);
    }
    pthread_mutex_unlock(&c->mu);
}

void kiln_plan_cache_summary(struct kiln_plan_cache *c, int *plans, int *steps, int *fast,
                             size_t *arena)
{
    *plans = *steps = *fast = 0;
    *arena = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        const struct kiln_plan *p = c->e[i].plan;
        if (!p) continue;
        (*plans)++;
        if (p->arena_bytes >= *arena) {
            *arena = p->arena_bytes;
            *steps = p->n_steps;
            *fast = p->n_fast;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void kiln_plan_cache_why_none(struct kiln_plan_cache *c, char *buf, size_t n)
{
    if (n) buf[0] = '\0';
    pthread_mutex_lock(&c->mu);
    int64_t best = -1;
    for (int i = 0; i < c->n; i++)
        if (!c->e[i].plan && c->e[i].msg && c->e[i].tick > best) {
            best = c->e[i].tick;
            snprintf(buf, n, "%s", c->e[i].msg);
        }
    pthread_mutex_unlock(&c->mu);
}

double kiln_plan_cache_reference_share(struct kiln_plan_cache *c)
{
    int64_t ref = 0, all = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].plan) reference_time(c->e[i].plan, &ref, &all);
    pthread_mutex_unlock(&c->mu);
    return all > 0 ? (double)ref / (double)all : -1.0;
}

void kiln_plan_cache_concat_lines(struct kiln_plan_cache *c,
                                  void (*line)(void *ctx, const char *s), void *ctx)
{
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        const struct kiln_plan *p = c->e[i].plan;
        if (!p || !p->concat_inputs) continue;
        char buf[320], shape[160];
        int len = snprintf(buf, sizeof buf, "concat in place: plan for");
        for (int k = 0; k < p->n_in && len > 0 && (size_t)len < sizeof buf; k++)
            len += snprintf(buf + len, sizeof buf - (size_t)len, " %s",
                            kiln_shape_str(p->in_types[k].rank, p->in_types[k].dims, shape,
                                           sizeof shape));
        if (len > 0 && (size_t)len < sizeof buf)
            snprintf(buf + len, sizeof buf - (size_t)len,
                     ": %d of %d Concat inputs written in place by their producers, "
                     "%d Concat steps removed, %d inputs strided (batch > 1), "
                     "%d Concat steps folded into their per-channel reader",
                     p->concat_inputs_elided, p->concat_inputs, p->concat_removed,
                     p->concat_inputs_strided, p->concat_folded);
        line(ctx, buf);
    }
    pthread_mutex_unlock(&c->mu);
}

void kiln_plan_cache_fallbacks(struct kiln_plan_cache *c, void (*line)(void *ctx, const char *s),
                               void *ctx)
{
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        const struct kiln_plan *p = c->e[i].plan;
        if (!p || !p->fallbacks) continue;
        for (const char *s = p->fallbacks; *s;) {
            const char *nl = strchr(s, '\n');
            size_t n = nl ? (size_t)(nl - s) : strlen(s);
            char buf[640];
            snprintf(buf, sizeof buf, "%.*s", (int)n, s);
            line(ctx, buf);
            s += n + (nl != NULL);
        }
    }
    pthread_mutex_unlock(&c->mu);
}
