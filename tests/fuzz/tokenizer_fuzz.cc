// libFuzzer target for the GPT-2 tokenizer on arbitrary bytes (the real r50k_base
// vocabulary: LOOM_TOKENIZER_VOCAB or the default path). Encoding never fails; every id is
// below 50256 (<|endoftext|> is never produced from text); decoding the ids gives back the
// input repaired to valid UTF-8 (invalid sequences become U+FFFD); and decoding arbitrary
// ids either succeeds or throws a UserError.
#include <vector>

#include "fuzz_support.h"
#include "loom/data/tokenizer.h"
#include "loom/data/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::data::Gpt2Tokenizer;
  static const auto tok = Gpt2Tokenizer::load("");
  static Gpt2Tokenizer::Encoder enc(tok);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int> ids = enc.encode(text);
  for (int id : ids)
    if (id < 0 || id >= Gpt2Tokenizer::kEndOfText) __builtin_trap();
  if (tok->decode(ids) != loom::data::repair_utf8(text)) __builtin_trap();
  // The bytes read as little-endian u16 ids, some of them out of range.
  std::vector<int> raw(size / 2);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = data[2 * i] | (data[2 * i + 1] << 8);
  loom::fuzz::expect_user_errors([&] { (void)tok->decode(raw); });
  return 0;
}
