/* What decode_step.c (the forward) and decode_loop.c (the sampling loop) share. */
#ifndef KGSYNTH_DECODE_STEP_H
#define KGSYNTH_DECODE_STEP_H
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, L, H, NH, KV, D, I, V, cap, T;
    const int64_t *ids, *start, *valid; /* ids [B][T]: row b's first valid[b] run at start[b].. */
    const float *embed;           /* [V][H] */
    const float *const *w;        /* per layer: ln1, qkvT [H][(NH+2KV)D], oT [NH D][H], ln2,
                                     guT [H][2I], downT [I][H] */
    const float *normw, *headT;   /* [H], [H][V] */
    const float *cos, *sin;       /* [cap][D] */
    float *kc, *vc;               /* [L][B][KV][cap][D] */
    int64_t layer_stride, row_stride;
    float eps;
    float *logits;                /* [B][V] */
} step_args;

#define ROWS 16 /* rows whose activations go through the weights together */

typedef struct {
    float *h, *x, *qkv, *att, *gu, *sc;
} scratch;

/* a[i] = e^(a[i] - shift) */
void exp_inplace(float *a, int n, float shift);
/* the floats of one thread's scratch, and its parts */
size_t scratch_floats(const step_args *a);
scratch carve(const step_args *a, float *buf);
/* token t of rows rows[0..R-1] (R <= ROWS) through every layer; the head's logits for the
 * rows whose last token it is */
void one_block(const step_args *a, const int *rows, int R, int t, scratch s);
/* fn on each of n parts (part i at parts + i * size), part 0 on this thread and the others
 * on their own; 1 when a thread could not be started or a part returned non-NULL, else 0 */
int run_parts(void *(*fn)(void *), void *parts, size_t size, int n);

#endif
