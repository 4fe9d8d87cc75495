// The paged KV store and its attention node (LitePagedAttend; the loops: attention_math.cc's PagedItem and
// PagedTile).
//
// A store is allocated once, by the runtime, for a session: `blocks` blocks of `block` positions for every
// layer, float16, float32 or int8 (each run of kKvScaleRun values of a position's key and value of each head
// with a float32 scale: their largest magnitude / 127, rounded to nearest even, as llama.cpp's q8_0 blocks),
// zeroed lazily by the system (calloc), so that memory is
// resident only for the blocks used. The graph's attention node of layer l gets q (N, kv, g, hd), the call's new keys and values
// (N, kv, hd), meta (N, 4), each row's block ids (B, T), the store's id (1,) and its layer (1,); it writes each
// new token's key and value into its row's block at its position, then attends over the store. Nothing of
// the cache is a graph input or output.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attention_math.h"
#include "kernel_support.h"
#include "lite_registry.h"
#include "thread_pool.h"

namespace lk {
namespace {

using mindspore::DataType;
using mindspore::MSTensor;

constexpr char kPagedType[] = "LitePagedAttend";
constexpr int kPagedInputs = 9;   // q, k, v, meta, tables, store, layer, slopes, scale

struct KvStore {
  int64_t layers = 0, blocks = 0, block = 0, kv = 0, hd = 0;
  int dtype = kKvFloat32;
  void *data = nullptr;     // layer after layer: its keys (blocks, kv, hd, block), then its values (blocks, kv, block, hd)
  float *scales = nullptr;  // int8: layer after layer, its keys' scales (blocks, kv, runs, block), then its values'
  ~KvStore() {
    std::free(data);
    std::free(scales);
  }
  int64_t Elements() const { return blocks * kv * block * hd; }   // of the keys (or values) of one layer
  int64_t ScaleCount() const { return blocks * kv * KvScaleRuns(hd) * block; }   // int8: of one layer's keys
  int64_t ElementBytes() const { return dtype == kKvFloat32 ? 4 : dtype == kKvFloat16 ? 2 : 1; }
  char *Part(int64_t layer, int which) const {
    return static_cast<char *>(data) + (2 * layer + which) * Elements() * ElementBytes();
  }
  float *Scales(int64_t layer, int which) const {
    return scales ? scales + (2 * layer + which) * ScaleCount() : nullptr;
  }
};

// x (hd floats) as int8 at out[0], out[stride], ...: returns its scale (0 for zeros).
float QuantizeI8(const float *x, int64_t hd, int8_t *out, int64_t stride) {
  float amax = 0.0f;
  for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float scale = amax / 127.0f;
  for (int64_t d = 0; d < hd; ++d) out[d * stride] = scale > 0.0f ? static_cast<int8_t>(std::nearbyint(x[d] / scale)) : 0;
  return scale;
}

std::mutex g_stores_mutex;
std::vector<std::unique_ptr<KvStore>> g_stores;   // index = id; freed ones are null

KvStore *FindStore(int64_t id) {
  std::lock_guard<std::mutex> lock(g_stores_mutex);
  return id >= 0 && id < static_cast<int64_t>(g_stores.size()) ? g_stores[id].get() : nullptr;
}

uint16_t FloatToHalf(float f) {   // round to nearest even; beyond float16's range: infinity
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000;
  x &= 0x7FFFFFFF;
  if (x >= 0x7F800000) return sign | 0x7C00 | (x > 0x7F800000 ? 0x200 : 0);
  if (x >= 0x477FF000) return sign | 0x7C00;
  if (x < 0x38800000) {   // subnormal or zero in float16
    const uint32_t m = (x & 0x7FFFFF) | 0x800000;
    const int shift = 126 - static_cast<int>(x >> 23);
    if (shift > 25) return sign;
    const uint32_t half = m >> shift, rest = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
    return sign | (half + (rest > mid || (rest == mid && (half & 1))));
  }
  const uint32_t half = ((x >> 13) - (112u << 10)), rest = x & 0x1FFF;
  return sign | (half + (rest > 0x1000 || (rest == 0x1000 && (half & 1))));
}

// n floats as float16 bits at out[0], out[stride], ...: 8 at a time by F16C where the loops are AVX2's (the
// same rounding), else one by one.
__attribute__((target("avx,f16c"))) void HalvesF16c(const float *x, int64_t n, uint16_t *out, int64_t stride) {
  int64_t d = 0;
  alignas(16) uint16_t h[8];
  for (; d + 8 <= n; d += 8) {
    const __m128i v = _mm256_cvtps_ph(_mm256_loadu_ps(x + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (stride == 1) {
      _mm_storeu_si128(reinterpret_cast<__m128i *>(out + d), v);
      continue;
    }
    _mm_store_si128(reinterpret_cast<__m128i *>(h), v);
    for (int i = 0; i < 8; ++i) out[(d + i) * stride] = h[i];
  }
  for (; d < n; ++d) out[d * stride] = FloatToHalf(x[d]);
}

void Halves(const float *x, int64_t n, uint16_t *out, int64_t stride) {
  if (Avx2Loops()) return HalvesF16c(x, n, out, stride);
  for (int64_t d = 0; d < n; ++d) out[d * stride] = FloatToHalf(x[d]);
}

struct PagedCall {
  const float *k = nullptr, *v = nullptr;   // the call's new keys and values (N, kv, hd)
  const KvStore *store = nullptr;
  int64_t layer = 0;
};

// Writes each token's key and value into its row's block; the rows' ends (positions held after the call).
int WriteTokens(const PagedArgs &a, const PagedCall &c, std::vector<int64_t> *ends) {
  const KvStore &st = *c.store;
  ends->assign(a.B, 0);
  char *keys = st.Part(c.layer, 0), *values = st.Part(c.layer, 1);
  for (int64_t n = 0; n < a.N; ++n) {
    const float *meta = a.meta + n * kMetaCols;
    const float rowf = meta[kRow], positionf = meta[kPosition];
    if (!(rowf >= 0.0f && rowf < static_cast<float>(a.B)))
      return Fail("token " + std::to_string(n) + " is of row " + std::to_string(rowf) + "; the block tables have " +
                  std::to_string(a.B) + " rows");
    const int64_t row = static_cast<int64_t>(rowf), position = static_cast<int64_t>(positionf);
    if (!(positionf >= 0.0f) || position / st.block >= a.T)
      return Fail("token " + std::to_string(n) + " at position " + std::to_string(positionf) + ": the block tables hold " +
                  std::to_string(a.T * st.block) + " positions a row");
    const float blockf = a.tables[row * a.T + position / st.block];
    if (!(blockf >= 0.0f && blockf < static_cast<float>(st.blocks)))
      return Fail("row " + std::to_string(row) + "'s block for position " + std::to_string(position) + " is " +
                  std::to_string(blockf) + "; the store has " + std::to_string(st.blocks) + " blocks");
    (*ends)[row] = std::max((*ends)[row], position + 1);
    const int64_t block = static_cast<int64_t>(blockf), slot = position % st.block;
    for (int64_t h = 0; h < st.kv; ++h) {
      const float *key = c.k + (n * st.kv + h) * st.hd, *value = c.v + (n * st.kv + h) * st.hd;
      const int64_t kbase = (block * st.kv + h) * st.hd * st.block + slot, vbase = ((block * st.kv + h) * st.block + slot) * st.hd;
      if (st.dtype == kKvInt8) {
        const int64_t runs = KvScaleRuns(st.hd);
        for (int64_t r = 0, d0 = 0; r < runs; ++r, d0 += kKvScaleRun) {
          const int64_t at = ((block * st.kv + h) * runs + r) * st.block + slot, n = std::min(kKvScaleRun, st.hd - d0);
          st.Scales(c.layer, 0)[at] =
              QuantizeI8(key + d0, n, reinterpret_cast<int8_t *>(keys) + kbase + d0 * st.block, st.block);
          st.Scales(c.layer, 1)[at] = QuantizeI8(value + d0, n, reinterpret_cast<int8_t *>(values) + vbase + d0, 1);
        }
      } else if (st.dtype == kKvFloat16) {
        Halves(key, st.hd, reinterpret_cast<uint16_t *>(keys) + kbase, st.block);
        Halves(value, st.hd, reinterpret_cast<uint16_t *>(values) + vbase, 1);
      } else {
        float *K = reinterpret_cast<float *>(keys), *V = reinterpret_cast<float *>(values);
        for (int64_t d = 0; d < st.hd; ++d) K[kbase + d * st.block] = key[d], V[vbase + d] = value[d];
      }
    }
  }
  return 0;
}

// The call's tiles (PagedArgs::tiles): runs of up to PagedTileTokens tokens of one row at consecutive positions,
// as each row's chunk of a prompt comes; their first tokens, then N.
std::vector<int64_t> Tiles(const PagedArgs &a) {
  std::vector<int64_t> first;
  const int64_t most = PagedTileTokens(a.g);
  for (int64_t n = 0; n < a.N; ++n) {
    const float *meta = a.meta + n * kMetaCols, *prev = meta - kMetaCols;
    if (n == 0 || n - first.back() == most || meta[kRow] != prev[kRow] || meta[kPosition] != prev[kPosition] + 1.0f)
      first.push_back(n);
  }
  first.push_back(a.N);
  return first;
}

// A call of fewer (token, KV head) items than this many a thread, of a row this many positions long or more,
// splits each token's positions in parts (flash decoding): a lone sequence's decode step on every thread.
constexpr int64_t kSplitItems = 4, kSplitPositions = 256;

// Each item's output from its parts (PagedArgs::parts): their sums and denominators, each part's weighted by
// e^(its largest score - the largest of all).
void Combine(const PagedArgs &a, int64_t items) {
  const int64_t size = PagedPart(a), g = a.g, hd = a.hd;
  for (int64_t i = 0; i < items; ++i)
    for (int64_t j = 0; j < g; ++j) {
      const float *first = a.parts + i * a.splits * size;
      float most = -INFINITY, den = 0.0f;
      for (int64_t k = 0; k < a.splits; ++k) most = std::max(most, first[k * size + g * hd + g + j]);
      float *out = a.out + (i * g + j) * hd;
      std::fill_n(out, hd, 0.0f);
      for (int64_t k = 0; k < a.splits; ++k) {
        const float *part = first + k * size;
        if (part[g * hd + g + j] == -INFINITY) continue;   // past its row's end
        const float w = std::exp(part[g * hd + g + j] - most);
        den += w * part[g * hd + j];
        for (int64_t d = 0; d < hd; ++d) out[d] += w * part[j * hd + d];
      }
      const float inv = 1.0f / den;
      for (int64_t d = 0; d < hd; ++d) out[d] *= inv;
    }
}

int RunPaged(PagedArgs a, const PagedCall &c, int threads) {
  if (c.store == nullptr) return Fail("no KV store of that id (freed, or never made)");
  const KvStore &st = *c.store;
  if (c.layer < 0 || c.layer >= st.layers)
    return Fail("layer " + std::to_string(c.layer) + "; the store holds " + std::to_string(st.layers));
  if (a.kv != st.kv || a.hd != st.hd)
    return Fail("q has " + std::to_string(a.kv) + " KV heads of " + std::to_string(a.hd) + "; the store holds " +
                std::to_string(st.kv) + " of " + std::to_string(st.hd));
  a.block = st.block, a.dtype = st.dtype, a.keys = st.Part(c.layer, 0), a.values = st.Part(c.layer, 1);
  a.key_scales = st.Scales(c.layer, 0), a.value_scales = st.Scales(c.layer, 1);
  std::vector<int64_t> ends;
  if (WriteTokens(a, c, &ends)) return 1;
  a.ends = ends.data();
  int64_t work = 0;
  for (int64_t n = 0; n < a.N; ++n) work += static_cast<int64_t>(a.meta[n * kMetaCols + kPosition]) + 1;
  std::vector<int64_t> tiles;
  if (PagedTiles(a)) tiles = Tiles(a);
  if (tiles.size() <= static_cast<size_t>(a.N)) a.tiles = tiles.data();   // some tile of several tokens
  a.wide = WideLoops();
  const int64_t items = (a.tiles ? static_cast<int64_t>(tiles.size()) - 1 : a.N) * a.kv;
  int n = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
  if (work * a.kv * a.g * a.hd < (1 << 14)) n = 1;   // waking a thread costs more than such a call
  std::vector<float> parts;
  const int64_t longest = ends.empty() ? 0 : *std::max_element(ends.begin(), ends.end());
  if (!a.tiles && threads > 1 && items < kSplitItems * threads && longest >= 2 * kSplitPositions) {
    a.splits = std::min<int64_t>(longest / kSplitPositions, (kSplitItems * threads + items - 1) / items);
    a.split = ((longest + a.splits - 1) / a.splits + a.block - 1) / a.block * a.block;
    parts.resize(items * a.splits * PagedPart(a));
    a.parts = parts.data();
    n = threads;
  }
  const int64_t units = items * a.splits, chunks = std::min<int64_t>(units, n == 1 ? 1 : 8 * n);
  const int64_t need = PagedScratch(a);
  Pool::Get().Run(n, chunks, [&](int64_t ch) {
    thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
    (Avx2Loops() ? avx2::PagedAttend : generic::PagedAttend)(a, units * ch / chunks, units * (ch + 1) / chunks,
                                                             scratch.data());
  });
  if (a.parts) Combine(a, items);
  return 0;
}

class PagedKernel : public mindspore::kernel::Kernel {
 public:
  using Kernel::Kernel;

  int Prepare() override {
    const std::string who = std::string(kPagedType) + ": ";
    if (inputs_.size() != kPagedInputs)
      return Report(who + std::to_string(inputs_.size()) + " inputs, expected " + std::to_string(kPagedInputs));
    for (const auto &t : inputs_)
      if (t.DataType() != DataType::kNumberTypeFloat32) return Report(who + "every input must be float32");
    return 0;
  }
  int ReSize() override { return Prepare(); }

  int Execute() override {
    const std::string who = std::string(kPagedType) + ": ";
    const auto &qs = inputs_[0].Shape(), &ts = inputs_[4].Shape();
    if (qs.size() != 4 || ts.size() != 2 || inputs_[3].Shape().size() != 2)
      return Report(who + "q " + Shape(qs) + " must be 4-D, meta and the block tables " + Shape(ts) + " 2-D");
    PagedArgs a;
    a.N = qs[0], a.kv = qs[1], a.g = qs[2], a.hd = qs[3], a.B = ts[0], a.T = ts[1];
    if (inputs_[1].ElementNum() != a.N * a.kv * a.hd || inputs_[2].ElementNum() != a.N * a.kv * a.hd ||
        inputs_[3].Shape() != std::vector<int64_t>{a.N, kMetaCols} || inputs_[5].ElementNum() != 1 ||
        inputs_[6].ElementNum() != 1 || inputs_[7].ElementNum() != a.kv * a.g || inputs_[8].ElementNum() != 1)
      return Report(who + "inputs do not fit q " + Shape(qs) + " and the block tables " + Shape(ts));
    std::vector<int64_t> ys{a.N, a.kv * a.g * a.hd};
    auto &y = outputs_[0];
    if (y.Shape() != ys) y.SetShape(ys);
    std::shared_ptr<const void> data[kPagedInputs];
    for (int i = 0; i < kPagedInputs; ++i)
      if (!(data[i] = inputs_[i].Data()) && inputs_[i].ElementNum() > 0) return Report(who + "no data");
    auto f = [&](int i) { return static_cast<const float *>(data[i].get()); };
    PagedCall c;
    a.q = f(0), c.k = f(1), c.v = f(2), a.meta = f(3), a.tables = f(4), a.slopes = f(7), a.scale = *f(8);
    c.store = FindStore(static_cast<int64_t>(*f(5)));
    c.layer = static_cast<int64_t>(*f(6));
    a.out = static_cast<float *>(y.MutableData());
    if (a.out == nullptr && a.N > 0) return Report(who + "no output buffer");
    const int lite_threads = context_ ? std::max(1, context_->GetThreadNum()) : 1;
    if (RunPaged(a, c, KernelsHoldThreads() ? KernelThreads(lite_threads) : 1)) return Report(who + g_last_error);
    return 0;
  }
};

class PagedInfer : public mindspore::kernel::KernelInterface {
 public:
  mindspore::Status Infer(std::vector<MSTensor> *inputs, std::vector<MSTensor> *outputs,
                          const mindspore::schema::Primitive *) override {
    if (inputs->size() != kPagedInputs || outputs->size() != 1) return mindspore::kLiteError;
    const std::vector<int64_t> q = (*inputs)[0].Shape();
    auto &y = (*outputs)[0];
    y.SetDataType(DataType::kNumberTypeFloat32);
    if (q.size() != 4) return mindspore::kLiteInferInvalid;   // q's rank is unknown until Resize
    y.SetFormat((*inputs)[0].format());
    y.SetShape({q[0], q[1] * q[2] * q[3]});
    return mindspore::kSuccess;
  }
};

}  // namespace

int RegisterPagedAttend(bool op_info) {
  return RegisterFloatCustom(
    kPagedType, kPagedInputs, op_info,
    [](const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs,
       const mindspore::schema::Primitive *primitive, const mindspore::Context *ctx) {
      return std::make_shared<PagedKernel>(inputs, outputs, primitive, ctx);
    },
    [] { return std::make_shared<PagedInfer>(); });
}

}  // namespace lk

extern "C" {

// A store of `blocks` blocks of `block` positions for `layers` layers of `kv` heads of `hd`, holding `dtype`
// (lk::kKvFloat32, kKvFloat16 or kKvInt8): its id, or -1 (lk_last_error says why).
int64_t lk_kv_create(int64_t layers, int64_t blocks, int64_t block, int64_t kv, int64_t hd, int dtype) {
  if (dtype != lk::kKvFloat32 && dtype != lk::kKvFloat16 && dtype != lk::kKvInt8)
    return lk::Fail("a KV store of dtype " + std::to_string(dtype) + ": allowed 0 (float32), 1 (float16), 2 (int8)"), -1;
  if (layers <= 0 || blocks <= 0 || block <= 0 || block % 8 || kv <= 0 || hd <= 0)
    return lk::Fail("a KV store of " + std::to_string(layers) + " layers, " + std::to_string(blocks) + " blocks of " +
                    std::to_string(block) + " positions (a multiple of 8), " + std::to_string(kv) + " heads of " +
                    std::to_string(hd)), -1;
  auto store = std::make_unique<lk::KvStore>();
  store->layers = layers, store->blocks = blocks, store->block = block, store->kv = kv, store->hd = hd;
  store->dtype = dtype;
  store->data = std::calloc(static_cast<size_t>(2 * layers * store->Elements()), store->ElementBytes());
  if (dtype == lk::kKvInt8) store->scales = static_cast<float *>(std::calloc(2 * layers * store->ScaleCount(), 4));
  if (store->data == nullptr || (dtype == lk::kKvInt8 && store->scales == nullptr))
    return lk::Fail("could not reserve " + std::to_string(2 * layers * store->Elements() * store->ElementBytes()) +
                    " bytes for the KV store"), -1;
  std::lock_guard<std::mutex> lock(lk::g_stores_mutex);
  lk::g_stores.push_back(std::move(store));
  return static_cast<int64_t>(lk::g_stores.size()) - 1;
}

int lk_kv_free(int64_t id) {
  std::lock_guard<std::mutex> lock(lk::g_stores_mutex);
  if (id < 0 || id >= static_cast<int64_t>(lk::g_stores.size()) || !lk::g_stores[id])
    return lk::Fail("no KV store " + std::to_string(id));
  lk::g_stores[id].reset();
  return 0;
}

// The bytes store `id` holds (its values and, int8, their scales), or -1.
int64_t lk_kv_bytes(int64_t id) {
  const lk::KvStore *st = lk::FindStore(id);
  if (st == nullptr) return lk::Fail("no KV store " + std::to_string(id)), -1;
  return 2 * st->layers * (st->Elements() * st->ElementBytes() + (st->scales ? st->ScaleCount() * 4 : 0));
}

// Copies block `src` into block `dst` in every layer (a shared block written by one of its users).
int lk_kv_copy_block(int64_t id, int64_t src, int64_t dst) {
  const lk::KvStore *st = lk::FindStore(id);
  if (st == nullptr) return lk::Fail("no KV store " + std::to_string(id));
  if (src < 0 || dst < 0 || src >= st->blocks || dst >= st->blocks)
    return lk::Fail("blocks " + std::to_string(src) + " -> " + std::to_string(dst) + " of " + std::to_string(st->blocks));
  const int64_t bytes = st->kv * st->block * st->hd * st->ElementBytes(), scales = st->ScaleCount() / st->blocks;
  for (int64_t layer = 0; layer < st->layers; ++layer)
    for (int which = 0; which < 2; ++which) {
      std::memcpy(st->Part(layer, which) + dst * bytes, st->Part(layer, which) + src * bytes, bytes);
      if (float *s = st->Scales(layer, which)) std::memcpy(s + dst * scales, s + src * scales, scales * sizeof(float));
    }
  return 0;
}

// A block of one layer as float32 (tests): keys (kv, hd, block), values (kv, block, hd).
int lk_kv_read(int64_t id, int64_t layer, int64_t block, float *keys, float *values) {
  const lk::KvStore *st = lk::FindStore(id);
  if (st == nullptr || layer < 0 || layer >= st->layers || block < 0 || block >= st->blocks)
    return lk::Fail("no block " + std::to_string(block) + " of layer " + std::to_string(layer) + " in KV store " +
                    std::to_string(id));
  const int64_t n = st->kv * st->block * st->hd;
  for (int which = 0; which < 2; ++which) {
    const char *part = st->Part(layer, which) + block * n * st->ElementBytes();
    const float *scales = st->Scales(layer, which);
    float *out = which ? values : keys;
    for (int64_t i = 0; i < n; ++i) {
      if (st->dtype == lk::kKvInt8) {     // keys (kv, hd, block), values (kv, block, hd): each run's scale
        const int64_t h = i / (st->block * st->hd), slot = which ? i / st->hd % st->block : i % st->block;
        const int64_t d = which ? i % st->hd : i / st->block % st->hd, runs = lk::KvScaleRuns(st->hd);
        out[i] = reinterpret_cast<const int8_t *>(part)[i] *
                 scales[((block * st->kv + h) * runs + d / lk::kKvScaleRun) * st->block + slot];
      } else {
        out[i] = st->dtype == lk::kKvFloat16 ? lk::HalfToFloat(reinterpret_cast<const uint16_t *>(part)[i])
                                             : reinterpret_cast<const float *>(part)[i];
      }
    }
  }
  return 0;
}

// The paged attention without Lite (tests, benchmarks): as the node of `layer`, shapes as attention_math.h.
int lk_paged_attend(const float *q, const float *k, const float *v, const float *meta, const float *tables, int64_t B,
                    int64_t T, int64_t store, int64_t layer, const float *slopes, float scale, int64_t N, int64_t kv,
                    int64_t g, int64_t hd, float *out, int threads) {
  lk::PagedArgs a;
  lk::PagedCall c;
  a.q = q, a.meta = meta, a.tables = tables, a.slopes = slopes, a.scale = scale, a.out = out;
  a.N = N, a.B = B, a.T = T, a.kv = kv, a.g = g, a.hd = hd;
  c.k = k, c.v = v, c.store = lk::FindStore(store), c.layer = layer;
  return lk::RunPaged(a, c, threads);
}

}  // extern "C"
