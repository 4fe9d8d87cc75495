// The loops of layer_math.h over the 8-float vector type (vec8.h).
#include <cmath>
#include <cstdint>

#include "layer_math.h"
#include "vec8.h"

namespace lk {
namespace LK_NS {

void RmsNorm(const float *x, const float *w, float eps, int64_t rows, int64_t H, float *y) {
  for (int64_t r = 0; r < rows; ++r, x += H, y += H) {
    V8 acc = Zero();
    int64_t k = 0;
    for (; k + 8 <= H; k += 8) {
      const V8 v = Load(x + k);
      acc = Fma(v, v, acc);
    }
    float sum = Hsum(acc);
    for (; k < H; ++k) sum += x[k] * x[k];
    const float d = std::sqrt(sum / static_cast<float>(H) + eps);
    for (k = 0; k < H; ++k) y[k] = x[k] / d * w[k];
  }
}

void SwiGLU(const float *gate, const float *up, int64_t count, float *y) {
  float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail_up[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < count; i += 8) {
    const bool whole = i + 8 <= count;
    const int64_t n = whole ? 8 : count - i;
    for (int64_t j = 0; !whole && j < n; ++j) tail[j] = gate[i + j], tail_up[j] = up[i + j];
    const V8 g = Load(whole ? gate + i : tail), u = Load(whole ? up + i : tail_up);
    // sigmoid(g) from e = exp(-|g|) <= 1 (the vectors' exp takes x <= 0): 1 / (1 + e), or e / (1 + e) for g < 0
    float gs[8], es[8];
    Store(gs, g);
    for (int j = 0; j < 8; ++j) es[j] = -std::fabs(gs[j]);
    Store(es, Exp(Load(es)));
    for (int j = 0; j < 8; ++j) es[j] = (gs[j] >= 0.0f ? 1.0f : es[j]) / (1.0f + es[j]);
    float out[8];
    Store(out, Mul(Mul(g, Load(es)), u));
    for (int64_t j = 0; j < n; ++j) y[i + j] = out[j];
  }
}

void Rotary(const float *x, const float *cos, const float *sin, const float *pair, int64_t N, int64_t n, int64_t hd,
            float *y) {
  const float *partner = pair, *sign = pair + hd;
  for (int64_t t = 0; t < N; ++t, cos += hd, sin += hd)
    for (int64_t h = 0; h < n; ++h, x += hd, y += hd)
      for (int64_t i = 0; i < hd; ++i) {
        const int64_t j = static_cast<int64_t>(partner[i]);
        y[i] = x[i] * cos[i] + (j < 0 ? 0.0f : sign[i] * x[j]) * sin[i];
      }
}

}  // namespace LK_NS
}  // namespace lk
