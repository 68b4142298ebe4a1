#include "loom/data/jsonl.h"

#include <simdjson.h>

#include "loom/core/error.h"

namespace loom::data {

static_assert(JsonlRecords::kPadding >= simdjson::SIMDJSON_PADDING);

namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> keys;
  size_t begin = 0;
  for (;;) {
    const size_t dot = path.find('.', begin);
    keys.push_back(path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  return keys;
}

const char* type_name(simdjson::dom::element_type t) {
  using T = simdjson::dom::element_type;
  switch (t) {
    case T::ARRAY:
      return "an array";
    case T::OBJECT:
      return "an object";
    case T::INT64:
    case T::UINT64:
    case T::DOUBLE:
      return "a number";
    case T::STRING:
      return "a string";
    case T::BOOL:
      return "a boolean";
    case T::NULL_VALUE:
      return "null";
  }
  return "a value";
}

std::string reason_for(simdjson::error_code e) {
  switch (e) {
    case simdjson::UTF8_ERROR:
      return "invalid UTF-8";
    case simdjson::STRING_ERROR:
      return "not JSON: a bad string escape (an unpaired \\u surrogate?)";
    case simdjson::UNCLOSED_STRING:
      return "not JSON: an unclosed string";
    case simdjson::TAPE_ERROR:
      return "not JSON: missing or extra commas, braces or keys";
    case simdjson::EMPTY:
      return "not JSON: empty";
    default:
      return std::string("not JSON: ") + simdjson::error_message(e);
  }
}

}  // namespace

std::pair<std::string, std::string> parse_where(const std::string& arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError("--where '" + arg + "' is not KEY=VALUE",
                    "e.g. --where meta.pile_set_name=Wikipedia (a dotted path, an exact value)");
  std::string key = arg.substr(0, eq);
  for (const auto& k : split_path(key))
    if (k.empty())
      throw UserError("--where '" + arg + "': the key '" + key + "' has an empty part",
                      "a dotted path of object keys, e.g. meta.pile_set_name");
  return {std::move(key), arg.substr(eq + 1)};
}

struct JsonlRecords::Impl {
  simdjson::dom::parser parser;
  std::vector<std::string> text_path;
  std::string text_key;
  std::vector<std::pair<std::vector<std::string>, std::string>> where;

  // The element at `path` inside `doc`, or false (with the first missing key's place).
  static bool find(simdjson::dom::element doc, const std::vector<std::string>& path,
                   simdjson::dom::element* out) {
    for (const auto& key : path) {
      simdjson::dom::object obj;
      if (doc.get_object().get(obj)) return false;
      if (obj.at_key(key).get(doc)) return false;
    }
    *out = doc;
    return true;
  }
  bool matches(simdjson::dom::element doc) const {
    for (const auto& [path, want] : where) {
      simdjson::dom::element v;
      if (!find(doc, path, &v)) return false;
      std::string_view s;
      if (v.is_string()) {
        if (v.get_string().get(s) || s != want) return false;
      } else if (simdjson::minify(v) != want) {  // numbers, booleans, null: as JSON writes them
        return false;
      }
    }
    return true;
  }
};

JsonlRecords::JsonlRecords(RecordFilter filter) : impl_(std::make_unique<Impl>()) {
  if (filter.text_key.empty())
    throw UserError("--text-key is empty", "name the document's field, e.g. --text-key text");
  for (const auto& k : split_path(filter.text_key))
    if (k.empty())
      throw UserError("--text-key '" + filter.text_key + "' has an empty part",
                      "a dotted path of object keys, e.g. text or doc.body");
  impl_->text_key = filter.text_key;
  impl_->text_path = split_path(filter.text_key);
  for (auto& [key, value] : filter.where) impl_->where.push_back({split_path(key), value});
}

JsonlRecords::~JsonlRecords() = default;

JsonlRecords::Record JsonlRecords::parse(std::string_view line) {
  simdjson::dom::element doc;
  if (auto e = impl_->parser.parse(line.data(), line.size(), false).get(doc))
    return {Kind::kBad, {}, reason_for(e)};
  if (!doc.is_object())
    return {Kind::kBad, {}, std::string(type_name(doc.type())) + ", not an object"};
  if (!impl_->matches(doc)) return {Kind::kFiltered, {}, {}};
  simdjson::dom::element v;
  if (!Impl::find(doc, impl_->text_path, &v))
    return {Kind::kBad, {}, "no key '" + impl_->text_key + "'"};
  std::string_view text;
  if (v.get_string().get(text))
    return {
        Kind::kBad, {}, "'" + impl_->text_key + "' is " + type_name(v.type()) + ", not a string"};
  return {Kind::kKept, text, {}};
}

}  // namespace loom::data
