/* The sampling loop of kgsynth/llm/native_step.py: rows decoded to their stops over
 * decode_step.c's forward, without coming back to Python (see kg_decode_loop). */
#include "decode_step.h"

enum { SAMPLE = 0, FEED = 1, WAIT = 2, DONE = 3 };

typedef struct {
    const step_args *a;   /* its ids, start and valid point into the loop's own arrays */
    int b0, b1;
    int8_t *state;        /* [B] */
    int64_t *toks, *n_out;  /* [B][room], [B] */
    float *lps;           /* [B][room] */
    int room;
    const float *u;       /* [B][room] uniform draws in [0, 1) */
    float temperature;
    const uint8_t *is_stop, *is_cand; /* [V] */
    int64_t *feed;        /* [B] the token a FEED row runs next */
} loop_slice;

/* one token from a row's logits: argmax at temperature 0, else the first token whose
 * cumulative probability passes u of the total; its log-prob at the temperature */
static int64_t sample_row(const float *lg, int V, float temp, float u, float *lp, float *tmp) {
    if (temp <= 0.f) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (lg[i] > lg[best]) best = i;
        for (int i = 0; i < V; i++) tmp[i] = lg[i];
        exp_inplace(tmp, V, lg[best]);
        float total = 0.f;
        for (int i = 0; i < V; i++) total += tmp[i];
        *lp = -logf(total);
        return best;
    }
    const float inv = 1.f / temp;
    float m = lg[0] * inv;
    for (int i = 0; i < V; i++) {
        tmp[i] = lg[i] * inv;
        m = tmp[i] > m ? tmp[i] : m;
    }
    exp_inplace(tmp, V, m);
    float total = 0.f;
    for (int i = 0; i < V; i++) total += tmp[i];
    const float target = u * total;
    float cum = 0.f;
    int pick = -1, last = 0;
    for (int i = 0; i < V; i++) {
        if (tmp[i] > 0.f) last = i;
        cum += tmp[i];
        if (cum > target) {
            pick = i;
            break;
        }
    }
    if (pick < 0 || tmp[pick] <= 0.f) pick = last; /* rounding at the very end of the row */
    *lp = lg[pick] * inv - m - logf(total);
    return pick;
}

static void *run_loop_slice(void *arg) {
    loop_slice *ls = (loop_slice *)arg;
    const step_args *a = ls->a;
    const int V = a->V;
    float *buf = malloc(sizeof(float) * (scratch_floats(a) + (size_t)V + 16));
    if (!buf) return (void *)1;
    scratch sc = carve(a, buf);
    float *tmp = buf + scratch_floats(a);
    int rows[ROWS];
    /* a block of rows at a time, decoded until each has stopped or waits: only the block's
     * keys and values are read meanwhile, so they stay in the CPU's caches */
    for (int blk = ls->b0; blk < ls->b1; blk += ROWS) {
        const int end = blk + ROWS < ls->b1 ? blk + ROWS : ls->b1;
        for (;;) {
            for (int b = blk; b < end; b++) {
                if (ls->state[b] != SAMPLE) continue;
                const int64_t k = ls->n_out[b];
                float lp;
                const int64_t tok = sample_row(a->logits + (size_t)b * V, V, ls->temperature,
                                               ls->u ? ls->u[(size_t)b * ls->room + k] : 0.f,
                                               &lp, tmp);
                ls->toks[(size_t)b * ls->room + k] = tok;
                ls->lps[(size_t)b * ls->room + k] = lp;
                ls->n_out[b] = k + 1;
                if (ls->is_stop[tok] || k + 1 >= ls->room) ls->state[b] = DONE;
                else if (ls->is_cand[tok]) ls->state[b] = WAIT;
                else ls->state[b] = FEED;
            }
            int R = 0;
            for (int b = blk; b < end; b++) {
                if (ls->state[b] != FEED) continue;
                ls->feed[b] = ls->toks[(size_t)b * ls->room + ls->n_out[b] - 1];
                rows[R++] = b;
            }
            if (R == 0) break;
            one_block(a, rows, R, 0, sc);
            for (int r = 0; r < R; r++) {
                ((int64_t *)a->start)[rows[r]] += 1;
                ls->state[rows[r]] = SAMPLE;
            }
        }
    }
    free(buf);
    return NULL;
}

/* Rows in state SAMPLE (their next logits in `logits`) or FEED (their last sampled token
 * to run) are decoded until each is DONE (a stop id, or `room` tokens) or WAITs (it sampled
 * a token in is_cand: the caller checks its stop strings and sets it DONE or FEED, then
 * calls again). lens[b]: where row b's next token goes, advanced as tokens are fed.
 * Returns 0; 2 for a row that would run past the cache or an out-of-range token; 1 when
 * memory or a thread could not be had. */
int kg_decode_loop(int B, int L, int H, int NH, int KV, int D, int I, int V, int cap,
                   const float *embed, const float *const *w, const float *normw,
                   const float *headT, const float *cos, const float *sin, float *kc,
                   float *vc, int64_t layer_stride, int64_t row_stride, float eps,
                   float *logits, int64_t *lens, int8_t *state, int64_t *toks, float *lps,
                   int64_t *n_out, int room, const float *u, float temperature,
                   const uint8_t *is_stop, const uint8_t *is_cand, int threads) {
    if (D > 256) return 1;
    for (int b = 0; b < B; b++) {
        if (state[b] == DONE || state[b] == WAIT) continue;
        /* the slots its feeds will write: at most room - n_out more */
        if (lens[b] < 0 || lens[b] + (room - n_out[b]) > cap || n_out[b] > room) return 2;
        if (state[b] == FEED) {
            if (n_out[b] < 1) return 2;
            const int64_t t = toks[(size_t)b * room + n_out[b] - 1];
            if (t < 0 || t >= V) return 2;
        }
    }
    int64_t *feed = malloc(sizeof(int64_t) * (size_t)(B > 0 ? B : 1));
    int64_t *ones = malloc(sizeof(int64_t) * (size_t)(B > 0 ? B : 1));
    if (!feed || !ones) {
        free(feed);
        free(ones);
        return 1;
    }
    for (int b = 0; b < B; b++) ones[b] = 1;
    step_args a = {B, L, H, NH, KV, D, I, V, cap, 1, feed, lens, ones, embed, w, normw, headT,
                   cos, sin, kc, vc, layer_stride, row_stride, eps, logits};
    if (threads < 1) threads = 1;
    if (threads > B) threads = B > 0 ? B : 1;
    if (threads > 64) threads = 64;
    loop_slice parts[64];
    for (int t = 0; t < threads; t++) {
        loop_slice s = {&a, (int)((int64_t)B * t / threads), (int)((int64_t)B * (t + 1) / threads),
                        state, toks, n_out, lps, room, u, temperature, is_stop, is_cand, feed};
        parts[t] = s;
    }
    const int failed = B > 0 ? run_parts(run_loop_slice, parts, sizeof(loop_slice), threads) : 0;
    free(feed);
    free(ones);
    return failed;
}
