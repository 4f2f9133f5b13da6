// What this CPU and OS can run. Compiled without ISA flags: cpuid and xgetbv are issued by
// inline assembly that any x86-64 executes (xgetbv only after cpuid reported OSXSAVE).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#endif

namespace daisy::kernels {
namespace {

#if defined(__x86_64__) || defined(__i386__)
struct X86Features {
  bool avx2 = false;        // CPU has AVX2 and the OS saves YMM state
  bool avx512vnni = false;  // CPU has AVX-512 F/BW/VL/VNNI and the OS saves ZMM + opmask state
  std::string avx2_problem, avx512_problem;
};

uint64_t XGetBv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

X86Features DetectX86() {
  X86Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) {
    f.avx2_problem = f.avx512_problem = "cpuid leaf 1 unavailable";
    return f;
  }
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  unsigned b7 = 0, c7 = 0;
  if (__get_cpuid_count(7, 0, &a, &b7, &c, &d)) c7 = c;
  const bool has_avx2 = (b7 >> 5) & 1;
  const bool has_f = (b7 >> 16) & 1, has_bw = (b7 >> 30) & 1, has_vl = (b7 >> 31) & 1;
  const bool has_vnni = (c7 >> 11) & 1;
  // XCR0: bit 1 SSE, bit 2 AVX (YMM), bits 5-7 opmask, ZMM_Hi256, Hi16_ZMM.
  const uint64_t xcr0 = osxsave ? XGetBv0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;
  if (!avx || !has_avx2)
    f.avx2_problem = "CPU lacks AVX2";
  else if (!osxsave || !os_ymm)
    f.avx2_problem = "OS does not save AVX (YMM) state (XGETBV)";
  else
    f.avx2 = true;
  if (!has_f || !has_bw || !has_vl || !has_vnni)
    f.avx512_problem = "CPU lacks AVX-512 F/BW/VL/VNNI";
  else if (!osxsave || !os_zmm)
    f.avx512_problem = "OS does not save AVX-512 (ZMM/opmask) state (XGETBV)";
  else
    f.avx512vnni = true;
  return f;
}
#endif

}  // namespace

std::string CpuSupportProblem(Backend backend) {
  switch (backend) {
    case Backend::kScalar:
      return "";
    case Backend::kAvx2:
    case Backend::kAvx512Vnni: {
#if defined(DAISY_KERNELS_X86)
      static const X86Features kFeatures = DetectX86();
      return backend == Backend::kAvx2 ? kFeatures.avx2_problem : kFeatures.avx512_problem;
#else
      return "not built for this architecture (x86-64 only)";
#endif
    }
    case Backend::kNeon: {
#if defined(DAISY_KERNELS_NEON)
      static const bool has_dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
      return has_dotprod ? "" : "CPU lacks the dot-product extension (HWCAP_ASIMDDP)";
#else
      return "not built for this architecture (arm64 only)";
#endif
    }
    case Backend::kWasm:
#if defined(DAISY_KERNELS_WASM)
      // The engine validated the whole module, SIMD128 instructions included, before
      // running any of it: being here means it runs them.
      return "";
#elif defined(__EMSCRIPTEN__)
      return "not built into this module (configured with DAISY_WASM_SIMD=OFF)";
#else
      return "not built for this architecture (wasm32 with SIMD128 only)";
#endif
  }
  return "unknown backend";
}

namespace internal {

std::string CpuModelKey() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  char vendor[13] = {0};
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
  }
  unsigned sig = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) sig = a;  // family, model, stepping
  char brand[49] = {0};
  for (unsigned leaf = 0; leaf < 3; ++leaf)
    if (__get_cpuid(0x80000002u + leaf, &a, &b, &c, &d)) {
      const unsigned regs[4] = {a, b, c, d};
      std::memcpy(brand + 16 * leaf, regs, 16);
    }
  std::string name(brand);
  while (!name.empty() && name.back() == ' ') name.pop_back();
  char sig_hex[16];
  std::snprintf(sig_hex, sizeof sig_hex, "%08x", sig);
  return std::string("x86 ") + vendor + " " + sig_hex + " " + name;
#elif defined(__aarch64__)
  std::ifstream in("/sys/devices/system/cpu/cpu0/regs/identification/midr_el1");
  std::string midr;
  if (in >> midr) return "arm64 midr " + midr;
  return "arm64";
#else
  return "unknown cpu";
#endif
}

}  // namespace internal
}  // namespace daisy::kernels
