// Weight-only matrix products Y(M,N) = X(M,K) . W(N,K)^T for float32 X, shared by the Lite kernels
// (lite_kernels.cc). linear_math.cc is compiled twice: with -mavx2 -mfma into namespace lk::avx2 (its
// prefill GEMM also for AVX-512, used where args.wide) and without into lk::generic; lite_kernels.cc picks
// one at load time by cpuid.
//
// Weight layouts (written by lite_runtime/contract/quant.py):
//   kF32   W float32 (N, K)
//   kF32P16 W float32 (N, K) in panels for a float GEMM: rows 16p .. 16p+15 are one panel of 16K floats,
//          transposed: weight (16p + j, k) at 16Kp + 16k + j; the last N % 16 rows are stored whole after
//          the panels (row n at nK).
//   kI8    W int8 (N, K) in kF32P16's panels, scale float32 (N): w = q * scale[n].
//   kI4    W uint8 (N, Kp/2), Kp = K rounded up to 32; in each run of 32 weights along K, byte j holds
//          weight j in its low nibble and weight j + 16 in its high nibble (llama.cpp's Q4_0 order).
//          scale float32 (N, G), G groups of `group` weights (a multiple of 32; the last may be short):
//          w = (u - 8) * scale[n, g]
//   kI4Min as kI4 with min float32 (N, G): w = u * scale[n, g] + min[n, g]
// int4 products take x rounded to int8 per run of 32 along K (d = max|x| / 127, q = rint(x * (1 / d)),
// x = q * d; contract/quant.py round_activations): the decode loop multiplies integers, the other paths
// the same rounded values as floats.
#pragma once
#include <cstdint>

namespace lk {

enum Kind { kF32 = 0, kI8 = 1, kI4 = 2, kI4Min = 3, kF32P16 = 4 };

struct LinearArgs {
  int kind = kF32;
  const float *x = nullptr;   // (M, ldx); for kI4/kI4Min K == Kp and columns K.. are zeros
  int64_t M = 0, K = 0, N = 0, ldx = 0;
  const void *w = nullptr;
  const float *scale = nullptr;
  const float *min = nullptr;
  int64_t G = 0, group = 0;   // int4: groups per row and weights per group
  int group_shift = -1;       // int4: log2(group / 32) when a power of two, else -1
  const float *xsum = nullptr;  // int4: (M, G) sums of x over each group
  const int8_t *xq = nullptr;   // int4: x rounded to int8, (M, K): x = xq * xs per run of 32 along K
  const float *xs = nullptr;    // int4: (M, K / 32) scales of xq
  float *y = nullptr;         // (M, N)
  bool wide = false;          // AVX-512 present (avx2 build only): the prefill GEMM on 16-float registers
};

// Columns of W packed together for prefill-sized M (and kF32P16's panels).
constexpr int64_t kTileCols = 16;

// Index of W[n][k] in the panel layout of kF32P16 and kI8 (N, K): a panel's row n is its column n % 16, the
// last N % 16 rows whole.
inline int64_t PanelOffset(int64_t N, int64_t K, int64_t n, int64_t k) {
  return n < N / kTileCols * kTileCols ? (n - n % kTileCols) * K + k * kTileCols + n % kTileCols : n * K + k;
}

// Rows of W (output columns of Y) per block: a thread's share of N is a run of whole blocks.
constexpr int64_t kBlockRows = 4;
inline int64_t BlockRows(int kind) {     // the panel layouts: pairs of panels
  return kind == kF32P16 || kind == kI8 ? 2 * kTileCols : kBlockRows;
}

// Computes Y's columns [n0, n1); `scratch` holds at least kTileCols * K floats (K as padded for int4).
using RangeFn = void (*)(const LinearArgs &args, int64_t n0, int64_t n1, float *scratch);

// Rounds `runs` runs of 32 floats to int8 (the int4 products' rounding, above): q and d out, and x replaced by
// q * d.
using RoundFn = void (*)(float *x, int64_t runs, int8_t *q, float *d);

namespace avx2 {
void Range(const LinearArgs &args, int64_t n0, int64_t n1, float *scratch);
void RoundActivations(float *x, int64_t runs, int8_t *q, float *d);
}
namespace generic {
void Range(const LinearArgs &args, int64_t n0, int64_t n1, float *scratch);
void RoundActivations(float *x, int64_t runs, int8_t *q, float *d);
}

}  // namespace lk
