// The CPUs this process may run on: its affinity mask, which taskset, numactl, Slurm and a
// container's cpuset narrow (std::thread::hardware_concurrency() counts the machine's).
#pragma once

#include <string>
#include <vector>

namespace loom {

int cpus_available();

// The calling thread's affinity mask as CPU ids, ascending (every online CPU if it cannot
// be read).
std::vector<int> cpus_allowed();

// Narrows the calling thread to `cpus` (threads it creates later inherit them); false if
// the kernel refused (an id outside this process's cpuset).
bool set_thread_cpus(const std::vector<int>& cpus);

// "0-3,8,10-11" and back: how a rank publishes its mask at rendezvous. parse_cpu_list
// returns an empty list for text that is not such a list.
std::string format_cpu_list(const std::vector<int>& cpus);
std::vector<int> parse_cpu_list(const std::string& text);

}  // namespace loom
