// Picks the kernel variant once (kernels.h): the widest the CPU runs, or MOERL_KERNELS; and
// the OpenBLAS core type a process should ask for.
#include "model/kernels.h"

#include <cblas.h>    // openblas_get_corename
#include <strings.h>  // strcasecmp

#include <cstdlib>  // std::getenv
#include <cstring>  // std::strcmp
#include <string>

#include "common/check.h"

namespace moerl::model {

// One table per compilation of kernels_impl.cc.
namespace kernels_baseline {
extern const Kernels kTable;
}
#if defined(__x86_64__)
namespace kernels_avx2 {
extern const Kernels kTable;
}
namespace kernels_avx512 {
extern const Kernels kTable;
}
#endif

std::vector<const Kernels*> runnable_kernels() {
  std::vector<const Kernels*> out = {&kernels_baseline::kTable};
#if defined(__x86_64__)
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XCR0)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    out.push_back(&kernels_avx2::kTable);  // built with -mfma (every AVX2 x86-64 has FMA3)
  if (__builtin_cpu_supports("avx512f")) out.push_back(&kernels_avx512::kTable);
#endif
  return out;
}

namespace {

const Kernels& choose() {
  const std::vector<const Kernels*> runnable = runnable_kernels();
  const char* forced = std::getenv("MOERL_KERNELS");
  if (forced == nullptr || *forced == '\0') return *runnable.back();
  std::string names;
  for (const Kernels* k : runnable) {
    if (std::strcmp(k->name, forced) == 0) return *k;
    names += names.empty() ? k->name : std::string(", ") + k->name;
  }
  MOERL_FAIL(BadInput, "MOERL_KERNELS=", forced, " is not a variant this CPU runs (", names,
             "); unset it to use the widest");
}

}  // namespace

const Kernels& kernels() {
  static const Kernels& k = choose();
  return k;
}

const char* blas_core() { return openblas_get_corename(); }

bool blas_core_uses_avx2(const char* core) {
  for (const char* avx2 :
       {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"})
    if (strcasecmp(core, avx2) == 0) return true;
  return false;
}

const char* blas_core_to_set() {
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (set != nullptr && *set != '\0') return nullptr;
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return nullptr;
  if (blas_core_uses_avx2(blas_core())) return nullptr;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return avx512 ? "SkylakeX" : "Haswell";
#else
  return nullptr;
#endif
}

}  // namespace moerl::model
