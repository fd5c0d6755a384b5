// AVX2 layer norm and RMS norm rows: the three-pass scheme of norm_avx512.cc with 8 lanes.
// Tails use _mm256_maskload_ps / _mm256_maskstore_ps, which do not touch masked-off lanes.
#include <immintrin.h>

#include <cmath>

#include "kernels/norm/norm.h"
#include "kernels/vector_math/vector_math_avx2.h"

namespace cpuformer {
namespace avx2 {
namespace {

constexpr long kLanes = 8;

// A row position: full vectors use plain loads and stores, the tail the masked forms (masked
// lanes read as 0).
struct Lanes {
  bool tail;
  __m256i mask;
  __m256 load(const float* p) const { return tail ? _mm256_maskload_ps(p, mask) : _mm256_loadu_ps(p); }
  void store(float* p, __m256 v) const {
    if (tail) _mm256_maskstore_ps(p, mask, v);
    else _mm256_storeu_ps(p, v);
  }
};

constexpr Lanes kFull = {false, {}};

// See norm_avx512.cc: where s lives after pass 1 and whether pass 1 writes it.
struct RowSource {
  const float* s;
  float* store;
};

inline RowSource row_source(const float* x, const float* residual, float* sum_out, float* y) {
  if (sum_out) return {sum_out, sum_out};
  if (residual) return {y, y};
  return {x, nullptr};
}

template <bool kResidual, bool kStore>
inline __m256 load_sum(const float* x, const float* residual, float* store, long i, const Lanes& l) {
  __m256 v = l.load(x + i);
  if (kResidual) v = _mm256_add_ps(v, l.load(residual + i));
  if (kStore) l.store(store + i, v);
  return v;
}

template <bool kResidual, bool kStore, bool kSquares>
float first_pass(const float* x, const float* residual, float* store, long n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  auto acc = [](__m256 a, __m256 v) { return kSquares ? _mm256_fmadd_ps(v, v, a) : _mm256_add_ps(a, v); };
  long i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    a0 = acc(a0, load_sum<kResidual, kStore>(x, residual, store, i, kFull));
    a1 = acc(a1, load_sum<kResidual, kStore>(x, residual, store, i + kLanes, kFull));
    a2 = acc(a2, load_sum<kResidual, kStore>(x, residual, store, i + 2 * kLanes, kFull));
    a3 = acc(a3, load_sum<kResidual, kStore>(x, residual, store, i + 3 * kLanes, kFull));
  }
  for (; i + kLanes <= n; i += kLanes) a0 = acc(a0, load_sum<kResidual, kStore>(x, residual, store, i, kFull));
  if (i < n) a1 = acc(a1, load_sum<kResidual, kStore>(x, residual, store, i, Lanes{true, tail_mask(n - i)}));
  return reduce_add(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
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

float centred_squares(const float* s, float mean, long n) {
  const __m256 vmean = _mm256_set1_ps(mean);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  long i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(s + i), vmean);
    const __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(s + i + kLanes), vmean);
    const __m256 d2 = _mm256_sub_ps(_mm256_loadu_ps(s + i + 2 * kLanes), vmean);
    const __m256 d3 = _mm256_sub_ps(_mm256_loadu_ps(s + i + 3 * kLanes), vmean);
    a0 = _mm256_fmadd_ps(d0, d0, a0);
    a1 = _mm256_fmadd_ps(d1, d1, a1);
    a2 = _mm256_fmadd_ps(d2, d2, a2);
    a3 = _mm256_fmadd_ps(d3, d3, a3);
  }
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(s + i), vmean);
    a0 = _mm256_fmadd_ps(d, d, a0);
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 d = _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(s + i, m), vmean), _mm256_castsi256_ps(m));
    a1 = _mm256_fmadd_ps(d, d, a1);
  }
  return reduce_add(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

template <bool kBias>
void layer_norm_output(const float* s, float mean, float inv, const float* weight, const float* bias, float* y,
                       long n) {
  const __m256 vmean = _mm256_set1_ps(mean), vinv = _mm256_set1_ps(inv);
  auto out = [&](long i, const Lanes& l) {
    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(l.load(s + i), vmean), vinv);
    const __m256 w = l.load(weight + i);
    l.store(y + i, kBias ? _mm256_fmadd_ps(t, w, l.load(bias + i)) : _mm256_mul_ps(t, w));
  };
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) out(i, kFull);
  if (i < n) out(i, Lanes{true, tail_mask(n - i)});
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
  const __m256 vinv = _mm256_set1_ps(1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps));
  auto out = [&](long i, const Lanes& l) {
    l.store(y + i, _mm256_mul_ps(_mm256_mul_ps(l.load(src.s + i), vinv), l.load(weight + i)));
  };
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) out(i, kFull);
  if (i < n) out(i, Lanes{true, tail_mask(n - i)});
}

}  // namespace

const NormKernels kNormKernels = {layer_norm_row, rms_norm_row};

}  // namespace avx2
}  // namespace cpuformer
