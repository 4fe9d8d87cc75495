// The 8-float vector type the kernels' loops are written over (linear_math.cc, attention_math.cc): AVX2 + FMA
// registers when compiled with -mavx2 -mfma -mf16c (namespace lk::avx2), plain arrays the compiler vectorises as it
// can otherwise (lk::generic). LK_NS names the namespace; each file that includes this is compiled twice.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernel_support.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#ifndef LK_NS
#error "compile with -DLK_NS=avx2 or -DLK_NS=generic"
#endif

namespace lk {
namespace LK_NS {
namespace {
#if defined(__AVX2__) && defined(__FMA__)
struct V8 {
  __m256 v;
};
inline V8 Zero() { return {_mm256_setzero_ps()}; }
inline V8 Load(const float *p) { return {_mm256_loadu_ps(p)}; }
inline V8 Bcast(float f) { return {_mm256_set1_ps(f)}; }
inline V8 Fma(V8 a, V8 b, V8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline V8 Add(V8 a, V8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline void Store(float *p, V8 a) { _mm256_storeu_ps(p, a.v); }
inline V8 Sub(V8 a, V8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline V8 Mul(V8 a, V8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline V8 Max(V8 a, V8 b) { return {_mm256_max_ps(a.v, b.v)}; }
inline V8 Div(V8 a, V8 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline V8 NegAbs(V8 a) { return {_mm256_or_ps(a.v, _mm256_set1_ps(-0.0f))}; }   // -|a|
// a where z >= 0, else b
inline V8 SelectNonNegative(V8 z, V8 a, V8 b) {
  return {_mm256_blendv_ps(b.v, a.v, _mm256_cmp_ps(z.v, _mm256_setzero_ps(), _CMP_GE_OQ))};
}
// base[index[i]] where index[i] (a whole number as a float) >= 0, else 0
inline V8 GatherOrZero(const float *base, const float *index) {
  const __m256 at = _mm256_loadu_ps(index);
  const __m256 valid = _mm256_cmp_ps(at, _mm256_setzero_ps(), _CMP_GE_OQ);
  return {_mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, _mm256_cvttps_epi32(at), valid, 4)};
}
inline float Hmax(V8 a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
// e^x for x <= 0 (softmax terms; below -87 it gives 0): x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-6
// polynomial (relative error about 2e-7), times 2^n through the exponent bits.
inline V8 Exp(V8 a) {
  const __m256 x = _mm256_max_ps(a.v, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return {_mm256_mul_ps(p, _mm256_castsi256_ps(e))};
}
inline float Hsum(V8 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
// 8 float16s (their bits) as floats: F16C, which every AVX2 CPU has (the avx2 build is compiled with -mf16c).
inline V8 LoadHalf(const uint16_t *p) { return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)))}; }
inline V8 FromI8(const int8_t *p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))};
}
// 16 bytes -> the 32 nibble values of one run: u[0] weights 0-7, u[1] 8-15, u[2] 16-23, u[3] 24-31.
inline void FromU4(const uint8_t *p, V8 u[4]) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
  __m128i lo = _mm_and_si128(b, mask);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  u[0].v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  u[1].v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  u[2].v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  u[3].v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}
// 16 bytes of 4-bit values -> the nibbles at bit `shift` (0 or 4) of bytes 0-7 (lo) and 8-15 (hi) as floats.
inline void FromNibbles(const uint8_t *p, int shift, V8 &lo, V8 &hi) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
  const __m128i u = _mm_and_si128(_mm_srl_epi16(b, _mm_cvtsi32_si128(shift)), _mm_set1_epi8(0x0F));
  lo.v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(u));
  hi.v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(u, 8)));
}
// r[i] (row i, 8 values along k) -> r[i] (k = i, the 8 rows' values).
inline void Transpose8(V8 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i].v, r[i + 1].v);
    t[i + 1] = _mm256_unpackhi_ps(r[i].v, r[i + 1].v);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i].v = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4].v = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#else
struct V8 {
  float f[8];
};
inline V8 Zero() { return V8{}; }
inline V8 Load(const float *p) {
  V8 r;
  std::memcpy(r.f, p, sizeof(r.f));
  return r;
}
inline V8 Bcast(float f) {
  V8 r;
  for (int i = 0; i < 8; ++i) r.f[i] = f;
  return r;
}
inline V8 Fma(V8 a, V8 b, V8 c) {
  for (int i = 0; i < 8; ++i) c.f[i] += a.f[i] * b.f[i];
  return c;
}
inline V8 Add(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.f[i] += b.f[i];
  return a;
}
inline void Store(float *p, V8 a) { std::memcpy(p, a.f, sizeof(a.f)); }
inline V8 Sub(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.f[i] -= b.f[i];
  return a;
}
inline V8 Mul(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.f[i] *= b.f[i];
  return a;
}
inline V8 Max(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i];
  return a;
}
inline V8 Div(V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.f[i] /= b.f[i];
  return a;
}
inline V8 NegAbs(V8 a) {
  for (int i = 0; i < 8; ++i) a.f[i] = -std::fabs(a.f[i]);
  return a;
}
inline V8 SelectNonNegative(V8 z, V8 a, V8 b) {
  for (int i = 0; i < 8; ++i) a.f[i] = z.f[i] >= 0.0f ? a.f[i] : b.f[i];
  return a;
}
inline V8 GatherOrZero(const float *base, const float *index) {
  V8 r;
  for (int i = 0; i < 8; ++i) r.f[i] = index[i] >= 0.0f ? base[static_cast<int64_t>(index[i])] : 0.0f;
  return r;
}
inline float Hmax(V8 a) {
  float m = a.f[0];
  for (int i = 1; i < 8; ++i) m = a.f[i] > m ? a.f[i] : m;
  return m;
}
inline V8 Exp(V8 a) {
  for (int i = 0; i < 8; ++i) a.f[i] = std::exp(a.f[i]);
  return a;
}
inline float Hsum(V8 a) {
  return ((a.f[0] + a.f[4]) + (a.f[1] + a.f[5])) + ((a.f[2] + a.f[6]) + (a.f[3] + a.f[7]));
}
inline V8 LoadHalf(const uint16_t *p) {
  V8 r;
  for (int i = 0; i < 8; ++i) r.f[i] = HalfToFloat(p[i]);
  return r;
}
inline V8 FromI8(const int8_t *p) {
  V8 r;
  for (int i = 0; i < 8; ++i) r.f[i] = static_cast<float>(p[i]);
  return r;
}
inline void FromU4(const uint8_t *p, V8 u[4]) {
  for (int i = 0; i < 8; ++i) {
    u[0].f[i] = static_cast<float>(p[i] & 15);
    u[1].f[i] = static_cast<float>(p[8 + i] & 15);
    u[2].f[i] = static_cast<float>(p[i] >> 4);
    u[3].f[i] = static_cast<float>(p[8 + i] >> 4);
  }
}
inline void FromNibbles(const uint8_t *p, int shift, V8 &lo, V8 &hi) {
  for (int i = 0; i < 8; ++i) {
    lo.f[i] = static_cast<float>((p[i] >> shift) & 15);
    hi.f[i] = static_cast<float>((p[8 + i] >> shift) & 15);
  }
}
inline void Transpose8(V8 r[8]) {
  V8 t[8];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) t[j].f[i] = r[i].f[j];
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}
#endif

}  // namespace
}  // namespace LK_NS
}  // namespace lk
