// Weight-only matrix products Y(M,N) = X(M,K) . W(N,K)^T for float32 X, shared by the Lite kernels
// (lite_kernels.cc). linear_math.cc is compiled twice: with -mavx2 -mfma -mf16c into namespace lk::avx2 (its
// prefill GEMM also for AVX-512, used where args.wide) and without into lk::generic; lite_kernels.cc picks
// one at load time by cpuid.
//
// Weight layouts (written by lite_runtime/contract/quant.py):
//   kF32   W float32 (N, K)
//   kF32P16 W float32 (N, K) in panels for a float GEMM: rows 16p .. 16p+15 are one panel of 16K floats,
//          transposed: weight (16p + j, k) at 16Kp + 16k + j; the last N % 16 rows are stored whole after
//          the panels (row n at nK).
//   kI8    W int8 (N, K) in kF32P16's panels, scale float32 (N): w = q * scale[n].
//   kI4Min W uint8 (N, Kp / 2), Kp = K rounded up to 32, 4-bit values u; scale and min float16 (N, G), G groups
//          of `group` weights along K (a multiple of 32; the last may be short): w = u * scale[n, g] + min[n, g];
//          without mins (symmetric: a GGUF's Q4_0 blocks) min = -8 * scale.
//          In the panels' rows 16p .. 16p+15 as 8Kp bytes: for each pair of steps k, k + 1 (k even) 16 bytes,
//          byte j holding row 16p + j's u at k (low nibble) and at k + 1 (high nibble); their scales and mins
//          (G, 16) each, as kF32P16's panels of an (N, G) array. The last N % 16 rows are stored whole: in each
//          run of 32 weights along K byte j holds weight j in its low nibble and j + 16 in its high one
//          (llama.cpp's Q4 order).
//   kI8Group W int8 (N, K), K a multiple of 32, in kF32P16's panels; scale float16 (N, G) as kI4Min's, G groups of
//          `group` weights along K: w = q * scale[n, g] (`weights: int8`; in groups of 32 llama.cpp's Q8_0 blocks).
#pragma once
#include <cstdint>

namespace lk {

// 2, 3: retired (symmetric int4, float32 scales)
enum Kind { kF32 = 0, kI8 = 1, kI4Min = 5, kF32P16 = 4, kI8Group = 6 };

struct LinearArgs {
  int kind = kF32;
  const float *x = nullptr;   // (M, ldx); for kI4Min K == Kp and columns K.. are zeros
  int64_t M = 0, K = 0, N = 0, ldx = 0;
  const void *w = nullptr;
  const float *scale = nullptr;     // kI8
  const uint16_t *scale16 = nullptr, *min16 = nullptr;   // kI4Min, kI8Group: float16 bits (no mins: symmetric)
  int64_t G = 0, group = 0;   // int4, kI8Group: groups per row and weights per group
  int group_shift = -1;       // int4, kI8Group: log2(group / 32) when a power of two, else -1
  const float *xsum = nullptr;  // int4 up to kDecodeRowsI4 rows: (M, G) sums of x over each group
  const uint8_t *xq = nullptr;  // kI8Group with int8 activations (vnni::Range): X quantized (M, K), q + 128,
  const float *xd = nullptr;    // and its scales (M, K / 32)
  float *y = nullptr;         // (M, N)
  bool wide = false;          // AVX-512 present (avx2 build only): the prefill GEMM on 16-float registers
};

// Columns of W packed together for prefill-sized M (and kF32P16's panels).
constexpr int64_t kTileCols = 16;

// Index of W[n][k] in the panel layout of kF32P16, kI8 and kI8Group (N, K): a panel's row n is its column n % 16, the
// last N % 16 rows whole.
inline int64_t PanelOffset(int64_t N, int64_t K, int64_t n, int64_t k) {
  return n < N / kTileCols * kTileCols ? (n - n % kTileCols) * K + k * kTileCols + n % kTileCols : n * K + k;
}

// Rows of W (output columns of Y) per block: a thread's share of N is a run of whole blocks.
constexpr int64_t kBlockRows = 4;
inline int64_t BlockRows(int kind) { return kind == kF32 ? kBlockRows : 2 * kTileCols; }   // pairs of panels

// Up to this M int4 panels take their decode loop on AVX-512 (linear_math.cc DecodeWide; Decode up to 2
// rows on AVX2, whose 16 registers hold no more sums), which needs args.xsum: faster than the GEMM's
// dequantising panels up to here; past 64 rows the GEMM on panels dequantised once a call is faster
// (linear_math.cc PanelRange; docs/measured-choices.md).
constexpr int64_t kDecodeRowsI4 = 64;

// Computes Y's columns [n0, n1); `scratch` holds at least 2 * kTileCols * K floats (K as padded for int4),
// 64-byte aligned.
using RangeFn = void (*)(const LinearArgs &args, int64_t n0, int64_t n1, float *scratch);

namespace avx2 {
void Range(const LinearArgs &args, int64_t n0, int64_t n1, float *scratch);
}
namespace generic {
void Range(const LinearArgs &args, int64_t n0, int64_t n1, float *scratch);
}
// Grouped int8 weights in groups of 32 against X quantized alike (linear_int8.cc, AVX512-VNNI): Quantize fills
// args.xq and args.xd from X (M, K), Range computes Y's columns [n0, n1) from them.
namespace vnni {
bool Supported();
void Quantize(const float *x, int64_t M, int64_t K, int64_t ldx, uint8_t *xq, float *xd);
void Range(const LinearArgs &args, int64_t n0, int64_t n1);
}

}  // namespace lk
