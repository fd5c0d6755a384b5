// Output arrays whose shape comes from the caller's input (and the model's config): the size is
// checked (runtime/checked_size.h) before NumPy allocates, so an output that cannot exist raises
// ValueError naming the argument it came from instead of wrapping or ending in MemoryError.
#pragma once

#include <pybind11/numpy.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/checked_size.h"

namespace cpuformer {
namespace bindings {

// `request` names the argument, e.g. "input_ids of shape [2, 7]"; the message reads
// "<request> is too large: <what> [..] would need N bytes, more than ...".
template <typename T = float>
pybind11::array_t<T> sized_output(std::initializer_list<long> shape, const std::string& request,
                                  const char* what = "the output") {
  with_size_context([&] { return request; }, [&] { return checked_bytes(shape, sizeof(T), what); });
  return pybind11::array_t<T>(std::vector<pybind11::ssize_t>(shape.begin(), shape.end()));
}

}  // namespace bindings
}  // namespace cpuformer
