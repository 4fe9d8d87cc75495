// Grouped int8 weights (kI8Group in groups of 32: llama.cpp's Q8_0 blocks) against activations quantized to int8
// the same way, on AVX512-VNNI's dot products of unsigned and signed bytes (vpdpbusd: 64 products an instruction,
// against a float FMA's 16). Opt-in (lk_set_int8_activations): the products are a W8A8 scheme's, as llama.cpp's
// Q8_0 and OpenVINO's dynamic quantization compute them, not the float ones of the other loops.
//
// X is quantized once a call (Quantize): per row and run of 32 along K, d = max |x| / 127 and q = round(x / d) in
// [-127, 127], kept as q + 128 (the unsigned operand). A group's sum over k of (q + 128) w is corrected by 128 times
// the group's sum of w (one more dot product a step, shared by every row), then times d_x d_w as floats.
// Compiled once with -mavx512f -mavx512bw -mavx512vnni -mf16c; lite_kernels.cc calls it only where cpuid has them.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "linear_math.h"

namespace lk {
namespace vnni {
namespace {

constexpr int64_t kRun = 32;     // weights (and activations) a scale

// P panels from column n made VNNI's operands once a call, for every block of rows: `cols` (K / 4, P, 16) dwords,
// step k / 4's dword j of panel p column j's weights at k .. k + 3; `offset` (G, P, 16): -128 times each group's
// sum of a column's weights (what the + 128 of X's bytes adds to the sums).
template <int P>
void Stage(const LinearArgs &a, int64_t n, __m512i *cols, __m512i *offset) {
  const int64_t K = a.K, G = K / kRun;
  // dword t from the source's dword 4 (t % 4) + t / 4 (lane t / 4 then holds columns 4 (t / 4) .. + 3 of the four
  // steps), then byte j of a lane from its byte 4 (j % 4) + j / 4 (a 4 x 4 transpose)
  const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i ones = _mm512_set1_epi8(1);
  for (int p = 0; p < P; ++p) {
    const int8_t *w = static_cast<const int8_t *>(a.w) + (n + p * kTileCols) * K;
    for (int64_t g = 0; g < G; ++g) {
      __m512i sum = _mm512_setzero_si512();
      for (int64_t k = g * kRun; k < (g + 1) * kRun; k += 4) {
        const __m512i v = _mm512_loadu_si512(w + k * kTileCols);
        const __m512i c = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(lanes, v), bytes);
        cols[k / 4 * P + p] = c;
        sum = _mm512_dpbusd_epi32(sum, ones, c);
      }
      offset[g * P + p] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7));
    }
  }
}

// MB rows of X (from m0) against the staged panels: sums a group at a time in int32, then scaled into floats.
template <int MB, int P>
void Tile(const LinearArgs &a, const __m512i *cols, const __m512i *offset, int64_t m0, int64_t n) {
  const int64_t K = a.K, G = K / kRun;
  const uint16_t *scale[P];
  for (int p = 0; p < P; ++p) scale[p] = a.scale16 + (n + p * kTileCols) * G;
  const uint8_t *xq = a.xq + m0 * K;
  const float *xd = a.xd + m0 * G;
  __m512 f[MB][P];
  for (int m = 0; m < MB; ++m)
    for (int p = 0; p < P; ++p) f[m][p] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i acc[MB][P];
    for (int m = 0; m < MB; ++m)
      for (int p = 0; p < P; ++p) acc[m][p] = offset[g * P + p];
    for (int64_t k = g * kRun; k < (g + 1) * kRun; k += 4) {
      const __m512i *c = cols + k / 4 * P;
      for (int m = 0; m < MB; ++m) {
        int32_t four;
        __builtin_memcpy(&four, xq + m * K + k, 4);
        const __m512i xb = _mm512_set1_epi32(four);
        for (int p = 0; p < P; ++p) acc[m][p] = _mm512_dpbusd_epi32(acc[m][p], xb, c[p]);
      }
    }
    for (int p = 0; p < P; ++p) {
      const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(scale[p] + g * kTileCols)));
      for (int m = 0; m < MB; ++m)
        f[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[m][p]), _mm512_mul_ps(ws, _mm512_set1_ps(xd[m * G + g])),
                                  f[m][p]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(a.y + (m0 + m) * a.N + n + p * kTileCols, f[m][p]);
}

// One panel against MB rows, its operands made as read (few rows: staging would cost more than it saves), the
// panel asked of the cache ahead of use.
template <int MB>
void Streamed(const LinearArgs &a, int64_t m0, int64_t n) {
  const int64_t K = a.K, G = K / kRun;
  const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i ones = _mm512_set1_epi8(1);
  const int8_t *w = static_cast<const int8_t *>(a.w) + n * K;
  const uint16_t *scale = a.scale16 + n * G;
  const uint8_t *xq = a.xq + m0 * K;
  const float *xd = a.xd + m0 * G;
  __m512 f[MB];
  for (int m = 0; m < MB; ++m) f[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i acc[MB], sum = _mm512_setzero_si512();
    for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_si512();
    for (int64_t k = g * kRun; k < (g + 1) * kRun; k += 4) {
      __builtin_prefetch(w + (k + 64) * kTileCols);
      const __m512i v = _mm512_loadu_si512(w + k * kTileCols);
      const __m512i c = _mm512_shuffle_epi8(_mm512_permutexvar_epi32(lanes, v), bytes);
      sum = _mm512_dpbusd_epi32(sum, ones, c);
      for (int m = 0; m < MB; ++m) {
        int32_t four;
        __builtin_memcpy(&four, xq + m * K + k, 4);
        acc[m] = _mm512_dpbusd_epi32(acc[m], _mm512_set1_epi32(four), c);
      }
    }
    const __m512i offset = _mm512_slli_epi32(sum, 7);
    const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(scale + g * kTileCols)));
    for (int m = 0; m < MB; ++m)
      f[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m], offset)),
                             _mm512_mul_ps(ws, _mm512_set1_ps(xd[m * G + g])), f[m]);
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(a.y + (m0 + m) * a.N + n, f[m]);
}

// Up to this many rows of X a panel's operands are made as they are read (Streamed), from it once a call (Stage)
// (docs/measured-choices.md).
constexpr int64_t kStreamedRows = 8;

template <int P>
void Rows(const LinearArgs &a, int64_t n, std::vector<__m512i> &staged) {
  if (a.M <= kStreamedRows) {
    for (int p = 0; p < P; ++p) {
      const int64_t np = n + p * kTileCols;
      switch (a.M) {
        case 8: Streamed<8>(a, 0, np); break;
        case 7: Streamed<7>(a, 0, np); break;
        case 6: Streamed<6>(a, 0, np); break;
        case 5: Streamed<5>(a, 0, np); break;
        case 4: Streamed<4>(a, 0, np); break;
        case 3: Streamed<3>(a, 0, np); break;
        case 2: Streamed<2>(a, 0, np); break;
        default: Streamed<1>(a, 0, np);
      }
    }
    return;
  }
  const int64_t K = a.K, G = K / kRun;
  staged.resize(K / 4 * P + G * P);
  __m512i *cols = staged.data(), *offset = cols + K / 4 * P;
  Stage<P>(a, n, cols, offset);
  int64_t m = 0;
  for (; m + 6 <= a.M; m += 6) Tile<6, P>(a, cols, offset, m, n);
  switch (a.M - m) {
    case 5: return Tile<5, P>(a, cols, offset, m, n);
    case 4: return Tile<4, P>(a, cols, offset, m, n);
    case 3: return Tile<3, P>(a, cols, offset, m, n);
    case 2: return Tile<2, P>(a, cols, offset, m, n);
    case 1: return Tile<1, P>(a, cols, offset, m, n);
    default: return;
  }
}

// Row n of W stored whole (the last N % 16), every row of X: the same sums one product at a time.
void WholeRow(const LinearArgs &a, int64_t n) {
  const int64_t K = a.K, G = K / kRun;
  const int8_t *w = static_cast<const int8_t *>(a.w) + n * K;
  for (int64_t m = 0; m < a.M; ++m) {
    float y = 0.0f;
    for (int64_t g = 0; g < G; ++g) {
      int32_t sum = 0;
      for (int64_t k = g * kRun; k < (g + 1) * kRun; ++k) sum += (int32_t(a.xq[m * K + k]) - 128) * w[k];
      y = std::fma(static_cast<float>(sum), _cvtsh_ss(a.scale16[n * G + g]) * a.xd[m * G + g], y);
    }
    a.y[m * a.N + n] = y;
  }
}

}  // namespace

void Quantize(const float *x, int64_t M, int64_t K, int64_t ldx, uint8_t *xq, float *xd) {
  const int64_t G = K / kRun;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      const float *run = x + m * ldx + g * kRun;
      const __m512 lo = _mm512_loadu_ps(run), hi = _mm512_loadu_ps(run + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
      const float d = amax / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
      const __m512 iv = _mm512_set1_ps(inverse);
      // rounded to nearest, ties to even (the default rounding), then moved to [1, 255]
      const __m128i qlo = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(lo, iv)));
      const __m128i qhi = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(hi, iv)));
      const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
      _mm_storeu_si128(reinterpret_cast<__m128i *>(xq + m * K + g * kRun), _mm_xor_si128(qlo, flip));
      _mm_storeu_si128(reinterpret_cast<__m128i *>(xq + m * K + g * kRun + 16), _mm_xor_si128(qhi, flip));
      xd[m * G + g] = d;
    }
}

void Range(const LinearArgs &a, int64_t n0, int64_t n1) {
  thread_local std::vector<__m512i> staged;    // 64-byte aligned (the vector's allocator honours the type's)
  const int64_t panels_end = a.N / kTileCols * kTileCols;
  int64_t n = n0;
  for (; n + 2 * kTileCols <= std::min(n1, panels_end); n += 2 * kTileCols) Rows<2>(a, n, staged);
  for (; n + kTileCols <= std::min(n1, panels_end); n += kTileCols) Rows<1>(a, n, staged);
  for (; n < n1; ++n) WholeRow(a, n);
}

bool Supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c");
}

}  // namespace vnni
}  // namespace lk
