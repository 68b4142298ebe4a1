// libFuzzer target for a checkpoint's manifest.json: arbitrary bytes as the manifest of a
// folder that also holds a data file, data-00000.bin (64 floats). Opening must succeed or
// throw a UserError naming the folder; then every tensor the manifest lists is read whole
// and in two halves, each read succeeding or throwing a UserError. A manifest must not make
// the reader touch memory or files outside what it names inside the folder.
#include <vector>

#include "fuzz_support.h"
#include "loom/ckpt/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::ckpt::Reader;
  static const bool once = [] {
    std::vector<float> values(64);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    loom::fuzz::put("data-00000.bin", reinterpret_cast<const uint8_t*>(values.data()),
                    values.size() * sizeof(float));
    return true;
  }();
  (void)once;
  loom::fuzz::put("manifest.json", data, size);
  loom::fuzz::expect_user_errors([&] {
    Reader r(loom::fuzz::scratch());
    for (const std::string& name : r.tensors()) {
      loom::fuzz::expect_user_errors([&] {
        const loom::Shape shape = r.shape(name);
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        if (n > (int64_t{1} << 20)) return;  // the reader bounds it by the files; a test bound
        std::vector<float> out(static_cast<size_t>(n));
        r.read(name, 0, n, out.data());
        r.read(name, 0, n / 2, out.data());
        r.read(name, n / 2, n - n / 2, out.data() + n / 2);
      });
    }
  });
  return 0;
}
