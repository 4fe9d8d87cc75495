// A small C interface over MindSpore Lite's C++ API, loaded from Python with ctypes
// (lite_runtime/backends/lite_native.py). Lite 2.0's own Python binding exists only for CPython 3.7
// and it ships no C API header, hence this shim.
//
// Every function returns 0 on success; on failure it returns non-zero and keeps an error text,
// readable with lite_last_error() on the same thread. Lite 2.0's Status::ToString() is often just
// "Common error code.", the cause being written only to Lite's log on stderr; so Build and
// LoadConfig run with stderr captured, and the [ERROR] lines of that log join the status text.
//
// Inputs are bound to caller memory once (MSTensor::SetData(ptr, own_data=false)) and Lite reads
// them in place on every Predict. Outputs cannot be bound that way in Lite 2.0 (measured: SetData on
// an output tensor, or a CreateRefTensor output passed to Predict, is ignored and Lite returns
// tensors in its own memory; Predict() without arguments is "Unsupported Feature"), so lite_predict
// copies each output into the buffer registered with lite_bind_output.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
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

// Redirects file descriptor 2 into a temporary file while any capture is alive. Descriptor 2 is the
// process's and Builds run on several threads at once (segment_chain.py), so the captures share one
// redirection: the first in swaps fd 2, the last out restores it. (Swapping per capture, one that
// began inside another's saved that one's temporary file as "stderr" and restored it after it was
// deleted: stderr was lost for the rest of the process.) A capture's text is what the file got from
// its start on, other threads' output included. All of it is written back to the real stderr when
// the last capture ends, unless a call in that window failed (its lines are in the error text).
class StderrCapture {
 public:
  StderrCapture() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fflush(stderr);
    if (users_ == 0 && !Redirect()) return;
    ++users_;
    start_ = Size();
    active_ = true;
  }
  ~StderrCapture() { Finish(false); }

  // Returns what was captured since this capture began; succeeded=false: the call failed.
  std::string Finish(bool succeeded) {
    if (!active_) return "";
    active_ = false;
    std::lock_guard<std::mutex> lock(mutex_);
    std::fflush(stderr);
    std::string text = Read(start_);
    failed_ = failed_ || !succeeded;
    if (--users_ == 0) {
      dup2(saved_, 2);
      close(saved_);
      if (!failed_) {
        std::string all = Read(0);
        std::fwrite(all.data(), 1, all.size(), stderr);
      }
      std::fclose(file_);
      file_ = nullptr;
      saved_ = -1;
      failed_ = false;
    }
    return text;
  }

 private:
  static bool Redirect() {
    file_ = std::tmpfile();
    saved_ = dup(2);
    if (file_ != nullptr && saved_ >= 0 && dup2(fileno(file_), 2) >= 0) return true;
    if (saved_ >= 0) close(saved_);
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
    saved_ = -1;
    return false;
  }

  static off_t Size() {
    struct stat st;
    return fstat(fileno(file_), &st) == 0 ? st.st_size : 0;
  }

  // pread, not a seek: the file offset is shared with fd 2, where other threads may be writing.
  static std::string Read(off_t from) {
    std::string text;
    char buffer[4096];
    ssize_t n;
    while ((n = pread(fileno(file_), buffer, sizeof(buffer), from)) > 0) {
      text.append(buffer, static_cast<size_t>(n));
      from += n;
    }
    return text;
  }

  static inline std::mutex mutex_;
  static inline std::FILE *file_ = nullptr;
  static inline int saved_ = -1;
  static inline int users_ = 0;      // captures alive
  static inline bool failed_ = false;
  off_t start_ = 0;
  bool active_ = false;
};

// The messages of Lite's "[ERROR] ME(pid,...):time [file:line] Function] message" log lines.
std::string ErrorLines(const std::string &log) {
  std::string result;
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    std::string line = log.substr(start, end - start);
    start = end + 1;
    if (line.rfind("[ERROR]", 0) != 0) continue;
    size_t pos = 0;
    for (int i = 0; i < 3 && pos != std::string::npos; ++i) {
      pos = line.find("] ", pos);
      if (pos != std::string::npos) pos += 2;
    }
    if (!result.empty()) result += "; ";
    result += pos == std::string::npos ? line : line.substr(pos);
  }
  return result;
}

int FailStatus(const char *what, const mindspore::Status &status, const std::string &log = "") {
  std::string text = status.ToString();
  if (text.empty()) text = "status code " + std::to_string(static_cast<int>(status.StatusCode()));
  std::string details = ErrorLines(log);
  if (!details.empty()) text += " Lite log: " + details;
  return Fail(std::string(what) + " failed: " + text);
}

struct LiteHandle {
  mindspore::Model model;
  std::vector<mindspore::MSTensor> inputs;
  std::vector<mindspore::MSTensor> outputs;
  std::vector<std::string> input_names;
  std::vector<std::string> output_names;
  std::vector<void *> input_data;       // bound caller memory, nullptr while unbound
  std::vector<void *> output_data;      // where lite_predict copies each output, or nullptr
  std::vector<size_t> output_bytes;     // the size of each of those buffers
  std::vector<mindspore::MSTensor> results;  // Predict's outputs (Lite's memory)
};

// Takes the model's tensors (shapes included) afresh; every binding is dropped.
void Refresh(LiteHandle *h) {
  h->inputs = h->model.GetInputs();
  h->outputs = h->model.GetOutputs();
  h->input_data.assign(h->inputs.size(), nullptr);
  h->output_data.assign(h->outputs.size(), nullptr);
  h->output_bytes.assign(h->outputs.size(), 0);
}

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

int CheckIndex(size_t count, int index, const char *what) {
  if (index < 0 || static_cast<size_t>(index) >= count) {
    return Fail(std::string(what) + " index " + std::to_string(index) + " out of range; the model has " +
                std::to_string(count));
  }
  return 0;
}

int CheckSize(const mindspore::MSTensor &tensor, const std::string &name, const void *data, size_t nbytes) {
  if (data == nullptr) return Fail("cannot bind " + name + " to a null pointer");
  if (nbytes != tensor.DataSize()) {
    return Fail("cannot bind " + name + ": buffer has " + std::to_string(nbytes) + " bytes, the tensor needs " +
                std::to_string(tensor.DataSize()));
  }
  return 0;
}

}  // namespace

extern "C" {

const char *lite_last_error() { return g_last_error.c_str(); }

namespace {

// Builds `handle->model` for the CPU from a file (data == nullptr) or from `size` bytes at `data`.
int CreateModel(const char *model_path, const void *data, size_t size, const char *config_path, int num_threads,
                void **out) {
  *out = nullptr;
  auto context = std::make_shared<mindspore::Context>();
  context->SetThreadNum(num_threads);
  auto cpu = std::make_shared<mindspore::CPUDeviceInfo>();
  cpu->SetEnableFP16(false);
  context->MutableDeviceInfo().push_back(cpu);

  auto handle = std::make_unique<LiteHandle>();
  StderrCapture capture;
  if (config_path != nullptr && config_path[0] != '\0') {
    auto status = handle->model.LoadConfig(config_path);
    if (status != mindspore::kSuccess) return FailStatus("LoadConfig", status, capture.Finish(false));
  }
  std::string path(model_path);
  bool lite_format = path.size() > 3 && path.compare(path.size() - 3, 3, ".ms") == 0;
  auto type = lite_format ? mindspore::ModelType::kMindIR_Lite : mindspore::ModelType::kMindIR;
  auto status = data == nullptr ? handle->model.Build(model_path, type, context)
                                : handle->model.Build(data, size, type, context);
  if (status != mindspore::kSuccess) return FailStatus("Build", status, capture.Finish(false));
  capture.Finish(true);

  Refresh(handle.get());
  for (auto &t : handle->inputs) handle->input_names.push_back(t.Name());
  for (auto &t : handle->outputs) handle->output_names.push_back(t.Name());
  *out = handle.release();
  return 0;
}

}  // namespace

// Loads a model for the CPU: Lite's own format when the path ends in ".ms" (converted offline),
// else MindIR (converted by Lite at load time). config_path may be NULL or "" (no ini).
int lite_model_create(const char *model_path, const char *config_path, int num_threads, void **out) {
  return Guarded("lite_model_create",
                 [&]() -> int { return CreateModel(model_path, nullptr, 0, config_path, num_threads, out); });
}

// The same from `size` bytes at `data` holding the file `model_path` names (its name decides the format).
int lite_model_create_from_buffer(const char *model_path, const void *data, size_t size, const char *config_path,
                                  int num_threads, void **out) {
  return Guarded("lite_model_create_from_buffer", [&]() -> int {
    if (data == nullptr || size == 0) return Fail("lite_model_create_from_buffer: empty buffer for " + std::string(model_path));
    return CreateModel(model_path, data, size, config_path, num_threads, out);
  });
}

void lite_model_free(void *handle) { delete AsHandle(handle); }

int lite_num_tensors(void *handle, int is_output) {
  auto *h = AsHandle(handle);
  return static_cast<int>(is_output ? h->outputs.size() : h->inputs.size());
}

// Name (valid while the model lives), dtype (a mindspore::DataType value) and shape of one tensor.
int lite_tensor_info(void *handle, int is_output, int index, const char **name, int *dtype, int *ndim,
                     int64_t *shape, int max_ndim) {
  return Guarded("lite_tensor_info", [&]() -> int {
    auto *h = AsHandle(handle);
    auto &tensors = is_output ? h->outputs : h->inputs;
    if (CheckIndex(tensors.size(), index, is_output ? "output" : "input")) return 1;
    const auto &dims = tensors[index].Shape();
    if (static_cast<int>(dims.size()) > max_ndim) {
      return Fail("tensor " + std::to_string(index) + " has rank " + std::to_string(dims.size()) +
                  ", more than the " + std::to_string(max_ndim) + " the caller allows");
    }
    *name = (is_output ? h->output_names : h->input_names)[index].c_str();
    *dtype = static_cast<int>(tensors[index].DataType());
    *ndim = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) shape[i] = dims[i];
    return 0;
  });
}

// Gives the inputs new shapes (dims: every input's dims one after the other, ndims[i] of input i;
// a graph exported with dynamic dims). Every binding is dropped: bind inputs and outputs again.
int lite_resize(void *handle, const int64_t *dims, const int *ndims) {
  return Guarded("lite_resize", [&]() -> int {
    auto *h = AsHandle(handle);
    std::vector<std::vector<int64_t>> shapes;
    for (size_t i = 0; i < h->inputs.size(); ++i) {
      shapes.emplace_back(dims, dims + ndims[i]);
      dims += ndims[i];
    }
    auto status = h->model.Resize(h->inputs, shapes);
    if (status != mindspore::kSuccess) return FailStatus("Resize", status);
    Refresh(h);
    return 0;
  });
}

// Makes input `index` read caller memory in place on every Predict. The memory must outlive the binding.
int lite_bind_input(void *handle, int index, void *data, size_t nbytes) {
  return Guarded("lite_bind_input", [&]() -> int {
    auto *h = AsHandle(handle);
    if (CheckIndex(h->inputs.size(), index, "input")) return 1;
    if (CheckSize(h->inputs[index], h->input_names[index], data, nbytes)) return 1;
    h->inputs[index].SetData(data, false);
    h->input_data[index] = data;
    return 0;
  });
}

// Registers the caller buffer (of the output's shape as the caller expects it: after a Resize Lite may
// report an output's shape only once it has run) that lite_predict copies output `index` into.
int lite_bind_output(void *handle, int index, void *data, size_t nbytes) {
  return Guarded("lite_bind_output", [&]() -> int {
    auto *h = AsHandle(handle);
    if (CheckIndex(h->outputs.size(), index, "output")) return 1;
    if (data == nullptr) return Fail("output " + h->output_names[index] + ": no buffer");
    h->output_data[index] = data;
    h->output_bytes[index] = nbytes;
    return 0;
  });
}

int lite_predict(void *handle) {
  return Guarded("lite_predict", [&]() -> int {
    auto *h = AsHandle(handle);
    for (size_t i = 0; i < h->inputs.size(); ++i) {
      if (h->input_data[i] == nullptr) return Fail("input " + h->input_names[i] + " is not bound");
    }
    h->results.clear();
    auto status = h->model.Predict(h->inputs, &h->results);
    if (status != mindspore::kSuccess) return FailStatus("Predict", status);
    if (h->results.size() != h->outputs.size()) {
      return Fail("Predict returned " + std::to_string(h->results.size()) + " outputs, the model declares " +
                  std::to_string(h->outputs.size()));
    }
    for (size_t i = 0; i < h->results.size(); ++i) {
      if (h->output_data[i] == nullptr) continue;
      auto &result = h->results[i];
      const void *produced = result.MutableData();
      size_t nbytes = h->output_bytes[i];
      if (produced == nullptr || result.DataSize() != nbytes) {
        return Fail("output " + h->output_names[i] + " came back with " + std::to_string(result.DataSize()) +
                    " bytes, the caller expects " + std::to_string(nbytes));
      }
      std::memcpy(h->output_data[i], produced, nbytes);
    }
    return 0;
  });
}

// Runs Predict `runs` times on the bound inputs with Lite's per-kernel callbacks and writes, per
// kernel type (or per kernel, by_name), "key<TAB>kernels per run<TAB>microseconds per run" lines into
// `text`, slowest first: where a graph's time goes.
int lite_profile(void *handle, int runs, int by_name, char *text, size_t text_len) {
  return Guarded("lite_profile", [&]() -> int {
    auto *h = AsHandle(handle);
    using Clock = std::chrono::steady_clock;
    std::map<std::string, std::pair<long, double>> per_type;   // type -> (kernels, seconds)
    Clock::time_point started;
    mindspore::MSKernelCallBack before = [&](const std::vector<mindspore::MSTensor> &,
                                             const std::vector<mindspore::MSTensor> &,
                                             const mindspore::MSCallBackParam &) {
      started = Clock::now();
      return true;
    };
    mindspore::MSKernelCallBack after = [&](const std::vector<mindspore::MSTensor> &,
                                            const std::vector<mindspore::MSTensor> &,
                                            const mindspore::MSCallBackParam &info) {
      auto &entry = per_type[by_name ? info.node_type + " " + info.node_name : info.node_type];
      entry.first += 1;
      entry.second += std::chrono::duration<double>(Clock::now() - started).count();
      return true;
    };
    for (int r = 0; r < runs; ++r) {
      h->results.clear();
      auto status = h->model.Predict(h->inputs, &h->results, before, after);
      if (status != mindspore::kSuccess) return FailStatus("Predict", status);
    }
    std::vector<std::pair<std::string, std::pair<long, double>>> rows(per_type.begin(), per_type.end());
    std::sort(rows.begin(), rows.end(), [](const auto &a, const auto &b) { return a.second.second > b.second.second; });
    std::string out;
    for (const auto &row : rows) {
      out += row.first + "\t" + std::to_string(row.second.first / std::max(runs, 1)) + "\t" +
             std::to_string(row.second.second * 1e6 / std::max(runs, 1)) + "\n";
    }
    std::snprintf(text, text_len, "%s", out.c_str());
    return 0;
  });
}

}  // extern "C"
