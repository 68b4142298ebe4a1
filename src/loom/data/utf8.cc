#include "loom/data/utf8.h"

#include <cstdint>

namespace loom::data {
namespace {

// Length of the valid sequence starting at s[i], or 0 with *consumed set to the length of
// the maximal subpart to replace.
size_t sequence(std::string_view s, size_t i, size_t* consumed) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return 1;
  int need;
  uint8_t lower = 0x80, upper = 0xBF;
  if (b >= 0xC2 && b <= 0xDF)
    need = 1;
  else if (b == 0xE0)
    need = 2, lower = 0xA0;
  else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
    need = 2;
  else if (b == 0xED)
    need = 2, upper = 0x9F;
  else if (b == 0xF0)
    need = 3, lower = 0x90;
  else if (b >= 0xF1 && b <= 0xF3)
    need = 3;
  else if (b == 0xF4)
    need = 3, upper = 0x8F;
  else {
    *consumed = 1;
    return 0;
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) {
      *consumed = j - i;
      return 0;
    }
    auto c = static_cast<uint8_t>(s[j]);
    if (c < lower || c > upper) {
      *consumed = j - i;  // the offending byte starts the next attempt
      return 0;
    }
    lower = 0x80, upper = 0xBF;
  }
  return j - i;
}

}  // namespace

bool valid_utf8(std::string_view s) {
  size_t consumed;
  for (size_t i = 0; i < s.size();) {
    size_t n = sequence(s, i, &consumed);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t consumed;
  for (size_t i = 0; i < s.size();) {
    size_t n = sequence(s, i, &consumed);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += consumed;
    }
  }
  return out;
}

}  // namespace loom::data
