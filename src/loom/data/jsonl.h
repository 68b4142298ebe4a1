// One JSON Lines record -> the document text it holds (docs/formats.md "JSON Lines input").
//
// A record is one line holding one JSON value. The document is the string at `text_key`, a
// dotted path into nested objects ("text", "content", "doc.body"); `where` conditions
// ("meta.pile_set_name" = "Wikipedia", exact) keep only records that match all of them.
// A line that is not JSON, has no such key, holds something other than a string there, or
// has invalid UTF-8 or an unpaired \u surrogate anywhere is a bad record, with the reason.
// Parsing is simdjson's DOM parser: it validates the whole line (structure and UTF-8) at
// gigabytes per second, well ahead of the tokenizer.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data {

struct RecordFilter {
  std::string text_key = "text";
  std::vector<std::pair<std::string, std::string>> where;  // (dotted path, exact value)
};

// "meta.pile_set_name=Wikipedia" -> (path, value); UserError naming the argument otherwise.
std::pair<std::string, std::string> parse_where(const std::string& arg);

class JsonlRecords {
 public:
  // Bytes past a line's end that must be readable (not necessarily part of the line).
  static constexpr size_t kPadding = 64;

  explicit JsonlRecords(RecordFilter filter);
  ~JsonlRecords();
  JsonlRecords(const JsonlRecords&) = delete;
  JsonlRecords& operator=(const JsonlRecords&) = delete;

  enum class Kind { kKept, kFiltered, kBad };
  struct Record {
    Kind kind;
    std::string_view text;  // kKept: the document (valid until the next parse)
    std::string reason;     // kBad: why, e.g. "not JSON: unclosed string"
  };
  // `line` (no newline) must be followed by kPadding readable bytes.
  Record parse(std::string_view line);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::data
