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

void LayerNorm(const float *x, const float *w, const float *b, float eps, int64_t rows, int64_t H, float *y) {
  for (int64_t r = 0; r < rows; ++r, x += H, y += H) {
    float sum = 0.0f, sq = 0.0f;
    for (int64_t k = 0; k < H; ++k) sum += x[k];
    const float mean = sum / static_cast<float>(H);
    for (int64_t k = 0; k < H; ++k) sq += (x[k] - mean) * (x[k] - mean);
    const float d = std::sqrt(sq / static_cast<float>(H) + eps);
    for (int64_t k = 0; k < H; ++k) y[k] = (x[k] - mean) / d * w[k] + b[k];
  }
}

namespace {
// s[j] = sigmoid(z[j]) for 8 values, from e = exp(-|z|) <= 1 (the vectors' exp takes x <= 0): 1 / (1 + e),
// or e / (1 + e) for z < 0.
void Sigmoid8(const float *z, float *s) {
  float e[8];
  for (int j = 0; j < 8; ++j) e[j] = -std::fabs(z[j]);
  Store(e, Exp(Load(e)));
  for (int j = 0; j < 8; ++j) s[j] = (z[j] >= 0.0f ? 1.0f : e[j]) / (1.0f + e[j]);
}
}  // namespace

void SwiGLU(const float *gate, const float *up, int64_t count, float *y) {
  for (int64_t i = 0; i < count; i += 8) {
    const int64_t n = count - i < 8 ? count - i : 8;
    float g[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s[8];
    for (int64_t j = 0; j < n; ++j) g[j] = gate[i + j];
    Sigmoid8(g, s);
    for (int64_t j = 0; j < n; ++j) y[i + j] = g[j] * s[j] * up[i + j];
  }
}

void Gelu(int form, const float *x, int64_t count, float *y) {
  const float k_tanh = 2.0f * std::sqrt(2.0f / 3.14159265358979f), k_erf = 1.0f / std::sqrt(2.0f);
  if (form == kGeluErf) {
    for (int64_t i = 0; i < count; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * k_erf));
    return;
  }
  for (int64_t i = 0; i < count; i += 8) {
    const int64_t n = count - i < 8 ? count - i : 8;
    float h[8] = {0, 0, 0, 0, 0, 0, 0, 0}, z[8], s[8];
    for (int64_t j = 0; j < n; ++j) h[j] = x[i + j];
    for (int j = 0; j < 8; ++j)
      z[j] = form == kGeluTanh ? k_tanh * (h[j] + 0.044715f * h[j] * h[j] * h[j]) : 1.702f * h[j];
    Sigmoid8(z, s);
    for (int64_t j = 0; j < n; ++j) y[i + j] = h[j] * s[j];
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
