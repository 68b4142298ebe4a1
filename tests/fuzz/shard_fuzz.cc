// libFuzzer target for token shards: arbitrary bytes as a shard file. Opening must succeed
// or throw a UserError naming the file; a shard that opens must hold exactly the tokens its
// size allows, every one a valid id of the vocabulary (the model indexes its embedding with
// them), with and without the checksum pass.
#include "fuzz_support.h"
#include "loom/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::data::ShardView;
  constexpr uint32_t kVocab = 50257;
  const std::string path = loom::fuzz::put("shard.bin", data, size);
  for (bool verify : {true, false})
    loom::fuzz::expect_user_errors([&] {
      ShardView v = ShardView::open(path, kVocab, verify);
      if (v.size() != (size - sizeof(loom::data::ShardHeader)) / 2) __builtin_trap();
      for (uint64_t i = 0; i < v.size(); ++i)
        if (v.tokens()[i] >= kVocab) __builtin_trap();
    });
  return 0;
}
