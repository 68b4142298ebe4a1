// libFuzzer target for corpus input: arbitrary bytes as a .zst, .gz and .xz file (decoded
// whole: UserError naming the file, or the bytes), and each line of them as a JSON Lines
// record with a nested text key and a --where condition (kept, filtered, or bad with a
// reason; never a crash).
#include "fuzz_support.h"
#include "loom/data/input.h"
#include "loom/data/jsonl.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const char* ext : {"in.jsonl.zst", "in.jsonl.gz", "in.jsonl.xz"}) {
    const std::string path = loom::fuzz::put(ext, data, size);
    loom::fuzz::expect_user_errors([&] { loom::data::read_all(path); });
  }
  static loom::data::JsonlRecords records({"doc.text", {{"meta.set", "wiki"}}});
  std::string text(reinterpret_cast<const char*>(data), size);
  text.append(loom::data::JsonlRecords::kPadding, '\0');
  std::string_view all(text.data(), size);
  for (size_t at = 0; at <= all.size();) {
    const size_t nl = std::min(all.find('\n', at), all.size());
    auto r = records.parse(all.substr(at, nl - at));
    if (r.kind == loom::data::JsonlRecords::Kind::kBad && r.reason.empty()) __builtin_trap();
    at = nl + 1;
  }
  return 0;
}
