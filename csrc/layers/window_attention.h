// Swin Transformer: one block of shifted-window attention and MLP, and patch merging, over the
// tokens of images in row-major (row, column) order: x [batch · tokens, C].
//
// SwinBlock::forward updates x in place (transformers' SwinLayer):
//   1. LayerNorm fused with the window gather: windowed row r of image b is the norm of token
//      source[r] (the cyclic shift, the padding to a multiple of the window and the window
//      partition folded into one index, computed by the caller), or zeros for source[r] = -1 (a
//      padded position: transformers pads after layernorm_before);
//   2. q, k, v from one GEMM over the windowed rows, [rows, 3C];
//   3. the fused attention kernel per window and head, reading q, k and v in place in that buffer
//      (strides) with the additive mask [mask_windows, heads, area, area] (relative position bias,
//      plus the shifted windows' mask when mask_windows = windows), writing the heads merged;
//   4. the output projection over the windowed rows;
//   5. the window scatter (reverse partition and shift, padding dropped) fused with the residual:
//      x[token] += y[inverse[token]];
//   6. LayerNorm, the up projection with the activation fused, the down projection accumulating
//      into x (residual).
// Every step runs on current_num_threads() (parallel over rows, windows and heads). Scratch comes
// from a SwinScratch (reused across calls and blocks; a SwinScratchPool hands one to each
// concurrent call).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/activation/activation.h"
#include "layers/linear.h"
#include "layers/workspace.h"

namespace cpuformer {

// The window layout of one block at one input size (models/swin.py computes and caches it).
struct SwinWindowLayout {
  long tokens = 0;                    // H · W per image
  long windows = 0;                   // windows per image (padded grid)
  long area = 0;                      // tokens per window (window²)
  const int64_t* source = nullptr;    // [windows · area]: token of each windowed row, -1 for padding
  const int64_t* inverse = nullptr;   // [tokens]: windowed row of each token
  const float* mask = nullptr;        // [mask_windows, heads, area, area], additive
  long mask_windows = 1;              // windows (a mask per window) or 1 (the same for every window)
};

// Scratch of one call: buffers only grow.
struct SwinScratch {
  ScratchBuffer windows;  // normed windowed rows, then the attention output [rows, C]
  ScratchBuffer wide;     // q, k, v [rows, 3C], then the MLP's hidden [tokens, mlp]
  ScratchBuffer projected;  // the output projection [rows, C], then the second norm [tokens, C]
};

// Scratch sets shared by the blocks of a model: each call takes one (a new one when all are in
// use) and gives it back, so concurrent calls never share one and steady-state calls allocate
// nothing.
class SwinScratchPool {
 public:
  class Lease {
   public:
    Lease(SwinScratchPool* pool, std::unique_ptr<SwinScratch> scratch) : pool_(pool), scratch_(std::move(scratch)) {}
    ~Lease() { pool_->give_back(std::move(scratch_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    SwinScratch& operator*() const { return *scratch_; }

   private:
    SwinScratchPool* pool_;
    std::unique_ptr<SwinScratch> scratch_;
  };

  Lease take();
  // Floats held by the scratch sets not in use.
  std::size_t idle_floats();

 private:
  void give_back(std::unique_ptr<SwinScratch> scratch);
  std::mutex mutex_;
  std::vector<std::unique_ptr<SwinScratch>> free_;
};

// A block's float32 weights (borrowed; packed by the constructor). Biases may be null except o,
// up, down (transformers' Linear layers there always have one).
struct SwinBlockWeights {
  const float *norm1 = nullptr, *norm1_bias = nullptr;
  const float *q = nullptr, *q_bias = nullptr, *k = nullptr, *k_bias = nullptr, *v = nullptr, *v_bias = nullptr;
  const float *o = nullptr, *o_bias = nullptr;
  const float *norm2 = nullptr, *norm2_bias = nullptr;
  const float *up = nullptr, *up_bias = nullptr, *down = nullptr, *down_bias = nullptr;
};

class SwinBlock {
 public:
  // dim C, heads (dividing C), mlp hidden width; weights packed in `format`.
  SwinBlock(const SwinBlockWeights& w, long dim, long heads, long mlp, float eps, Activation activation,
            const WeightFormat& format);

  long dim() const { return dim_; }
  long heads() const { return heads_; }

  // x [batch · layout.tokens, C], updated in place.
  void forward(float* x, long batch, const SwinWindowLayout& layout, SwinScratch& scratch) const;

 private:
  long dim_, heads_, mlp_;
  float eps_;
  Activation activation_;
  std::vector<float> norm1_, norm1_bias_, norm2_, norm2_bias_;
  Linear qkv_, o_, up_, down_;
};

// transformers' SwinPatchMerging before its reduction: x [batch · height · width, C] ->
// y [batch · ceil(height / 2) · ceil(width / 2), 4C], each row the 2x2 neighbours (row, column)
// (2i, 2j), (2i + 1, 2j), (2i, 2j + 1), (2i + 1, 2j + 1) concatenated (zeros outside the map: odd
// sizes are padded), then LayerNorm (weight, bias [4C]). Multi-threaded over rows.
void swin_patch_merge(const float* x, long batch, long height, long width, long C, const float* weight,
                      const float* bias, float eps, float* y);

}  // namespace cpuformer
