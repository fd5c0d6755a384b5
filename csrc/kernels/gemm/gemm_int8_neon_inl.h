// The row quantization and the float epilogue of the AArch64 int8 GEMMs (SDOT, gemm_int8_dotprod.cc;
// SMMLA, gemm_int8_i8mm.cc): both quantize A rows to s8 and finish a tile row with the scalar
// reference's float operations. Include it INSIDE the ISA namespace (in an anonymous namespace),
// right after gemm_int8_inl.h; no include guard on purpose. The including file declares
// scalar::quantize_activation_row (gemm_int8_scalar.cc).

float quantize_row(const float* x, long k, long kp, uint8_t* out) {
  int8_t* qa = reinterpret_cast<int8_t*>(out);
  const float sa = scalar::quantize_activation_row(x, k, qa);
  std::memset(qa + k, 0, static_cast<std::size_t>(kp - k));
  return sa;
}

// The scalar reference's float operations in its order (gemm_int8_scalar.cc), unfused: GCC
// contracts a·b + c into fmadd on AArch64 unless kept from it, and the scalar reference (plain C++,
// the same on x86-64, which has no fused multiply-add in its baseline) rounds the product first.
// Then the level's activation table on the row.
template <Activation kAct>
void finish_row_act(const int32_t* acc, const int32_t* comp, float sa, const float* scales, const float* bias,
                    const float* residual, float* c, long ncols) {
  float row[kNR];
  for (long j = 0; j < ncols; ++j) {
    const int32_t sum = comp != nullptr ? acc[j] - comp[j] : acc[j];
    float product = sa * scales[j] * static_cast<float>(sum);
    __asm__("" : "+w"(product));  // keeps the multiply and the add apart (bit-exact)
    row[j] = product + (bias != nullptr ? bias[j] : 0.0f);
  }
  if constexpr (kAct != Activation::kNone) activation_kernels().apply(kAct, row, row, ncols);
  for (long j = 0; j < ncols; ++j) c[j] = row[j] + (residual != nullptr ? residual[j] : 0.0f);
}
