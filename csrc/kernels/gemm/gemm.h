// Matrix multiplication against a weight matrix packed once: c = epilogue(a · Wᵀ).
//
// Shapes and layout (row-major, element strides):
//   a [M, K] with row stride lda ≥ K; W [N, K] (PyTorch nn.Linear layout) with row stride ldw ≥ K;
//   c [M, N] with row stride ldc ≥ N; bias [N]; residual [M, N] with row stride ldr.
// Epilogue, per element: c = act(a·Wᵀ + bias) + residual. residual may alias c (then ldr == ldc:
// accumulate in place); a must not alias c. No alignment is required of a, c or residual.
// Threads: gemm() uses current_num_threads() OpenMP threads. PackedWeights is immutable after
// packing and may be shared by any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/activation/activation.h"
#include "runtime/aligned_buffer.h"
#include "runtime/cpu_features.h"

namespace cpuformer {

enum class WeightType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kInt8 = 3 };

struct GemmEpilogue {
  const float* bias = nullptr;              // [N] or null
  Activation activation = Activation::kNone;
  const float* residual = nullptr;          // [M, ldr] or null; added after the activation
  long ldr = 0;
};

// W packed for the GEMM of one ISA level. The byte layout of `data` belongs to that level's
// kernels (see gemm_<isa>.cc); nothing else reads it.
struct PackedWeights {
  long n = 0;  // output features (rows of W)
  long k = 0;  // input features (columns of W)
  WeightType type = WeightType::kFloat32;
  Isa isa = Isa::kScalar;
  AlignedBuffer<uint8_t> data;
};

struct GemmKernels {
  std::size_t (*packed_bytes_f32)(long n, long k);
  void (*pack_f32)(const float* w, long n, long k, long ldw, uint8_t* out);
  // Multi-threaded (current_num_threads()). m ≥ 1.
  void (*gemm_f32)(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
                   const GemmEpilogue& epilogue);
};

const GemmKernels& gemm_kernels();

// Scratch space owned by the calling thread (grown on demand, kept for the thread's lifetime), so
// the per-ISA kernels can pack A blocks without allocating on every call. 64-byte aligned.
// Valid until the same thread calls it again.
float* gemm_thread_scratch(std::size_t count);

PackedWeights pack_weights_f32(const float* w, long n, long k, long ldw);
void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
          const GemmEpilogue& epilogue = {});

namespace scalar { extern const GemmKernels kGemmKernels; }
namespace avx2 { extern const GemmKernels kGemmKernels; }
namespace avx512 { extern const GemmKernels kGemmKernels; }

}  // namespace cpuformer
