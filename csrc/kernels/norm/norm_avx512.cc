// AVX-512 layer norm and RMS norm rows (see norm.h). Three passes over a row that stays in L1:
// (1) s = x + residual, written once (to sum_out, else to y) and summed; (2) the statistic;
// (3) the normalised output. Tails use masked loads and stores.
#include <immintrin.h>

#include <cmath>

#include "kernels/norm/norm.h"
#include "kernels/vector_math/vector_math_avx512.h"

namespace cpuformer {
namespace avx512 {
namespace {

constexpr long kLanes = 16;

// Where s lives after pass 1 and whether pass 1 must write it there. With a residual, s is
// stored in sum_out if given (the caller wants it anyway), else in y (the reference's scratch);
// without one, s is x itself and is copied only when sum_out asks for it. Every later pass reads
// s[i] before writing y[i], so the aliasing that norm.h allows is safe.
struct RowSource {
  const float* s;
  float* store;  // null: nothing to write in pass 1
};

inline RowSource row_source(const float* x, const float* residual, float* sum_out, float* y) {
  if (sum_out) return {sum_out, sum_out};
  if (residual) return {y, y};
  return {x, nullptr};
}

// s = x + residual for one vector (masked lanes read 0), stored when `store` is set.
template <bool kResidual, bool kStore>
inline __m512 load_sum(const float* x, const float* residual, float* store, long i, __mmask16 m) {
  __m512 v = _mm512_maskz_loadu_ps(m, x + i);
  if (kResidual) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, residual + i));
  if (kStore) _mm512_mask_storeu_ps(store + i, m, v);
  return v;
}

// Pass 1: writes s where RowSource says and returns Σ s (kSquares: Σ s²).
template <bool kResidual, bool kStore, bool kSquares>
float first_pass(const float* x, const float* residual, float* store, long n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  const __mmask16 all = 0xFFFF;
  auto acc = [](__m512 a, __m512 v) { return kSquares ? _mm512_fmadd_ps(v, v, a) : _mm512_add_ps(a, v); };
  long i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    a0 = acc(a0, load_sum<kResidual, kStore>(x, residual, store, i, all));
    a1 = acc(a1, load_sum<kResidual, kStore>(x, residual, store, i + kLanes, all));
    a2 = acc(a2, load_sum<kResidual, kStore>(x, residual, store, i + 2 * kLanes, all));
    a3 = acc(a3, load_sum<kResidual, kStore>(x, residual, store, i + 3 * kLanes, all));
  }
  for (; i + kLanes <= n; i += kLanes) a0 = acc(a0, load_sum<kResidual, kStore>(x, residual, store, i, all));
  if (i < n) a1 = acc(a1, load_sum<kResidual, kStore>(x, residual, store, i, tail_mask(n - i)));
  return reduce_add(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

template <bool kSquares>
float first_pass(const float* x, const float* residual, float* store, long n) {
  if (residual) {
    return store ? first_pass<true, true, kSquares>(x, residual, store, n)
                 : first_pass<true, false, kSquares>(x, residual, store, n);
  }
  return store ? first_pass<false, true, kSquares>(x, residual, store, n)
               : first_pass<false, false, kSquares>(x, residual, store, n);
}

// Σ (s - mean)², the centred second pass.
float centred_squares(const float* s, float mean, long n) {
  const __m512 vmean = _mm512_set1_ps(mean);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  long i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(s + i), vmean);
    const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(s + i + kLanes), vmean);
    const __m512 d2 = _mm512_sub_ps(_mm512_loadu_ps(s + i + 2 * kLanes), vmean);
    const __m512 d3 = _mm512_sub_ps(_mm512_loadu_ps(s + i + 3 * kLanes), vmean);
    a0 = _mm512_fmadd_ps(d0, d0, a0);
    a1 = _mm512_fmadd_ps(d1, d1, a1);
    a2 = _mm512_fmadd_ps(d2, d2, a2);
    a3 = _mm512_fmadd_ps(d3, d3, a3);
  }
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(s + i), vmean);
    a0 = _mm512_fmadd_ps(d, d, a0);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, s + i), vmean);  // 0 in tail lanes
    a1 = _mm512_fmadd_ps(d, d, a1);
  }
  return reduce_add(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// y = (s - mean)·inv·weight (+ bias)
template <bool kBias>
void layer_norm_output(const float* s, float mean, float inv, const float* weight, const float* bias, float* y,
                       long n) {
  const __m512 vmean = _mm512_set1_ps(mean), vinv = _mm512_set1_ps(inv);
  auto out = [&](long i, __mmask16 m) {
    const __m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), vmean), vinv);
    const __m512 w = _mm512_maskz_loadu_ps(m, weight + i);
    const __m512 r = kBias ? _mm512_fmadd_ps(t, w, _mm512_maskz_loadu_ps(m, bias + i)) : _mm512_mul_ps(t, w);
    _mm512_mask_storeu_ps(y + i, m, r);
  };
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) out(i, 0xFFFF);
  if (i < n) out(i, tail_mask(n - i));
}

void layer_norm_row(const float* x, const float* residual, float* sum_out, const float* weight, const float* bias,
                    float eps, float* y, long n) {
  const RowSource src = row_source(x, residual, sum_out, y);
  const float mean = first_pass<false>(x, residual, src.store, n) / static_cast<float>(n);
  const float var = centred_squares(src.s, mean, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(var + eps);
  if (bias) layer_norm_output<true>(src.s, mean, inv, weight, bias, y, n);
  else layer_norm_output<false>(src.s, mean, inv, weight, nullptr, y, n);
}

void rms_norm_row(const float* x, const float* residual, float* sum_out, const float* weight, float eps, float* y,
                  long n) {
  const RowSource src = row_source(x, residual, sum_out, y);
  const float sum_sq = first_pass<true>(x, residual, src.store, n);
  const __m512 vinv = _mm512_set1_ps(1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps));
  auto out = [&](long i, __mmask16 m) {
    const __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src.s + i), vinv);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(t, _mm512_maskz_loadu_ps(m, weight + i)));
  };
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) out(i, 0xFFFF);
  if (i < n) out(i, tail_mask(n - i));
}

}  // namespace

const NormKernels kNormKernels = {layer_norm_row, rms_norm_row};

}  // namespace avx512
}  // namespace cpuformer
