// The int4 GEMM driver every SIMD level shares (gemm_int4_avx2_inl.h for avx2 and avxvnni,
// gemm_int4_avx512vnni.cc, gemm_int4_dotprod.cc): the scratch for the quantized rows of A, their
// scales and per-group values, the row-wise work split (gemm_rowwise_inl.h), the register tiles
// and the epilogue of each finished tile row. Only the tile, the row quantization, the per-group
// value and the epilogue differ between levels; the arithmetic is gemm.h's (Int4GemmKernels).
//
// Include INSIDE the ISA namespace (in an anonymous namespace), after gemm_int4_layout_inl.h and
// gemm_rowwise_inl.h; no include guard on purpose. The including file defines:
//   kMR, kNR                 the register tile: up to kMR rows × kNR features (kNR a multiple of
//                            kInt4Panel: the tile covers kNR / kInt4Panel neighbouring panels);
//   float int4_quantize_row(const float* a, long k, long kp, int8_t* row)
//                            row = qa (s8, zero-padded from k to kp), returns sa (gemm.h);
//   int32_t int4_group_value(const int8_t* row, long group_size, bool zero_point)
//                            what the tile reads for one group of qa (its sum, or a multiple of it);
//   TileFunction select_tile(long group_size, bool zero_point), where
//     void tile(long rows, const int8_t* a, long lda, const int32_t* values, long groups,
//               const uint8_t* panel, long ncols, long stride, long header, float* out)
//                            out[r·kNR + j] = Σ_g s[g]·t[g] for rows r < rows and the ncols ≤ kNR
//                            features of the panels from `panel` on (stride: the bytes of one
//                            panel; header: of its scales and zero points);
//   void finish_row(const float* acc, float sa, const float* bias, Activation act,
//                   const float* residual, float* c, long ncols)
//                            c[j] = act(sa·acc[j] + bias[j]) + residual[j] for j < ncols.

// Below this many multiply-adds per thread a second thread costs more than it saves.
constexpr long kInt4MinMacsPerThread = 1L << 19;

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k, group_size = w.group_size, groups = int4_groups(k, group_size);
  const long kp = groups * group_size;
  const long stride = int4_panel_bytes(groups, group_size, w.zero_point);
  const long header = int4_header_bytes(groups, w.zero_point);
  const TileFunction tile = select_tile(group_size, w.zero_point);

  // Quantized A ([m][kp] bytes, rows 64-byte aligned), sa [m] and the tiles' per-group values
  // [m][groups], rowwise_copies(m) copies 64-byte aligned, allocated here: no exception may leave
  // the parallel region.
  const std::size_t qa_floats = (static_cast<std::size_t>(m) * kp + 63) / 64 * 16;
  const std::size_t value_floats = static_cast<std::size_t>(m) * groups;
  const std::size_t copy_floats = (qa_floats + value_floats + static_cast<std::size_t>(m) + 15) / 16 * 16;
  float* scratch = gemm_thread_scratch(copy_floats * static_cast<std::size_t>(rowwise_copies(m)));
  struct Copy {
    int8_t* qa;
    int32_t* values;
    float* sa;
  };
  auto copy_at = [&](long copy) {
    float* base = scratch + copy * copy_floats;
    return Copy{reinterpret_cast<int8_t*>(base), reinterpret_cast<int32_t*>(base + qa_floats),
                base + qa_floats + value_floats};
  };

  rowwise_gemm(
      m, n, k, kInt4MinMacsPerThread,
      [&](long i, long copy) {
        const Copy x = copy_at(copy);
        int8_t* row = x.qa + i * kp;
        x.sa[i] = int4_quantize_row(a + i * lda, k, kp, row);
        for (long g = 0; g < groups; ++g)
          x.values[i * groups + g] = int4_group_value(row + g * group_size, group_size, w.zero_point);
      },
      [&](long i0, long rows, long j0, long ncols, long copy, const PanelAhead&) {
        const Copy x = copy_at(copy);
        const int8_t* qa = x.qa;
        const int32_t* values = x.values;
        const float* sa = x.sa;
        alignas(64) float acc[kMR * kNR];
        tile(rows, qa + i0 * kp, kp, values + i0 * groups, groups, w.bytes() + (j0 / kInt4Panel) * stride, ncols,
             stride, header, acc);
        for (long r = 0; r < rows; ++r) {
          const long i = i0 + r;
          finish_row(acc + r * kNR, sa[i], epilogue.bias ? epilogue.bias + j0 : nullptr, epilogue.activation,
                     epilogue.residual ? epilogue.residual + i * epilogue.ldr + j0 : nullptr, c + i * ldc + j0, ncols);
        }
      });
}
