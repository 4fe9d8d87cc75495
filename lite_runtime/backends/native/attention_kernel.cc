// The packed call's attention as a Custom kernel of Lite (LiteAttend; the loops: attention_math.cc): inputs
// q (N, kv, g, hd), the call's new keys and values (N, kv, hd), the caches K (B, kv, hd, P) and V (B, kv, P, hd),
// meta (N, 4), slopes (kv * g,) and scale (1,), all float32; out (N, kv * g * hd). Work items, (token, KV
// head) pairs, are shared by the kernels' pool.
#include <algorithm>
#include <memory>
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

constexpr char kAttendType[] = "LiteAttend";
constexpr int kAttendInputs = 8;   // q, k, v, k_cache, v_cache, meta, slopes, scale

// The attention of a packed call over the pool: work items are (token, KV head) pairs.
int RunAttend(const AttendArgs &a, int threads) {
  if (a.N < 0 || a.B <= 0 || a.kv <= 0 || a.g <= 0 || a.hd <= 0 || a.P < 0)
    return Fail("shape N=" + std::to_string(a.N) + " B=" + std::to_string(a.B) + " kv=" + std::to_string(a.kv) +
                " g=" + std::to_string(a.g) + " hd=" + std::to_string(a.hd) + " P=" + std::to_string(a.P));
  int64_t work = 0;
  for (int64_t n = 0; n < a.N; ++n) {
    const float row = a.meta[n * kMetaCols + kRow];
    if (!(row >= 0.0f && row < static_cast<float>(a.B)))
      return Fail("token " + std::to_string(n) + " is of cache row " + std::to_string(row) + "; the caches have " +
                  std::to_string(a.B));
    work += std::min<int64_t>(std::max(0.0f, a.meta[n * kMetaCols + kPast]), a.P) + 1;
  }
  const int64_t items = a.N * a.kv;
  int n = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
  if (work * a.kv * a.g * a.hd < (1 << 14)) n = 1;   // waking a thread costs more than such a call
  const int64_t chunks = std::min<int64_t>(items, n == 1 ? 1 : 8 * n), need = AttendScratch(a);
  Pool::Get().Run(n, chunks, [&](int64_t c) {
    thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
    (Avx2Loops() ? avx2::Attend : generic::Attend)(a, items * c / chunks, items * (c + 1) / chunks, scratch.data());
  });
  return 0;
}

class AttendKernel : public mindspore::kernel::Kernel {
 public:
  using Kernel::Kernel;

  int Prepare() override {
    const std::string who = std::string(kAttendType) + ": ";
    if (inputs_.size() != kAttendInputs)
      return Report(who + std::to_string(inputs_.size()) + " inputs, expected " + std::to_string(kAttendInputs));
    for (const auto &t : inputs_)
      if (t.DataType() != DataType::kNumberTypeFloat32) return Report(who + "every input must be float32");
    return 0;
  }
  int ReSize() override { return Prepare(); }

  int Execute() override {
    const std::string who = std::string(kAttendType) + ": ";
    const auto &qs = inputs_[0].Shape(), &ks = inputs_[3].Shape();
    if (qs.size() != 4 || ks.size() != 4 || inputs_[5].Shape().size() != 2)
      return Report(who + "q " + Shape(qs) + " and the key cache " + Shape(ks) + " must be 4-D, meta 2-D");
    lk::AttendArgs a;
    a.N = qs[0], a.kv = qs[1], a.g = qs[2], a.hd = qs[3], a.B = ks[0], a.P = ks[3];
    if (ks[1] != a.kv || ks[2] != a.hd || inputs_[4].Shape() != std::vector<int64_t>{a.B, a.kv, a.P, a.hd} ||
        inputs_[1].ElementNum() != a.N * a.kv * a.hd || inputs_[2].ElementNum() != a.N * a.kv * a.hd ||
        inputs_[5].Shape() != std::vector<int64_t>{a.N, lk::kMetaCols} || inputs_[6].ElementNum() != a.kv * a.g ||
        inputs_[7].ElementNum() != 1)
      return Report(who + "inputs do not fit q " + Shape(qs) + " and the key cache " + Shape(ks));
    std::vector<int64_t> ys{a.N, a.kv * a.g * a.hd};
    auto &y = outputs_[0];
    if (y.Shape() != ys) y.SetShape(ys);
    std::shared_ptr<const void> data[kAttendInputs];
    for (int i = 0; i < kAttendInputs; ++i)
      if (!(data[i] = inputs_[i].Data()) && inputs_[i].ElementNum() > 0) return Report(who + "no data");
    auto f = [&](int i) { return static_cast<const float *>(data[i].get()); };
    a.q = f(0), a.k = f(1), a.v = f(2), a.k_cache = f(3), a.v_cache = f(4), a.meta = f(5), a.slopes = f(6);
    a.scale = *f(7);
    a.out = static_cast<float *>(y.MutableData());
    if (a.out == nullptr && a.N > 0) return Report(who + "no output buffer");
    // Where Lite holds the threads (float32 weights), its workers spin through the whole graph run, and a
    // second attention thread only competes with them (docs/measured-choices.md).
    const int lite_threads = context_ ? std::max(1, context_->GetThreadNum()) : 1;
    if (RunAttend(a, KernelsHoldThreads() ? KernelThreads(lite_threads) : 1)) return Report(who + g_last_error);
    return 0;
  }
};

class AttendInfer : public mindspore::kernel::KernelInterface {
 public:
  mindspore::Status Infer(std::vector<MSTensor> *inputs, std::vector<MSTensor> *outputs,
                          const mindspore::schema::Primitive *) override {
    if (inputs->size() != kAttendInputs || outputs->size() != 1) return mindspore::kLiteError;
    const std::vector<int64_t> q = (*inputs)[0].Shape();
    auto &y = (*outputs)[0];
    y.SetDataType(DataType::kNumberTypeFloat32);
    if (q.size() != 4) return mindspore::kLiteInferInvalid;   // q's rank is unknown until Resize (the converter's pass)
    y.SetFormat((*inputs)[0].format());
    y.SetShape({q[0], q[1] * q[2] * q[3]});
    return mindspore::kSuccess;
  }
};

}  // namespace

int RegisterAttend(bool op_info) {
  return RegisterFloatCustom(
    kAttendType, kAttendInputs, op_info,
    [](const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs,
       const mindspore::schema::Primitive *primitive, const mindspore::Context *ctx) {
      return std::make_shared<AttendKernel>(inputs, outputs, primitive, ctx);
    },
    [] { return std::make_shared<AttendInfer>(); });
}

}  // namespace lk

extern "C" {

// The packed call's attention without Lite (tests, benchmarks): shapes and layouts as attention_math.h.
int lk_attend(const float *q, const float *k, const float *v, const float *k_cache, const float *v_cache,
              const float *meta, const float *slopes, float scale, int64_t N, int64_t B, int64_t kv, int64_t g,
              int64_t hd, int64_t P, float *out, int threads) {
  lk::AttendArgs a;
  a.q = q, a.k = k, a.v = v, a.k_cache = k_cache, a.v_cache = v_cache, a.meta = meta, a.slopes = slopes;
  a.scale = scale, a.N = N, a.B = B, a.kv = kv, a.g = g, a.hd = hd, a.P = P, a.out = out;
  return lk::RunAttend(a, threads);
}

}  // extern "C"
