// What the project's Lite kernels share across their files (defined in lite_kernels.cc): errors, threads,
// the loops chosen for this CPU, and the registry's names.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace lk {

constexpr char kProvider[] = "llm_lite_export";   // the provider the kernels are registered under
extern thread_local std::string g_last_error;    // the reason of the last failure (lk_last_error)

// Sets g_last_error, returns 1.
int Fail(const std::string &message);
// Lite's status for a kernel is a bare code: the reason goes to stderr, which the shim captures.
int Report(const std::string &error);
std::string Shape(const std::vector<int64_t> &s);
// The threads a kernel call may use: lk_set_threads', else those of Lite's context; LITE_KERNELS_THREADS caps them.
int KernelThreads(int lite_threads);
// Whether lk_set_threads gave the kernels the threads (Lite then runs on one); else Lite's workers hold them.
bool KernelsHoldThreads();
// The AVX2 + FMA loops (else the portable ones), chosen once at load (LITE_KERNELS_ISA forces a choice).
bool Avx2Loops();
// ... and the GEMMs on AVX-512 registers (the CPU has them)
bool WideLoops();
std::vector<char> Chars(const std::string &s);
// A float16's bits as a float (normal, subnormal, zero, infinity, NaN).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  float f;
  if (exponent == 0) {
    f = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -f : f;
  }
  const uint32_t bits = sign | (exponent == 0x1F ? 0x7F800000u : (exponent + 112) << 23) | mantissa << 13;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
// MindSpore's op-info entry of a Custom type whose inputs have these dtypes (its output is float32).
std::string OpInfo(const std::string &name, const std::vector<std::string> &dtypes);

// The attention kernel's registration (attention_kernel.cc): the kernel and its shape inference with Lite,
// or (`op_info`) the entry a MindIR Build needs.
int RegisterAttend(bool op_info);
// The paged attention's (paged_attention_kernel.cc), likewise.
int RegisterPagedAttend(bool op_info);
// The layer ops' (layer_ops_kernel.cc: RMS norm, SwiGLU, rotary), likewise.
int RegisterLayerOps(bool op_info);
// The lookups' (lookup_kernel.cc), likewise.
int RegisterLookups(bool op_info);

// The group of runs of 32 weights that the scales' G columns a row stand for: the least power of two 2^s with
// ceil(runs / 2^s) == G (the groups are 32, 64 or 128 weights; the last of a row may be short, so that G alone
// does not give the size: 160 weights in groups of 128 are 2 groups, as in groups of 96 would be). -1: none.
int GroupShift(int64_t runs, int64_t G);
// out (count, H) = the rows `ids` of a table (V, H) stored as the linear kernels' `kind` (lookup_kernel.cc).
int Gather(int kind, const int32_t *ids, int64_t count, const void *table, const void *scales, int64_t V, int64_t H,
           int64_t G, float *out);

}  // namespace lk
