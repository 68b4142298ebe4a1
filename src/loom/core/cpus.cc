#include "loom/core/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace loom {

int cpus_available() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

}  // namespace loom
