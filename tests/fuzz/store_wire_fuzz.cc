// libFuzzer target for the store's wire decoder: any byte sequence must decode to
// need-more, a frame, malformed or oversized, without reading out of bounds; frames that
// decode must re-encode to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/comm/store/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::comm::wire;
  Message m;
  DecodeResult r = decode(data, size, 1 << 16, m);
  if (r.status == Status::kOk) {
    std::string again = encode(m);
    if (again.size() != r.consumed ||
        again.compare(0, again.size(), reinterpret_cast<const char*>(data), r.consumed) != 0)
      __builtin_trap();
    std::string why;
    (void)valid_request(m, why);
  }
  return 0;
}
