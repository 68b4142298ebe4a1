#include "loom/comm/store/wire.h"

#include <cstring>

namespace loom::comm::wire {
namespace {

template <typename T>
void put(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

template <typename T>
bool take(const uint8_t*& p, const uint8_t* end, T& v) {
  if (static_cast<size_t>(end - p) < sizeof(T)) return false;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return true;
}

}  // namespace

std::string encode(const Message& m) {
  std::string body;
  put<uint8_t>(body, static_cast<uint8_t>(m.code));
  put<uint32_t>(body, m.timeout_ms);
  put<int64_t>(body, m.number);
  put<uint32_t>(body, static_cast<uint32_t>(m.strings.size()));
  for (const auto& s : m.strings) {
    put<uint32_t>(body, static_cast<uint32_t>(s.size()));
    body += s;
  }
  std::string frame;
  put<uint32_t>(frame, static_cast<uint32_t>(body.size()));
  return frame + body;
}

DecodeResult decode(const uint8_t* data, size_t len, size_t max_frame, Message& out) {
  DecodeResult r;
  if (len < kHeaderBytes) return r;
  uint32_t body_len;
  std::memcpy(&body_len, data, 4);
  if (body_len > max_frame) {
    r.status = Status::kOversized;
    r.error = "frame of " + std::to_string(body_len) + " bytes exceeds the limit of " +
              std::to_string(max_frame);
    return r;
  }
  if (body_len < kBodyFixedBytes) {
    r.status = Status::kMalformed;
    r.error = "frame body of " + std::to_string(body_len) + " bytes is shorter than its header";
    return r;
  }
  if (len - kHeaderBytes < body_len) return r;  // need more

  const uint8_t* p = data + kHeaderBytes;
  const uint8_t* end = p + body_len;
  uint8_t code = 0;
  uint32_t nstr = 0;
  Message m;
  take(p, end, code);
  take(p, end, m.timeout_ms);
  take(p, end, m.number);
  take(p, end, nstr);
  m.code = static_cast<Code>(code);
  // Each string needs at least its 4-byte length, which bounds nstr before allocating.
  if (nstr > static_cast<size_t>(end - p) / 4) {
    r.status = Status::kMalformed;
    r.error = "string count " + std::to_string(nstr) + " does not fit the frame";
    return r;
  }
  m.strings.reserve(nstr);
  for (uint32_t i = 0; i < nstr; ++i) {
    uint32_t slen;
    if (!take(p, end, slen) || slen > static_cast<size_t>(end - p)) {
      r.status = Status::kMalformed;
      r.error = "string " + std::to_string(i) + " runs past the end of the frame";
      return r;
    }
    m.strings.emplace_back(reinterpret_cast<const char*>(p), slen);
    p += slen;
  }
  if (p != end) {
    r.status = Status::kMalformed;
    r.error = std::to_string(end - p) + " trailing bytes after the last string";
    return r;
  }
  out = std::move(m);
  r.status = Status::kOk;
  r.consumed = kHeaderBytes + body_len;
  return r;
}

bool valid_request(const Message& m, std::string& why) {
  size_t n = m.strings.size();
  bool ok = false;
  switch (m.code) {
    case Code::kSet:
      ok = n == 2;
      break;
    case Code::kGet:
    case Code::kAdd:
    case Code::kRemove:
      ok = n == 1;
      break;
    case Code::kCompareSet:
      ok = n == 3;
      break;
    case Code::kWait:
    case Code::kCheck:
      ok = n >= 1;
      break;
    default:
      why = "unknown request code " + std::to_string(static_cast<int>(m.code));
      return false;
  }
  if (!ok)
    why = "request code " + std::to_string(static_cast<int>(m.code)) + " with " +
          std::to_string(n) + " strings";
  return ok;
}

}  // namespace loom::comm::wire
