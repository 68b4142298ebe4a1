// Tunables: each knob is declared once, where it is used, with its environment name,
// default and a one-line description (NCCL's NCCL_PARAM idea). `loom bench --tunables`
// lists them all. Values are read from the environment when asked for, so a process
// that sets a variable before building a communicator sees it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct TunableInfo {
  const char* env;
  std::string default_text;
  const char* help;
};

// All tunables declared in the program (registered by static initialisation).
const std::vector<TunableInfo>& all_tunables();

namespace detail {
void register_tunable(TunableInfo info);
// Parse helpers: throw UserError naming the variable when the text is malformed.
int64_t parse_int_env(const char* env, const char* text);
double parse_double_env(const char* env, const char* text);
}  // namespace detail

class IntTunable {
 public:
  IntTunable(const char* env, int64_t dflt, const char* help);
  int64_t get() const;
  const char* env() const { return env_; }

 private:
  const char* env_;
  int64_t default_;
};

// A size in bytes: "4096", "64K", "1MiB" (parse_bytes); listed with its unit.
class BytesTunable {
 public:
  BytesTunable(const char* env, int64_t dflt, const char* help);
  int64_t get() const;
  const char* env() const { return env_; }

 private:
  const char* env_;
  int64_t default_;
};

class DoubleTunable {
 public:
  DoubleTunable(const char* env, double dflt, const char* help);
  double get() const;

 private:
  const char* env_;
  double default_;
};

class StringTunable {
 public:
  StringTunable(const char* env, const char* dflt, const char* help);
  std::string get() const;
  const char* env() const { return env_; }

 private:
  const char* env_;
  const char* default_;
};

// Parses sizes such as "4096", "64K", "64KiB", "1M", "1GiB"; nullopt-free: throws UserError
// naming `what` on malformed text.
uint64_t parse_bytes(const std::string& text, const std::string& what);
std::string format_bytes(uint64_t bytes);

}  // namespace loom
