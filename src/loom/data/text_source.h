// Reading a corpus: the input list (files and folders, recursively, in sorted order) and
// each file's text, decompressed when it ends in .gz (zlib) or .xz (liblzma).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

struct InputFile {
  std::string path;
  uint64_t bytes = 0;  // on disk (compressed size for .gz/.xz)
};

// Expands folders (regular files below them, sorted by path). UserError naming the input
// that does not exist or cannot be read.
std::vector<InputFile> list_inputs(const std::vector<std::string>& inputs);

// The whole (decompressed) content. UserError naming the file on any read/decode error.
std::string read_text(const std::string& path);

}  // namespace loom::data
