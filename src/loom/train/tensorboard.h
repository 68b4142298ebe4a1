// A TensorBoard event file writer for scalar curves, with no TensorFlow or protobuf
// dependency. The file (events.out.tfevents.<time>.<host>) is a TFRecord stream:
//   u64 length | u32 masked crc32c(length) | Event protobuf | u32 masked crc32c(Event)
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, and the Event is hand-encoded:
//   1: wall_time (double)  2: step (int64)  3: file_version "brain.Event:2" (first record)
//   5: summary { 1: value { 1: tag (string)  2: simple_value (float) } }
// `tensorboard --logdir RUN_DIR` reads it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::train {

uint32_t crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  const std::string& path() const { return path_; }
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  void flush();

 private:
  void record(std::string_view event);
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace loom::train
