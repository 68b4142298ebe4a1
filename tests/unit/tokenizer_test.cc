// The GPT-2 tokenizer against the reference npm package (gpt-tokenizer@4.0.0): ids must be
// identical on prose, code, Unicode, emoji, whitespace runs, invalid UTF-8 and 300 random
// strings (tests/reference/tokenizer_reference.js writes the expected ids).
#include "loom/data/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/core/base64.h"
#include "loom/core/error.h"
#include "loom/data/utf8.h"

namespace loom::data {
namespace {

std::string b64decode(const std::string& in) {
  std::string out;
  EXPECT_TRUE(base64_decode(in, out)) << in;
  return out;
}

std::shared_ptr<const Gpt2Tokenizer> tokenizer() {
  static auto t = Gpt2Tokenizer::load(Gpt2Tokenizer::default_vocab_path());
  return t;
}

TEST(Tokenizer, MatchesTheReferencePackageExactly) {
  const char* ref = std::getenv("LOOM_TOKENIZER_REFERENCE");
  ASSERT_NE(ref, nullptr) << "set LOOM_TOKENIZER_REFERENCE (CTest does)";
  std::ifstream f(ref);
  ASSERT_TRUE(f) << ref;
  auto cases = nlohmann::json::parse(f);
  ASSERT_GT(cases.size(), 300u);
  Gpt2Tokenizer::Encoder enc(tokenizer());
  int wrong = 0;
  for (const auto& c : cases) {
    std::string text = b64decode(c["b64"].get<std::string>());
    std::vector<int> want = c["ids"].get<std::vector<int>>();
    std::vector<int> got = enc.encode(text);
    if (got != want && wrong++ < 5) {
      std::ostringstream g, w;
      for (int x : got) g << x << ' ';
      for (int x : want) w << x << ' ';
      ADD_FAILURE() << "text (repaired) '" << repair_utf8(text) << "'\n got: " << g.str()
                    << "\nwant: " << w.str();
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Tokenizer, DecodeInvertsEncodeOnValidUtf8) {
  Gpt2Tokenizer::Encoder enc(tokenizer());
  for (std::string s : {"Hello world", "  spaces\tand\nlines  ", "日本語 😀 naïve", ""})
    EXPECT_EQ(tokenizer()->decode(enc.encode(s)), s);
  EXPECT_EQ(tokenizer()->decode({Gpt2Tokenizer::kEndOfText}), "<|endoftext|>");
  EXPECT_THROW(tokenizer()->decode({50257}), UserError);
}

TEST(Tokenizer, EndOfTextIsNeverProducedFromText) {
  Gpt2Tokenizer::Encoder enc(tokenizer());
  for (int id : enc.encode("a<|endoftext|>b")) EXPECT_NE(id, Gpt2Tokenizer::kEndOfText);
}

TEST(Tokenizer, MissingOrCorruptVocabularyIsAUserError) {
  EXPECT_THROW(Gpt2Tokenizer::load("/nonexistent/r50k_base.tiktoken"), UserError);
  std::string bad = ::testing::TempDir() + "/bad.tiktoken";
  std::ofstream(bad) << "IQ== 0\nnot base64 at all\n";
  EXPECT_THROW(Gpt2Tokenizer::load(bad), UserError);
}

TEST(Utf8, RepairFollowsTheWhatwgDecoder) {
  EXPECT_EQ(repair_utf8("a\x80"
                        "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(repair_utf8("\xE2\x82 x"), "\xEF\xBF\xBD x");  // one U+FFFD for a truncated sequence
  EXPECT_EQ(repair_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: two
  EXPECT_TRUE(valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));  // surrogate
}

}  // namespace
}  // namespace loom::data
