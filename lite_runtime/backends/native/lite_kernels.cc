// The project's custom CPU kernels for MindSpore Lite 2.0: weight-only linear layers (float32, int8 per
// output channel or in groups, int4 in groups; linear_math.h), embedding lookups (lookup_kernel.cc) and the packed
// call's attention (attention_kernel.cc), registered as Custom op types, and a C interface loaded with ctypes
// (lite_runtime/backends/lite_kernels.py) with RTLD_GLOBAL before any Build, in the runtime and in the
// converter's process. Every function returns 0 on success, else non-zero with a reason in lk_last_error().
//
// A graph node is MindSpore 2.0's ops.Custom("liblite_kernels.so:<type>", func_type="aot") with the prim
// attribute type=<type> (exporter/models/kernels.py); its inputs are x (..., K) float32, the weight
// and its scales (and mins) as constants. Lite finds the kernel by that type under any provider, as long
// as the context names none.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "linear_math.h"
#include "lite_registry.h"
#include "kernel_support.h"
#include "thread_pool.h"

namespace {

using lk::Fail;
using lk::g_last_error;
using lk::GroupShift;
using lk::kProvider;
using lk::KernelThreads;
using lk::OpInfo;
using lk::Pool;
using lk::Report;
using lk::Shape;
using mindspore::DataType;
using mindspore::MSTensor;

constexpr char kAotLibrary[] = "liblite_kernels.so";   // the aot func's library part; never opened
constexpr int kLiteError = -1;                         // mindspore::lite::RET_ERROR
constexpr int64_t kDecodeRows = 16;                    // rows of X up to which a call runs on one thread
constexpr int64_t kSplitWeights = int64_t(1) << 22;    // unless its weights are this many (RunLinear)
std::atomic<int> g_threads{0};                         // lk_set_threads; 0: the thread count of Lite's context

struct TypeInfo {
  const char *name;
  lk::Kind kind;
  int inputs;
  const char *weight_dtype;   // op-info name of input 1's dtype
  const char *scale_dtype;    // of the scales (and mins): int4's are float16 bits held as int8 pairs, which
                              // Lite keeps as they are (it widens float16 constants on CPU)
};
const TypeInfo kTypes[] = {{"LiteLinearF32", lk::kF32, 2, "float32", ""},
                           {"LiteLinearF32P16", lk::kF32P16, 2, "float32", ""},
                           {"LiteLinearI8P16", lk::kI8, 3, "int8", "float32"},
                           {"LiteLinearI4F16P16", lk::kI4Min, 4, "int8", "int8"},
                           {"LiteLinearI4SymF16P16", lk::kI4Min, 3, "int8", "int8"},      // no mins: -8 scale
                           {"LiteLinearI8GroupF16P16", lk::kI8Group, 3, "int8", "int8"}};
// The loops for this CPU: AVX2 + FMA with the prefill GEMM on AVX-512 registers ("avx512"), AVX2 + FMA, or
// portable.
// LITE_KERNELS_ISA=avx2 or generic forces those.
const char *PickIsa() {
  const char *forced = std::getenv("LITE_KERNELS_ISA");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (forced && std::strcmp(forced, "generic") == 0) return "generic";
  if (avx2 && __builtin_cpu_supports("avx512f") && !(forced && std::strcmp(forced, "avx2") == 0)) return "avx512";
  return avx2 ? "avx2" : "generic";
}
const char *const g_isa = PickIsa();
const bool g_avx512 = std::strcmp(g_isa, "avx512") == 0, g_avx2 = std::strcmp(g_isa, "avx2") == 0;
const lk::RangeFn g_range = g_avx512 || g_avx2 ? lk::avx2::Range : lk::generic::Range;
// Grouped int8 products on int8 activations (lk_set_int8_activations): off unless asked for, and only where the
// AVX-512 loops run on a CPU with VNNI.
std::atomic<bool> g_int8_activations{false};
}  // namespace

namespace lk {

thread_local std::string g_last_error;

int Fail(const std::string &message) {
  g_last_error = message;
  return 1;
}

int Report(const std::string &error) {
  if (error.empty()) return 0;
  std::fprintf(stderr, "[ERROR] lite_kernels: %s\n", error.c_str());
  return kLiteError;
}

std::string Shape(const std::vector<int64_t> &s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

int KernelThreads(int lite_threads) {
  int threads = g_threads.load(std::memory_order_relaxed) > 0 ? g_threads.load() : lite_threads;
  if (const char *cap = std::getenv("LITE_KERNELS_THREADS")) threads = std::min(threads, std::max(1, std::atoi(cap)));
  return threads;
}

bool KernelsHoldThreads() { return g_threads.load(std::memory_order_relaxed) > 0; }

bool Avx2Loops() { return g_avx512 || g_avx2; }

bool WideLoops() { return g_avx512; }

std::vector<char> Chars(const std::string &s) { return std::vector<char>(s.begin(), s.end()); }

std::string OpInfo(const std::string &name, const std::vector<std::string> &dtypes) {
  std::string inputs, formats;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    inputs += std::string(i ? ", " : "") + "{\"index\": " + std::to_string(i) + ", \"name\": \"in" +
              std::to_string(i) + "\", \"paramType\": \"required\"}";
    formats += std::string(i ? ", " : "") + "[\"" + dtypes[i] + "\", \"DefaultFormat\"]";
  }
  return std::string("{\"op_name\": \"Custom__") + kAotLibrary + ":" + name + "\", \"inputs\": [" + inputs +
         "], \"outputs\": [{\"index\": 0, \"name\": \"y\", \"paramType\": \"required\"}], \"attr\": [], "
         "\"fusion_type\": \"OPAQUE\", \"dtype_format\": [[" + formats +
         ", [\"float32\", \"DefaultFormat\"]]], \"target\": \"CPU\", \"imply_type\": \"CPU\"}";
}

int GroupShift(int64_t runs, int64_t G) {
  for (int shift = 0; shift < 8; ++shift)
    if (G > 0 && (runs + (int64_t(1) << shift) - 1) >> shift == G) return shift;
  return -1;
}

}  // namespace lk

namespace {

// Y = X . W^T for one call; `x` is (M, K). For int4 K is the true row length: X is padded to the
// weights' 32-multiple here and the group size follows from the scales' columns G.
// `lite_workers`: Lite's own threads run the graph beside the kernels (its context has more than one).
int RunLinear(int kind, const float *x, int64_t M, int64_t K, const void *w, const void *scale, const void *mins,
              int64_t N, int64_t G, float *y, int threads, bool lite_workers) {
  if (kind != lk::kF32 && kind != lk::kI8 && kind != lk::kI4Min && kind != lk::kF32P16 && kind != lk::kI8Group)
    return Fail("kind " + std::to_string(kind) + ": allowed 0, 1, 4, 5, 6");
  if (M < 0 || K <= 0 || N <= 0) return Fail("shape M=" + std::to_string(M) + " K=" + std::to_string(K) +
                                              " N=" + std::to_string(N) + ": K and N must be positive");
  if (M == 0) return 0;
  lk::LinearArgs a;
  a.kind = kind;
  a.x = x;
  a.M = M;
  a.K = a.ldx = K;
  a.N = N;
  a.w = w;
  if (kind == lk::kI8) a.scale = static_cast<const float *>(scale);
  if (kind == lk::kI4Min || kind == lk::kI8Group) {
    a.scale16 = static_cast<const uint16_t *>(scale);
    a.min16 = static_cast<const uint16_t *>(mins);
  }
  if (kind == lk::kI8Group) {
    a.group_shift = GroupShift(K / 32, G);
    if (K % 32 != 0 || a.group_shift < 0)
      return Fail("grouped int8: a row of " + std::to_string(K) + " weights in " + std::to_string(G) +
                  " groups; allowed: rows of a multiple of 32 in groups of 32, 64 or 128");
    a.G = G;
    a.group = int64_t(32) << a.group_shift;
  }
  a.y = y;
  a.wide = g_avx512;
  std::vector<float> padded, sums;
  if (kind == lk::kI4Min) {
    const int64_t runs = (K + 31) / 32;
    a.group_shift = GroupShift(runs, G);
    if (a.group_shift < 0)
      return Fail("int4 scales have " + std::to_string(G) + " groups per row; a row of " + std::to_string(K) +
                  " weights in groups of 32, 64 or 128 has " + std::to_string(runs) + " or fewer");
    a.K = a.ldx = runs * 32;
    a.G = G;
    a.group = int64_t(32) << a.group_shift;
    if (a.K != K) {     // X padded with zeros to the weights' 32-multiple
      padded.assign(M * a.K, 0.0f);
      for (int64_t m = 0; m < M; ++m) std::memcpy(&padded[m * a.K], x + m * K, K * sizeof(float));
      a.x = padded.data();
    }
    if (M <= lk::kDecodeRowsI4) {       // the decode loop's sums of x over each group
      sums.assign(M * G, 0.0f);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t g = 0; g < G; ++g)
          for (int64_t k = g * a.group; k < std::min(K, (g + 1) * a.group); ++k) sums[m * G + g] += x[m * K + k];
      a.xsum = sums.data();
    }
  }
  std::vector<uint8_t> xq;
  std::vector<float> xd;
  const bool w8a8 = kind == lk::kI8Group && a.group == 32 && g_int8_activations.load(std::memory_order_relaxed);
  if (w8a8) {       // X quantized once, for every thread's columns
    xq.resize(M * K);
    xd.resize(M * G);
    lk::vnni::Quantize(x, M, K, K, xq.data(), xd.data());
    a.xq = xq.data();
    a.xd = xd.data();
  }
  const int64_t block = lk::BlockRows(kind), blocks = (N + block - 1) / block;
  int n = std::max(1, std::min<int>(threads, static_cast<int>(blocks)));
  if (M * N * K < (1 << 15)) n = 1;   // waking a thread costs more than such a product
  // Where Lite's own workers run beside the kernels, decode-sized calls stream the weights on the calling
  // thread, but for large layers: Lite's workers spin through a graph run and compete for the other cores
  // (docs/measured-choices.md).
  if (lite_workers && M <= kDecodeRows && N * K < kSplitWeights) n = 1;
  // Decode-sized calls stream their weights: one run of columns a thread, as each chunk's start waits for
  // memory before the hardware's prefetch follows. Larger ones, bound by arithmetic, take chunks from the
  // counter, so that a thread held up elsewhere does not hold up the call; 24 a thread left 0.97-0.98x the
  // time of 8 at 16-64 rows (the threads' last chunks end closer together).
  const int64_t chunks = std::min<int64_t>(blocks, n == 1 ? 1 : M <= kDecodeRows ? n : 24 * n);
  const int64_t tile = 2 * lk::kTileCols * a.K;     // two panels (linear_gemm.h StageWide)
  Pool::Get().Run(n, chunks, [&](int64_t c) {
    thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < tile + 16) scratch.resize(tile + 16);
    // 64-byte aligned: a tile row is one AVX-512 load that must not straddle two cache lines
    float *aligned = scratch.data() + (16 - (reinterpret_cast<uintptr_t>(scratch.data()) / sizeof(float)) % 16) % 16;
    const int64_t b0 = blocks * c / chunks, b1 = blocks * (c + 1) / chunks;
    if (w8a8) lk::vnni::Range(a, b0 * block, std::min(N, b1 * block));
    else g_range(a, b0 * block, std::min(N, b1 * block), aligned);
  });
  return 0;
}

// Checks a node's inputs; `known`: shapes are final (Execute), not possibly -1 (Prepare).
std::string CheckInputs(const TypeInfo &type, const std::vector<MSTensor> &in) {
  std::string who = std::string(type.name) + ": ";
  if (static_cast<int>(in.size()) != type.inputs)
    return who + std::to_string(in.size()) + " inputs, expected " + std::to_string(type.inputs);
  if (in[0].DataType() != DataType::kNumberTypeFloat32) return who + "input x must be float32";
  DataType wt = type.kind == lk::kF32 || type.kind == lk::kF32P16 ? DataType::kNumberTypeFloat32
                                                                  : DataType::kNumberTypeInt8;
  if (in[1].DataType() != wt) return who + "weight must be " + type.weight_dtype;
  if (in[1].Shape().size() != 2) return who + "weight must be 2-D, got " + Shape(in[1].Shape());
  const bool halves = type.kind == lk::kI4Min || type.kind == lk::kI8Group;     // float16 bits as pairs of int8
  for (int i = 2; i < type.inputs; ++i) {
    if (in[i].DataType() != (halves ? DataType::kNumberTypeInt8 : DataType::kNumberTypeFloat32))
      return who + "scales and mins must be " + type.scale_dtype;
    if (in[i].ElementNum() % (in[1].Shape()[0] * (halves ? 2 : 1)) != 0)
      return who + "scales do not match the weight's rows";
  }
  return "";
}

class LinearKernel : public mindspore::kernel::Kernel {
 public:
  LinearKernel(const TypeInfo &type, const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs,
               const mindspore::schema::Primitive *primitive, const mindspore::Context *ctx)
      : Kernel(inputs, outputs, primitive, ctx), type_info_(type) {}

  int Prepare() override { return Report(CheckInputs(type_info_, inputs_)); }
  int ReSize() override { return Prepare(); }

  int Execute() override {
    const auto &xs = inputs_[0].Shape();
    const auto &ws = inputs_[1].Shape();
    const int64_t K = xs.empty() ? 0 : xs.back(), N = ws[0];
    int64_t M = 1;
    for (size_t i = 0; i + 1 < xs.size(); ++i) M *= xs[i];
    const bool int4 = type_info_.kind == lk::kI4Min;
    if (int4 ? ws[1] != (K + 31) / 32 * 16 : ws[1] != K)
      return Report(std::string(type_info_.name) + ": x " + Shape(xs) + " does not fit the weight " + Shape(ws));
    std::vector<int64_t> ys(xs.begin(), xs.end() - 1);
    ys.push_back(N);
    auto &y = outputs_[0];
    if (y.Shape() != ys) y.SetShape(ys);
    float *out = static_cast<float *>(y.MutableData());
    auto x = inputs_[0].Data();
    auto w = inputs_[1].Data();
    std::shared_ptr<const void> scale, mins;
    if (type_info_.inputs > 2) scale = inputs_[2].Data();
    if (type_info_.inputs > 3) mins = inputs_[3].Data();
    if (out == nullptr || x == nullptr || w == nullptr) return Report(std::string(type_info_.name) + ": no data");
    const bool halves = int4 || type_info_.kind == lk::kI8Group;
    const int64_t G = type_info_.inputs > 2 ? inputs_[2].ElementNum() / N / (halves ? 2 : 1) : 0;
    const int lite_threads = context_ ? std::max(1, context_->GetThreadNum()) : 1;
    const int threads = KernelThreads(lite_threads);
    if (RunLinear(type_info_.kind, static_cast<const float *>(x.get()), M, K, w.get(), scale.get(), mins.get(), N, G,
                  out, threads, lite_threads > 1))
      return Report(std::string(type_info_.name) + ": " + g_last_error);
    return 0;
  }

 private:
  const TypeInfo &type_info_;
};

class LinearInfer : public mindspore::kernel::KernelInterface {
 public:
  mindspore::Status Infer(std::vector<MSTensor> *inputs, std::vector<MSTensor> *outputs,
                          const mindspore::schema::Primitive *) override {
    if (inputs->size() < 2 || outputs->size() != 1) return mindspore::kLiteError;
    std::vector<int64_t> shape = (*inputs)[0].Shape();
    if (shape.empty() || (*inputs)[1].Shape().size() != 2) return mindspore::kLiteError;
    shape.back() = (*inputs)[1].Shape()[0];
    auto &y = (*outputs)[0];
    y.SetDataType(DataType::kNumberTypeFloat32);
    y.SetFormat((*inputs)[0].format());
    y.SetShape(shape);
    return mindspore::kSuccess;
  }
};

std::vector<char> V(const std::string &s) { return lk::Chars(s); }

}  // namespace

namespace lk {
int RegisterFloatCustom(const std::string &type, int inputs, bool op_info, mindspore::registry::CreateKernel kernel,
                        mindspore::registry::KernelInterfaceCreator infer) {
  if (op_info) {
    if (!mindspore::kernel::OpLib::RegOp(OpInfo(type, std::vector<std::string>(inputs, "float32")), ""))
      return Fail("MindSpore's op-info library refused " + type);
    return 0;
  }
  auto created = mindspore::registry::RegisterKernel::RegCustomKernel(V("CPU"), V(kProvider),
                                                                      DataType::kNumberTypeFloat32, V(type), kernel);
  auto inferred = mindspore::registry::RegisterKernelInterface::CustomReg(V(kProvider), V(type), infer);
  if (created != mindspore::kSuccess || inferred != mindspore::kSuccess)
    return Fail("Lite refused to register the kernel " + type);
  return 0;
}
}  // namespace lk

extern "C" {

const char *lk_last_error() { return g_last_error.c_str(); }

// "avx512", "avx2" or "generic": the loops chosen at load (LITE_KERNELS_ISA=avx2 or generic forces those).
const char *lk_isa() { return g_isa; }

// The registered type names, comma-separated.
const char *lk_types() {
  return "LiteLinearF32,LiteLinearF32P16,LiteLinearI8P16,LiteLinearI4F16P16,LiteLinearI4SymF16P16,"
         "LiteLinearI8GroupF16P16,LiteGatherI8P16,LiteGatherI8GroupF16P16,"
         "LiteGatherF32P16,"
         "LiteAttend,LitePagedAttend,LiteRMSNorm,LiteLayerNorm,LiteSwiGLU,LiteGELU,LiteRotary";
}


// Registers every kernel and its shape inference with Lite, and with `op_info` non-zero the op-info
// entries a MindIR Build needs. Once per process; later calls do nothing.
int lk_register(int op_info) {
  static std::mutex mutex;
  static bool kernels = false, infos = false;
  std::lock_guard<std::mutex> lock(mutex);
  for (const TypeInfo &type : kTypes) {
    if (kernels) break;
    const TypeInfo *info = &type;
    auto created = mindspore::registry::RegisterKernel::RegCustomKernel(
      V("CPU"), V(kProvider), DataType::kNumberTypeFloat32, V(type.name),
      [info](const std::vector<MSTensor> &inputs, const std::vector<MSTensor> &outputs,
             const mindspore::schema::Primitive *primitive, const mindspore::Context *ctx) {
        return std::make_shared<LinearKernel>(*info, inputs, outputs, primitive, ctx);
      });
    auto inferred = mindspore::registry::RegisterKernelInterface::CustomReg(
      V(kProvider), V(type.name), [] { return std::make_shared<LinearInfer>(); });
    if (created != mindspore::kSuccess || inferred != mindspore::kSuccess)
      return Fail(std::string("Lite refused to register the kernel ") + type.name);
  }
  if (!kernels && (lk::RegisterAttend(false) || lk::RegisterPagedAttend(false) || lk::RegisterLayerOps(false) ||
                   lk::RegisterLookups(false)))
    return 1;
  kernels = true;
  if (op_info && !infos) {
    for (const TypeInfo &type : kTypes) {
      std::vector<std::string> dtypes(type.inputs, type.scale_dtype);
      dtypes[0] = "float32";
      dtypes[1] = type.weight_dtype;
      if (!mindspore::kernel::OpLib::RegOp(OpInfo(type.name, dtypes), ""))
        return Fail(std::string("MindSpore's op-info library refused ") + type.name);
    }
    if (lk::RegisterAttend(true) || lk::RegisterPagedAttend(true) || lk::RegisterLayerOps(true) ||
        lk::RegisterLookups(true))
      return 1;
    infos = true;
  }
  return 0;
}

// The threads every kernel call may use from now on (0: the thread count of the calling Lite context). The
// runtime gives the kernels the threads and Lite's context one where the kernels run every large product.
void lk_set_threads(int threads) { g_threads.store(std::max(0, threads)); }

// Grouped int8 products (`weights: int8` in groups of 32) on activations quantized to int8 alike, on AVX512-VNNI
// (linear_int8.cc), from now on (non-zero) or not; returns whether they are on (0 where the CPU lacks VNNI or the
// AVX-512 loops are not the ones chosen).
int lk_set_int8_activations(int on) {
  g_int8_activations.store(on != 0 && g_avx512 && lk::vnni::Supported());
  return g_int8_activations.load();
}

// The kernels' product without Lite (tests, benchmarks): y (M, N) = x (M, K) . W^T, W as in linear_math.h;
// `lite_workers` non-zero: as beside Lite's own workers (decode-sized calls on one thread).
int lk_linear(int kind, const float *x, int64_t M, int64_t K, const void *w, const void *scale, const void *mins,
              int64_t N, int64_t G, float *y, int threads, int lite_workers) {
  return RunLinear(kind, x, M, K, w, scale, mins, N, G, y, threads, lite_workers != 0);
}

// A lookup without Lite (tests): out (count, H) = rows `ids` of a table (V, H) stored as `kind` (lk::Kind: kI8
// with its scales, kF32P16, or kI8Group with its G scales a row).
int lk_gather(int kind, const int32_t *ids, int64_t count, const void *table, const void *scale, int64_t V, int64_t H,
              int64_t G, float *out) {
  if (kind != lk::kI8 && kind != lk::kF32P16 && kind != lk::kI8Group)
    return Fail("kind " + std::to_string(kind) + ": allowed 1, 4 or 6");
  return lk::Gather(kind, ids, count, table, scale, V, H, G, out);
}

// A plain read of `bytes` bytes over `threads` threads of the pool (the bandwidth a benchmark compares
// the kernels' weight streaming with); returns a checksum so the reads are not optimised away.
uint64_t lk_read(const void *data, int64_t bytes, int threads) {
  const int n = std::max(1, threads);
  const int64_t chunks = 8 * n, words = bytes / 8;
  std::vector<uint64_t> sums(chunks * 8, 0);
  Pool::Get().Run(n, chunks, [&](int64_t c) {
    const uint64_t *p = static_cast<const uint64_t *>(data);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = words * c / chunks, end = words * (c + 1) / chunks;
    for (; i + 4 <= end; i += 4) {
      s0 += p[i];
      s1 += p[i + 1];
      s2 += p[i + 2];
      s3 += p[i + 3];
    }
    for (; i < end; ++i) s0 += p[i];
    sums[c * 8] = s0 + s1 + s2 + s3;
  });
  uint64_t total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += sums[c * 8];
  return total;
}

}  // extern "C"
