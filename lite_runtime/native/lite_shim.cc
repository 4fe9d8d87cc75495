// A small C interface over MindSpore Lite's C++ API, loaded from Python with ctypes
// (lite_runtime/backends/lite_native.py). Lite 2.0's own Python binding exists only for CPython 3.7
// and it ships no C API header, hence this shim.
//
// Every function returns 0 on success; on failure it returns non-zero and keeps Lite's own error
// text (Status::ToString()) or the shim's, readable with lite_last_error() on the same thread.
//
// Inputs and outputs are bound to caller memory once (MSTensor::SetData(ptr, own_data=false));
// lite_predict() then runs the graph without touching Python. Whether Lite writes an output
// straight into the bound buffer or into memory of its own is decided by Lite at run time:
// the shim checks the returned tensor's address after Predict and copies only when it differs.
// lite_output_copied() reports which happened, so tests and benchmarks can tell.
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "include/api/context.h"
#include "include/api/model.h"
#include "include/api/status.h"
#include "include/api/types.h"

namespace {

thread_local std::string g_last_error;

int Fail(const std::string &message) {
  g_last_error = message;
  return 1;
}

int FailStatus(const char *what, const mindspore::Status &status) {
  std::string text = status.ToString();
  if (text.empty()) text = "status code " + std::to_string(static_cast<int>(status.StatusCode()));
  return Fail(std::string(what) + " failed: " + text);
}

struct Binding {
  void *data = nullptr;  // caller memory, or nullptr when unbound
  size_t nbytes = 0;
};

struct LiteHandle {
  mindspore::Model model;
  std::vector<mindspore::MSTensor> inputs;
  std::vector<mindspore::MSTensor> outputs;
  std::vector<std::string> input_names;
  std::vector<std::string> output_names;
  std::vector<Binding> input_bindings;
  std::vector<Binding> output_bindings;
  std::vector<int> output_copied;  // 1 if the last Predict needed a copy into the bound buffer
};

LiteHandle *AsHandle(void *handle) { return static_cast<LiteHandle *>(handle); }

// Runs body() and turns any C++ exception into an error code: none may cross the C boundary.
template <typename Body>
int Guarded(const char *where, Body body) {
  try {
    return body();
  } catch (const std::exception &e) {
    return Fail(std::string(where) + ": C++ exception: " + e.what());
  } catch (...) {
    return Fail(std::string(where) + ": unknown C++ exception");
  }
}

int CheckIndex(const std::vector<mindspore::MSTensor> &tensors, int index, const char *what) {
  if (index < 0 || static_cast<size_t>(index) >= tensors.size()) {
    return Fail(std::string(what) + " index " + std::to_string(index) + " out of range; the model has " +
                std::to_string(tensors.size()));
  }
  return 0;
}

int Bind(mindspore::MSTensor &tensor, Binding &binding, const std::string &name, void *data, size_t nbytes) {
  if (data == nullptr) return Fail("cannot bind " + name + " to a null pointer");
  if (nbytes != tensor.DataSize()) {
    return Fail("cannot bind " + name + ": buffer has " + std::to_string(nbytes) + " bytes, the tensor needs " +
                std::to_string(tensor.DataSize()));
  }
  tensor.SetData(data, false);
  binding.data = data;
  binding.nbytes = nbytes;
  return 0;
}

}  // namespace

extern "C" {

const char *lite_last_error() { return g_last_error.c_str(); }

// Loads a MindIR file on the CPU. config_path may be NULL or "" (no ini).
int lite_model_create(const char *model_path, const char *config_path, int num_threads, void **out) {
  return Guarded("lite_model_create", [&]() -> int {
    *out = nullptr;
    auto context = std::make_shared<mindspore::Context>();
    context->SetThreadNum(num_threads);
    auto cpu = std::make_shared<mindspore::CPUDeviceInfo>();
    cpu->SetEnableFP16(false);
    context->MutableDeviceInfo().push_back(cpu);

    auto handle = std::make_unique<LiteHandle>();
    if (config_path != nullptr && config_path[0] != '\0') {
      auto status = handle->model.LoadConfig(config_path);
      if (status != mindspore::kSuccess) return FailStatus("LoadConfig", status);
    }
    auto status = handle->model.Build(model_path, mindspore::ModelType::kMindIR, context);
    if (status != mindspore::kSuccess) return FailStatus("Build", status);

    handle->inputs = handle->model.GetInputs();
    handle->outputs = handle->model.GetOutputs();
    for (auto &t : handle->inputs) handle->input_names.push_back(t.Name());
    for (auto &t : handle->outputs) handle->output_names.push_back(t.Name());
    handle->input_bindings.resize(handle->inputs.size());
    handle->output_bindings.resize(handle->outputs.size());
    handle->output_copied.assign(handle->outputs.size(), 0);
    *out = handle.release();
    return 0;
  });
}

void lite_model_free(void *handle) { delete AsHandle(handle); }

int lite_num_tensors(void *handle, int is_output) {
  auto *h = AsHandle(handle);
  return static_cast<int>(is_output ? h->outputs.size() : h->inputs.size());
}

// Name (valid while the model lives), dtype (mindspore::DataType value) and shape of one tensor.
int lite_tensor_info(void *handle, int is_output, int index, const char **name, int *dtype, int *ndim,
                     int64_t *shape, int max_ndim) {
  return Guarded("lite_tensor_info", [&]() -> int {
    auto *h = AsHandle(handle);
    auto &tensors = is_output ? h->outputs : h->inputs;
    if (CheckIndex(tensors, index, is_output ? "output" : "input")) return 1;
    auto &tensor = tensors[index];
    const auto &dims = tensor.Shape();
    if (static_cast<int>(dims.size()) > max_ndim) {
      return Fail("tensor " + std::to_string(index) + " has rank " + std::to_string(dims.size()) +
                  ", more than the " + std::to_string(max_ndim) + " the caller allows");
    }
    *name = (is_output ? h->output_names : h->input_names)[index].c_str();
    *dtype = static_cast<int>(tensor.DataType());
    *ndim = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) shape[i] = dims[i];
    return 0;
  });
}

// Makes input `index` read from caller memory (no copy). The memory must outlive the binding.
int lite_bind_input(void *handle, int index, void *data, size_t nbytes) {
  return Guarded("lite_bind_input", [&]() -> int {
    auto *h = AsHandle(handle);
    if (CheckIndex(h->inputs, index, "input")) return 1;
    return Bind(h->inputs[index], h->input_bindings[index], h->input_names[index], data, nbytes);
  });
}

// Asks Lite to write output `index` into caller memory; lite_predict copies there if Lite did not.
int lite_bind_output(void *handle, int index, void *data, size_t nbytes) {
  return Guarded("lite_bind_output", [&]() -> int {
    auto *h = AsHandle(handle);
    if (CheckIndex(h->outputs, index, "output")) return 1;
    return Bind(h->outputs[index], h->output_bindings[index], h->output_names[index], data, nbytes);
  });
}

int lite_predict(void *handle) {
  return Guarded("lite_predict", [&]() -> int {
    auto *h = AsHandle(handle);
    for (size_t i = 0; i < h->inputs.size(); ++i) {
      if (h->input_bindings[i].data == nullptr) return Fail("input " + h->input_names[i] + " is not bound");
    }
    std::vector<mindspore::MSTensor> outputs = h->outputs;
    auto status = h->model.Predict(h->inputs, &outputs);
    if (status != mindspore::kSuccess) return FailStatus("Predict", status);
    if (outputs.size() != h->outputs.size()) {
      return Fail("Predict returned " + std::to_string(outputs.size()) + " outputs, the model declares " +
                  std::to_string(h->outputs.size()));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Binding &b = h->output_bindings[i];
      if (b.data == nullptr) continue;
      const void *produced = outputs[i].MutableData();
      if (produced == b.data) {
        h->output_copied[i] = 0;
        continue;
      }
      if (produced == nullptr || outputs[i].DataSize() != b.nbytes) {
        return Fail("output " + h->output_names[i] + " came back with " + std::to_string(outputs[i].DataSize()) +
                    " bytes, the bound buffer has " + std::to_string(b.nbytes));
      }
      std::memcpy(b.data, produced, b.nbytes);
      h->output_copied[i] = 1;
    }
    return 0;
  });
}

// 1 if the last lite_predict copied output `index` into its bound buffer, 0 if Lite wrote it there.
int lite_output_copied(void *handle, int index) {
  auto *h = AsHandle(handle);
  if (index < 0 || static_cast<size_t>(index) >= h->output_copied.size()) return -1;
  return h->output_copied[index];
}

}  // extern "C"
