// Picks the kernel variant once (kernels.h): the widest the CPU runs, or MOERL_KERNELS.
#include "model/kernels.h"

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

}  // namespace moerl::model
