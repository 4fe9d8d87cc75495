// A decoder layer's small float32 ops as Custom kernels of Lite, each one node where the graph form is several:
//   LiteRMSNorm  x (..., H), weight (H,), eps (1,)       -> x / sqrt(mean(x²) + eps) · weight
//   LiteLayerNorm x (..., H), weight, bias (H,), eps (1,) -> (x - mean) / sqrt(var + eps) · weight + bias
//   LiteSwiGLU   gate (..., F), up (..., F)               -> gate · sigmoid(gate) · up
//   LiteGELU     x (..., F), form (1,) (layer_math.h's GeluForm) -> GELU(x)
//   LiteRotary   x (N, n·hd), cos, sin (N·hd), pair (2, hd) -> (N, n, hd): x · cos + partner · sin, where
//                partner[i] = pair[1][i] · x[pair[0][i]] (pair[0][i] < 0: no partner), as positions.py's P
// Each costs Lite one node's dispatch instead of 3-9 (Lite's dispatch of many small kernels was a large part of a
// step: docs/measured-choices.md). Their work is a few µs per token (the loops: layer_math.cc): a call of many
// tokens shares its rows over the kernels' pool where the kernels hold the threads (as the attention kernel does).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernel_support.h"
#include "layer_math.h"
#include "lite_registry.h"
#include "thread_pool.h"

namespace lk {
namespace {

using mindspore::DataType;
using mindspore::MSTensor;

enum Op { kNorm, kLayerNorm, kSwiGLU, kGelu, kRotary };
struct OpType {
  const char *name;
  Op op;
  int inputs;
};
const OpType kOps[] = {{"LiteRMSNorm", kNorm, 3}, {"LiteLayerNorm", kLayerNorm, 4}, {"LiteSwiGLU", kSwiGLU, 2},
                       {"LiteGELU", kGelu, 2}, {"LiteRotary", kRotary, 4}};
constexpr int64_t kSplitFloats = int64_t(1) << 16;   // a call of fewer floats runs on one thread

// Rows [r0, r1) of the op's output: rows of H floats (norms, activations) or tokens (rotary).
void RunRows(Op op, const float *const *in, const std::vector<int64_t> &ys, int64_t r0, int64_t r1, float *out) {
  const bool avx2 = Avx2Loops();
  const int64_t H = ys.back(), token = op == kRotary ? ys[1] * ys[2] : H;
  const int64_t at = r0 * token;
  if (op == kNorm) (avx2 ? avx2::RmsNorm : generic::RmsNorm)(in[0] + at, in[1], *in[2], r1 - r0, H, out + at);
  if (op == kLayerNorm)
    (avx2 ? avx2::LayerNorm : generic::LayerNorm)(in[0] + at, in[1], in[2], *in[3], r1 - r0, H, out + at);
  if (op == kSwiGLU) (avx2 ? avx2::SwiGLU : generic::SwiGLU)(in[0] + at, in[1] + at, (r1 - r0) * H, out + at);
  if (op == kGelu) (avx2 ? avx2::Gelu : generic::Gelu)(static_cast<int>(*in[1]), in[0] + at, (r1 - r0) * H, out + at);
  if (op == kRotary)
    (avx2 ? avx2::Rotary : generic::Rotary)(in[0] + at, in[1] + r0 * ys[2], in[2] + r0 * ys[2], in[3], r1 - r0, ys[1],
                                            ys[2], out + at);
}

// The output's shape, or a reason it cannot be made from these input shapes ({} and a reason).
std::vector<int64_t> OutShape(const OpType &type, const std::vector<MSTensor> &in, std::string *why) {
  const std::vector<int64_t> xs = in[0].Shape();
  switch (type.op) {
    case kNorm:
      if (xs.empty() || in[1].ElementNum() != xs.back() || in[2].ElementNum() != 1)
        *why = "x " + Shape(xs) + " does not fit the weight " + Shape(in[1].Shape()) + " and eps " +
               Shape(in[2].Shape());
      return xs;
    case kLayerNorm:
      if (xs.empty() || in[1].ElementNum() != xs.back() || in[2].ElementNum() != xs.back() || in[3].ElementNum() != 1)
        *why = "x " + Shape(xs) + " does not fit the weight " + Shape(in[1].Shape()) + ", bias " +
               Shape(in[2].Shape()) + " and eps " + Shape(in[3].Shape());
      return xs;
    case kSwiGLU:
      if (in[1].Shape() != xs) *why = "gate " + Shape(xs) + " and up " + Shape(in[1].Shape()) + " differ";
      return xs;
    case kGelu:
      if (xs.empty() || in[1].ElementNum() != 1) *why = "the form " + Shape(in[1].Shape()) + " must be one value";
      return xs;
    case kRotary: {
      const auto &ps = in[3].Shape();
      const int64_t hd = ps.size() == 2 ? ps[1] : 0, N = xs.empty() ? 0 : xs[0];
      if (ps.size() != 2 || ps[0] != 2 || hd <= 0 || xs.size() < 2 || in[0].ElementNum() % (N * hd) != 0 ||
          in[1].ElementNum() != N * hd || in[2].ElementNum() != N * hd) {
        *why = "x " + Shape(xs) + ", cos " + Shape(in[1].Shape()) + " and sin " + Shape(in[2].Shape()) +
               " do not fit the pairs " + Shape(ps);
        return {};
      }
      return {N, in[0].ElementNum() / (N * hd), hd};
    }
  }
  return {};
}

class LayerOpKernel : public mindspore::kernel::Kernel {
 public:
  LayerOpKernel(const OpType &type, const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs,
                const mindspore::schema::Primitive *primitive, const mindspore::Context *ctx)
      : Kernel(inputs, outputs, primitive, ctx), type_(type) {}

  int Prepare() override {
    const std::string who = std::string(type_.name) + ": ";
    if (static_cast<int>(inputs_.size()) != type_.inputs)
      return Report(who + std::to_string(inputs_.size()) + " inputs, expected " + std::to_string(type_.inputs));
    for (const auto &t : inputs_)
      if (t.DataType() != DataType::kNumberTypeFloat32) return Report(who + "every input must be float32");
    return 0;
  }
  int ReSize() override { return Prepare(); }

  int Execute() override {
    std::string why;
    const std::vector<int64_t> ys = OutShape(type_, inputs_, &why);
    if (!why.empty()) return Report(std::string(type_.name) + ": " + why);
    auto &y = outputs_[0];
    if (y.Shape() != ys) y.SetShape(ys);
    std::shared_ptr<const void> data[4];
    for (int i = 0; i < type_.inputs; ++i)
      if (!(data[i] = inputs_[i].Data()) && inputs_[i].ElementNum() > 0)
        return Report(std::string(type_.name) + ": no data");
    const float *in[4];
    for (int i = 0; i < type_.inputs; ++i) in[i] = static_cast<const float *>(data[i].get());
    float *out = static_cast<float *>(y.MutableData());
    const int64_t count = inputs_[0].ElementNum();
    if (out == nullptr && count > 0) return Report(std::string(type_.name) + ": no output buffer");
    if (count == 0) return 0;
    if (type_.op == kGelu && !(*in[1] == kGeluErf || *in[1] == kGeluTanh || *in[1] == kGeluFast))
      return Report(std::string(type_.name) + ": form " + std::to_string(*in[1]) +
                    " is none of 0 (erf), 1 (tanh), 2 (fast)");
    const int64_t rows = type_.op == kRotary ? ys[0] : count / ys.back();
    const int lite_threads = context_ ? std::max(1, context_->GetThreadNum()) : 1;
    const int threads = count < kSplitFloats || !KernelsHoldThreads() ? 1 : KernelThreads(lite_threads);
    const int64_t chunks = std::min<int64_t>(rows, threads == 1 ? 1 : 4 * threads);
    Pool::Get().Run(threads, chunks, [&](int64_t c) {
      RunRows(type_.op, in, ys, rows * c / chunks, rows * (c + 1) / chunks, out);
    });
    return 0;
  }

 private:
  const OpType &type_;
};

class LayerOpInfer : public mindspore::kernel::KernelInterface {
 public:
  explicit LayerOpInfer(const OpType &type) : type_(type) {}
  mindspore::Status Infer(std::vector<MSTensor> *inputs, std::vector<MSTensor> *outputs,
                          const mindspore::schema::Primitive *) override {
    if (static_cast<int>(inputs->size()) != type_.inputs || outputs->size() != 1) return mindspore::kLiteError;
    auto &y = (*outputs)[0];
    y.SetDataType(DataType::kNumberTypeFloat32);
    y.SetFormat((*inputs)[0].format());
    const std::vector<int64_t> xs = (*inputs)[0].Shape();
    if (type_.op != kRotary) {
      y.SetShape(xs);
      return mindspore::kSuccess;
    }
    for (int64_t d : xs)   // N is unknown until Resize; the converter's own pass sees the rank unknown too
      if (d < 0) return mindspore::kLiteInferInvalid;
    std::string why;
    const std::vector<int64_t> ys = OutShape(type_, *inputs, &why);
    if (!why.empty()) return mindspore::kLiteInferInvalid;
    y.SetShape(ys);
    return mindspore::kSuccess;
  }

 private:
  const OpType &type_;
};

}  // namespace

int RegisterLayerOps(bool op_info) {
  for (const OpType &type : kOps) {
    const OpType *t = &type;
    if (RegisterFloatCustom(
          type.name, type.inputs, op_info,
          [t](const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs,
              const mindspore::schema::Primitive *primitive, const mindspore::Context *ctx) {
            return std::make_shared<LayerOpKernel>(*t, inputs, outputs, primitive, ctx);
          },
          [t] { return std::make_shared<LayerOpInfer>(*t); }))
      return 1;
  }
  return 0;
}

}  // namespace lk
