// Embedding lookups in tables stored as the linear kernels store their weights (a tied head's table too),
// registered as Custom op types by lk_register (lite_kernels.cc): ids int32 (any shape) -> float32 (ids' shape, H).
#include <memory>
#include <string>
#include <vector>

#include "kernel_support.h"
#include "linear_math.h"
#include "lite_registry.h"

namespace {

using lk::Fail;
using lk::g_last_error;
using lk::kProvider;
using lk::Report;
using mindspore::DataType;
using mindspore::MSTensor;

// The lookups: ids int32 (any shape) and a table (V, H) as a linear weight is stored -> float32 (ids' shape, H).
// A tied head's product reads the same constants: int8 in LiteLinearI8P16's panels with its scale float32 (V,),
// float32 in LiteLinearF32P16's, or int8 in LiteLinearI8GroupF16P16's with its float16 scales (V, G).
struct GatherInfo {
  const char *name;
  lk::Kind kind;
  int inputs;
  DataType table;
  const char *table_dtype;   // op-info name
};
const GatherInfo kGathers[] = {{"LiteGatherI8P16", lk::kI8, 3, DataType::kNumberTypeInt8, "int8"},
                               {"LiteGatherF32P16", lk::kF32P16, 2, DataType::kNumberTypeFloat32, "float32"},
                               {"LiteGatherI8GroupF16P16", lk::kI8Group, 3, DataType::kNumberTypeInt8, "int8"}};

}  // namespace

namespace lk {

// out (count, H) = the rows `ids` of a table (V, H) stored as `kind` (kI8: int8 in panels, each row times its
// scale float32 (V,); kF32P16: float32 panels; kI8Group: int8 in panels, each group (GroupShift) times its scale,
// float16 bits (V, G) in panels).
int Gather(int kind, const int32_t *ids, int64_t count, const void *table, const void *scales, int64_t V, int64_t H,
           int64_t G, float *out) {
  const int shift = kind == lk::kI8Group && H % 32 == 0 ? GroupShift(H / 32, G) : -1;
  if (kind == lk::kI8Group && shift < 0)
    return Fail("a grouped int8 table of rows of " + std::to_string(H) + " has " + std::to_string(G) +
                " groups a row; allowed: rows of a multiple of 32 in groups of 32, 64 or 128");
  const float *scale = static_cast<const float *>(scales);
  const uint16_t *halves = static_cast<const uint16_t *>(scales);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t v = ids[i];
    if (v < 0 || v >= V)
      return Fail("id " + std::to_string(v) + " is outside the table's " + std::to_string(V) + " rows");
    float *row = out + i * H;
    if (kind == lk::kI8) {
      const int8_t *q = static_cast<const int8_t *>(table);
      for (int64_t k = 0; k < H; ++k) row[k] = scale[v] * static_cast<float>(q[lk::PanelOffset(V, H, v, k)]);
    } else if (kind == lk::kI8Group) {
      const int8_t *q = static_cast<const int8_t *>(table);
      for (int64_t k = 0; k < H; ++k)
        row[k] = lk::HalfToFloat(halves[lk::PanelOffset(V, G, v, k >> (5 + shift))]) *
                 static_cast<float>(q[lk::PanelOffset(V, H, v, k)]);
    } else {
      const float *w = static_cast<const float *>(table);
      for (int64_t k = 0; k < H; ++k) row[k] = w[lk::PanelOffset(V, H, v, k)];
    }
  }
  return 0;
}

}  // namespace lk

namespace {

using lk::Gather;

class GatherKernel : public mindspore::kernel::Kernel {
 public:
  GatherKernel(const GatherInfo &info, const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs,
               const mindspore::schema::Primitive *primitive, const mindspore::Context *ctx)
      : Kernel(inputs, outputs, primitive, ctx), info_(info) {}

  int Prepare() override { return Report(Check()); }
  int ReSize() override { return Prepare(); }

  int Execute() override {
    const auto &table = inputs_[1].Shape();
    std::vector<int64_t> ys = inputs_[0].Shape();
    ys.push_back(table[1]);
    auto &y = outputs_[0];
    if (y.Shape() != ys) y.SetShape(ys);
    auto ids = inputs_[0].Data();
    auto w = inputs_[1].Data();
    std::shared_ptr<const void> scale = info_.inputs > 2 ? inputs_[2].Data() : nullptr;
    float *out = static_cast<float *>(y.MutableData());
    if (out == nullptr || ids == nullptr || w == nullptr || (info_.inputs > 2 && scale == nullptr))
      return Report(std::string(info_.name) + ": no data");
    const int64_t G = info_.kind == lk::kI8Group ? inputs_[2].ElementNum() / table[0] / 2 : 0;
    if (Gather(info_.kind, static_cast<const int32_t *>(ids.get()), inputs_[0].ElementNum(), w.get(), scale.get(),
               table[0], table[1], G, out))
      return Report(std::string(info_.name) + ": " + g_last_error);
    return 0;
  }

 private:
  std::string Check() const {
    const std::string who = std::string(info_.name) + ": ";
    if (static_cast<int>(inputs_.size()) != info_.inputs)
      return who + std::to_string(inputs_.size()) + " inputs, expected " + std::to_string(info_.inputs);
    if (inputs_[0].DataType() != DataType::kNumberTypeInt32) return who + "ids must be int32";
    if (inputs_[1].DataType() != info_.table || inputs_[1].Shape().size() != 2)
      return who + "the table must be " + info_.table_dtype + " and 2-D";
    const int64_t rows = inputs_[1].Shape()[0];
    if (info_.kind == lk::kI8 && (inputs_[2].DataType() != DataType::kNumberTypeFloat32 ||
                                  inputs_[2].ElementNum() != rows))
      return who + "the scales must be float32, one a row of the table";
    if (info_.kind == lk::kI8Group && (inputs_[2].DataType() != DataType::kNumberTypeInt8 || rows == 0 ||
                                       inputs_[2].ElementNum() % (2 * rows) != 0))
      return who + "the scales must be float16 bits as int8 pairs, as many a row of the table";
    return "";
  }

  const GatherInfo &info_;
};

class GatherInfer : public mindspore::kernel::KernelInterface {
 public:
  mindspore::Status Infer(std::vector<MSTensor> *inputs, std::vector<MSTensor> *outputs,
                          const mindspore::schema::Primitive *) override {
    if (inputs->size() < 2 || outputs->size() != 1 || (*inputs)[1].Shape().size() != 2) return mindspore::kLiteError;
    std::vector<int64_t> shape = (*inputs)[0].Shape();
    shape.push_back((*inputs)[1].Shape()[1]);
    auto &y = (*outputs)[0];
    y.SetDataType(DataType::kNumberTypeFloat32);
    y.SetFormat((*inputs)[1].format());
    y.SetShape(shape);
    return mindspore::kSuccess;
  }
};

std::vector<char> V(const std::string &s) { return lk::Chars(s); }

}  // namespace

namespace lk {

int RegisterLookups(bool op_info) {
  for (const GatherInfo &gather : kGathers) {
    if (op_info) {
      std::vector<std::string> dtypes = {"int32", gather.table_dtype, gather.kind == kI8Group ? "int8" : "float32"};
      dtypes.resize(gather.inputs);
      if (!mindspore::kernel::OpLib::RegOp(OpInfo(gather.name, dtypes), ""))
        return Fail(std::string("MindSpore's op-info library refused ") + gather.name);
      continue;
    }
    // Lite looks a Custom kernel up by the data type of one of its tensors; a lookup's differ (ids int32,
    // table int8 or float32, output float32), so it is registered under each
    const GatherInfo *info = &gather;
    for (DataType key : {DataType::kNumberTypeInt8, DataType::kNumberTypeFloat32, DataType::kNumberTypeInt32}) {
      auto created = mindspore::registry::RegisterKernel::RegCustomKernel(
        V("CPU"), V(kProvider), key, V(gather.name),
        [info](const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs,
               const mindspore::schema::Primitive *primitive, const mindspore::Context *ctx) {
          return std::make_shared<GatherKernel>(*info, inputs, outputs, primitive, ctx);
        });
      if (created != mindspore::kSuccess) return Fail(std::string("Lite refused to register the kernel ") + gather.name);
    }
    if (mindspore::registry::RegisterKernelInterface::CustomReg(
          V(kProvider), V(gather.name), [] { return std::make_shared<GatherInfer>(); }) != mindspore::kSuccess)
      return Fail(std::string("Lite refused to register the shape inference of ") + gather.name);
  }
  return 0;
}

}  // namespace lk
