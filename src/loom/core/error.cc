#include "loom/core/error.h"

#include <cstring>

#include "loom/core/check.h"

namespace loom {

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (not always buf).
  const char* msg = strerror_r(err, buf, sizeof buf);
  return std::string(msg) + " (errno " + std::to_string(err) + ")";
}

namespace detail {
void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  std::string s = std::string(file) + ":" + std::to_string(line) + ": check failed: " + expr;
  if (!msg.empty()) s += ": " + msg;
  throw InternalError(s);
}
}  // namespace detail

}  // namespace loom
