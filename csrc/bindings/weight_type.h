// The dtype string of a model config ("float32" | "float16" | "bfloat16" | "int8") as a WeightType.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "kernels/gemm/gemm.h"

namespace cpuformer {
namespace bindings {

// config["dtype"] when present, float32 otherwise; ValueError listing the valid names.
inline WeightType config_weight_type(const pybind11::dict& config) {
  if (!config.contains("dtype") || config["dtype"].is_none()) return WeightType::kFloat32;
  const std::string s = config["dtype"].cast<std::string>();
  if (s == "float32") return WeightType::kFloat32;
  if (s == "float16") return WeightType::kFloat16;
  if (s == "bfloat16") return WeightType::kBFloat16;
  if (s == "int8") return WeightType::kInt8;
  throw pybind11::value_error("dtype must be one of 'float32', 'float16', 'bfloat16', 'int8', got '" + s + "'");
}

}  // namespace bindings
}  // namespace cpuformer
