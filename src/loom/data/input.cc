#include "loom/data/input.h"

#include <fcntl.h>
#include <lzma.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "loom/core/error.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

std::string display(const std::string& path) {
  return path == "-" ? "standard input" : path;
}

// A file descriptor read in full-size pieces (a file, or standard input).
class FdReader {
 public:
  explicit FdReader(const std::string& path) : path_(path) {
    if (path == "-") {
      fd_ = 0;
      return;
    }
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw UserError("cannot read input " + path + ": " + errno_text(errno),
                      "check the path and permissions");
    owned_ = true;
  }
  ~FdReader() {
    if (owned_) ::close(fd_);
  }
  FdReader(const FdReader&) = delete;
  FdReader& operator=(const FdReader&) = delete;
  size_t read(char* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd_, buf + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        throw UserError("reading input " + display(path_) + " failed: " + errno_text(errno),
                        "check the file");
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    consumed_ += got;
    return got;
  }
  uint64_t consumed() const { return consumed_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool owned_ = false;
  uint64_t consumed_ = 0;
};

class PlainStream : public ByteStream {
 public:
  explicit PlainStream(const std::string& path) : in_(path) {}
  size_t read(char* buf, size_t n) override { return in_.read(buf, n); }
  uint64_t consumed() const override { return in_.consumed(); }

 private:
  FdReader in_;
};

// Compressed input: the compressed bytes come through a buffer the decoder drains.
class Decoder : public ByteStream {
 public:
  explicit Decoder(const std::string& path) : in_(path), buf_(kInBuf) {}
  uint64_t consumed() const override { return in_.consumed(); }

 protected:
  static constexpr size_t kInBuf = 1 << 20;
  // Refills the buffer once it is drained; false at the end of the file.
  bool refill() {
    if (pos_ < len_) return true;
    len_ = in_.read(buf_.data(), buf_.size());
    pos_ = 0;
    return len_ > 0;
  }
  [[noreturn]] void corrupt(const std::string& kind, const std::string& why) const {
    throw UserError("input " + display(in_.path()) + " is not valid " + kind + ": " + why,
                    "check or re-create the file (a download cut short?)");
  }
  FdReader in_;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
};

// gzip, one member or several concatenated (as `cat a.gz b.gz` or pigz write them).
class GzStream : public Decoder {
 public:
  explicit GzStream(const std::string& path) : Decoder(path) {
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) throw InternalError("inflateInit2 failed");
  }
  ~GzStream() override { inflateEnd(&z_); }
  size_t read(char* out, size_t n) override {
    size_t got = 0;
    while (got < n && !done_) {
      if (!refill()) {
        if (in_member_) corrupt("gzip", "it ends inside a member (truncated)");
        if (!any_) corrupt("gzip", "it is empty");
        done_ = true;
        break;
      }
      if (!in_member_ && !starts_member()) {
        // Bytes after a member that are not another member: gzip ignores trailing zeros.
        if (std::all_of(buf_.begin() + static_cast<long>(pos_),
                        buf_.begin() + static_cast<long>(len_), [](char c) { return c == 0; })) {
          pos_ = len_;
          continue;
        }
        corrupt("gzip", any_ ? "garbage after the last member" : "no gzip header");
      }
      in_member_ = any_ = true;
      z_.next_in = reinterpret_cast<Bytef*>(buf_.data() + pos_);
      z_.avail_in = static_cast<uInt>(len_ - pos_);
      z_.next_out = reinterpret_cast<Bytef*>(out + got);
      z_.avail_out = static_cast<uInt>(std::min<size_t>(n - got, 1u << 30));
      const int rc = inflate(&z_, Z_NO_FLUSH);
      got = static_cast<size_t>(reinterpret_cast<char*>(z_.next_out) - out);
      pos_ = len_ - z_.avail_in;
      if (rc == Z_STREAM_END) {
        in_member_ = false;
        inflateReset(&z_);
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        corrupt("gzip", z_.msg ? z_.msg : "zlib error " + std::to_string(rc));
      }
    }
    return got;
  }

 private:
  bool starts_member() const {
    return len_ - pos_ < 2 || (static_cast<unsigned char>(buf_[pos_]) == 0x1f &&
                               static_cast<unsigned char>(buf_[pos_ + 1]) == 0x8b);
  }
  z_stream z_{};
  bool in_member_ = false, any_ = false, done_ = false;
};

// xz, one stream or several concatenated.
class XzStream : public Decoder {
 public:
  explicit XzStream(const std::string& path) : Decoder(path) {
    if (lzma_stream_decoder(&s_, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK)
      throw InternalError("lzma_stream_decoder failed");
  }
  ~XzStream() override { lzma_end(&s_); }
  size_t read(char* out, size_t n) override {
    size_t got = 0;
    while (got < n && !done_) {
      const bool more = refill();
      s_.next_in = reinterpret_cast<const uint8_t*>(buf_.data() + pos_);
      s_.avail_in = len_ - pos_;
      s_.next_out = reinterpret_cast<uint8_t*>(out + got);
      s_.avail_out = n - got;
      const lzma_ret rc = lzma_code(&s_, more ? LZMA_RUN : LZMA_FINISH);
      got = n - s_.avail_out;
      pos_ = len_ - s_.avail_in;
      if (rc == LZMA_STREAM_END) {
        done_ = true;
      } else if (rc != LZMA_OK) {
        corrupt("xz", rc == LZMA_BUF_ERROR ? "it ends inside a stream (truncated)"
                                           : "liblzma error " + std::to_string(rc));
      }
    }
    return got;
  }

 private:
  lzma_stream s_ = LZMA_STREAM_INIT;
  bool done_ = false;
};

// zstd: any number of frames (zstd -T, pzstd and concatenation write several), skippable
// frames ignored, windows up to 2^31 (zstd --long=31; the library's default stops at 2^27).
class ZstdStream : public Decoder {
 public:
  explicit ZstdStream(const std::string& path) : Decoder(path), d_(ZSTD_createDCtx()) {
    if (!d_) throw InternalError("ZSTD_createDCtx failed");
    ZSTD_DCtx_setParameter(d_, ZSTD_d_windowLogMax, 31);
  }
  ~ZstdStream() override { ZSTD_freeDCtx(d_); }
  size_t read(char* out, size_t n) override {
    size_t got = 0;
    while (got < n) {
      if (!refill()) {
        if (pending_ != 0) corrupt("zstd", "it ends inside a frame (truncated)");
        break;
      }
      ZSTD_inBuffer in{buf_.data(), len_, pos_};
      ZSTD_outBuffer o{out, n, got};
      pending_ = ZSTD_decompressStream(d_, &o, &in);
      if (ZSTD_isError(pending_)) corrupt("zstd", ZSTD_getErrorName(pending_));
      pos_ = in.pos;
      got = o.pos;
    }
    return got;
  }

 private:
  ZSTD_DCtx* d_;
  size_t pending_ = 0;  // 0 between frames
};

}  // namespace

InputFormat format_of(const std::string& path) {
  std::string p = path;
  for (const char* z : {".gz", ".xz", ".zst"})
    if (p.ends_with(z)) p.resize(p.size() - std::string(z).size());
  return p.ends_with(".jsonl") || p.ends_with(".json") ? InputFormat::kJsonLines
                                                       : InputFormat::kText;
}

std::vector<InputFile> list_inputs(const std::vector<std::string>& inputs, InputFormat stdin_format,
                                   bool override_format) {
  std::vector<InputFile> out;
  auto typed = [&](std::string path, uint64_t bytes) {
    const InputFormat f = override_format || path == "-" ? stdin_format : format_of(path);
    return InputFile{std::move(path), bytes, f};
  };
  for (const auto& in : inputs) {
    if (in == "-") {
      out.push_back(typed("-", 0));
      continue;
    }
    std::error_code ec;
    auto st = fs::status(in, ec);
    if (ec || !fs::exists(st))
      throw UserError("input " + in + " does not exist",
                      "pass text or JSON Lines files or folders with --input");
    if (fs::is_directory(st)) {
      std::vector<InputFile> found;
      for (auto it = fs::recursive_directory_iterator(
               in, fs::directory_options::skip_permission_denied, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) throw UserError("cannot list " + in + ": " + ec.message(), "check permissions");
        if (it->is_regular_file(ec)) found.push_back(typed(it->path().string(), it->file_size(ec)));
      }
      std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.path < b.path; });
      out.insert(out.end(), found.begin(), found.end());
    } else {
      if (::access(in.c_str(), R_OK) != 0)
        throw UserError("input " + in + " is not readable: " + errno_text(errno),
                        "check permissions");
      out.push_back(typed(in, fs::file_size(in, ec)));
    }
  }
  return out;
}

std::unique_ptr<ByteStream> open_input(const std::string& path) {
  if (path.ends_with(".gz")) return std::make_unique<GzStream>(path);
  if (path.ends_with(".xz")) return std::make_unique<XzStream>(path);
  if (path.ends_with(".zst")) return std::make_unique<ZstdStream>(path);
  return std::make_unique<PlainStream>(path);
}

std::string read_all(const std::string& path) {
  auto s = open_input(path);
  std::string out;
  std::vector<char> buf(1 << 20);
  while (size_t n = s->read(buf.data(), buf.size())) out.append(buf.data(), n);
  return out;
}

}  // namespace loom::data
