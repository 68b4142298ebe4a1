#include "loom/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace loom::log {
namespace {

struct Filter {
  Level fallback = Level::kWarn;
  std::vector<std::pair<std::string, Level>> per_subsys;
};

Level parse_level(std::string_view s, Level dflt) {
  if (s == "debug" || s == "trace") return Level::kDebug;
  if (s == "info") return Level::kInfo;
  if (s == "warn" || s == "warning") return Level::kWarn;
  if (s == "error") return Level::kError;
  if (s == "off" || s == "none") return Level::kOff;
  return dflt;
}

// Parsed once from LOOM_LOG; immutable afterwards.
const Filter& filter() {
  static const Filter f = [] {
    Filter out;
    const char* env = std::getenv("LOOM_LOG");
    if (!env) return out;
    std::string_view rest(env);
    while (!rest.empty()) {
      auto comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      auto eq = item.find('=');
      if (eq == std::string_view::npos) {
        out.fallback = parse_level(item, out.fallback);
      } else {
        out.per_subsys.emplace_back(std::string(item.substr(0, eq)),
                                    parse_level(item.substr(eq + 1), Level::kWarn));
      }
    }
    return out;
  }();
  return f;
}

std::atomic<int> g_rank{-1};  // set once at bootstrap; only read by the printer
std::mutex g_write_mu;

const char* level_name(Level l) {
  switch (l) {
    case Level::kDebug:
      return "DEBUG";
    case Level::kInfo:
      return "INFO";
    case Level::kWarn:
      return "WARN";
    case Level::kError:
      return "ERROR";
    case Level::kOff:
      return "OFF";
  }
  return "?";
}

}  // namespace

bool enabled(std::string_view subsys, Level level) {
  const Filter& f = filter();
  for (const auto& [name, lvl] : f.per_subsys)
    if (name == subsys) return level >= lvl;
  return level >= f.fallback;
}

void write(std::string_view subsys, Level level, const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_write_mu);
  int r = g_rank.load(std::memory_order_relaxed);
  if (r >= 0)
    std::fprintf(stderr, "[loom rank %d] %s %.*s: %s\n", r, level_name(level),
                 static_cast<int>(subsys.size()), subsys.data(), msg.c_str());
  else
    std::fprintf(stderr, "[loom] %s %.*s: %s\n", level_name(level), static_cast<int>(subsys.size()),
                 subsys.data(), msg.c_str());
}

void set_rank(int rank) {
  g_rank.store(rank, std::memory_order_relaxed);
}

}  // namespace loom::log
