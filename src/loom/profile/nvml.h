// GPUs through NVML, loaded at run time (libnvidia-ml.so.1, from the NVIDIA driver; no build
// dependency): each device's utilisation (the share of the last sample period in which a
// kernel ran) and memory in use. Without the library or a device the list is empty. The
// GPU path has not run on a machine with a GPU yet (docs/perf.md).
#pragma once

#include <vector>

namespace loom::profile {

struct GpuSample {
  int index = 0;
  double util_pct = 0, mem_used_mb = 0, mem_total_mb = 0;
};

// Every device NVML sees, now; empty when NVML is not there.
std::vector<GpuSample> sample_gpus();

}  // namespace loom::profile
