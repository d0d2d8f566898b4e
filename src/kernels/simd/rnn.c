/*
 * rnn.c - fast f32 kernels for the ONNX recurrent ops RNN, GRU (both
 * linear_before_reset values) and LSTM: forward, reverse and bidirectional,
 * layout 0 and 1, sequence_lens, initial_h / initial_c, LSTM peepholes and
 * input_forget, clip, and every activation the reference kernel knows
 * (ref/rnn.c, against which unit_kernels tests them).
 *
 * Compile packs the constant weights once (through the weight cache when the
 * plan has one): W transposed to [I][directions * gates * H], so that the
 * input projections of every step and both directions are one GEMM over the
 * rows of X before the time loop; R per direction in the cell's blocked
 * form (struct simd_rnn in simd.h); the biases summed (Wb + Rb) where the
 * algebra allows. Each time step is then one pass of the table's rnn_cell
 * over blocks of hidden units, split across the run's threads (one parallel
 * region for the whole time loop, a barrier per pass): the
 * hidden-state product and the gate arithmetic together (GRU with
 * linear_before_reset 0 takes two passes, since its h gate's product reads
 * r * h of every unit). The two directions of a bidirectional layer run side
 * by side on two threads (no join per step) where the run has them. The
 * state, the projections and the per-step buffers live in the plan's
 * scratch memory: a run allocates nothing.
 *
 * Weights that are graph inputs (W, R, B or P not constant, as in the ONNX
 * node tests) are packed into scratch by every run instead. Declined (the
 * reference runs the node): a dtype other than f32, shapes or attributes the
 * reference would reject, an empty sequence or batch. The results of one
 * and two threads are identical: the GEMM is split on fixed slices of rows,
 * the cell on whole blocks, and a direction never across threads' sums.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kernels/family.h"
#include "kernels/simd/simd.h"

#define KILN_KERNEL KILN_KERNEL_DECLARE
#include "kernels/simd/attention.def"
#undef KILN_KERNEL

#define RNN_GEMM_SLICE 8 /* rows per GEMM slice: a multiple of every register tile's rows */
#define RNN_STEP_CHUNK_FLOPS 65536.0 /* least work of one thread's share of a step */
#define RNN_TUNE_RUNS 8 /* timed runs, split and unsplit in turn, before the choice */

/* Whether a direction's steps are split across the team is measured on this machine,
 * not guessed: where a step is split, both threads read each other's new state after
 * every barrier, and what that costs depends on where the two cores sit. A 2-layer LSTM
 * of 64 units at batch 8 ran 0.72 ms unsplit and 0.43 ms split on one 2-core host, 0.46
 * unsplit and 0.52 split on another (Zen 2). So after a first untimed run, the next
 * RNN_TUNE_RUNS runs that could split alternate between split and one thread, the
 * fastest of each is kept, and the faster way is used from then on. The results are
 * the same either way (the file comment). KILN_RNN_SPLIT=0 or 1 forces one. */
struct rnn_tune {
    atomic_int runs;           /* runs that could split, counted from 0 */
    atomic_llong best_ns[2];   /* fastest unsplit [0] and split [1] run, 0 = none yet */
    atomic_int choice;         /* -1 undecided, 0 one thread, 1 split */
};

struct rnn_state {
    const struct simd_kernels *k;
    enum simd_rnn_kind kind;
    int ndir, reverse_only, layout, lbr;
    int64_t T, B, I, H, G, nblk, ngh; /* ngh = ndir * G * H: columns of the projections */
    struct simd_rnn cell[2];          /* per direction (pointers into packed) */
    float *packed;                    /* owned when there is no weight cache, else NULL */
    const float *wt;                  /* [I][ngh] */
    int pack_per_run;                 /* weights known only at run time: packed into scratch */
    int has_peep;
    size_t off_pack, off_xw, off_h, off_c, off_z, off_rh, off_act; /* scratch offsets in floats */
    struct rnn_tune tune;
    char name[48];
};

/* ---- attributes ---- */

static const struct {
    const char *name;
    enum simd_rnn_fn fn;
    bool has_alpha, has_beta;
    float alpha, beta;
} rnn_acts[] = {
    {"Relu", SIMD_RNN_RELU, false, false, 0, 0},
    {"Tanh", SIMD_RNN_TANH, false, false, 0, 0},
    {"Sigmoid", SIMD_RNN_SIGMOID, false, false, 0, 0},
    {"Affine", SIMD_RNN_AFFINE, true, true, 1.0f, 0.0f},
    {"LeakyRelu", SIMD_RNN_LEAKY_RELU, true, false, 0.01f, 0},
    {"ThresholdedRelu", SIMD_RNN_THRESHOLDED_RELU, true, false, 1.0f, 0},
    {"ScaledTanh", SIMD_RNN_SCALED_TANH, true, true, 1.0f, 1.0f},
    {"HardSigmoid", SIMD_RNN_HARD_SIGMOID, true, true, 0.2f, 0.5f},
    {"Elu", SIMD_RNN_ELU, true, false, 1.0f, 0},
    {"Softsign", SIMD_RNN_SOFTSIGN, false, false, 0, 0},
    {"Softplus", SIMD_RNN_SOFTPLUS, false, false, 0, 0},
};

/* The activations of each direction; false for a list the op does not allow. */
static bool parse_acts(const struct kiln_node *n, enum simd_rnn_kind kind, int ndir,
                       struct simd_rnn_act acts[2][3])
{
    static const enum simd_rnn_fn defaults[3][3] = {
        {SIMD_RNN_TANH},
        {SIMD_RNN_SIGMOID, SIMD_RNN_TANH},
        {SIMD_RNN_SIGMOID, SIMD_RNN_TANH, SIMD_RNN_TANH},
    };
    const int per_dir = (int)kind + 1;
    const struct kiln_attr *names = kiln_node_attr(n, "activations");
    const float *alphas, *betas;
    int n_alpha = kiln_attr_floats(n, "activation_alpha", &alphas);
    int n_beta = kiln_attr_floats(n, "activation_beta", &betas);
    if (names && names->type != KILN_ATTR_STRINGS) return false;
    int count = names ? names->n : 0;
    if (names && count != per_dir && count != per_dir * ndir) return false;
    int ia = 0, ib = 0;
    for (int d = 0; d < ndir; d++) {
        if (count == per_dir) ia = ib = 0; /* one list for both directions: its alphas too */
        for (int k = 0; k < per_dir; k++) {
            struct simd_rnn_act *a = &acts[d][k];
            if (!names) {
                *a = (struct simd_rnn_act){defaults[kind][k], 0, 0};
                continue;
            }
            const kiln_string *s = &names->strings[(d * per_dir + k) % count];
            size_t t, nt = sizeof rnn_acts / sizeof rnn_acts[0];
            for (t = 0; t < nt; t++)
                if (strlen(rnn_acts[t].name) == s->len &&
                    strncasecmp(rnn_acts[t].name, s->data, s->len) == 0)
                    break;
            if (t == nt) return false;
            *a = (struct simd_rnn_act){rnn_acts[t].fn, rnn_acts[t].alpha, rnn_acts[t].beta};
            if (rnn_acts[t].has_alpha && ia < n_alpha) a->alpha = alphas[ia++];
            if (rnn_acts[t].has_beta && ib < n_beta) a->beta = betas[ib++];
        }
    }
    return true;
}

static bool f32_concrete(const struct kiln_type *t)
{
    return t && t->dtype == KILN_DTYPE_F32 && kiln_type_is_concrete(t);
}

static bool has_shape(const struct kiln_type *t, int rank, int64_t d0, int64_t d1, int64_t d2)
{
    const int64_t d[3] = {d0, d1, d2};
    if (t->rank != rank) return false;
    for (int i = 0; i < rank; i++)
        if (t->dims[i] != d[i]) return false;
    return true;
}

/* ---- packing ---- */

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

/* Floats of the packed weights, and the offsets of each direction's parts. */
struct rnn_layout {
    size_t wt, rp[2], rp_h[2], bias[2], rb_h[2], peep[2], total;
};

static void rnn_layout(const struct rnn_state *s, bool peep, struct rnn_layout *l)
{
    const int64_t W = s->k->lanes, H = s->H;
    const int64_t g_rp = s->kind == SIMD_RNN_CELL_GRU && !s->lbr ? 2 : s->G;
    size_t o = round16((size_t)(s->I * s->ngh));
    l->wt = 0;
    for (int d = 0; d < s->ndir; d++) {
        l->rp[d] = o;
        o += round16((size_t)(s->nblk * H * g_rp * W));
        l->rp_h[d] = o;
        if (s->kind == SIMD_RNN_CELL_GRU && !s->lbr) o += round16((size_t)(s->nblk * H * W));
        l->bias[d] = o;
        o += round16((size_t)(s->G * H));
        l->rb_h[d] = o;
        o += round16((size_t)H);
        l->peep[d] = o;
        if (peep) o += round16((size_t)(3 * H));
    }
    l->total = o;
}

struct pack_arg {
    const struct rnn_state *s;
    const kiln_tensor *w, *r, *b, *p;
};

/* Recurrence weights of gates [g0, g0 + gn) of direction d, blocked [blocks][H][gn][W]. */
static void pack_rec(const struct rnn_state *s, const float *R, int64_t g0, int64_t gn, float *dst)
{
    const int64_t W = s->k->lanes, H = s->H;
    for (int64_t jb = 0; jb < s->nblk; jb++)
        for (int64_t k = 0; k < H; k++)
            for (int64_t g = 0; g < gn; g++)
                for (int64_t l = 0; l < W; l++) {
                    int64_t j = jb * W + l;
                    *dst++ = j < H ? R[((g0 + g) * H + j) * H + k] : 0.0f;
                }
}

static void fill_packed(const struct pack_arg *a, float *buf)
{
    const struct rnn_state *s = a->s;
    struct rnn_layout l;
    rnn_layout(s, a->p != NULL, &l);
    const int64_t H = s->H, G = s->G, I = s->I, gh = G * H;
    const float *w = a->w->data, *r = a->r->data, *b = a->b ? a->b->data : NULL;
    for (int64_t c = 0; c < s->ngh; c++) /* W is [ndir * G * H][I]: column c of W^T */
        for (int64_t i = 0; i < I; i++) buf[l.wt + (size_t)(i * s->ngh + c)] = w[c * I + i];
    for (int d = 0; d < s->ndir; d++) {
        const float *rd = r + d * gh * H;
        if (s->kind == SIMD_RNN_CELL_GRU && !s->lbr) {
            pack_rec(s, rd, 0, 2, buf + l.rp[d]);
            pack_rec(s, rd, 2, 1, buf + l.rp_h[d]);
        } else {
            pack_rec(s, rd, 0, G, buf + l.rp[d]);
        }
        float *bias = buf + l.bias[d], *rb_h = buf + l.rb_h[d];
        for (int64_t j = 0; j < gh; j++) {
            float wb = b ? b[d * 2 * gh + j] : 0.0f, rb = b ? b[d * 2 * gh + gh + j] : 0.0f;
            bool keep_rb = s->kind == SIMD_RNN_CELL_GRU && s->lbr && j >= 2 * H;
            bias[j] = keep_rb ? wb : wb + rb;
            if (keep_rb) rb_h[j - 2 * H] = rb;
        }
        if (a->p) memcpy(buf + l.peep[d], (const float *)a->p->data + d * 3 * H,
                         (size_t)(3 * H) * sizeof(float));
    }
}

static kiln_status pack_fn(void *arg, void **packed, size_t *bytes, void (**free_fn)(void *))
{
    const struct pack_arg *a = arg;
    struct rnn_layout l;
    rnn_layout(a->s, a->p != NULL, &l);
    float *buf = aligned_alloc(64, l.total * sizeof(float));
    if (!buf) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory packing RNN weights");
    fill_packed(a, buf);
    *packed = buf;
    *bytes = l.total * sizeof(float);
    *free_fn = free;
    return KILN_OK;
}

/* Point the cells and W^T at packed weights pk. */
static void set_cells(const struct rnn_state *s, const float *pk, const float **wt,
                      struct simd_rnn *cells)
{
    struct rnn_layout l;
    rnn_layout(s, s->has_peep, &l);
    *wt = pk + l.wt;
    for (int d = 0; d < s->ndir; d++) {
        struct simd_rnn *c = &cells[d];
        c->rp = pk + l.rp[d];
        c->rp_h = pk + l.rp_h[d];
        c->bias = pk + l.bias[d];
        c->rb_h = pk + l.rb_h[d];
        c->peep = s->has_peep ? pk + l.peep[d] : NULL;
    }
}

static void rnn_destroy(void *p)
{
    struct rnn_state *s = p;
    free(s->packed);
    free(s);
}

/* ---- run ---- */

struct gemm_job {
    const struct rnn_state *s;
    const float *wt;
    const float *x;
    float *xw;
    int64_t rows;
};

static void gemm_range(void *arg, int64_t begin, int64_t end)
{
    const struct gemm_job *j = arg;
    const struct rnn_state *s = j->s;
    int64_t r0 = begin * RNN_GEMM_SLICE, r1 = end * RNN_GEMM_SLICE;
    if (r1 > j->rows) r1 = j->rows;
    s->k->gemm(r1 - r0, s->ngh, s->I, 1.0f, j->x + r0 * s->I, s->I, j->wt, s->ngh,
               j->xw + r0 * s->ngh, s->ngh);
}

/* Where state row b of direction d lives in initial_h / Y_h (layout 0: [dir][batch][H]). */
static int64_t state_off(const struct rnn_state *s, int d, int64_t b)
{
    return s->layout ? (b * s->ndir + d) * s->H : (d * s->B + b) * s->H;
}

/* One run's view of the buffers and tensors, shared by its directions. */
struct dir_job {
    const struct rnn_state *s;
    const struct simd_rnn *cells;
    const float *xw;
    float *sc;
    const kiln_tensor *L, *H0, *C0;
    kiln_tensor *Y, *YH, *YC;
    int64_t cgrain;
};

/* The row flags of step t (row b is within its sequence length). */
static void set_active(const struct dir_job *j, int64_t t, unsigned char *active)
{
    for (int64_t b = 0; b < j->s->B; b++) active[b] = !j->L || t < kiln_tensor_i64(j->L, b);
}

struct team_job {
    const struct dir_job *j;
    int d;
    float *hb[2], *cb[2];
    unsigned char *active[2]; /* step parity's row flags: tid 0 fills the next step's */
};

/* The time loop of one direction on a team of nt threads: thread tid runs
 * its fixed share of the hidden blocks in every step, and the team meets at
 * a barrier after each pass (the next step reads every unit's new state). */
static void team_steps(void *arg, int tid, int nt)
{
    const struct team_job *tj = arg;
    const struct dir_job *j = tj->j;
    const struct rnn_state *s = j->s;
    const int d = tj->d;
    const int64_t T = s->T, B = s->B, H = s->H, ND = s->ndir;
    const bool reverse = s->reverse_only || d == 1;
    const int gru2 = s->kind == SIMD_RNN_CELL_GRU && !s->lbr;
    const int64_t b0 = s->nblk * tid / nt, b1 = s->nblk * (tid + 1) / nt;
    int cur = 0;
    for (int64_t step = 0; step < T; step++) {
        const int64_t t = reverse ? T - 1 - step : step;
        if (tid == 0 && step + 1 < T) /* read by the next step, after the barrier */
            set_active(j, reverse ? T - 2 - step : step + 1, tj->active[(step + 1) & 1]);
        struct simd_rnn_step st = {
            .xw = j->xw + (s->layout ? t : t * B) * s->ngh + d * s->G * H,
            .ldx = s->layout ? T * s->ngh : s->ngh,
            .h = tj->hb[cur], .c = tj->cb[cur], .h_new = tj->hb[cur ^ 1], .c_new = tj->cb[cur ^ 1],
            .y = NULL,
            .ldy = s->layout ? T * ND * H : H,
            .active = tj->active[step & 1],
            .z = j->sc + s->off_z + d * B * H, .rh = j->sc + s->off_rh + d * B * H,
        };
        if (j->Y)
            st.y = (float *)j->Y->data + (s->layout ? (t * ND + d) * H : (t * ND + d) * B * H);
        if (b0 < b1) s->k->rnn_cell(&j->cells[d], &st, gru2 ? 1 : 0, b0, b1);
        kiln_team_barrier(nt);
        if (gru2) {
            if (b0 < b1) s->k->rnn_cell(&j->cells[d], &st, 2, b0, b1);
            kiln_team_barrier(nt);
        }
        cur ^= 1;
    }
}

/* Direction d's time loop on `threads` threads, with its own state buffers. */
static void run_direction(const struct dir_job *j, int d, int threads)
{
    const struct rnn_state *s = j->s;
    const int64_t T = s->T, B = s->B, H = s->H;
    const bool reverse = s->reverse_only || d == 1;
    struct team_job tj = {
        .j = j, .d = d,
        .hb = {j->sc + s->off_h + 2 * d * B * H, j->sc + s->off_h + (2 * d + 1) * B * H},
        .cb = {j->sc + s->off_c + 2 * d * B * H, j->sc + s->off_c + (2 * d + 1) * B * H},
        .active = {(unsigned char *)(j->sc + s->off_act) + 2 * d * B,
                   (unsigned char *)(j->sc + s->off_act) + (2 * d + 1) * B},
    };
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < H; k++) {
            int64_t o = state_off(s, d, b) + k;
            tj.hb[0][b * H + k] = j->H0 ? ((const float *)j->H0->data)[o] : 0.0f;
            tj.cb[0][b * H + k] = j->C0 ? ((const float *)j->C0->data)[o] : 0.0f;
        }
    set_active(j, reverse ? T - 1 : 0, tj.active[0]);
    int team = (int)(s->nblk / j->cgrain);
    if (team > threads) team = threads;
    kiln_parallel_team(team, team_steps, &tj);
    const int cur = (int)(T & 1); /* the buffer the last step wrote */
    for (int64_t b = 0; b < B; b++) {
        int64_t o = state_off(s, d, b);
        if (j->YH) memcpy((float *)j->YH->data + o, tj.hb[cur] + b * H, (size_t)H * sizeof(float));
        if (j->YC) memcpy((float *)j->YC->data + o, tj.cb[cur] + b * H, (size_t)H * sizeof(float));
    }
}

static void dir_range(void *arg, int64_t begin, int64_t end)
{
    for (int64_t d = begin; d < end; d++) run_direction(arg, (int)d, 1);
}

static long long rnn_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The threads for a direction's time loop that could split over `threads` (see struct
 * rnn_tune); *timed is set to the way (0 or 1) this run is timed for, else -1. */
static int split_threads(struct rnn_state *s, int threads, int *timed)
{
    *timed = -1;
    const char *env = getenv("KILN_RNN_SPLIT");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) return env[0] == '1' ? threads : 1;
    int choice = atomic_load(&s->tune.choice);
    if (choice >= 0) return choice ? threads : 1;
    int n = atomic_fetch_add(&s->tune.runs, 1);
    if (n == 0 || n > RNN_TUNE_RUNS) return threads; /* cold, or the choice is being made */
    *timed = (n - 1) / (RNN_TUNE_RUNS / 2); /* a block of runs each way */
    return *timed ? threads : 1;
}

static void split_timed(struct rnn_state *s, int way, long long ns)
{
    long long cur = atomic_load(&s->tune.best_ns[way]);
    while ((cur == 0 || ns < cur) &&
           !atomic_compare_exchange_weak(&s->tune.best_ns[way], &cur, ns)) {
    }
    if (atomic_load(&s->tune.runs) > RNN_TUNE_RUNS) {
        long long one = atomic_load(&s->tune.best_ns[0]), two = atomic_load(&s->tune.best_ns[1]);
        if (one > 0 && two > 0) {
            int expect = -1;
            atomic_compare_exchange_strong(&s->tune.choice, &expect, two < one ? 1 : 0);
        }
    }
}

static kiln_status rnn_run(void *state, struct kiln_run_ctx *ctx)
{
    struct rnn_state *s = state;
    const int64_t T = s->T, B = s->B, H = s->H, ND = s->ndir;
    const kiln_tensor *X = ctx->in[0];
    const kiln_tensor *L = ctx->n_in > 4 ? ctx->in[4] : NULL;
    for (int64_t b = 0; L && b < B; b++) {
        int64_t len = kiln_tensor_i64(L, b);
        if (len < 0 || len > T)
            return kiln_node_error(ctx->node, KILN_ERR_INVALID_ARGUMENT,
                                   "sequence_lens[%lld] = %lld is outside [0, %lld]",
                                   (long long)b, (long long)len, (long long)T);
    }
    float *sc = ctx->scratch;
    int threads = ctx->threads < 1 ? 1 : ctx->threads;
    const float *wt = s->wt;
    struct simd_rnn cells[2] = {s->cell[0], s->cell[1]};
    if (s->pack_per_run) { /* weights that are graph inputs */
        const kiln_tensor *Bt = ctx->n_in > 3 ? ctx->in[3] : NULL;
        const kiln_tensor *P = s->has_peep ? ctx->in[7] : NULL;
        struct pack_arg pa = {s, ctx->in[1], ctx->in[2], Bt, P};
        fill_packed(&pa, sc + s->off_pack);
        set_cells(s, sc + s->off_pack, &wt, cells);
    }

    /* a step's pass over the blocks: split into chunks of at least 64 kFLOP (about 1 us),
     * since every step ends in a join (on a busy host, a wait for a preempted worker). On
     * a quiet 2-core host the join costs far less than the work it halves: a 2-layer LSTM
     * of 64 units at batch 8 (256 kFLOP a step) ran in 0.72 ms unsplit, 0.43 ms split;
     * 512 kFLOP chunks, as before, left every step of it on one thread. Whether a node
     * whose steps can split does is then measured (struct rnn_tune): unsplit, the whole
     * node runs on one thread, the projections too, so that the time loop finds them in
     * its own core's cache (written by two cores, half came from the other's: 0.04 ms of
     * a 0.19 ms layer, Zen 2). */
    double block_flops = 2.0 * (double)(B * H * s->G * s->k->lanes);
    int64_t cgrain = block_flops >= RNN_STEP_CHUNK_FLOPS
                         ? 1 : (int64_t)(RNN_STEP_CHUNK_FLOPS / block_flops) + 1;
    const int side_by_side =
        ND == 2 && threads >= 2 && (threads == 2 || s->nblk / cgrain < threads);
    int timed = -1;
    long long t0 = 0;
    if (!side_by_side && threads >= 2 && s->nblk / cgrain >= 2) { /* measured */
        threads = split_threads(s, threads, &timed);
        if (timed >= 0) t0 = rnn_now_ns();
    }

    /* the input projections of every step and direction: [T * B rows][ngh] */
    int64_t rows = T * B, slices = (rows + RNN_GEMM_SLICE - 1) / RNN_GEMM_SLICE;
    struct gemm_job gj = {s, wt, X->data, sc + s->off_xw, rows};
    double slice_flops = 2.0 * RNN_GEMM_SLICE * (double)s->ngh * (double)s->I;
    int64_t grain = slice_flops >= 131072 ? 1 : (int64_t)(131072 / slice_flops) + 1;
    kiln_parallel_for(threads, slices, grain, gemm_range, &gj);

    struct dir_job j = {
        .s = s, .cells = cells, .xw = sc + s->off_xw, .sc = sc, .L = L,
        .H0 = ctx->n_in > 5 ? ctx->in[5] : NULL,
        .C0 = s->kind == SIMD_RNN_CELL_LSTM && ctx->n_in > 6 ? ctx->in[6] : NULL,
        .Y = ctx->n_out > 0 ? ctx->out[0] : NULL,
        .YH = ctx->n_out > 1 ? ctx->out[1] : NULL,
        .YC = s->kind == SIMD_RNN_CELL_LSTM && ctx->n_out > 2 ? ctx->out[2] : NULL,
        .cgrain = cgrain,
    };
    /* Two directions on two threads run side by side, one thread each, with no join per
     * step; so do they wherever a step would not be split across all the threads anyway. */
    if (side_by_side) {
        kiln_parallel_for(2, 2, 1, dir_range, &j);
    } else {
        for (int d = 0; d < ND; d++) run_direction(&j, d, threads);
    }
    if (timed >= 0) split_timed(s, timed, rnn_now_ns() - t0);
    return KILN_OK;
}

/* ---- compile ---- */

/* Pack the constant weights once (shared through the weight cache when there is one). */
static kiln_status rnn_pack(const struct kiln_compile_ctx *cc, struct rnn_state *s)
{
    struct pack_arg pa = {s, cc->in_value[1], cc->in_value[2],
                          cc->n_in > 3 ? cc->in_value[3] : NULL,
                          s->has_peep ? cc->in_value[7] : NULL};
    void *packed = NULL;
    kiln_status st;
    if (cc->weights) {
        char tag[160];
        snprintf(tag, sizeof tag, "simd_rnn:%d:%d:%d:%p:%p:%p", (int)s->kind, s->lbr,
                 s->k->lanes, (const void *)pa.r, (const void *)pa.b, (const void *)pa.p);
        st = kiln_weight_cache_get(cc->weights, pa.w, tag, pack_fn, &pa, &packed);
    } else {
        size_t bytes;
        void (*free_fn)(void *);
        st = pack_fn(&pa, &packed, &bytes, &free_fn);
        s->packed = packed;
    }
    if (st == KILN_OK) set_cells(s, packed, &s->wt, s->cell);
    return st;
}

static kiln_status rnn_compile_kind(const struct kiln_compile_ctx *cc,
                                    struct kiln_kernel_inst *inst,
                               const struct simd_kernels *table, enum simd_rnn_kind kind)
{
    const struct kiln_node *n = cc->node;
    const char *dir = kiln_attr_str(n, "direction", "forward");
    int ndir = 1, reverse_only = 0;
    if (strcmp(dir, "reverse") == 0) reverse_only = 1;
    else if (strcmp(dir, "bidirectional") == 0) ndir = 2;
    else if (strcmp(dir, "forward") != 0) return KILN_OK;
    int layout = (int)kiln_attr_int(n, "layout", 0);
    float clip = kiln_node_attr(n, "clip") ? kiln_attr_float(n, "clip", 0) : 0;
    if ((layout != 0 && layout != 1) || (kiln_node_attr(n, "clip") && !(clip > 0))) return KILN_OK;
    struct simd_rnn_act acts[2][3];
    if (!parse_acts(n, kind, ndir, acts)) return KILN_OK;

    const int is_lstm = kind == SIMD_RNN_CELL_LSTM;
    const struct kiln_type *x = cc->in[0], *w = cc->in[1], *r = cc->in[2];
    const struct kiln_type *b = cc->n_in > 3 ? cc->in[3] : NULL;
    const struct kiln_type *len = cc->n_in > 4 ? cc->in[4] : NULL;
    const struct kiln_type *h0 = cc->n_in > 5 ? cc->in[5] : NULL;
    const struct kiln_type *c0 = is_lstm && cc->n_in > 6 ? cc->in[6] : NULL;
    const struct kiln_type *p = is_lstm && cc->n_in > 7 ? cc->in[7] : NULL;
    if (!f32_concrete(x) || !f32_concrete(w) || !f32_concrete(r) || x->rank != 3 || r->rank != 3)
        return KILN_OK;
    const int64_t G = kind == SIMD_RNN_CELL_RNN ? 1 : kind == SIMD_RNN_CELL_GRU ? 3 : 4;
    const int64_t T = x->dims[layout ? 1 : 0], B = x->dims[layout ? 0 : 1], I = x->dims[2];
    const int64_t H = r->dims[2];
    if (kiln_attr_int(n, "hidden_size", H) != H || T <= 0 || B <= 0 || I <= 0 || H <= 0)
        return KILN_OK;
    if (!has_shape(w, 3, ndir, G * H, I) || !has_shape(r, 3, ndir, G * H, H)) return KILN_OK;
    if (b && (!f32_concrete(b) || !has_shape(b, 2, ndir, 2 * G * H, 0))) return KILN_OK;
    if (len && (!kiln_type_is_concrete(len) || !kiln_dtype_is_int(len->dtype) ||
                !has_shape(len, 1, B, 0, 0)))
        return KILN_OK;
    const int64_t sh0 = layout ? B : ndir, sh1 = layout ? ndir : B;
    if (h0 && (!f32_concrete(h0) || !has_shape(h0, 3, sh0, sh1, H))) return KILN_OK;
    if (c0 && (!f32_concrete(c0) || !has_shape(c0, 3, sh0, sh1, H))) return KILN_OK;
    if (p && (!f32_concrete(p) || !has_shape(p, 2, ndir, 3 * H, 0))) return KILN_OK;
    for (int i = 0; i < cc->n_out && i < (is_lstm ? 3 : 2); i++)
        if (cc->out[i] && cc->out[i]->dtype != KILN_DTYPE_F32) return KILN_OK;
    /* weights not all known now (graph inputs): packed by every run */
    const int per_run = !cc->in_value[1] || !cc->in_value[2] || (b && !cc->in_value[3]) ||
                        (p && !cc->in_value[7]);

    struct rnn_state *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_OUT_OF_MEMORY, "out of memory compiling %s",
                              kiln_op_name(n->op));
    s->k = table;
    atomic_init(&s->tune.runs, 0);
    atomic_init(&s->tune.best_ns[0], 0);
    atomic_init(&s->tune.best_ns[1], 0);
    atomic_init(&s->tune.choice, -1);
    s->kind = kind;
    s->ndir = ndir;
    s->reverse_only = reverse_only;
    s->layout = layout;
    s->lbr = kind == SIMD_RNN_CELL_GRU && kiln_attr_int(n, "linear_before_reset", 0) != 0;
    s->T = T;
    s->B = B;
    s->I = I;
    s->H = H;
    s->G = G;
    s->nblk = (H + s->k->lanes - 1) / s->k->lanes;
    s->ngh = ndir * G * H;
    s->has_peep = p != NULL;
    s->pack_per_run = per_run;
    for (int d = 0; d < ndir; d++) {
        struct simd_rnn *c = &s->cell[d];
        c->kind = kind;
        c->lbr = s->lbr;
        c->input_forget = is_lstm && kiln_attr_int(n, "input_forget", 0) != 0;
        c->H = H;
        c->rows = B;
        c->clip = clip;
        memcpy(c->act, acts[d], sizeof c->act);
    }

    /* scratch: the packed weights when they come with each run, the projections, two h
     * and two c buffers, z and r * h, the row flags */
    size_t o = 0;
    if (per_run) {
        struct rnn_layout l;
        rnn_layout(s, s->has_peep, &l);
        s->off_pack = o;
        o += l.total;
    } else {
        kiln_status st = rnn_pack(cc, s);
        if (st != KILN_OK) {
            rnn_destroy(s);
            return st;
        }
    }
    s->off_xw = o;
    o += round16((size_t)(T * B * s->ngh));
    s->off_h = o; /* per direction: two h, two c, z, r * h and the row flags */
    o += round16((size_t)(ndir * 2 * B * H));
    s->off_c = o;
    o += round16((size_t)(ndir * 2 * B * H));
    s->off_z = o;
    o += round16((size_t)(ndir * B * H));
    s->off_rh = o;
    o += round16((size_t)(ndir * B * H));
    s->off_act = o; /* two steps' row flags per direction */
    o += round16((size_t)(ndir * 2 * B + 3) / 4);
    snprintf(s->name, sizeof s->name, "f32_%s_%s", kiln_op_name(n->op), s->k->isa);
    for (char *q = s->name; *q; q++)
        if (*q >= 'A' && *q <= 'Z') *q = (char)(*q - 'A' + 'a');
    inst->state = s;
    inst->destroy = rnn_destroy;
    inst->run = rnn_run;
    inst->name = s->name;
    inst->scratch_bytes = o * sizeof(float);
    return KILN_OK;
}

/* One kernel per op and SIMD table (attention.def). */
#define RNN_OP(stem, KIND)                                                                   \
    static kiln_status stem##_compile(const struct kiln_compile_ctx *cc,                     \
                                      struct kiln_kernel_inst *inst,                         \
                                      const struct simd_kernels *k)                          \
    {                                                                                        \
        return rnn_compile_kind(cc, inst, k, KIND);                                             \
    }                                                                                        \
    SIMD_VARIANTS(stem, stem##_compile)
RNN_OP(rnn, SIMD_RNN_CELL_RNN)
RNN_OP(gru, SIMD_RNN_CELL_GRU)
RNN_OP(lstm, SIMD_RNN_CELL_LSTM)
