// What the libFuzzer targets share: a scratch folder in memory for parsers that read files,
// and the rule every parser of outside input must keep — bad bytes are a UserError (one
// line, naming the file), never a crash, a sanitizer report, an unbounded allocation or
// another exception. Anything but a UserError escapes LLVMFuzzerTestOneInput, and libFuzzer
// reports it as a crash with the input that caused it.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "loom/core/error.h"

namespace loom::fuzz {

// A folder under /dev/shm made once per process and removed at exit (libFuzzer calls exit()
// when its time is up; after a crash it stays, beside the crash's input).
inline const std::string& scratch() {
  static char made[] = "/dev/shm/loom_fuzz_XXXXXX";  // outlives every destructor
  static const std::string dir = [] {
    if (!mkdtemp(made)) abort();
    std::atexit([] { std::filesystem::remove_all(made); });
    return std::string(made);
  }();
  return dir;
}

// Writes bytes to scratch()/name (replacing it) and returns the path.
inline std::string put(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) abort();
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}
inline std::string put(const std::string& name, const std::string& text) {
  return put(name, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// Runs f; a UserError is the expected answer to bad input, anything else escapes.
template <typename F>
void expect_user_errors(F&& f) {
  try {
    f();
  } catch (const loom::UserError&) {
  }
}

}  // namespace loom::fuzz
