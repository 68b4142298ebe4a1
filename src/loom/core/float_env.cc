#include "loom/core/float_env.h"

#include <cstdint>
#include <string>

#include "loom/core/error.h"
#include "loom/core/tunable.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace loom {
namespace {

const IntTunable kFlush("LOOM_FLUSH_DENORMALS", 1,
                        "1: flush subnormal floats to zero on every thread (FTZ/DAZ), 0: keep "
                        "them (a product with one can cost ~100x)");

#if defined(__x86_64__)
constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6;  // MXCSR bits
#elif defined(__aarch64__)
constexpr uint64_t kFz = uint64_t{1} << 24;  // FPCR.FZ
#endif

}  // namespace

bool set_flush_denormals(bool on) {
#if defined(__x86_64__)
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? csr | kFtz | kDaz : csr & ~(kFtz | kDaz));
  return true;
#elif defined(__aarch64__)
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  fpcr = on ? fpcr | kFz : fpcr & ~kFz;
  __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
  return true;
#else
  (void)on;
  return false;
#endif
}

bool flushing_denormals() {
#if defined(__x86_64__)
  return (_mm_getcsr() & (kFtz | kDaz)) == (kFtz | kDaz);
#elif defined(__aarch64__)
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr & kFz) != 0;
#else
  return false;
#endif
}

bool flush_denormals_from_env() {
  const int64_t v = kFlush.get();
  if (v != 0 && v != 1)
    throw UserError("LOOM_FLUSH_DENORMALS=" + std::to_string(v) + " is not 0 or 1",
                    "unset it (flushing on), or set it to 0 to keep subnormal floats");
  return set_flush_denormals(v == 1) && flushing_denormals();
}

}  // namespace loom
