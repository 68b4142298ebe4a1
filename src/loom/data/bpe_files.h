// The GPT-2 vocabulary in the forms other programs read it: Hugging Face's vocab.json and
// merges.txt, and GGUF's token and merge lists (interop/export.h), derived from loom's
// pinned r50k_base.tiktoken instead of shipped beside it.
//
// Both spell a token's bytes through GPT-2's byte-to-unicode table: the 188 printable bytes
// ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the other 68 for U+0100 onwards in
// byte order (so a space is 'Ġ', a newline 'Ċ'). The merges are recovered from the ranks:
// token r (256 <= r < 50256) is the merge of the two tokens that byte-pair merging of its
// bytes, with only the merges ranked below r, leaves; listed in rank order they are GPT-2's
// 50,000 merges, so a BPE reading them produces the ids loom's tokenizer does.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

// bytes in GPT-2's byte-to-unicode spelling (UTF-8).
std::string byte_level_spelling(std::string_view bytes);

// Every token's spelling, ids 0..50256 (50256 is "<|endoftext|>").
std::vector<std::string> token_spellings(const Gpt2Tokenizer& tok);

// The 50,000 merges in rank order, as pairs of token ids; InternalError if the vocabulary
// is not a BPE vocabulary (a token that is not the merge of two lower-ranked ones).
std::vector<std::pair<int, int>> derive_merges(const Gpt2Tokenizer& tok);

// Hugging Face's files: vocab.json ({"spelling": id, ...}) and merges.txt ("#version: 0.2"
// then "a b" per merge).
std::string vocab_json(const Gpt2Tokenizer& tok);
std::string merges_txt(const Gpt2Tokenizer& tok);

}  // namespace loom::data
