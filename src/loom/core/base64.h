// Standard base64 (RFC 4648 alphabet), as the tiktoken vocabulary files and etcd's JSON
// gateway use it.
#pragma once

#include <string>
#include <string_view>

namespace loom {

// Decodes `in` (stopping at the first '=') into `out`; false on a character outside the
// alphabet.
bool base64_decode(std::string_view in, std::string& out);
// With '=' padding.
std::string base64_encode(std::string_view in);

}  // namespace loom
