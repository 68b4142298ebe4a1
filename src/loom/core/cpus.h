// The CPUs this process may run on: its affinity mask, which taskset, numactl, Slurm and a
// container's cpuset narrow (std::thread::hardware_concurrency() counts the machine's).
#pragma once

namespace loom {

int cpus_available();

}  // namespace loom
