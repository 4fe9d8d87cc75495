// The loops of a decoder layer's small ops (layer_ops_kernel.cc) over rows of float32; layer_math.cc is compiled
// twice, as linear_math.cc is.
#pragma once
#include <cstdint>

namespace lk {

// GELU's forms, as exporter/models/mlp.py's GeluMLP computes them: exact (erf), tanh's as x · sigmoid(2z), and
// MindSpore's FastGeLU, x · sigmoid(1.702 x).
enum GeluForm { kGeluErf = 0, kGeluTanh = 1, kGeluFast = 2 };

#define LK_LAYER_LOOPS                                                                                           \
  /* y = x / sqrt(mean(x²) + eps) · w, per row of H */                                                           \
  void RmsNorm(const float *x, const float *w, float eps, int64_t rows, int64_t H, float *y);                    \
  /* y = (x - mean) / sqrt(mean((x - mean)²) + eps) · w + b, per row of H */                                     \
  void LayerNorm(const float *x, const float *w, const float *b, float eps, int64_t rows, int64_t H, float *y);  \
  /* y = gate · sigmoid(gate) · up */                                                                            \
  void SwiGLU(const float *gate, const float *up, int64_t count, float *y);                                      \
  /* y = GELU(x) in the form `form` (GeluForm) */                                                                \
  void Gelu(int form, const float *x, int64_t count, float *y);                                                  \
  /* y (N, n, hd) = x · cos + partner · sin, partner[i] = pair[hd + i] · x[pair[i]] (pair[i] < 0: 0) */          \
  void Rotary(const float *x, const float *cos, const float *sin, const float *pair, int64_t N, int64_t n,       \
              int64_t hd, float *y);

namespace avx2 {
LK_LAYER_LOOPS
}
namespace generic {
LK_LAYER_LOOPS
}
#undef LK_LAYER_LOOPS

}  // namespace lk
