// Logging filtered by subsystem, in the manner of NCCL_DEBUG_SUBSYS.
//
//   LOOM_LOG=warn                 everything at warn and above (the default)
//   LOOM_LOG=info,comm=debug      info everywhere, debug for the comm subsystem
//
// Lines go to stderr as "[loom rank R] LEVEL subsys: message".
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace loom::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

bool enabled(std::string_view subsys, Level level);
void write(std::string_view subsys, Level level, const std::string& msg);
// The rank printed in every line; set once by the communicator bootstrap.
void set_rank(int rank);

class Line {
 public:
  Line(std::string_view subsys, Level level) : subsys_(subsys), level_(level) {}
  ~Line() { write(subsys_, level_, os_.str()); }
  template <typename T>
  Line& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::string_view subsys_;
  Level level_;
  std::ostringstream os_;
};

}  // namespace loom::log

#define LOOM_LOG(level, subsys)                                   \
  if (!::loom::log::enabled(subsys, ::loom::log::Level::level)) { \
  } else                                                          \
    ::loom::log::Line(subsys, ::loom::log::Level::level)
