// The stored panels of the linear products' weights as their loops read them (linear_math.cc, and through linear_gemm.h
// attention_math.cc; compiled twice, as they are: namespace lk::avx2 and lk::generic, vec8.h): a step of k's 16 weights
// as floats, the sums' last step, and the panel of a call's columns n .. n + 15 (PanelAt).
#pragma once
#include <cstdint>
#include <type_traits>

#include "linear_math.h"
#include "vec8.h"

namespace lk {
namespace LK_NS {
namespace {

// Bytes of a stored panel ahead of the GEMM that it asks the cache for, once per cache line.
constexpr int64_t kPrefetchTileBytes = 3072;

// The rows of a stored panel as the GEMM reads them, a step of k at a time: the 16 weights of row k of the
// transposed panel as floats (Get: two halves of 8, Get16: one AVX-512 register), and the sums' last step
// (Finish). Bytes: a row's size in the panel.
struct F32Panel {     // float32 as stored (also a tile dequantised into scratch)
  static constexpr int64_t kBytes = 64;
  const float *t;
  void Prefetch(int64_t k) const { __builtin_prefetch(t + (k + kPrefetchTileBytes / kBytes) * kTileCols); }
  void Get(int64_t k, V8 &lo, V8 &hi) const {
    lo = Load(t + k * kTileCols);
    hi = Load(t + k * kTileCols + 8);
  }
  void Finish(V8 &, V8 &) const {}
#if defined(__AVX2__) && defined(__FMA__)
  __attribute__((target("avx512f"))) __m512 Get16(int64_t k) const { return _mm512_loadu_ps(t + k * kTileCols); }
  __attribute__((target("avx512f"))) void Finish16(__m512 &) const {}
#endif
};

struct I8Panel {      // int8 converted; the sums times the rows' scales
  static constexpr int64_t kBytes = 16;
  const int8_t *t;
  const float *scale;   // the panel's 16
  void Prefetch(int64_t k) const {
    if ((k & 3) == 0) __builtin_prefetch(t + (k + kPrefetchTileBytes / kBytes) * kTileCols);
  }
  void Get(int64_t k, V8 &lo, V8 &hi) const {
    lo = FromI8(t + k * kTileCols);
    hi = FromI8(t + k * kTileCols + 8);
  }
  void Finish(V8 &lo, V8 &hi) const {
    lo = Mul(lo, Load(scale));
    hi = Mul(hi, Load(scale + 8));
  }
#if defined(__AVX2__) && defined(__FMA__)
  __attribute__((target("avx512f"))) __m512 Get16(int64_t k) const {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(t + k * 16))));
  }
  __attribute__((target("avx512f"))) void Finish16(__m512 &sums) const {
    sums = _mm512_mul_ps(sums, _mm512_loadu_ps(scale));
  }
#endif
};

#if defined(__AVX2__) && defined(__FMA__)
// 16 float16s (their bits) as floats in one AVX-512 register.
__attribute__((target("avx512f"))) inline __m512 Half16(const uint16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}
#endif

struct I4Panel {      // 4-bit, dequantised as read: u * scale + min of the row's group of k
  static constexpr int64_t kBytes = 8;
  const uint8_t *t;           // per pair of steps of k 16 bytes: the even step's u in the low nibbles
  const uint16_t *scale, *min;   // the panel's (G, 16), float16 bits; no min: symmetric, min = -8 scale
  int64_t group;
  int shift;                  // log2(group) when a power of two, else -1
  int64_t Group(int64_t k) const { return (shift >= 0 ? k >> shift : k / group) * kTileCols; }
  void Prefetch(int64_t k) const {
    if ((k & 7) == 0) __builtin_prefetch(t + (k + kPrefetchTileBytes / kBytes) * kBytes);
  }
  // the values of step k + c as stored (k even, c 0 or 1)
  void Stored(int64_t k, int c, V8 &lo, V8 &hi) const { FromNibbles(t + (k >> 1) * 16, 4 * c, lo, hi); }
  void Get(int64_t k, V8 &lo, V8 &hi) const {
    const int64_t g = Group(k);
    FromNibbles(t + (k >> 1) * 16, static_cast<int>(k & 1) * 4, lo, hi);
    const V8 s0 = LoadHalf(scale + g), s1 = LoadHalf(scale + g + 8);
    lo = Fma(lo, s0, min ? LoadHalf(min + g) : Mul(s0, Bcast(-8.0f)));
    hi = Fma(hi, s1, min ? LoadHalf(min + g + 8) : Mul(s1, Bcast(-8.0f)));
  }
  void Finish(V8 &, V8 &) const {}
#if defined(__AVX2__) && defined(__FMA__)
  __attribute__((target("avx512f"))) __m512 Get16(int64_t k) const {
    const int64_t g = Group(k);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(t + (k >> 1) * 16));
    const __m128i u = _mm_and_si128(_mm_srl_epi16(b, _mm_cvtsi32_si128(static_cast<int>(k & 1) * 4)),
                                    _mm_set1_epi8(0x0F));
    const __m512 s = Half16(scale + g);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(u)), s,
                           min ? Half16(min + g) : _mm512_mul_ps(s, _mm512_set1_ps(-8.0f)));
  }
  __attribute__((target("avx512f"))) void Finish16(__m512 &) const {}
  // steps k .. k + 3 as stored (k a multiple of 4), a step's 16 values a register: two 16-byte loads widened
  __attribute__((target("avx512f"))) void Stored4(int64_t k, __m512 *w) const {
    const __m512i mask = _mm512_set1_epi32(0x0F);
    for (int h = 0; h < 2; ++h) {
      const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(t + (k + 2 * h) * 8)));
      w[2 * h] = _mm512_cvtepi32_ps(_mm512_and_si512(b, mask));
      w[2 * h + 1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
    }
  }
#endif
};

struct I8GroupPanel {   // int8 converted, times its group's scale as read
  static constexpr int64_t kBytes = 16;
  const int8_t *t;
  const uint16_t *scale;   // the panel's (G, 16), float16 bits
  int64_t group;
  int shift;               // log2(group) when a power of two, else -1
  int64_t Group(int64_t k) const { return (shift >= 0 ? k >> shift : k / group) * kTileCols; }
  void Prefetch(int64_t k) const {
    if ((k & 3) == 0) __builtin_prefetch(t + (k + kPrefetchTileBytes / kBytes) * kTileCols);
  }
  // the values of step k + c as stored
  void Stored(int64_t k, int c, V8 &lo, V8 &hi) const {
    lo = FromI8(t + (k + c) * kTileCols);
    hi = FromI8(t + (k + c) * kTileCols + 8);
  }
  void Get(int64_t k, V8 &lo, V8 &hi) const {
    const int64_t g = Group(k);
    Stored(k, 0, lo, hi);
    lo = Mul(lo, LoadHalf(scale + g));
    hi = Mul(hi, LoadHalf(scale + g + 8));
  }
  void Finish(V8 &, V8 &) const {}
#if defined(__AVX2__) && defined(__FMA__)
  __attribute__((target("avx512f"))) __m512 Get16(int64_t k) const {
    const __m512 q =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(t + k * 16))));
    return _mm512_mul_ps(q, Half16(scale + Group(k)));
  }
  __attribute__((target("avx512f"))) void Finish16(__m512 &) const {}
  // steps k .. k + 3 as stored, a step's 16 values a register
  __attribute__((target("avx512f"))) void Stored4(int64_t k, __m512 *w) const {
    for (int i = 0; i < 4; ++i)
      w[i] = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(t + (k + i) * kTileCols))));
  }
#endif
};

// The stored panel of columns [n, n + 16).
F32Panel PanelAt(const LinearArgs &a, int64_t n, const float *) { return {static_cast<const float *>(a.w) + n * a.K}; }
I8Panel PanelAt(const LinearArgs &a, int64_t n, const int8_t *) {
  return {static_cast<const int8_t *>(a.w) + n * a.K, a.scale + n};
}
struct Int8Groups {};     // PanelRange's element type for kI8Group
I8GroupPanel PanelAt(const LinearArgs &a, int64_t n, const Int8Groups *) {
  return {static_cast<const int8_t *>(a.w) + n * a.K, a.scale16 + n * a.G, a.group,
          a.group_shift >= 0 ? a.group_shift + 5 : -1};
}
I4Panel PanelAt(const LinearArgs &a, int64_t n, const uint8_t *) {
  return {static_cast<const uint8_t *>(a.w) + n * a.K / 2, a.scale16 + n * a.G, a.min16 ? a.min16 + n * a.G : nullptr,
          a.group,
          a.group_shift >= 0 ? a.group_shift + 5 : -1};
}

}  // namespace
}  // namespace LK_NS
}  // namespace lk
