#include "runtime/checked_size.h"

#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <cstdint>
#include <cstdio>
#include <limits>

namespace cpuformer {
namespace {

// Signed 64-bit: pointer differences and the models' long indices must hold every size.
constexpr std::uint64_t kMaxSize = static_cast<std::uint64_t>(std::numeric_limits<long>::max());

std::string dims_string(std::initializer_list<long> dims) {
  std::string s = "[";
  bool first = true;
  for (long d : dims) {
    if (!first) s += " × ";
    s += std::to_string(d);
    first = false;
  }
  return s + "]";
}

// "25769803776 bytes (24.0 GiB)"; beyond 64 bits "about 8.9e+20 bytes".
std::string bytes_string(long double bytes) {
  char buffer[96];
  if (bytes > static_cast<long double>(kMaxSize)) {
    std::snprintf(buffer, sizeof buffer, "about %.3Lg bytes", bytes);
    return buffer;
  }
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  long double scaled = bytes / 1024.0L;
  int unit = 0;
  while (scaled >= 1024.0L && unit < 5) {
    scaled /= 1024.0L;
    ++unit;
  }
  if (bytes < 1024.0L) {
    std::snprintf(buffer, sizeof buffer, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buffer, sizeof buffer, "%llu bytes (%.1Lf %s)", static_cast<unsigned long long>(bytes), scaled,
                  units[unit]);
  }
  return buffer;
}

[[noreturn]] void throw_negative(const char* what, const std::string& dims) {
  throw SizeError(std::string(what) + " " + dims + " has a negative size");
}

// ∏ dims × element_bytes exactly when it fits 64 bits; `estimate` always (for the message).
bool product(std::initializer_list<long> dims, std::uint64_t element_bytes, std::uint64_t* exact, long double* estimate,
             const char* what) {
  std::uint64_t value = element_bytes;
  long double approx = static_cast<long double>(element_bytes);
  bool fits = true;
  for (long d : dims) {
    if (d < 0) throw_negative(what, dims_string(dims));
    approx *= static_cast<long double>(d);
    fits = fits && !__builtin_mul_overflow(value, static_cast<std::uint64_t>(d), &value);
  }
  // A zero factor makes the product 0 whatever overflowed before it.
  if (approx == 0.0L) {
    *exact = 0;
    *estimate = 0.0L;
    return true;
  }
  *exact = value;
  *estimate = approx;
  return fits && value <= kMaxSize;
}

// `describe()` names the buffer in the message; it is only called when the size does not fit, so
// that a check that passes (every scratch buffer a decode step reserves) formats no string.
template <typename Describe>
std::size_t bytes_within_limit(bool fits, std::uint64_t bytes, long double estimate, const Describe& describe) {
  const AllocationLimit limit = allocation_limit();
  if (fits && bytes <= limit.bytes) return static_cast<std::size_t>(bytes);
  throw SizeError(describe() + " would need " + bytes_string(fits ? static_cast<long double>(bytes) : estimate) +
                  ", more than the " + bytes_string(static_cast<long double>(limit.bytes)) +
                  " this process can allocate (" + limit.source + ")");
}

}  // namespace

AllocationLimit allocation_limit() {
  AllocationLimit limit{static_cast<std::size_t>(kMaxSize), "the address space"};
  struct sysinfo info;
  if (sysinfo(&info) == 0) {
    const long double total = (static_cast<long double>(info.totalram) + static_cast<long double>(info.totalswap)) *
                              static_cast<long double>(info.mem_unit);
    if (total > 0 && total < static_cast<long double>(limit.bytes)) {
      limit = {static_cast<std::size_t>(total), "physical memory and swap"};
    }
  }
  const struct {
    int resource;
    const char* name;
  } rlimits[] = {{RLIMIT_AS, "RLIMIT_AS"}, {RLIMIT_DATA, "RLIMIT_DATA"}};
  for (const auto& r : rlimits) {
    struct rlimit value;
    if (getrlimit(r.resource, &value) == 0 && value.rlim_cur != RLIM_INFINITY && value.rlim_cur < limit.bytes) {
      limit = {static_cast<std::size_t>(value.rlim_cur), r.name};
    }
  }
  return limit;
}

std::size_t checked_count(std::initializer_list<long> dims, const char* what) {
  std::uint64_t count;
  long double estimate;
  if (!product(dims, 1, &count, &estimate, what)) {
    throw SizeError(std::string(what) + " " + dims_string(dims) + " overflows a 64-bit size");
  }
  return static_cast<std::size_t>(count);
}

std::size_t checked_bytes(std::initializer_list<long> dims, std::size_t element_bytes, const char* what) {
  std::uint64_t bytes;
  long double estimate;
  const bool fits = product(dims, element_bytes, &bytes, &estimate, what);
  return bytes_within_limit(fits, bytes, estimate, [&] { return std::string(what) + " " + dims_string(dims); });
}

std::size_t checked_buffer_bytes(std::size_t count, std::size_t element_bytes, const char* what) {
  std::uint64_t bytes;
  const bool fits =
      !__builtin_mul_overflow(static_cast<std::uint64_t>(count), element_bytes, &bytes) && bytes <= kMaxSize;
  const long double estimate = static_cast<long double>(count) * static_cast<long double>(element_bytes);
  return bytes_within_limit(fits, bytes, estimate,
                            [&] { return std::string(what) + " of " + std::to_string(count) + " elements"; });
}

long checked_add(long a, long b, const char* what) {
  long sum;
  if (a < 0 || b < 0) throw_negative(what, "[" + std::to_string(a) + " + " + std::to_string(b) + "]");
  if (__builtin_add_overflow(a, b, &sum)) {
    throw SizeError(std::string(what) + " [" + std::to_string(a) + " + " + std::to_string(b) +
                    "] overflows a 64-bit size");
  }
  return sum;
}

long checked_multiply(long a, long b, const char* what) { return static_cast<long>(checked_count({a, b}, what)); }

}  // namespace cpuformer
