// The loops of the weight-only matrix products (linear_math.h), written once over an 8-float vector
// type: AVX2 + FMA registers when compiled with -mavx2 -mfma (namespace lk::avx2), plain arrays the
// compiler vectorises as it can otherwise (lk::generic; vec8.h).
//
// float32 (kF32P16) and int8 (kI8) weights are stored as the tiles of a float GEMM, panels of 16 rows of W
// transposed to (K, 16), and every M runs that GEMM straight from the stored panels, which it asks the cache
// for ahead of use: each x[m, k] broadcast against a panel row (int8 converted to floats as it is loaded, the
// rows' scales applied to the sums), 6 x 16 register blocks, 12 x 32 (two panels at a time) on AVX-512
// registers where the CPU has them (args.wide). At one or two rows of X the sums run in several chains along
// k, so that the loop waits on loads rather than on each FMA's latency. The panels are read where the model
// holds them, 4-byte aligned: an aligned copy of SmolLM2-135M's weights raised its load's peak RSS 1.5x,
// for steps 0.97-1.00x and prompt calls 0.99-1.01x the time on an AMD Zen 5.
// int4 up to a few rows of X takes integer dot products of a row of W at a time against x rounded to int8
// (up to 8 rows of X pair after pair, 6 with AVX-512); float32 stored by rows (kF32) up to 16 rows of X dot
// products against one row of W at a time. Otherwise their rows of W are dequantised 16 at a time into a
// tile transposed to (K, 16) (8 x 8 blocks transposed in registers; the tile 64-byte aligned by the caller),
// which runs the same GEMM; so do the last N % 16 rows of the panel layouts, stored whole.
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

// Bytes ahead of the int4 decode loop that it asks the cache for: without it the int8 decode loop of the time
// read 9 GB/s against a plain read's 16-21 (one core, SmolLM2-135M's layers), 2 KB ahead 14; 0.25-1 KB and 4 KB
// ahead less.
constexpr int64_t kPrefetchBytes = 2048;

// Up to these M, int4 runs its decode loop over pairs of X rows against each block of W (in L1 after the
// first pair), beyond them the dequantised tiles ("Wide": their GEMM on AVX-512). A 1536 x 576 layer on one
// thread, pairs against tiles (integer dot products): M 6 202 / 238 us wide (204 AVX2), M 8 262 / 208 (257),
// M 12 400 / 269 (315).
constexpr int64_t kPairRowsI4 = 8, kPairRowsI4Wide = 6;

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

// A tile row's 8 weights as floats: float32 as stored, int8 converted.
inline V8 LoadW(const float *p) { return Load(p); }
inline V8 LoadW(const int8_t *p) { return FromI8(p); }

// Bytes of a stored panel ahead of the GEMM that it asks the cache for (3 KB; SmolLM2-135M's float32
// products at M 8: 0.73x the time without), once per cache line: every tile row of floats, every fourth of int8.
constexpr int64_t kPrefetchTileBytes = 3072;
template <typename T>
inline void PrefetchRow(const T *tile, int64_t k) {
  if (sizeof(T) == 4 || (k & 3) == 0)
    __builtin_prefetch(tile + (k + kPrefetchTileBytes / int64_t(kTileCols * sizeof(T))) * kTileCols);
}

// Chains of sums along k per row of X (k by turns, added at the end): one chain a row at M 1 would wait on
// each FMA's latency.
template <int MB>
constexpr int Chains() { return MB == 1 ? 4 : MB == 2 ? 2 : 1; }

// One step of k of GemmTile into one chain of sums (inlined, or the sums leave the registers: GemmTile at
// M 6 took 1.9x as long).
template <int MB, bool Ahead, typename T>
__attribute__((always_inline)) inline void TileStep(const float *x, int64_t ldx, const T *tile, int64_t k,
                                                    V8 (&sums)[MB][2]) {
  if (Ahead) PrefetchRow(tile, k);
  const V8 w0 = LoadW(tile + k * kTileCols), w1 = LoadW(tile + k * kTileCols + 8);
  for (int m = 0; m < MB; ++m) {
    const V8 xb = Bcast(x[m * ldx + k]);
    sums[m][0] = Fma(xb, w0, sums[m][0]);
    sums[m][1] = Fma(xb, w1, sums[m][1]);
  }
}

// MB rows of X against a tile: each x[m, k] broadcast over kTileCols columns (2 x MB registers of sums a
// chain), the register block of a float GEMM; nb columns stored, times `scale` (16 floats) where given.
// `Ahead`: the tile streams from memory.
template <int MB, bool Ahead, typename T>
inline void GemmTile(const float *x, int64_t ldx, const T *tile, int64_t K, float *y, int64_t ldy, int64_t nb,
                     const float *scale) {
  constexpr int U = Chains<MB>();
  V8 acc[U][MB][2];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MB; ++m) acc[u][m][0] = acc[u][m][1] = Zero();
  const int64_t KU = K / U * U;
  int64_t k = 0;
  for (; k < KU; k += U)
    for (int u = 0; u < U; ++u) TileStep<MB, Ahead>(x, ldx, tile, k + u, acc[u]);
  for (; k < K; ++k) TileStep<MB, Ahead>(x, ldx, tile, k, acc[0]);
  for (int m = 0; m < MB; ++m) {
    V8 lo = acc[0][m][0], hi = acc[0][m][1];
    for (int u = 1; u < U; ++u) lo = Add(lo, acc[u][m][0]), hi = Add(hi, acc[u][m][1]);
    if (scale) lo = Mul(lo, Load(scale)), hi = Mul(hi, Load(scale + 8));
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
// With AVX-512 (args.wide; only the GEMM uses it: the int4 decode loop built for it ran slower) a tile row of
// kTileCols is one register.
__attribute__((target("avx512f"))) inline __m512 LoadW16(const float *p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"))) inline __m512 LoadW16(const int8_t *p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
}

// One tile, MB rows of X: MB registers of sums a chain (up to 12 of the 32), a load and MB broadcasts a step
// of k; nb columns stored, times `scale` where given.
template <int MB, typename T>
__attribute__((target("avx512f"))) inline void GemmTile16(const float *x, int64_t ldx, const T *tile, int64_t K,
                                                          float *y, int64_t ldy, int64_t nb, const float *scale) {
  constexpr int U = Chains<MB>();
  __m512 acc[U][MB];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MB; ++m) acc[u][m] = _mm512_setzero_ps();
  const int64_t KU = K / U * U;
  int64_t k = 0;
  for (; k < KU; k += U)
    for (int u = 0; u < U; ++u) {
      const __m512 w = LoadW16(tile + (k + u) * kTileCols);
      for (int m = 0; m < MB; ++m) acc[u][m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k + u]), w, acc[u][m]);
    }
  for (; k < K; ++k) {
    const __m512 w = LoadW16(tile + k * kTileCols);
    for (int m = 0; m < MB; ++m) acc[0][m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * ldx + k]), w, acc[0][m]);
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << nb) - 1);
  for (int m = 0; m < MB; ++m) {
    for (int u = 1; u < U; ++u) acc[0][m] = _mm512_add_ps(acc[0][m], acc[u][m]);
    if (scale) acc[0][m] = _mm512_mul_ps(acc[0][m], _mm512_loadu_ps(scale));
    _mm512_mask_storeu_ps(y + m * ldy, keep, acc[0][m]);
  }
}

// One step of k of GemmPair16 into one chain of sums.
template <int MB, bool Ahead, typename T>
__attribute__((target("avx512f"), always_inline)) inline void PairStep(const float *x, int64_t ldx, const T *t0,
                                                                       const T *t1, int64_t k,
                                                                       __m512 (&sums)[MB][2]) {
  if (Ahead) {
    PrefetchRow(t0, k);
    PrefetchRow(t1, k);
  }
  const __m512 w0 = LoadW16(t0 + k * kTileCols), w1 = LoadW16(t1 + k * kTileCols);
  for (int m = 0; m < MB; ++m) {
    const __m512 b = _mm512_set1_ps(x[m * ldx + k]);
    sums[m][0] = _mm512_fmadd_ps(b, w0, sums[m][0]);
    sums[m][1] = _mm512_fmadd_ps(b, w1, sums[m][1]);
  }
}

// Two stored panels side by side (32 columns): MB rows of X take 2 x MB registers of sums a chain (up to 24
// of the 32), two loads and MB broadcasts a step of k, so that the products, not the loads, bound the loop
// (SmolLM2-135M's products at M 256: 1.7x the speed of one panel at a time); sums times `scale` (32 floats)
// where given. `Ahead`: the panels stream from memory.
template <int MB, bool Ahead, typename T>
__attribute__((target("avx512f"))) inline void GemmPair16(const float *x, int64_t ldx, const T *t0, const T *t1,
                                                          int64_t K, float *y, int64_t ldy, const float *scale) {
  constexpr int U = Chains<MB>();
  __m512 acc[U][MB][2];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MB; ++m) acc[u][m][0] = acc[u][m][1] = _mm512_setzero_ps();
  const int64_t KU = K / U * U;
  int64_t k = 0;
  for (; k < KU; k += U)
    for (int u = 0; u < U; ++u) PairStep<MB, Ahead>(x, ldx, t0, t1, k + u, acc[u]);
  for (; k < K; ++k) PairStep<MB, Ahead>(x, ldx, t0, t1, k, acc[0]);
  for (int m = 0; m < MB; ++m)
    for (int h = 0; h < 2; ++h) {
      for (int u = 1; u < U; ++u) acc[0][m][h] = _mm512_add_ps(acc[0][m][h], acc[u][m][h]);
      if (scale) acc[0][m][h] = _mm512_mul_ps(acc[0][m][h], _mm512_loadu_ps(scale + h * kTileCols));
      _mm512_storeu_ps(y + m * ldy + h * kTileCols, acc[0][m][h]);
    }
}

template <bool Ahead, typename T>
__attribute__((target("avx512f"))) void GemmPairRows(const float *x, int64_t ldx, int64_t rows, const T *t0,
                                                     const T *t1, int64_t K, float *y, int64_t ldy,
                                                     const float *scale) {
  int64_t m = 0;
  for (; m + 12 <= rows; m += 12) GemmPair16<12, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy, scale);
  if (m + 8 <= rows) GemmPair16<8, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy, scale), m += 8;
  if (m + 4 <= rows) GemmPair16<4, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy, scale), m += 4;
  if (m + 2 <= rows) GemmPair16<2, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy, scale), m += 2;
  if (m < rows) GemmPair16<1, Ahead>(x + m * ldx, ldx, t0, t1, K, y + m * ldy, ldy, scale);
}

template <typename T>
__attribute__((target("avx512f"))) void GemmRows16(const float *x, int64_t ldx, int64_t rows, const T *tile,
                                                   int64_t K, float *y, int64_t ldy, int64_t nb, const float *scale) {
  int64_t m = 0;
  for (; m + 12 <= rows; m += 12) GemmTile16<12>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale);
  if (m + 8 <= rows) GemmTile16<8>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale), m += 8;
  if (m + 4 <= rows) GemmTile16<4>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale), m += 4;
  if (m + 2 <= rows) GemmTile16<2>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale), m += 2;
  if (m < rows) GemmTile16<1>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale);
}
#endif

template <bool Ahead, typename T>
void GemmRows(const float *x, int64_t ldx, int64_t rows, const T *tile, int64_t K, float *y, int64_t ldy,
              int64_t nb, const float *scale) {
  int64_t m = 0;
  for (; m + 6 <= rows; m += 6) GemmTile<6, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale);
  switch (rows - m) {
    case 5: return GemmTile<5, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale);
    case 4: return GemmTile<4, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale);
    case 3: return GemmTile<3, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale);
    case 2: return GemmTile<2, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale);
    case 1: return GemmTile<1, Ahead>(x + m * ldx, ldx, tile, K, y + m * ldy, ldy, nb, scale);
    default: return;
  }
}

// Every pass of kRowsPerPass rows of X over one tile (columns [n, n + nb)); `ahead`: a stored panel, which
// the first pass streams from memory.
template <typename T>
void TilePasses(const LinearArgs &a, const T *tile, int64_t n, int64_t nb, const float *scale, bool ahead) {
  for (int64_t m = 0; m < a.M; m += kRowsPerPass) {
    const int64_t rows = std::min(kRowsPerPass, a.M - m);
    const float *x = a.x + m * a.ldx;
    float *y = a.y + m * a.N + n;
#if defined(__AVX2__) && defined(__FMA__)
    if (a.wide) {
      GemmRows16(x, a.ldx, rows, tile, a.K, y, a.N, nb, scale);
      continue;
    }
#endif
    if (ahead && m == 0) GemmRows<true>(x, a.ldx, rows, tile, a.K, y, a.N, nb, scale);
    else GemmRows<false>(x, a.ldx, rows, tile, a.K, y, a.N, nb, scale);
  }
}

// Up to this M int8 panels are read one at a time on AVX-512 too, not in pairs: two int8 streams at 16 bytes a
// step of k each left the hardware's prefetch behind (SmolLM2-135M's layers from memory on one thread, M 1:
// 13 GB/s in pairs, 28 one at a time, software prefetch or not; in L3 53 and 55); on two threads, pairs
// against one at a time: M 2 1.21x the time, M 4 1.03-1.13x, M 8 0.93-0.95x.
constexpr int64_t kSinglePanelRowsI8 = 4;

// Y's columns [n0, n1) tile by tile: the stored panels of kF32P16 and kI8 (T their element type) as they are,
// other rows of W dequantised into `scratch` first.
template <typename T>
void TileRange(const LinearArgs &a, int64_t n0, int64_t n1, float *scratch) {
  const int64_t panels_end = a.kind == kF32P16 || a.kind == kI8 ? a.N / kTileCols * kTileCols : 0;
  const T *w = static_cast<const T *>(a.w);
  for (int64_t n = n0; n < n1; n += kTileCols) {
    const int64_t nb = std::min(kTileCols, n1 - n);
    if (n + kTileCols > panels_end) {     // n0 is on a panel's start
      PackTile(a, n, nb, scratch);
      TilePasses<float>(a, scratch, n, nb, nullptr, false);
      continue;
    }
    const float *scale = a.kind == kI8 ? a.scale + n : nullptr;
#if defined(__AVX2__) && defined(__FMA__)
    const bool pair = a.kind != kI8 || a.M > kSinglePanelRowsI8;
    if (a.wide && pair && n + 2 * kTileCols <= std::min(panels_end, n1)) {     // this panel and the next together
      const T *t0 = w + n * a.K, *t1 = t0 + kTileCols * a.K;
      for (int64_t m = 0; m < a.M; m += kRowsPerPass) {
        const int64_t rows = std::min(kRowsPerPass, a.M - m);
        if (m == 0) GemmPairRows<true>(a.x, a.ldx, rows, t0, t1, a.K, a.y + n, a.N, scale);
        else GemmPairRows<false>(a.x + m * a.ldx, a.ldx, rows, t0, t1, a.K, a.y + m * a.N + n, a.N, scale);
      }
      n += kTileCols;
      continue;
    }
#endif
    TilePasses(a, w + n * a.K, n, nb, scale, true);
  }
}

}  // namespace

void Range(const LinearArgs &a, int64_t n0, int64_t n1, float *scratch) {
  if ((a.kind == kI4 || a.kind == kI4Min) && a.M <= (a.wide ? kPairRowsI4Wide : kPairRowsI4)) {
    for (int64_t n = n0; n < n1; n += kBlockRows) {    // a block of W in L1 for every pair of rows of X
      const int64_t end = std::min(n + kBlockRows, n1);
      for (int64_t m = 0; m < a.M; m += 2) {
        LinearArgs rows = a;
        rows.x = a.x + m * a.ldx;
        rows.y = a.y + m * a.N;
        rows.xq = a.xq + m * a.K;
        rows.xs = a.xs + m * (a.K / 32);
        rows.xsum = a.xsum + m * a.G;
        for (int64_t j = n; j < end; ++j)
          if (m + 2 <= a.M) RowI4<2>(rows, j); else RowI4<1>(rows, j);
      }
    }
    return;
  }
  if (a.kind == kF32 && a.M <= kDotRows) {     // a few rows: a transposed tile would cost more than it saves
    for (int64_t n = n0; n < n1; ++n)
      RowsF32(a.x, a.ldx, a.M, static_cast<const float *>(a.w) + n * a.K, a.K, a.y + n, a.N);
    return;
  }
  if (a.kind == kI8) return TileRange<int8_t>(a, n0, n1, scratch);
  TileRange<float>(a, n0, n1, scratch);
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
