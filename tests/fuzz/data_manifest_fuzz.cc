// libFuzzer target for a prepared dataset's manifest.json (what `loom prep` writes beside
// its shards): arbitrary bytes as the manifest of a folder that holds one valid shard,
// train_000000.bin. Opening either split must succeed or throw a UserError; a dataset that
// opens must read every token it says it has.
#include <vector>

#include "fuzz_support.h"
#include "loom/data/loader.h"
#include "loom/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::data::TokenDataset;
  static const bool once = [] {
    std::vector<uint16_t> tokens(100);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7);
    loom::data::write_shard(loom::fuzz::scratch() + "/train_000000.bin", tokens, 0, 0, 50257);
    return true;
  }();
  (void)once;
  loom::fuzz::put("manifest.json", data, size);
  for (const char* split : {"train", "val"})
    loom::fuzz::expect_user_errors([&] {
      TokenDataset d = TokenDataset::open(loom::fuzz::scratch(), split);
      std::vector<int32_t> all(d.tokens());
      d.read(0, all.size(), all.data());
      for (int32_t t : all)
        if (t < 0 || t >= 50257) __builtin_trap();
    });
  return 0;
}
