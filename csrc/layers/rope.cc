#include "layers/rope.h"

#include <cmath>

namespace cpuformer {

void rope_angles(const float* inv_freq, long half, long position, float* cos_sin) {
  const float p = static_cast<float>(position);
  for (long i = 0; i < half; ++i) {
    const float a = p * inv_freq[i];
    cos_sin[i] = std::cos(a);
    cos_sin[half + i] = std::sin(a);
  }
}

void rope_apply(const float* cos_sin, long half, long heads, float* x) {
  const float* c = cos_sin;
  const float* s = cos_sin + half;
  for (long h = 0; h < heads; ++h) {
    float* x1 = x + h * 2 * half;
    float* x2 = x1 + half;
    for (long i = 0; i < half; ++i) {
      const float a = x1[i], b = x2[i];
      x1[i] = a * c[i] - b * s[i];
      x2[i] = b * c[i] + a * s[i];
    }
  }
}

}  // namespace cpuformer
