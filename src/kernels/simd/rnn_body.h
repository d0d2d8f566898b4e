/*
 * rnn_body.h - one time step of the ONNX recurrent cells (RNN, GRU, LSTM)
 * over the vector vocabulary of simd_body.h, which includes it once per ISA
 * (the table's rnn_cell). rnn.c drives it: the input projections of every
 * step come from one GEMM before the time loop; a step then runs this
 * function over blocks of W hidden units, split across the run's threads.
 *
 * For one block and a group of batch rows, the hidden-state product
 * (h . R^T for the block's units of every gate) accumulates in registers
 * from the packed recurrence weights ([H][G][W] per block, see struct
 * simd_rnn), and the cell's gate arithmetic (input projection and bias
 * added, clip, activations, the state update) finishes it in the same pass:
 * the gates never go to memory. A row past its sequence length keeps its
 * state and writes zeros to Y, as the reference does.
 */

/* n <= W floats (the tail block of a hidden size that is not a multiple of W). */
static inline vf rnn_ld(const float *p, int64_t n) { return n == W ? vld(p) : vld_part(p, n, 0.0f); }
static inline void rnn_st(float *p, vf v, int64_t n)
{
    if (n == W) vst(p, v);
    else vst_part(p, v, n);
}

/* The ONNX activation functions, as the reference computes them (in float). */
static inline vf rnn_act(const struct simd_rnn_act *a, vf x)
{
    const vf zero = vset(0.0f), one = vset(1.0f);
    switch (a->fn) {
    case SIMD_RNN_RELU: return vmaxs(x, zero);
    case SIMD_RNN_TANH: return v_tanh(x);
    case SIMD_RNN_SIGMOID: return v_sigmoid(x);
    case SIMD_RNN_AFFINE: return vfma(vset(a->alpha), x, vset(a->beta));
    case SIMD_RNN_LEAKY_RELU: return vsel(vlt(x, zero), x, x * vset(a->alpha));
    case SIMD_RNN_THRESHOLDED_RELU: return vsel(vlt(vset(a->alpha), x), zero, x);
    case SIMD_RNN_SCALED_TANH: return vset(a->alpha) * v_tanh(vset(a->beta) * x);
    case SIMD_RNN_HARD_SIGMOID: return vmaxs(vmins(vfma(vset(a->alpha), x, vset(a->beta)), one), zero);
    case SIMD_RNN_ELU: return vsel(vlt(x, zero), x, vset(a->alpha) * (v_exp(x) - one));
    case SIMD_RNN_SOFTSIGN: return x / (one + vabs(x));
    case SIMD_RNN_SOFTPLUS: return v_softplus(x);
    }
    return x;
}

/* The gates' sigmoid as 0.5 + 0.5 tanh(x / 2), on the rational tanh: 10 cycles a vector on
 * AVX2 against 18 for 1 / (1 + e^-x). A gate multiplies a state, so what counts is its
 * absolute error, at most 2e-7 (a gate of 2e-9 comes out below 3e-8). */
static inline vf rnn_gate(vf x)
{
#ifdef SIMD_SCALAR
    return v_sigmoid_gate(x);
#else
    const vf half = vset(0.5f);
    return vfma(half, v_tanh(half * x), half);
#endif
}

/* Activation k of the cell. With std (the op's default activations: RNN
 * Tanh; GRU Sigmoid, Tanh; LSTM Sigmoid, Tanh, Tanh) the function is known
 * at compile time and inlined: rnn_act's switch, called per vector, had been
 * 40% of an LSTM's time. (The gates' sigmoid there is rnn_gate.) */
static inline __attribute__((always_inline)) vf rnn_actk(const struct simd_rnn *r, int k, vf x,
                                                         const int std)
{
    if (std) return k == 0 && r->kind != SIMD_RNN_CELL_RNN ? rnn_gate(x) : v_tanh(x);
    return rnn_act(&r->act[k], x);
}

/* Clamp to [-clip, clip] when clip is set (NaN passes). */
static inline vf rnn_clip(const struct simd_rnn *r, vf x)
{
    if (r->clip > 0) x = vmins(vset(r->clip), vmaxs(vset(-r->clip), x));
    return x;
}

/* acc[i * G + g] = sum over k of h[i][k] * rp[k][g][lane], for R rows of h (stride ldh). */
static inline __attribute__((always_inline)) void
rnn_dot(const float *rp, int64_t H, const float *h, int64_t ldh, vf *acc, const int R, const int G)
{
#pragma GCC unroll 16
    for (int i = 0; i < R * G; i++) acc[i] = vset(0.0f);
    for (int64_t k = 0; k < H; k++) {
        vf w[4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) w[g] = vld(rp + (k * G + g) * W);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const vf hv = vset(h[i * ldh + k]);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) acc[i * G + g] = vfma(hv, w[g], acc[i * G + g]);
        }
    }
}

/* Finish row b of the block at unit j0 (n units) from its products acc. */
static inline __attribute__((always_inline)) void
rnn_finish(const struct simd_rnn *r, const struct simd_rnn_step *s, int phase, int64_t b,
           int64_t j0, int64_t n, const vf *acc, const int std)
{
    const int64_t H = r->H;
    const float *xw = s->xw + b * s->ldx + j0, *bias = r->bias + j0;
    const vf one = vset(1.0f), h_old = rnn_ld(s->h + b * H + j0, n);
    vf hn, c_old = vset(0.0f), cn = c_old;
    if (phase == 1) { /* GRU, linear_before_reset 0: z, and r * h for the h gate's product */
        vf z = rnn_actk(r, 0, rnn_clip(r, acc[0] + rnn_ld(xw, n) + rnn_ld(bias, n)), std);
        vf rg = rnn_actk(r, 0, rnn_clip(r, acc[1] + rnn_ld(xw + H, n) + rnn_ld(bias + H, n)),
                         std);
        rnn_st(s->z + b * H + j0, z, n);
        rnn_st(s->rh + b * H + j0, rg * h_old, n);
        return;
    }
    const int active = s->active[b];
    switch (r->kind) {
    case SIMD_RNN_CELL_RNN:
        hn = rnn_actk(r, 0, rnn_clip(r, acc[0] + rnn_ld(xw, n) + rnn_ld(bias, n)), std);
        break;
    case SIMD_RNN_CELL_GRU: {
        vf z, hh;
        if (phase == 2) {
            z = rnn_ld(s->z + b * H + j0, n);
            hh = acc[0] + rnn_ld(xw + 2 * H, n) + rnn_ld(bias + 2 * H, n);
        } else {
            z = rnn_actk(r, 0, rnn_clip(r, acc[0] + rnn_ld(xw, n) + rnn_ld(bias, n)), std);
            vf rg = rnn_actk(r, 0,
                             rnn_clip(r, acc[1] + rnn_ld(xw + H, n) + rnn_ld(bias + H, n)), std);
            hh = vfma(rg, acc[2] + rnn_ld(r->rb_h + j0, n),
                      rnn_ld(xw + 2 * H, n) + rnn_ld(bias + 2 * H, n));
        }
        hh = rnn_actk(r, 1, rnn_clip(r, hh), std);
        hn = (one - z) * hh + z * h_old;
        break;
    }
    default: { /* LSTM: gates i, o, f, c */
        c_old = rnn_ld(s->c + b * H + j0, n);
        vf gi = acc[0] + rnn_ld(xw, n) + rnn_ld(bias, n);
        vf go = acc[1] + rnn_ld(xw + H, n) + rnn_ld(bias + H, n);
        vf gf = acc[2] + rnn_ld(xw + 2 * H, n) + rnn_ld(bias + 2 * H, n);
        vf gc = acc[3] + rnn_ld(xw + 3 * H, n) + rnn_ld(bias + 3 * H, n);
        if (r->peep) {
            gi = vfma(rnn_ld(r->peep + j0, n), c_old, gi);
            gf = vfma(rnn_ld(r->peep + 2 * H + j0, n), c_old, gf);
        }
        vf i = rnn_actk(r, 0, rnn_clip(r, gi), std);
        vf f;
        if (r->input_forget) f = one - i;
        else f = rnn_actk(r, 0, rnn_clip(r, gf), std);
        vf g = rnn_actk(r, 1, rnn_clip(r, gc), std);
        cn = f * c_old + i * g;
        if (r->peep) go = vfma(rnn_ld(r->peep + H + j0, n), cn, go);
        vf o = rnn_actk(r, 0, rnn_clip(r, go), std);
        hn = o * rnn_actk(r, 2, cn, std);
        break;
    }
    }
    if (!active) {
        hn = h_old;
        cn = c_old;
    }
    rnn_st(s->h_new + b * H + j0, hn, n);
    if (r->kind == SIMD_RNN_CELL_LSTM) rnn_st(s->c_new + b * H + j0, cn, n);
    if (s->y) {
        if (!active) hn = vset(0.0f);
        rnn_st(s->y + b * s->ldy + j0, hn, n);
    }
}

/* Rows [i0, i0 + R) of block jb, with G gates in the packed weights of this phase. */
static inline __attribute__((always_inline)) void
rnn_rows(const struct simd_rnn *r, const struct simd_rnn_step *s, int phase, int64_t jb,
         int64_t i0, const int R, const int G, const int std)
{
    const int64_t H = r->H, j0 = jb * W, n = H - j0 < W ? H - j0 : W;
    const float *rp = phase == 2 ? r->rp_h + jb * H * W : r->rp + jb * H * G * W;
    const float *src = phase == 2 ? s->rh : s->h;
    vf acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = vset(0.0f); /* the unused ones: dead, not undefined */
    rnn_dot(rp, H, src + i0 * H, H, acc, R, G);
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) rnn_finish(r, s, phase, i0 + i, j0, n, acc + i * G, std);
}

/* Batch rows per register tile: 4 x 4 gates in 32 zmm registers, 2 x 4 in 16 ymm. */
#define RNN_RB (W >= 16 ? 4 : 2)

static inline __attribute__((always_inline)) void
rnn_blocks(const struct simd_rnn *r, const struct simd_rnn_step *s, int phase, int64_t b0,
           int64_t b1, const int G, const int std)
{
    for (int64_t jb = b0; jb < b1; jb++) {
        int64_t i = 0;
        for (; i + RNN_RB <= r->rows; i += RNN_RB) rnn_rows(r, s, phase, jb, i, RNN_RB, G, std);
        /* the rest in one tile too (batch 2 or 3 reads the block's weights once, not per row) */
        if (RNN_RB > 3 && i + 3 <= r->rows) {
            rnn_rows(r, s, phase, jb, i, 3, G, std);
            i += 3;
        }
        if (RNN_RB > 2 && i + 2 <= r->rows) {
            rnn_rows(r, s, phase, jb, i, 2, G, std);
            i += 2;
        }
        for (; i < r->rows; i++) rnn_rows(r, s, phase, jb, i, 1, G, std);
    }
}

static inline __attribute__((always_inline)) void
rnn_cell_g(const struct simd_rnn *r, const struct simd_rnn_step *s, int phase, int64_t b0,
           int64_t b1, const int std)
{
    if (phase == 2 || r->kind == SIMD_RNN_CELL_RNN) rnn_blocks(r, s, phase, b0, b1, 1, std);
    else if (phase == 1) rnn_blocks(r, s, phase, b0, b1, 2, std);
    else if (r->kind == SIMD_RNN_CELL_GRU) rnn_blocks(r, s, phase, b0, b1, 3, std);
    else rnn_blocks(r, s, phase, b0, b1, 4, std);
}

static void k_rnn_cell(const struct simd_rnn *r, const struct simd_rnn_step *s, int phase,
                       int64_t b0, int64_t b1)
{
    const int n_act = r->kind == SIMD_RNN_CELL_RNN ? 1 : r->kind == SIMD_RNN_CELL_GRU ? 2 : 3;
    int std = 1;
    for (int k = 0; k < n_act; k++)
        std &= r->act[k].fn == (k == 0 && r->kind != SIMD_RNN_CELL_RNN ? SIMD_RNN_SIGMOID
                                                                       : SIMD_RNN_TANH);
    if (std) rnn_cell_g(r, s, phase, b0, b1, 1);
    else rnn_cell_g(r, s, phase, b0, b1, 0);
}
#undef RNN_RB
