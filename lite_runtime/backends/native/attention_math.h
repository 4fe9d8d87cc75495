// The attention of a packed call (exporter/models/packed.py) as one kernel: N new tokens of any cache rows,
// each reading its own row of the caches in place, only the positions that row has cached, and the call's
// new keys of its row that it may see. attention_math.cc is compiled twice, as linear_math.cc is.
//
// A token n of row r at position t sees the cached positions p < past(n) of row r (score + slope * p) and
// the call's tokens m of row r at positions t_m <= t, or t_m < context(n) where the row has a prefix
// context (GLM; score + slope * t_m); one softmax over both, in float32. Slopes are ALiBi's (zeros
// otherwise), one per query head.
#pragma once
#include <algorithm>
#include <cstdint>

namespace lk {

// Columns of the per-token table `meta` (N, kMetaCols) the graph builds once a call.
enum MetaCol { kRow = 0, kPosition = 1, kPast = 2, kContext = 3, kMetaCols = 4 };

struct AttendArgs {
  const float *q = nullptr;        // (N, kv, g, hd)
  const float *k = nullptr;        // the call's new keys (N, kv, hd)
  const float *v = nullptr;        // and values (N, kv, hd)
  const float *k_cache = nullptr;  // (B, kv, hd, P)
  const float *v_cache = nullptr;  // (B, kv, P, hd)
  const float *meta = nullptr;     // (N, kMetaCols): row, position, past, context (-1: none)
  const float *slopes = nullptr;   // (kv * g,)
  float scale = 1.0f;
  int64_t N = 0, B = 0, kv = 0, g = 0, hd = 0, P = 0;
  float *out = nullptr;            // (N, kv * g * hd)
};

// Floats of scratch one work item needs.
inline int64_t AttendScratch(const AttendArgs &a) { return a.g * (a.P + a.N + 8 + a.hd + 1) + 3 * a.N + 16; }

// The paged form: K/V held in a store of blocks of `block` positions (paged_attention_kernel.cc), a block's keys
// (kv, hd, block) and values (kv, block, hd), float32 or float16; each row's blocks in its line of `tables`. The
// call's new K/V are written into the store first, so token n of row r at position t reads positions
// p < max(t + 1, context(n)) of its row, all from the store (no past/new split).
// What a paged store holds (lk_kv_create's dtype): float32, float16 bits, or int8 with a float32 scale for each
// position's key (and value) of each head: its largest magnitude / 127, llama.cpp's q8_0 rounding over the head.
constexpr int kKvFloat32 = 0, kKvFloat16 = 1, kKvInt8 = 2;

struct PagedArgs {
  const float *q = nullptr;        // (N, kv, g, hd)
  const float *meta = nullptr;     // (N, kMetaCols)
  const float *tables = nullptr;   // (B, T): each row's block ids, as floats
  const float *slopes = nullptr;   // (kv * g,)
  const void *keys = nullptr;      // this layer's keys, block after block
  const void *values = nullptr;    // and values
  int dtype = 0;                   // what the store holds: kKvFloat32, kKvFloat16 (bits) or kKvInt8
  const float *key_scales = nullptr, *value_scales = nullptr;   // int8: (block, head, run, position)
  float scale = 1.0f;
  int64_t N = 0, B = 0, T = 0, kv = 0, g = 0, hd = 0, block = 0;
  const int64_t *ends = nullptr;   // (B,): positions each row holds after the call's writes
  // Work items: with `tiles`, (tile, KV head) pairs, tile t the tokens tiles[t] .. tiles[t + 1] - 1 (one row's,
  // at consecutive positions: a prompt's chunk); without, (token, KV head) pairs.
  const int64_t *tiles = nullptr;
  bool wide = false;               // AVX-512 present (avx2 build only): the tiles' GEMMs on 16-float registers
  // Or, with `parts`, (token, KV head, part) triples: part k the positions [k * split, (k + 1) * split) of its
  // token's, `splits` parts a token (a few long rows on more threads than their items); each writes PagedPart
  // floats to parts, combined after (paged_attention_kernel.cc, Combine).
  float *parts = nullptr;
  int64_t splits = 1, split = 0;
  float *out = nullptr;            // (N, kv * g * hd)
};

// int8 K/V: a scale for each run of this many head dimensions of a position (llama.cpp's q8_0 blocks).
constexpr int64_t kKvScaleRun = 32;
inline int64_t KvScaleRuns(int64_t hd) { return (hd + kKvScaleRun - 1) / kKvScaleRun; }

// Tokens of a tile (PagedArgs::tiles) of a prompt's chunk: about 24 query vectors of one KV head (12 and 36
// measured slower), each key and value read and converted once for all of them.
inline int64_t PagedTileTokens(int64_t g) { return std::max<int64_t>(2, 24 / g); }
// Whether a store's keys and values take the tiles' GEMMs: blocks and heads in panels of 16, float32 or float16.
inline bool PagedTiles(const PagedArgs &a) { return a.block % 16 == 0 && a.hd % 16 == 0 && a.dtype != kKvInt8; }

// Floats of a part's results: its sums (g, hd), denominators (g) and largest scores (g).
inline int64_t PagedPart(const PagedArgs &a) { return a.g * (a.hd + 2); }

// Floats of scratch one paged work item needs: int8 values also one run's weights; a tile its queries, scores,
// sums, denominators and value rows.
inline int64_t PagedScratch(const PagedArgs &a) {
  const int64_t L = a.T * a.block, rows = PagedTileTokens(a.g) * a.g;
  return std::max(a.g * (2 * (L + 8) + a.hd + 2) + 2 * L + 16, rows * (2 * a.hd + L + 16 + 1) + 2 * L + 16);
}

// Work items [i0, i1): (token, KV head) pairs, item = n * kv + h, or as PagedArgs::tiles or parts say.
using AttendFn = void (*)(const AttendArgs &a, int64_t i0, int64_t i1, float *scratch);

namespace avx2 {
void Attend(const AttendArgs &a, int64_t i0, int64_t i1, float *scratch);
void PagedAttend(const PagedArgs &a, int64_t i0, int64_t i1, float *scratch);
}
namespace generic {
void Attend(const AttendArgs &a, int64_t i0, int64_t i1, float *scratch);
void PagedAttend(const PagedArgs &a, int64_t i0, int64_t i1, float *scratch);
}

}  // namespace lk
