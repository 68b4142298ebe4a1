#include "loom/core/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace loom {

int cpus_available() {
  return static_cast<int>(cpus_allowed().size());
}

std::vector<int> cpus_allowed() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  } else {
    for (long c = 0; c < std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)); ++c)
      cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

bool set_thread_cpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::ostringstream os;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (i > 0) os << ',';
    os << cpus[i];
    if (j > i) os << '-' << cpus[j];
    i = j + 1;
  }
  return os.str();
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::istringstream is(text);
  std::string part;
  while (std::getline(is, part, ',')) {
    char* end = nullptr;
    const long lo = std::strtol(part.c_str(), &end, 10);
    long hi = lo;
    if (end == part.c_str()) return {};
    if (*end == '-') {
      const char* from = end + 1;
      hi = std::strtol(from, &end, 10);
      if (end == from) return {};
    }
    if (*end != '\0' || lo < 0 || hi < lo || hi >= CPU_SETSIZE) return {};
    for (long c = lo; c <= hi; ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

}  // namespace loom
