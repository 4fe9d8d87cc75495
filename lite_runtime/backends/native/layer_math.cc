// The loops of layer_math.h over the 8-float vector type (vec8.h).
#include <cmath>
#include <cstdint>
#include <cstring>

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
// sigmoid(z) from e = exp(-|z|) <= 1 (the vectors' exp takes x <= 0): 1 / (1 + e), or e / (1 + e) for z < 0.
inline V8 Sigmoid(V8 z) {
  const V8 e = Exp(NegAbs(z)), one = Bcast(1.0f);
  return Div(SelectNonNegative(z, one, e), Add(one, e));
}

// f(v, i) stores 8 results from 8 values at i; the last count % 8 go through a padded copy.
template <typename F>
inline void Each8(const float *x, int64_t count, float *y, F f) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) Store(y + i, f(Load(x + i), i));
  if (i == count) return;
  float in[8] = {0, 0, 0, 0, 0, 0, 0, 0}, out[8];
  std::memcpy(in, x + i, sizeof(float) * (count - i));
  Store(out, f(Load(in), i));
  std::memcpy(y + i, out, sizeof(float) * (count - i));
}
}  // namespace

void SwiGLU(const float *gate, const float *up, int64_t count, float *y) {
  Each8(gate, count, y, [&](V8 g, int64_t i) {
    float u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const V8 upv = i + 8 <= count ? Load(up + i) : (std::memcpy(u, up + i, sizeof(float) * (count - i)), Load(u));
    return Mul(Mul(g, Sigmoid(g)), upv);
  });
}

void Gelu(int form, const float *x, int64_t count, float *y) {
  const float k_tanh = 2.0f * std::sqrt(2.0f / 3.14159265358979f), k_erf = 1.0f / std::sqrt(2.0f);
  if (form == kGeluErf) {
    for (int64_t i = 0; i < count; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * k_erf));
    return;
  }
  const V8 cubic = Bcast(0.044715f), scale = Bcast(form == kGeluTanh ? k_tanh : 1.702f);
  Each8(x, count, y, [&](V8 h, int64_t) {
    const V8 z = form == kGeluTanh ? Mul(scale, Add(h, Mul(Mul(Mul(cubic, h), h), h))) : Mul(scale, h);
    return Mul(h, Sigmoid(z));
  });
}

void Rotary(const float *x, const float *cos, const float *sin, const float *pair, int64_t N, int64_t n, int64_t hd,
            float *y) {
  const float *partner = pair, *sign = pair + hd;
  const int64_t hd8 = hd & ~int64_t(7);
  for (int64_t t = 0; t < N; ++t, cos += hd, sin += hd)
    for (int64_t h = 0; h < n; ++h, x += hd, y += hd) {
      for (int64_t i = 0; i < hd8; i += 8)
        Store(y + i, Fma(Mul(Load(sign + i), GatherOrZero(x, partner + i)), Load(sin + i),
                         Mul(Load(x + i), Load(cos + i))));
      for (int64_t i = hd8; i < hd; ++i) {
        const int64_t j = static_cast<int64_t>(partner[i]);
        y[i] = x[i] * cos[i] + (j < 0 ? 0.0f : sign[i] * x[j]) * sin[i];
      }
    }
}

}  // namespace LK_NS
}  // namespace lk
