#include "loom/data/text_source.h"

#include <lzma.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "loom/core/error.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_plain(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw UserError("cannot read input " + path + ": " + errno_text(errno),
                    "check the path and permissions");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw UserError("reading input " + path + " failed", "check the file");
  return s;
}

std::string read_gz(const std::string& path) {
  gzFile g = gzopen(path.c_str(), "rb");
  if (!g)
    throw UserError("cannot open input " + path + ": " + errno_text(errno),
                    "check the path and permissions");
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(g, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  if (gzdirect(g)) {  // zlib passes non-gzip data through; a .gz file must be gzip
    gzclose(g);
    throw UserError("input " + path + " ends in .gz but is not gzip data",
                    "rename it, or re-compress it with gzip");
  }
  int err = 0;
  const char* msg = gzerror(g, &err);
  gzclose(g);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END))
    throw UserError("input " + path + " is not valid gzip: " + msg, "check or re-create the file");
  return out;
}

std::string read_xz(const std::string& path) {
  std::string raw = read_plain(path);
  lzma_stream s = LZMA_STREAM_INIT;
  if (lzma_stream_decoder(&s, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK)
    throw InternalError("lzma_stream_decoder failed");
  std::string out;
  char buf[1 << 16];
  s.next_in = reinterpret_cast<const uint8_t*>(raw.data());
  s.avail_in = raw.size();
  lzma_ret rc;
  do {
    s.next_out = reinterpret_cast<uint8_t*>(buf);
    s.avail_out = sizeof buf;
    rc = lzma_code(&s, LZMA_FINISH);
    out.append(buf, sizeof buf - s.avail_out);
  } while (rc == LZMA_OK);
  lzma_end(&s);
  if (rc != LZMA_STREAM_END)
    throw UserError("input " + path + " is not valid xz (liblzma error " + std::to_string(rc) + ")",
                    "check or re-create the file");
  return out;
}
}  // namespace

std::vector<InputFile> list_inputs(const std::vector<std::string>& inputs) {
  std::vector<InputFile> out;
  for (const auto& in : inputs) {
    std::error_code ec;
    auto st = fs::status(in, ec);
    if (ec || !fs::exists(st))
      throw UserError("input " + in + " does not exist", "pass text files or folders with --input");
    if (fs::is_directory(st)) {
      std::vector<InputFile> found;
      for (auto it = fs::recursive_directory_iterator(
               in, fs::directory_options::skip_permission_denied, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) throw UserError("cannot list " + in + ": " + ec.message(), "check permissions");
        if (it->is_regular_file(ec)) found.push_back({it->path().string(), it->file_size(ec)});
      }
      std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.path < b.path; });
      out.insert(out.end(), found.begin(), found.end());
    } else {
      if (::access(in.c_str(), R_OK) != 0)
        throw UserError("input " + in + " is not readable: " + errno_text(errno),
                        "check permissions");
      out.push_back({in, fs::file_size(in, ec)});
    }
  }
  return out;
}

std::string read_text(const std::string& path) {
  if (ends_with(path, ".gz")) return read_gz(path);
  if (ends_with(path, ".xz")) return read_xz(path);
  return read_plain(path);
}

}  // namespace loom::data
