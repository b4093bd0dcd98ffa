/* Decode steps (and prefills, a token at a time) of a small Llama, every layer fused, over a
 * preallocated float32 KV cache.
 *
 * The same arithmetic as kgsynth/llm/kv_llama.py's forward (RMSNorm, rotary, attention over
 * each row's filled slots, SiLU-gated MLP, the final norm and the head), a block of up to ROWS
 * rows through each weight together, and attention reads only the slots a row has filled.
 * Rows are split over `threads` POSIX threads. Built on first use by
 * kgsynth/llm/native_step.py, with decode_loop.c; no other dependency than libm.
 */
#include "decode_step.h"

typedef struct {
    const step_args *a;
    int b0, b1;
} slice;

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0.f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

static void rope(float *x, const float *cos, const float *sin, int D) {
    int half = D / 2;
    float tmp[256];
    for (int d = 0; d < half; d++) tmp[d] = -x[d + half];
    for (int d = half; d < D; d++) tmp[d] = x[d - half];
    for (int d = 0; d < D; d++) x[d] = x[d] * cos[d] + tmp[d] * sin[d];
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* e^x for 16 floats (Cephes' expf polynomial, relative error ~2e-7); 0 below -87.3 (where
 * e^x is under the smallest normal float), so a masked (-inf) logit is never drawn */
static inline __m512 exp16(__m512 x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)),
                      _mm512_set1_ps(-88.3762626647949f));
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(y, fx));
}

void exp_inplace(float *a, int n, float shift) {
    int s = 0;
    const __m512 m = _mm512_set1_ps(shift);
    for (; s + 16 <= n; s += 16)
        _mm512_storeu_ps(a + s, exp16(_mm512_sub_ps(_mm512_loadu_ps(a + s), m)));
    if (s < n) {
        __mmask16 k = (__mmask16)((1u << (n - s)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(k, a + s);
        _mm512_mask_storeu_ps(a + s, k, exp16(_mm512_sub_ps(v, m)));
    }
}

static int fast_attention(int D) { return D % 16 == 0; }

/* the dot products of q with 16 consecutive 16-float keys, as one vector: the 16 products
 * summed by a transpose tree (pairs, quads, then across the four 128-bit lanes) */
static inline __m512 dot16x16(__m512 q, const float *K) {
    __m512 t[8], u[4], v[2];
    for (int i = 0; i < 8; i++) {
        __m512 a = _mm512_mul_ps(q, _mm512_loadu_ps(K + 32 * i));
        __m512 b = _mm512_mul_ps(q, _mm512_loadu_ps(K + 32 * i + 16));
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; i++)
        v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88),
                         _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

/* sc[s] = q . K[s] for n slots of D (a multiple of 16) floats */
static void scores_any(float *restrict sc, const float *restrict q, const float *restrict K,
                       int n, int D) {
    if (D == 16) {
        const __m512 qv = _mm512_loadu_ps(q);
        int s = 0;
        for (; s + 16 <= n; s += 16) _mm512_storeu_ps(sc + s, dot16x16(qv, K + (size_t)s * 16));
        for (; s < n; s++)
            sc[s] = _mm512_reduce_add_ps(_mm512_mul_ps(qv, _mm512_loadu_ps(K + (size_t)s * 16)));
        return;
    }
    for (int s = 0; s < n; s++) {
        __m512 acc = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(K + (size_t)s * D + d),
                                  acc);
        sc[s] = _mm512_reduce_add_ps(acc);
    }
}

/* out = sum_s p[s] V[s] */
static void weighted_sum(float *restrict out, const float *restrict p, const float *restrict Vv,
                         int n, int D) {
    for (int d = 0; d < D; d += 16) {
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        int s = 0;
        for (; s + 2 <= n; s += 2) {
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[s]), _mm512_loadu_ps(Vv + (size_t)s * D + d), a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(p[s + 1]),
                                 _mm512_loadu_ps(Vv + (size_t)(s + 1) * D + d), a1);
        }
        if (s < n)
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[s]), _mm512_loadu_ps(Vv + (size_t)s * D + d), a0);
        _mm512_storeu_ps(out + d, _mm512_add_ps(a0, a1));
    }
}
#else
void exp_inplace(float *a, int n, float shift) {
    for (int s = 0; s < n; s++) a[s] = expf(a[s] - shift);
}

static int fast_attention(int D) { (void)D; return 0; }

static void scores_any(float *restrict sc, const float *restrict q, const float *restrict K,
                       int n, int D) {
    (void)sc; (void)q; (void)K; (void)n; (void)D;
}

static void weighted_sum(float *restrict out, const float *restrict p, const float *restrict Vv,
                         int n, int D) {
    (void)out; (void)p; (void)Vv; (void)n; (void)D;
}
#endif

static void attend(float *restrict out, const float *restrict q, const float *restrict K,
                   const float *restrict Vv, int n, int D, float *restrict sc) {
    if (fast_attention(D)) {
        scores_any(sc, q, K, n, D);
    } else {
        for (int s = 0; s < n; s++) {
            float acc = 0.f;
            for (int d = 0; d < D; d++) acc += q[d] * K[(size_t)s * D + d];
            sc[s] = acc;
        }
    }
    float m = sc[0];
    for (int s = 1; s < n; s++) m = sc[s] > m ? sc[s] : m;
    exp_inplace(sc, n, m);
    float total = 0.f;
    for (int s = 0; s < n; s++) total += sc[s];
    const float inv = 1.f / total;
    for (int s = 0; s < n; s++) sc[s] *= inv;
    if (fast_attention(D)) {
        weighted_sum(out, sc, Vv, n, D);
        return;
    }
    for (int d = 0; d < D; d++) out[d] = 0.f;
    for (int s = 0; s < n; s++) {
        const float *restrict v = Vv + (size_t)s * D;
        for (int d = 0; d < D; d++) out[d] += sc[s] * v[d];
    }
}

/* out[r][n] = sum_k x[r][k] * wT[k][n] for R rows (wT is the weight transposed: [K][N]);
 * each weight row is read once for several rows */
#if defined(__AVX512F__)
static inline __mmask16 tail_mask(int left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* a tile of 4 rows x 64 columns in 16 registers */
static void matmul_rows(float *restrict out, const float *restrict x, const float *restrict wT,
                        int R, int K, int N) {
    for (int r0 = 0; r0 < R; r0 += 4) {
        const float *xr[4];
        for (int i = 0; i < 4; i++) xr[i] = x + (size_t)(r0 + i < R ? r0 + i : R - 1) * K;
        for (int n0 = 0; n0 < N; n0 += 64) {
            __mmask16 m[4];
            for (int j = 0; j < 4; j++) m[j] = tail_mask(N - n0 - 16 * j);
            __m512 acc[4][4];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
            for (int k = 0; k < K; k++) {
                const float *row = wT + (size_t)k * N + n0;
                __m512 wv[4];
                for (int j = 0; j < 4; j++) wv[j] = _mm512_maskz_loadu_ps(m[j], row + 16 * j);
                for (int i = 0; i < 4; i++) {
                    const __m512 xb = _mm512_set1_ps(xr[i][k]);
                    for (int j = 0; j < 4; j++) acc[i][j] = _mm512_fmadd_ps(xb, wv[j], acc[i][j]);
                }
            }
            for (int i = 0; i < 4 && r0 + i < R; i++)
                for (int j = 0; j < 4; j++)
                    _mm512_mask_storeu_ps(out + (size_t)(r0 + i) * N + n0 + 16 * j, m[j], acc[i][j]);
        }
    }
}
#else
#define CHUNK 128 /* output columns a pass (ROWS x CHUNK accumulators stay in L1) */

static void matmul_rows(float *restrict out, const float *restrict x, const float *restrict wT,
                        int R, int K, int N) {
    for (int n0 = 0; n0 < N; n0 += CHUNK) {
        const int w = N - n0 < CHUNK ? N - n0 : CHUNK;
        for (int r = 0; r < R; r++) memset(out + (size_t)r * N + n0, 0, sizeof(float) * w);
        for (int k = 0; k < K; k++) {
            const float *restrict row = wT + (size_t)k * N + n0;
            for (int r = 0; r < R; r++) {
                const float xk = x[(size_t)r * K + k];
                float *restrict o = out + (size_t)r * N + n0;
                for (int n = 0; n < w; n++) o[n] += xk * row[n];
            }
        }
    }
}
#endif

size_t scratch_floats(const step_args *a) {
    return (size_t)ROWS * (2 * a->H + (a->NH + 2 * a->KV) * a->D + a->NH * a->D + 2 * a->I) +
           (size_t)a->cap + (size_t)a->I + 64;
}

scratch carve(const step_args *a, float *buf) {
    scratch s;
    s.h = buf;
    s.x = s.h + ROWS * a->H;
    s.qkv = s.x + ROWS * a->H;
    s.att = s.qkv + ROWS * (a->NH + 2 * a->KV) * a->D;
    s.gu = s.att + ROWS * a->NH * a->D;
    s.sc = s.gu + ROWS * 2 * a->I;
    return s;
}

/* rotary, the new keys and values into the cache, attention over the filled slots: row b */
static void attend_row(const step_args *a, int l, int b, int64_t p, float *qkv, float *att,
                       float *sc) {
    const int NH = a->NH, KV = a->KV, D = a->D, cap = a->cap, group = NH / KV;
    const float *cs = a->cos + (size_t)p * D, *sn = a->sin + (size_t)p * D;
    const float scale = 1.f / sqrtf((float)D);
    for (int j = 0; j < NH + KV; j++) rope(qkv + j * D, cs, sn, D);
    float *kl = a->kc + l * a->layer_stride + b * a->row_stride;
    float *vl = a->vc + l * a->layer_stride + b * a->row_stride;
    for (int j = 0; j < KV; j++) {
        memcpy(kl + ((size_t)j * cap + p) * D, qkv + (NH + j) * D, sizeof(float) * D);
        memcpy(vl + ((size_t)j * cap + p) * D, qkv + (NH + KV + j) * D, sizeof(float) * D);
    }
    for (int hd = 0; hd < NH; hd++) {
        float *q = qkv + hd * D;
        for (int d = 0; d < D; d++) q[d] *= scale;
        const size_t off = (size_t)(hd / group) * cap * D;
        attend(att + hd * D, q, kl + off, vl + off, (int)p + 1, D, sc);
    }
}

/* token t of rows rows[0..R-1] (R <= ROWS) through every layer; the head for the rows whose
 * last token it is */
void one_block(const step_args *a, const int *rows, int R, int t, scratch s) {
    const int H = a->H, NH = a->NH, KV = a->KV, D = a->D, I = a->I;
    const int NQKV = (NH + 2 * KV) * D;
    for (int r = 0; r < R; r++)
        memcpy(s.h + r * H, a->embed + (size_t)a->ids[(size_t)rows[r] * a->T + t] * H,
               sizeof(float) * (size_t)H);
    for (int l = 0; l < a->L; l++) {
        const float *const *w = a->w + 6 * l;
        for (int r = 0; r < R; r++) rmsnorm(s.x + r * H, s.h + r * H, w[0], H, a->eps);
        matmul_rows(s.qkv, s.x, w[1], R, H, NQKV);
        for (int r = 0; r < R; r++)
            attend_row(a, l, rows[r], a->start[rows[r]] + t, s.qkv + r * NQKV,
                       s.att + r * NH * D, s.sc);
        matmul_rows(s.x, s.att, w[2], R, NH * D, H);
        for (int i = 0; i < R * H; i++) s.h[i] += s.x[i];
        for (int r = 0; r < R; r++) rmsnorm(s.x + r * H, s.h + r * H, w[3], H, a->eps);
        matmul_rows(s.gu, s.x, w[4], R, H, 2 * I);
        for (int r = 0; r < R; r++) {
            float *g = s.gu + (size_t)r * 2 * I;
            for (int i = 0; i < I; i++) s.sc[i] = -g[i];
            exp_inplace(s.sc, I, 0.f);
            /* the activations go where the next product reads them: [R][I] */
            float *o = s.gu + (size_t)r * I;
            for (int i = 0; i < I; i++) {
                const float act = g[i] / (1.f + s.sc[i]) * g[I + i];
                o[i] = act; /* o[i] is at or before g[i]: never read again */
            }
        }
        matmul_rows(s.x, s.gu, w[5], R, I, H);
        for (int i = 0; i < R * H; i++) s.h[i] += s.x[i];
    }
    int n = 0, ends[ROWS];
    for (int r = 0; r < R; r++) {
        if (t != a->valid[rows[r]] - 1) continue;
        rmsnorm(s.x + n * H, s.h + r * H, a->normw, H, a->eps);
        ends[n++] = rows[r];
    }
    if (n == 0) return;
    if (n == R && R > 0 && rows[R - 1] - rows[0] == R - 1) { /* contiguous: straight out */
        matmul_rows(a->logits + (size_t)rows[0] * a->V, s.x, a->headT, R, H, a->V);
        return;
    }
    for (int i = 0; i < n; i++) matmul_rows(a->logits + (size_t)ends[i] * a->V, s.x + i * H,
                                            a->headT, 1, H, a->V);
}

static void *run_slice(void *arg) {
    slice *s = (slice *)arg;
    const step_args *a = s->a;
    float *buf = malloc(sizeof(float) * scratch_floats(a));
    if (!buf) return (void *)1;
    scratch sc = carve(a, buf);
    int rows[ROWS];
    /* a block of rows at a time, all of its tokens (only its keys are read meanwhile) */
    for (int blk = s->b0; blk < s->b1; blk += ROWS) {
        const int end = blk + ROWS < s->b1 ? blk + ROWS : s->b1;
        for (int t = 0; t < a->T; t++) { /* the block's token t, the rows that have one */
            int R = 0;
            for (int b = blk; b < end; b++)
                if (t < a->valid[b]) rows[R++] = b;
            if (R == 0) break; /* valid >= 1 everywhere: past every row's last token */
            one_block(a, rows, R, t, sc);
        }
    }
    free(buf);
    return NULL;
}

/* Returns 0; 2 for an id or a position out of range (nothing written); 1 when memory or a
 * thread could not be had (the caller runs the step again in torch, which rewrites the same
 * slots). */
int kg_decode_step(int B, int L, int H, int NH, int KV, int D, int I, int V, int cap, int T,
                   const int64_t *ids, const int64_t *start, const int64_t *valid,
                   const float *embed,
                   const float *const *w, const float *normw, const float *headT,
                   const float *cos, const float *sin, float *kc, float *vc,
                   int64_t layer_stride, int64_t row_stride, float eps, float *logits,
                   int threads) {
    if (D > 256) return 1;
    for (int b = 0; b < B; b++) { /* out of range: torch runs the step and says so */
        if (valid[b] < 1 || valid[b] > T || start[b] < 0 || start[b] + valid[b] > cap) return 2;
        for (int t = 0; t < valid[b]; t++)
            if (ids[(size_t)b * T + t] < 0 || ids[(size_t)b * T + t] >= V) return 2;
    }
    step_args a = {B, L, H, NH, KV, D, I, V, cap, T, ids, start, valid, embed, w, normw, headT,
                   cos, sin, kc, vc, layer_stride, row_stride, eps, logits};
    if (threads < 1) threads = 1;
    if (threads > B) threads = B;
    if (threads > 64) threads = 64;
    slice parts[64];
    for (int t = 0; t < threads; t++) {
        parts[t].a = &a;
        parts[t].b0 = (int)((int64_t)B * t / threads);
        parts[t].b1 = (int)((int64_t)B * (t + 1) / threads);
    }
    return run_parts(run_slice, parts, sizeof(slice), threads);
}

int run_parts(void *(*fn)(void *), void *parts, size_t size, int n) {
    pthread_t tids[64];
    int failed = 0, started = 0;
    if (n > 64) return 1;
    for (int t = 1; t < n; t++) {
        if (pthread_create(&tids[t], NULL, fn, (char *)parts + (size_t)t * size) != 0) {
            failed = 1;
            break;
        }
        started = t;
    }
    if (n > 0 && fn(parts) != NULL) failed = 1;
    for (int t = 1; t <= started; t++) {
        void *r = NULL;
        pthread_join(tids[t], &r);
        if (r != NULL) failed = 1;
    }
    return failed;
}
