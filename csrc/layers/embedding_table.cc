#include "layers/embedding_table.h"

#include <stdexcept>

namespace cpuformer {

EmbeddingTable::EmbeddingTable(const float* table, long rows, long width, WeightType type) : width_(width) {
  if (type == WeightType::kFloat32) {
    rows_ = table;
    return;
  }
  if (type != WeightType::kInt8) throw std::invalid_argument("embedding tables are stored as float32 or int8");
  q_.resize(static_cast<std::size_t>(rows) * width);
  scales_.resize(rows);
  if (rows > 0 && width > 0) quantize_weights_s8(table, rows, width, width, q_.data(), scales_.data());
}

}  // namespace cpuformer
