// The loops of the weight-only matrix products (linear_math.h), written once over an 8-float vector
// type: AVX2 + FMA registers when compiled with -mavx2 -mfma -mf16c (namespace lk::avx2), plain arrays the
// compiler vectorises as it can otherwise (lk::generic; vec8.h).
//
// float32 (kF32P16), int8 (kI8) and int4 (kI4Min) weights are stored as the tiles of a float GEMM, panels of 16
// rows of W transposed to (K, 16), and every M runs that GEMM straight from the stored panels, which it asks
// the cache for ahead of use: each x[m, k] broadcast against a panel row (int8 and int4 converted to floats as
// they are loaded: int8's rows' scales applied to the sums, int4 dequantised), 6 x 16 register blocks, 12 x 32
// (two panels at a time) on AVX-512 registers where the CPU has them (args.wide). At one or two rows of X the
// sums run in several chains along k, so that the loop waits on loads rather than on each FMA's latency, and
// int4 and grouped int8 take loops of their own (Decode: scales once a group). The panels are read where the
// model holds them, 4-byte aligned: an aligned copy raised the load's peak RSS for no speed
// (docs/measured-choices.md, as for the other measured choices below).
// float32 stored by rows (kF32) up to 16 rows of X takes dot products against one row of W at a time, more
// rows dequantise 16 rows of W into a tile transposed to (K, 16) (8 x 8 blocks transposed in registers; the
// tile 64-byte aligned by the caller), which runs the same GEMM; so do the last N % 16 rows of the panel
// layouts, stored whole.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "linear_math.h"
#include "vec8.h"

namespace lk {
namespace LK_NS {
namespace {

constexpr int64_t kRowsPerPass = 64;   // rows of X per pass over a packed tile
constexpr int64_t kDotRows = 16;       // up to this M, dot products over rows of W (faster than the
                                       // transposed tile at few rows, slower at many)

// MB rows of X against one row of W, read front to back; U sums a row of X, so that MB * U chains of FMAs
// are in flight (rather than four rows of W against pairs of rows of X: slower at M 8).
template <int MB, int U>
inline void RowF32(const float *x, int64_t ldx, const float *w, int64_t K, float *y, int64_t ldy) {
  V8 acc[MB][U];
  for (int m = 0; m < MB; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = Zero();
  const int64_t step = 8 * U, KU = K / step * step, K8 = K & ~int64_t(7);
  int64_t k = 0;
  for (; k < KU; k += step)
    for (int u = 0; u < U; ++u) {
      const V8 wv = Load(w + k + 8 * u);
      for (int m = 0; m < MB; ++m) acc[m][u] = Fma(Load(x + m * ldx + k + 8 * u), wv, acc[m][u]);
    }
  for (; k < K8; k += 8) {
    const V8 wv = Load(w + k);
    for (int m = 0; m < MB; ++m) acc[m][0] = Fma(Load(x + m * ldx + k), wv, acc[m][0]);
  }
  for (int m = 0; m < MB; ++m) {
    V8 sum = acc[m][0];
    for (int u = 1; u < U; ++u) sum = Add(sum, acc[m][u]);
    float s = Hsum(sum);
    for (int64_t r = K8; r < K; ++r) s += x[m * ldx + r] * w[r];
    y[m * ldy] = s;
  }
}

// All `rows` rows of X against one row of W: 8 rows of X at a time, then 4, 2, 1.
inline void RowsF32(const float *x, int64_t ldx, int64_t rows, const float *w, int64_t K, float *y, int64_t ldy) {
  int64_t m = 0;
  for (; m + 8 <= rows; m += 8) RowF32<8, 1>(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
  if (m + 4 <= rows) RowF32<4, 1>(x + m * ldx, ldx, w, K, y + m * ldy, ldy), m += 4;
  if (m + 2 <= rows) RowF32<2, 2>(x + m * ldx, ldx, w, K, y + m * ldy, ldy), m += 2;
  if (m < rows) RowF32<1, 4>(x + m * ldx, ldx, w, K, y + m * ldy, ldy);
}

// Rows [n, n + nb) of W (nb <= kTileCols), dequantized, transposed into tile[k * kTileCols + j]; the
// columns past nb are zeros.
void PackTile(const LinearArgs &a, int64_t n, int64_t nb, float *tile) {
  if (nb < kTileCols) std::memset(tile, 0, sizeof(float) * kTileCols * a.K);
  int64_t j = 0;
  if (a.kind == kF32 || a.kind == kF32P16 || a.kind == kI8) {     // kF32P16, kI8: their rows stored whole
    const float *wf = static_cast<const float *>(a.w);
    const int8_t *wq = static_cast<const int8_t *>(a.w);
    auto run = [&](int64_t r, int64_t k) {     // row r's 8 weights from k
      return a.kind != kI8 ? Load(wf + r * a.K + k) : Mul(FromI8(wq + r * a.K + k), Bcast(a.scale[r]));
    };
    auto one = [&](int64_t r, int64_t k) {
      return a.kind != kI8 ? wf[r * a.K + k] : a.scale[r] * static_cast<float>(wq[r * a.K + k]);
    };
    const int64_t K8 = a.K & ~int64_t(7);
    for (; j + 8 <= nb; j += 8) {     // 8 rows x 8 weights at a time, transposed in registers
      for (int64_t k = 0; k < K8; k += 8) {
        V8 r[8];
        for (int i = 0; i < 8; ++i) r[i] = run(n + j + i, k);
        Transpose8(r);
        for (int i = 0; i < 8; ++i) Store(tile + (k + i) * kTileCols + j, r[i]);
      }
      for (int64_t k = K8; k < a.K; ++k)
        for (int64_t i = 0; i < 8; ++i) tile[k * kTileCols + j + i] = one(n + j + i, k);
    }
    for (; j < nb; ++j)
      for (int64_t k = 0; k < a.K; ++k) tile[k * kTileCols + j] = one(n + j, k);
    return;
  }
  if (a.kind == kI8Group) {     // its rows stored whole, a float16 scale per group
    const int8_t *wq = static_cast<const int8_t *>(a.w);
    for (; j < nb; ++j)
      for (int64_t k = 0; k < a.K; ++k)
        tile[k * kTileCols + j] = HalfToFloat(a.scale16[(n + j) * a.G + k / a.group]) *
                                  static_cast<float>(wq[(n + j) * a.K + k]);
    return;
  }
  const uint8_t *w = static_cast<const uint8_t *>(a.w);     // kI4Min: its rows stored whole
  auto run32 = [&](int64_t r, int64_t run, V8 u[4]) {   // row r's run of 32 weights, dequantized
    const int64_t g = run * 32 / a.group;
    const float scale = HalfToFloat(a.scale16[r * a.G + g]);
    const V8 sv = Bcast(scale), off = Bcast(a.min16 ? HalfToFloat(a.min16[r * a.G + g]) : -8.0f * scale);
    FromU4(w + r * (a.K / 2) + run * 16, u);
    for (int i = 0; i < 4; ++i) u[i] = Fma(u[i], sv, off);
  };
  for (; j + 8 <= nb; j += 8)
    for (int64_t run = 0; run < a.K / 32; ++run) {
      V8 u[8][4];
      for (int i = 0; i < 8; ++i) run32(n + j + i, run, u[i]);
      for (int part = 0; part < 4; ++part) {
        V8 r[8];
        for (int i = 0; i < 8; ++i) r[i] = u[i][part];
        Transpose8(r);
        for (int i = 0; i < 8; ++i) Store(tile + (run * 32 + part * 8 + i) * kTileCols + j, r[i]);
      }
    }
  float row[32];
  for (; j < nb; ++j)
    for (int64_t run = 0; run < a.K / 32; ++run) {
      V8 u[4];
      run32(n + j, run, u);
      for (int i = 0; i < 4; ++i) Store(row + 8 * i, u[i]);
      for (int i = 0; i < 32; ++i) tile[(run * 32 + i) * kTileCols + j] = row[i];
    }
}

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

// Chains of sums along k per row of X (k by turns, added at the end): one chain a row at M 1 would wait on
// each FMA's latency.
template <int MB>
constexpr int Chains() { return MB == 1 ? 4 : MB == 2 ? 2 : 1; }

// One step of k of GemmTile into one chain of sums (inlined, or the sums leave the registers).
template <int MB, bool Ahead, typename P>
__attribute__((always_inline)) inline void TileStep(const float *x, int64_t ldx, const P &panel, int64_t k,
                                                    V8 (&sums)[MB][2]) {
  if (Ahead) panel.Prefetch(k);
  V8 w0, w1;
  panel.Get(k, w0, w1);
  for (int m = 0; m < MB; ++m) {
    const V8 xb = Bcast(x[m * ldx + k]);
    sums[m][0] = Fma(xb, w0, sums[m][0]);
    sums[m][1] = Fma(xb, w1, sums[m][1]);
  }
}

// MB rows of X against a panel: each x[m, k] broadcast over kTileCols columns (2 x MB registers of sums a
// chain), the register block of a float GEMM; nb columns stored. `Ahead`: the panel streams from memory.
template <int MB, bool Ahead, typename P>
inline void GemmTile(const float *x, int64_t ldx, const P &panel, int64_t K, float *y, int64_t ldy, int64_t nb) {
  constexpr int U = Chains<MB>();
  V8 acc[U][MB][2];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MB; ++m) acc[u][m][0] = acc[u][m][1] = Zero();
  const int64_t KU = K / U * U;
  int64_t k = 0;
  for (; k < KU; k += U)
    for (int u = 0; u < U; ++u) TileStep<MB, Ahead>(x, ldx, panel, k + u, acc[u]);
  for (; k < K; ++k) TileStep<MB, Ahead>(x, ldx, panel, k, acc[0]);
  for (int m = 0; m < MB; ++m) {
    V8 lo = acc[0][m][0], hi = acc[0][m][1];
    for (int u = 1; u < U; ++u) lo = Add(lo, acc[u][m][0]), hi = Add(hi, acc[u][m][1]);
    panel.Finish(lo, hi);
    if (nb == kTileCols) {
      Store(y + m * ldy, lo);
      Store(y + m * ldy + 8, hi);
    } else {
      float out[kTileCols];
      Store(out, lo);
      Store(out + 8, hi);
      std::memcpy(y + m * ldy, out, sizeof(float) * nb);
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// With AVX-512 (args.wide; only the GEMM uses it) a panel row of kTileCols is one register.

// One panel, MB rows of X: MB registers of sums a chain (up to 12 of the 32), a load and MB broadcasts a step
// of k; nb columns stored.
template <int MB, typename P>
__attribute__((target("avx512f"))) inline void GemmTile16(const float *x, int64_t ldx, const P &panel, int64_t K,
                                                          float *y, int64_t ldy, int64_t nb) {
  constexpr int U = Chains<MB>();
  __m512 acc[U][MB];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MB; ++m) acc[u][m] = _mm512_setzero_ps();
  const int64_t KU = K / U * U;
  int64_t k = 0;
  for (; k < KU; k += U)
    for (int u = 0; u < U; ++u) {
      const __m512 w = panel.Get16(k + u);
      for (int m = 0; m < MB; ++m) acc[u][m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k + u]), w, acc[u][m]);
    }
  for (; k < K; ++k) {
    const __m512 w = panel.Get16(k);
    for (int m = 0; m < MB; ++m) acc[0][m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k]), w, acc[0][m]);
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << nb) - 1);
  for (int m = 0; m < MB; ++m) {
    for (int u = 1; u < U; ++u) acc[0][m] = _mm512_add_ps(acc[0][m], acc[u][m]);
    panel.Finish16(acc[0][m]);
    _mm512_mask_storeu_ps(y + m * ldy, keep, acc[0][m]);
  }
}

// One step of k of GemmPair16 into one chain of sums.
template <int MB, bool Ahead, typename P>
__attribute__((target("avx512f"), always_inline)) inline void PairStep(const float *x, int64_t ldx, const P &p0,
                                                                       const P &p1, int64_t k,
                                                                       __m512 (&sums)[MB][2]) {
  if (Ahead) {
    p0.Prefetch(k);
    p1.Prefetch(k);
  }
  const __m512 w0 = p0.Get16(k), w1 = p1.Get16(k);
  for (int m = 0; m < MB; ++m) {
    const __m512 b = _mm512_set1_ps(x[m * ldx + k]);
    sums[m][0] = _mm512_fmadd_ps(b, w0, sums[m][0]);
    sums[m][1] = _mm512_fmadd_ps(b, w1, sums[m][1]);
  }
}

// Two stored panels side by side (32 columns): MB rows of X take 2 x MB registers of sums a chain (up to 24
// of the 32), two loads and MB broadcasts a step of k, so that the products, not the loads, bound the loop.
// `Ahead`: the panels stream from memory.
template <int MB, bool Ahead, typename P>
__attribute__((target("avx512f"))) inline void GemmPair16(const float *x, int64_t ldx, const P &p0, const P &p1,
                                                          int64_t K, float *y, int64_t ldy) {
  constexpr int U = Chains<MB>();
  __m512 acc[U][MB][2];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MB; ++m) acc[u][m][0] = acc[u][m][1] = _mm512_setzero_ps();
  const int64_t KU = K / U * U;
  int64_t k = 0;
  for (; k < KU; k += U)
    for (int u = 0; u < U; ++u) PairStep<MB, Ahead>(x, ldx, p0, p1, k + u, acc[u]);
  for (; k < K; ++k) PairStep<MB, Ahead>(x, ldx, p0, p1, k, acc[0]);
  for (int m = 0; m < MB; ++m)
    for (int h = 0; h < 2; ++h) {
      for (int u = 1; u < U; ++u) acc[0][m][h] = _mm512_add_ps(acc[0][m][h], acc[u][m][h]);
      (h ? p1 : p0).Finish16(acc[0][m][h]);
      _mm512_storeu_ps(y + m * ldy + h * kTileCols, acc[0][m][h]);
    }
}

template <bool Ahead, typename P>
__attribute__((target("avx512f"))) void GemmPairRows(const float *x, int64_t ldx, int64_t rows, const P &p0,
                                                     const P &p1, int64_t K, float *y, int64_t ldy) {
  int64_t m = 0;
  for (; m + 12 <= rows; m += 12) GemmPair16<12, Ahead>(x + m * ldx, ldx, p0, p1, K, y + m * ldy, ldy);
  if (m + 8 <= rows) GemmPair16<8, Ahead>(x + m * ldx, ldx, p0, p1, K, y + m * ldy, ldy), m += 8;
  if (m + 4 <= rows) GemmPair16<4, Ahead>(x + m * ldx, ldx, p0, p1, K, y + m * ldy, ldy), m += 4;
  if (m + 2 <= rows) GemmPair16<2, Ahead>(x + m * ldx, ldx, p0, p1, K, y + m * ldy, ldy), m += 2;
  if (m < rows) GemmPair16<1, Ahead>(x + m * ldx, ldx, p0, p1, K, y + m * ldy, ldy);
}

template <typename P>
__attribute__((target("avx512f"))) void GemmRows16(const float *x, int64_t ldx, int64_t rows, const P &panel,
                                                   int64_t K, float *y, int64_t ldy, int64_t nb) {
  int64_t m = 0;
  for (; m + 12 <= rows; m += 12) GemmTile16<12>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb);
  if (m + 8 <= rows) GemmTile16<8>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb), m += 8;
  if (m + 4 <= rows) GemmTile16<4>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb), m += 4;
  if (m + 2 <= rows) GemmTile16<2>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb), m += 2;
  if (m < rows) GemmTile16<1>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb);
}

// A stored panel dequantised into `out` (kTileCols x K floats, 64-byte aligned), the float32 panel layout.
template <typename P>
__attribute__((target("avx512f"))) void StageWide(const P &panel, int64_t K, float *out) {
  for (int64_t k = 0; k < K; ++k) {
    __m512 w = panel.Get16(k);
    panel.Finish16(w);
    _mm512_store_ps(out + k * kTileCols, w);
  }
}
#endif

template <bool Ahead, typename P>
void GemmRows(const float *x, int64_t ldx, int64_t rows, const P &panel, int64_t K, float *y, int64_t ldy,
              int64_t nb) {
  int64_t m = 0;
  for (; m + 6 <= rows; m += 6) GemmTile<6, Ahead>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb);
  switch (rows - m) {
    case 5: return GemmTile<5, Ahead>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb);
    case 4: return GemmTile<4, Ahead>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb);
    case 3: return GemmTile<3, Ahead>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb);
    case 2: return GemmTile<2, Ahead>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb);
    case 1: return GemmTile<1, Ahead>(x + m * ldx, ldx, panel, K, y + m * ldy, ldy, nb);
    default: return;
  }
}

// Every pass of kRowsPerPass rows of X over one panel (columns [n, n + nb)); `ahead`: a stored panel, which
// the first pass streams from memory.
template <typename P>
void PanelPasses(const LinearArgs &a, const P &panel, int64_t n, int64_t nb, bool ahead) {
  for (int64_t m = 0; m < a.M; m += kRowsPerPass) {
    const int64_t rows = std::min(kRowsPerPass, a.M - m);
    const float *x = a.x + m * a.ldx;
    float *y = a.y + m * a.N + n;
#if defined(__AVX2__) && defined(__FMA__)
    if (a.wide) {
      GemmRows16(x, a.ldx, rows, panel, a.K, y, a.N, nb);
      continue;
    }
#endif
    if (ahead && m == 0) GemmRows<true>(x, a.ldx, rows, panel, a.K, y, a.N, nb);
    else GemmRows<false>(x, a.ldx, rows, panel, a.K, y, a.N, nb);
  }
}

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

// int4 or grouped int8 panels at one or two rows of X (decode): per group of k the products with the values
// as stored (P::Stored), in two chains (even and odd steps of k), then times the group's scales, plus for int4
// its mins times the group's sums of x (a.xsum): no dequantising FMA or scale loads a step of k, as the GEMM's
// rows have.
template <int MB, typename P>
void Decode(const LinearArgs &a, const P &p, int64_t n) {
  const float *x = a.x;
  V8 acc[MB][2];
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = Zero();
  for (int64_t g = 0; g < a.G; ++g) {
    const int64_t k0 = g * a.group, k1 = std::min(k0 + a.group, a.K);
    V8 sums[2][MB][2];
    for (int c = 0; c < 2; ++c)
      for (int m = 0; m < MB; ++m) sums[c][m][0] = sums[c][m][1] = Zero();
    for (int64_t k = k0; k < k1; k += 2) {      // groups are whole runs of 32
      p.Prefetch(k);
      for (int c = 0; c < 2; ++c) {
        V8 lo, hi;
        p.Stored(k, c, lo, hi);
        for (int m = 0; m < MB; ++m) {
          const V8 xb = Bcast(x[m * a.ldx + k + c]);
          sums[c][m][0] = Fma(xb, lo, sums[c][m][0]);
          sums[c][m][1] = Fma(xb, hi, sums[c][m][1]);
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const V8 scale = LoadHalf(p.scale + g * kTileCols + 8 * h);
      for (int m = 0; m < MB; ++m) acc[m][h] = Fma(Add(sums[0][m][h], sums[1][m][h]), scale, acc[m][h]);
      if constexpr (std::is_same<P, I4Panel>::value) {
        const V8 min = p.min ? LoadHalf(p.min + g * kTileCols + 8 * h) : Mul(scale, Bcast(-8.0f));
        for (int m = 0; m < MB; ++m) acc[m][h] = Fma(Bcast(a.xsum[m * a.G + g]), min, acc[m][h]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) {
    Store(a.y + m * a.N + n, acc[m][0]);
    Store(a.y + m * a.N + n + 8, acc[m][1]);
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// Decode on AVX-512 registers for MB rows of X from row m0: a step of k's 16 values one register (P::Stored4).
// Chains of sums a row: four at one row (steps k .. k + 3 by turns), two at two (even and odd steps), one from
// three (enough sums in flight, and 2 x MB registers).
template <int MB, typename P>
__attribute__((target("avx512f"))) void DecodeWide(const LinearArgs &a, const P &p, int64_t n, int64_t m0) {
  constexpr int C = MB == 1 ? 4 : MB == 2 ? 2 : 1;
  const float *x = a.x + m0 * a.ldx;
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < a.G; ++g) {
    const int64_t k0 = g * a.group, k1 = std::min(k0 + a.group, a.K);
    __m512 sums[C][MB];
    for (int c = 0; c < C; ++c)
      for (int m = 0; m < MB; ++m) sums[c][m] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 4) {      // groups are whole runs of 32
      p.Prefetch(k);
      __m512 w[4];
      p.Stored4(k, w);
      for (int i = 0; i < 4; ++i)
        for (int m = 0; m < MB; ++m)
          sums[i % C][m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * a.ldx + k + i]), w[i], sums[i % C][m]);
    }
    const __m512 scale = Half16(p.scale + g * kTileCols);
    for (int m = 0; m < MB; ++m) {
      __m512 s = sums[0][m];
      for (int c = 1; c < C; ++c) s = _mm512_add_ps(s, sums[c][m]);
      acc[m] = _mm512_fmadd_ps(s, scale, acc[m]);
    }
    if constexpr (std::is_same<P, I4Panel>::value) {    // its mins times the group's sums of x
      const __m512 min = p.min ? Half16(p.min + g * kTileCols) : _mm512_mul_ps(scale, _mm512_set1_ps(-8.0f));
      for (int m = 0; m < MB; ++m) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(a.xsum[(m0 + m) * a.G + g]), min, acc[m]);
    }
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(a.y + (m0 + m) * a.N + n, acc[m]);
}

#endif

// Grouped int8 panels take their decode loop up to kDecodeRowsI8Group rows on AVX-512 (2 on AVX2), the GEMM
// dequantising as it reads up to kStagedRowsI8Group, past it the GEMM on panels dequantised once a call, as
// int4's are (PanelRange): each the fastest in its range (tools/bench_kernels.py).
constexpr int64_t kDecodeRowsI8Group = 8, kStagedRowsI8Group = 40;

#if defined(__AVX2__) && defined(__FMA__)
// Every row of X against one panel (int4's or grouped int8's), twelve rows at a time (24 of the 32 registers).
template <typename P>
__attribute__((target("avx512f"))) void DecodeWideRows(const LinearArgs &a, const P &p, int64_t n) {
  int64_t m = 0;
  for (; m + 12 <= a.M; m += 12) DecodeWide<12>(a, p, n, m);
  if (m + 8 <= a.M) DecodeWide<8>(a, p, n, m), m += 8;
  switch (a.M - m) {
    case 7: return DecodeWide<7>(a, p, n, m);
    case 6: return DecodeWide<6>(a, p, n, m);
    case 5: return DecodeWide<5>(a, p, n, m);
    case 4: return DecodeWide<4>(a, p, n, m);
    case 3: return DecodeWide<3>(a, p, n, m);
    case 2: return DecodeWide<2>(a, p, n, m);
    case 1: return DecodeWide<1>(a, p, n, m);
    default: return;
  }
}
#endif

// int4 (T uint8_t) or grouped int8 (T Int8Groups) panels [n0, n1) (no rows stored whole) in their decode loops,
// for up to kDecodeRowsI4 or kDecodeRowsI8Group rows of X on AVX-512, 2 on AVX2.
template <typename T>
void DecodeRange(const LinearArgs &a, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n += kTileCols) {
    const auto p = PanelAt(a, n, static_cast<const T *>(nullptr));
#if defined(__AVX2__) && defined(__FMA__)
    if (a.wide) {
      DecodeWideRows(a, p, n);
      continue;
    }
#endif
    if (a.M == 2) Decode<2>(a, p, n); else Decode<1>(a, p, n);
  }
}

// Up to this M int8 and int4 panels are read one at a time on AVX-512 too, not in pairs: two int8 streams at
// 16 bytes a step of k each left the hardware's prefetch behind, software prefetch or not.
constexpr int64_t kSinglePanelRows = 4;

#if defined(__AVX2__) && defined(__FMA__)
// Every pass of kRowsPerPass rows of X over two panels side by side (columns [n, n + 32)); `ahead`: stored
// panels, which the first pass streams from memory.
template <typename P>
__attribute__((target("avx512f"))) void PairPasses(const LinearArgs &a, const P &p0, const P &p1, int64_t n,
                                                   bool ahead) {
  for (int64_t m = 0; m < a.M; m += kRowsPerPass) {
    const int64_t rows = std::min(kRowsPerPass, a.M - m);
    if (ahead && m == 0) GemmPairRows<true>(a.x, a.ldx, rows, p0, p1, a.K, a.y + n, a.N);
    else GemmPairRows<false>(a.x + m * a.ldx, a.ldx, rows, p0, p1, a.K, a.y + m * a.N + n, a.N);
  }
}
#endif

// Y's columns [n0, n1) panel by panel: the stored panels of the panel layouts (T their element type) as they
// are, other rows of W dequantised into `scratch` (2 x kTileCols x K floats) first.
template <typename T>
void PanelRange(const LinearArgs &a, int64_t n0, int64_t n1, float *scratch) {
  const int64_t panels_end = a.kind == kF32 ? 0 : a.N / kTileCols * kTileCols;
  if (a.kind == kI4Min && a.M <= (a.wide ? kDecodeRowsI4 : 2) && n0 < panels_end) {
    DecodeRange<uint8_t>(a, n0, std::min(n1, panels_end));
    n0 = std::min(n1, panels_end);
  }
  if (a.kind == kI8Group && a.M <= (a.wide ? kDecodeRowsI8Group : 2) && n0 < panels_end) {
    DecodeRange<Int8Groups>(a, n0, std::min(n1, panels_end));
    n0 = std::min(n1, panels_end);
  }
  for (int64_t n = n0; n < n1; n += kTileCols) {
    const int64_t nb = std::min(kTileCols, n1 - n);
    if (n + kTileCols > panels_end) {     // n0 is on a panel's start
      PackTile(a, n, nb, scratch);
      PanelPasses(a, F32Panel{scratch}, n, nb, false);
      continue;
    }
    const auto panel = PanelAt(a, n, static_cast<const T *>(nullptr));
#if defined(__AVX2__) && defined(__FMA__)
    const bool two = n + 2 * kTileCols <= std::min(panels_end, n1);     // this panel and the next together
    // On AVX-512 int4 panels past the decode loop are dequantised once a call into `scratch`, not again for
    // each block of rows as the GEMM reads them. Not int8 panels up to kStagedRowsI8Group, nor on AVX2:
    // there it does not pay.
    if (a.wide && (a.kind == kI4Min || (a.kind == kI8Group && a.M > kStagedRowsI8Group))) {
      float *second = scratch + kTileCols * a.K;
      StageWide(panel, a.K, scratch);
      if (two) {
        StageWide(PanelAt(a, n + kTileCols, static_cast<const T *>(nullptr)), a.K, second);
        PairPasses(a, F32Panel{scratch}, F32Panel{second}, n, false);
        n += kTileCols;
      } else {
        PanelPasses(a, F32Panel{scratch}, n, nb, false);
      }
      continue;
    }
    if (a.wide && two && (sizeof(T) == 4 || a.M > kSinglePanelRows)) {
      PairPasses(a, panel, PanelAt(a, n + kTileCols, static_cast<const T *>(nullptr)), n, true);
      n += kTileCols;
      continue;
    }
#endif
    PanelPasses(a, panel, n, nb, true);
  }
}

}  // namespace

void Range(const LinearArgs &a, int64_t n0, int64_t n1, float *scratch) {
  if (a.kind == kF32 && a.M <= kDotRows) {     // a few rows: a transposed tile would cost more than it saves
    for (int64_t n = n0; n < n1; ++n)
      RowsF32(a.x, a.ldx, a.M, static_cast<const float *>(a.w) + n * a.K, a.K, a.y + n, a.N);
    return;
  }
  if (a.kind == kI8) return PanelRange<int8_t>(a, n0, n1, scratch);
  if (a.kind == kI4Min) return PanelRange<uint8_t>(a, n0, n1, scratch);
  if (a.kind == kI8Group) return PanelRange<Int8Groups>(a, n0, n1, scratch);
  PanelRange<float>(a, n0, n1, scratch);
}

}  // namespace LK_NS
}  // namespace lk
