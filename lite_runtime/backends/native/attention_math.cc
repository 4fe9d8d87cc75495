// The loops of the packed call's attention (attention_math.h) over the 8-float vector type (vec8.h).
//
// Past scores run along the cached positions, the key cache's last axis: each step of 8 positions loads a
// vector per head dimension and takes it into the sums of up to 4 query heads that share the KV head.
// Values run along the head dimension, the value cache's last axis. Only the positions the token's row has
// cached are read.
#include <algorithm>
#include <cstdint>

#include "attention_math.h"
#include "linear_gemm.h"
#include "vec8.h"

namespace lk {
namespace LK_NS {
namespace {

constexpr float kIota[8] = {0, 1, 2, 3, 4, 5, 6, 7};

// Cached keys and values as stored: float32, float16 bits (the paged store's default), or int8 (their scales
// applied apart: the keys' to the scores, the values' to the weights).
inline V8 LoadAs(const float *p) { return Load(p); }
inline V8 LoadAs(const uint16_t *p) { return LoadHalf(p); }
inline V8 LoadAs(const int8_t *p) { return FromI8(p); }
inline float ScalarAs(float x) { return x; }
inline float ScalarAs(uint16_t x) { return HalfToFloat(x); }
inline float ScalarAs(int8_t x) { return static_cast<float>(x); }

// acc[j] = q_j[d0:d1] . K[d0:d1, p:p + 16] (two halves of 8 positions), J query heads: a whole cache line of
// each key row a step of d. Inlined, or the sums leave the registers.
template <int J, typename T>
__attribute__((always_inline)) inline void Dot16(const float *q, int64_t hd, const T *K, int64_t P, int64_t p,
                                                 int64_t d0, int64_t d1, V8 (&acc)[J][2]) {
  for (int j = 0; j < J; ++j) acc[j][0] = acc[j][1] = Zero();
  for (int64_t d = d0; d < d1; ++d) {
    const V8 k0 = LoadAs(K + d * P + p), k1 = LoadAs(K + d * P + p + 8);
    for (int j = 0; j < J; ++j) {
      const V8 qv = Bcast(q[j * hd + d]);
      acc[j][0] = Fma(qv, k0, acc[j][0]);
      acc[j][1] = Fma(qv, k1, acc[j][1]);
    }
  }
}

// Dot16 for 8 positions.
template <int J, typename T>
__attribute__((always_inline)) inline void Dot8(const float *q, int64_t hd, const T *K, int64_t P, int64_t p,
                                                int64_t d0, int64_t d1, V8 (&acc)[J]) {
  for (int j = 0; j < J; ++j) acc[j] = Zero();
  for (int64_t d = d0; d < d1; ++d) {
    const V8 kv = LoadAs(K + d * P + p);
    for (int j = 0; j < J; ++j) acc[j] = Fma(Bcast(q[j * hd + d]), kv, acc[j]);
  }
}

// s[j * ld + p] = scale * q_j . K[:, p] + slope_j * (base + p) for p < past, J query heads (J <= 4).
// `Padded`: K holds P >= past rounded up to 8 positions (a paged block), and s room for as many: the last
// positions run as a vector of 8 whose extra scores are never read, not one by one (a chain of scalar FMAs per
// head, a float16 converted a value at a time: as long as the block's vectors when rows end mid-vector).
template <int J, typename T = float, bool Padded = false>
void PastScores(const float *q, int64_t hd, const T *K, int64_t P, int64_t past, float scale,
                const float *slope, float *s, int64_t ld, int64_t base = 0) {
  const int64_t past8 = Padded ? (past + 7) & ~int64_t(7) : past & ~int64_t(7), past16 = past & ~int64_t(15);
  int64_t p = 0;
  for (; p < past16; p += 16) {
    V8 acc[J][2];
    Dot16<J>(q, hd, K, P, p, 0, hd, acc);
    for (int half = 0; half < 2; ++half) {
      const V8 key = Add(Bcast(static_cast<float>(base + p + 8 * half)), Load(kIota));
      const V8 sc = Bcast(scale);
      for (int j = 0; j < J; ++j)
        Store(s + j * ld + p + 8 * half, Fma(Bcast(slope[j]), key, Mul(acc[j][half], sc)));
    }
  }
  for (; p < past8; p += 8) {
    V8 acc[J];
    Dot8<J>(q, hd, K, P, p, 0, hd, acc);
    const V8 key = Add(Bcast(static_cast<float>(base + p)), Load(kIota));
    const V8 sc = Bcast(scale);
    for (int j = 0; j < J; ++j) Store(s + j * ld + p, Fma(Bcast(slope[j]), key, Mul(acc[j], sc)));
  }
  for (int64_t p = past8; p < past; ++p)     // none when Padded
    for (int j = 0; j < J; ++j) {
      float dot = 0.0f;
      for (int64_t d = 0; d < hd; ++d) dot += q[j * hd + d] * ScalarAs(K[d * P + p]);
      s[j * ld + p] = dot * scale + slope[j] * static_cast<float>(base + p);
    }
}

// PastScores for int8 keys: the dot product by runs of kKvScaleRun head dimensions, each run's times its scale,
// kscale[run * P + p]. J <= 3: the runs' sums and their total stay in the registers (16 on AVX2); a loop of its
// own, so that PastScores keeps all of them for 4 query heads.
template <int J, typename T, bool Padded = false>
void PastScoresRuns(const float *q, int64_t hd, const T *K, int64_t P, int64_t past, float scale,
                    const float *slope, float *s, int64_t ld, int64_t base, const float *kscale) {
  const int64_t past8 = Padded ? (past + 7) & ~int64_t(7) : past & ~int64_t(7), past16 = past & ~int64_t(15),
                run = kKvScaleRun;
  int64_t p = 0;
  for (; p < past16; p += 16) {
    V8 tot[J][2];
    for (int j = 0; j < J; ++j) tot[j][0] = tot[j][1] = Zero();
    for (int64_t d0 = 0; d0 < hd; d0 += run) {
      V8 acc[J][2];
      Dot16<J>(q, hd, K, P, p, d0, std::min(hd, d0 + run), acc);
      for (int half = 0; half < 2; ++half) {
        const V8 ks = Load(kscale + d0 / run * P + p + 8 * half);
        for (int j = 0; j < J; ++j) tot[j][half] = Fma(acc[j][half], ks, tot[j][half]);
      }
    }
    for (int half = 0; half < 2; ++half) {
      const V8 key = Add(Bcast(static_cast<float>(base + p + 8 * half)), Load(kIota));
      for (int j = 0; j < J; ++j)
        Store(s + j * ld + p + 8 * half, Fma(Bcast(slope[j]), key, Mul(tot[j][half], Bcast(scale))));
    }
  }
  for (; p < past8; p += 8) {
    V8 tot[J];
    for (int j = 0; j < J; ++j) tot[j] = Zero();
    for (int64_t d0 = 0; d0 < hd; d0 += run) {
      V8 acc[J];
      Dot8<J>(q, hd, K, P, p, d0, std::min(hd, d0 + run), acc);
      const V8 ks = Load(kscale + d0 / run * P + p);
      for (int j = 0; j < J; ++j) tot[j] = Fma(acc[j], ks, tot[j]);
    }
    const V8 key = Add(Bcast(static_cast<float>(base + p)), Load(kIota));
    for (int j = 0; j < J; ++j) Store(s + j * ld + p, Fma(Bcast(slope[j]), key, Mul(tot[j], Bcast(scale))));
  }
  for (int64_t p = past8; p < past; ++p)
    for (int j = 0; j < J; ++j) {
      float dot = 0.0f;
      for (int64_t d = 0; d < hd; ++d) dot += q[j * hd + d] * ScalarAs(K[d * P + p]) * kscale[d / run * P + p];
      s[j * ld + p] = dot * scale + slope[j] * static_cast<float>(base + p);
    }
}

float Dot(const float *a, const float *b, int64_t n) {
  const int64_t n8 = n & ~int64_t(7);
  V8 acc = Zero();
  for (int64_t i = 0; i < n8; i += 8) acc = Fma(Load(a + i), Load(b + i), acc);
  float s = Hsum(acc);
  for (int64_t i = n8; i < n; ++i) s += a[i] * b[i];
  return s;
}

// s[0, n) -> e^(s - max), returns their sum (and the max in *largest).
float Softmax(float *s, int64_t n, float *largest = nullptr) {
  const int64_t n8 = n & ~int64_t(7);
  float mx = s[0];
  if (n8) {
    V8 m = Load(s);
    for (int64_t i = 8; i < n8; i += 8) m = Max(m, Load(s + i));
    mx = Hmax(m);
  }
  for (int64_t i = n8; i < n; ++i) mx = std::max(mx, s[i]);
  if (largest) *largest = mx;
  const V8 mv = Bcast(mx);
  V8 sum = Zero();
  for (int64_t i = 0; i < n8; i += 8) {
    const V8 e = Exp(Sub(Load(s + i), mv));
    Store(s + i, e);
    sum = Add(sum, e);
  }
  float total = Hsum(sum);
  if (n8 < n) {   // the tail through the same exp as the vectors
    float tail[8];
    for (int64_t i = 0; i < 8; ++i) tail[i] = n8 + i < n ? s[n8 + i] - mx : -100.0f;
    Store(tail, Exp(Load(tail)));
    for (int64_t i = n8; i < n; ++i) {
      s[i] = tail[i - n8];
      total += s[i];
    }
  }
  return total;
}

// o[j, d0 + 8 DV) = sum over i < L of e[j * ld + i] * values[i][d0 + 8 DV), J query heads: J x DV registers of sums,
// each value vector loaded once for the J heads. values[i] is past + i rows of V below past, else new_values[i].
template <int J, int DV, typename T = float>
void Weigh(const float *e, int64_t ld, int64_t past, const T *V, const T *const *new_values, int64_t count,
           int64_t hd, int64_t d0, float *o) {
  V8 acc[J][DV];
  for (int j = 0; j < J; ++j)
    for (int v = 0; v < DV; ++v) acc[j][v] = Zero();
  auto take = [&](const T *row, int64_t i) {
    V8 w[J];
    for (int j = 0; j < J; ++j) w[j] = Bcast(e[j * ld + i]);
    for (int v = 0; v < DV; ++v) {
      const V8 x = LoadAs(row + d0 + 8 * v);
      for (int j = 0; j < J; ++j) acc[j][v] = Fma(w[j], x, acc[j][v]);
    }
  };
  for (int64_t p = 0; p < past; ++p) take(V + p * hd, p);
  for (int64_t i = 0; i < count; ++i) take(new_values[i], past + i);
  for (int j = 0; j < J; ++j)
    for (int v = 0; v < DV; ++v) Store(o + j * hd + d0 + 8 * v, acc[j][v]);
}

// Weigh over every query head and the head dimension's runs of 8 (DV of them at a time), the last hd % 8 one
// by one.
template <typename T = float>
void WeighAll(const float *e, int64_t ld, int64_t g, int64_t past, const T *V, const T *const *new_values,
              int64_t count, int64_t hd, float *o, int64_t d0 = 0, int64_t d1 = -1) {
  if (d1 < 0) d1 = hd;     // the columns [d0, d1) of o's rows of hd
  const int64_t hd8 = d0 + ((d1 - d0) & ~int64_t(7));
  for (int64_t j = 0; j < g; j += 3) {
    const int64_t J = std::min<int64_t>(3, g - j);
    int64_t d = d0;
    for (; d + 32 <= hd8; d += 32) {
      if (J == 3) Weigh<3, 4, T>(e + j * ld, ld, past, V, new_values, count, hd, d, o + j * hd);
      else if (J == 2) Weigh<2, 4, T>(e + j * ld, ld, past, V, new_values, count, hd, d, o + j * hd);
      else Weigh<1, 4, T>(e + j * ld, ld, past, V, new_values, count, hd, d, o + j * hd);
    }
    for (; d < hd8; d += 8) {
      if (J == 3) Weigh<3, 1, T>(e + j * ld, ld, past, V, new_values, count, hd, d, o + j * hd);
      else if (J == 2) Weigh<2, 1, T>(e + j * ld, ld, past, V, new_values, count, hd, d, o + j * hd);
      else Weigh<1, 1, T>(e + j * ld, ld, past, V, new_values, count, hd, d, o + j * hd);
    }
  }
  for (int64_t d = hd8; d < d1; ++d)
    for (int64_t j = 0; j < g; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < past; ++p) sum += e[j * ld + p] * ScalarAs(V[p * hd + d]);
      for (int64_t i = 0; i < count; ++i) sum += e[j * ld + past + i] * ScalarAs(new_values[i][d]);
      o[j * hd + d] = sum;
    }
}

void Item(const AttendArgs &a, int64_t n, int64_t h, float *scratch) {
  const float *meta = a.meta + n * kMetaCols;
  const int64_t row = static_cast<int64_t>(meta[kRow]);
  const float position = meta[kPosition], context = meta[kContext];
  const int64_t past = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(meta[kPast]), 0), a.P);
  const int64_t g = a.g, hd = a.hd, P = a.P;
  // the call's tokens this one sees, as indices
  int32_t *seen = reinterpret_cast<int32_t *>(scratch);
  int64_t count = 0;
  for (int64_t m = 0; m < a.N; ++m) {
    const float *other = a.meta + m * kMetaCols;
    if (static_cast<int64_t>(other[kRow]) == row && (other[kPosition] <= position || other[kPosition] < context))
      seen[count++] = static_cast<int32_t>(m);
  }
  const int64_t L = past + count, ld = (L + 7) & ~int64_t(7);
  // scratch: seen (N int32), then the seen tokens' value rows (N pointers), scores, sums, denominators
  const float **new_values = reinterpret_cast<const float **>(scratch + ((a.N + 15) & ~int64_t(15)));
  float *s = scratch + ((a.N + 15) & ~int64_t(15)) + 2 * a.N;
  float *o = s + g * ld;
  const float *q = a.q + (n * a.kv + h) * g * hd;
  const float *slope = a.slopes + h * g;
  const float *K = a.k_cache + (row * a.kv + h) * hd * P;
  const float *V = a.v_cache + (row * a.kv + h) * P * hd;
  for (int64_t j = 0; j < g; j += 4) {
    switch (std::min<int64_t>(4, g - j)) {
      case 4: PastScores<4>(q + j * hd, hd, K, P, past, a.scale, slope + j, s + j * ld, ld); break;
      case 3: PastScores<3>(q + j * hd, hd, K, P, past, a.scale, slope + j, s + j * ld, ld); break;
      case 2: PastScores<2>(q + j * hd, hd, K, P, past, a.scale, slope + j, s + j * ld, ld); break;
      default: PastScores<1>(q + j * hd, hd, K, P, past, a.scale, slope + j, s + j * ld, ld); break;
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t m = seen[i];
    const float *key = a.k + (m * a.kv + h) * hd, t = a.meta[m * kMetaCols + kPosition];
    for (int64_t j = 0; j < g; ++j) s[j * ld + past + i] = Dot(q + j * hd, key, hd) * a.scale + slope[j] * t;
  }
  float *den = o + g * hd;
  for (int64_t j = 0; j < g; ++j) den[j] = Softmax(s + j * ld, L);
  for (int64_t i = 0; i < count; ++i) new_values[i] = a.v + (seen[i] * a.kv + h) * hd;
  WeighAll(s, ld, g, past, V, new_values, count, hd, o);
  float *out = a.out + (n * a.kv + h) * g * hd;
  for (int64_t j = 0; j < g; ++j) {
    const float inv = 1.0f / den[j];
    for (int64_t d = 0; d < hd; ++d) out[j * hd + d] = o[j * hd + d] * inv;
  }
}

// Asks the L2 cache for item (n, h)'s cached keys and values, so that the next item's misses overlap this one's
// work. A key row holds each head dimension P positions apart: short runs that the hardware's stream
// prefetcher does not pick up, and that share few L1 sets (hence L2).
void Prefetch(const AttendArgs &a, int64_t n, int64_t h) {
  const float *meta = a.meta + n * kMetaCols;
  const int64_t row = static_cast<int64_t>(meta[kRow]);
  const int64_t past = std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(meta[kPast]), 0), a.P);
  const float *K = a.k_cache + (row * a.kv + h) * a.hd * a.P;
  const float *V = a.v_cache + (row * a.kv + h) * a.P * a.hd;
  for (int64_t d = 0; d < a.hd; ++d)
    for (int64_t p = 0; p < past; p += 16) __builtin_prefetch(K + d * a.P + p, 0, 2);
  for (int64_t i = 0; i < past * a.hd; i += 16) __builtin_prefetch(V + i, 0, 2);
}


// An item asks the caches for the keys (into L1) and values (L2) of the block this many blocks ahead of the one
// it reads: one thread's stream of blocks, a few KB apart, outruns what the hardware fetches ahead by itself
// (1 and 2 measured 0.83-0.89x the time of a lone row's call at 4-8k positions; at 64 rows of 200 no more than
// a control's 0.95x; 4 no better).
constexpr int64_t kPagedAhead = 2;

// Token n's attention on KV head h in the paged form: its row's positions p < L, block after block. With a
// `part` (PagedArgs::splits), only the positions [first, first + a.split) (first a multiple of the block), and
// the unnormalised sums go to `part` with each query head's largest score and denominator (PagedPart).
template <typename T>
void PagedItem(const PagedArgs &a, int64_t n, int64_t h, float *scratch, float *part = nullptr, int64_t first = 0) {
  const float *meta = a.meta + n * kMetaCols;
  const int64_t row = static_cast<int64_t>(meta[kRow]);
  const int64_t position = static_cast<int64_t>(meta[kPosition]), context = static_cast<int64_t>(meta[kContext]);
  const int64_t end = std::max<int64_t>(1, std::min(std::max(position + 1, context), a.ends[row]));
  const int64_t last = part ? std::min(end, first + a.split) : end, L = last - first;
  if (L <= 0) {   // a part past the row's end
    std::fill_n(part, PagedPart(a), 0.0f);
    for (int64_t j = 0; j < a.g; ++j) part[a.g * a.hd + a.g + j] = -INFINITY;
    return;
  }
  const int64_t g = a.g, hd = a.hd, bs = a.block, ld = (L + 7) & ~int64_t(7);
  const int64_t head_keys = hd * bs, block_values = a.kv * bs * hd;
  // scratch: each position's value row (L pointers), scores, sums, denominators
  const T **rows = reinterpret_cast<const T **>(scratch);
  float *s = scratch + ((2 * L + 15) & ~int64_t(15));
  float *o = s + g * ld;
  const float *q = a.q + (n * a.kv + h) * g * hd;
  const float *slope = a.slopes + h * g;
  const float *table = a.tables + row * a.T;
  const T *keys = static_cast<const T *>(a.keys), *values = static_cast<const T *>(a.values);
  const int64_t ahead = kPagedAhead * bs, key_bytes = head_keys * sizeof(T);
  for (int64_t start = first; start < last; start += bs) {
    const int64_t block = static_cast<int64_t>(table[start / bs]), count = std::min(bs, last - start);
    const T *K = keys + (block * a.kv + h) * head_keys;
    if (start + ahead < last) {
      const int64_t later = static_cast<int64_t>(table[(start + ahead) / bs]) * a.kv + h;
      const char *k = reinterpret_cast<const char *>(keys + later * head_keys);
      const char *v = reinterpret_cast<const char *>(values + later * head_keys);
      for (int64_t b = 0; b < key_bytes; b += 64) __builtin_prefetch(k + b, 0, 3), __builtin_prefetch(v + b, 0, 2);
    }
    const float *ks = a.key_scales ? a.key_scales + (block * a.kv + h) * KvScaleRuns(hd) * bs : nullptr;
    for (int64_t j = 0; j < g; j += ks ? 3 : 4) {
      float *sj = s + j * ld + start - first;
      if (ks) {     // int8 keys: by runs, three query heads at a time
        switch (std::min<int64_t>(3, g - j)) {
          case 3: PastScoresRuns<3, T, true>(q + j * hd, hd, K, bs, count, a.scale, slope + j, sj, ld, start, ks); break;
          case 2: PastScoresRuns<2, T, true>(q + j * hd, hd, K, bs, count, a.scale, slope + j, sj, ld, start, ks); break;
          default: PastScoresRuns<1, T, true>(q + j * hd, hd, K, bs, count, a.scale, slope + j, sj, ld, start, ks); break;
        }
        continue;
      }
      switch (std::min<int64_t>(4, g - j)) {
        case 4: PastScores<4, T, true>(q + j * hd, hd, K, bs, count, a.scale, slope + j, sj, ld, start); break;
        case 3: PastScores<3, T, true>(q + j * hd, hd, K, bs, count, a.scale, slope + j, sj, ld, start); break;
        case 2: PastScores<2, T, true>(q + j * hd, hd, K, bs, count, a.scale, slope + j, sj, ld, start); break;
        default: PastScores<1, T, true>(q + j * hd, hd, K, bs, count, a.scale, slope + j, sj, ld, start); break;
      }
    }
    const T *V = values + block * block_values + h * bs * hd;
    for (int64_t i = 0; i < count; ++i) rows[start - first + i] = V + i * hd;
  }
  float *den = o + g * hd, *largest = den + g;
  for (int64_t j = 0; j < g; ++j) den[j] = Softmax(s + j * ld, L, largest + j);
  if (a.value_scales) {   // int8 values: per run of head dimensions, each weight times its value's scale there
    const int64_t runs = KvScaleRuns(hd);
    float *w = largest + g;   // the weights of one run (the denominators are the unscaled weights')
    for (int64_t r = 0; r < runs; ++r) {
      for (int64_t start = first; start < last; start += bs) {
        const float *vs = a.value_scales + ((static_cast<int64_t>(table[start / bs]) * a.kv + h) * runs + r) * bs;
        float *ws = w + start - first;
        const float *ss = s + start - first;
        for (int64_t j = 0; j < g; ++j)
          for (int64_t i = 0; i < std::min(bs, last - start); ++i) ws[j * ld + i] = ss[j * ld + i] * vs[i];
      }
      WeighAll<T>(w, ld, g, 0, nullptr, rows, L, hd, o, r * kKvScaleRun, std::min(hd, (r + 1) * kKvScaleRun));
    }
  } else {
    WeighAll<T>(s, ld, g, 0, nullptr, rows, L, hd, o);
  }
  if (part) {
    std::copy_n(o, g * hd + 2 * g, part);   // the sums, denominators and largest scores
    return;
  }
  float *out = a.out + (n * a.kv + h) * g * hd;
  for (int64_t j = 0; j < g; ++j) {
    const float inv = 1.0f / den[j];
    for (int64_t d = 0; d < hd; ++d) out[j * hd + d] = o[j * hd + d] * inv;
  }
}

// Keys or values of the store as a GEMM panel (linear_gemm.h): step k is the 16 values at `at(k)`, a head
// dimension's 16 positions of a block's keys (hd, block), or a position's 16 head dimensions of its values.
template <typename T>
struct KeysPanel {
  const T *K;
  int64_t block;
  const T *At(int64_t d) const { return K + d * block; }
};
template <typename T>
struct ValuesPanel {
  const T *const *rows;   // each position's
  int64_t c;
  const T *At(int64_t p) const { return rows[p] + c; }
};
template <typename Where>
struct StoredPanel : Where {
  void Prefetch(int64_t) const {}
  void Get(int64_t k, V8 &lo, V8 &hi) const {
    lo = LoadAs(this->At(k));
    hi = LoadAs(this->At(k) + 8);
  }
  void Finish(V8 &, V8 &) const {}
#if defined(__AVX2__) && defined(__FMA__)
  __attribute__((target("avx512f"))) __m512 Get16(int64_t k) const { return Load16(this->At(k)); }
  __attribute__((target("avx512f"))) void Finish16(__m512 &) const {}
  __attribute__((target("avx512f"))) static __m512 Load16(const float *p) { return _mm512_loadu_ps(p); }
  __attribute__((target("avx512f"))) static __m512 Load16(const uint16_t *p) { return Half16(p); }
#endif
};

// y (rows, 16) = x (rows, K) times a panel's K steps, on AVX-512 registers where the CPU has them.
template <typename P>
void PanelProduct(bool wide, const float *x, int64_t ldx, int64_t rows, const P &panel, int64_t K, float *y,
                  int64_t ldy) {
#if defined(__AVX2__) && defined(__FMA__)
  if (wide) return GemmRows16(x, ldx, rows, panel, K, y, ldy, kTileCols);
#endif
  GemmRows<false>(x, ldx, rows, panel, K, y, ldy, kTileCols);
}

// Tokens n0 .. n1 - 1 of one row at consecutive positions (PagedArgs::tiles) on KV head h: their R query vectors
// against the row's blocks as two GEMMs, scores = Q K (block by block) and sums = weights V, so that each key and
// value is read and converted once for the R vectors instead of once a token.
template <typename T>
void PagedTile(const PagedArgs &a, int64_t n0, int64_t n1, int64_t h, float *scratch) {
  const int64_t g = a.g, hd = a.hd, bs = a.block, R = (n1 - n0) * g;
  const int64_t row = static_cast<int64_t>(a.meta[n0 * kMetaCols + kRow]);
  auto length = [&](int64_t n) {
    const float *meta = a.meta + n * kMetaCols;
    const int64_t position = static_cast<int64_t>(meta[kPosition]), context = static_cast<int64_t>(meta[kContext]);
    return std::max<int64_t>(1, std::min(std::max(position + 1, context), a.ends[row]));
  };
  int64_t most = 0;
  for (int64_t n = n0; n < n1; ++n) most = std::max(most, length(n));
  const int64_t ld = (most + 15) & ~int64_t(15);
  // scratch: the value rows (most pointers), queries (R, hd), scores (R, ld), sums (R, hd), denominators
  const T **rows = reinterpret_cast<const T **>(scratch);
  float *q = scratch + ((2 * most + 15) & ~int64_t(15));
  float *s = q + R * hd, *o = s + R * ld, *den = o + R * hd;
  for (int64_t n = n0; n < n1; ++n) std::copy_n(a.q + (n * a.kv + h) * g * hd, g * hd, q + (n - n0) * g * hd);
  const float *table = a.tables + row * a.T;
  for (int64_t start = 0; start < most; start += bs) {
    const int64_t block = static_cast<int64_t>(table[start / bs]), count = std::min(bs, most - start);
    const T *K = static_cast<const T *>(a.keys) + (block * a.kv + h) * hd * bs;
    for (int64_t p = 0; p < count; p += kTileCols)
      PanelProduct(a.wide, q, hd, R, StoredPanel<KeysPanel<T>>{{K + p, bs}}, hd, s + start + p, ld);
    const T *V = static_cast<const T *>(a.values) + (block * a.kv + h) * bs * hd;
    for (int64_t i = 0; i < count; ++i) rows[start + i] = V + i * hd;
  }
  const V8 sc = Bcast(a.scale);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t L = length(n0 + r / g);
    float *sr = s + r * ld;
    const V8 slope = Bcast(a.slopes[h * g + r % g]);
    for (int64_t p = 0; p < L; p += 8)
      Store(sr + p, Fma(slope, Add(Bcast(static_cast<float>(p)), Load(kIota)), Mul(Load(sr + p), sc)));
    den[r] = Softmax(sr, L);
    std::fill(sr + L, sr + most, 0.0f);   // positions past this token's: no weight
  }
  for (int64_t c = 0; c < hd; c += kTileCols)
    PanelProduct(a.wide, s, ld, R, StoredPanel<ValuesPanel<T>>{{rows, c}}, most, o + c, hd);
  for (int64_t r = 0; r < R; ++r) {
    const float inv = 1.0f / den[r];
    float *out = a.out + ((n0 + r / g) * a.kv + h) * g * hd + r % g * hd;
    for (int64_t d = 0; d < hd; ++d) out[d] = o[r * hd + d] * inv;
  }
}

}  // namespace

void Attend(const AttendArgs &a, int64_t i0, int64_t i1, float *scratch) {
  if (i0 < i1) Prefetch(a, i0 / a.kv, i0 % a.kv);
  for (int64_t i = i0; i < i1; ++i) {
    if (i + 1 < i1) Prefetch(a, (i + 1) / a.kv, (i + 1) % a.kv);
    Item(a, i / a.kv, i % a.kv, scratch);
  }
}

void PagedAttend(const PagedArgs &a, int64_t i0, int64_t i1, float *scratch) {
  for (int64_t i = i0; i < i1; ++i) {
    if (a.parts) {      // item i / splits, its part i % splits
      const int64_t item = i / a.splits, first = i % a.splits * a.split;
      float *part = a.parts + i * PagedPart(a);
      if (a.dtype == kKvFloat16) PagedItem<uint16_t>(a, item / a.kv, item % a.kv, scratch, part, first);
      else if (a.dtype == kKvInt8) PagedItem<int8_t>(a, item / a.kv, item % a.kv, scratch, part, first);
      else PagedItem<float>(a, item / a.kv, item % a.kv, scratch, part, first);
      continue;
    }
    const int64_t h = i % a.kv, n0 = a.tiles ? a.tiles[i / a.kv] : i / a.kv;
    const int64_t n1 = a.tiles ? a.tiles[i / a.kv + 1] : n0 + 1;
    if (n1 - n0 > 1 && a.dtype == kKvFloat16) PagedTile<uint16_t>(a, n0, n1, h, scratch);
    else if (n1 - n0 > 1) PagedTile<float>(a, n0, n1, h, scratch);
    else if (a.dtype == kKvFloat16) PagedItem<uint16_t>(a, n0, h, scratch);
    else if (a.dtype == kKvInt8) PagedItem<int8_t>(a, n0, h, scratch);
    else PagedItem<float>(a, n0, h, scratch);
  }
}

}  // namespace LK_NS
}  // namespace lk
