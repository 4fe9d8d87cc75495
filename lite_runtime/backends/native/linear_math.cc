// The loops of the weight-only matrix products (linear_math.h), written once over an 8-float vector
// type: AVX2 + FMA registers when compiled with -mavx2 -mfma (namespace lk::avx2), plain arrays the
// compiler vectorises as it can otherwise (lk::generic; vec8.h).
//
// Decode-sized M (1 or 2 rows) converts each weight vector once and multiplies it into every row
// straight from the packed weights, so the weights stream from memory once: int8 four rows of W at a time
// (in panels of four rows, one stream; up to 16 rows of X pair after pair, 12 with AVX-512), int4 a row at
// a time with integer dot products against x rounded to int8 (up to 8 rows of X pair after pair, 6 with
// AVX-512). float32 up to 16 rows of X takes dot products against one row of W at a time, 8 rows of X
// together. More rows (prefill) dequantise 16 rows of W into a tile transposed to (K, 16) (8 x 8 blocks
// transposed in registers) and run a 6 x 16 register block of a float GEMM over the rows of X, 12 x 16
// on AVX-512 registers where the CPU has them (args.wide; the tile 64-byte aligned by the caller).
// float32 weights stored as such tiles (kF32P16) run that GEMM at every M, straight from the stored
// panels, which it asks the cache for ahead of use (SmolLM2-135M's products on 2 threads, AVX2, against
// rows of W: M 1 0.92x, M 8 0.64x, M 32 0.78x the time); on AVX-512 two panels at a time. The panels
// are read where the model holds them, 4-byte aligned: an aligned copy of SmolLM2-135M's weights raised
// its load's peak RSS 1.5x, for steps 0.97-1.00x and prompt calls 0.99-1.01x the time on an AMD Zen 5
// (on an Intel Xeon a C++ loop of its products at M 32 had taken 1.3-1.4x as long unaligned).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "linear_math.h"
#include "vec8.h"

namespace lk {
namespace LK_NS {
namespace {

constexpr int64_t kRowsPerPass = 64;   // rows of X per pass over a packed tile
constexpr int64_t kDotRows = 16;       // up to this M, dot products over rows of W (measured: M 8 at 1.5x
                                       // the transposed tile's speed, M 64 at 0.6x)

// MB rows of X against one row of W, read front to back; U sums a row of X, so that MB * U chains of FMAs
// are in flight. (Four rows of W against pairs of rows of X took 1.17x as long at M 8, as long at M 1.)
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

// Bytes ahead of the int8 decode loop that it asks the cache for: in panels without it the loop read 9 GB/s
// against a plain read's 16-21 (one core, SmolLM2-135M's layers; rows stored whole: 6), 2 KB ahead 14;
// 0.25-1 KB and 4 KB ahead less.
constexpr int64_t kPrefetchBytes = 2048;

// Up to these M, int8 and int4 run their decode loops over pairs of X rows against each block of W (in L1
// after the first pair), beyond them the dequantised tiles ("Wide": their GEMM on AVX-512). A 1536 x 576
// layer on one thread, pairs against tiles: int8 M 12 314 / 308 us wide (363 AVX2), M 16 421 / 377
// (425), M 64 1686 / 971 (1217); int4 (integer dot products) M 6 202 / 238 (204), M 8 262 / 208 (257),
// M 12 400 / 269 (315).
constexpr int64_t kPairRowsI8 = 16, kPairRowsI8Wide = 12, kPairRowsI4 = 8, kPairRowsI4Wide = 6;

// Decode: MB (1 or 2) rows of X against a panel of 4 int8 rows, read front to back as one stream, each
// weight vector converted once.
template <int MB>
inline void PanelI8(const float *x, int64_t ldx, const int8_t *w, int64_t K, const float *scale, float *y,
                    int64_t ldy) {
  V8 acc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = Zero();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    const int8_t *p = w + k * 4;
    if (k & 8) __builtin_prefetch(p + kPrefetchBytes);
    V8 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = FromI8(p + j * 8);
    for (int m = 0; m < MB; ++m) {
      V8 xv = Load(x + m * ldx + k);
      for (int j = 0; j < 4; ++j) acc[m][j] = Fma(xv, wv[j], acc[m][j]);
    }
  }
  const int8_t *tail = w + 4 * K8;
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) {
      float s = Hsum(acc[m][j]);
      for (int64_t k = K8; k < K; ++k) s += x[m * ldx + k] * static_cast<float>(tail[j * (K - K8) + k - K8]);
      y[m * ldy + j] = s * scale[j];
    }
}

// Decode: MB (1 or 2) rows of X against one int8 row stored whole (the last N % 4 rows).
template <int MB>
inline void RowI8(const float *x, int64_t ldx, const int8_t *w, int64_t K, float scale, float *y, int64_t ldy) {
  V8 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = Zero();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    const V8 wv = FromI8(w + k);
    for (int m = 0; m < MB; ++m) acc[m] = Fma(Load(x + m * ldx + k), wv, acc[m]);
  }
  for (int m = 0; m < MB; ++m) {
    float s = Hsum(acc[m]);
    for (int64_t k = K8; k < K; ++k) s += x[m * ldx + k] * static_cast<float>(w[k]);
    y[m * ldy] = s * scale;
  }
}

template <int MB>
inline void DecodeI8(const LinearArgs &a, int64_t n, int64_t nb) {
  const int8_t *w = static_cast<const int8_t *>(a.w) + n * a.K;
  if (nb == 4) return PanelI8<MB>(a.x, a.ldx, w, a.K, a.scale + n, a.y + n, a.N);
  for (int64_t j = 0; j < nb; ++j) RowI8<MB>(a.x, a.ldx, w + j * a.K, a.K, a.scale[n + j], a.y + n + j, a.N);
}

// Decode: MB (1 or 2) rows of X, rounded to int8 (a.xq, a.xs), against one row of int4 W: an integer dot
// product per run of 32, scaled by x's scale of the run times the weights' of its group; runs in pairs
// into two sums each, so that no sum waits for the one before.
template <int MB>
inline void RowI4(const LinearArgs &a, int64_t n) {
  const int64_t runs = a.K / 32, per_group = a.group / 32;
  const uint8_t *w = static_cast<const uint8_t *>(a.w) + n * (a.K / 2);
  const float *scale = a.scale + n * a.G;
  auto group_scale = [&](int64_t r) { return scale[a.group_shift >= 0 ? r >> a.group_shift : r / per_group]; };
  V8 acc[MB][2];
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = Zero();
  int64_t r = 0;
  for (; r + 2 <= runs; r += 2) {
    if ((r & 3) == 0) __builtin_prefetch(w + r * 16 + kPrefetchBytes);
    const U32 u0 = U4Bytes(w + r * 16), u1 = U4Bytes(w + r * 16 + 16);
    const float s0 = group_scale(r), s1 = group_scale(r + 1);
    for (int m = 0; m < MB; ++m) {
      const int8_t *xq = a.xq + m * a.K + r * 32;
      const float *xs = a.xs + m * runs + r;
      acc[m][0] = Fma(DotU4(u0, xq), Bcast(xs[0] * s0), acc[m][0]);
      acc[m][1] = Fma(DotU4(u1, xq + 32), Bcast(xs[1] * s1), acc[m][1]);
    }
  }
  if (r < runs) {
    const U32 u = U4Bytes(w + r * 16);
    const float s0 = group_scale(r);
    for (int m = 0; m < MB; ++m)
      acc[m][0] = Fma(DotU4(u, a.xq + m * a.K + r * 32), Bcast(a.xs[m * runs + r] * s0), acc[m][0]);
  }
  for (int m = 0; m < MB; ++m) {
    float y = Hsum(Add(acc[m][0], acc[m][1]));
    const float *xsum = a.xsum + m * a.G;
    for (int64_t g = 0; g < a.G; ++g) y += (a.min ? a.min[n * a.G + g] : -8.0f * scale[g]) * xsum[g];
    a.y[m * a.N + n] = y;
  }
}

// Decode: MB (1 or 2) rows of X against rows [n, n + nb) of int8 or int4 W.
template <int MB>
inline void DecodeRows(const LinearArgs &a, int64_t n, int64_t nb) {
  if (a.kind == kI8) return DecodeI8<MB>(a, n, nb);
  for (int64_t j = 0; j < nb; ++j) RowI4<MB>(a, n + j);
}

// Rows [n, n + nb) of W (nb <= kTileCols), dequantized, transposed into tile[k * kTileCols + j]; the
// columns past nb are zeros.
void PackTile(const LinearArgs &a, int64_t n, int64_t nb, float *tile) {
  if (nb < kTileCols) std::memset(tile, 0, sizeof(float) * kTileCols * a.K);
  int64_t j = 0;
  if (a.kind == kF32 || a.kind == kF32P16 || a.kind == kI8) {     // kF32P16: its rows stored whole
    const float *wf = static_cast<const float *>(a.w);
    const int8_t *wq = static_cast<const int8_t *>(a.w);
    auto run = [&](int64_t r, int64_t k) {     // row r's 8 weights from k (a run of 8 is contiguous)
      return a.kind != kI8 ? Load(wf + r * a.K + k)
                            : Fma(FromI8(wq + I8Offset(a.N, a.K, r, k)), Bcast(a.scale[r]), Zero());
    };
    auto one = [&](int64_t r, int64_t k) {
      return a.kind != kI8 ? wf[r * a.K + k] : a.scale[r] * static_cast<float>(wq[I8Offset(a.N, a.K, r, k)]);
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
  const uint8_t *w = static_cast<const uint8_t *>(a.w);
  auto run32 = [&](int64_t r, int64_t run, V8 u[4]) {   // row r's run of 32 weights, dequantized
    const int64_t g = run * 32 / a.group;
    const float scale = a.scale[r * a.G + g];
    const V8 sv = Bcast(scale), off = Bcast(a.min ? a.min[r * a.G + g] : -8.0f * scale);
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

// Rows of a stored panel ahead of the GEMM that it asks the cache for (3 KB; SmolLM2-135M's products at M 8:
// 0.73x the time without).
constexpr int64_t kPrefetchTileRows = 48;

// MB rows of X against a packed tile: each x[m, k] broadcast over kTileCols columns (2 x MB registers
// of sums), the register block of a float GEMM; nb columns stored. `Ahead`: the tile streams from memory.
template <int MB, bool Ahead>
inline void GemmTile(const float *x, int64_t ldx, const float *tile, int64_t K, float *y, int64_t ldy, int64_t nb) {
  V8 acc[MB][2];
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = Zero();
  for (int64_t k = 0; k < K; ++k) {
    if (Ahead) __builtin_prefetch(tile + (k + kPrefetchTileRows) * kTileCols);
    const V8 w0 = Load(tile + k * kTileCols), w1 = Load(tile + k * kTileCols + 8);
    for (int m = 0; m < MB; ++m) {
      const V8 xb = Bcast(x[m * ldx + k]);
      acc[m][0] = Fma(xb, w0, acc[m][0]);
      acc[m][1] = Fma(xb, w1, acc[m][1]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    if (nb == kTileCols) {
      Store(y + m * ldy, acc[m][0]);
      Store(y + m * ldy + 8, acc[m][1]);
    } else {
      float out[kTileCols];
      Store(out, acc[m][0]);
      Store(out + 8, acc[m][1]);
      std::memcpy(y + m * ldy, out, sizeof(float) * nb);
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// With AVX-512 (args.wide; only these two functions use it: the decode loops built for it ran slower) a
// tile row of kTileCols is one register: MB rows of X take MB registers of sums (up to 12 of the 32), a
// load and MB broadcasts a step of k.
template <int MB>
__attribute__((target("avx512f"))) inline void GemmTile16(const float *x, int64_t ldx, const float *tile, int64_t K,
                                                          float *y, int64_t ldy, int64_t nb) {
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m512 w = _mm512_loadu_ps(tile + k * kTileCols);
    for (int m = 0; m < MB; ++m) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k]), w, acc[m]);
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << nb) - 1);
  for (int m = 0; m < MB; ++m) _mm512_mask_storeu_ps(y + m * ldy, keep, acc[m]);
}

// Two stored panels side by side (32 columns): MB rows of X take 2 x MB registers of sums (up to 24 of the 32),
// two loads and MB broadcasts a step of k, so that the products, not the loads, bound the loop (SmolLM2-135M's
// products at M 256: 1.7x the speed of one panel at a time). `Ahead`: the panels stream from memory.
template <int MB, bool Ahead>
__attribute__((target("avx512f"))) inline void GemmPair16(const float *x, int64_t ldx, const float *t0, const float *t1,
                                                          int64_t K, float *y, int64_t ldy) {
  __m512 acc[MB][2];
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    if (Ahead) {
      __builtin_prefetch(t0 + (k + kPrefetchTileRows) * kTileCols);
      __builtin_prefetch(t1 + (k + kPrefetchTileRows) * kTileCols);
    }
    const __m512 w0 = _mm512_loadu_ps(t0 + k * kTileCols), w1 = _mm512_loadu_ps(t1 + k * kTileCols);
    for (int m = 0; m < MB; ++m) {
      const __m512 b = _mm512_set1_ps(x[m * ldx + k]);
      acc[m][0] = _mm512_fmadd_ps(b, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(b, w1, acc[m][1]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    _mm512_storeu_ps(y + m * ldy, acc[m][0]);
    _mm512_storeu_ps(y + m * ldy + kTileCols, acc[m][1]);
  }
}

template <bool Ahead>
__attribute__((target("avx512f"))) void GemmPairRows(const float *x, int64_t ldx, int64_t rows, const float *t0,
                                                     const float *t1, int64_t K, float *y, int64_t ldy) {
  int64_t m = 0;
  for (; m + 12 <= rows; m += 12) GemmPair16<12, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy);
  if (m + 8 <= rows) GemmPair16<8, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy), m += 8;
  if (m + 4 <= rows) GemmPair16<4, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy), m += 4;
  if (m + 2 <= rows) GemmPair16<2, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy), m += 2;
  if (m < rows) GemmPair16<1, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy);
}

__attribute__((target("avx512f"))) void GemmRows16(const float *x, int64_t ldx, int64_t rows, const float *tile,
                                                   int64_t K, float *y, int64_t ldy, int64_t nb) {
  int64_t m = 0;
  for (; m + 12 <= rows; m += 12) GemmTile16<12>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb);
  if (m + 8 <= rows) GemmTile16<8>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb), m += 8;
  if (m + 4 <= rows) GemmTile16<4>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb), m += 4;
  if (m + 2 <= rows) GemmTile16<2>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb), m += 2;
  if (m < rows) GemmTile16<1>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb);
}
#endif

template <bool Ahead>
void GemmRows(const float *x, int64_t ldx, int64_t rows, const float *tile, int64_t K, float *y, int64_t ldy,
              int64_t nb) {
  int64_t m = 0;
  for (; m + 6 <= rows; m += 6) GemmTile<6, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb);
  switch (rows - m) {
    case 5: return GemmTile<5, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb);
    case 4: return GemmTile<4, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb);
    case 3: return GemmTile<3, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb);
    case 2: return GemmTile<2, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb);
    case 1: return GemmTile<1, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb);
    default: return;
  }
}

}  // namespace

void Range(const LinearArgs &a, int64_t n0, int64_t n1, float *scratch) {
  const int64_t pair_rows = a.kind == kI8 ? (a.wide ? kPairRowsI8Wide : kPairRowsI8)
                                          : (a.wide ? kPairRowsI4Wide : kPairRowsI4);
  if ((a.kind == kI8 || a.kind == kI4 || a.kind == kI4Min) && a.M <= pair_rows) {
    for (int64_t n = n0; n < n1; n += kBlockRows) {
      const int64_t nb = std::min(kBlockRows, n1 - n);
      LinearArgs rows = a;
      for (int64_t m = 0; m < a.M; m += 2) {
        rows.x = a.x + m * a.ldx;
        rows.y = a.y + m * a.N;
        if (a.kind != kI8) {
          rows.xq = a.xq + m * a.K;
          rows.xs = a.xs + m * (a.K / 32);
          rows.xsum = a.xsum + m * a.G;
        }
        if (m + 2 <= a.M) DecodeRows<2>(rows, n, nb); else DecodeRows<1>(rows, n, nb);
      }
    }
    return;
  }
  if (a.kind == kF32 && a.M <= kDotRows) {     // a few rows: a transposed tile would cost more than it saves
    for (int64_t n = n0; n < n1; ++n)
      RowsF32(a.x, a.ldx, a.M, static_cast<const float *>(a.w) + n * a.K, a.K, a.y + n, a.N);
    return;
  }
  const int64_t panels_end = a.kind == kF32P16 ? a.N / kTileCols * kTileCols : 0;
  for (int64_t n = n0; n < n1; n += kTileCols) {
    const int64_t nb = std::min(kTileCols, n1 - n);
    const bool stored = n + kTileCols <= panels_end;     // a stored panel is the tile (n0 on a panel's start)
    const float *tile = stored ? static_cast<const float *>(a.w) + n * a.K : scratch;
#if defined(__AVX2__) && defined(__FMA__)
    if (a.wide && n + 2 * kTileCols <= std::min(panels_end, n1)) {     // this panel and the next together
      for (int64_t m = 0; m < a.M; m += kRowsPerPass) {
        const int64_t rows = std::min(kRowsPerPass, a.M - m);
        if (m == 0) GemmPairRows<true>(a.x, a.ldx, rows, tile, tile + kTileCols * a.K, a.K, a.y + n, a.N);
        else GemmPairRows<false>(a.x + m * a.ldx, a.ldx, rows, tile, tile + kTileCols * a.K, a.K, a.y + m * a.N + n, a.N);
      }
      n += kTileCols;
      continue;
    }
#endif
    if (!stored) PackTile(a, n, nb, scratch);
    for (int64_t m = 0; m < a.M; m += kRowsPerPass) {
      const int64_t rows = std::min(kRowsPerPass, a.M - m);
#if defined(__AVX2__) && defined(__FMA__)
      if (a.wide) {
        GemmRows16(a.x + m * a.ldx, a.ldx, rows, tile, a.K, a.y + m * a.N + n, a.N, nb);
        continue;
      }
#endif
      if (stored && m == 0) GemmRows<true>(a.x, a.ldx, rows, tile, a.K, a.y + n, a.N, nb);
      else GemmRows<false>(a.x + m * a.ldx, a.ldx, rows, tile, a.K, a.y + m * a.N + n, a.N, nb);
    }
  }
}

void RoundActivations(float *x, int64_t runs, int8_t *q, float *d) {
  for (int64_t r = 0; r < runs; ++r) {
    float *v = x + r * 32;
    int8_t *qr = q + r * 32;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax8 = _mm256_setzero_ps();
    for (int i = 0; i < 32; i += 8) amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
#else
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
#endif
    const float scale = amax / 127.0f, inverse = amax > 0.0f ? 1.0f / scale : 0.0f;
    d[r] = scale;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 inv = _mm256_set1_ps(inverse), sc = _mm256_set1_ps(scale);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    alignas(32) int32_t ints[32];
    for (int i = 0; i < 32; i += 8) {   // cvtps rounds to nearest even (the default MXCSR), as numpy's rint
      __m256i qi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), inv));
      qi = _mm256_max_epi32(lo, _mm256_min_epi32(hi, qi));
      _mm256_store_si256(reinterpret_cast<__m256i *>(ints + i), qi);
      _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_cvtepi32_ps(qi), sc));
    }
    for (int i = 0; i < 32; ++i) qr[i] = static_cast<int8_t>(ints[i]);
#else
    for (int i = 0; i < 32; ++i) {
      const float rounded = std::nearbyint(v[i] * inverse);
      qr[i] = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, rounded)));
      v[i] = static_cast<float>(qr[i]) * scale;
    }
#endif
  }
}

}  // namespace LK_NS
}  // namespace lk
