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
// layouts, stored whole. The panels' readers are in linear_panels.h, the GEMM's register blocks in linear_gemm.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "linear_gemm.h"
#include "linear_math.h"
#include "linear_panels.h"
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
constexpr int64_t kDecodeRowsI8Group = 8, kStagedRowsI8Group = 32;

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
