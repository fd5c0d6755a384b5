// Runs one kernel of the core a given number of times on one thread, for counting the instructions
// it executes under an emulator (benchmarks/arm_instruction_model.py, docs/arm.md). Not a test: it
// checks nothing but its arguments; the kernels' correctness is tests/native/kernel_tests.cc's.
//
//   cpuformer_insn_probe gemm <float32|float16|bfloat16|int8|int4> M N K REPS
//   cpuformer_insn_probe attention Q_LEN KV_LEN HEADS HEAD_DIM REPS
//
// Everything before the first repetition (inputs, packing, a warm-up call that grows the thread's
// scratch) is the same for any REPS, so the difference between two runs with different REPS
// counts the repetitions' instructions alone.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

using namespace cpuformer;

namespace {

std::vector<float> values(long count, unsigned seed) {
  std::vector<float> v(count);
  for (long i = 0; i < count; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = static_cast<float>(static_cast<int>(seed >> 8) % 2001 - 1000) / 1000.0f;
  }
  return v;
}

long number(const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*end != '\0' || v < 0) {
    std::fprintf(stderr, "not a count: %s\n", text);
    std::exit(2);
  }
  return v;
}

int gemm_probe(const std::string& dtype, long m, long n, long k, long reps) {
  WeightType type;
  if (dtype == "float32") type = WeightType::kFloat32;
  else if (dtype == "float16") type = WeightType::kFloat16;
  else if (dtype == "bfloat16") type = WeightType::kBFloat16;
  else if (dtype == "int8") type = WeightType::kInt8;
  else if (dtype == "int4") type = WeightType::kInt4;
  else {
    std::fprintf(stderr, "unknown dtype %s\n", dtype.c_str());
    return 2;
  }
  const std::vector<float> a = values(m * k, 1), w = values(n * k, 2);
  const PackedWeights packed = pack_weights(w.data(), WeightFormat(type), n, k, k);
  std::vector<float> c(m * n);
  gemm(a.data(), m, k, packed, c.data(), n);  // warm-up: scratch grown
  for (long r = 0; r < reps; ++r) gemm(a.data(), m, k, packed, c.data(), n);
  std::printf("%s %s M=%ld N=%ld K=%ld reps=%ld c[0]=%g\n", gemm_kernel_name(type), dtype.c_str(), m, n, k, reps,
              static_cast<double>(c[0]));
  return 0;
}

int attention_probe(long q_len, long kv_len, long heads, long head_dim, long reps) {
  const std::vector<float> q = values(q_len * heads * head_dim, 3), k = values(kv_len * heads * head_dim, 4),
                           v = values(kv_len * heads * head_dim, 5);
  std::vector<float> out(q_len * heads * head_dim);
  AttentionArgs args;
  args.batch = 1;
  args.heads = args.kv_heads = heads;
  args.q_len = q_len;
  args.kv_len = kv_len;
  args.head_dim = head_dim;
  args.q = q.data();
  args.k = k.data();
  args.v = v.data();
  args.out = out.data();
  // [T, H, D] rows, as the models lay them out.
  args.q_stride_t = args.out_stride_t = heads * head_dim;
  args.k_stride_t = args.v_stride_t = heads * head_dim;
  args.q_stride_h = args.k_stride_h = args.v_stride_h = args.out_stride_h = head_dim;
  args.q_stride_b = q_len * heads * head_dim;
  args.out_stride_b = q_len * heads * head_dim;
  args.k_stride_b = args.v_stride_b = kv_len * heads * head_dim;
  args.scale = 0.125f;
  args.causal = true;
  args.causal_offset = kv_len - q_len;
  attention(args);  // warm-up
  for (long r = 0; r < reps; ++r) attention(args);
  std::printf("attention q_len=%ld kv_len=%ld heads=%ld head_dim=%ld reps=%ld out[0]=%g\n", q_len, kv_len, heads,
              head_dim, reps, static_cast<double>(out[0]));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ScopedNumThreads one(1);
  if (argc == 7 && std::strcmp(argv[1], "gemm") == 0) {
    return gemm_probe(argv[2], number(argv[3]), number(argv[4]), number(argv[5]), number(argv[6]));
  }
  if (argc == 7 && std::strcmp(argv[1], "attention") == 0) {
    return attention_probe(number(argv[2]), number(argv[3]), number(argv[4]), number(argv[5]), number(argv[6]));
  }
  std::fprintf(stderr,
               "usage: %s gemm <float32|float16|bfloat16|int8|int4> M N K REPS\n"
               "       %s attention Q_LEN KV_LEN HEADS HEAD_DIM REPS\n",
               argv[0], argv[0]);
  return 2;
}
