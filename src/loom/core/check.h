// LOOM_CHECK(cond) and LOOM_CHECK_EQ/LT/LE(a, b): invariant checks that stay on in
// release builds and print both values when they fail.
#pragma once

#include <sstream>
#include <string>

#include "loom/core/error.h"

namespace loom::detail {

template <typename A, typename B>
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const A& a,
                               const B& b) {
  std::ostringstream os;
  os << file << ":" << line << ": check failed: " << expr << " (" << a << " vs " << b << ")";
  throw InternalError(os.str());
}

[[noreturn]] void check_failed(const char* file, int line, const char* expr,
                               const std::string& msg);

}  // namespace loom::detail

#define LOOM_CHECK(cond)                                                      \
  do {                                                                        \
    if (!(cond)) ::loom::detail::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define LOOM_CHECK_MSG(cond, msg)                                                \
  do {                                                                           \
    if (!(cond)) ::loom::detail::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#define LOOM_CHECK_OP_(a, b, op)                                                             \
  do {                                                                                       \
    const auto& loom_a_ = (a);                                                               \
    const auto& loom_b_ = (b);                                                               \
    if (!(loom_a_ op loom_b_))                                                               \
      ::loom::detail::check_failed(__FILE__, __LINE__, #a " " #op " " #b, loom_a_, loom_b_); \
  } while (0)

#define LOOM_CHECK_EQ(a, b) LOOM_CHECK_OP_(a, b, ==)
#define LOOM_CHECK_NE(a, b) LOOM_CHECK_OP_(a, b, !=)
#define LOOM_CHECK_LT(a, b) LOOM_CHECK_OP_(a, b, <)
#define LOOM_CHECK_LE(a, b) LOOM_CHECK_OP_(a, b, <=)
#define LOOM_CHECK_GE(a, b) LOOM_CHECK_OP_(a, b, >=)
