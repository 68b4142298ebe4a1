// The system-metrics sampler: every `period` seconds, from /proc, this machine's busy share
// of each core, its network bytes per interface and disk bytes (whole disks), context
// switches, and this process's RSS and storage I/O. One JSON object per sample goes to a
// file (system.jsonl); the latest sample is there for other sinks (TensorBoard) and, with
// the timeline on, every sample becomes counter events ("ph": "C") of the trace.
//
// GPUs: utilisation and memory through NVML when the driver's library is there (nvml.h).
// Not sampled: memory bandwidth (needs the PMU, which this VM does not expose to
// perf_event_open).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/profile/nvml.h"

namespace loom::profile {

struct SystemSample {
  double t_s = 0;                                             // seconds since the sampler started
  std::vector<double> cpu_busy;                               // per core, 0..1 over the last period
  double rss_mb = 0;                                          // this process
  double proc_read_mbps = 0, proc_write_mbps = 0;             // this process's storage I/O
  double disk_read_mbps = 0, disk_write_mbps = 0;             // whole disks of the machine
  std::map<std::string, std::pair<double, double>> net_mbps;  // interface: rx, tx
  double ctxt_per_s = 0;                                      // machine-wide context switches
  std::vector<GpuSample> gpus;                                // NVML's, when there are GPUs
  std::string json() const;
};

class SystemSampler {
 public:
  // Appends to `path` every `period_s` seconds until destroyed. UserError when the file
  // cannot be opened.
  SystemSampler(const std::string& path, double period_s);
  ~SystemSampler();
  SystemSampler(const SystemSampler&) = delete;
  SystemSampler& operator=(const SystemSampler&) = delete;

  SystemSample latest() const;
  int samples() const { return count_.load(); }

 private:
  struct Counters;  // the raw /proc values at one moment
  void loop();

  std::ofstream out_;
  double period_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  SystemSample latest_;
  std::atomic<int> count_{0};
  std::thread thread_;
};

}  // namespace loom::profile
