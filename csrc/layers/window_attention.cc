#include "layers/window_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "kernels/attention/attention.h"
#include "kernels/norm/norm.h"
#include "runtime/threading.h"

namespace cpuformer {

namespace {

// Rows per thread below which a row loop stays on one thread (as the norms': ~16k elements).
long min_rows(long width) {
  constexpr long kMinElementsPerThread = 16384;
  return width >= kMinElementsPerThread ? 1 : kMinElementsPerThread / width;
}

std::vector<float> copy_of(const float* p, long n) { return p ? std::vector<float>(p, p + n) : std::vector<float>(); }

}  // namespace

SwinScratchPool::Lease SwinScratchPool::take() {
  std::unique_ptr<SwinScratch> scratch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      scratch = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!scratch) scratch = std::make_unique<SwinScratch>();
  return Lease(this, std::move(scratch));
}

void SwinScratchPool::give_back(std::unique_ptr<SwinScratch> scratch) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(scratch));
}

std::size_t SwinScratchPool::idle_floats() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t floats = 0;
  for (const auto& s : free_) floats += s->windows.capacity() + s->wide.capacity() + s->projected.capacity();
  return floats;
}

SwinBlock::SwinBlock(const SwinBlockWeights& w, long dim, long heads, long mlp, float eps, Activation activation,
                     const WeightFormat& format)
    : dim_(dim),
      heads_(heads),
      mlp_(mlp),
      eps_(eps),
      activation_(activation),
      norm1_(copy_of(w.norm1, dim)),
      norm1_bias_(copy_of(w.norm1_bias, dim)),
      norm2_(copy_of(w.norm2, dim)),
      norm2_bias_(copy_of(w.norm2_bias, dim)),
      qkv_({LinearPart{w.q, w.q_bias, dim}, LinearPart{w.k, w.k_bias, dim}, LinearPart{w.v, w.v_bias, dim}}, dim,
           format),
      o_({LinearPart{w.o, w.o_bias, dim}}, dim, format),
      up_({LinearPart{w.up, w.up_bias, mlp}}, dim, format),
      down_({LinearPart{w.down, w.down_bias, dim}}, mlp, format) {
  if (dim <= 0 || heads <= 0 || dim % heads != 0 || mlp <= 0) {
    throw std::invalid_argument("SwinBlock: dim must be a positive multiple of heads and mlp positive");
  }
  if (norm1_.empty() || norm2_.empty()) throw std::invalid_argument("SwinBlock: the norms' weights are missing");
}

void SwinBlock::forward(float* x, long batch, const SwinWindowLayout& layout, SwinScratch& scratch) const {
  const long C = dim_, tokens = layout.tokens, area = layout.area, windows = layout.windows;
  const long per_image = windows * area;  // windowed rows of one image (padding included)
  const long rows = batch * per_image, m = batch * tokens;
  const long hd = C / heads_;
  float* win = scratch.windows.reserve({rows, C});
  float* qkv = scratch.wide.reserve({std::max(rows * 3 * C, m * mlp_)});
  float* proj = scratch.projected.reserve({std::max(rows, m), C});
  const NormKernels& norm = norm_kernels();
  const float* b1 = norm1_bias_.empty() ? nullptr : norm1_bias_.data();
  const float* b2 = norm2_bias_.empty() ? nullptr : norm2_bias_.data();

  // 1. norm + gather (shift, padding, partition).
  parallel_ranges(rows, min_rows(C), [&](long begin, long end) {
    for (long r = begin; r < end; ++r) {
      const long b = r / per_image, s = layout.source[r - b * per_image];
      float* dst = win + r * C;
      if (s < 0) {
        std::memset(dst, 0, sizeof(float) * C);
      } else {
        norm.layer_norm_row(x + (b * tokens + s) * C, nullptr, nullptr, norm1_.data(), b1, eps_, dst, C);
      }
    }
  });
  // 2. q, k, v.
  qkv_.apply(win, rows, C, qkv, 3 * C);
  // 3. attention per window and head, in place in the q/k/v rows; the output, heads merged, into win.
  AttentionArgs a;
  a.heads = a.kv_heads = heads_;
  a.q_len = a.kv_len = area;
  a.head_dim = hd;
  a.q_stride_b = a.k_stride_b = a.v_stride_b = area * 3 * C;
  a.q_stride_h = a.k_stride_h = a.v_stride_h = hd;
  a.q_stride_t = a.k_stride_t = a.v_stride_t = 3 * C;
  a.out_stride_b = area * C;
  a.out_stride_h = hd;
  a.out_stride_t = C;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.mask = layout.mask;
  a.mask_stride_h = area * area;
  a.mask_stride_q = area;
  a.mask_stride_k = 1;
  if (layout.mask_windows == 1) {  // one mask for every window: all the batch's windows in one call
    a.batch = batch * windows;
    a.mask_stride_b = 0;
    a.q = qkv;
    a.k = qkv + C;
    a.v = qkv + 2 * C;
    a.out = win;
    attention(a);
  } else {  // a mask per window: one call per image
    a.batch = windows;
    a.mask_stride_b = heads_ * area * area;
    for (long b = 0; b < batch; ++b) {
      const float* base = qkv + b * per_image * 3 * C;
      a.q = base;
      a.k = base + C;
      a.v = base + 2 * C;
      a.out = win + b * per_image * C;
      attention(a);
    }
  }
  // 4. output projection (windowed rows).
  o_.apply(win, rows, C, proj, C);
  // 5. scatter back to token order with the residual.
  parallel_ranges(m, min_rows(C), [&](long begin, long end) {
    for (long t = begin; t < end; ++t) {
      const long b = t / tokens;
      const float* src = proj + (b * per_image + layout.inverse[t - b * tokens]) * C;
      float* dst = x + t * C;
      for (long c = 0; c < C; ++c) dst[c] += src[c];
    }
  });
  // 6. MLP with the residual.
  layer_norm(x, nullptr, nullptr, norm2_.data(), b2, eps_, proj, m, C);
  up_.apply(proj, m, C, qkv, mlp_, activation_);
  down_.apply(qkv, m, mlp_, x, C, Activation::kNone, x, C);
}

void swin_patch_merge(const float* x, long batch, long height, long width, long C, const float* weight,
                      const float* bias, float eps, float* y) {
  const long h2 = (height + 1) / 2, w2 = (width + 1) / 2, rows = batch * h2 * w2;
  const NormKernels& norm = norm_kernels();
  parallel_ranges(rows, min_rows(4 * C), [&](long begin, long end) {
    for (long r = begin; r < end; ++r) {
      const long b = r / (h2 * w2), i = (r / w2) % h2, j = r % w2;
      float* dst = y + r * 4 * C;
      // transformers' order: x0 (even row, even column), x1 (odd, even), x2 (even, odd), x3 (odd, odd).
      for (int part = 0; part < 4; ++part) {
        const long row = 2 * i + (part & 1), col = 2 * j + (part >> 1);
        float* out = dst + part * C;
        if (row < height && col < width) {
          std::memcpy(out, x + ((b * height + row) * width + col) * C, sizeof(float) * C);
        } else {
          std::memset(out, 0, sizeof(float) * C);
        }
      }
      norm.layer_norm_row(dst, nullptr, nullptr, weight, bias, eps, dst, 4 * C);
    }
  });
}

}  // namespace cpuformer
