// Reading a corpus: the input list (files, folders read recursively in sorted order, or "-"
// for standard input) and a byte stream per input, decompressed on the fly when its name
// ends in .gz (zlib: concatenated members too), .xz (liblzma: concatenated streams) or .zst
// (libzstd: multi-frame files, and windows up to 2 GiB as `zstd --long=31` writes them).
// What the decompressed bytes are is the name without that suffix: .jsonl and .json are
// JSON Lines, anything else plain text.
//
// Streams read a bounded buffer at a time, so a 15 GB Pile file needs no more memory than a
// small one. A corrupt or truncated compressed file is a UserError naming it, never a short
// corpus.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::data {

enum class InputFormat { kText, kJsonLines };

struct InputFile {
  std::string path;    // "-" is standard input
  uint64_t bytes = 0;  // on disk (compressed size for .gz/.xz/.zst; 0 for "-")
  InputFormat format = InputFormat::kText;
};

// Expands folders (regular files below them, sorted by path); `format` decides what "-" is
// and, unless `override_format`, files are typed by name. UserError naming the input that
// does not exist or cannot be read.
std::vector<InputFile> list_inputs(const std::vector<std::string>& inputs,
                                   InputFormat stdin_format = InputFormat::kText,
                                   bool override_format = false);

// The decompressed bytes of one input, in order.
class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Up to n bytes into buf; 0 at the end. UserError naming the file on a read or decode
  // error (a truncated file included).
  virtual size_t read(char* buf, size_t n) = 0;
  // Bytes of the file consumed so far (compressed), for progress.
  virtual uint64_t consumed() const = 0;
};

std::unique_ptr<ByteStream> open_input(const std::string& path);

// The whole decompressed content of a file (tests, small inputs).
std::string read_all(const std::string& path);

// The input's format by its name: .jsonl / .json (before any .gz/.xz/.zst) are JSON Lines.
InputFormat format_of(const std::string& path);

}  // namespace loom::data
