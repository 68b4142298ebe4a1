#include "loom/profile/nvml.h"

#include <dlfcn.h>

#include <mutex>

namespace loom::profile {
namespace {

// The few NVML entry points used, as the driver's nvml.h declares them.
struct Utilization {
  unsigned int gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};
using Device = void*;

struct Nvml {
  int (*init)() = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*handle)(unsigned int, Device*) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  bool ok = false;

  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    count = reinterpret_cast<int (*)(unsigned int*)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
    handle = reinterpret_cast<int (*)(unsigned int, Device*)>(
        dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    utilization = reinterpret_cast<int (*)(Device, Utilization*)>(
        dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    memory = reinterpret_cast<int (*)(Device, Memory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    ok = init && count && handle && utilization && memory && init() == 0;  // NVML_SUCCESS
  }
};

}  // namespace

std::vector<GpuSample> sample_gpus() {
  static Nvml nvml;  // loaded once, on first use
  static std::mutex mu;
  std::vector<GpuSample> out;
  if (!nvml.ok) return out;
  std::lock_guard<std::mutex> lock(mu);
  unsigned int n = 0;
  if (nvml.count(&n) != 0) return out;
  for (unsigned int i = 0; i < n; ++i) {
    Device d = nullptr;
    Utilization u{};
    Memory m{};
    if (nvml.handle(i, &d) != 0 || nvml.utilization(d, &u) != 0 || nvml.memory(d, &m) != 0)
      continue;
    const double mb = 1 << 20;
    out.push_back({static_cast<int>(i), static_cast<double>(u.gpu), m.used / mb, m.total / mb});
  }
  return out;
}

}  // namespace loom::profile
