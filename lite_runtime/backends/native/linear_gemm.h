// The register blocks of the float GEMM that every M of the panel layouts runs (linear_math.cc, and attention_math.cc
// for the paged attention's tiles; compiled twice, as they are): MB rows of X against one panel or two side by side, on
// 8-float vectors (V8, vec8.h) or, where args.wide, on AVX-512 registers; each x[m, k] broadcast against a panel row.
#pragma once
#include <cstdint>
#include <cstring>

#include "linear_math.h"
#include "linear_panels.h"
#include "vec8.h"

namespace lk {
namespace LK_NS {
namespace {

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

}  // namespace
}  // namespace LK_NS
}  // namespace lk
