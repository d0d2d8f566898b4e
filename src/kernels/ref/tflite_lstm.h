/*
 * tflite_lstm.h - the parameters of TflLstmInt, TFLite's fully integer
 * ("8x8_16") LSTM, as the importer prepares them and the reference kernel
 * (tflite_lstm_int.c) reads them: one "params" ints attribute, indexed by
 * the enum below. Gates are numbered as TFLite orders its inputs: 0 input,
 * 1 forget, 2 cell, 3 output. A multiplier and its shift (TFLite's
 * QuantizeMultiplier, real = m * 2^(shift - 31)) take two slots, m first.
 */
#ifndef KILN_KERNELS_REF_TFLITE_LSTM_H
#define KILN_KERNELS_REF_TFLITE_LSTM_H

enum tfl_lstm_int_param {
    TLI_X = 0,            /* input x weights -> gate g: 2 slots per gate, 8 */
    TLI_H = 8,            /* output state x recurrent weights -> gate g, 8 */
    TLI_C = 16,           /* cell state x peephole -> gate g (g = 2 unused), 8 */
    TLI_LN = 24,          /* layer norm coefficient scale of gate g, 8 */
    TLI_HIDDEN = 32,      /* output gate x tanh(c) -> hidden intermediate, 2 */
    TLI_PROJ = 34,        /* hidden x projection weights -> output state, 2 */
    TLI_GUARD = 36,       /* layer norm variance guard of gate g, 4 */
    TLI_INPUT_ZP = 40,    /* zero point of the input */
    TLI_STATE_ZP = 41,    /* zero point of the output state (the output) */
    TLI_HIDDEN_ZP = 42,   /* zero point of the hidden intermediate */
    TLI_CELL_SCALE = 43,  /* log2 of the cell state's scale, -15 .. -9 */
    TLI_CELL_CLIP = 44,   /* quantized cell clip, 0 = none */
    TLI_PROJ_CLIP = 45,   /* quantized projection clip, 0 = none */
    TLI_COUNT = 46
};

#endif
