#include "loom/core/tunable.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "loom/core/error.h"

namespace loom {
namespace {
// Written only during static initialisation (declarations of tunables), read afterwards.
std::vector<TunableInfo>& registry() {
  static std::vector<TunableInfo> r;
  return r;
}
std::mutex& registry_mu() {
  static std::mutex m;
  return m;
}
}  // namespace

const std::vector<TunableInfo>& all_tunables() {
  return registry();
}

namespace detail {
void register_tunable(TunableInfo info) {
  std::lock_guard<std::mutex> lock(registry_mu());
  registry().push_back(std::move(info));
}

int64_t parse_int_env(const char* env, const char* text) {
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0')
    throw UserError(std::string(env) + "='" + text + "' is not an integer",
                    std::string("set ") + env + " to a whole number or unset it");
  return v;
}

double parse_double_env(const char* env, const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || *end != '\0')
    throw UserError(std::string(env) + "='" + text + "' is not a number",
                    std::string("set ") + env + " to a number or unset it");
  return v;
}
}  // namespace detail

IntTunable::IntTunable(const char* env, int64_t dflt, const char* help)
    : env_(env), default_(dflt) {
  detail::register_tunable({env, std::to_string(dflt), help});
}
int64_t IntTunable::get() const {
  const char* v = std::getenv(env_);
  return (v && *v) ? detail::parse_int_env(env_, v) : default_;
}

BytesTunable::BytesTunable(const char* env, int64_t dflt, const char* help)
    : env_(env), default_(dflt) {
  detail::register_tunable({env, format_bytes(static_cast<uint64_t>(dflt)), help});
}
int64_t BytesTunable::get() const {
  const char* v = std::getenv(env_);
  if (!v || !*v) return default_;
  const uint64_t b = parse_bytes(v, env_);
  if (b > static_cast<uint64_t>(INT64_MAX))
    throw UserError(std::string(env_) + "='" + v + "' is too large", "write a smaller size");
  return static_cast<int64_t>(b);
}

DoubleTunable::DoubleTunable(const char* env, double dflt, const char* help)
    : env_(env), default_(dflt) {
  detail::register_tunable({env, std::to_string(dflt), help});
}
double DoubleTunable::get() const {
  const char* v = std::getenv(env_);
  return (v && *v) ? detail::parse_double_env(env_, v) : default_;
}

StringTunable::StringTunable(const char* env, const char* dflt, const char* help)
    : env_(env), default_(dflt) {
  detail::register_tunable({env, dflt, help});
}
std::string StringTunable::get() const {
  const char* v = std::getenv(env_);
  return (v && *v) ? std::string(v) : std::string(default_);
}

uint64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  auto bad = [&]() -> UserError {
    return UserError(what + ": '" + text + "' is not a size",
                     "write a size like 4096, 64K, 64KiB, 16M or 1GiB");
  };
  if (i == 0 || i > 19) throw bad();  // 19 digits: below 2^64
  uint64_t v = std::stoull(text.substr(0, i));
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  uint64_t mul = 1;
  if (unit.empty() || unit == "B")
    mul = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    mul = 1ull << 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    mul = 1ull << 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    mul = 1ull << 30;
  else
    throw bad();
  if (v > UINT64_MAX / mul) throw bad();
  return v * mul;
}

std::string format_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  uint64_t v = b;
  while (u < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + units[u];
}

}  // namespace loom
