// Standard base64 (RFC 4648 alphabet) decoding, as the tiktoken vocabulary files use it.
#pragma once

#include <string>
#include <string_view>

namespace loom {

// Decodes `in` (stopping at the first '=') into `out`; false on a character outside the
// alphabet.
bool base64_decode(std::string_view in, std::string& out);

}  // namespace loom
