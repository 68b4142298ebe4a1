#include "loom/profile/system_sampler.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "loom/core/error.h"
#include "loom/profile/trace.h"

namespace loom::profile {

struct SystemSampler::Counters {
  double t = 0;
  std::vector<std::pair<double, double>> cpu;  // per core: busy, total jiffies
  double ctxt = 0;
  double proc_read = 0, proc_write = 0, disk_read = 0, disk_write = 0;  // bytes
  std::map<std::string, std::pair<double, double>> net;                 // bytes rx, tx
  double rss = 0;                                                       // bytes

  static Counters now() {
    Counters c;
    c.t =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    std::ifstream stat("/proc/stat");
    for (std::string line; std::getline(stat, line);) {
      std::istringstream in(line);
      std::string name;
      in >> name;
      if (name.size() > 3 && name.compare(0, 3, "cpu") == 0) {
        double v[8] = {}, total = 0;
        for (double& x : v) in >> x, total += x;
        c.cpu.push_back({total - v[3] - v[4], total});  // idle and iowait are not busy
      } else if (name == "ctxt") {
        in >> c.ctxt;
      }
    }
    std::ifstream io("/proc/self/io");
    for (std::string key; io >> key;) {
      double v = 0;
      io >> v;
      if (key == "read_bytes:") c.proc_read = v;
      if (key == "write_bytes:") c.proc_write = v;
    }
    std::ifstream disks("/proc/diskstats");
    for (std::string line; std::getline(disks, line);) {
      std::istringstream in(line);
      double major, minor, reads, merged, sectors_read, ms, writes, wmerged, sectors_written;
      std::string dev;
      in >> major >> minor >> dev >> reads >> merged >> sectors_read >> ms >> writes >> wmerged >>
          sectors_written;
      std::error_code ec;
      if (!std::filesystem::exists("/sys/block/" + dev, ec)) continue;  // a partition
      if (dev.compare(0, 4, "loop") == 0 || dev.compare(0, 3, "ram") == 0) continue;
      c.disk_read += sectors_read * 512, c.disk_write += sectors_written * 512;
    }
    std::ifstream net("/proc/net/dev");
    std::string line;
    std::getline(net, line), std::getline(net, line);  // two header lines
    while (std::getline(net, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string dev = line.substr(0, colon);
      dev.erase(0, dev.find_first_not_of(' '));
      std::istringstream in(line.substr(colon + 1));
      double v[9] = {};
      for (double& x : v) in >> x;
      c.net[dev] = {v[0], v[8]};
    }
    std::ifstream status("/proc/self/status");
    while (std::getline(status, line))
      if (line.compare(0, 6, "VmRSS:") == 0) c.rss = std::stod(line.substr(6)) * 1024;
    return c;
  }
};

std::string SystemSample::json() const {
  std::ostringstream o;
  char buf[64];
  auto num = [&](double x) {
    std::snprintf(buf, sizeof buf, "%.3f", x);
    return std::string(buf);
  };
  o << "{\"t_s\": " << num(t_s) << ", \"cpu_busy\": [";
  for (size_t i = 0; i < cpu_busy.size(); ++i) o << (i ? ", " : "") << num(cpu_busy[i]);
  o << "], \"rss_mb\": " << num(rss_mb) << ", \"proc_read_mbps\": " << num(proc_read_mbps)
    << ", \"proc_write_mbps\": " << num(proc_write_mbps)
    << ", \"disk_read_mbps\": " << num(disk_read_mbps)
    << ", \"disk_write_mbps\": " << num(disk_write_mbps) << ", \"ctxt_per_s\": " << num(ctxt_per_s)
    << ", \"net_mbps\": {";
  bool first = true;
  for (const auto& [dev, rt] : net_mbps) {
    o << (first ? "" : ", ") << "\"" << dev << "\": [" << num(rt.first) << ", " << num(rt.second)
      << "]";
    first = false;
  }
  o << "}";
  if (!gpus.empty()) {
    o << ", \"gpus\": [";
    for (size_t i = 0; i < gpus.size(); ++i)
      o << (i ? ", " : "") << "{\"index\": " << gpus[i].index
        << ", \"util_pct\": " << num(gpus[i].util_pct)
        << ", \"mem_used_mb\": " << num(gpus[i].mem_used_mb)
        << ", \"mem_total_mb\": " << num(gpus[i].mem_total_mb) << "}";
    o << "]";
  }
  o << "}";
  return o.str();
}

SystemSampler::SystemSampler(const std::string& path, double period_s)
    : out_(path, std::ios::app), period_s_(period_s) {
  if (!out_)
    throw UserError("cannot write the system metrics file " + path,
                    "point run.dir at a writable folder, or set train.system_sample_s = 0");
  thread_ = std::thread([this] { loop(); });
}

SystemSampler::~SystemSampler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

SystemSample SystemSampler::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

void SystemSampler::loop() {
  Counters last = Counters::now();
  const double t0 = last.t;
  const double mb = 1 << 20;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::duration<double>(period_s_), [&] { return stop_; }))
        return;
    }
    const Counters c = Counters::now();
    const double dt = std::max(c.t - last.t, 1e-6);
    SystemSample s;
    s.t_s = c.t - t0;
    for (size_t i = 0; i < c.cpu.size() && i < last.cpu.size(); ++i) {
      const double busy = c.cpu[i].first - last.cpu[i].first,
                   total = c.cpu[i].second - last.cpu[i].second;
      s.cpu_busy.push_back(total > 0 ? busy / total : 0);
    }
    s.rss_mb = c.rss / mb;
    s.proc_read_mbps = (c.proc_read - last.proc_read) / mb / dt;
    s.proc_write_mbps = (c.proc_write - last.proc_write) / mb / dt;
    s.disk_read_mbps = (c.disk_read - last.disk_read) / mb / dt;
    s.disk_write_mbps = (c.disk_write - last.disk_write) / mb / dt;
    s.ctxt_per_s = (c.ctxt - last.ctxt) / dt;
    s.gpus = sample_gpus();
    for (const auto& [dev, rt] : c.net) {
      auto it = last.net.find(dev);
      if (it == last.net.end()) continue;
      s.net_mbps[dev] = {(rt.first - it->second.first) / mb / dt,
                         (rt.second - it->second.second) / mb / dt};
    }
    out_ << s.json() << "\n";
    out_.flush();
    if (Trace::on()) {  // counter tracks of the timeline
      double busy = 0;
      for (double b : s.cpu_busy) busy += b;
      std::ostringstream args;
      args << "{\"cpu_busy_cores\": " << busy << ", \"rss_mb\": " << s.rss_mb
           << ", \"disk_mbps\": " << s.disk_read_mbps + s.disk_write_mbps;
      for (const GpuSample& g : s.gpus)
        args << ", \"gpu" << g.index << "_util_pct\": " << g.util_pct << ", \"gpu" << g.index
             << "_mem_mb\": " << g.mem_used_mb;
      args << "}";
      Trace::get().add_counter("system", c.t * 1e6, args.str());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      latest_ = s;
    }
    ++count_;
    last = c;
  }
}

}  // namespace loom::profile
