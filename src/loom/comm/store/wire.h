// The store's wire format: one message type for requests and replies.
//
//   frame   := u32 body_len | body                       (little-endian)
//   body    := u8 code | u32 timeout_ms | i64 number | u32 nstrings | string*
//   string  := u32 len | bytes
//
// The decoder is total: any byte sequence yields kNeedMore, kOk, kMalformed or kOversized,
// never a read past the input (fuzzed by tests/fuzz/store_wire_fuzz.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::comm::wire {

enum class Code : uint8_t {
  // requests
  kSet = 1,
  kGet,
  kAdd,
  kCompareSet,
  kRemove,
  kWait,
  kCheck,
  // replies
  kOk = 100,
  kTimeout,
  kError,
};

struct Message {
  Code code = Code::kOk;
  uint32_t timeout_ms = 0;
  int64_t number = 0;
  std::vector<std::string> strings;
};

enum class Status { kNeedMore, kOk, kMalformed, kOversized };

struct DecodeResult {
  Status status = Status::kNeedMore;
  size_t consumed = 0;  // bytes of one whole frame when kOk
  std::string error;    // why, when kMalformed / kOversized
};

constexpr size_t kHeaderBytes = 4;
constexpr size_t kBodyFixedBytes = 1 + 4 + 8 + 4;

std::string encode(const Message& m);
DecodeResult decode(const uint8_t* data, size_t len, size_t max_frame, Message& out);
// For requests: checks the code and the number of strings it needs.
bool valid_request(const Message& m, std::string& why);

}  // namespace loom::comm::wire
