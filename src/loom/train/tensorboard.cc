#include "loom/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

#include "loom/core/error.h"

namespace loom::train {

namespace {
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli
    t[i] = c;
  }
  return t;
}
constexpr auto kCrcTable = make_crc_table();

uint32_t masked_crc(const void* p, size_t n) {
  const uint32_t c = crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protocol-buffer wire encoding, just what an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void tag(std::string& out, int field, int wire_type) {
  varint(out, (field << 3) | wire_type);
}
void bytes_field(std::string& out, int field, std::string_view b) {
  tag(out, field, 2);
  varint(out, b.size());
  out.append(b);
}
template <typename T>
void fixed_field(std::string& out, int field, T v) {
  tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian on every target loom builds for
  out.append(b, sizeof(T));
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}
}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
          "." + host + "." + std::to_string(getpid());
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw UserError("cannot create " + path_, "check that run.dir is writable");
  std::string ev;
  fixed_field(ev, 1, now_seconds());
  bytes_field(ev, 3, "brain.Event:2");
  record(ev);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::scalars(int64_t step,
                                const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [name, v] : values) {
    std::string value;
    bytes_field(value, 1, name);
    fixed_field(value, 2, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string ev;
  fixed_field(ev, 1, now_seconds());
  tag(ev, 2, 0);
  varint(ev, static_cast<uint64_t>(step));
  bytes_field(ev, 5, summary);
  record(ev);
}

void TensorBoardWriter::record(std::string_view event) {
  const uint64_t len = event.size();
  const uint32_t len_crc = masked_crc(&len, sizeof len);
  const uint32_t data_crc = masked_crc(event.data(), event.size());
  std::fwrite(&len, sizeof len, 1, f_);
  std::fwrite(&len_crc, sizeof len_crc, 1, f_);
  std::fwrite(event.data(), 1, event.size(), f_);
  std::fwrite(&data_crc, sizeof data_crc, 1, f_);
}

void TensorBoardWriter::flush() {
  std::fflush(f_);
}

}  // namespace loom::train
