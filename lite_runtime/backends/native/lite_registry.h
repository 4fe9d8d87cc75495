// Declarations of MindSpore Lite 2.0's custom-kernel registry, as in MindSpore r2.0's public headers
// include/kernel_interface.h, include/registry/register_kernel.h and register_kernel_interface.h, which
// the wheel does not ship. Only the std::vector<char> ("dual ABI") entry points exist as symbols
// (libmindspore-extendrt_python.so), so only those are declared.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "include/api/context.h"
#include "include/api/data_type.h"
#include "include/api/kernel.h"
#include "include/api/status.h"
#include "include/api/types.h"

namespace mindspore {
namespace kernel {
class MS_API KernelInterface {
 public:
  virtual ~KernelInterface() = default;
  virtual Status Infer(std::vector<mindspore::MSTensor> *inputs, std::vector<mindspore::MSTensor> *outputs,
                       const schema::Primitive *primitive) {
    return kSuccess;
  }
  virtual Status Infer(std::vector<mindspore::MSTensor> *inputs, std::vector<mindspore::MSTensor> *outputs,
                       const schema::Primitive *primitive, const Kernel *kernel) {
    return Infer(inputs, outputs, primitive);
  }
};

// MindSpore's op-info library. Building a MindIR (not a .ms) needs an entry of imply_type "CPU" for a
// Custom node, else Build stops with "Not find operator information for Custom operator".
class OpLib {
 public:
  static bool RegOp(const std::string &json_string, const std::string &impl_path);
};
}  // namespace kernel

namespace registry {
using CreateKernel = std::function<std::shared_ptr<kernel::Kernel>(
  const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs, const schema::Primitive *primitive,
  const mindspore::Context *ctx)>;
using KernelInterfaceCreator = std::function<std::shared_ptr<kernel::KernelInterface>()>;

class MS_API RegisterKernel {
 public:
  static Status RegCustomKernel(const std::vector<char> &arch, const std::vector<char> &provider, DataType data_type,
                                const std::vector<char> &type, const CreateKernel creator);
};

class MS_API RegisterKernelInterface {
 public:
  static Status CustomReg(const std::vector<char> &provider, const std::vector<char> &op_type,
                          const KernelInterfaceCreator creator);
};
}  // namespace registry
}  // namespace mindspore

namespace lk {
// Registers a Custom type whose inputs are all float32 (its output float32): with `op_info`, the op-info entry a
// MindIR Build needs; else its kernel and its shape inference with Lite. 0, or 1 with lk_last_error's reason.
int RegisterFloatCustom(const std::string &type, int inputs, bool op_info, mindspore::registry::CreateKernel kernel,
                        mindspore::registry::KernelInterfaceCreator infer);
}  // namespace lk
