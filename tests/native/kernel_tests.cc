// Native kernel tests: every kernel family the dispatch tables hold (GEMM with float32, float16,
// bfloat16, int8 and int4 weights; attention with float32, float16, bfloat16 and int8 keys and
// values; layer and RMS norm; activations, softmax, SwiGLU; the vector math functions and row
// reductions), at the ISA level this process runs at, against float64 references written here. The
// tolerances and special values are the ones tests/kernels states (the kernel headers' contracts).
// Sizes walk through vector and tile tails (1, 3, 7, 17, 33, 65, 127, ...). Also: the level in use,
// its matmul kernels and the tables of the other families, that the compute-peak probe of each
// weight type runs, and the thread pool's teams (runtime/thread_pool.h).
//
// One run checks one level: CPUFORMER_ISA picks it (the best the CPU has when unset), as for the
// Python package. A level the CPU lacks exits 77 (ctest reports it as skipped). The build registers
// one ctest per level of its architecture (CMakeLists.txt, CPUFORMER_BUILD_TESTS);
// scripts/test-aarch64.sh runs the AArch64 build under QEMU at each ARM level. No Python needed,
// so it also runs where the extension cannot be built (a cross build).
//
// Output: the level, the CPU features and matmul kernels, one line per failed check, a summary.
// Exit status 0 when every check passed, 1 otherwise.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/activation/activation.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_peak.h"
#include "kernels/norm/norm.h"
#include "kernels/vector_math/vector_math.h"
#include "layers/linear.h"
#include "models/generation.h"
#include "runtime/cpu_features.h"
#include "runtime/load_scratch.h"
#include "runtime/thread_pool.h"
#include "runtime/threading.h"

namespace {

using namespace cpuformer;

int g_checks = 0;
int g_failures = 0;

// Records one check: every |got[i] - ref[i]| ≤ tol[i] and got[i] finite where ref[i] is.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<double>& tol) {
  ++g_checks;
  long worst = -1;
  double worst_excess = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err - tol[i];
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = static_cast<long>(i);
    }
  }
  if (worst >= 0) {
    ++g_failures;
    std::printf("FAIL %s: element %ld is %.9g, reference %.9g (tolerance %.3g)\n", what.c_str(), worst,
                static_cast<double>(got[worst]), ref[worst], tol[worst]);
  }
}

void expect(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

std::mt19937 g_rng(20261126);

std::vector<float> randn(std::size_t n, float scale = 1.0f, float shift = 0.0f) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(g_rng) * scale + shift;
  return v;
}

std::string dims(std::initializer_list<long> values) {
  std::string out;
  for (long v : values) out += (out.empty() ? "" : "x") + std::to_string(v);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Activations (activation.h): the float64 definitions.

double activate(Activation act, double z) {
  switch (act) {
    case Activation::kNone: return z;
    case Activation::kRelu: return z > 0.0 ? z : 0.0;
    case Activation::kGeluErf: return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
    case Activation::kGeluTanh: return 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    case Activation::kSilu: return z / (1.0 + std::exp(-z));
    case Activation::kQuickGelu: return z / (1.0 + std::exp(-1.702 * z));
  }
  return z;
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kNone: return "none";
    case Activation::kRelu: return "relu";
    case Activation::kGeluErf: return "gelu";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kSilu: return "silu";
    case Activation::kQuickGelu: return "quick_gelu";
  }
  return "?";
}

const Activation kActivations[] = {Activation::kNone,     Activation::kRelu, Activation::kGeluErf,
                                   Activation::kGeluTanh, Activation::kSilu, Activation::kQuickGelu};

void test_activations() {
  for (long n : {1L, 3L, 7L, 17L, 33L, 65L, 127L, 4097L}) {
    const std::vector<float> x = randn(n, 4.0f);
    for (Activation act : kActivations) {
      std::vector<float> y(n);
      apply_activation(act, x.data(), y.data(), n);
      std::vector<double> ref(n), tol(n);
      for (long i = 0; i < n; ++i) {
        ref[i] = activate(act, x[i]);
        tol[i] = 2e-6 + 1e-6 * std::fabs(ref[i]);
      }
      expect_close(std::string("activation ") + activation_name(act) + " n=" + std::to_string(n), y, ref, tol);
    }
    // SwiGLU: silu(gate)·up, the product rounded once more.
    const std::vector<float> up = randn(n, 2.0f);
    std::vector<float> y(n);
    silu_mul(x.data(), up.data(), y.data(), n);
    std::vector<double> ref(n), tol(n);
    for (long i = 0; i < n; ++i) {
      const double s = activate(Activation::kSilu, x[i]);
      ref[i] = s * up[i];
      tol[i] = (2e-6 + 1e-6 * std::fabs(s)) * std::fabs(up[i]) + 1.2e-7 * std::fabs(ref[i]);
    }
    expect_close("silu_mul n=" + std::to_string(n), y, ref, tol);
  }
  for (long n : {1L, 3L, 17L, 65L, 127L, 1000L}) {
    const long rows = 3;
    std::vector<float> x = randn(rows * n, 3.0f);
    if (n > 2) x[n + 1] = -std::numeric_limits<float>::infinity();  // a removed entry gives 0
    std::vector<float> y(rows * n);
    softmax_rows(x.data(), y.data(), rows, n);
    std::vector<double> ref(rows * n), tol(rows * n);
    for (long r = 0; r < rows; ++r) {
      double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
      for (long i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[r * n + i]));
      for (long i = 0; i < n; ++i) sum += std::exp(x[r * n + i] - mx);
      for (long i = 0; i < n; ++i) {
        ref[r * n + i] = std::exp(x[r * n + i] - mx) / sum;
        tol[r * n + i] = 1e-8 + 1e-5 * ref[r * n + i];
      }
    }
    expect_close("softmax_rows n=" + std::to_string(n), y, ref, tol);
  }
}

// ---------------------------------------------------------------------------------------------
// Vector math (vector_math.h): the tolerances of tests/kernels/test_vector_math.py.

void test_vector_math() {
  const VectorMathKernels& k = vector_math_kernels();
  std::vector<float> x;
  for (int i = 0; i <= 40000; ++i) x.push_back(-20.0f + 0.001f * static_cast<float>(i));
  std::uniform_real_distribution<float> exponent(-30.0f, 30.0f);
  for (int i = 0; i < 4000; ++i) {
    const float m = std::pow(10.0f, exponent(g_rng));
    x.push_back(m);
    x.push_back(-m);
  }
  x.push_back(0.0f);
  x.push_back(-0.0f);
  struct Case {
    VectorFunction f;
    const char* name;
    double abs_tol, rel_tol;
  };
  const Case cases[] = {{VectorFunction::kErf, "erf", 4.5e-7, 4.5e-7},
                        {VectorFunction::kTanh, "tanh", 4.5e-7, 4.5e-7},
                        {VectorFunction::kSigmoid, "sigmoid", 1.2e-7, 3.5e-7}};
  for (const Case& c : cases) {
    std::vector<float> y(x.size());
    k.apply(c.f, x.data(), y.data(), static_cast<long>(x.size()));
    std::vector<double> ref(x.size()), tol(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double d = x[i];
      ref[i] = c.f == VectorFunction::kErf    ? std::erf(d)
               : c.f == VectorFunction::kTanh ? std::tanh(d)
                                              : 1.0 / (1.0 + std::exp(-d));
      tol[i] = std::fabs(ref[i]) > 1e-30 ? std::min(c.abs_tol, c.rel_tol * std::fabs(ref[i])) : c.abs_tol;
      // Both bounds hold: the absolute one everywhere, the relative one where |ref| > 1e-30.
    }
    expect_close(std::string("vector_math ") + c.name, y, ref, tol);
  }
  // exp: relative 2.5e-7 where e^x is a normal float and below the AVX2 clamp.
  std::vector<float> xe;
  for (float v : x)
    if (v > -87.3f && v < 88.3f) xe.push_back(v);
  for (VectorFunction f : {VectorFunction::kExp, VectorFunction::kExpNanPropagating}) {
    std::vector<float> y(xe.size());
    k.apply(f, xe.data(), y.data(), static_cast<long>(xe.size()));
    std::vector<double> ref(xe.size()), tol(xe.size());
    for (std::size_t i = 0; i < xe.size(); ++i) {
      ref[i] = std::exp(static_cast<double>(xe[i]));
      tol[i] = 2.5e-7 * ref[i];
    }
    expect_close(f == VectorFunction::kExp ? "vector_math exp" : "vector_math exp_nan_propagating", y, ref, tol);
  }
  // Row reductions, every length through the tails.
  for (long n : {0L, 1L, 3L, 7L, 17L, 33L, 65L, 127L, 4097L}) {
    std::vector<float> v = randn(n, 5.0f);
    if (n > 5) v[n / 2] = std::numeric_limits<float>::quiet_NaN();  // ignored by max_value
    float mx = -std::numeric_limits<float>::infinity();
    for (float e : v)
      if (!std::isnan(e)) mx = std::max(mx, e);
    expect(k.max_value(v.data(), n) == mx, "max_value n=" + std::to_string(n));
    if (n > 5) v[n / 2] = 1.0f;
    const float shift = n > 0 ? mx : 0.0f;
    double sum = 0.0;
    for (float e : v) sum += std::exp(static_cast<double>(e) - shift);
    const double got = k.sum_exp(v.data(), n, shift);
    expect(std::fabs(got - sum) <= 1e-6 * sum + 1e-300, "sum_exp n=" + std::to_string(n));
    const float offset = 0.25f, threshold = 6.0f;
    long first = n;
    for (long i = 0; i < n; ++i)
      if (v[i] + offset > threshold) {
        first = i;
        break;
      }
    expect(k.find_greater(v.data(), n, offset, threshold) == first, "find_greater n=" + std::to_string(n));
  }
}

// Special values and tails (the checks of tests/kernels/test_vector_math.py and test_activation.py
// that hold at every level): saturation to exactly ±1, underflow to 0, NaN kept, ±inf of the
// activations exactly as the scalar reference, and partial vectors giving the bits of full ones.

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

std::vector<float> vmath(VectorFunction f, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  vector_math_kernels().apply(f, x.data(), y.data(), static_cast<long>(x.size()));
  return y;
}

void test_special_values() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const VectorFunction all[] = {VectorFunction::kExp, VectorFunction::kExpNanPropagating, VectorFunction::kErf,
                                VectorFunction::kTanh, VectorFunction::kSigmoid};
  const char* names[] = {"exp", "exp_nan_propagating", "erf", "tanh", "sigmoid"};
  // e^x is below 1e-37 (exactly 0 at the SIMD levels) from -87.34 down to -inf; a NaN survives
  // exp_nan_propagating. (+inf and exp's NaN differ between the scalar reference and the SIMD
  // levels: see vector_math_avx512.h.)
  for (VectorFunction f : {VectorFunction::kExp, VectorFunction::kExpNanPropagating}) {
    const std::vector<float> y = vmath(f, {-inf, -1e30f, -104.0f, -88.0f, -87.5f, nan});
    bool ok = f == VectorFunction::kExp || std::isnan(y[5]);
    for (int i = 0; i < 5; ++i) ok = ok && y[i] >= 0.0f && y[i] < 1e-37f;
    expect(ok, std::string("vector_math ") + names[static_cast<int>(f)] + " special values");
  }
  // erf and tanh are exactly ±1 past 3.85 and 9; sigmoid exactly 1 above 20 and below 1e-40 far left.
  for (VectorFunction f : {VectorFunction::kErf, VectorFunction::kTanh}) {
    const float start = f == VectorFunction::kErf ? 4.0f : 9.5f;
    const std::vector<float> big = {start, start + 0.5f, 100.0f, 1e10f, 3e38f, inf};
    std::vector<float> neg(big.size());
    for (std::size_t i = 0; i < big.size(); ++i) neg[i] = -big[i];
    const std::vector<float> yp = vmath(f, big), yn = vmath(f, neg);
    bool ok = true;
    for (std::size_t i = 0; i < big.size(); ++i) ok = ok && yp[i] == 1.0f && yn[i] == -1.0f;
    expect(ok, std::string("vector_math ") + names[static_cast<int>(f)] + " saturates to exactly +-1");
  }
  {
    const std::vector<float> hi = vmath(VectorFunction::kSigmoid, {20.0f, 100.0f, 3e38f, inf});
    const std::vector<float> lo = vmath(VectorFunction::kSigmoid, {-100.0f, -1e10f, -3e38f, -inf});
    bool ok = true;
    for (int i = 0; i < 4; ++i) ok = ok && hi[i] == 1.0f && lo[i] >= 0.0f && lo[i] < 1e-40f;
    expect(ok, "vector_math sigmoid saturation");
  }
  for (int i = 1; i < 5; ++i) {
    const std::vector<float> y = vmath(all[i], {1.0f, nan, -2.0f, nan, 0.5f});
    expect(!std::isnan(y[0]) && std::isnan(y[1]) && !std::isnan(y[2]) && std::isnan(y[3]) && !std::isnan(y[4]),
           std::string("vector_math ") + names[i] + " keeps NaN");
  }
  // Every length (full vectors and partial ones, at both ends of the array) gives the same bits.
  std::uniform_real_distribution<float> wide(-10.0f, 10.0f);
  std::vector<float> x(67);
  for (float& e : x) e = wide(g_rng);
  for (int fi = 0; fi < 5; ++fi) {
    const std::vector<float> whole = vmath(all[fi], x);
    bool ok = true;
    for (long n = 1; n <= 67; ++n) {
      std::vector<float> head(x.begin(), x.begin() + n), tail(x.end() - n, x.end());
      const std::vector<float> yh = vmath(all[fi], head), yt = vmath(all[fi], tail);
      for (long i = 0; i < n; ++i) ok = ok && same_bits(yh[i], whole[i]) && same_bits(yt[i], whole[67 - n + i]);
    }
    expect(ok, std::string("vector_math ") + names[fi] + ": every length gives the bits of the whole array");
  }
  // max_value skips NaN (all NaN: -inf) and finds +inf; find_greater never takes NaN.
  {
    const VectorMathKernels& k = vector_math_kernels();
    std::vector<float> y(37, nan);
    expect(k.max_value(y.data(), 37) == -inf && k.find_greater(y.data(), 37, 0.0f, -inf) == 37,
           "max_value / find_greater of an all-NaN row");
    y[5] = inf;
    expect(k.max_value(y.data(), 37) == inf && k.find_greater(y.data(), 37, 0.0f, 0.0f) == 5,
           "max_value / find_greater with +inf");
    std::vector<float> z(21, -inf);
    z[20] = 0.0f;
    expect(k.sum_exp(z.data(), 21, 0.0f) == 1.0, "sum_exp: -inf adds nothing");
  }
  // Activations: NaN stays NaN; +inf gives +inf; -inf gives 0 for relu and NaN for the rest (-inf·0).
  for (Activation act : kActivations) {
    if (act == Activation::kNone) continue;
    std::vector<float> in = {nan, inf, -inf, 0.0f, -0.0f, -200.0f}, out(in.size());
    apply_activation(act, in.data(), out.data(), static_cast<long>(in.size()));
    const bool relu = act == Activation::kRelu;
    const bool ok = std::isnan(out[0]) && out[1] == inf && (relu ? out[2] == 0.0f : std::isnan(out[2])) &&
                    out[3] == 0.0f && out[4] == 0.0f && out[5] == 0.0f;
    expect(ok, std::string("activation ") + activation_name(act) + " special values");
  }
  {
    std::vector<float> gate = {nan, 1.0f, -inf, inf, -200.0f, 2.0f}, up = {1.0f, nan, 1.0f, 2.0f, 3.0f, -inf};
    std::vector<float> y(6);
    silu_mul(gate.data(), up.data(), y.data(), 6);
    expect(std::isnan(y[0]) && std::isnan(y[1]) && std::isnan(y[2]) && y[3] == inf && y[4] == 0.0f &&
               std::signbit(y[4]) && y[5] == -inf,
           "silu_mul special values");
  }
  // Softmax: NaN or +inf poisons the row, no entry above -inf gives zeros, -inf entries give 0.
  {
    const long n = 18;
    std::vector<float> x(4 * n), y(4 * n);
    for (long i = 0; i < n; ++i) x[i] = x[n + i] = static_cast<float>(i - 1);
    x[0] = nan;
    x[n] = inf;
    for (long i = 0; i < n; ++i) x[2 * n + i] = -inf;
    x[2 * n] = nan;
    for (long i = 0; i < n; ++i) x[3 * n + i] = i == n - 1 ? 1e30f : -inf;
    softmax_rows(x.data(), y.data(), 4, n);
    bool poisoned = true, zeros = true, one_hot = true;
    for (long i = 0; i < n; ++i) {
      poisoned = poisoned && std::isnan(y[i]) && std::isnan(y[n + i]);
      zeros = zeros && y[2 * n + i] == 0.0f;
      one_hot = one_hot && y[3 * n + i] == (i == n - 1 ? 1.0f : 0.0f);
    }
    expect(poisoned, "softmax: NaN or +inf poisons the row");
    expect(zeros, "softmax: a row with no entry above -inf gives zeros");
    expect(one_hot, "softmax: -inf entries give exactly 0");
  }
}

// ---------------------------------------------------------------------------------------------
// Norms (norm.h): tolerance 1e-5·max(1, |y|).

void test_norms() {
  for (long n : {1L, 3L, 7L, 17L, 33L, 65L, 127L, 768L, 4097L}) {
    const long rows = 3;
    for (int variant = 0; variant < 4; ++variant) {
      const bool with_residual = variant & 1, with_bias = variant & 2;
      const std::vector<float> x = randn(rows * n, 2.0f, 0.5f), res = randn(rows * n, 1.5f, -0.3f);
      const std::vector<float> w = randn(n, 0.2f, 1.0f), b = randn(n, 0.5f);
      const float eps = 1e-5f;
      std::vector<double> s(rows * n);
      for (long i = 0; i < rows * n; ++i) s[i] = static_cast<double>(x[i]) + (with_residual ? res[i] : 0.0);
      const std::string tag =
          " n=" + std::to_string(n) + (with_residual ? " residual" : "") + (with_bias ? " bias" : "");
      // layer norm
      std::vector<float> y(rows * n), sum(rows * n);
      layer_norm(x.data(), with_residual ? res.data() : nullptr, sum.data(), w.data(), with_bias ? b.data() : nullptr,
                 eps, y.data(), rows, n);
      std::vector<double> ref(rows * n), tol(rows * n), sum_ref(rows * n), sum_tol(rows * n);
      for (long r = 0; r < rows; ++r) {
        double mean = 0.0, var = 0.0;
        for (long i = 0; i < n; ++i) mean += s[r * n + i] / n;
        for (long i = 0; i < n; ++i) var += (s[r * n + i] - mean) * (s[r * n + i] - mean) / n;
        for (long i = 0; i < n; ++i) {
          const long e = r * n + i;
          ref[e] = (s[e] - mean) / std::sqrt(var + eps) * w[i] + (with_bias ? b[i] : 0.0);
          tol[e] = 1e-5 * std::max(1.0, std::fabs(ref[e]));
          sum_ref[e] = s[e];
          sum_tol[e] = 6e-8 * std::fabs(s[e]);
        }
      }
      expect_close("layer_norm" + tag, y, ref, tol);
      expect_close("layer_norm sum_out" + tag, sum, sum_ref, sum_tol);
      if (with_residual) {  // in place: y over x, sum_out over the residual
        std::vector<float> xy = x, rs = res;
        layer_norm(xy.data(), rs.data(), rs.data(), w.data(), with_bias ? b.data() : nullptr, eps, xy.data(), rows, n);
        expect_close("layer_norm in place" + tag, xy, ref, tol);
        expect_close("layer_norm sum_out in place" + tag, rs, sum_ref, sum_tol);
      }
      // RMS norm
      rms_norm(x.data(), with_residual ? res.data() : nullptr, nullptr, w.data(), eps, y.data(), rows, n);
      for (long r = 0; r < rows; ++r) {
        double ms = 0.0;
        for (long i = 0; i < n; ++i) ms += s[r * n + i] * s[r * n + i] / n;
        for (long i = 0; i < n; ++i) {
          const long e = r * n + i;
          ref[e] = s[e] / std::sqrt(ms + eps) * w[i];
          tol[e] = 1e-5 * std::max(1.0, std::fabs(ref[e]));
        }
      }
      expect_close("rms_norm" + tag, y, ref, tol);
      if (with_residual) {  // in place: y over the residual
        std::vector<float> ry = res;
        rms_norm(x.data(), ry.data(), nullptr, w.data(), eps, ry.data(), rows, n);
        expect_close("rms_norm in place" + tag, ry, ref, tol);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM (gemm.h): c = act(a·Wᵀ + bias) + residual for every weight type. The reference multiplies
// in float64 what the kernels' contract says they multiply: the rounded 16-bit weights; for int8
// and int4 the quantized rows of A (qa, sa) and the quantized weights. Tolerance as
// tests/kernels/test_gemm.py: 1e-5·√K·scale (scale: the largest |pre-activation| or |residual|),
// plus the activation kernels' bound when there is an activation.

struct QuantizedRow {
  std::vector<float> qa;
  float sa = 0.0f;
};

// A row quantized as gemm.h states: amax, 127/amax in float32, round half to even.
QuantizedRow quantize_row(const float* a, long k) {
  QuantizedRow out;
  out.qa.assign(k, 0.0f);
  float amax = 0.0f;
  for (long p = 0; p < k; ++p) amax = std::fmax(amax, std::fabs(a[p]));
  if (!(amax > 0.0f)) return out;
  const float inv = 127.0f / amax;
  for (long p = 0; p < k; ++p) out.qa[p] = std::nearbyint(a[p] * inv);
  out.sa = amax / 127.0f;
  return out;
}

// z[i][j] = Σ_p a[i][p]·w[j][p] for what the kernels of `format` compute, in float64; also
// Σ|a·w| per element (the bfloat16 dot-product kernel's error is relative to it).
void gemm_reference(const std::vector<float>& a, long m, long lda, const std::vector<float>& w, long n, long k,
                    const WeightFormat& format, std::vector<double>& z, std::vector<double>& magnitude) {
  z.assign(m * n, 0.0);
  magnitude.assign(m * n, 0.0);
  std::vector<double> wd(static_cast<std::size_t>(n) * k);
  switch (format.type) {
    case WeightType::kFloat32:
      for (long i = 0; i < n * k; ++i) wd[i] = w[i];
      break;
    case WeightType::kFloat16:
      for (long i = 0; i < n * k; ++i) wd[i] = half_to_float(float_to_half(w[i]));
      break;
    case WeightType::kBFloat16:
      for (long i = 0; i < n * k; ++i) wd[i] = bfloat16_to_float(float_to_bfloat16(w[i]));
      break;
    case WeightType::kInt8: {
      std::vector<int8_t> q(static_cast<std::size_t>(n) * k);
      std::vector<float> scales(n);
      quantize_weights_s8(w.data(), n, k, k, q.data(), scales.data());
      for (long j = 0; j < n; ++j)
        for (long p = 0; p < k; ++p) wd[j * k + p] = static_cast<double>(q[j * k + p]) * scales[j];
      break;
    }
    case WeightType::kInt4: {
      const long g = format.group_size, groups = int4_groups(k, g), kp = groups * g;
      std::vector<uint8_t> u(static_cast<std::size_t>(n) * kp / 2);
      std::vector<uint16_t> scales(static_cast<std::size_t>(n) * groups);
      std::vector<uint8_t> zeros(format.zero_point ? static_cast<std::size_t>(n) * groups : 0);
      quantize_weights_s4(w.data(), n, k, k, g, format.zero_point, u.data(), scales.data(), zeros.data());
      for (long j = 0; j < n; ++j)
        for (long p = 0; p < k; ++p) {
          const uint8_t byte = u[j * (kp / 2) + p / 2];
          const int nibble = p % 2 == 0 ? byte & 0xF : byte >> 4;
          const int zero = format.zero_point ? zeros[j * groups + p / g] : 8;
          wd[j * k + p] = static_cast<double>(half_to_float(scales[j * groups + p / g])) * (nibble - zero);
        }
      break;
    }
  }
  const bool quantized_a = format.type == WeightType::kInt8 || format.type == WeightType::kInt4;
  for (long i = 0; i < m; ++i) {
    const float* row = a.data() + i * lda;
    QuantizedRow qr;
    if (quantized_a) qr = quantize_row(row, k);
    for (long j = 0; j < n; ++j) {
      double acc = 0.0, mag = 0.0;
      for (long p = 0; p < k; ++p) {
        const double av = quantized_a ? static_cast<double>(qr.qa[p]) * qr.sa : row[p];
        acc += av * wd[j * k + p];
        mag += std::fabs(av * wd[j * k + p]);
      }
      z[i * n + j] = acc;
      magnitude[i * n + j] = mag;
    }
  }
}

std::string format_name(const WeightFormat& f) {
  switch (f.type) {
    case WeightType::kFloat32: return "float32";
    case WeightType::kFloat16: return "float16";
    case WeightType::kBFloat16: return "bfloat16";
    case WeightType::kInt8: return "int8";
    case WeightType::kInt4:
      return "int4 g" + std::to_string(f.group_size) + (f.zero_point ? " zero-point" : " symmetric");
  }
  return "?";
}

// The epilogue's residual for mode 0 (none), 1 (a separate residual [m, ldc]) or 2 (in place: c
// starts as the residual and is the output).
void set_residual(int mode, const std::vector<float>& residual, long ldc, std::vector<float>& c, GemmEpilogue& ep) {
  if (mode == 0) return;
  if (mode == 2) c = residual;
  ep.residual = mode == 2 ? c.data() : residual.data();
  ep.ldr = ldc;
}

void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, long m, long n, long ldc,
                      const std::string& what);

void check_gemm(const WeightFormat& format, long m, long k, long n, Activation act, bool with_bias,
                int residual_mode /* 0 none, 1 separate, 2 in place (residual = c) */) {
  const long lda = k + (m % 3), ldc = n + (n % 2);
  const std::vector<float> a = randn(m * lda), w = randn(n * k, 1.0f / std::sqrt(static_cast<float>(k)));
  const std::vector<float> bias = randn(n, 0.5f), residual = randn(m * ldc);
  const PackedWeights packed = pack_weights(w.data(), format, n, k, k);
  std::vector<float> c(m * ldc, std::numeric_limits<float>::quiet_NaN());
  GemmEpilogue ep;
  ep.bias = with_bias ? bias.data() : nullptr;
  ep.activation = act;
  set_residual(residual_mode, residual, ldc, c, ep);
  gemm(a.data(), m, lda, packed, c.data(), ldc, ep);
  {
    // The same bytes as a view of memory owned elsewhere (a mapped packed-weights file): the same bits.
    auto owner = std::make_shared<AlignedBuffer<uint8_t>>(packed.byte_size());
    std::memcpy(owner->data(), packed.bytes(), packed.byte_size());
    PackedWeights view;
    view.n = packed.n;
    view.k = packed.k;
    view.type = packed.type;
    view.isa = packed.isa;
    view.group_size = packed.group_size;
    view.zero_point = packed.zero_point;
    view.set_view(owner->data(), packed.byte_size(), owner);
    expect(view.is_view() && view.bytes() == owner->data() && view.data.size() == 0, "PackedWeights view");
    std::vector<float> c2(m * ldc, std::numeric_limits<float>::quiet_NaN());
    GemmEpilogue ep2 = ep;
    set_residual(residual_mode, residual, ldc, c2, ep2);
    gemm(a.data(), m, lda, view, c2.data(), ldc, ep2);
    expect_same_bits(c, c2, m, n, ldc, "gemm " + format_name(format) + " " + dims({m, k, n}) + " from a view");
  }

  std::vector<double> z, magnitude;
  gemm_reference(a, m, lda, w, n, k, format, z, magnitude);
  double scale = 1e-30;
  for (long i = 0; i < m; ++i)
    for (long j = 0; j < n; ++j) {
      z[i * n + j] += with_bias ? bias[j] : 0.0;
      scale = std::max(scale, std::fabs(z[i * n + j]));
      if (residual_mode) scale = std::max(scale, static_cast<double>(std::fabs(residual[i * ldc + j])));
    }
  // vdpbf16ps and the AMX-BF16 tiles (which fall back to it below 4 rows) round A to bfloat16
  const MatmulInstruction bf16_instruction = matmul_instruction(WeightType::kBFloat16);
  const bool bf16_dot = format.type == WeightType::kBFloat16 && (bf16_instruction == MatmulInstruction::kDpbf16x512 ||
                                                                 bf16_instruction == MatmulInstruction::kAmxBf16);
  std::vector<float> got(m * n);
  std::vector<double> ref(m * n), tol(m * n);
  for (long i = 0; i < m; ++i)
    for (long j = 0; j < n; ++j) {
      const long e = i * n + j;
      got[e] = c[i * ldc + j];
      ref[e] = activate(act, z[e]) + (residual_mode ? residual[i * ldc + j] : 0.0);
      tol[e] = 1e-5 * std::sqrt(static_cast<double>(k)) * scale;
      if (bf16_dot) tol[e] += std::ldexp(magnitude[e], -8);  // a rounded to bfloat16 (docs/precision.md)
      if (act != Activation::kNone) tol[e] += 4e-6 + 3e-6 * std::fabs(ref[e]);
    }
  expect_close("gemm " + format_name(format) + " " + dims({m, k, n}) + " act=" + activation_name(act) +
                   (with_bias ? " bias" : "") +
                   (residual_mode == 1   ? " residual"
                    : residual_mode == 2 ? " in-place"
                                         : ""),
               got, ref, tol);
}

void test_gemm() {
  // (m, k, n): GEMV rows (m ≤ 8), tile tails, several K slices (K > 256), panels of N.
  const long shapes[][3] = {{1, 1, 1},     {1, 7, 3},     {2, 17, 33},    {3, 33, 17},   {4, 65, 7},    {5, 127, 65},
                            {6, 64, 16},   {7, 300, 130}, {8, 129, 1},    {9, 33, 127},  {13, 257, 31}, {17, 3, 65},
                            {33, 513, 33}, {65, 64, 100}, {100, 300, 70}, {1, 4097, 17}, {257, 40, 48}};
  const WeightFormat formats[] = {WeightFormat(WeightType::kFloat32),         WeightFormat(WeightType::kFloat16),
                                  WeightFormat(WeightType::kBFloat16),        WeightFormat(WeightType::kInt8),
                                  WeightFormat(WeightType::kInt4, 32, false), WeightFormat(WeightType::kInt4, 64, true),
                                  WeightFormat(WeightType::kInt4, 128, false)};
  int i = 0;
  for (const WeightFormat& f : formats)
    for (const auto& s : shapes) {
      // Every shape without an epilogue; an activation, bias and residual walk through the shapes.
      check_gemm(f, s[0], s[1], s[2], Activation::kNone, false, 0);
      const Activation act = kActivations[1 + i % 5];
      check_gemm(f, s[0], s[1], s[2], act, i % 2 == 0, i % 3);
      ++i;
    }
  // The blocked paths of the SIMD drivers: each thread its own rows (many rows, narrow N) and the
  // team on each row block (wide N, or few rows), over several K slices, with an activation after
  // a residual that aliases c (the driver copies it first).
  for (const WeightFormat& f : formats) {
    check_gemm(f, 257, 300, 48, Activation::kGeluErf, true, 2);
    check_gemm(f, 300, 70, 400, Activation::kNone, true, 1);
    check_gemm(f, 30, 300, 40, Activation::kSilu, false, 2);
  }
}

// int4 (gemm.h): every level computes the same operations in the same order, so the level's
// kernel gives the scalar reference's bits (no activation: that is the level's own function), each
// on weights packed by its own table. Shapes walk the tile edges of the SIMD kernels: m = 1..9
// rows (4- and 8-row tiles plus tails), odd n (8- and 16-feature panels plus a partial one), k not
// a multiple of the group (padding), with bias and a separate or in-place residual.
void check_int4_bit_exact(long group_size, bool zero_point, long m, long k, long n, int residual_mode) {
  const long groups = int4_groups(k, group_size), kp = groups * group_size;
  const long lda = k + (m % 3), ldc = n + (n % 2);
  const std::vector<float> a = randn(m * lda), w = randn(n * k, 1.0f / std::sqrt(static_cast<float>(k)), 0.1f);
  const std::vector<float> bias = randn(n, 0.5f), residual = randn(m * ldc);
  std::vector<uint8_t> u(static_cast<std::size_t>(n) * kp / 2);
  std::vector<uint16_t> scales(static_cast<std::size_t>(n) * groups);
  std::vector<uint8_t> zeros(zero_point ? static_cast<std::size_t>(n) * groups : 0);
  quantize_weights_s4(w.data(), n, k, k, group_size, zero_point, u.data(), scales.data(), zeros.data());
  auto run = [&](const Int4GemmKernels& kernels) {
    PackedWeights packed;
    packed.n = n;
    packed.k = k;
    packed.type = WeightType::kInt4;
    packed.group_size = group_size;
    packed.zero_point = zero_point;
    packed.data.resize(kernels.packed_bytes(n, k, group_size, zero_point));
    kernels.pack(u.data(), scales.data(), zero_point ? zeros.data() : nullptr, n, k, group_size, packed.data.data());
    std::vector<float> c(m * ldc, std::numeric_limits<float>::quiet_NaN());
    GemmEpilogue ep;
    ep.bias = residual_mode != 0 ? bias.data() : nullptr;
    set_residual(residual_mode, residual, ldc, c, ep);
    kernels.gemm(a.data(), m, lda, packed, c.data(), ldc, ep);
    return c;
  };
  const std::vector<float> want = run(scalar::kInt4GemmKernels), got = run(int4_gemm_kernels());
  long mismatches = 0, first = -1;
  for (long i = 0; i < m; ++i)
    for (long j = 0; j < n; ++j)
      if (std::memcmp(&want[i * ldc + j], &got[i * ldc + j], sizeof(float)) != 0) {
        if (first < 0) first = i * ldc + j;
        ++mismatches;
      }
  const std::string what = "int4 g" + std::to_string(group_size) + (zero_point ? " zero-point " : " symmetric ") +
                           dims({m, k, n}) + " residual mode " + std::to_string(residual_mode) +
                           " bit-identical to the scalar reference";
  expect(mismatches == 0, what);
  if (mismatches != 0)
    std::printf("  %ld mismatches; first at %ld: %.9g, reference %.9g\n", mismatches, first,
                static_cast<double>(got[first]), static_cast<double>(want[first]));
}

void test_int4_bit_exact() {
  const long ks[] = {1, 31, 33, 100, 200, 300};
  const long ns[] = {1, 7, 9, 15, 17, 31};
  int i = 0;
  for (long group_size : {32L, 64L, 128L})
    for (bool zero_point : {false, true})
      for (long m = 1; m <= 9; ++m) {
        check_int4_bit_exact(group_size, zero_point, m, ks[i % 6], ns[(i / 2) % 6], i % 3);
        ++i;
      }
  check_int4_bit_exact(32, true, 70, 513, 33, 2);  // several row blocks, many groups
  check_int4_bit_exact(128, false, 3, 4097, 40, 1);
}

// int8 (gemm.h): the integer sums are exact at every level and the float epilogue is the scalar
// reference's, so the level's kernel gives the scalar reference's bits (no activation: that is the
// level's own function), each on weights packed by its own table. On AArch64 the SMMLA kernel
// (i8mm) also gives the SDOT kernel's (dotprod) bits, with an activation too (both run the level's
// activation table), when the CPU has the dot product. Shapes walk the tile edges: m = 1..9 rows
// (row pairs of SMMLA, 4-row tiles plus tails, an odd last row), odd n (16-feature panels plus a
// partial one), k not a multiple of 4, 8 or 16 (padding of the 4- and 8-byte k groups), with bias
// and a separate or in-place residual.
PackedWeights pack_int8_with(const Int8GemmKernels& kernels, const std::vector<int8_t>& q,
                             const std::vector<float>& scales, long n, long k) {
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.type = WeightType::kInt8;
  packed.data.resize(kernels.packed_bytes(n, k));
  kernels.pack(q.data(), scales.data(), n, k, k, packed.data.data());
  return packed;
}

void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, long m, long n, long ldc,
                      const std::string& what) {
  long mismatches = 0, first = -1;
  for (long i = 0; i < m; ++i)
    for (long j = 0; j < n; ++j)
      if (std::memcmp(&want[i * ldc + j], &got[i * ldc + j], sizeof(float)) != 0) {
        if (first < 0) first = i * ldc + j;
        ++mismatches;
      }
  expect(mismatches == 0, what);
  if (mismatches != 0)
    std::printf("  %ld mismatches; first at %ld: %.9g, reference %.9g\n", mismatches, first,
                static_cast<double>(got[first]), static_cast<double>(want[first]));
}

void check_int8_bit_exact(long m, long k, long n, Activation act, int residual_mode) {
  const long lda = k + (m % 3), ldc = n + (n % 2);
  const std::vector<float> a = randn(m * lda), w = randn(n * k, 1.0f / std::sqrt(static_cast<float>(k)));
  const std::vector<float> bias = randn(n, 0.5f), residual = randn(m * ldc);
  std::vector<int8_t> q(static_cast<std::size_t>(n) * k);
  std::vector<float> scales(n);
  quantize_weights_s8(w.data(), n, k, k, q.data(), scales.data());
  auto run = [&](const Int8GemmKernels& kernels) {
    const PackedWeights packed = pack_int8_with(kernels, q, scales, n, k);
    std::vector<float> c(m * ldc, std::numeric_limits<float>::quiet_NaN());
    GemmEpilogue ep;
    ep.bias = residual_mode != 0 ? bias.data() : nullptr;
    ep.activation = act;
    set_residual(residual_mode, residual, ldc, c, ep);
    kernels.gemm(a.data(), m, lda, packed, c.data(), ldc, ep);
    return c;
  };
  const std::string what =
      "int8 " + dims({m, k, n}) + " act=" + activation_name(act) + " residual mode " + std::to_string(residual_mode);
  const std::vector<float> got = run(int8_gemm_kernels());
  if (act == Activation::kNone)
    expect_same_bits(run(scalar::kInt8GemmKernels), got, m, n, ldc, what + " bit-identical to the scalar reference");
#if defined(__aarch64__)
  if (active_isa() == Isa::kI8mm)
    expect_same_bits(run(dotprod::kInt8GemmKernels), got, m, n, ldc, what + " smmla bit-identical to sdot");
#endif
}

void test_int8_bit_exact() {
  const long ks[] = {1, 7, 8, 9, 15, 16, 17, 33, 100, 301};
  const long ns[] = {1, 2, 7, 15, 16, 17, 31, 33};
  int i = 0;
  for (long m = 1; m <= 9; ++m)
    for (int rep = 0; rep < 4; ++rep) {
      check_int8_bit_exact(m, ks[i % 10], ns[(i / 2) % 8], Activation::kNone, i % 3);
      ++i;
    }
  // Several row blocks (32 rows each) and panels; a long K; an activation (SMMLA against SDOT).
  check_int8_bit_exact(70, 513, 33, Activation::kNone, 2);
  check_int8_bit_exact(3, 4097, 40, Activation::kNone, 1);
  check_int8_bit_exact(37, 130, 50, Activation::kGeluErf, 1);
  check_int8_bit_exact(5, 70, 20, Activation::kSilu, 2);
}

// float16 / bfloat16 (gemm.h): the widening kernels multiply exactly the float32 values of the
// weights. At the SIMD levels they share the float32 GEMM's driver and register kernels (widening
// in the GEMV kernel, or one W slice at a time before the tile kernel), so on shapes that take the
// same path for both (m ≤ 6: GEMV; m ≤ 64 with 4 panels or more: GEMV in chunks; m > 256 or fewer panels: blocked) the
// 16-bit GEMM gives the float32 GEMM's bits on the widened weights. The scalar level computes the same sums in its own
// order (covered by test_gemm's bound).
void check_half_as_float32(WeightType type, long m, long k, long n, Activation act, int residual_mode) {
  const long lda = k + (m % 3), ldc = n + (n % 2);
  const std::vector<float> a = randn(m * lda), w = randn(n * k, 1.0f / std::sqrt(static_cast<float>(k)));
  const std::vector<float> bias = randn(n, 0.5f), residual = randn(m * ldc);
  const bool half = type == WeightType::kFloat16;
  std::vector<uint16_t> h(w.size());
  std::vector<float> widened(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    h[i] = half ? float_to_half(w[i]) : float_to_bfloat16(w[i]);
    widened[i] = half ? half_to_float(h[i]) : bfloat16_to_float(h[i]);
  }
  auto run = [&](const PackedWeights& packed) {
    std::vector<float> c(m * ldc, std::numeric_limits<float>::quiet_NaN());
    GemmEpilogue ep;
    ep.bias = residual_mode != 0 ? bias.data() : nullptr;
    ep.activation = act;
    set_residual(residual_mode, residual, ldc, c, ep);
    gemm(a.data(), m, lda, packed, c.data(), ldc, ep);
    return c;
  };
  const std::vector<float> want = run(pack_weights_f32(widened.data(), n, k, k));
  const std::vector<float> got = run(pack_weights_16(h.data(), type, n, k, k));
  expect_same_bits(want, got, m, n, ldc,
                   std::string(half ? "float16 " : "bfloat16 ") + dims({m, k, n}) + " act=" + activation_name(act) +
                       " residual mode " + std::to_string(residual_mode) +
                       " bit-identical to float32 on the widened weights");
}

void test_half_as_float32() {
  if (active_isa() == Isa::kScalar) return;
  // vdpbf16ps (AVX512-BF16) and the AMX-BF16 tiles round A to bfloat16 instead: test_gemm's bound
  // covers them.
  const MatmulInstruction bf16_instruction = matmul_instruction(WeightType::kBFloat16);
  const bool bf16_widens =
      bf16_instruction != MatmulInstruction::kDpbf16x512 && bf16_instruction != MatmulInstruction::kAmxBf16;
  // Subnormal, signed-zero and extreme weights widen exactly too: with one-hot rows of A,
  // c[i][j] = w[j][i] (8 rows: the blocked path; 1 row: the GEMV kernel).
  {
    const long n = 16, k = 8;
    const uint16_t specials[] = {0x0001, 0x83FF, 0x8000, 0x3C00, 0x0400, 0x7BFF, 0x3555, 0xC001};
    std::vector<uint16_t> h(n * k);
    for (long i = 0; i < n * k; ++i) h[i] = specials[(i + i / k) % 8];
    std::vector<float> a(k * k, 0.0f);
    for (long i = 0; i < k; ++i) a[i * k + i] = 1.0f;
    for (WeightType type : {WeightType::kFloat16, WeightType::kBFloat16}) {
      if (type == WeightType::kBFloat16 && !bf16_widens) continue;
      const bool half = type == WeightType::kFloat16;
      const PackedWeights packed = pack_weights_16(h.data(), type, n, k, k);
      for (long m : {k, 1L}) {
        std::vector<float> c(m * n);
        gemm(a.data(), m, k, packed, c.data(), n);
        bool same = true;
        for (long i = 0; i < m; ++i)
          for (long j = 0; j < n; ++j)
            same &= c[i * n + j] == (half ? half_to_float(h[j * k + i]) : bfloat16_to_float(h[j * k + i]));
        expect(same,
               std::string(half ? "float16" : "bfloat16") + " special weights widen exactly, m=" + std::to_string(m));
      }
    }
  }
  int i = 0;
  for (WeightType type : {WeightType::kFloat16, WeightType::kBFloat16}) {
    if (type == WeightType::kBFloat16 && !bf16_widens) continue;
    for (long m = 1; m <= 6; ++m) {
      check_half_as_float32(type, m, 1 + 37 * m, 2 * m + 13, kActivations[i % 6], i % 3);  // GEMV
      ++i;
    }
    check_half_as_float32(type, 300, 300, 48, Activation::kGeluTanh, 2);  // blocked, private rows
    check_half_as_float32(type, 270, 70, 400, Activation::kNone, 1);      // blocked, shared rows
    check_half_as_float32(type, 40, 257, 80, Activation::kRelu, 0);       // GEMV in chunks
    check_half_as_float32(type, 40, 257, 33, Activation::kNone, 2);       // blocked (3 panels)
  }
}

// ---------------------------------------------------------------------------------------------
// Attention (attention.h): softmax(scale·q·kᵀ + mask)·v in float64. Tolerance as
// tests/kernels/test_attention.py: 1e-5·max|ref| + 1e-6.

struct AttentionCase {
  long batch, heads, kv_heads, q_len, kv_len, dim;
  bool causal;
  long window;
  bool padding_mask;  // [B, 1, 1, Tk] additive mask with some -inf keys
  KvType kv_type;
  // [B, H, Tq, Tk] additive mask instead: finite values and -inf that differ between the rows of
  // a tile (the per-row mask paths of the SIMD kernels)
  bool full_mask = false;
  // NaN in the float32 keys and values of the keys the padding mask removes: they must not reach
  // any row
  bool poison_removed = false;
  // AttentionArgs::bf16_products. Where the vdpbf16ps engine takes the call (avx512 level with
  // AVX512-BF16, float32 k/v, D a multiple of 16, ≥ 16 query rows per (batch, kv head)) the
  // reference multiplies bfloat16-rounded q·scale·log2(e), k and v, and the tolerance adds the
  // probabilities' rounding, 2^-9·max|v|; elsewhere the flag changes nothing.
  bool bf16_products = false;
};

bool bf16_engine_takes(const AttentionCase& t) {
#if defined(__aarch64__)
  return false;
#else
  return t.bf16_products && t.kv_type == KvType::kFloat32 && t.dim % 16 == 0 &&
         t.q_len * (t.heads / t.kv_heads) >= 16 && &attention_kernels() == &avx512::kAttentionKernels &&
         cpu_features().avx512bf16;
#endif
}

void check_attention(const AttentionCase& t) {
  const long B = t.batch, H = t.heads, Hkv = t.kv_heads, Tq = t.q_len, Tk = t.kv_len, D = t.dim;
  const std::vector<float> q = randn(B * H * Tq * D);
  std::vector<float> k = randn(B * Hkv * Tk * D), v = randn(B * Hkv * Tk * D);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> mask(t.full_mask ? B * H * Tq * Tk : B * Tk, 0.0f);
  if (t.padding_mask)
    for (long b = 0; b < B; ++b)
      for (long j = 0; j < Tk; ++j)
        if ((j + b) % 3 == 1) mask[b * Tk + j] = neg_inf;
  if (t.full_mask) {
    std::uniform_real_distribution<float> finite(-4.0f, 0.0f);
    for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 7 + i / Tk) % 5 == 2 ? neg_inf : finite(g_rng);
  }
  if (t.poison_removed)
    for (long b = 0; b < B; ++b)
      for (long h = 0; h < Hkv; ++h)
        for (long j = 0; j < Tk; ++j)
          if ((j + b) % 3 == 1)
            for (long d = 0; d < D; ++d)
              k[((b * Hkv + h) * Tk + j) * D + d] = v[((b * Hkv + h) * Tk + j) * D + d] =
                  std::numeric_limits<float>::quiet_NaN();
  const auto masked = [&](long b, long h, long i, long j) {
    return t.full_mask ? std::isinf(mask[((b * H + h) * Tq + i) * Tk + j])
                       : t.padding_mask && std::isinf(mask[b * Tk + j]);
  };
  // Keys and values as the kernel reads them (16-bit caches hold rounded values, int8 caches
  // scale · q rounded to float with one scale per key row).
  std::vector<uint16_t> k16(k.size()), v16(v.size());
  std::vector<int8_t> k8(k.size()), v8(v.size());
  std::vector<float> k_scale(B * Hkv * Tk), v_scale(B * Hkv * Tk);
  std::vector<double> kd(k.size()), vd(v.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    switch (t.kv_type) {
      case KvType::kFloat32: kd[i] = k[i], vd[i] = v[i]; break;
      case KvType::kFloat16:
        k16[i] = float_to_half(k[i]), v16[i] = float_to_half(v[i]);
        kd[i] = half_to_float(k16[i]), vd[i] = half_to_float(v16[i]);
        break;
      case KvType::kBFloat16:
        k16[i] = float_to_bfloat16(k[i]), v16[i] = float_to_bfloat16(v[i]);
        kd[i] = bfloat16_to_float(k16[i]), vd[i] = bfloat16_to_float(v16[i]);
        break;
      case KvType::kInt8: break;  // per row, below
    }
  }
  if (t.kv_type == KvType::kInt8)
    for (long row = 0; row < B * Hkv * Tk; ++row)
      for (int which = 0; which < 2; ++which) {
        const std::vector<float>& src = which ? v : k;
        std::vector<int8_t>& dst = which ? v8 : k8;
        std::vector<double>& wide = which ? vd : kd;
        float amax = 0.0f;
        for (long d = 0; d < D; ++d) amax = std::max(amax, std::fabs(src[row * D + d]));
        const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
        (which ? v_scale : k_scale)[row] = scale;
        for (long d = 0; d < D; ++d) {
          dst[row * D + d] = static_cast<int8_t>(std::lround(src[row * D + d] / scale));
          wide[row * D + d] = scale * static_cast<float>(dst[row * D + d]);
        }
      }
  AttentionArgs args;
  args.batch = B;
  args.heads = H;
  args.kv_heads = Hkv;
  args.q_len = Tq;
  args.kv_len = Tk;
  args.head_dim = D;
  args.q = q.data();
  args.q_stride_b = H * Tq * D, args.q_stride_h = Tq * D, args.q_stride_t = D;
  args.kv_type = t.kv_type;
  if (t.kv_type == KvType::kFloat32) {
    args.k = k.data();
    args.v = v.data();
  } else if (t.kv_type == KvType::kInt8) {
    args.k_data = k8.data();
    args.v_data = v8.data();
    args.k_scale = k_scale.data();
    args.v_scale = v_scale.data();
    args.scale_stride_b = Hkv * Tk;
    args.scale_stride_h = Tk;
  } else {
    args.k_data = k16.data();
    args.v_data = v16.data();
  }
  args.k_stride_b = args.v_stride_b = Hkv * Tk * D;
  args.k_stride_h = args.v_stride_h = Tk * D;
  args.k_stride_t = args.v_stride_t = D;
  std::vector<float> out(B * H * Tq * D, std::numeric_limits<float>::quiet_NaN());
  args.out = out.data();
  args.out_stride_b = H * Tq * D, args.out_stride_h = Tq * D, args.out_stride_t = D;
  args.scale = 1.0f / std::sqrt(static_cast<float>(D));
  args.causal = t.causal;
  args.causal_offset = t.causal ? Tk - Tq : 0;
  args.window = t.window;
  args.bf16_products = t.bf16_products;
  if (t.padding_mask) {
    args.mask = mask.data();
    args.mask_stride_b = Tk;
    args.mask_stride_k = 1;
  }
  if (t.full_mask) {
    args.mask = mask.data();
    args.mask_stride_b = H * Tq * Tk;
    args.mask_stride_h = Tq * Tk;
    args.mask_stride_q = Tk;
    args.mask_stride_k = 1;
  }
  attention(args);

  // The operands the kernel multiplies (bf16 engine: rounded; q times scale · log2 e before it).
  const bool rounded = bf16_engine_takes(t);
  const float q_factor = args.scale * 1.44269504088896341f;
  std::vector<double> qd(q.begin(), q.end());
  double max_v = 0.0;
  if (rounded) {
    for (std::size_t i = 0; i < q.size(); ++i)
      qd[i] = bfloat16_to_float(float_to_bfloat16(q[i] * q_factor)) / static_cast<double>(q_factor);
    for (std::size_t i = 0; i < kd.size(); ++i) {
      kd[i] = bfloat16_to_float(float_to_bfloat16(k[i]));
      vd[i] = bfloat16_to_float(float_to_bfloat16(v[i]));
      if (std::isfinite(v[i])) max_v = std::max(max_v, std::fabs(vd[i]));
    }
  }
  std::vector<double> ref(out.size(), 0.0);
  double max_ref = 0.0;
  for (long b = 0; b < B; ++b)
    for (long h = 0; h < H; ++h) {
      const long hk = h / (H / Hkv);
      for (long i = 0; i < Tq; ++i) {
        std::vector<double> s(Tk, -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        for (long j = 0; j < Tk; ++j) {
          const long pos = i + args.causal_offset;
          bool visible = t.causal ? j <= pos && (t.window <= 0 || j > pos - t.window)
                                  : t.window <= 0 || std::labs(j - pos) < t.window;
          if (masked(b, h, i, j)) visible = false;
          if (!visible) continue;
          const double added = t.full_mask ? mask[((b * H + h) * Tq + i) * Tk + j] : 0.0;
          double dot = 0.0;
          for (long d = 0; d < D; ++d)
            dot += qd[((b * H + h) * Tq + i) * D + d] * kd[((b * Hkv + hk) * Tk + j) * D + d];
          s[j] = dot * args.scale + added;
          mx = std::max(mx, s[j]);
        }
        if (std::isinf(mx)) continue;  // sees no key: zeros
        double total = 0.0;
        for (long j = 0; j < Tk; ++j) total += std::isinf(s[j]) ? 0.0 : std::exp(s[j] - mx);
        for (long d = 0; d < D; ++d) {
          double acc = 0.0;
          for (long j = 0; j < Tk; ++j)
            if (!std::isinf(s[j])) acc += std::exp(s[j] - mx) / total * vd[((b * Hkv + hk) * Tk + j) * D + d];
          ref[((b * H + h) * Tq + i) * D + d] = acc;
          max_ref = std::max(max_ref, std::fabs(acc));
        }
      }
    }
  std::vector<double> tol(out.size(), 1e-5 * max_ref + 1e-6 + (rounded ? std::ldexp(max_v, -9) : 0.0));
  expect_close(std::string("attention ") + dims({B, H, Hkv, Tq, Tk, D}) + (t.causal ? " causal" : "") +
                   (t.bf16_products ? (rounded ? " bf16 products" : " bf16 products (not taken)") : "") +
                   (t.window ? " window=" + std::to_string(t.window) : "") + (t.padding_mask ? " mask" : "") +
                   (t.full_mask ? " full mask" : "") + (t.poison_removed ? " NaN in removed keys" : "") +
                   (t.kv_type == KvType::kFloat16    ? " kv=float16"
                    : t.kv_type == KvType::kBFloat16 ? " kv=bfloat16"
                    : t.kv_type == KvType::kInt8     ? " kv=int8"
                                                     : ""),
               out, ref, tol);
}

void test_attention() {
  const AttentionCase cases[] = {
      {1, 1, 1, 1, 1, 1, false, 0, false, KvType::kFloat32},
      {2, 4, 4, 17, 33, 64, false, 0, false, KvType::kFloat32},
      {2, 4, 4, 17, 33, 64, true, 0, false, KvType::kFloat32},
      {1, 8, 2, 1, 65, 17, true, 0, false, KvType::kFloat32},
      {1, 4, 1, 7, 127, 128, false, 0, true, KvType::kFloat32},
      {2, 2, 2, 33, 7, 3, false, 0, true, KvType::kFloat32},
      {1, 3, 3, 65, 65, 65, true, 0, false, KvType::kFloat32},
      {1, 4, 2, 20, 40, 24, true, 7, false, KvType::kFloat32},
      {1, 2, 2, 30, 30, 16, false, 5, false, KvType::kFloat32},
      {1, 8, 2, 1, 300, 32, true, 0, false, KvType::kFloat32},
      {1, 2, 1, 2, 1000, 16, false, 0, true, KvType::kFloat32},
      {2, 4, 2, 5, 70, 64, true, 0, false, KvType::kFloat16},
      {1, 4, 4, 1, 129, 33, false, 0, true, KvType::kFloat16},
      // D whose last partial chunk of the P·V tile is 4 vectors: 13 and 30 at NEON, 50, 60 and 120 at AVX-512
      {1, 2, 2, 1, 33, 13, false, 0, false, KvType::kFloat32},
      {1, 4, 2, 6, 40, 30, true, 0, false, KvType::kFloat32},
      {2, 2, 2, 1, 70, 50, false, 0, false, KvType::kFloat32},
      {1, 4, 2, 5, 33, 60, true, 0, false, KvType::kFloat32},
      {1, 8, 2, 3, 40, 120, false, 0, true, KvType::kFloat32},
      {2, 4, 2, 6, 75, 40, true, 0, false, KvType::kBFloat16},
      {1, 2, 2, 1, 97, 21, false, 0, true, KvType::kBFloat16},
      {2, 4, 2, 6, 75, 40, true, 0, true, KvType::kInt8},
      {1, 2, 1, 3, 61, 19, false, 0, false, KvType::kInt8},
      {2, 4, 2, 9, 50, 24, false, 0, false, KvType::kFloat32, true},
      {1, 2, 2, 1, 70, 13, true, 0, false, KvType::kFloat32, true},
      {2, 8, 2, 3, 90, 32, false, 0, true, KvType::kFloat32, false, true},
      {1, 2, 2, 1, 600, 16, false, 0, true, KvType::kFloat32, false, true},
      // bf16_products: BERT's head, odd key counts, windows and masks that start rows at odd keys,
      // NaN in removed keys sharing a key pair with visible ones; D 24 and 4 rows stay float32
      {2, 4, 4, 40, 37, 64, false, 0, true, KvType::kFloat32, false, false, true},
      {1, 4, 2, 20, 40, 32, true, 7, false, KvType::kFloat32, false, false, true},
      {1, 2, 2, 48, 48, 64, false, 5, false, KvType::kFloat32, false, false, true},
      {2, 4, 2, 9, 50, 16, false, 0, false, KvType::kFloat32, true, false, true},
      {2, 8, 2, 8, 90, 32, false, 0, true, KvType::kFloat32, false, true, true},
      {1, 2, 2, 33, 33, 24, false, 0, false, KvType::kFloat32, false, false, true},
      {1, 2, 2, 4, 33, 64, true, 0, false, KvType::kFloat32, false, false, true},
  };
  for (const AttentionCase& c : cases) check_attention(c);
}

// ---------------------------------------------------------------------------------------------
// The level and its tables.

void print_level() {
  const CpuFeatures& f = cpu_features();
  std::string features;
  for (const std::string& name : f.names()) features += (features.empty() ? "" : " ") + name;
  std::printf("isa %s (best %s)\nfeatures: %s\n", isa_name(active_isa()), isa_name(best_isa()), features.c_str());
  std::printf("matmul: float32 %s, float16 %s, bfloat16 %s, int8 %s, int4 %s\n", gemm_kernel_name(WeightType::kFloat32),
              gemm_kernel_name(WeightType::kFloat16), gemm_kernel_name(WeightType::kBFloat16),
              gemm_kernel_name(WeightType::kInt8), gemm_kernel_name(WeightType::kInt4));
  std::printf("threads: %d\n", current_num_threads());
}

void test_level() {
  // CPUFORMER_ISA is obeyed, and the levels are ordered: the CPU supports every level up to its best.
  if (const char* want = std::getenv("CPUFORMER_ISA"); want != nullptr && *want != '\0')
    expect(std::string(isa_name(active_isa())) == want, std::string("CPUFORMER_ISA=") + want + " is the level in use");
  bool below_best = true;
  for (Isa level : architecture_levels()) {
    expect(cpu_features().supports(level) == below_best, std::string("supports(") + isa_name(level) + ")");
    if (level == best_isa()) below_best = false;
  }
  // The scalar level multiplies float32 weights with plain C++, every other level with its own kernels.
  const bool scalar = active_isa() == Isa::kScalar;
  expect((std::string(gemm_kernel_name(WeightType::kFloat32)) == "scalar") == scalar,
         "float32 matmul kernel of the level");
#if defined(__aarch64__)
  expect(scalar || std::string(gemm_kernel_name(WeightType::kFloat32)) == "neon fmla", "float32 matmul kernel: neon");
  expect(scalar || std::string(gemm_kernel_name(WeightType::kFloat16)) == "neon fcvtl widen + fmla",
         "float16 matmul kernel: neon");
  expect(scalar || std::string(gemm_kernel_name(WeightType::kBFloat16)) == "neon widen + fmla",
         "bfloat16 matmul kernel: neon");
  const bool dot = active_isa() == Isa::kDotprod || active_isa() == Isa::kI8mm;
  const bool mmla = active_isa() == Isa::kI8mm;
  expect((std::string(gemm_kernel_name(WeightType::kInt8)) == "dotprod sdot") == (dot && !mmla),
         "int8 matmul kernel: sdot");
  expect((std::string(gemm_kernel_name(WeightType::kInt8)) == "i8mm smmla") == mmla, "int8 matmul kernel: smmla");
  expect((std::string(gemm_kernel_name(WeightType::kInt4)) == "dotprod sdot") == dot, "int4 matmul kernel: sdot");
#endif
  // The vector math, activation, attention and norm tables of the level: the scalar reference at
  // scalar, the level's own SIMD tables otherwise (NEON at neon, dotprod and i8mm).
#if defined(__aarch64__)
  const bool neon_tables = &vector_math_kernels() == &neon::kVectorMathKernels &&
                           &activation_kernels() == &neon::kActivationKernels &&
                           &attention_kernels() == &neon::kAttentionKernels && &norm_kernels() == &neon::kNormKernels;
  expect(scalar != neon_tables, "vector math, activation, attention and norm tables: neon");
#else
  const Isa isa = active_isa();
  expect(&vector_math_kernels() == (isa == Isa::kAvx512 ? &avx512::kVectorMathKernels
                                    : isa == Isa::kAvx2 ? &avx2::kVectorMathKernels
                                                        : &scalar::kVectorMathKernels) &&
             &activation_kernels() == (isa == Isa::kAvx512 ? &avx512::kActivationKernels
                                       : isa == Isa::kAvx2 ? &avx2::kActivationKernels
                                                           : &scalar::kActivationKernels) &&
             &attention_kernels() == (isa == Isa::kAvx512 ? &avx512::kAttentionKernels
                                      : isa == Isa::kAvx2 ? &avx2::kAttentionKernels
                                                          : &scalar::kAttentionKernels),
         "vector math, activation and attention tables of the level");
#endif
  expect(!scalar || (&vector_math_kernels() == &scalar::kVectorMathKernels &&
                     &activation_kernels() == &scalar::kActivationKernels &&
                     &attention_kernels() == &scalar::kAttentionKernels && &norm_kernels() == &scalar::kNormKernels),
         "scalar level: the scalar reference tables");
}

// The compute-peak probe of each weight type's matmul instruction (gemm_peak.h) runs at this level
// (an instruction the CPU lacks would stop the process with SIGILL) and measures a positive rate.
void test_peak_probes() {
  for (WeightType type :
       {WeightType::kFloat32, WeightType::kFloat16, WeightType::kBFloat16, WeightType::kInt8, WeightType::kInt4}) {
    const double macs = gemm_peak_macs(type, 0.003);
    expect(macs > 0.0 && std::isfinite(macs), std::string("gemm_peak_macs for ") + gemm_kernel_name(type));
  }
}

}  // namespace

bool load_scratch_refused() {
  try {
    load_scratch(LoadSlot::kJoined, 16);
  } catch (const std::logic_error&) {
    return true;
  }
  return false;
}

// The outputs of `linear` on x [3, k], as bytes compare.
std::vector<float> outputs(const Linear& linear, const std::vector<float>& x, long k, long n) {
  std::vector<float> y(static_cast<std::size_t>(3 * n));
  linear.apply(x.data(), 3, k, y.data(), n);
  return y;
}

// The load scratch (runtime/load_scratch.h): refused without a scope, one buffer per slot reused
// within a scope, kept by nested scopes; and a Linear of row parts (a model's fused q/k/v: joined in
// the scratch) equal bit for bit to the Linear of the joined matrix, built inside a model-level
// scope (twice: the second reuses the first's buffers) and outside any, for every stored type.
// greedy_argmax (models/generation.h) equals the scalar loop it replaces, with the level's vector
// reductions: ties (the first wins), NaN anywhere (never chosen; 0 when first), ±inf, signed zeros,
// subnormal maxima and every length through the vector tails.
void test_greedy_argmax() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min();
  auto loop = [](const std::vector<float>& x) {
    long best = 0;
    for (long i = 1; i < static_cast<long>(x.size()); ++i)
      if (x[i] > x[best]) best = i;
    return best;
  };
  std::mt19937 rng(7);
  const float specials[] = {nan, inf, -inf, 0.0f, -0.0f, tiny, -tiny, 1.0f, 3.0f, -2.0f};
  int failures = 0, cases = 0;
  for (long n = 1; n <= 70; ++n) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(n);
      std::uniform_int_distribution<int> pick(0, 9), small(-3, 3);
      for (float& v : x) v = trial % 4 == 0 ? specials[pick(rng)] : static_cast<float>(small(rng));
      if (trial % 5 == 1) x[n - 1] = 100.0f;  // the maximum at the end, after the vector part
      if (trial % 7 == 2) std::fill(x.begin(), x.end(), -inf);
      if (trial % 9 == 3) std::fill(x.begin(), x.end(), nan);
      if (trial % 11 == 4) std::fill(x.begin(), x.end(), trial % 2 ? -0.0f : 0.0f);
      if (trial % 13 == 5 && n > 2) {
        std::fill(x.begin(), x.end(), -1.0f);
        x[n / 2] = tiny;  // a subnormal maximum
      }
      ++cases;
      const long got = greedy_argmax(x.data(), n), want = loop(x);
      if (got != want && failures++ < 5)
        std::printf("  greedy_argmax n=%ld trial %d: %ld, the loop %ld\n", n, trial, got, want);
    }
  }
  std::vector<float> vocab(50257);
  for (float& v : vocab) v = std::normal_distribution<float>(0.0f, 3.0f)(rng);
  vocab[31337] = 40.0f;
  vocab[40000] = 40.0f;
  ++cases;
  if (greedy_argmax(vocab.data(), 50257) != 31337) ++failures;
  expect(failures == 0, "greedy_argmax equals the scalar loop (" + std::to_string(cases) + " rows)");
}

// runtime/thread_pool.h: every thread of a team runs once with its own index, barriers order the
// phases, the dynamic schedule hands out every item once, nested teams run inline, teams larger
// than the CPUs and pools of other threads work, and a pool shut down is rebuilt on next use.
void test_thread_pool() {
  for (int nt : {1, 2, 3, 8}) {
    std::vector<int> ran(static_cast<std::size_t>(nt), 0);
    std::atomic<int> wrong_size{0};
    run_team(nt, [&](const Team& team) {
      if (team.size() != nt) wrong_size.fetch_add(1);
      ran[static_cast<std::size_t>(team.index())] += 1;
    });
    expect(wrong_size.load() == 0 && std::all_of(ran.begin(), ran.end(), [](int r) { return r == 1; }),
           "thread pool: each of " + std::to_string(nt) + " threads runs once with its own index");

    // 200 phases: in each, every thread writes its slot, then (after a barrier) checks all slots.
    const int phases = 200;
    std::vector<long> slots(static_cast<std::size_t>(nt), -1);
    std::atomic<int> bad{0};
    run_team(nt, [&](const Team& team) {
      for (int ph = 0; ph < phases; ++ph) {
        __atomic_store_n(&slots[static_cast<std::size_t>(team.index())], ph, __ATOMIC_RELAXED);
        team.barrier();
        for (int t = 0; t < team.size(); ++t)
          if (__atomic_load_n(&slots[static_cast<std::size_t>(t)], __ATOMIC_RELAXED) != ph) bad.fetch_add(1);
        team.barrier();
      }
    });
    expect(bad.load() == 0, "thread pool: barriers order " + std::to_string(nt) + " threads' phases");

    const long items = 1001;
    std::vector<int> claimed(static_cast<std::size_t>(items), 0);
    run_team(nt, [&](const Team& team) {
      long b, e;
      while (team.next_chunk(items, 7, &b, &e))
        for (long i = b; i < e; ++i) __atomic_fetch_add(&claimed[static_cast<std::size_t>(i)], 1, __ATOMIC_RELAXED);
    });
    expect(std::all_of(claimed.begin(), claimed.end(), [](int c) { return c == 1; }),
           "thread pool: the dynamic schedule hands out every item once (" + std::to_string(nt) + " threads)");
  }
  std::atomic<int> inner_sizes{0}, calls{0};
  run_team(2, [&](const Team&) {
    run_team(4, [&](const Team& inner) {
      inner_sizes.fetch_add(inner.size());
      calls.fetch_add(1);
    });
  });
  expect(calls.load() == 2 && inner_sizes.load() == 2, "thread pool: a team inside a team runs on its thread alone");

  std::atomic<long> total{0};
  std::thread other([&] {
    for (int i = 0; i < 50; ++i) run_team(2, [&](const Team& team) { total.fetch_add(team.index() + 1); });
  });
  for (int i = 0; i < 50; ++i) run_team(2, [&](const Team& team) { total.fetch_add(team.index() + 1); });
  other.join();
  expect(total.load() == 300, "thread pool: two threads' pools run side by side");

  shut_down_thread_pool();
  std::atomic<int> after{0};
  run_team(3, [&](const Team&) { after.fetch_add(1); });
  expect(after.load() == 3, "thread pool: rebuilt after a shutdown");
}

void test_load_scratch() {
  expect(load_scratch_refused(), "load_scratch without a scope throws");
  {
    LoadScratchScope outer;
    void* a = load_scratch(LoadSlot::kJoined, 1000);
    expect(load_scratch(LoadSlot::kJoined, 500) == a, "load scratch: a smaller request reuses the slot's buffer");
    expect(load_scratch(LoadSlot::kConverted, 500) != a, "load scratch: slots are separate buffers");
    {
      LoadScratchScope inner;
      expect(load_scratch(LoadSlot::kJoined, 1000) == a, "load scratch: a nested scope shares the buffers");
    }
    expect(load_scratch(LoadSlot::kJoined, 1000) == a, "load scratch: the end of a nested scope keeps them");
    expect(reinterpret_cast<std::uintptr_t>(load_scratch(LoadSlot::kJoined, 1 << 20)) % 64 == 0,
           "load scratch: a grown buffer is 64-byte aligned");
  }
  expect(load_scratch_refused(), "load scratch: the outermost scope's end closes it");

  const long k = 64, n = 56, rows[3] = {40, 8, 8};
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(n * k)), x(static_cast<std::size_t>(3 * k));
  for (float& v : w) v = dist(gen);
  for (float& v : x) v = dist(gen);
  std::vector<int8_t> q(w.size());
  std::vector<float> q_scales(n);
  quantize_weights_s8(w.data(), n, k, k, q.data(), q_scales.data());
  const long groups = int4_groups(k, 32);
  std::vector<uint8_t> u(static_cast<std::size_t>(n * groups * 16)), zeros(static_cast<std::size_t>(n * groups));
  std::vector<uint16_t> g_scales(static_cast<std::size_t>(n * groups));
  quantize_weights_s4(w.data(), n, k, k, 32, true, u.data(), g_scales.data(), zeros.data());

  auto part = [&](long r0, long count, const WeightFormat& format, bool stored) -> LinearPart {
    if (!stored) return {WeightRef(w.data() + r0 * k), nullptr, count};
    if (format.type == WeightType::kInt8)
      return {WeightRef(q.data() + r0 * k, WeightType::kInt8, q_scales.data() + r0), nullptr, count};
    return {WeightRef(u.data() + r0 * groups * 16, g_scales.data() + r0 * groups, zeros.data() + r0 * groups), nullptr,
            count};
  };
  const struct {
    const char* name;
    WeightFormat format;
    bool stored;  // parts already in the format (a converted directory) rather than float32
  } cases[] = {{"float32", WeightFormat(WeightType::kFloat32), false},
               {"int8 from float32", WeightFormat(WeightType::kInt8), false},
               {"int8 stored", WeightFormat(WeightType::kInt8), true},
               {"int4 from float32", WeightFormat(WeightType::kInt4, 32, true), false},
               {"int4 stored", WeightFormat(WeightType::kInt4, 32, true), true},
               {"float16 from float32", WeightFormat(WeightType::kFloat16), false}};
  for (const auto& c : cases) {
    const Linear whole({part(0, n, c.format, c.stored)}, k, c.format);
    std::vector<LinearPart> parts;
    for (long i = 0, r0 = 0; i < 3; r0 += rows[i], ++i) parts.push_back(part(r0, rows[i], c.format, c.stored));
    const std::vector<float> want = outputs(whole, x, k, n);
    const Linear alone(parts, k, c.format);
    expect(outputs(alone, x, k, n) == want, std::string("load scratch: ") + c.name + " parts outside a scope");
    LoadScratchScope model;
    const Linear first(parts, k, c.format), second(parts, k, c.format);
    expect(outputs(first, x, k, n) == want && outputs(second, x, k, n) == want,
           std::string("load scratch: ") + c.name + " parts inside a model-level scope");
  }
}

int main() {
  const char* want = std::getenv("CPUFORMER_ISA");
  try {
    active_isa();
  } catch (const std::invalid_argument& e) {
    for (Isa level : architecture_levels())
      if (want != nullptr && want == std::string(isa_name(level)) && !cpu_features().supports(level)) {
        std::printf("skipped: %s\n", e.what());
        return 77;
      }
    std::printf("error: %s\n", e.what());
    return 1;
  }
  print_level();
  test_level();
  test_vector_math();
  test_special_values();
  test_activations();
  test_norms();
  test_gemm();
  test_int4_bit_exact();
  test_int8_bit_exact();
  test_half_as_float32();
  test_attention();
  test_peak_probes();
  test_load_scratch();
  test_greedy_argmax();
  test_thread_pool();
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
