// libFuzzer target for the model files loom reads: arbitrary bytes as a .safetensors file
// (every tensor it accepts is then read and converted) and as a GGUF file's header. Each
// must open or throw a UserError naming the file; an accepted safetensors tensor's bytes
// lie inside the file.
#include "fuzz_support.h"
#include "loom/ckpt/gguf.h"
#include "loom/ckpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::put("model.safetensors", data, size);
  loom::fuzz::expect_user_errors([&] {
    loom::ckpt::SafetensorsFile f(path);
    for (const auto& t : f.tensors()) {
      if (t.end > size) __builtin_trap();
      if (loom::numel(t.shape) < (1 << 16)) f.read_f32(t.name);
    }
  });
  const std::string gguf = loom::fuzz::put("model.gguf", data, size);
  loom::fuzz::expect_user_errors([&] { loom::ckpt::GgufFile g(gguf); });
  return 0;
}
