// UTF-8 repair with the WHATWG decoder's rule: every maximal invalid subsequence becomes
// U+FFFD. This is what JavaScript's TextDecoder (and so the reference tokenizer, which
// works on JS strings) does to invalid bytes, so token ids match it exactly.
#pragma once

#include <string>
#include <string_view>

namespace loom::data {

// True when `s` is valid UTF-8 (then repair_utf8 would return it unchanged).
bool valid_utf8(std::string_view s);
std::string repair_utf8(std::string_view s);

}  // namespace loom::data
